-- spec/support/redis_faults.lua -- faults of a production Redis, on loopback,
-- for the specs of spec/redis/:
--
--   faults.tenant(server, "tenant-a", "pw", { list = true })  -- an ACL user limited to its queues
--   faults.load_library(server)            -- as an admin does: moonjob library | redis-cli -x FUNCTION LOAD REPLACE
--   faults.load_text(server, faults.library_at("8"))  -- another moonjob version's library
--   faults.replica_of(replica, primary)    -- REPLICAOF, waits until the link is up
--   local proxy = faults.proxy(server)     -- a TCP proxy; proxy:freeze() turns every link
--   proxy.url ... proxy:stop()             --   open now into a black hole (no byte, no close)
--   faults.proxy(server, { { "answer", "mark" }, { "ask", "HMGET.*token" } })
--                                          -- cuts: each link cut once, in turn (proxy:fired())
--   faults.in_namespace(hosts, script)     -- runs a Lua script with /etc/hosts replaced
--   faults.black_hole(port)                -- [::1]:port takes no new connection, silently
--
-- Everything listens on 127.0.0.1 only; processes are ended by their pid.
local helpers = require "helpers"
local redis_server = require "redis_server"

local M = {}

-- The ACL rules docs/REDIS.md gives a tenant (its queues' names begin with
-- NAME-); opts.list adds function|list (the exact check of the library).
function M.tenant_rules(name, opts)
  local rules = { "on", "resetkeys", "~mj:{" .. name .. "-*}:*", "resetchannels", "&mj:{" .. name .. "-*}:*",
    "-@all", "+@read", "+@write", "-@dangerous", "-function", "-scan", "-randomkey", "+time", "+publish", "+subscribe",
    "+ping", "+fcall", "+fcall_ro" }
  if opts and opts.list then rules[#rules + 1] = "+function|list" end
  return rules
end

function M.tenant(server, name, password, opts)
  local out = server:cli("ACL", "SETUSER", name, ">" .. password, unpack(M.tenant_rules(name, opts)))
  assert(out == "OK", out)
  return ("redis://%s:%s@127.0.0.1:%d/0"):format(name, password, server.port)
end

-- The library loaded by the admin's command (path: another library's file,
-- loaded from it).
function M.load_library(server, path)
  local source = path and ("< " .. path) or ""
  local command = ("%s -p %d -x FUNCTION LOAD REPLACE %s 2>&1"):format(redis_server.CLI, server.port, source)
  if not path then command = helpers.LUAJIT .. " scripts/moonjob library | " .. command end
  local out = helpers.first_line(command)
  assert(out == "moonjob", out)
end

-- This moonjob's library text at another version, serving programs from
-- `oldest` on (the form before that declaration, one version only, is the
-- older one's): another moonjob's library, as a rolling upgrade meets it.
function M.library_at(version, oldest)
  local library = require "moonjob.redis.library"
  local text, n = library.text():gsub('local VERSION, OLDEST_CLIENT = "[^"]*", "[^"]*"',
    ('local VERSION, OLDEST_CLIENT = "%s", "%s"'):format(version, oldest or version))
  if n == 0 then
    text, n = library.text():gsub('local function version%(%) return "[^"]*" end',
      ('local function version() return "%s" end'):format(version))
  end
  assert(n == 1, "the library's version declaration was not found")
  return text
end

-- Loads a library text as an admin would (moonjob library | redis-cli -x ...).
function M.load_text(server, text)
  local path = helpers.write_file(os.tmpname(), text)
  M.load_library(server, path)
  os.remove(path)
end

local function link_up(replica)
  return replica:cli("INFO", "replication"):find("master_link_status:up", 1, true) ~= nil
end

function M.replica_of(replica, primary)
  assert(replica:cli("REPLICAOF", "127.0.0.1", primary.port) == "OK")
  helpers.wait_for(function() return link_up(replica) end, 20)
end

-- The role a server has now ("master" or "slave").
function M.role(server)
  return server:cli("ROLE"):match("^(%a+)")
end

local PROXY = [[
import re, signal, socket, sys, threading
target = int(sys.argv[1])
fired_path = sys.argv[2]
cuts = [(sys.argv[i], re.compile(sys.argv[i + 1].encode(), re.S)) for i in range(3, len(sys.argv), 2)]
lock = threading.Lock()
accepted = [0]
frozen_below = [0]   # links numbered below this are black holes
def freeze(*_):
    frozen_below[0] = accepted[0]
signal.signal(signal.SIGUSR1, freeze)
def cut_here(way, data):
    # the first cut not made yet, if it is for this way and data holds its pattern
    with lock:
        if cuts and cuts[0][0] == way and cuts[0][1].search(data):
            cuts.pop(0)
            with open(fired_path, "a") as f:
                f.write(way + "\n")
            return True
    return False
def pipe(n, a, b, way):
    try:
        while True:
            data = a.recv(65536)
            if not data:
                break
            if n < frozen_below[0]:
                continue     # swallowed: no answer, no close, as a link that died silently
            if cut_here(way, data):
                break        # swallowed, and the link closed both ways
            b.sendall(data)
    except OSError:
        pass
    for s in (a, b):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", 0))
srv.listen(64)
print(srv.getsockname()[1], flush=True)
while True:
    client, _ = srv.accept()
    upstream = socket.create_connection(("127.0.0.1", target))
    n = accepted[0]
    accepted[0] += 1
    threading.Thread(target=pipe, args=(n, client, upstream, "ask"), daemon=True).start()
    threading.Thread(target=pipe, args=(n, upstream, client, "answer"), daemon=True).start()
]]

local Proxy = {}
Proxy.__index = Proxy

-- cuts (optional): { way, pattern } pairs, made one after the other: the
-- first chunk going that way ("ask": to Redis, "answer": from it) that
-- matches the pattern (a Python regular expression, no spaces nor quotes;
-- "." matches line ends too) is swallowed and its link closed both ways;
-- then the next cut waits for its own chunk.
function M.proxy(server, cuts)
  local dir = helpers.tmpdir()
  helpers.write_file(dir .. "/proxy.py", PROXY)
  local args = {}
  for _, c in ipairs(cuts or {}) do args[#args + 1] = c[1] .. " '" .. c[2] .. "'" end
  local pid = assert(tonumber(helpers.first_line(("python3 %s/proxy.py %d %s/fired %s > %s/port & echo $!")
    :format(dir, server.port, dir, table.concat(args, " "), dir))))
  local self = setmetatable({ pid = pid, dir = dir }, Proxy)
  helpers.wait_for(function()
    local f = io.open(dir .. "/port")
    self.port = f and tonumber(f:read("*l"))
    if f then f:close() end
    return self.port ~= nil
  end, 10)
  self.url = ("redis://127.0.0.1:%d/0"):format(self.port)
  return self
end

-- Every link open now stops carrying bytes, for good; new links work.
function Proxy:freeze()
  os.execute(("kill -USR1 %d"):format(self.pid))
end

-- The cuts made so far, in order: { "answer", "ask", ... }.
function Proxy:fired()
  local out = {}
  local f = io.open(self.dir .. "/fired")
  if not f then return out end
  for line in f:lines() do out[#out + 1] = line end
  f:close()
  return out
end

function Proxy:stop()
  os.execute(("kill -KILL %d 2>/dev/null"):format(self.pid))
  helpers.wait_for(function() return not helpers.running(self.pid) end, 10)
  os.execute("rm -rf " .. self.dir)
end

local BLACK_HOLE = [[
import socket, sys, time
port = int(sys.argv[1])
s = socket.socket(socket.AF_INET6)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("::1", port))
s.listen(0)
held = []
for _ in range(3):   # the accept queue full: the kernel drops the next SYNs, unanswered
    c = socket.socket(socket.AF_INET6)
    c.setblocking(False)
    try:
        c.connect(("::1", port))
    except BlockingIOError:
        pass
    held.append(c)
print("ready", flush=True)
time.sleep(600)
]]

-- A listener on [::1]:port that never answers a new connection (its accept
-- queue is full): connecting there hangs until the client gives up.
-- Returns an object with stop().
function M.black_hole(port)
  local dir = helpers.tmpdir()
  helpers.write_file(dir .. "/hole.py", BLACK_HOLE)
  local pid = assert(tonumber(helpers.first_line(("python3 %s/hole.py %d > %s/out & echo $!"):format(dir, port, dir))))
  helpers.wait_for(function() return helpers.first_line("cat " .. dir .. "/out") == "ready" end, 10)
  return { stop = function()
    os.execute(("kill -KILL %d 2>/dev/null"):format(pid))
    helpers.wait_for(function() return not helpers.running(pid) end, 10)
    os.execute("rm -rf " .. dir)
  end }
end

-- Runs `script` (Lua, on this tree's modules) in a mount namespace of its
-- own where /etc/hosts is `hosts`; returns its output and exit status, or
-- nil when namespaces cannot be made here (not root, no unshare).
function M.in_namespace(hosts, script)
  if not helpers.AS_ROOT or os.execute("unshare -m true 2>/dev/null") ~= 0 then return nil end
  local dir = helpers.tmpdir()
  helpers.write_file(dir .. "/hosts", hosts)
  helpers.write_file(dir .. "/script.lua", script)
  local h = io.popen(("unshare -m --propagation private sh -c 'mount --bind %s/hosts /etc/hosts && exec %s %s/script.lua' 2>&1; echo \"exit $?\"")
    :format(dir, helpers.LUAJIT, dir))
  local out = h:read("*a")
  h:close()
  os.execute("rm -rf " .. dir)
  local status = tonumber(out:match("exit (%d+)\n?$"))
  return out:gsub("exit %d+\n?$", ""), status
end

return M
