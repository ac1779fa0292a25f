-- spec/unit/fetch_policy_spec.lua -- moonjob.redis.fetch_policy on its own:
-- how many jobs a worker without a `prefetch` option holds beyond its
-- running ones, given the run times it measured (no Redis, no pool).
local FetchPolicy = require "moonjob.redis.fetch_policy"

-- A policy of `size` children (lease 30 s) that measured `ms` n times.
local function measured(size, ms, n)
  local p = FetchPolicy.new(size, 30000)
  for _ = 1, n do p:ran(ms) end
  return p
end

describe("moonjob.redis.fetch_policy", function()
  it("holds one job per child before any run time is known", function()
    local p = FetchPolicy.new(2, 30000)
    assert.equal(2, p:held_max())
    assert.equal(4, FetchPolicy.new(4, 30000):held_max())
  end)

  it("grows by one job per run measured, up to its cap", function()
    local p = FetchPolicy.new(2, 30000)
    for i = 1, 10 do
      p:ran(0)
      assert.equal(2 + i, p:held_max())
    end
    for _ = 1, 500 do p:ran(0) end
    assert.equal(256, p:held_max()) -- MIN_CAP for a small worker
    assert.equal(2 + 256, p:most())
    assert.equal(8 * 64, measured(8, 0, 2000):held_max()) -- PER_CHILD_MAX per child
    assert.equal(1024, measured(32, 0, 2000):held_max()) -- MAX_CAP
  end)

  it("never holds more than 100 ms of estimated work per child", function()
    for _, case in ipairs({ { 2, 5, 40 }, { 2, 1, 200 }, { 4, 5, 80 }, { 2, 30, 6 }, { 2, 200, 1 }, { 2, 201, 0 },
        { 1, 150, 0 }, { 8, 1000, 0 } }) do
      local size, ms, want = case[1], case[2], case[3]
      local p = measured(size, ms, 1000)
      assert.equal(want, p:held_max(), ("size %d, %d ms jobs"):format(size, ms))
      assert.is_true(p:held_max() * ms <= 100 * size)
    end
  end)

  it("holds no more than a twentieth of a short lease", function()
    local p = FetchPolicy.new(2, 1000) -- lease 1 s: 50 ms per child
    for _ = 1, 1000 do p:ran(5) end
    assert.equal(20, p:held_max())
    assert.equal(50, p.horizon_ms)
  end)

  it("follows a moving average, weighing the newest run by 1/8", function()
    local p = measured(2, 0, 200)
    p:ran(80)
    assert.equal(10, p.avg)
    assert.equal(20, p:held_max()) -- 200 ms of work / 10 ms
    p:ran(10)
    assert.equal(10, p.avg)
  end)

  it("counts a busy worker's youngest running job as a lower bound of the next ones", function()
    local p = measured(2, 1, 1000)
    assert.equal(200, p:held_max()) -- 100 ms of 1 ms jobs per child
    assert.equal(0, p:look(2, 0.5, 100)) -- young jobs: the average says
    assert.equal(96, p:look(2, 50, 100)) -- both busy for 50 ms: 4 may be held, 100 is over twice that
    assert.equal(4, p:held_max())
    assert.equal(0, p:look(2, 50, 8)) -- twice: kept (no give-back for a wobble)
    assert.equal(0, p:look(1, 5000, 4)) -- a child is free: the average alone
    assert.equal(200, p:held_max())
  end)

  it("gives every held job back once the running ones outlast the horizon", function()
    local p = FetchPolicy.new(2, 30000) -- nothing measured: one per child
    assert.equal(0, p:look(2, 80, 2)) -- 80 ms: 2 may still be held
    assert.equal(2, p:look(2, 250, 2)) -- 250 ms: none
    assert.equal(0, p:held_max())
  end)

  it("fetches when half of what it may hold is missing, or a child is free", function()
    local p = measured(2, 0, 1000) -- 256 held at most
    assert.is_false(p:fetch_now(0, 0))
    assert.is_false(p:fetch_now(127, 0))
    assert.is_true(p:fetch_now(128, 0))
    assert.is_true(p:fetch_now(1, 1))
    local slow = measured(2, 200, 100) -- 1 held at most
    assert.is_true(slow:fetch_now(1, 0))
  end)

  it("holds exactly an explicit prefetch, fetching whenever there is room", function()
    local p = FetchPolicy.fixed(3, 2)
    for _ = 1, 100 do p:ended({ started = 0, ms = 0 }, 1) end
    assert.equal(3, p:held_max())
    assert.equal(5, p:most())
    assert.is_true(p:fetch_now(1, 0))
    assert.is_false(p:fetch_now(0, 2))
  end)

  it("samples a job once, and only one that started", function()
    local p = FetchPolicy.new(2, 30000)
    local job = { started = 100 }
    p:ended(job, 130)
    p:ended(job, 500)
    p:ended({}, 500)
    assert.equal(1, p.samples)
    assert.equal(30, p.avg)
  end)
end)
