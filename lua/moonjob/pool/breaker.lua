-- moonjob.pool.breaker -- start failures: the circuit breaker and its back-off.
--
-- Methods mixed into the Pool class (see pool/init.lua). Start failures (a
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
-- State: pool.start_error (the last start failure's error, nil while starts
-- are healthy; the breaker may open only while it is set), start_failures
-- (how many in a row, for the back-off), next_spawn_at (loop.now() ms before
-- which no probe starts), breaker_due (a pass over the ready jobs is
-- deferred), and on each job, job.failed_by: the start error that last cost
-- it an attempt.
--
-- Caveats: a child that failed to start is killed and stops counting at once
-- (_worker_broken), not at its exit, which a process it started in a session
-- of its own can hold back for as long as it holds the channel. The breaker
-- fails jobs on a later loop turn, never inside add.
local loop = require "moonjob.loop"
local errors = require "moonjob.errors"

local Pool = {}

local BACKOFF_FIRST_MS, BACKOFF_MAX_MS = 100, 30000

-- A child could not load the processor, become ready in time, or start at
-- all: the breaker opens (see the top of this file) and the next start waits
-- longer each time.
function Pool:_start_failed(err)
  self.start_error = err
  self.start_failures = self.start_failures + 1
  self.next_spawn_at = loop.now()
    + math.min(BACKOFF_FIRST_MS * 2 ^ (self.start_failures - 1), BACKOFF_MAX_MS)
end

-- A child became ready: the processor loads, so starts are healthy again (the
-- breaker closes and the back-off starts over).
function Pool:_start_succeeded()
  self.start_error, self.start_failures, self.next_spawn_at = nil, 0, nil
end

-- True while starts fail and no child is ready or starting: then no waiting
-- job can run.
function Pool:_breaker_open()
  if not self.start_error or self.closing then return false end
  local ready, starting = self:_live_workers()
  return ready + starting == 0
end

-- The breaker's pass, on a later loop turn (see _check_breaker).
function Pool:_breaker_pass()
  return function()
    self.breaker_due = false
    self.ndeferred = self.ndeferred - 1
    if self:_breaker_open() then self:_fail_ready_jobs(self.start_error) end
    self:_pump()
  end
end

-- While the breaker is open, the jobs that could run fail with the start
-- error, on a later loop turn (never inside add). No closure is made here:
-- _pump calls this for every job and must stay compiled (see _pump_later).
function Pool:_check_breaker()
  if self.breaker_due or self.source:ready_count() == 0 or not self:_breaker_open() then return end
  self.breaker_due = true
  self.ndeferred = self.ndeferred + 1
  loop.defer(self:_breaker_pass())
end

-- Every job that may run now fails with err, the failed probe's error (an
-- attempt each). A job with attempts left comes back after its backoff, and
-- not before the next probe is due: each failed probe costs a job at most one
-- attempt, whatever its backoff (none included). So a job this probe already
-- failed is ready again only once the next probe is due (the clock may have
-- crossed that time since the pool last looked): that probe starts now, and
-- the jobs still waiting wait for it.
function Pool:_fail_ready_jobs(err)
  for _ = 1, self.source:ready_count() do
    local job = self.source:pop_ready()
    if not job then break end
    if job.failed_by == err then
      self.source:push(job)
      return self:_ensure_workers()
    end
    job.failed_by, job.attempts = err, job.attempts + 1
    self:_fail(job, errors.new(err.code, err.message, err), self.next_spawn_at)
  end
end

-- While starts fail: one probe at a time, once the back-off has passed. A
-- child that failed to start holds no place even before its exit reaches the
-- pool (a processor's setsid'd process may hold its channel open for long).
function Pool:_probe(target)
  local ready, starting = self:_live_workers()
  if starting > 0 or ready >= target then return end
  local wait_ms = self.next_spawn_at - loop.now()
  if wait_ms > 0 then return self:_respawn_later(wait_ms) end
  return self:_spawn()
end

-- A child could not start (LOADERR, start_timeout): its process group is
-- killed, it holds no place in the pool from now on, and the breaker opens
-- now, not at its exit, which a process it started in a session of its own
-- (out of the group's reach) can hold back for as long as it holds the channel.
function Pool:_worker_broken(w, err)
  w.start_reported = true
  self:_retire(w, true)
  self:_start_failed(err)
  self:_pump()
end

return Pool
