-- moonjob run --joblog FILE [--resume]: a joblog that cannot be written
-- (a full disk) stops the run, a record cut short is never trusted and is
-- cut off, a last line that is not a record is kept, a FIFO works; --resume
-- loses no line and repeats none.
local h = require "helpers"
local json = require "moonjob.codec.json"
local cli = require "cli"

local MOONJOB, read, numbers = cli.MOONJOB, cli.read, cli.numbers

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
      assert.matches("^moonjob: writing the joblog '.-/log' failed: ENOSPC: no space left on device; the run stopped", err)
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
