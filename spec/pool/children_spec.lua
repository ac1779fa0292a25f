local core = require "moonjob.core"
local h = require "helpers"

describe("children", function()
  after_each(h.cleanup)

  it("are reused: consecutive jobs with size = 1 run in the same pid", function()
    local pool = h.pool("pid.lua", { size = 1 })
    local pids = pool:map({ 1, 2, 3 })
    assert.equal(pids[1], pids[2])
    assert.equal(pids[2], pids[3])
    assert.equal(1, pool:stats().spawned)
  end)

  for _, code in ipairs({ 0, 1 }) do
    it(("that call os.exit(%d) mid-job fail it with ECRASH and are replaced"):format(code), function()
      local pool = h.pool("fails.lua", { size = 1 })
      local _, err = pool:run({ how = "exit" .. code })
      assert.equal("ECRASH", err.code)
      assert.equal(code, err.exit_status)
      assert.is_nil(err.signal)
      assert.equal(("the child process exited with code %d during the job"):format(code), err.message)
      assert.equal("ok", pool:run({ how = "none" }))
      local s = pool:stats()
      assert.equal(2, s.spawned)
      assert.equal(1, s.crashed)
    end)
  end

  it("killed with SIGKILL from outside mid-job fail it with ECRASH naming the signal", function()
    local pool = h.pool("fails.lua", { size = 1 })
    local job = pool:add({ how = "sleep", seconds = 5 })
    h.wait_started(job)
    os.execute("kill -KILL " .. job.pid)
    local _, err = job:wait()
    assert.equal("ECRASH", err.code)
    assert.equal(9, err.signal)
    assert.equal("the child process was killed by signal 9 during the job", err.message)
    assert.equal("ok", pool:run({ how = "none" }))
  end)

  it("are reported by the exit event when they are gone", function()
    local pool = h.pool("fails.lua", { size = 1 })
    local exits = {}
    pool:on("exit", function(pid, status, signal) exits[#exits + 1] = { pid, status, signal } end)
    local job = pool:add({ how = "exit1" })
    job:wait()
    h.wait_for(function() return #exits == 1 end)
    assert.same({ job.pid, 1, 0 }, exits[1])
  end)

  it("run the next job in a new child after a crash", function()
    local pool = h.pool("pid.lua", { size = 1 })
    local first = pool:run(1)
    os.execute("kill -KILL " .. first)
    h.wait_for(function() return pool:stats().crashed == 1 end)
    local second = pool:run(2)
    assert.is_not.equal(first, second)
    assert.equal(1, pool:stats().children)
  end)

  it("that die while idle are replaced without touching any job", function()
    local pool = h.pool("pid.lua", { size = 1 })
    local first = pool:run(1)
    os.execute("kill -KILL " .. first)
    h.wait_for(function() local s = pool:stats() return s.crashed == 1 and s.children == 1 end)
    local s = pool:stats()
    assert.equal(0, s.failed)
    assert.equal(1, s.completed)
    assert.is_number(pool:run(2))
  end)

  it("that died before the parent noticed never cost a job: it runs in the replacement", function()
    local pool = h.pool("pid.lua", { size = 1 })
    local first = pool:run(1)
    -- kill the child and wait for it to be dead without running the loop, so the
    -- pool still believes it idle when the next job is dispatched
    os.execute("kill -KILL " .. first)
    h.wait_until_zombie(first)
    local job = pool:add(2)
    local second, err = job:wait()
    assert.is_nil(err)
    assert.is_not.equal(first, second)
    assert.equal(1, job.attempts)
    assert.equal(0, pool:stats().failed)
  end)

  it("of a closed pool are gone, with no zombie left", function()
    local pool = h.pool("pid.lua", { size = 2 })
    local pids = pool:map({ 1, 2, 3, 4 })
    pool:close()
    for _, pid in ipairs(pids) do
      local f = io.open("/proc/" .. pid .. "/stat")
      assert.is_nil(f) -- not even a zombie
    end
  end)
end)

describe("supervision", function()
  after_each(h.cleanup)


  it("never reuses a child that failed to load, fails waiting jobs at once, and recovers once the file is fixed", function()
    local dir = h.tmpdir()
    local file = dir .. "/processor.lua"
    h.write_file(file, 'error("broken on purpose")\n')
    local pool = assert(require("moonjob").pool(file, { size = 2, echo = false }))
    local failures = {}
    for i = 1, 3 do
      local _, err = pool:run(i)
      failures[i] = err
    end
    for i = 1, 3 do
      assert.equal("ELOAD", failures[i].code)
      assert.matches("broken on purpose", failures[i].message)
    end
    assert.is_true(pool:stats().spawned <= 4) -- 2 at start, one probe for each later run
    h.write_file(file, "return function(job) return job.data * 2 end\n")
    -- a job added while the back-off runs waits for the next probe, which
    -- loads the fixed file
    assert.equal(42, pool:run(21, { attempts = 30, backoff = { type = "fixed", delay = 0.1 } }))
    h.wait_for(function() return pool:stats().children == 2 end) -- back to full size
    pool:close()
    os.execute("rm -rf " .. dir)
  end)

  it("waits longer between starts while loads keep failing", function()
    local pool = h.pool("load_error.lua", { size = 1 })
    local exits = {}
    pool:on("exit", function() exits[#exits + 1] = core.hrtime() / 1e9 end)
    pool:add(1, { attempts = 1000, backoff = { type = "fixed", delay = 0.01 } })
    h.wait_for(function() return #exits >= 4 end)
    -- back-off 0.1, 0.2, 0.4 s between the four starts. Exits are seen a reap later than
    -- the load failed, by a few ms that vary (more in the sanitized build): each gap holds
    -- half its back-off at least, and the three together nearly all of theirs
    for i = 2, 4 do
      assert.is_true(exits[i] - exits[i - 1] >= 0.1 * 2 ^ (i - 2) * 0.5, "gap " .. (i - 1))
    end
    assert.is_true(exits[4] - exits[1] >= 0.7 - 0.05, "the three back-offs")
  end)

  it("replaces a child that does not take its job, and runs the job elsewhere without counting it", function()
    local pool = h.pool("pid.lua", { size = 1, ack_timeout = 0.3 })
    local first = pool:run(1)
    os.execute("kill -STOP " .. first)
    local job = pool:add(2)
    local second, err = job:wait()
    assert.is_nil(err)
    assert.is_not.equal(first, second)
    assert.equal(1, job.attempts)
    h.wait_for(function() return not h.running(first) end, 5)
  end)

  it("recycles a child after max_jobs_per_child jobs", function()
    local pool = h.pool("pid.lua", { size = 1, max_jobs_per_child = 2 })
    local pids = pool:map({ 1, 2, 3, 4, 5 })
    assert.equal(pids[1], pids[2])
    assert.is_not.equal(pids[2], pids[3])
    assert.equal(pids[3], pids[4])
    assert.is_not.equal(pids[4], pids[5])
    assert.equal(0, pool:stats().crashed)
  end)

  it("caps the Lua heap with memory_limit: the job fails with ENOMEM and the child is recycled", function()
    local pool = h.pool("memory.lua", { size = 1, memory_limit = 32 * 1024 * 1024 })
    local job = pool:add({})
    local _, err = job:wait()
    assert.equal("ENOMEM", err.code)
    assert.equal("the job needed more than memory_limit (33554432 bytes)", err.message)
    assert.equal(1000, pool:run({ small = true }))
    assert.equal(2, pool:stats().spawned)
    assert.equal(0, pool:stats().crashed)
  end)

  it("reaps idle children after idle_timeout, down to min_size, and starts them again on demand", function()
    local pool = h.pool("pid.lua", { size = 2, idle_timeout = 0.2, min_size = 1 })
    pool:map({ 1, 2, 3, 4 })
    h.wait_for(function() return pool:stats().children == 1 end, 5)
    h.sleep(0.3)
    assert.equal(1, pool:stats().children)
    local jobs = {}
    for i = 1, 4 do jobs[i] = pool:add(i) end
    pool:drain()
    assert.equal(0, pool:stats().crashed)
  end)

  it("starts children with core dumps off and no new privileges", function()
    local pool = h.pool("sandbox_probe.lua", { size = 1 })
    local probe = pool:run({})
    assert.equal("0", probe.core)
    assert.equal("1", probe.no_new_privs)
  end)

  it("bounds a stdout flood to max_log_bytes per job and stays responsive", function()
    local pool = h.pool("spin.lua", { size = 1, max_log_bytes = 100000, timeout = 0.5, kill_after = 0.2 })
    local worst_gap, last = 0, core.hrtime()
    local ticker = core.timer(function()
      local now = core.hrtime()
      worst_gap = math.max(worst_gap, (now - last) / 1e6)
      last = now
    end)
    ticker:start(10, 10)
    local job = pool:add({ how = "flood" })
    local _, err = job:wait()
    ticker:close()
    assert.equal("ETIMEDOUT", err.code)
    local kept = 0
    for _, line in ipairs(job.logs) do kept = kept + #line + 1 end
    assert.is_true(kept <= 100000 + 200, "kept " .. kept .. " bytes")
    assert.matches("output past max_log_bytes %(100000%) is dropped", job.logs[#job.logs])
    assert.is_true(worst_gap < 500, "the loop stalled for " .. worst_gap .. " ms")
  end)

  it("reports each job's wall time, the child's CPU time during it, and its peak RSS", function()
    local pool = h.pool("spin.lua", { size = 1, jit = false, timeout = 0.2 })
    local job = pool:add({ how = "jit_loop" })
    job:wait()
    assert.is_true(job.ms >= 150)
    -- (spinning for 200 ms: at least a tenth of that on a loaded machine; a
    -- child that did not spin, or a figure not measured, would show ~0)
    assert.is_true(job.cpu_ms >= 20, "cpu_ms " .. tostring(job.cpu_ms))
    assert.is_true(job.max_rss_kb > 1000)
  end)
end)

describe("pool:close()", function()
  after_each(h.cleanup)


  it("with a timeout ends jobs still running after it with ECLOSED and leaves nothing behind", function()
    local before = h.open_fds()
    local pool = assert(require("moonjob").pool(h.fixture("spin.lua"), { size = 2, echo = false }))
    local pidfile = os.tmpname()
    local jobs = { pool:add({ how = "jit_loop" }), pool:add({ how = "grandchild", file = pidfile }) }
    h.wait_for(function() return jobs[1].state == "active" and jobs[2].state == "active" end)
    h.wait_for(function() return h.first_line("cat " .. pidfile) ~= nil end)
    local grandchild = h.first_line("cat " .. pidfile) -- ignores SIGTERM
    local pids = { jobs[1].pid, jobs[2].pid }
    local t0 = core.hrtime()
    pool:close({ timeout = 0.2 })
    assert.is_true((core.hrtime() - t0) / 1e9 < 5)
    for i = 1, 2 do
      assert.equal("ECLOSED", jobs[i].error.code)
      assert.is_false(h.unreaped(pids[i]))
    end
    h.wait_for(function() return not h.running(grandchild) end)
    os.remove(pidfile)
    for fd in pairs(h.open_fds()) do
      assert.is_true(before[fd], "descriptor left open: " .. fd)
    end
  end)

  it("ends a job that fails during the close with attempts left, instead of keeping it waiting", function()
    local pool = h.pool("fails.lua", { size = 1, attempts = 3 })
    local job = pool:add({ how = "sleep_then_fail", seconds = 0.3 })
    h.wait_for(function() return job.state == "active" end)
    pool:close()
    local _, err = job:wait()
    assert.equal("failed", job.state)
    assert.equal("EPROCESSOR", err.code)
    assert.equal(1, job.attempts)
  end)

  it("ends a job its stopped child never took with ECLOSED, instead of keeping it waiting", function()
    local pool = h.pool("identity.lua", { size = 1, ack_timeout = 0.3 })
    assert.equal(0, pool:run(0))
    os.execute("kill -STOP " .. pool:stats().workers[1].pid)
    local job = pool:add(1)
    pool:close()
    local _, err = job:wait()
    assert.equal("ECLOSED", err.code)
    assert.equal(0, job.attempts)
  end)

  it("with force does not wait for running jobs", function()
    local pool = h.pool("deaf.lua", { size = 1 })
    local job = pool:add({ seconds = 30 })
    h.wait_for(function() return job.state == "active" end)
    local t0 = core.hrtime()
    pool:close({ force = true })
    assert.is_true((core.hrtime() - t0) / 1e9 < 5)
    assert.equal("ECLOSED", job.error.code)
    assert.is_false(h.unreaped(job.pid))
  end)
end)
