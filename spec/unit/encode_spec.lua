-- spec/unit/encode_spec.lua -- moonjob.child.encode on its own (it touches
-- no channel): what a processor raised or returned, made fit to cross.
local buffer = require "string.buffer"
local encode = require "moonjob.child.encode"

describe("moonjob.child.encode", function()
  after_each(function() encode.use_options({ max_payload = 64 * 1024 * 1024 }) end)

  describe(".to_error()", function()
    it("makes a raised string the message, with the default code", function()
      assert.same({ code = "EPROCESSOR", message = "boom", traceback = "tb" }, encode.to_error("boom", "tb", "EPROCESSOR"))
    end)

    it("keeps a raised table's code and fields, placeholders for what cannot cross", function()
      local raised = { code = "EBAD", message = "bad", sku = "A-1", f = print, co = coroutine.create(print) }
      raised.self = raised
      local err = encode.to_error(raised, "tb", "EPROCESSOR")
      assert.same({ code = "EBAD", message = "bad", sku = "A-1", f = "[function]", co = "[thread]",
        self = "[Circular]", traceback = "tb" }, err)
      assert.has_no.errors(function() buffer.encode(err) end)
    end)

    it("cuts nesting past 20 levels", function()
      local deep = {}
      local t = deep
      for _ = 1, 25 do t.next = {} t = t.next end
      local err = encode.to_error({ message = "m", deep = deep }, nil, "EPROCESSOR")
      local level, n = err.deep, 1
      while type(level) == "table" do level, n = level.next, n + 1 end
      assert.equal("[too deep]", level)
      assert.equal(20, n) -- the error itself and 19 tables inside it: 20 levels kept
    end)

    it("takes the default code when the raised one is not a string", function()
      assert.equal("ELOAD", encode.to_error({ code = 5, message = "m" }, nil, "ELOAD").code)
    end)

    it("describes a table raised without a message", function()
      assert.equal('a table was raised: { reason = "x" }', encode.to_error({ reason = "x" }, nil, "E").message)
      local printable = setmetatable({}, { __tostring = function() return "printed" end })
      assert.equal("printed", encode.to_error(printable, nil, "E").message)
    end)

    it("keeps a traceback the raised table carries", function()
      assert.equal("mine", encode.to_error({ message = "m", traceback = "mine" }, "handler's", "E").traceback)
    end)
  end)

  describe(".encode_error()", function()
    it("encodes an error with its fields", function()
      local err = { code = "E", message = "m", sku = "A" }
      assert.same(err, buffer.decode(encode.encode_error(err)))
    end)

    it("drops the error's own fields when one still cannot be encoded", function()
      local err = { code = "E", message = "m", traceback = "tb", f = print }
      assert.same({ code = "E", message = "m", traceback = "tb" }, buffer.decode(encode.encode_error(err)))
    end)
  end)

  describe(".handler()", function()
    it("keeps the raised value and a traceback that starts with its message", function()
      local ok, caught = xpcall(error, encode.handler, { message = "gone" })
      assert.is_false(ok)
      assert.same({ message = "gone" }, caught.value)
      assert.matches("^gone\nstack traceback:", caught.traceback)
    end)
  end)

  describe(".result_problem()", function()
    it("lets a result within max_payload go", function()
      encode.use_options({ max_payload = 4 })
      assert.is_nil(encode.result_problem("1234"))
    end)

    it("fails a result over max_payload", function()
      encode.use_options({ max_payload = 4 })
      assert.same({ code = "EPAYLOAD", message = "the result is 5 bytes, more than max_payload (4); "
        .. "return less or raise max_payload" }, encode.result_problem("12345"))
    end)

    it("fails a result that cannot be encoded, in the JSON codec's words for depth", function()
      assert.same({ code = "EPAYLOAD", message = "the result cannot be encoded: nested deeper than 100 levels" },
        encode.result_problem(nil, "x.lua:3: too deep to serialize"))
      assert.equal("the result cannot be encoded: cannot write a function in JSON",
        encode.result_problem(nil, "cannot write a function in JSON").message)
    end)
  end)

  describe(".failure_of()", function()
    it("is ENOMEM when the heap filled, naming memory_limit", function()
      encode.use_options({ memory_limit = 1000 })
      local err = encode.failure_of({ value = "x", traceback = "tb" }, true)
      assert.same({ code = "ENOMEM", message = "the job needed more than memory_limit (1000 bytes)", traceback = "tb" }, err)
      assert.equal("ENOMEM", encode.failure_of("not enough memory", false).code)
    end)

    it("is EPROCESSOR with what the processor raised otherwise", function()
      assert.same({ code = "EPROCESSOR", message = "boom", traceback = "tb" },
        encode.failure_of({ value = "boom", traceback = "tb" }, false))
    end)
  end)

  describe(".is_memory_error()", function()
    it("tells a full heap's message from others", function()
      assert.is_true(encode.is_memory_error("x.lua:1: not enough memory"))
      assert.is_false(encode.is_memory_error("boom"))
      assert.is_false(encode.is_memory_error({ message = "not enough memory" }))
    end)
  end)

  describe(".input_error()", function()
    it("is EINPUT, in words that say why the line did not decode", function()
      assert.equal("EINPUT: input is not valid JSON: unexpected x", tostring(encode.input_error("unexpected x")))
      assert.equal("input cannot cross exactly: number 1e400 is out of range",
        encode.input_error("number 1e400 is out of range").message)
      assert.equal("input cannot be decoded: nested deeper than 1000 levels",
        encode.input_error("nested deeper than 1000 levels").message)
    end)
  end)

  describe(".interrupt_reason()", function()
    it("reads the INTERRUPT frame's payload", function()
      local info = { code = "ETIMEDOUT", message = "too slow", reason = "timeout" }
      assert.same(info, encode.interrupt_reason(buffer.encode(info)))
    end)

    it("is ECANCELED when there is no payload or it does not decode", function()
      local canceled = { code = "ECANCELED", message = "the job was interrupted" }
      assert.same(canceled, encode.interrupt_reason(nil))
      assert.same(canceled, encode.interrupt_reason("\255\254 garbage"))
      assert.same(canceled, encode.interrupt_reason(buffer.encode("not a table")))
    end)
  end)
end)
