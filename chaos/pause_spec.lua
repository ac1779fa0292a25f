-- make chaos: pausing a queue stops every worker on every host. Three
-- `moonjob worker` processes on two hosts (two network namespaces, one with
-- two workers, on a bridge this spec creates) run a queue; `moonjob pause`
-- must stop every fetch within a second (no run starts later than that),
-- running jobs finish, nothing starts while paused, and after `moonjob
-- resume` every job completes, each run exactly once. Needs root (ip netns).
--
-- Addresses: 10.231.78.0/24, on the bridge mjpause0 only; everything is
-- deleted afterwards, whatever happened.
local moonjob = require "moonjob"
local helpers = require "helpers"
local redis_server = require "redis_server"
local netns = require "netns"

local NET, HOSTS = "10.231.78", 2
local JOBS, MS = 1500, 40
local PROCESSOR = helpers.abs("chaos/processor.lua")

local hosts = netns.new("mjpause", NET, HOSTS)

local function run(cmd)
  return os.execute(cmd .. " >/dev/null 2>&1") == 0
end

local wall_ms = helpers.wall_ms

-- "<id> <attempt> <worker pid> <wall ms>" per run started.
local function read_runs(path)
  local runs = {}
  local f = io.open(path)
  if not f then return runs end
  for line in f:lines() do
    local id, _, pid, at = line:match("^(%S+) (%d+) (%d+) (%d+)$")
    if id then runs[#runs + 1] = { id = id, pid = tonumber(pid), at = tonumber(at) } end
  end
  f:close()
  return runs
end

describe("chaos: pausing a queue run by three workers on two hosts", function()
  local server, pids = nil, {}

  setup(function()
    hosts:setup()
    server = redis_server.start({ bind = "127.0.0.1 " .. NET .. ".1", password = "pause-pw" })
  end)

  teardown(function()
    for _, pid in ipairs(pids) do run("kill -KILL " .. pid) end
    if server then server:stop() end
    hosts:teardown()
  end)

  it("stops every fetch within a second, lets running jobs finish, and resumes with each job run once", function()
    local url = ("redis://:pause-pw@%s.1:%d/0"):format(NET, server.port)
    local runs_log = server.dir .. "/runs.log"
    local q = assert(moonjob.queue(server.url, "paused"))
    local pending = 0
    for i = 1, JOBS do
      pending = pending + 1
      local args = require("moonjob.redis.add").args(q.prefix,
        ('{"n":%d,"ms":%d,"log":"%s"}'):format(i, MS, runs_log), { id = "job" .. i })
      q.client:call(args, function() pending = pending - 1 end)
      if pending > 200 then helpers.wait_for(function() return pending < 100 end) end
    end
    helpers.wait_for(function() return pending == 0 end)
    -- host 1 runs two workers, host 2 one; each 2 children and 2 prefetched
    for w, host in ipairs({ 1, 1, 2 }) do
      local log = ("%s/worker%d.log"):format(server.dir, w)
      local cmd = ("%s %s scripts/moonjob worker %s --redis %s --queue paused -j 2 "
        .. "--lease 5 2>>%s >/dev/null & echo $!"):format(hosts:exec(host), helpers.LUAJIT, PROCESSOR, url, log)
      pids[#pids + 1] = assert(tonumber(helpers.first_line(cmd)))
    end
    local function completed() return assert(q:counts()).completed end
    helpers.wait_for(function() return completed() >= 200 end, 60) -- the workers started

    local paused_at = wall_ms()
    assert(q:pause())
    helpers.sleep(3) -- well past the second allowed: every run that started, started before it
    local c = assert(q:counts())
    assert.equal(0, c.active, "jobs still held or running 3 s after the pause")
    assert.is_true(c.paused)
    local runs = read_runs(runs_log)
    local last = 0
    for _, r in ipairs(runs) do last = math.max(last, r.at) end
    print(("\npause: the last run started %d ms after the pause; %d of %d jobs done; %d waiting")
      :format(last - paused_at, c.completed, JOBS, c.waiting))
    assert.is_true(last - paused_at < 1000, ("a run started %d ms after the pause"):format(last - paused_at))
    local during = #runs
    helpers.sleep(1.5)
    assert.equal(during, #read_runs(runs_log), "a run started while the queue was paused")
    assert.equal(c.completed, completed())
    for w = 1, 3 do
      local said = table.concat(helpers.lines(("%s/worker%d.log"):format(server.dir, w)), "\n")
      assert.matches("the queue is paused", said)
    end

    assert(q:resume())
    helpers.wait_for(function() return completed() == JOBS end, 120) -- every job completed
    local once = {}
    for _, r in ipairs(read_runs(runs_log)) do
      assert.is_nil(once[r.id], r.id .. " ran twice")
      once[r.id] = true
    end
    for i = 1, JOBS do assert.truthy(once["job" .. i], "job" .. i .. " never ran") end
    for w = 1, 3 do
      local said = table.concat(helpers.lines(("%s/worker%d.log"):format(server.dir, w)), "\n")
      assert.matches("the queue was resumed", said)
    end
    q:close()
  end)
end)
