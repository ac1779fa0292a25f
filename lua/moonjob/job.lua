-- moonjob.job -- the parent's handle on one job.
--
-- A job is created by pool:add and ends exactly once: "completed" with a
-- result, or "failed" with an error table (moonjob.errors). Its data and result
-- stay as encoded bytes; the result is decoded on first use (job.result,
-- job:wait(), a "completed" listener), never on the loop's hot path.
--
-- Fields: id, name, state ("waiting", "active", "completed", "failed"; "left"
-- for a job its owner took out of the pool, moonjob.pool.source),
-- attempts, logs (lines the job printed and job:log texts), error, ms (wall
-- time from start to end of the run), cpu_ms and max_rss_kb (measured by the
-- child), pid (the child that ran it).
local buffer = require "string.buffer"
local errors = require "moonjob.errors"
local loop = require "moonjob.loop"
require "ffi" -- string.buffer decodes 64-bit integer cdata (42LL) only once ffi is loaded

local Job = {}
local methods = {}

-- A waiting job must stay small (a million may wait): its hot fields live in
-- the table's array part, colocated with the table header (64 + 6 x 8 bytes),
-- and are reached by name through the metatable. The fields every run sets
-- (attempts, child, pid, started, ms, ...) have slots too, after those: the
-- array part grows to them in one step when the job is first sent
-- (Job.grow), which costs a fraction of what growing a hash part key by key
-- does (a rehash at each power of two), and nothing while the job waits.
-- Every other field is a plain named field, set only when it has a value;
-- `pool` comes from the pool's own metatable, `attempts` reads 0 until set,
-- `logs` is made on first use. A slot holds false for nil.
local SLOTS = { id = 1, data_bytes = 2, state = 3, added = 4, qindex = 5, priority = 6,
  attempts = 7, child = 8, prefetched = 9, ahead_since = 10, pid = 11, started = 12, ms = 13,
  cpu_ms = 14, max_rss_kb = 15, result_bytes = 16 }
local RUN_SLOTS = 16 -- the last one (Job.grow makes 7 to 16)
Job.SLOT = SLOTS -- for the pool's hot paths, which read and write them directly (false for nil)
local ATTEMPTS, RESULT_BYTES = SLOTS.attempts, SLOTS.result_bytes

-- Job.grow(job): the slots of a run, made at once (see above); the pool
-- calls it before it first sends the job.
function Job.grow(job)
  if rawget(job, RUN_SLOTS) ~= nil then return end
  -- in order, without a loop (a loop here would abort the callers' traces);
  -- a slot set before keeps its value (pool:add's first_attempt sets
  -- attempts: a line that failed in a batch goes on counting)
  rawset(job, 7, rawget(job, 7) or false); rawset(job, 8, rawget(job, 8) or false)
  rawset(job, 9, rawget(job, 9) or false); rawset(job, 10, rawget(job, 10) or false)
  rawset(job, 11, rawget(job, 11) or false); rawset(job, 12, rawget(job, 12) or false)
  rawset(job, 13, rawget(job, 13) or false); rawset(job, 14, rawget(job, 14) or false)
  rawset(job, 15, rawget(job, 15) or false); rawset(job, 16, rawget(job, 16) or false)
end

-- The result's bytes, or nil.
local function result_bytes(job)
  return rawget(job, RESULT_BYTES) or nil
end

-- Job.bytes(payload) -> string. A payload larger than the core's piece size
-- (256 KiB, MJ_PIECE) arrives as a list of pieces, so that no loop callback
-- copies it whole; it is joined only when someone needs it as one string.
function Job.bytes(payload)
  if type(payload) == "table" then return table.concat(payload) end
  return payload
end

local decoders = {
  lua = function(bytes) return buffer.decode(Job.bytes(bytes)) end,
  json = Job.bytes, -- JSON text is handed over as is
}

local function index(pool, job, key)
  local slot = SLOTS[key]
  if slot then
    local v = rawget(job, slot)
    if v == false or v == nil then
      if slot == ATTEMPTS then return 0 end
      return nil
    end
    return v
  end
  local m = methods[key]
  if m ~= nil then return m end
  if key == "pool" then return pool end
  if key == "logs" then
    local logs = {}
    rawset(job, "logs", logs)
    return logs
  end
  if key == "result" then
    if rawget(job, "decoded") then return rawget(job, "result_value") end
    local bytes = result_bytes(job)
    if bytes == nil then return nil end
    local ok, value = pcall(decoders[pool.codec], bytes)
    return ok and value or nil
  end
  if key == "progress" then -- bytes that do not decode (a broken child) read as nil
    local bytes = rawget(job, "progress_bytes")
    if bytes == nil then return nil end
    local ok, value = pcall(buffer.decode, Job.bytes(bytes))
    if ok then return value end
    return nil
  end
  return nil
end

local function newindex(job, key, value)
  local slot = SLOTS[key]
  if slot then
    if value == nil then value = false end -- keeps the array part in place
    rawset(job, slot, value)
  else
    rawset(job, key, value)
  end
end

local function tostring_job(job)
  return ("<moonjob.job %s %s>"):format(tostring(job.id), job.state)
end

-- Job.metatable(pool) -> the metatable of that pool's jobs
function Job.metatable(pool)
  return {
    __index = function(job, key) return index(pool, job, key) end,
    __newindex = newindex,
    __tostring = tostring_job,
  }
end

-- Job.new(mt, id, added) -> a waiting job without data yet
function Job.new(mt, id, added)
  return setmetatable({ id, false, "waiting", added, false, false }, mt)
end

-- Job.decode(pool, job) -> true | false, why. Decodes the result once (kept
-- for later reads of job.result); false when the bytes do not decode.
function Job.decode(pool, job)
  local ok, value = pcall(decoders[pool.codec], result_bytes(job))
  if not ok then return false, tostring(value) end
  rawset(job, "result_value", value)
  rawset(job, "decoded", true)
  return true
end

function methods:is_finished()
  return self.state == "completed" or self.state == "failed"
end

local function outcome(job)
  if job.state ~= "completed" then return nil, job.error end
  if not rawget(job, "decoded") and result_bytes(job) ~= nil then
    local ok, why = Job.decode(job.pool, job)
    if not ok then return nil, errors.new("EPROTO", "the child's result cannot be decoded: " .. why) end
  end
  return job.result
end

-- job:cancel([reason]) -> true, or false when the job had already ended. A
-- waiting job fails at once with ECANCELED; a running one is interrupted like
-- a timeout (its cleanup runs; the child is killed after kill_after).
function methods:cancel(reason)
  return self.pool:cancel_job(self, reason)
end

-- job:wait() -> result | nil, err. Runs the loop until the job ends.
function methods:wait()
  if not self:is_finished() then
    loop.wait_until(function() return self:is_finished() end)
  end
  return outcome(self)
end

return Job
