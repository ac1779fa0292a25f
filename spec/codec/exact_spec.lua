-- moonjob.codec.json's decoding through its C half (core/json_scan.c, then
-- cjson, then the markers turned back): every integer exact, every edge
-- refused in the same words, markers that no text can forge, and the same
-- values in the child program (ffi.C) and in the parent (core.so).
local ffi = require "ffi"
local h = require "helpers"
local json = require "moonjob.codec.json"
local lua_decode = require("moonjob.codec.json_lua").decode -- (where the C half is not there)

local decode_each = dofile("spec/fixtures/json_decode_each.lua")

local function int64(digits) return ffi.new("int64_t", 0) + assert(json.decode(digits)) end

local function assert_cdata(ctype, digits, v)
  assert.is_true(ffi.istype(ctype, v), digits .. " is not " .. ctype .. ": " .. tostring(v))
  assert.equal(digits, (tostring(v):gsub("U?LL$", "")))
end

-- Texts for the child and the parent to agree on (and the C and Lua paths).
local TEXTS = {
  "9007199254740991", "9007199254740992", "9007199254740993", "-9007199254740992", "-9007199254740993",
  "9223372036854775807", "9223372036854775808", "18446744073709551615", "18446744073709551616",
  "-9223372036854775808", "-9223372036854775809", "123456789012345678901234567890",
  '{"id":1700000001875161649,"user":"user2676","ts":"2026-07-14T19:37:11Z","text":"lorem ipsum"}',
  "0.1234567890123456", "[0.12345678901234567890123, 1234567890.1234567, 1e308, 1e-308, 5e-324]",
  "1e400", "-1E400", "1e-400", "[1, 1e-9999999]", "0e99999999999", "1.7976931348623157e308",
  "1.7976931348623159e308", "2.4703282292062328e-324", "2.4703282292062327e-324",
  "[]", "[ \t\n]", '{"a":[],"b":[1,[[]]],"c":{}}', "[[], {}, [[]]]",
  '"\\u00ffi12345678901234567890"', '["\\u00ff[", "\195\191i9223372036854775808", 9223372036854775808]',
  '{"a":12345678901234567890,"a":1}', "{12345678901234567890:1}", "{[]:1}", "01", "-", "[1,2",
  '"\255i1"', '["\237\160\128"]', "NaN", '{"x":-0}', "null", '"\\ud83d\\ude00"', "",
}

describe("moonjob.codec.json's exact decoding", function()
  it("finds its C half: core.so in a program, the program's own in the child", function()
    assert.equal("core.so", json.c_from)
    local pool = h.pool("json_decode_each.lua", { size = 1 })
    assert.equal("the program", assert(pool:run({})).c_from)
  end)

  it("keeps integers at the edges of 2^53 and of 64 bits exact, in the right type", function()
    for _, digits in ipairs({ "9007199254740991", "9007199254740992", "-9007199254740992" }) do
      assert.equal("number", type(json.decode(digits)))
      assert.equal(tonumber(digits), json.decode(digits))
    end
    assert_cdata("int64_t", "9007199254740993", json.decode("9007199254740993"))
    assert_cdata("int64_t", "-9007199254740993", json.decode("-9007199254740993"))
    assert_cdata("int64_t", "9223372036854775807", json.decode("9223372036854775807"))
    assert_cdata("uint64_t", "9223372036854775808", json.decode("9223372036854775808"))
    assert_cdata("uint64_t", "18446744073709551615", json.decode("18446744073709551615"))
    assert_cdata("int64_t", "-9223372036854775808", json.decode("-9223372036854775808"))
    assert.same({ nil, "number 18446744073709551616 at character 1 is an integer beyond 64 bits; write it as a string" },
      { json.decode("18446744073709551616") })
    assert.same({ nil, "number -9223372036854775809 at character 2 is an integer beyond 64 bits; write it as a string" },
      { json.decode(" -9223372036854775809") })
  end)

  it("keeps 19-digit ids inside a record exact", function()
    local v = assert(json.decode('{"id":1700000001875161649,"user":"u","ids":[-1700000001875161649,17]}'))
    assert_cdata("int64_t", "1700000001875161649", v.id)
    assert_cdata("int64_t", "-1700000001875161649", v.ids[1])
    assert.equal(17, v.ids[2])
    assert.equal('{"id":1700000001875161649,"ids":[-1700000001875161649,17],"user":"u"}', json.encode(v))
    assert.equal(int64("1700000001875161649"), v.id)
  end)

  it("reads a fractional run of 16 digits and more as a double", function()
    local v = json.decode("0.1234567890123456")
    assert.equal("number", type(v))
    assert.equal(0.1234567890123456, v)
    assert.equal(1234567890.1234567, json.decode("[1234567890.1234567]")[1])
  end)

  it("refuses numbers a double cannot hold, saying which and where", function()
    assert.same({ nil, "number 1e400 at character 1 is beyond the range of a double (about 1.8e308)" },
      { json.decode("1e400") })
    assert.same({ nil, "number -1E400 at character 7 is beyond the range of a double (about 1.8e308)" },
      { json.decode('{"a":[-1E400]}') })
    assert.same({ nil, "number 1e-400 at character 1 is too small for a double (it would read as 0)" },
      { json.decode("1e-400") })
    assert.same({ nil, "number 1.7976931348623159e308 at character 1 is beyond the range of a double (about 1.8e308)" },
      { json.decode("1.7976931348623159e308") })
    assert.equal(1.7976931348623157e308, json.decode("1.7976931348623157e308"))
    assert.equal(5e-324, json.decode("2.4703282292062328e-324"))
    assert.is_nil((json.decode("2.4703282292062327e-324")))
    assert.equal(0, json.decode("0e99999999999"))
    assert.same({ nil, "invalid number at character 2" }, { json.decode("[1.]") })
  end)

  it("brings [] back marked as an array, at the top and nested", function()
    local top = json.decode(" [ ] ")
    assert.equal(json.array_mt, getmetatable(top))
    local v = assert(json.decode('{"a":[],"b":[1,[[]]],"c":{}}'))
    assert.equal(json.array_mt, getmetatable(v.a))
    assert.equal(json.array_mt, getmetatable(v.b[2][1]))
    assert.is_nil(getmetatable(v.c))
    assert.equal('{"a":[],"b":[1,[[]]],"c":{}}', json.encode(v))
  end)

  it("never takes a string of the text for a marker", function()
    assert.equal("\195\191i12345678901234567890", json.decode('"\\u00ffi12345678901234567890"'))
    local v = assert(json.decode('["\\u00ff[", "\195\191i9223372036854775808", 9223372036854775808, []]'))
    assert.equal("\195\191[", v[1])
    assert.equal("\195\191i9223372036854775808", v[2])
    assert_cdata("uint64_t", "9223372036854775808", v[3])
    assert.equal(json.array_mt, getmetatable(v[4]))
    -- the byte markers begin with is never UTF-8: refused as such
    assert.same({ nil, "invalid UTF-8 at byte 2 (JSON text is UTF-8)" }, { json.decode('"\255i1"') })
    assert.same({ nil, "invalid UTF-8 at byte 29 (JSON text is UTF-8)" },
      { json.decode('[12345678901234567890, [], "\255["]') })
  end)

  it("rewrites texts with more markers than its first guess of room holds", function()
    local items = {}
    for i = 1, 1000 do items[i] = i % 2 == 0 and "[]" or tostring(9007199254740992LL + i):gsub("LL$", "") end
    local v = assert(json.decode("[" .. table.concat(items, ",") .. "]"))
    assert.equal(1000, #v)
    assert_cdata("int64_t", "9007199254740993", v[1])
    assert_cdata("int64_t", "9007199254741991", v[999])
    assert.equal(json.array_mt, getmetatable(v[1000]))
  end)

  it("refuses a number or [] as an object's key, and lets a repeated key stand", function()
    local v, err = json.decode("{12345678901234567890:1}")
    assert.is_nil(v)
    assert.equal("expected object key string but found T_NUMBER at character 2", err)
    assert.is_nil((json.decode("{[]:1}")))
    assert.same({ a = 1 }, json.decode('{"a":12345678901234567890,"a":1}'))
    assert.same({ nil, "expected comma or array end but found T_END at character 29" },
      { json.decode("[12345678901234567890, [], 2") })
  end)

  it("refuses text that is not UTF-8, before anything else", function()
    assert.same({ nil, "invalid UTF-8 at byte 3 (JSON text is UTF-8)" }, { json.decode('["\237\160\128", 1e400]') })
    assert.same({ nil, "invalid UTF-8 at byte 10 (JSON text is UTF-8)" }, { json.decode('[1e400, "\192\175"]') })
  end)

  it("nests 1000 deep and no deeper, with or without markers inside", function()
    local function nested(n, inner) return ("["):rep(n) .. inner .. ("]"):rep(n) end
    for _, inner in ipairs({ "1", "", "12345678901234567890" }) do
      assert.is_table(json.decode(nested(1000, inner)), inner)
      assert.same({ nil, "nested deeper than 1000 levels at character 1001" }, { json.decode(nested(1001, inner)) })
    end
    local deepest = json.decode(nested(1000, ""))
    for _ = 1, 999 do deepest = deepest[1] end
    assert.equal(json.array_mt, getmetatable(deepest))
  end)

  it("decodes as the Lua code does where the C half is not there, text by text", function()
    local c_path = json.decode
    json.decode = lua_decode
    local ok, lua = pcall(decode_each, { data = TEXTS })
    json.decode = c_path
    assert(ok, lua)
    local mine = decode_each({ data = TEXTS })
    for i, text in ipairs(TEXTS) do
      local a, b = mine[i], lua[i]
      assert.equal(a.error == nil, b.error == nil, text)
      if a.value then assert.same(b, a, text) end -- (errors: the same verdict, in cjson's words or ours)
    end
  end)

  it("agrees with the Lua code on 20,000 texts made of JSON's pieces, or is stricter", function()
    local PIECES = { "[", "]", "{", "}", '"', ",", ":", " ", "-", "0", "1", "9", ".", "e", "+", "[]",
      "12345678901234567890", "-9223372036854775809", "9007199254740993", "1e400", "1e-400", "0.1234567890123456",
      '"k"', '"\\u00ffi1"', "\195\169", "\255", "true", "null" }
    local describe_value = decode_each
    math.randomseed(7)
    local both_ok = 0
    for _ = 1, 20000 do
      local parts = {}
      for i = 1, math.random(1, 12) do parts[i] = PIECES[math.random(#PIECES)] end
      local text = table.concat(parts)
      local mine = describe_value({ data = { text } })[1]
      local c_path = json.decode
      json.decode = lua_decode
      local lua = describe_value({ data = { text } })[1]
      json.decode = c_path
      if mine.value then
        assert.same(lua, mine, text)
        both_ok = both_ok + 1
      else
        assert.is_string(mine.error, text)
        assert.is_nil(lua.value, text) -- (both refuse `1.`, which cjson alone would take)
      end
    end
    assert.is_true(both_ok > 500, "texts that decoded: " .. both_ok)
  end)

  it("decodes the same texts to the same values in the child and in the parent", function()
    local pool = h.pool("json_decode_each.lua", { size = 1 })
    local texts = { "[1.]", "1.e400", unpack(TEXTS) } -- (outside JSON's grammar: cjson alone would take them)
    local child = assert(pool:run(texts))
    local parent = decode_each({ data = texts })
    assert.equal("the program", child.c_from)
    assert.equal("core.so", parent.c_from)
    for i, text in ipairs(texts) do assert.same(parent[i], child[i], text) end
  end)
end)
