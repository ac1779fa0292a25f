-- spec/support/parallel_run.lua -- runs the spec files as several busted
-- processes at once; `make test`, `make test-fast` and `make sanitize` use it.
--
--   luajit spec/support/parallel_run.lua [--jobs N] [--busted CMD]
--     [--exclude-tags=TAGS] [--findings DIR] [--record] [PATH...]
--
-- PATHs are spec files or folders (default: spec); each *_spec.lua file found
-- is one busted process, started longest first by the seconds it took last
-- time (spec/support/spec_times.txt; --record writes this run's times there),
-- N at a time (default 6, or $SPEC_JOBS). Most of the suite waits on servers,
-- children and timers rather than using a CPU, so more processes than
-- cores pay. The files of the ALONE set measure windows of time and how
-- soon things happen (rates, stalls, schedules, a dead link's PING): they
-- run last, in ALONE_LANES processes (each a share of the files, one after
-- another), with nothing else beside them.
--
-- Each file's output goes to a log, shown in full when the file has a
-- failure. The run ends with one line, "N passed, N failed" (errors, files
-- that ended without busted's summary or past their time bound, and each
-- file a sanitizer wrote in the --findings folder count as failed), and
-- exits 1 when anything failed or no spec file was found. Every spec file
-- already starts its servers on free ports and makes its own temporary
-- files, so files do not collide.
--
-- Caveats: each busted runs under timeout(1) (UNIT_SECONDS, a bound that
-- only catches a hang the specs' own watchdog cannot see, such as a call
-- blocked outside the loop), in a process group of its own: Ctrl-C stops
-- this runner, and the files already started run on to their end. When a
-- file ends, whatever is left in its group (servers and workers a killed
-- busted could not stop) is killed by that group's id.
local ffi = require "ffi"
ffi.cdef [[
int poll(void *fds, unsigned long nfds, int timeout);
struct moonjob_run_timespec { long tv_sec; long tv_nsec; };
int clock_gettime(int clock, struct moonjob_run_timespec *ts);
]]

local TIMES_FILE = "spec/support/spec_times.txt"
local DEFAULT_SECONDS = 5 -- a file not timed yet
local UNIT_SECONDS = 600 -- the bound on one busted process
-- Files that time what they watch, run last and alone (see above).
local ALONE_LANES = 1 -- (2 saves ~35 s, but the group-rate window spec then failed one run in six)
local ALONE = {
  "spec/redis/schedules_spec.lua", "spec/redis/stalls_spec.lua", "spec/redis/limits_spec.lua",
  "spec/pool/limits_spec.lua", "spec/cli/rate_spec.lua", "spec/redis/server_faults_spec.lua",
  "spec/redis/rate_starts_spec.lua",
}

local function now()
  local ts = ffi.new("struct moonjob_run_timespec")
  ffi.C.clock_gettime(1, ts) -- CLOCK_MONOTONIC
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) / 1e9
end

local function sleep_ms(ms) ffi.C.poll(nil, 0, ms) end

local function shell_quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local function read_file(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local text = f:read("*a")
  f:close()
  return text
end

local function parse_args(argv)
  local o = { jobs = tonumber(os.getenv("SPEC_JOBS") or "") or 6, busted = "busted", flags = {}, paths = {} }
  local i = 1
  while i <= #argv do
    local a = argv[i]
    if a == "--jobs" then o.jobs = assert(tonumber(argv[i + 1]), "--jobs takes a number"); i = i + 1
    elseif a == "--busted" then o.busted = assert(argv[i + 1], "--busted takes a command"); i = i + 1
    elseif a == "--record" then o.record = true
    elseif a == "--findings" then o.findings = assert(argv[i + 1], "--findings takes a folder"); i = i + 1
    elseif a:match("^%-%-") then o.flags[#o.flags + 1] = a -- passed to busted
    else o.paths[#o.paths + 1] = a end
    i = i + 1
  end
  if #o.paths == 0 then o.paths = { "spec" } end
  o.jobs = math.max(1, o.jobs)
  return o
end

-- The *_spec.lua files under the paths, sorted.
local function spec_files(paths)
  local files, seen = {}, {}
  for _, path in ipairs(paths) do
    local p = io.popen("find " .. shell_quote(path) .. " -name '*_spec.lua' -not -path '*/node_modules/*' 2>/dev/null | sort")
    for file in p:lines() do
      if not seen[file] then seen[file] = true; files[#files + 1] = file end
    end
    p:close()
  end
  return files
end

local function load_times()
  local times = {}
  for file, seconds in (read_file(TIMES_FILE) or ""):gmatch("(%S+)%s+([%d.]+)") do times[file] = tonumber(seconds) end
  return times
end

local function by_seconds(a, b) return a.seconds > b.seconds end

-- The ALONE files present, in ALONE_LANES units of about equal time (each
-- file, longest first, to the lane with the least so far).
local function alone_lanes(files, times)
  table.sort(files, function(a, b) return (times[a] or DEFAULT_SECONDS) > (times[b] or DEFAULT_SECONDS) end)
  local lanes = {}
  for i = 1, math.min(ALONE_LANES, #files) do lanes[i] = { files = {}, seconds = 0, alone = true } end
  for _, f in ipairs(files) do
    table.sort(lanes, function(a, b) return a.seconds < b.seconds end)
    lanes[1].files[#lanes[1].files + 1] = f
    lanes[1].seconds = lanes[1].seconds + (times[f] or DEFAULT_SECONDS)
  end
  table.sort(lanes, by_seconds)
  return lanes
end

-- The units of work, longest first: one per file, and last the lanes of
-- the ALONE files present.
local function make_units(files, times)
  local alone, units, quiet = {}, {}, {}
  for _, f in ipairs(ALONE) do alone[f] = true end
  for _, f in ipairs(files) do
    if alone[f] then quiet[#quiet + 1] = f
    else units[#units + 1] = { files = { f }, seconds = times[f] or DEFAULT_SECONDS } end
  end
  table.sort(units, by_seconds)
  for _, lane in ipairs(alone_lanes(quiet, times)) do units[#units + 1] = lane end
  return units
end

-- Whether `unit` may start beside the `running` ones: an ALONE lane only
-- beside the other lanes.
local function may_start(unit, running, jobs)
  if #running >= jobs then return false end
  if not unit.alone then return true end
  for _, other in ipairs(running) do
    if not other.alone then return false end
  end
  return true
end

local function start(unit, o, dir, index)
  unit.log, unit.status_file = ("%s/%d.log"):format(dir, index), ("%s/%d.status"):format(dir, index)
  local quoted = {}
  for i, f in ipairs(unit.files) do quoted[i] = shell_quote(f) end
  local command = ("timeout --kill-after=10 %d env %s %s %s"):format(UNIT_SECONDS, o.busted,
    table.concat(o.flags, " "), table.concat(quoted, " "))
  unit.pid_file = unit.status_file .. ".pid"
  os.execute(("(%s >%s 2>&1 </dev/null & echo $! >%s; wait $!; echo $? >%s.tmp; mv %s.tmp %s) &"):format(
    command, unit.log, unit.pid_file, unit.status_file, unit.status_file, unit.status_file))
  unit.started = now()
end

-- busted's closing line, "N successes / N failures / N errors / N pending".
local function summary(log)
  local plain = (log or ""):gsub("\27%[[%d;]*m", "")
  local counts
  for s, f, e, p in plain:gmatch("(%d+) successe?s? / (%d+) failures? / (%d+) errors? / (%d+) pending") do
    counts = { passed = tonumber(s), failed = tonumber(f) + tonumber(e), pending = tonumber(p) }
  end
  return counts
end

-- timeout(1) leads a process group of its own: what the file started and
-- left running (a server, a worker, once its busted was killed) is in it.
local function end_leftovers(unit)
  local pgid = tonumber(read_file(unit.pid_file) or "")
  if pgid and pgid > 1 then os.execute(("kill -KILL -%d 2>/dev/null"):format(pgid)) end
end

local function finish(unit, total, o)
  unit.seconds_taken = now() - unit.started
  end_leftovers(unit)
  local log = read_file(unit.log)
  local status = tonumber(read_file(unit.status_file) or "")
  local counts = summary(log)
  if not counts then counts = { passed = 0, failed = 1, pending = 0 } -- no summary: it died
  elseif status ~= 0 and counts.failed == 0 then counts.failed = 1 end -- a non-zero exit, e.g. the hang watchdog
  for k, v in pairs(counts) do total[k] = total[k] + v end
  io.write(("%7.1f s  %s  %d ok%s\n"):format(unit.seconds_taken, table.concat(unit.files, " "), counts.passed,
    counts.failed > 0 and (", %d FAILED"):format(counts.failed) or ""))
  if counts.failed > 0 then
    total.failed_units[#total.failed_units + 1] = unit
    local why = status == 124 and (" (stopped after %d s)"):format(UNIT_SECONDS) or ""
    local names = table.concat(unit.files, " ")
    io.write(("---- %s (exit %s%s) ----\n%s\n---- end of %s ----\n"):format(names,
      tostring(status), why, log or "(no output)", names))
  end
  io.flush()
end

-- A unit's files' times: its time, shared in the proportions of their
-- times before (a lane's files run in one process, timed together).
local function record_times(units, times)
  for _, unit in ipairs(units) do
    local before = 0
    for _, f in ipairs(unit.files) do before = before + (times[f] or DEFAULT_SECONDS) end
    for _, f in ipairs(unit.files) do
      times[f] = unit.seconds_taken * (times[f] or DEFAULT_SECONDS) / before
    end
  end
  local names = {}
  for f in pairs(times) do
    local there = io.open(f)
    if there then there:close(); names[#names + 1] = f end -- a file since removed is forgotten
  end
  table.sort(names)
  local out = assert(io.open(TIMES_FILE, "w"))
  out:write("# seconds each spec file took in `make test` (luajit spec/support/parallel_run.lua --record)\n")
  for _, f in ipairs(names) do out:write(("%s %.1f\n"):format(f, times[f])) end
  out:close()
end

-- Each file a sanitizer wrote in folder `dir` (nil: none asked) counts as a
-- failure; their text is shown.
local function findings(dir, total)
  if not dir then return end
  local p = io.popen("ls " .. shell_quote(dir) .. " 2>/dev/null")
  for name in p:lines() do
    total.failed = total.failed + 1
    io.write(("---- sanitizer finding %s ----\n%s\n"):format(name, read_file(dir .. "/" .. name) or ""))
  end
  p:close()
end

local function run(o)
  for _, path in ipairs(o.paths) do
    local there = io.open(path)
    if not there then
      io.write("no such spec file or folder: ", path, "\n0 passed, 1 failed\n")
      return false
    end
    there:close()
  end
  local times = load_times()
  local files = spec_files(o.paths)
  if #files == 0 then
    io.write("no spec file (*_spec.lua) under ", table.concat(o.paths, " "), "\n0 passed, 1 failed\n")
    return false
  end
  local units = make_units(files, times)
  local dir = os.tmpname()
  os.remove(dir)
  assert(os.execute("mkdir -p " .. dir) == 0)
  local total = { passed = 0, failed = 0, pending = 0, failed_units = {} }
  local began, next_unit, running = now(), 1, {}
  io.write(("running %d spec files, %d busted processes at once\n"):format(#files, o.jobs))
  while next_unit <= #units or #running > 0 do
    while next_unit <= #units and may_start(units[next_unit], running, o.jobs) do
      start(units[next_unit], o, dir, next_unit)
      running[#running + 1] = units[next_unit]
      next_unit = next_unit + 1
    end
    sleep_ms(50)
    for i = #running, 1, -1 do
      if read_file(running[i].status_file) then
        finish(running[i], total, o)
        table.remove(running, i)
      end
    end
  end
  os.execute("rm -rf " .. shell_quote(dir))
  if o.record then record_times(units, times) end
  findings(o.findings, total)
  for _, unit in ipairs(total.failed_units) do io.write("failed: ", table.concat(unit.files, " "), "\n") end
  if total.pending > 0 then io.write(total.pending, " pending\n") end
  io.write(("%.1f s in all\n"):format(now() - began))
  io.write(("%d passed, %d failed\n"):format(total.passed, total.failed))
  return total.failed == 0
end

os.exit(run(parse_args(arg)) and 0 or 1)
