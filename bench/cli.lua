-- bench/cli.lua -- `moonjob run` over a big NDJSON file, next to a plain
-- LuaJIT loop doing the same work (part of `make bench`).
--
-- The input is LINES small lines ({"n":1,"name":"item 1"}); the processor is
-- bench/small_table.lua. The plain loop is one LuaJIT process that decodes
-- each line with moonjob.json (the CLI's exact JSON codec), calls the same
-- processor, encodes the result the same way and writes the same output line
-- ({"line":N,"status":"completed","result":...}). Both write to /dev/null.
-- moonjob runs inside this process (moonjob.cli.main), so the parent's own
-- CPU (getrusage of this process) is told apart from its children's.
--
-- Prints, for -j 1 and -j 2: wall seconds, the ratio plain / moonjob (above 1:
-- moonjob is faster), and the parent's CPU per line. Each figure is the best
-- of ROUNDS runs.
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
package.cpath = "build/?.so;" .. package.cpath

local ffi = require "ffi"
ffi.cdef [[
struct bench_timeval { long tv_sec; long tv_usec; };
struct bench_rusage { struct bench_timeval utime, stime; long rest[14]; };
int getrusage(int who, struct bench_rusage *usage);
int dup(int fd);
int dup2(int from, int to);
int open(const char *path, int flags, ...);
int close(int fd);
]]

local LINES = tonumber(os.getenv("BENCH_LINES")) or 200000
local ROUNDS = tonumber(os.getenv("BENCH_ROUNDS")) or 3
local PROCESSOR = "bench/small_table.lua"

local function cpu_ms(who)
  local u = ffi.new("struct bench_rusage")
  ffi.C.getrusage(who, u)
  return (tonumber(u.utime.tv_sec) + tonumber(u.stime.tv_sec)) * 1e3
    + (tonumber(u.utime.tv_usec) + tonumber(u.stime.tv_usec)) / 1e3
end

local function now_s()
  return require("moonjob.core").hrtime() / 1e9
end

-- Runs fn with this process's standard output on /dev/null.
local function quietly(fn)
  io.stdout:flush()
  local saved = ffi.C.dup(1)
  local null = ffi.C.open("/dev/null", 1) -- O_WRONLY
  ffi.C.dup2(null, 1)
  ffi.C.close(null)
  local ok, a = pcall(fn)
  io.stdout:flush()
  ffi.C.dup2(saved, 1)
  ffi.C.close(saved)
  assert(ok, a)
  return a
end

local function make_input()
  local path = os.tmpname()
  local f = assert(io.open(path, "w"))
  for i = 1, LINES do f:write(('{"n":%d,"name":"item %d"}\n'):format(i, i)) end
  f:close()
  return path
end

-- The same work in one plain LuaJIT loop.
local function plain(path)
  local json = require "moonjob.json"
  local process = dofile(PROCESSOR)
  local out = io.stdout
  out:setvbuf("full")
  local n = 0
  for line in io.lines(path) do
    n = n + 1
    local data = assert(json.decode(line))
    local result = assert(json.encode(process({ data = data, id = n })))
    out:write('{"line":', n, ',"status":"completed","result":', result, ',"attempts":1,"ms":0}\n')
  end
  return n
end

local function moonjob_run(path, j)
  return require("moonjob.cli").main({ "run", PROCESSOR, path, "-j", tostring(j) })
end

-- Best wall time of ROUNDS runs, and the parent CPU (ms) of that run.
local function best(fn)
  local wall, cpu = math.huge, nil
  for _ = 1, ROUNDS do
    local c0, t0 = cpu_ms(0), now_s()
    quietly(fn)
    local t, c = now_s() - t0, cpu_ms(0) - c0
    if t < wall then wall, cpu = t, c end
  end
  return wall, cpu
end

local path = make_input()
print(("moonjob run over %d NDJSON lines (bench/small_table.lua), best of %d runs"):format(LINES, ROUNDS))
local plain_s, plain_cpu = best(function() return plain(path) end)
print(("%-26s %8.3f s  (%.2f us CPU per line)"):format("plain LuaJIT, one process", plain_s,
  plain_cpu * 1e3 / LINES))
for _, j in ipairs({ 1, 2 }) do
  local s, cpu = best(function()
    local status = moonjob_run(path, j)
    assert(status == 0, "moonjob run exited with " .. tostring(status))
  end)
  print(("%-26s %8.3f s  plain/moonjob %.2f  parent CPU %.2f us per line"):format(
    "moonjob run -j " .. j, s, plain_s / s, cpu * 1e3 / LINES))
end
os.remove(path)
