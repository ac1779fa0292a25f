-- Durable queues behind Redis Sentinel (redis+sentinel:// URLs): on
-- loopback, a primary (AOF on), a replica and three sentinels
-- (spec/support/sentinels.lua), the data servers and the sentinels each
-- with a password of their own. Producers and workers find the primary
-- through the sentinels, follow a switchover (SENTINEL FAILOVER) and a
-- failover after the primary is SIGKILLed, and lose no job: every job
-- completes, and the only jobs that run twice are those the failover's
-- window explains (their first run started within its run time and the
-- workers' reply timeout before the kill, or while workers were away). The
-- failover's times are measured and printed. Also: a sentinel that names a
-- dead address is passed over, replicas that lag (NOREPLICAS) stop writes
-- only, a sentinel user that may not subscribe, and TLS to the sentinels.
-- The cases that leave the group as it was, or end with a switchover,
-- share one group (started once: a group costs seconds); those that kill a
-- server have their own.
local moonjob = require "moonjob"
local client = require "moonjob.redis.client"
local helpers = require "helpers"
local sentinels = require "sentinels"
local redis_server = require "redis_server"
local tls_certs = require "tls_certs"
local rq = require "redis_queue"
local rf = require "redis_workers"

local PROCESSOR = helpers.abs("chaos/processor.lua") -- logs "<id> <attempt> <worker pid> <wall ms>" per run
local DATA_PW, WATCH_PW = "data-pw", "watch-pw"
local wall_ms = helpers.wall_ms

local function start_group(opts)
  opts = opts or {}
  opts.password, opts.sentinel_password = DATA_PW, WATCH_PW
  local g = sentinels.start(opts)
  rq.close_after({ close = function() g:stop() end })
  return g
end

-- The group the lighter cases share, ready for a failover (stopped in the
-- describe's teardown).
local shared
local function shared_group()
  if not shared then
    shared = sentinels.start({ password = DATA_PW, sentinel_password = WATCH_PW })
  else
    shared:wait_settled()
  end
  return shared
end

-- A client of url whose on_state calls are kept in said ("up WHY" or
-- "down WHY"), closed after the test.
local function watched_client(url, timeout_ms)
  local said = {}
  local c = assert(client.new(url, { timeout_ms = timeout_ms or 3000, on_state = function(up, why)
    said[#said + 1] = (up and "up " or "down ") .. tostring(why)
  end }))
  rq.close_after(c)
  return c, said
end

-- How many lines of said hold text.
local function count(said, text)
  local n = 0
  for _, line in ipairs(said) do
    if line:find(text, 1, true) then n = n + 1 end
  end
  return n
end

-- A `moonjob worker` of the chaos processor on url; -> pid, stderr's path.
local function start_worker(url, queue, args)
  local log = os.tmpname()
  local cmd = ("MOONJOB_REDIS='%s' %s scripts/moonjob worker %s --queue %s %s 2>%s >/dev/null & echo $!")
    :format(url, helpers.LUAJIT, PROCESSOR, queue, args or "", log)
  local pid = assert(tonumber(helpers.first_line(cmd)))
  rq.close_after({ close = function() os.execute(("kill -KILL %d 2>/dev/null"):format(pid)) end })
  return pid, log
end

-- `moonjob add` of n lines {"n":i,"ms":...,"log":runs} fed slowly (about
-- `per_s` lines a second) from a pipe; -> its pid and the path its stdout
-- (the jobs' ids, in input order) goes to.
local function start_adder(url, queue, n, per_s, runs)
  local ids, err = os.tmpname(), os.tmpname()
  local feed = ([[python3 -c 'import sys, time
for i in range(1, %d + 1):
    print("{\"n\":%%d,\"ms\":%%d,\"log\":\"%s\"}" %% (i, (i * 7) %% 11), flush=True)
    time.sleep(%g)']]):format(n, runs, 1 / per_s)
  local cmd = ("%s | MOONJOB_REDIS='%s' %s scripts/moonjob add --queue %s --attempts 3 >%s 2>%s & echo $!")
    :format(feed, url, helpers.LUAJIT, queue, ids, err)
  local pid = assert(tonumber(helpers.first_line(cmd)))
  rq.close_after({ close = function() os.execute(("kill -KILL %d 2>/dev/null"):format(pid)) end })
  return pid, ids, err
end

-- The runs a runs log holds: by job id, in order: { attempt, pid, at }.
local function read_runs(path)
  local by_id, count = {}, 0
  for _, line in ipairs(rf.lines(path)) do
    local id, attempt, pid, at = line:match("^(%S+) (%d+) (%d+) (%d+)$")
    count = count + 1
    by_id[id] = by_id[id] or {}
    table.insert(by_id[id], { attempt = tonumber(attempt), pid = tonumber(pid), at = tonumber(at) })
  end
  return by_id, count
end

-- Waits up to `seconds` for pred() in steps of at most 20 s (the specs'
-- hang catcher wants a bounded wait begun within every minute); raises.
local function wait_long(pred, seconds)
  local deadline = wall_ms() + seconds * 1000
  repeat
    local ok = pcall(helpers.wait_for, pred, math.min(20, math.max(1, (deadline - wall_ms()) / 1000)))
    if ok then return end
  until wall_ms() >= deadline
  helpers.wait_for(pred, 1)
end

local function file_has(path, text)
  return rf.read(path):find(text, 1, true) ~= nil
end

-- Each job of ids (n lines of ids_path) completed with its own result.
local function assert_all_completed(q, ids_path, n)
  local ids = rf.lines(ids_path)
  assert.equal(n, #ids)
  for i, id in ipairs(ids) do
    local info = assert(q:get(id))
    assert.equal("completed", info.state, id)
    assert.equal(i, info.result.n)
  end
  return ids
end

describe("a queue behind Redis Sentinel #slow", function()
  after_each(rq.close_all)
  teardown(function() if shared then shared:stop() end end)

  it("finds the primary when the first sentinel named is down", function()
    local g = shared_group()
    local url = g:url({ first = { "127.0.0.1:" .. redis_server.free_port() } })
    local q = rq.close_after(assert(moonjob.queue(url, "found")))
    local job = assert(q:add({ n = 1 }))
    local primary = g:server(g:primary_port())
    assert.equal("1", primary:cli("EXISTS", "mj:{found}:j:" .. job.id))
    assert.matches("^redis%+sentinel://:%*%*%*@127%.0%.0%.1:%d+,", q.client.name)
  end)

  it("says clearly that no sentinel knows a wrong master name", function()
    local g = shared_group()
    local q, err = moonjob.queue(g:url({ master = "nope" }), "x", { timeout = 3 })
    assert.is_nil(q)
    assert.matches("no sentinel knows a master named 'nope'", tostring(err), 1, true)
    assert.falsy(tostring(err):find(DATA_PW, 1, true))
    assert.falsy(tostring(err):find(WATCH_PW, 1, true))
    -- and the command line says so too
    local _, stderr, status = helpers.sh(("MOONJOB_REDIS='%s' %s scripts/moonjob status --queue x")
      :format(g:url({ master = "nope" }), helpers.LUAJIT))
    assert.are_not.equal(0, status)
    assert.matches("no sentinel knows a master named 'nope'", stderr, 1, true)
  end)

  it("passes over a sentinel whose address fails, asks it last and moves the watch off it", function()
    -- a lone sentinel listed first names a dead port (as one cut off from
    -- its peers keeps naming a primary that is gone); the three others name
    -- the live primary
    local g = shared_group()
    local dead = redis_server.free_port()
    local lone = g:lone_sentinel(dead)
    rq.close_after({ close = function() os.execute(("kill -KILL %d 2>/dev/null"):format(lone.pid)) end })
    local c, said = watched_client(g:url({ first = { "127.0.0.1:" .. lone.port } }))
    assert(c:wait_ready())
    local live = g:primary_port()
    assert.equal(live, c.sentinel.current.port)
    -- the failure names the address and the sentinel that named it
    assert.equal(1, count(said, ("down 127.0.0.1:%d, named by 127.0.0.1:%d: Connection refused")
      :format(dead, lone.port)), table.concat(said, "\n"))
    -- the sentinel whose address passed is asked first, the lone one last
    assert.equal(g.sentinels[1].port, c.target.sentinels[1].port)
    assert.equal(lone.port, c.target.sentinels[#c.target.sentinels].port)
    helpers.wait_for(function() return c.sentinel.watch_up and c.sentinel.watched.port ~= lone.port end, 10)
    -- and it stays on the live primary: a new connection asks the others first
    local conn = c.conn
    g:server(live):cli("CLIENT", "KILL", "TYPE", "normal")
    helpers.wait_for(function() return c.ready and c.conn ~= conn end, 10)
    assert.equal(live, c.sentinel.current.port)
    assert.equal("PONG", c:call_wait({ "PING" }))
  end)

  it("keeps reading while replicas lag (NOREPLICAS): writes wait on the same connection", function()
    local g = shared_group()
    local primary = g:server(g:primary_port())
    local replica = g:other(primary.port)
    local url = g:url()
    local q = rq.close_after(assert(moonjob.queue(url, "lagging", { timeout = 2 })))
    assert(q:add({ n = 1 }))
    local c = q.client
    local conn, downs, on_state = c.conn, {}, c.on_state
    c.on_state = function(up, why)
      if not up then downs[#downs + 1] = tostring(why) end
      on_state(up, why)
    end
    rq.close_after({ close = function()
      replica:signal("CONT")
      primary:cli("CONFIG", "SET", "min-replicas-to-write", "0")
    end })
    assert.equal("OK", primary:cli("CONFIG", "SET", "min-replicas-max-lag", "2"))
    assert.equal("OK", primary:cli("CONFIG", "SET", "min-replicas-to-write", "1"))
    replica:signal("STOP")
    helpers.wait_for(function() return primary:cli("SET", "mj:probe", "1"):match("^NOREPLICAS") ~= nil end, 10)
    -- a write waits for its timeout, then is refused for now
    local started = wall_ms()
    local job, err = q:add({ n = 2 })
    assert.is_nil(job)
    assert.matches("NOREPLICAS", tostring(err), 1, true)
    assert.is_true(wall_ms() - started < 4000, "the add waited past its timeout")
    -- reads go on, on the same connection, never dropped
    assert.equal(1, assert(q:counts()).waiting)
    assert.equal(conn, c.conn)
    assert.same({}, downs)
    -- a new client gets in (its set-up met NOREPLICAS) and reads
    local q2 = rq.close_after(assert(moonjob.queue(url, "lagging", { timeout = 2 })))
    assert.equal(1, assert(q2:counts()).waiting)
    -- the replica back while an add waits: it lands
    os.execute(("(sleep 0.5; kill -CONT %d) &"):format(replica.pid))
    local q3 = rq.close_after(assert(moonjob.queue(url, "lagging", { timeout = 8 })))
    assert(q3:add({ n = 3 }))
    assert(q:add({ n = 4 }))
    assert.equal(3, q:counts().waiting)
    assert.equal(conn, c.conn)
    assert.same({}, downs)
    assert.equal("OK", primary:cli("CONFIG", "SET", "min-replicas-to-write", "0"))
  end)

  it("says once why its sentinel user cannot watch, and follows a failover by asking", function()
    local g = shared_group()
    for i = 1, 3 do
      assert.equal("OK", g:sentinel_cli(i, "ACL", "SETUSER", "asker", "on", ">asker-pw", "resetchannels", "+@all"))
    end
    local c, said = watched_client(g:url({ sentinel_user = "asker", sentinel_password = "asker-pw" }), 2000)
    assert(c:wait_ready())
    local hint = "may not subscribe to +switch-master: grant it &+switch-master"
    helpers.wait_for(function() return count(said, hint) > 0 end, 10)
    local old = g:primary_port()
    assert.matches("^OK", g:sentinel_cli(1, "SENTINEL", "FAILOVER", "m"))
    local new = g:other(old).port
    -- no call is made, and the old primary stays a master for seconds:
    -- only asking the sentinels can move the client
    helpers.wait_for(function() return c.sentinel.current.port == new and c.ready end, 20)
    assert.equal(1, count(said, hint), table.concat(said, "\n"))
  end)

  it("makes its watch again on another sentinel, and finds a switch it missed", function()
    local g = shared_group()
    local q = rq.close_after(assert(moonjob.queue(g:url(), "watched", { timeout = 2 })))
    local old = g:primary_port()
    local watched -- (white box: the sentinel its +switch-master watch is on)
    helpers.wait_for(function() return q.client.sentinel.watch_up end, 10)
    for i, s in ipairs(g.sentinels) do
      if s.port == q.client.sentinel.watched.port then watched = i end
    end
    os.execute("kill -STOP " .. g.sentinels[watched].pid) -- silent: only the watch's PING can tell
    rq.close_after({ close = function() os.execute("kill -CONT " .. g.sentinels[watched].pid) end })
    assert.matches("^OK", g:sentinel_cli(watched % 3 + 1, "SENTINEL", "FAILOVER", "m"))
    local new = g:other(old).port
    helpers.wait_for(function() return q.client.sentinel.current.port == new and q.client.ready end, 30)
    assert.are_not.equal(g.sentinels[watched].port, q.client.sentinel.watched.port)
    -- moved on the new watch's word: the old primary, still a master, had
    -- not dropped it yet (Sentinel makes it a replica some 8 s later)
    assert.equal("master", g:server(old):cli("ROLE"):match("^%a+"))
    local job = assert(q:add({ n = 1 }))
    assert.equal("1", g:server(new):cli("EXISTS", "mj:{watched}:j:" .. job.id))
  end)

  it("moves workers and a producer over at SENTINEL FAILOVER without losing a job", function()
    -- min-replicas-to-write 1: once its replica leaves, the old primary
    -- refuses writes (NOREPLICAS) rather than taking ones the new primary
    -- will never see
    local g = start_group({ primary_extra = "--min-replicas-to-write 1 --min-replicas-max-lag 2" })
    local url, old = g:url(), g:primary_port()
    local dir = helpers.tmpdir()
    local runs = dir .. "/runs.log"
    local logs = {}
    for i = 1, 2 do
      local _, log = start_worker(url, "moved", "-j 2 --lease 10")
      logs[i] = log
      assert(rq.worker_connected(log), "worker connected")
    end
    local adder, ids_path, add_err = start_adder(url, "moved", 600, 200, runs)
    helpers.wait_for(function() return #rf.lines(runs) >= 100 end, 30)
    assert.matches("^OK", g:sentinel_cli(1, "SENTINEL", "FAILOVER", "m"))
    local new = g:other(old).port
    g:wait_primary(new)
    for _, log in ipairs(logs) do
      helpers.wait_for(function() return file_has(log, "primary for m is now 127.0.0.1:" .. new) end, 30)
    end
    wait_long(function() return not helpers.running(adder) end, 60)
    local q = rq.close_after(assert(moonjob.queue(url, "moved")))
    wait_long(function() local c = q:counts() return c.completed == 600 end, 90)
    assert_all_completed(q, ids_path, 600)
    assert.equal("", rf.read(add_err)) -- no line refused, none unknown
  end)

  it("runs again each job whose completion the new primary never had: at once, or after its lease", function()
    -- the replica cut off from the primary (its link killed, and a wrong
    -- masterauth so that it cannot come back) for 0.4 s, then the primary
    -- SIGKILLed: what the primary acknowledged meanwhile never reached the
    -- replica Sentinel promotes. Jobs completed then are active again there, under
    -- the old token, with no worker renewing them: recovered once their
    -- lease lapses, they run again (ESTALLED); jobs whose fetch was lost
    -- too wait in the new primary's ready set and run again at once. None
    -- is lost; an add acknowledged in that window is.
    local LEASE, N = 3, 30
    local g = start_group()
    local url, old = g:url(), g:primary_port()
    local primary, replica = g:server(old), g:other(old)
    local runs = helpers.tmpdir() .. "/runs.log"
    local q = rq.close_after(assert(moonjob.queue(url, "unseen")))
    local ids = {}
    for i = 1, N do ids[i] = assert(q:add({ n = i, ms = 100, log = runs }, { attempts = 3 })).id end
    helpers.wait_for(function() return replica:cli("EXISTS", "mj:{unseen}:j:" .. ids[N]) == "1" end, 10)
    local _, log = start_worker(url, "unseen", ("-j 1 --prefetch 0 --lease %d"):format(LEASE))
    helpers.wait_for(function() return #rf.lines(runs) >= 5 end, 30)
    assert.equal("OK", replica:cli("CONFIG", "SET", "masterauth", "wrong"))
    local stopped = wall_ms()
    primary:cli("CLIENT", "KILL", "TYPE", "replica")
    -- an add the old primary acknowledged in the window: lost with it
    local lost = assert(q:add({ n = 0, ms = 0, log = "/dev/null" }))
    helpers.sleep(0.4)
    local killed = wall_ms()
    primary:kill9()
    assert.equal("OK", replica:cli("CONFIG", "SET", "masterauth", DATA_PW))
    wait_long(function() local c = q:counts() return c and c.completed == N end, 60)
    -- the lost add's id is given again (the ids counter stepped back), and
    -- its handle answers for its own job only: not kept, never the other's
    local later = assert(q:add({ n = -1, ms = 0, log = "/dev/null" }))
    assert.equal(lost.id, later.id)
    local result, err = lost:wait(1)
    assert.is_nil(result)
    assert.equal("ENOTFOUND", err.code)
    assert.equal(-1, later:wait(20).n)
    for i, id in ipairs(ids) do
      local info = assert(q:get(id))
      assert.equal("completed", info.state)
      assert.equal(i, info.result.n)
    end
    local by_id = read_runs(runs)
    local again = 0
    for id, list in pairs(by_id) do
      if #list > 1 then
        again = again + 1
        -- its first run ended while the replica was cut off (it began at most a job's time before)
        assert.is_true(list[1].at >= stopped - 200 and list[1].at <= killed, id .. " ran again, from outside the window")
        assert.equal(2, #list)
      end
    end
    -- the job running at the cut: recovered after its lease (ESTALLED);
    -- those fetched after it: their fetch was lost too, they waited again
    local recovered = rf.recovered(replica, "unseen")
    assert.is_true(recovered >= 1, "no job was recovered after its lease")
    assert.is_true(again > recovered, "no job whose fetch was lost ran again")
    assert.truthy(file_has(log, "primary for m is now 127.0.0.1:" .. replica.port))
  end)

  it("carries on after the primary is SIGKILLed: every job completes once, re-runs explained", function()
    local LEASE, N = 10, 3000
    local g = start_group()
    local url, old = g:url(), g:primary_port()
    local primary, replica = g:server(old), g:other(old)
    local runs = helpers.tmpdir() .. "/runs.log"
    local pids, logs = {}, {}
    for i = 1, 3 do
      pids[i], logs[i] = start_worker(url, "failover", ("-j 2 --prefetch 2 --lease %d"):format(LEASE))
    end
    for i = 1, 3 do assert(rq.worker_connected(logs[i]), "worker connected") end
    local q = rq.close_after(assert(moonjob.queue(url, "failover")))
    local adder, ids_path, add_err = start_adder(url, "failover", N, 400, runs)
    helpers.wait_for(function() return #rf.lines(runs) >= N / 3 end, 60)

    local killed = wall_ms()
    primary:kill9()
    local completed = function() return tonumber(replica:cli("HGET", "mj:{failover}:totals", "completed")) end
    local before = assert(completed())
    local switched, first, back = nil, nil, {}
    helpers.wait_for(function()
      local now = wall_ms()
      if not switched and g:named_by(1) == replica.port then switched = now end
      if not first and (completed() or 0) > before then first = now end
      for i, log in ipairs(logs) do
        if not back[i] and file_has(log, "primary for m is now 127.0.0.1:" .. replica.port) then back[i] = now end
      end
      return switched and first and back[1] and back[2] and back[3]
    end, 60)
    local all_back = math.max(back[1], back[2], back[3])

    wait_long(function() return not helpers.running(adder) end, 120)
    wait_long(function() local c = q:counts() return c and c.completed == N end, LEASE * 3 + 120)
    assert_all_completed(q, ids_path, N)
    assert.equal("", rf.read(add_err)) -- no line refused, none unknown

    -- re-runs: a job run again must have had its run before start at most
    -- its own run time and the workers' reply timeout before the kill (its
    -- report, sent at its end, was then unanswered or answered and not yet
    -- replicated: a report is given up and sent again after that timeout),
    -- or before every worker was back (a fetch lost with the primary)
    local by_id, runs_count = read_runs(runs)
    local ms_of = {}
    for i, id in ipairs(rf.lines(ids_path)) do ms_of[id] = (i * 7) % 11 end
    local reply_ms = math.min(LEASE * 1000 * 4 / 5, 5000) -- a worker's timeout_ms (moonjob.redis.remote)
    local reruns, unexplained = 0, {}
    for id, list in pairs(by_id) do
      for k = 2, #list do
        reruns = reruns + 1
        local at = list[k - 1].at
        if at < killed - ms_of[id] - reply_ms - 100 or at > all_back + 500 then
          unexplained[#unexplained + 1] = ("%s (ran %d ms before the kill)"):format(id, killed - at)
        end
      end
    end
    -- no worker stuck: each ran jobs it fetched after it was back
    for i, pid in ipairs(pids) do
      local after = 0
      for _, list in pairs(by_id) do
        for _, r in ipairs(list) do
          if r.pid == pid and r.at > back[i] then after = after + 1 end
        end
      end
      assert.is_true(after > 0, ("worker %d ran nothing after the failover"):format(i))
    end
    print(("\nsentinel failover: kill -> sentinels switched %d ms, first completion on the new primary %d ms,"
      .. " every worker back %d ms (%d, %d, %d); %d runs for %d jobs, %d re-run(s)"):format(switched - killed,
      first - killed, all_back - killed, back[1] - killed, back[2] - killed, back[3] - killed, runs_count, N, reruns))
    assert.same({}, unexplained)
    assert.is_true(reruns <= 3 * (2 + 2) + 10, reruns .. " re-runs")
  end)

  it("works over TLS to the sentinels and the data servers, and refuses a wrong CA at once", function()
    local certs = tls_certs.make()
    rq.close_after({ close = function() certs:remove() end })
    local g = start_group({ tls = certs })
    local url = g:url()
    assert.matches("^rediss%+sentinel://", url)
    local runs = helpers.tmpdir() .. "/runs.log"
    local _, log = start_worker(url, "secure", "-j 1")
    assert(rq.worker_connected(log), "worker connected")
    local q = rq.close_after(assert(moonjob.queue(url, "secure")))
    local job = assert(q:add({ n = 7, ms = 0, log = runs }))
    assert.equal(7, job:wait(20).n)
    assert.truthy(file_has(log, "primary for m is 127.0.0.1:" .. g:primary_port()))
    -- a CA that signed none of them: refused at once, not after the timeout
    local started = wall_ms()
    local none, err = moonjob.queue(g:url({ query = "ca=" .. certs.other_ca }), "secure", { timeout = 10 })
    assert.is_nil(none)
    assert.matches("TLS: certificate verify failed", tostring(err), 1, true)
    assert.is_true(wall_ms() - started < 5000, "refused after " .. (wall_ms() - started) .. " ms")
    -- the sentinels' certificate name and the data servers' are given apart
    local names = "servername=localhost&sentinel_servername=localhost"
    local named = rq.close_after(assert(moonjob.queue(g:url({ query = names }), "secure", { timeout = 5 })))
    assert.equal(1, named:counts().completed)
    -- a wrong name for the sentinels: said, with the setting to give
    none, err = moonjob.queue(g:url({ query = "sentinel_servername=elsewhere.example" }), "secure", { timeout = 10 })
    assert.is_nil(none)
    assert.matches("not for 'elsewhere.example': give sentinel_servername=", tostring(err), 1, true)
  end)
end)
