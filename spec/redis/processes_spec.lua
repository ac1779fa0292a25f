-- Durable queues on Redis: `moonjob worker` processes, ended by their pid, and a
-- producer in another language (Python, redis-py).
-- (a real redis-server per file and the shared helpers: spec/support/redis_queue.lua)
local helpers = require "helpers"
local loop = require "moonjob.loop"
local json = require "moonjob.codec.json"
local redis_server = require "redis_server"
local rq = require "redis_queue"

rq.describe(function()
  describe("worker processes", function()
    it("a job on a worker SIGKILLed mid-run runs again on another within lease + 1 s, counting an attempt", function()
      local name = rq.new_queue()
      local log = os.tmpname()
      local q = rq.new_producer(name)
      local pid1 = rq.start_worker(name, "-j 1 --lease 1")
      local job = assert(q:add({ log = log, sleep = 1.5 }, { attempts = 3 }))
      helpers.wait_for(function() return #rq.read_lines(log) == 1 end, 20)
      helpers.sleep(0.5) -- a renewal (every lease/3) has told Redis the job started
      rq.stop_worker(pid1, "KILL")
      local killed_at = loop.now()
      local pid2 = rq.start_worker(name, "-j 1 --lease 1")
      local result = assert(job:wait(20))
      assert.equal(2, result.attempt)
      local lines = rq.read_lines(log)
      assert.equal(2, #lines)
      -- it started again within the lease (1 s) + 1 s, plus the new worker's start
      assert.is_true(loop.now() - killed_at < 4000)
      rq.stop_worker(pid2, "TERM")
      q:close()
    end)

    it("a job a killed worker held but had not started runs again without counting an attempt", function()
      local name = rq.new_queue()
      local log = os.tmpname()
      local q = rq.new_producer(name)
      local pid1 = rq.start_worker(name, "-j 1 --prefetch 1 --lease 1")
      local first = assert(q:add({ log = log, sleep = 30 }))
      local held = assert(q:add({ log = log, echo = "held" })) -- attempts = 1
      helpers.wait_for(function() return q:counts().active == 2 end, 20)
      helpers.sleep(0.5)
      rq.stop_worker(pid1, "KILL")
      local pid2 = rq.start_worker(name, "-j 2 --lease 1")
      local result = assert(held:wait(20))
      assert.equal(1, result.attempt)
      -- the one that was running had its only attempt counted: it fails with ESTALLED
      local _, err = first:wait(20)
      assert.equal("ESTALLED", err.code)
      rq.stop_worker(pid2, "TERM")
    end)

    it("cancel interrupts a job running on another worker process", function()
      local name = rq.new_queue()
      local log = os.tmpname()
      local q = rq.new_producer(name)
      local pid = rq.start_worker(name, "-j 1")
      local job = assert(q:add({ log = log, sleep = 30 }))
      helpers.wait_for(function() return #rq.read_lines(log) == 1 end, 20)
      local t0 = loop.now()
      assert.equal("active", q:cancel(job.id, "changed my mind"))
      local _, err = job:wait(20)
      assert.equal("ECANCELED", err.code)
      assert.is_true(loop.now() - t0 < 3000)
      rq.stop_worker(pid, "TERM")
      q:close()
    end)

    it("a worker that Redis refuses says why at once instead of hanging silently", function()
      local locked = redis_server.start({ password = "right-pw" })
      local log = os.tmpname()
      local cmd = ("%s scripts/moonjob worker %s --redis redis://:wrong-pw@127.0.0.1:%d/0 --queue x 2>%s >/dev/null & echo $!")
        :format(helpers.LUAJIT, rq.PROCESSOR, locked.port, log)
      local pid = assert(tonumber(helpers.first_line(cmd)))
      helpers.wait_for(function() return table.concat(rq.read_lines(log), "\n"):find("check the user and password") end, 10)
      local text = table.concat(rq.read_lines(log), "\n")
      assert.not_matches("wrong%-pw", text)
      assert.equal(1, select(2, text:gsub("check the user and password", ""))) -- said once, not at every retry
      rq.stop_worker(pid, "TERM")
      locked:stop()
    end)

    it("stop on SIGTERM: running jobs finish, held ones go back, exit 0", function()
      local name = rq.new_queue()
      local log = os.tmpname()
      local q = rq.new_producer(name)
      local pid, errlog = rq.start_worker(name, "-j 1 --grace 10")
      local jobs = {}
      for i = 1, 4 do jobs[i] = assert(q:add({ log = log, sleep = 0.5, echo = i })) end
      helpers.wait_for(function() return #rq.read_lines(log) == 1 end, 20)
      os.execute("kill -TERM " .. pid)
      helpers.wait_for(function() return not helpers.running(pid) end, 20)
      assert(jobs[1]:wait(5))
      local c = q:counts()
      assert.equal(0, c.active)
      assert.equal(4, c.completed + c.waiting)
      local text = table.concat(rq.read_lines(errlog), "\n")
      assert.matches("stopping %(SIGTERM%)", text)
      q:close()
    end)
  end)

  describe("other languages", function()
    it("a Python program adds a job with redis-py and reads its result", function()
      local name = rq.new_queue()
      local p = rq.pool(name, { size = 1 })
      local up = false
      p:on("redis", function(kind) if kind == "up" then up = true end end)
      helpers.wait_for(function() return up end) -- the worker has loaded the function library
      local script = helpers.write_file(os.tmpname() .. ".py", ([[
import json, sys, time, redis
r = redis.Redis(host="127.0.0.1", port=%d, db=0)
prefix = "mj:{%s}:"
# moonjob_add: id, data, priority, delay_ms, attempts, backoff, timeout, kill_after, name, cache, max_queue, notify
job_id, state, joined = r.fcall("moonjob_add", 1, prefix, "", json.dumps({"echo": [1, 2.5, "x"]}),
                               0, 0, 1, "", 0, 0, "", 0, 0, 0)
for _ in range(500):
    f = r.fcall("moonjob_get", 1, prefix, job_id)
    if f[0] in (b"completed", b"failed"):
        print(f[0].decode(), f[1].decode())
        sys.exit(0)
    time.sleep(0.02)
sys.exit(1)
]]):format(rq.server().port, name))
      -- in the background: this process's loop runs the worker meanwhile
      local out_path = os.tmpname()
      local pid = tonumber(helpers.first_line(("/usr/bin/python3 %s >%s 2>&1 & echo $!"):format(script, out_path)))
      helpers.wait_for(function() return not helpers.running(pid) end, 20)
      local out = table.concat(rq.read_lines(out_path), "\n") .. "\n"
      local state, result = out:match("^(%S+) (.*)\n$")
      assert.truthy(state, out)
      assert.equal("completed", state)
      assert.same({ 1, 2.5, "x" }, json.decode(result).echo)
      p:close()
    end)
  end)
end)
