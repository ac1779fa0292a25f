-- moonjob.pool.metrics -- pool:metrics() and moonjob.metrics(): the pools of
-- this process in Prometheus' text format (written by moonjob.prometheus).
--
-- Per pool, labelled pool="<name>": children (alive, busy, resident
-- memory), jobs waiting and active, the counters of pool:stats() and a
-- histogram of run times. Per process, without labels: the event loop's lag
-- and the parent's resident memory. Every name starts with moonjob_; the
-- list, with meanings, is in docs/reference/lua-api.md (pool:metrics).
--
-- Owns: the open pools (track, untrack: Pool.new and pool:close), their
-- labels, and the lag sampler: one timer per process on the shared loop,
-- started with the first pool and closed with the last, unref'd so that it
-- never keeps a program running. Every LAG_INTERVAL_MS it notes how late it
-- fired (a loop busy with something else fires it late).
-- Exposes: Metrics.new_histogram(), Metrics.observe(h, ms) (the tally
-- records each run time there: pool/tally.lua), Metrics.track(pool),
-- Metrics.untrack(pool), Metrics.pool_text(pool), Metrics.all_families(),
-- Metrics.all_text(),
-- Metrics.LAG_INTERVAL_MS, Metrics.DURATION_BOUNDS, Metrics.sampling().
-- Calls, for a pool's text: pool.children:array(), pool.tally (its counts
-- and run-time histogram).
--
-- Caveats: the lag is seen only at the sampler's ticks (and, when read, as
-- how overdue the next one is): a block shorter than LAG_INTERVAL_MS that
-- ends before the next tick is due goes unseen.
-- Memory is resident set size from /proc/<pid>/statm: the children's sum
-- counts pages they share (the LuaJIT library) once per child; a child whose
-- statm cannot be read (gone meanwhile) is left out.
local core = require "moonjob.core"
local loop = require "moonjob.loop"
local prometheus = require "moonjob.prometheus"
local run_buckets = require "moonjob.run_buckets"

local Metrics = {}

---------------------------------------------------------- run times ---

-- The run-time histogram's bucket bounds, in seconds: moonjob.run_buckets',
-- the buckets of every /metrics (a queue's on the dashboard too).
Metrics.DURATION_BOUNDS = run_buckets.BOUNDS_SECONDS
local NBUCKETS, bucket_of = run_buckets.COUNT, run_buckets.bucket

-- Metrics.new_histogram() -> { counts (one per bucket and one above the
-- last, not cumulative), sum_ms }, all 0.
function Metrics.new_histogram()
  local counts = {}
  for i = 1, NBUCKETS do counts[i] = 0 end
  return { counts = counts, sum_ms = 0 }
end

-- Metrics.observe(h, ms): one run of `ms` milliseconds. For every job: the
-- bucket in O(1) (run_buckets.bucket), nothing allocated.
function Metrics.observe(h, ms)
  local counts, i = h.counts, bucket_of(ms)
  counts[i] = counts[i] + 1
  h.sum_ms = h.sum_ms + ms
end

---------------------------------------------------------- loop lag ---

Metrics.LAG_INTERVAL_MS = 500
local LAG_KEPT = 60 -- the ticks the maximum is taken over (30 s)

local lag = { timer = nil, due = 0, last_ms = 0, n = 0, recent = {} }

local function lag_tick()
  local now = loop.now()
  local late = now - lag.due
  if late < 0 then late = 0 end -- libuv's whole milliseconds may fire it a fraction early
  lag.last_ms = late
  lag.n = lag.n + 1
  lag.recent[(lag.n - 1) % LAG_KEPT + 1] = late
  lag.due = now + Metrics.LAG_INTERVAL_MS
  lag.timer:start(Metrics.LAG_INTERVAL_MS)
end

local function lag_start()
  lag.timer = core.timer(lag_tick)
  lag.due = loop.now() + Metrics.LAG_INTERVAL_MS
  lag.timer:start(Metrics.LAG_INTERVAL_MS)
  lag.timer:unref()
end

local function lag_stop()
  lag.timer:close()
  lag.timer, lag.last_ms, lag.n, lag.recent = nil, 0, 0, {}
end

-- Metrics.sampling() -> whether the lag sampler's timer is open (specs).
function Metrics.sampling()
  return lag.timer ~= nil
end

-- The lag now: the last tick's lateness, or how overdue the next tick is
-- when that is more (a loop not run for a while, read from inside a long
-- callback or from a host loop that has not stepped it).
local function lag_now_ms()
  local overdue = lag.timer and (loop.now() - lag.due) or 0
  return math.max(lag.last_ms, overdue)
end

local function lag_max_ms()
  local max = lag_now_ms()
  for i = 1, math.min(lag.n, LAG_KEPT) do
    if lag.recent[i] > max then max = lag.recent[i] end
  end
  return max
end

------------------------------------------------------- open pools ---

-- The open pools, each with its order of creation; weak, so that a pool
-- dropped without close() does not stay listed.
local open = setmetatable({}, { __mode = "k" })
local next_order = 0

local function base_name(pool)
  if pool.name then return pool.name end
  local file = pool.processor:match("([^/]*)$")
  return (file:gsub("%.lua$", ""))
end

-- A label no other open pool has: the name, or name#2, name#3, ...
local function unique_label(pool)
  local taken = {}
  for _, entry in pairs(open) do taken[entry.label] = true end
  local name = base_name(pool)
  local label, n = name, 1
  while taken[label] do
    n = n + 1
    label = name .. "#" .. n
  end
  return label
end

-- Metrics.track(pool): an open pool (Pool.new); the first starts the lag sampler.
function Metrics.track(pool)
  if not next(open) and not lag.timer then lag_start() end
  next_order = next_order + 1
  open[pool] = { order = next_order, label = unique_label(pool) }
end

-- Metrics.untrack(pool): a closed pool; with the last, the sampler stops.
function Metrics.untrack(pool)
  open[pool] = nil
  if not next(open) and lag.timer then lag_stop() end
end

----------------------------------------------------------- memory ---

local ffi = require "ffi"
-- (a name of our own: another module may declare getpagesize too; pcall: this
-- module loaded twice declares it twice)
pcall(ffi.cdef, [[ int moonjob_metrics_getpagesize(void) __asm__("getpagesize"); ]])
local PAGE_SIZE = ffi.C.moonjob_metrics_getpagesize()

-- Resident bytes of a process (pid, or "self"), or nil when unreadable.
local function resident_bytes(pid)
  local f = io.open("/proc/" .. pid .. "/statm", "r")
  if not f then return nil end
  local text = f:read("*l")
  f:close()
  local pages = text and tonumber(text:match("^%d+%s+(%d+)"))
  return pages and pages * PAGE_SIZE
end

local function children_resident_bytes(pool)
  local sum = 0
  for _, child in ipairs(pool.children:array()) do
    local bytes = child.pid and resident_bytes(child.pid)
    if bytes then sum = sum + bytes end
  end
  return sum
end

local function busy_children(pool)
  local n = 0
  for _, child in ipairs(pool.children:array()) do
    if child.state == "busy" then n = n + 1 end
  end
  return n
end

------------------------------------------------------------ families ---

local function family(name, kind, help, samples)
  return { name = "moonjob_" .. name, type = kind, help = help, samples = samples }
end

-- The process's families: the loop's lag, the parent's memory.
local function process_families()
  return {
    family("event_loop_lag_seconds", "gauge",
      "How late the event loop's lag timer fired last (every 0.5 s), or is overdue now.",
      { { value = lag_now_ms() / 1000 } }),
    family("event_loop_lag_max_seconds", "gauge",
      "The largest event loop lag seen over the last 30 s.", { { value = lag_max_ms() / 1000 } }),
    family("process_resident_bytes", "gauge",
      "Resident memory of this (the parent) process.", { { value = resident_bytes("self") or 0 } }),
  }
end

-- The gauges and counters of one pool, in the order they are written.
local POOL_GAUGES = {
  { "pool_size", "The pool's size option: the children it keeps.", function(_, p) return p.size end },
  { "pool_children", "Child processes of the pool now.", function(s) return s.children end },
  { "pool_children_busy", "Children running a job now.", function(_, p) return busy_children(p) end },
  { "pool_children_resident_bytes", "Resident memory of the pool's children, summed.",
    function(_, p) return children_resident_bytes(p) end },
  { "jobs_waiting", "Jobs waiting for a child (sent ahead to a child but not started included).",
    function(s) return s.waiting end },
  { "jobs_active", "Jobs running now.", function(s) return s.active end },
}
local POOL_COUNTERS = {
  { "jobs_completed_total", "Jobs completed.", "completed" },
  { "jobs_failed_total", "Jobs failed for good (timed out, crashed or canceled included).", "failed" },
  { "jobs_retried_total", "Failed attempts that were tried again.", "retries" },
  { "jobs_timed_out_total", "Attempts that ran past their timeout.", "timeouts" },
  { "jobs_canceled_total", "Jobs that ended canceled.", "canceled" },
  { "jobs_cache_hits_total", "Jobs answered from the result cache.", "cache_hits" },
  { "pool_children_spawned_total", "Children started.", "spawned" },
  { "pool_children_restarts_total", "Children started beyond the pool's size (replacements).", "restarts" },
  { "pool_children_crashed_total", "Children that ended unexpectedly.", "crashed" },
  { "pool_children_killed_total", "Children killed at a job's hard deadline.", "killed" },
}

-- One pool's families, labelled pool=label.
local function pool_families(pool, label)
  local s, labels = pool:stats(), { pool = label }
  local families = {}
  for _, g in ipairs(POOL_GAUGES) do
    families[#families + 1] = family(g[1], "gauge", g[2], { { labels = labels, value = g[3](s, pool) } })
  end
  for _, c in ipairs(POOL_COUNTERS) do
    families[#families + 1] = family(c[1], "counter", c[2], { { labels = labels, value = s[c[3]] } })
  end
  local h = pool.tally.run_histogram
  families[#families + 1] = family("job_duration_seconds", "histogram",
    "Run time of the jobs that ended in the pool (on Redis: of each attempt).",
    { prometheus.histogram(labels, Metrics.DURATION_BOUNDS, h.counts, h.sum_ms / 1000) })
  return families
end

local function label_of(pool)
  local entry = open[pool]
  return entry and entry.label or base_name(pool)
end

-- Metrics.pool_text(pool) -> the exposition text of one pool and the process.
function Metrics.pool_text(pool)
  local families = process_families()
  for _, f in ipairs(pool_families(pool, label_of(pool))) do families[#families + 1] = f end
  return prometheus.render(families)
end

-- Metrics.all_families() -> the families of the process and of every open
-- pool (in the order they were made), for moonjob.prometheus.render: a
-- program adds its own families to the list and renders them all at once.
function Metrics.all_families()
  local pools = {}
  for pool in pairs(open) do pools[#pools + 1] = pool end
  table.sort(pools, function(a, b) return open[a].order < open[b].order end)
  local families = process_families()
  for _, pool in ipairs(pools) do
    for _, f in ipairs(pool_families(pool, open[pool].label)) do families[#families + 1] = f end
  end
  return families
end

-- Metrics.all_text() -> the text of every open pool and the process, each
-- family once (render writes a family given by several pools once).
function Metrics.all_text()
  return prometheus.render(Metrics.all_families())
end

return Metrics
