-- moonjob.redis.sentinel_url -- redis+sentinel:// URLs read and printed
-- (moonjob.redis.sentinel follows the primary they name):
--
--   redis+sentinel://[user:password@]host1[:port1],host2[:port2],.../MASTER[/DB]
--     [?sentinel_user=U&sentinel_password=P]
--
-- (26379 by default; the user and password are the data servers', the query
-- gives the sentinels' own; rediss+sentinel:// is the same over TLS, to the
-- sentinels and the data servers alike, with the query keys ca, cert, key,
-- servername (the data servers' certificate name) and sentinel_servername
-- (the sentinels': the target's sentinel_tls).)
local M = {}

M.PORT = 26379
local TLS_KEYS = { ca = true, cert = true, key = true, servername = true, sentinel_servername = true }
local OWN_KEYS = { sentinel_user = true, sentinel_password = true }

local function unescape(s)
  return (s:gsub("%%(%x%x)", function(h) return string.char(tonumber(h, 16)) end))
end

-- "host:port" of s ({ host, port }), an IPv6 host in brackets.
function M.address(s)
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
  local known = "sentinel_user, sentinel_password"
    .. (t.tls and ", ca, cert, key, servername, sentinel_servername" or "")
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
  local at_err = auth and require("moonjob.redis.url").query_in_auth(auth) -- (it requires this module)
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
  if t.tls then
    require("moonjob.redis.url").tls_defaults(t.tls)
    t.sentinel_tls = {} -- the sentinels': the same files, their own name (else the host in the URL)
    for k, v in pairs(t.tls) do t.sentinel_tls[k] = v end
    t.sentinel_tls.servername, t.sentinel_tls.sentinel_servername, t.tls.sentinel_servername =
      t.tls.sentinel_servername, nil, nil
  end
  return t
end

-- The URL as it may be printed: passwords as ***, no TLS settings.
function M.display(t)
  local auth = t.password and ((t.user or "") .. ":***@") or ""
  local hosts, query = {}, {}
  for i, s in ipairs(t.sentinels) do hosts[i] = M.address(s) end
  if t.sentinel_user then query[#query + 1] = "sentinel_user=" .. t.sentinel_user end
  if t.sentinel_password then query[#query + 1] = "sentinel_password=***" end
  return ("%s://%s%s/%s/%d%s"):format(t.scheme, auth, table.concat(hosts, ","), t.master, t.db,
    #query > 0 and "?" .. table.concat(query, "&") or "")
end

return M
