-- How many jobs a `moonjob worker` holds beyond its running ones. Without
-- --prefetch it follows the jobs' run time (moonjob.redis.fetch_policy):
-- many short jobs ahead, few long ones, and jobs it holds that prove long
-- go back to the queue, so that a worker started later gets them at once.
-- An explicit --prefetch holds exactly that many. Real redis-server, real
-- worker processes (the remote.lua fixture: `sleep` in 10 ms steps, `log`
-- a line "<id> <attempt> <child pid>" at each start).
local loop = require "moonjob.loop"
local rq = require "redis_queue"

-- The worker process (its pid) whose child is `pid`: its parent.
local function parent_of(pid)
  local f = io.open("/proc/" .. pid .. "/stat")
  if not f then return nil end
  local stat = f:read("*a")
  f:close()
  return tonumber(stat:match("^%d+ %b() %S+ (%d+)"))
end

-- The child pids that logged a start, in the order of their first start.
local function child_pids(log)
  local seen, order = {}, {}
  for _, line in ipairs(rq.read_lines(log)) do
    local pid = line:match("^%S+ %S+ (%d+)$")
    if pid and not seen[pid] then seen[pid], order[#order + 1] = true, pid end
  end
  return order
end

-- Runs the loop until the queue has completed n jobs, and returns the most
-- jobs it had active at once (held or running), seen every 20 ms.
local function most_active(q, n, seconds)
  local most = 0
  assert(rq.wait_for(function()
    local c = q:counts()
    most = math.max(most, c.active)
    return c.completed >= n
  end, seconds or 60), "the jobs did not all complete")
  return most
end

rq.describe(function()
  describe("a worker without --prefetch", function()
    it("holds more than one job per child ahead once its jobs prove short", function()
      local name, log = rq.new_queue(), os.tmpname()
      local q = rq.new_producer(name)
      for i = 1, 300 do assert(q:add({ sleep = 0.01, log = log }, { id = "s" .. i })) end
      rq.start_worker(name, "-j 1")
      local most = most_active(q, 300)
      -- 10 ms jobs, 100 ms of work per child: about 9 held beyond the running one
      assert.is_true(most >= 5, ("it held at most %d jobs at once"):format(most))
      assert.is_true(most <= 1 + 11, ("it held %d jobs at once: more than 100 ms of work"):format(most))
    end)

    it("gives back the jobs it holds once they prove long: a worker started later gets them within a second",
        function()
      local name, log = rq.new_queue(), os.tmpname()
      local q = rq.new_producer(name)
      -- short jobs first: the first worker learns to hold many, then meets long ones
      for i = 1, 200 do assert(q:add({}, { id = "s" .. i })) end
      for i = 1, 8 do assert(q:add({ sleep = 3, log = log }, { id = "l" .. i })) end
      rq.start_worker(name, "-j 1")
      assert(rq.wait_for(function() return #child_pids(log) == 1 end, 30), "the first long job did not start")
      local _, second_log = rq.start_worker(name, "-j 1")
      assert(rq.worker_connected(second_log), "the second worker did not connect")
      local connected = loop.now()
      assert(rq.wait_for(function() return #child_pids(log) >= 2 end, 10), "the second worker got no job")
      local waited = loop.now() - connected
      assert.is_true(waited < 1000, ("the second worker waited %.0f ms for a job"):format(waited))
    end)

    it("spreads 200 ms jobs evenly over two workers of 2 children", function()
      local name, log = rq.new_queue(), os.tmpname()
      local q = rq.new_producer(name)
      local pids = {}
      for i = 1, 2 do
        local pid, wlog = rq.start_worker(name, "-j 2")
        assert(rq.worker_connected(wlog), "a worker did not connect")
        pids[i] = pid
      end
      local N = 80
      for i = 1, N do assert(q:add({ sleep = 0.2, log = log }, { id = "j" .. i })) end
      assert(rq.wait_for(function() return q:counts().completed >= N end, 60), "the jobs did not all complete")
      local by_worker = { [pids[1]] = 0, [pids[2]] = 0 }
      local parent = {}
      for _, pid in ipairs(child_pids(log)) do parent[pid] = parent_of(pid) end
      for _, line in ipairs(rq.read_lines(log)) do
        local w = parent[line:match("(%d+)$")]
        assert(by_worker[w], "a job ran on a child of no worker of this test")
        by_worker[w] = by_worker[w] + 1
      end
      for _, pid in ipairs(pids) do
        local ran = by_worker[pid]
        assert.is_true(math.abs(ran - N / 2) <= N / 2 * 0.1,
          ("one worker ran %d of %d jobs, the other %d"):format(ran, N, N - ran))
      end
    end)
  end)

  describe("a worker with --prefetch", function()
    it("holds no more than its children and that many jobs, whatever the jobs take", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      for i = 1, 300 do assert(q:add({ sleep = 0.01 }, { id = "p" .. i })) end
      rq.start_worker(name, "-j 1 --prefetch 2")
      local most = most_active(q, 300)
      assert.is_true(most <= 3, ("it held %d jobs at once"):format(most))
      assert.is_true(most >= 2, ("it held at most %d jobs at once"):format(most))
    end)
  end)
end)
