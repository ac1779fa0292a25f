-- `moonjob worker --memory-limit SIZE`, and the cap every child has without
-- it: a runaway job fails with ENOMEM and the worker goes on with the next
-- job; the cap reaches the child (its RLIMIT_DATA backstop: twice the cap
-- and 256 MiB) and the worker's first line says it; `none` lifts it; a bad
-- size is a usage error. The default is a share of the machine's memory
-- (moonjob.pool.options), or MOONJOB_MEMORY_LIMIT: a runaway job is run
-- under that, not under gigabytes. (A real redis-server: spec/support/redis_queue.lua.)
local helpers = require "helpers"
local rq = require "redis_queue"
local Options = require "moonjob.pool.options"

local RUNAWAY = helpers.abs(helpers.fixture("runaway.lua"))
local MIB = 1024 * 1024

-- A `moonjob worker` of the runaway fixture on `queue`, `env` before the
-- command (MOONJOB_MEMORY_LIMIT unset without it); -> its stderr's path,
-- once it connected.
local function worker(queue, args, env)
  local log = os.tmpname()
  local cmd = ("%s%s scripts/moonjob worker %s --redis %s --queue %s %s 2>%s >/dev/null & echo $!")
    :format(env or "env -u MOONJOB_MEMORY_LIMIT ", helpers.LUAJIT, RUNAWAY, rq.server().url, queue, args, log)
  local pid = assert(tonumber(helpers.first_line(cmd)))
  rq.close_after({ close = function() os.execute(("kill -KILL %d 2>/dev/null"):format(pid)) end })
  assert.is_truthy(rq.worker_connected(log), "the worker connected")
  return log
end

local function stderr_of(log) return table.concat(rq.read_lines(log), "\n") end

-- The RLIMIT_DATA of a child of a worker started with `args` and `env`.
local function data_limit(args, env)
  local name = rq.new_queue()
  local log = worker(name, args, env)
  local q = rq.new_producer(name)
  local result, err = assert(q:add("limits")):wait(20)
  assert.is_nil(err)
  return result, stderr_of(log)
end

rq.describe(function()
  describe("moonjob worker's memory cap", function()
    it("caps a child by default: a runaway job fails with ENOMEM and the next job completes", function()
      local name = rq.new_queue()
      local log = worker(name, "-j 1", "MOONJOB_MEMORY_LIMIT=64M ")
      local q = rq.new_producer(name)
      local runaway = assert(q:add("runaway"))
      local after = assert(q:add("after"))
      local _, err = runaway:wait(30)
      assert.equal("ENOMEM", err and err.code)
      assert.equal(("the job needed more than memory_limit (%d bytes)"):format(64 * MIB), err.message)
      assert.equal("after", after:wait(20))
      local said = stderr_of(log)
      assert.matches("1 child on queue " .. name .. ", memory limit 64 MiB per child", said, 1, true)
      assert.matches(("failed, attempt 1/1: ENOMEM: the job needed more than memory_limit (%d bytes)")
        :format(64 * MIB), said, 1, true)
    end)

    it("gives each child a share of the machine's memory by default", function()
      local share = Options.memory_limit({ size = 1 })
      local limit, said = data_limit("-j 1")
      assert.equal(helpers.data_backstop(share), limit)
      assert.matches(("memory limit %d MiB per child"):format(share / MIB), said, 1, true)
    end)

    it("takes --memory-limit SIZE, and none to lift the cap", function()
      local limit, said = data_limit("-j 1 --memory-limit 64M", "MOONJOB_MEMORY_LIMIT=1G ")
      assert.equal(helpers.data_backstop(64 * MIB), limit)
      assert.matches("memory limit 64 MiB per child", said, 1, true)
      limit, said = data_limit("-j 1 --memory-limit none", "MOONJOB_MEMORY_LIMIT=64M ")
      assert.equal("unlimited", limit)
      assert.matches("1 child on queue q%d+, no memory limit", said)
    end)

    it("refuses a bad size with a usage error naming the flag", function()
      local _, err, status = rq.moonjob("worker " .. RUNAWAY .. " --queue q --memory-limit 2X")
      assert.equal(2, status)
      assert.matches("^moonjob: %-%-memory%-limit needs a size such as 512M, 2G, 1%.5G, 64K", err)
      assert.matches("got '2X'", err, 1, true)
    end)
  end)
end)
