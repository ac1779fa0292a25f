-- moonjob.producer.clients -- the Redis clients moonjob.producer works
-- through, each behind one small face (an adapter):
--
--   a:call(argv)     -> reply | nil, err, kind ("reply": Redis refused the
--                       call, err is its message; "connection": the link failed)
--   a:pipeline(list) -> { { reply, err, kind }, ... } | nil, err (the link
--                       failed: which calls ran is unknown)
--   a:close()        -> closes (or pools) a connection the producer opened;
--                       a client the app gave is the app's, left as it is
--
-- argv is a command: its name and arguments ({ "FCALL", "moonjob_add", 1, ... }).
-- Replies as moonjob's C client gives them: nil for Redis's nil (inside
-- lists too), { err = message } for an error inside a list.
--
-- Kinds:
--   * "resty": an OpenResty client object (nginx.redis on Debian, resty.redis
--     elsewhere): its own methods (red:fcall(...), init_pipeline and
--     commit_pipeline); a command of more arguments than LuaJIT can pass
--     (ARGS_MAX) is written on its socket by moonjob.producer.resp;
--   * "socket": a LuaSocket connection spoken to with moonjob.producer.resp:
--     a redis-lua client's (client.network.socket; redis-lua raises on error
--     replies and its pipeline leaves replies unread after one), or one the
--     producer opened (plain Lua given host and port: LuaSocket, which
--     redis-lua needs anyway, so it is there wherever redis-lua is);
--   * "call": any object with call(self, argv) -> reply | nil, err [, kind]
--     (kind "connection" for a failed link, else the error is Redis's
--     refusal), and optionally pipeline(self, list) as above.
-- Pure Lua; ngx only under OpenResty.
local resp = require "moonjob.producer.resp"

local M = {}

local unpack = table.unpack or unpack -- (Lua 5.1, LuaJIT: unpack)
local ARGS_MAX = 7000 -- LuaJIT's unpack gives fewer than 8,000 values

local function in_openresty()
  return type(ngx) == "table" and type(ngx.socket) == "table" and ngx.null ~= nil
end

------------------------------------------------------------- sockets ---

local Socket = {}
Socket.__index = Socket

-- sock: LuaSocket's or a cosocket; owned: opened by the producer (closed
-- with QUIT by close).
function M.socket(sock, owned)
  return setmetatable({ sock = sock, kind = "socket", owned = owned }, Socket)
end

-- A connection the producer opened, closed before any reply: a TLS port
-- does so to plaintext, and the producer speaks no TLS itself.
local TLS_HINT = "; if the server's port is a TLS port, connect with TLS through your own client"
  .. " (docs/guide/producer.md)"

-- The link failed: the socket is closed (a reply may be half read), so
-- that later calls fail at once rather than read another call's reply.
function Socket:_broken(err)
  local first = self.owned and not self.heard and self.sock.getfd ~= nil -- (not the stub below)
  if first and (err == "closed" or tostring(err):find("reset", 1, true)) then err = tostring(err) .. TLS_HINT end
  self.sock:close()
  self.sock = { send = function() return nil, "closed" end, close = function() end }
  return nil, err, "connection"
end

function Socket:call(argv)
  local ok, err = self.sock:send(resp.encode(argv))
  if not ok then return self:_broken(err) end
  local v, e, kind = resp.read(self.sock)
  if kind == "connection" then return self:_broken(e) end
  self.heard = true
  return v, e, kind
end

function Socket:pipeline(list)
  local out, err = resp.pipeline(self.sock, list)
  if not out then
    local _, why = self:_broken(err)
    return nil, why
  end
  self.heard = true
  return out
end

function Socket:close()
  if not self.owned then return end
  pcall(self.call, self, { "QUIT" })
  self.sock:close()
end

----------------------------------------------------------- OpenResty ---

local Resty = {}
Resty.__index = Resty

function M.resty(red, owned)
  return setmetatable({ red = red, kind = "resty", owned = owned }, Resty)
end

-- A reply of the OpenResty client as the header says: ngx.null is nil, an
-- error inside a list ({ false, message }) is { err = message }.
local function from_resty(v)
  if v == ngx.null then return nil end
  if type(v) ~= "table" then return v end
  if v[1] == false then return { err = v[2] } end
  local out = {}
  for i = 1, #v do out[i] = from_resty(v[i]) end
  return out
end

-- Sends argv with the client's own method of that name, its arguments as
-- moonjob.producer.resp writes them.
local function send(red, argv)
  local args = {}
  for i = 2, #argv do args[i - 1] = resp.text(argv[i]) end
  return red[argv[1]:lower()](red, unpack(args, 1, #argv - 1))
end

-- A command too long for the client's methods, on its socket.
function Resty:_raw(argv)
  local sock = rawget(self.red, "_sock")
  if not sock then
    return nil, ("this client cannot send a command of %d arguments (its socket is not found)"):format(#argv), "reply"
  end
  return M.socket(sock):call(argv)
end

function Resty:call(argv)
  if #argv > ARGS_MAX then return self:_raw(argv) end
  local v, err = send(self.red, argv)
  if v == nil then return nil, err, "connection" end
  if v == false then return nil, err, "reply" end
  return from_resty(v)
end

function Resty:pipeline(list)
  for _, argv in ipairs(list) do
    if #argv > ARGS_MAX then return M.in_turn(self, list) end
  end
  local red = self.red
  red:init_pipeline(#list)
  for _, argv in ipairs(list) do send(red, argv) end
  local vals, err = red:commit_pipeline()
  if not vals then return nil, err end
  local out = {}
  for i, v in ipairs(vals) do
    if type(v) == "table" and v[1] == false then out[i] = { nil, v[2], "reply" } else out[i] = { from_resty(v) } end
  end
  return out
end

-- A connection the producer opened goes back to OpenResty's pool (its
-- lua_socket_keepalive_timeout and pool size).
function Resty:close()
  if self.owned then self.red:set_keepalive() end
end

---------------------------------------------------------------- call ---

local Call = {}
Call.__index = Call

function M.call_object(obj)
  return setmetatable({ obj = obj, kind = "call" }, Call)
end

function Call:call(argv)
  local v, err, kind = self.obj:call(argv)
  if v == nil and err ~= nil then return nil, tostring(err), kind == "connection" and "connection" or "reply" end
  return v
end

function Call:pipeline(list)
  if type(self.obj.pipeline) ~= "function" then return M.in_turn(self, list) end
  local got, err = self.obj:pipeline(list)
  if not got then return nil, tostring(err) end
  return got
end

function Call:close() end -- (the app's object)

-- A pipeline's calls made one after the other (a client without one).
function M.in_turn(a, list)
  local out = {}
  for i, argv in ipairs(list) do
    local v, err, kind = a:call(argv)
    if kind == "connection" then return nil, err end
    out[i] = { v, err, kind }
  end
  return out
end

------------------------------------------------------------- finding ---

-- wrap(client) -> adapter | nil: what kind of client the app gave.
function M.wrap(c)
  if type(c) ~= "table" then return nil end
  if rawget(c, "_sock") ~= nil and type(c.commit_pipeline) == "function" then return M.resty(c) end
  if type(rawget(c, "network")) == "table" and c.network.socket then return M.socket(c.network.socket) end
  if type(c.call) == "function" then return M.call_object(c) end
  return nil
end

-- AUTH and SELECT on a new connection, as o says -> true | nil, err.
local function hello(a, o)
  if o.password then
    local _, err = a:call(o.user and { "AUTH", o.user, o.password } or { "AUTH", o.password })
    if err then return nil, "AUTH: " .. err end
  end
  if o.db ~= 0 then
    local _, err = a:call({ "SELECT", o.db })
    if err then return nil, "SELECT: " .. err end
  end
  return true
end

-- Under OpenResty: nginx.redis (Debian's lua-nginx-redis), else
-- resty.redis, from OpenResty's connection pool (one pool per server,
-- database and user: a pooled connection has had its AUTH and SELECT).
local function open_resty(o)
  local found, mod = pcall(require, "nginx.redis")
  if not found then found, mod = pcall(require, "resty.redis") end
  if not found then return nil, "no OpenResty Redis client found (nginx.redis or resty.redis)" end
  local red, err = mod:new()
  if not red then return nil, err end
  red:set_timeout(o.timeout)
  local ok
  ok, err = red:connect(o.host, o.port, { pool = ("moonjob:%s:%d:%d:%s"):format(o.host, o.port, o.db, o.user or "") })
  if not ok then return nil, err end
  local a = M.resty(red, true)
  if (red:get_reused_times() or 0) > 0 then return a end
  ok, err = hello(a, o)
  if not ok then red:close() return nil, err end
  return a
end

-- Plain Lua: a LuaSocket connection.
local function open_socket(o)
  local found, socket = pcall(require, "socket")
  if not found then return nil, "no Redis client found: install LuaSocket (Debian: lua-socket), or pass a client" end
  local sock = socket.tcp()
  sock:settimeout(o.timeout / 1000)
  local ok, err = sock:connect(o.host, o.port)
  if not ok then sock:close() return nil, err end
  sock:setoption("tcp-nodelay", true)
  local a = M.socket(sock, true)
  ok, err = hello(a, o)
  if not ok then sock:close() return nil, err end
  return a
end

-- open(o) -> adapter | nil, err: a connection to o.host:o.port (o.db,
-- o.user, o.password, o.timeout in ms), of OpenResty's client under
-- OpenResty, else of LuaSocket.
function M.open(o)
  if in_openresty() then return open_resty(o) end
  return open_socket(o)
end

-------------------------------------------------------------- waiting ---

-- sleeper() -> sleep(seconds), now() (seconds) | nil, err: ngx.sleep under
-- OpenResty, LuaSocket's elsewhere.
function M.sleeper()
  if in_openresty() then
    return ngx.sleep, function() ngx.update_time() return ngx.now() end
  end
  local found, socket = pcall(require, "socket")
  if not found then return nil, "waiting needs ngx.sleep (OpenResty) or LuaSocket's socket.sleep (lua-socket)" end
  return socket.sleep, socket.gettime
end

return M
