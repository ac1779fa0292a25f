-- moonjob.redis.url -- Redis URLs read and printed: redis:// and rediss://
-- (TLS: the query's ca=, cert=, key=, servername=, and the environment's
-- MOONJOB_REDIS_CA, MOONJOB_REDIS_CERT, MOONJOB_REDIS_KEY for what it leaves
-- out), handing redis+sentinel:// to moonjob.redis.sentinel and
-- redis+cluster:// to moonjob.redis.cluster. A password is never printed.
--
-- Caveat: the user info ends at the URL's last @ (a password may hold one),
-- so an @ in a query value must be written %40; one left as such is refused.
local sentinel = require "moonjob.redis.sentinel"

local M = {}

function M.unescape(s)
  return (s:gsub("%%(%x%x)", function(h) return string.char(tonumber(h, 16)) end))
end

local TLS_QUERY = "ca, cert, key, servername (?ca=PATH&cert=PATH&key=PATH&servername=NAME)"
local TLS_ENV = { ca = "MOONJOB_REDIS_CA", cert = "MOONJOB_REDIS_CERT", key = "MOONJOB_REDIS_KEY" }

-- M.tls_defaults(tls) -> tls: the environment's files where a URL's query
-- named none (a client certificate and its key only as a pair); also for
-- rediss+sentinel:// URLs (moonjob.redis.sentinel).
function M.tls_defaults(tls)
  local pair = tls.cert == nil and tls.key == nil
  for k, name in pairs(TLS_ENV) do
    local v = os.getenv(name)
    if tls[k] == nil and v and v ~= "" and (k == "ca" or pair) then tls[k] = v end
  end
  return tls
end

-- A rediss:// URL's query -> { ca, cert, key, servername } (core.redis's TLS
-- options), the environment's files where the query names none (a client
-- certificate and its key only as a pair) | nil, err; form: the URL's
-- scheme, as errors name it.
local function tls_options(query, form)
  local tls = {}
  for pair in query:gmatch("[^&]+") do
    local k, v = pair:match("^([^=]*)=(.*)$")
    k = k and M.unescape(k)
    if not (k == "ca" or k == "cert" or k == "key" or k == "servername") then
      return nil, ("'%s' is unknown in a %s:// URL's query: it takes %s"):format(k or pair, form, TLS_QUERY)
    end
    if v == "" or tls[k] then return nil, ("%s= in a %s:// URL needs one value"):format(k, form) end
    tls[k] = M.unescape(v)
  end
  return M.tls_defaults(tls)
end

-- A URL of a Redis Cluster (redis+cluster://, rediss+cluster://).
function M.is_cluster(url)
  return type(url) == "string" and url:match("^rediss?%+cluster://") ~= nil
end

-- The keys a Redis URL's query may hold (rediss://, redis+sentinel://).
local QUERY_KEYS = { ca = true, cert = true, key = true, servername = true, sentinel_user = true,
  sentinel_password = true, sentinel_servername = true }

-- M.query_in_auth(auth) -> err | nil: the user info of a URL (what comes
-- before its last @) that holds a query: an @ in a query value was left as
-- such, and would be taken for the end of a password (the host would be
-- what follows it).
function M.query_in_auth(auth)
  for pair in (auth:match("%?(.*)$") or ""):gmatch("[^&]+") do
    if QUERY_KEYS[pair:match("^([^=]*)=")] then
      return "an @ in a Redis URL's query must be written %40 (the last @ of a URL ends its password, so the"
        .. " host would be what follows it)"
    end
  end
end

-- M.database(text) -> number | nil, err: a URL's database ("" is 0).
function M.database(text)
  if text == "" then return 0 end
  local db = tonumber(text)
  if not db or db < 0 or db % 1 ~= 0 then
    return nil, ("the database in a Redis URL must be a number, not '%s'"):format(text)
  end
  return db
end

local FORMS = "write redis://[user:password@]host[:port][/db], redis+sentinel://s1:port,s2:port/MASTER[/db]"
  .. " (Sentinel) or redis+cluster://host1:port,host2:port/ (Cluster); over TLS: rediss://,"
  .. " rediss+sentinel://, rediss+cluster://"

-- host[:port] of a URL -> host, port ("" when left out) | nil, err; form:
-- the URL's scheme, as errors name it.
local function host_port(hostport, form)
  if hostport:find(",", 1, true) and not form:find("+", 1, true) then
    return nil, ("several hosts (%s) need %s+cluster://host1:port,host2:port/ (a Redis Cluster) or"
      .. " %s+sentinel://s1:port,s2:port/MASTER (Sentinel): %s:// names one server"):format(hostport, form, form, form)
  end
  local host, port = hostport:match("^%[([^%]]+)%]:?(.*)$")
  if not host then host, port = hostport:match("^([^:]*):?(.*)$") end
  if not host or host == "" then
    return nil, ("a %s:// URL needs a host: %s://127.0.0.1:6379/0"):format(form, form)
  end
  if not port:match("^%d*$") then
    return nil, ("'%s' is not host:port in a %s:// URL: the port must be a number"):format(hostport, form)
  end
  return host, port
end

-- M.server(scheme, rest, form) -> target | nil, err: one server's URL
-- (scheme "redis" or "rediss", rest what follows "://"); form: the URL's
-- scheme as errors name it (a cluster's nodes are read so: redis+cluster).
function M.server(scheme, rest, form)
  local t = { port = 6379, db = 0 }
  local auth, hostpart = rest:match("^(.*)@([^@]*)$") -- the last @: a password may hold one
  if auth and M.query_in_auth(auth) then return nil, M.query_in_auth(auth) end
  if auth then
    local user, password = auth:match("^([^:]*):(.*)$")
    if user then
      t.user, t.password = user ~= "" and M.unescape(user) or nil, M.unescape(password)
    else
      t.password = M.unescape(auth)
    end
    rest = hostpart
  end
  local query
  rest, query = rest:match("^([^?]*)%??(.*)$")
  if scheme == "rediss" then
    local tls, err = tls_options(query, form)
    if not tls then return nil, err end
    t.tls = tls
  elseif query ~= "" then
    return nil, ("a %s:// URL takes no query: ca=, cert=, key= and servername= are for %s:// (TLS)")
      :format(form, form:gsub("^redis", "rediss"))
  end
  local hostport, db = rest:match("^([^/]*)/?(.*)$")
  local err
  t.db, err = M.database(db)
  if not t.db then return nil, err end
  local host, port = host_port(hostport, form)
  if not host then return nil, port end
  t.host = host
  if port ~= "" then
    t.port = tonumber(port)
    if t.port < 1 or t.port > 65535 then return nil, "the port in a Redis URL must be from 1 to 65535" end
  end
  return t
end

-- parse(url) -> { host, port, db, user, password, tls } | nil, err; tls
-- (rediss:// only): core.redis's TLS options (a redis+sentinel:// URL:
-- moonjob.redis.sentinel's target; a redis+cluster:// URL:
-- moonjob.redis.cluster's, with cluster = true).
function M.parse(url)
  if type(url) ~= "string" then return nil, "a Redis URL must be a string like redis://host:6379/0" end
  if url:match("^rediss?%+sentinel://") then return sentinel.parse(url) end -- Sentinel
  if M.is_cluster(url) then return require("moonjob.redis.cluster").parse(url) end -- Cluster
  local scheme, rest = url:match("^(rediss?)://(.*)$")
  if not rest then
    return nil, ("'%s' is not a Redis URL: %s"):format((url:gsub("^([%w+.-]*:?//).*@", "%1***@")), FORMS)
  end
  return M.server(scheme, rest, scheme)
end

-- The URL as it may be printed: the password replaced by ***.
function M.display(t)
  if t.sentinels then return sentinel.display(t) end -- Sentinel
  if t.cluster then return require("moonjob.redis.cluster").display(t) end -- Cluster
  local auth = ""
  if t.password then auth = (t.user or "") .. ":***@" end
  local host = t.host:find(":") and "[" .. t.host .. "]" or t.host
  return ("%s://%s%s:%d/%d"):format(t.tls and "rediss" or "redis", auth, host, t.port, t.db)
end

return M
