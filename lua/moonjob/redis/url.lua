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

local TLS_QUERY = "ca, cert, key, servername (rediss://host:6380/0?ca=PATH&cert=PATH&key=PATH&servername=NAME)"
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
-- certificate and its key only as a pair) | nil, err.
local function tls_options(query)
  local tls = {}
  for pair in query:gmatch("[^&]+") do
    local k, v = pair:match("^([^=]*)=(.*)$")
    k = k and M.unescape(k)
    if not (k == "ca" or k == "cert" or k == "key" or k == "servername") then
      return nil, ("'%s' is unknown in a rediss:// URL's query: it takes %s"):format(k or pair, TLS_QUERY)
    end
    if v == "" or tls[k] then return nil, ("%s= in a rediss:// URL needs one value"):format(k) end
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
    return nil, ("'%s' is not a Redis URL: write redis://[user:password@]host[:port][/db], or rediss://"
      .. " for TLS"):format((url:gsub("^([%w+.-]*:?//).*@", "%1***@")))
  end
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
    local tls, err = tls_options(query)
    if not tls then return nil, err end
    t.tls = tls
  elseif query ~= "" then
    return nil, "a redis:// URL takes no query: ca=, cert=, key= and servername= are for rediss:// (TLS)"
  end
  local hostport, db = rest:match("^([^/]*)/?(.*)$")
  if db ~= "" then
    t.db = tonumber(db)
    if not t.db or t.db < 0 or t.db % 1 ~= 0 then
      return nil, ("the database in a Redis URL must be a number, not '%s'"):format(db)
    end
  end
  local host, port = hostport:match("^%[([^%]]+)%]:?(%d*)$")
  if not host then host, port = hostport:match("^([^:]*):?(%d*)$") end
  if not host or host == "" then
    return nil, "a Redis URL needs a host: redis://127.0.0.1:6379/0"
  end
  t.host = host
  if port ~= "" then
    t.port = tonumber(port)
    if t.port < 1 or t.port > 65535 then return nil, "the port in a Redis URL must be from 1 to 65535" end
  end
  return t
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
