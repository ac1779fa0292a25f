-- moonjob run at the edges of its descriptors: stdout read by a slow reader
-- when the run is stopped (SIGTERM, SIGKILL), stdout on a full disk, stdout
-- closed, stdin closed. Whatever happens, the joblog records only lines that
-- were printed, and --resume runs exactly the others: across both runs every
-- input line's result is printed once.
local h = require "helpers"
local cli = require "cli"

local MOONJOB, read, numbers, count_lines = cli.MOONJOB, cli.read, cli.numbers, cli.count_lines

local function size_of(set)
  local n = 0
  for _ in pairs(set) do n = n + 1 end
  return n
end

-- Every line of 1..n is in `seen`.
local function assert_all(seen, n)
  for i = 1, n do assert.is_true(seen[i], ("line %d is in no output"):format(i)) end
  assert.equal(n, size_of(seen))
end

-- Runs shell `command` (stdout and stdin as the command says): its stderr and
-- exit status.
local function run_sh(command)
  local err = os.tmpname()
  local status = os.execute("(" .. command .. ") 2>" .. err)
  local said = read(err)
  os.remove(err)
  return said, status / 256
end

-- A reader that takes a few hundred lines a second from stdin and writes each
-- whole line to `path` as it reads it.
local function slow_reader(path)
  return h.LUAJIT .. [[ -e '
    local ffi = require "ffi"
    ffi.cdef "int poll(void *fds, unsigned long n, int timeout);"
    local out = assert(io.open("]] .. path .. [[", "w"))
    local n = 0
    for line in io.lines() do
      out:write(line, "\n") out:flush()
      n = n + 1
      ffi.C.poll(nil, 0, 2)
    end
    out:close()']]
end

describe("moonjob run at the edges #slow", function()
  local dir
  before_each(function() dir = h.tmpdir() end)
  after_each(function() os.execute("rm -rf " .. dir) end)

  -- `moonjob run ... --joblog J > FIFO` with a slow reader on the FIFO,
  -- stopped by `signal` once the reader has some lines; then --resume.
  local function stopped_under_a_slow_reader(signal)
    local n = 20000
    local input = h.write_file(dir .. "/in", numbers(n))
    local fifo, read_out, joblog = dir .. "/fifo", dir .. "/read", dir .. "/log"
    assert.equal(0, os.execute("mkfifo " .. fifo))
    local reader = tonumber(h.first_line(("(%s < %s & echo $!) 2>/dev/null"):format(slow_reader(read_out), fifo)))
    local pid = tonumber(h.first_line(("(%s run -j 2 --joblog %s spec/fixtures/paced.lua %s > %s 2>%s/err & echo $!)")
      :format(MOONJOB, joblog, input, fifo, dir)))
    finally(function()
      os.execute("kill -KILL " .. pid .. " " .. reader .. " 2>/dev/null")
    end)
    h.wait_for(function() return #(read(read_out) or "") > 600 * 60 end, 20) -- (processed: a few thousand)
    os.execute("kill -" .. signal .. " " .. pid)
    -- it ends soon, whatever it could not print (a bound that only catches a wait for the reader)
    h.wait_for(function() return not h.running(pid) end, 10)
    h.wait_for(function() return not h.running(reader) end, 30)
    local text = read(read_out)
    assert.equal("\n", text:sub(-1), "the reader got a line cut short")
    local printed = count_lines(text, {}, "first run")
    assert.is_true(size_of(printed) > 0)
    -- the joblog records only lines the reader got
    local recorded = count_lines(read(joblog), {}, "joblog")
    for line in pairs(recorded) do assert.is_true(printed[line], ("line %d recorded, never printed"):format(line)) end
    local resumed, err, status = h.sh(("%s run -j 2 --resume --joblog %s spec/fixtures/identity.lua %s") -- (no pace)
      :format(MOONJOB, joblog, input))
    assert.equal(0, status, err)
    assert_all(count_lines(resumed, printed, "the --resume run"), n)
  end

  it("stopped by SIGTERM under a slow reader, --resume runs exactly the lines not printed", function()
    stopped_under_a_slow_reader("TERM")
  end)

  it("killed (SIGKILL) under a slow reader, --resume runs exactly the lines not printed", function()
    stopped_under_a_slow_reader("KILL")
  end)

  it("keeps a bounded buffer for a reader that does not read: the input waits", function()
    local n = 1000000
    local input = h.write_file(dir .. "/in", numbers(n))
    local fifo, gate = dir .. "/fifo", dir .. "/gate"
    assert.equal(0, os.execute("mkfifo " .. fifo))
    -- the reader opens the FIFO at once, and reads once the gate file exists
    local reader = tonumber(h.first_line(("(sh -c 'while [ ! -e %s ]; do sleep 0.05; done; wc -l > %s/count' < %s "
      .. "& echo $!) 2>/dev/null"):format(gate, dir, fifo)))
    local pid = tonumber(h.first_line(("(%s run -j 2 spec/fixtures/identity.lua %s > %s 2>%s/err & echo $!)")
      :format(MOONJOB, input, fifo, dir)))
    finally(function() os.execute("kill -KILL " .. pid .. " " .. reader .. " 2>/dev/null") end)
    h.sleep(3) -- (unbounded, the whole output, about 70 MB, would be held by now)
    local peak_kb = tonumber((read("/proc/" .. pid .. "/status") or ""):match("VmHWM:%s*(%d+)"))
    assert.is_true(peak_kb < 48 * 1024, ("%d KB held for a reader that does not read"):format(peak_kb or -1))
    h.write_file(gate, "")
    h.wait_for(function() return not h.running(pid) and not h.running(reader) end, 60)
    assert.equal(tostring(n), h.first_line("cat " .. dir .. "/count"))
  end)

  it("with stdout on a full disk, says so, records only what was printed, and --resume ends the work", function()
    assert.is_true(h.AS_ROOT, "this spec mounts a small tmpfs: run the suite as root (as CI does)")
    local n = 5000
    local input = h.write_file(dir .. "/in", numbers(n))
    local mount, joblog = dir .. "/full", dir .. "/log"
    os.execute("mkdir -p " .. mount)
    assert.equal(0, os.execute("mount -t tmpfs -o size=64k tmpfs " .. mount))
    finally(function() os.execute("umount " .. mount .. " 2>/dev/null") end)
    local out = mount .. "/out"
    local err, status = run_sh(("%s run -j 2 --joblog %s spec/fixtures/identity.lua %s > %s")
      :format(MOONJOB, joblog, input, out))
    assert.equal(2, status, err)
    assert.matches("no space left on the device that standard output writes to", err)
    local text = read(out)
    assert.equal("\n", text:sub(-1), "the output ends with a line cut short")
    local printed = count_lines(text, {}, "first run")
    assert.is_true(size_of(printed) > 0 and size_of(printed) < n)
    for line in pairs(count_lines(read(joblog), {}, "joblog")) do
      assert.is_true(printed[line], ("line %d recorded, never printed"):format(line))
    end
    -- room is made; the rest is appended to the same file
    assert.equal(0, os.execute("mount -o remount,size=4m " .. mount))
    err, status = run_sh(("%s run -j 2 --resume --joblog %s spec/fixtures/identity.lua %s >> %s")
      :format(MOONJOB, joblog, input, out))
    assert.equal(0, status, err)
    assert_all(count_lines(read(out), {}, "both runs"), n)
  end)

  it("with stdout closed, says so and records nothing", function()
    local input = h.write_file(dir .. "/in", numbers(3))
    local joblog = dir .. "/log"
    local err, status = run_sh(("%s run --joblog %s spec/fixtures/identity.lua %s >&-")
      :format(MOONJOB, joblog, input))
    assert.equal(2, status, err)
    assert.matches("^moonjob: standard output is closed", err)
    assert.equal("", read(joblog) or "")
  end)

  describe("with stdin closed", function()
    it("runs an INPUT file as usual", function()
      local input = h.write_file(dir .. "/in", numbers(100))
      local err, status = run_sh(("%s run spec/fixtures/identity.lua %s > %s/out <&-")
        :format(MOONJOB, input, dir))
      assert.equal(0, status, err)
      assert_all(count_lines(read(dir .. "/out"), {}, "the run"), 100)
    end)

    it("without INPUT says that its input is closed", function()
      local err, status = run_sh(("%s run spec/fixtures/identity.lua > %s/out <&-"):format(MOONJOB, dir))
      assert.equal(2, status, err)
      assert.matches("^moonjob: standard input is closed and no INPUT file was given", err)
      err, status = run_sh(("%s run spec/fixtures/identity.lua - > %s/out <&-"):format(MOONJOB, dir))
      assert.equal(2, status, err)
      assert.matches("^moonjob: standard input is closed %(INPUT is %-%)", err)
    end)

    it("moonjob add without INPUT says that its input is closed, before it connects", function()
      local err, status = run_sh(("%s add --redis redis://127.0.0.1:1/0 --queue q > %s/out <&-"):format(MOONJOB, dir))
      assert.equal(2, status, err)
      assert.matches("^moonjob: standard input is closed and no INPUT file was given", err)
      assert.not_matches("traceback", err)
      assert.equal("", read(dir .. "/out"))
    end)

    it("a Lua program using moonjob runs", function()
      local err, status = run_sh((h.LUAJIT .. [[ -e '
        local moonjob = require "moonjob"
        local pool = moonjob.pool("spec/fixtures/identity.lua", { size = 1 })
        io.write(tostring(pool:add(41):wait() + 1), "\n")
        pool:close()' > %s/out <&-]]):format(dir))
      assert.equal(0, status, err)
      assert.equal("42\n", read(dir .. "/out"))
    end)
  end)
end)
