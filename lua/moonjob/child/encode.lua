-- moonjob.child.encode -- what a job raised or returned, made fit to cross the
-- channel to the parent (child side, for moonjob.child.runner and
-- moonjob.child.batch).
--
-- Errors become plain tables { code, message, traceback, ... } that
-- string.buffer can encode: the processor's own fields that can cross are
-- kept, the others become placeholders that say why ("[function]",
-- "[Circular]", "[too deep]"), and a table raised without a message is
-- described. Whatever was raised is read defensively: fields raw first, and
-- every read that runs a metamethod of the user's (__index, __tostring) is
-- protected, so an object that raises when read (a strict class), a cdata, a
-- userdata or a cycle still becomes an error with the best message there is;
-- an error larger than max_payload loses its own fields, then has its
-- message and traceback cut. Results are checked against max_payload, and a
-- heap that filled (LUA_ERRMEM) becomes ENOMEM. Nothing here reads or writes
-- the channel.
--
-- Caveat: the limits come from the INIT options, which the runner shares with
-- this module once (encode.use_options) before any job runs. Only a heap
-- that fills while an error is read still makes "error in error handling".
local buffer = require "string.buffer"
local errors = require "moonjob.errors"
local json = require "moonjob.codec.json"

-- Kept before any processor code runs: a processor may replace the globals.
local debug_getmetatable, next, pcall, rawget, tostring, type =
  debug.getmetatable, next, pcall, rawget, tostring, type
local traceback_of, concat, floor, max = debug.traceback, table.concat, math.floor, math.max

local M = {}

local options = { max_payload = 64 * 1024 * 1024 } -- the runner's INIT options (use_options)

-- encode.use_options(t): the table of INIT options (max_payload,
-- memory_limit) to read the limits from, the runner's own.
function M.use_options(t)
  options = t
end

---------------------------------------------------------------- errors ---

local MAX_DEPTH = 20 -- nested tables in an error past this become "[too deep]"
local MESSAGE_DEPTH = 4 -- a message that is itself an error object, that many levels deep

-- Reading a user's error object runs the user's metamethods (__index,
-- __tostring), which may raise (the strict-class pattern raises on any field
-- it lacks): every such read is protected, and raw reads come first.
local function index(t, k) return t[k] end

-- t[k], or nil when the object lacks it or reading it raised.
local function field(t, k)
  local v = rawget(t, k)
  if v ~= nil then return v end
  local mt = debug_getmetatable(t) -- getmetatable honours __metatable, which may be anything
  if mt == nil or rawget(mt, "__index") == nil then return nil end
  local ok, value = pcall(index, t, k)
  if ok then return value end
  return nil
end

-- tostring(v), or nil when its __tostring raised or gave no string.
local function text_of(v)
  local t = type(v)
  if t == "string" then return v end
  if t == "number" or t == "boolean" or t == "nil" then return tostring(v) end
  local ok, text = pcall(tostring, v)
  if ok and type(text) == "string" then return text end
  return nil
end

-- A copy of v that string.buffer can encode: values that cannot cross become
-- a short placeholder that says why ("[function]", "[Circular]", ...). Fields
-- are read raw (next): no metamethod of the user's runs.
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
  for k, value in next, v do
    local tk = type(k)
    if tk == "string" or tk == "number" or tk == "boolean" then
      copy[k] = crossable(value, depth + 1, seen)
    end
  end
  seen[v] = nil
  return copy
end

-- A key or value shortened for a description, at most 40 characters; a
-- value that is a string is quoted.
local function short_text(v, quoted)
  local text
  if type(v) == "string" then text = quoted and ("%q"):format(v:sub(1, 40)) or v
  else text = text_of(v) or ("[" .. type(v) .. "]") end
  if #text > 40 then text = text:sub(1, 37) .. "..." end
  return text
end

-- A short text for a table raised without a usable message:
-- 'a table was raised: { reason = "x", n = 3 }' (a few fields, shortened).
local function describe_table(value)
  local fields, n = {}, 0
  for k, v in next, value do
    n = n + 1
    if n > 5 then fields[#fields + 1] = "..." break end
    fields[#fields + 1] = short_text(k) .. " = " .. short_text(v, true)
  end
  if n == 0 then return "a table was raised: {}" end
  return "a table was raised: { " .. concat(fields, ", ") .. " }"
end

-- The message of whatever was raised: a string as is; a table's `message`
-- (itself read as a message), or its __tostring, or a description of its
-- fields; a value whose __tostring fails is named by its type. Never raises.
local function message_of(value, depth)
  depth = depth or 1
  if type(value) ~= "table" then
    return text_of(value) or ("a %s was raised (its __tostring failed)"):format(type(value))
  end
  local message = nil
  if depth <= MESSAGE_DEPTH then message = field(value, "message") end
  if message ~= nil then return message_of(message, depth + 1) end
  local mt = debug_getmetatable(value)
  local text = mt and rawget(mt, "__tostring") ~= nil and text_of(value)
  return text or describe_table(value)
end
M.message_of = message_of

-- Turns whatever a processor raised into an error table that can cross the
-- channel: code, message, traceback, plus every field of the user's own that
-- can cross (the others become placeholders). Never raises.
local function to_error(value, traceback, default_code)
  local err
  if type(value) == "table" then
    err = crossable(value, 1, {})
    err.message = message_of(value)
    local code = field(value, "code")
    err.code = type(code) == "string" and code or default_code
  else
    err = { code = default_code, message = message_of(value) }
  end
  if type(err.traceback) ~= "string" then err.traceback = traceback end
  return err
end
M.to_error = to_error

-- s cut to `limit` bytes, saying how long it was.
local function cut(s, limit)
  if type(s) ~= "string" or #s <= limit then return s end
  return s:sub(1, limit) .. ("... [cut: %d bytes in all]"):format(#s)
end

-- The bytes of a FAIL or LOADERR frame's error, within max_payload (the
-- parent refuses a larger frame): the error whole when it fits; else without
-- its own fields (when they were too large, the message says so); else with
-- its message and traceback cut to fit.
function M.encode_error(err)
  local limit = options.max_payload
  local ok, bytes = pcall(buffer.encode, err)
  if ok and #bytes <= limit then return bytes end
  local plain = { code = err.code, message = err.message, traceback = err.traceback }
  local fits, plain_bytes = pcall(buffer.encode, plain)
  if fits and not ok and #plain_bytes <= limit then return plain_bytes end -- a field that cannot be encoded
  if fits and #plain_bytes + 200 <= limit then
    plain.message = ("%s [its other fields were left out: %d bytes, more than max_payload (%d)]")
      :format(tostring(plain.message), #bytes, limit)
    return buffer.encode(plain)
  end
  local each = max(floor((limit - 1024) / 2), 256)
  plain.message, plain.traceback = cut(plain.message, each), cut(plain.traceback, each)
  return buffer.encode(plain)
end

-- A frame line of the runner's side: a file of moonjob/child/ (the runner,
-- the batch runner, this module), or a C function (channel.run, the pcalls
-- that call the runner).
local function runner_frame(line)
  return line:find("^\t%[C%]:") ~= nil or line:find("moonjob/child/[%w_]+%.lua:%d+:") ~= nil
end

-- A traceback cut at the processor's own frames: the runner's frames below
-- the function it called (where moonjob's install path shows) are dropped,
-- so the last frame is the processor's. Frames above it stay, a runner's
-- among them (job:progress raising names it).
local function processor_frames(traceback)
  if type(traceback) ~= "string" then return traceback end
  local kept = traceback
  while true do
    local at = kept:match("()\n[^\n]*$") -- where the last line starts
    if not at or not runner_frame(kept:sub(at + 1)) then return kept end
    kept = kept:sub(1, at - 1)
  end
end
M.processor_frames = processor_frames

-- The message handler of every protected call of the processor's code: what
-- was raised, and the traceback from where it was raised (the processor's
-- frames).
function M.handler(value)
  return { value = value, traceback = processor_frames(traceback_of(message_of(value), 2)) }
end

------------------------------------------------------- inputs, results ---

-- The EINPUT error of JSON text that did not decode (json.decode's message).
function M.input_error(err)
  local what = err:find("^number ") and "input cannot cross exactly: "
    or err:find("^nested deeper") and "input cannot be decoded: " or errors.NOT_JSON
  return errors.new("EINPUT", what .. err) -- (EINPUT is never retried: pool/endings.lua's FINAL)
end

-- string.buffer's limit, in the words of moonjob.codec.json's (LuaJIT's own: "too deep to serialize")
local BUFFER_TOO_DEEP = json.too_deep(100)

-- The EPAYLOAD error of a result that could not be encoded (why) or is over
-- max_payload; nil when `bytes` may go.
function M.result_problem(bytes, why)
  if not bytes then
    local text = tostring(why):gsub("^.-:%d+: ", ""):gsub("^too deep to serialize$", BUFFER_TOO_DEEP)
    return { code = "EPAYLOAD", message = "the result cannot be encoded: " .. text }
  end
  if #bytes > options.max_payload then
    return { code = "EPAYLOAD", message = ("the result is %d bytes, more than max_payload (%d); "
      .. "return less or raise max_payload"):format(#bytes, options.max_payload) }
  end
end

---------------------------------------------------------------- memory ---

-- A heap filled outside the processor's own call (receiving or decoding the
-- job's data, encoding its result) is ENOMEM like any other.
function M.is_memory_error(e)
  return type(e) == "string" and e:find("not enough memory", 1, true) ~= nil
end

local function out_of_memory(what)
  return { code = "ENOMEM", message = ("%s needed more than memory_limit (%d bytes)")
    :format(what, options.memory_limit or 0) }
end
M.out_of_memory = out_of_memory

-- The error of a job whose protected call failed (channel.run). The message
-- handler does not run for memory errors (LUA_ERRMEM): the raw "not enough
-- memory" comes back instead of the handler's table (or the handler itself
-- ran out: "error in error handling"); channel.run tells.
function M.failure_of(result, heap_full)
  if type(result) ~= "table" then result = { value = result } end
  if heap_full or result.value == "not enough memory" then
    local err = out_of_memory("the job")
    err.traceback = result.traceback
    return err
  end
  return to_error(result.value, result.traceback, "EPROCESSOR")
end

------------------------------------------------------------- interrupts ---

-- Why the parent interrupted the job, from the payload of its INTERRUPT frame
-- (channel.interrupt(), nil when the child could not keep it). Returns
-- { code, message, reason }.
function M.interrupt_reason(payload)
  local ok, info = false, nil
  if payload then ok, info = pcall(buffer.decode, payload) end
  if ok and type(info) == "table" then return info end
  return { code = "ECANCELED", message = "the job was interrupted" } -- a heap too full to read why
end

return M
