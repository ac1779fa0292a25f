-- moonjob.pool.endings -- how a job ends, or comes back to wait again.
--
-- A part of the pool (see pool/init.lua), pool.endings. Every failed attempt
-- goes through fail: the job waits again after its backoff, or fails for
-- good; every ending goes through finish, the one place a job becomes
-- "completed" or "failed" (exactly once): counters, the job's key and the
-- result cache, its listeners, and `drained`. Also here: jobs that end
-- without running (a refusal in add, a cache hit) on a later loop turn,
-- cancel, and a job given back because its child never took it.
--
-- A job with an owner (job.owner: the second job source that brought it,
-- moonjob.redis.remote; the hook is documented in moonjob.pool.source) ends
-- through that owner: a failed attempt is the owner's to retry
-- (owner:attempt_failed), and an ending is reported to it first
-- (owner:ending), which may say the job leaves the pool instead (leave: the
-- bookkeeping of finish without counts or events). Local jobs have no owner.
--
-- Owns: nothing but the rules; the pool's nactive (jobs "active": whoever
-- moves a job out of that state takes it down by one) and ndeferred
-- (endings due on a later loop turn: drain waits for them) are the pool's.
-- Exposes: endings:fail(job, err [, not_before]), endings:finish(job, state),
-- endings:leave(job), endings:retry_delay(job, err), endings:retried(job,
-- err, delay), endings:refuse(job, err), endings:complete_from_cache(job,
-- bytes), endings:cancel(job, reason [, code [, unstarted_only]]),
-- endings:give_back(job).
-- Calls: pool.dispatch (unprefetch, note_run, take_back), pool.children:free,
-- pool.deadlines:interrupt, pool.tally, pool.events, pool.source (push,
-- remove, release), pool:is_idle(), job.owner.
--
-- Caveats: once the pool is closing nothing is retried (no child would run it
-- again). A job that never ran ends on a later loop turn, never inside add
-- (callers expecting an answer later must not get it now).
local errors = require "moonjob.errors"
local loop = require "moonjob.loop"
local Backoff = require "moonjob.backoff"
local Job = require "moonjob.job"

-- finish runs for every job: it reads and writes the job's slots (Job.SLOT,
-- false for nil) and other fields with rawget, not through its metatable.
local SLOT = Job.SLOT
local STATE, CHILD, STARTED, MS = SLOT.state, SLOT.child, SLOT.started, SLOT.ms

local Endings = {}
Endings.__index = Endings

-- Failures that another attempt cannot fix.
local FINAL = { ECANCELED = true, ECLOSED = true, EPAYLOAD = true, EINPUT = true, ELOST = true,
  EINTERNAL = true }

function Endings.new(pool)
  return setmetatable({ pool = pool, listeners = pool.events.listeners }, Endings)
end

-- Seconds before the job's next attempt, or nil when it fails for good.
function Endings:retry_delay(job, err)
  local pool = self.pool
  local max = job.max_attempts or pool.attempts
  if job.attempts >= max or err.retry == false or FINAL[err.code] then return nil end
  local delay = Backoff.delay(job.backoff or pool.backoff, job.attempts, err)
  return delay ~= false and delay or nil
end

-- A retry was decided: counted, and the `retrying` listeners told.
function Endings:retried(job, err, delay)
  self.pool.tally:bump("retries")
  if self.listeners.retrying then self.pool.events:emit("retrying", job, err, delay) end
end

-- A job's attempt failed: it comes back after its backoff, or fails for good
-- (always once the pool is closing: nothing would run it again).
-- not_before (loop.now() milliseconds) holds a retry back further.
function Endings:fail(job, err, not_before)
  local pool = self.pool
  pool.dispatch:unprefetch(job)
  job.error = err
  job.errors = job.errors or {}
  job.errors[#job.errors + 1] = err
  local owner = job.owner
  if owner then return owner:attempt_failed(job, err) end
  local delay = not pool.closing and self:retry_delay(job, err)
  if not delay then return self:finish(job, "failed") end
  if job.state == "active" then pool.nactive = pool.nactive - 1 end
  job.state, job.child, job.interrupt = "waiting", nil, nil
  local now = loop.now()
  job.run_at = now + delay * 1000
  if not_before and not_before > job.run_at then -- later still: the delay reported says so
    job.run_at, delay = not_before, (not_before - now) / 1000
  end
  pool.source:push(job)
  self:retried(job, err, delay)
end

-- A job leaves the pool without ending here (its owner retries it, or it
-- went back to the owner's queue): the bookkeeping of finish without counts
-- or events.
function Endings:leave(job)
  local pool = self.pool
  if job.state == "active" then
    pool.nactive = pool.nactive - 1
    if job.started then pool.tally:sample_run(self:run_ms(job)) end
  end
  pool.dispatch:unprefetch(job)
  job.state, job.child = "left", nil
  if self.listeners.drained and pool:is_idle() then pool.events:emit("drained") end
end

-- How long the job's attempt ran: as its child measured it (job.ms, set when
-- its ending frame came), else, for an attempt that ended without one (a
-- crash, a kill), from its start to now on the parent's clock.
function Endings:run_ms(job)
  return job[MS] or (loop.now() - job[STARTED])
end

-- A job with a key (id or dedupe) leaves pool.by_key when it ends; a
-- completed one leaves its result in the cache (failures are never cached).
function Endings:release_key(job, state)
  local key = rawget(job, "key")
  if not key then return end
  local pool = self.pool
  if pool.by_key[key] == job then pool.by_key[key] = nil end
  if state == "completed" and pool.cache and not job.from_cache then
    pool.cache:set(key, job.result_bytes, loop.now() + pool.cache_ttl * 1000)
  end
end

-- Ends a job for good ("completed" or "failed"): its owner told, its key,
-- its run time, the counters, its listeners, then `drained` if nothing is
-- left to do.
function Endings:finish(job, state)
  local pool = self.pool
  local owner = rawget(job, "owner")
  if owner and owner:ending(job, state) then return self:leave(job) end
  local was_active = job[STATE] == "active"
  if rawget(job, "holds_group") then pool.source:release(job) end -- (moonjob.pool.source)
  pool.dispatch:unprefetch(job)
  job[STATE], job[CHILD] = state, false
  self:release_key(job, state)
  if job[STARTED] then job[MS] = self:run_ms(job) end
  if was_active then
    local ms = job[MS]
    pool.nactive = pool.nactive - 1
    pool.tally:sample_run(ms)
    pool.dispatch:note_run(ms)
  end
  pool.tally:bump(state)
  local listeners = self.listeners
  if state == "completed" then
    if listeners.completed then pool.events:emit("completed", job, job.result) end
  else
    local err = job.error
    if err and err.code == "ECANCELED" then pool.tally:bump("canceled") end
    if listeners.failed then pool.events:emit("failed", job, err) end
  end
  if listeners.drained and pool:is_idle() then
    pool.events:emit("drained")
  end
end

-- Ends a job that never ran on a later loop turn, never inside add: callers
-- expecting an answer later must not get it now. ndeferred keeps drain()
-- waiting for it.
function Endings:finish_later(job, state)
  local pool = self.pool
  pool.ndeferred = pool.ndeferred + 1
  loop.defer(function()
    pool.ndeferred = pool.ndeferred - 1
    if not job:is_finished() then self:finish(job, state) end
  end)
  return job
end

-- Fails a job that never ran (unserialisable, too big, pool closed).
function Endings:refuse(job, err)
  job.error = err
  return self:finish_later(job, "failed")
end

-- A cache hit still completes through the loop, never inside add.
function Endings:complete_from_cache(job, result_bytes)
  self.pool.tally:bump("cache_hits")
  job.result_bytes, job.from_cache = result_bytes, true
  return self:finish_later(job, "completed")
end

-- Ends a job by cancel: a waiting one at once, a running one is interrupted
-- like a timeout (soft, then kill). A prefetched job its child has not
-- started is taken back first (with the jobs behind it, which wait again):
-- it then ends at once, never having run; one the child started meanwhile is
-- interrupted. false when the job had already ended.
-- code: ECANCELED unless given (a remote job stopped by its owner: ELEASE, ELOST).
-- unstarted_only: a job a child started is left to run (false), never
-- interrupted (the command line's --halt soon).
function Endings:cancel(job, reason, code, unstarted_only)
  if job:is_finished() or job.state == "left" then return false end
  local pool = self.pool
  local message = "the job was canceled" .. (reason ~= nil and (": " .. tostring(reason)) or "")
  if code and code ~= "ECANCELED" then message = reason end
  code = code or "ECANCELED"
  local fields = { code = code, message = message, reason = reason }
  if job.prefetched then
    -- taken back with the jobs behind it, it fails as given back with its
    -- interrupt set (at once, never sent again); one the child started is
    -- interrupted below
    local child = job.child
    job.interrupt = fields
    pool.dispatch:take_back(child, job)
    if child.state == "idle" then pool.children:free(child) end -- nothing more was sent to it
    if job:is_finished() then return true end
    job.interrupt = nil
  end
  if job.state == "waiting" and not job.prefetched then
    pool.source:remove(job)
    job.error = errors.new(code, message, { reason = reason })
    self:finish(job, "failed")
  elseif unstarted_only then
    return false
  elseif not job.interrupt then
    pool.deadlines:interrupt(job.child, job, fields)
  end
  return true
end

-- A job its child never took goes back to the head of the queue and the
-- attempt does not count, unless it was interrupted meanwhile (canceled, or
-- past its timeout): then it ends with that error, never having run.
function Endings:give_back(job)
  local pool = self.pool
  pool.dispatch:unprefetch(job)
  job.attempts = job.attempts - 1 -- it never ran
  local f = job.interrupt
  if f then
    return self:fail(job, errors.new(f.code, f.message .. "; its child never took it",
      { reason = f.reason }))
  end
  if pool.closing then -- and no child will take it now
    return self:fail(job, errors.new("ECLOSED", "the pool was closed before the job ran"))
  end
  if job.state == "active" then pool.nactive = pool.nactive - 1 end
  job.state, job.child, job.started = "waiting", nil, nil
  pool.source:push(job)
end

return Endings
