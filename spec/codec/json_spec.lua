local json = require "moonjob.codec.json"
local json_lua = require "moonjob.codec.json_lua"

describe("moonjob.codec.json", function()
  describe(".encode()", function()
    it("writes numbers exactly where cjson rounds them to 14 digits", function()
      assert.equal("9007199254740992", json.encode(2^53))
      assert.equal("123456789012345", json.encode(123456789012345))
      assert.equal("0.30000000000000004", json.encode(0.1 + 0.2))
      assert.equal("0.1", json.encode(0.1))
      assert.equal("-0", json.encode(-0.0))
      assert.equal(5e-324, tonumber(json.encode(5e-324)))
      assert.equal("1.7976931348623157e+308", json.encode(1.7976931348623157e308))
    end)

    it("round-trips random doubles bit for bit", function()
      math.randomseed(42)
      for _ = 1, 2000 do
        local n = (math.random() - 0.5) * 10 ^ math.random(-300, 300)
        assert.equal(n, json.decode(json.encode(n)))
      end
    end)

    it("refuses NaN and infinities with a message", function()
      local text, err = json.encode({ x = 0 / 0 })
      assert.is_nil(text)
      assert.matches("cannot write .*nan in JSON", err)
      assert.is_nil((json.encode(math.huge)))
    end)

    it("escapes control characters, quotes and backslashes, and leaves / alone", function()
      assert.equal([["a\"b\\c\n\u0001/"]], json.encode("a\"b\\c\n\1/"))
    end)
  end)

  describe(".decode()", function()
    it("keeps an empty array as an array on the way back", function()
      local v = json.decode('{"a":[],"b":[1,[]],"c":{}}')
      assert.equal('[]', json.encode(v.a))
      assert.equal('[1,[]]', json.encode(v.b))
      assert.equal('{}', json.encode(v.c))
    end)

    it("decodes \\u escapes and surrogate pairs in the Lua decoder", function()
      local v = json.decode('["\\u00e9\\ud83d\\ude00", []]')
      assert.equal("é😀", v[1])
    end)

    it("returns nil and a message for invalid JSON", function()
      local v, err = json.decode("{nope")
      assert.is_nil(v)
      assert.is_string(err)
      local v2, err2 = json.decode("[1, [], ")
      assert.is_nil(v2)
      assert.is_string(err2)
    end)

    -- cjson stops reading at a NUL byte: what follows it must not be dropped
    -- unseen, on the C path (plain, fixups, copy) and the Lua one alike
    it("refuses a NUL byte after the value as trailing data, with and without the C half", function()
      local TRAILING = {
        ['{"a":1}\0junk'] = 8, ['{"a":1}\0'] = 8, ['[1]\0x'] = 4, ['1\0'] = 2, ['"x" \0y'] = 5,
        ['{"a":12345678901234567890}\0j'] = 27, ['{"a":[]}\0'] = 9, ['[[], 12345678901234567890]\0'] = 27,
        ['{"a":1}\n\0{"b":2}'] = 9,
      }
      for name, decode in pairs({ c = json.decode, lua = json_lua.decode }) do
        for text, at in pairs(TRAILING) do
          assert.same({ nil, ("trailing data at character %d: a NUL byte after the JSON value"):format(at) },
            { decode(text) }, name .. ": " .. ("%q"):format(text))
        end
        -- before the value's end: refused too
        assert.same({ nil, "unexpected NUL byte at character 6" }, { decode('{"a":\0}') }, name)
        assert.same({ nil, "unexpected NUL byte at character 1" }, { decode('\0{"a":1}') }, name)
        assert.is_nil((decode('["a\0b"]')), name)
        assert.is_nil((decode('["a\0b", []]')), name)
        -- not UTF-8 comes first, as for any other error
        assert.same({ nil, "invalid UTF-8 at byte 10 (JSON text is UTF-8)" }, { decode('{"a":1}\0 \255') }, name)
      end
      assert.same({ "a\0b" }, json.decode('["a\\u0000b"]')) -- (written as an escape it is a string's byte)
    end)
  end)
end)
