-- moonjob.pool.ranks -- priorities among the jobs sent ahead to busy children.
--
-- A part of the dispatch (moonjob.pool.dispatch), dispatch.ranks. A child
-- reads ahead the jobs sent behind the one it runs (pipelining), in the
-- order they were sent; a better job added later would wait behind them,
-- for as long as the job running before them lasts. This part bounds that
-- in time: a job that has waited RANK_AFTER_MS is not passed by worse ones
-- any more. Three looks, each taking jobs back through the shared gate
-- (dispatch:take_back_*: a job is started by its child or taken back, never
-- both, and no attempt is counted), after which the source hands them out
-- again lowest priority first, ties in order of arrival:
--
--   * rank(), RANK_AFTER_MS after a job is sent ahead with a better priority
--     than the worst sent ahead (sent_ahead), or waits in the source with
--     one (check_source, from the pump): every job a better one waits
--     behind, in its own child's read-ahead or in the source, comes back,
--     with every read-ahead whose first job has waited RANK_AFTER_MS.
--   * rescue(job, to), before the pump sends a job worse than the best sent
--     ahead: another child's read-ahead whose first job has waited
--     steal_after_ms, holding a better job than it, comes back and goes first.
--   * unstick(), while priorities differ among the jobs sent ahead, when a
--     read-ahead's first job has waited steal_after_ms: it comes back if it
--     holds a better job than one queued in another child or next in the
--     source.
--
-- Read-aheads of two children are compared only once one has waited
-- steal_after_ms: each is meant to start within the pipelining budget, and a
-- rising sequence spread over children (the command line's line numbers)
-- must not churn. Jobs of one priority, or of rising ones, never arm rank.
--
-- Owns: job.ahead_since (when a job was last sent ahead), worst_sent and
-- best_sent (the highest and lowest priority sent ahead since none was
-- waiting in a read-ahead; bounds, made exact at each look), the rank and stuck timers and
-- when each is due, stuck_from (no read-ahead can have waited
-- steal_after_ms before: rescue walks nothing until then), ranked_back
-- (jobs taken back by these looks, for the specs).
-- Exposes: ranks:sent_ahead(job), ranks:none_ahead(),
-- ranks:check_source(source), ranks:rescue(job, to), ranks:close();
-- ranks.best_sent and ranks.worst_sent, read by the pump.
-- Calls: dispatch (take_back_unstarted, take_back_prefetched, pump,
-- nprefetched), pool.children (snapshot, array), pool.source (peek_ready,
-- push).
--
-- Caveats: a job's priority is read in its own slot (Job.SLOT), as the
-- source's heaps do. The looks walk every child: O(children x pipeline),
-- at most once per RANK_AFTER_MS each, and rescue once per job sent while a
-- read-ahead is that old.
local core = require "moonjob.core"
local loop = require "moonjob.loop"
local Job = require "moonjob.job"

local Ranks = {}
Ranks.__index = Ranks

local RANK_AFTER_MS = 2 -- how long a better job may wait behind worse ones sent ahead
local PRIORITY = Job.SLOT.priority -- (false for the default, 0)
local AHEAD_SINCE = Job.SLOT.ahead_since

-- Ranks.new(dispatch, steal_after_ms) -> the dispatch's ranks; steal_after_ms
-- is the age at which a head is deemed stuck (the dispatch's steal's).
function Ranks.new(dispatch, steal_after_ms)
  local self = setmetatable({ dispatch = dispatch, pool = dispatch.pool, steal_after_ms = steal_after_ms,
    worst_sent = nil, best_sent = nil, rank_due = nil, stuck_due = nil, stuck_from = 0,
    ranked_back = 0 }, Ranks)
  self.rank_later = function() self:rank() end -- for the timers: made once
  self.unstick_later = function() self:unstick() end
  return self
end

-- Job was sent ahead to a busy child: it waits there from now (ahead_since;
-- now: the sender's loop.now(), if it has one).
function Ranks:sent_ahead(job, now)
  now = now or loop.now()
  job[AHEAD_SINCE] = now -- in its slot (Job.SLOT): this runs for every job sent ahead
  local priority, worst, best = job[PRIORITY] or 0, self.worst_sent, self.best_sent
  if not best or priority < best then self.best_sent = priority end
  if not worst or priority > worst then self.worst_sent = priority
  elseif priority < worst then self:rank_soon() end -- a worse job may wait ahead of it
  if not self.stuck_due and self.best_sent ~= self.worst_sent then self:watch_stuck(now) end
end

-- Since when the first job behind the child's head has waited there (nil: none).
local function queued_since(child)
  local first = child.sent[2]
  return first and (first.ahead_since or child.job.started)
end

-- No job is sent ahead any more.
function Ranks:none_ahead()
  self.worst_sent, self.best_sent = nil, nil
end

-- After a pump (worst_sent set): the source's next job may wait while a
-- worse one was sent ahead.
function Ranks:check_source(source)
  if self.rank_due then return end
  local best = source:peek_ready()
  if best and (best[PRIORITY] or 0) < self.worst_sent then self:rank_soon() end
end

-- A job waits (in the source or in a child's read-ahead) while a worse one
-- may wait ahead of it in a child: rank() looks RANK_AFTER_MS from now.
function Ranks:rank_soon()
  if self.rank_due then return end
  self.rank_due = loop.now() + RANK_AFTER_MS
  if not self.rank_timer then self.rank_timer = core.timer(self.rank_later) end
  self.rank_timer:start(RANK_AFTER_MS)
end

-- The lowest and the highest priority of the jobs sent to the child behind
-- its head (nil when there are none).
local function priorities_behind(child)
  local sent, low, high = child.sent, nil, nil
  for i = 2, #sent do
    local priority = sent[i][PRIORITY] or 0
    if not low or priority < low then low = priority end
    if not high or priority > high then high = priority end
  end
  return low, high
end

-- Where in `sent` (a child's) the first job behind the head is that a better
-- job waiting after it (later in sent, or in the source: `outside`, its best
-- priority) should go before; nil when they are in order.
local function first_out_of_rank(sent, outside)
  local cut, best = nil, outside
  for i = #sent, 2, -1 do
    local priority = sent[i][PRIORITY] or 0
    if best and priority > best then cut = i
    elseif not best or priority < best then best = priority end
  end
  return cut
end

-- Where each busy child's read-ahead is to be taken back from (false: kept),
-- by its place in `children`: from the first job a better waiting one should
-- go before; and, once such a job is found anywhere, every read-ahead whose
-- first job has waited RANK_AFTER_MS (no one knows when it would start, so
-- it waits in the source, where the first free child takes the best job).
-- Nothing when every read-ahead is in order. (Read-aheads of different
-- children are not compared here: each starts within about the
-- pipelining budget, unless its head runs long, which unstick watches.)
local function rank_cuts(children, source)
  local best = source:peek_ready()
  local outside, cuts, any = best and (best[PRIORITY] or 0), {}, false
  for i, child in ipairs(children) do
    local sent = child.sent
    cuts[i] = child.state == "busy" and #sent > 1 and first_out_of_rank(sent, outside) or false
    any = any or cuts[i] ~= false
  end
  if not any then return cuts end
  local long_ago = loop.now() - RANK_AFTER_MS
  for i, child in ipairs(children) do
    local since = child.state == "busy" and queued_since(child)
    if since and since <= long_ago then cuts[i] = 2 end
  end
  return cuts
end

-- Jobs sent ahead to busy children that a better waiting job should go
-- before (rank_cuts) are taken back, those their child has not started (the
-- gate decides: never both), and wait in the source again, which hands them
-- out lowest priority first; no attempt is counted. Then worst_sent is made
-- exact again (it only grows between two looks).
function Ranks:rank()
  local now, pool, due = loop.now(), self.pool, self.rank_due
  if due and now < due then -- the timer counts whole ms of the loop's clock: not yet
    return self.rank_timer:start(math.ceil(due - now))
  end
  self.rank_due = nil
  if pool.closing then return end
  local children = pool.children:snapshot() -- taking back may free a child: a copy
  local cuts = rank_cuts(children, pool.source)
  for i, child in ipairs(children) do
    if cuts[i] then
      self.ranked_back = self.ranked_back + self.dispatch:take_back_unstarted(child, cuts[i])
    end
  end
  self:measure_sent(children)
  self.dispatch:pump()
end

-- worst_sent and best_sent made exact again (between two looks, they only
-- move outwards).
function Ranks:measure_sent(children)
  local worst, best = nil, nil
  for _, child in ipairs(children) do
    local low, high = priorities_behind(child)
    if high and (not worst or high > worst) then worst = high end
    if low and (not best or low < best) then best = low end
  end
  if self.dispatch.nprefetched == 0 then worst, best = nil, nil end
  self.worst_sent, self.best_sent = worst, best
end

-- Child `to` is about to be sent `job` while a better one may be stuck in
-- another child's read-ahead, whose first job has waited steal_after_ms: such
-- jobs are taken back and `job` goes back to the source with them. Returns true when
-- some came back (the caller pops again: the best comes first), false when
-- `job` is the one to send. (Every call that returns true takes jobs out of
-- the other children, and `to` is never walked: a caller's loop ends.)
-- Cheap when nothing can be stuck: no walk before the oldest read-ahead
-- reaches that age (stuck_from), and best_sent is made exact after a walk.
function Ranks:rescue(job, to)
  local now = loop.now()
  if now < self.stuck_from or self.pool.closing then return false end
  local children = self.pool.children:array()
  local priority, long_ago, stuck, soonest = job[PRIORITY] or 0, now - self.steal_after_ms, nil, math.huge
  for _, child in ipairs(children) do
    local since = child.state == "busy" and queued_since(child)
    if since then
      soonest = math.min(soonest, since + self.steal_after_ms)
      if child ~= to and since <= long_ago and priorities_behind(child) < priority then
        stuck = stuck or {}
        stuck[#stuck + 1] = child
      end
    end
  end
  self.stuck_from = math.min(soonest, now + self.steal_after_ms) -- jobs sent later wait less
  local back = 0
  if stuck then
    for _, child in ipairs(stuck) do back = back + self.dispatch:take_back_prefetched(child) end
  end
  self.ranked_back = self.ranked_back + back
  self:measure_sent(children)
  if back == 0 then return false end
  self.pool.source:push(job)
  return true
end

-- Priorities differ among the jobs sent ahead: unstick() looks when a job
-- sent ahead at `since` has waited steal_after_ms.
function Ranks:watch_stuck(since)
  local now = loop.now()
  local due = since + self.steal_after_ms
  self.stuck_due = due
  if not self.stuck_timer then self.stuck_timer = core.timer(self.unstick_later) end
  self.stuck_timer:start(math.max(1, math.ceil(due - now)))
end

-- The two highest priorities queued behind the children's heads, and the
-- place of the child holding the first: "the worst job queued elsewhere".
local function highs_behind(children)
  local first_at, first, second = nil, nil, nil
  for i, child in ipairs(children) do
    local _, high = priorities_behind(child)
    if high and (not first or high > first) then first_at, first, second = i, high, first
    elseif high and (not second or high > second) then second = high end
  end
  return first_at, first, second
end

-- A read-ahead whose first job has waited steal_after_ms, holding a job
-- better than one queued in another child or next in the source (either
-- would start first), is taken back: the source hands its jobs to the first
-- free child. Looks again when the next read-ahead reaches that age, or
-- steal_after_ms from now while one that old stays, as long as priorities
-- differ among the jobs sent ahead (not sooner: a long job would wake the
-- parent every few ms; a worse job sent meanwhile meets rescue).
function Ranks:unstick()
  local now, pool, due = loop.now(), self.pool, self.stuck_due
  if due and now < due then return self.stuck_timer:start(math.ceil(due - now)) end
  self.stuck_due = nil
  if pool.closing or self.dispatch.nprefetched == 0 then return end
  local children = pool.children:snapshot() -- taking back may free a child: a copy
  local next_best = pool.source:peek_ready()
  next_best = next_best and (next_best[PRIORITY] or 0)
  local first_at, first, second = highs_behind(children)
  local long_ago, back, soonest = now - self.steal_after_ms, 0, nil
  for i, child in ipairs(children) do
    local since = child.state == "busy" and queued_since(child)
    if since and since <= long_ago then
      local worse = first -- the worst job queued in another child (nil: none)
      if i == first_at then worse = second end -- (`and second or first` would give first for a nil second)
      if next_best and (not worse or next_best > worse) then worse = next_best end
      local low = priorities_behind(child)
      if worse and low < worse then back = back + self.dispatch:take_back_prefetched(child)
      else soonest = math.min(soonest or math.huge, now + self.steal_after_ms) end
    elseif since then
      soonest = math.min(soonest or math.huge, since + self.steal_after_ms)
    end
  end
  self.ranked_back = self.ranked_back + back
  self:measure_sent(children)
  if soonest and self.best_sent ~= self.worst_sent then self:watch_stuck(soonest - self.steal_after_ms) end
  if back > 0 then self.dispatch:pump() end
end

function Ranks:close()
  for _, name in ipairs({ "rank_timer", "stuck_timer" }) do
    if self[name] then self[name]:close(); self[name] = nil end
  end
end

return Ranks
