-- moonjob.pool.limits -- a pool's rate limit and per-group concurrency: a job
-- source wrapped around the local one.
--
-- A pool given `rate = { max, per }` or `group_concurrency = n` keeps its
-- waiting jobs in this source instead of the plain local one (Pool.new
-- chooses; a pool with neither never loads it, so its cost per job is the
-- plain source's). It answers to the interface of moonjob.pool.source and
-- adds release(job).
--
--   * Rate: at most `max` jobs start in any `per` seconds. The times of the
--     last `max` starts are kept in a ring; a job may start when fewer than
--     `max` have, or the oldest of them is `per` seconds old. While the ring
--     says no, pop_ready answers nil and next_due gives the time it will say
--     yes: the dispatch's delay timer (moonjob.pool.dispatch, arm_delay) wakes
--     the pool then. No loop and no sleep: the parent's loop goes on.
--   * Groups: a job added with `group = "name"` holds one of its group's
--     `group_concurrency` places from the moment it is handed out (pop_ready)
--     until it is pushed back (a retry, a give-back) or ends (release, called
--     by moonjob.pool.endings' finish). A job whose group has no place left
--     is parked, by group (a moonjob.pool.waiting queue each, same order),
--     and pop_ready goes on to the next job: other groups and ungrouped jobs
--     are never held up behind it. When a place frees, the best parked job of
--     that group goes back to the main queue, where it takes its turn by its
--     priority and number as before. Each job is parked at most once per
--     place freed: no walk over a group's backlog on every pop.
--
-- Both count a job as started when it is handed to a child (pop_ready), which
-- is exact because such a pool gives each child one job at a time (its
-- pipeline is 1: no job waits in a child's read-ahead, moonjob.pool.options).
--
-- Owns: the inner moonjob.pool.waiting queue, the start ring, the running
-- count and the parked queue of each group, job.holds_group (a plain field:
-- the job holds a place of its group).
-- Exposes: the source interface (push, pop_ready, peek_ready, pop_any,
-- remove, count, ready_count, next_due), limits:release(job).
--
-- Caveats: a job handed out is counted against the rate even if it comes
-- back without starting (a child found gone, an open circuit breaker's
-- pass): the pool then starts fewer jobs than allowed, never more. Groups
-- are counted by name for as long as one of their jobs runs or is parked;
-- an idle group costs nothing.
local Queue = require "moonjob.pool.waiting"

local Limits = {}
Limits.__index = Limits

-- Limits.new(now, opts) -> the source; now() -> milliseconds (loop.now),
-- opts: the pool's checked options (rate, group_concurrency).
function Limits.new(now, opts)
  local rate = opts.rate
  return setmetatable({
    inner = Queue.new(now), now = now,
    rate_max = rate and rate.max, per_ms = rate and rate.per * 1000,
    starts = {}, nstarts = 0, oldest = 1, -- the ring of the last rate_max start times
    group_cap = opts.group_concurrency,
    running = {}, -- group -> how many of its jobs hold a place
    parked = {}, nparked = 0, -- group -> its jobs waiting for a place (a queue)
  }, Limits)
end

------------------------------------------------------------------ rate ---

-- When the next job may start (ms on now()'s clock); -inf when at once.
function Limits:rate_open_at()
  if not self.rate_max or self.nstarts < self.rate_max then return -math.huge end
  return self.starts[self.oldest] + self.per_ms
end

-- A job starts at `now`: it takes the oldest start's place in the ring.
function Limits:note_start(now)
  local at = self.oldest
  self.starts[at] = now
  self.oldest = at % self.rate_max + 1
  if self.nstarts < self.rate_max then self.nstarts = self.nstarts + 1 end
end

---------------------------------------------------------------- groups ---

local function group_of(job)
  return rawget(job, "group")
end

-- Job waits for a place of its group.
function Limits:park(job, group)
  local queue = self.parked[group]
  if not queue then
    queue = Queue.new(self.now)
    self.parked[group] = queue
  end
  queue:push(job)
  self.nparked = self.nparked + 1
end

-- Takes the best parked job of `group` out of its queue (nil: none).
function Limits:unpark(group)
  local queue = self.parked[group]
  if not queue then return nil end
  local job = queue:pop_any()
  self.nparked = self.nparked - 1
  if queue.n == 0 then self.parked[group] = nil end
  return job
end

-- Whether job may start now as far as its group goes; if so it takes a place.
function Limits:take_place(job)
  local group, cap = group_of(job), self.group_cap
  if not group or not cap then return true end
  local n = self.running[group] or 0
  if n >= cap then return false end
  self.running[group] = n + 1
  rawset(job, "holds_group", true)
  return true
end

-- limits:release(job): job no longer runs (it ended, or waits again); the
-- place it held in its group frees, and that group's best parked job goes
-- back to the main queue. Nothing for a job that holds no place.
function Limits:release(job)
  if not rawget(job, "holds_group") then return end
  rawset(job, "holds_group", nil)
  local group = group_of(job)
  local n = self.running[group] - 1
  self.running[group] = n > 0 and n or nil
  local next_job = self:unpark(group)
  if next_job then self.inner:push(next_job) end
end

-------------------------------------------------------------- the source ---

function Limits:push(job)
  self:release(job)
  self.inner:push(job)
end

-- The next job that may start now, or nil: the rate first (nil while it says
-- no), then jobs whose group is full are parked on the way.
function Limits:pop_ready()
  local now
  if self.rate_max then
    now = self.now()
    if now < self:rate_open_at() then return nil end
  end
  local inner = self.inner
  while true do
    local job = inner:pop()
    if not job then return nil end
    if self:take_place(job) then
      if now then self:note_start(now) end
      return job
    end
    self:park(job, group_of(job))
  end
end

-- The job pop_ready would return, left waiting (parking the full groups' on
-- the way), or nil.
function Limits:peek_ready()
  if self.rate_max and self.now() < self:rate_open_at() then return nil end
  local inner, cap = self.inner, self.group_cap
  while true do
    local job = inner:peek()
    local group = job and group_of(job)
    if not (group and cap and (self.running[group] or 0) >= cap) then return job end
    self:park(inner:pop(), group) -- (pop takes the job peek showed)
  end
end

-- Any waiting job, due, parked or not (close and cancel_all empty the source).
function Limits:pop_any()
  local job = self.inner:pop_any()
  if job then return job end
  local group = next(self.parked)
  return group and self:unpark(group) or nil
end

function Limits:remove(job)
  if self.inner:remove(job) then return true end
  local group = group_of(job)
  local queue = group and self.parked[group]
  if not (queue and queue:remove(job)) then return false end
  self.nparked = self.nparked - 1
  if queue.n == 0 then self.parked[group] = nil end
  return true
end

function Limits:count()
  return self.inner.n + self.nparked
end

-- Jobs that could run but for the rate count (children are kept for them);
-- parked ones do not (they wait for a running job of their group).
function Limits:ready_count()
  return self.inner:ready_n()
end

-- The earliest delayed job's time, or, while the rate holds ready jobs
-- back, the time it lets the next one start if sooner; nil when neither.
function Limits:next_due()
  local due = self.inner:next_due()
  if self.rate_max and self.inner:ready_n() > 0 then
    local open_at = self:rate_open_at()
    if open_at > self.now() and (not due or open_at < due) then due = open_at end
  end
  return due
end

return Limits
