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
--   g:stop()
--
-- opts.password: the data servers' (requirepass and masterauth; the
-- sentinels are told it); opts.sentinel_password: the sentinels' own
-- (requirepass, and sentinel-pass between them); opts.primary_extra:
-- more arguments for the first primary (min-replicas-to-write ...).
-- Failure detection is quick: down-after-milliseconds 1000,
-- failover-timeout 3000 ms.
local helpers = require "helpers"
local redis_server = require "redis_server"

local M = {}
local Group = {}
Group.__index = Group

local function quote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

function Group:_sentinel_conf(dir, port, primary_port)
  local lines = {
    "port " .. port, "bind 127.0.0.1", "dir " .. dir, "logfile " .. dir .. "/sentinel.log",
    ("sentinel monitor %s 127.0.0.1 %d 2"):format(self.master, primary_port),
    ("sentinel down-after-milliseconds %s 1000"):format(self.master),
    ("sentinel failover-timeout %s 3000"):format(self.master),
    ("sentinel parallel-syncs %s 1"):format(self.master),
  }
  if self.password then lines[#lines + 1] = ("sentinel auth-pass %s %s"):format(self.master, self.password) end
  if self.sentinel_password then
    lines[#lines + 1] = "requirepass " .. self.sentinel_password
    lines[#lines + 1] = "sentinel sentinel-pass " .. self.sentinel_password
  end
  return helpers.write_file(dir .. "/sentinel.conf", table.concat(lines, "\n") .. "\n")
end

function Group:_start_sentinel(primary_port)
  local dir = helpers.tmpdir()
  local port = redis_server.free_port()
  local conf = self:_sentinel_conf(dir, port, primary_port)
  local pid = assert(tonumber(helpers.first_line(("redis-server %s --sentinel & echo $!"):format(conf))))
  local s = { port = port, pid = pid, dir = dir }
  self.sentinels[#self.sentinels + 1] = s
  return s
end

-- redis-cli on sentinel i (1 to 3), its output as a string.
function Group:sentinel_cli(i, ...)
  local args = {}
  for k, a in ipairs({ ... }) do args[k] = quote(a) end
  local auth = self.sentinel_password and ("--no-auth-warning -a " .. quote(self.sentinel_password)) or ""
  local h = io.popen(("redis-cli -p %d %s %s 2>&1"):format(self.sentinels[i].port, auth, table.concat(args, " ")))
  local out = h:read("*a")
  h:close()
  return (out:gsub("\n$", ""))
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

-- The replica's link to its primary is up (it has the data).
function M.link_up(server)
  return server:cli("INFO", "replication"):find("master_link_status:up", 1, true) ~= nil
end

function M.start(opts)
  opts = opts or {}
  local self = setmetatable({ master = opts.master or "m", password = opts.password,
    sentinel_password = opts.sentinel_password, sentinels = {}, servers = {} }, Group)
  local auth = opts.password and ("--masterauth " .. opts.password) or ""
  local ok, err = pcall(function()
    local primary = redis_server.start({ password = opts.password, extra = auth .. " " .. (opts.primary_extra or "") })
    self.servers[1] = primary
    local replica = redis_server.start({ password = opts.password,
      extra = ("%s --replicaof 127.0.0.1 %d"):format(auth, primary.port) })
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

-- The URL of the group: the sentinels in order (extra: a list of
-- "host:port" put first), the master's name, database 0.
function Group:url(opts)
  opts = opts or {}
  local hosts = {}
  for _, h in ipairs(opts.first or {}) do hosts[#hosts + 1] = h end
  for _, s in ipairs(self.sentinels) do hosts[#hosts + 1] = "127.0.0.1:" .. s.port end
  local auth = self.password and (":" .. self.password .. "@") or ""
  local query = self.sentinel_password and ("?sentinel_password=" .. self.sentinel_password) or ""
  return ("redis+sentinel://%s%s/%s/0%s"):format(auth, table.concat(hosts, ","), opts.master or self.master, query)
end

function Group:stop()
  for _, s in ipairs(self.sentinels) do
    os.execute(("kill -KILL %d 2>/dev/null"):format(s.pid))
    helpers.wait_for(function() return not helpers.running(s.pid) end, 10)
    os.execute("rm -rf " .. s.dir)
  end
  self.sentinels = {}
  for _, s in ipairs(self.servers) do s:stop() end
  self.servers = {}
end

M.Group = Group

return M
