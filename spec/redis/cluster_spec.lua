-- Queues on a Redis Cluster of 3 primaries on loopback (redis_cluster_min):
-- the cluster client (moonjob.redis.cluster) routes each queue's calls to
-- its primary, loads the library on every primary and on a node added,
-- follows MOVED and ASK while a slot moves under a running worker, follows
-- a failover; the registry lists every queue of every shard; subscriptions
-- hear the library's messages, and follow their slot.
local helpers = require "helpers"
local redis_cluster = require "redis_cluster_min"
local redis_server = require "redis_server"
local moonjob = require "moonjob"
local client = require "moonjob.redis.client"
local loop = require "moonjob.loop"
local names = require "moonjob.redis.names"
local slots = require "moonjob.redis.slots"
local queue_of = require("moonjob.redis.producer").attach
local dashboard = require "moonjob.dashboard"
local http = require "dashboard_http"

local PROCESSOR = helpers.abs(helpers.fixture("remote.lua"))

local cluster
local open = {} -- closed after each test, last first

local function keep(obj)
  open[#open + 1] = obj
  return obj
end

local wait_for = require("redis_queue").wait_for -- the loop run until cond() or `seconds` (20) pass; -> cond()

local function read(path)
  local f = io.open(path)
  if not f then return "" end
  local text = f:read("*a")
  f:close()
  return text
end

-- `moonjob worker` on queues (a list) of the cluster: its pid and stderr's path.
local function start_worker(queues, args)
  local log = os.tmpname()
  local pid = assert(tonumber(helpers.first_line(("%s scripts/moonjob worker %s --redis %s --queue %s %s 2>%s"
    .. " >/dev/null & echo $!"):format(helpers.LUAJIT, PROCESSOR, cluster.url, table.concat(queues, ","), args or "",
    log))))
  keep({ close = function() os.execute(("kill -KILL %d 2>/dev/null"):format(pid)) end })
  return pid, log
end

local function producer(name, opts)
  return keep(assert(moonjob.queue(cluster.url, name, opts)))
end

local function moonjob_cli(args, stdin)
  return helpers.sh(("%s scripts/moonjob %s --redis %s"):format(helpers.LUAJIT, args, cluster.url), stdin)
end

-- The names `moonjob queues` lists, and each one's row.
local function listed()
  local out, err, status = moonjob_cli("queues")
  assert.equal(0, status, err)
  local rows = {}
  for line in out:gmatch("[^\n]+") do
    local row = require("moonjob.codec.json").decode(line)
    rows[row.name] = row
  end
  return rows
end

-- Another primary than node, of those the cluster was made with.
local function other_than(node)
  for i = 1, cluster.made_with do
    if cluster.nodes[i] ~= node then return cluster.nodes[i] end
  end
end

-- n queue names (BASE1, BASE2, ...) whose slot node serves.
local function names_on(node, n, base)
  local owner, out, k = cluster:owners(), {}, 0
  while #out < n do
    k = k + 1
    if owner[slots.key_slot(base .. k)] == node then out[#out + 1] = base .. k end
  end
  return out
end

-- A primary the cluster was made with that does not serve the registry.
local function not_registry()
  local registry = cluster:owner(names.REGISTRY)
  for i = 1, cluster.made_with do
    if cluster.nodes[i] ~= registry then return cluster.nodes[i] end
  end
end

-- A primary serving slots now (a failover may have killed one the cluster
-- was made with) that does not serve the registry.
local function live_not_registry()
  local registry = cluster:owner(names.REGISTRY)
  for _, node in pairs(cluster:owners()) do
    if node ~= registry then return node end
  end
end

-- Whether the registry (on its primary now) holds name.
local function registered(name)
  local members = cluster:owner(names.REGISTRY):cli("SMEMBERS", names.REGISTRY)
  for line in members:gmatch("[^\n]+") do if line == name then return true end end
  return false
end

-- Runs the loop for ms.
local function pause_ms(ms)
  local until_ms = loop.now() + ms
  wait_for(function() return loop.now() >= until_ms end, ms / 1000 + 1)
end

-- A node killed comes back (its cluster state from its own file).
local function back(node)
  node:restart()
  cluster:wait_ok()
end

local function has_library(node)
  return node:cli("FUNCTION", "LIST", "LIBRARYNAME", "moonjob"):find("moonjob_add", 1, true) ~= nil
end

describe("queues on a Redis Cluster #slow", function()
  setup(function() cluster = redis_cluster.start(3) end)
  teardown(function() if cluster then cluster:stop() end end)
  after_each(function()
    for i = #open, 1, -1 do pcall(open[i].close, open[i]) end
    open = {}
  end)

  it("adds to queues on every primary, one worker runs them all, moonjob queues and status list them", function()
    local list = cluster:spread_names(2, "run")
    local owners = {}
    for _, name in ipairs(list) do owners[cluster:owner(name)] = true end
    local n = 0
    for _ in pairs(owners) do n = n + 1 end
    assert.equal(3, n) -- (the queues are on 3 primaries)
    local qs, waited = {}, nil
    for i, name in ipairs(list) do
      qs[i] = producer(name)
      for k = 1, 5 do
        local job = assert(qs[i]:add({ echo = name .. k }))
        waited = waited or job
      end
    end
    local idle = "runidle" -- a queue a worker serves, with nothing added yet
    local pid, log = start_worker({ list[1], list[2], list[3], list[4], list[5], list[6], idle }, "-j 2")
    assert.equal(list[1] .. 1, assert(waited:wait(30)).echo)
    assert(wait_for(function()
      for _, q in ipairs(qs) do if q:counts().completed ~= 5 then return false end end
      return true
    end, 60), "every queue's jobs completed: " .. read(log))
    local rows = listed()
    for _, name in ipairs(list) do
      assert(rows[name], name .. " listed")
      assert.equal(5, rows[name].completed)
    end
    assert(rows[idle], "a worker's queue is listed before anything is added to it")
    -- the registry is one key, on its slot's primary
    local members = cluster:owner(names.REGISTRY):cli("SMEMBERS", names.REGISTRY)
    for _, name in ipairs(list) do assert.matches("\n?" .. name .. "\n?", members) end
    local out, err, status = moonjob_cli("status --queue " .. list[4])
    assert.equal(0, status, err)
    assert.matches("completed 5", out, 1, true)
    -- an obliterated queue is no longer listed; added to again, it is
    assert(qs[6]:obliterate())
    assert.is_nil(listed()[list[6]])
    local _, aerr, astatus = moonjob_cli("add --queue " .. list[6], '{"echo":1}\n')
    assert.equal(0, astatus, aerr)
    assert(listed()[list[6]], "added to again: listed")
    os.execute("kill -TERM " .. pid)
    assert(wait_for(function() return not helpers.running(pid) end, 40))
    assert.matches("stopped: 31 completed", read(log), 1, true)
  end)

  it("adds a flow on queues of one tag, on their shard, and lists each queue", function()
    local tag = cluster:spread_names(1, "flow")[1]
    local images = "{" .. tag .. "}/images"
    local q = producer(tag)
    local root = assert(q:add_flow({ id = "page", data = { page = 1 }, children = {
      { id = "img", queue = images, data = { n = 1 } }, { id = "txt", data = { n = 2 } } } }))
    assert.equal("waiting-children", root.state)
    local rows = listed()
    assert.equal(1, rows[tag].waiting) -- (txt; the parent waits for its children)
    assert.equal(1, rows[images].waiting)
    assert.equal(cluster:owner(tag), cluster:owner(names.prefix(images)))
  end)

  it("loads the library on every primary, and on a node added when a queue's slot moves to it", function()
    for i = 1, cluster.made_with do assert.equal("OK", cluster.nodes[i]:cli("FUNCTION", "FLUSH")) end
    local c = keep(assert(client.new(cluster.url)))
    assert(c:wait_ready())
    for i = 1, cluster.made_with do assert.is_true(has_library(cluster.nodes[i]), "the library on node " .. i) end
    local got = loop.await(function(cb) c:each_primary({ "FCALL_RO", "moonjob_version", 0 }, cb) end)
    assert.equal(cluster.made_with, #c:primaries())
    for _, r in pairs(got) do assert.equal(require("moonjob.redis.library").version(), r[1]) end

    local name = cluster:spread_names(1, "grow")[1]
    local q = producer(name)
    for k = 1, 4 do assert(q:add({ n = k })) end
    local node = cluster:add_node()
    assert.is_false(has_library(node))
    cluster:migrate(slots.key_slot(name), cluster:owner(name), node)
    assert.equal(node, cluster:owner(name))
    local counts = assert(q:counts()) -- (MOVED: a client for the new node, set up)
    assert.equal(4, counts.waiting)
    assert.is_true(has_library(node))
    assert(q:add({ n = 5 }))
    assert.equal("5", node:cli("ZCARD", names.prefix(name) .. "wait"))
  end)

  it("follows MOVED when a queue's slot moves while a worker runs it: nothing lost", function()
    local name = cluster:spread_names(1, "move")[1]
    local from = cluster:owner(name)
    local to = other_than(from)
    local q = producer(name)
    local list = {}
    for k = 1, 300 do list[k] = { sleep = 0.002, n = k } end
    assert(q:add_bulk(list))
    local pid, log = start_worker({ name }, "-j 4")
    assert(wait_for(function() return q:counts().completed >= 30 end, 30), "jobs run: " .. read(log))
    cluster:migrate(slots.key_slot(name), from, to)
    for k = 1, 100 do assert(q:add({ sleep = 0.002, n = 300 + k })) end -- (this client learns by MOVED too)
    assert(wait_for(function() return q:counts().completed == 400 end, 60), "every job completed: " .. read(log))
    local counts = q:counts()
    assert.same({ 0, 0, 0, 0, 400 }, { counts.waiting, counts.active, counts.delayed, counts.failed,
      counts.completed_ever })
    assert.equal("0", from:cli("CLUSTER", "COUNTKEYSINSLOT", slots.key_slot(name)))
    os.execute("kill -TERM " .. pid)
    assert(wait_for(function() return not helpers.running(pid) end, 40))
    local said = read(log)
    assert.matches("stopped: 400 completed, 0 failed", said, 1, true)
    assert.matches("(0 fenced, 0 lost)", said, 1, true)
  end)

  it("follows ASK mid-migration: a plain command on the node importing, a function's call once the slot moved", function()
    local name = cluster:spread_names(1, "ask")[1]
    local from = cluster:owner(name)
    local to = other_than(from)
    local q = producer(name)
    for k = 1, 10 do assert(q:add({ n = k }, { id = "j" .. k })) end
    local c = keep(assert(client.new(cluster.url)))
    assert(c:wait_ready())
    local answer
    cluster:migrate(slots.key_slot(name), from, to, function(step, keys)
      if step == "half" then
        local moved, stayed
        for i, key in ipairs(keys) do
          if key:find(":j:j", 1, true) then
            if i <= #keys / 2 then moved = moved or key else stayed = stayed or key end
          end
        end
        assert(moved and stayed, "job hashes on both nodes")
        assert.matches("^ASK ", from:cli("EXISTS", moved)) -- (the node migrating has it no longer)
        -- (ASK: the node migrating no longer has it; ASKING, then HGET on the node importing)
        assert.matches('^{"n":%d+}$', assert(c:call_wait({ "HGET", moved, "data" })))
        assert.matches('^{"n":%d+}$', assert(c:call_wait({ "HGET", stayed, "data" })))
        c:call({ "FCALL_RO", "moonjob_counts", 1, names.prefix(name) }, function(v, err) answer = { v, err } end)
        wait_for(function() return answer ~= nil end, 0.3)
        assert.is_nil(answer, "a function's call waits while its slot's keys move")
      elseif step == "keys" then
        wait_for(function() return answer ~= nil end, 0.2)
        assert.is_nil(answer, "and until the slot has moved")
      end
    end)
    assert(wait_for(function() return answer ~= nil end, 5), "the call answered once the slot moved")
    assert.is_nil(answer[2])
    assert.equal(10, answer[1][1]) -- waiting
    assert.equal(10, assert(q:counts()).waiting)
  end)

  it("hears a queue's messages on its primary (SSUBSCRIBE), moved with its slot; the library keeps them in the shard",
    function()
    local name = cluster:spread_names(1, "hear")[1]
    local from = cluster:owner(name)
    local to = other_than(from)
    local channel = names.prefix(name) .. "events"
    local c = keep(assert(client.new(cluster.url)))
    assert(c:wait_ready())
    local heard = {}
    c:subscribe(channel, function(kind, message) if kind == "message" then heard[#heard + 1] = message end end)
    local function subscribed(node)
      return node:cli("PUBSUB", "SHARDCHANNELS"):find(channel, 1, true) ~= nil
    end
    assert(wait_for(function() return subscribed(from) end, 5), "subscribed on the queue's primary")
    -- SUBSCRIBE on another node hears nothing: SPUBLISH stays in the shard
    local out = os.tmpname()
    local sub_pid = assert(tonumber(helpers.first_line(("timeout 20 %s -p %d SUBSCRIBE %s >%s 2>&1 & echo $!")
      :format(redis_server.CLI, to.port, channel, out))))
    keep({ close = function() os.execute("kill " .. sub_pid .. " 2>/dev/null") end })
    assert(wait_for(function() return to:cli("PUBSUB", "CHANNELS"):find(channel, 1, true) ~= nil end, 5))
    local q = producer(name)
    assert(q:add({ n = 1 }))
    assert(wait_for(function() return #heard == 1 end, 5), "the subscription heard the add")
    assert.equal("added", heard[1])
    assert.is_nil(read(out):find("added", 1, true), "a plain subscriber elsewhere heard it")
    -- the slot moves: the node ends the subscription (sunsubscribe), the
    -- client makes it again on the new owner (what is published meanwhile
    -- is lost: a hint, the remote looks again when it hears "resubscribed")
    cluster:migrate(slots.key_slot(name), from, to)
    assert(wait_for(function() return subscribed(to) end, 5), "subscribed on the new primary")
    assert(q:pause())
    assert(wait_for(function() return #heard == 2 end, 5), "heard after the move")
    assert.equal("paused", heard[2])
  end)

  it("says what is wrong: a server not in cluster mode, a database, no node answering", function()
    local single = keep(redis_server.start())
    keep({ close = function() single:stop() end })
    local q, err = moonjob.queue(("redis+cluster://127.0.0.1:%d/"):format(single.port), "x", { timeout = 2 })
    assert.is_nil(q)
    assert.matches("is not a node of a Redis Cluster (cluster support disabled): use redis://127.0.0.1:"
      .. single.port .. "/0", err, 1, true)
    q, err = moonjob.queue(cluster.url:gsub("/$", "/3"), "x")
    assert.is_nil(q)
    assert.matches("a Redis Cluster has one database, 0", err, 1, true)
    local port = redis_server.free_port()
    local started = loop.now()
    q, err = moonjob.queue(("redis+cluster://127.0.0.1:%d/"):format(port), "x", { timeout = 1 })
    assert.is_nil(q)
    assert.matches("127.0.0.1:" .. port .. ": ", err, 1, true)
    assert.is_true(loop.now() - started < 5000)
    local _, said, status = helpers.sh(("%s scripts/moonjob status --queue x --redis redis+cluster://127.0.0.1:%d/")
      :format(helpers.LUAJIT, port))
    assert.is_not.equal(0, status)
    assert.matches("127.0.0.1:" .. port .. ": ", said, 1, true)
  end)

  it("hears the messages of a call by a user the ACL denies CLUSTER MYID, and of every call after it", function()
    local name = cluster:spread_names(1, "acl")[1]
    local node = cluster:owner(name)
    for _, n in ipairs(cluster.nodes) do
      assert.equal("OK", n:cli("ACL", "SETUSER", "nomyid", "on", ">pw", "~*", "&*", "+@all", "-cluster",
        "+cluster|slots"))
    end
    keep({ close = function() for _, n in ipairs(cluster.nodes) do n:cli("ACL", "DELUSER", "nomyid") end end })
    local c = keep(assert(client.new(cluster.url)))
    assert(c:wait_ready())
    local channel, heard = names.prefix(name) .. "events", {}
    c:subscribe(channel, function(kind, message) if kind == "message" then heard[#heard + 1] = message end end)
    assert(wait_for(function() return node:cli("PUBSUB", "SHARDCHANNELS"):find(channel, 1, true) ~= nil end, 5))
    local limited = keep(assert(moonjob.queue((cluster.url:gsub("//", "//nomyid:pw@")), name)))
    local q = producer(name)
    assert.equal("OK", node:cli("FUNCTION", "FLUSH"))
    assert(limited:pause()) -- (the library loaded again by this user, whose call is its first message)
    assert(wait_for(function() return #heard == 1 end, 5), "heard the limited user's pause")
    assert(q:resume())
    assert(wait_for(function() return #heard == 2 end, 5), "heard the next call's message")
    assert.same({ "paused", "resumed" }, heard)
  end)

  it("answers an add at once while the registry's shard is down, and lists the queue once it is back", function()
    local registry = cluster:owner(names.REGISTRY)
    local list = names_on(not_registry(), 2, "regdown")
    local q = producer(list[1])
    registry:kill9()
    keep({ close = function() if not helpers.running(registry.pid) then back(registry) end end })
    assert(wait_for(function() return not q.client.nodes[registry.address].ready end, 5))
    local started = loop.now()
    assert(q:add({ n = 1 }))
    assert.is_true(loop.now() - started < 1000, "the add waited for the registry: " .. (loop.now() - started) .. " ms")
    local _, log = start_worker({ list[2] })
    pause_ms(7000) -- (past the registry writes' timeout: they failed)
    back(registry)
    assert(wait_for(function() return registered(list[1]) and registered(list[2]) end, 20),
      "listed once the registry's shard is back: " .. read(log))
  end)

  it("lists a queue a one-shot add made while the registry's primary was slow to take its connection", function()
    local registry, seed = cluster:owner(names.REGISTRY), not_registry()
    local name = names_on(seed, 1, "slowreg")[1]
    registry:cli("CLIENT", "PAUSE", 1500, "ALL") -- (the add's program connects to it meanwhile)
    local _, err, status = helpers.sh(("%s scripts/moonjob add --queue %s --redis redis+cluster://%s/")
      :format(helpers.LUAJIT, name, seed.address), '{"n":1}\n')
    assert.equal(0, status, err)
    assert.is_true(registered(name))
  end)

  it("lists a queue added to again right after it was obliterated, by the same program", function()
    local name = cluster:spread_names(1, "again")[1]
    local q = producer(name)
    assert(q:add({ n = 1 }))
    assert(q:obliterate())
    assert.is_false(registered(name))
    assert(q:add({ n = 2 }))
    assert.is_true(registered(name), "listed again")
  end)

  it("writes the registry again when its slot moves, leaving out a queue obliterated meanwhile", function()
    local list = cluster:spread_names(1, "back")
    local kept, gone, other = list[1], list[2], list[3]
    local c = keep(assert(client.new(cluster.url)))
    assert(c:wait_ready())
    for _, name in ipairs(list) do assert(queue_of(c, name):add({ n = 1 })) end
    assert(producer(gone):obliterate()) -- (by another program)
    local from = cluster:owner(names.REGISTRY)
    from:cli("SREM", names.REGISTRY, kept) -- (a write a failover lost)
    cluster:migrate(slots.key_slot(names.REGISTRY), from, other_than(from))
    local away = cluster:owner(other)
    cluster:migrate(slots.key_slot(other), away, other_than(away))
    assert(queue_of(c, other):counts()) -- (MOVED: the map read again, the registry's new owner in it)
    assert(wait_for(function() return registered(kept) end, 5), "written again")
    assert(wait_for(function() return c:in_flight() == 0 end, 5))
    assert.is_false(registered(gone), "an obliterated queue written back")
  end)

  it("writes the registry again when a MOVED tells it the registry's slot moved", function()
    local kept = cluster:spread_names(1, "moved")[1]
    local c = keep(assert(client.new(cluster.url)))
    assert(c:wait_ready())
    assert(queue_of(c, kept):add({ n = 1 }))
    local from = cluster:owner(names.REGISTRY)
    from:cli("SREM", names.REGISTRY, kept) -- (a write a failover lost)
    cluster:migrate(slots.key_slot(names.REGISTRY), from, other_than(from))
    assert(c:call_wait({ "SCARD", names.REGISTRY })) -- (MOVED)
    assert(wait_for(function() return registered(kept) end, 5), "written again")
  end)

  it("lists at once the queues of a shard that is down, each said unreachable", function()
    local down = not_registry()
    local list, on_down = names_on(down, 3, "shard"), {}
    for _, name in ipairs(list) do on_down[name] = true end
    for _, name in ipairs(cluster:spread_names(1, "shardup")) do
      if cluster:owner(name) ~= down then list[#list + 1] = name end
    end
    for _, name in ipairs(list) do assert(producer(name):add({ n = 1 })) end
    down:kill9()
    keep({ close = function() if not helpers.running(down.pid) then back(down) end end })
    local started = loop.now()
    local rows = listed()
    local took = loop.now() - started
    for _, name in ipairs(list) do
      assert(rows[name], name .. " listed")
      if on_down[name] then
        assert.is_true(rows[name].unreachable, name)
        assert.matches("EREDIS", rows[name].error)
      else
        assert.is_nil(rows[name].unreachable)
        assert.equal(1, rows[name].waiting)
      end
    end
    assert.is_true(took < 8000, ("moonjob queues took %d ms"):format(took))
  end)

  it("asks for the map less and less often while a primary stays down", function()
    local down = not_registry()
    local c = keep(assert(client.new(cluster.url)))
    assert(c:wait_ready())
    local alive = {}
    for _, node in ipairs(cluster.nodes) do
      if node ~= down then alive[#alive + 1] = node end
    end
    down:kill9()
    keep({ close = function() if not helpers.running(down.pid) then back(down) end end })
    assert(wait_for(function() return not c.ready end, 5))
    for _, node in ipairs(alive) do node:cli("CONFIG", "RESETSTAT") end
    pause_ms(4000)
    local asked = 0
    for _, node in ipairs(alive) do
      asked = asked + tonumber(node:cli("INFO", "commandstats"):match("cmdstat_cluster|slots:calls=(%d+)") or 0)
    end
    assert.is_true(asked <= 8, ("the map asked for %d times in 4 s"):format(asked))
  end)

  it("gives up a call sent back and forth past its redirections as transient", function()
    local name = cluster:spread_names(1, "hops")[1]
    local from = cluster:owner(name)
    local slot = slots.key_slot(name)
    -- migrating to a node that does not import it: ASK there, MOVED back
    assert.equal("OK", from:cli("CLUSTER", "SETSLOT", slot, "MIGRATING", other_than(from).id))
    keep({ close = function() from:cli("CLUSTER", "SETSLOT", slot, "STABLE") end })
    local c = keep(assert(client.new(cluster.url)))
    assert(c:wait_ready())
    local v, err, kind = loop.await(function(cb) c:call({ "GET", names.prefix(name) .. "none" }, cb) end)
    assert.is_nil(v)
    assert.matches("^[AM][SO][KV]", err)
    assert.equal("transient", kind)
  end)

  it("says 'resubscribed' when a subscription is made again on the node it was on", function()
    local c = keep(assert(client.new(cluster.url)))
    assert(c:wait_ready())
    local first = c:primaries()[1] -- (the node asked for the map first)
    local name
    for _, n in ipairs(cluster:spread_names(1, "resub")) do
      if cluster:owner(n).address ~= first then name = n end
    end
    local node, asked = cluster:owner(name), nil
    for _, n in ipairs(cluster.nodes) do if n.address == first then asked = n end end
    local channel, heard = names.prefix(name) .. "events", {}
    c:subscribe(channel, function(kind) heard[#heard + 1] = kind end)
    assert(wait_for(function() return heard[1] == "resubscribed" end, 5), "subscribed")
    heard = {}
    -- the map's answer held back while the subscription's connection is
    -- made again on the same node
    asked:cli("CLIENT", "PAUSE", 1000, "ALL")
    node:cli("CLIENT", "KILL", "TYPE", "pubsub")
    assert(wait_for(function()
      for _, kind in ipairs(heard) do if kind == "resubscribed" then return true end end
      return false
    end, 5), "heard: " .. table.concat(heard, ", "))
  end)

  it("keeps every node's address off what a page may be shown", function()
    local c = keep(assert(client.new((cluster.url:gsub("/$", ",127.0.0.1:1/")))))
    assert(c:wait_ready())
    local list = c:primaries()
    list[#list + 1] = "127.0.0.1:1" -- (a seed that is no node)
    for _, address in ipairs(list) do
      for _, text in ipairs({ "MOVED 3999 " .. address, address .. " is not a primary of the cluster now",
        "EREDIS: redis://" .. address .. "/0: connection lost", address .. ": connection refused" }) do
        local shown = c:without_address(text)
        assert.is_nil(shown:find(address, 1, true), shown)
      end
    end
    assert.equal("MOVED 3999 a node", c:without_address("MOVED 3999 " .. list[1]))
  end)

  it("follows a failover: the replica promoted serves its primary's queues", function()
    local name = cluster:spread_names(1, "fail")[1]
    local primary = cluster:owner(name)
    local replica = cluster:add_replica(primary)
    local q = producer(name, { timeout = 20 })
    for k = 1, 5 do assert(q:add({ n = k })) end
    local c = keep(assert(client.new(cluster.url, { timeout_ms = 20000 })))
    assert(c:wait_ready())
    local heard = {}
    c:subscribe(names.prefix(name) .. "events", function(kind, message)
      if kind == "message" then heard[#heard + 1] = message end
    end)
    assert(wait_for(function()
      return primary:cli("PUBSUB", "SHARDNUMSUB", names.prefix(name) .. "events"):match("\n1$") ~= nil
    end, 5), "subscribed on the primary")
    assert.equal("1", primary:cli("WAIT", 1, 2000))
    primary:kill9()
    -- a call made while the primary is down waits for it (never sent), and
    -- goes to the replica once the map names it
    assert(wait_for(function() return not c.ready end, 10), "the client saw its primary go")
    local counts = assert(c:call_wait({ "FCALL_RO", "moonjob_counts", 1, names.prefix(name) }))
    assert.equal(5, counts[1])
    local ok, err = q:add({ n = 6 })
    assert(ok, err)
    assert.equal(replica, cluster:owner(name))
    assert.equal(6, assert(q:counts()).waiting)
    assert.is_true(has_library(replica))
    -- the subscription moved from the dead primary to the one promoted
    assert(wait_for(function()
      return replica:cli("PUBSUB", "SHARDNUMSUB", names.prefix(name) .. "events"):match("\n1$") ~= nil
    end, 10), "subscribed on the new primary")
    assert(q:pause())
    assert(wait_for(function() return heard[#heard] == "paused" end, 10), "heard on the new primary")
  end)

  it("takes a queue with only a worker, or only listed, as there: status, limit, pause, the dashboard, obliterate",
    function()
    local name, listed_only = unpack(names_on(live_not_registry(), 2, "bare"))
    local pid, log = start_worker({ name })
    assert(wait_for(function() local row = listed()[name] return row and row.workers == 1 end, 20),
      "the worker's queue listed with its worker: " .. read(log))
    for _, args in ipairs({ "status", "limit --rate 1/s", "pause" }) do
      local _, err, status = moonjob_cli((args:gsub("^(%S+)", "%1 --queue " .. name)))
      assert.equal(0, status, args .. ": " .. err)
    end
    assert.equal("1", cluster:owner(names.REGISTRY):cli("SADD", names.REGISTRY, listed_only))
    local server = keep(assert(dashboard.start({ redis = cluster.url, listen = "127.0.0.1:0" })))
    local code, text = http(server, "GET", "/metrics")
    assert.equal(200, code, text)
    assert.matches('moonjob_queue_workers{queue="' .. name .. '"} 1', text, 1, true)
    for _, q in ipairs({ name, listed_only }) do
      code, text = http(server, "GET", "/api/queues/" .. q)
      assert.equal(200, code, q .. ": " .. text)
    end
    os.execute("kill -KILL " .. pid)
    for _, q in ipairs({ name, listed_only }) do
      for _, args in ipairs({ "drain", "obliterate --yes" }) do
        local _, err, status = moonjob_cli((args:gsub("^(%S+)", "%1 --queue " .. q)))
        assert.equal(0, status, q .. ": " .. args .. ": " .. err)
      end
      assert.is_false(registered(q), q .. " no longer listed")
    end
  end)

  it("refuses redis:// at a node of the cluster at once, naming redis+cluster://; a worker says it once", function()
    local address = cluster:owner(names.REGISTRY).address -- (a primary alive now)
    local url = "redis://" .. address .. "/"
    local said = address .. " is a Redis Cluster node: use redis+cluster://" .. address
      .. "/ (a queue lives on its slot's shard)"
    local started = loop.now()
    local q, err = moonjob.queue(url, "plain", { timeout = 5 })
    assert.is_nil(q)
    assert.matches(said, tostring(err), 1, true)
    assert.is_true(loop.now() - started < 3000, "refused at once")
    local log = os.tmpname()
    local pid = assert(tonumber(helpers.first_line(("%s scripts/moonjob worker %s --redis %s --queue plain 2>%s"
      .. " >/dev/null & echo $!"):format(helpers.LUAJIT, PROCESSOR, url, log))))
    keep({ close = function() os.execute(("kill -KILL %d 2>/dev/null"):format(pid)) end })
    assert(wait_for(function() return read(log):find(said, 1, true) ~= nil end, 10), "the worker said it: " .. read(log))
    wait_for(function() return not helpers.running(pid) end, 3) -- (it may stop, or wait for a person)
    local _, times = read(log):gsub(said:gsub("%p", "%%%0"), "")
    assert.equal(1, times, read(log))
    assert.is_nil(read(log):find("MOVED", 1, true), read(log))
  end)
end)
