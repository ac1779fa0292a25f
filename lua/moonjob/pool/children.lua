-- moonjob.pool.children -- the children: how many, starting, freeing, ending.
--
-- Methods mixed into the Pool class (see pool/init.lua). The pool keeps `size`
-- children alive (or, with idle_timeout, as many as the work needs, at least
-- min_size), replaces the ones that end, recycles them (max_jobs_per_child,
-- ENOMEM: a free child past its count is ended instead of taking a job) and,
-- every SWEEP_MS, checks that dispatched jobs were taken and ends children
-- idle past idle_timeout. While starts fail, how many to start is the
-- breaker's (moonjob.pool.breaker).
--
-- State: pool.workers (worker -> true, every child until its exit is
-- handled), nworkers (their number), nretiring (those asked to end: they no
-- longer count toward the pool's size), idle (a stack of free workers; an
-- entry whose worker is no longer idle is skipped by _pump).
--
-- Caveats: starting a child never waits (core.spawn runs on a libuv thread);
-- a child ended here leaves pool.workers only when its exit comes in
-- (_remove_worker), which a process it started in a session of its own can
-- hold back: so _retire takes it out of the count at once (nretiring).
local core = require "moonjob.core"
local errors = require "moonjob.errors"
local loop = require "moonjob.loop"
local Worker = require "moonjob.worker"

local Pool = {}

local SWEEP_MS = 100            -- how often acknowledgements and idle children are checked
local TERM_GRACE_MS = 1000      -- SIGTERM to SIGKILL when a close ends busy children

-- Starts the sweep (see _sweep); it does not keep the loop alive.
function Pool:_start_sweeper()
  self.sweeper = core.timer(function() self:_sweep() end)
  self.sweeper:start(SWEEP_MS, SWEEP_MS)
  self.sweeper:unref()
end

-- Starts one child; false when it cannot even be spawned (a start failure).
function Pool:_spawn()
  local w, err = Worker.spawn(self)
  if not w then
    self:_start_failed(errors.new("ESPAWN", "cannot start a child process: " .. tostring(err)))
    return false
  end
  self.workers[w] = true
  self.worker_list[#self.worker_list + 1] = w
  self.nworkers = self.nworkers + 1
  self.counts.spawned = self.counts.spawned + 1
  return true
end

-- How many workers are ready (idle or busy) and starting.
function Pool:_live_workers()
  local ready, starting = 0, 0
  for w in pairs(self.workers) do
    if w.state == "idle" or w.state == "busy" then ready = ready + 1
    elseif w.state == "starting" then starting = starting + 1 end
  end
  return ready, starting
end

-- How many children the pool wants now: `size`; with idle_timeout, what the
-- work needs (at least min_size); while starts fail and no child is ready,
-- one probe while jobs wait.
function Pool:_target()
  local waiting = self.source:ready_count()
  if self.start_error and self:_live_workers() == 0 then return waiting > 0 and 1 or 0 end
  if self.idle_timeout then
    return math.max(self.min_size, math.min(self.size, self.nactive + waiting))
  end
  return self.size
end

-- Looks again at how many children the pool wants in `ms` (the back-off).
function Pool:_respawn_later(ms)
  if not self.respawn_timer then
    self.respawn_timer = core.timer(function() self:_ensure_workers() end)
  end
  self.respawn_timer:start(ms)
end

-- Starts the children the pool wants; after start failures, one at a time
-- and not before the back-off has passed.
function Pool:_ensure_workers()
  if self.closing then return end
  local target = self:_target()
  if self.start_error then return self:_probe(target) end
  while self.nworkers - self.nretiring < target do
    if not self:_spawn() then return end
  end
end

-- Ends a child: an idle one reads end of file and exits; kill = true
-- SIGKILLs its process group. It no longer counts toward the pool's size.
-- Returns what the kill returned (nil, err once the child was reaped).
function Pool:_retire(w, kill)
  if not w.retiring then
    w.retiring = true
    self.nretiring = self.nretiring + 1
  end
  if kill then
    w.state = "killed"
    return w:kill()
  end
  w:finish()
  return true
end

-- A child is free again: it takes the next job, or is recycled.
function Pool:_worker_free(w)
  if self.closing or w.recycle or (self.max_jobs_per_child and w.jobs_done >= self.max_jobs_per_child) then
    self:_retire(w)
  else
    w.idle_since = loop.now()
    self.idle[#self.idle + 1] = w
    self.saturated = false -- there is room again: prefetching may fill it past one job
  end
  self:_pump()
end

-- A child's exit came in: it leaves the pool. One that ended unasked (not
-- retired) and was not reported as a failed start counts as crashed.
function Pool:_remove_worker(w)
  self.workers[w] = nil
  local list = self.worker_list
  for i = 1, #list do
    if list[i] == w then
      list[i] = list[#list]
      list[#list] = nil
      break
    end
  end
  self.nworkers = self.nworkers - 1
  if w.retiring then self.nretiring = self.nretiring - 1 end
  if not w.retiring and not w.start_reported then
    self.counts.crashed = self.counts.crashed + 1
  end
end

-- Every SWEEP_MS: acknowledgements of dispatched jobs, and idle children past
-- idle_timeout (down to min_size).
function Pool:_sweep()
  local now = loop.now()
  local ack_ms, idle_ms = self.ack_timeout * 1000, self.idle_timeout and self.idle_timeout * 1000
  local current = {} -- replacing a child adds workers: never while iterating them
  for w in pairs(self.workers) do current[#current + 1] = w end
  for _, w in ipairs(current) do
    if w.state == "busy" and not w.acked and now - w.dispatched_at >= ack_ms then
      if w:taken() then w.acked = true else self:_unacknowledged(w) end
    elseif idle_ms and w.state == "idle" and now - w.idle_since >= idle_ms
        and self.nworkers - self.nretiring > self.min_size then
      self:_retire(w)
    end
  end
  if self.batches then self:_publish_kept() end
end

-- Ends every child now: busy ones get SIGTERM (their jobs fail with ECLOSED),
-- and whatever is still there TERM_GRACE_MS later gets SIGKILL.
function Pool:_terminate()
  if self.terminating then return end
  self.terminating = true
  for w in pairs(self.workers) do
    self:_take_back(w) -- what it has not started ends as waiting jobs do (ECLOSED)
    for _, job in ipairs(w.queue) do
      if job.remote_id then
        -- given back to the queue below: another host may start it at once, so
        -- this child stops now, not after SIGTERM's grace
        w:kill("SIGKILL")
      end
    end
    while w.job do
      local job = w:end_job()
      job.error = errors.new("ECLOSED", "the pool was closed while the job ran", { killed = true })
      self:_finish(job, "failed")
    end
    self:_retire(w)
    w:kill("SIGTERM")
  end
  self.killer = core.timer(function()
    for w in pairs(self.workers) do w:kill() end
  end)
  self.killer:start(TERM_GRACE_MS)
end

-- The first batch of lines (pool:add's `lines`): idle children may cut
-- batches from now on (_steal), and children may send their bigger DONE.
function Pool:_expect_batches()
  self.batches = true
  for _, w in ipairs(self.worker_list) do w:expect_batches() end
end

return Pool
