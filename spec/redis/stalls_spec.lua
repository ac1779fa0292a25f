-- Durable queues on Redis: a server that stalls for less than a lease
-- (CLIENT PAUSE, DEBUG SLEEP) under three `moonjob worker` processes. A
-- stall shorter than the lease must cost no more than its own length: no
-- job runs twice, no report is refused, no fetched job sits idle for a lease.
local helpers = require "helpers"
local loop = require "moonjob.loop"
local rf = require "redis_faults"

local JOBS, LEASE = 90, 2

-- Adds JOBS jobs, runs them on three workers (optionally stalling Redis with
-- stall() once a third of them completed); returns the seconds it took, the
-- job log's lines and the workers' stderr.
local function run(server, queue, stall)
  local log = os.tmpname()
  local q = rf.producer(server, queue)
  local logs, pids = {}, {}
  for i = 1, 3 do pids[i], logs[i] = rf.worker(server, queue, "-j 2 --lease " .. LEASE) end
  helpers.wait_for(function()
    for i = 1, 3 do if not rf.read(logs[i]):find("connected to") then return false end end
    return true
  end, 20)
  local t0 = loop.now()
  for _ = 1, JOBS do assert(q:add({ log = log, sleep = 0.1 }, { attempts = 3 })) end
  if stall then
    helpers.wait_for(function() return q:counts().completed >= JOBS / 3 end, 30)
    stall()
  end
  helpers.wait_for(function() return q:counts().completed == JOBS end, 60)
  local took = (loop.now() - t0) / 1000
  for i = 1, 3 do rf.stop_worker(pids[i], "TERM") end
  local stderr = {}
  for i = 1, 3 do stderr[i] = rf.read(logs[i]) end
  return took, rf.lines(log), table.concat(stderr, "\n")
end

local function assert_ran_once_each(lines)
  local seen = {}
  for _, line in ipairs(lines) do
    local id = line:match("^(%S+)")
    assert.is_nil(seen[id], "job " .. id .. " ran twice: " .. line)
    seen[id] = true
  end
  assert.equal(JOBS, #lines)
end

describe("a Redis stall shorter than the lease #slow", function()
  after_each(rf.close_all)

  for _, way in ipairs({ "CLIENT PAUSE", "DEBUG SLEEP" }) do
    it(way .. " of 1.2 s: no job runs twice, no refusal, no job idle for a lease", function()
      local server = rf.server("--enable-debug-command yes")
      local plain = run(server, "plain")
      local took, lines, stderr = run(server, "stalled", function()
        if way == "CLIENT PAUSE" then server:cli("CLIENT", "PAUSE", "1200")
        else server:cli("DEBUG", "SLEEP", "1.2") end
      end)
      assert_ran_once_each(lines)
      assert.not_matches("refused", stderr)
      assert.not_matches("ELEASE", stderr)
      -- the stall costs about its own length; a fetched job left idle until
      -- its lease ran out would cost a lease more
      assert.is_true(took < plain + LEASE, ("%.1f s stalled, %.1f s plain"):format(took, plain))
      local c = rf.producer(server, "stalled"):counts()
      assert.equal(JOBS, c.completed)
    end)
  end
end)
