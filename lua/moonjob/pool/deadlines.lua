-- moonjob.pool.deadlines -- what the pool does when a deadline passes.
--
-- A part of the pool (see pool/init.lua), pool.deadlines. Deadlines are the
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
-- A batch of lines (moonjob.pool.lines) is the exception: its timeout is
-- each line's, whose soft deadline the child enforces itself; when the
-- batch's timer fires the parent looks at the line running (the shared
-- page) and kills the child's group once that line has run timeout +
-- kill_after, else re-arms for that line's hard deadline. The killed batch
-- keeps what its finished lines wrote (job.batch_state): the line running
-- fails ETIMEDOUT (killed), as a job of its own would, and the lines after
-- go back to their owner.
--
-- Each child has one timer (moonjob.pool.child): armed for start_timeout
-- until the child is ready, then for the running job's timeout, then for
-- kill_after once the job was interrupted; when it fires, the sink tells from
-- the child's state which deadline it was. Acknowledgements are checked by
-- the sweep (moonjob.pool.children), not by a timer per job.
--
-- Owns: nothing (the timers are the children's).
-- Exposes: deadlines:interrupt(child, job, fields), deadlines:hasten_kill(job, s),
-- deadlines:job_timed_out(child, job), deadlines:kill_job(child, job),
-- deadlines:start_timed_out(child), deadlines:unacknowledged(child).
-- Calls: pool.children:retire, pool.dispatch (take_back, pump),
-- pool.endings:fail, pool.breaker:child_broken, pool.tally:bump,
-- pool.lines:line_overdue (a batch's hard deadline).
--
-- Caveat: the soft deadline cannot stop JIT-compiled loops or C calls (no
-- hook runs there); the hard kill always can.
local errors = require "moonjob.errors"

local Deadlines = {}
Deadlines.__index = Deadlines

function Deadlines.new(pool)
  return setmetatable({ pool = pool }, Deadlines)
end

-- Asks the child to stop a job sent to it (soft deadline, cancel); the hard
-- deadline follows kill_after seconds later (for a job prefetched behind the
-- head, from when it becomes the head: moonjob.pool.dispatch).
function Deadlines:interrupt(child, job, fields)
  job.interrupt = fields
  child:interrupt(job, fields)
  if child.job == job then child:arm(job.kill_after or self.pool.kill_after) end
end

-- A running job already interrupted gets its hard deadline `seconds` from
-- now instead; false when the job is not such a job.
function Deadlines:hasten_kill(job, seconds)
  if not (job.interrupt and job.child and job.state == "active") then return false end
  job.child:arm(seconds)
  return true
end

-- The soft deadline: the job ran past its timeout; it is interrupted. A
-- batch of lines: its line running is killed at its hard deadline.
function Deadlines:job_timed_out(child, job)
  local pool = self.pool
  local fields = { code = "ETIMEDOUT", reason = "timeout",
    message = ("the job ran past its timeout (%s s)"):format(tostring(job.timeout or pool.timeout)) }
  if job.first_line then
    local overdue, seconds = pool.lines:line_overdue(child, job)
    if not overdue then return child:arm(math.max(seconds, 0.001)) end
    pool.tally:bump("timeouts")
    job.interrupt = fields
    return self:kill_job(child, job)
  end
  pool.tally:bump("timeouts")
  self:interrupt(child, job, fields)
end

-- The hard deadline: the child's process group is killed now and the job
-- fails now; the child's exit later only frees its slot.
function Deadlines:kill_job(child, job)
  local pool = self.pool
  local f = job.interrupt
  child.killed_for = job
  local batch = job.first_line
  if batch then child:batch_cut(job) end -- it starts no more lines: what it did stays as read below
  local killed = pool.children:retire(child, true)
  if batch then job.batch_state = child:batch_state(job) end
  child:end_job()
  pool.dispatch:take_back(child) -- the jobs sent to it behind this one run elsewhere
  local how = "its child had already exited"
  if killed then
    pool.tally:bump("killed")
    how = ("the child was killed after kill_after (%s s)"):format(tostring(job.kill_after or pool.kill_after))
  end
  pool.endings:fail(job, errors.new(f.code, f.message .. "; " .. how, { killed = killed and true or nil,
    reason = f.reason }))
  pool.dispatch:pump()
end

-- A child not ready within start_timeout is killed: a start failure. The
-- deadline is looked at once more after the loop has read what the children
-- sent (libuv runs timers before it reads): a parent that did not run for a
-- while (a busy machine, a REPL at its prompt) must not kill a child whose
-- READY is already waiting in the channel.
function Deadlines:start_timed_out(child)
  if not child.start_overdue then
    child.start_overdue = true
    return child:arm(0.001)
  end
  self.pool.breaker:child_broken(child, errors.new("ELOAD",
    ("the processor did not become ready within %s s (start_timeout)"):format(tostring(self.pool.start_timeout))))
end

-- A child that has not taken its job in time is replaced; the job is given
-- back (see endings:give_back).
function Deadlines:unacknowledged(child)
  local pool = self.pool
  local head = child.job
  child.killed_for = head
  pool.children:retire(child, true)
  pool.dispatch:take_back(child) -- the head with the rest, unless the child started it after all
  if child.job == head then -- it did, an instant before the kill: that run counts
    child:end_job()
    pool.endings:fail(head, errors.new("ECRASH", ("the child started the job only after ack_timeout "
      .. "(%s s) and was killed"):format(tostring(pool.ack_timeout)), { killed = true }))
  end
  pool.dispatch:pump()
end

return Deadlines
