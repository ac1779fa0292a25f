-- bench/redis.lua -- `make bench`, part 2: the durable queue on Redis.
--
-- A redis-server of its own (loopback, temporary directory, AOF on with
-- appendfsync everysec, as in production), then:
-- 1. Floor: a bare FCALL loop against that server (redis-benchmark, one
--    connection per worker process, no pipelining), moonjob_counts.
-- 2. No-op jobs per second through the queue: N jobs added first (moonjob
--    add), then 1 or 2 `moonjob worker` processes (-j 2 each) drain them;
--    timed from the workers' start to the last completion. Redis commands
--    per job from INFO commandstats.
-- 3. Recovery: a worker (lease 1 s) holding 4 running jobs is SIGKILLed; the
--    time until all 4 have started again on another worker.
-- 4. Loop lag: a 1 ms timer's lateness (p99, max) in a process whose pool
--    drains jobs from Redis, next to the same pool draining local jobs.
-- 5. The cost of limits: run 2 again with a rate and with a concurrency
--    limit set so high that they never bind, in turns with the plain queue
--    (3 rounds, medians): what counting costs per job.
-- 6. Redis memory per schedule (used_memory before and after 10,000).
-- 7. The cost of groups: run 2 again with the jobs in 10 groups (added
--    group after group: the case round-robin is for), and with a group
--    concurrency or a group rate that never binds, in turns with the plain
--    queue.
-- 8. Redis memory per group: 1,000 groups of 10 waiting jobs each, next to
--    10,000 waiting jobs of no group.
-- BENCH_REDIS_SECTIONS="5,7" runs only those sections (1-4 go together:
-- "2" runs them); BENCH_REDIS_WORKER_FLAGS replaces the queue runs' worker
-- flags ("-j 2 --prefetch 32"; "-j 2" for the defaults).
-- Each process is ended by its pid.
package.path = "lua/?.lua;lua/?/init.lua;bench/?.lua;spec/support/?.lua;" .. package.path
package.cpath = "build/?.so;" .. package.cpath

local moonjob = require "moonjob"
local core = require "moonjob.core"
local loop = require "moonjob.loop"
local redis_server = require "redis_server"
local helpers = require "helpers" -- loaded by redis_server already: its sleep
local library = require "moonjob.redis.library"

local JOBS = tonumber(os.getenv("BENCH_REDIS_JOBS")) or 60000
local WORKER_FLAGS = os.getenv("BENCH_REDIS_WORKER_FLAGS") or "-j 2 --prefetch 32"
local SECTIONS = os.getenv("BENCH_REDIS_SECTIONS")

-- Whether section n runs (all of them unless BENCH_REDIS_SECTIONS names some).
local function runs(n)
  if not SECTIONS then return true end
  for s in SECTIONS:gmatch("%d+") do
    if tonumber(s) == n or (n == 1 and tonumber(s) <= 4) then return true end
  end
  return false
end
local common = require "common"
local LUAJIT, sh_first_line, wait_for = common.LUAJIT, common.first_line, common.wait_for

-- Commands the server ran (those inside functions included), and the calls
-- clients made (every command but the ones functions ran).
local function total_calls(server)
  local all, fcall, inside = 0, 0, 0
  local stats = server:cli("INFO", "commandstats")
  for name, calls in stats:gmatch("cmdstat_([%w|_]+):calls=(%d+)") do
    all = all + tonumber(calls)
    if name == "fcall" then fcall = fcall + tonumber(calls) end
  end
  return all, fcall
end

local server = redis_server.start()
local q, q_err = moonjob.queue(server.url, "bench")
if not q then server:stop() error(q_err) end

-- 1. the floor
local function floor_rate(clients)
  local out = sh_first_line(("redis-benchmark -p %d -c %d -n 100000 -q FCALL moonjob_counts 1 'mj:{bench}:' 2>/dev/null | tr '\\r' '\\n' | grep 'requests per second' | tail -1")
    :format(server.port, clients))
  return tonumber(out and out:match("([%d.]+) requests per second")) or 0
end

-- A `moonjob worker` process on the queue running `processor` with `args`; its pid.
local function start_worker(args, processor) return common.start_worker(server.url, "bench", args, processor) end
local stop = common.stop

-- n jobs added with moonjob add; groups: in that many groups, one group's
-- jobs after the other's.
local function add_jobs(n, groups)
  for g = 1, groups or 1 do
    local path = os.tmpname()
    local f = assert(io.open(path, "w"))
    for i = 1, math.floor(n / (groups or 1)) do f:write('{"n":', i, '}\n') end
    f:close()
    local group = groups and (" --group g" .. g) or ""
    assert(os.execute(("%s scripts/moonjob add --redis %s --queue bench%s %s >/dev/null")
      :format(LUAJIT, server.url, group, path)) == 0)
    os.remove(path)
  end
end

-- 2. throughput with `workers` processes of 2 children each
local function queue_rate(workers, groups)
  local before = q:counts().completed_ever -- every job ever completed
  add_jobs(JOBS, groups)
  local calls0, fcalls0 = total_calls(server)
  local t0 = loop.now()
  local pids = {}
  for i = 1, workers do pids[i] = start_worker(WORKER_FLAGS .. " --keep 1000000") end
  local ok = wait_for(function()
    local c = q:counts()
    return c and c.completed_ever >= before + JOBS
  end, 300)
  local seconds = (loop.now() - t0) / 1000
  local calls, fcalls = total_calls(server)
  for _, pid in ipairs(pids) do stop(pid) end
  assert(ok, "the jobs did not finish")
  return JOBS / seconds, (calls - calls0) / JOBS, (fcalls - fcalls0) / JOBS
end

-- The measurements listed at the top. The server and the workers are ended
-- by their pid however they end.
local function measure()
  print(("\nRedis queue: %s %s, AOF everysec, %d no-op jobs per run"):format(redis_server.SERVER,
    sh_first_line(redis_server.SERVER .. " --version | grep -o 'v=[0-9.]*'") or "?", JOBS))
  print(("%-20s %13s %14s %7s %10s %14s"):format("worker processes", "queue jobs/s", "FCALL floor/s", "ratio",
    "FCALL/job", "commands/job"))
  for _, workers in ipairs({ 1, 2 }) do
    local floor = floor_rate(workers)
    local rate, per_job, fcall_per_job = queue_rate(workers)
    print(("%-20s %13.0f %14.0f %7.2f %10.2f %14.2f"):format(workers .. " (2 children each)", rate, floor,
      rate / floor, fcall_per_job, per_job))
  end
  print("(commands/job: every command Redis ran, those inside the functions included)")

  -- 3. recovery of a killed worker's jobs
  do
    q.client:call_wait({ "FLUSHDB" })
    q.client:call_wait({ "FUNCTION", "LOAD", "REPLACE", library.text() })
    local log = os.tmpname()
    local spinning = "-j 4 --prefetch 0 --lease 1"
    local pid = start_worker(spinning, "bench/spin_log.lua")
    for _ = 1, 4 do assert(q:add({ log = log, seconds = 3 }, { attempts = 2 })) end
    local function starts()
      local n = 0
      local f = io.open(log)
      if f then for _ in f:lines() do n = n + 1 end f:close() end
      return n
    end
    assert(wait_for(function() return starts() == 4 end, 30), "the jobs did not start")
    local pid2 = start_worker(spinning, "bench/spin_log.lua")
    helpers.sleep(0.5) -- the second worker is up and polling
    local t0 = loop.now()
    stop(pid)
    local ok = wait_for(function() return starts() == 8 end, 30)
    local ms = loop.now() - t0
    stop(pid2)
    os.remove(log)
    print(("\nkilled worker (lease 1 s, 4 running jobs): all 4 running again on another worker %.2f s later%s")
      :format(ms / 1000, ok and "" or " (NOT ALL)"))
  end

  -- 4. loop lag: a 1 ms timer's lateness in a process whose pool drains jobs
  -- from Redis, next to the same pool draining the same jobs added locally.
  local function lag_while(drain)
    local lags, last = {}, core.hrtime()
    local ticker = core.timer(function()
      local now = core.hrtime()
      lags[#lags + 1] = math.max(0, (now - last) / 1e6 - 1)
      last = now
    end)
    last = core.hrtime()
    ticker:start(1, 1)
    drain()
    ticker:close()
    table.sort(lags)
    return lags[math.max(1, math.floor(#lags * 0.99))], lags[#lags]
  end

  do
    local N = 20000
    local loc = assert(moonjob.pool("bench/noop.lua", { size = 2, echo = false, codec = "json" }))
    loc:map({ "1", "2" })
    local lp99, lmax = lag_while(function()
      for i = 1, N do loc:add(tostring(i)) end
      loc:drain()
    end)
    loc:close()
    q.client:call_wait({ "FLUSHDB" })
    add_jobs(N)
    local rem = assert(moonjob.pool("bench/noop.lua", { size = 2, echo = false, redis = server.url,
      queue = "bench", prefetch = 32, keep = 1000000 }))
    local rp99, rmax = lag_while(function()
      assert(wait_for(function() return rem.tally.counts.completed >= N end, 120))
    end)
    rem:close()
    print(("\nloop lag of a 1 ms timer while 2 children run %d no-op jobs: local p99 %.3f ms, max %.3f ms; "
      .. "from Redis p99 %.3f ms, max %.3f ms"):format(N, lp99, lmax, rp99, rmax))
  end
end

local function median(t)
  table.sort(t)
  return t[math.floor((#t + 1) / 2)]
end

local function flush()
  q.client:call_wait({ "FLUSHDB" })
  q.client:call_wait({ "FUNCTION", "LOAD", "REPLACE", library.text() })
end

-- 5. limits that never bind, next to none
local LIMITED = {
  { name = "plain" },
  { name = "rate 10^6/s", rate = { max = 1000000, per = 1 } },
  { name = "concurrency 1000", concurrency = 1000 },
}

-- The queue run of section 2 (1 worker) for each of variants in turns, 3
-- rounds, after set_up(v) on an empty server; medians printed under title,
-- next to the first variant's.
local function in_turns(title, variants, set_up)
  local rates = {}
  for round = 1, 3 do
    for _, v in ipairs(variants) do
      helpers.sleep(0.1) -- a breath between runs (the spec watchdog sees the bench alive)
      flush()
      set_up(v)
      rates[v.name] = rates[v.name] or {}
      rates[v.name][round] = queue_rate(1, v.groups)
    end
  end
  local first = median(rates[variants[1].name])
  print(("\n%s, 1 worker (%s), %d no-op jobs, median of 3 in turns:"):format(title, WORKER_FLAGS, JOBS))
  for _, v in ipairs(variants) do
    local r = median(rates[v.name])
    print(("  %-20s %8.0f jobs/s  %5.2f of %s"):format(v.name, r, r / first, variants[1].name))
  end
end

local function limits_cost()
  in_turns("limits that never bind", LIMITED, function(v)
    assert(q:set_rate(v.rate))
    assert(q:set_concurrency(v.concurrency))
  end)
end

-- 6. memory per schedule
local function schedule_memory()
  flush()
  local function used() return tonumber(server:cli("INFO", "memory"):match("used_memory:(%d+)")) end
  local n = 10000
  local before = used()
  for i = 1, n do assert(q:schedule("s" .. i, { cron = "*/5 * * * *" }, { report = i })) end
  local after = used()
  print(("\nRedis memory per schedule (cron, small data): %.0f bytes (%d schedules)"):format((after - before) / n, n))
end

-- 7. groups, next to none
local GROUPED = {
  { name = "plain" },
  { name = "10 groups", groups = 10 },
  { name = "10 groups, cap 1000", groups = 10, group_concurrency = 1000 },
  { name = "10 groups, 10^6/s each", groups = 10, group_rate = { max = 1000000, per = 1 } },
}

local function groups_cost()
  in_turns("groups", GROUPED, function(v)
    assert(q:set_group_concurrency(v.group_concurrency))
    assert(q:set_group_rate(v.group_rate))
  end)
end

-- 8. memory per group
local function group_memory()
  local function used() return tonumber(server:cli("INFO", "memory"):match("used_memory:(%d+)")) end
  local n, groups = 10000, 1000
  local grew = {}
  for _, grouped in ipairs({ false, true }) do
    flush()
    local before = used()
    for i = 1, n do
      assert(q:add({ n = i }, { id = "j" .. i, group = grouped and ("tenant-" .. i % groups) or nil }))
    end
    grew[grouped] = used() - before
  end
  print(("\nRedis memory per group (10 waiting jobs each; their group fields and index entries counted): "
    .. "%.0f bytes (%d groups, %d jobs)"):format((grew[true] - grew[false]) / groups, groups, n))
end

local ok, err = xpcall(function()
  if runs(1) then measure() end
  if runs(5) then limits_cost() end
  if runs(6) then schedule_memory() end
  if runs(7) then groups_cost() end
  if runs(8) then group_memory() end
end, debug.traceback)
common.stop_all()
pcall(q.close, q)
server:stop()
if not ok then io.stderr:write(err, "\n") os.exit(1) end
