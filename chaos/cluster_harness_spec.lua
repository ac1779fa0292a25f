-- The Redis Cluster the cluster specs and the bench run on
-- (spec/support/redis_cluster.lua), proved with redis-cli alone: made and
-- agreed, a primary killed and replaced by its replica, a node added with
-- the cluster's functions, and a queue's slot moved to it with its keys
-- while calls go on (ASK during the move, MOVED after), at once or batch
-- by batch. A guard of the harness: it needs nothing of moonjob's cluster
-- client.
local helpers = require "helpers"
local redis_server = require "redis_server"
local redis_cluster = require "redis_cluster"
local library = require "moonjob.redis.library"

-- `redis-cli -c` (following MOVED and ASK) at node, with args.
local function cli_c(node, ...)
  local args = {}
  for i, a in ipairs({ ... }) do args[i] = "'" .. tostring(a):gsub("'", "'\\''") .. "'" end
  return (helpers.sh(("%s -c -p %d %s"):format(redis_server.CLI, node.port, table.concat(args, " "))):gsub("\n$", ""))
end

-- moonjob's library loaded on node (as a client would load it on each primary).
local function load_library(node)
  local path = os.tmpname()
  helpers.write_file(path, library.text())
  local out = helpers.sh(("%s -p %d -x FUNCTION LOAD REPLACE < %s"):format(redis_server.CLI, node.port, path))
  os.remove(path)
  assert.equal("moonjob", (out:gsub("\n$", "")))
end

-- node:cli's answer without trailing white space (an error ends in two newlines).
local function said(node, ...)
  return (node:cli(...):gsub("%s+$", ""))
end

-- count keys PREFIX1.. PREFIXcount, each set to its number, in one call on node.
local function fill(node, prefix, count)
  assert.equal(tostring(count), node:cli("EVAL",
    "for i = 1, tonumber(ARGV[1]) do redis.call('SET', KEYS[1] .. i, i) end return ARGV[1]", 1, prefix, count))
end

local function has_library(node)
  return node:cli("FUNCTION", "LIST", "LIBRARYNAME", "moonjob"):find("moonjob_add", 1, true) ~= nil
end

describe("a Redis Cluster of 3 primaries and 3 replicas on loopback #slow", function()
  local cluster

  setup(function()
    cluster = redis_cluster.start()
    for _, p in ipairs(cluster:primaries()) do load_library(p) end
  end)

  teardown(function()
    if cluster then cluster:stop() end
  end)

  it("is made with a replica for each primary, and agreed; queue names spread over the shards", function()
    local primaries = cluster:primaries()
    assert.equal(3, #primaries)
    assert.equal(6, #cluster:live())
    for _, p in ipairs(primaries) do
      local r = assert(cluster:replica_of(p), p.address .. " has a replica")
      assert.equal("slave", cluster:replication(r, "role"))
      assert.equal("up", cluster:replication(r, "master_link_status"))
    end
    assert.matches("^redis%+cluster://127%.0%.0%.1:%d+,127%.0%.0%.1:%d+,127%.0%.0%.1:%d+/$", cluster.url)
    local queues, of = cluster:spread_queues("hq", 2)
    assert.equal(6, #queues)
    local per = {}
    for _, name in ipairs(queues) do
      local key = ("mj:{%s}:probe"):format(name)
      assert.equal("OK", cli_c(primaries[1], "SET", key, name))
      assert.equal("1", of[name]:cli("EXISTS", key)) -- on the primary spread_queues named
      per[of[name]] = (per[of[name]] or 0) + 1
    end
    for _, p in ipairs(primaries) do assert.equal(2, per[p]) end
  end)

  it("replaces a SIGKILLed primary by its replica, which keeps its data and functions", function()
    local p = cluster:owner(cluster:queue_slot("failing"))
    fill(p, "mj:{failing}:k", 50)
    assert.equal("1", p:cli("WAIT", 1, 5000)) -- the replica has them
    local replica, promoted_ms, agreed_ms = cluster:fail_over(p)
    print(("\ncluster: a primary SIGKILLed: its replica master after %d ms, every node agreeing after %d ms"
      .. " (cluster-node-timeout %d ms)"):format(promoted_ms, agreed_ms, redis_cluster.NODE_TIMEOUT_MS))
    assert.equal(replica, cluster:owner(cluster:queue_slot("failing")))
    assert.equal("50", replica:cli("CLUSTER", "COUNTKEYSINSLOT", cluster:queue_slot("failing")))
    assert.equal("7", cli_c(cluster:primaries()[1], "GET", "mj:{failing}:k7"))
    assert.is_true(has_library(replica), "FUNCTION LOAD reached the replica")
    assert.equal(3, #cluster:primaries())

    cluster:restart(p) -- back from its dir: a replica of its replacement
    assert.equal("slave", cluster:replication(p, "role"))
    assert.equal(replica, cluster:node_at(cluster:replication(p, "master_host") .. ":"
      .. cluster:replication(p, "master_port")))
    assert.equal(replica, cluster:owner(cluster:queue_slot("failing")))
  end)

  it("adds a node with the functions, and moves a queue's slot to it with its keys, ASK then MOVED", function()
    local node = cluster:add_node()
    assert.equal(7, #cluster:live())
    assert.is_true(has_library(node), "add-node gave the new node the functions")
    assert.equal(3, #cluster:primaries()) -- no slot yet
    local slot = cluster:queue_slot("moving")
    local from = cluster:owner(slot)
    fill(from, "mj:{moving}:k", 1200)
    local during = 0
    local moved = cluster:move_slot(slot, node, { wait = function()
      -- the keys are all on the new node; the old owner sends every call there
      assert.equal("0", from:cli("CLUSTER", "COUNTKEYSINSLOT", slot))
      assert.equal("1200", node:cli("CLUSTER", "COUNTKEYSINSLOT", slot))
      assert.equal(("ASK %d %s"):format(slot, node.address), said(from, "GET", "mj:{moving}:k1"))
      assert.matches("^ASK " .. slot, from:cli("FCALL", "moonjob_counts", 1, "mj:{moving}:"))
      for i = 1, 20 do
        assert.equal(tostring(i + 1), cli_c(from, "INCR", "mj:{moving}:k" .. i))
        during = during + 1
      end
    end })
    assert.equal(1200, moved)
    assert.equal(20, during)
    assert.equal(node, cluster:owner(slot))
    assert.equal(4, #cluster:primaries())
    assert.equal(("MOVED %d %s"):format(slot, node.address), said(from, "GET", "mj:{moving}:k1"))
    assert.equal("2", cli_c(from, "GET", "mj:{moving}:k1"))
    assert.equal("1200", cli_c(from, "GET", "mj:{moving}:k1200"))
    assert.equal("1200", node:cli("CLUSTER", "COUNTKEYSINSLOT", slot))
    local counts = node:cli("FCALL", "moonjob_counts", 1, "mj:{moving}:") -- the functions run there
    assert.is_nil(counts:match("^ERR") or counts:match("^MOVED"), counts)
  end)
  it("moves a queue's slot key batch by key batch, as redis-cli --cluster reshard does: ASK all along", function()
    local slot = cluster:queue_slot("batched")
    local from = cluster:owner(slot)
    local to = cluster:primaries()[1] == from and cluster:primaries()[2] or cluster:primaries()[1]
    fill(from, "mj:{batched}:k", 1000)
    local batches = 0
    local moved = cluster:move_slot(slot, to, { batch = 100, between = function(moved)
      batches = batches + 1
      assert.equal(tostring(1000 - moved), from:cli("CLUSTER", "COUNTKEYSINSLOT", slot))
      assert.equal(tostring(moved), to:cli("CLUSTER", "COUNTKEYSINSLOT", slot))
      -- a function names the queue's prefix, on neither node: sent away all along
      assert.equal(("ASK %d %s"):format(slot, to.address), said(from, "FCALL", "moonjob_counts", 1, "mj:{batched}:"))
      -- a plain key is read wherever it is now: on the owner, or through ASK
      for _, k in ipairs({ 1, 500, 1000 }) do assert.equal(tostring(k), cli_c(from, "GET", "mj:{batched}:k" .. k)) end
    end })
    assert.equal(1000, moved)
    assert.equal(10, batches)
    assert.equal(to, cluster:owner(slot))
    assert.equal("1000", to:cli("CLUSTER", "COUNTKEYSINSLOT", slot))
    assert.equal(("MOVED %d %s"):format(slot, to.address), said(from, "GET", "mj:{batched}:k1"))
  end)
end)
