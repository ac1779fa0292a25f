-- Durable queues on Redis: writes a server refuses for its state, beyond
-- OOM (spec/redis/refusals_spec.lua): too few replicas for
-- min-replicas-to-write (NOREPLICAS), a disk that cannot take its snapshot
-- (MISCONF). A worker's report is sent again until it lands, never dropped.
local helpers = require "helpers"
local rf = require "redis_workers"

describe("Redis refusing writes for its state #slow", function()
  after_each(rf.close_all)

  it("a completion refused with NOREPLICAS is sent again once writes are taken: completed once", function()
    local server = rf.server()
    local log = os.tmpname()
    local q = rf.producer(server, "noreplicas")
    local p = rf.pool(server, "noreplicas", { size = 1, lease = 5 })
    local said = {}
    p:on("redis", function(kind, why) said[#said + 1] = kind .. ": " .. tostring(why) end)
    local job = assert(q:add({ log = log, sleep = 0.5 }))
    helpers.wait_for(function() return #rf.lines(log) == 1 end, 20)
    assert.equal("OK", server:cli("CONFIG", "SET", "min-replicas-to-write", "1"))
    helpers.wait_for(function() return p:stats().completed == 1 end, 20)
    helpers.wait_for(function() return table.concat(said, "\n"):find("complete [^\n]*NOREPLICAS") end, 10)
    assert.equal("OK", server:cli("CONFIG", "SET", "min-replicas-to-write", "0"))
    local result = assert(job:wait(20))
    assert.equal(1, result.attempt)
    assert.equal(1, #rf.lines(log)) -- ran once
    local text = table.concat(said, "\n")
    assert.matches("complete refused for now: NOREPLICAS", text)
    assert.equal(0, q:counts().failed)
  end)
end)
