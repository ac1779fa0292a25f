-- moonjob.pool.dispatch -- several jobs in flight per child, for tiny jobs.
--
-- Methods mixed into the Pool class (see pool/init.lua). A child can hold up to
-- `pipeline` jobs (default 8, at most core.frame.MAX_INFLIGHT): the one it
-- runs (its head, w.job) and the ones queued behind it, which it reads ahead
-- and starts the moment the head ends, without waiting for the parent. Users
-- cannot tell, except by speed:
--
--   * A job is "active" (state, `active` event, job.started, its timeout, the
--     ack_timeout) only once it is its child's head; before, it is "waiting".
--   * A job queued in a child that has not started it can be taken back: the
--     shared page's gate (core/frame.h) decides, by compare-and-swap, whether
--     the child started it or the parent recalled it, never both. Cancel,
--     close, a hard kill, a crash and an idle child looking for work use it;
--     a recalled job goes back to the source without counting an attempt.
--   * Prefetching (more than one job per child) happens only while jobs are
--     ready beyond what idle children take, and only as deep as recent jobs
--     were short: depth = 1 + PIPELINE_BUDGET_MS / (average run time), capped
--     by `pipeline`; never behind a head that has run longer than the budget.
--     With no run time known yet, or jobs longer than the budget, each child
--     holds one job, as without pipelining.
--   * Long jobs hold no one hostage: when a child is idle and nothing is ready,
--     jobs queued behind a head that has run for STEAL_AFTER_MS are taken
--     back and run elsewhere (a timer looks again when a head reaches it).
--     A batch of lines (moonjob.cli: pool:add's `lines`) that has run that
--     long has its lines not started cut off, its first line excepted
--     (core/frame.h: the child starts no more of them), and
--     pool.on_lines_cut(job, lines_kept) hands them back to the command
--     line, which adds them again.
--   * Priorities: a job added later with a better priority goes ahead of every
--     job still waiting in the pool, but not of the jobs already sent to a
--     child: at most (pipeline - 1) per child, plus the one it runs.
--
-- State: pool.nqueued (jobs sent and not yet their child's head: job.queued),
-- pool.run_avg (moving average of recent run times, ms), pool.pipeline_budget_ms
-- (PIPELINE_BUDGET_MS; the specs raise it so that timing on a loaded machine
-- does not decide whether they pipeline), pool.saturated (the last walk found
-- every busy child full: _pump skips the walk until a child is free or jobs
-- are taken back; meanwhile each child tops itself up when one of its jobs
-- ends).
--
-- Caveat: a job data over PIPELINE_MAX_BYTES is only given to an idle child
-- (a child's read-ahead holds whole frames in memory).
local core = require "moonjob.core"
local loop = require "moonjob.loop"

local Pool = {}

local PIPELINE_BUDGET_MS = 2     -- how long the jobs queued in one child may take, about
local PIPELINE_MAX_BYTES = 64 * 1024 -- larger job data is never queued behind another job
local STEAL_AFTER_MS = 10        -- a head that ran this long gives up the jobs behind it
local RUN_AVG_WEIGHT = 0.05      -- weight of the newest run time in the average

-- A job's run ended after `ms`: the average the depth follows.
function Pool:_note_run(ms)
  local avg = self.run_avg
  if avg then self.run_avg = avg + (ms - avg) * RUN_AVG_WEIGHT else self.run_avg = ms end
end

-- How many jobs one child may hold now.
function Pool:_depth()
  local avg, max = self.run_avg, self.pipeline
  if max <= 1 or not avg then return 1 end
  local budget = self.pipeline_budget_ms or PIPELINE_BUDGET_MS
  local depth = math.min(max, 1 + math.floor(budget / math.max(avg, 0.001)))
  -- batches of lines are sized to a few ms each: one more waits behind the
  -- head, so the child never waits for the parent between two
  if self.batches and depth < 2 then return 2 end
  return depth
end

-- A job queued in a child is not any more (it started, ended or came back).
function Pool:_unqueue(job)
  if job.queued then job.queued, self.nqueued = nil, self.nqueued - 1 end
end

-- A job became its child's head: it runs now. Its wait ends, its timeout (or,
-- interrupted while it was queued, its hard deadline) starts, `active` fires.
function Pool:_job_started(w, job)
  self:_unqueue(job)
  local now = loop.now()
  job.state, job.pid, job.started = "active", w.pid, now
  job.ms = nil -- this attempt's run time comes with its end (the child's measure)
  self:_sample_wait(now - (job.run_at or job.added))
  w.dispatched_at, w.acked = now, false
  self.nactive = self.nactive + 1
  if job.interrupt then
    w:arm(job.kill_after or self.kill_after)
  else
    local timeout = job.timeout or self.timeout
    if timeout then w:arm(timeout) end
  end
  if self.listeners.active then self:_emit("active", job) end
end

-- A job of w's ended (or was taken back): the next one it holds starts and w
-- takes more (_top_up: the one child with a place free, so O(1) per job), or
-- w is free.
function Pool:_worker_next(w)
  local head = w.job
  if not head then return self:_worker_free(w) end
  if head.state ~= "active" then self:_job_started(w, head) end
  self:_top_up(w, self:_depth(), loop.now() - self:_budget_ms())
  self:_pump()
end

-- Takes back from w every job its child has not started, from job `from` on
-- (all of them without it); they wait in the source again, their attempt not
-- counted. Returns how many. The caller frees w if it holds nothing now.
function Pool:_take_back(w, from)
  local back = w:recall(from)
  if #back == 0 then return 0 end
  for _, job in ipairs(back) do self:_give_back(job) end
  self.saturated = false
  return #back
end

-- Takes back the jobs queued behind w's head that its child has not started
-- (it may have moved on to the next ones before their frames reached us).
function Pool:_take_back_queued(w)
  local queue = w.queue
  for i = 2, #queue do
    if not w:started(queue[i]) then return self:_take_back(w, queue[i]) end
  end
  return 0
end

function Pool:_budget_ms()
  return self.pipeline_budget_ms or PIPELINE_BUDGET_MS
end

-- A busy child takes ready jobs up to the depth (and its max_jobs_per_child),
-- unless its head started before `recent` (it is not short). Returns false
-- when the source ran out of jobs it may queue.
function Pool:_top_up(w, depth, recent)
  local head = w.job -- not started yet while a listener of its predecessor's end runs (_worker_next)
  if depth <= 1 or w.state ~= "busy" or w.retiring or w.recycle or not head.started or head.started < recent then
    return true
  end
  local source, room = self.source, depth - #w.queue
  if self.max_jobs_per_child then room = math.min(room, self.max_jobs_per_child - w.jobs_done - #w.queue) end
  for _ = 1, room do
    local job = source:pop_ready()
    if not job then return false end
    if job.data_bytes and #job.data_bytes > PIPELINE_MAX_BYTES then
      source:push(job) -- it waits for an idle child
      return false
    end
    self:_dispatch(w, job)
  end
  return true
end

-- While jobs are ready beyond what idle children took, every busy child takes
-- more (a walk over the children: only after new jobs or jobs taken back; a
-- child whose job ended tops itself up in _worker_next).
function Pool:_prefetch()
  local depth = self:_depth()
  if depth <= 1 then return end
  local recent, workers = loop.now() - self:_budget_ms(), self.worker_list
  for i = 1, #workers do
    if not self:_top_up(workers[i], depth, recent) then return end
  end
  self.saturated = true
end

-- A child is idle and nothing is ready: jobs queued behind a head that has
-- run for STEAL_AFTER_MS come back to run on it. Returns true when some did;
-- otherwise a timer looks again when the first head reaches that age.
function Pool:_steal()
  local now, soonest, took, cut = loop.now(), nil, false, nil
  local workers = { unpack(self.worker_list) } -- taking back may start a child: a copy
  for _, w in ipairs(workers) do
    local head = w.job
    local batch = head and head.first_line and not head.lines_cut
    if (#w.queue > 1 or batch) and head and head.started then
      local due = head.started + STEAL_AFTER_MS
      if due <= now then
        took = #w.queue > 1 and self:_take_back_queued(w) > 0 or took
        if batch then
          head.lines_cut = w:batch_cut(head)
          if head.lines_cut then cut = cut or {}; cut[#cut + 1] = head
          elseif not soonest or now + 1 < soonest then soonest = now + 1 end -- the child has not taken it yet
        end
      elseif not soonest or due < soonest then
        soonest = due
      end
    end
  end
  -- the lines cut off go back to their owner (moonjob.cli), who adds them again
  for i = 1, cut and #cut or 0 do
    if self.on_lines_cut then self.on_lines_cut(cut[i], cut[i].lines_cut) end
  end
  if soonest and not took then
    if not self.steal_timer then self.steal_timer = core.timer(self:_pump_later()) end
    self.steal_timer:start(math.max(1, soonest - now))
  end
  return took
end

-- Hands what long batches of lines have finished so far to their owner
-- (pool.on_lines_kept(job, lines_kept, kept_text): moonjob.cli prints them),
-- for each batch running for min_ms (default STEAL_AFTER_MS) or more: a slow
-- line holds up no output of the lines before it, and a run stopped by a
-- signal records them. The sweep calls it; so does the command line before
-- it kills the children.
function Pool:_publish_kept(min_ms)
  local listener = self.on_lines_kept
  if not (listener and self.batches) then return end
  min_ms = min_ms or STEAL_AFTER_MS
  local now, heads = loop.now(), {}
  for _, w in ipairs(self.worker_list) do
    local head = w.job
    if head and head.first_line and head.started and now - head.started >= min_ms then
      heads[#heads + 1] = { head, w:batch(head) }
    end
  end
  for _, h in ipairs(heads) do -- the listener may add jobs: not while walking the workers
    local head, kept, text = h[1], h[3], h[4] -- h[2]: the lines started
    if kept and kept > 0 then listener(head, kept, text) end
  end
end

return Pool
