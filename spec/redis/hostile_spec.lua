-- Durable queues on Redis: foreign data in a queue's keys, numbers out of
-- range from other producers, a Redis that lost its data, and `moonjob add`
-- against a Redis that stalls past its reply deadline.
-- (a real redis-server per file and the shared helpers: spec/support/redis_queue.lua)
local helpers = require "helpers"
local redis_server = require "redis_server"
local rq = require "redis_queue"

-- The ids of the queue's job hashes whose state is not matched by an entry in
-- the set of that state (a job in no set: nobody would ever run or report it).
local ORPHANS = [[
  local p, orphans = ARGV[1], {}
  for _, k in ipairs(redis.call("KEYS", p .. "j:*")) do
    local f = redis.call("HMGET", k, "state", "member")
    local id = string.sub(k, #p + 3)
    local found
    if f[1] == "waiting" then found = f[2] and redis.call("ZSCORE", p .. "wait", f[2])
    elseif f[1] then found = redis.call("ZSCORE", p .. f[1], id) end
    if not found then orphans[#orphans + 1] = id end
  end
  return #orphans == 0 and "none" or table.concat(orphans, " ")
]]

local function prefix(name) return "mj:{" .. name .. "}:" end

local function orphans(name)
  return rq.server():cli("EVAL", ORPHANS, 0, prefix(name))
end

-- A raw FCALL moonjob_add, as another language's producer makes it:
-- id, data, priority, delay_ms, attempts, backoff, timeout, kill_after, name,
-- cache, max_queue, notify.
local function raw_add(name, id, fields)
  local a = { id, fields.data or "{}", fields.priority or 0, fields.delay or 0, fields.attempts or 1, "",
    fields.timeout or 0, fields.kill_after or 0, "", 0, 0, 1 }
  return rq.server():cli("FCALL", "moonjob_add", 1, prefix(name), unpack(a))
end

rq.describe(function()
  describe("foreign data in the queue", function()
    it("a spoiled token counter stops a fetch before it pops; spoiled totals never stop a completion", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      local p = prefix(name)
      local jobs = {}
      for i = 1, 3 do jobs[i] = assert(q:add({ echo = i })) end
      rq.server():cli("SET", p .. "tokens", "not a number")
      local said = rq.server():cli("FCALL", "moonjob_fetch", 1, p, "w", 2, 30000, 100, 60000, 0)
      assert.matches("tokens is not a counter", said, 1, true)
      assert.equal("3", rq.server():cli("ZCARD", p .. "wait")) -- nothing popped
      assert.equal("none", orphans(name))
      rq.server():cli("DEL", p .. "tokens")
      rq.server():cli("HSET", p .. "totals", "completed", "abc")
      local pool = rq.pool(name, { size = 1 })
      local refused = {}
      pool:on("redis", function(kind, why) if kind == "error" then refused[#refused + 1] = why end end)
      for i = 1, 3 do assert.equal(i, assert(jobs[i]:wait(20)).echo) end
      assert.equal("3", rq.server():cli("ZCARD", p .. "completed"))
      assert.same({}, refused)
      assert.equal("none", orphans(name))
    end)

    it("a key of the wrong type in the wait set fails alone with EINPUT; the jobs around it run", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      local jobs = {}
      for i = 1, 6 do jobs[i] = assert(q:add({ echo = i })) end
      local p = prefix(name)
      -- a job whose hash another client replaced by a list: its handle hears EINPUT
      rq.server():cli("DEL", p .. "j:" .. jobs[6].id)
      rq.server():cli("RPUSH", p .. "j:" .. jobs[6].id, "x")
      -- after the second job in the batch: a string where a job hash should be,
      -- and an entry whose job hash is gone (evicted, deleted by hand)
      rq.server():cli("SET", p .. "j:bad", "not a job")
      rq.server():cli("ZADD", p .. "wait", 0, "0000000000000002:bad")
      rq.server():cli("ZADD", p .. "wait", 0, "0000000000000003:gone")
      local pool = rq.pool(name, { size = 2, prefetch = 8 })
      for i = 1, 5 do assert.equal(i, assert(jobs[i]:wait(20)).echo) end
      local _, err = jobs[6]:wait(20)
      assert.equal("EINPUT", err.code)
      assert.matches("holds a list", err.message)
      helpers.wait_for(function() return q:counts().failed == 2 end, 20)
      assert.same({ waiting = 0, delayed = 0, active = 0, completed = 5, failed = 2, missing = 1, paused = false,
        held = 0, exists = true, waiting_children = 0, running = 0, completed_ever = 5, failed_ever = 2,
        workers = 1, lapsed = 0 }, q:counts())
      assert.equal("EINPUT", select(2, jobs[6]:wait(1)).code) -- after the fetch replaced it too
      local info = assert(q:get("bad"))
      assert.equal("failed", info.state)
      assert.equal("EINPUT", info.error.code)
      assert.matches("holds a string", info.error.message)
      assert.equal("none", orphans(name))
      local status = helpers.first_line(("%s scripts/moonjob status --redis %s --queue %s"):format(
        helpers.LUAJIT, rq.server().url, name))
      assert.matches("failed 2, missing 1 (gone from Redis", status, 1, true)
      pool:close()
    end)

    it("a worker's renew and complete answer for an overwritten job alone; bad worker arguments write nothing", function()
      local name = rq.new_queue()
      local p = prefix(name)
      local cli = function(...) return rq.server():cli(...) end
      rq.new_producer(name) -- loads the library
      raw_add(name, "one", {})
      raw_add(name, "two", {})
      assert.matches("EINPUT moonjob_fetch: N", cli("FCALL", "moonjob_fetch", 1, p, "w", "nan", 30000, 10, 1000, 0))
      assert.equal("", cli("GET", p .. "tokens")) -- refused before its first write
      local fetched = cli("FCALL", "moonjob_fetch", 1, p, "w", 2, 30000, 10, 1000, 0)
      assert.matches("w/1", fetched, 1, true)
      assert.matches("w/2", fetched, 1, true)
      cli("DEL", p .. "j:one")
      cli("SET", p .. "j:one", "overwritten")
      assert.equal("one\nELOST\n", cli("FCALL", "moonjob_renew", 1, p, 30000, "one", "w/1", 1, "two", "w/2", 1))
      assert.equal("ESTALE\nOK", cli("FCALL", "moonjob_complete", 1, p, "one", "w/1", "1", "two", "w/2", "2"))
      assert.matches("EINPUT", cli("FCALL", "moonjob_complete", 1, p, "two", "w/2"))
      assert.equal("completed", cli("HGET", p .. "j:two", "state"))
    end)

    it("priority nan from a raw FCALL is refused with nothing written; a later add of that id works", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      assert.matches("EINPUT.*PRIORITY", raw_add(name, "ghost", { priority = "nan" }))
      assert.equal("0", rq.server():cli("EXISTS", prefix(name) .. "j:ghost"))
      for field, value in pairs({ priority = "inf", delay = "inf", attempts = "1.5", timeout = "1e13",
          kill_after = "-1" }) do
        assert.matches("EINPUT", raw_add(name, "ghost", { [field] = value }), 1, true)
      end
      assert.equal("0", rq.server():cli("EXISTS", prefix(name) .. "j:ghost"))
      assert.equal("0", rq.server():cli("ZCARD", prefix(name) .. "wait"))
      local job = assert(q:add({ echo = "ghost" }, { id = "ghost" }))
      assert.is_false(job.joined)
      local pool = rq.pool(name, { size = 1 })
      assert.equal("ghost", assert(job:wait(20)).echo)
      assert.equal("none", orphans(name))
      pool:close()
    end)

    it("a timeout of 1e13 or inf written around moonjob_add fails EINPUT at fetch; the worker goes on", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      local p = prefix(name)
      raw_add(name, "huge", { timeout = 5 })
      rq.server():cli("HSET", p .. "j:huge", "timeout", "1e13")
      raw_add(name, "inf", { timeout = 5 })
      rq.server():cli("HSET", p .. "j:inf", "timeout", "inf")
      raw_add(name, "nanprio", {})
      rq.server():cli("HSET", p .. "j:nanprio", "priority", "nan")
      -- (its mark of a job with no option to read dropped, as docs/REDIS.md asks of such a writer)
      rq.server():cli("HDEL", p .. "j:nanprio", "plain")
      local fine = assert(q:add({ echo = "fine" }))
      local pid, errlog = rq.start_worker(name, "-j 1")
      assert.equal("fine", assert(fine:wait(20)).echo)
      helpers.wait_for(function() return q:counts().failed == 3 end, 20)
      for _, id in ipairs({ "huge", "inf", "nanprio" }) do
        local info = assert(q:get(id))
        assert.equal("failed", info.state)
        assert.equal("EINPUT", info.error.code)
      end
      assert.matches("timeout '1e13'", q:get("huge").error.message, 1, true)
      local later = assert(q:add({ echo = "later" }))
      assert.equal("later", assert(later:wait(20)).echo) -- the worker went on
      rq.stop_worker(pid, "TERM")
      local text = table.concat(rq.read_lines(errlog), "\n")
      assert.not_matches("internal error", text)
      assert.not_matches("traceback", text)
      assert.equal("none", orphans(name))
    end)
  end)

  describe("a Redis that lost its data", function()
    it("no handle resolves to another producer's job that got its id (wait, get, cancel)", function()
      local name = rq.new_queue()
      local first = rq.new_producer(name)
      local second = rq.new_producer(name)
      local old = {}
      for i = 1, 20 do old[i] = assert(first:add({ echo = "first " .. i })) end
      rq.server():cli("FLUSHALL") -- no persistence, a failover that lost writes: ids start again
      local new = {}
      for i = 1, 20 do new[i] = assert(second:add({ echo = "second " .. i })) end
      assert.equal(old[1].id, new[1].id) -- the same ids, other jobs
      local pool = rq.pool(name, { size = 2 })
      for i = 1, 20 do assert.equal("second " .. i, assert(new[i]:wait(20)).echo) end
      for i = 1, 20 do
        local result, err = old[i]:wait(5)
        assert.is_nil(result)
        assert.equal("ENOTFOUND", err.code)
        assert.is_nil(old[i]:get())
        assert.is_nil(first:get(old[i]))
      end
      local _, err = old[1]:cancel("not mine")
      assert.equal("ENOTFOUND", err.code)
      assert.equal("completed", assert(new[1]:get()).state) -- the other job untouched
      assert.equal("completed", assert(first:get(new[1].id)).state) -- by plain id: whatever holds it
      pool:close()
    end)
  end)

  describe("moonjob add against a Redis that stalls past the reply deadline", function()
    it("gets every line's id though replies were lost, and a re-add with --dedupe gives the same ids", function()
      local server = redis_server.start({ extra = "--enable-debug-command yes" })
      local dir = helpers.tmpdir()
      local ok, err = pcall(function()
        local all, lines = dir .. "/all.ndjson", {}
        for i = 1, 600 do lines[i] = ('{"n":%d}'):format(i) end
        helpers.write_file(all, table.concat(lines, "\n") .. "\n")
        local fifo = dir .. "/in"
        assert(os.execute("mkfifo " .. fifo) == 0)
        local cmd = ("(%s scripts/moonjob add --redis %s --queue s --dedupe %s >%s/out 2>%s/err; echo $? >%s/rc) "
          .. "& echo $!"):format(helpers.LUAJIT, server.url, fifo, dir, dir, dir)
        local pid = assert(tonumber(helpers.first_line(cmd)))
        rq.close_after({ close = function() os.execute(("kill -KILL %d 2>/dev/null"):format(pid)) end })
        local w = assert(io.open(fifo, "r+")) -- read-write: never blocks, even with no reader (Linux)
        -- more than its window (256 calls in flight): some are added and answered
        w:write(table.concat(lines, "\n", 1, 400), "\n")
        w:flush()
        helpers.wait_for(function() return tonumber(server:cli("ZCARD", "mj:{s}:wait")) >= 128 end, 20)
        helpers.sleep(0.5)
        os.execute(("%s -p %d DEBUG SLEEP 7 >/dev/null 2>&1 &"):format(redis_server.CLI, server.port))
        helpers.sleep(0.5) -- the server sleeps: what is sent now gets no reply for 6.5 s
        w:write(table.concat(lines, "\n", 401, 600), "\n")
        w:close()
        helpers.wait_for(function() return rq.read_lines(dir .. "/rc")[1] ~= nil end, 40)
        local stderr = table.concat(rq.read_lines(dir .. "/err"), "\n")
        assert.equal("0", rq.read_lines(dir .. "/rc")[1], stderr)
        assert.not_matches("unknown", stderr)
        local printed = rq.read_lines(dir .. "/out")
        assert.equal(600, #printed)
        -- the same lines again: every id comes back, and no job is there twice
        local out2 = dir .. "/out2"
        local rc = os.execute(("%s scripts/moonjob add --redis %s --queue s --dedupe %s >%s 2>&1")
          :format(helpers.LUAJIT, server.url, all, out2))
        local ids = rq.read_lines(out2)
        assert.equal(0, rc, table.concat(ids, "\n"))
        assert.same(printed, ids)
        local seen = {}
        for _, id in ipairs(ids) do assert.is_nil(seen[id]); seen[id] = true end
        assert.equal("600", server:cli("ZCARD", "mj:{s}:wait"))
      end)
      server:stop()
      os.execute("rm -rf " .. dir)
      assert(ok, err)
    end)
  end)

  describe("moonjob add and status with a standard output that takes nothing", function()
    local function run(command)
      local err = os.tmpname()
      local status = os.execute(command .. " 2>" .. err)
      local said = table.concat(rq.read_lines(err), "\n")
      os.remove(err)
      return status / 256, said
    end

    for i, way in ipairs({ ">/dev/full", ">&-" }) do
      local queue = "lost_ids" .. i
      it("say that the ids were not printed, and fail (stdout " .. way .. ")", function()
        local input = os.tmpname()
        finally(function() os.remove(input) end)
        local f = assert(io.open(input, "w"))
        f:write('{"a":1}\n{"a":2}\n')
        f:close()
        local url = rq.server().url
        local status, said = run(("%s scripts/moonjob add --redis %s --queue %s %s %s")
          :format(helpers.LUAJIT, url, queue, input, way))
        assert.equal(1, status, said)
        assert.matches("the jobs were added but some ids were not printed", said, 1, true)
        assert.equal("2", rq.server():cli("ZCARD", "mj:{" .. queue .. "}:wait"))
        status, said = run(("%s scripts/moonjob status --redis %s --queue %s %s")
          :format(helpers.LUAJIT, url, queue, way))
        assert.equal(1, status, said)
        assert.matches("writing to standard output failed", said, 1, true)
      end)
    end
  end)
end)
