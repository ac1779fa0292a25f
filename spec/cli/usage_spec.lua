-- moonjob run's usage and set-up errors: exit 2 with a message and no
-- stack trace, also for a processor that cannot load (it stops at once,
-- whatever the input's length).
local h = require "helpers"
local cli = require "cli"

local MOONJOB, numbers = cli.MOONJOB, cli.numbers

describe("moonjob run with a processor that cannot load", function()
  for _, case in ipairs({
    { "load_error.lua", "cannot start: missing configuration" },
    { "init_error.lua", "init%(%) failed: .*init exploded" },
  }) do
    it("(" .. case[1] .. ") stops at once over 20,000 lines: exit 2, the ELOAD message, no output", function()
      local input = h.write_file(os.tmpname(), numbers(20000))
      local t0 = os.time()
      local out, err, status = h.sh(MOONJOB .. "run -j 2 spec/fixtures/" .. case[1] .. " " .. input)
      local seconds = os.time() - t0
      os.remove(input)
      assert.equal(2, status, err)
      assert.equal("", out)
      assert.matches("^moonjob: ELOAD: .*" .. case[2], err)
      assert.equal(1, select(2, err:gsub("\n", "")), err)
      assert.is_true(seconds < 10, "took " .. seconds .. " s")
    end)
  end

  it("that never becomes ready stops after --start-timeout", function()
    local out, err, status = h.sh(MOONJOB .. "run --start-timeout 0.3 spec/fixtures/never_ready.lua", "1\n2\n")
    assert.equal(2, status, err)
    assert.equal("", out)
    assert.matches("did not become ready within 0.3 s %(start_timeout%)", err)
  end)

  it("goes on when it fails to load only after some job completed", function()
    -- flaky load: the first child loads, later ones fail (the file counts its loads)
    local dir = h.tmpdir()
    local processor = h.write_file(dir .. "/p.lua", ([[
local f = io.open(%q, "a+") f:write("x") local n = f:seek("end") f:close()
if n > 1 then error("second load fails") end
return function(job) if job.data == 1 then os.exit(9) end return job.data end
]]):format(dir .. "/loads"))
    local out, err, status = h.sh(MOONJOB .. "run -j 1 -k " .. processor, "2\n1\n3\n")
    os.execute("rm -rf " .. dir)
    assert.equal(1, status, err)
    assert.matches('^{"line":1,"status":"completed"', out)
    assert.matches('{"line":2,"status":"failed","error":{"code":"ECRASH"', out, 1, true)
    assert.matches('{"line":3,"status":"failed","error":{"code":"ELOAD"', out, 1, true)
  end)
end)

describe("moonjob run's usage errors", function()
  for _, case in ipairs({
    { "--timeout 0", "%-%-timeout needs a number of seconds from 0.001 to 1e9, got '0'" },
    { "--timeout 1e-300", "%-%-timeout needs a number of seconds from 0.001 to 1e9" },
    { "--timeout 1e10", "%-%-timeout needs a number of seconds from 0.001 to 1e9" },
    { "--start-timeout 0", "%-%-start%-timeout needs a number of seconds from 0.001 to 1e9" },
    { "--kill-after -1", "%-%-kill%-after needs a number of seconds from 0 to 1e9" },
    { "-j 100000", "%-j needs a whole number from 1 to 1024" },
  }) do
    it("exit 2 with a message, no stack trace: " .. case[1], function()
      local out, err, status = h.sh(MOONJOB .. "run " .. case[1] .. " examples/square.lua", "1\n")
      assert.equal(2, status, err)
      assert.equal("", out)
      assert.matches("^moonjob: " .. case[2], err)
      assert.is_nil(err:find("traceback", 1, true), err)
    end)
  end
end)
