-- moonjob.redis.sentinel -- redis+sentinel:// URLs (their form:
-- moonjob.redis.sentinel_url): the primary of a Redis Sentinel group found,
-- verified and followed for moonjob.redis.client (client.sentinel; the
-- hooks in client.lua call it), as Redis's "Sentinel client spec" describes:
--
--   * Before each connection the sentinels are asked in the list's order,
--     each on a short-lived connection with a short timeout (ASK_MS),
--     `SENTINEL get-master-addr-by-name MASTER`. None answers: the client
--     is down for that reason and tries again after its back-off; each
--     answers and none knows the name, or each fails with a TLS error:
--     refused, a person must act.
--   * The connection's set-up (moonjob.redis.setup, through M.set_up)
--     checks ROLE after AUTH: a server that is not a master now is down
--     for the "state" reason, and the sentinels are asked again after the
--     back-off. The subscription's connection goes to the same primary.
--   * The sentinel that named the address goes first in the list once the
--     address passed every check; when it fails them (no connection, not a
--     master, READONLY...) or answers READONLY later, the list turns to
--     start after that sentinel and the watch leaves it: a sentinel cut off
--     from its peers that keeps naming a dead primary does not hold the
--     client. The client's reasons name both ("HOST:PORT, named by
--     HOST:PORT: ...").
--   * A watch: one connection to a sentinel subscribed to +switch-master.
--     A message for our master moves the client at once: the connection to
--     the old primary is retired (calls in flight end there, as
--     client.lua's READONLY path does; calls not sent wait), a new one
--     made to the new address, the subscription moved too. A lost watch is
--     made again on the next sentinel of the list (after a back-off), and
--     the address asked again then, since a message may have been missed.
--     While no watch is up (a sentinel user refused the channel: said
--     once) the address is asked every sub_timeout_ms.
--   * NOREPLICAS (min-replicas-to-write: the primary's replicas lag or are
--     gone) stops writes, not the client: the connection stays (reads go
--     on), the refused call (it never ran) is sent again every HOLD_MS
--     until its deadline, then its caller gets the refusal ("transient");
--     the sentinels are asked (at most once every CONFIRM_MS) in case a
--     switchover is taking the primary away, and the client moves if they
--     name another.
--   * on_state hears the primary's address when it changes, once: up with
--     "primary for MASTER is now HOST:PORT (Sentinel)".
local core = require "moonjob.core"
local loop = require "moonjob.loop"
local url = require "moonjob.redis.sentinel_url"

local M = {}
local Sentinel = {}
Sentinel.__index = Sentinel

M.parse, M.display = url.parse, url.display -- (for client.lua)
local address = url.address

local ASK_MS = 1000 -- a sentinel's connect and answer: short, the next one is asked after it
local HOLD_MS = 250 -- a call refused with NOREPLICAS is sent again after it
local CONFIRM_MS = 1000 -- NOREPLICAS: the sentinels asked at most once in it
local MAX_REPLY = 64 * 1024

local NOREPLICAS = "the primary has fewer replicas than min-replicas-to-write (NOREPLICAS) and could not load the"
  .. " function library: asking the sentinels again"
local REASONS = {
  READONLY = "a replica now (READONLY): asking the sentinels for the primary again",
  MASTERDOWN = "a replica cut off from its primary (MASTERDOWN): asking the sentinels for the primary again",
  ROLE = "not a master now (ROLE): asking the sentinels for the primary again",
}

-- Every connection to a sentinel opens here (the sentinels' TLS settings
-- go with it).
function M.open(t, host, port, timeout_ms, cb)
  return core.redis(host, port, timeout_ms, MAX_REPLY, cb, t.sentinel_tls)
end

-- A plaintext connection closed before any reply (a TLS port, likely): the
-- hint names this URL's TLS form.
local function tls_form(why)
  return type(why) == "string" and (why:gsub("use a rediss:// URL", "use a rediss+sentinel:// URL")) or why
end

-- A TLS error of a sentinel's connection names the sentinels' setting.
local function sentinel_error(why)
  return type(why) == "string" and (tls_form(why):gsub("give servername=", "give sentinel_servername=")) or why
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
-- set-up (loading the library: a write) told as the server's state (ask
-- again) rather than a refusal; moonjob_writable's NOREPLICAS, after ROLE
-- said master, passes (moonjob.redis.setup).
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
    primary = nil,     -- { host, port, by }: the address last named, by sentinel `by`
    current = nil,     -- the address the calls' connection went to last
    subject = nil,     -- current while the calls' connection to it stands (Sentinel:down)
    checked = false,   -- that connection passed the set-up's checks
    fresh = false,     -- primary was named since the last connection was made
    asking = false,    -- a lookup for the calls' connection is under way
    epoch = 0,         -- +1 at each switch: an answer asked for before it is stale
    announced = nil,   -- the address on_state last heard
    asks = {},         -- the lookups' connections: closed with the client
    held = {},         -- calls refused with NOREPLICAS: { args, cb, deadline, tries, err }
    watch_backoff = 0,
  }, Sentinel)
  local on_state = c.on_state
  c.on_state = function(up, why) -- (a down's why is Sentinel:down's already)
    if up then why = self:_news() end
    if on_state then on_state(up, why) end
  end
  self.ping_timer = core.timer(function() -- the watch PINGed; without one, the address asked
    if self.watch and self.watch_up then self.watch:ping() else self:_poll() end
  end)
  self.ping_timer:start(c.sub_timeout_ms, c.sub_timeout_ms)
  self.retry_timer = core.timer(function() self:_watch() end)
  self.hold_timer = core.timer(function() self:_resend() end)
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
    if kind ~= "up" then return finish(nil, sentinel_error(why) or "connection lost") end
    sentinel_auth(conn, self.target, function(err)
      if err then return finish(nil, err) end
      local ok, cerr = conn:command(args, function(v, e) finish(v, e) end)
      if not ok then finish(nil, cerr) end
    end)
  end)
  if not conn then return finish(nil, "cannot start connecting") end
  self.asks[conn] = true
end

-- Why a lookup named no primary; true: a person must act (every sentinel
-- that answered knows no such master: the URL's name is wrong; or every
-- one failed with a TLS error: a CA, a name, a certificate).
local function lookup_failure(t, errors, unknown, count)
  if unknown > 0 then
    return ("no sentinel knows a master named '%s' (%d of %d asked answered nothing%s): check the name in the"
      .. " URL against `sentinel monitor` in the sentinels' configuration"):format(t.master, unknown, count,
      #errors > 0 and "; " .. table.concat(errors, "; ") or ""), true
  end
  local tls = #errors == count
  for _, e in ipairs(errors) do tls = tls and e:match("^%S+: TLS: ") ~= nil end
  if tls then return ("no sentinel could be reached over TLS (%s)"):format(table.concat(errors, "; ")), true end
  return ("no sentinel answered (%s)"):format(table.concat(errors, "; "))
end

-- A sentinel's answer to get-master-addr-by-name: { host, port, by = s }, or nil.
local function named(v, s)
  local port = type(v) == "table" and tonumber(v[2])
  if port and type(v[1]) == "string" then return { host = v[1], port = port, by = s } end
end

local function same(a, b)
  return a ~= nil and b ~= nil and a.host == b.host and a.port == b.port
end

-- Asks the sentinels in the list's order where the primary is: cb(addr,
-- addr.by the sentinel that named it) or cb(nil, why, refused).
function Sentinel:_lookup(cb)
  local t = self.target
  local order, errors, unknown, i = { unpack(t.sentinels) }, {}, 0, 0
  local function next_one()
    i = i + 1
    local s = order[i]
    if not s then return cb(nil, lookup_failure(t, errors, unknown, #order)) end
    self:_ask(s, { "SENTINEL", "get-master-addr-by-name", t.master }, function(v, err)
      if self.closed then return end
      local addr = named(v, s)
      if addr then return cb(addr) end
      if err then errors[#errors + 1] = ("%s: %s"):format(address(s), err) else unknown = unknown + 1 end
      next_one()
    end)
  end
  next_one()
end

-- The list turned to start after s (s asked last).
local function turn_after(list, s)
  for k, x in ipairs(list) do
    if x == s then
      for _ = 1, k do table.insert(list, (table.remove(list, 1))) end
      return
    end
  end
end

-- s put first in the list.
local function to_front(list, s)
  for k, x in ipairs(list) do
    if x == s then return table.insert(list, 1, table.remove(list, k)) end
  end
end

-- For client:_connect: the primary's host and port for the calls'
-- connection, or nil while the sentinels are asked (then _connect runs
-- again once they named it; if they did not, the client is down for why).
function Sentinel:calls_address()
  if self.fresh then
    self.fresh, self.current, self.subject, self.checked = false, self.primary, self.primary, false
    return self.primary.host, self.primary.port
  end
  if self.asking then return nil end
  self.asking, self.subject = true, nil
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

-- What on_state's "up" says: the primary's address when it changed, and
-- a notice not said yet (the watch refused). The connection passed every
-- check: the sentinel that named it goes first in the list.
function Sentinel:_news()
  local p = self.current
  if not p then return nil end
  if self.subject and not self.checked then to_front(self.target.sentinels, self.subject.by) end
  self.checked = true
  local at, news = address(p), nil
  if self.sub_at ~= at then move_subscription(self.client) end
  if at ~= self.announced then
    news = ("primary for %s is %s%s (Sentinel)"):format(self.target.master, self.announced and "now " or "", at)
    self.announced = at
  end
  local notice = self.notice
  self.notice = nil
  if news and notice then return news .. "; " .. notice end
  return news or notice
end

-- A state refusal's reason as said for a primary the sentinels name.
local function reason(why)
  if type(why) ~= "string" then return why end
  why = tls_form(why)
  local code = why:match("%((READONLY)%)") or why:match("%((MASTERDOWN)%)")
  return code and REASONS[code] or why
end

-- For client:_down: why, as said of the calls' connection; when it went to
-- an address a sentinel named, why names both. When that address failed
-- the set-up's checks (no connection, not a master, READONLY...), or is a
-- replica now, the next lookup starts after that sentinel, and the watch
-- leaves it. (A connection lost after its checks is no sentinel's fault.)
function Sentinel:down(why)
  why = reason(why)
  local p = self.subject
  if not p or not p.by then return why end
  self.subject = nil
  if not self.checked or why == REASONS.READONLY or why == REASONS.MASTERDOWN then
    turn_after(self.target.sentinels, p.by)
    if self.watched == p.by and self.watch then self:_watch_lost() end
  end
  local plain = type(why) == "string" and why:match("^cannot connect to .-: (.+)$") or why
  return ("%s, named by %s: %s"):format(address(p), address(p.by), tostring(plain or "connection lost"))
end

-- For client:call, a reply refused: true when the Sentinel took the call
-- (NOREPLICAS: the primary's replicas lag or are gone; it is still the
-- primary). The call never ran: it is sent again every HOLD_MS until its
-- deadline, then its caller gets the refusal (kind "transient"); the
-- sentinels are asked meanwhile, in case a switchover is taking the
-- primary away.
function Sentinel:hold(err, args, cb, tries, deadline)
  if type(err) ~= "string" or not err:match("^NOREPLICAS") then return false end
  self.held[#self.held + 1] = { args, cb, deadline, tries, err }
  if #self.held == 1 then self.hold_timer:start(HOLD_MS) end
  self:_confirm()
  return true
end

function Sentinel:_resend()
  local held, now, c = self.held, loop.now(), self.client
  self.held = {}
  for _, h in ipairs(held) do
    if now >= h[3] then h[2](nil, h[5], "transient") else c:call(h[1], h[2], h[4], h[3]) end
  end
end

-- The primary the sentinels name now, asked at most once every CONFIRM_MS.
function Sentinel:_confirm()
  local now = loop.now()
  if self.confirming or now < (self.confirmed_at or -CONFIRM_MS) + CONFIRM_MS then return end
  self.confirming, self.confirmed_at = true, now
  local epoch = self.epoch
  self:_lookup(function(addr)
    self.confirming = false
    self:_follow(addr, epoch, "the primary refused writes for too few replicas (NOREPLICAS) and Sentinel names"
      .. " another primary for %s")
  end)
end

-- addr, named by a sentinel asked when the epoch was `epoch`: the client
-- moves there when it is not the primary known (why: a format of the name).
function Sentinel:_follow(addr, epoch, why)
  local p = self.primary
  if self.closed or not addr or epoch ~= self.epoch or not p or same(addr, p) then return end
  self:_switch(addr, why:format(self.target.master))
end

-- No watch up: the address asked, so that a failover is still followed.
function Sentinel:_poll()
  if self.polling or self.asking or self.closed or not self.client.ready then return end
  self.polling = true
  local epoch = self.epoch
  self:_lookup(function(addr)
    self.polling = false
    self:_follow(addr, epoch, "Sentinel names another primary for %s")
  end)
end

-- The primary is now addr: the calls' connection moves there at once (the
-- old one retired: its calls in flight end there), the subscription too.
function Sentinel:_switch(addr, why)
  local c = self.client
  if self.closed or c.closed then return end
  self.epoch = self.epoch + 1
  self.primary = addr
  if c.conn and same(self.current, addr) then return end -- (there already)
  self.fresh, self.subject = true, nil -- (the old address did not fail: no sentinel is blamed)
  local old = c.conn
  if old and c.ready then
    c:_retire_conn(old, why)
  elseif old then -- still being set up: no call of the caller's is on it
    c:_down(why)
    old:close()
  end
  c.backoff, c.reconnect_at = 0, 0
  c:_connect()
  self:_resend() -- (calls held for NOREPLICAS wait for the new primary)
end

-- "+switch-master MASTER OLD_IP OLD_PORT NEW_IP NEW_PORT"
function Sentinel:_message(text)
  local name, host, port = tostring(text):match("^(%S+) %S+ %S+ (%S+) (%d+)$")
  if name ~= self.target.master then return end
  self:_switch({ host = host, port = tonumber(port), by = self.watched },
    ("Sentinel moved the primary for %s (+switch-master)"):format(name))
end

-- After the watch is (re)made: a switch may have been missed meanwhile
-- (not followed once the watch left s: an address it named failed).
function Sentinel:_check(s)
  local epoch = self.epoch
  self:_ask(s, { "SENTINEL", "get-master-addr-by-name", self.target.master }, function(v)
    if self.watched == s then self:_follow(named(v, s), epoch, "Sentinel names another primary for %s") end
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
      local ok = conn:subscribe({ "SUBSCRIBE", "+switch-master" }, function(msg, serr, kind)
        if self.watch ~= conn then return end
        if serr then -- (a lost connection: its "down" event makes the watch again)
          if kind == "reply" then self:_watch_refused(serr) end
          return
        end
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

-- SUBSCRIBE refused (NOPERM: a sentinel ACL user without the channel):
-- said once (with the next "up", at once when the client is up), tried
-- again after the longest back-off; meanwhile the address is asked
-- (Sentinel:_poll).
function Sentinel:_watch_refused(err)
  if not self.told_refused then
    self.told_refused = true
    self.notice = ("the sentinel user may not subscribe to +switch-master: grant it &+switch-master (ACL; the"
      .. " sentinel said %s); meanwhile the sentinels are asked where the primary is every %g s")
      :format(tostring(err):match("^%S+"), self.client.sub_timeout_ms / 1000)
    local c = self.client
    if c.ready then c.on_state(true) end
  end
  self.watch_backoff = 5000
  self:_watch_lost()
end

function Sentinel:close()
  if self.closed then return end
  self.closed = true
  if self.watch then self.watch:close() end
  self.watch = nil
  for conn in pairs(self.asks) do conn:close() end
  self.asks = {}
  local held = self.held
  self.held = {}
  for _, h in ipairs(held) do h[2](nil, "EREDIS: the client is closed", "connection") end
  self.ping_timer:close()
  self.retry_timer:close()
  self.hold_timer:close()
end

return M
