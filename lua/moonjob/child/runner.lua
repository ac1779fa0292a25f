-- moonjob.child.runner -- the child side: load a processor file, then run its jobs.
--
-- Runs inside the moonjob-child program, which preloads `moonjob.channel`
-- (blocking frame I/O on fd 3, and channel.run, which makes a job
-- interruptible by the parent) and calls runner.main(). The first frame is
-- INIT with the options; the runner loads the processor once, answers READY
-- (or LOADERR and exits), then serves JOB frames one at a time until
-- end-of-file on the channel. An interrupted job (soft timeout, cancel) runs
-- the processor's cleanup(job, reason) and fails with the code the parent
-- sent (ETIMEDOUT, ECANCELED). A JOB frame that is a batch of lines (moonjob
-- run) goes to moonjob.child.batch; what a job raised or returned is made fit
-- to cross by moonjob.child.encode.
--
-- Every value crossing the channel is encoded with string.buffer (exact), except
-- in the "json" codec where job data arrives as JSON text and results leave as
-- exact JSON text (see moonjob.codec.json), so the parent never parses payloads;
-- with the pool's raw option, the data is that text itself, not decoded.
local channel = require "moonjob.channel"
local batch = require "moonjob.child.batch" -- requires the channel itself: before it is hidden
-- The channel is the child modules' alone: a processor cannot require it.
package.loaded["moonjob.channel"], package.preload["moonjob.channel"] = nil, nil
local buffer = require "string.buffer"
local json = require "moonjob.codec.json"
local child_rows = require "moonjob.codec.children" -- (a flow's parent's job.children)
local encode = require "moonjob.child.encode"
-- Nor the runner's parts: the batch runner holds the channel and the
-- processor, and encode the limits results and errors must keep to.
package.loaded["moonjob.child.batch"], package.loaded["moonjob.child.encode"] = nil, nil
require "moonjob.codec.json_lua" -- (the codec loads it when a text needs it: by then a processor
-- may have removed the globals its file reads at load)

-- Kept at load, before the processor's file runs: a processor may remove or
-- replace any global (`pcall = nil`, `math = nil`, `io = nil`), and its child
-- must still run the next job. The modules the runner uses per job keep
-- theirs the same way (spec/child/processor_spec.lua checks their bytecode).
local assert, collectgarbage, error, loadfile, pairs, pcall, select, setmetatable, tostring, type, xpcall =
  assert, collectgarbage, error, loadfile, pairs, pcall, select, setmetatable, tostring, type, xpcall
local abs, concat, jit, package = math.abs, table.concat, jit, package
local stdout, stderr = io.stdout, io.stderr -- the child's own, whatever a processor does to io

local handler, to_error, encode_error = encode.handler, encode.to_error, encode.encode_error
local failure_of, out_of_memory, is_memory_error = encode.failure_of, encode.out_of_memory, encode.is_memory_error

local M = {}

local options = { codec = "lua", max_payload = 64 * 1024 * 1024 }
local processor = nil          -- the function that runs a job
local cleanup = nil            -- the processor's optional cleanup(job, reason)
local decoder = buffer.new()
encode.use_options(options)

-- What the processor printed is written, and counted, before the frame that
-- ends its job (a job-ending frame carries the output byte counts).
local function flush_output()
  stdout:flush()
  stderr:flush()
end

-- A command a processor runs writes to the child's stdout and stderr
-- itself: what the child holds of its output (a batch's lines, tagged:
-- core/child/output.c) is written first, so that the command's comes after.
local function flushing_first(run)
  local output_flush = channel.output_flush
  return function(...) output_flush() return run(...) end
end
os.execute, io.popen = flushing_first(os.execute), flushing_first(io.popen)

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
-- batch: a batch of lines runs (moonjob.child.batch sets it): job:log() is
-- then a line on stderr, which the child tags with the line running
local sent = { batch = false }

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
  local text = concat(parts, " ")
  check_size("job:log(): the text", text)
  if sent.batch then -- tagged with its line and written with its output: no frame per log
    stderr:write(text, "\n")
    return
  end
  channel.send(channel.LOG, self.number, text)
end

function Job:__tostring()
  return "<moonjob.job " .. tostring(self.id) .. " running>"
end

local codecs = {
  lua = {
    decode = function() return decoder:decode() end,
    encode = buffer.encode,
  },
  json = {
    decode = function()
      if options.raw then return decoder:tostring() end -- (moonjob run --raw: the line is the data)
      local value, err = json.decode(decoder:tostring())
      if err then error(encode.input_error(err)) end
      return value
    end,
    encode = function(value) return assert(json.encode(value)) end,
  },
}

local function fail(number, err)
  flush_output()
  channel.send(channel.FAIL, number, encode_error(err))
end

local function complete(number, result)
  local codec = codecs[options.codec]
  local ok, bytes = pcall(codec.encode, result)
  if not ok and is_memory_error(bytes) then
    collectgarbage()
    return fail(number, out_of_memory("encoding the result"))
  end
  local problem = encode.result_problem(ok and bytes, not ok and bytes)
  if problem then return fail(number, problem) end
  flush_output()
  channel.send(channel.DONE, number, bytes)
end

-- After an interruption: cleanup(job, reason) runs (not interruptible; the
-- parent's hard kill bounds it), then the job fails with the parent's code.
-- heap_full: its heap was full too; the error says so (heap_full, which
-- the parent reads and drops), so that the parent replaces this child.
local function fail_interrupted(number, job, heap_full)
  local info = encode.interrupt_reason(channel.interrupt())
  local err = { code = info.code, message = info.message, reason = info.reason,
    traceback = encode.processor_frames(channel.interrupt_traceback()), heap_full = heap_full or nil }
  if cleanup then
    local ok, failure = xpcall(cleanup, handler, job, info.reason)
    if not ok then
      if type(failure) ~= "table" then failure = { value = failure } end -- a memory error
      err.cleanup_error = tostring(to_error(failure.value, nil, "EPROCESSOR").message)
    end
  end
  fail(number, err)
end

-- The job's meta: its id, attempt, name, the number of its first line
-- when it is a batch of lines (else false), and a flow's parent's children
-- (else nil), encoded one after the other (no table to build in the parent
-- for each job).
local function decode_meta()
  local id = decoder:decode()
  local attempt = decoder:decode()
  local name = decoder:decode()
  local first = decoder:decode() -- negative: the batch ends at its first failed line (--halt)
  local children = decoder:decode()
  local line_timeout = nil -- { first, seconds }: each line's timeout (moonjob.pool.lines)
  if type(first) == "table" then first, line_timeout = first[1], first[2] end
  return { id = id, attempt = attempt, name = name, first_line = first and abs(first),
    end_on_failure = first and first < 0, line_timeout = line_timeout,
    children = children and child_rows.decode(children, json, true) }
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

local function run_job(number, payload)
  local meta, data = decode_job(payload)
  if not meta then return fail(number, data) end
  if meta.first_line then return batch.run(number, meta, data) end
  meta.first_line, meta.end_on_failure, meta.line_timeout = nil, nil, nil -- not fields of the job's
  local job = setmetatable(meta, Job)
  job.number = number
  job.data = data
  local ok, result, interrupted, heap_full = channel.run(handler, processor, job)
  if ok then return complete(number, result) end
  if interrupted then -- (interrupted with its heap full: the child ends too)
    fail_interrupted(number, job, heap_full)
    return heap_full
  end
  fail(number, failure_of(result, heap_full))
  -- A full heap: this child ends (its pool replaces it anyway), rather than
  -- collect gigabytes for seconds; the OS frees them at once.
  return heap_full
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
  batch.setup({ processor = processor, Job = Job, sent = sent, flush_output = flush_output,
    cleanup = cleanup, raw = options.raw, max_payload = options.max_payload })
  flush_output() -- what the file printed at load or in init() is counted in READY: it is no job's
  channel.send(channel.READY, 0)
  while true do
    local kind, number, payload = channel.recv()
    if kind == nil then return 0 end
    if kind == channel.JOB and run_job(number, payload) then return 0 end -- ENOMEM: this child ends
  end
end

return M
