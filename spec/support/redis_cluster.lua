-- spec/support/redis_cluster.lua -- a real Redis Cluster for the specs and
-- the bench: 3 primaries with a replica each (redis-cli --cluster create),
-- every node a redis_server (its own temp dir, AOF on) ended by its pid;
-- the server and client programs are redis_server's (Valkey's under
-- make test-valkey).
--
--   local cluster = redis_cluster.start()     -- on loopback; waits for agreement
--   local cluster = redis_cluster.start({ announce = "10.231.79.1" })
--                                              -- also on a netns bridge's host side
--   cluster.url                                -- "redis+cluster://H:P1,H:P2,H:P3/"
--   cluster:primaries(); cluster:replica_of(p) -- live nodes, as the cluster says
--   cluster:slot_of(key); cluster:owner(slot)  -- CLUSTER KEYSLOT; the primary of a slot
--   cluster:queue_slot(name)                   -- the slot of a moonjob queue's keys
--   cluster:spread_queues(base, n)             -- n queue names on each primary
--   cluster:fail_over(p)                       -- SIGKILL p; -> its promoted replica, ms
--   cluster:restart(node)                      -- back from its dir: a replica now
--   cluster:add_node()                         -- redis-cli --cluster add-node; -> node
--   cluster:move_slot(slot, node, opts)        -- its keys in batches, or at once; ASK, then MOVED
--   cluster:stop()                             -- every node by its pid, dirs removed
--
-- Nodes answer CLUSTER NODES/SLOTS with the announced address (default
-- 127.0.0.1), so clients in network namespaces reach them at the bridge's
-- host side: they listen on loopback and that address only. Protected mode
-- is off unless a password is set: nothing else can reach those addresses.
-- cluster-require-full-coverage is off, as in production: a shard's
-- failover stops only the queues on that shard, not the whole cluster.
local helpers = require "helpers"
local redis_server = require "redis_server"
local names = require "moonjob.redis.names"

local M = {}
local Cluster = {}
Cluster.__index = Cluster

M.NODE_TIMEOUT_MS = 1000 -- a dead primary is marked failed, and replaced, within about 2 of these
M.WAIT = 30              -- seconds any wait here may take before the spec fails: catches hangs only

-- A port for a node's cluster bus: the default (port + 10000) may be past
-- 65535 for the ports the kernel hands out, so each node is given one.
local function bus_port(taken)
  for _ = 1, 20 do
    local port = redis_server.free_port()
    if not taken[port] then return port end
  end
  error("no free port for a cluster bus")
end

local function shell_quote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

-- (replica-validity-factor 0: a replica takes over however long ago it
-- last heard from its primary; diskless-sync-delay 0: a replica gets its
-- copy at once, not after Redis' 5 s wait for others to share it)
function Cluster:_node_args(bus)
  local args = ("--cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout %d"
    .. " --cluster-port %d --cluster-announce-ip %s --cluster-replica-validity-factor 0"
    .. " --cluster-require-full-coverage no --repl-diskless-sync-delay 0")
    :format(self.node_timeout, bus, self.host)
  if self.password then return args .. " --masterauth " .. shell_quote(self.password) end
  return args .. " --protected-mode no"
end

-- A fresh node, alone in a cluster of its own until it is met.
function Cluster:_start_node()
  local taken = {}
  for _, n in ipairs(self.nodes) do taken[n.port], taken[n.bus_port] = true, true end
  local bus = bus_port(taken)
  local node = redis_server.start({ bind = self.bind, password = self.password, extra = self:_node_args(bus) })
  node.bus_port, node.host = bus, self.host
  node.address = ("%s:%d"):format(self.host, node.port)
  node.id = node:cli("CLUSTER", "MYID")
  assert(node.id:match("^%x+$"), "CLUSTER MYID: " .. node.id)
  self.nodes[#self.nodes + 1] = node
  return node
end

-- `redis-cli --cluster ARGS` (authenticated when the nodes are); raises
-- with its output when it fails.
function Cluster:admin(args)
  local auth = self.password and ("--no-auth-warning -a " .. shell_quote(self.password) .. " ") or ""
  local out, err, status = helpers.sh(("%s %s--cluster %s"):format(redis_server.CLI, auth, args), "")
  assert(status == 0, ("redis-cli --cluster %s failed (%s):\n%s%s"):format(args, tostring(status), out, err))
  return out
end

------------------------------------------------------------- the view ---

-- A node's CLUSTER NODES, by address: { id, address, flags = { name = true },
-- master (an id, or nil), slots = "a-b c ..." (its own slots, not the
-- slots it is moving) }.
local function parse_nodes(text)
  local view = {}
  for line in text:gmatch("[^\n]+") do
    local fields = {}
    for f in line:gmatch("%S+") do fields[#fields + 1] = f end
    if #fields >= 8 then
      local flags = {}
      for f in fields[3]:gmatch("[^,]+") do flags[f] = true end
      local slots = {}
      for i = 9, #fields do
        if not fields[i]:find("[", 1, true) then slots[#slots + 1] = fields[i] end
      end
      local address = fields[2]:match("^([^@]+)")
      view[address] = { id = fields[1], address = address, flags = flags,
        master = fields[4] ~= "-" and fields[4] or nil, slots = table.concat(slots, " ") }
    end
  end
  return view
end

function Cluster:view(node)
  return parse_nodes(node:cli("CLUSTER", "NODES"))
end

-- The nodes still running (not killed by the spec, or restarted since).
function Cluster:live()
  local list = {}
  for _, n in ipairs(self.nodes) do
    if not n.dead then list[#list + 1] = n end
  end
  return list
end

function Cluster:node_at(address)
  for _, n in ipairs(self.nodes) do
    if n.address == address then return n end
  end
end

-- What a node says of the whole cluster, as one text every node must say
-- alike once they agree: each node's role, master and slots.
local function summary(view)
  local rows = {}
  for address, v in pairs(view) do
    local role = v.flags.master and "master" or "replica"
    local failed = (v.flags.fail and " fail") or (v.flags["fail?"] and " fail?") or ""
    if v.flags.handshake or v.flags.noaddr then return nil end
    rows[#rows + 1] = ("%s %s%s %s %s"):format(address, role, failed, v.master or "-", v.slots)
  end
  table.sort(rows)
  return table.concat(rows, "\n")
end

-- True when every live node is "ok" and all say the same of every node,
-- knowing each live one and no dead one still taken for alive.
function Cluster:agreed()
  local seen
  for _, n in ipairs(self:live()) do
    if not n:cli("CLUSTER", "INFO"):find("cluster_state:ok", 1, true) then return false end
    local view = self:view(n)
    local text = summary(view)
    if not text or (seen and text ~= seen) then return false end
    seen = text
    for _, other in ipairs(self.nodes) do
      local v = view[other.address]
      if not v or (other.dead and not v.flags.fail) or (not other.dead and (v.flags.fail or v.flags["fail?"])) then
        return false
      end
    end
  end
  return true
end

function Cluster:wait_agreed(what)
  local ok = pcall(helpers.wait_for, function() return self:agreed() end, M.WAIT)
  if ok then return end
  local said = {}
  for _, n in ipairs(self:live()) do said[#said + 1] = n.address .. ":\n" .. n:cli("CLUSTER", "NODES") end
  error(("the cluster's nodes did not agree %s within %d s:\n%s"):format(what, M.WAIT, table.concat(said, "\n")))
end

-- A node's INFO replication field (role, master_link_status, ...).
function Cluster:replication(node, field)
  return node:cli("INFO", "replication"):match(field .. ":([^\r\n]*)")
end

-- Waits until every live replica has its master's data (a replica that
-- never synced has nothing to take over with).
function Cluster:wait_synced()
  helpers.wait_for(function()
    for _, n in ipairs(self:live()) do
      if self:replication(n, "role") == "slave" and self:replication(n, "master_link_status") ~= "up" then
        return false
      end
    end
    return true
  end, M.WAIT)
end

------------------------------------------------------------- queries ---

-- The live primaries that own slots (a node added and not yet given any is
-- left out unless `all`), in the order the cluster was made.
function Cluster:primaries(all)
  local view, list = self:view(self:live()[1]), {}
  for _, n in ipairs(self:live()) do
    local v = view[n.address]
    if v and v.flags.master and not v.flags.fail and (all or v.slots ~= "") then list[#list + 1] = n end
  end
  return list
end

-- The live replica of primary node p.
function Cluster:replica_of(p)
  local view = self:view(self:live()[1])
  for _, n in ipairs(self:live()) do
    local v = view[n.address]
    if v and v.master == p.id and not v.flags.fail then return n end
  end
end

function Cluster:slot_of(key)
  local slot = tonumber(self:live()[1]:cli("CLUSTER", "KEYSLOT", key))
  assert(slot, "CLUSTER KEYSLOT " .. key)
  return slot
end

-- The slot of every key of moonjob queue `name` (its prefix's hash tag).
function Cluster:queue_slot(name)
  return self:slot_of(names.prefix(name))
end

-- The live primary serving `slot` (from CLUSTER SLOTS of a live node).
function Cluster:owner(slot)
  local view = self:view(self:live()[1])
  for address, v in pairs(view) do
    if v.flags.master and not v.flags.fail then
      for range in v.slots:gmatch("%S+") do
        local a, b = range:match("^(%d+)%-?(%d*)$")
        a, b = tonumber(a), tonumber(b) or tonumber(a)
        if a and slot >= a and slot <= b then return self:node_at(address) end
      end
    end
  end
end

-- `per` queue names on each primary: base .. 1, base .. 2, ... kept or
-- passed over by their slot; -> the names (those of cluster:primaries()[1]
-- first, and so on), and the primary of each name.
function Cluster:spread_queues(base, per)
  local primaries, taken, of = self:primaries(), {}, {}
  local found, i = 0, 0
  while found < per * #primaries do
    i = i + 1
    assert(i < 1000, "no names found for every primary")
    local name = base .. i
    local p = self:owner(self:queue_slot(name))
    taken[p] = taken[p] or {}
    if #taken[p] < per then
      taken[p][#taken[p] + 1], of[name], found = name, p, found + 1
    end
  end
  local list = {}
  for _, p in ipairs(primaries) do
    for _, name in ipairs(taken[p]) do list[#list + 1] = name end
  end
  return list, of
end

------------------------------------------------------------- events ---

-- SIGKILLs primary p; waits for its replica's promotion and for every
-- live node to agree. -> the new primary, ms from the kill to the replica
-- calling itself master, ms to every node agreeing.
function Cluster:fail_over(p)
  local replica = assert(self:replica_of(p), "the primary has no live replica")
  local t0 = helpers.wall_ms()
  p:kill9()
  p.dead = true
  local promoted
  helpers.wait_for(function()
    if self:replication(replica, "role") ~= "master" then return false end
    promoted = promoted or helpers.wall_ms()
    return true
  end, M.WAIT)
  self:wait_agreed("on the promotion of " .. replica.address)
  return replica, promoted - t0, helpers.wall_ms() - t0
end

-- A killed node started again on its port and dir: its nodes.conf says it
-- was in the cluster, which makes it a replica of whoever took its slots.
function Cluster:restart(node)
  node:restart()
  node.dead = nil
  self:wait_agreed("on " .. node.address .. " back")
  self:wait_synced()
  return node
end

-- A new primary with no slots, met by `redis-cli --cluster add-node` (which
-- gives it the cluster's functions: FUNCTION DUMP/RESTORE). -> the node.
function Cluster:add_node()
  local existing = self:primaries()[1]
  local node = self:_start_node()
  self:admin(("add-node %s %s"):format(node.address, existing.address))
  self:wait_agreed("on " .. node.address .. " added")
  return node
end

local function must(node, ...)
  local out = node:cli(...)
  assert(out == "OK", ("%s on %s: %s"):format(table.concat({ ... }, " "), node.address, out))
end

-- MIGRATE's arguments up to KEYS, to node `to`.
function Cluster:_migrate_args(to)
  local args = { "MIGRATE", to.host, to.port, "", 0, 10000 }
  if self.password then args[#args + 1] = "AUTH"; args[#args + 1] = self.password end
  args[#args + 1] = "KEYS"
  return args
end

-- The slot set MIGRATING on `from`, then its keys sent `batch` at a time
-- (as redis-cli --cluster reshard does), between(moved so far) called
-- after each batch. -> keys moved.
function Cluster:_move_in_batches(slot, from, to, batch, between)
  must(from, "CLUSTER", "SETSLOT", slot, "MIGRATING", to.id)
  local moved = 0
  while true do
    local args = self:_migrate_args(to)
    local count = #args
    for key in from:cli("CLUSTER", "GETKEYSINSLOT", slot, batch):gmatch("[^\n]+") do args[#args + 1] = key end
    if #args == count then return moved end
    must(from, unpack(args))
    moved = moved + #args - count
    if between then between(moved) end
  end
end

-- Moves `slot` to primary `to` with its keys: `to` set IMPORTING, then
--   * opts.batch = n: the owner set MIGRATING and the keys sent n at a
--     time, opts.between(moved) after each batch: the way redis-cli
--     --cluster reshard moves a slot. A queue's function calls name one
--     key, the queue's prefix, which no key is: the owner answers ASK to
--     every one of them for the whole move, while the queue's other keys
--     are on both nodes (a client must not run them on `to` with ASKING);
--   * else every key in batches of 1000 sent back to back (no script: a
--     MIGRATE inside a script ends the connection on Valkey 8.0), then
--     ASK for opts.ask_seconds (default 1) spent by opts.wait(seconds)
--     (default helpers.sleep, which runs the loop).
-- Then the slot is given to `to` (SETSLOT NODE on it, on the old owner, on
-- every other primary): MOVED from then on. -> keys moved, the old owner.
function Cluster:move_slot(slot, to, opts)
  opts = opts or {}
  local from = assert(self:owner(slot), "no owner of slot " .. slot)
  assert(from ~= to, "the slot is on that node already")
  must(to, "CLUSTER", "SETSLOT", slot, "IMPORTING", from.id)
  local moved
  if opts.batch then
    moved = self:_move_in_batches(slot, from, to, opts.batch, opts.between)
  else
    moved = self:_move_in_batches(slot, from, to, 1000)
    local ask = opts.ask_seconds or 1
    if ask > 0 then (opts.wait or helpers.sleep)(ask) end
  end
  must(to, "CLUSTER", "SETSLOT", slot, "NODE", to.id)
  must(from, "CLUSTER", "SETSLOT", slot, "NODE", to.id)
  for _, p in ipairs(self:primaries(true)) do
    if p ~= to and p ~= from then must(p, "CLUSTER", "SETSLOT", slot, "NODE", to.id) end
  end
  self:wait_agreed("on slot " .. slot .. " moved")
  return moved, from
end

------------------------------------------------------------- life ---

-- The cluster's URL for moonjob, seeded with the primaries it was made with.
function Cluster:_url()
  local seeds = {}
  for i, p in ipairs(self:primaries()) do seeds[i] = p.address end
  local auth = self.password and (":" .. self.password .. "@") or ""
  return ("redis+cluster://%s%s/"):format(auth, table.concat(seeds, ","))
end

-- start([opts]): opts.announce: the address nodes give clients (and
-- listen on besides loopback; default 127.0.0.1); opts.password: every
-- node's (requirepass, masterauth); opts.primaries (default 3), each with
-- one replica; opts.node_timeout (ms).
function M.start(opts)
  opts = opts or {}
  local host = opts.announce or "127.0.0.1"
  local self = setmetatable({ nodes = {}, host = host, password = opts.password,
    bind = host == "127.0.0.1" and host or ("127.0.0.1 " .. host),
    node_timeout = opts.node_timeout or M.NODE_TIMEOUT_MS }, Cluster)
  local ok, err = pcall(function()
    local addresses = {}
    for i = 1, (opts.primaries or 3) * 2 do addresses[i] = self:_start_node().address end
    self:admin(("create %s --cluster-replicas 1 --cluster-yes"):format(table.concat(addresses, " ")))
    self:wait_agreed("after create")
    self:wait_synced()
  end)
  if not ok then
    self:stop()
    error(err, 0)
  end
  self.url = self:_url()
  return self
end

-- Every node ended by its pid (SIGTERM, then SIGKILL), its dir removed.
function Cluster:stop()
  for _, n in ipairs(self.nodes) do n:stop() end
end

return M
