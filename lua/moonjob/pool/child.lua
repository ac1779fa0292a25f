-- moonjob.pool.child -- the parent's side of one child process.
--
-- A Child owns one moonjob.core process: it sends INIT, JOB and INTERRUPT
-- frames and turns the child's frames, timer and exit into calls on its
-- pool's child sink (child.sink, pool.sink: its methods are documented in
-- moonjob/pool/sink.lua; a child calls no method of the pool). Its
-- output is its part child.output (moonjob.pool.child_output), which cuts
-- stdout and stderr into lines for the same sink. It also owns one timer,
-- armed for start_timeout until the child is ready, then by the pool for the
-- running job's deadlines. pool.children (moonjob.pool.children) keeps the
-- list of them. States: "starting" (until READY), "idle", "busy" (jobs in
-- flight), "exiting" (asked to end), "killed" (SIGKILLed by the pool: a
-- deadline, a failed start, a channel found closed), "lost" (died before
-- taking a job, until the pool kills it), "gone".
--
-- Pipelining: several jobs may be sent to a child at once (child.sent, in
-- the order sent; at most core.frame.MAX_INFLIGHT). The child runs them one
-- at a time in that order: the first, child.job, is the one it runs (the
-- head); the others wait in the child. When the head ends the next becomes
-- the head. Jobs the child has not started can be taken back (child:recall):
-- the child will never start them.
--
-- The C core checks every frame against the child's state and the job's
-- random token before it reaches this file (core/parent/channel.c): a frame that
-- breaks the protocol arrives as a "protocol" event instead, and the child
-- then fails its job with EPROTO. At the child's exit, child:started(job)
-- tells which of the jobs sent to it the child had started (a job it never
-- started goes back to the queue without counting an attempt).
--
-- The C core delivers whatever the child printed before a frame that ends a
-- job, and everything the child sent before its exit event, so a line is
-- always attributed to the job that printed it.
--
-- Owns: the process, its timer, state, pid, ready, child.sent and child.job,
-- jobs_done, the error it is to fail its job with (failure) and the output
-- part. The pool's parts keep their own marks on it (children: retiring,
-- removed, idle_since, recycle; dispatch: dispatched_at, acked; deadlines:
-- killed_for, start_overdue; breaker: start_reported).
-- Exposes: Child.spawn(pool), Child.max_frame(pool), child:run(job, ...),
-- child:recall([from]), child:started(job), child:taken(), child:end_job(),
-- child:arm(s), child:disarm(), child:interrupt(job, fields),
-- child:finish(), child:kill([signal]), child:expect_batches(), and the
-- shared batch area: child:batch(job), child:batch_state(job),
-- child:batch_started(job), child:batch_cut(job).
-- Calls: the sink's methods only (child.sink); reads the pool fields the
-- sink lists.
local buffer = require "string.buffer"
local core = require "moonjob.core"
local errors = require "moonjob.errors"
local Job = require "moonjob.job"
local Output = require "moonjob.pool.child_output"

local frame = core.frame
-- Fields read or written for every job are in the job's slots (Job.SLOT,
-- false for nil), not behind its metatable.
local SLOT = Job.SLOT
local ID, DATA_BYTES, CPU_MS, MAX_RSS_KB, MS = SLOT.id, SLOT.data_bytes, SLOT.cpu_ms,
  SLOT.max_rss_kb, SLOT.ms

local Child = {}
Child.__index = Child

function Child.__tostring(child)
  return ("<moonjob.pool.child pid %d %s>"):format(child.pid or 0, child.state)
end

-- Child.spawn(pool) -> child | nil, err
function Child.spawn(pool)
  local child = setmetatable({ pool = pool, sink = pool.sink, state = "starting", jobs_done = 0, sent = {} }, Child)
  child.output = Output.new(child)
  local process, err = core.spawn({
    file = pool.child_program,
    args = pool.child_args,
    env = pool.child_env,
    max_frame = Child.max_frame(pool),
    on_event = function(kind, a, b, c, d, e, f) return child:on_event(kind, a, b, c, d, e, f) end,
  })
  if not process then return nil, err end
  child.process = process -- child.pid comes with the "spawned" event
  child.timer = core.timer(function() child:on_event("timer") end)
  child:arm(pool.start_timeout)
  process:send(frame.INIT, 0, pool.init_bytes)
  return child
end

-- child:arm(seconds): the sink's timer(child) runs after that long.
function Child:arm(seconds)
  self.armed = true
  self.timer:start(seconds * 1000)
end

function Child:disarm()
  if not self.armed then return end -- most jobs have no timeout: no call into C for them
  self.armed = false
  self.timer:stop()
end

-- child:interrupt(job, err_fields): asks the child to stop job, one sent to
-- it (the core signals the child once the frame is written and the job is
-- the head; a job not started yet fails before any of its code runs); it
-- fails with err_fields.code once cleanup ran (or the pool's hard kill lands).
function Child:interrupt(job, fields)
  self.process:send(frame.INTERRUPT, job.id, buffer.encode(fields))
end

-- Child.max_frame(pool): the payload bytes a frame from a child may have.
-- A batch of lines' DONE (child/batch.lua) holds its kept results besides its
-- last line's, which alone is at most max_payload: a pool with batches
-- (pool.batches) allows for them.
function Child.max_frame(pool)
  return pool.max_payload + 4096 + (pool.batches and frame.BATCH_AREA or 0)
end

-- child:run(job, meta_bytes, meta_rest) -> true, or false when the child is
-- already gone (the job never reached it; the child is "lost" until its exit
-- event). The frame's payload is meta_bytes, meta_rest (the rest of the
-- metadata, maybe ""), then the job's data. The job joins the jobs sent to
-- the child; the first one is its head (child.job).
function Child:run(job, meta_bytes, meta_rest)
  if not self.process:send(frame.JOB, job[ID], meta_bytes, meta_rest, job[DATA_BYTES]) then
    self.state = "lost" -- a frame may be cut short in the channel: the child must go
    self:kill()
    return false
  end
  local sent = self.sent
  sent[#sent + 1] = job
  if not self.job then self.state, self.job = "busy", job end
  return true
end

-- child:recall([from]) -> the jobs sent to this child that it had not
-- started, from job `from` on (all of them without it), taken back (the
-- child will never start them), oldest first.
function Child:recall(from)
  local numbers = self.process:recall(from and from.id)
  if #numbers == 0 then return numbers end
  local back, keep = {}, {}
  local set = {}
  for _, n in ipairs(numbers) do set[n] = true end
  for _, job in ipairs(self.sent) do
    if set[job.id] then back[#back + 1] = job else keep[#keep + 1] = job end
  end
  if keep[1] ~= self.job then self:disarm() end -- the head went back: its deadline with it
  self.sent, self.job = keep, keep[1]
  if not self.job and self.state == "busy" then self.state = "idle" end
  return back
end

-- child:started(job) -> true when the child started job (one sent to it: it
-- may have died running it).
function Child:started(job)
  return self.process:started(job.id) == true
end

-- What batch of lines `job` has done in the child (core/frame.h, readable
-- after its death): lines started, lines kept, their result text, how long
-- the running line has run (ms); nil when it is not the child's batch.
function Child:batch(job)
  return self.process:batch(job.id)
end

-- The same as a table, { started, kept, text, line_ms }, or nil: what the
-- owner gets as job.batch_state when the batch ends without its DONE (the
-- child's exit, or its kill at a line's hard deadline).
function Child:batch_state(job)
  local started, kept, text, line_ms = self:batch(job)
  return started and { started = started, kept = kept, text = text, line_ms = line_ms }
end

-- How many lines of batch `job` the child has started; nil when it is not
-- the child's batch (the area holds another's, or none yet).
function Child:batch_started(job)
  return self.process:batch_started(job.id)
end

-- Takes back the lines of batch `job` the child has not started (its first
-- excepted): how many it keeps, or nil when it has not taken the batch yet.
function Child:batch_cut(job)
  return self.process:batch_cut(job.id)
end

-- The pool now takes batches: the child may send the bigger DONE they need.
function Child:expect_batches()
  if self.state ~= "gone" then self.process:set_max_frame(Child.max_frame(self.pool)) end
end

-- child:finish(): ask an idle child to end (it reads end-of-file and exits).
function Child:finish()
  if self.state == "gone" or self.state == "exiting" then return end
  self.state = "exiting"
  if not self.process:end_input() then self.process:kill("SIGKILL", true) end
end

-- child:kill([signal]): signals the child's whole process group (grandchildren
-- included); SIGKILL by default. Harmless once the child was reaped.
function Child:kill(signal)
  return self.process:kill(signal or "SIGKILL", true)
end

-- True once the child has started its head job.
function Child:taken()
  return self.job ~= nil and self:started(self.job)
end

---------------------------------------------------------------- frames ---

local function decode_error(bytes)
  local ok, err = pcall(buffer.decode, Job.bytes(bytes))
  if not ok or type(err) ~= "table" then
    err = { code = "EPROCESSOR", message = "undecodable error from the child" }
  end
  return errors.wrap(err)
end

-- Returns the child's head job when the frame is about it, else nil (a
-- stale frame).
function Child:current(number)
  local job = self.job
  if job and job[ID] == number then return job end
  return nil
end

-- Ends the head job on the parent's side and returns it; the next job sent
-- becomes the head (child.job), or the child is idle.
function Child:end_job()
  local job = self.job
  self.output:job_ended(job)
  local sent = self.sent
  if job then table.remove(sent, 1) end
  self.job = sent[1]
  self:disarm()
  if self.state == "busy" and not self.job then self.state = "idle" end
  self.jobs_done = self.jobs_done + 1
  return job
end

-- What the child measured of the job: its run time (job.ms, which the
-- pool keeps; the parent's own clock would count the time its loop was not
-- run, a REPL at its prompt), CPU time and peak RSS.
local function record_usage(job, cpu_ms, max_rss_kb, ms)
  job[CPU_MS], job[MAX_RSS_KB], job[MS] = cpu_ms, max_rss_kb, ms
end

local on_frame = {}

-- What the child printed while it loaded came before READY (the core
-- delivers it first): no job's, its partial last line included.
on_frame[frame.READY] = function(child)
  child:disarm()
  child.output:flush(child.job)
  if child.state ~= "starting" then return end -- killed meanwhile (start_timeout, close): too late
  child.output:reset_budget()
  child.state, child.ready = "idle", true
  child.sink:ready(child)
end

on_frame[frame.LOADERR] = function(child, _, payload)
  child:disarm()
  child.sink:load_error(child, decode_error(payload))
end

on_frame[frame.DONE] = function(child, seq, payload, cpu_ms, max_rss_kb, ms)
  if not child:current(seq) then return end
  local job = child:end_job()
  record_usage(job, cpu_ms, max_rss_kb, ms)
  child.sink:done(child, job, payload)
end

on_frame[frame.FAIL] = function(child, seq, payload, cpu_ms, max_rss_kb, ms)
  if not child:current(seq) then return end
  local job = child:end_job()
  record_usage(job, cpu_ms, max_rss_kb, ms)
  child.sink:failed(child, job, decode_error(payload))
end

on_frame[frame.PROGRESS] = function(child, seq, payload)
  local job = child:current(seq)
  if job then child.sink:progress(child, job, payload) end
end

on_frame[frame.LOG] = function(child, seq, payload)
  local job = child:current(seq)
  if job then child.sink:output(child, job, "log", Job.bytes(payload)) end
end

---------------------------------------------------------------- events ---

local function describe_exit(status, signal)
  if signal ~= 0 then return ("was killed by signal %d"):format(signal) end
  return ("exited with code %d"):format(status)
end

local EXIT_SETUP = 78 -- the child could not set itself up (EXIT_SETUP, core/child/child.h)

local function crash_error(child, status, signal, during_job, spawn_failure, starting)
  if spawn_failure then
    return errors.new("ESPAWN", ("cannot start the child program %s: %s")
      :format(child.pool.child_program, spawn_failure))
  end
  local tail = child.output.tail
  if starting and signal == 0 and status == EXIT_SETUP and #tail > 0 then
    return errors.new("ELOAD", (tail[#tail]:gsub("^moonjob%-child: ", "")))
  end
  local message = "the child process " .. describe_exit(status, signal)
  if during_job then message = message .. " during the job" end
  if starting then message = message .. " before it was ready" end
  if #tail > 0 then message = message .. "; its last stderr lines: " .. table.concat(tail, " | ") end
  return errors.new("ECRASH", message, {
    exit_status = signal == 0 and status or nil,
    signal = signal ~= 0 and signal or nil,
    pid = child.pid,
  })
end

-- The child is gone: every job sent to it ends on the parent's side, and
-- the pool hears which of them the child had started.
local function exited(child, status, signal, spawn_failure)
  local jobs = child.sent
  child.output:flush(child.job)
  child.job, child.sent, child.state = nil, {}, "gone"
  child.timer:close()
  local started, running = {}, false
  for i, job in ipairs(jobs) do
    started[i] = child:started(job)
    running = running or started[i]
    if started[i] and job.first_line then -- a batch of lines: what ran, from the shared area
      job.batch_state = child:batch_state(job)
    end
  end
  local err = child.failure
    or crash_error(child, status, signal, running, spawn_failure, not child.ready)
  child.exit_jobs = jobs -- for sink:fault, should the pool raise while it ends them
  child.sink:exit(child, jobs, started, err, status, signal)
  child.exit_jobs = nil
end

local on_event = {
  spawned = function(child, pid) child.pid = pid end,
  timer = function(child) child.sink:timer(child) end,
  frame = function(child, kind, seq, payload, cpu_ms, max_rss_kb, ms)
    local handler = on_frame[kind]
    if handler then handler(child, seq, payload, cpu_ms, max_rss_kb, ms) end
  end,
  stdout = function(child, chunk) child.output:chunk("stdout", chunk, child.job) end,
  stderr = function(child, chunk) child.output:chunk("stderr", chunk, child.job) end,
  oversize = function(child, len)
    child.killed_for = child.job
    child.failure = errors.new("EPAYLOAD", ("the child sent a %d-byte frame, more than max_payload (%d)")
      :format(len, child.pool.max_payload))
    child.sink:channel_error(child)
  end,
  protocol = function(child, why)
    child.killed_for = child.job
    child.failure = errors.new("EPROTO", ("the child broke the channel protocol (%s); a processor "
      .. "must not write to the channel, fd 3"):format(why))
    child.sink:channel_error(child)
  end,
  exit = exited,
  closed = function() end,
}

-- Every event of the child, and its timer, comes through here, guarded: an
-- error raised while the pool handles one (a bug, in moonjob or in a hook it
-- calls) goes to sink:fault with the job that was the head before
-- it, so that no job is left unfinished with a waiter that never returns.
local traceback = debug.traceback

function Child:on_event(kind, a, b, c, d, e, f)
  local head = self.job
  local ok, err = xpcall(on_event[kind], traceback, self, a, b, c, d, e, f)
  if not ok then self.sink:fault(self, head, err) end
end

return Child
