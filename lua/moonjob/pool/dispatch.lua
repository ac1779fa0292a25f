-- moonjob.pool.dispatch -- pairing waiting jobs with children, several per child.
--
-- A part of the pool (see pool/init.lua), pool.dispatch. pump() is the pool's
-- heartbeat, run after anything that may free a child or make a job ready:
-- free children take ready jobs (the most recently freed first), then the
-- delay timer, the number of children and the breaker are brought up to
-- date, and the owner of remote jobs (pool.owner) is told there may be room.
--
-- Up to `pipeline` jobs may be sent to a child (default 8, at most
-- core.frame.MAX_INFLIGHT; child.sent): the one it runs (its head, child.job)
-- and the ones prefetched behind it, which it reads ahead and starts the
-- moment the head ends, without waiting for the parent. Users cannot tell, except by speed:
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
--     is sent one job at a time, as without pipelining.
--   * Long jobs hold no one hostage: when a child is idle and nothing is ready,
--     jobs prefetched behind a head that has run for STEAL_AFTER_MS are taken
--     back and run elsewhere (a timer looks again when a head reaches it);
--     a batch of lines that has run that long has its lines not started cut
--     off (moonjob.pool.lines).
--   * A job its owner bounded (job.start_by, loop.now() ms: a Redis rate
--     counted it as started by then) goes only to an idle child, never
--     behind a busy one, and only until then: found ready later, it goes
--     back to its owner (owner:late) instead.
--   * Priorities: a job added later with a better priority goes ahead of every
--     job still waiting in the pool at once, and of the jobs already sent to
--     a child once it has waited 2 ms: dispatch.ranks (moonjob.pool.ranks)
--     takes back the jobs sent ahead that it should go before. The pump asks
--     it (rescue) before it sends a job worse than the best sent ahead.
--
-- Owns: the number of prefetched jobs (those with job.prefetched), the moving
-- average of recent run times (ms), budget_ms (PIPELINE_BUDGET_MS; the specs
-- raise it so that timing on a loaded machine does not decide whether they
-- pipeline), `saturated` (the last walk found every busy child full: pump
-- skips the walk until a child is free or jobs are taken back; meanwhile
-- each child tops itself up when one of its jobs ends), the delay and steal
-- timers, `ranks` (moonjob.pool.ranks), the buffer the job's metadata is
-- encoded in.
-- Exposes: dispatch:pump(), dispatch:job_started(child, job) (nactive),
-- dispatch:child_next(child), dispatch:take_back(child [, from]),
-- dispatch:take_back_prefetched(child), dispatch:take_back_unstarted(child, from),
-- dispatch:unprefetch(job),
-- dispatch:note_run(ms), dispatch:depth(), dispatch:prefetched_count(),
-- dispatch:has_started(job) (the gate, for a job not yet its child's head),
-- dispatch:room_again(), dispatch:close().
-- Calls: pool.source (pop_ready, push, next_due), pool.children
-- (next_idle, pop_idle, has_idle, free, retire, ensure, array, snapshot),
-- pool.breaker:check, pool.owner (want; late, for a job with a start bound),
-- pool.endings:give_back, pool.lines (wire_first_line, cuttable, cut,
-- hand_back), pool.tally:sample_wait, pool.events:emit (the `active`
-- listeners), ranks
-- (sent_ahead, none_ahead, check_source, rescue, close).
--
-- Caveats: a job data over PIPELINE_MAX_BYTES is only given to an idle child
-- (a child's read-ahead holds whole frames in memory), and so is one with a
-- start bound (behind a busy child it would start late). No closure is made in
-- the methods pump runs for every job: LuaJIT cannot compile a function that
-- makes one (it aborts its traces), and those methods must stay compiled.
local buffer = require "string.buffer"
local core = require "moonjob.core"
local loop = require "moonjob.loop"
local Job = require "moonjob.job"
local Lines = require "moonjob.pool.lines"
local Ranks = require "moonjob.pool.ranks"

local Dispatch = {}
Dispatch.__index = Dispatch

local PIPELINE_BUDGET_MS = 2     -- how long the jobs prefetched in one child may take, about
local PIPELINE_MAX_BYTES = 64 * 1024 -- larger job data is never prefetched behind another job
local STEAL_AFTER_MS = 10        -- a head that ran this long gives up the jobs behind it
local RUN_AVG_WEIGHT = 0.05      -- weight of the newest run time in the average
Dispatch.STEAL_AFTER_MS = STEAL_AFTER_MS

-- The job's fields the pool sets or reads for every job are read and written
-- in the job's own slots (Job.SLOT: false for nil), and its other fields with
-- rawget: a call of the job's metatable for each would cost more than the
-- rest of the pump, and keep these paths from being compiled.
local SLOT = Job.SLOT
local ID, STATE, DATA_BYTES, ADDED, PRIORITY = SLOT.id, SLOT.state, SLOT.data_bytes, SLOT.added, SLOT.priority
local ATTEMPTS, CHILD, PREFETCHED, PID, STARTED, MS = SLOT.attempts, SLOT.child, SLOT.prefetched,
  SLOT.pid, SLOT.started, SLOT.ms

local wire_first_line = Lines.wire_first_line
local encode = buffer.encode

-- The metadata the child reads before a job's data (child/runner.lua's
-- decode_meta): the job's id, attempt, name, first line and children (a
-- flow's parent on Redis: Redis's rows, text, which the child decodes),
-- encoded one after the other. For a first attempt
-- without a name, lines or children, the common case, it is sent as two
-- parts: the id's encoding and these bytes, made once.
local PLAIN_FIRST_ATTEMPT = buffer.new():encode(1):encode(nil):encode(false):encode(nil):tostring()

-- Dispatch.new(pool, pipeline) -> the dispatch of a pool whose children hold
-- at most `pipeline` jobs each.
function Dispatch.new(pool, pipeline)
  local self = setmetatable({
    pool = pool, listeners = pool.events.listeners,
    pipeline = pipeline, budget_ms = PIPELINE_BUDGET_MS,
    nprefetched = 0, saturated = false,
    meta = buffer.new(),
  }, Dispatch)
  self.pump_later = function() self:pump() end -- for the timers: made once
  self.ranks = Ranks.new(self, STEAL_AFTER_MS)
  return self
end

-------------------------------------------------------------- the pump ---

-- Sends a job to a child: an idle one runs it now; a busy one gets it
-- behind the jobs sent to it before (prefetched). A child found gone is
-- retired and the job goes back to the source at once (it never left the
-- parent). now: the loop.now() of the caller's pass, if it has one (a clock
-- read less per job).
function Dispatch:send(child, job, now)
  local pool = self.pool
  Job.grow(job)
  local attempt = (job[ATTEMPTS] or 0) + 1
  local id, name, first = rawget(job, "remote_id") or job[ID], rawget(job, "name"), rawget(job, "first_line")
  local children = rawget(job, "children")
  local meta, rest = nil, PLAIN_FIRST_ATTEMPT
  if attempt == 1 and name == nil and not first and not children then
    meta = encode(id)
  else
    meta, rest = self.meta:reset():encode(id):encode(attempt):encode(name)
      :encode(first and wire_first_line(job) or false):encode(children):tostring(), ""
  end
  if not child:run(job, meta, rest) then -- the child is gone: it holds no place either
    pool.children:retire(child, true)
    return pool.source:push(job)
  end
  job[ATTEMPTS], job[CHILD] = attempt, child
  if child.job == job then return self:job_started(child, job, now) end
  job[PREFETCHED] = true
  self.nprefetched = self.nprefetched + 1
  self.ranks:sent_ahead(job, now)
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
  local children, source, ranks = pool.children, pool.source, self.ranks
  local child = children:next_idle()
  while child do
    local job = source:pop_ready()
    if job then
      local best = ranks.best_sent
      if rawget(job, "start_by") and self:late(job) then -- (its owner took it back: pick again)
      elseif not (best and (job[PRIORITY] or 0) > best and ranks:rescue(job, child)) then
        children:pop_idle()
        self:send(child, job)
      end -- else better jobs stuck behind a long one came back: pick again
    elseif not ((self.nprefetched > 0 or pool.batches) and self:steal()) then
      break
    end
    child = children:next_idle()
  end
  if not self.saturated and self.pipeline > 1 and not children:has_idle() then self:prefetch() end
  if ranks.worst_sent then ranks:check_source(source) end
  self:arm_delay()
  children:ensure()
  pool.breaker:check()
  local owner = pool.owner
  if owner then owner:want() end
end

-- Whether a job its owner bounded (job.start_by) is past its bound, read
-- on a fresh clock: then it goes back to its owner, unsent.
function Dispatch:late(job)
  if loop.now() <= job.start_by then return false end
  job.owner:late(job)
  return true
end

-------------------------------------------------------- one child's jobs ---

-- A job's run ended after `ms`: the average the depth follows.
function Dispatch:note_run(ms)
  local avg = self.run_avg
  if avg then self.run_avg = avg + (ms - avg) * RUN_AVG_WEIGHT else self.run_avg = ms end
end

-- How many jobs may be sent to one child now.
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
  return job.started ~= nil or (job.prefetched and job.child and job.child:started(job)) or false
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
  if not job[PREFETCHED] then return end
  job[PREFETCHED], self.nprefetched = false, self.nprefetched - 1
  if self.nprefetched == 0 then self.ranks:none_ahead() end
end

-- A job became its child's head: it runs now. Its wait ends, its timeout (or,
-- interrupted while it was prefetched, its hard deadline) starts, `active` fires.
function Dispatch:job_started(child, job, now)
  local pool = self.pool
  self:unprefetch(job)
  now = now or loop.now()
  job[STATE], job[PID], job[STARTED] = "active", child.pid, now
  job[MS] = false -- this attempt's run time comes with its end (the child's measure)
  pool.tally:sample_wait(now - (rawget(job, "run_at") or job[ADDED]))
  child.dispatched_at, child.acked = now, false
  pool.nactive = pool.nactive + 1
  if rawget(job, "interrupt") then
    child:arm(rawget(job, "kill_after") or pool.kill_after)
  else
    local timeout = rawget(job, "timeout") or pool.timeout
    if timeout then child:arm(timeout) end
  end
  local owner = rawget(job, "owner") -- a plain field: nil for a local job
  if owner then owner:started(job) end
  if self.listeners.active then pool.events:emit("active", job) end
end

-- A job of the child's ended (or was taken back): the next one sent to it
-- starts and it takes more (top_up: the one child with a place free, so O(1)
-- per job), or the child is free.
function Dispatch:child_next(child)
  local head = child.job
  if not head then return self.pool.children:free(child) end
  local now = loop.now()
  if head[STATE] ~= "active" then self:job_started(child, head, now) end
  self:top_up(child, self:depth(), now - self.budget_ms, now)
  self:pump()
end

-- Takes back from the child every job sent to it that it has not started,
-- from job `from` on (all of them without it); they wait in the source again,
-- their attempt not counted. Returns how many. The caller frees the child if
-- nothing is left sent to it.
function Dispatch:take_back(child, from)
  local back = child:recall(from)
  if #back == 0 then return 0 end
  local endings = self.pool.endings
  for _, job in ipairs(back) do endings:give_back(job) end
  self.saturated = false
  return #back
end

-- Takes back the jobs prefetched behind the child's head that it has not
-- started (it may have moved on to the next ones before their frames reached us).
function Dispatch:take_back_prefetched(child)
  return self:take_back_unstarted(child, 2)
end

-- Takes back from the child the jobs sent to it from place `from` of
-- child.sent on that it has not started (it may have moved past some before
-- their ends reached us).
function Dispatch:take_back_unstarted(child, from)
  local sent = child.sent
  for i = from, #sent do
    if not child:started(sent[i]) then return self:take_back(child, sent[i]) end
  end
  return 0
end

-- A busy child takes ready jobs up to the depth (and its max_jobs_per_child),
-- unless its head started before `recent` (it is not short). Returns false
-- when the source ran out of jobs it may prefetch. The common case, one
-- place free (the job that just ended), takes one job without a loop: a
-- loop here would end the compiled trace of every job's ending.
function Dispatch:top_up(child, depth, recent, now)
  local head = child.job -- not started yet while a listener of its predecessor's end runs (child_next)
  if depth <= 1 or child.state ~= "busy" or child.retiring or child.recycle
      or not head[STARTED] or head[STARTED] < recent then
    return true
  end
  local room = self:room_in(child, depth)
  if room <= 0 then return true end
  local took = self:take_one(child, depth, now)
  if took == "sent" and room == 1 then return true end
  return self:top_up_more(child, depth, room, took, now)
end

-- top_up's loop, after the first take_one answered `took`.
function Dispatch:top_up_more(child, depth, room, took, now)
  while true do
    if took == "sent" then room = room - 1
    elseif took == "again" then -- (a listener may have sent it more)
      room = math.min(room, self:room_in(child, depth))
    else return took ~= "none" end
    if room <= 0 then return true end
    took = self:take_one(child, depth, now)
  end
end

-- Sends the child the next ready job: "sent"; "none" when the source has none it
-- may prefetch; "again" when better jobs stuck behind a long one came back
-- instead (pick again); "stop" when the child is no longer busy.
function Dispatch:take_one(child, depth, now)
  local source = self.pool.source
  local job = source:pop_ready()
  if not job then return "none" end
  local data = job[DATA_BYTES]
  if data and #data > PIPELINE_MAX_BYTES or rawget(job, "start_by") then
    source:push(job) -- it waits for an idle child
    return "none"
  end
  local best = self.ranks.best_sent
  if not (best and (job[PRIORITY] or 0) > best and self.ranks:rescue(job, child)) then
    self:send(child, job, now)
    return "sent"
  end
  return child.state == "busy" and "again" or "stop"
end

-- How many more jobs may be sent to the child now (the depth, its
-- max_jobs_per_child).
function Dispatch:room_in(child, depth)
  local pool, sent = self.pool, #child.sent
  local room = depth - sent
  if pool.max_jobs_per_child then room = math.min(room, pool.max_jobs_per_child - child.jobs_done - sent) end
  return room
end

-- While jobs are ready beyond what idle children took, every busy child takes
-- more (a walk over the children: only after new jobs or jobs taken back; a
-- child whose job ended tops itself up in child_next).
function Dispatch:prefetch()
  local depth = self:depth()
  if depth <= 1 then return end
  local now, list = loop.now(), self.pool.children:array()
  for i = 1, #list do
    if not self:top_up(list[i], depth, now - self.budget_ms, now) then return end
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
  for _, child in ipairs(pool.children:snapshot()) do -- taking back may start a child: a copy
    local head = child.job
    local batch = lines and head and lines:cuttable(head)
    if (#child.sent > 1 or batch) and head and head.started then
      local due = head.started + STEAL_AFTER_MS
      if due <= now then
        took = #child.sent > 1 and self:take_back_prefetched(child) > 0 or took
        if batch then
          if lines:cut(child, head) then cut = cut or {}; cut[#cut + 1] = head
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

function Dispatch:close()
  for _, name in ipairs({ "delay_timer", "steal_timer" }) do
    if self[name] then self[name]:close(); self[name] = nil end
  end
  self.ranks:close()
end

return Dispatch
