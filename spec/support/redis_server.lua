-- spec/support/redis_server.lua -- a real redis-server for the specs.
--
--   local server = redis_server.start()     -- free loopback port, temp dir, AOF on
--   server.url                              -- "redis://127.0.0.1:PORT/0"
--   server:cli("FCALL", ...)                -- redis-cli, output as a string
--   server:kill9(); server:restart()         -- crash and come back from the AOF
--   server:stop()                           -- by its pid, directory removed
--   redis_server.free_port()                -- a loopback port nobody listens on
--   redis_server.CLI, redis_server.SERVER   -- the programs, as shell words
--   redis_server.start({ tls = { cert =, key =, ca =, auth_clients = true } })
--                                           -- TLS only (--port 0 --tls-port PORT):
--                                           -- server.url is rediss://127.0.0.1:PORT/0 (no ca=)
--
-- The programs are redis-server and redis-cli from the PATH, or another
-- server's drop-ins: MOONJOB_REDIS_SERVER names the server (Valkey's
-- valkey-server: make test-valkey), and the client beside it (valkey-cli
-- beside valkey-server) is taken unless MOONJOB_REDIS_CLI names one. Every
-- spec, bench and chaos test that starts a server or runs the client goes
-- through these, so one variable moves them all to another server.
-- The server runs in the foreground of a shell's background job whose pid we
-- record (no daemonize: the pid is the server's own), so it is ended by pid,
-- never by name.
local helpers = require "helpers"

local M = {}
local Server = {}
Server.__index = Server

local function quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- The server program, and its client: the named one, else the *-cli beside
-- a *-server named, else redis-cli.
local function programs()
  local server, cli = os.getenv("MOONJOB_REDIS_SERVER"), os.getenv("MOONJOB_REDIS_CLI")
  if server == "" then server = nil end
  if cli == "" then cli = nil end
  for _, path in ipairs({ server or "", cli or "" }) do
    if path:find("/") and not helpers.exists(path) then
      error(("no such program: %s (from MOONJOB_REDIS_SERVER or MOONJOB_REDIS_CLI)"):format(path))
    end
  end
  if server and not cli then
    local beside = server:gsub("%-server$", "-cli")
    if beside ~= server and helpers.exists(beside) then cli = beside end
  end
  return server and quote(server) or "redis-server", cli and quote(cli) or "redis-cli"
end
M.SERVER, M.CLI = programs()

-- A port nobody listens on: ask the kernel for a free one through a bind.
local function free_port()
  local out = helpers.first_line([[python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()']])
  return assert(tonumber(out), "cannot find a free port")
end

-- The client's arguments for this server: its port, TLS, the password.
function Server:_cli_args()
  local args = ("-p %d %s"):format(self.port, self.auth_args or "")
  local tls = self.tls
  if tls then
    args = ("%s --tls --cacert %s"):format(args, tls.ca)
    if tls.auth_clients then args = ("%s --cert %s --key %s"):format(args, tls.client_cert, tls.client_key) end
  end
  return args
end

-- The arguments that make the port a TLS port (and no plaintext one).
local function tls_args(port, tls)
  return ("--port 0 --tls-port %d --tls-cert-file %s --tls-key-file %s --tls-ca-cert-file %s"
    .. " --tls-auth-clients %s"):format(port, tls.cert, tls.key, tls.ca, tls.auth_clients and "yes" or "no")
end

function Server:_launch()
  local ports = self.tls and tls_args(self.port, self.tls) or ("--port %d"):format(self.port)
  local cmd = ("%s %s --bind %s --dir %s --appendonly yes --appendfsync everysec"
    .. " --save '' --maxmemory-policy noeviction --daemonize no --logfile %s/redis.log %s & echo $!")
    :format(M.SERVER, ports, self.bind, self.dir, self.dir, self.extra or "")
  self.pid = assert(tonumber(helpers.first_line(cmd)), "cannot start " .. M.SERVER)
  local deadline = os.time() + 10
  repeat
    local pong = helpers.first_line(("%s %s PING 2>/dev/null"):format(M.CLI, self:_cli_args()))
    if pong == "PONG" then return end
    helpers.sleep(0.02)
  until os.time() > deadline
  error(M.SERVER .. " did not answer within 10 s; its log: " .. (helpers.first_line("tail -3 " .. self.dir .. "/redis.log") or ""))
end

-- start([opts]): opts.password sets requirepass; opts.bind the addresses to
-- listen on (default 127.0.0.1); opts.extra adds arguments; opts.tls makes
-- its port a TLS port: { cert, key, ca (files), auth_clients (true: a client
-- must show a certificate the CA signed: client_cert, client_key, which
-- redis-cli shows) }.
function M.start(opts)
  opts = opts or {}
  local self = setmetatable({ dir = helpers.tmpdir(), port = free_port(), bind = opts.bind or "127.0.0.1",
    tls = opts.tls }, Server)
  if opts.password then
    self.extra = "--requirepass " .. opts.password
    self.auth_args = "--no-auth-warning -a " .. opts.password
  end
  self.extra = (self.extra or "") .. " " .. (opts.extra or "")
  self:_launch()
  self.url = ("%s://%s127.0.0.1:%d/0"):format(opts.tls and "rediss" or "redis",
    opts.password and (":" .. opts.password .. "@") or "", self.port)
  return self
end

function Server:cli(...)
  local args = {}
  for i, a in ipairs({ ... }) do args[i] = quote(tostring(a)) end
  local h = io.popen(("%s %s %s 2>&1"):format(M.CLI, self:_cli_args(), table.concat(args, " ")))
  local out = h:read("*a")
  h:close()
  return (out:gsub("\n$", ""))
end

function Server:signal(sig)
  os.execute(("kill -%s %d 2>/dev/null"):format(sig, self.pid))
end

function Server:wait_gone()
  local deadline = os.time() + 10
  while helpers.running(self.pid) and os.time() <= deadline do
    helpers.sleep(0.02)
  end
end

function Server:kill9()
  self:signal("KILL")
  self:wait_gone()
end

function Server:restart()
  self:_launch()
end

function Server:stop()
  if self.pid then
    self:signal("TERM")
    self:wait_gone()
    if helpers.running(self.pid) then self:kill9() end
    self.pid = nil
  end
  os.execute("rm -rf " .. self.dir)
end

M.free_port = free_port

return M
