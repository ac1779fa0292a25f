-- Priorities among jobs that wait while children pipeline (moonjob.pool.ranks):
-- jobs sent to a busy child behind its running job still run lower priority
-- first once they have waited a few milliseconds, ties in order of arrival,
-- and every job runs exactly once. The processor (fixtures/ranked.lua) writes
-- each job's name to a file as it starts, so the order is the children's own.
local h = require "helpers"

local names_in = h.lines -- (the processor writes one name a line)

local function without(names, skip)
  local kept = {}
  for _, name in ipairs(names) do if not skip[name] then kept[#kept + 1] = name end end
  return kept
end

-- The pool's recent jobs are short, so it pipelines; its time budget is
-- raised (white box, as in pipeline_spec) so that a loaded machine, where
-- even tiny jobs seem to take milliseconds, does not decide whether the
-- jobs get sent behind the running one.
local function warm(pool)
  pool.dispatch.budget_ms = 1000
  for _ = 1, 50 do pool:add({ file = "/dev/null" }) end
  pool:drain()
  assert.is_true(pool.dispatch:depth() > 1, "the pool pipelines after short jobs")
  h.wait_for(function() -- every child ready, so each takes one of the first jobs
    local idle = 0
    for _, child in ipairs(pool.children:array()) do if child.state == "idle" then idle = idle + 1 end end
    return idle == pool.size
  end)
end

-- Runs add() with the budget raised, then puts the default back: the jobs
-- get sent behind the running ones whatever the machine's load, and the
-- pool then works as it does for users (nothing more is sent behind a job
-- that has run 2 ms).
local function sending_ahead(pool, add)
  local budget = pool.dispatch.budget_ms
  warm(pool)
  local jobs = add()
  pool.dispatch.budget_ms = budget
  return jobs
end

-- The first two names, sorted (two children may start them in either order).
local function first_two(names)
  local two = { names[1], names[2] }
  table.sort(two)
  return two
end

local RANKED = { { "p5", 5 }, { "p1-a", 1 }, { "p3", 3 }, { "p1-b", 1 } }

local function add_ranked(pool, file)
  local jobs = {}
  for i, r in ipairs(RANKED) do jobs[i] = pool:add({ file = file }, { name = r[1], priority = r[2] }) end
  return jobs
end

local function some_prefetched(jobs)
  for _, job in ipairs(jobs) do if job.prefetched then return true end end
  return false
end

describe("priorities under pipelining", function()
  local file
  before_each(function() file = os.tmpname() end)
  after_each(function()
    os.remove(file)
    h.cleanup()
  end)

  it("runs the jobs sent behind a long one lower priority first (size 1)", function()
    local pool = h.pool("ranked.lua", { size = 1 })
    warm(pool)
    pool:add({ file = file, seconds = 0.3 }, { name = "long" })
    local jobs = add_ranked(pool, file)
    assert.is_true(some_prefetched(jobs), "the jobs were sent behind the long one")
    pool:drain()
    assert.same({ "long", "p1-a", "p1-b", "p3", "p5" }, names_in(file))
    for _, job in ipairs(jobs) do assert.equal(1, job.attempts) end
  end)

  it("orders them behind two long jobs (size 2, default budget)", function()
    -- pipeline 3: each child gets two of the four behind its long job
    local pool = h.pool("ranked.lua", { size = 2, pipeline = 3 })
    local jobs = sending_ahead(pool, function()
      pool:add({ file = file, seconds = 0.3 }, { name = "long-a" })
      pool:add({ file = file, seconds = 0.6 }, { name = "long-b" })
      return add_ranked(pool, file)
    end)
    assert.is_true(some_prefetched(jobs), "the jobs were sent behind the long ones")
    pool:drain()
    local names = names_in(file)
    assert.equal(6, #names)
    assert.same({ "p1-a", "p1-b", "p3", "p5" }, without(names, { ["long-a"] = true, ["long-b"] = true }))
    for _, job in ipairs(jobs) do assert.equal(1, job.attempts) end
  end)

  it("puts a better job added later ahead of worse ones already sent to the child", function()
    local pool = h.pool("ranked.lua", { size = 1 })
    warm(pool)
    local long = pool:add({ file = file, seconds = 0.3 }, { name = "long" })
    local worse = {}
    for i = 1, 3 do worse[i] = pool:add({ file = file }, { name = "p5-" .. i, priority = 5 }) end
    assert.is_true(some_prefetched(worse), "the worse jobs were sent behind the long one")
    h.wait_for(function() return long.state == "active" end)
    h.sleep(0.05)
    pool:add({ file = file }, { name = "p0", priority = 0 })
    pool:drain()
    assert.same({ "long", "p0", "p5-1", "p5-2", "p5-3" }, names_in(file))
  end)

  it("with the default budget, a better job waiting in the pool goes before worse ones sent ahead", function()
    local pool = h.pool("ranked.lua", { size = 1 })
    local long, worse = nil, {}
    sending_ahead(pool, function()
      long = pool:add({ file = file, seconds = 0.3 }, { name = "long" })
      for i = 1, 2 do worse[i] = pool:add({ file = file }, { name = "p5-" .. i, priority = 5 }) end
    end)
    assert.is_true(some_prefetched(worse), "the worse jobs were sent with the long one")
    h.wait_for(function() return long.state == "active" end)
    h.sleep(0.05)
    local better = pool:add({ file = file }, { name = "p1", priority = 1 })
    assert.is_nil(better.prefetched, "nothing is sent behind a job that has run that long")
    pool:drain()
    assert.same({ "long", "p1", "p5-1", "p5-2" }, names_in(file))
  end)

  it("takes back a better job stuck behind a long job while another child runs worse ones", function()
    -- pipeline 2: each child holds one job behind the one it runs
    local pool = h.pool("ranked.lua", { size = 2, pipeline = 2 })
    local better = sending_ahead(pool, function()
      pool:add({ file = file, seconds = 0.4 }, { name = "long" })
      pool:add({ file = file, seconds = 0.05 }, { name = "short" })
      return { pool:add({ file = file }, { name = "p1-a", priority = 1 }),
        pool:add({ file = file }, { name = "p1-b", priority = 1 }) }
    end)
    assert.is_true(better[1].prefetched and better[2].prefetched, "one sent behind each")
    for i = 1, 20 do pool:add({ file = file }, { name = "p5-" .. i, priority = 5 }) end
    pool:drain()
    local names = without(names_in(file), { long = true, short = true })
    assert.equal(22, #names)
    assert.same({ "p1-a", "p1-b" }, first_two(names), "both better jobs ran before the worse ones")
  end)

  it("takes back better jobs queued behind a long job while worse ones are queued in another child", function()
    -- pipeline 3: a child holds two jobs behind the one it runs; the first
    -- child (white box: the pump fills them in that order) gets the first two
    local pool = h.pool("ranked.lua", { size = 2, pipeline = 3 })
    local better = {}
    sending_ahead(pool, function()
      local long = pool:add({ file = file, seconds = 0.4 }, { name = "long" })
      pool:add({ file = file, seconds = 0.05 }, { name = "short" })
      local function add(priority, names)
        for _, name in ipairs(names) do
          local job = pool:add({ file = file }, { name = name, priority = priority })
          assert.is_true(job.prefetched, name .. " sent ahead")
          if priority == 1 then better[#better + 1] = job end
        end
      end
      if pool.children:array()[1] == long.child then -- the better ones behind the long job
        add(1, { "p1-a", "p1-b" }); add(5, { "p5-a", "p5-b" })
      else
        add(5, { "p5-a", "p5-b" }); add(1, { "p1-a", "p1-b" })
      end
      assert.equal(long.child, better[1].child)
    end)
    pool:drain()
    local order = without(names_in(file), { long = true, short = true })
    assert.equal(4, #order)
    assert.same({ "p1-a", "p1-b" }, first_two(order), "the better jobs ran first: " .. table.concat(order, " "))
  end)

  it("orders a burst added to an idle pool once its first job runs long", function()
    local pool = h.pool("ranked.lua", { size = 1 })
    warm(pool)
    pool:add({ file = file, seconds = 0.3 }, { name = "first", priority = 9 })
    local jobs = add_ranked(pool, file)
    assert.is_true(some_prefetched(jobs))
    pool:drain()
    assert.same({ "first", "p1-a", "p1-b", "p3", "p5" }, names_in(file))
  end)

  it("keeps a burst of equal priority first in first out, each job run once", function()
    local pool = h.pool("ranked.lua", { size = 1 })
    warm(pool)
    local jobs, expected = {}, {}
    for i = 1, 2000 do
      expected[i] = "j" .. i
      jobs[i] = pool:add({ file = file }, { name = expected[i], priority = 2 })
    end
    pool:drain()
    assert.same(expected, names_in(file))
    for i = 1, 2000 do
      assert.equal("completed", jobs[i].state)
      assert.equal(1, jobs[i].attempts)
    end
  end)

  it("runs every job exactly once while mixed priorities are reordered (size 3)", function()
    local pool = h.pool("ranked.lua", { size = 3 })
    local budget = pool.dispatch.budget_ms
    warm(pool)
    pool.dispatch.budget_ms = budget -- as users run it: jobs queued behind long ones get stuck
    local jobs = {}
    for round = 1, 20 do
      -- jobs that run a while, then jobs of falling priority behind them
      for k = 1, 2 do
        local seconds = (round + k) % 3 == 0 and 0.03 or 0.01
        jobs[#jobs + 1] = pool:add({ file = file, seconds = seconds }, { name = ("slow-%d-%d"):format(round, k) })
      end
      for i = 1, 40 do
        local name = ("r%d-%d"):format(round, i)
        jobs[#jobs + 1] = pool:add({ file = file }, { name = name, priority = (40 - i) % 7 })
      end
      if round % 4 == 0 then pool:drain() end
    end
    pool:drain()
    local runs = {}
    for _, name in ipairs(names_in(file)) do runs[name] = (runs[name] or 0) + 1 end
    for _, job in ipairs(jobs) do
      assert.equal("completed", job.state)
      assert.equal(1, runs[job.name], job.name .. " ran once")
      assert.equal(1, job.attempts)
    end
    assert.equal(#jobs, #names_in(file))
    assert.is_true(pool.dispatch.ranks.ranked_back > 0, "some jobs were taken back to be reordered")
  end)
end)
