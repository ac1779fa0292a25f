-- moonjob.worker -- the parent's side of one child process.
--
-- A worker owns one moonjob.core process: it sends INIT, JOB and INTERRUPT
-- frames, turns the child's frames, output, timer and exit into calls on its
-- pool's worker sink (the pool:on_worker_* methods, all documented in
-- moonjob/pool/sink.lua; a worker calls no other method of the pool), and
-- cuts the child's stdout/stderr into lines (at most max_log_bytes per job;
-- the rest is counted and dropped). It also owns one timer, armed for
-- start_timeout until the child is ready, then by the pool for the running
-- job's deadlines. States: "starting" (until READY), "idle", "busy" (jobs in
-- flight), "exiting" (asked to end), "killed" (SIGKILLed by the pool: a
-- deadline, a failed start, a channel found closed), "lost" (died before
-- taking a job, until the pool kills it), "gone".
--
-- Pipelining: a worker may hold several jobs at once (w.held, in the order
-- sent; at most core.frame.MAX_INFLIGHT). The child runs them one at a time
-- in that order: the first, w.job, is the one it runs (the head); the others
-- wait in the child. When the head ends the next becomes the head. Jobs the
-- child has not started can be taken back (worker:recall): the child will
-- never start them.
--
-- The C core checks every frame against the child's state and the job's
-- random token before it reaches this file (core/parent/channel.c): a frame that
-- breaks the protocol arrives as a "protocol" event instead, and the worker
-- then fails its job with EPROTO. At the child's exit, worker:started(job)
-- tells which of the jobs it held the child had started (a job it never
-- started goes back to the queue without counting an attempt).
--
-- The C core delivers whatever the child printed before a frame that ends a
-- job, and everything the child sent before its exit event, so a line is
-- always attributed to the job that printed it.
local buffer = require "string.buffer"
local core = require "moonjob.core"
local errors = require "moonjob.errors"
local Job = require "moonjob.job"
local tagged = require "moonjob.tagged_output"

local frame = core.frame
-- Fields read or written for every job are in the job's slots (Job.SLOT,
-- false for nil), not behind its metatable.
local SLOT = Job.SLOT
local ID, DATA_BYTES, CPU_MS, MAX_RSS_KB, MS = SLOT.id, SLOT.data_bytes, SLOT.cpu_ms,
  SLOT.max_rss_kb, SLOT.ms

local Worker = {}
Worker.__index = Worker

local STDERR_TAIL = 5 -- lines of stderr kept to explain a crash

function Worker.__tostring(w)
  return ("<moonjob.worker pid %d %s>"):format(w.pid or 0, w.state)
end

-- Worker.spawn(pool) -> worker | nil, err
function Worker.spawn(pool)
  local w = setmetatable({ pool = pool, state = "starting", partial = {}, tail = {},
    jobs_done = 0, log_bytes = 0, held = {} }, Worker)
  local process, err = core.spawn({
    file = pool.child_program,
    args = pool.child_args,
    env = pool.child_env,
    max_frame = Worker.max_frame(pool),
    on_event = function(kind, a, b, c, d, e, f) return w:on_event(kind, a, b, c, d, e, f) end,
  })
  if not process then return nil, err end
  w.process = process -- w.pid comes with the "spawned" event
  w.timer = core.timer(function() w:on_event("timer") end)
  w:arm(pool.start_timeout)
  process:send(frame.INIT, 0, pool.init_bytes)
  return w
end

-- worker:arm(seconds): the pool's on_worker_timer(w) runs after that long.
function Worker:arm(seconds)
  self.armed = true
  self.timer:start(seconds * 1000)
end

function Worker:disarm()
  if not self.armed then return end -- most jobs have no timeout: no call into C for them
  self.armed = false
  self.timer:stop()
end

-- worker:interrupt(job, err_fields): asks the child to stop job, one it
-- holds (the core signals the child once the frame is written and the job is
-- the head; a job not started yet fails before any of its code runs); it
-- fails with err_fields.code once cleanup ran (or the pool's hard kill lands).
function Worker:interrupt(job, fields)
  self.process:send(frame.INTERRUPT, job.id, buffer.encode(fields))
end

-- Worker.max_frame(pool): the payload bytes a frame from a child may have.
-- A batch of lines' DONE (child/batch.lua) holds its kept results besides its
-- last line's, which alone is at most max_payload: a pool with batches
-- (pool.batches) allows for them.
function Worker.max_frame(pool)
  return pool.max_payload + 4096 + (pool.batches and frame.BATCH_AREA or 0)
end

-- worker:run(job, meta_bytes, meta_rest) -> true, or false when the child is
-- already gone (the job never reached it; the worker is "lost" until its exit
-- event). The frame's payload is meta_bytes, meta_rest (the rest of the
-- metadata, maybe ""), then the job's data. The job joins the jobs the worker
-- holds; the first one is its head (w.job).
function Worker:run(job, meta_bytes, meta_rest)
  if not self.process:send(frame.JOB, job[ID], meta_bytes, meta_rest, job[DATA_BYTES]) then
    self.state = "lost" -- a frame may be cut short in the channel: the child must go
    self:kill()
    return false
  end
  local held = self.held
  held[#held + 1] = job
  if not self.job then self.state, self.job = "busy", job end
  return true
end

-- worker:recall([from]) -> the jobs this worker held that the child had not
-- started, from job `from` on (all of them without it), taken back (the
-- child will never start them), oldest first.
function Worker:recall(from)
  local numbers = self.process:recall(from and from.id)
  if #numbers == 0 then return numbers end
  local back, keep = {}, {}
  local set = {}
  for _, n in ipairs(numbers) do set[n] = true end
  for _, job in ipairs(self.held) do
    if set[job.id] then back[#back + 1] = job else keep[#keep + 1] = job end
  end
  if keep[1] ~= self.job then self:disarm() end -- the head went back: its deadline with it
  self.held, self.job = keep, keep[1]
  if not self.job and self.state == "busy" then self.state = "idle" end
  return back
end

-- worker:started(job) -> true when the child started job (one it holds or
-- held: it may have died running it).
function Worker:started(job)
  return self.process:started(job.id) == true
end

-- What batch of lines `job` has done in the child (core/frame.h, readable
-- after its death): lines started, lines kept, their result text, how long
-- the running line has run (ms); nil when it is not the child's batch.
function Worker:batch(job)
  return self.process:batch(job.id)
end

-- The same as a table, { started, kept, text, line_ms }, or nil: what the
-- owner gets as job.batch_state when the batch ends without its DONE (the
-- child's exit, or its kill at a line's hard deadline).
function Worker:batch_state(job)
  local started, kept, text, line_ms = self:batch(job)
  return started and { started = started, kept = kept, text = text, line_ms = line_ms }
end

-- How many lines of batch `job` the child has started; nil when it is not
-- the child's batch (the area holds another's, or none yet).
function Worker:batch_started(job)
  return self.process:batch_started(job.id)
end

-- Takes back the lines of batch `job` the child has not started (its first
-- excepted): how many it keeps, or nil when it has not taken the batch yet.
function Worker:batch_cut(job)
  return self.process:batch_cut(job.id)
end

-- The pool now takes batches: the child may send the bigger DONE they need.
function Worker:expect_batches()
  if self.state ~= "gone" then self.process:set_max_frame(Worker.max_frame(self.pool)) end
end

-- worker:finish(): ask an idle child to end (it reads end-of-file and exits).
function Worker:finish()
  if self.state == "gone" or self.state == "exiting" then return end
  self.state = "exiting"
  if not self.process:end_input() then self.process:kill("SIGKILL", true) end
end

-- worker:kill([signal]): signals the child's whole process group (grandchildren
-- included); SIGKILL by default. Harmless once the child was reaped.
function Worker:kill(signal)
  return self.process:kill(signal or "SIGKILL", true)
end

-- True once the child has started its head job.
function Worker:taken()
  return self.job ~= nil and self:started(self.job)
end

---------------------------------------------------------------- output ---

-- Keeps stderr line `line` among the last STDERR_TAIL (w.tail), which
-- explain a crash; also for a batch's output passed on whole
-- (moonjob.tagged_output).
function Worker:keep_stderr_line(line)
  local tail = self.tail
  tail[#tail + 1] = line
  if #tail > STDERR_TAIL then table.remove(tail, 1) end
end

function Worker:emit_line(stream, line)
  if stream == "stderr" then self:keep_stderr_line(line) end
  self.pool:on_worker_output(self, self.job, stream, line)
end

-- Output past max_log_bytes for one job is dropped (and counted): a flood costs
-- the parent a length check per chunk, never memory. (A batch of lines' output,
-- tagged by the child, is passed on whole: moonjob.tagged_output.)
local function over_budget(w, chunk)
  local limit = w.pool.max_log_bytes
  w.log_bytes = w.log_bytes + #chunk
  if w.log_bytes <= limit then return false end
  if not w.truncated then
    w.truncated = true
    w:emit_line("stderr", ("[moonjob: output past max_log_bytes (%d) is dropped]"):format(limit))
  end
  return true
end

function Worker:on_output(stream, chunk)
  if tagged.passes(self, self.job) then return tagged.chunk(self, stream, chunk, self.job) end
  if over_budget(self, chunk) then
    self.partial[stream] = nil
    return
  end
  local rest = self.partial[stream]
  if rest then chunk, self.partial[stream] = rest .. chunk, nil end
  local start = 1
  while true do
    local nl = chunk:find("\n", start, true)
    if not nl then break end
    self:emit_line(stream, chunk:sub(start, nl - 1))
    start = nl + 1
  end
  if start <= #chunk then self.partial[stream] = chunk:sub(start) end
end

-- Lines still without a newline belong to the job that is ending.
function Worker:flush_partial_lines()
  local partial = self.partial
  if partial.stdout == nil and partial.stderr == nil then return end
  if tagged.passes(self, self.job) then return tagged.flush(self, self.job) end
  for _, stream in ipairs({ "stdout", "stderr" }) do
    local rest = partial[stream]
    if rest then
      partial[stream] = nil
      self:emit_line(stream, rest)
    end
  end
end

---------------------------------------------------------------- frames ---

local function decode_error(bytes)
  local ok, err = pcall(buffer.decode, Job.bytes(bytes))
  if not ok or type(err) ~= "table" then
    err = { code = "EPROCESSOR", message = "undecodable error from the child" }
  end
  return errors.wrap(err)
end

-- Returns the worker's job when the frame is about it, else nil (a stale frame).
function Worker:current(number)
  local job = self.job
  if job and job[ID] == number then return job end
  return nil
end

-- Ends the head job on the worker's side and returns it; the next job held
-- becomes the head (w.job), or the worker is idle.
function Worker:end_job()
  local job = self.job
  self:flush_partial_lines()
  if job and self.truncated then -- (a batch of lines may write max_log_bytes a line)
    job.dropped_log_bytes = self.log_bytes - self.pool.max_log_bytes * (job.line_count or 1)
  end
  self.log_bytes, self.truncated = 0, false
  local held = self.held
  if job then table.remove(held, 1) end
  self.job = held[1]
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
on_frame[frame.READY] = function(w)
  w:disarm()
  w:flush_partial_lines()
  if w.state ~= "starting" then return end -- killed meanwhile (start_timeout, close): too late
  w.log_bytes, w.truncated = 0, false
  w.state, w.ready = "idle", true
  w.pool:on_worker_ready(w)
end

on_frame[frame.LOADERR] = function(w, _, payload)
  w:disarm()
  w.pool:on_worker_load_error(w, decode_error(payload))
end

on_frame[frame.DONE] = function(w, seq, payload, cpu_ms, max_rss_kb, ms)
  if not w:current(seq) then return end
  local job = w:end_job()
  record_usage(job, cpu_ms, max_rss_kb, ms)
  w.pool:on_worker_done(w, job, payload)
end

on_frame[frame.FAIL] = function(w, seq, payload, cpu_ms, max_rss_kb, ms)
  if not w:current(seq) then return end
  local job = w:end_job()
  record_usage(job, cpu_ms, max_rss_kb, ms)
  w.pool:on_worker_failed(w, job, decode_error(payload))
end

on_frame[frame.PROGRESS] = function(w, seq, payload)
  local job = w:current(seq)
  if job then w.pool:on_worker_progress(w, job, payload) end
end

on_frame[frame.LOG] = function(w, seq, payload)
  local job = w:current(seq)
  if job then w.pool:on_worker_output(w, job, "log", Job.bytes(payload)) end
end

---------------------------------------------------------------- events ---

local function describe_exit(status, signal)
  if signal ~= 0 then return ("was killed by signal %d"):format(signal) end
  return ("exited with code %d"):format(status)
end

local EXIT_SETUP = 78 -- the child could not set itself up (EXIT_SETUP, core/child/child.h)

local function crash_error(w, status, signal, during_job, spawn_failure, starting)
  if spawn_failure then
    return errors.new("ESPAWN", ("cannot start the child program %s: %s")
      :format(w.pool.child_program, spawn_failure))
  end
  if starting and signal == 0 and status == EXIT_SETUP and #w.tail > 0 then
    return errors.new("ELOAD", (w.tail[#w.tail]:gsub("^moonjob%-child: ", "")))
  end
  local message = "the child process " .. describe_exit(status, signal)
  if during_job then message = message .. " during the job" end
  if starting then message = message .. " before it was ready" end
  if #w.tail > 0 then message = message .. "; its last stderr lines: " .. table.concat(w.tail, " | ") end
  return errors.new("ECRASH", message, {
    exit_status = signal == 0 and status or nil,
    signal = signal ~= 0 and signal or nil,
    pid = w.pid,
  })
end

local on_event = {
  spawned = function(w, pid) w.pid = pid end,
  timer = function(w) w.pool:on_worker_timer(w) end,
  frame = function(w, kind, seq, payload, cpu_ms, max_rss_kb, ms)
    local handler = on_frame[kind]
    if handler then handler(w, seq, payload, cpu_ms, max_rss_kb, ms) end
  end,
  stdout = function(w, chunk) w:on_output("stdout", chunk) end,
  stderr = function(w, chunk) w:on_output("stderr", chunk) end,
  oversize = function(w, len)
    w.killed_for = w.job
    w.failure = errors.new("EPAYLOAD", ("the child sent a %d-byte frame, more than max_payload (%d)")
      :format(len, w.pool.max_payload))
    w.pool:on_worker_channel_error(w)
  end,
  protocol = function(w, why)
    w.killed_for = w.job
    w.failure = errors.new("EPROTO", ("the child broke the channel protocol (%s); a processor "
      .. "must not write to the channel, fd 3"):format(why))
    w.pool:on_worker_channel_error(w)
  end,
  exit = function(w, status, signal, spawn_failure)
    local jobs = w.held
    w:flush_partial_lines()
    w.job, w.held, w.state = nil, {}, "gone"
    w.timer:close()
    local started, running = {}, false
    for i, job in ipairs(jobs) do
      started[i] = w:started(job)
      running = running or started[i]
      if started[i] and job.first_line then -- a batch of lines: what ran, from the shared area
        job.batch_state = w:batch_state(job)
      end
    end
    local err = w.failure
      or crash_error(w, status, signal, running, spawn_failure, not w.ready)
    w.exit_jobs = jobs -- for on_worker_fault, should the pool raise while it ends them
    w.pool:on_worker_exit(w, jobs, started, err, status, signal)
    w.exit_jobs = nil
  end,
  closed = function() end,
}

-- Every event of the child, and its timer, comes through here, guarded: an
-- error raised while the pool handles one (a bug, in moonjob or in a hook it
-- calls) goes to pool:on_worker_fault with the job that was the head before
-- it, so that no job is left unfinished with a waiter that never returns.
local traceback = debug.traceback

function Worker:on_event(kind, a, b, c, d, e, f)
  local head = self.job
  local ok, err = xpcall(on_event[kind], traceback, self, a, b, c, d, e, f)
  if not ok then self.pool:on_worker_fault(self, head, err) end
end

return Worker
