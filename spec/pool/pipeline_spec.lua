-- Several jobs in flight per child (moonjob.pool.dispatch): every semantic
-- of a job holds while jobs wait queued in a child behind the one it runs.
-- Each spec first makes the pool's recent jobs short (so it pipelines) and
-- checks that the jobs it is about were really queued in a child
-- (job.prefetched), so none of them passes by running one job at a time.
local core = require "moonjob.core"
local h = require "helpers"

local function lines_in(path)
  local n = 0
  for _ in io.lines(path) do n = n + 1 end
  return n
end

-- Job ids in the order their runs started (runs.lua appends one per run).
local function runs_of(path)
  local ids = {}
  for line in io.lines(path) do ids[#ids + 1] = tonumber(line) end
  return ids
end

local function count(list, value)
  local n = 0
  for _, v in ipairs(list) do if v == value then n = n + 1 end end
  return n
end

-- The pool's recent jobs are short, so it pipelines. Its time budget is
-- raised (white box) so that a loaded machine, where even tiny jobs seem to
-- take milliseconds, does not decide whether a spec's jobs get queued.
local function pipelining(pool)
  pool.dispatch.budget_ms = 1000
end

local function warm(pool, runs)
  pipelining(pool)
  for _ = 1, 50 do pool:add({ file = runs, how = "none" }) end
  pool:drain()
  assert.is_true(pool.dispatch:depth() > 1, "the pool pipelines after short jobs")
end

describe("pipelining", function()
  local runs
  before_each(function() runs = os.tmpname() end)
  after_each(function()
    os.remove(runs)
    h.cleanup()
  end)

  it("takes jobs a 'completed' listener adds while the next job waits queued in the child", function()
    local pool = h.pool("identity.lua", { size = 2 })
    pipelining(pool)
    local added, ends, listener_errors = 0, 0, 0
    local most_queued = 0
    pool:on("error", function() listener_errors = listener_errors + 1 end)
    pool:on("completed", function()
      ends = ends + 1
      most_queued = math.max(most_queued, pool.dispatch:prefetched_count())
      if added < 500 then
        added = added + 1
        assert(pool:add({ added = added }))
      end
    end)
    for i = 1, 6 do pool:add({ i = i }) end -- few: the children have room, so each add tops them up
    pool:drain()
    assert.is_true(most_queued > 0, "no job was ever queued in a child")
    assert.equal(500, added)
    assert.equal(506, ends)
    assert.equal(0, listener_errors)
    pool:close()
  end)

  it("queues jobs in children while tiny jobs flow, and every job ends once with its own result", function()
    local pool = h.pool("identity.lua", { size = 2 })
    pipelining(pool)
    local most_queued, ends = 0, 0
    pool:on("active", function() most_queued = math.max(most_queued, pool.dispatch:prefetched_count()) end)
    pool:on("completed", function() ends = ends + 1 end)
    local jobs = {}
    for i = 1, 5000 do jobs[i] = pool:add({ i = i, s = ("x"):rep(i % 50) }) end
    pool:drain()
    assert.is_true(most_queued > 0, "no job was ever queued in a child")
    assert.equal(5000, ends)
    for i = 1, 5000 do
      local result = jobs[i]:wait()
      assert.equal(i, result.i)
      assert.equal(1, jobs[i].attempts)
    end
  end)

  it("counts a queued job's timeout from when its child starts it, and fires active then", function()
    local pool = h.pool("runs.lua", { size = 1, jit = false })
    warm(pool, runs)
    local long = pool:add({ file = runs, how = "spin", seconds = 0.5 })
    local short = pool:add({ file = runs, how = "none" }, { timeout = 0.3 })
    assert.is_true(short.prefetched, "the short job waits in the child")
    assert.equal("waiting", short.state)
    assert.equal(1, pool:stats().waiting, "a job queued in a child counts as waiting")
    local active_at = {}
    pool:on("active", function(job) active_at[job] = core.hrtime() / 1e6 end)
    assert.equal("ran", short:wait())
    assert.equal("ran", long:wait())
    assert.is_true(active_at[short] >= long.started + 450, "active when it started, not when sent")
    assert.is_true(short.ms < 250, "run time from its start: " .. short.ms)
    assert.is_true(long.ms >= 450, long.ms)
    local s = pool:stats()
    assert.is_true(s.wait_p99 >= 450, "the wait of the queued job counts: " .. s.wait_p99)
  end)

  it("gives back the jobs queued behind a job whose child crashes, without counting an attempt", function()
    local pool = h.pool("runs.lua", { size = 1 })
    warm(pool, runs)
    local base = lines_in(runs)
    -- it lives 0.2 s: a child dying at once may be gone before the next add
    local crash = pool:add({ file = runs, how = "exit", seconds = 0.2 })
    local after = {}
    for i = 1, 5 do after[i] = pool:add({ file = runs, how = "none" }) end
    assert.is_true(after[1].prefetched, "jobs wait in the child behind the crashing one")
    local _, err = crash:wait()
    assert.equal("ECRASH", err.code)
    for i = 1, 5 do
      assert.equal("ran", after[i]:wait())
      assert.equal(1, after[i].attempts)
      assert.is_nil(after[i].errors)
    end
    local ids = runs_of(runs)
    assert.equal(base + 6, #ids)
    for i = 1, 5 do assert.equal(1, count(ids, after[i].id)) end
    assert.equal(2, pool:stats().spawned)
  end)

  it("runs every queued job once when the child is killed an instant before it reaches them", function()
    local pool = h.pool("runs.lua", { size = 1, jit = false })
    warm(pool, runs)
    local head = pool:add({ file = runs, how = "spin", seconds = 5 })
    local queued = {}
    for i = 1, 6 do queued[i] = pool:add({ file = runs, how = "none" }) end
    assert.is_true(queued[1].prefetched)
    h.wait_started(head) -- killed before it took the head, the child would give it back
    os.execute("kill -KILL " .. head.pid)
    local _, err = head:wait()
    assert.equal("ECRASH", err.code)
    for i = 1, 6 do
      assert.equal("ran", queued[i]:wait())
      assert.equal(1, queued[i].attempts)
    end
    local ids = runs_of(runs)
    for i = 1, 6 do assert.equal(1, count(ids, queued[i].id), "job " .. i .. " ran once") end
  end)

  it("cancels a job queued in a child without running it and without disturbing the running one", function()
    local pool = h.pool("runs.lua", { size = 1, jit = false })
    warm(pool, runs)
    local running = pool:add({ file = runs, how = "spin", seconds = 0.4 })
    local victim = pool:add({ file = runs, how = "none" })
    local behind = pool:add({ file = runs, how = "none" })
    assert.is_true(victim.prefetched and behind.prefetched)
    h.wait_for(function() return running.state == "active" end)
    assert.is_true(victim:cancel("not needed"))
    local _, err = victim:wait()
    assert.equal("ECANCELED", err.code)
    assert.equal("active", running.state, "canceled at once, while the running job goes on")
    assert.equal(0, victim.attempts)
    assert.equal("ran", running:wait())
    assert.equal("ran", behind:wait())
    local ids = runs_of(runs)
    assert.equal(0, count(ids, victim.id), "the canceled job never ran")
    assert.equal(1, count(ids, running.id))
    assert.equal(1, count(ids, behind.id))
    assert.equal(1, pool:stats().spawned)
  end)

  it("cancels a queued job its child started meanwhile by interrupting it", function()
    local pool = h.pool("runs.lua", { size = 1, jit = false, kill_after = 30 })
    warm(pool, runs)
    for round = 1, 20 do
      local first = pool:add({ file = runs, how = "none" })
      local second = pool:add({ file = runs, how = "spin", seconds = 30 })
      assert.is_true(second.prefetched, "round " .. round)
      if round % 2 == 0 then h.wait_for(function() return first.state == "completed" end) end
      assert.is_true(second:cancel("late"))
      local _, err = second:wait()
      assert.equal("ECANCELED", err.code, "round " .. round)
      assert.equal("ran", first:wait())
    end
    assert.equal(0, pool:stats().killed, "interrupted, never killed")
  end)

  it("puts a better priority ahead of the jobs already sent to the child once it waits", function()
    local pool = h.pool("runs.lua", { size = 1, jit = false, pipeline = 3 })
    warm(pool, runs)
    local order = {}
    pool:on("active", function(job) order[#order + 1] = job.name end)
    pool:add({ file = runs, how = "spin", seconds = 0.2 }, { name = "block" })
    for i = 1, 5 do pool:add({ file = runs, how = "none" }, { name = "p5-" .. i, priority = 5 }) end
    pool:add({ file = runs, how = "none" }, { name = "p0", priority = 0 })
    pool:drain()
    -- the two p5 jobs sent behind block (pipeline 3) are taken back while it runs
    assert.same({ "block", "p0", "p5-1", "p5-2", "p5-3", "p5-4", "p5-5" }, order)
  end)

  it("holds no short job behind a long one while another child is idle #slow", function()
    local pool = h.pool("runs.lua", { size = 2, jit = false })
    warm(pool, runs)
    local long = pool:add({ file = runs, how = "spin", seconds = 2 })
    local shorts = {}
    -- as many as both children can hold (2 x 8): some wait behind the long one
    for i = 1, 15 do shorts[i] = pool:add({ file = runs, how = "none" }) end
    local queued_behind_long = 0
    for i = 1, 15 do
      if shorts[i].child == long.child then queued_behind_long = queued_behind_long + 1 end
    end
    assert.is_true(queued_behind_long > 0, "some short job was queued behind the long one")
    local t0 = core.hrtime()
    for i = 1, 15 do assert.equal("ran", shorts[i]:wait()) end
    assert.is_true((core.hrtime() - t0) / 1e9 < 1, "the short jobs did not wait for the long one")
    assert.equal("ran", long:wait())
    local ids = runs_of(runs)
    for i = 1, 15 do
      assert.equal(1, count(ids, shorts[i].id))
      assert.equal(1, shorts[i].attempts)
    end
  end)

  it("keeps each line of output, log and progress on the job that made it", function()
    local pool = h.pool("noisy.lua", { size = 1 })
    pipelining(pool)
    for i = 1, 50 do pool:add({ n = 0 }) end
    pool:drain()
    local most_queued = 0
    pool:on("active", function() most_queued = math.max(most_queued, pool.dispatch:prefetched_count()) end)
    local jobs = {}
    for i = 1, 500 do jobs[i] = pool:add({ n = i }) end
    pool:drain()
    assert.is_true(most_queued > 0, "no job was ever queued in the child")
    for i = 1, 500 do
      local logs = jobs[i].logs
      table.sort(logs)
      assert.same({ "err " .. i, "log " .. i, "out " .. i, "partial " .. i }, logs)
      assert.equal(i, jobs[i].progress.n)
      assert.equal(i, jobs[i]:wait())
    end
  end)

  -- Jobs taken back stay in the child's channel until it reaches them, while
  -- new ones follow: the child must keep reading past any number of them.
  local function pile_up(pool, long, rounds)
    local child, added = long.child, {}
    for _ = 1, rounds do
      long.started = require("moonjob.loop").now() -- keeps prefetching behind it (white box)
      for _ = 1, 7 do added[#added + 1] = pool:add({ file = runs, how = "none" }) end
      assert.is_not_nil(child.sent[2], "jobs were queued behind the long one")
      assert.is_true(child.sent[2]:cancel("taken back"))
    end
    return added
  end

  it("runs every job when many taken-back jobs still wait in the child's channel", function()
    local pool = h.pool("runs.lua", { size = 1, jit = false })
    warm(pool, runs)
    local long = pool:add({ file = runs, how = "spin", seconds = 0.3 })
    local added = pile_up(pool, long, 8)
    assert.equal("ran", long:wait())
    h.wait_for(function()
      for _, job in ipairs(added) do if not job:is_finished() then return false end end
      return true
    end)
    local ids = runs_of(runs)
    for _, job in ipairs(added) do
      if job.state == "failed" then
        assert.equal("ECANCELED", job.error.code)
        assert.equal(0, count(ids, job.id))
      else
        assert.equal(1, count(ids, job.id))
      end
    end
    assert.equal(1, pool:stats().spawned)
  end)

  it("interrupts the running job behind many taken-back jobs in the child's channel", function()
    local pool = h.pool("runs.lua", { size = 1, jit = false, kill_after = 30 })
    warm(pool, runs)
    local long = pool:add({ file = runs, how = "spin", seconds = 30 })
    pile_up(pool, long, 8)
    assert.is_true(long:cancel("stop"))
    local _, err = long:wait()
    assert.equal("ECANCELED", err.code)
    assert.is_nil(err.killed, "stopped by its interrupt, not by the hard kill")
  end)

  it("runs the jobs queued behind one that hit memory_limit, and counts them until they end", function()
    local pool = h.pool("memory_bomb.lua", { size = 1, jit = false, memory_limit = 32 * 1024 * 1024 })
    pipelining(pool)
    for _ = 1, 50 do pool:add("none") end
    pool:drain()
    local bomb = pool:add("tables")
    local next_jobs = {}
    for i = 1, 3 do next_jobs[i] = pool:add("none") end
    assert.is_true(next_jobs[1].prefetched)
    local _, err = bomb:wait()
    assert.equal("ENOMEM", err.code)
    pool:drain()
    for i = 1, 3 do assert.equal("completed", next_jobs[i].state) end
    assert.equal(0, pool.nactive)
    assert.equal(0, pool.dispatch:prefetched_count())
  end)

  it("on close, ends the jobs queued in a child with ECLOSED, unrun, and lets the running one finish", function()
    local pool = h.pool("runs.lua", { size = 1, jit = false })
    warm(pool, runs)
    local before = lines_in(runs)
    local running = pool:add({ file = runs, how = "spin", seconds = 0.3 })
    local queued = { pool:add({ file = runs, how = "none" }), pool:add({ file = runs, how = "none" }) }
    assert.is_true(queued[1].prefetched and queued[2].prefetched, "the jobs wait in the child")
    h.wait_for(function() return running.state == "active" end)
    pool:close()
    assert.equal("ran", running:wait())
    for _, job in ipairs(queued) do
      local _, err = job:wait()
      assert.equal("ECLOSED", err.code)
      assert.equal(0, job.attempts)
    end
    assert.equal(before + 1, lines_in(runs), "only the running job ran")
    assert.equal(0, pool.dispatch:prefetched_count())
  end)

  it("holds one job per child when jobs are long, and with pipeline = 1", function()
    local pool = h.pool("runs.lua", { size = 1, pipeline = 1 })
    for _ = 1, 50 do pool:add({ file = runs, how = "none" }) end
    local most_queued = 0
    pool:on("active", function() most_queued = math.max(most_queued, pool.dispatch:prefetched_count()) end)
    pool:drain()
    assert.equal(0, most_queued)
    local slow = h.pool("runs.lua", { size = 1, jit = false })
    for _ = 1, 5 do slow:add({ file = runs, how = "spin", seconds = 0.01 }) end
    slow:drain()
    assert.equal(1, slow.dispatch:depth())
  end)
end)
