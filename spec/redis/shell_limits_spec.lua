-- A queue's limits, debounce, expiry, groups, drain and obliterate from the
-- shell, on a real Redis: `moonjob limit` and `moonjob limits` round trip
-- through q:limits, bad values are usage errors (exit 2) that write
-- nothing; `moonjob add --debounce --expire --group` shows in the jobs;
-- `moonjob drain` says how many it removed; `moonjob obliterate` is refused
-- without --yes, and refused while jobs run unless --force.
local rq = require "redis_queue"

local moonjob, ndjson = rq.moonjob, require("cli").ndjson

rq.describe(function()
  describe("moonjob limit and limits", function()
    it("set each limit, show them back, clear one with none and all with --clear", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      assert(q:add({ n = 1 }, { delay = 3600 }))
      local out, err, status = moonjob(("limit --queue %s --rate 100/s --concurrency 5000 --group-rate 10/1m "
        .. "--group-concurrency 2"):format(name))
      assert.equal(0, status, err)
      local l = assert(q:limits())
      assert.same({ max = 100, per = 1 }, l.rate)
      assert.equal(5000, l.concurrency)
      assert.same({ max = 10, per = 60 }, l.group_rate)
      assert.equal(2, l.group_concurrency)
      local shown = ndjson(out)[1]
      assert.same({ max = 100, per = 1 }, shown.rate)
      assert.equal(name, shown.queue)
      out, err, status = moonjob(("limits --queue %s --json"):format(name))
      assert.equal(0, status, err)
      shown = ndjson(out)[1]
      assert.same({ max = 10, per = 60 }, shown.group_rate)
      assert.equal(5000, shown.concurrency)
      assert.equal(2, shown.group_concurrency)
      -- a fraction spaces starts evenly; none lifts one limit, the others stay
      _, err, status = moonjob(("limit --queue %s --rate 0.5/s --group-rate none"):format(name))
      assert.equal(0, status, err)
      l = assert(q:limits())
      assert.same({ max = 1, per = 2 }, l.rate)
      assert.is_nil(l.group_rate)
      assert.equal(5000, l.concurrency)
      _, err, status = moonjob(("limit --queue %s --rate 3/250ms --concurrency none"):format(name))
      assert.equal(0, status, err)
      l = assert(q:limits())
      assert.same({ max = 3, per = 0.25 }, l.rate)
      assert.is_nil(l.concurrency)
      _, err, status = moonjob(("limit --queue %s --clear"):format(name))
      assert.equal(0, status, err)
      l = assert(q:limits())
      assert.is_nil(l.rate)
      assert.is_nil(l.concurrency)
      assert.is_nil(l.group_rate)
      assert.is_nil(l.group_concurrency)
    end)

    it("refuses bad values and a limit with nothing to set as usage errors, writing nothing", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      assert(q:add({ n = 1 }, { delay = 3600 }))
      assert(q:set_concurrency(7))
      for _, case in ipairs({
        { "--rate 0/s", "%-%-rate needs" }, { "--rate fast", "%-%-rate needs" }, { "--rate 10/d", "%-%-rate needs" },
        { "--concurrency 0", "%-%-concurrency needs" }, { "--concurrency 1.5", "%-%-concurrency needs" },
        { "--group-concurrency -3", "%-%-group%-concurrency needs" }, { "--group-rate 10/0s", "%-%-group%-rate needs" },
        { "--rate 10/s --concurrency x", "%-%-concurrency needs" },
        { "-j 4", "%-j is for moonjob run and worker" },
        { "", "moonjob limit needs %-%-rate, %-%-concurrency, %-%-group%-rate, %-%-group%-concurrency or %-%-clear" },
      }) do
        local out, err, status = moonjob(("limit --queue %s %s"):format(name, case[1]))
        assert.equal(2, status, case[1] .. ": " .. err)
        assert.equal("", out)
        assert.matches(case[2], err)
      end
      local l = assert(q:limits())
      assert.is_nil(l.rate)
      assert.equal(7, l.concurrency)
      local _, err, status = moonjob("limit --queue no-such-q --rate 5/s")
      assert.equal(1, status)
      assert.matches("no such queue", err)
      -- run's own --concurrency keeps its bound of 1024 children
      _, err, status = moonjob("worker spec/fixtures/remote.lua --queue " .. name .. " --concurrency 5000")
      assert.equal(2, status)
      assert.matches("%-%-concurrency needs a whole number from 1 to 1024", err)
      _, err, status = moonjob("status --queue " .. name .. " --group-rate 5/s")
      assert.equal(2, status)
      assert.matches("%-%-group%-rate is for moonjob limit", err)
    end)
  end)

  describe("moonjob add's job options", function()
    it("--debounce joins lines into one delayed job, --expire and --group land in the job", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      local out, err, status = moonjob("add --queue " .. name .. " --debounce user:7:30", '{"n":1}\n{"n":2}\n')
      assert.equal(0, status, err)
      local ids = {}
      for id in out:gmatch("[^\n]+") do ids[#ids + 1] = id end
      assert.equal(2, #ids)
      assert.equal(ids[1], ids[2]) -- the second line joined the first one's job
      local job = assert(q:job(ids[1]))
      assert.equal("delayed", job.state)
      assert.same({ n = 2 }, job.data)
      assert.near(job.created + 30000, job.run_at, 2000)
      assert.equal(1, q:counts().delayed)
      out, err, status = moonjob("add --queue " .. name .. " --expire 60 --group acme", '{"n":3}\n')
      assert.equal(0, status, err)
      local id = out:match("[^\n]+")
      local f = q.client:call_wait({ "HMGET", q.prefix .. "j:" .. id, "expire_at", "group", "created" })
      assert.near(tonumber(f[3]) + 60000, tonumber(f[1]), 1000)
      assert.equal("acme", f[2])
      local groups = assert(q:groups())
      assert.equal("acme", groups[1].group)
      for _, bad in ipairs({ "--debounce 30", "--debounce x:0", "--debounce :5", "--expire 0",
          "--debounce k:5 --delay 3", "--debounce k:5 --dedupe" }) do
        out, err, status = moonjob("add --queue " .. name .. " " .. bad, '{"n":9}\n')
        assert.equal(2, status, bad .. ": " .. err)
        assert.equal("", out)
      end
      assert.equal(2, q:counts().waiting + q:counts().delayed)
    end)
  end)

  describe("moonjob drain and obliterate", function()
    it("drain removes the waiting and delayed jobs and says how many", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      for i = 1, 5 do assert(q:add({ n = i })) end
      for i = 1, 3 do assert(q:add({ n = i }, { delay = 3600 })) end
      local out, err, status = moonjob("drain --queue " .. name)
      assert.equal(0, status, err)
      assert.same({ action = "drain", count = 8, queue = name }, ndjson(out)[1])
      local c = q:counts()
      assert.same({ 0, 0 }, { c.waiting, c.delayed })
    end)

    it("obliterate needs --yes, is refused while jobs run unless --force, and removes the queue", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      for i = 1, 3 do assert(q:add({ n = i })) end
      local out, err, status = moonjob("obliterate --queue " .. name)
      assert.equal(2, status)
      assert.equal("", out)
      assert.matches("removes queue " .. name .. " and every job in it for good: add %-%-yes", err)
      assert.equal(3, q:counts().waiting)
      local running = assert(q:add({ sleep = 30 }))
      rq.pool(name, { size = 1 })
      assert(rq.wait_for(function() return running:get().state == "active" end), "the job started")
      out, err, status = moonjob("obliterate --yes --queue " .. name)
      assert.equal(1, status)
      assert.matches("refused: %d job%(s%) are active.*%-%-force", err)
      assert.is_true(q:counts().exists)
      out, err, status = moonjob("obliterate --yes --force --queue " .. name)
      assert.equal(0, status, err)
      assert.equal(name, ndjson(out)[1].queue)
      assert.equal("obliterate", ndjson(out)[1].action)
      local _, _, listed = moonjob("queues")
      assert.equal(0, listed)
      assert.is_false(q:counts().exists)
      out = moonjob("queues")
      assert.is_nil(out:find('"name":"' .. name .. '"', 1, true))
    end)
  end)
end)
