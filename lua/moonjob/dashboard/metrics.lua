-- moonjob.dashboard.metrics -- the dashboard's /metrics: every queue of the
-- server in Prometheus' text format (moonjob.prometheus writes it).
--
--   moonjob_queue_jobs{queue,state}              gauge: jobs by state now
--                                                (waiting, delayed, active, held)
--   moonjob_queue_paused{queue}                  gauge: 1 while paused
--   moonjob_queue_completed_total{queue}         counter: jobs that ever completed
--   moonjob_queue_failed_total{queue}            counter: jobs that ever failed for good
--   moonjob_queue_job_duration_seconds{queue}    histogram: run times, since ever
--
-- Read from Redis at each scrape: per queue one moonjob_counts and one
-- moonjob_metrics (0 minutes: the totals only), never a walk over jobs, so
-- it answers as fast with 100,000 jobs as with 10. The counters are the
-- queue's own totals (they survive worker restarts); obliterating a queue
-- resets them, which Prometheus reads as a counter reset.
local prometheus = require "moonjob.prometheus"
local producer = require "moonjob.redis.producer"

local M = {}

local function family(name, type, help)
  return { name = name, type = type, help = help, samples = {} }
end

-- The queues' families, or nil and why.
function M.render(server)
  local list, err = producer.list_queues(server.client)
  if not list then return nil, err end
  local jobs = family("moonjob_queue_jobs", "gauge", "Jobs in the queue by state (held: active but not started).")
  local paused = family("moonjob_queue_paused", "gauge", "1 while the queue is paused.")
  local completed = family("moonjob_queue_completed_total", "counter", "Jobs of the queue that ever completed.")
  local failed = family("moonjob_queue_failed_total", "counter", "Jobs of the queue that ever failed for good.")
  local runs = family("moonjob_queue_job_duration_seconds", "histogram",
    "Run time of the queue's jobs (from start to end, on the Redis server's clock).")
  for _, c in ipairs(list) do
    local q = c.name
    for _, state in ipairs({ "waiting", "delayed", "active", "held" }) do
      jobs.samples[#jobs.samples + 1] = { labels = { queue = q, state = state }, value = c[state] }
    end
    paused.samples[#paused.samples + 1] = { labels = { queue = q }, value = c.paused and 1 or 0 }
    completed.samples[#completed.samples + 1] = { labels = { queue = q }, value = c.completed }
    failed.samples[#failed.samples + 1] = { labels = { queue = q }, value = c.failed }
    local m, merr = producer.attach(server.client, q):metrics({ minutes = 1 })
    if not m then return nil, merr end
    local bounds = {}
    for i, ms in ipairs(m.buckets) do bounds[i] = ms / 1000 end
    local t = m.total
    runs.samples[#runs.samples + 1] = prometheus.histogram({ queue = q }, bounds, t.counts,
      (t.mean_ms or 0) * t.runs / 1000)
  end
  return prometheus.render({ jobs, paused, completed, failed, runs })
end

return M
