-- spec/unit/resultline_spec.lua -- moonjob.codec.resultline on its own: the
-- exact bytes of `moonjob run`'s result lines, as the parent and a child's
-- batch write them.
local buffer = require "string.buffer"
local json = require "moonjob.codec.json"
local resultline = require "moonjob.codec.resultline"

describe("moonjob.codec.resultline", function()
  describe(".completed()", function()
    it("writes the line of a completed job, its result as given", function()
      assert.equal('{"line":1,"status":"completed","result":{"a":1},"attempts":1,"ms":0.4}\n',
        resultline.completed(1, '{"a":1}', 1, 0.4))
    end)

    it("writes attempts past the table of small numbers", function()
      assert.matches('"attempts":1000,', resultline.completed(7, "null", 1000, 1), 1, true)
    end)

    it("writes milliseconds to the microsecond, as json.number_text does", function()
      for _, ms in ipairs({ 0, 0.0004, 0.0005, 0.4125, 1.05, 12, 999.9999, 1234.5678, 2e12, 1e14, 5e14, 2e15 }) do
        local us = math.floor(ms * 1000 + 0.5)
        local line = resultline.completed(1, "null", 1, ms)
        assert.equal('"ms":' .. json.number_text(us / 1000) .. "}\n", line:match('"ms":.*$'))
      end
    end)
  end)

  describe(".put_completed()", function()
    it("appends to the buffer it is given", function()
      local out = buffer.new()
      out:put("before\n")
      resultline.put_completed(out, 2, "true", 3, 1)
      assert.equal('before\n{"line":2,"status":"completed","result":true,"attempts":3,"ms":1}\n', out:tostring())
    end)
  end)

  describe(".failed()", function()
    it("writes code and message, then the error's own fields sorted, without the traceback", function()
      local err = { code = "EBAD", message = "no", traceback = "stack", sku = "A-1", count = 2, zone = "z",
        batch = true, area = 0 }
      assert.equal('{"line":3,"status":"failed","error":{"code":"EBAD","message":"no",'
        .. '"area":0,"batch":true,"count":2,"sku":"A-1","zone":"z"},"attempts":2,"ms":1.5}\n',
        resultline.failed(3, err, 2, 1.5))
    end)

    it("replaces the bytes of text that are not UTF-8 with U+FFFD", function()
      local line = resultline.failed(1, { code = "EBAD", message = "a\255b", ["k\254"] = "\255" }, 1, 0)
      assert.matches('"message":"a\239\191\189b"', line, 1, true)
      assert.matches('"k\239\191\189":"\239\191\189"', line, 1, true)
    end)

    it("writes a field JSON cannot hold as a string that says why", function()
      local line = resultline.failed(1, { code = "EBAD", message = "m", n = 0 / 0, f = print }, 1, 0)
      local decoded = json.decode(line)
      assert.equal("[cannot be written as JSON: cannot write nan in JSON]", decoded.error.n)
      assert.equal("[cannot be written as JSON: cannot write a function in JSON]", decoded.error.f)
    end)

    it("writes a code and a message that are not strings as text", function()
      local decoded = json.decode(resultline.failed(1, { code = 7 }, 1, 0))
      assert.same({ code = "7", message = "nil" }, decoded.error)
    end)
  end)
end)
