-- bench/life.lua -- `make bench`: the Redis cost of a job's whole life, with
-- the defaults a user gets (`moonjob add` of a file, then 2 `moonjob worker
-- -j 2` processes, no other flag), next to the same with --prefetch 32.
--
-- Redis CPU per job = the server's used_cpu_user + used_cpu_sys (INFO cpu)
-- over the add and the drain, divided by the jobs; commands per job from
-- INFO commandstats (those run inside functions included). Own redis-server
-- (loopback, AOF everysec). Each process is ended by its pid.
package.path = "lua/?.lua;lua/?/init.lua;bench/?.lua;spec/support/?.lua;" .. package.path
package.cpath = "build/?.so;" .. package.cpath

local moonjob = require "moonjob"
local loop = require "moonjob.loop"
local redis_server = require "redis_server"
local common = require "common"
local LUAJIT, wait_for = common.LUAJIT, common.wait_for

local JOBS = tonumber(os.getenv("BENCH_LIFE_JOBS")) or 40000

local M = {}

-- The server's CPU seconds so far and its commands so far.
local function server_usage(server)
  local cpu = server:cli("INFO", "cpu")
  local user = tonumber(cpu:match("used_cpu_user:([%d.]+)"))
  local sys = tonumber(cpu:match("used_cpu_sys:([%d.]+)"))
  local all = 0
  for calls in server:cli("INFO", "commandstats"):gmatch("calls=(%d+)") do all = all + tonumber(calls) end
  return user + sys, all
end

-- One whole life of `jobs` no-op jobs on a fresh queue: -> jobs/s of the
-- drain, Redis us per job for the add, for the drain, commands per job.
function M.run(server, queue, worker_args, jobs)
  jobs = jobs or JOBS
  local q = assert(moonjob.queue(server.url, queue))
  local path = os.tmpname()
  local f = assert(io.open(path, "w"))
  for i = 1, jobs do f:write('{"n":', i, '}\n') end
  f:close()
  local cpu0, calls0 = server_usage(server)
  assert(os.execute(("%s scripts/moonjob add --redis %s --queue %s %s >/dev/null")
    :format(LUAJIT, server.url, queue, path)) == 0)
  os.remove(path)
  local cpu1 = server_usage(server)
  local t0 = loop.now()
  local pids = {}
  for i = 1, 2 do pids[i] = common.start_worker(server.url, queue, worker_args) end
  local ok = wait_for(function()
    local c = q:counts()
    return c and c.completed >= jobs
  end, 600)
  local seconds = (loop.now() - t0) / 1000
  for _, pid in ipairs(pids) do common.stop(pid) end
  local cpu2, calls2 = server_usage(server)
  q:close()
  assert(ok, "the jobs did not finish")
  return jobs / seconds, (cpu1 - cpu0) / jobs * 1e6, (cpu2 - cpu1) / jobs * 1e6, (calls2 - calls0) / jobs
end

function M.measure(server)
  print(("\nA job's whole life on Redis: %d no-op jobs, `moonjob add FILE`, then 2 `moonjob worker -j 2`"):format(JOBS))
  print(("%-28s %10s %12s %12s %12s %12s"):format("worker flags", "jobs/s", "add us/job", "drain us/job",
    "total us/job", "commands/job"))
  local rows = {}
  for i, flags in ipairs({ "-j 2", "-j 2 --prefetch 32" }) do
    local rate, add_us, drain_us, cmds = M.run(server, "life" .. i, flags)
    rows[flags] = { rate = rate, total = add_us + drain_us }
    print(("%-28s %10.0f %12.1f %12.1f %12.1f %12.1f"):format(flags, rate, add_us, drain_us, add_us + drain_us, cmds))
  end
  return rows
end

if not pcall(debug.getlocal, 4, 1) then -- run as a script
  local server = redis_server.start()
  local ok, err = pcall(M.measure, server)
  common.stop_all()
  server:stop()
  if not ok then error(err) end
end

return M
