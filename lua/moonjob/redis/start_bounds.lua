-- moonjob.redis.start_bounds -- a remote's jobs fetched under a rate: each
-- is sent to an idle child within the rate's start bound, or given back.
--
-- A part of a moonjob.redis.remote (remote.bounds, made in Remote.new).
-- Redis counts a job it hands out under a rate as started B ms after the
-- hand-out, B the rate's start bound (functions/limits.lua), and says B in
-- the fetch's reply. The worker sent its fetch before Redis handed the jobs
-- out, so a job sent to an idle child by sent_at + B (job.start_by, on the
-- worker's own monotonic clock) starts within B of its hand-out, and the
-- rate holds where the processors run: no clock between hosts is involved.
-- The pool sends such a job only to an idle child, only until start_by
-- (moonjob.pool.dispatch, which calls owner:late past it); a timer here
-- gives back the ones still waiting then, so that another worker may take
-- them. Given back: released, no attempt counted (its hand-out stays in the
-- window).
-- A bound of PIPELINED_MS or more (a job held ahead while the rate is far
-- from binding: functions/limits.lua) is long enough for the job to wait
-- behind a busy child like any other (the pool's read-ahead): such a job
-- has no start_by but a recall_at, a quarter of its bound earlier, when
-- the timer takes it back unless its child started it (the shared page's
-- gate decides); the quarter (250 ms for 1 s) is what the parent's loop
-- may be late by.
--
-- Owns: that timer.
-- Exposes: bind(job, bound, sent_at), fetched(start_by, sent_at), late(job),
-- close().
-- Calls: the remote's port (cancel_job), fetched, _trouble, _fine.
local core = require "moonjob.core"
local loop = require "moonjob.loop"

local StartBounds = {}
StartBounds.__index = StartBounds

StartBounds.PIPELINED_MS = 400 -- a bound this long lets a job wait behind a busy child

function StartBounds.new(remote)
  local self = setmetatable({ remote = remote }, StartBounds)
  self.timer = core.timer(function() self:give_back_late() end)
  return self
end

-- A job fetched at sent_at must start within bound ms: job.start_by (sent
-- to an idle child by then), or job.recall_at for a long bound. -> either.
function StartBounds.bind(job, bound, sent_at)
  if bound >= StartBounds.PIPELINED_MS then
    job.recall_at = sent_at + bound - bound / 4
    return job.recall_at
  end
  job.start_by = sent_at + bound
  return job.start_by
end

-- A fetch sent at sent_at brought jobs with a start bound, the first due
-- by start_by. A reply that came after it (a round trip to Redis longer
-- than the bound) is said once: nothing it brings can run here, though the
-- rate's window counts it all the same.
function StartBounds:fetched(start_by, sent_at)
  local remote, now = self.remote, loop.now()
  if now > start_by then
    remote:_trouble("late", ("a fetch's answer came %.0f ms after it was sent, later than the rate's start "
      .. "bound (%.0f ms): its jobs were given back; this worker is too far from Redis, or too busy, for that "
      .. "rate"):format(now - sent_at, start_by - sent_at))
  else
    remote:_fine("late")
  end
  if not self.armed_at or start_by < self.armed_at then -- (an earlier deadline keeps the timer: it looks at all)
    self.armed_at = start_by
    self.timer:start(math.max(0, start_by - now) + 1)
  end
end

-- The jobs no child took by their start_by go back to the queue; the
-- timer looks again at the next one's.
function StartBounds:give_back_late()
  local now, soonest = loop.now(), nil
  for _, job in pairs(self.remote.fetched) do
    local by = job.start_by or job.recall_at -- (recall_at: in a child too; its gate says whether it started)
    if by and job.state == "waiting" and not job.abandoned then
      if by < now then self:late(job)
      elseif not soonest or by < soonest then soonest = by end
    end
  end
  self.armed_at = soonest
  if soonest then self.timer:start(soonest - now + 1) end
end

-- A job no child took by its start_by: given back (the pool's cancel with
-- ECLOSED, which the remote's reports turn into a release). False if a
-- child started it meanwhile.
function StartBounds:late(job)
  return self.remote.port:cancel_job(job, "not started within the rate's start bound: given back", "ECLOSED",
    true)
end

function StartBounds:close()
  self.timer:close()
end

return StartBounds
