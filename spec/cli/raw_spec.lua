-- Plain-text input: --raw passes each line as a string in job.data (lines
-- alone and in batches; blank lines run nothing; \r and bytes that are not
-- UTF-8 are kept; --joblog and --resume as for NDJSON; moonjob add --raw
-- on a real Redis), and without --raw, input that is not JSON says to use
-- --raw: once, before any line runs, when its first line is not JSON.
local h = require "helpers"
local json = require "moonjob.codec.json"
local cli = require "cli"
local moonjob = require "moonjob"
local redis_server = require "redis_server"

local MOONJOB, by_line = cli.MOONJOB, cli.by_line
local ECHO = "spec/fixtures/raw_echo.lua"

local function hex(s)
  return (s:gsub(".", function(c) return ("%02x"):format(c:byte()) end))
end

-- Runs `moonjob run ECHO --raw ARGS` over `input`: the output lines by line,
-- their number, stderr and the exit status.
local function run_raw(input, args)
  local out, err, status = h.sh(MOONJOB .. "run " .. ECHO .. " --raw " .. (args or ""), input)
  local lines, n = by_line(out)
  return lines, n, err, status
end

describe("moonjob run --raw #slow", function()
  it("passes each line's text as a string, JSON-looking or not", function()
    local texts = { "a.log", "my file.txt", '{"x":1}', "42", 'say "hi" \\ back', "\tindented ", "true" }
    local lines, n, _, status = run_raw(table.concat(texts, "\n") .. "\n", "-j 2")
    assert.equal(0, status)
    assert.equal(#texts, n)
    for i, text in ipairs(texts) do
      assert.equal("completed", lines[i].status)
      assert.equal("string", lines[i].result.type)
      assert.equal(hex(text), lines[i].result.hex, "line " .. i)
    end
  end)

  it("passes lines run in batches the same way, every line once", function()
    local t = {}
    for i = 1, 20000 do t[i] = "file " .. i .. ".log" end
    local lines, n, _, status = run_raw(table.concat(t, "\n") .. "\n", "-j 2")
    assert.equal(0, status)
    assert.equal(20000, n)
    local per_job = {}
    for i = 1, 20000 do
      assert.equal(hex(t[i]), lines[i].result.hex, "line " .. i)
      per_job[lines[i].result.id] = (per_job[lines[i].result.id] or 0) + 1
    end
    local most = 0
    for _, count in pairs(per_job) do most = math.max(most, count) end
    assert.is_true(most > 1, "no two lines ran in one batch")
  end)

  it("runs nothing for blank lines, which still count in line numbers", function()
    local lines, n, _, status = run_raw("a\n\n   \n\t\nb\n", "-j 1")
    assert.equal(0, status)
    assert.equal(2, n)
    assert.equal(hex("a"), lines[1].result.hex)
    assert.equal(hex("b"), lines[5].result.hex)
  end)

  it("keeps a \\r before the newline and bytes that are not UTF-8; a result holding them fails", function()
    local lines, n, _, status = run_raw("dos\r\ncaf\233.log\ncaf\233!\n", "-j 1")
    assert.equal(3, n)
    assert.equal(1, status)
    assert.equal(hex("dos\r"), lines[1].result.hex)
    assert.equal(hex("caf\233.log"), lines[2].result.hex)
    assert.equal("EPAYLOAD", lines[3].error.code)
    assert.matches("not UTF%-8", lines[3].error.message)
  end)

  it("records in the joblog as NDJSON runs do, and --resume runs only what did not complete", function()
    local dir = h.tmpdir()
    local input = h.write_file(dir .. "/in.txt", "one\nfail\nthree\n")
    local log = dir .. "/log"
    local lines, n, _, status = run_raw(nil, ("-j 1 --joblog %s %s"):format(log, input))
    assert.equal(1, status)
    assert.equal(3, n)
    assert.equal("EBAD", lines[2].error.code)
    local recorded = select(2, by_line(cli.read(log)))
    assert.equal(3, recorded)
    h.write_file(input, "one\nfixed\nthree\n")
    lines, n, _, status = run_raw(nil, ("-j 1 --joblog %s --resume %s"):format(log, input))
    os.execute("rm -rf " .. dir)
    assert.equal(0, status)
    assert.equal(1, n)
    assert.equal(hex("fixed"), lines[2].result.hex)
  end)

  it("is refused by moonjob worker, whose jobs are JSON already", function()
    local _, err, status = h.sh(MOONJOB .. "worker " .. ECHO .. " --raw --redis redis://127.0.0.1:1/0 --queue q")
    assert.equal(2, status)
    assert.matches("--raw is for moonjob run and moonjob add", err, 1, true)
  end)
end)

describe("moonjob run on input that is not JSON #slow", function()
  it("stops before any line runs when its first line is not JSON, saying to use --raw", function()
    local dir = h.tmpdir()
    local marker = dir .. "/ran"
    local processor = h.write_file(dir .. "/p.lua",
      ("return function(job) io.open(%q, 'a'):write('x') return 1 end\n"):format(marker))
    local input = { "\n", "  \n" }
    for i = 1, 5000 do input[#input + 1] = "report-" .. i .. ".log\n" end
    local out, err, status = h.sh(MOONJOB .. "run -j 2 " .. processor, table.concat(input))
    local ran = cli.read(marker)
    os.execute("rm -rf " .. dir)
    assert.equal(2, status)
    assert.equal("", out)
    assert.is_nil(ran, "a line ran")
    assert.matches('^moonjob: line 3 is not JSON %("report%-1%.log"', err)
    assert.matches("use --raw", err, 1, true)
    assert.equal(1, select(2, err:gsub("\n", "")), "said more than once: " .. err)
  end)

  it("fails a later line that is not JSON alone, and says once at the end to use --raw", function()
    local out, err, status = h.sh(MOONJOB .. "run -j 1 " .. cli.HABITS, '{"a":1}\n2\nthree\nfour\n[5]\n')
    assert.equal(1, status)
    local lines, n = by_line(out)
    assert.equal(5, n)
    assert.equal("EINPUT", lines[3].error.code)
    assert.equal("EINPUT", lines[4].error.code)
    assert.same({ 5 }, lines[5].result)
    assert.matches("moonjob: 2 lines were not valid JSON %(the first: line 3%), and failed with EINPUT; "
      .. "for plain%-text lines use %-%-raw", err)
  end)

  it("keeps a first line whose only fault is its UTF-8, numbers or depth to fail alone", function()
    local out, err, status = h.sh(MOONJOB .. "run -j 1 " .. cli.HABITS, '"caf\233"\n1e400\n7\n')
    assert.equal(1, status)
    local lines = by_line(out)
    assert.equal("EINPUT", lines[1].error.code)
    assert.equal("EINPUT", lines[2].error.code)
    assert.equal(7, lines[3].result)
    assert.is_nil(err:find("use --raw", 1, true))
  end)
end)

describe("moonjob add --raw #slow", function()
  local server
  setup(function() server = redis_server.start() end)
  teardown(function() if server then server:stop() end end)

  it("adds one job per line of text, its data the line as a JSON string; blank lines add nothing", function()
    local input = h.write_file(os.tmpname(), "a.log\n\nsay \"hi\"\ncaf\233\n")
    local out, err, status = h.sh(("%s add --raw --redis %s --queue rawq %s"):format(MOONJOB, server.url, input))
    os.remove(input)
    assert.equal(1, status) -- the line that is not UTF-8 was not added
    assert.matches("line 4 is not UTF%-8 text", err)
    local ids = {}
    for id in out:gmatch("[^\n]+") do ids[#ids + 1] = id end
    assert.equal(2, #ids)
    local pool = assert(moonjob.pool(h.abs(ECHO), { redis = server.url, queue = "rawq", size = 1, echo = false }))
    local q = assert(moonjob.queue(server.url, "rawq"))
    local results = {}
    h.wait_for(function()
      for i, id in ipairs(ids) do
        local info = q:get(id)
        if info and info.state == "completed" then results[i] = info.result end
      end
      return results[1] and results[2]
    end, 20)
    pool:close()
    q:close()
    assert.equal(hex("a.log"), results[1].hex)
    assert.equal(hex('say "hi"'), results[2].hex)
  end)

  it("without --raw, says a line that is not JSON was skipped and that --raw takes text", function()
    local out, err, status = h.sh(("%s add --redis %s --queue rawq2"):format(MOONJOB, server.url), "a.log\n")
    assert.equal(1, status)
    assert.equal("", out)
    assert.matches("line 1 is not JSON %(.*%); skipped %(for plain%-text lines use %-%-raw%)", err)
  end)

  -- (a reader that stops at a NUL, as C's fgets does, would take line 1 for
  -- `{"a":1}` and join what follows the NUL to the next line)
  it("reads a NUL byte as one of its line's: after the JSON it is trailing data, with --raw it is kept", function()
    local out, err, status = h.sh(("%s add --redis %s --queue nulq"):format(MOONJOB, server.url),
      '{"a":1}\0junk\n{"b":2}\n{"c":3}\0')
    assert.equal(1, status)
    local said = "is not JSON %(trailing data at character 8: a NUL byte after the JSON value%); skipped"
    assert.matches("line 1 " .. said, err)
    assert.matches("line 3 " .. said, err)
    local ids = {}
    for id in out:gmatch("[^\n]+") do ids[#ids + 1] = id end
    assert.equal(1, #ids, out)
    local q = assert(moonjob.queue(server.url, "nulq"))
    assert.same({ b = 2 }, assert(q:job(ids[1])).data)
    out, err, status = h.sh(("%s add --raw --redis %s --queue nulq"):format(MOONJOB, server.url), "a\0b\nc\n")
    assert.equal(0, status, err)
    ids = {}
    for id in out:gmatch("[^\n]+") do ids[#ids + 1] = id end
    assert.equal(2, #ids, out)
    assert.equal("a\0b", assert(q:job(ids[1])).data)
    assert.equal("c", assert(q:job(ids[2])).data)
    q:close()
  end)

  it("says a read error of its input and exits 1, not 0 as if the input had ended", function()
    -- (/proc/self/mem opens, and reading it at offset 0 fails: EIO)
    local _, err, status = h.sh(("%s add --redis %s --queue readerr /proc/self/mem"):format(MOONJOB, server.url))
    assert.equal(1, status, err)
    assert.matches("cannot read /proc/self/mem after line 0: EIO", err, 1, true)
  end)

  it("refuses an input that is a directory before it sends anything (exit 2)", function()
    local dir = h.tmpdir()
    local _, err, status = h.sh(("%s add --redis %s --queue readerr %s"):format(MOONJOB, server.url, dir))
    assert.equal(2, status, err)
    assert.matches("cannot read " .. dir .. ": EISDIR", err, 1, true)
  end)
end)

describe("the pool's raw option", function()
  after_each(h.cleanup)

  it("hands each job's text to the processor as it is, with codec json only", function()
    local pool = h.pool("raw_echo.lua", { codec = "json", raw = true, size = 1 })
    local job = pool:add('{"not":"decoded"}')
    h.wait_for(function() return job.state == "completed" end)
    assert.equal(hex('{"not":"decoded"}'), json.decode(job.result).hex) -- (codec json: results are JSON text)
    assert.has_error(function() moonjob.pool(ECHO, { raw = true }) end,
      'moonjob.pool: option \'raw\' needs codec "json" (job data given as text)')
  end)
end)
