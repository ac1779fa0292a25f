-- spec/unit/encode_hostile_spec.lua -- moonjob.child.encode on values that
-- fight being read: error objects whose metamethods raise, values that are no
-- table, errors too large for max_payload. Nothing here may raise.
local buffer = require "string.buffer"
local encode = require "moonjob.child.encode"

local function raising(_, k) error("no field " .. tostring(k)) end

describe("moonjob.child.encode on hostile error values", function()
  after_each(function() encode.use_options({ max_payload = 64 * 1024 * 1024 }) end)

  it("reads a strict object's own fields raw, and its message through a protected __index", function()
    local strict = setmetatable({ reason = "x" }, { __index = raising })
    assert.same({ code = "E", message = 'a table was raised: { reason = "x" }', reason = "x", traceback = "tb" },
      encode.to_error(strict, "tb", "E"))
    local Class = setmetatable({ message = "from the class", code = "ECLASS" }, { __index = raising })
    Class.__index = Class
    local err = encode.to_error(setmetatable({}, Class), nil, "E")
    assert.equal("from the class", err.message)
    assert.equal("ECLASS", err.code)
  end)

  it("never raises in the message handler, whatever was raised", function()
    local values = {
      setmetatable({}, { __index = raising }),
      setmetatable({}, { __tostring = function() error("no text") end }),
      setmetatable({}, { __tostring = function() return {} end }),
      setmetatable({}, { __metatable = 42, __index = raising }),
      { message = setmetatable({}, { __tostring = function() error("no text") end }) },
      print, coroutine.create(print), io.stdout, nil, false,
    }
    for i = 1, 10 do
      local ok, caught = xpcall(error, encode.handler, values[i])
      assert.is_false(ok)
      assert.is_table(caught, "the handler raised for value " .. i)
      assert.is_string(encode.to_error(caught.value, caught.traceback, "E").message)
    end
  end)

  it("follows a message that is an error object, and stops on a cycle", function()
    assert.equal("inner", encode.message_of({ message = { message = "inner" } }))
    local t = {}
    t.message = t
    assert.matches("^a table was raised: { message = table: ", encode.message_of(t))
  end)

  it("leaves out fields too large for max_payload, saying so; then cuts message and traceback", function()
    encode.use_options({ max_payload = 4096 })
    local err = buffer.decode(encode.encode_error({ code = "E", message = "m", blob = string.rep("b", 10000) }))
    assert.is_nil(err.blob)
    assert.matches("^m %[its other fields were left out: %d+ bytes, more than max_payload %(4096%)%]$", err.message)
    local bytes = encode.encode_error({ code = "E", message = string.rep("m", 10000), traceback = string.rep("t", 10000) })
    assert.is_true(#bytes <= 4096)
    err = buffer.decode(bytes)
    assert.matches("%.%.%. %[cut: 10000 bytes in all%]$", err.message)
    assert.matches("%.%.%. %[cut: 10000 bytes in all%]$", err.traceback)
  end)
end)
