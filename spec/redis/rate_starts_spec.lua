-- A Redis rate as the processor sees it: at most `max` jobs start in any
-- window of `per`, by the processors' own clock, whatever lies between a
-- job's hand-out and its start: children still loading their processor,
-- children restarting after each job, several workers. The processor
-- (fixtures/rate_starts.lua) logs each start on CLOCK_MONOTONIC, the same
-- clock in every process of the host; its twin rate_starts_slow_load.lua
-- takes 150 ms to load. Each job must start once and complete.
--
-- Tolerance: a window counts the starts within `per` less TOLERANCE_MS.
-- The worker sends a job to an idle child within the rate's start bound of
-- its hand-out, or gives it back; what it cannot bound is how long the
-- machine takes to wake the child once the job is written to it (and to
-- finish the loop turn that wrote it). On an idle machine that is well
-- under a millisecond; TOLERANCE_MS leaves room for a loaded one.
local helpers = require "helpers"
local moonjob = require "moonjob"
local rq = require "redis_queue"
local counting = require "counting"
local most_in_window = counting.most_in_window

local TOLERANCE_MS = 25
local FAST = helpers.abs(helpers.fixture("rate_starts.lua"))
local SLOW_LOAD = helpers.abs(helpers.fixture("rate_starts_slow_load.lua"))

-- The starts the processors logged: { id = { start, ... } }, and every
-- start time of the ids whose name begins with `prefix` ("" for all).
local function starts(log, prefix)
  local by_id, times = {}, {}
  for _, line in ipairs(rq.read_lines(log)) do
    local id, ms = line:match("^(%S+) (%S+)$")
    by_id[id] = by_id[id] or {}
    table.insert(by_id[id], tonumber(ms))
    if id:sub(1, #prefix) == prefix then times[#times + 1] = tonumber(ms) end
  end
  return by_id, times
end

-- Every job of ids completed, and started once (by_id: starts()).
local function each_once(q, ids, by_id)
  for _, id in ipairs(ids) do
    assert.equal(1, by_id[id] and #by_id[id] or 0, "job " .. id .. " did not start exactly once")
  end
end

-- No window of per ms (less the tolerance) holds more than max of times.
local function within_rate(times, max, per_ms, what)
  local most, at = most_in_window(times, per_ms - TOLERANCE_MS)
  local around = {}
  for _, t in ipairs(times) do
    if at and t >= at and t <= at + per_ms then around[#around + 1] = ("%.0f"):format(t - at) end
  end
  assert.is_true(most <= max, ("%d %s started within %d ms (ms from the first: %s)"):format(most, what,
    per_ms - TOLERANCE_MS, table.concat(around, " ")))
end

-- n jobs { log = log } with ids prefix1..prefixn (of group `group`, if any).
local function add_jobs(q, log, n, prefix, group, ids)
  for i = 1, n do
    local id = prefix .. i
    assert(q:add({ log = log, ms = 20 }, { id = id, group = group }))
    ids[#ids + 1] = id
  end
end

rq.describe(function()
  describe("a rate, counted where the jobs start", function()
    local function across_workers(processor)
      local name, log = rq.new_queue(), os.tmpname()
      local q = rq.new_producer(name)
      assert(q:set_rate({ max = 5, per = 0.5 }))
      local ids = {}
      add_jobs(q, log, 30, "r", nil, ids)
      for _ = 1, 3 do rq.start_worker(name, "-j 4", processor) end
      assert(rq.wait_for(function() return q:counts().completed == #ids end, 60), "the jobs did not all complete")
      local by_id, all = starts(log, "")
      each_once(q, ids, by_id)
      within_rate(all, 5, 500, "jobs")
    end

    it("max = 5 per 0.5 s, 3 workers of 4 children that take 150 ms to load: never 6 in 0.5 s", function()
      across_workers(SLOW_LOAD)
    end)

    it("max = 5 per 0.5 s, 3 workers of 4 children that load at once: never 6 in 0.5 s", function()
      across_workers(FAST)
    end)

    it("max = 5 per 0.5 s, 2 pools whose children restart after each job: never 6 in 0.5 s", function()
      local name, log = rq.new_queue(), os.tmpname()
      local q = rq.new_producer(name)
      assert(q:set_rate({ max = 5, per = 0.5 }))
      local ids = {}
      add_jobs(q, log, 20, "c", nil, ids)
      for _ = 1, 2 do
        rq.close_after(assert(moonjob.pool(SLOW_LOAD, { redis = rq.server().url, queue = name, size = 3,
          max_jobs_per_child = 1, echo = false })))
      end
      assert(rq.wait_for(function() return q:counts().completed == #ids end, 60), "the jobs did not all complete")
      local by_id, all = starts(log, "")
      each_once(q, ids, by_id)
      within_rate(all, 5, 500, "jobs")
    end)

    it("a fetch answered past the start bound: its job goes back uncounted, said once, and runs later", function()
      local name, log = rq.new_queue(), os.tmpname()
      local q = rq.new_producer(name)
      assert(q:set_rate({ max = 1, per = 0.5 })) -- start bound: 25 ms
      local said = {}
      local pool = rq.close_after(assert(moonjob.pool(FAST, { redis = rq.server().url, queue = name, size = 1,
        echo = false })))
      pool:on("redis", function(_, why) if tostring(why):find("start bound", 1, true) then said[#said + 1] = why end end)
      local ids = {}
      add_jobs(q, log, 2, "p", nil, ids)
      assert(rq.wait_for(function() return #rq.read_lines(log) == 1 end), "the first job did not start")
      -- the window is full until 525 ms after the first hand-out: the
      -- worker's next fetch, sent then, is answered only when the pause ends
      local handed = tonumber(q.client:call_wait({ "HGET", q.prefix .. "j:p1", "started" }))
      local t = q.client:call_wait({ "TIME" })
      local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
      helpers.sleep(math.max(0, handed + 200 - now) / 1000)
      assert.equal("OK", q.client:call_wait({ "CLIENT", "PAUSE", 1000, "ALL" }))
      assert(rq.wait_for(function() return q:counts().completed == 2 end, 30), "the jobs did not all complete")
      local by_id, all = starts(log, "")
      each_once(q, ids, by_id)
      within_rate(all, 1, 500, "jobs")
      assert.is_true(#said >= 1, "the late answer was not said") -- (once per late spell: a loaded machine may have two)
      assert.matches("later than the rate's start bound %(25 ms%): its jobs were given back", said[1])
      assert.is_true(pool:stats().redis.released >= 1)
      assert.equal(1, assert(q:job("p2")).attempts) -- the run given back did not count
    end)

    it("group_rate max = 2 per 0.5 s, 3 workers of 4 slow-loading children: never 3 of a group in 0.5 s", function()
      local name, log = rq.new_queue(), os.tmpname()
      local q = rq.new_producer(name)
      assert(q:set_group_rate({ max = 2, per = 0.5 }))
      local ids = {}
      for _, g in ipairs({ "a", "b", "c" }) do add_jobs(q, log, 8, g, g:upper(), ids) end
      for _ = 1, 3 do rq.start_worker(name, "-j 4", SLOW_LOAD) end
      assert(rq.wait_for(function() return q:counts().completed == #ids end, 60), "the jobs did not all complete")
      local by_id = starts(log, "")
      each_once(q, ids, by_id)
      for _, g in ipairs({ "a", "b", "c" }) do
        local _, times = starts(log, g)
        within_rate(times, 2, 500, "jobs of group " .. g:upper())
      end
    end)
  end)
end)
