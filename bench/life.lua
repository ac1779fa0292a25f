-- bench/life.lua -- `make bench`: the Redis cost of a job's whole life, with
-- the defaults a user gets (`moonjob add` of a file, then 2 `moonjob worker
-- -j 2` processes, no other flag), next to the same with --prefetch 32, and
-- next to BullMQ on the same server (bench/bullmq/life.js: addBulk, then 2
-- Workers in one process, or 2 sandboxed ones), with the ratios between them.
--
-- Redis CPU per job = the server's used_cpu_user + used_cpu_sys (INFO cpu)
-- over the add and the drain, divided by the jobs; commands per job from
-- INFO commandstats (those run inside functions and scripts included). Own
-- redis-server (loopback, AOF everysec), emptied (FLUSHALL) before each
-- contender's run. BENCH_LIFE_ROUNDS rounds (default 1), the contenders
-- taking turns in each; each keeps its best round (highest jobs/s). Each
-- process is ended by its pid (node's by its process group).
package.path = "lua/?.lua;lua/?/init.lua;bench/?.lua;spec/support/?.lua;" .. package.path
package.cpath = "build/?.so;" .. package.cpath

local moonjob = require "moonjob"
local loop = require "moonjob.loop"
local cjson = require "cjson"
local redis_server = require "redis_server"
local helpers = require "helpers"
local common = require "common"
local LUAJIT, wait_for = common.LUAJIT, common.wait_for

local JOBS = tonumber(os.getenv("BENCH_LIFE_JOBS")) or 40000
local ROUNDS = tonumber(os.getenv("BENCH_LIFE_ROUNDS")) or 1
-- The folder whose node_modules holds BullMQ (make bullmq-deps installs it).
local BULLMQ_DIR = os.getenv("BULLMQ_DIR") or "bench/bullmq"
local DEADLINE = 600 -- seconds a phase may take before the bench fails

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
  -- (watched by the size of completed: a counts() every 10 ms read each
  -- running job's hash, a cost of the watching, not of the jobs' lives)
  local completed = { "ZCARD", q.prefix .. "completed" }
  local ok = wait_for(function() return (tonumber(q.client:call_wait(completed)) or 0) >= jobs end, DEADLINE)
  local seconds = (loop.now() - t0) / 1000
  for _, pid in ipairs(pids) do common.stop(pid) end
  local cpu2, calls2 = server_usage(server)
  q:close()
  assert(ok, "the jobs did not finish")
  return jobs / seconds, (cpu1 - cpu0) / jobs * 1e6, (cpu2 - cpu1) / jobs * 1e6, (calls2 - calls0) / jobs
end

local function shell_quote(s)
  return "'" .. s:gsub("'", "'\\''") .. "'"
end

local function found(program)
  return os.execute("command -v " .. program .. " >/dev/null 2>&1") == 0
end

-- BullMQ's version when it can run here; else nil and why not.
function M.bullmq_version()
  if not helpers.exists(BULLMQ_DIR .. "/node_modules/bullmq/package.json") then
    if not found("npm") then return nil, "npm not found" end
    return nil, ("no %s/node_modules: make bullmq-deps installs it"):format(BULLMQ_DIR)
  end
  if not found("node") then return nil, "node not found" end
  return M.node("version").version
end

-- node bench/bullmq/life.js with args, in a process group of its own, waited
-- for; -> its JSON line, decoded. Raises with its stderr when it has none.
function M.node(...)
  local out = os.tmpname()
  local args = {}
  for i, a in ipairs({ ... }) do args[i] = shell_quote(tostring(a)) end
  local pid = common.start_group(("env BULLMQ_DIR=%s node bench/bullmq/life.js %s >%s 2>%s.err </dev/null")
    :format(shell_quote(helpers.abs(BULLMQ_DIR)), table.concat(args, " "), out, out))
  local ended = common.wait_gone(pid, DEADLINE)
  common.stop(pid) -- its group: children it left behind
  local f, e = io.open(out), io.open(out .. ".err")
  local line, err = f and f:read("*l"), e and e:read("*a") or ""
  if f then f:close() end
  if e then e:close() end
  os.remove(out)
  os.remove(out .. ".err")
  assert(ended, ("bench/bullmq/life.js %s: still running after %d s"):format(table.concat(args, " "), DEADLINE))
  local ok, result = pcall(cjson.decode, line or "")
  assert(ok and type(result) == "table", ("bench/bullmq/life.js %s failed: %s"):format(table.concat(args, " "), err))
  return result
end

-- BullMQ's whole life of `jobs` no-op jobs on queue, drained in mode
-- ("inproc" or "sandboxed"): -> the same four figures as M.run.
function M.run_bullmq(server, queue, mode, jobs)
  jobs = jobs or JOBS
  local cpu0, calls0 = server_usage(server)
  M.node(server.port, jobs, "add", queue)
  local cpu1 = server_usage(server)
  local drain = M.node(server.port, jobs, mode, queue)
  local cpu2, calls2 = server_usage(server)
  return drain.rate, (cpu1 - cpu0) / jobs * 1e6, (cpu2 - cpu1) / jobs * 1e6, (calls2 - calls0) / jobs
end

-- The contenders, in the order they take turns and print: `key` is the
-- row's key in what M.measure returns (a moonjob row's key: its flags).
local function contenders(bullmq)
  local list = {
    { key = "-j 2", label = "moonjob -j 2", flags = "-j 2" },
    { key = "-j 2 --prefetch 32", label = "moonjob -j 2 --prefetch 32", flags = "-j 2 --prefetch 32" },
  }
  if bullmq then
    list[#list + 1] = { key = "bullmq inproc", label = "BullMQ in-process, c 50", mode = "inproc" }
    list[#list + 1] = { key = "bullmq sandboxed", label = "BullMQ sandboxed, c 2", mode = "sandboxed" }
  end
  return list
end

local ROW = "%-28s %10s %12s %12s %12s %12s"

local function print_row(c, r)
  print(("%-28s %10.0f %12.1f %12.1f %12.1f %12.1f"):format(c.label, r.rate, r.add, r.drain, r.total, r.cmds))
end

-- The ratios the targets name: moonjob's defaults against BullMQ's Workers.
local function print_ratios(rows)
  local m = rows["-j 2"]
  for _, other in ipairs({ { "bullmq inproc", "in-process" }, { "bullmq sandboxed", "sandboxed" } }) do
    local b = rows[other[1]]
    print(("moonjob -j 2 / BullMQ %-11s jobs/s %5.2fx (target >= 2x), Redis us/job %5.2fx (target <= 0.5x)")
      :format(other[2] .. ":", m.rate / b.rate, m.total / b.total))
  end
  print(("moonjob -j 2's Redis CPU per job: %.1f us (target <= 20)"):format(m.total))
end

-- One run of contender c in round `round` on an emptied server.
local function run_one(server, c, round, i)
  server:cli("FLUSHALL")
  local queue = ("life%d_%d"):format(round, i)
  local rate, add, drain, cmds
  if c.mode then
    rate, add, drain, cmds = M.run_bullmq(server, queue, c.mode)
  else
    rate, add, drain, cmds = M.run(server, queue, c.flags)
  end
  return { rate = rate, add = add, drain = drain, total = add + drain, cmds = cmds }
end

-- -> rows by key: { rate, add, drain, total, cmds } (jobs/s, Redis us/job,
-- commands/job), each contender's best round.
function M.measure(server)
  local version, why = M.bullmq_version()
  print(("\nA job's whole life on Redis: %d no-op jobs, added then drained by 2 workers; best of %d round(s)")
    :format(JOBS, ROUNDS))
  print("moonjob: `moonjob add FILE`, then 2 `moonjob worker -j 2` processes")
  print(version and ("BullMQ %s: addBulk of 1000, then 2 Workers (default options; no removeOnComplete)"):format(version)
    or ("BullMQ: skipped (%s)"):format(why))
  local list, rows = contenders(version), {}
  for round = 1, ROUNDS do
    for i, c in ipairs(list) do
      local r = run_one(server, c, round, i)
      if not rows[c.key] or r.rate > rows[c.key].rate then rows[c.key] = r end
    end
  end
  print(ROW:format("contender", "jobs/s", "add us/job", "drain us/job", "total us/job", "commands/job"))
  for _, c in ipairs(list) do print_row(c, rows[c.key]) end
  if version then print_ratios(rows) end
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
