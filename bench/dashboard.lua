-- bench/dashboard.lua -- `make bench`, part 5: the dashboard on a big queue.
--
-- A redis-server of its own; a queue of 100,000 waiting jobs and 20,000
-- completed ones (run by a `moonjob worker` on bench/noop.lua), then
-- `moonjob dashboard` on a free loopback port. Each page and API call is
-- fetched by curl, 30 times in turn; the median and the worst of its
-- time_total are reported next to the floor: the same server answering a
-- path it does not have (404: the HTTP round trip and curl's own cost),
-- and against the target (under 50 ms for / and /metrics with 100,000 jobs).
-- Listing is paged in Redis, so the times should not depend on the number
-- of jobs. Each process is ended by its pid.
package.path = "lua/?.lua;lua/?/init.lua;bench/?.lua;spec/support/?.lua;" .. package.path
package.cpath = "build/?.so;" .. package.cpath

local moonjob = require "moonjob"
local redis_server = require "redis_server"

local WAITING = tonumber(os.getenv("BENCH_DASHBOARD_JOBS")) or 100000
local COMPLETED, TRIES = 20000, 30
local common = require "common"
local LUAJIT, first_line, wait_for = common.LUAJIT, common.first_line, common.wait_for

local function add_jobs(q, n, from)
  local pending = 0
  for i = 1, n do
    pending = pending + 1
    q.client:call(require("moonjob.redis.add").args(q.prefix, ('{"n":%d}'):format(from + i), {}, false),
      function() pending = pending - 1 end)
    if pending >= 512 then wait_for(function() return pending < 256 end, 60) end
  end
  wait_for(function() return pending == 0 end, 60)
end

local server = redis_server.start()
local q = assert(moonjob.queue(server.url, "big"))
local pids = {}
local function finish()
  for _, pid in ipairs(pids) do os.execute("kill -TERM " .. pid .. " 2>/dev/null") end
  q:close()
  server:stop()
end

local ok, err = pcall(function()
  add_jobs(q, COMPLETED, 0)
  pids[#pids + 1] = tonumber(first_line(("%s scripts/moonjob worker bench/noop.lua --redis %s --queue big -j 2 --quiet "
    .. "2>/dev/null >/dev/null & echo $!"):format(LUAJIT, server.url)))
  assert(wait_for(function() return q:counts().completed >= COMPLETED end, 120), "the worker did not finish")
  os.execute("kill -TERM " .. pids[1])
  wait_for(function() return q:counts().active == 0 end, 30)
  add_jobs(q, WAITING, COMPLETED)
  local port = tonumber(first_line([[python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()']]))
  pids[#pids + 1] = tonumber(first_line(("%s scripts/moonjob dashboard --redis %s --listen 127.0.0.1:%d "
    .. "2>/dev/null >/dev/null & echo $!"):format(LUAJIT, server.url, port)))
  assert(wait_for(function()
    return first_line(("curl -s -o /dev/null -w '%%{http_code}' http://127.0.0.1:%d/"):format(port)) == "200"
  end, 20), "the dashboard did not answer")
  local c = q:counts()
  print(("\ndashboard: queue of %d waiting and %d completed jobs (%s)"):format(c.waiting, c.completed,
    os.date("!%Y-%m-%d %H:%M UTC")))
  local one = assert(q:jobs("waiting", { limit = 1, offset = 50000 }))[1].id
  local paths = { "/missing (floor: a 404)", "/", "/metrics", "/api/queues", "/api/queues/big",
    "/api/queues/big/jobs?state=waiting&offset=50000&limit=20", "/api/queues/big/jobs?state=completed&limit=20",
    "/api/queues/big/jobs/" .. one }
  local floor
  print(("  %-58s %9s %9s %8s"):format("path", "median ms", "worst ms", "x floor"))
  for _, label in ipairs(paths) do
    local path = label:match("^(%S+)")
    local times = {}
    for i = 1, TRIES do
      times[i] = tonumber(first_line(("curl -s -o /dev/null -w '%%{time_total}' 'http://127.0.0.1:%d%s'"):format(port, path))) * 1000
    end
    table.sort(times)
    local median = times[math.floor(TRIES / 2) + 1]
    floor = floor or median
    print(("  %-58s %9.2f %9.2f %8.2f"):format(label, median, times[TRIES], median / floor))
  end
  print("  target: / and /metrics under 50 ms with 100,000 jobs")
end)
finish()
if not ok then error(err, 0) end
