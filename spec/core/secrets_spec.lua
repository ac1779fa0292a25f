-- A Redis URL (its password) in the parent's environment stays the parent's:
-- a processor that looks for it in /proc/<parent>/environ with plain io.open,
-- and in the parent's memory (every readable region of /proc/<parent>/maps,
-- read through /proc/<parent>/mem), finds nothing: the parent is not
-- dumpable once it has a child (core/parent/spawn.c), and a root child loses
-- the capabilities that would pass that (core/child/sandbox.c). The command
-- line also wipes MOONJOB_REDIS from its own environment block once read.
-- Real processes: a program with a local pool started with MOONJOB_REDIS set
-- (as the spec's user, and as an unprivileged user when the spec runs as
-- root), and `moonjob worker` on a real redis-server with a password.
local h = require "helpers"
local json = require "moonjob.codec.json"
local redis_server = require "redis_server"

local PROBE = h.abs(h.fixture("parent_secrets.lua"))

-- A password of this run: the same text twice would make a stale copy
-- anywhere look like a leak.
local function new_password()
  local f = assert(io.open("/dev/urandom", "rb"))
  local bytes = f:read(12)
  f:close()
  return "pw-" .. bytes:gsub(".", function(c) return ("%02x"):format(c:byte()) end)
end

local function shell_quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- A program with a local pool of one child on the probe; it prints the
-- probe's report as JSON. The secret is given reversed (see the probe).
local PROGRAM = [[
local moonjob = require "moonjob"
local json = require "moonjob.codec.json"
local pool = assert(moonjob.pool(arg[1], { size = 1, echo = false }))
local result, err = pool:run({ secret = arg[2] })
pool:close()
io.write(assert(json.encode(result or { error = tostring(err) })), "\n")
]]

-- Runs the program with MOONJOB_REDIS holding `password`, as `as_user`
-- (a prefix such as setpriv's) or as the spec's user; returns the report.
local function local_pool_report(password, as_user)
  local dir = h.tmpdir()
  local program = h.write_file(dir .. "/program.lua", PROGRAM)
  os.execute("chmod -R a+rX " .. dir)
  local url = ("redis://:%s@127.0.0.1:1/0"):format(password)
  local out, err, status = h.sh(("MOONJOB_REDIS=%s %s%s %s %s %s"):format(shell_quote(url), as_user or "",
    h.LUAJIT, program, PROBE, password:reverse()))
  os.execute("rm -rf " .. dir)
  assert.equal(0, status, err)
  return assert(json.decode(out), "not a report: " .. out)
end

local function assert_kept_out(report)
  assert.is_nil(report.error)
  assert.matches("^denied: .*Permission denied", report.environ, "the child read its parent's environment")
  assert.matches("^denied: .*Permission denied", report.memory, "the child read its parent's memory")
end

-- Capability n in a hexadecimal mask of /proc/PID/status (CapEff: ...).
local function has_capability(mask, n)
  local word = n < 32 and tonumber(mask:sub(-8), 16) or tonumber(mask:sub(1, -9), 16) or 0
  return math.floor(word / 2 ^ (n % 32)) % 2 == 1
end

describe("a secret in the parent's environment", function()
  it("cannot be read by a processor from /proc/<parent>/environ or its memory", function()
    local report = local_pool_report(new_password())
    assert_kept_out(report)
    if h.AS_ROOT then -- a root child has lost what would pass (CAP_SYS_PTRACE, ...)
      for _, cap in ipairs({ 19, 21, 24, 38 }) do -- SYS_PTRACE, SYS_ADMIN, SYS_RESOURCE, PERFMON
        for _, set in ipairs({ "effective", "permitted", "bounding" }) do
          assert.is_false(has_capability(report.capabilities[set], cap), ("capability %d in %s"):format(cap, set))
        end
      end
    end
  end)

  it("cannot be read by a processor of an unprivileged parent either", function()
    if not h.AS_ROOT or not h.first_line("command -v setpriv") then
      pending("needs root and setpriv to run the program as another user")
      return
    end
    assert_kept_out(local_pool_report(new_password(), "setpriv --reuid=65534 --regid=65534 --clear-groups "))
  end)

  it("given to `moonjob worker` in MOONJOB_REDIS stays out of its processors' reach, and its environment #slow", function()
    local password = new_password()
    local server = redis_server.start({ password = password })
    local log = os.tmpname()
    local pid
    local ok, failure = pcall(function()
      pid = assert(tonumber(h.first_line(("MOONJOB_REDIS=%s %s scripts/moonjob worker %s --queue secrets -j 1"
        .. " 2>%s >/dev/null & echo $!"):format(shell_quote(server.url), h.LUAJIT, PROBE, log))))
      local q = assert(require("moonjob").queue(server.url, "secrets"))
      local job = assert(q:add({ secret = password:reverse() }))
      local report, err = job:wait(20)
      q:close()
      assert(report, tostring(err))
      assert_kept_out(report)
      -- the worker's own environment block no longer holds the URL (root
      -- reads it: the worker is not dumpable)
      local f = h.AS_ROOT and io.open("/proc/" .. pid .. "/environ", "rb")
      if f then
        local environ = f:read("*a")
        f:close()
        assert.is_nil(environ:find(password, 1, true), "the password is still in the worker's environment")
      end
    end)
    if pid then os.execute(("kill -KILL %d 2>/dev/null"):format(pid)) end
    server:stop()
    os.remove(log)
    assert(ok, failure)
  end)
end)

-- Children of one pool run as one user (root without CAP_SYS_PTRACE when
-- the suite runs as root, see above): each makes itself not dumpable before
-- any processor code runs, so that a sibling can read neither its memory
-- (another job's data) nor its /proc files, nor trace it.
describe("a job's data in another child of the same pool", function()
  after_each(h.cleanup)

  local function assert_kept_apart(report)
    assert.is_nil(report.error)
    assert.not_equal(report.sibling, report.pid) -- (the probe ran in another child)
    assert.matches("^denied: .*Permission denied", report.memory, "a sibling read the child's memory: " .. json.encode(report))
    assert.matches("^denied: .*Permission denied", report.environ, "a sibling read the child's environment")
    assert.equal("denied: Operation not permitted", report.ptrace, "a sibling traced the child")
  end

  it("cannot be read by a sibling from /proc/<child>/mem, nor traced", function()
    local dir = h.tmpdir()
    local secret = new_password()
    local pool = h.pool("sibling_secrets.lua", { size = 2 })
    local holder = pool:add({ hold = secret:reverse(), wait = dir .. "/done" })
    h.wait_started(holder)
    local pid = holder.child.pid
    local report, err = pool:run({ probe = pid, secret = secret:reverse() })
    h.write_file(dir .. "/done", "")
    assert.equal(pid, holder:wait())
    os.execute("rm -rf " .. dir)
    assert.is_nil(err, err and tostring(err))
    assert_kept_apart(report)
  end)

  -- (as root, the test above has root children without CAP_SYS_PTRACE;
  -- here they are an unprivileged user's, without the pool's `user`)
  it("cannot be read by a sibling in a program run by an unprivileged user either", function()
    if not h.AS_ROOT or not h.first_line("command -v setpriv") then
      pending("needs root and setpriv to run the program as another user")
      return
    end
    local dir = h.tmpdir()
    os.execute("chmod a+rwx " .. dir)
    local program = h.write_file(dir .. "/program.lua", [[
local moonjob = require "moonjob"
local json = require "moonjob.codec.json"
local processor, secret, dir = arg[1], arg[2], arg[3]
local pool = assert(moonjob.pool(processor, { size = 2, echo = false }))
local holder = pool:add({ hold = secret, wait = dir .. "/done", pid_file = dir .. "/pid" })
local report, err = pool:run({ probe = dir .. "/pid", secret = secret })
io.open(dir .. "/done", "w"):close()
assert(holder:wait())
pool:close()
io.write(assert(json.encode(report or { error = tostring(err) })), "\n")
]])
    os.execute("chmod a+r " .. program)
    local out, err, status = h.sh(("setpriv --reuid=65534 --regid=65534 --clear-groups %s %s %s %s %s")
      :format(h.LUAJIT, program, h.abs(h.fixture("sibling_secrets.lua")), new_password():reverse(), dir))
    os.execute("rm -rf " .. dir)
    assert.equal(0, status, err)
    assert_kept_apart(assert(json.decode(out), "not a report: " .. out))
  end)
end)
