-- moonjob.pool.deadlines -- what the pool does when a deadline passes.
--
-- Methods mixed into the Pool class (see pool/init.lua). Deadlines are the
-- parent's, never the child's: at a job's soft deadline (or on cancel) the
-- child is interrupted and its processor's cleanup runs; at the hard
-- deadline, kill_after seconds later, the child's process group is SIGKILLed,
-- the job fails with killed = true, and a new child replaces it. A child that
-- has not taken its job within ack_timeout is replaced and the job goes back
-- to the head of the queue without counting an attempt; so does a job whose
-- child died before taking it (the child marks the jobs it takes in a page
-- shared with the parent, see core/frame.h). A child not ready within
-- start_timeout is a start failure (moonjob.pool.breaker).
--
-- Each worker has one timer (moonjob.worker): armed for start_timeout until
-- the child is ready, then for the running job's timeout, then for
-- kill_after once the job was interrupted; when it fires, the pool tells from
-- the worker's state which deadline it was. Acknowledgements are checked by
-- the sweep (moonjob.pool.children), not by a timer per job.
--
-- Caveat: the soft deadline cannot stop JIT-compiled loops or C calls (no
-- hook runs there); the hard kill always can.
local errors = require "moonjob.errors"

local Pool = {}

-- Asks the child to stop a job it holds (soft deadline, cancel); the hard
-- deadline follows kill_after seconds later (for a job queued behind the
-- head, from when it becomes the head: moonjob.pool.pipeline).
function Pool:_interrupt(w, job, fields)
  job.interrupt = fields
  w:interrupt(job, fields)
  if w.job == job then w:arm(job.kill_after or self.kill_after) end
end

-- The soft deadline: the job ran past its timeout; it is interrupted.
function Pool:_job_timed_out(w, job)
  self.counts.timeouts = self.counts.timeouts + 1
  self:_interrupt(w, job, { code = "ETIMEDOUT", reason = "timeout",
    message = ("the job ran past its timeout (%s s)"):format(tostring(job.timeout or self.timeout)) })
end

-- The hard deadline: the child's process group is killed now and the job
-- fails now; the child's exit later only frees its slot.
function Pool:_kill_job(w, job)
  local f = job.interrupt
  w.killed_for = job
  local killed = self:_retire(w, true)
  w:end_job()
  self:_take_back(w) -- the jobs it held behind this one run elsewhere
  local how = "its child had already exited"
  if killed then
    self.counts.killed = self.counts.killed + 1
    how = ("the child was killed after kill_after (%s s)"):format(tostring(job.kill_after or self.kill_after))
  end
  self:_fail(job, errors.new(f.code, f.message .. "; " .. how, { killed = killed and true or nil,
    reason = f.reason }))
  self:_pump()
end

-- A child not ready within start_timeout is killed: a start failure.
function Pool:_start_timed_out(w)
  self:_worker_broken(w, errors.new("ELOAD",
    ("the processor did not become ready within %s s (start_timeout)"):format(tostring(self.start_timeout))))
end

-- A child that has not taken its job in time is replaced; the job is given
-- back (see _give_back).
function Pool:_unacknowledged(w)
  local head = w.job
  w.killed_for = head
  self:_retire(w, true)
  self:_take_back(w) -- the head with the rest, unless its child started it after all
  if w.job == head then -- it did, an instant before the kill: that run counts
    w:end_job()
    self:_fail(head, errors.new("ECRASH", ("the child started the job only after ack_timeout "
      .. "(%s s) and was killed"):format(tostring(self.ack_timeout)), { killed = true }))
  end
  self:_pump()
end

return Pool
