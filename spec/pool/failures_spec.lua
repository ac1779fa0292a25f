-- Failure behaviour at the edges: jobs that must never run twice, children
-- killed at the worst moment, full heaps, errors that cannot cross as they
-- are. (Start failures and the breaker: breaker_spec.lua.)
local h = require "helpers"
local lines_in = require("counting").lines_in

describe("a job", function()
  local dir, runs
  before_each(function()
    dir = h.tmpdir()
    runs = dir .. "/runs"
  end)
  after_each(function()
    h.cleanup()
    os.execute("rm -rf " .. dir)
  end)

  for _, how in ipairs({ "jit_loop", "c_call" }) do
    it("cancelled while stuck in a " .. how .. " fails once with ECANCELED and never runs again", function()
      local pool = h.pool("runs.lua", { size = 1, ack_timeout = 0.3, kill_after = 0.5 })
      local completed = 0
      pool:on("completed", function() completed = completed + 1 end)
      local job = pool:add({ file = runs, how = how })
      h.wait_for(function() return lines_in(runs) == 1 end)
      h.sleep(0.3) -- a margin for the child to be inside the loop or the C call, past any hook
      job:cancel("enough")
      local _, err = job:wait()
      assert.equal("ECANCELED", err.code)
      assert.equal("the job was canceled: enough; the child was killed after kill_after (0.5 s)", err.message)
      assert.equal("ran", pool:run({ file = runs, how = "none" })) -- the pool goes on
      assert.equal(2, lines_in(runs))
      assert.equal(1, completed)
      assert.equal(1, #job.errors)
    end)
  end

  it("cancelled an instant after it was sent is interrupted, whenever its child gets the signal", function()
    -- jit = false: the job's loop is always interruptible, so only a lost
    -- interrupt could let it complete (kill_after is far away)
    local pool = h.pool("runs.lua", { size = 1, jit = false, kill_after = 60 })
    local completed = 0
    pool:on("completed", function() completed = completed + 1 end)
    assert.equal("ran", pool:run({ file = runs, how = "none" }))
    for round = 1, 20 do
      local pad = string.rep("x", round % 2 == 0 and 4 * 1024 * 1024 or 0)
      local job = pool:add({ file = runs, how = "spin", seconds = 5, pad = pad })
      assert.is_true(job:cancel("at once"))
      local _, err = job:wait()
      assert.equal("ECANCELED", err and err.code, "round " .. round)
      assert.equal("the job was canceled: at once", err.message)
    end
    assert.equal(1, completed)
    assert.equal(0, pool:stats().killed)
  end)

  it("with data slower to read than ack_timeout is taken, not given back #slow", function()
    local pool = h.pool("identity.lua", { size = 1, ack_timeout = 0.02, max_payload = 256 * 1024 * 1024 })
    local data = string.rep("x", 200 * 1024 * 1024)
    local job = pool:add(data)
    assert.equal(#data, #job:wait())
    assert.equal(1, job.attempts)
    assert.equal(1, pool:stats().spawned)
  end)

  it("with a soft timeout shorter than ack_timeout runs once #slow", function()
    local pool = h.pool("runs.lua", { size = 1, timeout = 0.1, kill_after = 0.3 })
    local job = pool:add({ file = runs, how = "jit_loop" })
    local _, err = job:wait()
    assert.equal("ETIMEDOUT", err.code)
    assert.equal(1, job.attempts)
    assert.equal(1, #job.errors)
    h.sleep(2.3) -- past ack_timeout: the sweep must not bring the job back
    assert.equal(1, lines_in(runs))
    assert.equal("failed", job.state)
  end)

  it("keeps every attempt's error in job.errors, the last one too", function()
    local pool = h.pool("runs.lua", { size = 1 })
    local job = pool:add({ file = runs, how = "fail" })
    local _, err = job:wait()
    assert.equal(1, #job.errors)
    assert.equal(err, job.errors[1])
    job = pool:add({ file = runs, how = "fail" }, { attempts = 3 })
    _, err = job:wait()
    assert.equal(3, #job.errors)
    assert.equal(err, job.errors[3])
    assert.equal("EAGAIN", job.errors[1].code)
  end)

  it("that crashes its child at once fails with ECRASH, and runs exactly its attempts", function()
    local pool = h.pool("runs.lua", { size = 1 })
    local job = pool:add({ file = runs, how = "exit" }, { attempts = 3 })
    local _, err = job:wait()
    assert.equal("ECRASH", err.code)
    assert.equal(3, job.attempts)
    assert.equal(3, lines_in(runs))
  end)
end)

describe("a child killed from outside while idle", function()
  after_each(h.cleanup)

  it("an instant before a job reaches it costs the job nothing: 40 rounds all complete", function()
    local pool = h.pool("pid.lua", { size = 1 })
    pool:run(0)
    for round = 1, 40 do
      h.wait_for(function()
        local w = pool:stats().workers[1]
        return w and w.state == "idle"
      end)
      os.execute("kill -KILL " .. pool:stats().workers[1].pid)
      local job = pool:add(round)
      local _, err = job:wait()
      assert.is_nil(err, err and tostring(err))
      assert.equal(1, job.attempts)
    end
  end)
end)

describe("a full heap (memory_limit)", function()
  after_each(h.cleanup)

  for _, how in ipairs({ "tables", "global", "string", "rep", "ffi", "errfull" }) do
    it("fails the job with ENOMEM (" .. how .. "), and the pool goes on", function()
      local pool = h.pool("memory_bomb.lua", { size = 1, memory_limit = 32 * 1024 * 1024 })
      local _, err = pool:run(how)
      assert.equal("ENOMEM", err.code)
      assert.equal("the job needed more than memory_limit (33554432 bytes)", err.message)
      assert.equal("ok", pool:run("none"))
    end)
  end

  it("fails the job with ENOMEM when its data or result cannot fit, and the pool goes on", function()
    local pool = h.pool("identity.lua", { size = 1, memory_limit = 32 * 1024 * 1024 })
    for _, mb in ipairs({ 10, 20, 31, 40 }) do
      local _, err = pool:run(string.rep("x", mb * 1024 * 1024))
      assert.equal("ENOMEM", err and err.code, mb .. " MB: " .. tostring(err and err.message))
      assert.matches("needed more than memory_limit %(33554432 bytes%)$", err.message)
      assert.equal(mb, pool:run(mb))
    end
    assert.equal(0, pool:stats().crashed)
  end)

  it("too small to start the processor fails with a clear ELOAD", function()
    local pool = h.pool("memory_bomb.lua", { size = 1, memory_limit = 20000 })
    local _, err = pool:run("none")
    assert.equal("ELOAD", err.code)
    assert.equal("memory_limit (20000 bytes) is too small to start the processor", err.message)
  end)
end)

describe("errors that cannot cross as they are", function()
  after_each(h.cleanup)

  it("keep every field that can, with placeholders for the rest", function()
    local pool = h.pool("memory_bomb.lua", { size = 1 })
    local _, err = pool:run("errtable")
    assert.equal("EPROCESSOR", err.code)
    assert.equal("x", err.reason)
    assert.equal("[function]", err.f)
    assert.equal("[thread]", err.co)
    assert.same({ deep = {} }, err.nested)
  end)

  it("mark cycles as [Circular]", function()
    local dir = h.tmpdir()
    local file = h.write_file(dir .. "/p.lua", [[
      return function() local t = { name = "loop" } t.self = t error({ code = "ECYCLE", t = t }) end]])
    local pool = assert(require("moonjob").pool(file, { size = 1, echo = false }))
    local _, err = pool:run(1)
    assert.equal("ECYCLE", err.code)
    assert.equal("loop", err.t.name)
    assert.equal("[Circular]", err.t.self)
    pool:close()
    os.execute("rm -rf " .. dir)
  end)

  it("raised as a table without a message at load read as a description, not an address", function()
    local dir = h.tmpdir()
    local file = h.write_file(dir .. "/p.lua", 'error({ reason = "no config" })\n')
    local pool = assert(require("moonjob").pool(file, { size = 1, echo = false }))
    local _, err = pool:run(1)
    assert.equal("ELOAD", err.code)
    assert.equal('a table was raised: { reason = "no config" }', err.message)
    assert.equal("no config", err.reason)
    pool:close()
    os.execute("rm -rf " .. dir)
  end)
end)

describe("results that are 64-bit integers", function()
  after_each(h.cleanup)

  it("arrive in a parent that never loaded ffi itself, also through a completed listener", function()
    local out, err, status = h.sh(h.LUAJIT .. [[ -e '
      local pool = require("moonjob").pool("spec/fixtures/int64.lua", { size = 1, echo = false })
      local seen
      pool:on("completed", function(_, r) seen = r end)
      local a = pool:run("literal")
      local b = pool:run("new")
      print(tostring(a), tostring(b), tostring(seen), type(a), package.loaded.ffi ~= nil)
      pool:close()']]) -- no 64-bit literal in this script either: it would load ffi
    assert.equal(0, status, err)
    assert.equal("42LL\t42LL\t42LL\tcdata\ttrue\n", out)
  end)
end)
