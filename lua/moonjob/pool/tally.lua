-- moonjob.pool.tally -- what pool:stats() reports: counters and recent times.
--
-- A part of the pool (see pool/init.lua), pool.tally (the name pool.stats is
-- the public method's).
--
-- Owns: tally.counts (completed, failed, spawned, crashed, timeouts, killed,
-- retries, cache_hits, canceled), bumped by the parts where each thing
-- happens, two rings of recent times (wait: from added, or due, to started;
-- run: started to ended) and tally.run_histogram, every run time since the
-- pool was made (pool:metrics(), moonjob.pool.metrics).
-- Exposes: tally:bump(name), tally:sample_wait(ms), tally:sample_run(ms),
-- tally:report() (pool:stats()).
-- Calls, for report: the pool's source, size and nactive, the dispatch's
-- prefetched count (jobs in a child not started yet wait too), the
-- children (pool.children:count_all(), :snapshot()) and, for a pool on
-- Redis, its owner's counts (pool.owner:stats()).
--
-- Caveat: the percentiles cover the last SAMPLES jobs only, and sorting them
-- costs O(SAMPLES log SAMPLES) per stats() call: fine for a progress line,
-- not for every job.
local Metrics = require "moonjob.pool.metrics"

local Tally = {}
Tally.__index = Tally

local SAMPLES = 1024             -- recent wait and run times kept for percentiles

-- Tally.new(pool) -> the counters of one pool, all 0.
function Tally.new(pool)
  return setmetatable({
    pool = pool,
    counts = { completed = 0, failed = 0, spawned = 0, crashed = 0, timeouts = 0, killed = 0,
      retries = 0, cache_hits = 0, canceled = 0 },
    wait_ms = { n = 0 }, run_ms = { n = 0 },
    run_histogram = Metrics.new_histogram(),
  }, Tally)
end

-- One more of `name` (a key of tally.counts).
function Tally:bump(name)
  local counts = self.counts
  counts[name] = counts[name] + 1
end

local function sample(ring, value)
  ring.n = ring.n + 1
  ring[(ring.n - 1) % SAMPLES + 1] = value
end

-- A job started after waiting `ms` since it was added (or became due).
function Tally:sample_wait(ms)
  sample(self.wait_ms, ms)
end

-- A job's run ended after `ms`.
function Tally:sample_run(ms)
  sample(self.run_ms, ms)
  Metrics.observe(self.run_histogram, ms)
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
-- restarts, crashed, timeouts, killed, retries, cache_hits, canceled, wait_p50, wait_p99,
-- run_p50, run_p99 (ms, over the last 1024 jobs), workers = { { pid, jobs,
-- state } ... }, redis (a pool on Redis: owner:stats()) }
function Tally:report()
  local pool, c = self.pool, self.counts
  local wait_p50, wait_p99 = percentiles(self.wait_ms)
  local run_p50, run_p99 = percentiles(self.run_ms)
  local rows = {} -- (one per child: the public field is named workers)
  for _, child in ipairs(pool.children:snapshot()) do
    rows[#rows + 1] = { pid = child.pid, jobs = child.jobs_done, state = child.state }
  end
  return setmetatable({
    waiting = pool.source:count() + pool.dispatch:prefetched_count(), -- in a child, not started: waiting too
    active = pool.nactive, completed = c.completed,
    failed = c.failed, children = pool.children:count_all(), size = pool.size,
    spawned = c.spawned, restarts = math.max(0, c.spawned - pool.size),
    crashed = c.crashed, timeouts = c.timeouts, killed = c.killed,
    retries = c.retries, cache_hits = c.cache_hits, canceled = c.canceled,
    wait_p50 = wait_p50, wait_p99 = wait_p99, run_p50 = run_p50, run_p99 = run_p99,
    workers = rows,
    redis = pool.owner and pool.owner:stats() or nil, -- a pool on Redis: its remote's counts
  }, { __tostring = format_stats })
end

return Tally
