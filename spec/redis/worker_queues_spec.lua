-- One `moonjob worker` serving several queues (--queue a,b, or --queue
-- repeated), on a real Redis: jobs of each queue run and are reported to
-- their own queue, and a busy queue does not starve a small one: the
-- queues are fetched in turn, each holding no more than a worker of its
-- own would (moonjob.redis.remotes).
local rq = require "redis_queue"

local helpers = require "helpers"

local moonjob = rq.moonjob

-- `moonjob worker ARGS`, ended after 20 s should it serve rather than refuse.
local function worker_usage(args)
  return helpers.sh(("timeout 20 %s scripts/moonjob worker %s %s --redis %s"):format(helpers.LUAJIT, rq.PROCESSOR,
    args, rq.server().url))
end

rq.describe(function()
  describe("a worker on several queues", function()
    it("runs the jobs of each queue and reports each to its own queue", function()
      local a, b = rq.new_queue(), rq.new_queue()
      local qa, qb = rq.new_producer(a), rq.new_producer(b)
      for i = 1, 5 do assert(qa:add({ echo = "a" .. i }, { id = "a" .. i })) end
      for i = 1, 5 do assert(qb:add({ echo = "b" .. i }, { id = "b" .. i })) end
      local pid, log = rq.start_worker(a .. "," .. b, "-j 2")
      assert(rq.wait_for(function() return qa:counts().completed == 5 and qb:counts().completed == 5 end, 30),
        "both queues' jobs completed: " .. table.concat(rq.read_lines(log), "\n"))
      for i = 1, 5 do
        local ja, jb = assert(qa:job("a" .. i)), assert(qb:job("b" .. i))
        assert.same({ "completed", "a" .. i }, { ja.state, ja.result.echo })
        assert.same({ "completed", "b" .. i }, { jb.state, jb.result.echo })
        assert.matches(":" .. pid .. ":", ja.worker, 1, true)
        assert.matches(":" .. pid .. ":", jb.worker, 1, true)
      end
      assert.same({ 0, 0 }, { qa:counts().failed, qb:counts().failed })
      -- a job added later, on either queue, is run too; --queue repeated is the same
      rq.stop_worker(pid, "TERM")
      local said = table.concat(rq.read_lines(log), "\n")
      assert.matches("on queues " .. a .. ", " .. b, said, 1, true)
      assert.matches("connected to .*, queue " .. a .. "\n", said)
      assert.matches("connected to .*, queue " .. b .. "\n", said)
      assert.matches("stopped: 10 completed", said, 1, true)
      pid, log = rq.start_worker(a .. " --queue " .. b, "-j 1")
      assert(rq.worker_connected(log), "the worker connected")
      assert(qb:add({ echo = "late" }, { id = "late" }))
      assert(rq.wait_for(function() local j = qb:job("late") return j and j.state == "completed" end, 30),
        "a job added to the second queue ran")
    end)

    it("names the queue in each job's line, its ids being the queue's own", function()
      local a, b = rq.new_queue(), rq.new_queue()
      local qa, qb = rq.new_producer(a), rq.new_producer(b)
      local ja = assert(qa:add({ n = 1 }, { id = "7" }))
      local jb = assert(qb:add({ fail = true }, { id = "7", name = "charge" }))
      local pid, log = rq.start_worker(a .. "," .. b, "-j 1 --verbose")
      ja:wait(20); jb:wait(20)
      rq.stop_worker(pid, "TERM")
      local said = table.concat(rq.read_lines(log), "\n")
      assert.matches(("job 7 (queue %s) completed, attempt 1/1"):format(a), said, 1, true)
      assert.matches(("job 7 (charge, queue %s) failed, attempt 1/1: EBAD"):format(b), said, 1, true)
    end)

    it("finishes a small queue long before a busy one's end", function()
      local busy, small = rq.new_queue(), rq.new_queue()
      local qa, qb = rq.new_producer(busy), rq.new_producer(small)
      local list = {}
      for i = 1, 2000 do list[i] = { sleep = 0.01, n = i } end
      assert(qa:add_bulk(list))
      local _, log = rq.start_worker(busy .. "," .. small, "-j 2 --quiet")
      assert(rq.wait_for(function() return qa:counts().completed >= 20 end, 30),
        "the busy queue's jobs run: " .. table.concat(rq.read_lines(log), "\n"))
      for i = 1, 20 do assert(qb:add({ sleep = 0.01, n = i })) end
      assert(rq.wait_for(function() return qb:counts().completed == 20 end, 60), "the small queue's jobs ran")
      local done = qa:counts().completed
      assert.is_true(done < 1000, ("the busy queue had completed %d of 2000 when the small one ended"):format(done))
    end)

    it("takes a list of queues in Lua, each once", function()
      local a, b = rq.new_queue(), rq.new_queue()
      local qa, qb = rq.new_producer(a), rq.new_producer(b)
      local ja, jb = assert(qa:add({ echo = 1 })), assert(qb:add({ echo = 2 }))
      local pool = rq.pool({ a, b }, { size = 1 })
      assert(ja:wait(20))
      assert(jb:wait(20))
      local stats = pool:stats().redis
      assert.equal(2, stats.completed)
      assert.same({ 1, 1 }, { stats.queues[a].completed, stats.queues[b].completed })
      local moonjob_ = require "moonjob"
      for _, bad in ipairs({ { a, a }, {}, { a, "" } }) do
        local ok, err = pcall(moonjob_.pool, rq.PROCESSOR, { redis = rq.server().url, queue = bad })
        assert.is_false(ok)
        assert.matches("option 'queue'", err)
      end
    end)

    it("refuses a queue named twice, a bad name, and several queues for one-queue commands", function()
      local _, err, status = worker_usage("--queue a,b,a")
      assert.equal(2, status)
      assert.matches("%-%-queue names a twice", err)
      _, err, status = worker_usage("--queue a,")
      assert.equal(2, status)
      assert.matches("%-%-queue a,:", err)
      _, err, status = worker_usage("--queue 'a, a'") -- (blanks around a name are dropped)
      assert.equal(2, status)
      assert.matches("%-%-queue names a twice", err)
      _, err, status = moonjob("status --queue a --queue b")
      assert.equal(2, status)
      assert.matches("moonjob status takes one %-%-queue", err)
    end)
  end)
end)
