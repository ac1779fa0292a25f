-- Limits far from binding let a worker hold jobs ahead of its children (so
-- that they cost next to nothing), and stay exact once they bind: a rate's
-- window (the queue's, a group's) never holds more starts than its max on
-- the processors' clock, a group's cap never more jobs than it allows, even
-- right after workers held jobs ahead. Real redis-server, real `moonjob
-- worker` processes; fixtures remote.lua (`sleep`, `span`) and
-- rate_starts.lua (each start on CLOCK_MONOTONIC, as rate_starts_spec.lua).
local helpers = require "helpers"
local rq = require "redis_queue"
local counting = require "counting"
local most_in_window, most_at_once = counting.most_in_window, counting.most_at_once

local TOLERANCE_MS = 25 -- waking a child once its job is written (rate_starts_spec.lua says why)
local STARTS = helpers.abs(helpers.fixture("rate_starts.lua"))

-- Runs the loop until the queue has completed n jobs; -> the most jobs it
-- had active at once (held or running) and, if key is given, the most
-- members of that set of the queue's, both seen every 20 ms.
local function watch(q, n, key)
  local most, most_key = 0, 0
  assert(rq.wait_for(function()
    local c = q:counts()
    most = math.max(most, c.active)
    if key then most_key = math.max(most_key, (q.client:call_wait({ "SCARD", q.prefix .. key }))) end
    return c.completed >= n
  end, 60), "the jobs did not all complete")
  return most, most_key
end

-- The start times rate_starts.lua logged, of the ids beginning with prefix.
local function starts(log, prefix)
  local times, ids = {}, {}
  for _, line in ipairs(rq.read_lines(log)) do
    local id, ms = line:match("^(%S+) (%S+)$")
    assert.is_nil(ids[id], "job " .. id .. " started twice")
    ids[id] = true
    if id:sub(1, #prefix) == prefix then times[#times + 1] = tonumber(ms) end
  end
  return times
end

rq.describe(function()
  describe("limits far from binding", function()
    -- 200 jobs of 10 ms for a worker of 1 child holding 8 ahead: it holds
    -- more than the one its child runs, as on a queue without limits
    local function holds_ahead(set_up, group, key)
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      set_up(q)
      for i = 1, 200 do assert(q:add({ sleep = 0.01 }, { id = "h" .. i, group = group })) end
      rq.start_worker(name, "-j 1 --prefetch 8")
      local most, most_key = watch(q, 200, key)
      assert.is_true(most >= 3, ("it held at most %d jobs at once"):format(most))
      assert.is_true(most <= 9, ("it held %d jobs at once, more than --prefetch allows"):format(most))
      if key then assert.is_true(most_key <= 9) end
    end

    it("a rate of 10^6 a second: a worker holds jobs ahead of its children", function()
      holds_ahead(function(q) assert(q:set_rate({ max = 1000000, per = 1 })) end)
    end)

    it("a group cap of 1,000: a worker holds jobs of the group ahead of its children", function()
      holds_ahead(function(q) assert(q:set_group_concurrency(1000)) end, "A", "ga:A")
    end)

    it("a group rate of 10^6 a second: a worker holds jobs of the group ahead of its children", function()
      holds_ahead(function(q) assert(q:set_group_rate({ max = 1000000, per = 1 })) end, "A")
    end)
  end)

  describe("fetch, under limits far from binding", function()
    -- moonjob_fetch as a worker calls it: n jobs, FREE children free -> its rows
    local function fetch(q, n, free)
      local reply = assert(q.client:call_wait({ "FCALL", "moonjob_fetch", 1, q.prefix, "w", n, 30000, "", 86400000,
        0, 604800000, free, 0 }))
      return { unpack(reply, 2) }
    end
    local function server_ms(q)
      local t = assert(q.client:call_wait({ "TIME" }))
      return tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
    end

    it("a rate: the first FREE jobs take the start bound, the others the ahead bound, each counted until then",
        function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      assert(q:set_rate({ max = 60, per = 0.5 })) -- start bound 25 ms, ahead bound 500 ms
      for i = 1, 100 do assert(q:add({}, { id = "r" .. i })) end
      local before = server_ms(q)
      local rows = fetch(q, 18, 2) -- 60 - 18 leaves more than half: 16 held ahead
      assert.equal(18, #rows)
      for i, row in ipairs(rows) do assert.equal(i <= 2 and 25 or 500, tonumber(row[11])) end
      local scores = q.client:call_wait({ "ZRANGE", q.prefix .. "starts", 0, -1, "WITHSCORES" })
      local short, ahead = 0, 0
      for i = 2, #scores, 2 do
        local late = tonumber(scores[i]) - before
        if late < 100 then short = short + 1 elseif late >= 450 and late < 700 then ahead = ahead + 1 end
      end
      assert.same({ 2, 16 }, { short, ahead })
      assert.equal(2, #fetch(q, 18, 2)) -- 42 - 18 leaves less than half: only FREE
      assert.equal(2, #fetch(q, 18, 2))
      assert.equal(0, #fetch(q, 18, 0))
      assert.equal(22, assert(q:limits()).started)
    end)

    it("a group cap: jobs held ahead only while the fetch's N leaves the group places", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      assert(q:set_group_concurrency(14))
      for i = 1, 40 do assert(q:add({}, { id = "a" .. i, group = "A" })) end
      assert.equal(4, #fetch(q, 10, 1)) -- ahead while active + 10 < 14: the 2nd, 3rd, 4th
      assert.equal(1, #fetch(q, 10, 1)) -- 4 + 10: near, FREE only
      assert.equal(14, #fetch(q, 10, 9) + 5) -- FREE 9 up to the cap
      assert.equal(0, #fetch(q, 10, 10))
      assert.equal(14, q.client:call_wait({ "SCARD", q.prefix .. "ga:A" }))
    end)

    it("a group rate: jobs held ahead take its ahead bound while half its window is left", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      assert(q:set_group_rate({ max = 40, per = 2 })) -- start bound 100 ms, ahead bound 1 s
      for i = 1, 60 do assert(q:add({}, { id = "b" .. i, group = "B" })) end
      local rows = fetch(q, 12, 3)
      -- ahead while its window + 12 stays within half of 40: rows 4 to 9
      assert.equal(9, #rows)
      for i, row in ipairs(rows) do assert.equal(i <= 3 and 100 or 1000, tonumber(row[11])) end
      assert.equal(3, #fetch(q, 12, 3))
    end)
  end)

  describe("limits that come to bind after jobs were held ahead", function()
    -- max = 60 per 0.5 s: the first fetch (2 children + 16 ahead) finds the
    -- window far from full and holds jobs ahead (counted 0.5 s longer); the
    -- next ones find it past half and take only for their free children;
    -- 3 workers of 2 children run 20 ms jobs faster than the rate
    it("a queue rate of 60 per 0.5 s over 3 workers holding 16 ahead: never 61 starts in 0.5 s", function()
      local name, log = rq.new_queue(), os.tmpname()
      local q = rq.new_producer(name)
      assert(q:set_rate({ max = 60, per = 0.5 }))
      for i = 1, 240 do assert(q:add({ log = log, ms = 20 }, { id = "r" .. i })) end
      for _ = 1, 3 do rq.start_worker(name, "-j 2 --prefetch 16", STARTS) end
      assert(rq.wait_for(function() return q:counts().completed == 240 end, 60), "the jobs did not all complete")
      local times = starts(log, "r")
      assert.equal(240, #times)
      local most = most_in_window(times, 500 - TOLERANCE_MS)
      assert.is_true(most <= 60, ("%d jobs started within %d ms"):format(most, 500 - TOLERANCE_MS))
    end)

    it("a group rate of 30 per 0.5 s over 3 workers holding 16 ahead: never 31 of a group in 0.5 s", function()
      local name, log = rq.new_queue(), os.tmpname()
      local q = rq.new_producer(name)
      assert(q:set_group_rate({ max = 30, per = 0.5 }))
      for _, g in ipairs({ "a", "b" }) do
        for i = 1, 90 do assert(q:add({ log = log, ms = 5 }, { id = g .. i, group = g:upper() })) end
      end
      for _ = 1, 3 do rq.start_worker(name, "-j 2 --prefetch 16", STARTS) end
      assert(rq.wait_for(function() return q:counts().completed == 180 end, 60), "the jobs did not all complete")
      for _, g in ipairs({ "a", "b" }) do
        local times = starts(log, g)
        assert.equal(90, #times)
        local most = most_in_window(times, 500 - TOLERANCE_MS)
        assert.is_true(most <= 30, ("%d jobs of group %s started within %d ms"):format(most, g:upper(),
          500 - TOLERANCE_MS))
      end
    end)

    -- a cap of 10, fetches of 5 (4 children + 1 ahead): the first worker
    -- holds one ahead while its group has 5 places left or more; 12
    -- children in all, more than the cap
    it("a group cap of 10 over 3 workers of 4 children holding 1 ahead: never 11 of a group at once", function()
      local name, span = rq.new_queue(), os.tmpname()
      local q = rq.new_producer(name)
      assert(q:set_group_concurrency(10))
      for i = 1, 60 do assert(q:add({ span = span, sleep = 0.05 }, { id = "c" .. i, group = "C" })) end
      for _ = 1, 3 do rq.start_worker(name, "-j 4 --prefetch 1") end
      local _, most_key = watch(q, 60, "ga:C")
      assert.is_true(most_key <= 10, ("the group had %d jobs active at once"):format(most_key))
      local most = most_at_once(rq.spans(span))
      assert.is_true(most <= 10, ("%d jobs of the group ran at once"):format(most))
      assert.is_true(most >= 8, ("only %d jobs of the group ran at once: the cap held them back"):format(most))
    end)
  end)
end)
