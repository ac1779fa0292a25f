-- Durable queues on Redis: a server that stalls for less than a lease
-- (CLIENT PAUSE, DEBUG SLEEP) under `moonjob worker` processes. A stall
-- shorter than the lease must cost no more than its own length: no job runs
-- twice, no report is refused, no fetched job sits idle for a lease; also
-- when the stall outlasts the connection's watchdog and answers are lost.
local helpers = require "helpers"
local loop = require "moonjob.loop"
local rf = require "redis_workers"

local JOBS, LEASE = 90, 2

-- Adds JOBS jobs, runs them on three workers (optionally stalling Redis with
-- stall() once a third of them completed); returns the seconds it took, the
-- job log's lines and the workers' stderr.
-- w: { workers = 3, args = "-j 2 --lease 2", jobs = 90, sleep = 0.1 }
local function run(server, queue, stall, w)
  w = w or { workers = 3, args = "-j 2 --lease " .. LEASE, jobs = JOBS, sleep = 0.1 }
  local log = os.tmpname()
  local q = rf.producer(server, queue)
  local logs, pids = {}, {}
  for i = 1, w.workers do pids[i], logs[i] = rf.worker(server, queue, w.args) end
  helpers.wait_for(function()
    for i = 1, w.workers do if not rf.read(logs[i]):find("connected to") then return false end end
    return true
  end, 20)
  local t0 = loop.now()
  for _ = 1, w.jobs do assert(q:add({ log = log, sleep = w.sleep }, { attempts = 3 })) end
  if stall then
    helpers.wait_for(function() return q:counts().completed >= w.jobs / 3 end, 30)
    stall()
  end
  helpers.wait_for(function() return q:counts().completed == w.jobs end, 60)
  local took = (loop.now() - t0) / 1000
  for i = 1, w.workers do rf.stop_worker(pids[i], "TERM") end
  local stderr = {}
  for i = 1, w.workers do stderr[i] = rf.read(logs[i]) end
  return took, rf.lines(log), table.concat(stderr, "\n")
end

local recovered = rf.recovered

local function assert_ran_once_each(lines, jobs)
  local seen = {}
  for _, line in ipairs(lines) do
    local id = line:match("^(%S+)")
    assert.is_nil(seen[id], "job " .. id .. " ran twice: " .. line)
    seen[id] = true
  end
  assert.equal(jobs or JOBS, #lines)
end

describe("a Redis stall #slow", function()
  after_each(rf.close_all)

  for _, way in ipairs({ "CLIENT PAUSE", "DEBUG SLEEP" }) do
    it(way .. " of 1.2 s: no job runs twice, no refusal, no job idle for a lease", function()
      local server = rf.server("--enable-debug-command yes")
      local _, lines, stderr = run(server, "stalled", function()
        if way == "CLIENT PAUSE" then server:cli("CLIENT", "PAUSE", "1200")
        else server:cli("DEBUG", "SLEEP", "1.2") end
      end)
      assert_ran_once_each(lines)
      assert.not_matches("refused", stderr)
      assert.not_matches("ELEASE", stderr)
      -- the stall costs about its own length: no fetched job was left idle
      -- until its lease ran out (a count, not a time: a busy machine's
      -- slowness must not fail it)
      assert.equal(0, recovered(server, "stalled"))
      local c = rf.producer(server, "stalled"):counts()
      assert.equal(JOBS, c.completed)
    end)
  end

  it("a stall past the watchdog: a fetch and reports whose answers were lost are made good", function()
    -- lease 10 s: the watchdog drops the connection after 5 s; DEBUG SLEEP
    -- 6.5 s then runs the commands the worker sent meanwhile, answering none
    local server = rf.server("--enable-debug-command yes")
    local w = { workers = 1, args = "-j 2 --prefetch 0 --lease 10", jobs = 30, sleep = 0.2 }
    local _, lines, stderr = run(server, "stalled", function() server:cli("DEBUG", "SLEEP", "6.5") end, w)
    assert_ran_once_each(lines, w.jobs)
    assert.matches("unreachable", stderr) -- the stall did drop the connection
    assert.not_matches("refused", stderr)
    -- jobs fetched by the lost fetch are given back at once, not left to their lease (10 s)
    assert.equal(0, recovered(server, "stalled"))
  end)
end)
