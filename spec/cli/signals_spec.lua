-- moonjob run stopped by a signal: it ends every child's process group,
-- grandchildren included, and exits 128 + the signal; a signal it was
-- started with ignored (nohup) stays ignored.
local h = require "helpers"
local cli = require "cli"

local MOONJOB, read = cli.MOONJOB, cli.read

-- Starts the command line in the background through `launcher` (by default
-- env, setting every stop signal to its default, as from an interactive
-- shell: a shell's background job starts with SIGINT ignored, which moonjob
-- keeps). The launcher execs the CLI, so the pid returned is the CLI's.
-- Returns it and the files the run writes (out, err, and status at its end).
local function start_cli(dir, args, launcher)
  local files = { out = dir .. "/out", err = dir .. "/err", status = dir .. "/status" }
  local pid = h.first_line(("(%s %s %s >%s 2>%s & echo $!; wait $!; "
    .. "echo $? >%s.tmp; mv %s.tmp %s) 2>/dev/null &")
    :format(launcher or "env --default-signal=INT,TERM,HUP", MOONJOB, args, files.out, files.err,
      files.status, files.status, files.status))
  return tonumber(pid), files
end

-- The pids the grandchildren fixture reported, once there are n of them: its
-- "pids CHILD GRANDCHILD" lines (echoed by the CLI on stderr) and its results.
local function wait_for_pids(files, n)
  local found
  h.wait_for(function()
    found = {}
    for child, grandchild in (read(files.err) or ""):gmatch("pids (%d+) (%d+)") do
      found[#found + 1] = { child = tonumber(child), grandchild = tonumber(grandchild) }
    end
    for result in (read(files.out) or ""):gmatch('"result":(%b{})') do
      found[#found + 1] = { child = tonumber(result:match('"child":(%d+)')),
        grandchild = tonumber(result:match('"grandchild":(%d+)')) }
    end
    return #found >= n
  end, 10)
  return found
end

local function wait_for_status(files)
  h.wait_for(function() return read(files.status) ~= nil end, 10)
  return tonumber(read(files.status))
end

describe("moonjob run stopped by a signal #slow", function()
  local INPUT = '{"how":"ignores_term","stay":true}\n{"how":"holds_channel","stay":true}\n'
    .. '{"how":"plain"}\n'
  -- --timeout: if a spec fails half-way, its jobs still end within a minute
  local RUN = "run -j 3 --timeout 60 --kill-after 1 spec/fixtures/grandchildren.lua "

  -- Starts the CLI on INPUT, waits for its three children and grandchildren,
  -- and makes sure nothing is left running whatever the spec's outcome.
  local function start_grandchildren()
    local dir = h.tmpdir()
    local input = h.write_file(dir .. "/in", INPUT)
    local pid, files = start_cli(dir, RUN .. input)
    local pids = {}
    finally(function()
      os.execute("kill -KILL " .. pid .. " 2>/dev/null")
      for _, p in ipairs(pids) do os.execute("kill -KILL -" .. p.child .. " 2>/dev/null") end
      os.execute("rm -rf " .. dir)
    end)
    for _, p in ipairs(wait_for_pids(files, 3)) do pids[#pids + 1] = p end
    for _, p in ipairs(pids) do assert.is_true(h.running(p.grandchild)) end
    return pid, files, pids
  end

  local function assert_all_gone(pids)
    for _, p in ipairs(pids) do
      assert.same({}, h.wait_group_gone(p.child), "a process of child " .. p.child .. " outlived the CLI")
    end
  end

  for _, case in ipairs({ { "INT", 2 }, { "TERM", 15 }, { "HUP", 1 } }) do
    it("by SIG" .. case[1] .. " kills every child's process group and exits " .. 128 + case[2], function()
      local pid, files, pids = start_grandchildren()
      os.execute("kill -" .. case[1] .. " " .. pid)
      local status = wait_for_status(files)
      local err = read(files.err)
      assert.equal(128 + case[2], status, err)
      assert.matches("moonjob: interrupted by SIG" .. case[1] .. "; running jobs were killed", err)
      assert_all_gone(pids)
    end)
  end

  it("by several signals in a row still ends every group before it exits", function()
    local pid, files, pids = start_grandchildren()
    os.execute(("kill -TERM %d; kill -INT %d; kill -HUP %d"):format(pid, pid, pid))
    local status = wait_for_status(files)
    assert.is_true(status == 143 or status == 130 or status == 129, "status " .. tostring(status))
    assert_all_gone(pids)
  end)

  it("by SIGKILL takes its children's process groups down with it", function()
    local pid, files, pids = start_grandchildren()
    os.execute("kill -KILL " .. pid)
    wait_for_status(files)
    assert_all_gone(pids)
  end)

  it("keeps a signal it was started with ignored (nohup)", function()
    local dir = h.tmpdir()
    finally(function() os.execute("rm -rf " .. dir) end)
    local processor = h.write_file(dir .. "/p.lua",
      'return function() print("started") os.execute("sleep 2") return "done" end\n')
    local input = h.write_file(dir .. "/in", "1\n")
    local cli, files = start_cli(dir, "run " .. processor .. " " .. input, "nohup")
    assert.is_not_nil(cli, "the CLI was not started")
    h.wait_for(function() return (read(files.err) or ""):find("started") ~= nil end)
    os.execute("kill -HUP " .. cli) -- the job runs: the CLI has set its signals up
    assert.equal(0, wait_for_status(files), read(files.err))
    assert.matches('"status":"completed","result":"done"', read(files.out))
  end)
end)
