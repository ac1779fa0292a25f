-- Durable queues on Redis: producers (moonjob.queue) and their connection.
-- (a real redis-server per file and the shared helpers: spec/support/redis_queue.lua)
local moonjob = require "moonjob"
local helpers = require "helpers"
local loop = require "moonjob.loop"
local redis_server = require "redis_server"
local rq = require "redis_queue"

rq.describe(function()
  describe("producers", function()
    it("add jobs, read their state and counts, and cancel waiting ones", function()
      local q = rq.new_producer(rq.new_queue())
      local a = assert(q:add({ n = 1 }))
      local b = assert(q:add({ n = 2 }, { delay = 60 }))
      assert.equal("waiting", a.state)
      assert.equal("delayed", b.state)
      assert.same({ waiting = 1, delayed = 1, active = 0, completed = 0, failed = 0, missing = 0, paused = false,
        held = 0, exists = true, waiting_children = 0, running = 0, completed_ever = 0, failed_ever = 0, workers = 0,
        lapsed = 0 },
        q:counts())
      assert.equal("waiting", q:cancel(a.id, "not needed"))
      local info = q:get(a.id)
      assert.equal("failed", info.state)
      assert.equal("ECANCELED", info.error.code)
      local _, err = q:cancel("no-such-id")
      assert.equal("ENOTFOUND", err.code)
      q:close()
    end)

    it("say clearly what is wrong with a URL, a server that is down, or a password, never printing it", function()
      local _, err = moonjob.queue("http://127.0.0.1", "x")
      assert.matches("not a Redis URL", tostring(err))
      _, err = moonjob.queue("redis://127.0.0.1:1/0", "x", { timeout = 1 })
      assert.matches("EREDIS: redis://127.0.0.1:1/0: Connection refused", tostring(err), 1, true)
      local locked = redis_server.start({ password = "s3cret-pw" })
      _, err = moonjob.queue(("redis://:wrong-pw@127.0.0.1:%d/0"):format(locked.port), "x", { timeout = 1 })
      assert.matches("check the user and password", tostring(err))
      assert.not_matches("wrong%-pw", tostring(err))
      local q = assert(moonjob.queue(("redis://:s3cret-pw@127.0.0.1:%d/0"):format(locked.port), "x"))
      assert.not_matches("s3cret", tostring(q))
      assert.truthy(q:add({ n = 1 }))
      q:close()
      locked:stop()
      _, err = moonjob.queue(("rediss://:Zm9v/YmFy+c2Vj@127.0.0.1:%d/0"):format(redis_server.free_port()), "x",
        { timeout = 1 }) -- a slash in the password (and TLS: nothing listens there)
      assert.not_matches("Zm9v", tostring(err))
      assert.not_matches("c2Vj", tostring(err))
      _, err = moonjob.queue(rq.server().url, "bad{name}")
      assert.matches("queue name", tostring(err))
    end)

    it("refuse with EQUEUEFULL past max_queue, and cancel delayed jobs", function()
      local q = rq.new_producer(rq.new_queue())
      assert(q:add({ n = 1 }, { max_queue = 2 }))
      local delayed = assert(q:add({ n = 2 }, { max_queue = 2, delay = 30 }))
      local _, err = q:add({ n = 3 }, { max_queue = 2 })
      assert.equal("EQUEUEFULL", err.code)
      assert.equal("delayed", q:cancel(delayed.id))
      assert(q:add({ n = 3 }, { max_queue = 2 })) -- room again
      local _, werr = delayed:wait(5)
      assert.equal("ECANCELED", werr.code)
    end)

    it("refuse data that is not JSON or is larger than max_payload, and a backoff function", function()
      local q = rq.new_producer(rq.new_queue(), { max_payload = 100 })
      local _, err = q:add({ f = function() end })
      assert.equal("EPAYLOAD", err.code)
      _, err = q:add({ s = ("x"):rep(200) })
      assert.equal("EPAYLOAD", err.code)
      assert.has_error(function() q:add({}, { backoff = function() return 1 end }) end)
      q:close()
    end)
  end)

  describe("a connection", function()
    it("drops a reply larger than its bound before holding it (a 40 MB string, a 1 MiB bound)", function()
      local data = helpers.write_file(os.tmpname(), ("x"):rep(40 * 1024 * 1024))
      assert.equal("OK", helpers.first_line(("%s -p %d -x SET huge < %s"):format(redis_server.CLI, rq.server().port, data)))
      os.remove(data)
      local script = helpers.write_file(os.tmpname(), ([[
        local core = require "moonjob.core"
        local loop = require "moonjob.loop"
        local function peak_kb()
          local f = io.open("/proc/self/status")
          local kb = tonumber(f:read("*a"):match("VmHWM:%%s*(%%d+)"))
          f:close()
          return kb
        end
        local up, done, err = false, false, nil
        local c = core.redis("127.0.0.1", %d, 5000, 1024 * 1024, function(k) up = up or k == "up" end)
        loop.wait_until(function() return up end)
        local before = peak_kb()
        c:command({ "GET", "huge" }, function(v, e) done, err = true, e end)
        loop.wait_until(function() return done end)
        print(err, peak_kb() - before)
      ]]):format(rq.server().port))
      local out = helpers.first_line(helpers.LUAJIT .. " " .. script)
      os.remove(script)
      rq.server():cli("DEL", "huge")
      local err, grew_kb = out:match("^(.-)\t(%d+)$")
      assert.matches("larger than 1048576 bytes", err)
      assert.is_true(tonumber(grew_kb) < 10 * 1024, "peak RSS grew by " .. tostring(grew_kb) .. " kB")
    end)
  end)
end)
