-- Durable queues on Redis: adds in bulk. moonjob_add_bulk adds many jobs
-- of one set of options in one FCALL (atomic: nothing of another client
-- runs between its jobs), each job's id or its own refusal in its row;
-- q:add_bulk of both producers and `moonjob add` send their jobs through
-- it. A job's hash holds its options only when not their default, and
-- every reader gives the default back.
local rq = require "redis_queue"
local add = require "moonjob.redis.add"
local pure_lua = require "pure_lua"

-- moonjob_add_bulk's head: SHEET CALL FORGET, then the options as add's
-- (PRIORITY DELAY_MS ATTEMPTS BACKOFF TIMEOUT KILL_AFTER NAME CACHE
-- MAX_QUEUE NOTIFY EXISTING EXPIRE_MS GROUP), defaults but o's.
local function head(o)
  o = o or {}
  return { o.sheet or "", o.call or "", "", "0", "0", "1", "", "0", "0", "", "0", tostring(o.max_queue or 0), "0",
    "", "", o.group or "" }
end

local function bulk(q, o, ...)
  local args = { "FCALL", "moonjob_add_bulk", 1, q.prefix }
  for _, a in ipairs(head(o)) do args[#args + 1] = a end
  for _, a in ipairs({ ... }) do args[#args + 1] = a end
  return q.client:call_wait(args)
end

local function fcalls(server)
  return tonumber(server:cli("INFO", "commandstats"):match("cmdstat_fcall:calls=(%d+)")) or 0
end

rq.describe(function()
  describe("adds in bulk", function()
    it("q:add_bulk adds 1,200 jobs in 3 calls, each with its own id, nonce and exact data", function()
      local q = rq.new_producer(rq.new_queue())
      local list = {}
      for i = 1, 1200 do list[i] = { n = i, big = 9007199254740993 } end
      local before = fcalls(rq.server())
      local jobs = assert(q:add_bulk(list, { attempts = 3, name = "bulk" }))
      assert.equal(3, fcalls(rq.server()) - before) -- 500 jobs per call
      local seen = {}
      for i, job in ipairs(jobs) do
        assert.is_nil(seen[job.id])
        seen[job.id] = true
        assert.equal("waiting", job.state)
        assert.truthy(job.nonce)
        if i % 300 == 0 then
          local info = assert(q:get(job))
          assert.equal(3, info.max_attempts)
          assert.equal("bulk", info.name)
        end
      end
      assert.equal(1200, q:counts().waiting)
      local view = assert(q:job(jobs[1200].id))
      assert.same({ n = 1200, big = 9007199254740993 }, view.data)
    end)

    it("each job's refusal comes in its row, the others are added, all in one call", function()
      local q = rq.new_producer(rq.new_queue())
      local sha = q.client:call_wait({ "EVAL", "return redis.sha1hex(ARGV[1])", 0, '{"x":1}' })
      q.client:call_wait({ "SET", q.prefix .. "j:d:" .. sha, "a string" })
      local rows = assert(bulk(q, { max_queue = 3 }, "", '{"a":1}', ("i"):rep(1025), '{"a":2}', "", "",
        "\0dedupe", '{"x":1}', "", '{"a":3}', "", '{"a":4}', "", '{"a":5}'))
      assert.equal(7, #rows)
      assert.equal("waiting", rows[1][2])
      assert.matches("^EINPUT moonjob_add_bulk: a job's id must take at most 1024 bytes", rows[2])
      assert.matches("^EINPUT moonjob_add_bulk: DATA must be JSON text", rows[3])
      assert.matches("^EINPUT moonjob_add_bulk: .*holds a string, not a job hash", rows[4]) -- a key of another type: that job's refusal only
      assert.equal("waiting", rows[5][2])
      assert.equal("waiting", rows[6][2])
      assert.matches("^EQUEUEFULL", rows[7]) -- max_queue 3, reached by the jobs before it
      assert.equal(3, q:counts().waiting)
    end)

    it("q:add_bulk answers the jobs Redis refused apart, the others as handles", function()
      local q = rq.new_producer(rq.new_queue())
      local jobs, err = q:add_bulk({ { n = 1 }, { n = 2 }, { n = 3 }, { n = 4 }, { n = 5 } }, { max_queue = 3 })
      assert.same({ "waiting", "waiting", "waiting", false, false },
        { jobs[1].state, jobs[2].state, jobs[3].state, jobs[4], jobs[5] })
      assert.equal("EQUEUEFULL", err.code)
      assert.matches("2 of 5 adds were refused; the first, job 4", err.message, 1, true)
      assert.same({ "EQUEUEFULL", "EQUEUEFULL" }, { err.errors[4].code, err.errors[5].code })
      local _, bad = q:add_bulk({ { n = 1 }, { f = function() end } })
      assert.matches("^job 2: ", bad.message)
    end)

    it("a drawn id never takes a number an id named in the same call holds", function()
      local q = rq.new_producer(rq.new_queue())
      local rows = assert(bulk(q, {}, "", '{"a":1}', "2", '{"b":2}', "", '{"c":3}'))
      assert.same({ "1", "2", "3" }, { rows[1][1], rows[2][1], rows[3][1] })
      assert.same({ b = 2 }, assert(q:job("2")).data)
      assert.equal(3, q:counts().waiting)
    end)

    it("refuses bad options before anything is written, and a call of too many jobs", function()
      local q = rq.new_producer(rq.new_queue())
      assert(q:add({ n = 0 }))
      local digest = q.client:call_wait({ "DEBUG", "DIGEST" })
      local h = head()
      h[6] = "0" -- ATTEMPTS 0
      local args = { "FCALL", "moonjob_add_bulk", 1, q.prefix }
      for _, a in ipairs(h) do args[#args + 1] = a end
      args[#args + 1] = ""
      args[#args + 1] = '{"a":1}'
      local _, err = q.client:call_wait(args)
      assert.matches("EINPUT moonjob_add_bulk: ATTEMPTS must be a whole number", tostring(err))
      _, err = bulk(q, {}, "", '{"a":1}', "")
      assert.matches("then ID DATA pairs", tostring(err))
      local many = {}
      for i = 1, 1001 do many[#many + 1] = ""; many[#many + 1] = '{"i":' .. i .. "}" end
      _, err = bulk(q, {}, unpack(many))
      assert.matches("at most 1000 jobs per call", tostring(err))
      assert.equal(digest, q.client:call_wait({ "DEBUG", "DIGEST" }))
    end)

    it("a named call sent again gets the reply it got, and adds nothing twice", function()
      local q = rq.new_producer(rq.new_queue())
      local first = assert(bulk(q, { sheet = "p.0", call = "1" }, "", '{"a":1}', "", '{"a":2}'))
      local again = assert(bulk(q, { sheet = "p.0", call = "1" }, "", '{"a":1}', "", '{"a":2}'))
      assert.same(first, again)
      assert.equal(2, q:counts().waiting)
    end)

    it("answers jobs made in a row as runs to a caller that asks, each the job's own id and nonce", function()
      local q = rq.new_producer(rq.new_queue())
      local reply = assert(bulk(q, {}, "runs", "", '{"a":1}', "", '{"a":2}', "", "", "", '{"a":3}', "\0dedupe",
        '{"d":1}', "", '{"a":4}', "", '{"a":5}', "", '{"a":6}'))
      -- two made in a row, a refusal, one, a job of a named id (its row), three
      assert.equal(5, #reply)
      assert.same({ "\0run", "\0run", "\0run" }, { reply[1][1], reply[3][1], reply[5][1] })
      assert.same({ 2, 1, 3 }, { reply[1][2], reply[3][2], reply[5][2] })
      assert.matches("DATA must be JSON text", reply[2])
      assert.equal(4, #reply[4]) -- (a row)
      -- a client that reads integers as text gets the same rows
      local as_text = {}
      for i, item in ipairs(reply) do
        if type(item) == "table" and #item == 5 then
          as_text[i] = { item[1], tostring(item[2]), tostring(item[3]), item[4], tostring(item[5]) }
        else
          as_text[i] = item
        end
      end
      assert.same(add.bulk_rows(reply), add.bulk_rows(as_text))
      local rows = add.bulk_rows(reply)
      local data = { '{"a":1}', '{"a":2}', false, '{"a":3}', '{"d":1}', '{"a":4}', '{"a":5}', '{"a":6}' }
      assert.equal(#data, #rows)
      local ids = {}
      for i, row in ipairs(rows) do
        if data[i] then
          assert.equal("waiting", row[2])
          local f = q.client:call_wait({ "HMGET", q.prefix .. "j:" .. row[1], "id", "nonce", "state", "data" })
          assert.same({ row[1], row[4], "waiting", data[i] }, { f[1], f[2], f[3], f[4] })
          assert.is_nil(ids[row[1]])
          ids[row[1]] = true
          assert.equal("waiting", assert(q:get({ id = row[1], nonce = row[4] })).state)
        end
      end
      -- the same call without REPLY: a row per job; with an odd count but no REPLY, refused
      local plain_rows = assert(bulk(q, {}, "", '{"b":1}', "", '{"b":2}'))
      assert.equal(2, #plain_rows)
      assert.equal("string", type(plain_rows[1][1]))
      local _, err = bulk(q, {}, "later", "", '{"b":3}')
      assert.matches("the 17th is REPLY, which must be runs", tostring(err))
    end)

    it("writes ids, places in line, nonces and tokens digit for digit across thousands", function()
      local q = rq.new_producer(rq.new_queue())
      q.client:call_wait({ "SET", q.prefix .. "ids", 997 })
      q.client:call_wait({ "SET", q.prefix .. "seq", 99997 })
      q.client:call_wait({ "SET", q.prefix .. "tokens", 1998 })
      local texts = {}
      for i = 1, 6 do texts[#texts + 1] = "" texts[#texts + 1] = '{"i":' .. i .. "}" end
      local rows = add.bulk_rows(assert(bulk(q, {}, "runs", unpack(texts))))
      local fetched = assert(q.client:call_wait({ "FCALL", "moonjob_fetch", 1, q.prefix, "w", 6, 30000, "", 86400000,
        0, "", 6, 0 }))
      for i, row in ipairs(rows) do
        local id, seq = 997 + i, 99997 + i
        assert.equal(tostring(id), row[1])
        local f = q.client:call_wait({ "HMGET", q.prefix .. "j:" .. row[1], "id", "member", "nonce", "token" })
        assert.same({ tostring(id), ("%016d:%d"):format(seq, id), row[4], "w/" .. (1998 + i) }, { f[1], f[2], f[3], f[4] })
        assert.matches("%." .. seq .. "$", row[4])
        assert.equal("w/" .. (1998 + i), fetched[i + 1][2])
      end
    end)

    it("puts jobs in line under a priority written as Lua reads it but Redis would not", function()
      local q = rq.new_producer(rq.new_queue())
      for _, prio in ipairs({ " 5", "5 ", "1e-400", "-0", "2.5" }) do
        local args = { "FCALL", "moonjob_add_bulk", 1, q.prefix }
        for i, a in ipairs(head()) do args[#args + 1] = i == 4 and prio or a end
        args[#args + 1] = "runs"
        args[#args + 1] = ""
        args[#args + 1] = '{"p":"' .. prio .. '"}'
        local id = add.bulk_rows(assert(q.client:call_wait(args)))[1][1]
        local member = q.client:call_wait({ "HGET", q.prefix .. "j:" .. id, "member" })
        assert.equal(tonumber(prio), tonumber(q.client:call_wait({ "ZSCORE", q.prefix .. "wait", member })), prio)
      end
      assert.equal(5, q:counts().waiting)
    end)

    it("marks a job plain only while it has no option to read, and runs and ends it either way", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      local function field(id, name) return q.client:call_wait({ "HGET", q.prefix .. "j:" .. id, name }) end
      local rows = add.bulk_rows(assert(bulk(q, {}, "runs", "", '{"echo":1}')))
      assert.equal("1", field(rows[1][1], "plain"))
      assert.is_nil(field(rows[1][1], "run_at")) -- (read as created: its views say so)
      assert.equal(assert(q:job(rows[1][1])).created, assert(q:job(rows[1][1])).run_at)
      local notified = assert(q:add({ echo = 2 }, { id = "n" }))
      assert.equal("n", field("n", "plain"))
      assert(q:add({ echo = 3 }, { id = "three", attempts = 3 }))
      assert.is_nil(field("three", "plain"))
      -- joined by an add that asks to be told: no longer plain
      local args = { "FCALL", "moonjob_add", 1, q.prefix, rows[1][1], "{}", "0", "0", "1", "", "0", "0", "", "0", "0",
        "1" }
      assert.equal(1, assert(q.client:call_wait(args))[3])
      assert.is_nil(field(rows[1][1], "plain"))
      -- a plain job over a worker's max_payload fails EPAYLOAD at fetch, its data never sent
      local big = add.bulk_rows(assert(bulk(q, {}, "runs", "", '{"big":"' .. ("x"):rep(200) .. '"}')))[1][1]
      local fetched = assert(q.client:call_wait({ "FCALL", "moonjob_fetch", 1, q.prefix, "w", 10, 30000, "", 86400000,
        100, "", 10, 0 }))
      local taken = {}
      for i = 2, #fetched do taken[fetched[i][1]] = true end
      assert.is_nil(taken[big])
      assert.equal("EPAYLOAD", assert(q:get(big)).error.code)
      -- those it took go back for the pool below
      for i = 2, #fetched do
        q.client:call_wait({ "FCALL", "moonjob_release", 1, q.prefix, fetched[i][1], fetched[i][2] })
      end
      local pool = rq.pool(name, { size = 1 })
      assert.equal(2, assert(notified:wait(20)).echo)
      rq.wait_for(function() return q:counts().completed == 3 end, 20)
      for _, id in ipairs({ rows[1][1], "n", "three" }) do assert.equal("completed", field(id, "state")) end
      pool:close()
    end)

    it("a job added with the defaults reads back with them, from every view", function()
      local q = rq.new_producer(rq.new_queue())
      local job = assert(q:add_bulk({ { n = 1 } }))[1]
      local stored = q.client:call_wait({ "HGETALL", q.prefix .. "j:" .. job.id })
      local fields = {}
      for i = 1, #stored, 2 do fields[stored[i]] = stored[i + 1] end
      for _, absent in ipairs({ "priority", "attempts", "made", "backoff", "timeout", "kill_after", "name", "cache" }) do
        assert.is_nil(fields[absent], absent) -- (written only when not the default)
      end
      local info = assert(q:get(job))
      assert.same({ 0, 1 }, { info.attempts, info.max_attempts })
      local view = assert(q:job(job.id))
      assert.same({ 0, 1, 0 }, { view.attempts, view.max_attempts, view.priority })
      local p = rq.pool(q.name, { size = 1 })
      assert.is_true(rq.wait_for(function() return q:get(job).state == "completed" end, 20))
      p:close()
    end)

    it("moonjob add sends its lines in bulk: every good line's id in order, each bad line said", function()
      local name = rq.new_queue()
      local lines = {}
      for i = 1, 1000 do lines[i] = i % 250 == 0 and "not json" or ('{"n":%d}'):format(i) end
      local before = fcalls(rq.server())
      local out, err, status = rq.moonjob("add --queue " .. name, table.concat(lines, "\n") .. "\n")
      assert.equal(1, status, err)
      assert.is_true(fcalls(rq.server()) - before <= 10, "calls: " .. (fcalls(rq.server()) - before))
      local ids = {}
      for id in out:gmatch("[^\n]+") do ids[#ids + 1] = id end
      assert.equal(996, #ids)
      for _, n in ipairs({ 250, 500, 750, 1000 }) do assert.matches("line " .. n .. " is not JSON", err) end
      local q = rq.new_producer(name)
      assert.same({ n = 1 }, assert(q:job(ids[1])).data)
      assert.same({ n = 999 }, assert(q:job(ids[996])).data)
      -- with --dedupe the same lines again join their jobs: the same ids, nothing twice
      local good = {}
      for _, l in ipairs(lines) do if l ~= "not json" then good[#good + 1] = l end end
      local out1 = assert(rq.moonjob("add --dedupe --queue " .. name, table.concat(good, "\n") .. "\n"))
      local out2 = assert(rq.moonjob("add --dedupe --queue " .. name, table.concat(good, "\n") .. "\n"))
      assert.equal(out1, out2)
      assert.equal(996 * 2, q:counts().waiting)
    end)

    it("the pure-Lua producer adds in bulk on every Lua, one call per 500 jobs", function()
      local name = rq.new_queue()
      for _, lua in ipairs(pure_lua.INTERPRETERS) do
        local before = fcalls(rq.server())
        local out, err, status = pure_lua.run(lua, rq.server().port, ([[
          local q = assert(producer.queue({ port = PORT }, %q))
          local list = {}
          for i = 1, 600 do list[i] = { n = i } end
          local jobs = assert(q:add_bulk(list, { priority = 5 }))
          say(#jobs, jobs[600].state, q:get(jobs[600]).state)
        ]]):format(name))
        assert.equal(0, status, err)
        assert.matches("600\twaiting\twaiting", out, 1, true)
        -- (2 adds, its get and its look at the library: not one call per job)
        assert.is_true(fcalls(rq.server()) - before <= 5, lua .. ": " .. (fcalls(rq.server()) - before))
      end
    end)
  end)
end)
