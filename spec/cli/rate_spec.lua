-- moonjob run --rate N/s (N/m, N/h): the pool's rate (moonjob.pool.limits)
-- from the command line, one line per job. The processor
-- (fixtures/start_times.lua) returns when each line started on
-- CLOCK_MONOTONIC, the same clock in every process.
local h = require "helpers"
local cli = require "cli"
local args = require "moonjob.cli.args"

local MOONJOB = cli.MOONJOB
-- A loaded machine's delay between a line's sending and its start (the
-- parent's start times hold to the rate exactly; the children's are what
-- this command line shows). Without --rate the lines start within ms.
local CHILD_SLACK_MS = 400

describe("moonjob run --rate", function()
  it("reads N/s, N/m, N/h and plain N; a fraction spaces the starts", function()
    local function rate(text) return assert(args.parse({ "--rate", text })).rate end
    assert.same({ max = 10, per = 1 }, rate("10/s"))
    assert.same({ max = 10, per = 1 }, rate("10"))
    assert.same({ max = 30, per = 60 }, rate("30/m"))
    assert.same({ max = 100, per = 3600 }, rate("100/h"))
    assert.same({ max = 1, per = 2 }, rate("0.5/s"))
    assert.same({ max = 1, per = 0.4 }, rate("2.5/s"))
    assert.same({ max = 1, per = 7200 }, rate("0.5/h"))
    for _, bad in ipairs({ "x", "0/s", "-1/s", "10/d", "10/", "/s", "1e3/s", "2000000/s", "" }) do
      local o, err = args.parse({ "--rate=" .. bad })
      assert.is_nil(o, bad)
      assert.truthy(err:find("--rate needs", 1, true), err)
    end
  end)

  it("starts at most N lines a second and prints every line's result #slow", function()
    local out, err, status = h.sh(MOONJOB .. "run spec/fixtures/start_times.lua --rate 5/s -j 2", cli.numbers(12))
    assert.equal(0, status, err)
    local lines, n = cli.by_line(out)
    assert.equal(12, n)
    local starts = {}
    for i = 1, 12 do
      assert.equal("completed", lines[i].status)
      starts[i] = lines[i].result.start
    end
    table.sort(starts)
    for i = 1, 12 - 5 do
      assert.is_true(starts[i + 5] - starts[i] >= 1000 - CHILD_SLACK_MS, "6 lines started within a second")
    end
    assert.is_true(starts[12] - starts[1] >= 2000 - CHILD_SLACK_MS)
  end)

  it("counts lines, not batches of them, however short the lines are #slow", function()
    -- tiny lines read once some have run would go to the children in
    -- batches, many lines a job (the input reads ahead up to 64 lines a child)
    local out, err, status = h.sh(MOONJOB .. "run spec/fixtures/start_times.lua --rate 100/s -j 2", cli.numbers(250))
    assert.equal(0, status, err)
    local lines, n = cli.by_line(out)
    assert.equal(250, n)
    local starts = {}
    for i = 1, 250 do starts[i] = lines[i].result.start end
    table.sort(starts)
    for i = 1, 250 - 100 do
      assert.is_true(starts[i + 100] - starts[i] >= 1000 - CHILD_SLACK_MS, "101 lines started within a second")
    end
  end)

  it("says what --rate takes, with exit status 2 #slow", function()
    local _, err, status = h.sh(MOONJOB .. "run spec/fixtures/start_times.lua --rate x", "")
    assert.equal(2, status)
    assert.equal("moonjob: --rate needs N/s, N/m or N/h such as 10/s or 0.5/s (N above 0, at most 1e6), "
      .. "got 'x'\nTry 'moonjob --help'.\n", err)
    _, err, status = h.sh(MOONJOB .. "worker spec/fixtures/start_times.lua --redis redis://127.0.0.1:1 "
      .. "--queue q --rate 5/s")
    assert.equal(2, status)
    assert.equal("moonjob: --rate is for moonjob run, not moonjob worker (a queue's rate: moonjob limit --rate)\n"
      .. "Try 'moonjob --help'.\n", err)
    local help = h.sh(MOONJOB .. "run --help")
    assert.truthy(help:find("--rate N/s", 1, true))
  end)
end)
