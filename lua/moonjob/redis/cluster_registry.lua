-- moonjob.redis.cluster_registry -- the registry of queues
-- (moonjob.redis.names.REGISTRY) as a cluster client (moonjob.redis.cluster)
-- keeps it. On a cluster the key lives on its own slot's primary, where the
-- library's own writes to it are refused (another slot), so the client
-- writes it (SADD):
--   * the queues of a registering function's keys (names.REGISTERING) once
--     it answered, again after REGISTER_AGAIN_MS (an obliterated queue used
--     again is listed again). The caller's reply waits for that write (a
--     program that ends right after its add leaves its queue listed), at
--     most HOLD_MS once it can be sent (longer while the connection to the
--     registry's primary is first being made, within the timeout: unsent,
--     it would be lost), and not at all while that primary is down;
--   * a worker's queue when it connects (register): kept, written again
--     whenever the registry is written again;
--   * a write that failed for want of the registry's primary: written
--     again once that primary is up (and the next call writes it too);
--   * when the registry's slot has changed owner (a failover can lose the
--     last writes): the kept names, and the others written that still have
--     a key (a queue obliterated meanwhile is not written back).
-- forget(name): the queue was obliterated; the next call writes it again.
local core = require "moonjob.core"
local loop = require "moonjob.loop"
local names = require "moonjob.redis.names"
local slots = require "moonjob.redis.slots"

local M = {}
local Registry = {}
Registry.__index = Registry

local REGISTER_AGAIN_MS = 10000 -- a queue written, written again after it (at its next call)
local HOLD_MS = 300             -- at most this long a reply waits for its registry write
M.SLOT = slots.key_slot(names.REGISTRY)

-- M.new(cluster): for the cluster client whose owner, nodes and call it uses.
function M.new(cluster)
  return setmetatable({ cluster = cluster,
    written = {},   -- name -> when this client last sent its write (nil once it failed)
    kept = {},      -- name -> true: a worker's queue (register)
    unwritten = {}, -- name -> true: its write failed for want of the registry's primary
    holds = {},     -- { due, release }: replies waiting for their writes
    at = nil,       -- the registry's primary when the names were last written
  }, Registry)
end

-- The registry's primary, as the map says: "up", "down" (its client said
-- why), or "connecting" (its client not up yet, nor said why).
function Registry:_state()
  local c = self.cluster
  local address = c.owner[M.SLOT]
  local node = address and c.nodes[address]
  if node and node.ready then return "up" end
  if not node or c.down_why[address] then return "down" end
  return "connecting"
end

-- SADD of name; done() once it answered. A write lost for want of the node
-- (a connection, a failover) is written again once the registry's primary
-- is up; a refusal (an ACL: best effort, as the library's) is tried again
-- after REGISTER_AGAIN_MS only.
function Registry:write(name, done)
  local at = loop.now()
  self.written[name], self.unwritten[name] = at, nil
  self.cluster:call({ "SADD", names.REGISTRY, name }, function(_, err, kind)
    if err and kind ~= "reply" and self.written[name] == at then
      self.written[name], self.unwritten[name] = nil, true
    end
    if done then done() end
  end)
end

-- registry:register(name [, done]): a worker's queue, kept.
function Registry:register(name, done)
  self.kept[name] = true
  self:write(name, done)
end

function Registry:forget(name)
  self.written[name], self.kept[name], self.unwritten[name] = nil, nil, nil
end

-- The names of args' queues due a write (a registering function's call).
local function due_names(self, args, now)
  local due, seen = {}, {}
  if args[1] ~= "FCALL" or not names.REGISTERING[args[2]] then return due end
  for _, key in ipairs(slots.script_keys(args)) do
    local name = names.queue_name(key)
    if name and not seen[name] and now - (self.written[name] or -math.huge) >= REGISTER_AGAIN_MS then
      seen[name], due[#due + 1] = true, name
    end
  end
  return due
end

-- registry:after_call(args, release) -> true when release() (the caller's
-- reply, args' call having answered) waits for the writes of its queues
-- (done, or HOLD_MS past); false: give the reply now.
function Registry:after_call(args, release)
  local now = loop.now()
  local due = due_names(self, args, now)
  if #due == 0 then return false end
  local hold = self:_state() ~= "down"
  local left, held = #due, hold
  local function give()
    if held then held = false; release() end
  end
  for _, name in ipairs(due) do
    self:write(name, function()
      left = left - 1
      if left == 0 then give() end
    end)
  end
  if not hold then return false end
  if held then
    self.holds[#self.holds + 1] = { now + HOLD_MS, give, now + self.cluster.timeout_ms }
    self.timer = self.timer or core.timer(function() self:_tick() end)
    self.timer:start(50, 50)
  end
  return true
end

-- The replies held past HOLD_MS given (not while their write waits for
-- the registry's primary's first connection: it would not be sent).
function Registry:_tick()
  local now, list = loop.now(), self.holds
  self.holds = {}
  local connecting = self:_state() == "connecting"
  for _, h in ipairs(list) do
    if now >= h[1] and not (connecting and now < h[3]) then h[2]() else self.holds[#self.holds + 1] = h end
  end
  if #self.holds == 0 then self.timer:stop() end
end

local function keys(t)
  local list = {}
  for k in pairs(t) do list[#list + 1] = k end
  return list
end

-- The cluster's map was read: when the registry's slot has another owner
-- than when the names were written, they are written there again.
function Registry:map_read()
  local owner = self.cluster.owner[M.SLOT]
  if self.at and owner and owner ~= self.at then
    for _, name in ipairs(keys(self.written)) do
      if self.kept[name] then self:write(name) else self:_write_if_there(name) end
    end
  end
  self.at = owner or self.at
  self:node_up(owner)
end

-- The primary at address is up: if it serves the registry, the writes that
-- failed are sent again.
function Registry:node_up(address)
  if not address or address ~= self.cluster.owner[M.SLOT] or self:_state() ~= "up" then return end
  for _, name in ipairs(keys(self.unwritten)) do self:write(name) end
end

-- name written again if its queue still has a key (moonjob_counts' exists,
-- its ninth: the library cannot read the registry on a cluster, so it says
-- whether any key is there); written when that cannot be read.
function Registry:_write_if_there(name)
  self.cluster:call({ "FCALL_RO", "moonjob_counts", 1, names.prefix(name) }, function(c, err)
    if not err and type(c) == "table" and c[9] == 0 then
      if not self.kept[name] then self.written[name] = nil end
      return
    end
    self:write(name)
  end)
end

-- The replies still held are given; no more writes are sent again.
function Registry:close()
  local list = self.holds
  self.holds, self.unwritten = {}, {}
  for _, h in ipairs(list) do h[2]() end
  if self.timer then self.timer:close() end
end

return M
