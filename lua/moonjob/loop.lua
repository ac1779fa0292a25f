-- moonjob.loop -- running the shared event loop from Lua.
--
-- One libuv loop serves every pool of the program (moonjob.core keeps it in
-- the Lua registry). Blocking calls (job:wait, pool:run, pool:drain, ...) run
-- it with wait_until; Ctrl-C during such a call raises an "interrupted" error
-- (moonjob.errors.interrupted) and leaves every pool usable. defer() runs a
-- function on a later loop turn, so results known at once (a job refused by
-- add) still arrive asynchronously.
--
-- A program with an event loop of its own (luv, cqueues, ...) drives this one
-- instead: it watches fd() for reading and calls step() when it is readable
-- and when timeout() milliseconds have passed (see docs/guide/embedding.md).
-- Blocking calls still work then, and block that loop.
local core = require "moonjob.core"
local errors = require "moonjob.errors"

local M = {}

local deferred, ndeferred = {}, 0
local defer_timer = nil

local function run_deferred()
  local batch, n = deferred, ndeferred
  deferred, ndeferred = {}, 0
  for i = 1, n do batch[i]() end
end

-- loop.defer(fn): fn() runs on the next turn of the loop.
function M.defer(fn)
  if not defer_timer then defer_timer = core.timer(run_deferred) end
  ndeferred = ndeferred + 1
  deferred[ndeferred] = fn
  if ndeferred == 1 then defer_timer:start(0) end
end

-- The errors carry no position: they are about the wait, not about a line.
local function wait(done)
  while not done() do
    local alive, err, signum = core.run("once")
    if err == "interrupted" then
      M.signal = signum
      error(errors.interrupted(signum), 0)
    elseif err == "reentered" then
      error("cannot wait inside a moonjob event callback; use pool:on() events there", 0)
    elseif not alive and not done() then
      error("moonjob: the loop has nothing left to run but the wait is not over", 0)
    end
  end
end

-- loop.wait_until(done): runs the loop until done() is true. Raises
-- errors.interrupted(signum) on Ctrl-C (or on SIGTERM and SIGHUP in a program
-- that holds them, core.hold_stop_signals; loop.signal is then the signal's
-- number), and a clear error when called from inside a moonjob callback (the
-- loop cannot run inside itself).
function M.wait_until(done)
  if done() then return end
  core.catch_sigint(true)
  local ok, err = pcall(wait, done)
  core.catch_sigint(false)
  if not ok then error(err, 0) end
end

------------------------------------------------------ async tasks ---
-- A task started with loop.async runs in a coroutine of its own; inside it,
-- loop.await yields until a callback comes instead of running the loop, so
-- blocking-style calls (a queue's methods, which wait with await) work from
-- inside loop callbacks (the dashboard's request handlers). Anywhere else
-- await runs the loop as wait_until does. Only coroutines made by
-- loop.async yield: a user's own coroutines keep the blocking behaviour.

local async_tasks = setmetatable({}, { __mode = "k" })

local function resume(co, ...)
  local ok, err = coroutine.resume(co, ...)
  if not ok then
    io.stderr:write("moonjob: error in an async task: ", debug.traceback(co, tostring(err)), "\n")
  end
end

-- loop.async(fn, ...): fn(...) runs now, as a task, until its first await.
function M.async(fn, ...)
  local co = coroutine.create(fn)
  async_tasks[co] = true
  resume(co, ...)
end

-- loop.await(start) -> what start's callback was given: start(cb) begins
-- something that calls cb(...) once, now or on a later turn.
function M.await(start)
  local co = coroutine.running()
  if co and async_tasks[co] then
    local waiting, early = false, nil
    start(function(...)
      if waiting then return resume(co, ...) end
      early = { n = select("#", ...), ... }
    end)
    if early then return unpack(early, 1, early.n) end
    waiting = true
    return coroutine.yield()
  end
  local values
  start(function(...) values = { n = select("#", ...), ... } end)
  M.wait_until(function() return values ~= nil end)
  return unpack(values, 1, values.n)
end

------------------------------------------------- inside another loop ---

-- loop.fd() -> the descriptor a host loop watches for reading (libuv's
-- backend, epoll). From the first call on, anything moonjob is asked to do
-- from outside its own callbacks also makes it readable.
function M.fd()
  return core.backend_fd()
end

-- loop.step() -> true while moonjob has something to watch (a pool open, a
-- timer), false once it has nothing. Runs what is ready and returns at once.
-- Raises inside a moonjob callback (as blocking calls do), and on a stop
-- signal of a program that holds them (core.hold_stop_signals).
function M.step()
  local alive, err, signum = core.step()
  if err == "interrupted" then
    M.signal = signum
    error(errors.interrupted(signum), 0)
  elseif err == "reentered" then
    error("moonjob.step() cannot run inside a moonjob event callback; it runs them", 2)
  end
  return alive
end

-- loop.timeout() -> milliseconds until step() is due even if fd() stays
-- quiet (0: now), or nil when only fd() can bring it work. Read it again
-- after each step().
function M.timeout()
  return core.backend_timeout()
end

-- loop.now() -> milliseconds from an arbitrary origin, sub-millisecond
-- precision: CLOCK_MONOTONIC, the clock of core.hrtime(), read through the
-- FFI (the vDSO: no system call, and no trace abort for the JIT on the pool's
-- paths that call it for every job).
local ffi = require "ffi"
ffi.cdef [[
struct moonjob_timespec { long tv_sec; long tv_nsec; };
int clock_gettime(int clock, struct moonjob_timespec *ts);
]]
local CLOCK_MONOTONIC = 1
local ts = ffi.new("struct moonjob_timespec")

function M.now()
  ffi.C.clock_gettime(CLOCK_MONOTONIC, ts)
  return tonumber(ts.tv_sec) * 1e3 + tonumber(ts.tv_nsec) / 1e6
end

return M
