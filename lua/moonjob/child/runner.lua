-- moonjob.child.runner -- the child side: load a processor file, then run its jobs.
--
-- Runs inside the moonjob-child program, which preloads `moonjob.channel`
-- (blocking frame I/O on fd 3, and channel.run, which makes a job
-- interruptible by the parent). The first frame is INIT with the options; the
-- runner loads the processor once, answers READY (or LOADERR and exits), then
-- serves JOB frames one at a time until end-of-file on the channel. An
-- interrupted job (soft timeout, cancel) runs the processor's cleanup(job,
-- reason) and fails with the code the parent sent (ETIMEDOUT, ECANCELED).
--
-- Every value crossing the channel is encoded with string.buffer (exact), except
-- in the "json" codec where job data arrives as JSON text and results leave as
-- exact JSON text (see moonjob.codec.json), so the parent never parses payloads.
local channel = require "moonjob.channel"
-- The channel is the runner's alone: a processor cannot require it.
package.loaded["moonjob.channel"], package.preload["moonjob.channel"] = nil, nil
local buffer = require "string.buffer"
local errors = require "moonjob.errors"
local json = require "moonjob.codec.json"

local M = {}

local options = { codec = "lua", max_payload = 64 * 1024 * 1024 }
local processor = nil          -- the function that runs a job
local cleanup = nil            -- the processor's optional cleanup(job, reason)
local decoder = buffer.new()

---------------------------------------------------------------- errors ---

local MAX_DEPTH = 20 -- nested tables in an error past this become "[too deep]"

-- A copy of v that string.buffer can encode: values that cannot cross become
-- a short placeholder that says why ("[function]", "[Circular]", ...).
local function crossable(v, depth, seen)
  local t = type(v)
  if t == "nil" or t == "boolean" or t == "number" or t == "string" then return v end
  if t == "cdata" then
    return pcall(buffer.encode, v) and v or "[cdata]" -- 64-bit integers cross
  end
  if t ~= "table" then return "[" .. t .. "]" end
  if seen[v] then return "[Circular]" end
  if depth > MAX_DEPTH then return "[too deep]" end
  seen[v] = true
  local copy = {}
  for k, value in pairs(v) do
    local tk = type(k)
    if tk == "string" or tk == "number" or tk == "boolean" then
      copy[k] = crossable(value, depth + 1, seen)
    end
  end
  seen[v] = nil
  return copy
end

-- A short text for a table raised without a usable message:
-- 'a table was raised: { reason = "x", n = 3 }' (a few fields, shortened).
local function describe_table(value)
  local fields, n = {}, 0
  for k, v in pairs(value) do
    n = n + 1
    if n > 5 then fields[#fields + 1] = "..." break end
    local text = type(v) == "string" and ("%q"):format(v) or tostring(v)
    if #text > 40 then text = text:sub(1, 37) .. "..." end
    fields[#fields + 1] = tostring(k) .. " = " .. text
  end
  return "a table was raised: { " .. table.concat(fields, ", ") .. " }"
end

-- The message of whatever was raised: a string as is; a table's `message`, or
-- its __tostring, or a description of its fields.
local function message_of(value)
  if type(value) ~= "table" then return tostring(value) end
  if value.message ~= nil then return tostring(value.message) end
  local mt = getmetatable(value)
  if mt and mt.__tostring then return tostring(value) end
  return describe_table(value)
end

-- Turns whatever a processor raised into an error table that can cross the
-- channel: code, message, traceback, plus every field of the user's own that
-- can cross (the others become placeholders).
local function to_error(value, traceback, default_code)
  local err
  if type(value) == "table" then
    err = crossable(value, 1, {})
    err.message = message_of(value)
    err.code = type(value.code) == "string" and value.code or default_code
  else
    err = { code = default_code, message = tostring(value) }
  end
  err.traceback = err.traceback or traceback
  return err
end

local function encode_error(err)
  local ok, bytes = pcall(buffer.encode, err)
  if ok then return bytes end
  return buffer.encode({ code = err.code, message = err.message, traceback = err.traceback })
end

local function handler(value)
  return { value = value, traceback = debug.traceback(message_of(value), 2) }
end

local function flush_output()
  io.stdout:flush()
  io.stderr:flush()
end

---------------------------------------------------------------- loading ---

local function add_to_package_path(dir)
  package.path = dir .. "/?.lua;" .. dir .. "/?/init.lua;" .. package.path
end

-- Loads the processor file and runs its init(). Returns the job function, or
-- nil and an error table. The file's top level gets its directory and its
-- path as `...` (see main), so that it can open the files beside it.
local function load_processor(file, dir)
  add_to_package_path(dir) -- its real directory: reached through a link, it still finds its neighbours
  local chunk, message = loadfile(file)
  if not chunk then return nil, { code = "ELOAD", message = message } end
  local ok, result = xpcall(chunk, handler, dir, file)
  if not ok then return nil, to_error(type(result) == "table" and result.value or result,
    type(result) == "table" and result.traceback or nil, "ELOAD") end
  local exported = result
  if type(exported) == "table" then
    if type(exported.process) ~= "function" then
      return nil, { code = "ELOAD", message = file .. ": the returned table has no process function" }
    end
    if exported.init ~= nil then
      local ok_init, failure = xpcall(exported.init, handler)
      if not ok_init then
        if type(failure) ~= "table" then failure = { value = failure } end -- a memory error
        local err = to_error(failure.value, failure.traceback, "ELOAD")
        err.message = "init() failed: " .. err.message
        err.code = "ELOAD"
        return nil, err
      end
    end
    if type(exported.cleanup) == "function" then cleanup = exported.cleanup end
    return exported.process
  elseif type(exported) == "function" then
    return exported
  end
  return nil, { code = "ELOAD", message = file .. " must return a function(job) or a table "
    .. "{ process = function(job) ... end }, not a " .. type(exported) }
end

------------------------------------------------------------------- jobs ---

local Job = {}
Job.__index = Job
local logs_sent = 0 -- job:log() calls so far: a batch line that logs ends its batch, as one that prints

local function check_size(what, bytes)
  if #bytes > options.max_payload then
    error(("%s is %d bytes, more than max_payload (%d)"):format(what, #bytes, options.max_payload), 3)
  end
end

function Job:progress(value)
  local ok, bytes = pcall(buffer.encode, value)
  if not ok then error("job:progress(): value is not serialisable: " .. bytes, 2) end
  check_size("job:progress(): the value", bytes)
  channel.send(channel.PROGRESS, self.number, bytes)
end

function Job:log(...)
  local parts = { ... }
  for i = 1, select("#", ...) do parts[i] = tostring(parts[i]) end
  local text = table.concat(parts, " ")
  check_size("job:log(): the text", text)
  logs_sent = logs_sent + 1
  channel.send(channel.LOG, self.number, text)
end

function Job:__tostring()
  return "<moonjob.job " .. tostring(self.id) .. " running>"
end

-- The EINPUT error of JSON text that did not decode (json.decode's message).
local function input_error(err)
  local what = err:find("^number ") and "input cannot cross exactly: "
    or err:find("^nested deeper") and "input cannot be decoded: " or "input is not valid JSON: "
  return errors.new("EINPUT", what .. err) -- (EINPUT is never retried: pool/endings.lua's FINAL)
end

-- string.buffer's limit, in the words of moonjob.codec.json's (LuaJIT's own: "too deep to serialize")
local BUFFER_TOO_DEEP = json.too_deep(100)

-- The EPAYLOAD error of a result that could not be encoded (why) or is over
-- max_payload; nil when `bytes` may go.
local function result_problem(bytes, why)
  if not bytes then
    local text = tostring(why):gsub("^.-:%d+: ", ""):gsub("^too deep to serialize$", BUFFER_TOO_DEEP)
    return { code = "EPAYLOAD", message = "the result cannot be encoded: " .. text }
  end
  if #bytes > options.max_payload then
    return { code = "EPAYLOAD", message = ("the result is %d bytes, more than max_payload (%d); "
      .. "return less or raise max_payload"):format(#bytes, options.max_payload) }
  end
end

local codecs = {
  lua = {
    decode = function() return decoder:decode() end,
    encode = buffer.encode,
  },
  json = {
    decode = function()
      local value, err = json.decode(decoder:tostring())
      if err then error(input_error(err)) end
      return value
    end,
    encode = function(value) return assert(json.encode(value)) end,
  },
}

local function fail(number, err)
  flush_output()
  channel.send(channel.FAIL, number, encode_error(err))
end

-- A heap filled outside the processor's own call (receiving or decoding the
-- job's data, encoding its result) is ENOMEM like any other.
local function is_memory_error(e)
  return type(e) == "string" and e:find("not enough memory", 1, true) ~= nil
end

local function out_of_memory(what)
  return { code = "ENOMEM", message = ("%s needed more than memory_limit (%d bytes)")
    :format(what, options.memory_limit or 0) }
end

local function complete(number, result)
  local codec = codecs[options.codec]
  local ok, bytes = pcall(codec.encode, result)
  if not ok and is_memory_error(bytes) then
    collectgarbage()
    return fail(number, out_of_memory("encoding the result"))
  end
  local problem = result_problem(ok and bytes, not ok and bytes)
  if problem then return fail(number, problem) end
  flush_output()
  channel.send(channel.DONE, number, bytes)
end

-- Why the parent interrupted the job: its INTERRUPT frame, which the child
-- kept aside when it read it. Returns { code, message, reason }.
local function read_interrupt()
  local payload = channel.interrupt()
  local ok, info = false, nil
  if payload then ok, info = pcall(buffer.decode, payload) end
  if ok and type(info) == "table" then return info end
  return { code = "ECANCELED", message = "the job was interrupted" } -- a heap too full to read why
end

-- After an interruption: cleanup(job, reason) runs (not interruptible; the
-- parent's hard kill bounds it), then the job fails with the parent's code.
local function fail_interrupted(number, job)
  local info = read_interrupt()
  local err = { code = info.code, message = info.message, reason = info.reason,
    traceback = channel.interrupt_traceback() }
  if cleanup then
    local ok, failure = xpcall(cleanup, handler, job, info.reason)
    if not ok then
      if type(failure) ~= "table" then failure = { value = failure } end -- a memory error
      err.cleanup_error = tostring(to_error(failure.value, nil, "EPROCESSOR").message)
    end
  end
  fail(number, err)
end

-- The message handler does not run for memory errors (LUA_ERRMEM): the raw
-- "not enough memory" comes back instead of the handler's table (or the
-- handler itself ran out: "error in error handling"); channel.run tells.
local function failure_of(result, heap_full)
  if type(result) ~= "table" then result = { value = result } end
  if heap_full or result.value == "not enough memory" then
    local err = out_of_memory("the job")
    err.traceback = result.traceback
    return err
  end
  return to_error(result.value, result.traceback, "EPROCESSOR")
end

-- The job's meta: its id, attempt, name, and the number of its first line
-- when it is a batch of lines (else false), encoded one after the other (no
-- table to build in the parent for each job).
local function decode_meta()
  local id = decoder:decode()
  local attempt = decoder:decode()
  local name = decoder:decode()
  local first = decoder:decode() -- negative: the batch ends at its first failed line (--halt)
  return { id = id, attempt = attempt, name = name, first_line = first and math.abs(first),
    end_on_failure = first and first < 0 }
end

-- Decodes the job's data (a batch's lines stay text); false and an error
-- when it cannot.
local function decode_job(payload)
  if payload == false then return false, out_of_memory("the job's data") end
  decoder:set(payload)
  local ok, meta = pcall(decode_meta)
  local data
  if ok and meta.first_line then ok, data = pcall(decoder.tostring, decoder)
  elseif ok then ok, data = pcall(codecs[options.codec].decode) end
  if ok then return meta, data end
  local e = data or meta -- the error: the data's, or the meta's when that failed first
  decoder:reset()
  collectgarbage()
  if is_memory_error(e) then return false, out_of_memory("decoding the job's data") end
  return false, to_error(e, nil, "EPAYLOAD")
end

------------------------------------------------------------- batches ---

-- A batch of lines (moonjob run, "json" codec; frame.h): the job's data is
-- NDJSON text, and the processor runs once per line, each line a job of its
-- own to it, with a job's fields (job.data, job.name "line N", job.attempt;
-- job.id and job.number are the batch's).
-- The child writes each line's result line itself (moonjob.codec.resultline) into the
-- batch area it shares with the parent, so a child that dies mid-batch loses
-- no finished line's result; the DONE frame carries the area's bytes after a
-- header "<lines run> <completed> <failed>\n". A line starts only when the
-- shared batch word allows it (the parent may take back the lines not
-- started). A blank line is run as nothing (no result line) but still counts.
-- Lines after one that filled the heap (ENOMEM) or was interrupted are not
-- run: the parent sends them again.
local lines_format = nil -- moonjob.codec.resultline, loaded with the first batch

-- The child program's own functions through the FFI (core/child.c exports
-- them), so that the per-line loop stays compiled; channel's otherwise.
local batch_next, now, output_mark = channel.batch_next, channel.now, channel.output_mark
-- batch_keep(buf): keeps string.buffer buf's bytes in the batch area; false when they do not fit
local batch_keep = function(buf) return channel.batch_keep(buf:tostring()) end
-- line_end(text, pos, len): where the line at pos ends (its newline, or len + 1)
local line_end = function(text, pos, len) return string.find(text, "\n", pos, true) or len + 1 end
local record_buffer = buffer.new() -- the result line of the line just run, kept without a string
do
  local ffi = require "ffi"
  local found = pcall(function()
    ffi.cdef [[
double moonjob_batch_next(void);
int moonjob_batch_keep(const void *text, size_t len);
double moonjob_now_ms(void);
size_t moonjob_line_end(const char *text, size_t from, size_t len);
uint32_t moonjob_output_mark(void);
]]
    local C = ffi.C
    local _ = C.moonjob_batch_next, C.moonjob_batch_keep, C.moonjob_now_ms, C.moonjob_line_end,
      C.moonjob_output_mark
  end)
  if found then
    local C = ffi.C
    batch_next = C.moonjob_batch_next
    batch_keep = function(buf) return C.moonjob_batch_keep(buf:ref()) ~= 0 end
    now = C.moonjob_now_ms
    output_mark = C.moonjob_output_mark
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
-- here: the area is full (the DONE frame carries this line itself), the
-- line wrote output (to stdout or stderr, or job:log), which the parent then
-- tags with this line, the batch's last, or it failed in a batch that ends at a
-- failure (--halt decides before any later line runs). The lines after it
-- go out again.
local function keep(b, completed)
  b.run = b.run + 1
  if completed == true then b.completed = b.completed + 1
  elseif completed == false then b.failed = b.failed + 1 end
  if batch_keep(record_buffer) then
    return output_mark() == b.output_mark and logs_sent == b.logs_sent
      and not (completed == false and b.end_on_failure)
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
  local find, sub, byte = string.find, string.sub, string.byte
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
      b.line, b.t0 = line, t0
      local data, err = json.decode(source)
      if err then
        lines_format.put_failed(record_buffer, line, input_error(err), b.attempt, now() - t0)
        completed = false
      else
        -- the same fields as a job of its own (run_job); the line number's
        -- text is made once, for its name and its result line
        local line_text = tostring(line)
        local job = setmetatable({ id = b.id, attempt = b.attempt, name = "line " .. line_text,
          number = b.number, data = data }, Job)
        completed = completed_line(line_text, b.attempt, processor(job), now() - t0)
      end
      b.line = nil
    end
    if not keep(b, completed) then return true end
  end
  return true
end

-- Runs the lines of batch `b` (under channel.run). A line that raises fails
-- with its error, and the lines after it go on; an interrupt or a full heap
-- (the message handler did not run) ends the batch there, b.line says where.
local function run_batch_lines(b)
  while true do
    local ok, result = xpcall(run_lines, handler, b)
    if ok then return end
    if b.line == nil then error(result, 0) end -- not inside a line: the runner's own failure
    if type(result) ~= "table" or result.value == "not enough memory" then
      b.raised = result
      return
    end
    local line = b.line
    b.line = nil
    lines_format.put_failed(record_buffer:reset(), line, failure_of(result, false), b.attempt, now() - b.t0)
    if not keep(b, false) then return end
  end
end

-- Runs a batch and sends its DONE frame. Returns true when the child must
-- end after it (a line filled the heap: the pool's rule for ENOMEM).
local function run_batch(number, meta, text)
  lines_format = lines_format or require "moonjob.codec.resultline"
  local b = { text = text, pos = 1, next_line = meta.first_line, id = meta.id, attempt = meta.attempt,
    number = number, run = 0, completed = 0, failed = 0, extra = "", output_mark = output_mark(),
    end_on_failure = meta.end_on_failure, logs_sent = logs_sent }
  local ok, value, interrupted, heap_full = channel.run(handler, run_batch_lines, b)
  if not ok and b.raised == nil and type(value) == "table" then b.raised = message_of(value.value) end
  b.text = nil
  if b.line then -- it stopped inside a line: that line fails, the rest go back
    local err
    if interrupted then
      local info = read_interrupt()
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
  flush_output()
  channel.send(channel.DONE, number, ("%d %d %d\n"):format(b.run, b.completed, b.failed),
    channel.KEPT, b.extra)
  return heap_full
end

local function run_job(number, payload)
  local meta, data = decode_job(payload)
  if not meta then return fail(number, data) end
  if meta.first_line then return run_batch(number, meta, data) end
  meta.first_line, meta.end_on_failure = nil, nil -- not fields of the job's
  local job = setmetatable(meta, Job)
  job.number = number
  job.data = data
  local ok, result, interrupted, heap_full = channel.run(handler, processor, job)
  if ok then return complete(number, result) end
  if interrupted then return fail_interrupted(number, job) end
  fail(number, failure_of(result, heap_full))
end

------------------------------------------------------------------- main ---

local function read_init()
  local kind, _, payload = channel.recv()
  if kind == nil then return false end
  assert(kind == channel.INIT, "the first frame must be INIT")
  for k, v in pairs(buffer.decode(payload)) do options[k] = v end
  if options.jit == false then jit.off() end
  return true
end

-- Returns the exit status of the child.
function M.main()
  if not read_init() then return 0 end
  local err
  channel.strict(true)
  -- the processor's directory: absolute, symbolic links resolved, from the
  -- parent (else the path's own), for its top level (`...`) and every job
  -- (job.dir): the files that ship beside it, from any working directory
  local dir = options.dir or options.processor:match("^(.*)/[^/]*$") or "."
  Job.dir = dir
  processor, err = load_processor(options.processor, dir)
  channel.strict(false)
  if not processor and err.message == "not enough memory" then
    err.message = ("the processor needed more than memory_limit (%d bytes) to load")
      :format(options.memory_limit or 0)
  end
  if not processor then
    flush_output()
    channel.send(channel.LOADERR, 0, encode_error(err))
    return 3
  end
  channel.send(channel.READY, 0)
  while true do
    local kind, number, payload = channel.recv()
    if kind == nil then return 0 end
    if kind == channel.JOB and run_job(number, payload) then return 0 end -- ENOMEM in a batch: this child ends
  end
end

return M
