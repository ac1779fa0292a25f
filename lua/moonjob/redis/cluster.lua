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
--     past MAX_HOPS redirections (nodes that disagree for now) the caller
--     gets the last one, kind "transient";
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
--     connections open to them) after 250 ms, then at gaps doubling to 1 s
--     while it comes back unchanged, until it changes (its replica
--     promoted) or the node is back; the calls waiting for it (never sent)
--     go to the slot's new owner.
--     Calls sent before a drop keep moonjob.redis.client's contract (cb's
--     fourth argument true: the caller's own retries, reports carry tokens).
-- The registry of queues (moonjob.redis.names.REGISTRY) is one key, on its
-- slot's owner; the library's own writes to it are refused there (another
-- slot), so this client writes it (moonjob.redis.cluster_registry). A
-- subscription is sharded (SSUBSCRIBE) on the primary serving its
-- channel's slot (the channel holds the queue's hash tag), moved with it.
local core = require "moonjob.core"
local loop = require "moonjob.loop"
local client = require "moonjob.redis.client"
local map = require "moonjob.redis.cluster_map"
local registry = require "moonjob.redis.cluster_registry"
local slots = require "moonjob.redis.slots"

local M = {}
local Cluster = {}
Cluster.__index = Cluster

local MAX_HOPS = 5              -- redirections one call follows
local DOWN_REFRESH_MS = 250     -- the map asked for again while a primary is down: after this,
local DOWN_REFRESH_MAX_MS = 1000 -- doubling up to this while it comes back unchanged (a promoted
                                 -- replica seen within 1 s; one small request a second)
local REFRESH_GAP_MS = 100      -- at most one request for the map in this time

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
    seen = {},        -- address -> true: every seed and node this client knew (without_address)
    refreshed_at = -math.huge, backoff = 0, down_wait = DOWN_REFRESH_MS,
  }, Cluster)
  for _, seed in ipairs(t.seeds) do self.seen[map.address(seed.host, seed.port)] = true end
  self.registry = registry.new(self)
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
  if down and not self.refresh_at then self.refresh_at = now + self.down_wait end
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
      local owner, primaries, text = map.read(reply, node)
      -- (while a primary stays down, the map is asked for less often as long as it is the same)
      self.down_wait = text == self.map_text and math.min(self.down_wait * 2, DOWN_REFRESH_MAX_MS) or DOWN_REFRESH_MS
      self.map_text = text
      self:_apply(owner, primaries)
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
  self.owner, self.known = owner, true
  for address, p in pairs(primaries) do self:_node(address, p.host, p.port) end
  for address, node in pairs(self.nodes) do
    if not primaries[address] then self:_retire(address, node) end
  end
  for address, node in pairs(self.nodes) do self:_reroute(address, node, false) end
  local unrouted = self.unrouted
  self.unrouted = {}
  for _, r in ipairs(unrouted) do self:_send(r) end
  local channels = {}
  for channel in pairs(self.subs) do channels[#channels + 1] = channel end
  for _, channel in ipairs(channels) do self:_place(channel) end
  self.registry:map_read()
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
  self.seen[address] = true
  return node
end

function Cluster:_node_state(address, node, up, why)
  if self.nodes[address] ~= node then return end
  self.settled[address] = true
  self.down_why[address] = not up and why or nil
  if not up then
    self.down_wait = DOWN_REFRESH_MS
    self:_refresh_soon()
  else
    self.registry:node_up(address)
  end
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
-- slot of args' key (slots.command_key). args.no_wait: a call for the
-- primary of a slot whose client is down (it said why, and the map names
-- no other owner) fails at once (kind "connection", never sent) instead of
-- waiting for it (a listing of every queue: a shard down costs nothing).
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
  if r.args.no_wait and not node.ready and self.down_why[address] then -- (the map names no other owner)
    return r.cb(nil, ("EREDIS: %s: %s: %s"):format(self.name, address, self.down_why[address]), "connection")
  end
  local args = r.args
  if asking then
    args = { unpack(r.args) }
    args.asking = true
  end
  node:call(args, function(v, err, kind, sent) self:_answer(r, address, v, err, kind, sent) end)
end

function Cluster:_answer(r, from, v, err, kind, sent)
  if err and kind ~= "connection" and not self.closed then
    local word, slot, to = map.redirection(err, from)
    if word and r.hops >= MAX_HOPS then -- (nodes that disagree, for now: the map is read again)
      self:_refresh_soon()
      return r.cb(nil, err, "transient")
    end
    if word then
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
  if not err and self.registry:after_call(r.args, function() r.cb(v, err, kind, sent) end) then return end
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
  local again = sub.placed
  sub.address, sub.placed = address, true
  self.nodes[address]:subscribe(channel, function(kind, message)
    if self.subs[channel] ~= sub or sub.address ~= address then return end
    if kind == "unsubscribed" then -- (the server dropped it: its slot moved)
      sub.address = nil
      return self:_refresh_soon()
    end
    sub.cb(kind, message)
  end, true)
  -- placed again: said here, as the node's own "resubscribed" may have
  -- come while it was not placed (and been dropped), or never come (the
  -- node's connection still subscribed)
  if again then sub.cb("resubscribed") end
end

-- cluster:register(name [, done]): a worker's queue in the registry
-- (moonjob.redis.names; best effort, as the library's), kept there while
-- this client lives (moonjob.redis.cluster_registry). done() once answered.
function Cluster:register(name, done)
  self.registry:register(name, done)
end

-- cluster:forget(name): the queue was obliterated; its next registering
-- call writes it in the registry again, and it is not written back before.
function Cluster:forget(name)
  self.registry:forget(name)
end

-- text with each occurrence of word (not inside a longer name or number)
-- replaced by with.
local function replace_word(text, word, with)
  local pattern = "()" .. word:gsub("%p", "%%%0") .. "()"
  return (text:gsub(pattern, function(from, to)
    if text:sub(from - 1, from - 1):match("[%w.:%-]") or text:sub(to, to):match("%d") then return nil end
    return with
  end))
end

-- cluster:without_address(text): as moonjob.redis.client's, for any node;
-- the address of any node or seed this client knew (a node retired, one
-- a redirection or the map named) replaced by "a node".
function Cluster:without_address(text)
  text = tostring(text)
  if text:find(self.name, 1, true) then return "Redis is unreachable" end
  for _, node in pairs(self.nodes) do
    if text:find(node.name, 1, true) then
      text = node:without_address(text)
      break
    end
  end
  for address in pairs(self.seen) do
    local host, port = map.split(address)
    local forms = { client.display(map.node_target(self.target, host, port)), "[" .. host .. "]:" .. port, address }
    for _, form in ipairs(forms) do text = replace_word(text, form, "a node") end
  end
  return text
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
  self.registry:close()
  self.timer:close()
end

return M
