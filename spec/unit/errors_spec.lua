-- spec/unit/errors_spec.lua -- moonjob.errors on its own: how its errors are
-- made and how they print.
local errors = require "moonjob.errors"

describe("moonjob.errors", function()
  describe(".new()", function()
    it("makes an error that prints as CODE: message", function()
      local err = errors.new("EBAD", "it broke")
      assert.equal("EBAD", err.code)
      assert.equal("it broke", err.message)
      assert.equal("EBAD: it broke", tostring(err))
    end)

    it("copies the fields given, code and message winning", function()
      local fields = { sku = "A-1", code = "EOTHER", message = "other" }
      local err = errors.new("EBAD", "it broke", fields)
      assert.same({ sku = "A-1", code = "EBAD", message = "it broke" }, setmetatable(err, nil))
      assert.equal("EOTHER", fields.code) -- the caller's table is left alone
    end)
  end)

  describe(".wrap()", function()
    it("puts the metatable on the table itself", function()
      local t = { code = "EX", message = "m", extra = 1 }
      assert.equal(t, errors.wrap(t))
      assert.equal("EX: m", tostring(t))
      assert.equal(1, t.extra)
    end)

    it("fills a missing code and message, and makes the message a string", function()
      assert.equal("EPROCESSOR: (no message)", tostring(errors.wrap({})))
      local err = errors.wrap({ code = "EX", message = 42 })
      assert.equal("42", err.message)
    end)
  end)

  describe(".interrupted()", function()
    it("prints as its message alone, naming the signal", function()
      local err = errors.interrupted(2)
      assert.equal("EINTERRUPTED", err.code)
      assert.equal(2, err.signal)
      assert.equal("interrupted (Ctrl-C); jobs keep running and the pool stays usable", tostring(err))
    end)

    it("names SIGTERM, SIGHUP and any other signal", function()
      assert.matches("^interrupted %(SIGTERM%);", tostring(errors.interrupted(15)))
      assert.matches("^interrupted %(SIGHUP%);", tostring(errors.interrupted(1)))
      assert.matches("^interrupted %(signal 10%);", tostring(errors.interrupted(10)))
    end)

    it("prints as its message for a message handler outside the REPL", function()
      local ok, text = xpcall(error, tostring, errors.interrupted(2), 0)
      assert.is_false(ok)
      assert.equal("interrupted (Ctrl-C); jobs keep running and the pool stays usable", text)
    end)
  end)
end)
