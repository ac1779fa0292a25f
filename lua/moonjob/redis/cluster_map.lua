-- moonjob.redis.cluster_map -- what moonjob.redis.cluster knows of a Redis
-- Cluster before it routes a call: its URL, and its slot map (which primary
-- serves each of the 16384 hash slots), asked of one node after another.
--
--   redis+cluster://[user:password@]host1:port1,host2:port2,.../
--   rediss+cluster://...      (TLS, as rediss:// for one server)
--
-- The hosts are seeds: any node of the cluster (a primary or a replica)
-- tells the whole map (CLUSTER SLOTS), so one is enough and the others are
-- tried when it does not answer. A cluster has one database, 0: a URL that
-- names another is refused.
local setup = require "moonjob.redis.setup"

local M = {}

local CLUSTER_DB = "a Redis Cluster has one database, 0: write redis+cluster://host1:port1,host2:port2/ (or .../0)"

-- A node's address as the map keys it: "host:port" (an IPv6 host as it is,
-- without brackets: the port is what follows the last ':').
function M.address(host, port)
  return host .. ":" .. port
end

-- address -> host, port
function M.split(address)
  local host, port = address:match("^(.*):(%d+)$")
  return host, tonumber(port)
end

-- M.parse(url) -> target | nil, err. target: cluster = true, scheme ("redis"
-- or "rediss"), seeds ({ host, port } each), user, password, db = 0, tls
-- (what rediss:// gives a server, from the first seed), host and port (the
-- first seed's).
function M.parse(url)
  local scheme, rest = url:match("^(rediss?)%+cluster://(.*)$")
  if not scheme then
    return nil, ("'%s' is not a Redis Cluster URL: write redis+cluster://host1:port1,host2:port2/")
      :format((url:gsub("^(%w*%+?%w*:?//).*@", "%1***@")))
  end
  local auth, hostpart = rest:match("^(.*)@([^@]*)$") -- the last @: a password may hold one (a '?' too)
  hostpart = hostpart or rest
  local query = hostpart:match("(%?.*)$") or ""
  hostpart = hostpart:sub(1, #hostpart - #query)
  local hostlist, db = hostpart:match("^([^/]*)/?(.*)$")
  if db ~= "" and db ~= "0" then return nil, ("%s, not /%s"):format(CLUSTER_DB, db) end
  if hostlist == "" then
    return nil, "a Redis Cluster URL needs a host, one node at least: redis+cluster://127.0.0.1:7000/"
  end
  local t = { cluster = true, scheme = scheme, seeds = {}, db = 0 }
  for hostport in (hostlist .. ","):gmatch("([^,]*),") do
    if hostport == "" then
      return nil, "a Redis Cluster URL lists its nodes with commas, none empty:"
        .. " redis+cluster://127.0.0.1:7000,127.0.0.1:7001/"
    end
    local one, err = require("moonjob.redis.url").server(scheme, ("%s%s/0%s"):format(auth and auth .. "@" or "",
      hostport, query), scheme .. "+cluster")
    if not one then return nil, err end
    t.user, t.password, t.tls = one.user, one.password, one.tls
    t.seeds[#t.seeds + 1] = { host = one.host, port = one.port }
  end
  t.host, t.port = t.seeds[1].host, t.seeds[1].port
  return t
end

-- The URL as it may be printed: the password replaced by ***.
function M.display(t)
  local auth = t.password and (t.user or "") .. ":***@" or ""
  local list = {}
  for i, s in ipairs(t.seeds) do list[i] = (s.host:find(":") and "[" .. s.host .. "]" or s.host) .. ":" .. s.port end
  return ("%s+cluster://%s%s/"):format(t.scheme, auth, table.concat(list, ","))
end

-- The target of one node (moonjob.redis.client's, database 0): the
-- cluster's user, password and TLS settings (the name checked: the node's
-- host, unless the URL's servername= names one for all), its host and port;
-- cluster_node = true (moonjob.redis.setup refuses a cluster node to a plain URL).
function M.node_target(t, host, port)
  return { host = host, port = port, db = 0, user = t.user, password = t.password, tls = t.tls, cluster_node = true }
end

-- M.redirection(err, from) -> word, slot, address | nil: a MOVED or ASK
-- refusal's ("MOVED 3999 127.0.0.1:7002"), from the node at address from.
-- The port is what follows the last ':' (Redis writes an IPv6 host without
-- brackets); a host left out ("" or "?": the cluster knows no endpoint for
-- it) is from's.
function M.redirection(err, from)
  local word, slot, host, port = tostring(err):match("^(%u+) (%d+) (%S*):(%d+)$")
  if word ~= "MOVED" and word ~= "ASK" then return nil end
  host = host:match("^%[(.*)%]$") or host
  if host == "" or host == "?" then host = M.split(from) end
  return word, tonumber(slot), M.address(host, tonumber(port))
end

-- Where to ask for the map: the primaries known (those whose client is up
-- first: a node cut off costs a connect timeout), then the seeds, each once.
function M.candidates(t, nodes)
  local list, seen = {}, {}
  local function add(host, port)
    local a = M.address(host, port)
    if not seen[a] then seen[a], list[#list + 1] = true, { host = host, port = port } end
  end
  local known = {}
  for address in pairs(nodes) do known[#known + 1] = address end
  table.sort(known, function(a, b)
    if nodes[a].ready ~= nodes[b].ready then return nodes[a].ready end
    return a < b
  end)
  for _, address in ipairs(known) do add(M.split(address)) end
  for _, s in ipairs(t.seeds) do add(s.host, s.port) end
  return list
end

-- What a refusal of CLUSTER SLOTS means, in words.
local function slots_refusal(address, err)
  if err:find("cluster support disabled", 1, true) then
    return ("%s is not a node of a Redis Cluster (cluster support disabled): use redis://%s/0 for one server")
      :format(address, address), true
  end
  return ("%s refused CLUSTER SLOTS: %s"):format(address, err), err:match("^NOPERM") ~= nil
end

-- M.ask(t, node, timeout_ms, max_reply, cb): node's CLUSTER SLOTS, on a
-- connection of its own (AUTH only), closed after it: cb(reply) or cb(nil,
-- why, refused) (refused: a person must act, asking again will not help).
function M.ask(t, node, timeout_ms, max_reply, cb)
  local address, conn, done = M.address(node.host, node.port), nil, false
  local function finish(v, why, refused)
    if done then return end
    done = true
    if conn then conn:close() end
    cb(v, why, refused)
  end
  local target = M.node_target(t, node.host, node.port)
  local function on_event(kind, why)
    if kind ~= "up" then return finish(nil, ("%s: %s"):format(address, why or "connection lost")) end
    setup.run(conn, target, false, function(err, err_kind)
      if err then return finish(nil, ("%s: %s"):format(address, err), err_kind == "refused") end
      local ok, cerr = conn:command({ "CLUSTER", "SLOTS" }, function(v, e, k)
        if not e then return finish(v) end
        if k == "connection" then return finish(nil, ("%s: %s"):format(address, e)) end
        finish(nil, slots_refusal(address, e))
      end)
      if not ok then finish(nil, ("%s: %s"):format(address, cerr)) end
    end)
  end
  local open_err
  conn, open_err = require("moonjob.redis.client").open(target, node.host, node.port, timeout_ms, max_reply, on_event)
  if not conn then finish(nil, ("%s: %s"):format(address, open_err or "cannot start connecting"), true) end
end

-- M.read(reply, asked) -> owner, primaries, text: owner[slot] the address
-- of the primary serving slot (0-based; nil: none), primaries[address] = {
-- host, port, id }, text: the map in short (equal for equal maps). A node
-- whose host the reply leaves out ("" or "?": unknown to the cluster) is on
-- the host that was asked.
function M.read(reply, asked)
  local owner, primaries, ranges = {}, {}, {}
  for _, range in ipairs(type(reply) == "table" and reply or {}) do
    local from, to, node = tonumber(range[1]), tonumber(range[2]), range[3]
    if from and to and type(node) == "table" and tonumber(node[2]) then
      local host = node[1]
      if type(host) ~= "string" or host == "" or host == "?" then host = asked.host end
      local address = M.address(host, tonumber(node[2]))
      primaries[address] = { host = host, port = tonumber(node[2]), id = node[3] }
      for slot = from, to do owner[slot] = address end
      ranges[#ranges + 1] = from .. "-" .. to .. " " .. address
    end
  end
  table.sort(ranges)
  return owner, primaries, table.concat(ranges, ",")
end

return M
