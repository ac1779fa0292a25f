-- What moonjob run writes: a closed output (| head) ends it quietly with
-- the jobs' status; what a processor prints or logs is tagged with its line
-- and stays whole next to result lines; a processor's errors, its own
-- fields and bytes that are not UTF-8 end up in valid result lines.
local h = require "helpers"
local cli = require "cli"

local MOONJOB, HABITS, by_line, input_file, now, read = cli.MOONJOB, cli.HABITS, cli.by_line, cli.input_file, cli.now, cli.read

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
