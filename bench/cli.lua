-- bench/cli.lua -- `moonjob run` over a big NDJSON file, next to a plain
-- LuaJIT loop doing the same work (part of `make bench`).
--
-- The input is LINES small lines ({"n":1,"name":"item 1"}); the processor is
-- bench/small_table.lua. The plain loop is one LuaJIT process that decodes
-- each line with moonjob.codec.json (the CLI's exact JSON codec), calls the same
-- processor, encodes the result the same way and writes the same output line
-- ({"line":N,"status":"completed","result":...}). Both write to /dev/null.
-- moonjob runs inside this process (moonjob.cli.main), so the parent's own
-- CPU (getrusage of this process) is told apart from its children's.
--
-- Prints, for -j 1 and -j 2: wall seconds, the ratio plain / moonjob (above 1:
-- moonjob is faster), and the parent's CPU per line. Each figure is the best
-- of ROUNDS runs; the three take turns in every round.
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
local ROUNDS = tonumber(os.getenv("BENCH_ROUNDS")) or 5
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
  local json = require "moonjob.codec.json"
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

-- One run of fn: its wall seconds and the parent CPU (ms) it took.
local function timed(fn)
  local c0, t0 = cpu_ms(0), now_s()
  quietly(fn)
  return now_s() - t0, cpu_ms(0) - c0
end

local path = make_input()
print(("moonjob run over %d NDJSON lines (bench/small_table.lua), best of %d runs"):format(LINES, ROUNDS))
-- The contenders run in turn, round after round, so that a machine whose
-- speed drifts (a shared VM) slows them alike; each keeps its best run.
local contenders = {
  { name = "plain", run = function() return plain(path) end },
  { name = "j1", run = function() assert(moonjob_run(path, 1) == 0, "moonjob run -j 1 failed") end },
  { name = "j2", run = function() assert(moonjob_run(path, 2) == 0, "moonjob run -j 2 failed") end },
}
local best = {}
for _ = 1, ROUNDS do
  for _, c in ipairs(contenders) do
    local wall, cpu = timed(c.run)
    if not best[c.name] or wall < best[c.name].wall then best[c.name] = { wall = wall, cpu = cpu } end
  end
end
local plain_s = best.plain.wall
print(("%-26s %8.3f s  (%.2f us CPU per line)"):format("plain LuaJIT, one process", plain_s,
  best.plain.cpu * 1e3 / LINES))
for j = 1, 2 do
  local b = best["j" .. j]
  print(("%-26s %8.3f s  plain/moonjob %.2f  parent CPU %.2f us per line"):format(
    "moonjob run -j " .. j, b.wall, plain_s / b.wall, b.cpu * 1e3 / LINES))
end
os.remove(path)
