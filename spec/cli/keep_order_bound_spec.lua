-- moonjob run -k holds the results that wait for an earlier line to about
-- 8 MiB per child, also when the size of results jumps while that line runs:
-- a batch ends when its results fill the child's area, and the lines it
-- hands back wait (parked) instead of all running past the bound.
local h = require "helpers"
local cli = require "cli"

local MOONJOB, read = cli.MOONJOB, cli.read

describe("moonjob run -k when result sizes jump #slow", function()
  it("keeps the results it holds near its bound, and prints every line in order", function()
    local dir = h.tmpdir()
    finally(function() os.execute("rm -rf " .. dir) end)
    local lines = { '{"sleep":2}' } -- line 1 holds every later result for 2 s
    for i = 2, 200 do lines[i] = '{"big":10}' end -- small results: batches grow
    for i = 201, 3000 do lines[i] = '{"big":100000}' end -- then 100 KB each: 280 MB in all
    local input = h.write_file(dir .. "/in", table.concat(lines, "\n") .. "\n")
    -- Under the sanitizer build, ASan's quarantine keeps up to 256 MiB of
    -- freed memory resident: a small one keeps the bound meaningful there.
    local env = h.SANITIZED and ("ASAN_OPTIONS=%s:quarantine_size_mb=8 "):format(os.getenv("ASAN_OPTIONS") or "") or ""
    local pid = tonumber(h.first_line(("(%s%s run -k -j 2 spec/fixtures/slow_line.lua %s > %s/out 2>%s/err & echo $!)")
      :format(env, MOONJOB, input, dir, dir)))
    finally(function() os.execute("kill -KILL " .. pid .. " 2>/dev/null") end)
    local peak_kb = 0
    h.wait_for(function()
      local kb = tonumber((read("/proc/" .. pid .. "/status") or ""):match("VmHWM:%s*(%d+)"))
      if kb then peak_kb = math.max(peak_kb, kb) end
      return not h.running(pid)
    end, 60)
    -- 2 children: 16 MiB held at most, plus what a DONE carries (1 MiB) and the program itself
    assert.is_true(peak_kb < 150 * 1024, ("a peak of %d KB"):format(peak_kb))
    local n = 0
    for line in read(dir .. "/out"):gmatch('{"line":(%d+),') do
      n = n + 1
      assert.equal(n, tonumber(line))
    end
    assert.equal(3000, n, read(dir .. "/err"))
  end)
end)
