-- Debounce and expiry on a real Redis: a burst of debounced adds runs
-- once with the last data; a job not started before its expire fails with
-- EEXPIRED and never runs (nor runs again); bad options change nothing.
local helpers = require "helpers"
local rq = require "redis_queue"

rq.describe(function()
  describe("debounce", function()
    it("runs a burst of 20 adds once, with the last data", function()
      local name, log = rq.new_queue(), os.tmpname()
      local q = rq.new_producer(name)
      local handles = {}
      for i = 1, 20 do
        handles[i] = assert(q:add({ echo = i, log = log }, { debounce = { id = "user-7", seconds = 0.4 } }))
      end
      for i = 2, 20 do
        assert.equal(handles[1].id, handles[i].id)
        assert.is_true(handles[i].joined)
      end
      assert.equal("delayed", handles[20].state)
      rq.pool(name, { size = 2 })
      local result = assert(handles[20]:wait(20))
      assert.equal(20, result.echo)
      assert.same(handles[1].nonce, handles[20].nonce) -- every handle waits for the one job
      assert.equal(1, #rq.read_lines(log))
      assert.equal(1, q:counts().completed)
      -- once it ran, the same debounce id makes a new job
      local later = assert(q:add({ echo = 21, log = log }, { debounce = { id = "user-7", seconds = 0.1 } }))
      assert.is_false(later.joined)
      assert.are_not.equal(handles[1].id, later.id)
      assert.equal(21, assert(later:wait(20)).echo)
    end)

    it("starts the delay again at each add, and keeps ids of other debounce keys apart", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      local a = assert(q:add({ n = 1 }, { debounce = { id = "a", seconds = 30 } }))
      local first = assert(q:job(a.id)).run_at
      helpers.sleep(0.05)
      assert(q:add({ n = 2 }, { debounce = { id = "a", seconds = 30 }, priority = 5, name = "second" }))
      local job = assert(q:job(a.id))
      assert.is_true(job.run_at > first, "the delay started again")
      assert.same({ n = 2 }, job.data)
      assert.equal(5, job.priority)
      assert.equal("second", job.name)
      local b = assert(q:add({ n = 3 }, { debounce = { id = "b", seconds = 30 } }))
      assert.are_not.equal(a.id, b.id)
      assert.equal(2, q:counts().delayed)
    end)

    it("never joins a job waiting out a retry's backoff", function()
      local name, log = rq.new_queue(), os.tmpname()
      local q = rq.new_producer(name)
      local first = assert(q:add({ log = log, fail_until = 2 }, { attempts = 2, backoff = { type = "fixed", delay = 30 },
        debounce = { id = "k", seconds = 0.05 } }))
      rq.pool(name, { size = 1 })
      assert(rq.wait_for(function() return assert(q:job(first.id)).attempts == 1 and q:counts().delayed == 1 end),
        "the first attempt did not fail into its backoff")
      local second = assert(q:add({ echo = "new" }, { debounce = { id = "k", seconds = 0.05 } }))
      assert.is_false(second.joined)
      assert.are_not.equal(first.id, second.id)
      assert.equal("new", assert(second:wait(20)).echo)
      local job = assert(q:job(first.id))
      assert.equal("delayed", job.state) -- its backoff and data untouched
      assert.is_nil(job.data.echo)
    end)

    it("makes a new job when its key holds something else", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      q.client:call_wait({ "HSET", q.prefix .. "debounce:x", "f", "v" }) -- written by another client
      local j = assert(q:add({ n = 1 }, { debounce = { id = "x", seconds = 30 } }))
      assert.equal("delayed", j.state)
      q.client:call_wait({ "SET", q.prefix .. "debounce:y", "no-such-job" })
      local k = assert(q:add({ n = 2 }, { debounce = { id = "y", seconds = 30 } }))
      assert.is_false(k.joined)
      -- a key naming a delayed job another add made (its id reused after a data loss)
      local other = assert(q:add({ n = 3 }, { delay = 30 }))
      q.client:call_wait({ "SET", q.prefix .. "debounce:z", other.id })
      local z = assert(q:add({ n = 4 }, { debounce = { id = "z", seconds = 30 } }))
      assert.is_false(z.joined)
      assert.same({ n = 3 }, assert(q:job(other.id)).data)
      assert.equal(4, q:counts().delayed)
    end)
  end)

  describe("expire", function()
    it("fails a job not started in time with EEXPIRED; it never runs", function()
      local name, log = rq.new_queue(), os.tmpname()
      local q = rq.new_producer(name)
      local late = assert(q:add({ log = log }, { expire = 0.2 }))
      local fine = assert(q:add({ log = log, echo = "ok" }, { expire = 60 }))
      helpers.sleep(0.4)
      rq.pool(name, { size = 1 })
      local ok, err = late:wait(20)
      assert.is_nil(ok)
      assert.equal("EEXPIRED", err.code)
      assert.matches("expired %d+ ms ago, before a worker took it", err.message)
      assert.equal("ok", assert(fine:wait(20)).echo)
      local lines = rq.read_lines(log)
      assert.equal(1, #lines)
      assert.matches("^" .. fine.id .. " ", lines[1])
      assert.equal(0, assert(q:job(late.id)).attempts)
    end)

    it("clears a backlog of expired jobs at once, and runs the jobs behind it", function()
      local name, log = rq.new_queue(), os.tmpname()
      local q = rq.new_producer(name)
      for _ = 1, 3000 do assert(q:add({ log = log }, { expire = 0.05 })) end
      local fresh = {}
      for i = 1, 5 do fresh[i] = assert(q:add({ echo = i })) end
      helpers.sleep(0.2)
      rq.pool(name, { size = 1 })
      for i = 1, 5 do assert.equal(i, assert(fresh[i]:wait(20)).echo) end
      assert.equal(3000, q:counts().failed)
      assert.equal(0, #rq.read_lines(log))
    end)

    it("also holds for a retry that would start after it", function()
      local name, log = rq.new_queue(), os.tmpname()
      local q = rq.new_producer(name)
      local j = assert(q:add({ log = log, fail_until = 3 }, { expire = 0.5, attempts = 3,
        backoff = { type = "fixed", delay = 1 } }))
      rq.pool(name, { size = 1 })
      local ok, err = j:wait(20)
      assert.is_nil(ok)
      assert.equal("EEXPIRED", err.code)
      assert.equal(1, #rq.read_lines(log))
    end)

    it("counts a retried job's expiry anew from the retry, so the retry runs", function()
      local name, log = rq.new_queue(), os.tmpname()
      local q = rq.new_producer(name)
      local ids = {}
      for i = 1, 4 do ids[i] = assert(q:add({ log = log, echo = i }, { id = "x" .. i, expire = 1 })).id end
      -- a job stored before the relative expiry was kept: its expire_at less its created
      q.client:call_wait({ "HDEL", q.prefix .. "j:x4", "expire_ms" })
      helpers.sleep(1.1)
      rq.pool(name, { size = 1 })
      assert(rq.wait_for(function() return q:counts().failed == 4 end), "the jobs did not expire")
      assert.equal("EEXPIRED", assert(q:job("x1")).error.code)
      local moonjob = rq.moonjob
      assert.equal("failed", assert(q:retry("x1")))
      local out, err, status = moonjob("retry --queue " .. name .. " x2")
      assert.equal(0, status, err)
      assert.matches('"was":"failed"', out)
      -- x3 and x4 by the bulk retry
      out, err, status = moonjob("retry --all --queue " .. name)
      assert.equal(0, status, err)
      assert.matches('"count":2', out)
      local function ended(id)
        local state = assert(q:job(id)).state
        return state == "completed" or state == "failed"
      end
      for _, id in ipairs(ids) do
        assert(rq.wait_for(function() return ended(id) end), id .. " did not end")
        local job = assert(q:job(id))
        assert.equal("completed", job.state, id .. ": " .. tostring(job.error and job.error.message))
        local f = q.client:call_wait({ "HMGET", q.prefix .. "j:" .. id, "expire_at", "run_at" })
        assert.equal(1000, tonumber(f[1]) - tonumber(f[2]), id .. ": the expiry counts from the retry")
      end
      assert.equal(4, #rq.read_lines(log))
    end)

    it("goes with a schedule's jobs", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      assert(q:schedule("s", { every = 1 }, { n = 1 }, { expire = 30 }))
      helpers.sleep(1.1)
      rq.poll(q)
      local jobs = assert(q:jobs("waiting"))
      assert.equal(1, #jobs)
      local at = q.client:call_wait({ "HGET", q.prefix .. "j:" .. jobs[1].id, "expire_at" })
      assert.is_true(tonumber(at) - jobs[1].created == 30000)
    end)
  end)

  it("refuses bad debounce and expire options and adds nothing", function()
    local name = rq.new_queue()
    local q = rq.new_producer(name)
    local function raises(pattern, opts)
      local ok, err = pcall(q.add, q, { n = 1 }, opts)
      assert.is_false(ok)
      assert.matches(pattern, err)
    end
    raises("option 'debounce' must be { id = text", { debounce = { id = "k" } })
    raises("option 'debounce' must be { id = text", { debounce = "k" })
    raises("option 'debounce' takes id and seconds, not 'ttl'", { debounce = { id = "k", seconds = 1, ttl = 2 } })
    raises("cannot go with it", { debounce = { id = "k", seconds = 1 }, id = "x" })
    raises("cannot go with it", { debounce = { id = "k", seconds = 1 }, delay = 1 })
    raises("option 'debounce.seconds' must be a number of seconds, more than 0", { debounce = { id = "k", seconds = 0 } })
    raises("option 'expire' must be a number of seconds, more than 0", { expire = -1 })
    local j, err = q:add({ n = 1 }, { expire = 1, delay = 2 })
    assert.is_nil(j)
    assert.equal("EINPUT", err.code)
    assert.matches("would expire before it may run", err.message)
    j, err = q:add({ n = 1 }, { expire = 1, debounce = { id = "k", seconds = 1 } })
    assert.is_nil(j)
    assert.matches("would expire before it may run", err.message)
    -- Redis refuses what another client may send
    local reply
    reply, err = q.client:call_wait({ "FCALL", "moonjob_add", 1, q.prefix, "x", "1", 0, 0, 1, "", 0, 0, "", 0, 0,
      "0", "", "", "", "k", "100" })
    assert.is_nil(reply)
    assert.matches("ID must be empty with DEBOUNCE_ID", err)
    reply, err = q.client:call_wait({ "FCALL", "moonjob_add", 1, q.prefix, "", "1", 0, 0, 1, "", 0, 0, "", 0, 0,
      "0", "", "", "", "k", "" })
    assert.is_nil(reply)
    assert.matches("DEBOUNCE_ID needs DEBOUNCE_MS", err)
    local c = q:counts()
    assert.equal(0, c.waiting + c.delayed)
    assert.equal(0, q.client:call_wait({ "EXISTS", q.prefix .. "debounce:k" }))
  end)
end)
