-- make chaos: a Redis Cluster (3 primaries, a replica each) that clients in
-- network namespaces reach at the address its nodes announce: the host
-- side of a bridge this spec creates (spec/support/redis_cluster.lua,
-- spec/support/netns.lua). Needs root (ip netns).
--
-- The queue test: 6 queues, 2 on each shard, served by three `moonjob
-- worker --queue q1,...,q6` processes, one in each namespace, while a
-- producer adds more; a primary is SIGKILLed and its replica promoted, the
-- old primary started again (a replica now), a node added and a queue's
-- slot moved to it in batches (MIGRATE, as `redis-cli --cluster reshard`)
-- while its jobs run. Every job must complete; runs beyond the first are
-- counted and each must be explained by an event that can cause it on that
-- queue (docs/guide/redis.md, "Redis Cluster" and "What asynchronous
-- replication can lose"); `moonjob queues` lists all 6; no worker is stuck.
-- Twice, on a fresh cluster each: with a lease longer than the failover
-- (no job runs again but for writes the replica lacked) and shorter (the
-- jobs held of the killed shard's queues run again, no others).
--
-- Addresses: 10.231.79.0/24, on the bridge mjclus0 only; everything is
-- deleted afterwards, whatever happened.
local moonjob = require "moonjob"
local json = require "moonjob.codec.json"
local add = require "moonjob.redis.add"
local loop = require "moonjob.loop"
local helpers = require "helpers"
local redis_server = require "redis_server"
local redis_cluster = require "redis_cluster"
local netns = require "netns"

local NET, HOSTS = "10.231.79", 3
local PASSWORD = "cluster-pw"
local PER_QUEUE = 400 -- jobs added to each queue before the workers start
local HELD = 4        -- jobs a worker holds of each queue at most (-j 2 --prefetch 2: 2 + 2)
local PROCESSOR = helpers.abs("chaos/processor.lua")
local wall_ms = helpers.wall_ms

local hosts = netns.new("mjclus", NET, HOSTS)

local function run(cmd)
  return os.execute(cmd .. " >/dev/null 2>&1") == 0
end

-- The data of job n of a queue (chaos/processor.lua's; the producer's alike).
local function job_data(n, log)
  return ('{"n":%d,"ms":%d,"log":"%s"}'):format(n, (n * 7) % 61, log)
end

-- Adds jobs first..last of each queue in qs (pipelined), ids "<queue>-<n>".
local function add_jobs(qs, first, last, log)
  local pending, added, want = 0, 0, 0
  for _, q in ipairs(qs) do
    for n = first, last do
      pending, want = pending + 1, want + 1
      local args = add.args(q.prefix, job_data(n, log), { attempts = 10, id = ("%s-%d"):format(q.name, n) })
      q.client:call(args, function(reply) pending = pending - 1; if reply then added = added + 1 end end)
      if pending > 200 then helpers.wait_for(function() return pending < 100 end) end
    end
  end
  helpers.wait_for(function() return pending == 0 end)
  assert.equal(want, added)
end

-- The runs chaos/processor.lua logged: { id, queue, attempt, pid, at } each.
local function read_runs(path)
  local list = {}
  for line in io.lines(path) do
    local id, attempt, pid, at = line:match("^(%S+) (%d+) (%d+) (%d+)$")
    list[#list + 1] = { id = id, queue = id:match("^(.-)%-%d+$"), attempt = tonumber(attempt),
      pid = tonumber(pid), at = tonumber(at) }
  end
  return list
end

-- The producer's acknowledged adds: { [id] = wall ms }.
local function read_acks(path)
  local acks = {}
  for line in io.lines(path) do
    local id, at = line:match("^(%S+) (%d+)$")
    acks[id] = tonumber(at)
  end
  return acks
end

-- Waits until no queue of qs has a job waiting, delayed or active.
local function wait_idle(qs, t0)
  local function idle()
    for _, q in ipairs(qs) do
      local c = q:counts()
      if not c or c.waiting + c.delayed + c.active > 0 then return false end
    end
    return true
  end
  local deadline = loop.now() + 180000
  repeat -- in steps: the specs' hang catcher wants a sign of life every minute
    pcall(helpers.wait_for, idle, 10)
    io.stderr:write(("cluster chaos: %.0f s\n"):format((loop.now() - t0) / 1000))
  until idle() or loop.now() > deadline
  assert.is_true(idle(), "jobs still waiting or active after 3 minutes")
end

-- Every job of each queue in qs completed with its result: 1..PER_QUEUE,
-- and the producer's acknowledged adds, but for an add the killed primary
-- acknowledged in the second before its kill, which its replica may not
-- have had (docs/guide/redis.md: "An add acknowledged and lost").
-- -> { [queue name] = adds lost so }.
local function check_jobs(qs, acks, may_lose, killed)
  local lost = {}
  local function check(q, id, n)
    local info = q:get(id)
    if not info and may_lose[q.name] and acks[id] and acks[id] >= killed - 1000 and acks[id] <= killed then
      lost[q.name] = (lost[q.name] or 0) + 1
      return
    end
    assert.truthy(info, id .. " is not in the queue")
    assert.equal("completed", info.state, id)
    assert.equal(n, info.result.n)
  end
  local by_name = {}
  for _, q in ipairs(qs) do
    by_name[q.name] = q
    for n = 1, PER_QUEUE do check(q, ("%s-%d"):format(q.name, n), n) end
  end
  for id in pairs(acks) do
    local name, n = id:match("^(.-)%-(%d+)$")
    check(by_name[name], id, tonumber(n))
  end
  return lost
end

-- Runs beyond a job's first: each explained by an event on its queue whose
-- window its previous run started in. -> their count, by event; and for
-- each event, the start times of the runs it made run again.
local function count_reruns(runs, events)
  local by_id = {}
  for _, r in ipairs(runs) do
    by_id[r.id] = by_id[r.id] or {}
    table.insert(by_id[r.id], r)
  end
  local function cause_of(r)
    for _, ev in ipairs(events) do
      if ev.queues[r.queue] and r.at >= ev.from and r.at <= ev["until"] then return ev end
    end
  end
  local reruns, by_cause, starts = 0, {}, {}
  for id, list in pairs(by_id) do
    for k = 2, #list do
      reruns = reruns + 1
      local before = list[k - 1]
      local cause = cause_of(before)
      assert.truthy(cause, ("%s ran again (attempt %d after %d, worker %d) with no event to explain it")
        :format(id, list[k].attempt, before.attempt, before.pid))
      by_cause[cause] = (by_cause[cause] or 0) + 1
      starts[cause] = starts[cause] or {}
      table.insert(starts[cause], before.at)
      assert.is_true(list[k].attempt >= before.attempt, id .. " ran again with an older attempt")
    end
  end
  return reruns, by_cause, starts
end

-- How many of `times` are before a, in [a, b), and from b on.
local function split_times(times, a, b)
  local n = { 0, 0, 0 }
  for _, t in ipairs(times or {}) do
    local k = t < a and 1 or t < b and 2 or 3
    n[k] = n[k] + 1
  end
  return n
end

-- `moonjob queues --json` -> { [name] = its row }.
local function listed_queues(url)
  local out, err, status = helpers.sh(("%s scripts/moonjob queues --redis '%s' --json"):format(helpers.LUAJIT, url))
  assert.equal(0, status, err)
  local listed = {}
  for line in out:gmatch("[^\n]+") do
    local row = json.decode(line)
    listed[row.name] = row
  end
  return listed, out
end

-- Runs of queue `name` started within a second of [t, t + ms): -> how many
-- before, during and after.
local function runs_near(runs, name, t, ms)
  local near = {}
  for _, r in ipairs(runs) do
    if r.queue == name and r.at >= t - 1000 and r.at < t + ms + 1000 then near[#near + 1] = r.at end
  end
  return split_times(near, t, t + ms)
end

-- The first run of a queue in `set` started after wall ms t.
local function first_run_after(runs, set, t)
  local first
  for _, r in ipairs(runs) do
    if set[r.queue] and r.at > t and (not first or r.at < first) then first = r.at end
  end
  return first
end

describe("chaos: a Redis Cluster reached from network namespaces", function()
  local clusters, started = {}, {} -- every cluster and pid started, ended by teardown

  setup(function() hosts:setup() end)

  teardown(function()
    for _, pid in ipairs(started) do run("kill -KILL " .. pid) end
    for _, c in ipairs(clusters) do c:stop() end
    hosts:teardown()
  end)

  -- A cluster announcing the bridge's host side, stopped after the test.
  local function new_cluster()
    local cluster = redis_cluster.start({ announce = NET .. ".1", password = PASSWORD })
    clusters[#clusters + 1] = cluster
    finally(function() cluster:stop() end)
    return cluster
  end

  -- A background process; -> its pid (ended by teardown, unless stop(pid)).
  local function start(cmd)
    local pid = assert(tonumber(helpers.first_line(cmd .. " & echo $!")))
    started[#started + 1] = pid
    return pid
  end

  -- Ends pid (gone already: forgets it, so that no later process is hit).
  local function stop(pid)
    for i, p in ipairs(started) do
      if p == pid then table.remove(started, i) break end
    end
    if helpers.running(pid) then run("kill -KILL " .. pid) end
  end

  it("answers every host at the address its nodes announce, following MOVED to each shard", function()
    local cluster = new_cluster()
    assert.matches("^redis%+cluster://:[^@]+@" .. NET:gsub("%.", "%%.") .. "%.1:%d+,", cluster.url)
    local seed = cluster:primaries()[1]
    local queues, of = cluster:spread_queues("ns", 1)
    for i = 1, HOSTS do
      for _, name in ipairs(queues) do
        local key = ("mj:{%s}:host%d"):format(name, i)
        local out = helpers.sh(("%s %s --no-auth-warning -a %s -c -h %s -p %d SET %s %d")
          :format(hosts:exec(i), redis_server.CLI, PASSWORD, seed.host, seed.port, key, i))
        assert.equal("OK\n", out)
        assert.equal(tostring(i), of[name]:cli("GET", key))
      end
    end
  end)

  -- The run: t.names (6 queues, 2 on each shard) with PER_QUEUE jobs each,
  -- a `moonjob worker` on all of them in each namespace (lease t.lease),
  -- and the producer adding to them. -> t with workers, producer, t0.
  local function start_run(t)
    add_jobs(t.qs, 1, PER_QUEUE, t.runs_log)
    t.t0, t.workers = loop.now(), {}
    local list = table.concat(t.names, ",")
    for i = 1, HOSTS do
      t.workers[i] = start(("%s %s scripts/moonjob worker %s --redis '%s' --queue %s -j 2 --prefetch 2 "
        .. "--lease %g --grace 5 --keep 100000 2>>%s/worker%d.log >/dev/null")
        :format(hosts:exec(i), helpers.LUAJIT, PROCESSOR, t.url, list, t.lease, t.dir, i))
    end
    t.producer = start(("%s chaos/cluster_producer.lua '%s' %s %d 20 %s %s %s 2>>%s/producer.log >/dev/null")
      :format(helpers.LUAJIT, t.url, list, PER_QUEUE + 1, t.runs_log, t.acks_log, t.stop_file, t.dir))
  end

  -- The events while jobs run. Each: what, the queues whose runs it can make
  -- run again (on any worker), and the wall clock window in which such a
  -- run started: from a lease before it (jobs held then) to a lease after.
  local function make_events(cluster, t)
    local function event(what, queues, f)
      local e = { what = what, queues = queues, from = wall_ms() - t.lease * 1000 - 500 }
      t.events[#t.events + 1] = e
      f(e)
      e["until"] = wall_ms() + t.lease * 1000 + 500
      return e
    end
    t.events = {}
    helpers.sleep(2)
    -- 1. the primary of names[1] and names[2] SIGKILLed, its replica
    -- promoted. Their calls wait meanwhile (renewals longer than 4/5 of the
    -- lease: the jobs are fenced and run again); and what the replica had
    -- not received is lost (a completion: its job runs again; a fetch: its
    -- jobs are waiting again; an add)
    t.failover = event("the failover of " .. t.victim.address, t.on_victim, function()
      t.killed = wall_ms()
      local _
      _, t.promoted_ms, t.agreed_ms = cluster:fail_over(t.victim)
    end)
    -- 2. the old primary started again: a replica of the new one
    helpers.sleep(1)
    cluster:restart(t.victim)
    -- 3. a node added, and the slot of names[3] (another shard's) moved to
    -- it in batches while its jobs run: its calls wait for the move (ASK),
    -- then follow MOVED; a job runs again only if its renewals wait for
    -- 4/5 of the lease
    helpers.sleep(1)
    local node = cluster:add_node()
    helpers.sleep(0.5)
    local slot = cluster:queue_slot(t.moving)
    t.move = event("the move of " .. t.moving .. "'s slot", { [t.moving] = true }, function()
      t.move_t0 = wall_ms()
      t.keys = cluster:move_slot(slot, node, { batch = 100, between = function() helpers.sleep(0.02) end })
      t.move_ms = wall_ms() - t.move_t0
    end)
    assert.equal(node, cluster:owner(slot))
    helpers.sleep(1)
    helpers.write_file(t.stop_file, "")
    helpers.wait_for(function() return not helpers.running(t.producer) end, 30)
    stop(t.producer)
  end

  -- Every job completed, re-runs explained and counted, the queues listed.
  local function check_run(t)
    local acks = read_acks(t.acks_log)
    local total = PER_QUEUE * #t.names
    for _ in pairs(acks) do total = total + 1 end
    print(("\ncluster chaos, lease %g s: %d jobs (%d added by the producer during the run) in %.1f s")
      :format(t.lease, total, total - PER_QUEUE * #t.names, (loop.now() - t.t0) / 1000))
    print(("  %s's replica promoted %d ms after the SIGKILL (every node agreed at %d ms); %s's slot moved "
      .. "in %d ms (%d keys, batches of 100)"):format(t.victim.address, t.promoted_ms, t.agreed_ms, t.moving,
      t.move_ms, t.keys))
    local lost_adds = 0
    for _, n in pairs(check_jobs(t.qs, acks, t.on_victim, t.killed)) do lost_adds = lost_adds + n end
    local runs = read_runs(t.runs_log)
    local reruns, by_cause, starts = count_reruns(runs, t.events)
    print(("  %d runs, %d re-runs; adds lost by asynchronous replication: %d"):format(#runs, reruns, lost_adds))
    for _, ev in ipairs(t.events) do print(("  %4d after %s"):format(by_cause[ev] or 0, ev.what)) end
    local when = split_times(starts[t.failover], t.killed, t.killed + t.promoted_ms)
    print(("  the failover's: %d started before the SIGKILL, %d while the primary was down, %d after the "
      .. "promotion"):format(when[1], when[2], when[3]))
    local near = runs_near(runs, t.moving, t.move_t0, t.move_ms)
    print(("  runs of %s: %d started in the second before its slot's move, %d during it, %d in the second after")
      :format(t.moving, near[1], near[2], near[3]))
    assert.is_true(near[1] > 0 and near[3] > 0, "the slot did not move while its jobs ran")
    -- the killed shard's queues running again: their first run started after the promotion
    local resumed = first_run_after(runs, t.on_victim, t.killed + t.promoted_ms)
    assert.truthy(resumed, "no job of the killed primary's queues ran after its replica's promotion")
    print(("  %s and %s running jobs again %d ms after the SIGKILL (promotion at %d ms)"):format(
      t.names[1], t.names[2], resumed - t.killed, t.promoted_ms))
    local listed, out = listed_queues(t.url)
    for _, q in ipairs(t.qs) do assert.truthy(listed[q.name], q.name .. " not listed by moonjob queues:\n" .. out) end
    return by_cause
  end

  -- No worker stuck: each alive, and each running some of 20 jobs added
  -- now to every queue.
  local function check_workers(t)
    for i = 1, HOSTS do assert.truthy(helpers.running(t.workers[i]), "worker " .. i .. " has ended") end
    local from = wall_ms()
    add_jobs(t.qs, 100001, 100020, t.runs_log)
    wait_idle(t.qs, t.t0)
    local ran = {}
    for _, r in ipairs(read_runs(t.runs_log)) do
      if r.at >= from then
        ran[r.pid] = ran[r.pid] or {}
        ran[r.pid][r.queue] = (ran[r.pid][r.queue] or 0) + 1
      end
    end
    for i = 1, HOSTS do
      local mine, counts = ran[t.workers[i]] or {}, {}
      for _, name in ipairs(t.names) do counts[#counts + 1] = ("%s %d"):format(name, mine[name] or 0) end
      print(("  worker %d ran, of the last %d jobs: %s"):format(i, 20 * #t.names, table.concat(counts, ", ")))
      assert.truthy(next(mine), ("worker %d ran none of the last jobs (stuck?): %s/worker%d.log"):format(i, t.dir, i))
    end
  end

  -- The whole test with workers of lease `lease`: -> the re-runs by event
  -- (by_cause[t.failover], by_cause[t.move]) and t.
  local function queue_test(lease)
    local cluster = new_cluster()
    local names, of = cluster:spread_queues("cq", 2)
    local dir = helpers.tmpdir()
    local t = { lease = lease, url = cluster.url, names = names, victim = of[names[1]], moving = names[3],
      on_victim = {}, qs = {}, dir = dir, runs_log = dir .. "/runs.log", acks_log = dir .. "/acks.log",
      stop_file = dir .. "/stop" } -- (names[3]: on another shard than names[1])
    for i, name in ipairs(names) do
      t.on_victim[name] = of[name] == t.victim or nil
      t.qs[i] = assert(moonjob.queue(cluster.url, name))
    end
    start_run(t)
    make_events(cluster, t)
    wait_idle(t.qs, t.t0)
    local by_cause = check_run(t)
    check_workers(t)
    for _, pid in ipairs(t.workers) do stop(pid) end
    for _, q in ipairs(t.qs) do q:close() end
    os.execute("rm -rf " .. dir)
    -- the slot's move waits for no renewal as long as 4/5 of the lease
    assert.is_true(t.move_ms < lease * 1000 / 2, "the move took too long to count on no re-run")
    assert.equal(0, by_cause[t.move] or 0, "jobs of the moved queue ran again")
    return by_cause, t
  end

  it("6 queues on 3 shards, lease 10 s: a primary killed, a node added, a slot moved; no job lost or run twice",
    function()
      -- the failover (about 2.5 s here) is shorter than 4/5 of the lease:
      -- the jobs held of the killed shard's queues keep their leases and
      -- their reports land on the new primary; only writes the replica
      -- lacked can make one run again: those of the primary's last turn of
      -- its loop, at most a call of each worker on each of the 2 queues
      local by_cause, t = queue_test(10)
      assert.is_true((by_cause[t.failover] or 0) <= HOSTS * 2, "the failover: more re-runs than calls in flight")
    end)

  it("6 queues on 3 shards, lease 2 s: a failover longer than the lease re-runs only the jobs held there",
    function()
      -- the failover outlasts the lease: jobs held of the killed shard's
      -- queues (running and prefetched) are fenced, or their reports meet
      -- ESTALE (another worker took them once their lease ran out): each
      -- worker holds at most HELD of each queue
      local by_cause, t = queue_test(2)
      assert.is_true((by_cause[t.failover] or 0) <= HOSTS * 2 * HELD + HOSTS * 2,
        "the failover: more re-runs than jobs held")
    end)
end)
