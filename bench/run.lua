-- bench/run.lua -- `make bench`: moonjob's throughput against the machine's floor.
--
-- For 1 and 2 children: no-op jobs per second through a pool (add N jobs,
-- drain), then the floor program (bench/floor.c: the same one-frame-out,
-- one-frame-back exchange over socketpairs, in plain C with epoll), and their
-- ratio. Each figure is the best of a few rounds, so a passing hiccup on a
-- shared machine does not decide it.
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
package.cpath = "build/?.so;" .. package.cpath

local moonjob = require "moonjob"
local core = require "moonjob.core"

local JOBS = tonumber(os.getenv("BENCH_JOBS")) or 100000
local ROUNDS = tonumber(os.getenv("BENCH_ROUNDS")) or 3

local function pool_rate(size)
  local pool = assert(moonjob.pool("bench/noop.lua", { size = size, echo = false }))
  pool:map({ 1, 2, 3, 4 }) -- children started and warm
  local best = 0
  for _ = 1, ROUNDS do
    local t0 = core.hrtime()
    for i = 1, JOBS do pool:add(i) end
    pool:drain()
    local rate = JOBS / ((core.hrtime() - t0) / 1e9)
    if rate > best then best = rate end
  end
  assert(pool:stats().failed == 0, "no-op jobs failed")
  pool:close()
  return best
end

local function floor_rate(size)
  local best = 0
  for _ = 1, ROUNDS do
    local p = assert(io.popen(("build/bench-floor %d %d"):format(size, JOBS)))
    local out = p:read("*a")
    p:close()
    local rate = tonumber(out:match("jobs_per_second (%d+)"))
    assert(rate, "the floor program printed: " .. out)
    if rate > best then best = rate end
  end
  return best
end

print(("moonjob bench: %d no-op jobs per round, best of %d rounds, %d logical CPUs")
  :format(JOBS, ROUNDS, core.cpu_count()))
print(("%-10s %14s %14s %8s"):format("children", "pool jobs/s", "floor jobs/s", "ratio"))
for _, size in ipairs({ 1, 2 }) do
  local pool, floor = pool_rate(size), floor_rate(size)
  print(("%-10d %14.0f %14.0f %8.2f"):format(size, pool, floor, pool / floor))
end
