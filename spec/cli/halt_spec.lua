-- moonjob run --halt now|soon,fail=N|P%: when a run stops for its failed
-- lines, what it prints and records then, and its exit status (3 and 4).
local h = require "helpers"
local cli = require "cli"

local MOONJOB, HABITS, by_line, input_file, now = cli.MOONJOB, cli.HABITS, cli.by_line, cli.input_file, cli.now

describe("moonjob run --halt", function()
  it("now,fail=1 stops at the first failed line, kills the running jobs and exits 3", function()
    local input = input_file({ { sleep = 30 }, { fail = "EBAD" }, { n = 3 }, { n = 4 } })
    local t0 = now()
    local out, err, status = h.sh(MOONJOB .. "run -j 2 --halt now,fail=1 " .. HABITS .. " " .. input)
    os.remove(input)
    assert.is_true(now() - t0 < 20, "the 30 s line was not killed")
    assert.equal(3, status)
    local lines, n = by_line(out)
    assert.equal("EBAD", lines[2].error.code)
    assert.is_nil(lines[1]) -- killed: not printed, it runs again with --resume
    assert.is_true(n <= 3, out) -- line 3 may have finished in the meantime, line 4 too late
    assert.equal("moonjob: halted (--halt now,fail=1): 1 line failed; running jobs were killed\n", err)
  end)

  it("soon,fail=1 starts nothing more after a failed line, lets the running ones finish and exits 4", function()
    local list = { { sleep = 1 }, { fail = "EBAD" } }
    for i = 3, 40 do list[i] = { sleep = 0.2 } end
    local input = input_file(list)
    local out, err, status = h.sh(MOONJOB .. "run -j 2 --halt soon,fail=1 " .. HABITS .. " " .. input)
    os.remove(input)
    assert.equal(4, status)
    local lines, n = by_line(out)
    assert.equal("completed", lines[1].status) -- it was running: it finished
    assert.equal("EBAD", lines[2].error.code)
    assert.is_true(n <= 4, out) -- at most what the second child had started meanwhile
    assert.equal("moonjob: halted (--halt soon,fail=1): 1 line failed; running jobs finished, no more "
      .. "were started\n", err)
  end)

  it("soon prints the failed line and what ran, once, also with -k and batches; --resume runs the rest", function()
    for _, k in ipairs({ "", "-k " }) do
      local list = {}
      for i = 1, 6000 do list[i] = i == 4500 and { fail = "EBAD" } or { n = i } end
      local input = input_file(list)
      local log = os.tmpname()
      os.remove(log)
      local args = "run -j 3 " .. k .. "--joblog " .. log .. " "
      local out, _, status = h.sh(MOONJOB .. args .. "--halt soon,fail=1 " .. HABITS .. " " .. input)
      assert.equal(4, status)
      local lines = by_line(out)
      assert.equal("EBAD", lines[4500].error.code, k)
      local again = h.sh(MOONJOB .. args .. "--resume " .. HABITS .. " " .. input)
      os.remove(input)
      os.remove(log)
      local completed = {}
      for line, state in (out .. again):gmatch('"line":(%d+),"status":"(%a+)"') do
        line = tonumber(line)
        assert.is_nil(completed[line], k .. "line " .. line .. " completed twice")
        if state == "completed" then completed[line] = true end
      end
      for i = 1, 6000 do assert.is_true(i == 4500 or completed[i], k .. "line " .. i .. " never completed") end
    end
  end)

  it("now,fail=P% stops once P% of the finished lines failed, counted from the third", function()
    local input = input_file({ { n = 1 }, { n = 2 }, { fail = "EBAD" }, { n = 4 }, { n = 5 }, { n = 6 } })
    local out, _, status = h.sh(MOONJOB .. "run -j 1 --halt now,fail=30% " .. HABITS .. " " .. input)
    assert.equal(3, status) -- 1 of 3 is 33%
    local lines = by_line(out)
    assert.equal("EBAD", lines[3].error.code)
    out, _, status = h.sh(MOONJOB .. "run -j 1 --halt soon,fail=50% " .. HABITS .. " " .. input)
    os.remove(input)
    assert.equal(1, status) -- never 50%: every line runs, and a failure exits 1 as without --halt
    local _, n = by_line(out)
    assert.equal(6, n)
  end)
end)
