-- moonjob.redis.client -- a Redis client on moonjob's loop: policy over
-- core.redis (one connection, mechanism in core/parent/redis.c).
--
-- What it adds: redis:// and rediss:// (TLS) URLs (user, password, db; the
-- password is never printed), the set-up of each connection (moonjob.redis.setup: AUTH and
-- SELECT, the eviction policy, moonjob's function library loaded when the
-- server's copy is not ours, a writable primary), reconnecting with back-off
-- and jitter, and calls made while the connection is being re-established
-- waiting for it (up to timeout_ms) rather than failing at once. Calls the
-- server refused without running them are sent again, unseen by the caller:
-- after "Function not found" (the library is loaded again on that
-- connection), and after READONLY, MASTERDOWN or LOADING (the server is not a
-- primary now: on a new connection, once the server is one; on_state hears
-- why, once). A subscription lives on a second connection of its own, PINGed
-- so that a dead link is noticed, and is renewed on each reconnect; its
-- callback then hears "resubscribed" (messages sent while it was down are
-- lost: the owner re-checks).
--
-- TLS (rediss://): the server's certificate and name are always checked
-- (core/parent/redis_tls.c); the URL's query gives the files, ca=, cert=,
-- key=, and the name checked, servername= (default: the host); the
-- environment's MOONJOB_REDIS_CA, MOONJOB_REDIS_CERT and MOONJOB_REDIS_KEY
-- stand in for what the query leaves out (cert and key as a pair).
--
-- redis+sentinel:// URLs: the primary asked of the sentinels, verified and
-- followed (moonjob.redis.sentinel; the hooks marked "Sentinel" below).
--
-- Caveats: no Unix sockets; no Cluster redirections here (a
-- redis+cluster:// URL gets moonjob.redis.cluster's client, the same face,
-- over one client of this file per primary: M.from_target, the hooks marked
-- "Cluster" below). An @ in a query value is written %40 (the last @ of a
-- URL ends its password; one left as such is refused).
local core = require "moonjob.core"
local loop = require "moonjob.loop"
local setup = require "moonjob.redis.setup"
local sentinel = require "moonjob.redis.sentinel"
local urls = require "moonjob.redis.url"

local M = {}
local Client = {}
Client.__index = Client

-- URLs are read and printed by moonjob.redis.url; these names stay here for
-- the modules that know them from the client.
M.parse, M.display, M.tls_defaults, M.query_in_auth = urls.parse, urls.display, urls.tls_defaults,
  urls.query_in_auth

-- M.open(target, host, port, timeout_ms, max_reply, on_event) -> conn | nil,
-- err: one connection (core.redis) to host:port, with target's TLS options
-- (a rediss:// URL's; the name checked is then target.tls.servername, else
-- host). Every connection of moonjob to Redis is opened here.
function M.open(target, host, port, timeout_ms, max_reply, on_event)
  return core.redis(host, port, timeout_ms, max_reply, on_event, target.tls)
end

-- A connection's reason to be down that a person must act on (TLS: a CA, a
-- name, a certificate; core/parent/redis_tls.c begins those with "TLS: ").
local function needs_a_person(why)
  return type(why) == "string" and why:match("^TLS: ") ~= nil
end

-- Server errors come back as they are; connection errors name the server.
local function connection_error(self, why)
  return ("EREDIS: %s: %s"):format(self.name, why or "not connected")
end

-- M.new(url, opts) -> client | nil, err. opts: timeout_ms (connect, replies and
-- waiting for a connection; default 5000), max_reply (bytes; default 64 MiB),
-- on_state(up, why) (the connection came up or went down).
function M.new(url, opts)
  if urls.is_cluster(url) then return require("moonjob.redis.cluster").new(url, opts) end -- Cluster
  local t, err = M.parse(url)
  if not t then return nil, err end
  return M.from_target(t, opts)
end

-- M.from_target(t, opts) -> client | nil, err: as M.new, on a target parse
-- made (Cluster: a node's, moonjob.redis.cluster).
function M.from_target(t, opts)
  opts = opts or {}
  local self = setmetatable({
    target = t, name = M.display(t),
    timeout_ms = opts.timeout_ms or 5000,
    sub_timeout_ms = math.max(opts.timeout_ms or 5000, 2000),
    max_reply = opts.max_reply or 64 * 1024 * 1024,
    on_state = opts.on_state,
    ready = false, closed = false, why = nil,
    waiting = {},        -- calls made while not ready: { args, cb, deadline, tries }
    reloads = {},        -- calls that met "Function not found", sent again once it is loaded
    retiring = {},       -- connections to a server that is not a primary now, closed once drained
    subscriptions = {},  -- channel -> cb
    sharded = {},        -- channel -> true: subscribed with SSUBSCRIBE
    said = {},           -- why -> true: the reasons on_state heard since the last "up"
    backoff = 0,
    sub_backoff = 0,     -- the subscription's own, as backoff
  }, Client)
  self.timer = core.timer(function() self:_tick() end)
  self.ping_timer = core.timer(function() self:_ping() end)
  if t.sentinels then self.sentinel = sentinel.new(self) end -- Sentinel: finds the primary
  self:_connect()
  if self.unusable then -- a TLS file that cannot be used: said at once
    local why = self.unusable
    self:close()
    return nil, connection_error(self, why)
  end
  return self
end

function Client:__tostring() return "moonjob redis client " .. self.name end

-- A connection error's reason with no part of the address, or nil when its
-- words hold some (then none is given).
local function plain_reason(self, why)
  why = why:match("^cannot connect to .-: (.+)$") or why
  if why:match("^cannot resolve ") then why = "its host name does not resolve" end
  local t = self.target
  local tls = t.tls or {}
  local parts = { "redis://", "rediss://", t.user or "redis://", tls.ca or t.host, tls.cert or t.host,
    tls.key or t.host, tls.servername or t.host }
  for _, s in ipairs(t.sentinels or { t }) do parts[#parts + 1], parts[#parts + 2] = s.host, ":" .. s.port end
  for _, part in ipairs(parts) do
    if why:find(part, 1, true) then return nil end
  end
  return (why:gsub("^(%u)(%l)", function(a, b) return a:lower() .. b end)) -- "Connection refused"
end

-- client:without_address(text) -> text, or, for an error of this client's
-- connection (it names the URL: user, host, port, database), "Redis is
-- unreachable: connection refused" with nothing of the URL: what a page
-- may be shown (the dashboard; the URL is for its operator's log).
function Client:without_address(text)
  text = tostring(text)
  local at = text:find(self.name, 1, true)
  if not at then return text end
  local reason = plain_reason(self, (text:sub(at + #self.name):gsub("^:%s*", "")))
  return reason and reason ~= "" and "Redis is unreachable: " .. reason or "Redis is unreachable"
end

function Client:_connect()
  if self.closed then return end
  local host, port = self.target.host, self.target.port
  if self.sentinel then -- Sentinel: nil while the sentinels are asked (_connect again once they answer)
    host, port = self.sentinel:calls_address()
    if not host then return end
  end
  local conn
  local err
  conn, err = M.open(self.target, host, port, self.timeout_ms, self.max_reply,
    function(kind, why)
      if self.conn ~= conn then
        if kind == "down" and self.retiring[conn] then self.retiring[conn] = nil; conn:close() end
        return
      end
      if kind == "up" then
        setup.run(conn, self.target, true, function(err, err_kind)
          if self.conn ~= conn then return end
          if err then
            conn:close()
            self.refused = err_kind == "refused" and err or nil
            return self:_down(err)
          end
          self:_up()
        end)
      else
        conn:close() -- down for good: free it
        self:_down(why)
      end
    end)
  if not conn then
    self.unusable = err
    return self:_down(err or "cannot start connecting")
  end
  self.conn = conn
  if not self.sub_pending or loop.now() >= (self.sub_retry_at or 0) then self:_resubscribe() end
end

function Client:_up()
  self.ready, self.why, self.backoff, self.said, self.refused = true, nil, 0, {}, nil
  self.sub_retry_at = nil -- the server is back: the subscription need not wait its back-off
  self:_flush()
  if self.on_state then self.on_state(true) end
end

-- The next back-off after `ms` (100 ms doubling to 5 s) and when it ends
-- (with jitter, so that clients cut off together do not come back together).
local function back_off(ms)
  ms = math.min(math.max(ms * 2, 100), 5000)
  return ms, loop.now() + ms * (0.5 + math.random())
end

-- Down: waiting calls keep waiting until their deadline, a new connection
-- starts after a back-off (back_off).
function Client:_down(why)
  local was_ready = self.ready
  if needs_a_person(why) then self.refused = why end
  if self.sentinel then why = self.sentinel:down(why) end -- Sentinel: the address and who named it
  self.ready, self.why, self.conn = false, why, nil
  if self.closed then return end
  self.backoff, self.reconnect_at = back_off(self.backoff)
  self.timer:start(50, 50)
  -- said once per reason while down: a server that refuses us (protected
  -- mode, a wrong password, a replica) must not look like a silent hang, nor
  -- fill a log (a replica that syncs alternates READONLY and LOADING)
  if was_ready then self.said = {} end
  if self.on_state and not self.said[why or ""] then
    self.said[why or ""] = true
    self.on_state(false, why)
  end
end

function Client:_tick()
  local now = loop.now()
  if #self.waiting > 0 then
    local keep = {}
    for _, w in ipairs(self.waiting) do
      if now >= w[3] then
        w[2](nil, connection_error(self, self.why), "connection")
      else
        keep[#keep + 1] = w
      end
    end
    self.waiting = keep
  end
  if not self.conn and not self.closed and now >= (self.reconnect_at or 0) then self:_connect() end
  if self.conn and #self.waiting == 0 and not self.sub_pending then self.timer:stop() end
  if self.sub_pending and now >= (self.sub_retry_at or 0) then self:_resubscribe() end
end

-- Refusals about the server's state rather than the call: the same call can
-- succeed later (memory freed, a script ended, the data loaded, the primary
-- found again, the library reloaded, replicas back for min-replicas-to-write,
-- the disk able to take the snapshot again).
local TRANSIENT = {
  OOM = true, BUSY = true, LOADING = true, READONLY = true, MASTERDOWN = true,
  TRYAGAIN = true, CLUSTERDOWN = true, NOSCRIPT = true, NOREPLICAS = true, MISCONF = true,
}

-- M.refusal_kind(err) -> "transient" | "reply" for a server's error message.
function M.refusal_kind(err)
  local code = type(err) == "string" and err:match("^(%u+)")
  if code and TRANSIENT[code] then return "transient" end
  if type(err) == "string" and err:find("Function not found", 1, true) then return "transient" end
  return "reply"
end

-- client:call(args, cb): cb(reply) or cb(nil, err, kind) with kind "reply"
-- (the server refused the call itself: err is its message), "transient" (the
-- server refused for now: M.refusal_kind) or "connection"; after a
-- "connection" error cb's fourth argument is true when the call was handed
-- to a connection (it may have run: its reply was lost), nil when it never
-- was (it waited for a connection until timeout_ms, the client closed, or
-- too many bytes already waited to be written: ENOBUFS). Refusals of a call
-- that never ran do not reach cb: "Function not found" (the library loaded
-- again, the call sent again, twice at most), READONLY, MASTERDOWN, LOADING
-- (not a primary now: it waits for the next connection, until timeout_ms
-- after it was made). tries, deadline: internal.
function Client:call(args, cb, tries, deadline)
  if self.closed then return cb(nil, "EREDIS: the client is closed", "connection") end
  local conn = self.conn
  deadline = deadline or loop.now() + self.timeout_ms
  if self.ready and conn then
    -- (args.asking: a cluster's ASK redirection, ASKING right before it)
    if args.asking then conn:command({ "ASKING" }, function() end) end -- Cluster
    local ok, err, code = conn:command(args, function(v, e, kind)
      if e and kind == "reply" then
        if self.sentinel and self.sentinel:hold(e, args, cb, tries, deadline) then return self:_settle(conn) end
        local state = setup.state_refusal(e)
        if state then return self:_retire(conn, state, args, cb, tries, deadline) end
        if setup.function_missing(e) and (tries or 0) < 2 then
          return self:_reload(conn, args, cb, (tries or 0) + 1, deadline)
        end
        kind = M.refusal_kind(e)
      elseif e then
        e = connection_error(self, e)
      end
      if kind ~= "connection" then self:_settle(conn) end
      cb(v, e, kind, kind == "connection" or nil)
    end)
    if ok then return end
    -- too many bytes wait to be written: waiting for a connection would not help
    if code == "ENOBUFS" then return cb(nil, connection_error(self, err), "connection") end
    self.why = err
  end
  self:_wait(args, cb, tries, deadline)
end

-- The call waits for a connection ready for it, until its deadline.
function Client:_wait(args, cb, tries, deadline)
  self.waiting[#self.waiting + 1] = { args, cb, deadline or loop.now() + self.timeout_ms, tries }
  self.timer:start(50, 50)
end

-- Sends what waited, in order: the calls a reload held first (sent first).
function Client:_flush()
  local reloads, waiting = self.reloads, self.waiting
  self.reloads, self.waiting = {}, {}
  for _, w in ipairs(reloads) do self:call(w[1], w[2], w[4], w[3]) end
  for _, w in ipairs(waiting) do self:call(w[1], w[2], w[4], w[3]) end
end

-- The server is not a primary now: no more calls on conn (the ones in
-- flight end there), said once through on_state, and a new connection after
-- the back-off, whose set-up checks for a primary again. The refused call
-- never ran: it waits for that connection.
function Client:_retire(conn, why, args, cb, tries, deadline)
  self:_wait(args, cb, tries, deadline)
  self:_retire_conn(conn, why)
end

-- No more calls on conn (the current one: down, for why); closed once
-- nothing is in flight on it.
function Client:_retire_conn(conn, why)
  if self.conn == conn then
    self.retiring[conn] = true
    self:_down(why)
  end
  self:_settle(conn)
end

-- A retiring connection is closed once nothing is in flight on it.
function Client:_settle(conn)
  if self.retiring[conn] and conn:pending() == 0 then
    self.retiring[conn] = nil
    conn:close()
  end
end

-- "Function not found": the library was flushed (FUNCTION FLUSH, a restart
-- without it). It is loaded again on this connection, once for every call
-- that met it meanwhile; those calls never ran, and are sent again, first.
function Client:_reload(conn, args, cb, tries, deadline)
  if self.conn ~= conn then return self:_wait(args, cb, tries, deadline) end -- the next connection loads it
  self.reloads[#self.reloads + 1] = { args, cb, deadline, tries }
  if self.reloading then return end
  self.reloading, self.ready = true, false -- new calls wait until it is loaded
  setup.ensure_library(conn, self.target, function(err, kind)
    self.reloading = false
    if self.conn ~= conn or kind == "connection" or kind == "state" then
      -- this connection goes (down, or not a primary): the next one loads it
      local reloads = self.reloads
      self.reloads = {}
      for _, w in ipairs(reloads) do self:_wait(w[1], w[2], w[4], w[3]) end
      if kind == "state" and self.conn == conn then self:_retire_conn(conn, err) end
      return
    end
    self.ready = true
    if err then -- refused (an ACL): the calls fail with why; the server's state, so transient
      local reloads = self.reloads
      self.reloads = {}
      for _, w in ipairs(reloads) do w[2](nil, err, "transient") end
    end
    self:_flush()
  end)
end

-- client:take_waiting([take]) -> { { args, cb }, ... }: the calls that wait
-- and were never sent (those take(args) is true for), no longer this
-- client's (Cluster: moved to the new owner of their slot).
function Client:take_waiting(take)
  local taken = {}
  for _, field in ipairs({ "reloads", "waiting" }) do
    local keep = {}
    for _, w in ipairs(self[field]) do
      if not take or take(w[1]) then taken[#taken + 1] = w else keep[#keep + 1] = w end
    end
    self[field] = keep
  end
  return taken
end

-- client:in_flight() -> the calls sent and not answered, and those waiting.
function Client:in_flight()
  local sent = 0
  if self.conn then sent = self.conn:pending() end
  for conn in pairs(self.retiring) do sent = sent + conn:pending() end
  return sent + #self.waiting + #self.reloads + (self.sentinel and #self.sentinel.held or 0) -- (Sentinel: NOREPLICAS)
end

-- client:call_wait(args) -> reply | nil, err: a blocking call (the REPL, a
-- script), or, inside a loop.async task, one that yields to the loop.
function Client:call_wait(args)
  local value, err = loop.await(function(cb) self:call(args, cb) end)
  return value, err
end

-- client:wait_ready() -> true | nil, err: waits up to timeout_ms for a connection.
function Client:wait_ready()
  -- a moment past timeout_ms: a connection that fails then says why (a TLS
  -- client at a plaintext port) rather than "no answer"
  local deadline = loop.now() + self.timeout_ms + 250
  loop.wait_until(function()
    return self.ready or self.closed or self.refused or loop.now() >= deadline
      or (self.why and loop.now() >= deadline - 250)
  end)
  if self.ready then return true end
  return nil, connection_error(self, self.why or "no answer")
end

-- Subscriptions: one more connection, set up like the first (AUTH, SELECT).
-- It waits for messages, so a link that died silently (a NAT or proxy that
-- forgot it, a cut cable) would never be noticed: it is PINGed every
-- sub_timeout_ms, and no answer within as long drops it (core/parent/redis.c);
-- it is then made again (after a back-off of its own, as the calls'
-- connection's) and cb hears "resubscribed". That timeout is
-- timeout_ms, at least 2 s: a busy server's slow answer costs a needless
-- resubscription, not a lost call, but should stay rare. sharded: SSUBSCRIBE
-- (Cluster: a shard channel); cb then hears "unsubscribed" when the server
-- dropped it (its slot moved to another node).
function Client:subscribe(channel, cb, sharded)
  self.subscriptions[channel] = cb
  self.sharded[channel] = sharded or nil
  self:_resubscribe()
  self.ping_timer:start(self.sub_timeout_ms, self.sub_timeout_ms)
end

-- client:unsubscribe(channel): its messages are no longer heard (the server
-- is not told: they are dropped here, and it is not subscribed again).
function Client:unsubscribe(channel)
  self.subscriptions[channel], self.sharded[channel] = nil, nil
end

-- A message on the subscription's connection, to its channel's callback.
local MESSAGES = { message = "message", smessage = "message", subscribe = "resubscribed",
  ssubscribe = "resubscribed", sunsubscribe = "unsubscribed" }

function Client:_heard(channel, msg)
  local cb, kind = self.subscriptions[channel], MESSAGES[msg[1]]
  if kind == "unsubscribed" and self.sub_channels then self.sub_channels[channel] = nil end
  if not cb or not kind then return end
  if kind == "message" then cb(kind, msg[3]) else cb(kind) end
end

function Client:_ping()
  if self.sub and self.sub_up then self.sub:ping() end -- nil, err before SUBSCRIBE was sent: no matter
end

function Client:_resubscribe()
  if next(self.subscriptions) == nil or self.closed then return end
  if self.sub and self.sub_up then
    for channel in pairs(self.subscriptions) do
      if not self.sub_channels[channel] then
        self.sub_channels[channel] = true
        self.sub:subscribe({ self.sharded[channel] and "SSUBSCRIBE" or "SUBSCRIBE", channel }, function(msg, err)
          if not err then return self:_heard(channel, msg) end
          -- (SSUBSCRIBE refused: MOVED, the slot is another node's; a drop ends every channel)
          if self.sharded[channel] then self:_heard(channel, { "sunsubscribe" }) end
        end)
      end
    end
    return
  end
  if self.sub then return end
  local host, port = self.target.host, self.target.port
  if self.sentinel then -- Sentinel: the primary of the calls' connection, once known
    host, port = self.sentinel:subscription_address()
    if not host then return self:_sub_later() end
  end
  self.sub_pending = nil
  local sub
  sub = M.open(self.target, host, port, self.sub_timeout_ms, self.max_reply,
    function(kind)
      if self.sub ~= sub then return end
      if kind == "up" then
        setup.run(sub, self.target, false, function(err)
          if self.sub ~= sub then return end
          if err then -- refused (a password): try again later, as after a drop
            sub:close()
            self.sub = nil
            return self:_sub_later()
          end
          self.sub_up, self.sub_channels, self.sub_backoff = true, {}, 0
          self:_resubscribe()
        end)
      else
        sub:close()
        self.sub, self.sub_up = nil, false
        self:_sub_later()
      end
    end)
  self.sub, self.sub_up = sub, false
  if not sub then self:_sub_later() end
end

-- The subscription's connection is made again after a back-off (100 ms
-- doubling to 5 s, with jitter; back to 100 ms once it is set up): a server
-- that refuses it (a wrong password) or is down is not hammered.
function Client:_sub_later()
  self.sub_pending = true
  self.sub_backoff, self.sub_retry_at = back_off(self.sub_backoff)
  self.timer:start(50, 50)
end

function Client:close()
  if self.closed then return end
  self.closed, self.ready = true, false
  if self.sentinel then self.sentinel:close() end -- Sentinel
  if self.conn then self.conn:close() end
  if self.sub then self.sub:close() end
  for conn in pairs(self.retiring) do conn:close() end
  self.conn, self.sub, self.retiring = nil, nil, {}
  local reloads, waiting = self.reloads, self.waiting
  self.reloads, self.waiting = {}, {}
  for _, list in ipairs({ reloads, waiting }) do
    for _, w in ipairs(list) do w[2](nil, "EREDIS: the client is closed", "connection") end
  end
  self.timer:close()
  self.ping_timer:close()
end

return M
