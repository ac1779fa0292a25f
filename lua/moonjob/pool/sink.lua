-- moonjob.pool.sink -- how a worker reports to its pool: the worker sink.
--
-- Methods of the Pool class itself (copied into it by pool/init.lua): the
-- pool's one entry for its workers. A worker (moonjob.worker, the parent's
-- side of one child) tells its pool what happened through these methods and
-- no other: every frame, line of output, timer and exit of a
-- child arrives here, and each method turns it into pool actions (a job's
-- ending, the child's freeing or retiring, the breaker, events). This is the
-- one place they are documented:
--
--   pool:on_worker_ready(w)
--       READY: the child loaded the processor; w.state is "idle", w.ready true.
--       Starts are healthy again (the breaker closes) and w takes a job.
--   pool:on_worker_load_error(w, err)
--       LOADERR: the processor did not load (err: ELOAD...). The child is
--       killed now and the breaker opens now, not at its exit.
--   pool:on_worker_timer(w)
--       w's one timer fired (worker:arm): start_timeout while w.state is
--       "starting", else the soft deadline of w.job (timeout), or, once that
--       job was interrupted, the hard one (kill_after).
--   pool:on_worker_done(w, job, result_bytes)
--       DONE: job completed; result_bytes are the encoded result (a string or
--       a list of pieces). The worker has ended the job first (w.job is the
--       next job it holds, or nil; job.ms, job.cpu_ms and job.max_rss_kb are set).
--   pool:on_worker_failed(w, job, err)
--       FAIL: the job's attempt failed with err (a moonjob.errors table);
--       ended first as for DONE. It may be retried; ENOMEM recycles the child.
--   pool:on_worker_progress(w, job, bytes)
--       PROGRESS: the running job reported progress (encoded value).
--   pool:on_worker_output(w, job, stream, line)
--       A line the child printed (stream "stdout" or "stderr"; job is nil
--       while it loads and between jobs), or a LOG frame's text (stream
--       "log"). Lines are already cut and bounded by max_log_bytes.
--   pool:on_worker_channel_error(w)
--       The child sent a frame over max_payload or broke the channel protocol:
--       it is killed now. The worker keeps the error (w.failure), and its job
--       fails with it at the exit.
--   pool:on_worker_exit(w, jobs, started, err, status, signal)
--       The child is gone (w.state "gone"), after everything it sent was
--       delivered. jobs: the jobs it held (oldest first, maybe none);
--       started[i]: whether the child had started jobs[i] (the shared page).
--       A started job's attempt fails with err (ECRASH, or w.failure); a job
--       it never started is given back without counting an attempt, and so
--       is one it started after the job the pool killed it for
--       (w.killed_for: a deadline, a protocol error), which it was running
--       only because that job had just ended in the child. A child
--       that ended before READY is a start failure (err), unless a LOADERR or
--       start_timeout already counted as one or the pool is closing. status
--       and signal go to the `exit` event.
--   pool:on_worker_fault(w, head, trace)
--       One of the methods above raised (worker:on_event guards them all):
--       reported once (events:internal_error); the job that was w's head
--       before the event, and the jobs an exit was ending, if they were left
--       neither ended nor waiting, fail with EINTERNAL; w's child, whose
--       bookkeeping may be half done, is killed (its running job fails with
--       EINTERNAL at its exit, the others wait again), and a gone one leaves
--       the pool.
--
-- Besides, a worker reads (never writes) these pool fields: child_program,
-- child_args, child_env, init_bytes, max_payload, max_log_bytes,
-- start_timeout, batches (moonjob.pool.lines).
--
-- Owns: nothing. Calls: pool.breaker (succeeded, child_broken, failed),
-- pool.events:internal_error,
-- pool.children (free, retire, remove), pool.deadlines (start_timed_out,
-- kill_job, job_timed_out), pool.endings (finish, fail, give_back),
-- pool.dispatch (worker_next, take_back, pump), pool.events.
--
-- Caveats: these are for moonjob.worker, not for users. They run inside the
-- loop's callbacks (listeners they reach run protected, so no error of theirs
-- comes back to the worker; an error of moonjob's own goes to
-- on_worker_fault). Each report that frees, kills or loses a child
-- or ends a job runs the pump before it returns, except
-- on_worker_channel_error: the killed child's replacement waits for its exit
-- (or the pool's next pump).
local errors = require "moonjob.errors"
local Job = require "moonjob.job"

local RESULT_BYTES = Job.SLOT.result_bytes

local Pool = {}

----------------------------------------------------------- the child ---

function Pool:on_worker_ready(w)
  self.breaker:succeeded()
  self.children:free(w)
end

function Pool:on_worker_load_error(w, err)
  self.breaker:child_broken(w, err)
end

-- The start deadline, a job's soft deadline, or the hard one after it.
function Pool:on_worker_timer(w)
  if w.state == "starting" then return self.deadlines:start_timed_out(w) end
  local job = w.job
  if not job then return end
  if job.interrupt then return self.deadlines:kill_job(w, job) end
  self.deadlines:job_timed_out(w, job)
end

function Pool:on_worker_channel_error(w)
  self.children:retire(w, true)
end

function Pool:on_worker_exit(w, jobs, started, err, status, signal)
  self.children:remove(w)
  local endings = self.endings
  local blamed = w.killed_for
  for i, job in ipairs(jobs) do
    if started[i] and (not blamed or blamed == job) then endings:fail(job, err)
    else endings:give_back(job) end
  end
  if #jobs == 0 and not w.ready and not w.start_reported and not self.closing then
    self.breaker:failed(err) -- died before READY, and nothing said so yet
  end
  if self.events.listeners.exit then self.events:emit("exit", w.pid, status, signal) end
  self.dispatch:pump()
end

-- A job a fault left behind: not ended, not waiting in the source, not left
-- to its owner, and not among the jobs w's exit will end.
local function stranded(job, w)
  if job:is_finished() or job.state == "left" or job.qindex then return false end
  if w.state ~= "gone" then
    for _, held in ipairs(w.held) do if held == job then return false end end
  end
  return true
end

-- Ends a stranded job with err; should that raise too, the job is marked
-- failed all the same, so that its waiter returns.
local function end_stranded(pool, job, err)
  local ok = pcall(pool.endings.fail, pool.endings, job, err)
  if ok or job:is_finished() or job.state == "left" or job.qindex then return end
  if job.state == "active" then pool.nactive = pool.nactive - 1 end
  job.error, job.state, job.worker = err, "failed", nil
end

function Pool:on_worker_fault(w, head, trace)
  self.events:internal_error(trace)
  local err = errors.new("EINTERNAL", "an internal error of moonjob ended the job: "
    .. tostring(trace):match("^[^\n]*"))
  local jobs = { head }
  for _, job in ipairs(w.exit_jobs or {}) do jobs[#jobs + 1] = job end
  for _, job in ipairs(jobs) do
    if stranded(job, w) then end_stranded(self, job, err) end
  end
  local ok, again = true, nil
  if w.state == "gone" then
    ok, again = pcall(self.children.remove, self.children, w)
  elseif w.state ~= "killed" then
    w.killed_for, w.failure = w.killed_for or w.job, w.failure or err
    ok, again = pcall(self.children.retire, self.children, w, true)
  end
  if ok then ok, again = pcall(self.dispatch.pump, self.dispatch) end
  if not ok then self.events:internal_error(again) end
end

------------------------------------------------------------- its job ---

function Pool:on_worker_done(w, job, result_bytes)
  job[RESULT_BYTES] = result_bytes -- in its slot (Job.SLOT): this runs for every job
  if rawget(job, "error") ~= nil then job.error = nil end
  if self.events.listeners.completed then -- decoded once for them; bytes that do not decode fail the job
    local ok, why = Job.decode(self, job)
    if not ok then
      job.result_bytes = nil
      return self:on_worker_failed(w, job, errors.new("EPROTO", "the child's result cannot be decoded: " .. why))
    end
  end
  self.endings:finish(job, "completed")
  self.dispatch:worker_next(w)
end

function Pool:on_worker_failed(w, job, err)
  self.endings:fail(job, err)
  if err.code == "ENOMEM" then -- the heap hit memory_limit: start afresh
    w.recycle = true -- it takes no more jobs, and ends once free (children:free)
    self.dispatch:take_back(w) -- a job its child started already runs there
  end
  self.dispatch:worker_next(w)
end

function Pool:on_worker_progress(w, job, bytes)
  job.progress_bytes = bytes
  local owner = job.owner
  if owner and owner.progress then owner:progress(job, bytes) end
  if self.events.listeners.progress then self.events:emit("progress", job, job.progress) end
end

function Pool:on_worker_output(w, job, stream, line)
  if job then
    job.logs[#job.logs + 1] = line
    local owner = job.owner
    if owner and owner.output then owner:output(job, stream, line) end
  end
  if self.echo == true then
    local who = job and ("job " .. tostring(job.id)) or ("child " .. tostring(w.pid))
    io.stderr:write("[" .. who .. "] " .. line .. "\n") -- one write: lines never interleave mid-line
  elseif self.echo then -- the user's function runs protected, as listeners do
    local ok, err = xpcall(self.echo, debug.traceback, line, job, w.pid)
    if not ok then self.events:report("echo", err) end
  end
  if job and self.events.listeners.log then self.events:emit("log", job, line, stream) end
end

return Pool
