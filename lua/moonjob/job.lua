-- moonjob.job -- the parent's handle on one job.
--
-- A job is created by pool:add and ends exactly once: "completed" with a
-- result, or "failed" with an error table (moonjob.errors). Its data and result
-- stay as encoded bytes; the result is decoded on first use (job.result,
-- job:wait(), a "completed" listener), never on the loop's hot path.
--
-- Fields: id, name, state ("waiting", "active", "completed", "failed"),
-- attempts, logs (lines the job printed and job:log texts), error, ms (wall
-- time from start to end of the run), cpu_ms and max_rss_kb (measured by the
-- child), pid (the child that ran it).
local buffer = require "string.buffer"
local loop = require "moonjob.loop"

local Job = {}
local methods = {}

local decoders = {
  lua = buffer.decode,
  json = function(bytes) return bytes end, -- JSON text is handed over as is
}

local function decode(job, bytes)
  if bytes == nil then return nil end
  return decoders[job.pool.codec](bytes)
end

Job.__index = function(job, key)
  local m = methods[key]
  if m ~= nil then return m end
  if key == "result" then return decode(job, rawget(job, "result_bytes")) end
  if key == "progress" then
    local bytes = rawget(job, "progress_bytes")
    return bytes and buffer.decode(bytes)
  end
  return nil
end

function Job.__tostring(job)
  return ("<moonjob.job %s %s>"):format(tostring(job.id), job.state)
end

-- Job.new(pool, id, name, data_bytes) -> job, waiting
function Job.new(pool, id, name, data_bytes)
  return setmetatable({
    pool = pool, id = id, name = name, data_bytes = data_bytes,
    state = "waiting", attempts = 0, logs = {},
  }, Job)
end

function methods:is_finished()
  return self.state == "completed" or self.state == "failed"
end

local function outcome(job)
  if job.state == "completed" then return job.result end
  return nil, job.error
end

-- job:cancel([reason]) -> true, or false when the job had already ended. A
-- waiting job fails at once with ECANCELED; a running one is interrupted like
-- a timeout (its cleanup runs; the child is killed after kill_after).
function methods:cancel(reason)
  return self.pool:_cancel(self, reason)
end

-- job:wait() -> result | nil, err. Runs the loop until the job ends.
function methods:wait()
  if not self:is_finished() then
    loop.wait_until(function() return self:is_finished() end)
  end
  return outcome(self)
end

return Job
