-- spec/support/helpers.lua -- shared fixtures for the specs.
--
-- pool(file, opts): a pool on a fixture file, echo off, closed after each test
-- by cleanup(). wait_for(pred, seconds): runs the loop until pred() or fails
-- the test after a generous bound that only catches hangs.
local moonjob = require "moonjob"
local core = require "moonjob.core"
local loop = require "moonjob.loop"

local M = {}

-- The command that runs luajit on this tree's modules. `make sanitize` sets
-- MOONJOB_CPATH (its build) and MOONJOB_PRELOAD (the ASan runtime, preloaded
-- into luajit only, never into the shell tools the specs use).
local preload = os.getenv("MOONJOB_PRELOAD")
if os.getenv("LD_PRELOAD") then -- loaded into this luajit already; not into the tools it starts
  local ffi = require "ffi"
  ffi.cdef "int unsetenv(const char *name);"
  ffi.C.unsetenv("LD_PRELOAD")
end
local cpath = os.getenv("MOONJOB_CPATH") or "build/?.so"
M.LUAJIT = ('env LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="%s;;" %sluajit')
  :format(cpath, preload and ("LD_PRELOAD=" .. preload .. " ") or "")
-- The build directory in use (build, or build-sanitize under make sanitize).
M.BUILD = cpath:match("^(.*)/%?%.so$")
M.SANITIZED = preload ~= nil

-- The RLIMIT_DATA a child gets under a memory cap of `cap` bytes, as
-- /proc/self/limits writes it: twice the cap and 256 MiB; the sanitized
-- build sets none (its shadow memory would not fit).
function M.data_backstop(cap)
  if M.SANITIZED then return "unlimited" end
  return 2 * cap + 256 * 1024 * 1024
end

local open_pools = {}

-- A hang catcher: a spec that runs the loop for more than HANG_SECONDS after
-- its last pool was created (or its last bounded wait began) ends the run with a message, instead of hanging CI.
-- busted loads this file afresh for each spec file (insulation), so the
-- catcher and its clock live once per process, in the registry: a catcher per
-- load would keep the clock of a spec file long finished.
local HANG_SECONDS = 60
-- Before such an exit, every process this one started is SIGKILLed with its
-- process group, by pid: a child stopped (SIGSTOP) by a spec cannot act on
-- its parent's death, and would outlive the run.
local function kill_own_children()
  local ffi = require "ffi"
  pcall(ffi.cdef, "int getpid(void);")
  local ps = io.popen("ps -o pid= --ppid " .. ffi.C.getpid())
  for pid in ps:read("*a"):gmatch("%d+") do
    os.execute(("kill -9 -%s 2>/dev/null; kill -9 %s 2>/dev/null"):format(pid, pid)) -- group, then pid
  end
  ps:close()
end

local progress = debug.getregistry()["moonjob.spec.progress"]
if not progress then
  progress = { last = core.hrtime() }
  debug.getregistry()["moonjob.spec.progress"] = progress
  progress.watchdog = core.timer(function()
    if (core.hrtime() - progress.last) / 1e9 > HANG_SECONDS then
      io.stderr:write("\nspec/support/helpers.lua: a spec hung for ", HANG_SECONDS, " s; stopping the run\n",
        debug.traceback(), "\n")
      kill_own_children()
      os.exit(3)
    end
  end)
  progress.watchdog:start(1000, 1000)
  progress.watchdog:unref()
end

-- path made absolute (relative to the current directory).
function M.abs(path)
  if path:sub(1, 1) == "/" then return path end
  return os.getenv("PWD") .. "/" .. path
end

function M.fixture(name)
  return "spec/fixtures/" .. name
end

function M.pool(name, opts)
  opts = opts or {}
  if opts.echo == nil then opts.echo = false end
  progress.last = core.hrtime()
  local pool, err = moonjob.pool(M.fixture(name), opts)
  assert(pool, tostring(err))
  open_pools[#open_pools + 1] = pool
  return pool
end

function M.cleanup()
  progress.last = core.hrtime()
  for _, pool in ipairs(open_pools) do pool:close() end
  open_pools = {}
end

-- Runs the loop until pred() is true, looking at least every 20 ms; raises
-- after `seconds` (default 10).
function M.wait_for(pred, seconds)
  progress.last = core.hrtime() -- a bounded wait of its own
  local deadline = false
  local timer = core.timer(function() deadline = true end)
  timer:start((seconds or 10) * 1000)
  -- pred may watch something outside the loop (a file, a process): look every 20 ms
  local poll = core.timer(function() end)
  poll:start(20, 20)
  local ok, err = pcall(loop.wait_until, function() return deadline or pred() end)
  timer:close()
  poll:close()
  assert(ok, err)
  assert(not deadline or pred(), "timed out waiting")
end

-- Waits until the child running `job` has started it (white box: the gate
-- in the shared page). "active" alone is the parent's view: a child killed
-- before it took the job gives it back to run again, which is not a crash.
function M.wait_started(job)
  M.wait_for(function() return job.state == "active" and job.child ~= nil and job.child:started(job) end)
end

-- Sleeps while running the loop (the loop keeps serving the pools).
function M.sleep(seconds)
  progress.last = core.hrtime()
  local done = false
  local timer = core.timer(function() done = true end)
  timer:start(seconds * 1000)
  loop.wait_until(function() return done end)
  timer:close()
end

-- Waits, without running the loop, until the dead child pid is a zombie
-- (dead, not yet reaped by moonjob). Bounded: raises after 5 s.
function M.wait_until_zombie(pid)
  for _ = 1, 500 do
    local f = io.open("/proc/" .. pid .. "/stat")
    local state = f and f:read("*l"):match("^%d+ %b() (%a)")
    if f then f:close() end
    if state == "Z" then return end
    os.execute("sleep 0.01")
  end
  error("process " .. pid .. " did not die")
end


-- The parent's open descriptors (0 to 4095), as a set of "fd -> target"
-- strings. Pipes are left out: moonjob's channels and output pipes are
-- sockets. Read in this process: once it has a child it is not dumpable, and
-- another process of a user other than root cannot list its /proc/PID/fd.
function M.open_fds()
  local ffi = require "ffi"
  pcall(ffi.cdef, "long readlink(const char *path, char *buf, unsigned long size);")
  local set, buf = {}, ffi.new("char[4096]")
  for fd = 0, 4095 do
    local n = tonumber(ffi.C.readlink("/proc/self/fd/" .. fd, buf, 4096))
    local target = n > 0 and ffi.string(buf, n)
    if target and not target:match("^pipe:") then set[fd .. " -> " .. target] = true end
  end
  return set
end

-- The lines of file `path`, in a list.
function M.lines(path)
  local list = {}
  for line in io.lines(path) do list[#list + 1] = line end
  return list
end

-- Whether a file `path` exists (the handle that tells is closed).
function M.exists(path)
  local f = io.open(path)
  if f then f:close() end
  return f ~= nil
end

function M.write_file(path, text)
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
  return path
end

-- A fresh empty directory under /tmp.
function M.tmpdir()
  local path = os.tmpname()
  os.remove(path)
  assert(os.execute("mkdir -p " .. path) == 0)
  return path
end

-- The first line a shell command prints (its shell is reaped before return).
function M.first_line(command)
  local p = io.popen(command)
  local line = p:read("*l")
  p:close()
  return line
end

-- True when the specs run as root (CI does): mounting, dropping to a user.
M.AS_ROOT = M.first_line("id -u") == "0"

-- The state letter of a process (R, S, Z, ...), or nil when there is none.
local function process_state(pid)
  local f = io.open("/proc/" .. pid .. "/stat")
  if not f then return nil end
  local line = f:read("*l")
  f:close()
  return line and line:match("^%d+ %b() (%a)")
end

-- True while pid runs: a zombie (dead, unreaped; this machine's init may not
-- reap) counts as gone.
function M.running(pid)
  local state = process_state(pid)
  return state ~= nil and state ~= "Z" and state ~= "X"
end

-- The pids of the running (not zombie) processes of process group pgid.
function M.group_members(pgid)
  local members = {}
  local listing = io.popen("ls /proc")
  for name in listing:lines() do
    local f = name:match("^%d+$") and io.open("/proc/" .. name .. "/stat")
    local line = f and f:read("*l")
    if f then f:close() end
    local state, group = (line or ""):match("^%d+ %b() (%a) %d+ (%d+)")
    if group and tonumber(group) == pgid and state ~= "Z" and state ~= "X" then
      members[#members + 1] = tonumber(name)
    end
  end
  listing:close()
  return members
end

-- Waits, without running the loop, until no process of group pgid runs.
-- Bounded: returns what still runs after `seconds` (default 5).
function M.wait_group_gone(pgid, seconds)
  local members
  for _ = 1, (seconds or 5) * 50 do
    members = M.group_members(pgid)
    if #members == 0 then return members end
    os.execute("sleep 0.02")
  end
  return members
end

-- True while pid names a process at all, running or dead and not yet reaped:
-- for this process's own children (a pool's), which moonjob must reap. A
-- process started in the background by a shell is an orphan that only PID 1
-- reaps, seconds later on some machines: wait on those with M.running.
function M.unreaped(pid)
  return process_state(pid) ~= nil
end

-- Runs a shell command; returns its stdout, stderr and exit status.
function M.sh(command, stdin)
  local tmp = os.tmpname()
  local err = os.tmpname()
  local full = "(" .. command .. ") >" .. tmp .. " 2>" .. err
  if stdin then
    local input = os.tmpname()
    local f = assert(io.open(input, "wb")); f:write(stdin); f:close()
    full = full .. " <" .. input
  end
  local status = os.execute(full)
  local function slurp(path)
    local f = assert(io.open(path, "rb")); local s = f:read("*a"); f:close(); os.remove(path)
    return s
  end
  return slurp(tmp), slurp(err), status / 256 -- os.execute gives the wait status in Lua 5.1
end

-- Milliseconds since the epoch (the wall clock: runs logged by processes
-- on several hosts compared against events the spec caused).
local ffi = require "ffi"
if not pcall(ffi.typeof, "struct moonjob_spec_timeval") then
  ffi.cdef [[
struct moonjob_spec_timeval { long tv_sec; long tv_usec; };
int gettimeofday(struct moonjob_spec_timeval *tv, void *tz);
]]
end
function M.wall_ms()
  local tv = ffi.new("struct moonjob_spec_timeval")
  ffi.C.gettimeofday(tv, nil)
  return tonumber(tv.tv_sec) * 1000 + math.floor(tonumber(tv.tv_usec) / 1000)
end

return M
