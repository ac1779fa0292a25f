-- bench/failover.lua -- how long a Redis Sentinel failover stops a queue:
-- from a SIGKILL of the primary to jobs running again.
--
-- Each run, on loopback: a primary (AOF on), its replica and three
-- sentinels (spec/support/sentinels.lua: down-after-milliseconds 1000,
-- quorum 2), BENCH_FAILOVER_JOBS jobs of 5 ms each added, 2 `moonjob
-- worker -j 2` on the redis+sentinel:// URL; once they have run for a
-- second the primary is SIGKILLed. Measured from the kill, looking every
-- 10 ms: the sentinels naming the replica (its promotion's end,
-- +switch-master), the first job completed on the new primary (its totals
-- counter, read on the replica), and every worker saying it moved
-- ("primary for m is now ..." on its stderr). BENCH_FAILOVER_RUNS runs
-- (default 3), each with servers of its own; the medians are printed.
-- Every process is ended by its pid.
--
--   luajit bench/failover.lua
package.path = "lua/?.lua;lua/?/init.lua;bench/?.lua;spec/support/?.lua;" .. package.path
package.cpath = "build/?.so;" .. package.cpath

local moonjob = require "moonjob"
local helpers = require "helpers"
local sentinels = require "sentinels"
local common = require "common"

local RUNS = tonumber(os.getenv("BENCH_FAILOVER_RUNS")) or 3
local JOBS = tonumber(os.getenv("BENCH_FAILOVER_JOBS")) or 8000
local PROCESSOR = "chaos/processor.lua" -- waits data.ms, logs the run to data.log
local wall_ms = helpers.wall_ms

-- A worker on url with its stderr in log; -> its pid (common.stop ends it).
local function start_worker(url, log)
  local cmd = ("MOONJOB_REDIS='%s' %s scripts/moonjob worker %s --queue bench -j 2 2>%s >/dev/null & echo $!")
    :format(url, common.LUAJIT, PROCESSOR, log)
  return assert(tonumber(common.first_line(cmd)))
end

local function said(log, text)
  local f = io.open(log)
  if not f then return false end
  local all = f:read("*a")
  f:close()
  return all:find(text, 1, true) ~= nil
end

local function add_jobs(q)
  local list = {}
  for i = 1, JOBS do
    list[#list + 1] = { n = i, ms = 5, log = "/dev/null" }
    if #list == 500 or i == JOBS then
      assert(q:add_bulk(list))
      list = {}
    end
  end
end

-- One run: -> ms from the kill to the switch, the first completion, every worker back.
local function run_once(g, dir)
  local url, old = g:url(), g:primary_port()
  local primary, replica = g:server(old), g:other(old)
  local q = assert(moonjob.queue(url, "bench"))
  add_jobs(q)
  local logs, pids = { dir .. "/w1.log", dir .. "/w2.log" }, {}
  for i, log in ipairs(logs) do pids[i] = start_worker(url, log) end
  local function completed() return tonumber(replica:cli("HGET", "mj:{bench}:totals", "completed")) or 0 end
  assert(common.wait_for(function() return completed() >= 200 end, 60), "the workers ran no job")
  common.wait_for(function() return false end, 1)
  local killed, base = wall_ms(), nil
  primary:kill9()
  base = completed()
  local switched, first, back = nil, nil, {}
  local ok = common.wait_for(function()
    local now = wall_ms()
    if not switched and g:named_by(1) == replica.port then switched = now end
    if not first and completed() > base then first = now end
    for i, log in ipairs(logs) do
      if not back[i] and said(log, "primary for m is now 127.0.0.1:" .. replica.port) then back[i] = now end
    end
    return switched and first and back[1] and back[2]
  end, 60)
  for _, pid in ipairs(pids) do common.stop(pid) end
  q:close()
  assert(ok, "no failover within 60 s")
  return switched - killed, first - killed, math.max(back[1], back[2]) - killed
end

local function median(t)
  table.sort(t)
  return t[math.ceil(#t / 2)]
end

local switch, first, back = {}, {}, {}
for r = 1, RUNS do
  local g = sentinels.start()
  local dir = helpers.tmpdir()
  local ok, a, b, c = pcall(run_once, g, dir)
  common.stop_all()
  g:stop()
  os.execute("rm -rf " .. dir)
  if not ok then error(a, 0) end
  switch[r], first[r], back[r] = a, b, c
  io.stderr:write(("failover run %d: switched %d ms, first job %d ms, workers back %d ms\n"):format(r, a, b, c))
end
print(("Sentinel failover (down-after-milliseconds 1000, 2 workers -j 2), median of %d runs, from the SIGKILL"
  .. " of the primary:"):format(RUNS))
print(("  sentinels switched to the replica  %6d ms"):format(median(switch)))
print(("  first job completed on it          %6d ms"):format(median(first)))
print(("  every worker moved to it           %6d ms"):format(median(back)))
