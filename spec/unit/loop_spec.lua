-- spec/unit/loop_spec.lua -- moonjob.loop with no pool and no child: deferred
-- functions, waiting, the clock, and what cannot run inside a callback.
local core = require "moonjob.core"
local loop = require "moonjob.loop"

describe("moonjob.loop", function()
  describe(".defer()", function()
    it("runs functions on a later turn of the loop, in the order given", function()
      local ran = {}
      loop.defer(function() ran[#ran + 1] = "a" end)
      loop.defer(function() ran[#ran + 1] = "b" end)
      assert.same({}, ran)
      loop.wait_until(function() return #ran == 2 end)
      assert.same({ "a", "b" }, ran)
    end)
  end)

  describe(".wait_until()", function()
    it("raises a clear error inside a moonjob callback", function()
      local err
      loop.defer(function() err = select(2, pcall(loop.wait_until, function() return false end)) end)
      loop.wait_until(function() return err ~= nil end)
      assert.equal("cannot wait inside a moonjob event callback; use pool:on() events there", err)
    end)
  end)

  describe(".step()", function()
    it("raises a clear error inside a moonjob callback", function()
      local err
      loop.defer(function() err = select(2, pcall(loop.step)) end)
      loop.wait_until(function() return err ~= nil end)
      assert.matches("moonjob.step() cannot run inside a moonjob event callback; it runs them", err, 1, true)
    end)
  end)

  describe(".now()", function()
    it("reads milliseconds on the clock of core.hrtime()", function()
      local before = core.hrtime() / 1e6
      local now = loop.now()
      local after = core.hrtime() / 1e6
      assert.is_true(before <= now and now <= after)
    end)
  end)
end)
