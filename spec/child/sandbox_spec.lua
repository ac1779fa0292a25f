-- The sandbox holds: what a child inherits, which limits it can lift, what it
-- leaves behind. Each case is tried with real processes, the way a processor
-- trying to get out would: listing its descriptors, raising its limits through
-- ffi, starting grandchildren that ignore SIGTERM or keep the channel, and
-- outliving a parent killed by SIGKILL.
local h = require "helpers"
local core = require "moonjob.core"
local ffi = require "ffi"

-- declared one by one: other specs of the run may have declared some already
for _, decl in ipairs({ "int open(const char *path, int flags, int mode);", "int dup2(int from, int to);",
  "int close(int fd);" }) do
  pcall(ffi.cdef, decl)
end
local O_RDONLY = 0


describe("a child", function()
  after_each(h.cleanup)

  it("holds only stdin, stdout, stderr and its channel, whatever the parent left open", function()
    -- neither is close-on-exec: an io.open'd file and a descriptor high up
    local path = os.tmpname()
    local file = assert(io.open(path, "w"))
    local raw = ffi.C.open("/etc/hostname", O_RDONLY, 0)
    assert.is_true(raw >= 0)
    local high = ffi.C.dup2(raw, 200)
    assert.equal(200, high)
    local pool = h.pool("descriptors.lua", { size = 1 })
    local open = pool:run({})
    ffi.C.close(raw)
    ffi.C.close(high)
    file:close()
    os.remove(path)
    -- and a pidfd of its parent (close-on-exec), which its watcher thread polls
    assert.equal(5, #open, table.concat(open, ", "))
    assert.equal("0 /dev/null", open[1])
    for fd = 1, 2 do assert.matches("^" .. fd .. " pipe:", open[fd + 1]) end -- stdout, stderr
    assert.matches("^3 socket:", open[4]) -- the channel
    assert.equal("4 anon_inode:[pidfd]", open[5])
  end)

  it("holds only those through the command line too, with a joblog open", function()
    local dir = h.tmpdir()
    local out, err, status = h.sh(("%s scripts/moonjob run spec/fixtures/descriptors.lua --joblog %s/log"
      .. " -j 1"):format(h.LUAJIT, dir), "{}\n")
    os.execute("rm -rf " .. dir)
    assert.equal(0, status, err)
    local listed = out:match('"result":(%b[])')
    assert.equal('["0 /dev/null",', listed:sub(1, 15))
    local n = select(2, listed:gsub('"%d+ ', ""))
    assert.equal(5, n, listed) -- 0-3 and the parent's pidfd
  end)

  local function check_limits_hold(opts)
    local pool = h.pool("raise_limits.lua", opts)
    local report = pool:run({})
    -- the sanitized build sets no RLIMIT_DATA (Makefile, sanitize): nothing to raise there
    local limited = h.SANITIZED and { "core", "nproc" } or { "core", "nproc", "data" }
    for _, name in ipairs(limited) do
      local r = report[name]
      assert.is_false(r.raised, name .. ": a processor raised its hard limit to unlimited")
      assert.same(r.before, r.after, name)
    end
    assert.same({ soft = "0", hard = "0" }, report.core.before)
    assert.same({ soft = "20", hard = "20" }, report.nproc.before)
    if h.SANITIZED then
      assert.same({ soft = "unlimited", hard = "unlimited" }, report.data.before)
    else
      local backstop = tostring(10e6 * 2 + 256 * 1024 * 1024)
      assert.same({ soft = backstop, hard = backstop }, report.data.before)
      assert.is_false(report.gib_malloc, "1 GiB allocated past the RLIMIT_DATA backstop")
    end
  end

  it("cannot raise its limits back through ffi: core, max_procs and the memory backstop hold", function()
    check_limits_hold({ size = 1, memory_limit = 10e6, max_procs = 20 })
  end)

  it("cannot raise them back either when dropped from root to another user", function()
    assert.is_true(h.AS_ROOT, "this spec drops from root to 'nobody': run the suite as root (as CI does)")
    check_limits_hold({ size = 1, memory_limit = 10e6, max_procs = 20, user = "nobody" })
  end)

  it("keeps a fork bomb inside max_procs even after trying to lift it, and leaves none behind", function()
    -- root is exempt from RLIMIT_NPROC: the user option drops the child to nobody
    local pool = h.pool("forks.lua", { size = 1, max_procs = 8, user = h.AS_ROOT and "nobody" or nil,
      timeout = 5, kill_after = 1 })
    local job = pool:add({ tries = 50, lift = true })
    local started = job:wait()
    assert.is_true(started < 8, "started " .. tostring(started) .. " processes")
    local group = job.pid
    pool:close()
    assert.same({}, h.wait_group_gone(group))
  end)
end)

describe("a child whose sandbox cannot be set up", function()
  after_each(h.cleanup)

  -- A wrapper child program: the real one, with one set-up call made to fail.
  local function failing_child(dir, call)
    local path = h.write_file(dir .. "/child.sh", ([[#!/bin/sh
LD_PRELOAD=%s/spec-failing.so MOONJOB_FAIL=%s ASAN_OPTIONS="${ASAN_OPTIONS}:verify_asan_link_order=0" \
  exec %s "$@"
]]):format(h.abs(h.BUILD), call, core.child_path()))
    os.execute("chmod +x " .. path)
    return path
  end

  local CASES = {
    { "prctl:38", "PR_SET_NO_NEW_PRIVS" }, { "prctl:1", "PR_SET_PDEATHSIG" },
    { "setrlimit:4", "RLIMIT_CORE" }, { "setrlimit:6", "RLIMIT_NPROC" },
    { "fcntl:2", "close%-on%-exec" }, { "fcntl:4", "blocking" },
    { "close_range:5", "inherited descriptors" },
  }
  if not h.SANITIZED then -- that build sets no RLIMIT_DATA (Makefile, sanitize)
    CASES[#CASES + 1] = { "setrlimit:2", "RLIMIT_DATA" }
  end
  for _, case in ipairs(CASES) do
    it("runs no job: " .. case[1] .. " failing ends in ELOAD naming " .. case[2], function()
      local dir = h.tmpdir()
      local child = failing_child(dir, case[1])
      local pool = h.pool("identity.lua", { size = 1, child = child, max_procs = 50, memory_limit = 50e6 })
      local _, err = pool:run({ x = 1 })
      os.execute("rm -rf " .. dir)
      assert.equal("ELOAD", err.code)
      assert.matches(case[2], err.message)
      assert.matches("runs no job without its sandbox", err.message)
    end)
  end

  it("runs no job when the user option names no user", function()
    local pool = h.pool("identity.lua", { size = 1, user = "no-such-user-here" })
    local _, err = pool:run({ x = 1 })
    assert.equal("ELOAD", err.code)
    assert.matches("no such user 'no%-such%-user%-here'", err.message)
  end)
end)

describe("grandchildren", function()
  after_each(h.cleanup)
  local KINDS = { "plain", "ignores_term", "holds_channel" }

  for _, how in ipairs(KINDS) do
    it("(" .. how .. ") are gone once pool:close() returns, and close() does not wait for them", function()
      local pool = h.pool("grandchildren.lua", { size = 1 })
      local pids = pool:run({ how = how })
      assert.is_true(h.running(pids.grandchild))
      local t0 = core.hrtime()
      pool:close()
      local seconds = (core.hrtime() - t0) / 1e9
      assert.is_true(seconds < 3, ("close() took %.1f s"):format(seconds))
      assert.same({}, h.wait_group_gone(pids.child))
    end)
  end

  it("of a job killed mid-run by close({ force }) are gone with it", function()
    local pool = h.pool("grandchildren.lua", { size = 1 })
    local seen
    pool:on("progress", function(_, pids) seen = pids end)
    local job = pool:add({ how = "ignores_term", stay = true })
    h.wait_for(function() return seen ~= nil end)
    pool:close({ force = true })
    assert.equal("ECLOSED", job.error.code)
    assert.same({}, h.wait_group_gone(seen.child))
  end)

  -- A parent program that starts four children with grandchildren (three
  -- busy, one idle) and writes their pids to a file, then sleeps.
  local PARENT = [[
local moonjob = require "moonjob"
local pool = assert(moonjob.pool("spec/fixtures/grandchildren.lua",
  { size = 4, echo = false, user = arg[2] ~= "" and arg[2] or nil }))
local seen = {}
pool:on("progress", function(_, pids) seen[#seen + 1] = pids.child .. " " .. pids.grandchild end)
for _, how in ipairs({ "plain", "ignores_term", "holds_channel" }) do
  pool:add({ how = how, stay = true, deaf = how == "plain" }) -- deaf: ignores the death signal
end
local done = pool:run({ how = "plain" }) -- its child is idle, blocked reading the channel
seen[#seen + 1] = done.child .. " " .. done.grandchild
require("moonjob.loop").wait_until(function() return #seen == 4 end)
local f = assert(io.open(arg[1], "w"))
f:write(table.concat(seen, "\n"), "\n")
f:close()
require("ffi").cdef("unsigned sleep(unsigned seconds);")
while true do require("ffi").C.sleep(60) end
]]

  for _, user in ipairs({ "", "nobody" }) do
    local as = user == "" and "" or " (children running as " .. user .. ")"
    it("die with the parent when it is killed by SIGKILL, with every child, busy or idle" .. as, function()
      assert.is_true(user == "" or h.AS_ROOT, "the user option needs the suite to run as root (as CI does)")
      local dir = h.tmpdir()
      local script = h.write_file(dir .. "/parent.lua", PARENT)
      local pid = tonumber(h.first_line(("%s %s %s/pids '%s' >/dev/null 2>&1 & echo $!")
        :format(h.LUAJIT, script, dir, user)))
      local groups = {}
      finally(function() -- whatever happens, nothing is left running
        os.execute("kill -KILL " .. pid .. " 2>/dev/null")
        for _, group in ipairs(groups) do os.execute("kill -KILL -" .. group .. " 2>/dev/null") end
        os.execute("rm -rf " .. dir)
      end)
      h.wait_for(function()
        local f = io.open(dir .. "/pids")
        local n = f and select(2, f:read("*a"):gsub("\n", ""))
        if f then f:close() end
        return n == 4
      end)
      for line in io.lines(dir .. "/pids") do
        local child, grandchild = line:match("^(%d+) (%d+)$")
        groups[#groups + 1] = tonumber(child)
        assert.is_true(h.running(tonumber(grandchild)))
      end
      os.execute("kill -KILL " .. pid)
      for _, group in ipairs(groups) do
        assert.same({}, h.wait_group_gone(group), "group " .. group .. " outlived its parent")
      end
    end)
  end
end)
