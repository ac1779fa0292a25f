-- spec/unit/backoff_spec.lua -- moonjob.backoff on its own: checking a
-- backoff, and the wait it gives after each attempt (no pool, no child).
local Backoff = require "moonjob.backoff"

describe("moonjob.backoff", function()
  describe(".check()", function()
    it("accepts a function and the two table types", function()
      assert.is_true(Backoff.check(function() return 1 end))
      assert.is_true(Backoff.check({ type = "fixed", delay = 0 }))
      assert.is_true(Backoff.check({ type = "exponential", delay = 0.5, jitter = 1 }))
    end)

    it("says why a value is not a backoff", function()
      assert.same({ false, "must be a table or a function" }, { Backoff.check(5) })
      assert.same({ false, "needs type = \"fixed\" or \"exponential\"" }, { Backoff.check({ type = "linear", delay = 1 }) })
      assert.same({ false, "needs delay = a number of seconds" }, { Backoff.check({ type = "fixed" }) })
      assert.same({ false, "needs delay = a number of seconds" }, { Backoff.check({ type = "fixed", delay = -1 }) })
      assert.same({ false, "needs delay = a number of seconds" }, { Backoff.check({ type = "fixed", delay = 0 / 0 }) })
      assert.same({ false, "jitter must be between 0 and 1" }, { Backoff.check({ type = "fixed", delay = 1, jitter = 1.5 }) })
      assert.same({ false, "jitter must be between 0 and 1" }, { Backoff.check({ type = "fixed", delay = 1, jitter = "x" }) })
    end)
  end)

  describe(".delay()", function()
    it("waits nothing without a backoff", function()
      assert.equal(0, Backoff.delay(nil, 3, nil))
    end)

    it("waits the same after every attempt when fixed", function()
      local b = { type = "fixed", delay = 2 }
      assert.equal(2, Backoff.delay(b, 1))
      assert.equal(2, Backoff.delay(b, 5))
    end)

    it("doubles the wait after each attempt when exponential", function()
      local b = { type = "exponential", delay = 0.5 }
      assert.same({ 0.5, 1, 2, 4 }, { Backoff.delay(b, 1), Backoff.delay(b, 2), Backoff.delay(b, 3), Backoff.delay(b, 4) })
    end)

    it("takes a random share of up to jitter off the wait", function()
      local random = math.random
      finally(function() math.random = random end)
      math.random = function() return 0.5 end
      assert.equal(8 * (1 - 0.25), Backoff.delay({ type = "exponential", delay = 2, jitter = 0.5 }, 3))
      math.random = function() return 0 end
      assert.equal(2, Backoff.delay({ type = "fixed", delay = 2, jitter = 1 }, 1))
    end)

    it("asks a function, passing the attempt and the error", function()
      local seen
      local d = Backoff.delay(function(attempt, err) seen = { attempt, err } return 7 end, 4, "boom")
      assert.equal(7, d)
      assert.same({ 4, "boom" }, seen)
    end)

    it("does not retry when the function gives false or nothing", function()
      assert.is_false(Backoff.delay(function() return false end, 1))
      assert.is_false(Backoff.delay(function() end, 1))
    end)

    it("waits 0 for a negative or non-numeric answer of the function", function()
      assert.equal(0, Backoff.delay(function() return -3 end, 1))
      assert.equal(0, Backoff.delay(function() return "soon" end, 1))
      assert.equal(1.5, Backoff.delay(function() return "1.5" end, 1))
    end)
  end)
end)
