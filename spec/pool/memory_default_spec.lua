-- The pool option memory_limit in Lua: a cap by default (a share of the
-- machine's memory per child), bytes or a size string, and false or "none"
-- to lift it; each reaches the child (its RLIMIT_DATA backstop: twice the
-- cap and 256 MiB, or unlimited). A bad value raises, naming the option.
local h = require "helpers"
local moonjob = require "moonjob"
local Options = require "moonjob.pool.options"

local MIB = 1024 * 1024

describe("the pool option memory_limit", function()
  after_each(h.cleanup)

  local function child_data_limit(pool)
    return assert(pool:run("limits"))
  end

  it("is on by default: half the machine's memory shared among the children, 64 MiB to 2 GiB", function()
    local pool = h.pool("runaway.lua", { size = 2 })
    local expected = math.max(64 * MIB, math.min(2048 * MIB, math.floor(Options.machine_memory() / 2 / 2 / MIB) * MIB))
    if os.getenv("MOONJOB_MEMORY_LIMIT") then expected = Options.size(os.getenv("MOONJOB_MEMORY_LIMIT")) end
    assert.equal(expected, pool.memory_limit)
    assert.equal(h.data_backstop(expected), child_data_limit(pool))
  end)

  it("replaces, not counts as crashed, a child whose heap stayed full till its timeout", function()
    local pool = h.pool("runaway.lua", { size = 1, memory_limit = "64M", timeout = 0.5 })
    local _, err = pool:run("hoard")
    assert.equal("ETIMEDOUT", err.code)
    assert.is_nil(err.heap_full) -- (the child's word to its pool only)
    assert.equal(1000, assert(pool:run("some")))
    assert.equal(0, pool:stats().crashed)
  end)

  it("takes a size string, and false or \"none\" to lift the cap", function()
    local pool = h.pool("runaway.lua", { size = 1, memory_limit = "48M" })
    assert.equal(48 * MIB, pool.memory_limit)
    assert.equal(h.data_backstop(48 * MIB), child_data_limit(pool))
    for _, none in ipairs({ false, "none" }) do
      pool = h.pool("runaway.lua", { size = 1, memory_limit = none })
      assert.is_nil(pool.memory_limit)
      assert.equal("unlimited", child_data_limit(pool))
    end
  end)

  it("raises on a value that is no size, naming the option and the forms it takes", function()
    for _, bad in ipairs({ 0, -5, "lots", true, 2 ^ 47, "" }) do
      assert.has_error(function() moonjob.pool(h.fixture("runaway.lua"), { memory_limit = bad }) end)
      local ok, err = pcall(moonjob.pool, h.fixture("runaway.lua"), { memory_limit = bad })
      assert.is_false(ok)
      assert.matches("option 'memory_limit' must be a number of bytes %(1 to 2%^46%), a size such as 512M", err)
    end
  end)
end)
