-- moonjob.pool.dispatch -- pairing waiting jobs with children, several per child.
--
-- A part of the pool (see pool/init.lua), pool.dispatch. pump() is the pool's
-- heartbeat, run after anything that may free a child or make a job ready:
-- free children take ready jobs (the most recently freed first), then the
-- delay timer, the number of children and the breaker are brought up to
-- date, and the owner of remote jobs (pool.owner) is told there may be room.
--
-- A child can hold up to `pipeline` jobs (default 8, at most
-- core.frame.MAX_INFLIGHT): the one it runs (its head, w.job) and the ones
-- prefetched behind it, which it reads ahead and starts the moment the head
-- ends, without waiting for the parent. Users cannot tell, except by speed:
--
--   * A job is "active" (state, `active` event, job.started, its timeout, the
--     ack_timeout) only once it is its child's head; before, it is "waiting"
--     and job.prefetched is set.
--   * A prefetched job its child has not started can be taken back: the
--     shared page's gate (core/frame.h) decides, by compare-and-swap, whether
--     the child started it or the parent recalled it, never both. Cancel,
--     close, a hard kill, a crash and an idle child looking for work use it;
--     a recalled job goes back to the source without counting an attempt.
--   * Prefetching (more than one job per child) happens only while jobs are
--     ready beyond what idle children take, and only as deep as recent jobs
--     were short: depth = 1 + budget_ms / (average run time), capped by
--     `pipeline`; never behind a head that has run longer than the budget.
--     With no run time known yet, or jobs longer than the budget, each child
--     holds one job, as without pipelining.
--   * Long jobs hold no one hostage: when a child is idle and nothing is ready,
--     jobs prefetched behind a head that has run for STEAL_AFTER_MS are taken
--     back and run elsewhere (a timer looks again when a head reaches it);
--     a batch of lines that has run that long has its lines not started cut
--     off (moonjob.pool.lines). So are jobs behind such a head when a child
--     is about to be sent a worse job than they are (rescue: only when
--     a job worse than best_sent is popped, and not before the oldest head
--     can have run that long).
--   * Priorities: a job added later with a better priority goes ahead of every
--     job still waiting in the pool at once, and of the jobs already sent to
--     a child once it has waited RANK_AFTER_MS (2 ms): then the jobs sent
--     ahead that a better job waits behind, in the source or in a child's
--     read-ahead, are taken back (those not started, by the gate) and the
--     source hands them out again lowest priority first (rank). Ties keep
--     their order of arrival (a job taken back keeps its id). The look is
--     armed only when a job is sent ahead with a better priority than the
--     worst sent ahead (worst_sent), or one waits in the source with it: jobs
--     of one priority, or of rising ones (the CLI's lines), never arm it.
--
-- Owns: the number of prefetched jobs (those with job.prefetched), the moving
-- average of recent run times (ms), budget_ms (PIPELINE_BUDGET_MS; the specs
-- raise it so that timing on a loaded machine does not decide whether they
-- pipeline), `saturated` (the last walk found every busy child full: pump
-- skips the walk until a child is free or jobs are taken back; meanwhile
-- each child tops itself up when one of its jobs ends), the delay, steal
-- and rank timers, worst_sent and best_sent (the highest and lowest
-- priority sent ahead since none was held; bounds between two looks),
-- stuck_from (no head has run STEAL_AFTER_MS before), ranked_back (jobs
-- taken back to be reordered, for the specs), the buffer the job's
-- metadata is encoded in.
-- Exposes: dispatch:pump(), dispatch:job_started(w, job) (nactive),
-- dispatch:worker_next(w), dispatch:take_back(w [, from]),
-- dispatch:take_back_prefetched(w), dispatch:take_back_unstarted(w, from),
-- dispatch:unprefetch(job),
-- dispatch:note_run(ms), dispatch:depth(), dispatch:prefetched_count(),
-- dispatch:has_started(job) (the gate, for a job not yet its child's head),
-- dispatch:room_again(), dispatch:close().
-- Calls: pool.source (pop_ready, peek_ready, push, next_due), pool.children
-- (next_idle, pop_idle, has_idle, free, retire, ensure, array, snapshot),
-- pool.breaker:check, pool.owner:want,
-- pool.endings:give_back, pool.lines (wire_first_line, cuttable, cut,
-- hand_back), pool.tally:sample_wait, the `active` listeners.
--
-- Caveats: a job data over PIPELINE_MAX_BYTES is only given to an idle child
-- (a child's read-ahead holds whole frames in memory). No closure is made in
-- the methods pump runs for every job: LuaJIT cannot compile a function that
-- makes one (it aborts its traces), and those methods must stay compiled.
local buffer = require "string.buffer"
local core = require "moonjob.core"
local loop = require "moonjob.loop"
local Job = require "moonjob.job"
local Lines = require "moonjob.pool.lines"

local Dispatch = {}
Dispatch.__index = Dispatch

local PIPELINE_BUDGET_MS = 2     -- how long the jobs prefetched in one child may take, about
local PIPELINE_MAX_BYTES = 64 * 1024 -- larger job data is never prefetched behind another job
local STEAL_AFTER_MS = 10        -- a head that ran this long gives up the jobs behind it
local RUN_AVG_WEIGHT = 0.05      -- weight of the newest run time in the average
local RANK_AFTER_MS = 2          -- how long a better job may wait behind worse ones sent ahead
Dispatch.STEAL_AFTER_MS = STEAL_AFTER_MS

local PRIORITY = Job.SLOT.priority -- read in the job's own slot (false for the default, 0)

local wire_first_line = Lines.wire_first_line

-- Dispatch.new(pool, pipeline) -> the dispatch of a pool whose children hold
-- at most `pipeline` jobs each.
function Dispatch.new(pool, pipeline)
  local self = setmetatable({
    pool = pool, listeners = pool.events.listeners,
    pipeline = pipeline, budget_ms = PIPELINE_BUDGET_MS,
    nprefetched = 0, saturated = false, worst_sent = nil, best_sent = nil, rank_due = nil,
    stuck_from = 0, stuck_due = nil, ranked_back = 0,
    meta = buffer.new(),
  }, Dispatch)
  self.pump_later = function() self:pump() end -- for the timers: made once
  self.rank_later = function() self:rank() end
  self.unstick_later = function() self:unstick() end
  return self
end

-------------------------------------------------------------- the pump ---

-- Sends a job to a child: an idle one runs it now; a busy one holds it
-- behind the jobs it has (prefetched). A child found gone is retired and the
-- job goes back to the source at once (it never left the parent).
function Dispatch:send(w, job)
  local pool = self.pool
  local attempt = job.attempts + 1
  local meta = self.meta:reset():encode(job.remote_id or job.id):encode(attempt):encode(job.name)
    :encode(wire_first_line(job))
  if not w:run(job, meta:tostring()) then -- the child is gone: it holds no place either
    pool.children:retire(w, true)
    return pool.source:push(job)
  end
  job.attempts, job.worker = attempt, w
  if w.job == job then return self:job_started(w, job) end
  job.prefetched = true
  self.nprefetched = self.nprefetched + 1
  local priority, worst, best = job[PRIORITY] or 0, self.worst_sent, self.best_sent
  if not best or priority < best then self.best_sent = priority end
  if not worst or priority > worst then self.worst_sent = priority
  elseif priority < worst then self:rank_soon() end -- a worse job may wait ahead of it
  if not self.stuck_due and self.best_sent ~= self.worst_sent then self:watch_stuck(w.job.started) end
end

-- Wakes the pool when the earliest delayed job becomes due.
function Dispatch:arm_delay()
  local due = self.pool.source:next_due()
  if not due then return end
  if not self.delay_timer then self.delay_timer = core.timer(self.pump_later) end
  self.delay_timer:start(math.max(0, due - loop.now()) + 1)
end

-- The pool's heartbeat (see the top of this file).
function Dispatch:pump()
  local pool = self.pool
  local children, source = pool.children, pool.source
  local w = children:next_idle()
  while w do
    local job = source:pop_ready()
    if job then
      local best = self.best_sent
      if not (best and (job[PRIORITY] or 0) > best and self:rescue(job, w)) then
        children:pop_idle()
        self:send(w, job)
      end -- else better jobs stuck behind a long one came back: pick again
    elseif not ((self.nprefetched > 0 or pool.batches) and self:steal()) then
      break
    end
    w = children:next_idle()
  end
  if not self.saturated and self.pipeline > 1 and not children:has_idle() then self:prefetch() end
  local worst = self.worst_sent
  if worst and not self.rank_due then
    local best = source:peek_ready() -- it may wait while a worse one was sent ahead
    if best and (best[PRIORITY] or 0) < worst then self:rank_soon() end
  end
  self:arm_delay()
  children:ensure()
  pool.breaker:check()
  local owner = pool.owner
  if owner then owner:want() end
end

-------------------------------------------------------- one child's jobs ---

-- A job's run ended after `ms`: the average the depth follows.
function Dispatch:note_run(ms)
  local avg = self.run_avg
  if avg then self.run_avg = avg + (ms - avg) * RUN_AVG_WEIGHT else self.run_avg = ms end
end

-- How many jobs one child may hold now.
function Dispatch:depth()
  local avg, max = self.run_avg, self.pipeline
  if max <= 1 or not avg then return 1 end
  local depth = math.min(max, 1 + math.floor(self.budget_ms / math.max(avg, 0.001)))
  -- batches of lines are sized to a few ms each: one more waits behind the
  -- head, so the child never waits for the parent between two
  if self.pool.batches and depth < 2 then return 2 end
  return depth
end

-- Whether job's child has started it (its head, or prefetched and started:
-- the gate says).
function Dispatch:has_started(job)
  return job.started ~= nil or (job.prefetched and job.worker and job.worker:started(job)) or false
end

-- How many jobs are prefetched in a child and not started (they wait too).
function Dispatch:prefetched_count()
  return self.nprefetched
end

-- There is room in a child again: the next pump walks the children.
function Dispatch:room_again()
  self.saturated = false
end

-- A prefetched job is not any more (it started, ended or came back).
function Dispatch:unprefetch(job)
  if not job.prefetched then return end
  job.prefetched, self.nprefetched = nil, self.nprefetched - 1
  if self.nprefetched == 0 then self.worst_sent, self.best_sent = nil, nil end
end

-- A job became its child's head: it runs now. Its wait ends, its timeout (or,
-- interrupted while it was prefetched, its hard deadline) starts, `active` fires.
function Dispatch:job_started(w, job)
  local pool = self.pool
  self:unprefetch(job)
  local now = loop.now()
  job.state, job.pid, job.started = "active", w.pid, now
  job.ms = nil -- this attempt's run time comes with its end (the child's measure)
  pool.tally:sample_wait(now - (job.run_at or job.added))
  w.dispatched_at, w.acked = now, false
  pool.nactive = pool.nactive + 1
  if job.interrupt then
    w:arm(job.kill_after or pool.kill_after)
  else
    local timeout = job.timeout or pool.timeout
    if timeout then w:arm(timeout) end
  end
  if self.listeners.active then pool.events:emit("active", job) end
end

-- A job of w's ended (or was taken back): the next one it holds starts and w
-- takes more (top_up: the one child with a place free, so O(1) per job), or
-- w is free.
function Dispatch:worker_next(w)
  local head = w.job
  if not head then return self.pool.children:free(w) end
  if head.state ~= "active" then self:job_started(w, head) end
  self:top_up(w, self:depth(), loop.now() - self.budget_ms)
  self:pump()
end

-- Takes back from w every job its child has not started, from job `from` on
-- (all of them without it); they wait in the source again, their attempt not
-- counted. Returns how many. The caller frees w if it holds nothing now.
function Dispatch:take_back(w, from)
  local back = w:recall(from)
  if #back == 0 then return 0 end
  local endings = self.pool.endings
  for _, job in ipairs(back) do endings:give_back(job) end
  self.saturated = false
  return #back
end

-- Takes back the jobs prefetched behind w's head that its child has not
-- started (it may have moved on to the next ones before their frames reached us).
function Dispatch:take_back_prefetched(w)
  return self:take_back_unstarted(w, 2)
end

-- Takes back from w the jobs it holds from place `from` on that its child
-- has not started (it may have moved past some before their ends reached us).
function Dispatch:take_back_unstarted(w, from)
  local held = w.held
  for i = from, #held do
    if not w:started(held[i]) then return self:take_back(w, held[i]) end
  end
  return 0
end

-- A busy child takes ready jobs up to the depth (and its max_jobs_per_child),
-- unless its head started before `recent` (it is not short). Returns false
-- when the source ran out of jobs it may prefetch.
function Dispatch:top_up(w, depth, recent)
  local head = w.job -- not started yet while a listener of its predecessor's end runs (worker_next)
  if depth <= 1 or w.state ~= "busy" or w.retiring or w.recycle or not head.started or head.started < recent then
    return true
  end
  local pool = self.pool
  local source, room = pool.source, self:room_in(w, depth)
  while room > 0 do
    local job = source:pop_ready()
    if not job then return false end
    if job.data_bytes and #job.data_bytes > PIPELINE_MAX_BYTES then
      source:push(job) -- it waits for an idle child
      return false
    end
    local best = self.best_sent
    if not (best and (job[PRIORITY] or 0) > best and self:rescue(job, w)) then
      self:send(w, job)
      room = room - 1
    elseif w.state == "busy" then -- better jobs stuck behind a long one came back: pick again
      room = math.min(room, self:room_in(w, depth)) -- (a listener may have sent it more)
    else
      return true
    end
  end
  return true
end

-- How many more jobs w may hold now (the depth, its max_jobs_per_child).
function Dispatch:room_in(w, depth)
  local pool, room = self.pool, depth - #w.held
  if pool.max_jobs_per_child then room = math.min(room, pool.max_jobs_per_child - w.jobs_done - #w.held) end
  return room
end

-- While jobs are ready beyond what idle children took, every busy child takes
-- more (a walk over the children: only after new jobs or jobs taken back; a
-- child whose job ended tops itself up in worker_next).
function Dispatch:prefetch()
  local depth = self:depth()
  if depth <= 1 then return end
  local recent, workers = loop.now() - self.budget_ms, self.pool.children:array()
  for i = 1, #workers do
    if not self:top_up(workers[i], depth, recent) then return end
  end
  self.saturated = true
end

-- A child is idle and nothing is ready: jobs prefetched behind a head that
-- has run for STEAL_AFTER_MS come back to run on it, and batches of lines
-- that long are cut (moonjob.pool.lines). Returns true when jobs came back;
-- otherwise a timer looks again when the first head reaches that age.
function Dispatch:steal()
  local pool = self.pool
  local lines = pool.batches and pool.lines
  local now, soonest, took, cut = loop.now(), nil, false, nil
  for _, w in ipairs(pool.children:snapshot()) do -- taking back may start a child: a copy
    local head = w.job
    local batch = lines and head and lines:cuttable(head)
    if (#w.held > 1 or batch) and head and head.started then
      local due = head.started + STEAL_AFTER_MS
      if due <= now then
        took = #w.held > 1 and self:take_back_prefetched(w) > 0 or took
        if batch then
          if lines:cut(w, head) then cut = cut or {}; cut[#cut + 1] = head
          elseif not soonest or now + 1 < soonest then soonest = now + 1 end -- the child has not taken it yet
        end
      elseif not soonest or due < soonest then
        soonest = due
      end
    end
  end
  if cut then lines:hand_back(cut) end
  if soonest and not took then
    if not self.steal_timer then self.steal_timer = core.timer(self.pump_later) end
    self.steal_timer:start(math.max(1, soonest - now))
  end
  return took
end

--------------------------------------------- priorities of jobs sent ahead ---

-- A job waits (in the source or in a child's read-ahead) while a worse one
-- may wait ahead of it in a child: rank() looks RANK_AFTER_MS from now.
function Dispatch:rank_soon()
  if self.rank_due then return end
  self.rank_due = loop.now() + RANK_AFTER_MS
  if not self.rank_timer then self.rank_timer = core.timer(self.rank_later) end
  self.rank_timer:start(RANK_AFTER_MS)
end

-- The lowest and the highest priority of the jobs w holds behind its head
-- (nil when it holds none).
local function priorities_behind(w)
  local held, low, high = w.held, nil, nil
  for i = 2, #held do
    local priority = held[i][PRIORITY] or 0
    if not low or priority < low then low = priority end
    if not high or priority > high then high = priority end
  end
  return low, high
end

-- Where in `held` the first job behind the head is that a better job waiting
-- after it (later in held, or in the source: `outside`, its best priority)
-- should go before; nil when they are in order.
local function first_out_of_rank(held, outside)
  local cut, best = nil, outside
  for i = #held, 2, -1 do
    local priority = held[i][PRIORITY] or 0
    if best and priority > best then cut = i
    elseif not best or priority < best then best = priority end
  end
  return cut
end

-- Where each busy child's read-ahead is to be taken back from (false: kept),
-- by its place in `workers`: from the first job a better waiting one should
-- go before; and, once such a job is found anywhere, from the first behind
-- every head that has run RANK_AFTER_MS (no one knows when its read-ahead
-- would start, so it waits in the source, where the first free child takes
-- the best job). Nothing when every read-ahead is in order. (Read-aheads of
-- different children are not compared: each starts within about budget_ms,
-- unless its head runs long, and then it goes back with the rest.)
local function rank_cuts(workers, source)
  local best = source:peek_ready()
  local outside, cuts, any = best and (best[PRIORITY] or 0), {}, false
  for i, w in ipairs(workers) do
    local held = w.held
    cuts[i] = w.state == "busy" and #held > 1 and first_out_of_rank(held, outside) or false
    any = any or cuts[i] ~= false
  end
  if not any then return cuts end
  local long_ago = loop.now() - RANK_AFTER_MS
  for i, w in ipairs(workers) do
    local head = w.job
    if w.state == "busy" and #w.held > 1 and head.started and head.started <= long_ago then cuts[i] = 2 end
  end
  return cuts
end

-- Jobs sent ahead to busy children that a better waiting job should go
-- before (rank_cuts) are taken back, those their child has not started (the
-- gate decides: never both), and wait in the source again, which hands them
-- out lowest priority first; no attempt is counted. Then worst_sent is made
-- exact again (it only grows between two looks).
function Dispatch:rank()
  local now, pool, due = loop.now(), self.pool, self.rank_due
  if due and now < due then -- the timer counts whole ms of the loop's clock: not yet
    return self.rank_timer:start(math.ceil(due - now))
  end
  self.rank_due = nil
  if pool.closing then return end
  local workers = pool.children:snapshot() -- taking back may free a child: a copy
  local cuts = rank_cuts(workers, pool.source)
  for i, w in ipairs(workers) do
    if cuts[i] then self.ranked_back = self.ranked_back + self:take_back_unstarted(w, cuts[i]) end
  end
  self:measure_sent(workers)
  self:pump()
end

-- worst_sent and best_sent made exact again (between two looks, they only
-- move outwards).
function Dispatch:measure_sent(workers)
  local worst, best = nil, nil
  for _, w in ipairs(workers) do
    local low, high = priorities_behind(w)
    if high and (not worst or high > worst) then worst = high end
    if low and (not best or low < best) then best = low end
  end
  if self.nprefetched == 0 then worst, best = nil, nil end
  self.worst_sent, self.best_sent = worst, best
end

-- Child `to` is about to be sent `job` while a better one may be stuck in
-- another child, behind a head that has run STEAL_AFTER_MS: such jobs are
-- taken back and `job` goes back to the source with them. Returns true when
-- some came back (the caller pops again: the best comes first), false when
-- `job` is the one to send. (Every call that returns true takes jobs out of
-- the other children, and `to` is never walked: a caller's loop ends.)
-- Cheap when nothing can be stuck: no walk before the oldest head reaches
-- that age (stuck_from), and best_sent is made exact after a walk.
function Dispatch:rescue(job, to)
  local now = loop.now()
  if now < self.stuck_from then return false end
  local workers = self.pool.children:array()
  local priority, long_ago, stuck, soonest = job[PRIORITY] or 0, now - STEAL_AFTER_MS, nil, math.huge
  for _, w in ipairs(workers) do
    local head = w.job
    if w.state == "busy" and head and head.started then
      soonest = math.min(soonest, head.started + STEAL_AFTER_MS)
      if w ~= to and head.started <= long_ago and #w.held > 1 and priorities_behind(w) < priority then
        stuck = stuck or {}
        stuck[#stuck + 1] = w
      end
    end
  end
  self.stuck_from = math.min(soonest, now + STEAL_AFTER_MS) -- heads started later are younger
  local back = 0
  if stuck then
    for _, w in ipairs(stuck) do back = back + self:take_back_prefetched(w) end
  end
  self.ranked_back = self.ranked_back + back
  self:measure_sent(workers)
  if back == 0 then return false end
  self.pool.source:push(job)
  return true
end

-- Priorities differ among the jobs sent ahead: unstick() looks when the head
-- that started at `started` has run STEAL_AFTER_MS.
function Dispatch:watch_stuck(started)
  local now = loop.now()
  local due = (started or now) + STEAL_AFTER_MS
  self.stuck_due = due
  if not self.stuck_timer then self.stuck_timer = core.timer(self.unstick_later) end
  self.stuck_timer:start(math.max(1, math.ceil(due - now)))
end

-- The highest priority behind each busy child's head, and the two highest
-- of them (where the highest is), for "the worst job queued elsewhere".
local function highs_behind(workers)
  local highs, first_at, first, second = {}, nil, nil, nil
  for i, w in ipairs(workers) do
    local _, high = priorities_behind(w)
    highs[i] = high or false
    if high and (not first or high > first) then first_at, first, second = i, high, first
    elseif high and (not second or high > second) then second = high end
  end
  return first_at, first, second
end

-- Jobs queued behind a head that has run STEAL_AFTER_MS, better than a job
-- queued in another child or next in the source (either would start first),
-- are taken back: the source hands them to the first free child. Looks again
-- when the next head reaches that age, or RANK_AFTER_MS from now while jobs
-- stay behind such a head, as long as priorities differ among jobs sent ahead.
function Dispatch:unstick()
  local now, pool, due = loop.now(), self.pool, self.stuck_due
  if due and now < due then return self.stuck_timer:start(math.ceil(due - now)) end
  self.stuck_due = nil
  if pool.closing or self.nprefetched == 0 then return end
  local workers = pool.children:snapshot() -- taking back may free a child: a copy
  local next_best = pool.source:peek_ready()
  next_best = next_best and (next_best[PRIORITY] or 0)
  local first_at, first, second = highs_behind(workers)
  local long_ago, back, soonest = now - STEAL_AFTER_MS, 0, nil
  for i, w in ipairs(workers) do
    local head = w.job
    if w.state == "busy" and #w.held > 1 and head.started then
      if head.started <= long_ago then
        local worse = i == first_at and second or first
        if next_best and (not worse or next_best > worse) then worse = next_best end
        local low = priorities_behind(w)
        if worse and low < worse then back = back + self:take_back_prefetched(w)
        else soonest = math.min(soonest or math.huge, now + RANK_AFTER_MS) end
      else
        soonest = math.min(soonest or math.huge, head.started + STEAL_AFTER_MS)
      end
    end
  end
  self.ranked_back = self.ranked_back + back
  self:measure_sent(workers)
  if soonest and self.best_sent ~= self.worst_sent then self:watch_stuck(soonest - STEAL_AFTER_MS) end
  if back > 0 then self:pump() end
end

function Dispatch:close()
  for _, name in ipairs({ "delay_timer", "steal_timer", "rank_timer", "stuck_timer" }) do
    if self[name] then self[name]:close(); self[name] = nil end
  end
end

return Dispatch
