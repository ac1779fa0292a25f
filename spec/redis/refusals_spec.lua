-- Durable queues on Redis: what a worker does when Redis refuses it (OOM at
-- maxmemory under noeviction), when a producer wrote a job out of range, and
-- when a job is stopped because its lease is no longer provably its own.
local helpers = require "helpers"
local rf = require "redis_workers"

describe("Redis refusals and foreign data #slow", function()
  after_each(rf.close_all)

  it("a completion refused with OOM is sent again once memory is back: completed once, lease kept", function()
    local server = rf.server()
    local log = os.tmpname()
    local q = rf.producer(server, "oom")
    local p = rf.pool(server, "oom", { size = 1, lease = 2 })
    local said = {}
    p:on("redis", function(kind, why) said[#said + 1] = kind .. ": " .. tostring(why) end)
    local job = assert(q:add({ log = log, sleep = 0.5 }))
    helpers.wait_for(function() return #rf.lines(log) == 1 end, 20)
    rf.fill_memory(server)
    assert.matches("OOM", server:cli("SET", "spec:probe", "x")) -- Redis refuses writes now
    helpers.wait_for(function() return p:stats().completed == 1 end, 20)
    helpers.sleep(2.5) -- longer than the lease: the pending report keeps the job's lease
    assert.equal("active", q:get(job.id).state)
    rf.free_memory(server)
    local result = assert(job:wait(20))
    assert.equal(1, result.attempt)
    assert.equal(1, #rf.lines(log)) -- ran once
    local c = q:counts()
    assert.equal(1, c.completed)
    assert.equal(0, c.failed)
    local text = table.concat(said, "\n")
    assert.matches("complete refused for now: OOM", text)
    assert.equal(1, select(2, text:gsub("complete refused for now", ""))) -- said once, not at each retry
    assert.not_matches("stale", text)
  end)

  it("a job another producer wrote with a timeout out of range fails EINPUT, and the worker goes on", function()
    local server = rf.server()
    local prefix = "mj:{foreign}:"
    local pid, log = rf.worker(server, "foreign", "-j 1")
    helpers.wait_for(function() return rf.read(log):find("connected to") end, 20)
    -- written around moonjob_add, as a producer in another language might
    for i, timeout in ipairs({ "1e13", "inf", "nan", "-1" }) do
      local id, member = "bad" .. i, ("%016d:bad%d"):format(i, i)
      server:cli("HSET", prefix .. "j:" .. id, "id", id, "data", "{}", "priority", "0", "attempts", "1",
        "made", "0", "backoff", "", "timeout", timeout, "kill_after", "0", "name", "", "cache", "0",
        "notify", "0", "created", "0", "state", "waiting", "member", member)
      server:cli("ZADD", prefix .. "wait", "0", member)
    end
    local q = rf.producer(server, "foreign")
    local good = assert(q:add({ echo = "fine" }))
    assert.equal("fine", assert(good:wait(20)).echo)
    for i = 1, 4 do
      helpers.wait_for(function() local g = q:get("bad" .. i) return g and g.state == "failed" end, 20)
      assert.equal("EINPUT", q:get("bad" .. i).error.code)
    end
    rf.stop_worker(pid, "TERM")
    assert.not_matches("internal error", rf.read(log))
  end)

  it("a job fenced (Redis unreachable) or lost (its lease recovered) is told and counted", function()
    local server = rf.server()
    local log = os.tmpname()
    local q = rf.producer(server, "fence")
    local p = rf.pool(server, "fence", { size = 2, lease = 1.2 })
    local told = {}
    p:on("redis", function(kind, why, id)
      if kind == "fenced" or kind == "lost" then told[#told + 1] = { kind = kind, why = why, id = id } end
    end)
    local lost = assert(q:add({ log = log, sleep = 30 }, { attempts = 2 }))
    helpers.wait_for(function() return #rf.lines(log) == 1 end, 20)
    -- another run took the lease (as after a recovery): the next renewal says ELOST
    server:cli("HSET", "mj:{fence}:j:" .. lost.id, "token", "another-run")
    helpers.wait_for(function() return #told == 1 end, 10)
    assert.equal("lost", told[1].kind)
    assert.equal(lost.id, told[1].id)
    assert.matches("no longer this worker's", told[1].why)
    server:cli("HSET", "mj:{fence}:j:" .. lost.id, "state", "failed") -- out of the way
    helpers.wait_for(function() return p.nactive == 0 end, 10)
    local fenced = assert(q:add({ log = log, sleep = 30 }, { attempts = 2 }))
    helpers.wait_for(function() return #rf.lines(log) == 2 end, 20)
    server.signal(server, "STOP")
    local ok, err = pcall(helpers.wait_for, function() return #told == 2 end, 10)
    server.signal(server, "CONT")
    assert(ok, err)
    assert.equal("fenced", told[2].kind)
    assert.equal(fenced.id, told[2].id)
    assert.matches("could not be renewed", told[2].why)
    local s = p:stats()
    assert.equal(1, s.redis.lost)
    assert.equal(1, s.redis.fenced)
  end)
end)
