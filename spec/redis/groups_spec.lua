-- Groups on a real Redis: jobs added with a group are handed out
-- round-robin between groups (within a priority), each group under its own
-- rate and concurrency cap, a job's ERATELIMIT holding back only its group;
-- and the indexes behind it (functions/groups.lua) kept true through
-- remove, cancel, drain, obliterate and the switch between a plain queue
-- and one with groups. Worker processes are real `moonjob worker`s.
local helpers = require "helpers"
local rq = require "redis_queue"

local spans = rq.spans

local function settled(q, n, seconds)
  assert(rq.wait_for(function() return q:counts().completed == n end, seconds or 60),
    "the jobs did not all complete")
end

local fetch_ids = require("held_groups").fetch
local counting = require "counting"
local most_at_once = counting.most_at_once

local function exists(q, key) return q.client:call_wait({ "EXISTS", q.prefix .. key }) == 1 end

rq.describe(function()
  describe("groups", function()
    it("1,000 jobs of A then 10 of B over 2 workers: B's 10 are done before A's 100th", function()
      local name, span = rq.new_queue(), os.tmpname()
      local q = rq.new_producer(name)
      for i = 1, 1000 do assert(q:add({ span = span }, { id = "a" .. i, group = "A" })) end
      for i = 1, 10 do assert(q:add({ span = span }, { id = "b" .. i, group = "B" })) end
      rq.start_worker(name, "-j 2")
      rq.start_worker(name, "-j 2")
      settled(q, 1010)
      local a_done, b_done, b_last, a_100th = 0, 0, nil, nil
      for i, sp in ipairs(spans(span)) do
        if sp.id:sub(1, 1) == "a" then
          a_done = a_done + 1
          if a_done == 100 then a_100th = i end
        else
          b_done = b_done + 1
          b_last = i
        end
      end
      assert.equal(1000, a_done)
      assert.equal(10, b_done)
      assert.is_true(b_last < a_100th, ("B's last job was done %dth, A's 100th %dth"):format(b_last, a_100th))
      -- the groups are gone with their jobs: the queue is a plain one again
      assert.is_false(exists(q, "groups"))
      assert.is_false(exists(q, "gw:A"))
      assert.is_false(exists(q, "ga:A"))
    end)

    it("takes turns between groups within a priority, and the best priority first", function()
      local q = rq.new_producer(rq.new_queue())
      for i = 1, 4 do assert(q:add({ n = i }, { id = "a" .. i, group = "A" })) end
      for i = 1, 2 do assert(q:add({ n = i }, { id = "b" .. i, group = "B" })) end
      for i = 1, 2 do assert(q:add({ n = i }, { id = "u" .. i })) end -- no group: one more turn
      assert(q:add({ n = 0 }, { id = "urgent", group = "C", priority = -1 }))
      assert.same({ "urgent", "a1", "b1", "u1", "a2", "b2", "u2", "a3", "a4" }, (fetch_ids(q, 20)))
    end)

    it("a better priority goes first also behind more groups than a fetch walks", function()
      local q = rq.new_producer(rq.new_queue())
      for i = 1, 100 do assert(q:add({ n = i }, { id = "j" .. i, group = "g" .. i })) end
      assert(q:add({ n = 0 }, { id = "urgent", group = "H", priority = -1 }))
      local ids = fetch_ids(q, 3)
      assert.same({ "urgent", "j1", "j2" }, ids)
    end)

    it("a fetch reaches the groups that may take a job past more groups at their cap than it walks", function()
      local q = rq.new_producer(rq.new_queue())
      assert(q:set_group_concurrency(1))
      for i = 1, 100 do
        for k = 1, 2 do assert(q:add({ n = i }, { id = "j" .. i .. "." .. k, group = "g" .. i })) end
      end
      assert.equal(100, #(fetch_ids(q, 100))) -- one of each group: all at their cap now
      assert(q:add({ n = 0 }, { id = "free1", group = "free" }))
      local got = fetch_ids(q, 5)
      assert.same({ "free1" }, got)
    end)

    it("a queue with no group waiting keeps no index; the first grouped job starts one, and all run", function()
      local q = rq.new_producer(rq.new_queue())
      for i = 1, 3 do assert(q:add({ n = i }, { id = "u" .. i })) end
      assert.is_false(exists(q, "ungrouped"))
      assert.is_false(exists(q, "groups"))
      assert(q:add({ n = 1 }, { id = "g1", group = "G" }))
      assert.equal(3, q.client:call_wait({ "ZCARD", q.prefix .. "ungrouped" })) -- wait copied at the switch
      assert(q:add({ n = 4 }, { id = "u4" }))
      local ids = fetch_ids(q, 2)
      assert.same({ "u1", "g1" }, ids)
      assert.same({ "u2", "u3", "u4" }, (fetch_ids(q, 10)))
      assert.is_false(exists(q, "groups"))
      assert.is_false(exists(q, "ungrouped"))
      assert(q:add({ n = 5 }, { id = "u5" })) -- plain again: no index
      assert.is_false(exists(q, "ungrouped"))
      assert.same({ "u5" }, (fetch_ids(q, 10)))
    end)

    it("remove, cancel and drain take grouped jobs out of their group; obliterate deletes the groups", function()
      local q = rq.new_producer(rq.new_queue())
      for i = 1, 3 do assert(q:add({ n = i }, { id = "a" .. i, group = "A" })) end
      for i = 1, 2 do assert(q:add({ n = i }, { id = "u" .. i })) end
      assert(q:remove("a1"))
      assert(q:cancel("u1"))
      assert(q:add({ n = 1 }, { id = "c1", group = "C" }))
      assert(q:cancel("c1")) -- its group's last waiting job: the group goes
      local listed = {}
      for _, g in ipairs(assert(q:groups())) do listed[#listed + 1] = g.group .. " " .. g.state .. " " .. g.waiting end
      assert.same({ "A ready 2" }, listed)
      assert.equal(1, assert(q:limits()).groups.ready)
      assert.equal(2, q.client:call_wait({ "ZCARD", q.prefix .. "gw:A" }))
      assert.equal(1, q.client:call_wait({ "ZCARD", q.prefix .. "ungrouped" }))
      assert.same({ "a2", "u2", "a3" }, (fetch_ids(q, 10)))
      for i = 4, 6 do assert(q:add({ n = i }, { id = "a" .. i, group = "A" })) end
      assert(q:drain())
      assert.is_false(exists(q, "gw:A"))
      assert.is_false(exists(q, "groups"))
      assert(q:add({ n = 7 }, { id = "a7", group = "A" }))
      assert(q:set_group_concurrency(5))
      assert(q:obliterate({ force = true }))
      local left = q.client:call_wait({ "KEYS", q.prefix .. "*" })
      assert.same({ q.prefix .. "tokens" }, { unpack(left) })
    end)

    it("set_group_concurrency(1) over 2 workers: never two jobs of a group at once, groups side by side", function()
      local name, span = rq.new_queue(), os.tmpname()
      local q = rq.new_producer(name)
      assert(q:set_group_concurrency(1))
      for i = 1, 6 do assert(q:add({ span = span, sleep = 0.15 }, { id = "a" .. i, group = "A" })) end
      for i = 1, 6 do assert(q:add({ span = span, sleep = 0.15 }, { id = "b" .. i, group = "B" })) end
      rq.start_worker(name, "-j 2")
      rq.start_worker(name, "-j 2")
      settled(q, 12)
      local by_group = { a = {}, b = {} }
      for _, sp in ipairs(spans(span)) do table.insert(by_group[sp.id:sub(1, 1)], sp) end
      assert.equal(1, most_at_once(by_group.a), "two jobs of group A ran at once")
      assert.equal(1, most_at_once(by_group.b), "two jobs of group B ran at once")
      assert.equal(2, most_at_once(spans(span)), "the groups did not run side by side")
      assert.equal(1, assert(q:limits()).group_concurrency)
    end)

    it("set_group_rate(5 per 1 s): a busy group is spaced out, another group is not held up by it", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      assert(q:set_group_rate({ max = 5, per = 1 }))
      for i = 1, 15 do assert(q:add({ n = i }, { id = "a" .. i, group = "A" })) end
      for i = 1, 5 do assert(q:add({ n = i }, { id = "b" .. i, group = "B" })) end
      rq.start_worker(name, "-j 2")
      settled(q, 20)
      local function started(prefix, n)
        local t = {}
        for i = 1, n do t[i] = tonumber(q.client:call_wait({ "HGET", q.prefix .. "j:" .. prefix .. i, "started" })) end
        table.sort(t)
        return t
      end
      local a, b = started("a", 15), started("b", 5)
      for i = 6, 15 do -- the server's clock, as fetch counted: never 6 of A in a closed second
        assert.is_true(a[i] - a[i - 5] > 1000, "6 jobs of group A handed out within one second")
      end
      assert.is_true(a[15] - a[1] > 2000, "15 jobs of A at 5 a second took under 2 s")
      assert.is_true(b[5] - a[1] < 1000, "group B waited behind group A's rate")
      assert.same({ max = 5, per = 1 }, assert(q:limits()).group_rate)
    end)

    it("ERATELIMIT in a job of a group holds back that group only, without costing an attempt", function()
      local name, log, flag = rq.new_queue(), os.tmpname(), os.tmpname()
      os.remove(flag)
      local q = rq.new_producer(name)
      local first = assert(q:add({ log = log, ratelimit_once = flag, retry_after = 2 },
        { id = "a1", group = "A" }))
      local pool = rq.pool(name, { size = 2 })
      local held
      assert(rq.wait_for(function()
        held = assert(q:groups())[1]
        return held and held.state == "held"
      end), "group A is not held back")
      local at = helpers.wall_ms()
      assert.equal("A", held.group)
      assert.equal(1, held.waiting)
      assert.is_true(held.seconds > 0 and held.seconds <= 2)
      assert.same({ ready = 0, held_back = 1 }, assert(q:limits()).groups)
      assert.equal(0, assert(q:limits()).held_back) -- the queue itself is not held back
      local a2 = assert(q:add({ log = log }, { id = "a2", group = "A" }))
      local b1 = assert(q:add({ log = log }, { id = "b1", group = "B" }))
      local u1 = assert(q:add({ log = log }, { id = "u1" }))
      assert.truthy(assert(b1:wait(20)))
      assert.truthy(assert(u1:wait(20)))
      assert.is_true(helpers.wall_ms() - at < (held.seconds - 0.2) * 1000, "B waited for A's hold")
      assert.equal("waiting", assert(q:job("a2")).state)
      assert.truthy(assert(first:wait(20)))
      assert.truthy(assert(a2:wait(20)))
      assert.is_true(helpers.wall_ms() - at >= (held.seconds - 0.1) * 1000, "group A did not hold back")
      assert.equal(1, assert(q:job("a1")).attempts) -- the pushed-back run did not count
      assert.equal(1, pool:stats().redis.rate_limited)
    end)

    it("moonjob add --group and schedule add --group give the jobs their group", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      local input = helpers.write_file(os.tmpname(), '{"n":1}\n{"n":2}\n')
      finally(function() os.remove(input) end)
      local cli = ("%s scripts/moonjob %%s --redis %s --queue %s "):format(helpers.LUAJIT, rq.server().url, name)
      local out, err, code = helpers.sh(cli:format("add") .. "--group tenant-7 " .. input)
      assert.equal(0, code, err)
      local ids = {}
      for id in out:gmatch("[^\n]+") do ids[#ids + 1] = id end
      assert.equal(2, #ids)
      for _, id in ipairs(ids) do
        assert.equal("tenant-7", q.client:call_wait({ "HGET", q.prefix .. "j:" .. id, "group" }))
      end
      out, err, code = helpers.sh(cli:format("schedule add") .. "tick --every 1 --group tenant-8")
      assert.equal(0, code, err)
      assert(rq.wait_for(function()
        rq.poll(q)
        return q.client:call_wait({ "EXISTS", q.prefix .. "gw:tenant-8" }) == 1
      end), "the schedule's job is not in its group")
      _, err, code = helpers.sh(cli:format("add") .. "--group '' " .. input)
      assert.equal(2, code)
      assert.matches("%-%-group needs a name: a group's name of 1 to 1024 bytes", err)
    end)

    it("a group at its cap whose running job was lost takes its next job once that job's lease ends", function()
      local q = rq.new_producer(rq.new_queue())
      assert(q:set_group_concurrency(1))
      for i = 1, 2 do assert(q:add({ n = i }, { id = "a" .. i, group = "A" })) end
      assert.same({ "a1" }, (fetch_ids(q, 5, 400)))
      local ids, reply = fetch_ids(q, 5, 400)
      assert.same({}, ids) -- A is at its cap: parked until a1's lease ends
      assert.is_true(reply[1] > 0 and reply[1] <= 401, "when to look again: " .. tostring(reply[1]))
      q.client:call_wait({ "DEL", q.prefix .. "j:a1" }) -- lost (evicted, deleted by hand): it never leaves active
      helpers.sleep(0.5)
      assert.same({ "a2" }, (fetch_ids(q, 5)))
    end)

    it("a fetch that may take nothing still takes back the groups whose time came: no busy polling", function()
      local q = rq.new_producer(rq.new_queue())
      assert(q:set_group_rate({ max = 1, per = 0.2 }))
      for i = 1, 2 do assert(q:add({ n = i }, { id = "a" .. i, group = "A" })) end
      assert(q:add({ n = 0 }, { id = "u1" }))
      assert.same({ "a1", "u1" }, (fetch_ids(q, 5))) -- A's window is full: parked 200 ms
      assert.equal("rate", assert(q:groups())[1].state)
      helpers.sleep(0.3)
      local ids, reply = fetch_ids(q, 5, nil, 0) -- no idle child: under group limits it takes nothing
      assert.same({}, ids)
      assert.is_true(reply[1] ~= 0, "a fetch that takes nothing said to look again at once")
      assert.same({ ready = 1, held_back = 0 }, assert(q:limits()).groups)
    end)

    it("a group limit lifted lets the groups it parked go at once; a group key of another type is replaced", function()
      local q = rq.new_producer(rq.new_queue())
      assert(q:set_group_rate({ max = 1, per = 3600 }))
      for i = 1, 2 do assert(q:add({ n = i }, { id = "a" .. i, group = "A" })) end
      assert.same({ "a1" }, (fetch_ids(q, 5)))
      assert.equal("rate", assert(q:groups())[1].state)
      assert(q:set_group_rate(nil))
      assert.same({ "a2" }, (fetch_ids(q, 5)))
      q.client:call_wait({ "SET", q.prefix .. "gw:B", "x" })
      assert(q:add({ n = 1 }, { id = "b1", group = "B" }))
      assert.same({ "b1" }, (fetch_ids(q, 5)))
      q.client:call_wait({ "SET", q.prefix .. "groups", "x" }) -- the ring, of another type: replaced as C joins it
      assert(q:add({ n = 1 }, { id = "c1", group = "C" }))
      assert.same({ "c1" }, (fetch_ids(q, 5)))
    end)

    it("every way back to waiting keeps a job in its group, and frees its group's place", function()
      local q = rq.new_producer(rq.new_queue())
      assert(q:set_group_concurrency(1))
      local function call(...) return assert(q.client:call_wait({ "FCALL", ... })) end
      local function active_of_a() return q.client:call_wait({ "SCARD", q.prefix .. "ga:A" }) end
      -- the one place of A, taken and given back each way; each time the
      -- job comes back through A's turn and takes the place again
      assert(q:add({ n = 1 }, { id = "a1", group = "A", attempts = 10 }))
      local _, reply = fetch_ids(q, 5, 300)
      assert.equal(1, active_of_a())
      helpers.sleep(0.4) -- its lease ends: recovered (ESTALLED) at the next fetch, and taken again
      local ids
      ids, reply = fetch_ids(q, 5)
      assert.same({ "a1" }, ids)
      assert.equal(1, active_of_a())
      assert.equal("OK", call("moonjob_release", 1, q.prefix, "a1", reply[2][2]))
      assert.equal(0, active_of_a())
      ids, reply = fetch_ids(q, 5)
      assert.same({ "a1" }, ids)
      assert.equal("waiting", call("moonjob_fail", 1, q.prefix, "a1", reply[2][2], '{"code":"E"}', 0))
      ids, reply = fetch_ids(q, 5)
      assert.same({ "a1" }, ids)
      assert.equal("failed", call("moonjob_fail", 1, q.prefix, "a1", reply[2][2], '{"code":"E"}', -1))
      assert.equal(0, active_of_a())
      assert(q:retry("a1"))
      assert.same({ "a1" }, (fetch_ids(q, 5)))
      -- a delayed job promoted, and a debounced job whose last add changed its group
      assert(q:add({ n = 2 }, { id = "b1", group = "B", delay = 60 }))
      assert(q:promote("b1"))
      assert(q:add({ n = 3 }, { group = "C", debounce = { id = "d", seconds = 0.2 } }))
      assert(q:add({ n = 4 }, { group = "D", debounce = { id = "d", seconds = 0.2 } }))
      helpers.sleep(0.3)
      ids, reply = fetch_ids(q, 5)
      assert.equal(2, #ids)
      assert.same({ "B", "D" }, { reply[2][10], reply[3][10] }) -- A is at its cap: a1 runs
      assert.is_false(exists(q, "gw:C"))
      -- a job canceled while it ran, then pushed back (ERATELIMIT): it fails,
      -- and its group, with no job waiting, is not listed as held back
      assert(q:add({ n = 5 }, { id = "e1", group = "E" }))
      ids, reply = fetch_ids(q, 5)
      assert.same({ "e1" }, ids)
      assert(q:cancel("e1"))
      assert.equal("OK", call("moonjob_ratelimited", 1, q.prefix, "e1", reply[2][2], 5000))
      assert.equal("failed", assert(q:job("e1")).state)
      for _, g in ipairs(assert(q:groups())) do assert.is_not.equal("E", g.group) end
    end)

    it("refuses bad group limits and options with a clear error and changes nothing", function()
      local q = rq.new_producer(rq.new_queue())
      local function raises(pattern, fn, ...)
        local ok, err = pcall(fn, q, ...)
        assert.is_false(ok)
        assert.matches(pattern, err)
      end
      assert(q:set_group_rate({ max = 3, per = 2 }))
      assert(q:set_group_concurrency(2))
      raises("set_group_rate%(%): takes { max = N", q.set_group_rate, { max = 0, per = 1 })
      raises("set_group_rate%(%): takes { max = N", q.set_group_rate, { max = 3, per = 1, burst = 5 })
      raises("set_group_concurrency%(%): takes a whole number", q.set_group_concurrency, 0)
      raises("option 'group' must be a name of 1 to 1024 bytes", q.add, { n = 1 }, { group = "" })
      raises("option 'group' must be a name of 1 to 1024 bytes", q.add, { n = 1 }, { group = 42 })
      raises("unknown option 'groups'", q.add, { n = 1 }, { groups = "A" })
      raises("queue:groups%(%): takes nil or { limit = n }", q.groups, { limit = 0 })
      local reply, err = q.client:call_wait({ "FCALL", "moonjob_limit", 1, q.prefix, "group_rate", 3, "" })
      assert.is_nil(reply)
      assert.matches("group_rate takes 2 number%(s%), none empty", err)
      local l = assert(q:limits())
      assert.same({ max = 3, per = 2 }, l.group_rate)
      assert.equal(2, l.group_concurrency)
      assert.equal(0, q:counts().waiting)
      assert(q:set_group_rate(nil))
      assert(q:set_group_concurrency(nil))
      l = assert(q:limits())
      assert.is_nil(l.group_rate)
      assert.is_nil(l.group_concurrency)
    end)
  end)
end)
