-- moonjob.redis.cluster -- a Redis Cluster client with moonjob.redis.client's
-- face (call, call_wait, wait_ready, subscribe, close, without_address,
-- name, target, on_state, ready), made by client.new for a
-- redis+cluster:// URL (moonjob.redis.cluster_map).
--
-- One moonjob.redis.client per primary, each set up as for one server
-- (moonjob.redis.setup: the function library loaded on every primary, and
-- on a promoted replica or a new node when its client is made). Each call
-- goes to the primary serving the slot of its key (moonjob.redis.slots: an
-- FCALL's first key; a queue's keys share one hash tag, so one slot); a
-- keyless call to the node named (call_on, each_primary) or any.
--   * MOVED: the slot's entry is changed, the call sent to the new owner,
--     and the whole map asked for again soon (one request for many MOVED);
--   * ASK (a slot being migrated): a plain command is sent to the node
--     named, ASKING right before it on the same connection; a function
--     (FCALL) waits instead, sent again until the slot has moved (MOVED):
--     it declares only its queue's prefix, a key that never exists, so
--     the node migrating the slot sends every call away, while the
--     queue's other keys are on both nodes. The queue's calls wait while
--     its keys move;
--   * TRYAGAIN, CLUSTERDOWN: sent again after a short wait, within the
--     call's timeout (then the caller gets the refusal, kind "transient");
--   * a primary down: the map is asked of the other nodes (on the
--     connections open to them) every 250 ms until it changes (its replica
--     promoted) or the node is back; the calls waiting for it (never sent)
--     go to the slot's new owner.
--     Calls sent before a drop keep moonjob.redis.client's contract (cb's
--     fourth argument true: the caller's own retries, reports carry tokens).
-- The registry of queues (moonjob.redis.names.REGISTRY) is one key, on its
-- slot's owner; the library's own writes to it are refused there (another
-- slot), so this client writes it: the queues of a registering function's
-- keys once it answered (again after REGISTER_AGAIN_MS), and every name it
-- wrote again when the registry's slot changes owner (a failover can lose
-- a write). A subscription is sharded (SSUBSCRIBE) on the primary serving
-- its channel's slot (the channel holds the queue's hash tag), moved with it.
local core = require "moonjob.core"
local loop = require "moonjob.loop"
local client = require "moonjob.redis.client"
local map = require "moonjob.redis.cluster_map"
local names = require "moonjob.redis.names"
local slots = require "moonjob.redis.slots"

local M = {}
local Cluster = {}
Cluster.__index = Cluster

local MAX_HOPS = 5              -- redirections one call follows
local DOWN_REFRESH_MS = 250     -- the map asked for again while a primary is down
local REFRESH_GAP_MS = 100      -- at most one request for the map in this time
local REGISTER_AGAIN_MS = 10000 -- a queue this client registered, registered again after it
local REGISTRY_SLOT = slots.key_slot(names.REGISTRY)

M.parse, M.display = map.parse, map.display

-- M.new(url, opts) -> client | nil, err. opts as moonjob.redis.client's
-- (timeout_ms, max_reply, on_state) and key: the key (a queue's prefix)
-- whose primary the client's state follows (ready, on_state, wait_ready);
-- without it, every primary's.
function M.new(url, opts)
  local t, err = M.parse(url)
  if not t then return nil, err end
  opts = opts or {}
  local self = setmetatable({
    target = t, name = M.display(t), cluster = true,
    timeout_ms = opts.timeout_ms or 5000, max_reply = opts.max_reply or 64 * 1024 * 1024,
    on_state = opts.on_state, focus = opts.key and slots.key_slot(opts.key),
    nodes = {},       -- address -> moonjob.redis.client of a primary in the map
    settled = {},     -- address -> true: its client was up or said why not
    down_why = {},    -- address -> why its client said it is down
    owner = {},       -- slot -> address
    known = false, ready = false, closed = false, why = nil,
    delayed = {},     -- { call, due }: sent again at due (TRYAGAIN, a migrating slot)
    unrouted = {},    -- calls made before the map was known
    retired = {},     -- client -> until: nodes no longer primaries, closed once idle
    subs = {},        -- channel -> { cb, address }
    registered = {},  -- queue name -> when this client registered it
    refreshed_at = -math.huge, backoff = 0,
  }, Cluster)
  self.timer = core.timer(function() self:_tick() end)
  self:_discover()
  return self
end

function Cluster:__tostring() return "moonjob redis cluster client " .. self.name end

local function closed_error() return "EREDIS: the client is closed" end

function Cluster:_arm()
  if not self.armed and not self.closed then
    self.armed = true
    self.timer:start(20, 20)
  end
end

-- The map asked for again within ms (0: now), one request at a time.
function Cluster:_refresh_soon(ms)
  local at = math.max(loop.now() + (ms or 0), self.refreshed_at + REFRESH_GAP_MS)
  self.refresh_at = math.min(self.refresh_at or at, at)
  self:_arm()
end

function Cluster:_tick()
  local now = loop.now()
  if self.refresh_at and now >= self.refresh_at and not self.asking then self:_discover() end
  local due, later = {}, {}
  for _, d in ipairs(self.delayed) do
    if now >= d[2] then due[#due + 1] = d[1] else later[#later + 1] = d end
  end
  self.delayed = later
  for _, r in ipairs(due) do self:_send(r) end
  self:_expire_unrouted(now)
  for c, until_ms in pairs(self.retired) do
    if c:in_flight() == 0 or now >= until_ms then self.retired[c] = nil; c:close() end
  end
  local down = self:_down_node()
  if down and not self.refresh_at then self.refresh_at = now + DOWN_REFRESH_MS end
  if not (self.refresh_at or down or #self.delayed > 0 or #self.unrouted > 0 or next(self.retired)) then
    self.armed = false
    self.timer:stop()
  end
end

-- A primary of the map whose client is not ready, or nil.
function Cluster:_down_node()
  for address, node in pairs(self.nodes) do
    if not node.ready then return address, node end
  end
end

-- Calls made before any node answered: failed at their deadline.
function Cluster:_expire_unrouted(now)
  if #self.unrouted == 0 or self.known then return end
  local keep = {}
  for _, r in ipairs(self.unrouted) do
    if now >= r.deadline then
      r.cb(nil, ("EREDIS: %s: %s"):format(self.name, self.why or "no node of the cluster answered"), "connection")
    else
      keep[#keep + 1] = r
    end
  end
  self.unrouted = keep
end

-- One node's CLUSTER SLOTS: on its client's connection when it is up (no
-- new connection: asked often while a primary is down), else on one of its
-- own (cluster_map.ask). cb(reply) or cb(nil, why, refused).
function Cluster:_ask(node, cb)
  local c = self.nodes[map.address(node.host, node.port)]
  if not (c and c.ready) then return map.ask(self.target, node, self.timeout_ms, self.max_reply, cb) end
  c:call({ "CLUSTER", "SLOTS" }, function(v, err)
    if err then return cb(nil, ("%s: %s"):format(map.address(node.host, node.port), err)) end
    cb(v)
  end)
end

-- Asks the nodes in turn for the map (cluster_map.candidates) and applies
-- the first answer; when none answers, again after a back-off.
function Cluster:_discover()
  self.asking, self.refresh_at, self.refreshed_at = true, nil, loop.now()
  local list, i, last, refused = map.candidates(self.target, self.nodes), 0, nil, false
  local function try()
    if self.closed then return end
    i = i + 1
    if i > #list then
      self.asking = false
      self.backoff = math.min(math.max(self.backoff * 2, 100), 5000)
      self:_refresh_soon(self.backoff)
      self.refused = refused or nil
      if not self.known then self:_set_why(last) end
      return
    end
    local node = list[i]
    self:_ask(node, function(reply, why, is_refusal)
      if self.closed then return end
      if not reply then
        last, refused = why, refused or (is_refusal and why)
        return try()
      end
      self.asking, self.backoff = false, 0
      self:_apply(map.read(reply, node))
    end)
  end
  try()
end

-- A new map: a client for each new primary, the nodes no longer primaries
-- retired, the calls waiting for a node sent to their slot's owner, the
-- subscriptions moved, the registry written again if its owner changed.
function Cluster:_apply(owner, primaries)
  if next(primaries) == nil then
    self:_refresh_soon(1000)
    return self:_set_why("the cluster serves no slot yet (CLUSTER SLOTS is empty)")
  end
  local registry_was = self.known and self.owner[REGISTRY_SLOT]
  self.owner, self.known = owner, true
  for address, p in pairs(primaries) do self:_node(address, p.host, p.port) end
  for address, node in pairs(self.nodes) do
    if not primaries[address] then self:_retire(address, node) end
  end
  for address, node in pairs(self.nodes) do self:_reroute(address, node, false) end
  local unrouted = self.unrouted
  self.unrouted = {}
  for _, r in ipairs(unrouted) do self:_send(r) end
  for channel in pairs(self.subs) do self:_place(channel) end
  if registry_was and registry_was ~= owner[REGISTRY_SLOT] then
    for name in pairs(self.registered) do self:register(name) end
  end
  self:_update_state()
end

-- The client of the primary at address, made when first needed (its set-up
-- loads the library there).
function Cluster:_node(address, host, port)
  local node = self.nodes[address]
  if node then return node end
  if not host then host, port = map.split(address) end
  local err
  node, err = client.from_target(map.node_target(self.target, host, port), {
    timeout_ms = self.timeout_ms, max_reply = self.max_reply,
    on_state = function(up, why) self:_node_state(address, node, up, why) end,
  })
  if not node then -- (a TLS file that cannot be used: a person must act)
    self.refused = err
    return nil
  end
  self.nodes[address], self.settled[address], self.down_why[address] = node, nil, nil
  return node
end

function Cluster:_node_state(address, node, up, why)
  if self.nodes[address] ~= node then return end
  self.settled[address] = true
  self.down_why[address] = not up and why or nil
  if not up then self:_refresh_soon() end
  self:_update_state()
end

-- A node that is no longer a primary of the map: its waiting calls and
-- subscriptions go to the new owners; closed once its calls in flight
-- answered (at most timeout_ms).
function Cluster:_retire(address, node)
  self.nodes[address], self.settled[address], self.down_why[address] = nil, nil, nil
  self.retired[node] = loop.now() + self.timeout_ms
  self:_reroute(address, node, true)
  self:_arm()
end

-- The calls waiting for node (never sent) whose slot another node serves
-- now go there (all of them when node is retired: keyless ones to any).
function Cluster:_reroute(address, node, all)
  local moved = node:take_waiting(function(args)
    local slot = slots.command_slot(args)
    if slot then return self.owner[slot] ~= address end
    return all
  end)
  for _, w in ipairs(moved) do
    local slot = slots.command_slot(w[1])
    local to = slot and self.owner[slot] or self:_any()
    local c = to and self.nodes[to]
    if c then
      c:call(w[1], w[2])
    else
      w[2](nil, ("EREDIS: %s: no primary serves this slot"):format(self.name), "connection")
    end
  end
end

-- Any primary, a ready one first (keyless calls), or nil before the map.
function Cluster:_any()
  local list = self:primaries()
  for _, address in ipairs(list) do
    if self.nodes[address].ready then return address end
  end
  return list[1]
end

-- cluster:primaries() -> the addresses ("host:port") of the map's primaries, sorted.
function Cluster:primaries()
  local list = {}
  for address in pairs(self.nodes) do list[#list + 1] = address end
  table.sort(list)
  return list
end

-- The state (ready, on_state): the focus slot's primary ready, or, without
-- a focus, every primary; told to on_state when it changes, and once per
-- new reason while down (nothing while first connecting).
function Cluster:_state_now()
  if not self.known then return false, self.why end
  if self.focus then
    local address = self.owner[self.focus]
    local node = address and self.nodes[address]
    if node and node.ready then return true end
    if not address then return false, "no primary serves the queue's slot (the cluster is not whole)" end
    local why = self.down_why[address]
    return false, why and ("%s: %s"):format(address, why)
  end
  local address = self:_down_node()
  if not address then return true end
  local why = self.down_why[address]
  return false, why and ("%s: %s"):format(address, why)
end

function Cluster:_update_state()
  local up, why = self:_state_now()
  if up then
    local was = self.ready
    self.ready, self.why, self.said = true, nil, nil
    if not was and self.on_state then self.on_state(true) end
    return
  end
  local was = self.ready
  self.ready = false
  if why then self:_set_why(why, was) end
end

-- Down, for why: said once per reason (and when it was up).
function Cluster:_set_why(why, was_ready)
  self.why = why or self.why
  if not why or (self.said == why and not was_ready) then return end
  self.said = why
  if self.on_state then self.on_state(false, why) end
end

-- cluster:call(args, cb): as moonjob.redis.client's call, routed by the
-- slot of args' key (slots.command_key).
function Cluster:call(args, cb)
  if self.closed then return cb(nil, closed_error(), "connection") end
  self:_send({ args = args, cb = cb, slot = slots.command_slot(args), deadline = loop.now() + self.timeout_ms,
    hops = 0 })
end

-- cluster:call_on(address, args, cb): on the primary at address (keyless
-- commands: FUNCTION, SCAN, INFO, ...), unless redirected.
function Cluster:call_on(address, args, cb)
  if self.closed then return cb(nil, closed_error(), "connection") end
  if self.known and not self.nodes[address] then
    return cb(nil, ("%s is not a primary of the cluster now"):format(address), "reply")
  end
  self:_send({ args = args, cb = cb, node = address, deadline = loop.now() + self.timeout_ms, hops = 0 })
end

-- cluster:each_primary(args, cb): args on every primary of the map; cb(got)
-- with got[address] = { reply, err, kind }, once all answered.
function Cluster:each_primary(args, cb)
  if not self.known then
    if self.closed then return cb({}) end
    return self:_send({ fan = function() self:each_primary(args, cb) end, cb = function() cb({}) end,
      deadline = loop.now() + self.timeout_ms })
  end
  local list, got = self:primaries(), {}
  local left = #list
  for _, address in ipairs(list) do
    self:call_on(address, args, function(v, err, kind)
      got[address], left = { v, err, kind }, left - 1
      if left == 0 then cb(got) end
    end)
  end
end

-- Sends call r to the node it goes to (to: redirected there; asking: an
-- ASK's ASKING first); kept until the map is known.
function Cluster:_send(r, to, asking)
  if not self.known then
    self.unrouted[#self.unrouted + 1] = r
    if not self.refresh_at and not self.asking then self.refresh_at = 0 end
    return self:_arm()
  end
  if r.fan then return r.fan() end
  local address = to or r.node or (r.slot and self.owner[r.slot]) or self:_any()
  local node = address and (self.nodes[address] or to and self:_node(address))
  if not node and r.node then return r.cb(nil, ("%s is not a primary of the cluster now"):format(r.node), "reply") end
  if not node then
    return r.cb(nil, ("CLUSTERDOWN no primary serves slot %s (%s)"):format(tostring(r.slot), self.name), "transient")
  end
  local args = r.args
  if asking then
    args = { unpack(r.args) }
    args.asking = true
  end
  node:call(args, function(v, err, kind, sent) self:_answer(r, address, v, err, kind, sent) end)
end

-- A redirection's word, slot and address ("MOVED 3999 127.0.0.1:7002"),
-- the host of the node that answered when the reply leaves it out.
local function redirection(err, from)
  local word, slot, address = err:match("^(%u+) (%d+) (%S+)$")
  if word ~= "MOVED" and word ~= "ASK" then return nil end
  if address:sub(1, 1) == ":" then address = (map.split(from)) .. address end
  return word, tonumber(slot), address
end

function Cluster:_answer(r, from, v, err, kind, sent)
  if err and kind ~= "connection" and not self.closed then
    local word, slot, to = redirection(err, from)
    if word and r.hops < MAX_HOPS then
      r.hops = r.hops + 1
      if word == "MOVED" then
        self:_moved(slot, to)
        return self:_send(r, to)
      end
      if not slots.is_script(r.args) then return self:_send(r, to, true) end
      return self:_later(r, ("TRYAGAIN slot %d is moving to %s (ASK): a function's call waits until it has moved")
        :format(slot, to))
    end
    local code = err:match("^(%u+)")
    if code == "TRYAGAIN" or code == "CLUSTERDOWN" then
      if code == "CLUSTERDOWN" then self:_refresh_soon() end
      return self:_later(r, err)
    end
  end
  if not err and self:_registering(r.args, function() r.cb(v, err, kind, sent) end) then return end
  r.cb(v, err, kind, sent)
end

-- MOVED: the slot is served by address now (a client made for a node not
-- known yet); the whole map is asked for again soon.
function Cluster:_moved(slot, address)
  self.owner[slot] = address
  self:_node(address)
  if slot == self.focus then self:_update_state() end
  self:_refresh_soon()
end

-- Sent again after a short wait (10 ms doubling to 200 ms), within the
-- call's timeout; past it the caller gets err (kind "transient").
function Cluster:_later(r, err)
  local now = loop.now()
  r.wait = math.min((r.wait or 5) * 2, 200)
  r.hops = 0
  if now + r.wait > r.deadline then return r.cb(nil, err, "transient") end
  self.delayed[#self.delayed + 1] = { r, now + r.wait }
  self:_arm()
end

-- cluster:call_wait(args) -> reply | nil, err (as moonjob.redis.client's).
function Cluster:call_wait(args)
  local value, err = loop.await(function(cb) self:call(args, cb) end)
  return value, err
end

-- Whether wait_ready may end: ready, refused, closed, or (no focus) every
-- primary's client up or said why not, one up.
function Cluster:_settled()
  if self.ready or self.closed or self.refused then return true end
  if not self.known then return false end
  if self.focus then -- (its primary refused us: a person must act)
    local address = self.owner[self.focus]
    return address ~= nil and self.nodes[address] ~= nil and self.nodes[address].refused ~= nil
  end
  local one = false
  for address, node in pairs(self.nodes) do
    if not self.settled[address] then return false end
    one = one or node.ready
  end
  return one
end

-- cluster:wait_ready() -> true | nil, err: waits up to timeout_ms for the
-- map and the focus slot's primary (without a focus: every primary's client
-- up, or one up and the others said why not).
function Cluster:wait_ready()
  local deadline = loop.now() + self.timeout_ms
  loop.wait_until(function() return self:_settled() or loop.now() >= deadline end)
  if self.ready then return true end
  local address, why = self.focus and self.owner[self.focus], self.refused
  local node = address and self.nodes[address]
  if not why and node and node.refused then why = address .. ": " .. node.refused end
  if self:_settled() and not self.closed and not why then return true end
  return nil, ("EREDIS: %s: %s"):format(self.name, why or self.why or "no answer")
end

-- cluster:subscribe(channel, cb): as moonjob.redis.client's, with SSUBSCRIBE
-- (the library SPUBLISHes on a cluster) on the primary serving the
-- channel's slot; made again on the new one when the slot moves (the node
-- ends it: sunsubscribe) or the primary dies. What is published meanwhile
-- is lost, as while a connection is down: cb hears "resubscribed".
function Cluster:subscribe(channel, cb)
  self.subs[channel] = { cb = cb }
  self:_place(channel)
end

function Cluster:_place(channel)
  local sub = self.subs[channel]
  if not self.known or not sub then return end
  local address = self.owner[slots.key_slot(channel)]
  if not address or (sub.address == address and self.nodes[address]) then return end
  local old = sub.address and self.nodes[sub.address]
  if old then old:unsubscribe(channel) end
  sub.address = address
  self.nodes[address]:subscribe(channel, function(kind, message)
    if self.subs[channel] ~= sub or sub.address ~= address then return end
    if kind == "unsubscribed" then -- (the server dropped it: its slot moved)
      sub.address = nil
      return self:_refresh_soon()
    end
    sub.cb(kind, message)
  end, true)
end

-- cluster:register(name [, done]): the queue in the registry
-- (moonjob.redis.names; best effort, as the library's), remembered:
-- written again when the registry's slot changes owner. done() once answered.
function Cluster:register(name, done)
  self.registered[name] = loop.now()
  self:call({ "SADD", names.REGISTRY, name }, done or function() end)
end

-- After a registering function answered: its queues registered (again
-- after REGISTER_AGAIN_MS: an obliterated queue used again is listed
-- again), then done() (its reply to the caller: a program that ends right
-- after an add leaves its queue listed) -> true; false when none is to be.
function Cluster:_registering(args, done)
  if args[1] ~= "FCALL" or not names.REGISTERING[args[2]] then return false end
  local now, left = loop.now(), 0
  local function answered()
    left = left - 1
    if left == 0 then done() end
  end
  for _, key in ipairs(slots.script_keys(args)) do
    local name = names.queue_name(key)
    if name and now - (self.registered[name] or -math.huge) >= REGISTER_AGAIN_MS then
      left = left + 1
      self:register(name, answered)
    end
  end
  return left > 0
end

-- cluster:without_address(text): as moonjob.redis.client's, for any node.
function Cluster:without_address(text)
  text = tostring(text)
  for _, node in pairs(self.nodes) do
    if text:find(node.name, 1, true) then return node:without_address(text) end
  end
  local at = text:find(self.name, 1, true)
  if not at then return text end
  return "Redis is unreachable"
end

-- cluster:in_flight() -> the calls sent and not answered, and those waiting.
function Cluster:in_flight()
  local n = #self.delayed + #self.unrouted
  for _, node in pairs(self.nodes) do n = n + node:in_flight() end
  for node in pairs(self.retired) do n = n + node:in_flight() end
  return n
end

function Cluster:close()
  if self.closed then return end
  self.closed, self.ready = true, false
  for _, node in pairs(self.nodes) do node:close() end
  for node in pairs(self.retired) do node:close() end
  local waiting = self.unrouted
  for _, d in ipairs(self.delayed) do waiting[#waiting + 1] = d[1] end
  self.nodes, self.retired, self.delayed, self.unrouted = {}, {}, {}, {}
  for _, r in ipairs(waiting) do r.cb(nil, closed_error(), "connection") end
  self.timer:close()
end

return M
