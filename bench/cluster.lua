-- bench/cluster.lua -- `make bench`: queues spread over a Redis Cluster.
--
-- 1. Jobs/s: 6 queues, JOBS no-op jobs in all (`moonjob add` per queue),
--    drained by WORKERS `moonjob worker --queue q1,...,q6` processes
--    (FLAGS each), on a cluster of 3 primaries (a replica each,
--    spec/support/redis_cluster.lua: 2 queues on each shard) and on one
--    redis-server; the ratio cluster / one Redis. Timed from the workers'
--    start to the last completion. Each setup's best of ROUNDS, with the
--    CPU per job of its servers (INFO cpu: one Redis; the primaries, and
--    the replicas, which replay every write).
-- 2. Failover: WORKERS workers (FAILOVER_FLAGS each) on 6 queues of 20 ms
--    jobs (chaos/processor.lua, which logs when each run starts); 2 s in,
--    the primary of 2 of them SIGKILLed. Its replica's promotion (the
--    harness's measure), and the first run of its queues started after
--    the promotion, from the kill: the time its queues were stopped. Runs
--    on the other shards meanwhile, to show they went on. (A small
--    prefetch: a worker starts the jobs it holds in the order it fetched
--    them, so with --prefetch 32 the first job fetched from the new
--    primary waits behind 32 held of each other queue: 1.4 s more here.)
-- The figures compare setups on this machine only: one Redis uses one core
-- for commands, so the cluster's gain needs a core for each shard and the
-- workers' own; with fewer, the ratio shows what the extra servers and the
-- routing cost.
-- BENCH_CLUSTER_JOBS, BENCH_CLUSTER_WORKERS, BENCH_CLUSTER_FLAGS,
-- BENCH_CLUSTER_ROUNDS, BENCH_CLUSTER_FAILOVER_FLAGS, BENCH_CLUSTER_FAILOVERS
-- (runs of 2., each on fresh queues; the medians printed) set them. Each
-- process is ended by its pid.
package.path = "lua/?.lua;lua/?/init.lua;bench/?.lua;spec/support/?.lua;" .. package.path
package.cpath = "build/?.so;" .. package.cpath

local moonjob = require "moonjob"
local loop = require "moonjob.loop"
local redis_server = require "redis_server"
local redis_cluster = require "redis_cluster"
local helpers = require "helpers"
local common = require "common"
local LUAJIT, wait_for = common.LUAJIT, common.wait_for

local JOBS = tonumber(os.getenv("BENCH_CLUSTER_JOBS")) or 30000
local WORKERS = tonumber(os.getenv("BENCH_CLUSTER_WORKERS")) or 3
local FLAGS = os.getenv("BENCH_CLUSTER_FLAGS") or "-j 2 --prefetch 32"
local ROUNDS = tonumber(os.getenv("BENCH_CLUSTER_ROUNDS")) or 3
local FAILOVER_FLAGS = os.getenv("BENCH_CLUSTER_FAILOVER_FLAGS") or "-j 2 --prefetch 2"
local FAILOVERS = tonumber(os.getenv("BENCH_CLUSTER_FAILOVERS")) or 3
local QUEUES = 6
local DEADLINE = 600 -- seconds a phase may take before the bench fails
local PROCESSOR = helpers.abs("chaos/processor.lua")

local M = {}

-- `moonjob add` of `jobs` lines made by line(i) to queue at url.
local function add(url, queue, jobs, line)
  local path = os.tmpname()
  local f = assert(io.open(path, "w"))
  for i = 1, jobs do f:write(line(i), "\n") end
  f:close()
  local ok = os.execute(("%s scripts/moonjob add --redis '%s' --queue %s %s >/dev/null")
    :format(LUAJIT, url, queue, path)) == 0
  os.remove(path)
  assert(ok, "moonjob add to " .. queue .. " failed")
end

-- How many jobs of `queues` (producer objects) have completed.
local function completed(qs)
  local n = 0
  for _, q in ipairs(qs) do
    n = n + (tonumber(q.client:call_wait({ "ZCARD", q.prefix .. "completed" })) or 0)
  end
  return n
end

local function open_queues(url, names)
  local qs = {}
  for i, name in ipairs(names) do qs[i] = assert(moonjob.queue(url, name)) end
  return qs
end

local function close_queues(qs)
  for _, q in ipairs(qs) do q:close() end
end

local function start_workers(url, names, processor, flags)
  local pids = {}
  for i = 1, WORKERS do pids[i] = common.start_worker(url, table.concat(names, ","), flags or FLAGS, processor) end
  return pids
end

-- The CPU time (user + system, seconds) the servers in `nodes` have used.
local function cpu_of(nodes)
  local sum = 0
  for _, node in ipairs(nodes) do
    local info = node:cli("INFO", "cpu")
    sum = sum + tonumber(info:match("used_cpu_user:([%d.]+)")) + tonumber(info:match("used_cpu_sys:([%d.]+)"))
  end
  return sum
end

-- One drain of JOBS no-op jobs over queues `names` at url: -> jobs/s, and
-- the CPU per job (µs) of the servers in each list of `groups` (the
-- primaries, the replicas).
function M.drain(url, names, groups)
  local per = math.floor(JOBS / #names)
  for _, name in ipairs(names) do add(url, name, per, function(n) return '{"n":' .. n .. '}' end) end
  local qs = open_queues(url, names)
  local cpu = {}
  for i, nodes in ipairs(groups) do cpu[i] = cpu_of(nodes) end
  local t0 = loop.now()
  local pids = start_workers(url, names)
  local last, done = 0, 0
  local ok = wait_for(function()
    if loop.now() - last >= 50 then last, done = loop.now(), completed(qs) end -- (the watching costs Redis too)
    return done >= per * #names
  end, DEADLINE)
  local seconds = (loop.now() - t0) / 1000
  for _, pid in ipairs(pids) do common.stop(pid) end
  close_queues(qs)
  assert(ok, "the jobs did not finish")
  for i, nodes in ipairs(groups) do cpu[i] = (cpu_of(nodes) - cpu[i]) * 1e6 / (per * #names) end
  return per * #names / seconds, cpu
end

-- -> the best jobs/s of ROUNDS drains on one Redis, and on the cluster,
-- taking turns, each with the CPU per job of its round (one Redis; the
-- primaries, the replicas); each round on fresh queues, 2 on each shard
-- (the same names on the one Redis).
function M.rates(cluster, server)
  local one, many = { rate = 0 }, { rate = 0 }
  local primaries, replicas = cluster:primaries(), {}
  for i, p in ipairs(primaries) do replicas[i] = cluster:replica_of(p) end
  for round = 1, ROUNDS do
    local names = cluster:spread_queues(("r%d_"):format(round), QUEUES / #primaries)
    local rate, cpu = M.drain(server.url, names, { { server } })
    if rate > one.rate then one = { rate = rate, cpu = cpu } end
    rate, cpu = M.drain(cluster.url, names, { primaries, replicas })
    if rate > many.rate then many = { rate = rate, cpu = cpu } end
  end
  return one, many
end

-- The start times (wall ms) of the runs the processor logged in `path`.
local function run_starts(path)
  local list, f = {}, io.open(path)
  if not f then return list end
  for line in f:lines() do list[#list + 1] = tonumber(line:match("(%d+)$")) end
  f:close()
  return list
end

-- The first of `names`' runs started after wall ms `t` (nil: none yet),
-- and how many started in [from, t2).
local function runs_of(dir, names, t, from, t2)
  local first, between = nil, 0
  for _, name in ipairs(names) do
    for _, at in ipairs(run_starts(("%s/%s.log"):format(dir, name))) do
      if at > t and (not first or at < first) then first = at end
      if from and at >= from and at < t2 then between = between + 1 end
    end
  end
  return first, between
end

-- 20 ms jobs on QUEUES queues (names from base) run by the workers; 2 s
-- in, the primary of the first two SIGKILLed, then started again (a
-- replica now, for the next run). -> ms to its replica's promotion, ms
-- until a run of its queues started after that, runs of the other queues
-- started meanwhile.
function M.failover(cluster, base)
  local names, of = cluster:spread_queues(base, QUEUES / #cluster:primaries())
  local dir = helpers.tmpdir()
  for _, name in ipairs(names) do
    add(cluster.url, name, 1000, function(n) return ('{"n":%d,"ms":20,"log":"%s/%s.log"}'):format(n, dir, name) end)
  end
  local pids = start_workers(cluster.url, names, PROCESSOR, FAILOVER_FLAGS)
  assert(wait_for(function() return runs_of(dir, names, 0) ~= nil end, 60), "no job ran")
  helpers.sleep(2)
  local victim, hit, others = of[names[1]], {}, {}
  for _, name in ipairs(names) do table.insert(of[name] == victim and hit or others, name) end
  local killed = helpers.wall_ms()
  local _, promoted = cluster:fail_over(victim)
  local resumed
  local ok = wait_for(function()
    resumed = runs_of(dir, hit, killed + promoted)
    return resumed ~= nil
  end, 60)
  for _, pid in ipairs(pids) do common.stop(pid) end
  assert(ok, "no job of the killed primary's queues ran again within 60 s of its replica's promotion")
  local _, meanwhile = runs_of(dir, others, resumed, killed, resumed)
  os.execute("rm -rf " .. dir)
  cluster:restart(victim)
  return promoted, resumed - killed, meanwhile
end

local function median(t)
  local sorted = { unpack(t) }
  table.sort(sorted)
  return sorted[math.ceil(#sorted / 2)]
end

-- FAILOVERS runs of M.failover: -> the medians of its figures.
function M.failovers(cluster)
  local promoted, resumed, meanwhile = {}, {}, {}
  for run = 1, FAILOVERS do
    promoted[run], resumed[run], meanwhile[run] = M.failover(cluster, ("f%d_"):format(run))
    io.stderr:write(("cluster failover run %d: replica master %d ms, jobs running again %d ms\n")
      :format(run, promoted[run], resumed[run]))
  end
  return median(promoted), median(resumed), median(meanwhile)
end

function M.measure(cluster, server)
  print(("\nQueues over a Redis Cluster: %d queues, %d no-op jobs, %d `moonjob worker %s` processes on every"
    .. " queue; best of %d round(s); %s cores here"):format(QUEUES, JOBS, WORKERS, FLAGS, ROUNDS,
    common.first_line("nproc") or "?"))
  local one, many = M.rates(cluster, server)
  print(("%-44s %10.0f jobs/s   Redis CPU %5.1f µs a job"):format("one redis-server", one.rate, one.cpu[1]))
  print(("%-44s %10.0f jobs/s   Redis CPU %5.1f µs a job on the primaries, %5.1f on the replicas"):format(
    ("cluster of %d primaries (a replica each)"):format(#cluster:primaries()), many.rate, many.cpu[1], many.cpu[2]))
  print(("cluster / one Redis: %.2fx"):format(many.rate / one.rate))
  local promoted, resumed, meanwhile = M.failovers(cluster)
  print(("Cluster failover (a primary SIGKILLed, cluster-node-timeout %d ms; workers %s), median of %d runs:"
    .. " its replica master after %d ms; its queues' jobs running again after %d ms; %d runs started on the"
    .. " other shards' queues meanwhile"):format(redis_cluster.NODE_TIMEOUT_MS, FAILOVER_FLAGS, FAILOVERS,
    promoted, resumed, meanwhile))
  return { one = one.rate, cluster = many.rate, ratio = many.rate / one.rate, promoted_ms = promoted,
    resumed_ms = resumed }
end

if not pcall(debug.getlocal, 4, 1) then -- run as a script
  local server, cluster = redis_server.start(), nil
  local ok, err = pcall(function()
    cluster = redis_cluster.start()
    M.measure(cluster, server)
  end)
  common.stop_all()
  if cluster then cluster:stop() end
  server:stop()
  if not ok then error(err, 0) end
end

return M
