-- spec/embed/embed_spec.lua -- moonjob driven by another event loop: luv (Debian's
-- lua-luv, the loop of Luvit) watches moonjob.fd() and calls moonjob.step()
-- when it is readable and when moonjob.timeout() has passed.
--
-- Every case has a luv timer of its own that stops luv's loop after 20 s,
-- should moonjob never be driven (a hang would otherwise hold the run).
local h = require "helpers"
local moonjob = require "moonjob"
local uv = require "luv"

-- Drives moonjob from luv's loop: the example's own driver, which the
-- README shows. Returns { stop = a function that stops driving }.
local drive_with = dofile("examples/luv_driver.lua")
local function drive()
  return { stop = drive_with(uv) }
end

-- Runs luv's loop until done() (looked at after every luv callback, through
-- a check handle) or 20 s; returns whether done() came true.
local function run_luv_until(done)
  local check, deadline = uv.new_check(), uv.new_timer()
  local finished = false
  check:start(function() if done() then finished = true; uv.stop() end end)
  deadline:start(20000, 0, function() uv.stop() end)
  uv.run()
  check:close()
  deadline:close()
  uv.run("nowait") -- the close callbacks
  return finished
end

describe("moonjob inside a luv loop", function()
  local driver
  after_each(function()
    if driver then driver.stop() end
    driver = nil
    uv.run("nowait")
    h.cleanup()
  end)

  it("runs jobs while a luv timer keeps ticking at its rate", function()
    local pool = h.pool("slow.lua", { size = 2 })
    driver = drive()
    local ticks, t0 = 0, uv.hrtime()
    local ticker = uv.new_timer()
    ticker:start(10, 10, function() ticks = ticks + 1 end)
    local jobs = {}
    local adder = uv.new_timer() -- the jobs are added from a luv callback
    adder:start(0, 0, function()
      for i = 1, 20 do jobs[i] = pool:add({ ms = 50, i = i }) end
    end)
    local finished = run_luv_until(function()
      if #jobs < 20 then return false end
      for _, job in ipairs(jobs) do if not job:is_finished() then return false end end
      return true
    end)
    local elapsed_ms = (uv.hrtime() - t0) / 1e6
    ticker:close()
    adder:close()
    assert.is_true(finished, "the jobs never ended")
    for i, job in ipairs(jobs) do
      assert.equal("completed", job.state)
      assert.same({ ms = 50, i = i }, job.result)
    end
    -- 20 jobs of 50 ms on 2 children take 0.5 s at least; a loop blocked by
    -- moonjob would have ticked a handful of times, not ~50
    assert.is_true(elapsed_ms >= 450, "elapsed " .. elapsed_ms)
    assert.is_true(ticks >= elapsed_ms / 10 / 3, ("%d ticks in %.0f ms"):format(ticks, elapsed_ms))
  end)

  it("lands moonjob's own timers (a job's timeout, its kill) through timeout(), with no descriptor readable", function()
    local pool = h.pool("spin.lua", { size = 1, timeout = 0.2, kill_after = 0.2 })
    driver = drive()
    local job = pool:add({ how = "c_call" }) -- a C call: only the hard kill stops it
    assert.is_true(run_luv_until(function() return job:is_finished() end), "the timeout never landed")
    assert.equal("ETIMEDOUT", job.error.code)
    assert.is_true(job.error.killed)
  end)

  it("runs a delayed job when its delay is over, its timer armed from outside moonjob", function()
    local pool = h.pool("echo.lua", { size = 1 })
    driver = drive()
    local job
    local adder = uv.new_timer()
    adder:start(20, 0, function()
      job = pool:add("later", { delay = 0.2 })
      assert(moonjob.timeout(), "a delayed job: timeout() says when")
    end)
    assert.is_true(run_luv_until(function() return job ~= nil and job:is_finished() end))
    adder:close()
    assert.equal("later", job.result.data)
  end)

  it("leaves blocking calls working, from the program and from inside a luv callback", function()
    local pool = h.pool("slow.lua", { size = 1 })
    driver = drive()
    local first = pool:add({ ms = 10 })
    assert.is_true(run_luv_until(function() return first:is_finished() end))
    assert.same({ ms = 20 }, pool:run({ ms = 20 })) -- blocking, after steps
    local ticks, ticks_during, result = 0, nil, nil
    local ticker, caller = uv.new_timer(), uv.new_timer()
    ticker:start(5, 5, function() ticks = ticks + 1 end)
    caller:start(30, 0, function()
      local before = ticks
      result = pool:run({ ms = 200 }) -- runs moonjob's loop; luv's waits meanwhile
      ticks_during = ticks - before
    end)
    assert.is_true(run_luv_until(function() return result ~= nil end))
    ticker:close()
    caller:close()
    assert.same({ ms = 200 }, result)
    assert.equal(0, ticks_during, "luv ran no callback during the blocking call")
  end)

  it("refuses step() inside a moonjob event listener, with a clear error", function()
    local pool = h.pool("echo.lua", { size = 1 })
    local raised
    pool:on("completed", function() raised = select(2, pcall(moonjob.step)) end)
    pool:run("x")
    assert.matches("moonjob.step%(%) cannot run inside a moonjob event callback", raised)
  end)

  it("says when nothing is left to watch: step() false and timeout() nil once every pool is closed", function()
    -- a program of its own: this one's loop also serves the other spec files' leftovers
    local out, err, status = h.sh(h.LUAJIT .. [[ -e '
      local moonjob = require "moonjob"
      print(moonjob.step(), moonjob.timeout())
      local pool = assert(moonjob.pool("spec/fixtures/echo.lua", { size = 1, echo = false }))
      pool:run("x")
      print(moonjob.step(), type(moonjob.timeout()))
      pool:close()
      print(moonjob.step(), moonjob.timeout())']])
    assert.equal(0, status, err)
    assert.equal("false\tnil\ntrue\tnumber\nfalse\tnil\n", out) -- a pool open: at least its sweep's timer
  end)
end)
