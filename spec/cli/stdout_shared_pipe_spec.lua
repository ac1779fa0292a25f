-- moonjob run with stdout a pipe it cannot open again through /proc/self/fd
-- (no /proc here; the same holds for a pipe another user made, as with
-- `sudo -u u moonjob run ... | reader`): the pipe is written as it is, and
-- still never more than it takes at once. So a stop never waits on a reader
-- that does not read, and a kill leaves the joblog holding exactly what the
-- reader got.
local h = require "helpers"
local cli = require "cli"

local MOONJOB, read, numbers, count_lines = cli.MOONJOB, cli.read, cli.numbers, cli.count_lines

-- Starts `command` in the background without /proc (a mount namespace of
-- its own with an empty /proc): its pid.
local function start_without_proc(command)
  return tonumber(h.first_line(("(unshare -m sh -c 'mount -t tmpfs none /proc && exec %s' & echo $!)")
    :format(command)))
end

describe("moonjob run on a pipe it cannot open again #slow", function()
  local dir
  before_each(function()
    assert.is_true(h.AS_ROOT, "this spec hides /proc in a mount namespace: run the suite as root (as CI does)")
    dir = h.tmpdir()
  end)
  after_each(function() os.execute("rm -rf " .. dir) end)

  it("stops on SIGTERM though the reader never reads", function()
    local input = h.write_file(dir .. "/in", numbers(200000))
    local fifo = dir .. "/fifo"
    assert.equal(0, os.execute("mkfifo " .. fifo))
    local reader = tonumber(h.first_line(("(sleep 120 < %s & echo $!) 2>/dev/null"):format(fifo)))
    local pid = start_without_proc(("%s run -j 2 spec/fixtures/identity.lua %s > %s 2>%s/err")
      :format(MOONJOB, input, fifo, dir))
    finally(function() os.execute("kill -KILL " .. pid .. " " .. reader .. " 2>/dev/null") end)
    h.sleep(2) -- (the pipe is full by now)
    os.execute("kill -TERM " .. pid)
    h.wait_for(function() return not h.running(pid) end, 15) -- (a bound that only catches a hang)
    assert.matches("interrupted by SIGTERM", read(dir .. "/err"))
  end)

  it("killed under a slow reader, --resume runs exactly the lines not printed", function()
    local n = 20000
    local input = h.write_file(dir .. "/in", numbers(n))
    local fifo, read_out, joblog = dir .. "/fifo", dir .. "/read", dir .. "/log"
    assert.equal(0, os.execute("mkfifo " .. fifo))
    local reader = tonumber(h.first_line(("(%s -e '%s' < %s & echo $!) 2>/dev/null"):format(h.LUAJIT, [[
      local ffi = require "ffi"
      ffi.cdef "int poll(void *fds, unsigned long n, int timeout);"
      local out = assert(io.open("]] .. read_out .. [[", "w"))
      for line in io.lines() do out:write(line, "\n") out:flush() ffi.C.poll(nil, 0, 2) end
      out:close()]], fifo)))
    local pid = start_without_proc(("%s run -j 2 --joblog %s spec/fixtures/paced.lua %s > %s 2>%s/err")
      :format(MOONJOB, joblog, input, fifo, dir))
    finally(function() os.execute("kill -KILL " .. pid .. " " .. reader .. " 2>/dev/null") end)
    h.wait_for(function() return #(read(read_out) or "") > 600 * 60 end, 20)
    os.execute("kill -KILL " .. pid)
    h.wait_for(function() return not h.running(pid) and not h.running(reader) end, 30)
    local text = read(read_out)
    assert.equal("\n", text:sub(-1), "the reader got a line cut short")
    local printed = count_lines(text, {}, "first run")
    for line in pairs(count_lines(read(joblog), {}, "joblog")) do
      assert.is_true(printed[line], ("line %d recorded, never printed"):format(line))
    end
    local resumed, err, status = h.sh(("%s run -j 2 --resume --joblog %s spec/fixtures/identity.lua %s")
      :format(MOONJOB, joblog, input))
    assert.equal(0, status, err)
    local seen = count_lines(resumed, printed, "the --resume run")
    for i = 1, n do assert.is_true(seen[i], ("line %d is in no output"):format(i)) end
  end)
end)
