-- bench/steps.lua -- `make bench`: what each step of a job's life costs
-- Redis through the library alone, no worker: where bench/life.lua's whole
-- life goes, and the floor a worker's batching can reach.
--
-- A redis-server of its own (loopback; AOF off, then on with appendfsync
-- everysec). Redis CPU (INFO cpu: used_cpu_user + used_cpu_sys) per job of:
--   add       moonjob_add_bulk, 500 jobs per call, NOTIFY 0 (as `moonjob add`)
--   fetch     moonjob_fetch of 256 jobs per call (lease 5 min)
--   complete  moonjob_complete of 256 jobs per call (with run ms)
-- and per call of: PING, a trivial FCALL (moonjob_version), an empty fetch
-- (its housekeeping: stalled leases, delayed jobs, schedules, retention,
-- flows' parents, limits).
package.path = "lua/?.lua;lua/?/init.lua;bench/?.lua;spec/support/?.lua;" .. package.path
package.cpath = "build/?.so;" .. package.cpath

local moonjob = require "moonjob"
local add_args = require "moonjob.redis.add"
local redis_server = require "redis_server"

local JOBS = tonumber(os.getenv("BENCH_STEPS_JOBS")) or 40000
local ADD_BATCH, DRAIN_BATCH = 500, 256
local CALLS = 20000

local function cpu_seconds(server)
  local info = server:cli("INFO", "cpu")
  return tonumber(info:match("used_cpu_user:([%d.]+)")) + tonumber(info:match("used_cpu_sys:([%d.]+)"))
end

-- us of Redis CPU per unit that fn() costs, over `units`.
local function cost(server, units, fn)
  local c0 = cpu_seconds(server)
  fn()
  return (cpu_seconds(server) - c0) / units * 1e6
end

local function fetch_args(q, n)
  return { "FCALL", "moonjob_fetch", 1, q.prefix, "bench-steps", n, 300000, "", 86400000, 1048576, "", n, 0 }
end

-- The three steps of JOBS jobs on a fresh queue -> us per job of each.
local function steps(server, name)
  local q = assert(moonjob.queue(server.url, name))
  local texts, rows = {}, {}
  for i = 1, ADD_BATCH do texts[i] = '{"n":' .. i .. "}" end
  local call = add_args.bulk_calls(add_args.args(q.prefix, "{}", {}, false, ""), texts)[1].args
  local add = cost(server, JOBS, function()
    for _ = 1, JOBS / ADD_BATCH do assert(q.client:call_wait(call)) end
  end)
  local fetch = cost(server, JOBS, function()
    while #rows < JOBS do
      local r = assert(q.client:call_wait(fetch_args(q, DRAIN_BATCH)))
      for i = 2, #r do rows[#rows + 1] = r[i] end
    end
  end)
  local complete = cost(server, JOBS, function()
    for first = 1, JOBS, DRAIN_BATCH do
      local args = { "FCALL", "moonjob_complete", 1, q.prefix, "\0ms" }
      for i = first, math.min(JOBS, first + DRAIN_BATCH - 1) do
        local row = rows[i]
        args[#args + 1] = row[1]; args[#args + 1] = row[2]; args[#args + 1] = "null"; args[#args + 1] = "0"
      end
      assert(q.client:call_wait(args))
    end
  end)
  local calls = {}
  for _, c in ipairs({ { "PING" }, { "FCALL", "moonjob_version", 0 }, fetch_args(q, 0) }) do
    calls[#calls + 1] = cost(server, CALLS, function() for _ = 1, CALLS do q.client:call_wait(c) end end)
  end
  q:close()
  return add, fetch, complete, calls
end

local function measure()
  print(("\nEach step through the library alone (no worker): Redis CPU, %d no-op jobs; add %d, fetch and complete"
    .. " %d per call"):format(JOBS, ADD_BATCH, DRAIN_BATCH))
  print(("%-22s %9s %9s %9s %9s   %8s %8s %12s"):format("server", "add", "fetch", "complete", "us/job",
    "PING", "FCALL", "empty fetch"))
  for _, aof in ipairs(os.getenv("STEPS_AOF") and { os.getenv("STEPS_AOF") } or { "no", "yes" }) do
    local server = redis_server.start({ extra = "--appendonly " .. aof })
    local ok, add, fetch, complete, calls = pcall(steps, server, "steps")
    server:stop()
    if not ok then error(add, 0) end
    print(("%-22s %9.1f %9.1f %9.1f %9.1f   %8.1f %8.1f %12.1f"):format(
      aof == "yes" and "AOF everysec" or "no AOF", add, fetch, complete, add + fetch + complete,
      calls[1], calls[2], calls[3]))
  end
  print("(us per job for the steps; us per call for PING, a trivial FCALL and a fetch that takes nothing)")
end

measure()
