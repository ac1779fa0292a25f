-- A pool's rate = { max, per }, group_concurrency and group_rate
-- (moonjob.pool.limits): never more than max starts in any per seconds, jobs
-- beyond waiting (not refused); at most n jobs of one group at once, and a
-- rate per group, while other groups' jobs go ahead; priorities, cancel,
-- retries and close with them; bad options refused. The processor (fixtures/start_times.lua) returns when each job
-- started and stopped on CLOCK_MONOTONIC (the same clock in every process).
-- Timings are lower bounds that hold by construction, less a tolerance for
-- the time a child takes to read its job.
local h = require "helpers"

local PROCESSOR = "start_times.lua"
local CHILD_SLACK_MS = 200 -- a loaded machine's delay between a job's sending and its start
-- The parent counts a start in its window just before it sends the job and
-- sets job.started just after: on a loaded machine the two reads of the
-- clock can be this far apart (a broken limit starts jobs ~0 ms apart).
local PARENT_SLACK_MS = 50

-- The results of `jobs` (each { start, stop }), after waiting for them.
local function results(jobs)
  local out = {}
  for i, job in ipairs(jobs) do
    local result, err = job:wait()
    assert(result, err and err.message)
    out[i] = result
  end
  return out
end

-- The fewest milliseconds between a start and the max-th start after it.
local function narrowest_window(starts, max)
  table.sort(starts)
  local narrowest = math.huge
  for i = 1, #starts - max do narrowest = math.min(narrowest, starts[i + max] - starts[i]) end
  return narrowest
end

describe("moonjob.pool rate", function()
  after_each(h.cleanup)

  it("starts at most max jobs in any per seconds; the others wait #slow", function()
    local pool = h.pool(PROCESSOR, { size = 2, rate = { max = 5, per = 1 } })
    local jobs = {}
    for i = 1, 12 do jobs[i] = assert(pool:add({})) end
    assert.equal(12, #jobs)
    local done = results(jobs)
    local started, child_starts = {}, {}
    for i, job in ipairs(jobs) do started[i], child_starts[i] = job.started, done[i].start end
    -- the parent's start times (job.started) hold to it exactly, but for the
    -- microseconds between the window's look and the job's start
    assert.is_true(narrowest_window(started, 5) >= 1000 - PARENT_SLACK_MS, "6 starts within a second (parent)")
    -- the children's: later than the parent's by at most `late` ms
    local late = 0
    for i = 1, #jobs do late = math.max(late, child_starts[i] - started[i]) end
    assert.is_true(late < CHILD_SLACK_MS * 5, "a child took seconds to start its job")
    assert.is_true(narrowest_window(child_starts, 5) >= 1000 - late - 1, "6 starts within a second (children)")
    -- 0..4 in the first window, 5..9 in the second, 10 and 11 in the third
    assert.is_true(child_starts[12] - child_starts[1] >= 2000 - CHILD_SLACK_MS)
    assert.is_true(started[12] - started[1] >= 2000 - PARENT_SLACK_MS)
    assert.is_true(started[12] - started[1] < 30000, "a hang")
  end)

  it("keeps priorities and delays among the jobs it holds back", function()
    local pool = h.pool(PROCESSOR, { size = 1, rate = { max = 1, per = 0.2 } })
    local first = pool:add({})
    local late = pool:add({}, { priority = 9 })
    local early = pool:add({}, { priority = 1 })
    local delayed = pool:add({}, { delay = 0.05, priority = 0 })
    local r = results({ first, late, early, delayed })
    assert.is_true(r[1].start < r[4].start and r[4].start < r[3].start and r[3].start < r[2].start)
    assert.is_true(late.started - first.started >= 3 * 200 - PARENT_SLACK_MS)
  end)

  it("refuses a bad rate, naming the option", function()
    local wants = "option 'rate' must be { max = N (a whole number, 1 or more), per = S (seconds, more than 0) }"
    for _, rate in ipairs({ { max = 0, per = 1 }, { max = 1.5, per = 1 }, { max = 5, per = 0 }, { max = 5 },
      { per = 1 }, { max = 5, per = -1 }, { max = 5, per = 0 / 0 }, { max = 5, per = 2e9 }, { max = 2e6, per = 1 },
      "5/s", 5 }) do
      local ok, err = pcall(h.pool, PROCESSOR, { rate = rate })
      assert.is_false(ok)
      assert.truthy(tostring(err):find(wants, 1, true), tostring(err))
    end
    local ok, err = pcall(h.pool, PROCESSOR, { rate = { max = 5, per = 1, burst = 2 } })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("option 'rate' has an unknown key 'burst' (known: max, per)", 1, true))
    ok, err = pcall(h.pool, PROCESSOR, { rate = { max = 5, per = 1 }, pipeline = 4 })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("option 'pipeline' must be 1 with option 'rate'", 1, true))
    ok, err = pcall(h.pool, PROCESSOR, { rate = { max = 5, per = 1 }, redis = "redis://127.0.0.1:1",
      queue = "q", codec = "json" })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("option 'rate' is for a local pool; a queue on Redis is limited "
      .. "across all its workers by q:set_rate, q:set_concurrency and their group forms", 1, true))
  end)
end)

describe("moonjob.pool group_concurrency", function()
  after_each(h.cleanup)

  -- No job of `group` (by its jobs' results) overlaps another.
  local function assert_serial(list)
    table.sort(list, function(a, b) return a.start < b.start end)
    for i = 2, #list do assert.is_true(list[i].start >= list[i - 1].stop, "two jobs of a group overlap") end
  end

  it("runs one job of a group at a time while another group's job goes ahead", function()
    local pool = h.pool(PROCESSOR, { size = 2, group_concurrency = 1 })
    local a1 = pool:add({ ms = 800 }, { group = "A" })
    local a2 = pool:add({ ms = 50 }, { group = "A" })
    h.wait_started(a1)
    local b1 = pool:add({ ms = 50 }, { group = "B" }) -- behind a2, which waits for a1
    local r = results({ a1, a2, b1 })
    assert.is_true(r[2].start >= r[1].stop, "A2 overlapped A1")
    assert.is_true(r[3].start < r[1].stop, "B1 waited behind A's jobs")
    assert.is_true(r[3].stop < r[2].start, "B1 waited behind A2")
    assert.equal("A", a1.group)
  end)

  it("lets a small group through a large one's backlog, and ungrouped jobs too", function()
    local pool = h.pool(PROCESSOR, { size = 2, group_concurrency = 1 })
    local a, b = {}, {}
    -- A's jobs long enough that a second child slow to start (a loaded
    -- machine) is ready before A's 6th
    for i = 1, 10 do a[i] = pool:add({ ms = 150 }, { group = "A" }) end
    for i = 1, 3 do b[i] = pool:add({ ms = 1 }, { group = "B" }) end
    local free = pool:add({ ms = 1 })
    local ra, rb = results(a), results(b)
    assert_serial(ra)
    assert_serial(rb)
    for i = 1, 3 do assert.is_true(rb[i].stop < ra[6].start, "B's jobs waited behind A's backlog") end
    assert.is_true(results({ free })[1].stop < ra[6].start)
  end)

  it("hands out a full group's waiting jobs by priority", function()
    local pool = h.pool(PROCESSOR, { size = 2, group_concurrency = 1 })
    local a1 = pool:add({ ms = 300 }, { group = "A" })
    h.wait_started(a1)
    local low = pool:add({}, { group = "A", priority = 5 })
    local high = pool:add({}, { group = "A", priority = 1 })
    local r = results({ a1, low, high })
    assert.is_true(r[1].stop <= r[3].start and r[3].stop <= r[2].start)
  end)

  it("frees nothing wrongly when a waiting grouped job is canceled", function()
    local pool = h.pool(PROCESSOR, { size = 3, group_concurrency = 2 })
    local a1 = pool:add({ ms = 400 }, { group = "A" })
    local a2 = pool:add({ ms = 400 }, { group = "A" })
    local a3 = pool:add({ ms = 10 }, { group = "A" })
    local a4 = pool:add({ ms = 10 }, { group = "A" })
    h.wait_started(a1)
    h.wait_started(a2)
    assert.equal("waiting", a3.state)
    assert.is_true(a3:cancel("not needed"))
    assert.equal("ECANCELED", select(2, a3:wait()).code)
    local r = results({ a1, a2, a4 })
    -- a4 still waited for a place: a3's cancel did not free one
    assert.is_true(r[3].start >= math.min(r[1].stop, r[2].stop))
    pool:drain()
    assert.same({}, pool.source.running) -- (white box: no place left taken)
    assert.equal(0, pool.source:count())
    -- and the group runs two at once again
    local again = { pool:add({ ms = 300 }, { group = "A" }), pool:add({ ms = 300 }, { group = "A" }) }
    local ra = results(again)
    assert.is_true(ra[2].start < ra[1].stop and ra[1].start < ra[2].stop, "the group lost a place")
  end)

  it("frees a place when a running job is canceled, fails or waits for a retry", function()
    local pool = h.pool(PROCESSOR, { size = 2, group_concurrency = 1, attempts = 2,
      backoff = { type = "fixed", delay = 0.5 } })
    local a1 = pool:add({ ms = 5000 }, { group = "A" })
    local a2 = pool:add({ fail_first = true }, { group = "A" })
    local a3 = pool:add({ ms = 10 }, { group = "A" })
    h.wait_started(a1)
    a1:cancel()
    local r = results({ a2, a3 })
    assert.equal(2, a2.attempts)
    assert.is_true(r[2].stop <= r[1].start, "A3 did not run while A2 waited for its retry")
    pool:drain()
    assert.same({}, pool.source.running)
  end)

  it("cancels and closes with jobs waiting for their group", function()
    local pool = h.pool(PROCESSOR, { size = 2, group_concurrency = 1 })
    local jobs = {}
    for i = 1, 5 do jobs[i] = pool:add({ ms = 2000 }, { group = "A" }) end
    h.wait_started(jobs[1])
    assert.equal(5, pool:cancel_all("stop"))
    for _, job in ipairs(jobs) do assert.equal("ECANCELED", select(2, job:wait()).code) end
    pool:drain()
    assert.equal(0, pool.source:count())
    jobs = {}
    for i = 1, 3 do jobs[i] = pool:add({ ms = 300 }, { group = "B" }) end
    h.wait_started(jobs[1])
    pool:close()
    assert.is_nil(select(2, jobs[1]:wait()))
    for i = 2, 3 do assert.equal("ECLOSED", select(2, jobs[i]:wait()).code) end
  end)

  it("combines with a rate", function()
    local pool = h.pool(PROCESSOR, { size = 2, group_concurrency = 1, rate = { max = 2, per = 0.3 } })
    local jobs = {}
    for i = 1, 6 do jobs[i] = pool:add({ ms = 20 }, { group = i % 2 == 0 and "A" or "B" }) end
    local r = results(jobs)
    local a, b, started = {}, {}, {}
    for i = 1, 6 do
      if i % 2 == 0 then a[#a + 1] = r[i] else b[#b + 1] = r[i] end
      started[i] = jobs[i].started
    end
    assert_serial(a)
    assert_serial(b)
    assert.is_true(narrowest_window(started, 2) >= 300 - PARENT_SLACK_MS)
  end)

  it("refuses a bad group_concurrency or group, naming the option", function()
    for _, n in ipairs({ 0, 1.5, -1, 2 ^ 40, "2" }) do
      local ok, err = pcall(h.pool, PROCESSOR, { group_concurrency = n })
      assert.is_false(ok)
      assert.truthy(tostring(err):find("option 'group_concurrency'", 1, true), tostring(err))
    end
    local pool = h.pool(PROCESSOR, { size = 1, group_concurrency = 1 })
    for _, group in ipairs({ "", ("x"):rep(1025), 42, {} }) do
      local ok, err = pcall(pool.add, pool, {}, { group = group })
      assert.is_false(ok)
      assert.truthy(tostring(err):find("pool:add(): option 'group' must be a name (a string of 1 to 1024 bytes)",
        1, true), tostring(err))
    end
    assert.is_truthy(pool:add({}, { group = ("x"):rep(1024) }))
    pool:drain()
  end)
end)

describe("moonjob.pool group_rate", function()
  after_each(h.cleanup)

  -- The parent's start times of `jobs`.
  local function started(jobs)
    local list = {}
    results(jobs)
    for i, job in ipairs(jobs) do list[i] = job.started end
    return list
  end

  it("starts at most max jobs of one group in any per seconds, groups side by side #slow", function()
    local pool = h.pool(PROCESSOR, { size = 2, group_rate = { max = 2, per = 0.5 } })
    local a, b = {}, {}
    for i = 1, 5 do a[i] = pool:add({}, { group = "A" }) end
    for i = 1, 5 do b[i] = pool:add({}, { group = "B" }) end
    local free = pool:add({})
    local sa, sb = started(a), started(b)
    assert.is_true(narrowest_window(sa, 2) >= 500 - PARENT_SLACK_MS, "3 jobs of A started within 0.5 s")
    assert.is_true(narrowest_window(sb, 2) >= 500 - PARENT_SLACK_MS, "3 jobs of B started within 0.5 s")
    assert.is_true(sa[5] - sa[1] >= 1000 - PARENT_SLACK_MS)
    -- B's first two and the job without a group did not wait for A's window
    assert.is_true(sb[2] < sa[3] and started({ free })[1] < sa[3])
    local children = {}
    for i, r in ipairs(results(a)) do children[i] = r.start end
    assert.is_true(narrowest_window(children, 2) >= 500 - CHILD_SLACK_MS)
  end)

  it("wakes a group again when its waking job is canceled", function()
    local pool = h.pool(PROCESSOR, { size = 2, group_rate = { max = 1, per = 0.3 } })
    local a1 = pool:add({}, { group = "A" })
    local a2 = pool:add({}, { group = "A" }) -- waits in the queue for A's window
    local a3 = pool:add({}, { group = "A" }) -- parked behind it
    h.wait_for(function() return pool.source.waking.A == a2 end) -- (white box: a2 wakes A)
    assert.is_true(a2:cancel())
    local s = started({ a1, a3 })
    assert.is_true(s[2] - s[1] >= 300 - PARENT_SLACK_MS)
    assert.equal("ECANCELED", select(2, a2:wait()).code)
    assert.equal(0, pool.source:count())
  end)

  it("combines with group_concurrency and forgets idle groups", function()
    local pool = h.pool(PROCESSOR, { size = 2, group_concurrency = 1, group_rate = { max = 2, per = 0.3 } })
    local jobs = {}
    for i = 1, 4 do jobs[i] = pool:add({ ms = 30 }, { group = "A" }) end
    local r, s = results(jobs), started(jobs)
    for i = 2, 4 do assert.is_true(r[i].start >= r[i - 1].stop, "two jobs of A overlapped") end
    assert.is_true(narrowest_window(s, 2) >= 300 - PARENT_SLACK_MS)
    -- rings of groups that started nothing for `per` are swept (white box)
    for round = 1, 3 do
      local many = {}
      for i = 1, 100 do many[i] = pool:add({}, { group = round .. "-" .. i }) end
      results(many)
      h.sleep(0.35)
    end
    assert.is_true(pool.source.nrings <= 200, "old groups' rings kept: " .. pool.source.nrings)
  end)

  it("refuses a bad group_rate, naming the option", function()
    local ok, err = pcall(h.pool, PROCESSOR, { group_rate = { max = 0, per = 1 } })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("option 'group_rate' must be { max = N (a whole number, 1 or more), "
      .. "per = S (seconds, more than 0) }, not { max = 0, per = 1 }", 1, true), tostring(err))
    ok, err = pcall(h.pool, PROCESSOR, { group_rate = { max = 1, per = 1, group = "A" } })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("option 'group_rate' has an unknown key 'group'", 1, true), tostring(err))
  end)
end)

describe("moonjob.pool.limits, on a clock of its own", function()
  local Job = require "moonjob.job"
  local Limits = require "moonjob.pool.limits"

  it("still says when to wake after the window opens between a refusal and the look", function()
    local t = 0
    local src = Limits.new(function() return t end, { rate = { max = 1, per = 0.2 } })
    local mt = Job.metatable({})
    for id = 1, 3 do src:push(Job.new(mt, id, 0)) end
    assert.truthy(src:pop_ready()) -- the window's one start, at 0
    t = 100
    assert.is_nil(src:pop_ready()) -- refused: the window opens at 200
    t = 250 -- a slow pass: it opened before the pool asked when to wake
    local due = src:next_due()
    assert.truthy(due, "no wake: the pool would sleep with jobs ready")
    assert.is_true(due <= 250)
    assert.truthy(src:pop_ready())
  end)
end)

describe("moonjob.pool.limits, on a clock that moves while it looks", function()
  local Job = require "moonjob.job"
  local Limits = require "moonjob.pool.limits"

  -- A clock that moves 0.3 ms at each read (a live clock on a busy
  -- machine), and raises once read too often: a look that spins fails.
  local function moving_clock(from)
    local t, reads = from, 0
    return function()
      reads = reads + 1
      if reads > 10000 then error("the look spins: the clock was read 10,000 times") end
      t = t + 0.3
      return t
    end, function(at) t, reads = at, 0 end
  end

  for _, look in ipairs({ "pop_ready", "peek_ready" }) do
    it(look .. " ends when a group's ring opens during the look", function()
      local now, set = moving_clock(0)
      local src = Limits.new(now, { group_rate = { max = 1, per = 0.2 } })
      local mt = Job.metatable({})
      local first, second = Job.new(mt, 1, 0), Job.new(mt, 2, 0)
      first.group, second.group = "g", "g"
      src:push(first)
      set(0)
      assert.equal(first, src:pop_ready()) -- the ring's one start, at 0.3
      src:push(second)
      set(199.7) -- the look starts just before the ring opens (at 200.3) and runs past it
      local got = src[look](src)
      assert.truthy(got == nil or got == second)
      if look == "pop_ready" and got then return end -- taken: it started once its ring opened
      set(400)
      assert.equal(second, src:pop_ready())
    end)
  end
end)
