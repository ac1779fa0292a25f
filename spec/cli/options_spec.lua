-- moonjob run's options as users of GNU parallel and other Unix tools type
-- them: the forms of -j, a missing or wrong value, an input or processor it
-- may not read. --halt: halt_spec.lua; what a terminal shows: terminal_spec.lua.
local h = require "helpers"
local cli = require "cli"

local MOONJOB, HABITS = cli.MOONJOB, cli.HABITS

describe("moonjob run's options #slow", function()
  it("takes -j1, -j=1, -j 1, --concurrency=1, --concurrency 1 and --jobs 1 alike", function()
    -- slow lines through one child run in one process; the default (a child
    -- per CPU, 2 here) or a value ignored would spread them
    local function children_used(form)
      local out, err, status = h.sh(MOONJOB .. "run " .. form .. " spec/fixtures/pid_after.lua",
        ('{"ms":100}\n'):rep(6))
      assert.equal(0, status, form .. ": " .. err)
      local pids, n = {}, 0
      for pid in out:gmatch('"result":(%d+)') do
        if not pids[pid] then n = n + 1 end
        pids[pid] = true
      end
      return n
    end
    assert.is_true(children_used("-j 3") >= 2) -- (so one process for -j1 is the option's doing)
    for _, form in ipairs({ "-j1", "-j=1", "-j 1", "--concurrency=1", "--concurrency 1", "--jobs 1", "--jobs=1" }) do
      assert.equal(1, children_used(form), form)
    end
  end)

  it("says what a value-taking option needs when its value is missing or wrong", function()
    local _, err, status = h.sh(MOONJOB .. "run " .. HABITS .. " -j")
    assert.equal(2, status)
    assert.equal("moonjob: -j needs a number: a whole number from 1 to 1024\nTry 'moonjob --help'.\n", err)
    _, err = h.sh(MOONJOB .. "run " .. HABITS .. " --concurrency=")
    assert.matches("^moonjob: %-%-concurrency needs a number: a whole number from 1 to 1024\n", err)
    _, err = h.sh(MOONJOB .. "run " .. HABITS .. " -jx")
    assert.matches("^moonjob: %-j needs a whole number from 1 to 1024, got 'x'\n", err)
    _, err = h.sh(MOONJOB .. "run " .. HABITS .. " --halt sometimes")
    assert.matches("^moonjob: %-%-halt needs now,fail=N, soon,fail=N, now,fail=P%% or soon,fail=P%%", err)
    assert.truthy(err:find("got 'sometimes'", 1, true))
  end)

  it("refuses a directory as its input, saying so", function()
    local dir = h.tmpdir()
    local _, err, status = h.sh(MOONJOB .. "run " .. HABITS .. " " .. dir)
    os.execute("rm -rf " .. dir)
    assert.equal(2, status)
    assert.equal(("moonjob: cannot open input '%s': illegal operation on a directory\n")
      :format(dir), err)
  end)

  it("says 'permission denied' for an input or processor it may not read", function()
    local dir = h.tmpdir()
    local input = h.write_file(dir .. "/in.ndjson", "1\n")
    local processor = h.write_file(dir .. "/p.lua", "return function(job) return job.data end\n")
    assert(os.execute("chmod 000 " .. input .. " " .. processor) == 0)
    -- as root, without the capabilities that read any file
    local as_user = h.AS_ROOT and "setpriv --bounding-set=-dac_override,-dac_read_search " or ""
    local _, err, status = h.sh(as_user .. MOONJOB .. "run " .. HABITS .. " " .. input)
    assert.equal(2, status)
    assert.equal(("moonjob: cannot open input '%s': permission denied\n")
      :format(input), err)
    _, err, status = h.sh(as_user .. MOONJOB .. "run " .. processor, "1\n")
    assert.equal(2, status)
    assert.equal(("moonjob: ELOAD: cannot open processor file '%s': permission denied\n"):format(processor), err)
    os.execute("rm -rf " .. dir)
  end)
end)
