-- bench/datasets.lua -- `make bench`: `moonjob run -j 2` on data like a
-- user's, side by side with one plain LuaJIT process, GNU parallel and xargs.
--
-- Three generated datasets (bench/datasets/gen.lua, into a temporary
-- directory, removed at the end): RECORDS records of about 485 bytes (a
-- 19-digit integer id, a user, an ISO timestamp, about 400 bytes of text)
-- run by bench/datasets/records.lua (counts words, hashes the text in pure
-- Lua, parses the timestamp), TINY tiny lines {"i":N,"s":"abc","f":0.5}
-- run by bench/datasets/tiny.lua, and EVENTS web-log events of about 350
-- bytes run by bench/datasets/events.lua (a few string operations, a result
-- of 9 fields). On each, the contenders:
--   plain_cjson  the same loop with its results written by cjson.encode
--             (PLAIN_ENCODE=cjson): a user's own script
--   plain     one LuaJIT process: bench/datasets/plain.lua (cjson decodes,
--             moonjob's encoder writes the result lines as moonjob does)
--   j2        moonjob run -j 2 PROCESSOR FILE
--   parallel  parallel --pipepart --block -10 -j 2 -a FILE, each job the
--             plain loop on its stdin (Debian's GNU parallel)
--   xargs     xargs -P 2 -n 1 over the file split in two parts, each the
--             plain loop on one part (the split is made once beforehand and
--             not counted: a user would split it once too)
--   j2-limits moonjob run -j 2 --timeout 10 --attempts 3
--   j2-log    moonjob run -j 2 with a processor that calls job:log on every
--             line (bench/datasets/*_log.lua; its stderr to /dev/null)
-- Every contender's output goes to /dev/null. They take turns, round after
-- round, and each keeps its best wall time (a shared machine's drift slows
-- them alike). Printed: wall seconds, CPU per line (all processes; for
-- moonjob the parent's and the children's, from bench/datasets/moonjob.lua),
-- the idle share of the two cores (of the best run), then the ratios the targets name. Then the start:
-- a one-line input, moonjob run -j 2 against the plain loop.
--
-- Environment: BENCH_RECORDS, BENCH_TINY, BENCH_EVENTS (lines), BENCH_DS_ROUNDS
-- (rounds).
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
package.cpath = "build/?.so;" .. package.cpath

local ffi = require "ffi"
ffi.cdef [[
struct bench_dsm_timeval { long tv_sec; long tv_usec; };
struct bench_dsm_rusage { struct bench_dsm_timeval utime, stime; long rest[14]; };
int getrusage(int who, struct bench_dsm_rusage *usage);
]]
local core = require "moonjob.core"

local RECORDS = tonumber(os.getenv("BENCH_RECORDS")) or 100000
local TINY = tonumber(os.getenv("BENCH_TINY")) or 200000
local EVENTS = tonumber(os.getenv("BENCH_EVENTS")) or 100000
local ROUNDS = tonumber(os.getenv("BENCH_DS_ROUNDS")) or 3
local LUA = os.getenv("LUA") or "luajit"
local STARTS = 5 -- rounds of the one-line start

-- The CPU (ms) of the waited-for children of this process, all theirs included.
local function children_cpu_ms()
  local u = ffi.new("struct bench_dsm_rusage")
  ffi.C.getrusage(-1, u) -- RUSAGE_CHILDREN
  return (tonumber(u.utime.tv_sec) + tonumber(u.stime.tv_sec)) * 1e3
    + (tonumber(u.utime.tv_usec) + tonumber(u.stime.tv_usec)) / 1e3
end

local function sh(command)
  local ok, how, code = os.execute(command)
  if ok ~= true and ok ~= 0 then
    error(("bench command failed (%s %s): %s"):format(tostring(how), tostring(code), command))
  end
end

local function quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local dir = os.tmpname()
os.remove(dir)
sh("mkdir -m 700 " .. quote(dir))
local cpu_file = dir .. "/parent-cpu"

local function read_number(path)
  local f = io.open(path)
  local n = f and tonumber(f:read("*l"))
  if f then f:close() end
  os.remove(path)
  return n
end

local PLAIN = LUA .. " bench/datasets/plain.lua "
local PLAIN_CJSON = "PLAIN_ENCODE=cjson " .. PLAIN
local MOONJOB = "BENCH_CPU_FILE=" .. quote(cpu_file) .. " " .. LUA .. " bench/datasets/moonjob.lua run -j 2 "

-- The contenders' commands for the dataset in file `input` (parts: its two
-- halves) run by processor `proc` (and `log_proc`, the same logging).
local function contenders(input, parts, proc, log_proc)
  local i, p = quote(input), quote(proc)
  return {
    { name = "plain", label = "plain LuaJIT + cjson", command = PLAIN .. p .. " " .. i },
    { name = "plain_cjson", label = "plain, results by cjson.encode", command = PLAIN_CJSON .. p .. " " .. i },
    { name = "j2", label = "moonjob run -j 2", command = MOONJOB .. p .. " " .. i, moonjob = true },
    { name = "parallel", label = "parallel --pipepart -j 2",
      command = "parallel --pipepart --block -10 -j 2 -a " .. i .. " " .. PLAIN .. p },
    { name = "xargs", label = "xargs -P 2 (split in 2)",
      command = "printf '%s\\n' " .. quote(parts[1]) .. " " .. quote(parts[2]) .. " | xargs -P 2 -n 1 "
        .. PLAIN .. p },
    { name = "limits", label = "-j 2 --timeout 10 --attempts 3",
      command = MOONJOB .. "--timeout 10 --attempts 3 " .. p .. " " .. i, moonjob = true },
    { name = "log", label = "-j 2, job:log every line", command = MOONJOB .. quote(log_proc) .. " " .. i,
      moonjob = true },
  }
end

-- One run of contender c: wall seconds, all CPU (ms), the parent's (ms, moonjob only).
local function run_once(c)
  local cpu0, t0 = children_cpu_ms(), core.hrtime()
  sh(c.command .. " >/dev/null 2>/dev/null")
  local wall = (core.hrtime() - t0) / 1e9
  return wall, children_cpu_ms() - cpu0, c.moonjob and read_number(cpu_file) or nil
end

local function best_of(list, rounds)
  local best = {}
  for _ = 1, rounds do
    for _, c in ipairs(list) do
      local wall, cpu, parent = run_once(c)
      local b = best[c.name]
      if not b or wall < b.wall then best[c.name] = { wall = wall, cpu = cpu, parent = parent } end
    end
  end
  return best
end

local function report(title, lines, list, best)
  print(("%s: %d lines, best of %d rounds"):format(title, lines, ROUNDS))
  print(("  %-32s %8s %11s %8s %9s %6s"):format("", "wall s", "CPU us/line", "parent", "children", "idle"))
  for _, c in ipairs(list) do
    local b = best[c.name]
    local idle = math.max(0, 1 - b.cpu / 1e3 / (2 * b.wall))
    local per_line = function(ms) return ms and ("%.2f"):format(ms * 1e3 / lines) or "" end
    print(("  %-32s %8.3f %11.2f %8s %9s %5.0f%%"):format(c.label, b.wall, b.cpu * 1e3 / lines,
      per_line(b.parent), per_line(b.parent and b.cpu - b.parent), idle * 100))
  end
  local w = function(name) return best[name].wall end
  print(("  ratios: plain/j2 %.2f, plain_cjson/j2 %.2f (goal >= 1.4 for both)  parallel/j2 %.2f (goal > 1)"
    .. "  xargs/j2 %.2f"):format(w("plain") / w("j2"), w("plain_cjson") / w("j2"), w("parallel") / w("j2"),
    w("xargs") / w("j2")))
  print(("          limits/j2 %.2f  log/j2 %.2f (goal <= 1.2)"):format(w("limits") / w("j2"), w("log") / w("j2")))
end

local function dataset(title, name, lines, proc, log_proc)
  local input = dir .. "/" .. name .. ".ndjson"
  sh(("split -n l/2 %s %s"):format(quote(input), quote(dir .. "/" .. name .. ".part.")))
  local parts = { dir .. "/" .. name .. ".part.aa", dir .. "/" .. name .. ".part.ab" }
  local list = contenders(input, parts, proc, log_proc)
  report(title, lines, list, best_of(list, ROUNDS))
end

-- The start: one line, run by the plain loop and by moonjob run -j 2 (two
-- children spawned, the processor loaded in each).
local function start()
  local one = dir .. "/one.ndjson"
  sh(("head -n 1 %s > %s"):format(quote(dir .. "/records.ndjson"), quote(one)))
  local list = {
    { name = "plain", command = PLAIN .. "bench/datasets/records.lua " .. quote(one) },
    { name = "j2", command = MOONJOB .. "bench/datasets/records.lua " .. quote(one), moonjob = true },
  }
  local best = best_of(list, STARTS)
  print(("start, one line (best of %d): plain %.3f s, moonjob run -j 2 %.3f s (parent CPU %.1f ms, all CPU %.1f ms)")
    :format(STARTS, best.plain.wall, best.j2.wall, best.j2.parent, best.j2.cpu))
end

local t0 = core.hrtime()
sh(("%s bench/datasets/gen.lua %s %d %d %d"):format(LUA, quote(dir), RECORDS, TINY, EVENTS))
local loadavg = io.open("/proc/loadavg") -- other programs' load shows as idle time here
print(("datasets generated in %.1f s; %d cores, load average %s"):format((core.hrtime() - t0) / 1e9,
  core.cpu_count(), loadavg and loadavg:read("*l"):match("^(%S+)") or "unknown"))
if loadavg then loadavg:close() end
local ok, err = pcall(function()
  dataset("records (~485 bytes, 19-digit ids)", "records", RECORDS, "bench/datasets/records.lua",
    "bench/datasets/records_log.lua")
  dataset("tiny lines", "tiny", TINY, "bench/datasets/tiny.lua", "bench/datasets/tiny_log.lua")
  dataset("web-log events (~350 bytes, a 9-field result)", "events", EVENTS, "bench/datasets/events.lua",
    "bench/datasets/events_log.lua")
  start()
end)
sh("rm -rf " .. quote(dir))
assert(ok, err)
