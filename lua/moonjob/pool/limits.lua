-- moonjob.pool.limits -- a pool's rate limits and per-group concurrency: a
-- job source wrapped around the local one.
--
-- A pool given `rate`, `group_concurrency` or `group_rate` keeps its waiting
-- jobs in this source instead of the plain local one (moonjob.pool.source
-- chooses; a pool with none of them never loads it, so its cost per job is
-- the plain source's). It answers to the interface of moonjob.pool.source,
-- release(job) included.
--
--   * Rate (`rate = { max, per }`): at most `max` jobs start in any `per`
--     seconds. The times of the last `max` starts are kept in a ring; a job
--     may start when fewer than `max` have, or the oldest of them is `per`
--     seconds old. While the ring says no, pop_ready answers nil and
--     next_due gives the time it will say yes: the dispatch's delay timer
--     (moonjob.pool.dispatch, arm_delay) wakes the pool then. No loop and no
--     sleep: the parent's loop goes on.
--   * Groups: a job added with `group = "name"` holds one of its group's
--     `group_concurrency` places from the moment it is handed out (pop_ready)
--     until it is pushed back (a retry, a give-back) or ends (release, called
--     by moonjob.pool.endings' finish); with `group_rate`, each group has a
--     ring of its own. A job whose group is full (or whose group's ring says
--     no) is parked, by group (a moonjob.pool.waiting queue each, same
--     order), and pop_ready goes on to the next job: other groups and
--     ungrouped jobs never wait behind it.
--   * A group with parked jobs always has something that will bring one
--     back (settle): a place freeing (release), or, while its ring says no,
--     its best parked job waiting in the main queue as a delayed job due when
--     the ring opens (job.run_at; `waking`), which the delay timer promotes.
--     Back in the main queue, a job takes its turn by its priority and number
--     as before. One job of a group comes back per place freed or start made:
--     no walk over a group's backlog on every pop.
--
-- Every limit counts a job as started when it is handed to a child
-- (pop_ready), which is exact because such a pool gives each child one job
-- at a time (its pipeline is 1: no job waits in a child's read-ahead,
-- moonjob.pool.options).
--
-- Owns: the inner moonjob.pool.waiting queue, the pool's start ring, each
-- group's ring, running count, parked queue and waking job, and
-- job.holds_group (a plain field: the job holds a place of its group).
-- Exposes: the source interface (push, pop_ready, peek_ready, pop_any,
-- remove, count, ready_count, next_due), limits:release(job).
-- Calls: nothing of the pool (it holds its own Waiting).
--
-- Caveats: a job handed out is counted against the rates even if it comes
-- back without starting (a child found gone, an open circuit breaker's
-- pass): the pool then starts fewer jobs than allowed, never more. A group
-- is remembered while one of its jobs runs or waits, and its ring while its
-- last start is younger than `per` (rings are swept when their number has
-- doubled: an idle group costs nothing for long).
local Waiting = require "moonjob.pool.waiting"

local Limits = {}
Limits.__index = Limits

local SWEEP_FROM = 64 -- group rings kept before the first sweep of old ones

------------------------------------------------------------------ rings ---
-- A ring of the last `max` start times: { n, oldest, newest, [i] = ms }.

local function new_ring()
  return { n = 0, oldest = 1, newest = -math.huge }
end

-- When the ring lets the next job start (ms); -inf when at once.
local function open_at(ring, max, per_ms)
  if ring.n < max then return -math.huge end
  return ring[ring.oldest] + per_ms
end

-- A job starts at `now`: it takes the oldest start's place in the ring.
local function note_start(ring, max, now)
  local at = ring.oldest
  ring[at], ring.newest = now, now
  ring.oldest = at % max + 1
  if ring.n < max then ring.n = ring.n + 1 end
end

-- Limits.new(now, opts) -> the source; now() -> milliseconds (loop.now),
-- opts: the pool's checked options (rate, group_concurrency, group_rate).
function Limits.new(now, opts)
  local rate, group_rate = opts.rate, opts.group_rate
  return setmetatable({
    inner = Waiting.new(now), now = now,
    rate_max = rate and rate.max, per_ms = rate and rate.per * 1000, ring = new_ring(),
    group_cap = opts.group_concurrency,
    group_rate_max = group_rate and group_rate.max, group_per_ms = group_rate and group_rate.per * 1000,
    rings = {}, nrings = 0, sweep_limit = SWEEP_FROM, -- group -> its ring (group_rate)
    running = {}, -- group -> how many of its jobs hold a place
    parked = {}, nparked = 0, -- group -> its jobs waiting for a place or their ring (a queue)
    waking = {}, -- group -> its job waiting in the main queue for the group's ring to open
  }, Limits)
end

function Limits:rate_open_at()
  if not self.rate_max then return -math.huge end
  return open_at(self.ring, self.rate_max, self.per_ms)
end

---------------------------------------------------------------- groups ---

local function group_of(job)
  return rawget(job, "group")
end

-- What keeps a job of `group` from starting at `now`: "full" (no place),
-- "rate" (its ring says no) or nil.
function Limits:blocks(group, now)
  local cap = self.group_cap
  if cap and (self.running[group] or 0) >= cap then return "full" end
  local ring = self.group_rate_max and self.rings[group]
  if ring and now < open_at(ring, self.group_rate_max, self.group_per_ms) then return "rate" end
  return nil
end

-- Old rings (their last start `per` ago) go once their number doubled.
function Limits:sweep(now)
  local rings, per_ms = self.rings, self.group_per_ms
  for group, ring in pairs(rings) do -- (clearing fields while walking is allowed)
    if ring.newest + per_ms <= now and not self.parked[group] then
      rings[group] = nil
      self.nrings = self.nrings - 1
    end
  end
  self.sweep_limit = math.max(SWEEP_FROM, 2 * self.nrings)
end

-- A job of `group` starts at `now`: it takes a place and a start of its ring.
function Limits:start_in_group(job, group, now)
  if self.group_cap then
    self.running[group] = (self.running[group] or 0) + 1
    rawset(job, "holds_group", true)
  end
  local max = self.group_rate_max
  if not max then return end
  local ring = self.rings[group]
  if not ring then
    ring = new_ring()
    self.rings[group] = ring
    self.nrings = self.nrings + 1
    if self.nrings > self.sweep_limit then self:sweep(now) end
  end
  note_start(ring, max, now)
end

-- Job waits for a place of its group, or for its ring.
function Limits:park(job, group)
  local queue = self.parked[group]
  if not queue then
    queue = Waiting.new(self.now)
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

-- A group with parked jobs and nothing to bring one back gets something
-- (see the top of this file): its best parked job goes back to the main
-- queue, at once when it may start, when the ring opens when that says no;
-- a full group waits for release.
function Limits:settle(group, now)
  if not self.parked[group] or self.waking[group] then return end
  local why = self:blocks(group, now)
  if why == "full" then return end
  local job = self:unpark(group)
  if why == "rate" then
    rawset(job, "run_at", open_at(self.rings[group], self.group_rate_max, self.group_per_ms))
    self.waking[group] = job
  end
  self.inner:push(job)
end

-- A job left the main queue: it no longer wakes its group.
function Limits:left_main(job, group)
  if self.waking[group] == job then self.waking[group] = nil end
end

-- Job, out of the main queue, may not start now (`why`): parked.
function Limits:hold(job, group, why, now)
  self:left_main(job, group)
  self:park(job, group)
  if why == "rate" then self:settle(group, now) end
end

-- limits:release(job): job no longer runs (it ended, or waits again); the
-- place it took in its group frees and the group settles. Nothing for a job
-- that holds no place.
function Limits:release(job)
  if not rawget(job, "holds_group") then return end
  rawset(job, "holds_group", nil)
  local group = group_of(job)
  local n = self.running[group] - 1
  self.running[group] = n > 0 and n or nil
  self:settle(group, self.now())
end

-------------------------------------------------------------- the source ---

function Limits:push(job)
  self:release(job)
  self.inner:push(job)
end

-- The next job that may start now, or nil: the pool's rate first (nil while
-- it says no), then jobs whose group may not start are parked on the way.
function Limits:pop_ready()
  local now = self.now()
  self.rate_refused = now < self:rate_open_at()
  if self.rate_refused then return nil end
  local inner = self.inner
  while true do
    local job = inner:pop()
    if not job then return nil end
    now = self.now() -- (the clock moves: a time older than the queue's would park a due job again and again)
    local group = group_of(job)
    local why = group and self:blocks(group, now)
    if not why then
      if self.rate_max then note_start(self.ring, self.rate_max, now) end
      if group then
        self:left_main(job, group)
        self:start_in_group(job, group, now)
        self:settle(group, now)
      end
      return job
    end
    self:hold(job, group, why, now)
  end
end

-- The job pop_ready would return, left waiting (parking on the way those
-- whose group may not start), or nil.
function Limits:peek_ready()
  local now = self.now()
  if now < self:rate_open_at() then return nil end
  local inner = self.inner
  while true do
    local job = inner:peek()
    now = self.now() -- (as in pop_ready)
    local group = job and group_of(job)
    local why = group and self:blocks(group, now)
    if not why then return job end
    self:hold(inner:pop(), group, why, now) -- (pop takes the job peek showed)
  end
end

-- Any waiting job, due, parked or not (close and cancel_all empty the source).
function Limits:pop_any()
  local job = self.inner:pop_any()
  if job then
    local group = group_of(job)
    if group then self:left_main(job, group) end
    return job
  end
  local group = next(self.parked)
  return group and self:unpark(group) or nil
end

function Limits:remove(job)
  local group = group_of(job)
  if self.inner:remove(job) then
    if group and self.waking[group] == job then -- another parked job wakes the group
      self.waking[group] = nil
      self:settle(group, self.now())
    end
    return true
  end
  local queue = group and self.parked[group]
  if not (queue and queue:remove(job)) then return false end
  self.nparked = self.nparked - 1
  if queue.n == 0 then self.parked[group] = nil end
  return true
end

function Limits:count()
  return self.inner.n + self.nparked
end

-- Jobs that could run but for the pool's rate (children are kept for them);
-- parked ones do not count (they wait for their group).
function Limits:ready_count()
  return self.inner:ready_n()
end

-- The earliest delayed job's time (a group's waking job among them), or,
-- while the pool's rate holds ready jobs back, the time it lets the next one
-- start if sooner; nil when neither. A time already past is given too when
-- the last pop_ready was refused for the rate (the window may open between
-- that refusal and this look: without a wake the pool would sleep on).
function Limits:next_due()
  local due = self.inner:next_due()
  if self.rate_max and self.inner:ready_n() > 0 then
    local at = self:rate_open_at()
    if (at > self.now() or (self.rate_refused and at > -math.huge)) and (not due or at < due) then due = at end
  end
  return due
end

return Limits
