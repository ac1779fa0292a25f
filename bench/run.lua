-- bench/run.lua -- `make bench`: moonjob's figures, side by side with floors.
--
-- 1. Throughput: for 1 and 2 children, no-op jobs per second through a pool
--    (add N jobs, drain), the parent's CPU per job (user + system of this
--    process over the round, divided by the jobs), then the floor program
--    (bench/floor.c: the same frame-out, frame-back exchange over
--    socketpairs, in plain C with epoll) with 1 frame in flight per child and
--    with 8 (what pipelining allows), and the pool's ratio to the latter.
--    Each figure is the best of a few rounds, the pool and the floor taking
--    turns, so a passing hiccup on a shared machine does not decide it. Then the loop lag of a 1 ms timer while the
--    pool drains tiny jobs at that speed.
-- 2. Hard kills: 100 jobs spinning in JIT-compiled code; the time from each
--    job's hard deadline to its child being reaped (median, max).
-- 3. Loop lag: a 1 ms timer's lateness (p99, max) while jobs time out and
--    children are killed and replaced as fast as the pool can, against the
--    same timer on an idle loop.
-- 4. Large payloads: the same timer's lateness while ten 60 MB results come
--    back from 2 children, and while ten 60 MB job data go out to them.
-- 5. A million waiting jobs: time to add 1,000,000 no-op jobs, the parent's
--    Lua memory per waiting job (payload included, and without it), and the
--    time to drain them with 2 children.
--
-- BENCH_ONLY=throughput runs section 1 alone; BENCH_ONLY=waiting runs
-- section 5 alone (quick rounds while working on the pool's per-job cost).
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
package.cpath = "build/?.so;" .. package.cpath

local moonjob = require "moonjob"
local core = require "moonjob.core"

local JOBS = tonumber(os.getenv("BENCH_JOBS")) or 100000
local ROUNDS = tonumber(os.getenv("BENCH_ROUNDS")) or 3
local ONLY = os.getenv("BENCH_ONLY")

local ffi = require "ffi"
ffi.cdef [[
struct bench_run_timeval { long tv_sec; long tv_usec; };
struct bench_run_rusage { struct bench_run_timeval utime, stime; long rest[14]; };
int getrusage(int who, struct bench_run_rusage *usage);
]]

-- This process's CPU time (user + system), in microseconds.
local function cpu_us()
  local u = ffi.new("struct bench_run_rusage")
  ffi.C.getrusage(0, u)
  return (tonumber(u.utime.tv_sec) + tonumber(u.stime.tv_sec)) * 1e6
    + tonumber(u.utime.tv_usec) + tonumber(u.stime.tv_usec)
end

-- One round of JOBS no-op jobs through `pool`: jobs/s and the parent's CPU
-- per job.
local function pool_round(pool)
  local t0, c0 = core.hrtime(), cpu_us()
  for i = 1, JOBS do pool:add(i) end
  pool:drain()
  return JOBS / ((core.hrtime() - t0) / 1e9), (cpu_us() - c0) / JOBS
end

-- One run of the floor program: jobs/s.
local function floor_round(size, inflight)
  local p = assert(io.popen(("build/bench-floor %d %d %d"):format(size, JOBS, inflight)))
  local out = p:read("*a")
  p:close()
  local rate = tonumber(out:match("jobs_per_second (%d+)"))
  assert(rate, "the floor program printed: " .. out)
  return rate
end

-- For `size` children: the pool's best jobs/s over the rounds and its CPU
-- per job in that round, and the floor's best with 1 and 8 frames in flight
-- per child. The three take turns in every round, so that a machine whose
-- speed drifts (a shared VM) slows them alike.
local function throughput(size)
  local pool = assert(moonjob.pool("bench/noop.lua", { size = size, echo = false }))
  pool:map({ 1, 2, 3, 4 }) -- children started and warm
  local best, cpu, floor1, floor8 = 0, nil, 0, 0
  for _ = 1, ROUNDS do
    local rate, per_job = pool_round(pool)
    if rate > best then best, cpu = rate, per_job end
    floor1 = math.max(floor1, floor_round(size, 1))
    floor8 = math.max(floor8, floor_round(size, 8))
  end
  assert(pool:stats().failed == 0, "no-op jobs failed")
  pool:close()
  return best, cpu, floor1, floor8
end

local function percentile(sorted, p)
  return sorted[math.max(1, math.ceil(#sorted * p))]
end

-- Hard deadline -> child reaped, over `n` jobs that only a kill can end.
local function kill_latency(n)
  local timeout, kill_after = 0.02, 0.02
  local pool = assert(moonjob.pool("bench/spin.lua", { size = 2, echo = false,
    timeout = timeout, kill_after = kill_after }))
  local deadline_of, latencies = {}, {}
  pool:on("active", function(job) deadline_of[job.pid] = job.started + (timeout + kill_after) * 1000 end)
  pool:on("exit", function(pid)
    if deadline_of[pid] then latencies[#latencies + 1] = core.hrtime() / 1e6 - deadline_of[pid] end
  end)
  for i = 1, n do pool:add(i) end
  pool:drain()
  local t0 = core.hrtime()
  while #latencies < n and core.hrtime() - t0 < 5e9 do core.run("once") end
  pool:close()
  table.sort(latencies)
  return percentile(latencies, 0.5), latencies[#latencies], #latencies
end

-- Lateness of a 1 ms repeating timer over `seconds`, with `load` running
-- (seconds = nil: until the load's stop function, which waits for it, returns).
local function loop_lag(seconds, load)
  local lags, last = {}, core.hrtime()
  local ticker = core.timer(function()
    local now = core.hrtime()
    lags[#lags + 1] = math.max(0, (now - last) / 1e6 - 1)
    last = now
  end)
  local stop = false
  local stopper = core.timer(function() stop = true end)
  local pool, stop_load = nil, nil
  if load then pool, stop_load = load() end
  last = core.hrtime()
  ticker:start(1, 1)
  if seconds then
    stopper:start(seconds * 1000)
    while not stop do core.run("once") end
  else -- until the load is done
    stop_load()
  end
  ticker:close()
  stopper:close()
  local churn = pool and pool:stats()
  if pool then
    stop_load()
    pool:close({ force = true })
  end
  table.sort(lags)
  return percentile(lags, 0.99), lags[#lags], churn
end

-- Jobs that time out at once and get killed, back to back, on `size` children.
local function timeout_storm(size)
  local pool = assert(moonjob.pool("bench/spin.lua", { size = size, echo = false,
    timeout = 0.001, kill_after = 0.001 }))
  local stopped = false
  local function refill() if not stopped then pool:add(0) end end
  pool:on("failed", refill)
  for _ = 1, 4 do refill() end
  return pool, function() stopped = true end
end

print(("moonjob bench: %d no-op jobs per round, best of %d rounds, %d logical CPUs")
  :format(JOBS, ROUNDS, core.cpu_count()))
print(("%-9s %12s %12s %12s %12s %9s"):format("children", "pool jobs/s", "parent us/job",
  "floor 1/child", "floor 8/child", "pool/fl8"))
for _, size in ipairs(ONLY == "waiting" and {} or { 1, 2 }) do
  local pool, cpu, floor1, floor8 = throughput(size)
  print(("%-9d %12.0f %12.2f %12.0f %12.0f %9.2f"):format(size, pool, cpu, floor1, floor8, pool / floor8))
end
if ONLY == "throughput" then return end

-- Adds `n` no-op jobs, measures the memory they hold while waiting, drains them.
local function million(n)
  local buffer = require "string.buffer"
  local pool = assert(moonjob.pool("bench/noop.lua", { size = 2, echo = false }))
  pool:map({ 1, 2 })
  collectgarbage()
  collectgarbage()
  local before = collectgarbage("count")
  local t0 = core.hrtime()
  local payload = 0
  for i = 1, n do
    pool:add(i)
    payload = payload + #buffer.encode(i)
  end
  local add_s = (core.hrtime() - t0) / 1e9
  collectgarbage()
  collectgarbage()
  local per_job = (collectgarbage("count") - before) * 1024 / n
  t0 = core.hrtime()
  pool:drain()
  local drain_s = (core.hrtime() - t0) / 1e9
  pool:close()
  return add_s, per_job, payload / n, drain_s
end

local MILLION = tonumber(os.getenv("BENCH_WAITING")) or 1000000
local function report_million()
  local add_s, per_job, payload, drain_s = million(MILLION)
  print(("\n%d waiting no-op jobs: added in %.2f s, %.0f bytes each in the parent (%.0f without the "
    .. "%.0f-byte payload string's bytes), drained by 2 children in %.1f s")
    :format(MILLION, add_s, per_job, per_job - payload, payload, drain_s))
end
if ONLY == "waiting" then return report_million() end

local median, max, n = kill_latency(100)
print(("\nhard deadline -> child reaped, %d JIT-loop jobs: median %.2f ms, max %.2f ms")
  :format(n, median, max))

-- A pool of 2 children draining `n` no-op jobs added before the timer starts.
local function tiny_jobs(n)
  return function()
    local pool = assert(moonjob.pool("bench/noop.lua", { size = 2, echo = false }))
    pool:map({ 1, 2, 3, 4 })
    for i = 1, n do pool:add(i) end
    return pool, function() pool:drain() end
  end
end

local idle_p99, idle_max = loop_lag(2)
print(("loop lag of a 1 ms timer, idle loop:          p99 %.3f ms, max %.3f ms"):format(idle_p99, idle_max))
local tiny_t0 = core.hrtime()
local tiny_p99, tiny_max = loop_lag(nil, tiny_jobs(JOBS * 2))
print(("loop lag, 2 children draining %d no-op jobs at full speed: p99 %.3f ms, max %.3f ms (%.0f jobs/s)")
  :format(JOBS * 2, tiny_p99, tiny_max, JOBS * 2 / ((core.hrtime() - tiny_t0) / 1e9)))
for _, size in ipairs({ 1, 2 }) do
  local p99, lag_max, churn = loop_lag(3, function() return timeout_storm(size) end)
  print(("loop lag, %d spinning child(ren) killed/replaced: p99 %.3f ms, max %.3f ms (%d kills in 3 s)")
    :format(size, p99, lag_max, churn.killed))
end

-- Ten jobs moving `size` bytes each way `direction` ("results": the children
-- return them; "data": the parent sends them), added before the timer starts
-- so the caller's own encoding is not counted.
local function big_payloads(direction, size)
  return function()
    local pool = assert(moonjob.pool("bench/big.lua", { size = 2, echo = false,
      max_payload = size + 4096 }))
    pool:map({ 1, 2 }) -- children started and warm
    -- a completed listener gets the decoded result: decoding runs on the loop
    if direction == "results, completed listener" then pool:on("completed", function() end) end
    local data = direction == "data" and string.rep("y", size) or size
    for _ = 1, 10 do pool:add(data) end
    return pool, function() pool:drain() end
  end
end

local BIG = 60 * 1024 * 1024
for _, direction in ipairs({ "results", "data", "results, completed listener" }) do
  local t0 = core.hrtime()
  local p99, lag_max, s = loop_lag(nil, big_payloads(direction, BIG))
  print(("loop lag, ten 60 MB %-7s in flight (2 children): p99 %.3f ms, max %.3f ms, %.1f s, %d failed")
    :format(direction, p99, lag_max, (core.hrtime() - t0) / 1e9, s.failed))
end

report_million()
