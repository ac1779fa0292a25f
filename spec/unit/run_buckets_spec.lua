-- moonjob.run_buckets: the one set of run-time buckets and the percentile
-- estimate read from them: every run time from 1 ms to 10 min (and on to
-- the last bound) is estimated within the stated error; the bucket found in
-- O(1) is the one a scan of the bounds finds.
local names = require "moonjob.redis.names"
local run_buckets = require "moonjob.run_buckets"

local function scan(ms) -- the bucket, as a plain scan finds it
  for i, b in ipairs(run_buckets.BOUNDS_MS) do
    if ms <= b then return i end
  end
  return #run_buckets.BOUNDS_MS + 1
end

describe("the run-time buckets", function()
  it("are 8 per power of two from 1 ms to 2^20 ms, as short decimals", function()
    local b = run_buckets.BOUNDS_MS
    assert.equal(161, #b)
    assert.equal(162, run_buckets.COUNT)
    assert.same({ 1, 1.091, 1.189, 1.297, 1.414, 1.542, 1.682, 1.834, 2 }, { unpack(b, 1, 9) })
    assert.same({ 939, 1024, 1117 }, { b[80], b[81], b[82] })
    assert.equal(2 ^ 20, b[161])
    for i = 2, #b do assert.is_true(b[i] > b[i - 1]) end
    assert.equal(0.001091, run_buckets.BOUNDS_SECONDS[2])
    assert.equal("1.091", names.run_bound(1))
  end)

  it("finds a run's bucket as a scan of the bounds does, at and around every bound", function()
    for _, b in ipairs(run_buckets.BOUNDS_MS) do
      for _, ms in ipairs({ b * (1 - 1e-9), b, b * (1 + 1e-9), b * 1.03 }) do
        assert.equal(scan(ms), run_buckets.bucket(ms), "ms " .. ms)
      end
    end
    assert.equal(1, run_buckets.bucket(0))
    assert.equal(1, run_buckets.bucket(1))
    assert.equal(162, run_buckets.bucket(2 ^ 20 + 1))
    assert.equal(162, run_buckets.bucket(1e15))
  end)

  it("estimates every run time from 1 ms to 17.5 min within its stated error, 4.5%", function()
    assert.is_true(run_buckets.ERROR <= 0.045, "stated " .. run_buckets.ERROR)
    local worst, ms = 0, 1.0001
    while ms <= 2 ^ 20 do
      local est, bound = run_buckets.estimate(run_buckets.bucket(ms))
      assert.is_nil(bound)
      worst = math.max(worst, math.abs(est / ms - 1))
      assert.is_true(math.abs(est / ms - 1) <= run_buckets.ERROR + 1e-12, ("%.6g ms read as %.6g"):format(ms, est))
      ms = ms * 1.0007
    end
    assert.is_true(worst > 0.04, "the sweep reached a bucket's end") -- the bound is met, not loose
  end)

  it("reads quantiles from sparse counts, the ends as bounds", function()
    local counts = { [run_buckets.bucket(20)] = 90, [run_buckets.bucket(1000)] = 10 }
    assert.is_true(math.abs(run_buckets.quantile(counts, 100, 0.5) / 20 - 1) < 0.045)
    assert.is_true(math.abs(run_buckets.quantile(counts, 100, 0.9) / 20 - 1) < 0.045)
    assert.is_true(math.abs(run_buckets.quantile(counts, 100, 0.99) / 1000 - 1) < 0.045)
    assert.same({ 1, "below" }, { run_buckets.quantile({ 5 }, 5, 0.5) })
    assert.same({ 2 ^ 20, "above" }, { run_buckets.quantile({ [162] = 3 }, 3, 0.99) })
    assert.is_nil(run_buckets.quantile({}, 0, 0.5))
  end)
end)
