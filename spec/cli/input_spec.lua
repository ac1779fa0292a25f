-- What moonjob run reads: a UTF-8 byte order mark, lines that are not
-- UTF-8, numbers past the limits or beyond 2^53, nesting 1000 deep: each
-- runs exactly or fails with EINPUT saying why, never silently.
local h = require "helpers"
local json = require "moonjob.codec.json"
local cli = require "cli"

local MOONJOB, HABITS, by_line = cli.MOONJOB, cli.HABITS, cli.by_line

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
    { '{"a":1}\0junk', einput = "not valid JSON: trailing data at character 8: a NUL byte" },
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
