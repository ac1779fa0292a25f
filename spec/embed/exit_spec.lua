-- Every way out of a program is clean: no crash, the children ended, no hang.
-- Each case runs a separate luajit several times (the crash this guards
-- against came in about 2 runs of 5).
local h = require "helpers"


local SCRIPT = [[
local moonjob = require "moonjob"
local loop = require "moonjob.loop"
local pool = assert(moonjob.pool("spec/fixtures/fails.lua", { size = 2, echo = false }))
local how, pidfile = arg[1], arg[2]
if how ~= "starting" then
  pool:run({ how = "none" })
  loop.wait_until(function() return pool:stats().workers[2].pid ~= nil end)
end
if how == "running" then
  pool:add({ how = "sleep", seconds = 5 })
  loop.wait_until(function() return pool:stats().active == 1 end)
end
local f = io.open(pidfile, "w")
for _, w in ipairs(pool:stats().workers) do if w.pid then f:write(w.pid, "\n") end end
f:close()
if how == "error" then error("ends with an error") end
if how == "exit_close" then os.exit(3, true) end
if how == "exit" then os.exit(4) end
]]

describe("a program that ends without closing its pool", function()
  local dir
  before_each(function() dir = h.tmpdir() end)
  after_each(function() os.execute("rm -rf " .. dir) end)

  for _, case in ipairs({
    { "normal", "at its end", 0 },
    { "error", "with an error", 1 },
    { "exit_close", "with os.exit(3, true)", 3 },
    { "exit", "with os.exit(4)", 4 },
    { "running", "while a job runs", 0 },
    { "starting", "while its children start", 0 },
  }) do
    it("exits " .. case[2] .. " with its own status, and leaves no child running", function()
      local script = h.write_file(dir .. "/script.lua", SCRIPT)
      for run = 1, 5 do
        local pidfile = dir .. "/pids" .. run
        local _, err, status = h.sh(("timeout -s KILL 20 %s %s %s %s"):format(h.LUAJIT, script,
          case[1], pidfile))
        assert.equal(case[3], status, ("run %d: status %d, stderr: %s"):format(run, status, err))
        assert.is_nil(err:find("Segmentation", 1, true), err)
        local f = io.open(pidfile)
        for pid in f:lines() do
          h.wait_for(function() return not h.running(pid) end, 5)
        end
        f:close()
      end
    end)
  end
end)

describe("the command line", function()
  it("stops at once on SIGINT while its input blocks, instead of hanging at exit", function()
    local dir = h.tmpdir()
    local fifo = dir .. "/fifo"
    os.execute("mkfifo " .. fifo)
    -- a writer that keeps the FIFO open and sends nothing; ended by pid below
    local writer = h.first_line("(exec sleep 30 > " .. fifo .. ") >/dev/null 2>&1 & echo $!")
    -- a shell's background job starts with SIGINT ignored, which moonjob keeps: reset it
    local _, err, status = h.sh(("timeout -s KILL 20 env --default-signal=INT %s scripts/moonjob run spec/fixtures/identity.lua %s"
      .. " & cli=$!; sleep 0.5; kill -INT $cli; wait $cli"):format(h.LUAJIT, fifo))
    os.execute("kill " .. writer)
    os.execute("rm -rf " .. dir)
    assert.equal(130, status, err)
    assert.matches("moonjob: interrupted", err)
  end)
end)
