-- Limits across workers on a real Redis: a rate (a sliding window on the
-- server's clock), a concurrency cap counted in Redis, a processor's
-- ERATELIMIT holding the whole queue back without costing an attempt, and
-- bad input that changes nothing. Worker processes are real `moonjob worker`s.
local helpers = require "helpers"
local rq = require "redis_queue"
local counting = require "counting"
local most_in_window = counting.most_in_window

-- The fixture's spans (rq.spans), by their start.
local function spans(path)
  local out = rq.spans(path)
  table.sort(out, function(a, b) return a.start < b.start end)
  return out
end

local function settled(q, n)
  assert(rq.wait_for(function() return q:counts().completed == n end, 60), "the jobs did not all complete")
end

rq.describe(function()
  describe("limits across workers", function()
    it("max = 10 per 1 s over 2 workers: 50 jobs take 4 s or more, never 11 started in a second", function()
      local name, span = rq.new_queue(), os.tmpname()
      local q = rq.new_producer(name)
      assert(q:set_rate({ max = 10, per = 1 }))
      local began = helpers.wall_ms()
      for i = 1, 50 do assert(q:add({ span = span }, { id = "r" .. i })) end
      rq.start_worker(name, "-j 2")
      rq.start_worker(name, "-j 2")
      settled(q, 50)
      assert.is_true(helpers.wall_ms() - began >= 4000, "50 jobs at 10 a second took under 4 s")
      -- the server's clock, as fetch counted: exact for any closed window of 1 s
      local fetched = {}
      for i = 1, 50 do
        fetched[i] = tonumber(q.client:call_wait({ "HGET", q.prefix .. "j:r" .. i, "started" }))
      end
      assert.is_true(most_in_window(fetched, 1000) <= 10, "11 jobs handed out within one second")
      -- the processors' clocks: each job starts after its fetch, within `late`
      -- ms (on a loaded machine, more than a few): any window of 1 s less
      -- that holds at most 10 starts
      local starts, late = {}, 0
      for i, sp in ipairs(spans(span)) do
        starts[i] = sp.start
        local at = tonumber(q.client:call_wait({ "HGET", q.prefix .. "j:" .. sp.id, "started" }))
        assert.is_true(sp.start >= at - 5, "a job started before its fetch") -- (clock reads: ms apart)
        late = math.max(late, sp.start - at)
      end
      assert.equal(50, #starts)
      assert.is_true(late < 1000)
      assert.is_true(most_in_window(starts, 1000 - late - 1) <= 10, "11 jobs started within 1 s")
      local l = assert(q:limits())
      assert.same({ max = 10, per = 1 }, l.rate)
    end)

    it("set_concurrency(1) over 2 workers: never two running at once", function()
      local name, span = rq.new_queue(), os.tmpname()
      local q = rq.new_producer(name)
      assert(q:set_concurrency(1))
      for _ = 1, 8 do assert(q:add({ span = span, sleep = 0.1 })) end
      rq.start_worker(name, "-j 2")
      rq.start_worker(name, "-j 2")
      settled(q, 8)
      local list = spans(span)
      assert.equal(8, #list)
      for i = 2, #list do
        assert.is_true(list[i].start >= list[i - 1].finish, "two jobs overlapped: " .. list[i - 1].id .. " and "
          .. list[i].id)
      end
      assert.equal(1, assert(q:limits()).concurrency)
      -- the limit removed: the two workers run jobs side by side again
      assert(q:set_concurrency(nil))
      local span2 = os.tmpname()
      for _ = 1, 4 do assert(q:add({ span = span2, sleep = 0.3 })) end
      settled(q, 12)
      list = spans(span2)
      assert.is_true(list[2].start < list[1].finish, "no two jobs ran together without the limit")
    end)

    it("set_concurrency(4) over 2 workers of 2 children: 4 run at once, never 5", function()
      local name, span = rq.new_queue(), os.tmpname()
      local q = rq.new_producer(name)
      assert(q:set_concurrency(4))
      local _, log1 = rq.start_worker(name, "-j 2")
      local _, log2 = rq.start_worker(name, "-j 2")
      for _, l in ipairs({ log1, log2 }) do assert(rq.worker_connected(l), "a worker did not connect") end
      for _ = 1, 12 do assert(q:add({ span = span, sleep = 0.6 })) end
      settled(q, 12)
      local list = spans(span)
      local most = 0
      for _, a in ipairs(list) do -- jobs running when a started
        local n = 0
        for _, b in ipairs(list) do if b.start <= a.start and b.finish > a.start then n = n + 1 end end
        most = math.max(most, n)
      end
      assert.is_true(most <= 4, "more than 4 ran at once")
      assert.equal(4, most) -- one worker does not hold every place while its children are busy
    end)

    it("ERATELIMIT puts the job back without an attempt and holds the queue back", function()
      local name, log, flag = rq.new_queue(), os.tmpname(), os.tmpname()
      os.remove(flag)
      local q = rq.new_producer(name)
      local first = assert(q:add({ log = log, ratelimit_once = flag, retry_after = 1.5 }, { attempts = 1 }))
      local pool = rq.pool(name, { size = 2 })
      local held = 0
      assert(rq.wait_for(function()
        held = assert(q:limits()).held_back
        return held > 0
      end), "the queue is not held back")
      local at = helpers.wall_ms()
      assert.is_true(held <= 1.5)
      local other = assert(q:add({ log = log }))
      assert.truthy(assert(first:wait(20)))
      assert.truthy(assert(other:wait(20)))
      assert.is_true(helpers.wall_ms() - at >= (held - 0.1) * 1000, "the queue did not hold back")
      local job = assert(q:job(first.id))
      assert.equal("completed", job.state)
      assert.equal(1, job.attempts) -- the pushed-back run did not count
      assert.equal(3, #rq.read_lines(log))
      assert.equal(1, pool:stats().redis.rate_limited)
    end)

    it("refuses bad limits with a clear error and changes nothing", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      local function raises(pattern, fn, ...)
        local ok, err = pcall(fn, q, ...)
        assert.is_false(ok)
        assert.matches(pattern, err)
      end
      assert(q:set_rate({ max = 3, per = 2 }))
      raises("set_rate%(%): takes { max = N", q.set_rate, { max = 0, per = 1 })
      raises("set_rate%(%): takes { max = N", q.set_rate, { max = 10 })
      raises("set_rate%(%): takes { max = N", q.set_rate, { max = 10, per = 1, group = "a" })
      raises("set_rate%(%): takes { max = N", q.set_rate, 10)
      raises("set_concurrency%(%): takes a whole number", q.set_concurrency, 0)
      raises("set_concurrency%(%): takes a whole number", q.set_concurrency, 1.5)
      local reply, err = q.client:call_wait({ "FCALL", "moonjob_limit", 1, q.prefix, "speed", 10 })
      assert.is_nil(reply)
      assert.matches("KIND must be rate %(MAX PER_MS%), concurrency %(N%), group_rate %(MAX PER_MS%) or "
        .. "group_concurrency %(N%)", err)
      reply, err = q.client:call_wait({ "FCALL", "moonjob_limit", 1, q.prefix, "rate", 10, 0 })
      assert.is_nil(reply)
      assert.matches("PER_MS must be a whole number of ms from 1", err)
      reply, err = q.client:call_wait({ "FCALL", "moonjob_limit", 1, q.prefix, "rate", 10, "" })
      assert.is_nil(reply)
      assert.matches("rate takes 2 number%(s%), none empty", err)
      reply, err = q.client:call_wait({ "FCALL", "moonjob_ratelimited", 1, q.prefix, "x", "t", -5 })
      assert.is_nil(reply)
      assert.matches("RETRY_MS must be", err)
      assert.equal(0, q.client:call_wait({ "EXISTS", q.prefix .. "limited" }))
      assert.same({ rate = { max = 3, per = 2 }, held_back = 0, started = 0, active = 0,
        groups = { ready = 0, held_back = 0 } }, assert(q:limits()))
    end)

    it("are shown by moonjob status, with the schedules", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      assert(q:add({ n = 1 }))
      local function status(args)
        return helpers.sh(("%s scripts/moonjob status --queue %s --redis %s %s"):format(helpers.LUAJIT, name,
          rq.server().url, args or ""))
      end
      local out, err, code = status()
      assert.equal(0, code, err)
      assert.equal("waiting 1, delayed 0, running 0, held 0, completed 0, failed 0\n", out)
      assert(q:set_rate({ max = 10, per = 2 }))
      assert(q:set_concurrency(3))
      assert(q:schedule("nightly", { cron = "0 3 * * *" }))
      out, err, code = status()
      assert.equal(0, code, err)
      assert.matches("\nlimits: 10 jobs per 2 s %(0 in the current window%), 3 at once\n", out)
      assert.matches("\nschedules: 1; next: nightly at %d%d%d%d%-%d%d%-%d%dT03:00:00Z\n", out)
      out = status("--json")
      local t = require("moonjob.codec.json").decode(out)
      assert.same({ rate = { max = 10, per = 2 }, concurrency = 3, held_back = 0 }, t.limits)
      assert.equal(1, t.schedules)
      assert.equal("nightly", t.next_schedule.id)
    end)

    it("takes a limits key of another type as none, and set_rate replaces it", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      q.client:call_wait({ "SET", q.prefix .. "limits", "x" })
      local j = assert(q:add({ echo = 1 }))
      rq.pool(name, { size = 1 })
      assert.equal(1, assert(j:wait(20)).echo)
      assert(q:set_rate({ max = 5, per = 2 }))
      assert.same({ max = 5, per = 2 }, assert(q:limits()).rate)
      -- a starts key of another type is replaced, and the limit holds
      q.client:call_wait({ "SET", q.prefix .. "starts", "x" })
      local k = assert(q:add({ echo = 2 }))
      assert.equal(2, assert(k:wait(20)).echo)
      -- obliterate takes the limits with the queue
      assert(q:obliterate())
      assert.equal(0, q.client:call_wait({ "EXISTS", q.prefix .. "limits", q.prefix .. "starts" }))
    end)
  end)
end)
