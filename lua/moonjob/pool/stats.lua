-- moonjob.pool.stats -- what pool:stats() reports: counters and recent times.
--
-- Methods mixed into the Pool class (see pool/init.lua). The counters live in
-- pool.counts (completed, failed, spawned, crashed, timeouts, killed,
-- retries, cache_hits) and are bumped where each thing happens; this file
-- keeps the two rings of recent times (pool.wait_ms: from added, or due, to
-- dispatched; pool.run_ms: dispatched to ended) and turns it all into the
-- table pool:stats() returns.
--
-- Caveat: the percentiles cover the last SAMPLES jobs only, and sorting them
-- costs O(SAMPLES log SAMPLES) per stats() call: fine for a progress line,
-- not for every job.
local Pool = {}

local SAMPLES = 1024             -- recent wait and run times kept for percentiles

local function sample(ring, value)
  ring.n = ring.n + 1
  ring[(ring.n - 1) % SAMPLES + 1] = value
end

-- A dispatched job waited `ms` since it was added (or became due).
function Pool:_sample_wait(ms)
  sample(self.wait_ms, ms)
end

-- A job's run ended after `ms`.
function Pool:_sample_run(ms)
  sample(self.run_ms, ms)
end

local STATS_FORMAT = "waiting %d, active %d, completed %d, failed %d, children %d/%d, "
  .. "spawned %d, crashed %d, timeouts %d, killed %d, retries %d, cache hits %d, "
  .. "wait p50 %.1f ms p99 %.1f ms, run p50 %.1f ms p99 %.1f ms"

-- p50 and p99 of the recent samples in a ring, 0 without samples.
local function percentiles(ring)
  local sorted = {}
  for i = 1, math.min(ring.n, SAMPLES) do sorted[i] = ring[i] end
  table.sort(sorted)
  local n = #sorted
  if n == 0 then return 0, 0 end
  return sorted[math.ceil(n * 0.5)], sorted[math.ceil(n * 0.99)]
end

local function format_stats(s)
  return STATS_FORMAT:format(s.waiting, s.active, s.completed, s.failed, s.children, s.size,
    s.spawned, s.crashed, s.timeouts, s.killed, s.retries, s.cache_hits, s.wait_p50, s.wait_p99,
    s.run_p50, s.run_p99)
end

-- pool:stats() -> { waiting, active, completed, failed, children, size, spawned,
-- restarts, crashed, timeouts, killed, retries, cache_hits, wait_p50, wait_p99,
-- run_p50, run_p99 (ms, over the last 1024 jobs), workers = { { pid, jobs,
-- state } ... } }
function Pool:stats()
  local c = self.counts
  local wait_p50, wait_p99 = percentiles(self.wait_ms)
  local run_p50, run_p99 = percentiles(self.run_ms)
  local workers = {}
  for w in pairs(self.workers) do
    workers[#workers + 1] = { pid = w.pid, jobs = w.jobs_done, state = w.state }
  end
  return setmetatable({
    waiting = self.source:count() + self.nqueued, -- queued in a child, not started: waiting too
    active = self.nactive, completed = c.completed,
    failed = c.failed, children = self.nworkers, size = self.size,
    spawned = c.spawned, restarts = math.max(0, c.spawned - self.size),
    crashed = c.crashed, timeouts = c.timeouts, killed = c.killed,
    retries = c.retries, cache_hits = c.cache_hits,
    wait_p50 = wait_p50, wait_p99 = wait_p99, run_p50 = run_p50, run_p99 = run_p99,
    workers = workers,
  }, { __tostring = format_stats })
end

return Pool
