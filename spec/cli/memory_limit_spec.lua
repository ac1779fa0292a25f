-- `moonjob run --memory-limit SIZE`, and the cap every child has without it:
-- a runaway job fails with ENOMEM while the lines after it run; the cap
-- reaches the child (its RLIMIT_DATA backstop: twice the cap and 256 MiB);
-- `none` lifts it; a bad size is a usage error. The default cap is a share
-- of the machine's memory (moonjob.pool.options), or MOONJOB_MEMORY_LIMIT:
-- a runaway job is run under that, not under gigabytes.
local h = require "helpers"
local cli = require "cli"
local Options = require "moonjob.pool.options"

local MOONJOB = cli.MOONJOB
local RUNAWAY = " spec/fixtures/runaway.lua "
local MIB = 1024 * 1024

-- `moonjob run` of the runaway fixture on `lines`, with `env` before the command.
local function run(args, lines, env)
  return h.sh((env or "env -u MOONJOB_MEMORY_LIMIT ") .. MOONJOB .. "run" .. RUNAWAY .. args, lines)
end

-- The RLIMIT_DATA the child had, as /proc/self/limits writes it.
local function data_limit(args, env)
  local out, err, status = run(args, '"limits"\n', env)
  assert.equal(0, status, err)
  return cli.ndjson(out)[1].result
end

describe("moonjob run's memory cap #slow", function()
  it("caps a child by default: a runaway job fails with ENOMEM and the next line runs", function()
    local out, err, status = run("-j 1", '"runaway"\n"after"\n', "MOONJOB_MEMORY_LIMIT=64M ")
    assert.equal(1, status, err)
    local lines = cli.by_line(out)
    assert.equal("failed", lines[1].status)
    assert.equal("ENOMEM", lines[1].error.code)
    assert.equal(("the job needed more than memory_limit (%d bytes)"):format(64 * MIB), lines[1].error.message)
    assert.equal("completed", lines[2].status)
    assert.equal("after", lines[2].result)
  end)

  it("ends a child whose heap stayed full till its timeout: the next line runs on a fresh one", function()
    local out, err, status = run("-j 1 --timeout 0.5", '"hoard"\n"some"\n', "MOONJOB_MEMORY_LIMIT=64M ")
    assert.equal(1, status, err)
    local lines = cli.by_line(out)
    assert.equal("ETIMEDOUT", lines[1].error.code)
    assert.equal("completed", lines[2].status, out) -- (not ENOMEM in a child whose heap was still full)
    assert.equal(1000, lines[2].result)
  end)

  it("gives each child a share of the machine's memory by default", function()
    local share = Options.memory_limit({ size = 2 }) -- (MOONJOB_MEMORY_LIMIT is not set in the spec)
    assert.is_true(share >= Options.MEMORY_FLOOR)
    assert.is_true(share * 2 <= math.max(Options.machine_memory() / 2, 2 * Options.MEMORY_FLOOR))
    assert.equal(h.data_backstop(share), data_limit("-j 2"))
  end)

  it("takes --memory-limit SIZE: 64M, 1.5G, 64K, bytes", function()
    assert.equal(h.data_backstop(64 * MIB), data_limit("--memory-limit 64M"))
    assert.equal(h.data_backstop(1536 * MIB), data_limit("--memory-limit=1.5G"))
    assert.equal(h.data_backstop(100000000), data_limit("--memory-limit 100000000"))
    local out = run("-j 1 --memory-limit 64M", '"runaway"\n"after"\n', "MOONJOB_MEMORY_LIMIT=1G ")
    local lines = cli.by_line(out)
    assert.equal("ENOMEM", lines[1].error.code)
    assert.equal(("the job needed more than memory_limit (%d bytes)"):format(64 * MIB), lines[1].error.message)
    assert.equal("completed", lines[2].status)
  end)

  it("lifts the cap with --memory-limit none, whatever MOONJOB_MEMORY_LIMIT says", function()
    assert.equal("unlimited", data_limit("--memory-limit none", "MOONJOB_MEMORY_LIMIT=64M "))
    assert.equal("unlimited", data_limit("", "MOONJOB_MEMORY_LIMIT=none "))
  end)

  it("refuses a bad size with a usage error naming the flag and the forms it takes", function()
    for _, bad in ipairs({ "lots", "0", "-1", "12Q", "100T" }) do
      local out, err, status = run("--memory-limit " .. bad, '"after"\n')
      assert.equal(2, status, bad)
      assert.equal("", out)
      assert.matches("^moonjob: %-%-memory%-limit needs a size such as 512M, 2G, 1%.5G, 64K or a number of "
        .. "bytes %(K, M, G, T: powers of 1024%), or none %(no cap%), got '" .. bad:gsub("%p", "%%%0") .. "'\n", err)
    end
    local _, err, status = run("--memory-limit", '"after"\n')
    assert.equal(2, status)
    assert.matches("^moonjob: %-%-memory%-limit needs a size: a size such as 512M", err)
    _, err, status = run("", '"after"\n', "MOONJOB_MEMORY_LIMIT=lots ")
    assert.equal(2, status)
    assert.matches("MOONJOB_MEMORY_LIMIT must be a size such as 512M", err)
  end)
end)
