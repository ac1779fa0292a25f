local h = require "helpers"
-- Peak RSS bounds are wider under `make sanitize`: ASan keeps freed memory
-- in quarantine (up to 256 MB), so a run's peak there counts garbage too,
-- by an amount that varies from run to run. `make test` keeps the tight
-- bounds; under the sanitizer these specs catch only gross growth.
local RSS_SLACK = h.SANITIZED and 3 or 1
local json = require "moonjob.codec.json"
local cli = require "cli"

local MOONJOB, by_line = cli.MOONJOB, cli.by_line

local function write_file(text)
  return h.write_file(os.tmpname(), text)
end

describe("moonjob run #slow", function()
  it("prints one line per job with status, result, attempts and ms, and exits 0", function()
    local input = write_file('{"x":3}\n{"x":4}\n')
    local out, err, status = h.sh(MOONJOB .. "run -j 2 examples/square.lua " .. input)
    os.remove(input)
    assert.equal(0, status)
    local lines = by_line(out)
    assert.equal(9, lines[1].result)
    assert.equal(16, lines[2].result)
    assert.equal("completed", lines[1].status)
    assert.equal(1, lines[1].attempts)
    assert.is_number(lines[1].ms)
    assert.matches('^{"line":%d,"status":"completed","result":%d+,"attempts":1,"ms":[%d.e-]+}\n',
      out)
    assert.truthy(err:find("squaring 3", 1, true))
  end)

  it("reads standard input when no INPUT is given", function()
    local out, _, status = h.sh(MOONJOB .. "run spec/fixtures/identity.lua", '"a"\n"b"\n')
    assert.equal(0, status)
    local lines = by_line(out)
    assert.equal("a", lines[1].result)
    assert.equal("b", lines[2].result)
  end)

  it("keeps numbers and empty arrays exact in its JSON output", function()
    local input = '9007199254740992\n0.30000000000000004\n{"a":[],"b":{},"c":-0}\n1e-7\n123456789012345\n'
    local out, _, status = h.sh(MOONJOB .. "run -j 1 spec/fixtures/identity.lua", input)
    assert.equal(0, status)
    local results = {}
    for line, result in out:gmatch('"line":(%d+),"status":"completed","result":(.-),"attempts"') do
      results[tonumber(line)] = result
    end
    assert.equal("9007199254740992", results[1])
    assert.equal("0.30000000000000004", results[2])
    assert.truthy(results[3]:find('"a":[]', 1, true))
    assert.truthy(results[3]:find('"b":{}', 1, true))
    assert.truthy(results[3]:find('"c":-0', 1, true))
    assert.equal(1e-7, tonumber(results[4]))
    assert.equal("123456789012345", results[5])
  end)

  it("fails a line that is not JSON with EINPUT, runs the rest, and exits 1", function()
    local out, _, status = h.sh(MOONJOB .. "run spec/fixtures/identity.lua", '1\nnot json\n3\n')
    assert.equal(1, status)
    local lines = by_line(out)
    assert.equal(1, lines[1].result)
    assert.equal("failed", lines[2].status)
    assert.equal("EINPUT", lines[2].error.code)
    assert.matches("^input is not valid JSON", lines[2].error.message)
    assert.equal(3, lines[3].result)
  end)

  it("reports a processor error with its code and message", function()
    local out, _, status = h.sh(MOONJOB .. "run spec/fixtures/fails.lua", '{"how":"table"}\n')
    assert.equal(1, status)
    assert.equal('{"line":1,"status":"failed","error":{"code":"EBADINPUT","message":"bad input","field":"x"},',
      out:match('^(.-)"attempts"'))
  end)

  it("skips blank lines but counts them in line numbers", function()
    local out, _, status = h.sh(MOONJOB .. "run spec/fixtures/identity.lua", '1\n\n  \n4')
    assert.equal(0, status)
    local lines = by_line(out)
    assert.equal(1, lines[1].result)
    assert.equal(4, lines[4].result)
    assert.is_nil(lines[2])
  end)

  -- Writes lines 1..n of text(i) to a new file; returns its path.
  local function input_of(n, text)
    local input = os.tmpname()
    local f = assert(io.open(input, "wb"))
    for i = 1, n do f:write(text(i), "\n") end
    f:close()
    return input
  end

  -- Runs `moonjob run ARGS INPUT` (args: Lua string literals, comma-separated)
  -- in one luajit process whose output goes to the shell command `sink`;
  -- returns the sink's output and the process's peak RSS in KiB. The input
  -- file goes; the run must exit 0.
  local function run_measured(args, input, sink)
    local out, err, status = h.sh(h.LUAJIT .. [[ -e '
      local status = require("moonjob.cli").main({ "run", ]] .. args .. [[, "]] .. input .. [[" })
      local hwm = io.open("/proc/self/status"):read("*a"):match("VmHWM:%s*(%d+)")
      io.stderr:write("peak=", hwm, "\n")
      os.exit(status)' | ]] .. sink)
    os.remove(input)
    assert.equal(0, status, err)
    return out, tonumber(err:match("peak=(%d+)"))
  end

  it("reads its input as a stream, in bounded memory", function()
    local function peak_kb(n)
      local input = input_of(n, function(i) return '{"i":' .. i .. ',"pad":"' .. string.rep("p", 40) .. '"}' end)
      local _, peak = run_measured('"-j", "2", "spec/fixtures/identity.lua"', input, "cat >/dev/null")
      return peak
    end
    -- The heap and the batch sizes grow while a run starts, and level off
    -- once batches reach their bound (about 35 MiB past a million lines on a
    -- 2-core machine, from 20-30 MiB at 100,000: batches of light lines grew
    -- when children began writing their result lines in C); memory that grew
    -- with the input would add 30 MiB for 300,000 more lines even at 100
    -- bytes a line, twice the 16 MiB allowed.
    -- Each the lower of two runs: a loaded machine's slow reader can fill
    -- stdout's bounded backlog in one run and not the other.
    local small = math.min(peak_kb(100000), peak_kb(100000))
    local large = math.min(peak_kb(400000), peak_kb(400000))
    assert.is_true(large - small < 16384 * RSS_SLACK,
      ("peak RSS %d KiB for 400,000 lines against %d KiB for 100,000"):format(large, small))
  end)

  -- The peak RSS (KiB) of `moonjob run -k -j 2` over n lines, line 1 `first`
  -- and the others text(i), through spec/fixtures/slow_line.lua; every line
  -- must come out completed and in order.
  local function keep_order_peak(n, first, text)
    local input = input_of(n, function(i) return i == 1 and first or text(i) end)
    local out, peak = run_measured('"-k", "-j", "2", "spec/fixtures/slow_line.lua"', input,
      [[awk '{ if (index($0, "{\"line\":" NR ",\"status\":\"completed\"") != 1) bad++ }
        END { print NR, bad + 0 }']])
    assert.equal(n .. " 0\n", out, "lines printed, and lines out of order or not completed")
    return peak
  end

  it("holds bounded results behind a slow early line with --keep-order, and prints them all in order", function()
    -- 200,000 lines of 250 bytes take well under the slow line's 3 s: without
    -- a bound, about 50 MB of later results would wait in memory for it; the
    -- bound is 8 MiB per child.
    local function line(i) return '{"i":' .. i .. ',"pad":"' .. string.rep("p", 220) .. '"}' end
    local fast = keep_order_peak(200000, '{"i":1}', line)
    local slow = keep_order_peak(200000, '{"sleep":3}', line)
    assert.is_true(slow < fast + 32768 * RSS_SLACK,
      ("peak RSS %d KiB behind a slow first line against %d KiB without"):format(slow, fast))
  end)

  it("with --keep-order, holds big results behind a slow first line to its bound too", function()
    -- 300 results of 1 MB each: without a bound on them all would wait for
    -- line 1; with it, about 8 MiB per child (and the lines in flight).
    local function big() return '{"big":1000000}' end
    local fast, slow = keep_order_peak(301, big(), big), keep_order_peak(301, '{"sleep":2}', big)
    assert.is_true(slow < fast + 65536 * RSS_SLACK,
      ("peak RSS %d KiB behind a slow first line against %d KiB without"):format(slow, fast))
  end)

  it("times jobs out with --timeout and --kill-after", function()
    local out, _, status = h.sh(MOONJOB .. "run --timeout 0.1 --kill-after=0.1 spec/fixtures/spin.lua",
      '{"how":"jit_loop"}\n{"how":"none"}\n')
    assert.equal(1, status)
    local lines = by_line(out)
    assert.equal("ETIMEDOUT", lines[1].error.code)
    assert.matches("killed after kill_after", lines[1].error.message)
    assert.equal("returned", lines[2].result)
  end)

  it("prints in input order with --keep-order", function()
    local out, _, status = h.sh(MOONJOB .. "run -j 2 --keep-order spec/fixtures/slow_first.lua",
      "1\n2\n3\n4\n5\n\n7\n")
    assert.equal(0, status)
    local lines = {}
    for line in out:gmatch('"line":(%d+)') do lines[#lines + 1] = tonumber(line) end
    assert.same({ 1, 2, 3, 4, 5, 7 }, lines)
  end)

  it("keeps input order, exact results and a whole joblog over 20,000 tiny lines", function()
    local lines = {}
    local function big(i) return ("90071992547%06d"):format(i) end -- beyond 2^53: exact or nothing
    for i = 1, 20000 do lines[i] = ('{"n":%d,"big":%s}'):format(i, big(i)) end
    lines[777] = "not json"
    local input = h.write_file(os.tmpname(), table.concat(lines, "\n") .. "\n")
    local log = os.tmpname()
    os.remove(log)
    local out, _, status = h.sh(MOONJOB .. "run -j 2 --keep-order --joblog " .. log
      .. " spec/fixtures/identity.lua " .. input)
    assert.equal(1, status)
    local n = 0
    for text in out:gmatch("[^\n]+") do
      n = n + 1
      local v = assert(json.decode(text))
      assert.equal(n, v.line)
      if n == 777 then
        assert.equal("EINPUT", v.error.code)
      else
        assert.equal(n, tonumber(v.result.n))
        assert.equal(big(n), (tostring(v.result.big):gsub("LL$", "")))
      end
    end
    assert.equal(20000, n)
    local f = assert(io.open(log))
    local logged = f:read("*a")
    f:close()
    assert.equal(20000, select(2, logged:gsub("\n", "")))
    os.remove(log)
    os.remove(input)
  end)

  it("retries with --attempts and --backoff", function()
    local out, _, status = h.sh(MOONJOB .. "run --attempts 3 --backoff fixed:0.01 spec/fixtures/flaky.lua",
      '{"succeed_at":3}\n')
    assert.equal(0, status)
    assert.matches('"result":3,"attempts":3', out)
  end)

  it("writes a joblog, and --resume skips what it records as completed", function()
    local log = os.tmpname()
    os.remove(log)
    local input = h.write_file(os.tmpname(), '1\nnot json\n3\n')
    local _, _, status = h.sh(MOONJOB .. "run --joblog " .. log .. " spec/fixtures/identity.lua " .. input)
    assert.equal(1, status)
    local f = assert(io.open(log))
    local logged = f:read("*a")
    f:close()
    assert.equal(3, select(2, logged:gsub("\n", "")))
    -- line 2 failed: resume runs only it
    local out = h.sh(MOONJOB .. "run --resume --joblog " .. log .. " spec/fixtures/identity.lua " .. input)
    assert.equal(1, select(2, out:gsub("\n", "")))
    assert.matches('^{"line":2,"status":"failed"', out)
    os.remove(log)
    os.remove(input)
  end)

  it("after the CLI is killed mid-run, --resume runs every job not completed, none twice", function()
    local log, runs = os.tmpname(), os.tmpname()
    os.remove(log)
    local lines = {}
    for i = 1, 40 do lines[i] = ('{"file":"%s","value":%d,"sleep":0.05}'):format(runs, i) end
    local input = h.write_file(os.tmpname(), table.concat(lines, "\n") .. "\n")
    h.sh("timeout -s KILL 0.6 " .. MOONJOB .. "run -j 2 --joblog " .. log
      .. " spec/fixtures/counted.lua " .. input .. "; true") -- the shell's 'Killed' goes to the captured stderr
    local first = h.sh("grep -c completed " .. log)
    assert.is_true(tonumber(first) > 0 and tonumber(first) < 40, "completed before the kill: " .. first)
    local _, _, status = h.sh(MOONJOB .. "run -j 2 --resume --joblog " .. log
      .. " spec/fixtures/counted.lua " .. input)
    assert.equal(0, status)
    local completed = {}
    local f = assert(io.open(log))
    for text in f:lines() do
      local line = tonumber(text:match('^{"line":(%d+),"status":"completed"'))
      assert.is_nil(completed[line], "line " .. tostring(line) .. " completed twice")
      completed[line] = true
    end
    f:close()
    for i = 1, 40 do assert.is_true(completed[i], "line " .. i .. " lost") end
    -- a job killed with the CLI may have run without being recorded; a recorded one never reruns
    local ran = tonumber((h.sh("wc -l < " .. runs)))
    assert.is_true(ran >= 40 and ran <= 42, "executions: " .. ran)
    os.remove(log); os.remove(runs); os.remove(input)
  end)

  describe("usage and set-up errors", function()
    it("prints help and exits 0 with --help", function()
      local out, _, status = h.sh(MOONJOB .. "--help")
      assert.equal(0, status)
      assert.matches("^usage: moonjob run PROCESSOR %[INPUT%]", out)
    end)

    it("exits 2 without a command", function()
      local _, err, status = h.sh(MOONJOB)
      assert.equal(2, status)
      assert.equal("moonjob: missing command: moonjob run PROCESSOR [INPUT]\nTry 'moonjob --help'.\n", err)
    end)

    it("exits 2 on an unknown option", function()
      local _, err, status = h.sh(MOONJOB .. "run --frobnicate examples/square.lua")
      assert.equal(2, status)
      assert.matches("unknown option '%-%-frobnicate'", err)
    end)

    it("exits 2 on a bad concurrency", function()
      local _, err, status = h.sh(MOONJOB .. "run -j 0 examples/square.lua")
      assert.equal(2, status)
      assert.matches("%-j needs a whole number from 1 to 1024, got '0'", err)
    end)

    it("exits 2 on --resume without --joblog, and on a bad --backoff", function()
      local _, err, status = h.sh(MOONJOB .. "run --resume examples/square.lua")
      assert.equal(2, status)
      assert.matches("%-%-resume needs %-%-joblog FILE", err)
      local _, err2, status2 = h.sh(MOONJOB .. "run --backoff sometimes examples/square.lua")
      assert.equal(2, status2)
      assert.matches("%-%-backoff needs fixed:SECONDS or exponential:SECONDS%[:JITTER%]", err2)
    end)

    it("exits 2 on a bad timeout", function()
      local _, err, status = h.sh(MOONJOB .. "run --timeout soon examples/square.lua")
      assert.equal(2, status)
      assert.matches("%-%-timeout needs a number of seconds from 0.001 to 1e9, got 'soon'", err)
    end)

    it("exits 2 when the processor file is missing", function()
      local _, err, status = h.sh(MOONJOB .. "run nowhere.lua", "1\n")
      assert.equal(2, status)
      assert.equal("moonjob: ELOAD: cannot open processor file 'nowhere.lua': no such file or directory\n", err)
    end)

    it("exits 2 when the input file is missing", function()
      local _, err, status = h.sh(MOONJOB .. "run examples/square.lua /nonexistent.ndjson")
      assert.equal(2, status)
      assert.matches("cannot open input '/nonexistent.ndjson': no such file or directory", err)
    end)
  end)
end)
