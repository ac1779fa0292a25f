-- Durable queues on Redis: when Redis goes away (stopped, cut off) under a pool.
-- (a real redis-server per file and the shared helpers: spec/support/redis_queue.lua)
local helpers = require "helpers"
local loop = require "moonjob.loop"
local rq = require "redis_queue"

rq.describe(function()
  describe("when Redis goes away", function()
    it("running jobs go on, their results reach Redis once it is back, and fetching resumes", function()
      local name = rq.new_queue()
      local log = os.tmpname()
      local q = rq.new_producer(name)
      local p = rq.pool(name, { size = 1, lease = 10 })
      local events = {}
      p:on("redis", function(kind) events[#events + 1] = kind end)
      local job = assert(q:add({ log = log, sleep = 1 }))
      helpers.wait_for(function() return #rq.read_lines(log) == 1 end, 20)
      rq.server():signal("STOP") -- unreachable: nothing answers, the watchdog drops the connection
      helpers.wait_for(function() return events[#events] == "down" end, 20)
      assert.equal(1, p:stats().completed) -- the job went on meanwhile
      rq.server():signal("CONT")
      assert(job:wait(20))
      helpers.wait_for(function() return events[#events] == "up" end, 20)
      assert.truthy(table.concat(events, " "):find("down"))
      local later = assert(q:add({ log = log }))
      assert(later:wait(20))
      assert.equal(2, #rq.read_lines(log)) -- the first job ran once
      p:close()
      q:close()
    end)

    it("a worker that cannot renew stops its job before the lease ends, and the job runs again once", function()
      local name = rq.new_queue()
      local log = os.tmpname()
      local q = rq.new_producer(name)
      local p = rq.pool(name, { size = 1, lease = 1.2 })
      local job = assert(q:add({ log = log, sleep = 3 }, { attempts = 3 }))
      helpers.wait_for(function() return #rq.read_lines(log) == 1 end, 20)
      rq.server():signal("STOP")
      local stopped_at = loop.now()
      helpers.wait_for(function() return p.nactive == 0 end, 5)
      assert.equal(1, p.owner.counts.fenced)
      -- the last renewal was before the STOP: the lease ends within 1.2 s of it
      assert.is_true(loop.now() - stopped_at < 1200, "stopped after " .. (loop.now() - stopped_at) .. " ms")
      rq.server():signal("CONT")
      local result = assert(job:wait(20))
      assert.equal(2, result.attempt)
      assert.equal(2, #rq.read_lines(log))
      p:close()
      q:close()
    end)

    it("the fence kills in time a job already interrupted by its own timeout, in a JIT loop", function()
      local name = rq.new_queue()
      local log = os.tmpname()
      local q = rq.new_producer(name)
      local p = rq.pool(name, { size = 1, lease = 1.2 })
      local job = assert(q:add({ log = log, spin = 30 }, { timeout = 0.2, kill_after = 30, attempts = 2 }))
      helpers.wait_for(function() return #rq.read_lines(log) == 1 end, 20)
      helpers.sleep(0.3) -- past its timeout: interrupted, which a JIT loop ignores; its kill is 30 s away
      rq.server():signal("STOP")
      local stopped_at = loop.now()
      helpers.wait_for(function() return p.nactive == 0 end, 10)
      assert.is_true(loop.now() - stopped_at < 1200, "killed after " .. (loop.now() - stopped_at) .. " ms")
      rq.server():signal("CONT")
      local _, err = job:wait(20)
      assert.truthy(err) -- it ran past its timeout both times
    end)
  end)
end)
