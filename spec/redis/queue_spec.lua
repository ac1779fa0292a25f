-- Durable queues on Redis: a real redis-server (AOF on) on a free loopback
-- port, producers in this process, workers in this process or as separate
-- `moonjob worker` processes ended by their pid.
local moonjob = require "moonjob"
local helpers = require "helpers"
local redis_server = require "redis_server"
local loop = require "moonjob.loop"
local json = require "moonjob.codec.json"

local PROCESSOR = helpers.abs(helpers.fixture("remote.lua"))

local server
local queues = 0

-- A fresh queue name per test.
local function new_queue()
  queues = queues + 1
  return "q" .. queues
end

local function read_lines(path)
  local lines = {}
  local f = io.open(path)
  if not f then return lines end
  for line in f:lines() do lines[#lines + 1] = line end
  f:close()
  return lines
end

-- A `moonjob worker` process; returns its pid and the path of its stderr.
local open = {} -- pools, queues and worker processes of the running test, ended after it even when it fails

local function start_worker(queue, args)
  local log = os.tmpname()
  local cmd = ("%s scripts/moonjob worker %s --redis %s --queue %s %s 2>%s >/dev/null & echo $!")
    :format(helpers.LUAJIT, PROCESSOR, server.url, queue, args or "", log)
  local pid = assert(tonumber(helpers.first_line(cmd)))
  open[#open + 1] = { close = function() os.execute(("kill -KILL %d 2>/dev/null"):format(pid)) end }
  return pid, log
end

local function stop_worker(pid, signal)
  os.execute(("kill -%s %d 2>/dev/null"):format(signal or "KILL", pid))
  helpers.wait_for(function() return not helpers.process_exists(pid) end, 40)
end

local function pool(queue, opts)
  opts = opts or {}
  opts.redis, opts.queue, opts.echo = server.url, queue, false
  local p = assert(moonjob.pool(PROCESSOR, opts))
  open[#open + 1] = p
  return p
end

local function new_producer(name, opts)
  local q = assert(moonjob.queue(server.url, name, opts))
  open[#open + 1] = q
  return q
end

local function close_all()
  for i = #open, 1, -1 do pcall(open[i].close, open[i]) end
  open = {}
end

describe("a durable queue on Redis", function()
  setup(function() server = redis_server.start() end)
  teardown(function() if server then server:stop() end end)
  after_each(close_all)

  describe("producers", function()
    it("add jobs, read their state and counts, and cancel waiting ones", function()
      local q = new_producer(new_queue())
      local a = assert(q:add({ n = 1 }))
      local b = assert(q:add({ n = 2 }, { delay = 60 }))
      assert.equal("waiting", a.state)
      assert.equal("delayed", b.state)
      assert.same({ waiting = 1, delayed = 1, active = 0, completed = 0, failed = 0 }, q:counts())
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
      _, err = moonjob.queue("rediss://:Zm9v/YmFy+c2Vj@10.0.0.1:6380/0", "x") -- a slash in the password
      assert.not_matches("Zm9v", tostring(err))
      assert.not_matches("c2Vj", tostring(err))
      _, err = moonjob.queue(server.url, "bad{name}")
      assert.matches("queue name", tostring(err))
    end)

    it("refuse with EQUEUEFULL past max_queue, and cancel delayed jobs", function()
      local q = new_producer(new_queue())
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
      local q = new_producer(new_queue(), { max_payload = 100 })
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
      assert.equal("OK", helpers.first_line(("redis-cli -p %d -x SET huge < %s"):format(server.port, data)))
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
      ]]):format(server.port))
      local out = helpers.first_line(helpers.LUAJIT .. " " .. script)
      os.remove(script)
      server:cli("DEL", "huge")
      local err, grew_kb = out:match("^(.-)\t(%d+)$")
      assert.matches("larger than 1048576 bytes", err)
      assert.is_true(tonumber(grew_kb) < 10 * 1024, "peak RSS grew by " .. tostring(grew_kb) .. " kB")
    end)
  end)

  describe("a pool on the queue", function()
    it("runs jobs added by a producer and their results come back exactly", function()
      local name = new_queue()
      local p = pool(name, { size = 2 })
      local q = new_producer(name)
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
      assert.same({ waiting = 0, delayed = 0, active = 0, completed = 50, failed = 0 }, q:counts())
      p:close()
      q:close()
    end)

    it("retries with the attempts and backoff given by the producer, and keeps the processor's error fields", function()
      local name = new_queue()
      local p = pool(name, { size = 1 })
      local q = new_producer(name)
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
      local name = new_queue()
      local q = new_producer(name)
      local log = os.tmpname()
      local late = assert(q:add({ log = log, echo = "late" }, { delay = 0.5 }))
      for i = 1, 3 do assert(q:add({ log = log, echo = "low" .. i }, { priority = 5, id = "low" .. i })) end
      assert(q:add({ log = log, echo = "high" }, { priority = -1, id = "high" }))
      local t0 = loop.now()
      local p = pool(name, { size = 1, prefetch = 0 })
      assert(late:wait(20))
      assert.is_true(loop.now() - t0 >= 400)
      local order = {}
      for _, line in ipairs(read_lines(log)) do order[#order + 1] = line:match("^(%S+)") end
      assert.same({ "high", "low1", "low2", "low3", late.id }, order)
      p:close()
      q:close()
    end)

    it("joins a live job by id from any producer, and returns a cached result for `cache` seconds", function()
      local name = new_queue()
      local q1 = new_producer(name)
      local q2 = new_producer(name)
      local log = os.tmpname()
      local a = assert(q1:add({ log = log, sleep = 0.3 }, { id = "same", cache = 30 }))
      local b = assert(q2:add({ log = log, sleep = 0.3 }, { id = "same", cache = 30 }))
      assert.equal(a.id, b.id)
      assert.is_true(b.joined)
      local p = pool(name, { size = 2 })
      assert(a:wait(20))
      local c = assert(q2:add({ log = log }, { id = "same", cache = 30 }))
      assert.equal("completed", c.state)
      assert(c:wait(5))
      assert.equal(1, #read_lines(log))
      p:close()
      q1:close()
      q2:close()
    end)

    it("renews the lease of a job that runs longer than the lease, which then runs once", function()
      local name = new_queue()
      local log = os.tmpname()
      local p = pool(name, { size = 1, lease = 0.6 })
      local q = new_producer(name)
      local job = assert(q:add({ log = log, sleep = 2.5 }))
      local result = assert(job:wait(20))
      assert.equal(1, result.attempt)
      assert.equal(1, #read_lines(log))
      assert.equal(1, q:get(job.id).attempts)
      p:close()
      q:close()
    end)

    it("fails a job whose data in Redis is too big or missing, clearly, and goes on", function()
      local name = new_queue()
      local q = new_producer(name)
      local prefix = "mj:{" .. name .. "}:"
      server:cli("FCALL", "moonjob_add", 1, prefix, "big", '"' .. ("x"):rep(3000) .. '"', 0, 0, 1, "", 0, 0, "", 0, 0, 1)
      server:cli("FCALL", "moonjob_add", 1, prefix, "gone", '{}', 0, 0, 1, "", 0, 0, "", 0, 0, 1)
      server:cli("HDEL", prefix .. "j:gone", "data")
      local fine = assert(q:add({ echo = 1 }))
      local p = pool(name, { size = 1, max_payload = 1000 })
      assert(fine:wait(20))
      helpers.wait_for(function() return q:counts().failed == 2 end, 20)
      assert.equal("EPAYLOAD", q:get("big").error.code)
      assert.equal("EINPUT", q:get("gone").error.code)
      p:close()
      q:close()
    end)

    it("keeps finished jobs by count, so Redis does not grow with them", function()
      local name = new_queue()
      local p = pool(name, { size = 2, keep = 10 })
      local q = new_producer(name)
      local last
      for i = 1, 200 do last = assert(q:add({ echo = i })) end
      assert(last:wait(30))
      helpers.wait_for(function() return q:counts().active == 0 end)
      assert.equal(200, q:counts().completed) -- counted, though not all kept
      local last_fetch = q:counts() -- the next fetch (every poll, 1 s) trims
      helpers.sleep(1.2)
      local kept = tonumber(server:cli("ZCARD", "mj:{" .. name .. "}:completed"))
      assert.is_true(kept <= 12, "completed kept: " .. kept)
      local keys = tonumber(server:cli("EVAL", "return #redis.call('KEYS', ARGV[1])", 0, "mj:{" .. name .. "}:j:*"))
      assert.is_true(keys <= 12, "job hashes kept: " .. keys)
      p:close()
      q:close()
    end)

    it("keeps finished jobs by age too", function()
      local name = new_queue()
      local p = pool(name, { size = 1, keep_age = 0.3, poll = 0.2 })
      local q = new_producer(name)
      local job = assert(q:add({ echo = 1 }))
      assert(job:wait(20))
      assert.truthy(q:get(job.id))
      helpers.wait_for(function() return q:get(job.id) == nil end, 10)
      assert.equal(1, q:counts().completed)
      p:close()
    end)

    it("retries with the worker pool's own backoff function", function()
      local name = new_queue()
      local seen = {}
      local p = pool(name, { size = 1, backoff = function(attempt, err)
        seen[#seen + 1] = attempt
        return 0.01
      end })
      local q = new_producer(name)
      local job = assert(q:add({ fail_until = 3 }, { attempts = 3 }))
      assert.equal(3, assert(job:wait(20)).attempt)
      assert.same({ 1, 2 }, seen)
      p:close()
    end)

    it("a worker whose processor cannot load leaves the queue's jobs to others", function()
      local name = new_queue()
      local q = new_producer(name)
      local jobs = {}
      for i = 1, 20 do jobs[i] = assert(q:add({ echo = i }, { attempts = 3 })) end
      local broken = assert(moonjob.pool(helpers.fixture("load_error.lua"),
        { redis = server.url, queue = name, size = 2, echo = false }))
      open[#open + 1] = broken
      helpers.sleep(1.5)
      local c = q:counts()
      assert.equal(0, c.failed)
      assert.equal(20, c.waiting + c.active)
      local p = pool(name, { size = 2 })
      for i = 1, 20 do assert(jobs[i]:wait(20)) end
      assert.equal(0, q:counts().failed)
      broken:close()
      p:close()
    end)

    it("fails clearly a job another producer wrote with a bad backoff or an oversized name, and goes on", function()
      local name = new_queue()
      local q = new_producer(name)
      local prefix = "mj:{" .. name .. "}:"
      server:cli("FCALL", "moonjob_add", 1, prefix, "nodelay", "{}", 0, 0, 2, '{"type":"exponential"}', 0, 0, "", 0, 0, 1)
      assert.matches("EINPUT", server:cli("FCALL", "moonjob_add", 1, prefix, "bigname", "{}", 0, 0, 1, "", 0, 0,
        ("n"):rep(5000), 0, 0, 1))
      server:cli("FCALL", "moonjob_add", 1, prefix, "sneaky", "{}", 0, 0, 1, "", 0, 0, "", 0, 0, 1)
      local big = helpers.write_file(os.tmpname(), ("n"):rep(3 * 1024 * 1024))
      helpers.first_line(("redis-cli -p %d -x HSET '%sj:sneaky' name < %s"):format(server.port, prefix, big))
      os.remove(big) -- a name written around moonjob_add
      local fine = assert(q:add({ echo = 1 }))
      local p = pool(name, { size = 1, lease = 2 })
      assert(fine:wait(20))
      helpers.wait_for(function() return q:counts().failed == 2 end, 20)
      assert.equal("EINPUT", q:get("nodelay").error.code)
      assert.equal("EINPUT", q:get("sneaky").error.code)
      p:close()
    end)

    it("acts on a cancel only for its own database's job of that id", function()
      local name = new_queue()
      local log = os.tmpname()
      local q = new_producer(name)
      local p = pool(name, { size = 1 })
      local job = assert(q:add({ log = log, sleep = 1 }, { id = "42" }))
      helpers.wait_for(function() return #read_lines(log) == 1 end, 20)
      local other = assert(moonjob.queue(server.url:gsub("/0$", "/1"), name))
      open[#open + 1] = other
      assert(other:add({ n = 1 }, { id = "42" }))
      server:cli("-n", 1, "FCALL", "moonjob_fetch", 1, "mj:{" .. name .. "}:", "w-db1", 1, 60000, 10, 1000, 0)
      assert.equal("active", other:cancel("42"))
      assert(job:wait(20)) -- db 0's job 42 was not canceled
    end)

    it("refuses a result carrying a token that is no longer the job's", function()
      local name = new_queue()
      local prefix = "mj:{" .. name .. "}:"
      local q = new_producer(name)
      local job = assert(q:add({ n = 1 }, { attempts = 2 }))
      local fetched = server:cli("FCALL", "moonjob_fetch", 1, prefix, "w-old", 1, 100)
      local token = fetched:match("(w%-old/%d+)")
      assert.truthy(token)
      helpers.sleep(0.2)
      server:cli("FCALL", "moonjob_fetch", 1, prefix, "w-new", 1, 10000) -- recovers it (ESTALLED), runs it anew
      assert.equal("ESTALE", server:cli("FCALL", "moonjob_complete", 1, prefix, job.id, token, "{}"))
      assert.equal("ESTALE", server:cli("FCALL", "moonjob_fail", 1, prefix, job.id, token, "{}", 0))
      assert.equal("ESTALE", server:cli("FCALL", "moonjob_release", 1, prefix, job.id, token))
      assert.equal("active", q:get(job.id).state)
      q:close()
    end)

    it("gives back the jobs it holds but has not started when it closes", function()
      local name = new_queue()
      local q = new_producer(name)
      for i = 1, 6 do assert(q:add({ sleep = 0.3, echo = i })) end
      local p = pool(name, { size = 1, prefetch = 5 })
      helpers.wait_for(function() return q:counts().active == 6 end)
      p:close()
      local c = q:counts()
      assert.equal(0, c.active)
      assert.equal(6, c.completed + c.waiting)
      assert.is_true(c.waiting >= 4)
      q:close()
    end)
  end)

  describe("when Redis goes away", function()
    it("running jobs go on, their results reach Redis once it is back, and fetching resumes", function()
      local name = new_queue()
      local log = os.tmpname()
      local q = new_producer(name)
      local p = pool(name, { size = 1, lease = 10 })
      local events = {}
      p:on("redis", function(kind) events[#events + 1] = kind end)
      local job = assert(q:add({ log = log, sleep = 1 }))
      helpers.wait_for(function() return #read_lines(log) == 1 end, 20)
      server:signal("STOP") -- unreachable: nothing answers, the watchdog drops the connection
      helpers.wait_for(function() return events[#events] == "down" end, 20)
      assert.equal(1, p:stats().completed) -- the job went on meanwhile
      server:signal("CONT")
      assert(job:wait(20))
      helpers.wait_for(function() return events[#events] == "up" end, 20)
      assert.truthy(table.concat(events, " "):find("down"))
      local later = assert(q:add({ log = log }))
      assert(later:wait(20))
      assert.equal(2, #read_lines(log)) -- the first job ran once
      p:close()
      q:close()
    end)

    it("a worker that cannot renew stops its job before the lease ends, and the job runs again once", function()
      local name = new_queue()
      local log = os.tmpname()
      local q = new_producer(name)
      local p = pool(name, { size = 1, lease = 1.2 })
      local job = assert(q:add({ log = log, sleep = 3 }, { attempts = 3 }))
      helpers.wait_for(function() return #read_lines(log) == 1 end, 20)
      server:signal("STOP")
      local stopped_at = loop.now()
      helpers.wait_for(function() return p.nactive == 0 end, 5)
      assert.equal(1, p.owner.counts.fenced)
      -- the last renewal was before the STOP: the lease ends within 1.2 s of it
      assert.is_true(loop.now() - stopped_at < 1200, "stopped after " .. (loop.now() - stopped_at) .. " ms")
      server:signal("CONT")
      local result = assert(job:wait(20))
      assert.equal(2, result.attempt)
      assert.equal(2, #read_lines(log))
      p:close()
      q:close()
    end)

    it("the fence kills in time a job already interrupted by its own timeout, in a JIT loop", function()
      local name = new_queue()
      local log = os.tmpname()
      local q = new_producer(name)
      local p = pool(name, { size = 1, lease = 1.2 })
      local job = assert(q:add({ log = log, spin = 30 }, { timeout = 0.2, kill_after = 30, attempts = 2 }))
      helpers.wait_for(function() return #read_lines(log) == 1 end, 20)
      helpers.sleep(0.3) -- past its timeout: interrupted, which a JIT loop ignores; its kill is 30 s away
      server:signal("STOP")
      local stopped_at = loop.now()
      helpers.wait_for(function() return p.nactive == 0 end, 10)
      assert.is_true(loop.now() - stopped_at < 1200, "killed after " .. (loop.now() - stopped_at) .. " ms")
      server:signal("CONT")
      local _, err = job:wait(20)
      assert.truthy(err) -- it ran past its timeout both times
    end)
  end)

  describe("worker processes", function()
    it("a job on a worker SIGKILLed mid-run runs again on another within lease + 1 s, counting an attempt", function()
      local name = new_queue()
      local log = os.tmpname()
      local q = new_producer(name)
      local pid1 = start_worker(name, "-j 1 --lease 1")
      local job = assert(q:add({ log = log, sleep = 1.5 }, { attempts = 3 }))
      helpers.wait_for(function() return #read_lines(log) == 1 end, 20)
      helpers.sleep(0.5) -- a renewal (every lease/3) has told Redis the job started
      stop_worker(pid1, "KILL")
      local killed_at = loop.now()
      local pid2 = start_worker(name, "-j 1 --lease 1")
      local result = assert(job:wait(20))
      assert.equal(2, result.attempt)
      local lines = read_lines(log)
      assert.equal(2, #lines)
      -- it started again within the lease (1 s) + 1 s, plus the new worker's start
      assert.is_true(loop.now() - killed_at < 4000)
      stop_worker(pid2, "TERM")
      q:close()
    end)

    it("a job a killed worker held but had not started runs again without counting an attempt", function()
      local name = new_queue()
      local log = os.tmpname()
      local q = new_producer(name)
      local pid1 = start_worker(name, "-j 1 --prefetch 1 --lease 1")
      local first = assert(q:add({ log = log, sleep = 30 }))
      local held = assert(q:add({ log = log, echo = "held" })) -- attempts = 1
      helpers.wait_for(function() return q:counts().active == 2 end, 20)
      helpers.sleep(0.5)
      stop_worker(pid1, "KILL")
      local pid2 = start_worker(name, "-j 2 --lease 1")
      local result = assert(held:wait(20))
      assert.equal(1, result.attempt)
      -- the one that was running had its only attempt counted: it fails with ESTALLED
      local _, err = first:wait(20)
      assert.equal("ESTALLED", err.code)
      stop_worker(pid2, "TERM")
    end)

    it("cancel interrupts a job running on another worker process", function()
      local name = new_queue()
      local log = os.tmpname()
      local q = new_producer(name)
      local pid = start_worker(name, "-j 1")
      local job = assert(q:add({ log = log, sleep = 30 }))
      helpers.wait_for(function() return #read_lines(log) == 1 end, 20)
      local t0 = loop.now()
      assert.equal("active", q:cancel(job.id, "changed my mind"))
      local _, err = job:wait(20)
      assert.equal("ECANCELED", err.code)
      assert.is_true(loop.now() - t0 < 3000)
      stop_worker(pid, "TERM")
      q:close()
    end)

    it("a worker that Redis refuses says why at once instead of hanging silently", function()
      local locked = redis_server.start({ password = "right-pw" })
      local log = os.tmpname()
      local cmd = ("%s scripts/moonjob worker %s --redis redis://:wrong-pw@127.0.0.1:%d/0 --queue x 2>%s >/dev/null & echo $!")
        :format(helpers.LUAJIT, PROCESSOR, locked.port, log)
      local pid = assert(tonumber(helpers.first_line(cmd)))
      helpers.wait_for(function() return table.concat(read_lines(log), "\n"):find("check the user and password") end, 10)
      local text = table.concat(read_lines(log), "\n")
      assert.not_matches("wrong%-pw", text)
      assert.equal(1, select(2, text:gsub("check the user and password", ""))) -- said once, not at every retry
      stop_worker(pid, "TERM")
      locked:stop()
    end)

    it("stop on SIGTERM: running jobs finish, held ones go back, exit 0", function()
      local name = new_queue()
      local log = os.tmpname()
      local q = new_producer(name)
      local pid, errlog = start_worker(name, "-j 1 --grace 10")
      local jobs = {}
      for i = 1, 4 do jobs[i] = assert(q:add({ log = log, sleep = 0.5, echo = i })) end
      helpers.wait_for(function() return #read_lines(log) == 1 end, 20)
      os.execute("kill -TERM " .. pid)
      helpers.wait_for(function() return not helpers.process_exists(pid) end, 20)
      assert(jobs[1]:wait(5))
      local c = q:counts()
      assert.equal(0, c.active)
      assert.equal(4, c.completed + c.waiting)
      local text = table.concat(read_lines(errlog), "\n")
      assert.matches("stopping %(SIGTERM%)", text)
      q:close()
    end)
  end)

  describe("other languages", function()
    it("a Python program adds a job with redis-py and reads its result", function()
      local name = new_queue()
      local p = pool(name, { size = 1 })
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
]]):format(server.port, name))
      -- in the background: this process's loop runs the worker meanwhile
      local out_path = os.tmpname()
      local pid = tonumber(helpers.first_line(("/usr/bin/python3 %s >%s 2>&1 & echo $!"):format(script, out_path)))
      helpers.wait_for(function() return not helpers.process_exists(pid) end, 20)
      local out = table.concat(read_lines(out_path), "\n") .. "\n"
      local state, result = out:match("^(%S+) (.*)\n$")
      assert.truthy(state, out)
      assert.equal("completed", state)
      assert.same({ 1, 2.5, "x" }, json.decode(result).echo)
      p:close()
    end)
  end)
end)
