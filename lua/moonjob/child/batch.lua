-- moonjob.child.batch -- the child's runner of a batch of lines (moonjob run,
-- "json" codec; core/frame.h): the job's data is NDJSON text, and the
-- processor runs once per line, each line a job of its own to it, with a
-- job's fields (job.data, job.name "line N", job.attempt; job.id and
-- job.number are the batch's). With the pool's raw option (moonjob run
-- --raw) a line's text is its data, not decoded.
--
-- The child writes each line's result line itself (moonjob.codec.resultline)
-- into the batch area it shares with the parent, so a child that dies
-- mid-batch loses no finished line's result; the DONE frame carries the
-- area's bytes after a header "<lines run> <completed> <failed>\n". A line
-- starts only when the shared batch word allows it (the parent may take back
-- the lines not started). A blank line is run as nothing (no result line) but
-- still counts. Lines after one that filled the heap (ENOMEM) or was
-- interrupted are not run: the parent sends them again.
--
-- With a timeout (the batch's meta: line_timeout, seconds), each line has
-- its own soft deadline, enforced here (channel.line_timeout arms one timer
-- for the batch, core/child/interrupt.c): a line past it fails as a job of
-- its own would (ETIMEDOUT, "the job ran past its timeout (N s)", reason
-- "timeout", after the processor's cleanup(job, "timeout")), and the batch
-- goes on with the next line. The hard deadline is the parent's
-- (moonjob.pool.deadlines). A failed line is written as failed here; the
-- command line decides whether it runs again alone (--attempts,
-- moonjob.cli.batch_jobs).
--
-- The per-line loop makes no closure and no string beyond the line's own
-- and its name, and calls the child program's C functions through the FFI
-- so that it stays compiled. A completed line's result line is written by
-- C straight into the batch area (channel.keep_completed,
-- core/child/result.c: the bytes the codec and moonjob.codec.resultline
-- write); what it declines (a result with a metatable, a cdata, bad UTF-8,
-- a line the area has no room for...) is written here in Lua as before.
--
-- Caveats: it requires `moonjob.channel`, which only moonjob.child.runner can
-- (the runner requires this module before it takes the channel out of
-- processors' reach). The runner hands over, once the processor is loaded,
-- what the lines share with its jobs (batch.setup).
local channel = require "moonjob.channel"
local buffer = require "string.buffer"
local json = require "moonjob.codec.json"
local encode = require "moonjob.child.encode"
-- (loaded here, not with the first batch: by then a processor may have
-- removed `require` and the globals the module reads at load)
local lines_format = require "moonjob.codec.resultline"

-- Kept at load, before the processor's file runs: a processor may remove or
-- replace the globals (`pcall = nil`, `string = nil`), and the child must
-- still run its next batch.
local error, setmetatable, tonumber, tostring, type, xpcall =
  error, setmetatable, tonumber, tostring, type, xpcall
local find, sub, byte = string.find, string.sub, string.byte

local M = {}

local handler, message_of, input_error = encode.handler, encode.message_of, encode.input_error
local result_problem, failure_of, out_of_memory = encode.result_problem, encode.failure_of, encode.out_of_memory

-- What the runner hands over (batch.setup): the processor's job function,
-- the jobs' class, the runner's state its job:log() reads ({ batch = true }
-- while a batch runs: a line's log is then a tagged line on stderr), its
-- flush_output(), and the processor's cleanup(job, reason) or nil.
local processor, Job, sent, flush_output, cleanup = nil, nil, nil, nil, nil
local max_payload = 64 * 1024 * 1024 -- the runner's options.max_payload (batch.setup)
local decode_line = json.decode -- a line's data from its text (--raw: the text itself)

-- batch.setup(runner) with runner = { processor, Job, sent, flush_output, cleanup, max_payload }.
function M.setup(runner)
  processor, Job, sent, flush_output = runner.processor, runner.Job, runner.sent, runner.flush_output
  max_payload = runner.max_payload or max_payload
  if runner.raw then decode_line = function(text) return text end end -- moonjob run --raw
  cleanup = runner.cleanup
end

-- The child program's own functions through the FFI (the moonjob-child
-- executable exports them as moonjob_*), so that the per-line loop stays
-- compiled; channel's otherwise.
local batch_next, now, output_lines = channel.batch_next, channel.now, channel.output_lines
local line_done = channel.batch_line_done -- the line ended: no deadline until the next starts
local keep_completed = channel.keep_completed
-- batch_keep(buf): keeps string.buffer buf's bytes in the batch area; false when they do not fit
local batch_keep = function(buf) return channel.batch_keep(buf:tostring()) end
-- line_end(text, pos, len): where the line at pos ends (its newline, or len + 1)
local line_end = function(text, pos, len) return find(text, "\n", pos, true) or len + 1 end
local record_buffer = buffer.new() -- the result line of the line just run, kept without a string
do
  local ffi = require "ffi"
  local found = pcall(function()
    ffi.cdef [[
double moonjob_batch_next(void);
int moonjob_batch_keep(const void *text, size_t len);
double moonjob_now_ms(void);
size_t moonjob_line_end(const char *text, size_t from, size_t len);
void moonjob_output_lines(double first);
void moonjob_batch_line_done(void);
]]
    local C = ffi.C
    local _ = C.moonjob_batch_next, C.moonjob_batch_keep, C.moonjob_now_ms, C.moonjob_line_end,
      C.moonjob_output_lines, C.moonjob_batch_line_done
  end)
  if found then
    local C = ffi.C
    batch_next = C.moonjob_batch_next
    batch_keep = function(buf) return C.moonjob_batch_keep(buf:ref()) ~= 0 end
    now = C.moonjob_now_ms
    output_lines = C.moonjob_output_lines
    line_done = C.moonjob_batch_line_done
    line_end = function(text, pos, len) return tonumber(C.moonjob_line_end(text, pos - 1, len)) + 1 end
  end
end

-- Writes into record_buffer the result line of a line whose processor
-- returned `result`; returns whether it completed (a result that cannot be
-- written fails it).
local function completed_line(line, attempt, result, ms)
  local bytes, why = json.encode(result)
  local problem = result_problem(bytes, why)
  if problem then
    lines_format.put_failed(record_buffer:reset(), line, problem, attempt, ms)
    return false
  end
  lines_format.put_completed(record_buffer:reset(), line, bytes, attempt, ms)
  return true
end

-- Counts a line run (completed: true, false, or nil for a blank line) and
-- keeps its result line, in record_buffer; false when the batch must end
-- here: the area is full (the DONE frame carries this line itself), or it
-- failed in a batch that ends at a failure (--halt decides before any later
-- line runs). The lines after it go out again. What a line printed or
-- logged does not end the batch: the child tagged it with the line
-- (core/child/output.c).
local function keep(b, completed)
  b.run = b.run + 1
  if completed == true then b.completed = b.completed + 1
  elseif completed == false then b.failed = b.failed + 1 end
  if batch_keep(record_buffer) then
    return not (completed == false and b.end_on_failure)
  end
  b.extra = record_buffer:tostring()
  return false
end

-- Runs lines of batch `b` from b.pos on, with no protected call of its own
-- per line (the processor's trace stays whole): a line that raises ends this
-- call, with b.line and b.t0 saying which line and since when. Returns true
-- when the batch is over (its end, a cut, a full area).
local function run_lines(b)
  local text, len, line = b.text, #b.text, b.next_line - 1
  local pos = b.pos
  while pos <= len + 1 do -- a block ending in a newline ends in a blank line
    local stop = line_end(text, pos, len)
    line = line + 1
    local t0 = batch_next()
    if t0 < 0 then return true end -- the parent took back the lines from here on
    local c = byte(text, pos)
    local source = sub(text, pos, stop - 1)
    pos = stop + 1
    b.pos, b.next_line = pos, line + 1
    local completed = nil -- a blank line: no result line
    record_buffer:reset()
    if #source > 0 and (c > 32 or find(source, "%S")) then -- not blank
      b.line, b.t0, b.job = line, t0, nil
      local data, err = decode_line(source)
      if err then
        lines_format.put_failed(record_buffer, line, input_error(err), b.attempt, now() - t0)
        completed = false
      else
        -- the same fields as a job of its own (the runner's run_job)
        local job = setmetatable({ id = b.id, attempt = b.attempt, name = "line " .. line,
          number = b.number, data = data }, Job)
        b.job = job -- (for cleanup, should its deadline pass)
        local result = processor(job)
        line_done() -- (its deadline does not run while its result is written)
        if keep_completed(result, line, b.attempt, t0, max_payload) then -- written in the area
          completed = "kept"
        else
          completed = completed_line(line, b.attempt, result, now() - t0)
        end
      end
      b.line = nil
    end
    line_done() -- (again for a completed line: the other ways end here)
    if completed == "kept" then
      b.run, b.completed = b.run + 1, b.completed + 1
    elseif not keep(b, completed) then
      return true
    end
  end
  return true
end

-- The error of a line that passed its deadline, once the processor's
-- cleanup(job, "timeout") ran (not interruptible: the parent's hard kill
-- bounds it): what a job of its own that timed out fails with.
local function timed_out_error(b)
  local err = { code = "ETIMEDOUT", reason = "timeout",
    message = ("the job ran past its timeout (%s s)"):format(tostring(b.line_timeout)) }
  local job = b.job
  b.job = nil
  if cleanup and job then
    local ok, failure = xpcall(cleanup, handler, job, "timeout")
    if not ok then
      if type(failure) ~= "table" then failure = { value = failure } end -- a memory error
      err.cleanup_error = tostring(encode.to_error(failure.value, nil, "EPROCESSOR").message)
    end
  end
  return err
end

-- Runs the lines of batch `b` (under channel.run). A line that raises, or
-- passes its deadline, fails with its error, and the lines after it go on;
-- an interrupt or a full heap (the message handler did not run) ends the
-- batch there, b.line says where. channel.protect is xpcall that also says
-- whether the line's own deadline made it fail (core/child/interrupt.c).
local function run_batch_lines(b)
  local protect = channel.protect
  while true do
    local ok, result, timed_out = protect(handler, run_lines, b)
    if ok then return end
    if b.line == nil then error(result, 0) end -- not inside a line: the runner's own failure
    local err
    if timed_out then
      err = timed_out_error(b)
    elseif type(result) ~= "table" or result.value == "not enough memory" then
      b.raised = result
      return
    else
      err = failure_of(result, false)
    end
    local line = b.line
    b.line, b.job = nil, nil
    lines_format.put_failed(record_buffer:reset(), line, err, b.attempt, now() - b.t0)
    if not keep(b, false) then return end
  end
end

-- batch.run(number, meta, text): runs a batch and sends its DONE frame.
-- Returns true when the child must end after it (a line filled the heap: the
-- pool's rule for ENOMEM).
function M.run(number, meta, text)
  local b = { text = text, pos = 1, next_line = meta.first_line, id = meta.id, attempt = meta.attempt,
    number = number, run = 0, completed = 0, failed = 0, extra = "",
    end_on_failure = meta.end_on_failure, line_timeout = meta.line_timeout }
  output_lines(meta.first_line) -- each line's output tagged with its number
  sent.batch = true
  if b.line_timeout then channel.line_timeout(b.line_timeout) end
  local ok, value, interrupted, heap_full = channel.run(handler, run_batch_lines, b)
  if b.line_timeout then channel.line_timeout(0) end
  if not ok and b.raised == nil and type(value) == "table" then b.raised = message_of(value.value) end
  b.text = nil
  if b.line then -- it stopped inside a line: that line fails, the rest go back
    local err
    if interrupted then
      local info = encode.interrupt_reason(channel.interrupt())
      err = { code = info.code, message = info.message }
    elseif heap_full or b.raised == "not enough memory" or b.raised == nil then
      heap_full = true
      err = out_of_memory("the job")
    else
      err = { code = "EPROCESSOR", message = tostring(b.raised) }
    end
    b.extra = lines_format.failed(b.line, err, b.attempt, now() - b.t0)
    b.run, b.failed = b.run + 1, b.failed + 1
  end
  sent.batch = false
  output_lines(0) -- what the lines printed is written before DONE counts it
  flush_output()
  channel.send(channel.DONE, number, ("%d %d %d\n"):format(b.run, b.completed, b.failed),
    channel.KEPT, b.extra)
  return heap_full
end

return M
