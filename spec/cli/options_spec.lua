-- The command line as users of GNU parallel and other Unix tools type it and
-- read it: option forms, --halt, a closed output (| head), input edge cases
-- (a BOM, invalid UTF-8, numbers and nesting past the limits), processor
-- output tagged with its line, and a processor's own error fields. What
-- shows on a terminal is in spec/cli/terminal_spec.lua.
local h = require "helpers"
local json = require "moonjob.codec.json"

local MOONJOB = h.LUAJIT .. " scripts/moonjob "
local HABITS = "spec/fixtures/habits.lua"

-- Output lines decoded, keyed by input line; every line must be valid JSON.
local function by_line(out)
  local lines, n = {}, 0
  for text in out:gmatch("[^\n]+") do
    local v = assert(json.decode(text), "not JSON: " .. text)
    lines[v.line] = v
    n = n + 1
  end
  return lines, n
end

-- An input file of the given lines (strings, or tables written as JSON).
local function input_file(list)
  local t = {}
  for i, v in ipairs(list) do t[i] = type(v) == "string" and v or assert(json.encode(v)) end
  return h.write_file(os.tmpname(), table.concat(t, "\n") .. "\n")
end

local function now() return require("moonjob.loop").now() / 1000 end

describe("moonjob run's options", function()
  it("takes -j1, -j=1, -j 1, --concurrency=1, --concurrency 1 and --jobs 1 alike", function()
    -- slow lines through one child run in one process; the default (a child
    -- per CPU, 2 here) or a value ignored would spread them
    local function children_used(form)
      local out, err, status = h.sh(MOONJOB .. "run " .. form .. " spec/fixtures/pid_after.lua",
        ('{"ms":100}\n'):rep(6))
      assert.equal(0, status, form .. ": " .. err)
      local pids, n = {}, 0
      for pid in out:gmatch('"result":(%d+)') do
        if not pids[pid] then n = n + 1 end
        pids[pid] = true
      end
      return n
    end
    assert.is_true(children_used("-j 3") >= 2) -- (so one process for -j1 is the option's doing)
    for _, form in ipairs({ "-j1", "-j=1", "-j 1", "--concurrency=1", "--concurrency 1", "--jobs 1", "--jobs=1" }) do
      assert.equal(1, children_used(form), form)
    end
  end)

  it("says what a value-taking option needs when its value is missing or wrong", function()
    local _, err, status = h.sh(MOONJOB .. "run " .. HABITS .. " -j")
    assert.equal(2, status)
    assert.equal("moonjob: -j needs a number: a whole number from 1 to 1024\nTry 'moonjob --help'.\n", err)
    _, err = h.sh(MOONJOB .. "run " .. HABITS .. " --concurrency=")
    assert.matches("^moonjob: %-%-concurrency needs a number: a whole number from 1 to 1024\n", err)
    _, err = h.sh(MOONJOB .. "run " .. HABITS .. " -jx")
    assert.matches("^moonjob: %-j needs a whole number from 1 to 1024, got 'x'\n", err)
    _, err = h.sh(MOONJOB .. "run " .. HABITS .. " --halt sometimes")
    assert.matches("^moonjob: %-%-halt needs now,fail=N, soon,fail=N, now,fail=P%% or soon,fail=P%%", err)
    assert.truthy(err:find("got 'sometimes'", 1, true))
  end)

  it("refuses a directory as its input, saying so", function()
    local dir = h.tmpdir()
    local _, err, status = h.sh(MOONJOB .. "run " .. HABITS .. " " .. dir)
    os.execute("rm -rf " .. dir)
    assert.equal(2, status)
    assert.equal(("moonjob: cannot open input '%s': illegal operation on a directory\nTry 'moonjob --help'.\n")
      :format(dir), err)
  end)

  it("says 'permission denied' for an input or processor it may not read", function()
    local dir = h.tmpdir()
    local input = h.write_file(dir .. "/in.ndjson", "1\n")
    local processor = h.write_file(dir .. "/p.lua", "return function(job) return job.data end\n")
    assert(os.execute("chmod 000 " .. input .. " " .. processor) == 0)
    -- as root, without the capabilities that read any file
    local as_user = h.AS_ROOT and "setpriv --bounding-set=-dac_override,-dac_read_search " or ""
    local _, err, status = h.sh(as_user .. MOONJOB .. "run " .. HABITS .. " " .. input)
    assert.equal(2, status)
    assert.equal(("moonjob: cannot open input '%s': permission denied\nTry 'moonjob --help'.\n")
      :format(input), err)
    _, err, status = h.sh(as_user .. MOONJOB .. "run " .. processor, "1\n")
    assert.equal(2, status)
    assert.equal(("moonjob: ELOAD: cannot open processor file '%s': permission denied\n"):format(processor)
      .. "Try 'moonjob --help'.\n", err)
    os.execute("rm -rf " .. dir)
  end)
end)

describe("moonjob run --halt", function()
  it("now,fail=1 stops at the first failed line, kills the running jobs and exits 3", function()
    local input = input_file({ { sleep = 30 }, { fail = "EBAD" }, { n = 3 }, { n = 4 } })
    local t0 = now()
    local out, err, status = h.sh(MOONJOB .. "run -j 2 --halt now,fail=1 " .. HABITS .. " " .. input)
    os.remove(input)
    assert.is_true(now() - t0 < 20, "the 30 s line was not killed")
    assert.equal(3, status)
    local lines, n = by_line(out)
    assert.equal("EBAD", lines[2].error.code)
    assert.is_nil(lines[1]) -- killed: not printed, it runs again with --resume
    assert.is_true(n <= 3, out) -- line 3 may have finished in the meantime, line 4 too late
    assert.equal("moonjob: halted (--halt now,fail=1): 1 line failed; running jobs were killed\n", err)
  end)

  it("soon,fail=1 starts nothing more after a failed line, lets the running ones finish and exits 4", function()
    local list = { { sleep = 1 }, { fail = "EBAD" } }
    for i = 3, 40 do list[i] = { sleep = 0.2 } end
    local input = input_file(list)
    local out, err, status = h.sh(MOONJOB .. "run -j 2 --halt soon,fail=1 " .. HABITS .. " " .. input)
    os.remove(input)
    assert.equal(4, status)
    local lines, n = by_line(out)
    assert.equal("completed", lines[1].status) -- it was running: it finished
    assert.equal("EBAD", lines[2].error.code)
    assert.is_true(n <= 4, out) -- at most what the second child had started meanwhile
    assert.equal("moonjob: halted (--halt soon,fail=1): 1 line failed; running jobs finished, no more "
      .. "were started\n", err)
  end)

  it("soon prints the failed line and what ran, once, also with -k and batches; --resume runs the rest", function()
    for _, k in ipairs({ "", "-k " }) do
      local list = {}
      for i = 1, 6000 do list[i] = i == 4500 and { fail = "EBAD" } or { n = i } end
      local input = input_file(list)
      local log = os.tmpname()
      os.remove(log)
      local args = "run -j 3 " .. k .. "--joblog " .. log .. " "
      local out, _, status = h.sh(MOONJOB .. args .. "--halt soon,fail=1 " .. HABITS .. " " .. input)
      assert.equal(4, status)
      local lines = by_line(out)
      assert.equal("EBAD", lines[4500].error.code, k)
      local again = h.sh(MOONJOB .. args .. "--resume " .. HABITS .. " " .. input)
      os.remove(input)
      os.remove(log)
      local completed = {}
      for line, state in (out .. again):gmatch('"line":(%d+),"status":"(%a+)"') do
        line = tonumber(line)
        assert.is_nil(completed[line], k .. "line " .. line .. " completed twice")
        if state == "completed" then completed[line] = true end
      end
      for i = 1, 6000 do assert.is_true(i == 4500 or completed[i], k .. "line " .. i .. " never completed") end
    end
  end)

  it("now,fail=P% stops once P% of the finished lines failed, counted from the third", function()
    local input = input_file({ { n = 1 }, { n = 2 }, { fail = "EBAD" }, { n = 4 }, { n = 5 }, { n = 6 } })
    local out, _, status = h.sh(MOONJOB .. "run -j 1 --halt now,fail=30% " .. HABITS .. " " .. input)
    assert.equal(3, status) -- 1 of 3 is 33%
    local lines = by_line(out)
    assert.equal("EBAD", lines[3].error.code)
    out, _, status = h.sh(MOONJOB .. "run -j 1 --halt soon,fail=50% " .. HABITS .. " " .. input)
    os.remove(input)
    assert.equal(1, status) -- never 50%: every line runs, and a failure exits 1 as without --halt
    local _, n = by_line(out)
    assert.equal(6, n)
  end)
end)

describe("moonjob run with its output closed early (| head)", function()
  -- Runs `moonjob run ARGS` on `input` into `| head -n 1`; returns moonjob's
  -- status, what head printed, and the seconds it took.
  local function into_head(args, input)
    local t0 = now()
    local out, err = h.sh("(" .. MOONJOB .. "run " .. args .. " " .. input .. '; echo "status=$?" >&2) | head -n 1')
    return tonumber(err:match("status=(%d+)")), out, now() - t0, err
  end

  it("stops quietly with status 0 when no finished job failed", function()
    local list = {}
    for i = 1, 20000 do list[i] = tostring(i) end
    local input = input_file(list)
    local status, out, _, err = into_head("-j 2 " .. HABITS, input)
    os.remove(input)
    assert.equal(0, status)
    assert.equal("status=0\n", err) -- nothing else on stderr
    assert.equal(1, select(2, out:gsub("\n", "")))
  end)

  it("exits 1 when a job that finished failed, and ends the children still running", function()
    local list = { { fail = "EBAD" } }
    for i = 2, 60 do list[i] = { sleep = i < 4 and 0 or 30 } end
    local input = input_file(list)
    local status, _, seconds = into_head("-j 2 -k " .. HABITS, input)
    os.remove(input)
    assert.equal(1, status)
    assert.is_true(seconds < 20, "the children running 30 s jobs were waited for")
  end)
end)

describe("moonjob run with its output closed early, nothing more to write", function()
  it("sees the reader gone at once and ends the children still running", function()
    local input = input_file({ { n = 1 }, { sleep = 30 }, { sleep = 30 } })
    local t0 = now()
    local _, err = h.sh("(" .. MOONJOB .. "run -j 3 " .. HABITS .. " " .. input
      .. '; echo "status=$?" >&2) | (read line; echo "$line" >&2; sleep 0.5)')
    os.remove(input)
    assert.matches('^{"line":1,"status":"completed"', err)
    assert.matches("status=0\n$", err)
    assert.is_true(now() - t0 < 15, "it waited for the 30 s jobs")
  end)
end)

describe("moonjob run's input", function()
  it("skips a UTF-8 byte order mark at its start, from a file and from a pipe", function()
    local input = h.write_file(os.tmpname(), '\239\187\191{"n":1}\n2\n')
    local out, _, status = h.sh(MOONJOB .. "run -j 1 " .. HABITS .. " " .. input)
    assert.equal(0, status)
    local lines = by_line(out)
    assert.same({ n = 1 }, lines[1].result)
    -- through a pipe, the mark split across writes
    out, _, status = h.sh("(printf '\\357'; sleep 0.2; printf '\\273\\277\"x\"\\n') | " .. MOONJOB
      .. "run -j 1 " .. HABITS)
    assert.equal(0, status)
    assert.equal("x", by_line(out)[1].result)
    -- a mark anywhere else is not skipped: that line is not JSON
    out = h.sh(MOONJOB .. "run -j 1 " .. HABITS, '1\n\239\187\1912\n')
    assert.equal("EINPUT", by_line(out)[2].error.code)
    os.remove(input)
  end)

  it("fails a line that is not UTF-8 with EINPUT, and its output stays valid JSON", function()
    local out, _, status = h.sh(MOONJOB .. "run -j 1 " .. HABITS,
      '"caf\195\169"\n"\255\254"\n"\237\160\128"\n"\192\175"\n["ok"]\n')
    assert.equal(1, status)
    local lines, n = by_line(out) -- (by_line asserts each line decodes)
    assert.equal(5, n)
    assert.equal("caf\195\169", lines[1].result)
    for i = 2, 4 do -- a bad byte, a surrogate, an overlong form
      assert.equal("EINPUT", lines[i].error.code)
      assert.matches("^input is not valid JSON: invalid UTF%-8 at byte 2", lines[i].error.message)
    end
    assert.same({ "ok" }, lines[5].result)
  end)

  it("fails a result string that is not UTF-8 with EPAYLOAD", function()
    local dir = h.tmpdir()
    local processor = h.write_file(dir .. "/bytes.lua", 'return function(job) return job.data .. "\\255" end\n')
    local out, _, status = h.sh(MOONJOB .. "run -j 1 " .. processor, '"abc"\n')
    os.execute("rm -rf " .. dir)
    assert.equal(1, status)
    local line = by_line(out)[1]
    assert.equal("EPAYLOAD", line.error.code)
    assert.equal("the result cannot be encoded: cannot write a string that is not UTF-8 (byte 4) in JSON; "
      .. "send bytes as base64 or hex", line.error.message)
  end)

  it("fails 1e400 with EINPUT, in every position and both decoders", function()
    local out = h.sh(MOONJOB .. "run -j 1 " .. HABITS, '1e400\n{"a":-1E400}\n[[], 1e400]\n')
    local lines = by_line(out)
    for i = 1, 3 do
      assert.equal("EINPUT", lines[i].error.code)
      assert.matches("is beyond the range of a double", lines[i].error.message)
    end
  end)

  it("nests arrays and objects 1000 deep and no deeper, in the same words everywhere", function()
    local function nested(n, inner) return ("["):rep(n) .. inner .. ("]"):rep(n) end
    local input = table.concat({ nested(1000, "1"), nested(1001, "1"), nested(1000, ""), nested(1001, "") }, "\n")
    local out = h.sh(MOONJOB .. "run -j 1 -k spec/fixtures/identity.lua", input .. "\n")
    local texts = {}
    for text in out:gmatch("[^\n]+") do texts[#texts + 1] = text end
    -- a line holds its result one level deeper: a result of 1000 levels is
    -- written whole, though a decoder held to 1000 levels cannot read its line
    assert.equal('{"line":1,"status":"completed","result":' .. nested(1000, "1"), texts[1]:match("^(.-),\"attempts\""))
    assert.equal('{"line":3,"status":"completed","result":' .. nested(1000, ""), texts[3]:match("^(.-),\"attempts\""))
    for _, i in ipairs({ 2, 4 }) do -- (line 3 went through the other decoder: it holds an empty array)
      local e = assert(json.decode(texts[i])).error
      assert.equal("EINPUT", e.code)
      assert.equal("input cannot be decoded: nested deeper than 1000 levels at character 1001", e.message)
    end
    -- a result nested deeper: the same words
    local dir = h.tmpdir()
    local deep = h.write_file(dir .. "/deep.lua", [[
return function(job)
  local t = {}
  local c = t
  for _ = 2, job.data do c[1] = {}; c = c[1] end
  return t
end
]])
    out = h.sh(MOONJOB .. "run -j 1 -k " .. deep, "1000\n1001\n")
    os.execute("rm -rf " .. dir)
    local first, second = out:match("^([^\n]*)\n([^\n]*)\n$")
    assert.matches('^{"line":1,"status":"completed","result":%[%[%[', first)
    assert.equal("the result cannot be encoded: cannot write JSON nested deeper than 1000 levels",
      assert(json.decode(second)).error.message)
  end)
end)

describe("moonjob run's processor output and errors", function()
  it("tags what a processor prints or logs with its line, in batches too", function()
    local list, saying = {}, 0
    for i = 1, 3000 do
      list[i] = { n = i }
      if i % 97 == 0 then list[i] = { print = "line " .. i .. " says hi" } end
      if i % 97 == 50 then list[i] = { log = "line " .. i .. " says hi" } end
      if i % 97 == 0 or i % 97 == 50 then saying = saying + 1 end
    end
    local input = input_file(list)
    local out, err, status = h.sh(MOONJOB .. "run -j 2 " .. HABITS .. " " .. input)
    os.remove(input)
    assert.equal(0, status)
    local _, n = by_line(out)
    assert.equal(3000, n)
    local tagged = 0
    for tag, said in err:gmatch("%[line (%d+)%] line (%d+) says hi\n") do
      assert.equal(tag, said)
      tagged = tagged + 1
    end
    assert.equal(saying, tagged)
    assert.is_nil(err:find("[job", 1, true))
  end)

  it("writes a failed line whose error is not UTF-8, its bad bytes replaced, and ends", function()
    local dir = h.tmpdir()
    local processor = h.write_file(dir .. "/latin1.lua", [[
return function(job)
  if job.data % 1000 == 15 then error({ code = "E\233", message = "caf\233 " .. job.data, ["k\255"] = "v\255" }) end
  return job.data
end
]])
    local list = {}
    for i = 1, 3000 do list[i] = tostring(i) end
    local input = input_file(list)
    -- in batches, and one line per job (--attempts 2)
    for _, args in ipairs({ "-j 2 ", "-j 2 --attempts 2 " }) do
      local out, _, status = h.sh("timeout 60 " .. MOONJOB .. "run " .. args .. processor .. " " .. input)
      assert.equal(1, status, args)
      local lines, n = by_line(out)
      assert.equal(3000, n, args)
      assert.same({ code = "E\239\191\189", message = "caf\239\191\189 15", ["k\239\191\189"] = "v\239\191\189" },
        lines[15].error)
    end
    -- a message of 600,000 bytes that are not UTF-8: replaced in one pass (this
    -- took minutes when each bad byte rescanned the rest)
    h.write_file(processor, 'return function() error(("\\233"):rep(600000)) end\n')
    local out, _, status = h.sh("timeout 60 " .. MOONJOB .. "run -j 1 " .. processor, "1\n")
    assert.equal(1, status)
    assert.equal(600000, select(2, by_line(out)[1].error.message:gsub("\239\191\189", "")))
    os.remove(input)
    os.execute("rm -rf " .. dir)
  end)

  it("puts a processor's own error fields in the line's error object", function()
    local out, _, status = h.sh(MOONJOB .. "run -j 1 " .. HABITS,
      '{"fail":"EBADSKU","sku":"A-1"}\n{"n":2}\n{"fail":"EBADSKU","sku":"B-2"}\n')
    assert.equal(1, status)
    local lines = by_line(out)
    assert.same({ code = "EBADSKU", message = "failed on purpose", sku = "A-1" }, lines[1].error)
    assert.same({ code = "EBADSKU", message = "failed on purpose", sku = "B-2" }, lines[3].error)
    -- moonjob's own fields too, with no traceback
    out = h.sh(MOONJOB .. "run -j 1 spec/fixtures/fails.lua", '{"how":"exit1"}\n')
    local e = by_line(out)[1].error
    assert.equal("ECRASH", e.code)
    assert.equal(1, e.exit_status)
    assert.is_number(e.pid)
    assert.is_nil(e.traceback)
  end)
end)
