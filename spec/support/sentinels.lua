-- spec/support/sentinels.lua -- Redis Sentinel on loopback for the specs and
-- the failover bench: a primary (AOF on, as every spec server), a replica of
-- it, and three sentinels watching them (`redis-server sentinel.conf
-- --sentinel`), each on a free port, ended by their pid.
--
--   local sentinels = require "sentinels"
--   local g = sentinels.start({ master = "m" })  -- returns once a failover could run
--   g:url()                  -- redis+sentinel://127.0.0.1:S1,.../m/0
--   g:primary_port()         -- the port the sentinels name now
--   g:server(port)           -- the redis_server object on that port
--   g:sentinel_cli(i, ...)   -- redis-cli on sentinel i
--   g:wait_primary(port, s)  -- until every sentinel names port
--   g:wait_settled()         -- until a failover could run again (after one)
--   g:lone_sentinel(port)    -- one more sentinel, alone, watching port under
--                            -- the same name (quorum 1; not in g.sentinels)
--   g:stop()
--
-- opts.password: the data servers' (requirepass and masterauth; the
-- sentinels are told it); opts.sentinel_password: the sentinels' own
-- (requirepass, and sentinel-pass between them); opts.primary_extra:
-- more arguments for the first primary (min-replicas-to-write ...);
-- opts.tls: certificates (spec/support/tls_certs.lua) that make every port
-- a TLS port, the data servers' and the sentinels', replication and the
-- sentinels' links TLS too (no client certificate asked), and g:url() a
-- rediss+sentinel:// URL with ca=.
-- Failure detection is quick: down-after-milliseconds 1000,
-- failover-timeout 3000 ms; a replica's first sync starts at once
-- (repl-diskless-sync-delay 0).
local helpers = require "helpers"
local redis_server = require "redis_server"

local M = {}
local Group = {}
Group.__index = Group

local function quote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

-- A sentinel's configuration lines for its port: plaintext, or TLS only.
function Group:_port_lines(port)
  local c = self.tls
  if not c then return { "port " .. port } end
  return { "port 0", "tls-port " .. port, "tls-cert-file " .. c.server_cert, "tls-key-file " .. c.server_key,
    "tls-ca-cert-file " .. c.ca, "tls-auth-clients no", "tls-replication yes" }
end

function Group:_sentinel_conf(dir, port, primary_port, quorum)
  local lines = self:_port_lines(port)
  for _, line in ipairs({ "bind 127.0.0.1", "dir " .. dir, "logfile " .. dir .. "/sentinel.log",
    ("sentinel monitor %s 127.0.0.1 %d %d"):format(self.master, primary_port, quorum or 2),
    ("sentinel down-after-milliseconds %s 1000"):format(self.master),
    ("sentinel failover-timeout %s 3000"):format(self.master),
    ("sentinel parallel-syncs %s 1"):format(self.master),
  }) do lines[#lines + 1] = line end
  if self.password then lines[#lines + 1] = ("sentinel auth-pass %s %s"):format(self.master, self.password) end
  if self.sentinel_password then
    lines[#lines + 1] = "requirepass " .. self.sentinel_password
    lines[#lines + 1] = "sentinel sentinel-pass " .. self.sentinel_password
  end
  return helpers.write_file(dir .. "/sentinel.conf", table.concat(lines, "\n") .. "\n")
end

function Group:_start_sentinel(primary_port, list, quorum)
  local dir = helpers.tmpdir()
  local port = redis_server.free_port()
  local conf = self:_sentinel_conf(dir, port, primary_port, quorum)
  local pid = assert(tonumber(helpers.first_line(("%s %s --sentinel & echo $!"):format(redis_server.SERVER, conf))))
  local s = { port = port, pid = pid, dir = dir }
  list = list or self.sentinels
  list[#list + 1] = s
  return s
end

-- redis-cli on a sentinel (i: 1 to 3, or one of lone_sentinel's), its
-- output as a string.
function Group:sentinel_cli(i, ...)
  local s = type(i) == "table" and i or self.sentinels[i]
  local args = {}
  for k, a in ipairs({ ... }) do args[k] = quote(a) end
  local auth = self.sentinel_password and ("--no-auth-warning -a " .. quote(self.sentinel_password)) or ""
  if self.tls then auth = auth .. " --tls --cacert " .. quote(self.tls.ca) end
  local h = io.popen(("%s -p %d %s %s 2>&1"):format(redis_server.CLI, s.port, auth, table.concat(args, " ")))
  local out = h:read("*a")
  h:close()
  return (out:gsub("\n$", ""))
end

-- One more sentinel, watching port under the group's master name, alone
-- (quorum 1): it never meets the others (they meet through the primary
-- they watch), and names port whatever happens, as a sentinel cut off from
-- its peers does. Ended with the group; -> { port, pid, dir }.
function Group:lone_sentinel(port)
  local s = self:_start_sentinel(port, self.lone, 1)
  helpers.wait_for(function() return self:sentinel_cli(s, "PING") == "PONG" end, 10)
  return s
end

-- The port sentinel i names as the primary now (nil when it cannot say).
function Group:named_by(i)
  return tonumber(self:sentinel_cli(i, "SENTINEL", "get-master-addr-by-name", self.master):match("\n(%d+)$"))
end

function Group:primary_port()
  for i = 1, #self.sentinels do
    local port = self:named_by(i)
    if port then return port end
  end
end

-- The redis_server of the data server on port.
function Group:server(port)
  for _, s in ipairs(self.servers) do
    if s.port == port then return s end
  end
end

-- The data server that is not on port (the other one of the two).
function Group:other(port)
  for _, s in ipairs(self.servers) do
    if s.port ~= port then return s end
  end
end

-- Until every sentinel names port as the primary (bounded: raises).
function Group:wait_primary(port, seconds)
  helpers.wait_for(function()
    for i = 1, #self.sentinels do
      if self:named_by(i) ~= port then return false end
    end
    return true
  end, seconds or 30)
end

-- Until a failover could run: each sentinel sees the replica and reaches
-- the quorum with the others (they find each other in 2 s hellos).
function Group:wait_ready(seconds)
  helpers.wait_for(function()
    for i = 1, #self.sentinels do
      if not self:sentinel_cli(i, "SENTINEL", "ckquorum", self.master):match("^OK") then return false end
      local replicas = self:sentinel_cli(i, "SENTINEL", "replicas", self.master)
      if not replicas:find("\nslave\n", 1, true) then return false end
    end
    return true
  end, seconds or 30)
end

-- Until a failover could run again after one: the old primary is a
-- replica of the new one with its link up, and the sentinels see it so.
function Group:wait_settled(seconds)
  local port = self:primary_port()
  self:wait_primary(port, seconds)
  helpers.wait_for(function() return M.link_up(self:other(port)) end, seconds or 30)
  self:wait_ready(seconds)
end

-- The replica's link to its primary is up (it has the data).
function M.link_up(server)
  return server:cli("INFO", "replication"):find("master_link_status:up", 1, true) ~= nil
end

-- A data server's redis_server options (extra: more arguments).
function Group:_server_opts(extra)
  local c = self.tls
  local args = "--repl-diskless-sync-delay 0 " .. (self.password and ("--masterauth " .. self.password) or "")
  return { password = self.password, extra = args .. (c and " --tls-replication yes " or " ") .. extra,
    tls = c and { cert = c.server_cert, key = c.server_key, ca = c.ca } }
end

function M.start(opts)
  opts = opts or {}
  local self = setmetatable({ master = opts.master or "m", password = opts.password, tls = opts.tls,
    sentinel_password = opts.sentinel_password, sentinels = {}, servers = {}, lone = {} }, Group)
  local ok, err = pcall(function()
    local primary = redis_server.start(self:_server_opts(opts.primary_extra or ""))
    self.servers[1] = primary
    local replica = redis_server.start(self:_server_opts("--replicaof 127.0.0.1 " .. primary.port))
    self.servers[2] = replica
    helpers.wait_for(function() return M.link_up(replica) end, 20)
    for _ = 1, 3 do self:_start_sentinel(primary.port) end
    self:wait_ready()
  end)
  if not ok then
    self:stop()
    error(err, 0)
  end
  return self
end

-- The URL of the group: the sentinels in order (opts.first: a list of
-- "host:port" put first), the master's name, database 0; opts.query: more
-- of the query ("k=v&..."; TLS: ca= is the group's unless it names one;
-- opts.sentinel_user and opts.sentinel_password stand for the group's).
function Group:url(opts)
  opts = opts or {}
  local hosts = {}
  for _, h in ipairs(opts.first or {}) do hosts[#hosts + 1] = h end
  for _, s in ipairs(self.sentinels) do hosts[#hosts + 1] = "127.0.0.1:" .. s.port end
  local auth = self.password and (":" .. self.password .. "@") or ""
  local query = {}
  if opts.sentinel_user then query[#query + 1] = "sentinel_user=" .. opts.sentinel_user end
  local pw = opts.sentinel_password or self.sentinel_password
  if pw then query[#query + 1] = "sentinel_password=" .. pw end
  if opts.query then query[#query + 1] = opts.query end
  if self.tls and not (opts.query or ""):match("ca=") then query[#query + 1] = "ca=" .. self.tls.ca end
  return ("%s://%s%s/%s/0%s"):format(self.tls and "rediss+sentinel" or "redis+sentinel", auth,
    table.concat(hosts, ","), opts.master or self.master, #query > 0 and "?" .. table.concat(query, "&") or "")
end

function Group:stop()
  for _, list in ipairs({ self.sentinels, self.lone }) do
    for _, s in ipairs(list) do
      os.execute(("kill -KILL %d 2>/dev/null"):format(s.pid))
      helpers.wait_for(function() return not helpers.running(s.pid) end, 10)
      os.execute("rm -rf " .. s.dir)
    end
  end
  self.sentinels, self.lone = {}, {}
  for _, s in ipairs(self.servers) do s:stop() end
  self.servers = {}
end

M.Group = Group

return M
