-- moonjob.pool.breaker -- start failures: the circuit breaker and its back-off.
--
-- A part of the pool (see pool/init.lua), pool.breaker. Start failures (a
-- processor that cannot load, a child not ready within start_timeout, a child
-- that cannot be spawned) open a circuit breaker: while no child is ready or
-- starting, jobs that would be dispatched fail at once with the start error
-- (each counts an attempt, so jobs with attempts left retry after their
-- backoff, and not before the next probe: a failed probe costs a job one
-- attempt at most). Children are then started one at a time, with a back-off
-- of 0.1 s doubling up to 30 s, so a broken file never turns into a fork
-- storm; a child that becomes ready closes the breaker. Healthy children keep
-- running jobs meanwhile: only when no child can run at all do jobs fail.
--
-- A job fails only on a start failure that happened while it waited, never
-- on one from before it was added: a job added while the breaker is open
-- waits for the next probe (a fresh child), which then comes no later than
-- FRESH_PROBE_MS after the last failure however long the back-off has grown,
-- so a file fixed meanwhile runs it, and one still broken fails it soon.
--
-- Owns: the last start failure's error (nil while starts are healthy; the
-- breaker may open only while it is set), how many failed in a row (the
-- back-off), when the last one happened, the time before which no probe
-- starts, whether a pass over the ready jobs is due and which error the last
-- one was for, the probe timer; and on each job, job.failed_by: the start
-- error that last cost it an attempt.
-- Exposes: breaker:failed(err), breaker:succeeded(), breaker:failing() -> the
-- start error or nil, breaker:stalled() (failing, and no child live), breaker:check() (after every pump), breaker:probe(target)
-- (children:ensure while starts fail), breaker:child_broken(child, err),
-- breaker:close().
-- Calls: pool.children (live, spawn, ensure, retire), pool.dispatch:pump,
-- pool.endings:fail, pool.source; pool.ndeferred (drain waits for a pass due).
--
-- Caveats: a child that failed to start is killed and stops counting at once
-- (child_broken), not at its exit, which a process it started in a session
-- of its own can hold back for as long as it holds the channel. The breaker
-- fails jobs on a later loop turn, never inside add.
local core = require "moonjob.core"
local loop = require "moonjob.loop"
local errors = require "moonjob.errors"

local Breaker = {}
Breaker.__index = Breaker

local BACKOFF_FIRST_MS, BACKOFF_MAX_MS = 100, 30000
local FRESH_PROBE_MS = 1000 -- the longest a job added after the last failure waits for a probe

-- Breaker.new(pool) -> a closed breaker.
function Breaker.new(pool)
  local self = setmetatable({ pool = pool, failures = 0, due = false }, Breaker)
  -- made once: check() runs after every pump and must make no closure
  self.pass = function() self:run_pass() end
  return self
end

-- The last start failure's error while starts fail, else nil.
function Breaker:failing()
  return self.start_error
end

-- Whether starts fail and no child is ready or starting: nothing can run.
function Breaker:stalled()
  return self.start_error ~= nil and self.pool.children:live() == 0
end

-- A child could not load the processor, become ready in time, or start at
-- all: the breaker opens (see the top of this file) and the next start waits
-- longer each time.
function Breaker:failed(err)
  self.start_error = err
  self.failures = self.failures + 1
  self.failed_at = loop.now()
  self.next_spawn_at = self.failed_at
    + math.min(BACKOFF_FIRST_MS * 2 ^ (self.failures - 1), BACKOFF_MAX_MS)
end

-- A child became ready: the processor loads, so starts are healthy again (the
-- breaker closes and the back-off starts over).
function Breaker:succeeded()
  self.start_error, self.failures, self.next_spawn_at = nil, 0, nil
  self.failed_at, self.passed = nil, nil
end

-- True while starts fail and no child is ready or starting: then no waiting
-- job can run.
function Breaker:is_open()
  if not self.start_error or self.pool.closing then return false end
  local ready, starting = self.pool.children:live()
  return ready + starting == 0
end

-- The breaker's pass, on a later loop turn (see check).
function Breaker:run_pass()
  local pool = self.pool
  self.due = false
  pool.ndeferred = pool.ndeferred - 1
  if self:is_open() then self:fail_ready_jobs(self.start_error) end
  pool.dispatch:pump()
end

-- While the breaker is open, the jobs that could run fail with the start
-- error, on a later loop turn (never inside add); one pass per error: the
-- jobs ready after it wait for the next probe.
function Breaker:check()
  if self.due or self.passed == self.start_error or self.pool.source:ready_count() == 0
      or not self:is_open() then
    return
  end
  self.due = true
  self.pool.ndeferred = self.pool.ndeferred + 1
  loop.defer(self.pass)
end

-- Every job that may run now and was added before the failure fails with
-- err, the failed probe's error (an attempt each). A job with attempts left
-- comes back after its backoff, and not before the next probe is due: each
-- failed probe costs a job at most one attempt, whatever its backoff (none
-- included). So a job this probe already failed is ready again only once the
-- next probe is due (the clock may have crossed that time since the pool last
-- looked), and it waits for that probe, as a job added after the failure does.
function Breaker:fail_ready_jobs(err)
  local pool = self.pool
  local source = pool.source
  local kept = {}
  for _ = 1, source:ready_count() do
    local job = source:pop_ready()
    if not job then break end
    if job.failed_by == err or job.added > self.failed_at then
      kept[#kept + 1] = job
    else
      job.failed_by, job.attempts = err, job.attempts + 1
      pool.endings:fail(job, errors.new(err.code, err.message, err), self.next_spawn_at)
    end
  end
  for i = 1, #kept do source:push(kept[i]) end
  self.passed = err
end

-- While starts fail: one probe at a time, once the back-off has passed. A
-- child that failed to start holds no place even before its exit reaches the
-- pool (a processor's setsid'd process may hold its channel open for long).
function Breaker:probe(target)
  local children = self.pool.children
  local ready, starting = children:live()
  if starting > 0 or ready >= target then return end
  local due = self.next_spawn_at
  if self.pool.source:ready_count() > 0 then -- jobs no probe has failed yet wait for one
    due = math.min(due, self.failed_at + FRESH_PROBE_MS)
  end
  local wait_ms = due - loop.now()
  if wait_ms > 0 then return self:probe_later(wait_ms) end
  return children:spawn()
end

-- Looks again at how many children the pool wants in `ms` (the back-off),
-- through the pump: a probe that cannot even be spawned is a failure whose
-- pass (check) must follow.
function Breaker:probe_later(ms)
  if not self.probe_timer then
    self.probe_timer = core.timer(function() self.pool.dispatch:pump() end)
  end
  self.probe_timer:start(ms)
end

-- A child could not start (LOADERR, start_timeout): its process group is
-- killed, it holds no place in the pool from now on, and the breaker opens
-- now, not at its exit, which a process it started in a session of its own
-- (out of the group's reach) can hold back for as long as it holds the channel.
function Breaker:child_broken(child, err)
  -- once per child: a LOADERR read after start_timeout killed it is that same failure
  if child.start_reported then return end
  child.start_reported = true
  self.pool.children:retire(child, true)
  self:failed(err)
  self.pool.dispatch:pump()
end

function Breaker:close()
  if self.probe_timer then self.probe_timer:close(); self.probe_timer = nil end
end

return Breaker
