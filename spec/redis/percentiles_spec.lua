-- Run-time percentiles on Redis: jobs of known run times (real workers
-- that sleep a fixed time, and run times a worker reports through
-- moonjob_complete, from 2 ms to 10 min) read back by q:metrics() within
-- 10% of the true value; the ends shown as bounds; the old call's coarse
-- reply still well-formed; one set of `le`s on every /metrics.
local dashboard = require "moonjob.dashboard"
local http = require "dashboard_http"
local prom = require "prometheus_text"
local rq = require "redis_queue"
local fetch_ids = require("held_groups").fetch

-- The true q-th quantile of a list of ms (nearest rank, as the estimate's rank).
local function true_quantile(list, q)
  table.sort(list)
  return list[math.max(1, math.ceil(q * #list))]
end

local function assert_near(want, got, what)
  assert.is_number(got, what .. ": no value")
  assert.is_true(math.abs(got / want - 1) <= 0.10, ("%s: %.4g ms, the true value %.4g ms"):format(what, got, want))
end

local function assert_percentiles(row, runs)
  for _, p in ipairs({ { "p50", 0.5 }, { "p90", 0.9 }, { "p99", 0.99 } }) do
    assert_near(true_quantile(runs, p[2]), row[p[1] .. "_ms"], p[1])
    assert.is_nil(row[p[1] .. "_bound"], p[1] .. " is a value, not a bound")
  end
end

-- Jobs added and completed by hand, each with the run time its worker says
-- (moonjob_complete after "\0ms": id, token, result, run ms).
local function complete_with(q, runs)
  for i = 1, #runs do assert(q:add({ n = i })) end
  local _, reply = fetch_ids(q, #runs)
  local args = { "FCALL", "moonjob_complete", 1, q.prefix, "\0ms" }
  for i = 2, #reply do
    for _, v in ipairs({ reply[i][1], reply[i][2], "1", runs[i - 1] }) do args[#args + 1] = v end
  end
  local said = assert(q.client:call_wait(args))
  assert.equal(#runs, #said)
end

local function le_set(text, family, label, value)
  local set = {}
  for _, s in ipairs(prom.parse(text).samples) do
    if s.name == family .. "_bucket" and s.labels[label] == value then set[#set + 1] = s.labels.le end
  end
  return set
end

rq.describe(function()
  describe("run-time percentiles", function()
    it("of jobs that sleep 20 ms and 1 s, on real workers, are within 10% of their run times", function()
      for _, case in ipairs({ { sleep = 0.02, n = 40, size = 4 }, { sleep = 1, n = 6, size = 6 } }) do
        local name = rq.new_queue()
        local q = rq.new_producer(name)
        local jobs = {}
        for i = 1, case.n do jobs[i] = assert(q:add({ sleep = case.sleep })) end
        rq.pool(name, { size = case.size })
        for _, j in ipairs(jobs) do assert(j:wait(30)) end
        local runs = {}
        for _, j in ipairs(assert(q:jobs("completed", { limit = 100 }))) do runs[#runs + 1] = j.ms end
        assert.equal(case.n, #runs)
        assert_percentiles(assert(q:metrics({ minutes = 1 })).total, runs)
      end
    end)

    it("of run times a worker reports, from 2 ms to 10 min, are within 10%, and each minute's too", function()
      for _, ms in ipairs({ 2, 3, 7, 20, 150, 999, 1000, 7000, 45000, 600000 }) do
        local q = rq.new_producer(rq.new_queue())
        local runs = {}
        for i = 1, 20 do runs[i] = ms end
        complete_with(q, runs)
        local m = assert(q:metrics({ minutes = 2 }))
        assert_percentiles(m.total, runs)
        local row = m.minutes[#m.minutes].runs > 0 and m.minutes[#m.minutes] or m.minutes[1]
        assert_percentiles(row, runs)
      end
      -- a spread: 10, 20, ... 1000 ms
      local q = rq.new_producer(rq.new_queue())
      local runs = {}
      for i = 1, 100 do runs[i] = 10 * i end
      complete_with(q, runs)
      assert_percentiles(assert(q:metrics({ minutes = 1 })).total, runs)
    end)

    it("says a bound where there is no value: 1 ms or less, more than 17.5 min", function()
      local q = rq.new_producer(rq.new_queue())
      complete_with(q, { 0, 1, 1, 1, 1, 2000000, 2000000, 2000000, 2000000, 2000000 })
      local t = assert(q:metrics({ minutes = 1 })).total
      assert.same({ 1, "below" }, { t.p50_ms, t.p50_bound })
      assert.same({ 1048.576, "above" }, { t.p90_ms / 1000, t.p90_bound })
      assert.equal("above", t.p99_bound)
    end)

    it("answers a client before the fine buckets in its coarse layout, folded", function()
      local q = rq.new_producer(rq.new_queue())
      complete_with(q, { 3, 20, 20, 700, 400000 })
      local reply = assert(q.client:call_wait({ "FCALL", "moonjob_metrics", 1, q.prefix, 1 }))
      assert.same({ 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 300000 }, { unpack(reply[2]) })
      for _, row in ipairs({ reply[3], reply[4] }) do
        assert.same({ 5, 0, 5, 400743, 1, 0, 2, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1 }, { unpack(row) })
      end
      local _, err = q.client:call_wait({ "FCALL", "moonjob_metrics", 1, q.prefix, 1, "coarse" })
      assert.matches("EINPUT moonjob_metrics: LAYOUT", tostring(err), 1, true)
    end)

    it("reads the coarse buckets a library of version 10 or before wrote, each as the fine bucket of its bound", function()
      local q = rq.new_producer(rq.new_queue())
      complete_with(q, { 20 })
      q.client:call_wait({ "HSET", q.prefix .. "m:all", "n", 11, "h3", 10 }) -- 10 runs of 10 to 25 ms
      local t = assert(q:metrics({ minutes = 1 })).total
      assert.equal(11, t.runs)
      assert_near(25, t.p50_ms, "p50")
    end)

    it("writes the same buckets on a worker's and the dashboard's /metrics, which promtool accepts", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      local job = assert(q:add({ sleep = 0.02 }))
      local pool = rq.pool(name, { size = 1 })
      assert(job:wait(20))
      local server = assert(dashboard.start({ redis = rq.server().url, listen = "127.0.0.1:0" }))
      local status, text = http(server, "GET", "/metrics")
      server:close()
      assert.equal(200, status, text)
      local worker_text = pool:metrics()
      local from_dashboard = le_set(text, "moonjob_queue_job_duration_seconds", "queue", name)
      local from_worker = le_set(worker_text, "moonjob_job_duration_seconds", "pool", "remote")
      assert.is_true(#from_worker > 100, #from_worker .. " buckets")
      assert.same(from_worker, from_dashboard)
      assert.equal("0.001", from_worker[1])
      assert.equal("1048.576", from_worker[#from_worker - 1])
      assert.equal("+Inf", from_worker[#from_worker])
      local code, said = prom.promtool_check(text)
      assert.equal(0, code, said)
      code, said = prom.promtool_check(worker_text)
      assert.equal(0, code, said)
    end)
  end)
end)
