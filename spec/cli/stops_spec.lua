-- The command line loses nothing and leaves nothing behind: stopped by a
-- signal it ends every child's process group and exits 128 + the signal; a
-- processor that cannot load stops it at once; numbers never change silently;
-- a joblog that cannot be written stops the run, and a record cut short is
-- never trusted; echoed lines stay whole next to result lines in one file.
local h = require "helpers"
local json = require "moonjob.codec.json"

local MOONJOB = h.LUAJIT .. " scripts/moonjob "

local function read(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

-- NDJSON input: the numbers 1..n, one per line.
local function numbers(n)
  local t = {}
  for i = 1, n do t[i] = tostring(i) end
  return table.concat(t, "\n") .. "\n"
end

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

describe("moonjob run stopped by a signal", function()
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

describe("moonjob run's numbers", function()
  -- input line -> the result it must print exactly, or the EINPUT reason
  local CASES = {
    { "12345678901234567890", result = "12345678901234567890" },
    { "9007199254740993", result = "9007199254740993" },
    { "-9223372036854775808", result = "-9223372036854775808" },
    { '{"id":18446744073709551615}', result = '{"id":18446744073709551615}' },
    { "9007199254740992", result = "9007199254740992" },
    { "0.1", result = "0.1" },
    { "-0", result = "-0" },
    { "0e99999999999", result = "0" },
    { '"a\tb 1234567890123456"', result = '"a\\tb 1234567890123456"' }, -- a raw tab, as cjson takes it
    { "18446744073709551616", einput = "integer beyond 64 bits" },
    { "-9223372036854775809", einput = "integer beyond 64 bits" },
    { "1e400", einput = "beyond the range of a double" },
    { "-1e400", einput = "beyond the range of a double" },
    { "1e999999999999", einput = "beyond the range of a double" },
    { '{"a":1e9999999,"b":2}', einput = "beyond the range of a double" },
    { "1e-400", einput = "too small for a double" },
    { "[1,1e-9999999,3]", einput = "too small for a double" },
    { "NaN", einput = "not valid JSON" },
    { "Infinity", einput = "not valid JSON" },
    { '["\\ud800", "1234567890123456"]', einput = "invalid unicode escape" },
  }

  it("cross exactly (64-bit integers beyond 2^53), or fail with EINPUT saying why, never silently", function()
    local input = {}
    for i, case in ipairs(CASES) do input[i] = case[1] end
    local out, err, status = h.sh(MOONJOB .. "run -k spec/fixtures/identity.lua", table.concat(input, "\n") .. "\n")
    assert.equal(1, status, err)
    local lines = {}
    for text in out:gmatch("[^\n]+") do lines[#lines + 1] = text end
    assert.equal(#CASES, #lines)
    for i, case in ipairs(CASES) do
      if case.result then
        local head = ('{"line":%d,"status":"completed","result":%s,"attempts":1,'):format(i, case.result)
        assert.equal(head, lines[i]:sub(1, #head), "input: " .. case[1])
      else
        local v = assert(json.decode(lines[i]))
        assert.equal("EINPUT", v.error.code, lines[i])
        assert.matches(case.einput, v.error.message, 1, true)
      end
    end
  end)
end)

describe("moonjob run's echoed lines", function()
  it("stay whole next to result lines when stdout and stderr go to one file", function()
    local n = 3000
    local t = {}
    for i = 1, n do t[i] = ('{"x":%d}'):format(i) end
    local input = h.write_file(os.tmpname(), table.concat(t, "\n") .. "\n")
    local merged = os.tmpname()
    local _, _, status = h.sh(MOONJOB .. "run -j 2 examples/square.lua " .. input .. " >" .. merged .. " 2>&1")
    local text = read(merged)
    os.remove(input)
    os.remove(merged)
    assert.equal(0, status)
    local results, echoed, broken = 0, 0, {}
    for line in text:gmatch("[^\n]*\n") do
      if line:match('^{"line":%d+,"status":"completed","result":%d+,"attempts":1,"ms":[%d.e-]+}\n$') then
        results = results + 1
      elseif line:match("^%[line (%d+)%] squaring (%d+)\n$") then
        local tag, x = line:match("^%[line (%d+)%] squaring (%d+)\n$")
        assert.equal(tag, x) -- line i squares i
        echoed = echoed + 1
      else
        broken[#broken + 1] = line
      end
    end
    assert.same({}, broken)
    assert.equal(n, results)
    assert.equal(n, echoed)
  end)
end)

describe("moonjob run's joblog", function()

  local function completed_in(text)
    local set, count = {}, 0
    for line in text:gmatch('"line":(%d+),"status":"completed"') do
      assert.is_nil(set[line], "line " .. line .. " completed twice")
      set[line] = true
      count = count + 1
    end
    return set, count
  end

  it("on a full disk stops the run with a clear error, and --resume loses no line and repeats none", function()
    assert.is_true(h.AS_ROOT, "this spec mounts a small tmpfs: run the suite as root (as CI does)")
    local dir = h.tmpdir()
    local mount = dir .. "/full"
    os.execute("mkdir -p " .. mount)
    assert.equal(0, os.execute("mount -t tmpfs -o size=16k tmpfs " .. mount))
    local input = h.write_file(dir .. "/in", numbers(2000))
    local ok, failure = pcall(function()
      local out, err, status = h.sh(("%s run -j 2 --joblog %s/log spec/fixtures/identity.lua %s")
        :format(MOONJOB, mount, input))
      assert.equal(2, status, err)
      assert.matches("^moonjob: writing the joblog '.-/log' failed: No space left on device; the run stopped", err)
      local logged = read(mount .. "/log")
      local printed, nprinted = completed_in(out)
      assert.is_true(nprinted > 0 and nprinted < 2000, "printed " .. nprinted)
      -- every printed line is recorded: --resume will not rerun them
      local recorded = completed_in(logged:match("^(.*\n)"))
      for line in pairs(printed) do assert.is_true(recorded[line], "line " .. line .. " printed, not recorded") end
      -- the disk is freed (the joblog moves off it); --resume does the rest
      os.execute(("cp %s/log %s/log"):format(mount, dir))
      local out2, err2, status2 = h.sh(("%s run -j 2 --resume --joblog %s/log spec/fixtures/identity.lua %s")
        :format(MOONJOB, dir, input))
      assert.equal(0, status2, err2)
      local all = {}
      for line in pairs(recorded) do all[line] = true end
      for line in pairs(completed_in(out2)) do
        assert.is_nil(all[line], "line " .. line .. " ran again")
        all[line] = true
      end
      for i = 1, 2000 do assert.is_true(all[tostring(i)], "line " .. i .. " lost") end
      -- the joblog is whole records only, the cut one dropped
      for record in read(dir .. "/log"):gmatch("[^\n]*\n?") do
        if record ~= "" then assert.is_not_nil(json.decode(record), "not a whole record: " .. record) end
      end
    end)
    os.execute("umount " .. mount)
    os.execute("rm -rf " .. dir)
    assert(ok, failure)
  end)

  it("drops a record cut within its first bytes too", function()
    local dir = h.tmpdir()
    local log = h.write_file(dir .. "/log", '{"line":1,"status":"completed","result":1,"attempts":1,"ms":1}\n{"l')
    local _, err, status = h.sh(("%s run --resume --joblog %s spec/fixtures/identity.lua"):format(MOONJOB, log),
      "1\n2\n")
    local logged = read(log)
    os.execute("rm -rf " .. dir)
    assert.equal(0, status, err)
    for record in logged:gmatch("([^\n]*)\n") do assert.is_not_nil(json.decode(record), record) end
    assert.equal("\n", logged:sub(-1))
  end)

  it("--resume ignores a truncated last record and cuts it off before appending", function()
    local dir = h.tmpdir()
    local log = h.write_file(dir .. "/log", '{"line":1,"status":"completed","result":1,"attempts":1,"ms":1}\n'
      .. '{"line":2,"status":"completed","result":')
    local input = h.write_file(dir .. "/in", numbers(3))
    local out, err, status = h.sh(("%s run -k --resume --joblog %s spec/fixtures/identity.lua %s")
      :format(MOONJOB, log, input))
    local logged = read(log)
    os.execute("rm -rf " .. dir)
    assert.equal(0, status, err)
    assert.matches("ended in a record cut short %(a full disk or a crash%); it was dropped", err)
    assert.matches('^{"line":2,"status":"completed","result":2,', out)
    assert.matches('\n{"line":3,"status":"completed","result":3,', out)
    local records = {}
    for record in logged:gmatch("([^\n]*)\n") do records[#records + 1] = assert(json.decode(record)).line end
    assert.equal(logged:sub(-1), "\n")
    table.sort(records)
    assert.same({ 1, 2, 3 }, records)
  end)

  it("keeps a last line that is not a record, and appends whole records after it", function()
    local dir = h.tmpdir()
    local log = h.write_file(dir .. "/log", "notes\nlast words")
    local _, err, status = h.sh(("%s run --joblog %s spec/fixtures/identity.lua"):format(MOONJOB, log), "7\n")
    local logged = read(log)
    os.execute("rm -rf " .. dir)
    assert.equal(0, status, err)
    assert.matches('^notes\nlast words\n{"line":1,"status":"completed","result":7,[^\n]*}\n$', logged)
  end)

  it("can be a pipe (a FIFO read by another program)", function()
    local dir = h.tmpdir()
    os.execute("mkfifo " .. dir .. "/fifo")
    local reader = tonumber(h.first_line(("cat %s/fifo > %s/copy 2>/dev/null & echo $!"):format(dir, dir)))
    finally(function()
      os.execute("kill " .. reader .. " 2>/dev/null")
      os.execute("rm -rf " .. dir)
    end)
    local out, err, status = h.sh(("%s run --joblog %s/fifo spec/fixtures/identity.lua"):format(MOONJOB, dir),
      "1\n2\n")
    assert.equal(0, status, err)
    assert.equal(2, select(2, out:gsub("\n", "")))
    h.wait_for(function() return select(2, (read(dir .. "/copy") or ""):gsub("\n", "")) == 2 end)
  end)
end)
