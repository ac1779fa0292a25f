-- Durable queues on Redis: faults a production server goes through while
-- workers and producers are connected: its function library flushed, a
-- switchover that makes it a replica for a while, a subscription link that
-- dies silently.
-- (a real redis-server per file: spec/support/redis_queue.lua; replicas and
-- the black-hole proxy: spec/support/redis_faults.lua)
local helpers = require "helpers"
local faults = require "redis_faults"
local moonjob = require "moonjob"
local redis_server = require "redis_server"
local rq = require "redis_queue"

-- The ids in a log of the remote.lua fixture, and the first one seen twice.
local function ids_in(log)
  local seen, n, twice = {}, 0, nil
  for _, line in ipairs(rq.read_lines(log)) do
    local id = line:match("^(%S+)")
    if seen[id] then twice = twice or id else n = n + 1 end
    seen[id] = true
  end
  return n, twice
end

local function count(path, pattern)
  return select(2, table.concat(rq.read_lines(path), "\n"):gsub(pattern, ""))
end

rq.describe(function()
  describe("FUNCTION FLUSH while workers and a producer are connected", function()
    it("the library is loaded again on each connection, every job runs once, and add works", function()
      local name = rq.new_queue()
      local log = os.tmpname()
      local q = rq.new_producer(name)
      rq.pool(name, { size = 2, lease = 10 })
      local pid = rq.start_worker(name, "-j 2 --lease 10")
      local jobs = {}
      for i = 1, 200 do jobs[i] = assert(q:add({ log = log, sleep = 0.02 })) end
      helpers.wait_for(function() return #rq.read_lines(log) >= 30 end, 20)
      assert.equal("OK", rq.server():cli("FUNCTION", "FLUSH"))
      helpers.sleep(0.2) -- workers' calls meet it first
      assert.equal("OK", rq.server():cli("FUNCTION", "FLUSH"))
      jobs[#jobs + 1] = assert(q:add({ log = log })) -- the connected producer's add
      for _, job in ipairs(jobs) do assert(job:wait(30)) end
      local n, twice = ids_in(log)
      assert.is_nil(twice, "a job ran twice")
      assert.equal(201, n)
      assert.same({ 0, 0, 0, 201, 0 }, (function()
        local c = q:counts()
        return { c.waiting, c.delayed, c.active, c.completed, c.failed }
      end)())
      rq.stop_worker(pid, "TERM")
    end)
  end)

  describe("a switchover: the server the URL names becomes a replica, then a primary again", function()
    it("workers say so once, do not stall, and resume; every job runs once", function()
      local primary = rq.server()
      local other = redis_server.start()
      local ok, err = pcall(function()
        faults.replica_of(other, primary)
        local name = rq.new_queue()
        local log = os.tmpname()
        local q = rq.new_producer(name)
        local pid, stderr = rq.start_worker(name, "-j 2 --lease 15")
        local p = rq.pool(name, { size = 2, lease = 15 })
        local events = {}
        p:on("redis", function(kind, why) events[#events + 1] = kind .. " " .. tostring(why) end)
        for _ = 1, 60 do assert(q:add({ log = log, sleep = 0.05 })) end
        helpers.wait_for(function() return #rq.read_lines(log) >= 10 end, 20)
        assert.equal("OK", primary:cli("FAILOVER", "TO", "127.0.0.1", other.port))
        helpers.wait_for(function() return faults.role(primary) == "slave" and faults.role(other) == "master" end, 20)
        helpers.wait_for(function() return count(stderr, "read%-only replica") > 0 end, 20)
        helpers.wait_for(function() return table.concat(events, "\n"):find("down [^\n]*READONLY") end, 20)
        -- jobs added meanwhile on the new primary run once the URL's server is a primary again
        local q2 = rq.close_after(assert(moonjob.queue(other.url, name)))
        for _ = 1, 10 do assert(q2:add({ log = log })) end
        q2:close()
        helpers.sleep(1)
        assert.equal("OK", other:cli("FAILOVER", "TO", "127.0.0.1", primary.port))
        helpers.wait_for(function() return faults.role(primary) == "master" end, 20)
        helpers.wait_for(function()
          local c = q:counts()
          return c.completed == 70 and c.active == 0
        end, 40)
        local n, twice = ids_in(log)
        assert.is_nil(twice, "a job ran twice")
        assert.equal(70, n)
        assert.equal(1, count(stderr, "read%-only replica")) -- said once, not at every retry
        assert.matches("up", events[#events])
        rq.stop_worker(pid, "TERM")
      end)
      primary:cli("REPLICAOF", "NO", "ONE") -- whatever happened, the file's server is a primary again
      other:stop()
      assert(ok, err)
    end)
  end)

  describe("a subscription link that dies silently", function()
    it("is noticed by its PING and made again: a worker hears of new jobs without polling", function()
      local proxy = faults.proxy(rq.server())
      local ok, err = pcall(function()
        local name = rq.new_queue()
        local log = os.tmpname()
        local q = rq.new_producer(name) -- straight to the server
        -- through the proxy; polling the queue only every 60 s: the channel tells it of new jobs
        -- (and an idle heartbeat as rare: a beat in flight on the frozen link would drop it)
        local p = rq.close_after(assert(moonjob.pool(rq.PROCESSOR,
          { redis = proxy.url, queue = name, size = 1, lease = 3, poll = 60, heartbeat = 60, echo = false })))
        assert(assert(q:add({ log = log })):wait(20))
        -- white box: count the subscriptions made from now on
        local resubscribed, subscriptions = 0, p.owner.client.subscriptions
        local channel = "mj:{" .. name .. "}:events"
        local cb = subscriptions[channel]
        subscriptions[channel] = function(kind, ...)
          if kind == "resubscribed" then resubscribed = resubscribed + 1 end
          return cb(kind, ...)
        end
        helpers.sleep(1.2) -- past the zones' first look at the schedules (moonjob.redis.zones: 1 s after start)
        -- no call in flight (the fetch after the report, the last beat): else its watchdog drops
        -- the calls' link and the reconnect's fetch finds the job first
        helpers.wait_for(function()
          local c = p.owner.client
          local beat = p.owner.heartbeat -- (idle: its next beat 60 s away)
          return not p.owner.fetching and not beat.fast and not beat.beating and c.conn ~= nil
            and c.conn:pending() == 0
        end, 10)
        proxy:freeze() -- both links carry nothing from now on, and never close
        helpers.sleep(0.3)
        local job = assert(q:add({ log = log })) -- "added" is published into the dead link
        assert(job:wait(20))
        assert.is_true(resubscribed >= 1)
        assert.equal(2, #rq.read_lines(log))
      end)
      proxy:stop()
      assert(ok, err)
    end)
  end)
end)
