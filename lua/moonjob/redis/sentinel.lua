-- moonjob.redis.sentinel -- redis+sentinel:// URLs: the primary of a Redis
-- Sentinel group found, verified and followed for moonjob.redis.client
-- (client.sentinel; the hooks in client.lua call it), as Redis's "Sentinel
-- client spec" describes:
--
--   redis+sentinel://[user:password@]host1[:port1],host2[:port2],.../MASTER[/DB]
--     [?sentinel_user=U&sentinel_password=P]
--
-- (26379 by default; the user and password are the data servers', the query
-- gives the sentinels' own; rediss+sentinel:// is the same over TLS, to the
-- sentinels and the data servers alike, with the query keys ca, cert, key
-- and servername.)
--
--   * Before each connection the sentinels are asked in turn, each on a
--     short-lived connection with a short timeout (ASK_MS), `SENTINEL
--     get-master-addr-by-name MASTER`; the first that names an address
--     goes first next time. None answers: the client is down for that
--     reason and tries again after its back-off; each answers and none
--     knows the name: refused, a person must act (the name in the URL).
--   * The connection's set-up (moonjob.redis.setup, through M.set_up)
--     checks ROLE after AUTH: a server that is not a master now is down
--     for the "state" reason, and the sentinels are asked again after the
--     back-off. The subscription's connection goes to the same primary.
--   * A watch: one connection to a sentinel subscribed to +switch-master.
--     A message for our master moves the client at once: the connection to
--     the old primary is retired (calls in flight end there, as
--     client.lua's READONLY path does; calls not sent wait), a new one
--     made to the new address, the subscription moved too. A lost watch is
--     made again on the next sentinel of the list (after a back-off), and
--     the address asked again then, since a message may have been missed.
--   * NOREPLICAS (min-replicas-to-write: the primary lost its replicas, as
--     an old primary does the moment a switchover takes its replica) is
--     taken like READONLY: the call never ran, it waits for the next
--     connection, and the sentinels are asked again.
--   * on_state hears the primary's address when it changes, once: up with
--     "primary for MASTER is now HOST:PORT (Sentinel)".
local core = require "moonjob.core"

local M = {}
local Sentinel = {}
Sentinel.__index = Sentinel

M.PORT = 26379
local ASK_MS = 1000 -- a sentinel's connect and answer: short, the next one is asked after it
local MAX_REPLY = 64 * 1024
local TLS_KEYS = { ca = true, cert = true, key = true, servername = true }
local OWN_KEYS = { sentinel_user = true, sentinel_password = true }

local NOREPLICAS = "the primary has fewer replicas than min-replicas-to-write (NOREPLICAS): a switchover may be"
  .. " taking it away; asking the sentinels again"
local REASONS = {
  READONLY = "the server the sentinels named is a replica now (READONLY): asking them for the primary again",
  MASTERDOWN = "the server the sentinels named is a replica cut off from its primary (MASTERDOWN): asking them"
    .. " for the primary again",
  ROLE = "the server the sentinels named is not a master now (ROLE): asking them for the primary again",
}

local function unescape(s)
  return (s:gsub("%%(%x%x)", function(h) return string.char(tonumber(h, 16)) end))
end

local function address(s)
  return (s.host:find(":") and "[" .. s.host .. "]" or s.host) .. ":" .. s.port
end

local function parse_hosts(list)
  if list == "" then
    return nil, "a redis+sentinel:// URL needs at least one sentinel: redis+sentinel://127.0.0.1:26379/mymaster/0"
  end
  local out = {}
  for item in (list .. ","):gmatch("([^,]*),") do
    if item == "" then return nil, "an empty sentinel address in the URL's list (two commas, or one at an end)" end
    local host, port = item:match("^%[([^%]]+)%]:?(.*)$")
    if not host then host, port = item:match("^([^:]*):?(.*)$") end
    if host == "" or not port:match("^%d*$") then
      return nil, ("'%s' is not host:port (a sentinel of a redis+sentinel:// URL)"):format(item)
    end
    port = port == "" and M.PORT or tonumber(port)
    if port < 1 or port > 65535 then
      return nil, ("the port of sentinel '%s' must be from 1 to 65535"):format(item)
    end
    out[#out + 1] = { host = host, port = port }
  end
  return out
end

-- The query's settings into t: the sentinels' user and password, and for
-- rediss+sentinel:// the TLS ones (t.tls).
local function parse_query(t, query)
  if query == "" then return true end
  local known = "sentinel_user, sentinel_password" .. (t.tls and ", ca, cert, key, servername" or "")
  for pair in (query .. "&"):gmatch("([^&]*)&") do
    local name, value = pair:match("^([^=]*)=(.*)$")
    name = name or pair
    if TLS_KEYS[name] and not t.tls then
      return nil, ("'%s' is a TLS setting: write rediss+sentinel:// to reach the servers over TLS"):format(name)
    end
    if not TLS_KEYS[name] and not OWN_KEYS[name] then
      return nil, ("unknown setting '%s' in a Sentinel URL (it takes %s)"):format(name, known)
    end
    if not value or value == "" then return nil, ("'%s' needs a value: %s=..."):format(name, name) end
    if TLS_KEYS[name] then t.tls[name] = unescape(value) else t[name] = unescape(value) end
  end
  return true
end

-- M.parse(url) -> { sentinels = { {host, port}, ... }, master, db, user,
-- password, sentinel_user, sentinel_password, tls, scheme } | nil, err.
-- The user info ends at the last @ (a password may hold @ and ?); the query
-- starts at the first ? after it (its values write @ as %40).
function M.parse(url)
  local scheme, rest = url:match("^(rediss?%+sentinel)://(.*)$")
  if not scheme then return nil, "not a redis+sentinel:// URL" end
  local t = { scheme = scheme, db = 0, tls = scheme == "rediss+sentinel" and {} or nil }
  local auth, after = rest:match("^(.*)@([^@]*)$")
  local at_err = auth and require("moonjob.redis.client").query_in_auth(auth) -- (client requires this module)
  if at_err then return nil, at_err end
  if auth then
    local user, password = auth:match("^([^:]*):(.*)$")
    if user then
      t.user, t.password = user ~= "" and unescape(user) or nil, unescape(password)
    else
      t.password = unescape(auth)
    end
    rest = after
  end
  local main, query = rest:match("^([^?]*)%??(.*)$")
  local hosts, path = main:match("^([^/]*)(.*)$")
  local err
  t.sentinels, err = parse_hosts(hosts)
  if not t.sentinels then return nil, err end
  local master, db = path:match("^/([^/]*)/?(.*)$")
  if not master or master == "" then
    return nil, "a redis+sentinel:// URL needs the master's name after the sentinels:"
      .. " redis+sentinel://127.0.0.1:26379/mymaster/0"
  end
  t.master = unescape(master)
  if db ~= "" then
    t.db = tonumber(db)
    if not t.db or t.db < 0 or t.db % 1 ~= 0 then
      return nil, ("the database in a Redis URL must be a number, not '%s'"):format(db)
    end
  end
  local ok, qerr = parse_query(t, query)
  if not ok then return nil, qerr end
  if t.tls then require("moonjob.redis.client").tls_defaults(t.tls) end -- (client requires this module)
  return t
end

-- The URL as it may be printed: passwords as ***, no TLS settings.
function M.display(t)
  local auth = t.password and ((t.user or "") .. ":***@") or ""
  local hosts, query = {}, {}
  for i, s in ipairs(t.sentinels) do hosts[i] = address(s) end
  if t.sentinel_user then query[#query + 1] = "sentinel_user=" .. t.sentinel_user end
  if t.sentinel_password then query[#query + 1] = "sentinel_password=***" end
  return ("%s://%s%s/%s/%d%s"):format(t.scheme, auth, table.concat(hosts, ","), t.master, t.db,
    #query > 0 and "?" .. table.concat(query, "&") or "")
end

-- Every connection to a sentinel opens here (the TLS settings go with it).
function M.open(t, host, port, timeout_ms, cb)
  return core.redis(host, port, timeout_ms, MAX_REPLY, cb, t.tls)
end

-- The set-up's step after AUTH: the server must say it is a master. ROLE
-- refused (an ACL): moonjob_writable, later, still checks for a primary.
local function check_role(conn, next)
  local ok, err = conn:command({ "ROLE" }, function(v, e, kind)
    if kind == "connection" then return next(e, "connection") end
    if not e and type(v) == "table" and v[1] ~= "master" then return next(REASONS.ROLE, "state") end
    next()
  end)
  if not ok then next(err, "connection") end
end

-- For moonjob.redis.setup's run on a sentinel-guided connection: the ROLE
-- step (steps holds AUTH and SELECT so far), and NOREPLICAS met in the
-- set-up told as the server's state (ask again) rather than a refusal.
function M.set_up(steps, done)
  steps[#steps + 1] = check_role
  return steps, function(err, kind)
    if err and kind ~= "connection" and err:match("^NOREPLICAS") then return done(NOREPLICAS, "state") end
    done(err, kind)
  end
end

-- AUTH on a sentinel, when the URL gives the sentinels a password; cb(err).
local function sentinel_auth(conn, t, cb)
  if not t.sentinel_password then return cb() end
  local args = t.sentinel_user and { "AUTH", t.sentinel_user, t.sentinel_password } or { "AUTH", t.sentinel_password }
  local ok, err = conn:command(args, function(_, e)
    cb(e and (e .. " (check sentinel_user and sentinel_password in the URL)") or nil)
  end)
  if not ok then cb(err) end
end

-- M.new(client) -> the guide of a client made from a redis+sentinel://
-- URL; it starts watching for +switch-master at once.
function M.new(c)
  local self = setmetatable({
    client = c, target = c.target,
    primary = nil,     -- { host, port }: the address last named (a lookup, or +switch-master)
    current = nil,     -- the address the calls' connection went to last
    fresh = false,     -- primary was named since the last connection was made
    asking = false,    -- a lookup for the calls' connection is under way
    epoch = 0,         -- +1 at each switch: an answer asked for before it is stale
    announced = nil,   -- the address on_state last heard
    asks = {},         -- the lookups' connections: closed with the client
    watch_backoff = 0,
  }, Sentinel)
  local on_state = c.on_state
  c.on_state = function(up, why)
    if up then why = self:_news() else why = self:_reason(why) end
    if on_state then on_state(up, why) end
  end
  self.ping_timer = core.timer(function()
    if self.watch and self.watch_up then self.watch:ping() end
  end)
  self.ping_timer:start(c.sub_timeout_ms, c.sub_timeout_ms)
  self.retry_timer = core.timer(function() self:_watch() end)
  self:_watch()
  return self
end

-- Sends args to sentinel s on a connection of its own, closed after;
-- cb(value) or cb(nil, why), once.
function Sentinel:_ask(s, args, cb)
  local conn, done
  local function finish(v, err)
    if done then return end
    done = true
    if conn then
      self.asks[conn] = nil
      conn:close()
    end
    cb(v, err)
  end
  conn = M.open(self.target, s.host, s.port, ASK_MS, function(kind, why)
    if kind ~= "up" then return finish(nil, why or "connection lost") end
    sentinel_auth(conn, self.target, function(err)
      if err then return finish(nil, err) end
      local ok, cerr = conn:command(args, function(v, e) finish(v, e) end)
      if not ok then finish(nil, cerr) end
    end)
  end)
  if not conn then return finish(nil, "cannot start connecting") end
  self.asks[conn] = true
end

-- Why a lookup named no primary; true: every sentinel that answered knows
-- no such master (the URL's name is wrong: a person must act).
local function lookup_failure(t, errors, unknown, count)
  if unknown > 0 then
    return ("no sentinel knows a master named '%s' (%d of %d asked answered nothing%s): check the name in the"
      .. " URL against `sentinel monitor` in the sentinels' configuration"):format(t.master, unknown, count,
      #errors > 0 and "; " .. table.concat(errors, "; ") or ""), true
  end
  return ("no sentinel answered (%s)"):format(table.concat(errors, "; "))
end

-- Asks the sentinels in turn where the primary is: cb(addr) or cb(nil,
-- why, refused). The first that names it goes first in the list.
function Sentinel:_lookup(cb)
  local t = self.target
  local order, errors, unknown, i = { unpack(t.sentinels) }, {}, 0, 0
  local function next_one()
    i = i + 1
    local s = order[i]
    if not s then return cb(nil, lookup_failure(t, errors, unknown, #order)) end
    self:_ask(s, { "SENTINEL", "get-master-addr-by-name", t.master }, function(v, err)
      if self.closed then return end
      local port = type(v) == "table" and tonumber(v[2])
      if port and type(v[1]) == "string" then
        for k, x in ipairs(t.sentinels) do
          if x == s then table.insert(t.sentinels, 1, table.remove(t.sentinels, k)) break end
        end
        return cb({ host = v[1], port = port })
      end
      if err then errors[#errors + 1] = ("%s: %s"):format(address(s), err) else unknown = unknown + 1 end
      next_one()
    end)
  end
  next_one()
end

-- For client:_connect: the primary's host and port for the calls'
-- connection, or nil while the sentinels are asked (then _connect runs
-- again once they named it; if they did not, the client is down for why).
function Sentinel:calls_address()
  if self.fresh then
    self.fresh, self.current = false, self.primary
    return self.primary.host, self.primary.port
  end
  if self.asking then return nil end
  self.asking = true
  local epoch = self.epoch
  self:_lookup(function(addr, why, refused)
    self.asking = false
    local c = self.client
    if self.closed or epoch ~= self.epoch then return end -- (+switch-master meanwhile: its address went first)
    if not addr then
      c.refused = refused and why or nil
      return c:_down(why)
    end
    self.primary, self.fresh = addr, true
    c:_connect()
  end)
  return nil
end

-- For client:_resubscribe: the primary the calls' connection went to, or
-- nil before one is known (it tries again later).
function Sentinel:subscription_address()
  local p = self.current
  self.sub_at = p and address(p)
  if p then return p.host, p.port end
end

-- The subscription's connection made again to the current primary.
local function move_subscription(c)
  if c.sub then
    c.sub:close()
    c.sub, c.sub_up = nil, false
  end
  c:_resubscribe()
end

-- What on_state's "up" says: the primary's address when it changed.
function Sentinel:_news()
  local p = self.current
  if not p then return nil end
  local at = address(p)
  if self.sub_at ~= at then move_subscription(self.client) end
  if at == self.announced then return nil end
  local again = self.announced ~= nil
  self.announced = at
  return ("primary for %s is %s%s (Sentinel)"):format(self.target.master, again and "now " or "", at)
end

-- A state refusal's reason as said for a primary the sentinels name.
function Sentinel:_reason(why)
  if type(why) ~= "string" then return why end
  local code = why:match("%((READONLY)%)") or why:match("%((MASTERDOWN)%)")
  return code and REASONS[code] or why
end

-- For client:call: NOREPLICAS is a state refusal here (the call never ran).
function Sentinel:state_refusal(err)
  if type(err) == "string" and err:match("^NOREPLICAS") then return NOREPLICAS end
end

-- The primary is now addr: the calls' connection moves there at once (the
-- old one retired: its calls in flight end there), the subscription too.
function Sentinel:_switch(addr, why)
  local c = self.client
  if self.closed or c.closed then return end
  self.epoch = self.epoch + 1
  self.primary = addr
  local cur = self.current
  if c.conn and cur and cur.host == addr.host and cur.port == addr.port then return end -- (there already)
  self.fresh = true
  local old = c.conn
  if old and c.ready then
    c:_retire_conn(old, why)
  elseif old then -- still being set up: no call of the caller's is on it
    c:_down(why)
    old:close()
  end
  c.backoff, c.reconnect_at = 0, 0
  c:_connect()
end

-- "+switch-master MASTER OLD_IP OLD_PORT NEW_IP NEW_PORT"
function Sentinel:_message(text)
  local name, host, port = tostring(text):match("^(%S+) %S+ %S+ (%S+) (%d+)$")
  if name ~= self.target.master then return end
  self:_switch({ host = host, port = tonumber(port) },
    ("Sentinel moved the primary for %s (+switch-master)"):format(name))
end

-- After the watch is (re)made: a switch may have been missed meanwhile.
function Sentinel:_check(s)
  local epoch = self.epoch
  self:_ask(s, { "SENTINEL", "get-master-addr-by-name", self.target.master }, function(v)
    local port = type(v) == "table" and tonumber(v[2])
    local p = self.primary
    if self.closed or epoch ~= self.epoch or not port or not p then return end
    if v[1] ~= p.host or port ~= p.port then
      self:_switch({ host = v[1], port = port }, ("Sentinel names another primary for %s"):format(self.target.master))
    end
  end)
end

-- The sentinel after s in the list (the first when s is none of them).
local function after(list, s)
  for k, x in ipairs(list) do
    if x == s then return list[k % #list + 1] end
  end
  return list[1]
end

function Sentinel:_watch()
  if self.closed or self.watch then return end
  local t = self.target
  local s = after(t.sentinels, self.watched)
  self.watched = s
  local conn
  conn = M.open(t, s.host, s.port, self.client.sub_timeout_ms, function(kind)
    if self.watch ~= conn then return end
    if kind ~= "up" then return self:_watch_lost() end
    sentinel_auth(conn, t, function(err)
      if self.watch ~= conn then return end
      if err then return self:_watch_lost() end
      local ok = conn:subscribe({ "SUBSCRIBE", "+switch-master" }, function(msg, serr)
        if serr or self.watch ~= conn then return end
        if msg[1] == "subscribe" then
          self.watch_up, self.watch_backoff = true, 0
          self:_check(s)
        elseif msg[1] == "message" then
          self:_message(msg[3])
        end
      end)
      if not ok then self:_watch_lost() end
    end)
  end)
  self.watch, self.watch_up = conn, false
  if not conn then self:_watch_lost() end
end

-- The watch is made again on the next sentinel, after a back-off (100 ms
-- doubling to 5 s, with jitter; back to 100 ms once subscribed).
function Sentinel:_watch_lost()
  if self.watch then self.watch:close() end
  self.watch, self.watch_up = nil, false
  if self.closed then return end
  self.watch_backoff = math.min(math.max(self.watch_backoff * 2, 100), 5000)
  self.retry_timer:start(math.floor(self.watch_backoff * (0.5 + math.random())))
end

function Sentinel:close()
  if self.closed then return end
  self.closed = true
  if self.watch then self.watch:close() end
  self.watch = nil
  for conn in pairs(self.asks) do conn:close() end
  self.asks = {}
  self.ping_timer:close()
  self.retry_timer:close()
end

return M
