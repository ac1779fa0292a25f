-- Durable queues on Redis: a pool on the queue (pool options redis, queue) in this process.
-- (a real redis-server per file and the shared helpers: spec/support/redis_queue.lua)
local moonjob = require "moonjob"
local helpers = require "helpers"
local loop = require "moonjob.loop"
local redis_server = require "redis_server"
local rq = require "redis_queue"

rq.describe(function()
  describe("a pool on the queue", function()
    it("runs jobs added by a producer and their results come back exactly", function()
      local name = rq.new_queue()
      local p = rq.pool(name, { size = 2 })
      local q = rq.new_producer(name)
      local jobs = {}
      for i = 1, 50 do jobs[i] = assert(q:add({ echo = { i = i, big = 9007199254740993LL, x = 0.1 } })) end
      for i = 1, 50 do
        local result, err = jobs[i]:wait(20)
        assert.is_nil(err)
        assert.equal(i, result.echo.i)
        assert.equal(9007199254740993LL, result.echo.big)
        assert.equal(0.1, result.echo.x)
        assert.equal(jobs[i].id, result.id) -- processors see the queue's id
      end
      assert.same({ waiting = 0, delayed = 0, active = 0, completed = 50, failed = 0, missing = 0, paused = false,
        held = 0, exists = true, waiting_children = 0, running = 0, completed_ever = 50, failed_ever = 0,
        workers = 1, lapsed = 0 }, q:counts()) -- (workers: the pool's heartbeat)
      p:close()
      q:close()
    end)

    it("takes a fetch of big jobs as large as its default size lets it ask for", function()
      -- No size given: a child per CPU, and a fetch asks for that many jobs
      -- and one more; each near the 1 MiB a pool on Redis reads by default.
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      local n = require("moonjob.core").cpu_count() + 1
      local jobs = {}
      for i = 1, n do jobs[i] = assert(q:add({ echo = ("x"):rep(900 * 1024) .. i })) end
      local p = rq.pool(name, {})
      for i = 1, n do
        local result, err = jobs[i]:wait(20)
        assert.is_nil(err)
        assert.equal(900 * 1024 + #tostring(i), #result.echo)
      end
      p:close()
      q:close()
    end)

    it("retries with the attempts and backoff given by the producer, and keeps the processor's error fields", function()
      local name = rq.new_queue()
      local p = rq.pool(name, { size = 1 })
      local q = rq.new_producer(name)
      local ok = assert(q:add({ fail_until = 3 }, { attempts = 3, backoff = { type = "fixed", delay = 0.05 } }))
      local bad = assert(q:add({ fail = true }, { attempts = 2 }))
      local result = assert(ok:wait(20))
      assert.equal(3, result.attempt)
      local _, err = bad:wait(20)
      assert.equal("EBAD", err.code)
      assert.equal("A-1", err.sku)
      assert.equal(2, q:get(bad.id).attempts)
      p:close()
      q:close()
    end)

    it("runs higher priorities first and delayed jobs when due", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      local log = os.tmpname()
      local late = assert(q:add({ log = log, echo = "late" }, { delay = 0.5 }))
      for i = 1, 3 do assert(q:add({ log = log, echo = "low" .. i }, { priority = 5, id = "low" .. i })) end
      assert(q:add({ log = log, echo = "high" }, { priority = -1, id = "high" }))
      local t0 = loop.now()
      local p = rq.pool(name, { size = 1, prefetch = 0 })
      assert(late:wait(20))
      assert.is_true(loop.now() - t0 >= 400)
      local order = {}
      for _, line in ipairs(rq.read_lines(log)) do order[#order + 1] = line:match("^(%S+)") end
      assert.same({ "high", "low1", "low2", "low3", late.id }, order)
      p:close()
      q:close()
    end)

    it("joins a live job by id from any producer, and returns a cached result for `cache` seconds", function()
      local name = rq.new_queue()
      local q1 = rq.new_producer(name)
      local q2 = rq.new_producer(name)
      local log = os.tmpname()
      local a = assert(q1:add({ log = log, sleep = 0.3 }, { id = "same", cache = 30 }))
      local b = assert(q2:add({ log = log, sleep = 0.3 }, { id = "same", cache = 30 }))
      assert.equal(a.id, b.id)
      assert.is_true(b.joined)
      local p = rq.pool(name, { size = 2 })
      assert(a:wait(20))
      local c = assert(q2:add({ log = log }, { id = "same", cache = 30 }))
      assert.equal("completed", c.state)
      assert(c:wait(5))
      assert.equal(1, #rq.read_lines(log))
      p:close()
      q1:close()
      q2:close()
    end)

    it("renews the lease of a job that runs longer than the lease, which then runs once", function()
      local name = rq.new_queue()
      local log = os.tmpname()
      local p = rq.pool(name, { size = 1, lease = 0.6 })
      local q = rq.new_producer(name)
      local job = assert(q:add({ log = log, sleep = 2.5 }))
      local result = assert(job:wait(20))
      assert.equal(1, result.attempt)
      assert.equal(1, #rq.read_lines(log))
      assert.equal(1, q:get(job.id).attempts)
      p:close()
      q:close()
    end)

    it("fails a job whose data in Redis is too big or missing, clearly, and goes on", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      local prefix = "mj:{" .. name .. "}:"
      rq.server():cli("FCALL", "moonjob_add", 1, prefix, "big", '"' .. ("x"):rep(3000) .. '"', 0, 0, 1, "", 0, 0, "", 0, 0, 1)
      rq.server():cli("FCALL", "moonjob_add", 1, prefix, "gone", '{}', 0, 0, 1, "", 0, 0, "", 0, 0, 1)
      rq.server():cli("HDEL", prefix .. "j:gone", "data")
      local fine = assert(q:add({ echo = 1 }))
      local p = rq.pool(name, { size = 1, max_payload = 1000 })
      assert(fine:wait(20))
      helpers.wait_for(function() return q:counts().failed == 2 end, 20)
      assert.equal("EPAYLOAD", q:get("big").error.code)
      assert.equal("EINPUT", q:get("gone").error.code)
      p:close()
      q:close()
    end)

    it("keeps finished jobs by count, so Redis does not grow with them", function()
      local name = rq.new_queue()
      local p = rq.pool(name, { size = 2, keep = 10 })
      local q = rq.new_producer(name)
      local last
      for i = 1, 200 do last = assert(q:add({ echo = i })) end
      assert(last:wait(30))
      helpers.wait_for(function() return q:counts().active == 0 end)
      assert.equal(200, q:counts().completed_ever) -- counted, though not all kept
      local last_fetch = q:counts() -- the next fetch (every poll, 1 s) trims
      helpers.sleep(1.2)
      local kept = tonumber(rq.server():cli("ZCARD", "mj:{" .. name .. "}:completed"))
      assert.is_true(kept <= 12, "completed kept: " .. kept)
      local keys = tonumber(rq.server():cli("EVAL", "return #redis.call('KEYS', ARGV[1])", 0, "mj:{" .. name .. "}:j:*"))
      assert.is_true(keys <= 12, "job hashes kept: " .. keys)
      p:close()
      q:close()
    end)

    it("keeps finished jobs by age too", function()
      local name = rq.new_queue()
      local p = rq.pool(name, { size = 1, keep_age = 0.3, poll = 0.2 })
      local q = rq.new_producer(name)
      local job = assert(q:add({ echo = 1 }))
      assert(job:wait(20))
      assert.truthy(q:get(job.id))
      helpers.wait_for(function() return q:get(job.id) == nil end, 10)
      assert.equal(1, q:counts().completed_ever)
      assert.equal(0, q:counts().completed) -- (none kept)
      p:close()
    end)

    it("retries with the worker pool's own backoff function", function()
      local name = rq.new_queue()
      local seen = {}
      local p = rq.pool(name, { size = 1, backoff = function(attempt, err)
        seen[#seen + 1] = attempt
        return 0.01
      end })
      local q = rq.new_producer(name)
      local job = assert(q:add({ fail_until = 3 }, { attempts = 3 }))
      assert.equal(3, assert(job:wait(20)).attempt)
      assert.same({ 1, 2 }, seen)
      p:close()
    end)

    it("a worker whose processor cannot load leaves the queue's jobs to others", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      local jobs = {}
      for i = 1, 20 do jobs[i] = assert(q:add({ echo = i }, { attempts = 3 })) end
      local broken = assert(moonjob.pool(helpers.fixture("load_error.lua"),
        { redis = rq.server().url, queue = name, size = 2, echo = false }))
      rq.close_after(broken)
      helpers.sleep(1.5)
      local c = q:counts()
      assert.equal(0, c.failed)
      assert.equal(20, c.waiting + c.active)
      local p = rq.pool(name, { size = 2 })
      for i = 1, 20 do assert(jobs[i]:wait(20)) end
      assert.equal(0, q:counts().failed)
      broken:close()
      p:close()
    end)

    it("fails clearly a job another producer wrote with a bad backoff or an oversized name, and goes on", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      local prefix = "mj:{" .. name .. "}:"
      rq.server():cli("FCALL", "moonjob_add", 1, prefix, "nodelay", "{}", 0, 0, 2, '{"type":"exponential"}', 0, 0, "", 0, 0, 1)
      assert.matches("EINPUT", rq.server():cli("FCALL", "moonjob_add", 1, prefix, "bigname", "{}", 0, 0, 1, "", 0, 0,
        ("n"):rep(5000), 0, 0, 1))
      rq.server():cli("FCALL", "moonjob_add", 1, prefix, "sneaky", "{}", 0, 0, 1, "", 0, 0, "", 0, 0, 1)
      local big = helpers.write_file(os.tmpname(), ("n"):rep(3 * 1024 * 1024))
      helpers.first_line(("%s -p %d -x HSET '%sj:sneaky' name < %s"):format(redis_server.CLI, rq.server().port, prefix, big))
      os.remove(big) -- a name written around moonjob_add
      -- (and its mark of a job with no option to read dropped, as docs/REDIS.md asks of such a writer)
      rq.server():cli("HDEL", prefix .. "j:sneaky", "plain")
      local fine = assert(q:add({ echo = 1 }))
      local p = rq.pool(name, { size = 1, lease = 2 })
      assert(fine:wait(20))
      helpers.wait_for(function() return q:counts().failed == 2 end, 20)
      assert.equal("EINPUT", q:get("nodelay").error.code)
      assert.equal("EINPUT", q:get("sneaky").error.code)
      p:close()
    end)

    it("acts on a cancel only for its own database's job of that id", function()
      local name = rq.new_queue()
      local log = os.tmpname()
      local q = rq.new_producer(name)
      local p = rq.pool(name, { size = 1 })
      local job = assert(q:add({ log = log, sleep = 1 }, { id = "42" }))
      helpers.wait_for(function() return #rq.read_lines(log) == 1 end, 20)
      local other = assert(moonjob.queue(rq.server().url:gsub("/0$", "/1"), name))
      rq.close_after(other)
      assert(other:add({ n = 1 }, { id = "42" }))
      rq.server():cli("-n", 1, "FCALL", "moonjob_fetch", 1, "mj:{" .. name .. "}:", "w-db1", 1, 60000, 10, 1000, 0)
      assert.equal("active", other:cancel("42"))
      assert(job:wait(20)) -- db 0's job 42 was not canceled
    end)

    it("refuses a result carrying a token that is no longer the job's", function()
      local name = rq.new_queue()
      local prefix = "mj:{" .. name .. "}:"
      local q = rq.new_producer(name)
      local job = assert(q:add({ n = 1 }, { attempts = 2 }))
      local fetched = rq.server():cli("FCALL", "moonjob_fetch", 1, prefix, "w-old", 1, 100)
      local token = fetched:match("(w%-old/%d+)")
      assert.truthy(token)
      helpers.sleep(0.2)
      rq.server():cli("FCALL", "moonjob_fetch", 1, prefix, "w-new", 1, 10000) -- recovers it (ESTALLED), runs it anew
      assert.equal("ESTALE", rq.server():cli("FCALL", "moonjob_complete", 1, prefix, job.id, token, "{}"))
      assert.equal("ESTALE", rq.server():cli("FCALL", "moonjob_fail", 1, prefix, job.id, token, "{}", 0))
      assert.equal("ESTALE", rq.server():cli("FCALL", "moonjob_release", 1, prefix, job.id, token))
      assert.equal("active", q:get(job.id).state)
      q:close()
    end)

    it("gives back the jobs it holds but has not started when it closes", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      for i = 1, 6 do assert(q:add({ sleep = 0.3, echo = i })) end
      local p = rq.pool(name, { size = 1, prefetch = 5 })
      helpers.wait_for(function() return q:counts().active == 6 end)
      p:close()
      local c = q:counts()
      assert.equal(0, c.active)
      assert.equal(6, c.completed + c.waiting)
      assert.is_true(c.waiting >= 4)
      q:close()
    end)

    -- An error of moonjob's own while a job's DONE is handled kills its
    -- child and fails that job, EINTERNAL, final on Redis. The next job the
    -- child had already started met no fault: it runs on a fresh child.
    it("runs on a fresh child the job its child started after one that met an internal error", function()
      local name = rq.new_queue()
      local dir = helpers.tmpdir()
      local q = rq.new_producer(name)
      local p = rq.close_after(assert(moonjob.pool(helpers.abs(helpers.fixture("gated.lua")),
        { redis = rq.server().url, queue = name, size = 1, pipeline = 2, echo = false })))
      local reports = 0
      p:on("error", function() reports = reports + 1 end)
      p.dispatch.budget_ms = 1e6 -- (white box) it sends the next job behind a head however long it runs
      for _ = 1, 3 do assert(assert(q:add({})):wait(20)) end -- short jobs: it pipelines
      local first = assert(q:add({ wait = dir .. "/go" }))
      local second = assert(q:add({ mark = dir .. "/second", wait = dir .. "/release" }))
      local finish = p.endings.finish
      p.endings.finish = function(self, job, ...) -- raises once, as the first job's DONE is handled
        if not self.raised and job.remote_id == first.id then
          self.raised = true
          error("injected failure in finish")
        end
        return finish(self, job, ...)
      end
      local child
      helpers.wait_for(function()
        child = p.children:array()[1]
        return child and #child.sent == 2 and child:taken()
      end, 20)
      local first_pid = child.pid
      -- without running the loop: the child ends the first job and starts
      -- the second before the worker reads the first one's DONE
      helpers.write_file(dir .. "/go", "")
      for _ = 1, 500 do
        if helpers.exists(dir .. "/second") then break end
        os.execute("sleep 0.01")
      end
      assert.truthy(helpers.exists(dir .. "/second"), "the child did not start the second job")
      local _, err = first:wait(20)
      -- its child is killed by now: the second job, held there by the file, runs
      -- again on a fresh child, which finds it
      helpers.write_file(dir .. "/release", "")
      assert.equal("EINTERNAL", err and err.code)
      local pid, err2 = second:wait(20)
      os.execute("rm -rf " .. dir)
      assert.is_nil(err2, err2 and tostring(err2))
      assert.is_number(pid)
      assert.not_equal(first_pid, pid)
      assert.equal(1, q:get(second.id).attempts)
      assert.equal(1, reports)
      q:close()
    end)
  end)
end)
