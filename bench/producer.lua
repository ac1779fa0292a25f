-- bench/producer.lua -- `make bench`, part: the pure-Lua producer's add rate.
--
-- A redis-server of its own (as bench/redis.lua's). N adds of a small job,
-- one after the other (each a round trip), from plain Lua programs using
-- moonjob.producer with nothing of moonjob's build (spec/support/pure_lua.lua
-- runs them): LuaJIT and Lua 5.1 over Debian's redis-lua, Lua 5.4 over a
-- LuaSocket connection the producer opens; and q:add_bulk in pipelines of
-- 100. Next to moonjob.queue's q:add (the C core, this process) as the
-- reference: each rate as a ratio of it. 3 rounds in turns, medians.
package.path = "lua/?.lua;lua/?/init.lua;spec/support/?.lua;" .. package.path
package.cpath = "build/?.so;" .. package.cpath

local moonjob = require "moonjob"
local loop = require "moonjob.loop"
local library = require "moonjob.redis.library"
local pure_lua = require "pure_lua"
local redis_server = require "redis_server"

local N = tonumber(os.getenv("BENCH_PRODUCER_JOBS")) or 20000
local BULK = 100

local server = redis_server.start()
local q, q_err = moonjob.queue(server.url, "bench")
if not q then server:stop() error(q_err) end

local function flush()
  q.client:call_wait({ "FLUSHDB" })
  q.client:call_wait({ "FUNCTION", "LOAD", "REPLACE", library.text() })
end

local function core_rate()
  local t0 = loop.now()
  for i = 1, N do assert(q:add({ n = i })) end
  return N / ((loop.now() - t0) / 1000)
end

-- The timed loop of a plain Lua program: N adds, one by one or in bulks.
local BODY = [[
  local socket = require "socket"
  local q = assert(producer.queue(%s, "bench"))
  assert(q:add({ n = 0 })) -- the library made sure of, the connection warm
  local n, bulk = %d, %d
  local t0 = socket.gettime()
  if bulk == 1 then
    for i = 1, n do assert(q:add({ n = i })) end
  else
    for i = 1, n, bulk do
      local list = {}
      for j = i, math.min(n, i + bulk - 1) do list[#list + 1] = { n = j } end
      assert(q:add_bulk(list))
    end
  end
  say(n / (socket.gettime() - t0))
]]

local RUNS = {
  { name = "luajit, redis-lua: q:add", lua = "luajit", client = 'require("redis").connect("127.0.0.1", PORT)' },
  { name = "lua5.3, redis-lua: q:add", lua = "lua5.3", client = 'require("redis").connect("127.0.0.1", PORT)' },
  { name = "lua5.4, LuaSocket: q:add", lua = "lua5.4", client = "{ port = PORT }" },
  { name = ("lua5.4, LuaSocket: q:add_bulk (%d a pipeline)"):format(BULK), lua = "lua5.4", client = "{ port = PORT }",
    bulk = BULK },
}

local function pure_rate(run)
  local out, err, status = pure_lua.run(run.lua, server.port, BODY:format(run.client, N, run.bulk or 1))
  assert(status == 0, err)
  return assert(tonumber(out:match("^([%d.e+]+)")), out)
end

local function median(t)
  table.sort(t)
  return t[math.ceil(#t / 2)]
end

local function measure()
  local core, rates = {}, {}
  for r = 1, 3 do
    flush()
    core[r] = core_rate()
    for i, run in ipairs(RUNS) do
      flush()
      rates[i] = rates[i] or {}
      rates[i][r] = pure_rate(run)
    end
  end
  local reference = median(core)
  print(("\nPure-Lua producer (moonjob.producer): %d adds of a small job, one connection, median of 3 in turns:")
    :format(N))
  print(("  %-46s %9.0f jobs/s  %5.2f"):format("moonjob.queue q:add (C core, the reference)", reference, 1))
  for i, run in ipairs(RUNS) do
    local rate = median(rates[i])
    print(("  %-46s %9.0f jobs/s  %5.2f"):format(run.name, rate, rate / reference))
  end
end

local ok, err = xpcall(measure, debug.traceback)
pcall(q.close, q)
server:stop()
if not ok then io.stderr:write(err, "\n") os.exit(1) end
