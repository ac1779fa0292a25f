-- bench/flows.lua -- `make bench`, part: flows on Redis, next to plain jobs.
--
-- A redis-server of its own (as bench/redis.lua's). A flow here is of depth
-- 2 and width 10: a parent and 10 children, 11 no-op jobs. In turns with
-- the same number of plain jobs (3 rounds, medians), one run:
-- 1. adding: one producer (moonjob.queue), q:add_flow once per flow, next
--    to q:add once per job (each a round trip);
-- 2. running: 2 `moonjob worker` processes with the default flags (-j 2),
--    from their start to the last completion (the parents run after their
--    children, so a flow's jobs take two rounds of fetches).
-- Each process is ended by its pid.
package.path = "lua/?.lua;lua/?/init.lua;bench/?.lua;spec/support/?.lua;" .. package.path
package.cpath = "build/?.so;" .. package.cpath

local moonjob = require "moonjob"
local loop = require "moonjob.loop"
local redis_server = require "redis_server"
local library = require "moonjob.redis.library"

local FLOWS = tonumber(os.getenv("BENCH_FLOWS")) or 2000
local WIDTH = 10
local JOBS = FLOWS * (WIDTH + 1)
local common = require "common"
local wait_for = common.wait_for

local server = redis_server.start()
local q, q_err = moonjob.queue(server.url, "bench")
if not q then server:stop() error(q_err) end
local function start_worker() return common.start_worker(server.url, "bench", "-j 2") end
local stop = common.stop

local function flush()
  q.client:call_wait({ "FLUSHDB" })
  q.client:call_wait({ "FUNCTION", "LOAD", "REPLACE", library.text() })
end

local function add_flows()
  for i = 1, FLOWS do
    local children = {}
    for c = 1, WIDTH do children[c] = { data = { n = i, c = c } } end
    assert(q:add_flow({ data = { n = i }, children = children }))
  end
end

local function add_plain()
  for i = 1, JOBS do assert(q:add({ n = i })) end
end

-- One round: JOBS jobs added (as flows or plain), then run by 2 workers.
-- -> jobs added per second, jobs run per second.
local function round(add)
  flush()
  local t0 = loop.now()
  add()
  local added = JOBS / ((loop.now() - t0) / 1000)
  t0 = loop.now()
  local pids = { start_worker(), start_worker() }
  local ok = wait_for(function()
    local c = q:counts()
    return c and c.completed >= JOBS
  end, 300)
  local ran = JOBS / ((loop.now() - t0) / 1000)
  for _, pid in ipairs(pids) do stop(pid) end
  assert(ok, "the jobs did not finish")
  return added, ran
end

local function median(t)
  table.sort(t)
  return t[math.ceil(#t / 2)]
end

local function measure()
  local rates = { flows = { add = {}, run = {} }, plain = { add = {}, run = {} } }
  for r = 1, 3 do
    for _, kind in ipairs({ "plain", "flows" }) do
      rates[kind].add[r], rates[kind].run[r] = round(kind == "flows" and add_flows or add_plain)
    end
  end
  local fa, fr = median(rates.flows.add), median(rates.flows.run)
  local pa, pr = median(rates.plain.add), median(rates.plain.run)
  print(("\nFlows (a parent and %d children), %d flows = %d no-op jobs, next to %d plain jobs, median of 3 in turns:")
    :format(WIDTH, FLOWS, JOBS, JOBS))
  print(("  added, one producer:    flows %8.0f flows/s (%8.0f jobs/s)   plain q:add %8.0f jobs/s   %5.2fx")
    :format(fa / (WIDTH + 1), fa, pa, fa / pa))
  print(("  run, 2 workers -j 2:    flows %8.0f flows/s (%8.0f jobs/s)   plain       %8.0f jobs/s   %5.2fx")
    :format(fr / (WIDTH + 1), fr, pr, fr / pr))
end

local ok, err = xpcall(measure, debug.traceback)
common.stop_all()
pcall(q.close, q)
server:stop()
if not ok then io.stderr:write(err, "\n") os.exit(1) end
