-- moonjob.pool.endings -- how a job ends, or comes back to wait again.
--
-- Methods mixed into the Pool class (see pool/init.lua). Every failed attempt goes
-- through _fail: the job waits again after its backoff, or fails for good;
-- every ending goes through _finish, the one place a job becomes "completed"
-- or "failed" (exactly once): counters, the job's key and the result cache,
-- its listeners, and `drained`. Also here: jobs that end without running (a
-- refusal in add, a cache hit) on a later loop turn, cancel, and a job given
-- back because its child never took it.
--
-- Caveats: once the pool is closing nothing is retried (no child would run it
-- again). A job that never ran ends on a later loop turn, never inside add
-- (callers expecting an answer later must not get it now); `ndeferred` counts
-- those endings so that drain() waits for them. `nactive` counts the jobs
-- whose state is "active": whoever moves a job out of that state takes it
-- down by one.
local errors = require "moonjob.errors"
local loop = require "moonjob.loop"
local Backoff = require "moonjob.backoff"

local Pool = {}

-- Failures that another attempt cannot fix.
local FINAL = { ECANCELED = true, ECLOSED = true, EPAYLOAD = true, EINPUT = true, ELOST = true }

-- Seconds before the job's next attempt, or nil when it fails for good.
function Pool:_retry_delay(job, err)
  local max = job.max_attempts or self.attempts
  if job.attempts >= max or err.retry == false or FINAL[err.code] then return nil end
  local delay = Backoff.delay(job.backoff or self.backoff, job.attempts, err)
  return delay ~= false and delay or nil
end

-- A job's attempt failed: it comes back after its backoff, or fails for good
-- (always once the pool is closing: nothing would run it again).
-- not_before (loop.now() milliseconds) holds a retry back further.
function Pool:_fail(job, err, not_before)
  self:_unqueue(job)
  job.error = err
  job.errors = job.errors or {}
  job.errors[#job.errors + 1] = err
  if job.remote_id then return self:_fail_remote(job, err) end
  local delay = not self.closing and self:_retry_delay(job, err)
  if not delay then return self:_finish(job, "failed") end
  if job.state == "active" then self.nactive = self.nactive - 1 end
  job.state, job.worker, job.interrupt = "waiting", nil, nil
  local now = loop.now()
  job.run_at = now + delay * 1000
  if not_before and not_before > job.run_at then -- held back longer: the delay reported says so
    job.run_at, delay = not_before, (not_before - now) / 1000
  end
  self.counts.retries = self.counts.retries + 1
  self.source:push(job)
  if self.listeners.retrying then self:_emit("retrying", job, err, delay) end
end

-- A job from Redis: the queue decides on its retry, with the delay our
-- backoff computed (it knows the attempts across hosts); here the job only
-- leaves the pool. A job this worker stopped because its lease is no longer
-- provably its own (abandoned) is not reported at all.
function Pool:_fail_remote(job, err)
  if err.code == "ELOAD" and not job.abandoned then -- it cannot load here; it may elsewhere
    job.error = errors.new("ECLOSED", "given back: the processor cannot load on this worker")
    return self:_finish(job, "failed") -- given back, not counted
  end
  -- closing or not: another host may retry it
  local delay = not job.retry_never and self:_retry_delay(job, err)
  if not delay or job.abandoned then return self:_finish(job, "failed") end
  job.reported = true
  self.remote:failed(job, err, delay * 1000)
  self.counts.retries = self.counts.retries + 1
  if self.listeners.retrying then self:_emit("retrying", job, err, delay) end
  return self:_leave(job)
end

-- A remote job leaves the pool without ending here (it retries, or goes back
-- to the queue): the bookkeeping of _finish without counts or events.
function Pool:_leave(job)
  if job.state == "active" then
    self.nactive = self.nactive - 1
    if job.started then self:_sample_run(self:_run_ms(job)) end
  end
  self:_unqueue(job)
  job.state, job.worker = "left", nil
  if self.listeners.drained and self:_idle() then self:_emit("drained") end
end

-- How long the job's attempt ran: as its child measured it (job.ms, set when
-- its ending frame came), else, for an attempt that ended without one (a
-- crash, a kill), from its start to now on the parent's clock.
function Pool:_run_ms(job)
  return job.ms or (loop.now() - job.started)
end

-- A job with a key (id or dedupe) leaves the in-flight map when it ends; a
-- completed one leaves its result in the cache (failures are never cached).
function Pool:_release_key(job, state)
  local key = job.key
  if not key then return end
  if self.inflight[key] == job then self.inflight[key] = nil end
  if state == "completed" and self.cache and not job.from_cache then
    self.cache:set(key, job.result_bytes, loop.now() + self.cache_ttl * 1000)
  end
end

-- Ends a job for good ("completed" or "failed"): its key, its run time,
-- the counters, its listeners, then `drained` if nothing is left to do.
function Pool:_finish(job, state)
  if job.remote_id and not job.reported then
    job.reported = true
    if job.abandoned or (state == "failed" and job.error.code == "ECLOSED") then
      self.remote:failed(job, job.error) -- given back to the queue (or, abandoned, left alone)
      return self:_leave(job)
    end
    if state == "completed" then self.remote:completed(job, job.result_bytes)
    else self.remote:failed(job, job.error) end
  end
  local was_active = job.state == "active"
  self:_unqueue(job)
  job.state, job.worker = state, nil
  self:_release_key(job, state)
  if job.started then job.ms = self:_run_ms(job) end
  if was_active then
    self.nactive = self.nactive - 1
    self:_sample_run(job.ms)
    self:_note_run(job.ms)
  end
  self.counts[state] = self.counts[state] + 1
  if state == "completed" then
    if self.listeners.completed then self:_emit("completed", job, job.result) end
  else
    if self.listeners.failed then self:_emit("failed", job, job.error) end
  end
  if self.listeners.drained and self:_idle() then
    self:_emit("drained")
  end
end

-- Ends a job that never ran on a later loop turn, never inside add: callers
-- expecting an answer later must not get it now. `ndeferred` keeps drain()
-- waiting for it.
function Pool:_finish_later(job, state)
  self.ndeferred = self.ndeferred + 1
  loop.defer(function()
    self.ndeferred = self.ndeferred - 1
    if not job:is_finished() then self:_finish(job, state) end
  end)
  return job
end

-- Fails a job that never ran (unserialisable, too big, pool closed).
function Pool:_refuse(job, err)
  job.error = err
  return self:_finish_later(job, "failed")
end

-- A cache hit still completes through the loop, never inside add.
function Pool:_complete_from_cache(job, result_bytes)
  self.counts.cache_hits = self.counts.cache_hits + 1
  job.result_bytes, job.from_cache = result_bytes, true
  return self:_finish_later(job, "completed")
end

-- Ends a job by cancel: a waiting one at once, a running one is interrupted
-- like a timeout (soft, then kill). A job queued in a child that has not
-- started it is taken back first (with the jobs behind it, which wait
-- again): it then ends at once, never having run; one the child started
-- meanwhile is interrupted. false when the job had already ended.
-- code: ECANCELED unless given (a remote job stopped by its worker: ELEASE, ELOST).
-- unstarted_only: a job a child started is left to run (false), never
-- interrupted (the command line's --halt soon).
function Pool:_cancel(job, reason, code, unstarted_only)
  if job:is_finished() or job.state == "left" then return false end
  local message = "the job was canceled" .. (reason ~= nil and (": " .. tostring(reason)) or "")
  if code and code ~= "ECANCELED" then message = reason end
  code = code or "ECANCELED"
  local fields = { code = code, message = message, reason = reason }
  if job.queued then
    -- taken back with the jobs behind it, it fails as given back with its
    -- interrupt set (at once, never sent again); one the child started is
    -- interrupted below
    local w = job.worker
    job.interrupt = fields
    self:_take_back(w, job)
    if w.state == "idle" then self:_worker_free(w) end -- it held nothing more
    if job:is_finished() then return true end
    job.interrupt = nil
  end
  if job.state == "waiting" and not job.queued then
    self.source:remove(job)
    job.error = errors.new(code, message, { reason = reason })
    self:_finish(job, "failed")
  elseif unstarted_only then
    return false
  elseif not job.interrupt then
    self:_interrupt(job.worker, job, fields)
  end
  return true
end

-- A job its child never took goes back to the head of the queue and the
-- attempt does not count, unless it was interrupted meanwhile (canceled, or
-- past its timeout): then it ends with that error, never having run.
function Pool:_give_back(job)
  self:_unqueue(job)
  job.attempts = job.attempts - 1 -- it never ran
  local f = job.interrupt
  if f then
    return self:_fail(job, errors.new(f.code, f.message .. "; its child never took it",
      { reason = f.reason }))
  end
  if self.closing then -- and no child will take it now
    return self:_fail(job, errors.new("ECLOSED", "the pool was closed before the job ran"))
  end
  if job.state == "active" then self.nactive = self.nactive - 1 end
  job.state, job.worker, job.started = "waiting", nil, nil
  self.source:push(job)
end

return Pool
