-- Operating a durable queue from Lua: listing, one job, retry, remove,
-- promote, clean, drain, obliterate, pause, remote progress and logs,
-- metrics, and moonjob.queues() (moonjob.redis.operate). Each bad input is
-- a clear error that changes nothing.
local moonjob = require "moonjob"
local helpers = require "helpers"
local rq = require "redis_queue"

local wait_for = rq.wait_for

local function ids_of(jobs)
  local out = {}
  for i, j in ipairs(jobs) do out[i] = j.id end
  return out
end

-- The counts that say what a call changed (not exists, held, paused).
local function counts(q)
  local c = assert(q:counts())
  return { c.waiting, c.delayed, c.active, c.completed, c.failed }
end

rq.describe(function()
  describe("operating a queue", function()
    it("lists a state's jobs a page at a time, in order, with their fields; a page past the end is ERANGE", function()
      local q = rq.new_producer(rq.new_queue())
      for i = 1, 25 do assert(q:add({ n = i }, { id = "job" .. i, name = "square" })) end
      assert(q:add({ n = 99 }, { id = "urgent", priority = -1 }))
      local page, total = assert(q:jobs("waiting", { limit = 10 }))
      assert.equal(26, total)
      assert.same({ "urgent", "job1", "job2", "job3", "job4", "job5", "job6", "job7", "job8", "job9" }, ids_of(page))
      local j = page[2]
      assert.same({ n = 1 }, j.data)
      assert.equal("waiting", j.state)
      assert.equal("square", j.name)
      assert.equal(0, j.attempts)
      assert.equal(1, j.max_attempts)
      assert.truthy(j.created > 1.7e12) -- the server's clock, in ms
      local last = assert(q:jobs("waiting", { offset = 20, limit = 10 }))
      assert.same({ "job20", "job21", "job22", "job23", "job24", "job25" }, ids_of(last))
      local rev = assert(q:jobs("waiting", { order = "desc", limit = 2 }))
      assert.same({ "job25", "job24" }, ids_of(rev))
      local _, err = q:jobs("waiting", { offset = 26 })
      assert.equal("ERANGE", err.code)
      assert.matches("offset 26 is past the end: queue .* holds 26 waiting", err.message)
      _, err = q:jobs("done")
      assert.equal("EINPUT", err.code)
      assert.matches("state must be waiting, delayed, active, completed, failed or waiting%-children, not 'done'", err.message)
      assert.has_error(function() q:jobs("waiting", { limit = 0 }) end,
        "queue:jobs(): option 'limit' must be a whole number from 1 to 1000")
      assert.has_error(function() q:jobs("waiting", { size = 1 }) end)
      local empty, none = assert(q:jobs("failed"))
      assert.same({}, empty)
      assert.equal(0, none)
      local cut = assert(q:jobs("waiting", { limit = 1, offset = 1, preview = 3 }))[1]
      assert.is_nil(cut.data)
      assert.equal('{"n', cut.data_preview)
    end)

    it("shows a failed job with its error fields, retries it alone or all failed ones, and they complete", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      local bad = assert(q:add({ fail = true }, { id = "bad" }))
      local others = {}
      for i = 1, 3 do others[i] = assert(q:add({ fail = true }, { id = "other" .. i })) end
      local pool = rq.pool(name, { size = 1 })
      local _, err = bad:wait(20)
      assert.equal("EBAD", err.code)
      for i = 1, 3 do others[i]:wait(20) end
      pool:close()
      local job = assert(q:job("bad"))
      assert.equal("failed", job.state)
      assert.equal("EBAD", job.error.code)
      assert.equal("A-1", job.error.sku)
      assert.equal(1, job.attempts)
      assert.truthy(job.worker)
      assert.truthy(job.finished >= job.started)
      -- a job that fails again would be a different data: make it pass now
      rq.server():cli("HSET", "mj:{" .. name .. "}:j:bad", "data", '{"echo":"again"}')
      for i = 1, 3 do rq.server():cli("HSET", "mj:{" .. name .. "}:j:other" .. i, "data", '{"echo":' .. i .. '}') end
      local _, serr = q:retry("other1-nope")
      assert.equal("ENOTFOUND", serr.code)
      assert.same({ 0, 0, 0, 0, 4 }, counts(q))
      assert.equal("failed", assert(q:retry("bad")))
      local again = assert(q:job("bad"))
      assert.equal("waiting", again.state)
      assert.equal(0, again.attempts)
      assert.is_nil(again.error)
      _, serr = q:retry("bad")
      assert.equal("ESTATE", serr.code)
      assert.matches("job bad is waiting; only a failed or completed job can be retried", serr.message)
      assert.equal(3, assert(q:retry_all()))
      assert.same({ 4, 0, 0, 0, 0 }, counts(q)) -- failed: none now (failed_ever keeps them)
      rq.pool(name, { size = 1 })
      assert(wait_for(function() return q:counts().waiting == 0 and q:counts().active == 0 end))
      local done = assert(q:job("bad"))
      assert.equal("completed", done.state)
      assert.same({ id = "bad", attempt = 1, echo = "again" }, done.result)
      assert.equal(4, #assert(q:jobs("completed")))
      assert.equal(0, #assert(q:jobs("failed")))
    end)

    it("removes, promotes and drains waiting and delayed jobs; refuses what does not fit, changing nothing", function()
      local q = rq.new_producer(rq.new_queue())
      for i = 1, 5 do assert(q:add({ n = i }, { id = "w" .. i })) end
      for i = 1, 3 do assert(q:add({ n = i }, { id = "d" .. i, delay = 600 })) end
      assert.same({ 5, 3, 0, 0, 0 }, counts(q))
      assert.equal("waiting", assert(q:remove("w1")))
      assert.equal("delayed", assert(q:remove("d1")))
      local _, err = q:remove("w1")
      assert.equal("ENOTFOUND", err.code)
      assert.same({ 4, 2, 0, 0, 0 }, counts(q))
      _, err = q:promote("w2")
      assert.equal("ESTATE", err.code)
      assert.matches("only a delayed job can be promoted", err.message)
      assert.equal("delayed", assert(q:promote("d2")))
      assert.same({ 5, 1, 0, 0, 0 }, counts(q))
      local page = assert(q:jobs("waiting"))
      assert.equal("d2", page[#page].id) -- it waits behind those there before it
      assert.equal(5, assert(q:drain({ delayed = false })))
      assert.same({ 0, 1, 0, 0, 0 }, counts(q))
      assert.equal(1, assert(q:drain()))
      assert.same({ 0, 0, 0, 0, 0 }, counts(q))
      assert.equal("0", rq.server():cli("EXISTS", q.prefix .. "j:d3"))
    end)

    it("refuses to remove a running job and to obliterate a queue whose jobs run, unless forced", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      local job = assert(q:add({ sleep = 30 }, { id = "long" }))
      local pool = rq.pool(name, { size = 1 })
      assert(wait_for(function() return q:counts().active == 1 end))
      local _, err = q:remove("long")
      assert.equal("ESTATE", err.code)
      assert.matches("job long is active; cancel it first", err.message)
      _, err = q:obliterate()
      assert.equal("EBUSY", err.code)
      assert.matches("1 job%(s%) are active %(fetched by workers", err.message)
      assert.same({ 0, 0, 1, 0, 0 }, counts(q))
      assert.equal("active", q:cancel(job))
      local _, werr = job:wait(20)
      assert.equal("ECANCELED", werr.code)
      pool:close()
      for i = 1, 30 do assert(q:add({ n = i })) end
      assert.equal(31, assert(q:obliterate()))
      -- the token counter stays: a run of a job added now never shares a token with one before
      assert.equal("mj:{" .. name .. "}:tokens", rq.server():cli("KEYS", "mj:{" .. name .. "}:*"))
      assert.is_false(q:counts().exists)
      assert.is_false(q:exists())
      local again = assert(q:add({ echo = "new" }))
      local tokens = tonumber(rq.server():cli("GET", "mj:{" .. name .. "}:tokens"))
      rq.pool(name, { size = 1 })
      assert.same({ id = again.id, attempt = 1, echo = "new" }, again:wait(20))
      assert.equal(tokens + 1, tonumber(rq.server():cli("GET", "mj:{" .. name .. "}:tokens")))
      local listed = false
      for _, info in ipairs(assert(moonjob.queues(rq.server().url))) do listed = listed or info.name == name end
      assert.is_true(listed) -- an add registers the queue again
    end)

    it("cleans finished jobs by age and says ENOQUEUE for a queue that does not exist", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      for i = 1, 3 do assert(q:add({ echo = i }, { id = "c" .. i })) end
      local pool = rq.pool(name, { size = 1 })
      assert(wait_for(function() return q:counts().completed == 3 end))
      pool:close()
      assert.equal(0, assert(q:clean("completed", { older_than = 3600 })))
      local _, err = q:clean("waiting")
      assert.equal("EINPUT", err.code)
      assert.matches("completed or failed %(jobs that wait: queue:drain%(%)%)", err.message)
      assert.equal(2, assert(q:clean("completed", { limit = 2 })))
      assert.equal(1, #assert(q:jobs("completed")))
      local ghost = rq.new_producer("never-used")
      _, err = ghost:jobs("failed")
      assert.equal("ENOQUEUE", err.code)
      assert.matches("no queue 'never%-used' on this server", err.message)
      _, err = ghost:job("x")
      assert.equal("ENOQUEUE", err.code)
      _, err = ghost:retry("x")
      assert.equal("ENOQUEUE", err.code)
      for _, call in ipairs({ function() return ghost:retry_all() end, function() return ghost:drain() end,
          function() return ghost:clean("failed") end, function() return ghost:metrics() end,
          function() return ghost:promote("x") end, function() return ghost:remove("x") end }) do
        local value, cerr = call()
        assert.is_nil(value)
        assert.equal("ENOQUEUE", cerr.code)
      end
      assert.is_false(ghost:counts().exists)
      local _, serr = q:retry_all({ state = "waiting" })
      assert.equal("EINPUT", serr.code)
    end)

    it("pauses every worker: nothing more is fetched, held jobs go back, running ones finish; resume runs them", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      local log = os.tmpname()
      local first = assert(q:add({ sleep = 1, log = log }, { id = "first" }))
      for i = 1, 3 do assert(q:add({ log = log }, { id = "next" .. i })) end
      local pool = rq.pool(name, { size = 1, prefetch = 3 })
      local said = {}
      pool:on("redis", function(kind) said[#said + 1] = kind end)
      assert(wait_for(function() return #rq.read_lines(log) == 1 end))
      assert(q:pause())
      assert.is_true(q:counts().paused)
      assert(first:wait(20)) -- the running one finishes
      assert(wait_for(function() return q:counts().waiting == 3 end))
      assert(q:add({ log = log }, { id = "later" }))
      helpers.sleep(1.5) -- a poll and more: nothing is fetched
      assert.same({ 4, 0, 0, 1, 0 }, counts(q))
      assert.equal(1, #rq.read_lines(log))
      assert.truthy(table.concat(said, " "):find("paused"))
      assert(q:resume())
      assert(wait_for(function() return q:counts().completed == 5 end))
      assert.equal(5, #rq.read_lines(log)) -- each ran once
      assert.truthy(table.concat(said, " "):find("resumed"))
      os.remove(log)
    end)

    it("brings a remote job's progress and log lines to Redis, bounded, and to producers as events", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      local heard = { progress = {}, log = {} }
      q:on("progress", function(id, value) heard.progress[#heard.progress + 1] = { id, value } end)
      q:on("log", function(id, line) heard.log[#heard.log + 1] = { id, line } end)
      local small = assert(q:add({ progress = 3, say = "hello" }, { id = "small" }))
      local chatty = assert(q:add({ say = "line", say_times = 250 }, { id = "chatty" }))
      rq.pool(name, { size = 1, keep_logs = 100 })
      assert(small:wait(20))
      assert(chatty:wait(20))
      local job = assert(q:job("small"))
      assert.same({ step = 3 }, job.progress)
      assert.same({ "hello", "hello printed" }, job.log)
      local lines = assert(q:job("chatty")).log
      assert.equal(100, #lines)
      assert.equal("line 151", lines[1])
      assert.equal("line 250", lines[100])
      assert.same({ "line 250" }, assert(q:job("chatty", { log = 1 })).log)
      assert(wait_for(function() return #heard.progress >= 1 and #heard.log >= 2 end, 5))
      assert.same({ "small", { step = 3 } }, heard.progress[#heard.progress])
      assert.same({ "small", "hello" }, heard.log[1])
      assert.has_error(function() q:on("done", function() end) end, "queue:on(): unknown event 'done' (progress, log)")
    end)

    it("keeps per-minute metrics: completed, failed and run-time percentiles", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      local jobs = {}
      for i = 1, 6 do jobs[i] = assert(q:add({ sleep = 0.05 })) end
      jobs[7] = assert(q:add({ fail = true }))
      rq.pool(name, { size = 2 })
      for _, j in ipairs(jobs) do j:wait(20) end
      local m = assert(q:metrics({ minutes = 3 }))
      assert.equal(3, #m.minutes)
      local completed, failed, runs = 0, 0, 0
      for _, row in ipairs(m.minutes) do
        completed, failed, runs = completed + row.completed, failed + row.failed, runs + row.runs
      end
      assert.same({ 6, 1, 7 }, { completed, failed, runs })
      assert.same({ 6, 1, 7 }, { m.total.completed, m.total.failed, m.total.runs })
      assert.truthy(m.total.p50_ms >= 25 and m.total.p50_ms <= 5000) -- 50 ms sleeps, in their bucket
      assert.truthy(m.total.p99_ms >= m.total.p50_ms)
      assert.equal(m.minutes[3].at - 120000, m.minutes[1].at)
      assert.has_error(function() q:metrics({ minutes = 0 }) end)
    end)

    it("lists the server's queues with their counts", function()
      local a, b = rq.new_queue(), rq.new_queue()
      local qa, qb = rq.new_producer(a), rq.new_producer(b)
      assert(qa:add({ n = 1 }))
      assert(qb:pause())
      local list = assert(moonjob.queues(rq.server().url))
      local seen = {}
      for _, q in ipairs(list) do seen[q.name] = q end
      assert.equal(1, seen[a].waiting)
      assert.is_true(seen[b].paused)
      assert(qa:obliterate())
      list = assert(moonjob.queues(rq.server().url))
      for _, q in ipairs(list) do assert.not_equal(a, q.name) end
    end)

    it("answers for a job key another client spoiled, and removes it", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      assert(q:add({ n = 1 }, { id = "fine" }))
      rq.server():cli("SET", "mj:{" .. name .. "}:j:spoiled", "text")
      assert.equal("invalid", assert(q:remove("spoiled")))
      assert.equal("0", rq.server():cli("EXISTS", "mj:{" .. name .. "}:j:spoiled"))
      local _, err = q:retry("fine")
      assert.equal("ESTATE", err.code)
    end)
  end)
end)

rq.describe(function()
  describe("operating a queue, the hard cases", function()
    it("keeps the metrics' run time to the run itself, not the time a job waited prefetched", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      local jobs = {}
      for i = 1, 8 do jobs[i] = assert(q:add({ sleep = 0.05 })) end
      rq.pool(name, { size = 1, prefetch = 4 })
      for _, j in ipairs(jobs) do assert(j:wait(20)) end
      local t = assert(q:metrics({ minutes = 2 })).total
      assert.equal(8, t.runs)
      -- 50 ms sleeps: in the 50 or 100 ms bucket; counted from the fetch, most would be 100-250 ms
      assert.truthy(t.p90_ms <= 100, "p90 " .. tostring(t.p90_ms))
      local done = assert(q:jobs("completed", { limit = 8 }))
      for _, j in ipairs(done) do assert.truthy(j.ms < 150, "run time " .. j.ms) end
    end)

    it("retries every failed job once, even while a worker fails them again", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      -- more than one call's worth (1,000 a call), so jobs fail again between calls
      for _ = 1, 2500 do assert(q:add({ fail = true })) end
      rq.pool(name, { size = 2 })
      assert(wait_for(function() return q:counts().failed == 2500 end, 60))
      local n = assert(q:retry_all()) -- the pool fails them again at once
      assert.equal(2500, n)
    end)

    it("cuts previews at a character, and writes text that is not UTF-8 as U+FFFD", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      local data = string.rep("é", 200) -- 400 bytes
      assert(q:add(data, { id = "utf" }))
      local job = assert(q:jobs("waiting", { preview = 300 }))[1] -- '"' then 2-byte characters
      assert.equal(299, #job.data_preview) -- not 300: that would end inside a character
      assert.is_nil(require("moonjob.codec.utf8").error_at(job.data_preview))
      local out = require("moonjob.redis.operate").encode({ line = "caf\233" })
      assert.equal('{"line":"caf\239\191\189"}', out)
    end)

    it("keeps a job's output and error that are not UTF-8, as U+FFFD, and shows them", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      local job = assert(q:add({ latin1 = true }, { id = "latin1" }))
      rq.pool(name, { size = 1 })
      local _, err = job:wait(20)
      assert.matches("na\239\191\189ve error", err.message)
      local seen = assert(q:job("latin1"))
      assert.same({ "caf\239\191\189 latin-1" }, seen.log)
      local text = require("moonjob.redis.operate").encode(seen)
      assert.is_nil(require("moonjob.codec.utf8").error_at(text))
    end)

    it("hears a pause whose message was lost, even with no room to fetch, and gives held jobs back", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      local log = os.tmpname()
      local first = assert(q:add({ sleep = 3, log = log }, { id = "long" }))
      for i = 1, 2 do assert(q:add({ log = log }, { id = "held" .. i })) end
      rq.pool(name, { size = 1, prefetch = 2 }) -- full: 1 running, 2 held
      assert(wait_for(function() return #rq.read_lines(log) == 1 end))
      rq.server():cli("SET", "mj:{" .. name .. "}:paused", "1") -- a pause with no message
      assert(wait_for(function() return q:counts().waiting == 2 end, 10))
      assert(first:wait(20))
      assert.equal(1, #rq.read_lines(log))
      os.remove(log)
    end)

    it("takes no pause of a queue of the same name in another database", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      local other = assert(moonjob.queue(rq.server().url:gsub("/0$", "/1"), name))
      local pool = rq.pool(name, { size = 1 })
      local said = {}
      pool:on("redis", function(kind) said[#said + 1] = kind end)
      assert(wait_for(function() return q:exists() end))
      assert(other:add({ n = 1 }))
      assert(other:pause())
      helpers.sleep(1.5)
      assert.is_nil(table.concat(said, " "):find("paused"))
      assert(q:add({ echo = 1 }):wait(20)) -- db 0's queue runs
      other:obliterate()
      other:close()
    end)
  end)
end)
