-- moonjob.pool.sink -- how a child reports to its pool: the child sink.
--
-- A part of the pool (pool.sink), its one entry for its children: a child
-- (moonjob.pool.child, the parent's side of one child process, and its
-- output part, moonjob.pool.child_output) holds the sink and tells its pool
-- what happened through these methods and no other: every frame, line of
-- output, timer and exit of a child arrives here, and each method turns it
-- into pool actions (a job's ending, the child's freeing or retiring, the
-- breaker, events, the owner of batches). This is the one place they are documented:
--
--   sink:ready(child)
--       READY: the child loaded the processor; child.state is "idle",
--       child.ready true. Starts are healthy again (the breaker closes) and
--       the child takes a job.
--   sink:load_error(child, err)
--       LOADERR: the processor did not load (err: ELOAD...). The child is
--       killed now and the breaker opens now, not at its exit.
--   sink:timer(child)
--       The child's one timer fired (child:arm): start_timeout while
--       child.state is "starting", else the soft deadline of child.job
--       (timeout), or, once that job was interrupted, the hard one (kill_after).
--   sink:done(child, job, result_bytes)
--       DONE: job completed; result_bytes are the encoded result (a string or
--       a list of pieces). The child has ended the job first (child.job is
--       the next job sent to it, or nil; job.ms, job.cpu_ms and
--       job.max_rss_kb are set).
--   sink:failed(child, job, err)
--       FAIL: the job's attempt failed with err (a moonjob.errors table);
--       ended first as for DONE. It may be retried; ENOMEM recycles the child.
--   sink:progress(child, job, bytes)
--       PROGRESS: the running job reported progress (encoded value).
--   sink:output(child, job, stream, line)
--       A line the child printed (stream "stdout" or "stderr"; job is nil
--       while it loads and between jobs), or a LOG frame's text (stream
--       "log"). Lines are already cut and bounded by max_log_bytes.
--   sink:lines(child, job, text)
--       What batch `job`'s child wrote, in whole lines (each ending in
--       "\n"), while pool.tagged_output is set: lines the child tagged
--       begin with "[line N] ", others (a command's output, a write(2)) are
--       for the owner of batches to tag. Given to that owner's output hook
--       (moonjob.pool.lines).
--   sink:channel_error(child)
--       The child sent a frame over max_payload or broke the channel protocol:
--       it is killed now. The child keeps the error (child.failure), and its
--       job fails with it at the exit.
--   sink:exit(child, jobs, started, err, status, signal)
--       The child is gone (child.state "gone"), after everything it sent was
--       delivered. jobs: the jobs sent to it (oldest first, maybe none);
--       started[i]: whether the child had started jobs[i] (the shared page).
--       A started job's attempt fails with err (ECRASH, or child.failure); a
--       job it never started is given back without counting an attempt, and
--       so is one it started after the job the pool killed it for
--       (child.killed_for: a deadline, a protocol error), which it was running
--       only because that job had just ended in the child. A child
--       that ended before READY is a start failure (err), unless a LOADERR or
--       start_timeout already counted as one or the pool is closing. status
--       and signal go to the `exit` event.
--   sink:fault(child, head, trace)
--       One of the methods above raised (child:on_event guards them all):
--       reported once (events:internal_error); the job that was the child's
--       head before the event, and the jobs an exit was ending, if they were
--       left neither ended nor waiting, fail with EINTERNAL; the child, whose
--       bookkeeping may be half done, is killed (blamed on that head: should
--       the child still be running it, it fails with EINTERNAL at its exit;
--       a job the child started after it, the next one sent, met no fault
--       and is given back, to run on a fresh child; the others wait again),
--       and a gone one leaves the pool.
--
-- Besides, a child reads (never writes) these pool fields: child_program,
-- child_args, child_env, init_bytes, max_payload, max_log_bytes,
-- start_timeout, batches and tagged_output (moonjob.pool.lines).
--
-- Owns: nothing (sink.pool, the pool it reports to). Calls: pool.breaker (succeeded, child_broken, failed),
-- pool.events:internal_error,
-- pool.children (free, retire, remove), pool.deadlines (start_timed_out,
-- kill_job, job_timed_out), pool.endings (finish, fail, give_back),
-- pool.dispatch (child_next, take_back, pump), pool.lines:output,
-- pool.events.
--
-- Caveats: these are for moonjob.pool.child, not for users. They run inside
-- the loop's callbacks (listeners and hooks they reach run protected, so no
-- error of theirs comes back to the child; an error of moonjob's own goes to
-- sink:fault). Each report that frees, kills or loses a child
-- or ends a job runs the pump before it returns, except
-- sink:channel_error: the killed child's replacement waits for its exit
-- (or the pool's next pump).
local errors = require "moonjob.errors"
local Job = require "moonjob.job"

local RESULT_BYTES = Job.SLOT.result_bytes

local Sink = {}
Sink.__index = Sink

function Sink.new(pool)
  return setmetatable({ pool = pool }, Sink)
end

----------------------------------------------------------- the child ---

function Sink:ready(child)
  local pool = self.pool
  pool.breaker:succeeded()
  pool.children:free(child)
end

function Sink:load_error(child, err)
  self.pool.breaker:child_broken(child, err)
end

-- The start deadline, a job's soft deadline, or the hard one after it.
function Sink:timer(child)
  local pool = self.pool
  if child.state == "starting" then return pool.deadlines:start_timed_out(child) end
  local job = child.job
  if not job then return end
  if job.interrupt then return pool.deadlines:kill_job(child, job) end
  pool.deadlines:job_timed_out(child, job)
end

function Sink:channel_error(child)
  self.pool.children:retire(child, true)
end

function Sink:exit(child, jobs, started, err, status, signal)
  local pool = self.pool
  pool.children:remove(child)
  local endings = pool.endings
  local blamed = child.killed_for
  for i, job in ipairs(jobs) do
    if started[i] and (not blamed or blamed == job) then endings:fail(job, err)
    else endings:give_back(job) end
  end
  if #jobs == 0 and not child.ready and not child.start_reported and not pool.closing then
    pool.breaker:failed(err) -- died before READY, and nothing said so yet
  end
  if pool.events.listeners.exit then pool.events:emit("exit", child.pid, status, signal) end
  pool.dispatch:pump()
end

-- A job a fault left behind: not ended, not waiting in the source, not left
-- to its owner, and not among the jobs the child's exit will end.
local function stranded(job, child)
  if job:is_finished() or job.state == "left" or job.qindex then return false end
  if child.state ~= "gone" then
    for _, sent in ipairs(child.sent) do if sent == job then return false end end
  end
  return true
end

-- Ends a stranded job with err; should that raise too, the job is marked
-- failed all the same, so that its waiter returns.
local function end_stranded(pool, job, err)
  local ok = pcall(pool.endings.fail, pool.endings, job, err)
  if ok or job:is_finished() or job.state == "left" or job.qindex then return end
  if job.state == "active" then pool.nactive = pool.nactive - 1 end
  job.error, job.state, job.child = err, "failed", nil
end

function Sink:fault(child, head, trace)
  local pool = self.pool
  pool.events:internal_error(trace)
  local err = errors.new("EINTERNAL", "an internal error of moonjob ended the job: "
    .. tostring(trace):match("^[^\n]*"))
  local jobs = { head }
  for _, job in ipairs(child.exit_jobs or {}) do jobs[#jobs + 1] = job end
  for _, job in ipairs(jobs) do
    if stranded(job, child) then end_stranded(pool, job, err) end
  end
  local ok, again = true, nil
  if child.state == "gone" then
    ok, again = pcall(pool.children.remove, pool.children, child)
  elseif child.state ~= "killed" then
    -- (not child.job: after a DONE or FAIL that is already the next job,
    -- which the child may have started, and which met no fault)
    child.killed_for, child.failure = child.killed_for or head or child.job, child.failure or err
    ok, again = pcall(pool.children.retire, pool.children, child, true)
  end
  if ok then ok, again = pcall(pool.dispatch.pump, pool.dispatch) end
  if not ok then pool.events:internal_error(again) end
end

------------------------------------------------------------- its job ---

function Sink:done(child, job, result_bytes)
  local pool = self.pool
  job[RESULT_BYTES] = result_bytes -- in its slot (Job.SLOT): this runs for every job
  if rawget(job, "error") ~= nil then job.error = nil end
  if pool.events.listeners.completed then -- decoded once for them; bytes that do not decode fail the job
    local ok, why = Job.decode(pool, job)
    if not ok then
      job.result_bytes = nil
      local err = errors.new("EPROTO", "the child's result cannot be decoded: " .. why)
      return self:failed(child, job, err)
    end
  end
  pool.endings:finish(job, "completed")
  pool.dispatch:child_next(child)
end

function Sink:failed(child, job, err)
  local pool = self.pool
  pool.endings:fail(job, err)
  if err.code == "ENOMEM" or err.heap_full then -- the heap hit memory_limit (an interrupted job's too): afresh
    err.heap_full = nil -- (the child's word to its pool, not the job's error)
    child.recycle = true -- it takes no more jobs, and ends once free (children:free)
    pool.dispatch:take_back(child) -- a job the child started already runs there
  end
  pool.dispatch:child_next(child)
end

function Sink:progress(child, job, bytes)
  local pool = self.pool
  job.progress_bytes = bytes
  local owner = job.owner
  if owner and owner.progress then owner:progress(job, bytes) end
  if pool.events.listeners.progress then pool.events:emit("progress", job, job.progress) end
end

function Sink:output(child, job, stream, line)
  local pool = self.pool
  if job then
    job.logs[#job.logs + 1] = line
    local owner = job.owner
    if owner and owner.output then owner:output(job, stream, line) end
  end
  if pool.echo == true then
    local who = job and ("job " .. tostring(job.id)) or ("child " .. tostring(child.pid))
    io.stderr:write("[" .. who .. "] " .. line .. "\n") -- one write: lines never interleave mid-line
  elseif pool.echo then -- the user's function runs protected, as listeners do
    local ok, err = xpcall(pool.echo, debug.traceback, line, job, child.pid)
    if not ok then pool.events:report("echo", err) end
  end
  if job and pool.events.listeners.log then pool.events:emit("log", job, line, stream) end
end

function Sink:lines(child, job, text)
  self.pool.lines:output(text, job)
end

return Sink
