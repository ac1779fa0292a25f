-- spec/support/redis_cluster_min.lua -- a small Redis Cluster on loopback for
-- the cluster client's specs: n primaries (redis_server.lua's servers with
-- cluster mode on), made one cluster by `redis-cli --cluster create`; a
-- slot moved by hand with a look between the steps (redis_cluster.lua is
-- the whole one: replicas, failovers, network namespaces).
--
--   local rc = require "redis_cluster_min"
--   local cluster = rc.start(3)             -- 3 primaries, slots spread evenly
--   rc.start(3, { tls = { cert =, key =, ca =, client_cert =, client_key = } })
--                                           -- TLS only, the bus too (rediss+cluster://)
--   cluster.url                             -- redis+cluster://127.0.0.1:P1,.../
--   cluster:owner(key)                      -- the node (a redis_server) serving key's slot
--   node:cli(...)                           -- redis-cli on a node
--   cluster:spread_names(2, "q")            -- queue names, 2 on each primary
--   local n = cluster:add_node()            -- an empty node joined by CLUSTER MEET
--   cluster:add_replica(node)               -- a replica of a primary, synced
--   cluster:migrate(slot, from, to, hook)   -- the slot moved by hand (hook between steps)
--   cluster:stop()                          -- every server, by its pid
local helpers = require "helpers"
local redis_server = require "redis_server"
local slots = require "moonjob.redis.slots"

local M = {}
local Cluster = {}
Cluster.__index = Cluster

-- cluster-node-timeout 1000: a dead primary is failed over in a few seconds;
-- the bus on a free port of its own (port + 10000 may be past 65535); a
-- replica synced at once; a shard down stops its own slots only.
local NODE_ARGS = "--cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 1000"
  .. " --cluster-replica-validity-factor 0 --repl-diskless-sync-delay 0 --cluster-require-full-coverage no"

local function start_node(tls)
  local bus = redis_server.free_port()
  local extra = NODE_ARGS .. " --cluster-port " .. bus
  if tls then -- (a node shows the bus a client certificate: the bus asks for one)
    extra = ("%s --tls-cluster yes --tls-replication yes --tls-client-cert-file %s --tls-client-key-file %s")
      :format(extra, tls.client_cert, tls.client_key)
  end
  local node = redis_server.start({ extra = extra, tls = tls })
  node.address, node.bus_port = "127.0.0.1:" .. node.port, bus
  node.id = node:cli("CLUSTER", "MYID")
  return node
end

-- Whether node's process runs.
local function alive(node)
  return node.pid ~= nil and helpers.running(node.pid)
end

-- Runs the loop or sleeps until cond() (seconds: 30 by default); raises
-- with what it waited for.
local function wait(cond, what, seconds)
  local ok, err = pcall(helpers.wait_for, cond, seconds or 30)
  assert(ok, ("waited for %s: %s"):format(what, tostring(err)))
end

-- Every node says the cluster is ok and knows every slot's owner alike.
function Cluster:wait_ok()
  wait(function()
    local first
    for _, node in ipairs(self.nodes) do
      if not alive(node) then goto next end
      if not node:cli("CLUSTER", "INFO"):find("cluster_state:ok", 1, true) then return false end
      local owners = self:_owners(node)
      first = first or owners
      if owners ~= first then return false end
      ::next::
    end
    return true
  end, "the cluster to be ok on every node")
end

-- A node's view of the slots' owners, as one text.
function Cluster:_owners(node)
  local lines = {}
  for line in node:cli("CLUSTER", "NODES"):gmatch("[^\n]+") do
    local id, flags, rest = line:match("^(%S+) %S+ (%S+) %S+ %S+ %S+ %S+ %S+ ?(.*)$")
    if id and flags:find("master") and not flags:find("fail") then
      lines[#lines + 1] = id .. " " .. (rest:gsub("%[.-%]", ""))
    end
  end
  table.sort(lines)
  return table.concat(lines, "\n")
end

-- M.start(n [, opts]): opts.tls (redis_server.start's) makes every port,
-- the cluster bus's too, TLS only; the URL then is rediss+cluster:// with
-- the CA.
function M.start(n, opts)
  local tls = opts and opts.tls
  local self = setmetatable({ nodes = {}, tls = tls }, Cluster)
  local ok, err = pcall(function()
    local list = {}
    for i = 1, n do
      self.nodes[i] = start_node(tls)
      list[i] = self.nodes[i].address
    end
    local out = helpers.first_line(("timeout 60 %s %s --cluster create %s --cluster-replicas 0 --cluster-yes 2>&1"
      .. " | grep -c 'All 16384 slots covered'"):format(redis_server.CLI, tls and "--tls --cacert " .. tls.ca or "",
      table.concat(list, " ")))
    assert(out == "1", "redis-cli --cluster create did not cover every slot")
    self:wait_ok()
  end)
  if not ok then self:stop(); error(err, 0) end
  self.url = tls and ("rediss+cluster://%s/?ca=%s"):format(self.nodes[1].address, tls.ca)
    or ("redis+cluster://%s/"):format(self.nodes[1].address)
  self.made_with = n
  return self
end

-- The node whose id is id (a primary or a replica), or nil.
function Cluster:by_id(id)
  for _, list in ipairs({ self.nodes, self.replicas or {} }) do
    for _, node in ipairs(list) do
      if node.id == id then return node end
    end
  end
end

-- slot -> the primary serving it, as the first node alive says it now.
function Cluster:owners()
  local owner = {}
  for _, asked in ipairs(self.nodes) do
    if alive(asked) then
      for line in asked:cli("CLUSTER", "NODES"):gmatch("[^\n]+") do
        local id, flags, rest = line:match("^(%S+) %S+ (%S+) %S+ %S+ %S+ %S+ %S+ ?(.*)$")
        if id and flags:find("master") and not flags:find("fail") then
          for range in rest:gmatch("%S+") do
            local a, b = range:match("^(%d+)%-?(%d*)$")
            if a then
              for slot = tonumber(a), tonumber(b ~= "" and b or a) do owner[slot] = self:by_id(id) end
            end
          end
        end
      end
      return owner
    end
  end
  return owner
end

function Cluster:owner(key)
  return self:owners()[slots.key_slot(key)]
end

-- Queue names (BASE1, BASE2, ...) whose slots are on the first n nodes
-- (the primaries the cluster was made with), per_node on each, in turn.
function Cluster:spread_names(per_node, base, n)
  local owner, out, have, k = self:owners(), {}, {}, 0
  local nodes = {}
  for i = 1, n or self.made_with do nodes[i] = self.nodes[i] end
  for _, node in ipairs(nodes) do have[node] = 0 end
  while #out < per_node * #nodes do
    k = k + 1
    assert(k < 100000, "no queue names spread over the nodes")
    local name = base .. k
    local node = owner[slots.key_slot(name)]
    if node and have[node] and have[node] < per_node then
      have[node] = have[node] + 1
      out[#out + 1] = name
    end
  end
  return out
end

-- A new node, empty (no slots, no library), met by the cluster.
function Cluster:add_node()
  local node = start_node(self.tls)
  self.nodes[#self.nodes + 1] = node
  self.nodes[1]:cli("CLUSTER", "MEET", "127.0.0.1", node.port, node.bus_port)
  wait(function()
    for _, other in ipairs(self.nodes) do
      if not other:cli("CLUSTER", "NODES"):find(node.id, 1, true) then return false end
    end
    return node:cli("CLUSTER", "INFO"):find("cluster_state:ok", 1, true) ~= nil
  end, "the new node to be known by every node")
  return node
end

-- A replica of primary, synced with it.
function Cluster:add_replica(primary)
  local node = start_node(self.tls)
  node.replica_of = primary
  self.replicas = self.replicas or {}
  self.replicas[#self.replicas + 1] = node
  primary:cli("CLUSTER", "MEET", "127.0.0.1", node.port, node.bus_port)
  wait(function() return node:cli("CLUSTER", "NODES"):find(primary.id, 1, true) ~= nil end, "the replica to meet")
  assert(node:cli("CLUSTER", "REPLICATE", primary.id) == "OK", "CLUSTER REPLICATE")
  wait(function() return node:cli("INFO", "replication"):find("master_link_status:up", 1, true) ~= nil end,
    "the replica to sync")
  -- every primary knows it as the replica (they vote for its promotion)
  wait(function()
    for _, other in ipairs(self.nodes) do
      if alive(other) and not other:cli("CLUSTER", "NODES"):find(node.id .. " [^\n]*slave " .. primary.id) then
        return false
      end
    end
    return true
  end, "every node to know the replica")
  return node
end

-- Moves slot from node `from` to node `to` by hand: IMPORTING, MIGRATING,
-- the keys by MIGRATE (hook(step) between: "marked" once both are set,
-- "half" once half the keys moved, "keys" once all did), then NODE on every node.
function Cluster:migrate(slot, from, to, hook)
  hook = hook or function() end
  assert(to:cli("CLUSTER", "SETSLOT", slot, "IMPORTING", from.id) == "OK", "IMPORTING")
  assert(from:cli("CLUSTER", "SETSLOT", slot, "MIGRATING", to.id) == "OK", "MIGRATING")
  hook("marked")
  local keys = {}
  for key in from:cli("CLUSTER", "GETKEYSINSLOT", slot, 100000):gmatch("[^\n]+") do keys[#keys + 1] = key end
  local half = math.floor(#keys / 2)
  local function move(a, b)
    if b < a then return end
    local args = { "MIGRATE", "127.0.0.1", to.port, "", 0, 5000, "KEYS" }
    for i = a, b do args[#args + 1] = keys[i] end
    local out = from:cli(unpack(args))
    assert(out == "OK" or out == "NOKEY", "MIGRATE: " .. out)
  end
  move(1, half)
  hook("half", keys)
  move(half + 1, #keys)
  -- keys added on from meanwhile (none should be: it sends them away)
  for key in from:cli("CLUSTER", "GETKEYSINSLOT", slot, 100000):gmatch("[^\n]+") do keys[#keys + 1] = key end
  hook("keys", keys)
  for _, node in ipairs({ to, from }) do assert(node:cli("CLUSTER", "SETSLOT", slot, "NODE", to.id) == "OK") end
  for _, node in ipairs(self.nodes) do
    if node ~= to and node ~= from and alive(node) then node:cli("CLUSTER", "SETSLOT", slot, "NODE", to.id) end
  end
end

function Cluster:stop()
  for _, list in ipairs({ self.replicas or {}, self.nodes }) do
    for _, node in ipairs(list) do node:stop() end
  end
end

return M
