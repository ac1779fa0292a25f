-- moonjob.dashboard.metrics -- the dashboard's /metrics: every queue of the
-- server in Prometheus' text format (moonjob.prometheus writes it).
--
--   moonjob_queue_jobs{queue,state}              gauge: jobs by state now (waiting,
--                                                delayed, running, held, lapsed:
--                                                their sum is active; waiting-children: a
--                                                flow's parents waiting for their
--                                                children; completed, failed: the
--                                                jobs kept in those states now)
--   moonjob_queue_paused{queue}                  gauge: 1 while paused
--   moonjob_queue_workers{queue}                 gauge: live workers (heartbeats)
--   moonjob_queue_completed_total{queue}         counter: jobs that ever completed
--   moonjob_queue_failed_total{queue}            counter: jobs that ever failed for good
--                                                (a retry does not take one back)
--   moonjob_queue_job_duration_seconds{queue}    histogram: run times, since ever, in
--                                                the buckets every /metrics of moonjob
--                                                has (moonjob.run_buckets)
--
-- Read from Redis at each scrape: per queue one moonjob_counts and one
-- moonjob_metrics (1 minute, and the totals), never a walk over jobs, so
-- it answers as fast with 100,000 jobs as with 10. The counters are the
-- queue's own totals (they survive worker restarts); obliterating a queue
-- resets them, which Prometheus reads as a counter reset.
local prometheus = require "moonjob.prometheus"
local producer = require "moonjob.redis.producer"

local M = {}

local function family(name, type, help)
  return { name = name, type = type, help = help, samples = {} }
end

-- One queue's samples added to the families f. -> true | nil, err.
local function add_queue(f, server, c)
  local q = c.name
  local m, err = producer.attach(server.client, q):metrics({ minutes = 1 })
  if not m then return nil, err end
  local values = { waiting = c.waiting, delayed = c.delayed, running = c.running, held = c.held,
    lapsed = c.lapsed, ["waiting-children"] = c.waiting_children or 0, completed = c.completed,
    failed = c.failed }
  for _, state in ipairs({ "waiting", "delayed", "running", "held", "lapsed", "waiting-children", "completed",
    "failed" }) do
    f.jobs.samples[#f.jobs.samples + 1] = { labels = { queue = q, state = state }, value = values[state] }
  end
  f.paused.samples[#f.paused.samples + 1] = { labels = { queue = q }, value = c.paused and 1 or 0 }
  f.workers.samples[#f.workers.samples + 1] = { labels = { queue = q }, value = c.workers }
  f.completed.samples[#f.completed.samples + 1] = { labels = { queue = q }, value = c.completed_ever }
  f.failed.samples[#f.failed.samples + 1] = { labels = { queue = q }, value = c.failed_ever }
  -- (the buckets of moonjob.run_buckets, as a pool's /metrics writes them)
  local bounds, counts, t = {}, {}, m.total
  for i, ms in ipairs(m.buckets) do bounds[i] = ms / 1000 end
  for i = 1, #bounds + 1 do counts[i] = t.counts[i] or 0 end
  f.runs.samples[#f.runs.samples + 1] = prometheus.histogram({ queue = q }, bounds, counts,
    t.sum_ms / 1000)
  return true
end

-- A comment line saying queue `name` was left out, and why (one line, no
-- address of a node).
local function left_out(server, name, err)
  local why = server.client:without_address(tostring(type(err) == "table" and err.message or err))
  return ("# queue %s left out: its counts could not be read: %s\n"):format(name:gsub("[\r\n]", " "),
    (why:gsub("[\r\n]+", " ")))
end

-- The text of every queue's families, or nil and why (the queues' list
-- cannot be read). A queue whose counts or metrics cannot be read (a key
-- another client spoiled; its shard down) is left out, with a comment line
-- saying so: the other queues are still scraped.
function M.render(server)
  local list, err = producer.list_queues(server.client)
  if not list then return nil, err end
  local f = {
    jobs = family("moonjob_queue_jobs", "gauge",
      "Jobs in the queue by state now (running: a worker's child runs it; held: fetched, not yet"
      .. " run; waiting-children: a flow's parents waiting for their children; completed, failed: kept)."),
    paused = family("moonjob_queue_paused", "gauge", "1 while the queue is paused."),
    workers = family("moonjob_queue_workers", "gauge", "Workers whose heartbeat has not lapsed."),
    completed = family("moonjob_queue_completed_total", "counter", "Jobs of the queue that ever completed."),
    failed = family("moonjob_queue_failed_total", "counter", "Jobs of the queue that ever failed for good."),
    runs = family("moonjob_queue_job_duration_seconds", "histogram",
      "Run time of the queue's jobs, as their workers measured it."),
  }
  local skipped = {}
  for _, c in ipairs(list) do
    local ok, aerr = not c.error, c.error
    if ok then ok, aerr = add_queue(f, server, c) end
    if not ok then skipped[#skipped + 1] = left_out(server, c.name, aerr) end
  end
  return prometheus.render({ f.jobs, f.paused, f.workers, f.completed, f.failed, f.runs }) .. table.concat(skipped)
end

return M
