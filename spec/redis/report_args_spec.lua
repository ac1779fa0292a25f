-- Durable queues on Redis: what a worker sends in its reports stays within
-- the ranges the functions check (docs/REDIS.md, "Arguments and data that
-- are out of range"), whatever the pool's options computed.
local helpers = require "helpers"
local rf = require "redis_workers"

describe("a worker's reports within the functions' ranges #slow", function()
  after_each(rf.close_all)

  it("a retry delay past 10^12 ms (a backoff that parks the job) still lands: the job waits, delayed", function()
    local server = rf.server()
    local log = os.tmpname()
    local q = rf.producer(server, "parked")
    -- a backoff function may return any number of seconds, math.huge too
    local p = rf.pool(server, "parked", { size = 1, lease = 2, backoff = function() return math.huge end })
    local said = {}
    p:on("redis", function(kind, why) said[#said + 1] = kind .. ": " .. tostring(why) end)
    local job = assert(q:add({ log = log, fail = true }, { attempts = 3 }))
    helpers.wait_for(function() return p:stats().redis.failed == 1 end, 20)
    helpers.wait_for(function() local g = q:get(job) return g and g.state ~= "active" end, 10)
    assert.equal("delayed", q:get(job).state)
    helpers.sleep(2.5) -- past the lease: a report dropped would let the job run again
    assert.equal("delayed", q:get(job).state)
    assert.equal(1, #rf.lines(log))
    assert.not_matches("EINPUT", table.concat(said, "\n"))
  end)

  it("a max_payload with a fraction (the pool takes one) still fetches", function()
    local server = rf.server()
    local q = rf.producer(server, "fraction")
    local p = rf.pool(server, "fraction", { size = 1, max_payload = 65536.5 })
    local said = {}
    p:on("redis", function(kind, why) said[#said + 1] = kind .. ": " .. tostring(why) end)
    local job = assert(q:add({ echo = "fits" }))
    local result, err = job:wait(10)
    assert(result, tostring(err) .. "\n" .. table.concat(said, "\n"))
    assert.equal("fits", result.echo)
  end)

  it("a progress or a backoff text with a NUL byte after its JSON is refused, not read as the JSON", function()
    local server = rf.server()
    local q = rf.producer(server, "nul")
    local client = assert(require("moonjob.redis.client").new(server.url))
    local _, err = client:call_wait({ "FCALL", "moonjob_progress", 1, "mj:{nul}:", "1", "t", '{"p":1}\0junk' })
    assert.matches("PROGRESS must be JSON text", tostring(err), 1, true)
    _, err = client:call_wait({ "FCALL", "moonjob_add", 1, "mj:{nul}:", "", "{}", "0", "0", "1",
      '{"type":"fixed","delay":1}\0junk', "0", "0", "", "0", "0", "0" })
    assert.matches("BACKOFF must be", tostring(err), 1, true)
    assert.equal(0, q:counts().waiting)
    client:close()
  end)
end)
