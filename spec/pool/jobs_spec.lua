-- How the pool schedules jobs: retries and their backoff, delay and
-- priority, backpressure (max_queue). (Ids, dedupe and the cache:
-- keys_spec.lua; named processors: router_spec.lua.)
local core = require "moonjob.core"
local h = require "helpers"

local function now_ms() return core.hrtime() / 1e6 end

describe("retries", function()
  after_each(h.cleanup)

  it("run a failing job again up to `attempts`, visible as job.attempt in the child", function()
    local pool = h.pool("flaky.lua", { size = 1, attempts = 3 })
    local retries = {}
    pool:on("retrying", function(job, err, delay) retries[#retries + 1] = { err.message, delay } end)
    local job = pool:add({ succeed_at = 3 })
    assert.equal(3, job:wait())
    assert.equal(3, job.attempts)
    assert.equal(2, #retries)
    assert.matches("attempt 1 failed", retries[1][1])
    assert.equal(2, #job.errors)
    assert.is_nil(job.error)
    assert.equal(2, pool:stats().retries)
  end)

  it("fail for good after the last attempt, with the last error", function()
    local pool = h.pool("flaky.lua", { size = 1, attempts = 2 })
    local _, err = pool:run({})
    assert.matches("attempt 2 failed", err.message)
  end)

  it("stop at once on an error raised with retry = false", function()
    local pool = h.pool("flaky.lua", { size = 1, attempts = 5 })
    local job = pool:add({ final = true })
    local _, err = job:wait()
    assert.equal("bad input", err.message)
    assert.equal(1, job.attempts)
  end)

  it("count crashes and timeouts as attempts", function()
    local pool = h.pool("spin.lua", { size = 1, attempts = 2, timeout = 0.05, kill_after = 0.05 })
    local job = pool:add({ how = "jit_loop" })
    local _, err = job:wait()
    assert.equal("ETIMEDOUT", err.code)
    assert.equal(2, job.attempts)
  end)

  it("wait the fixed backoff between attempts", function()
    local pool = h.pool("flaky.lua", { size = 1, attempts = 3, backoff = { type = "fixed", delay = 0.1 } })
    local t0 = now_ms()
    assert.equal(3, pool:run({ succeed_at = 3 }))
    local elapsed = now_ms() - t0
    assert.is_true(elapsed >= 200 and elapsed < 5000, elapsed .. " ms")
  end)

  it("double the delay with an exponential backoff, and report it", function()
    local pool = h.pool("flaky.lua", { size = 1, attempts = 3,
      backoff = { type = "exponential", delay = 0.05 } })
    local delays = {}
    pool:on("retrying", function(_, _, delay) delays[#delays + 1] = delay end)
    pool:run({ succeed_at = 3 })
    assert.same({ 0.05, 0.1 }, delays)
  end)

  it("take jitter off the delay, never more than the share asked", function()
    local pool = h.pool("flaky.lua", { size = 1, attempts = 4,
      backoff = { type = "fixed", delay = 0.1, jitter = 0.5 } })
    local delays = {}
    pool:on("retrying", function(_, _, delay) delays[#delays + 1] = delay end)
    pool:run({ succeed_at = 4 })
    for _, d in ipairs(delays) do assert.is_true(d >= 0.05 and d <= 0.1, tostring(d)) end
  end)

  it("follow a backoff function, which can also refuse a retry", function()
    local pool = h.pool("flaky.lua", { size = 1, attempts = 10 })
    local seen = {}
    local job = pool:add({}, { backoff = function(attempt, err)
      seen[#seen + 1] = attempt
      if attempt >= 3 then return false end
      return 0.01
    end })
    local _, err = job:wait()
    assert.matches("attempt 3 failed", err.message)
    assert.same({ 1, 2, 3 }, seen)
  end)

  it("are set per job, overriding the pool", function()
    local pool = h.pool("flaky.lua", { size = 1, attempts = 1 })
    assert.equal(2, pool:run({ succeed_at = 2 }, { attempts = 2 }))
  end)
end)

describe("delay and priority", function()
  after_each(h.cleanup)

  it("refuse numbers that cannot order or time a job, naming the option", function()
    local pool = h.pool("order.lua", { size = 1 })
    assert.has_error(function() pool:add(1, { priority = 0 / 0 }) end,
      "pool:add(): option 'priority' must be a finite number (lower runs first)")
    assert.has_error(function() pool:add(1, { delay = math.huge }) end,
      "pool:add(): option 'delay' must be a number of seconds (0 to 1000000000)")
    assert.has_error(function() pool:add(1, { timeout = -1 }) end,
      "pool:add(): option 'timeout' must be a number of seconds (0 to 1000000000)")
    assert.equal(0, pool:stats().waiting)
  end)

  it("delay holds a job back for that many seconds", function()
    local pool = h.pool("order.lua", { size = 1 })
    pool:run("warm")
    local t0 = now_ms()
    local job = pool:add("late", { delay = 0.2 })
    assert.equal("late", job:wait())
    local waited = job.started - t0
    assert.is_true(waited >= 195 and waited < 5000, waited .. " ms")
  end)

  it("lower priority runs first, first in first out within one priority", function()
    -- one job per child: with pipelining a child may hold a few jobs sent
    -- before a better one came (pipeline_spec checks that bound)
    local pool = h.pool("order.lua", { size = 1, pipeline = 1 })
    pool:run("warm")
    local order = {}
    pool:on("active", function(job) order[#order + 1] = job.name end)
    pool:add("block", { name = "block" })
    h.wait_for(function() return #order == 1 end)
    pool:add(1, { name = "p5-a", priority = 5 })
    pool:add(2, { name = "p1-a", priority = 1 })
    pool:add(3, { name = "p5-b", priority = 5 })
    pool:add(4, { name = "p1-b", priority = 1 })
    pool:add(5, { name = "p0", priority = 0 })
    pool:drain()
    assert.same({ "block", "p0", "p1-a", "p1-b", "p5-a", "p5-b" }, order)
  end)

  it("a delayed job can be canceled", function()
    local pool = h.pool("order.lua", { size = 1 })
    local job = pool:add("never", { delay = 10 })
    assert.is_true(job:cancel("changed my mind"))
    local _, err = job:wait()
    assert.equal("ECANCELED", err.code)
    assert.equal(0, pool:stats().waiting)
  end)
end)

describe("backpressure", function()
  after_each(h.cleanup)

  it("add past max_queue returns nil and EQUEUEFULL", function()
    local pool = h.pool("order.lua", { size = 1, max_queue = 2 })
    assert.truthy(pool:add("block"))
    h.wait_for(function() return pool:stats().active == 1 end)
    assert.truthy(pool:add(1))
    assert.truthy(pool:add(2))
    local job, err = pool:add(3)
    assert.is_nil(job)
    assert.equal("EQUEUEFULL", err.code)
    pool:drain()
    assert.truthy(pool:add(4))
  end)

  it("map adds no faster than the pool drains, and keeps input order", function()
    local pool = h.pool("order.lua", { size = 2, max_queue = 3 })
    local items = {}
    for i = 1, 50 do items[i] = i end
    local results = pool:map(items)
    for i = 1, 50 do assert.equal(i, results[i]) end
  end)
end)
