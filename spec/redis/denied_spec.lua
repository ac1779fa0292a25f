-- Durable queues on Redis when a command the library runs is refused for a
-- reason that is not the key's (an ACL that denies it): only WRONGTYPE means
-- a key of another type. Any other error is the call's: the FCALL answers
-- it, the worker says it, and no job is failed, replaced or taken out of
-- line.
local helpers = require "helpers"
local redis_server = require "redis_server"
local rf = require "redis_workers"

-- An ACL user that may do all moonjob needs but HMGET (a selector may let
-- it HMGET some keys: "~*:limits"); its URL.
local function no_hmget(server, ...)
  local allowed = select("#", ...) > 0 and ("(+hmget " .. table.concat({ ... }, " ") .. ")") or nil
  assert.equal("OK", server:cli("ACL", "SETUSER", "w", "on", ">pw", "~*", "&*", "+@all", "-hmget", allowed))
  return ("redis://w:pw@127.0.0.1:%d/0"):format(server.port)
end

-- How many commands the ACL denied so far (ACL LOG counts the same denial
-- of the same user in one entry).
local function denials(server)
  return tonumber(server:cli("ACL", "LOG", "1"):match("count\n(%d+)")) or 0
end

-- FCALL moonjob_fetch on queue as that user (n jobs, lease ms) -> its output.
local function fetch_as_w(server, queue, n, lease)
  return (helpers.sh(("%s -p %d --user w --pass pw --no-auth-warning FCALL moonjob_fetch 1 "
    .. "'mj:{%s}:' w1 %d %d '' '' 0 2>&1"):format(redis_server.CLI, server.port, queue, n, lease or 30000)))
end

-- A job's state, data and worker as they are in Redis (the admin reads them).
local function stored(server, queue, id)
  local prefix = ("mj:{%s}:"):format(queue)
  return {
    state = server:cli("HGET", prefix .. "j:" .. id, "state"),
    data = server:cli("HGET", prefix .. "j:" .. id, "data"),
    member = server:cli("HGET", prefix .. "j:" .. id, "member"),
  }
end

describe("a command the library runs, denied by an ACL #slow", function()
  after_each(rf.close_all)

  it("a worker whose user may not HMGET: its fetch fails and says why; the jobs stay waiting, none failed", function()
    local server = rf.server()
    local url = no_hmget(server)
    local q = rf.producer(server, "denied")
    local jobs = {}
    for i = 1, 3 do jobs[i] = assert(q:add({ echo = i })) end
    local pid, log = rf.worker({ url = url }, "denied", "-j 1")
    helpers.wait_for(function() return rf.read(log):find("fetch failed", 1, true) end, 20)
    helpers.wait_for(function() return denials(server) >= 2 end, 20) -- the next poll fails the same way
    for i, job in ipairs(jobs) do
      local s = stored(server, "denied", job.id)
      assert.equal("waiting", s.state)
      assert.equal(i, require("moonjob.json").decode(s.data).echo)
      assert.equal(0, tonumber(server:cli("ZSCORE", "mj:{denied}:wait", s.member))) -- still in line
    end
    local c = q:counts()
    assert.same({ 3, 0, 0, 0 }, { c.waiting, c.active, c.failed, c.missing })
    -- the server's own error, and what it refused
    assert.matches("fetch failed: %u+ .*HMGET mj:{denied}:", rf.read(log))
    assert.equal(1, select(2, rf.read(log):gsub("fetch failed", ""))) -- said once, not at each try
    -- the user is let HMGET again: the same worker runs every job, once
    assert.equal("OK", server:cli("ACL", "SETUSER", "w", "+hmget"))
    for i, job in ipairs(jobs) do assert.equal(i, assert(job:wait(20)).echo) end
    rf.stop_worker(pid, "TERM")
    assert.equal(0, q:counts().failed)
  end)

  it("a fetch that may read the first job but not the next: it hands out the first, the rest stay in line", function()
    local server = rf.server()
    no_hmget(server, "~*:limits", "~*:j:1")
    local q = rf.producer(server, "some")
    for i = 1, 3 do assert(q:add({ echo = i })) end
    local before = server:cli("ZRANGE", "mj:{some}:wait", "0", "-1", "WITHSCORES")
    local out = fetch_as_w(server, "some", 5)
    assert.same({ "waiting", "waiting" }, { stored(server, "some", "2").state, stored(server, "some", "3").state })
    assert.equal(before:gsub("^[^\n]*\n[^\n]*\n", ""), server:cli("ZRANGE", "mj:{some}:wait", "0", "-1", "WITHSCORES"))
    assert.equal("active", stored(server, "some", "1").state)
    assert.matches('"echo":1', out, 1, true) -- the job it could read, handed out
    out = fetch_as_w(server, "some", 5) -- the next fetch meets the error first
    assert.matches("HMGET mj:{some}:j:2", out, 1, true)
    assert.same({ 2, 1, 0 }, { q:counts().waiting, q:counts().active, q:counts().failed })
  end)

  it("a fetch that may not read a grouped job answers the error; the job stays in line, in its group", function()
    local server = rf.server()
    no_hmget(server, "~*:limits")
    local g = rf.producer(server, "grouped")
    local job = assert(g:add({ echo = "g" }, { group = "tenant-a" }))
    local out = fetch_as_w(server, "grouped", 5)
    local s = stored(server, "grouped", job.id)
    assert.equal("waiting", s.state)
    assert.is_not.equal("", server:cli("ZSCORE", "mj:{grouped}:wait", s.member))
    assert.is_not.equal("", server:cli("ZSCORE", "mj:{grouped}:gw:tenant-a", s.member))
    assert.matches("HMGET mj:{grouped}:j:" .. job.id, out, 1, true)
    -- put back in its group alone: not copied into the index of no group
    assert.equal("", server:cli("ZSCORE", "mj:{grouped}:ungrouped", s.member))
    local taken = server:cli("FCALL", "moonjob_fetch", "1", "mj:{grouped}:", "admin", "5", "30000", "", "", "0")
    assert.matches('"echo":"g"', taken, 1, true) -- the next fetch allowed to read it takes it
    assert.matches("tenant%-a", taken) -- with its group (its limits count it)
    assert.equal("0", server:cli("ZCARD", "mj:{grouped}:gw:tenant-a"))
  end)

  it("a fetch that may not read a due delayed job answers the error; the job stays delayed", function()
    local server = rf.server()
    no_hmget(server, "~*:limits")
    local d = rf.producer(server, "later")
    local job = assert(d:add({ echo = "d" }, { delay = 0.05 }))
    helpers.sleep(0.1)
    local out = fetch_as_w(server, "later", 1)
    assert.matches("HMGET mj:{later}:j:" .. job.id, out, 1, true)
    assert.equal("delayed", stored(server, "later", job.id).state)
    assert.is_not.equal("", server:cli("ZSCORE", "mj:{later}:delayed", job.id)) -- still due, not lost
    local taken = server:cli("FCALL", "moonjob_fetch", "1", "mj:{later}:", "admin", "5", "30000", "", "", "0")
    assert.matches('"echo":"d"', taken, 1, true)
  end)

  it("a fetch that may not read a stalled job answers the error; the job is not replaced", function()
    local server = rf.server()
    no_hmget(server)
    local st = rf.producer(server, "stalled")
    local lapsed = assert(st:add({ echo = "s" }))
    server:cli("FCALL", "moonjob_fetch", "1", "mj:{stalled}:", "admin", "1", "1", "", "", "0") -- a 1 ms lease
    helpers.sleep(0.05)
    local out = fetch_as_w(server, "stalled", 1)
    assert.equal("active", stored(server, "stalled", lapsed.id).state)
    assert.equal('{"echo":"s"}', stored(server, "stalled", lapsed.id).data)
    assert.matches("HMGET mj:{stalled}:j:" .. lapsed.id, out, 1, true)
  end)

  it("a fetch that may not read a due schedule answers the error; the schedule does not end", function()
    local server = rf.server()
    no_hmget(server)
    local sc = rf.producer(server, "sched")
    assert(sc:schedule("tick", { every = 1 }, { echo = "t" }))
    server:cli("HSET", "mj:{sched}:s:tick", "next", "1") -- due now
    server:cli("ZADD", "mj:{sched}:schedules", "1", "tick")
    local out = fetch_as_w(server, "sched", 1)
    assert.equal("", server:cli("HGET", "mj:{sched}:s:tick", "note"))
    assert.equal("1", server:cli("HGET", "mj:{sched}:s:tick", "next"))
    assert.matches("HMGET mj:{sched}:s:tick", out, 1, true)
  end)

  it("a fetch that may not INCRBY answers the server's error, not that the token counter is spoiled", function()
    local server = rf.server()
    assert.equal("OK", server:cli("ACL", "SETUSER", "w", "on", ">pw", "~*", "&*", "+@all", "-incrby"))
    local q = rf.producer(server, "tokens")
    local job = assert(q:add({ echo = 1 }))
    local out = fetch_as_w(server, "tokens", 1)
    assert.matches("INCRBY mj:{tokens}:tokens", out, 1, true)
    assert.not_matches("DEL", out, 1, true) -- deleting the counter would draw tokens again
    assert.equal("waiting", stored(server, "tokens", job.id).state)
  end)
end)
