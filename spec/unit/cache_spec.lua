-- spec/unit/cache_spec.lua -- moonjob.cache on its own: entries expire at
-- their time, and past max the least recently used one goes.
local Cache = require "moonjob.cache"

-- A cache of at most `max` entries holding a = 1, b = 2, ... (one per
-- value given), each expiring at 100.
local function holding(max, ...)
  local c = Cache.new(max)
  for i, value in ipairs({ ... }) do c:set(string.char(96 + i), value, 100) end
  return c
end

describe("moonjob.cache", function()
  it("gives nothing for a key it never kept", function()
    assert.is_nil(Cache.new(2):get("a", 0))
  end)

  it("gives a value back until its expiry, then drops it", function()
    local c = Cache.new(4)
    c:set("a", "A", 100)
    assert.equal("A", c:get("a", 99.9))
    assert.is_nil(c:get("a", 100))
    assert.equal(0, c.n)
    assert.is_nil(c:get("a", 50)) -- dropped, not only hidden
  end)

  it("replaces the value of a key set twice, counting it once", function()
    local c = Cache.new(4)
    c:set("a", 1, 10)
    c:set("a", 2, 20)
    assert.equal(1, c.n)
    assert.equal(2, c:get("a", 15))
  end)

  it("drops the least recently set entry past max", function()
    local c = holding(2, 1, 2, 3)
    assert.equal(2, c.n)
    assert.is_nil(c:get("a", 0))
    assert.equal(2, c:get("b", 0))
    assert.equal(3, c:get("c", 0))
  end)

  it("counts a get as a use: the entry read last stays", function()
    local c = holding(2, 1, 2)
    assert.equal(1, c:get("a", 0))
    c:set("c", 3, 100)
    assert.equal(1, c:get("a", 0))
    assert.is_nil(c:get("b", 0))
    assert.equal(3, c:get("c", 0))
  end)

  it("deletes a key, and ignores one it does not hold", function()
    local c = holding(1, 1)
    c:delete("a")
    c:delete("zzz")
    assert.equal(0, c.n)
    assert.is_nil(c:get("a", 0))
    c:set("b", 2, 100)
    c:set("c", 3, 100) -- evicts b: "a" left the recency list with its delete
    assert.equal(1, c.n)
    assert.is_nil(c:get("b", 0))
    assert.equal(3, c:get("c", 0))
  end)
end)
