-- The scan's shortcut for the commonest texts with big integers: records
-- whose top object holds them as members ({"id":1700000001875161649,...}).
-- cjson decodes the text itself and the codec sets those members by key
-- (core/json_scan.c, MOONJOB_JSON_FIXUPS), with no copy to decode and walk.
-- These specs check which texts take it, through the scanner's own status,
-- and that every text decodes exactly as the Lua decoder says, whichever way.
local ffi = require "ffi"
local json = require "moonjob.codec.json"
local lua_decode = require("moonjob.codec.json_lua").decode -- (where the C half is not there)

local decode_each = dofile("spec/fixtures/json_decode_each.lua")

local FIXUPS, REWRITTEN, NUL = 8, 1, 9
local lib = ffi.load(package.searchpath("moonjob.core", package.cpath))
local scan = ffi.new("moonjob_json_scan_t")

local function status_of(text)
  local room = #text + 64
  local out = ffi.new("char[?]", room)
  return lib.moonjob_json_scan(text, #text, out, room, 1000, scan)
end

-- What json.decode and the Lua decoder make of each text, described.
local function both(texts)
  local mine = decode_each({ data = texts })
  local c_path = json.decode
  json.decode = lua_decode
  local ok, lua = pcall(decode_each, { data = texts })
  json.decode = c_path
  assert(ok, lua)
  return mine, lua
end

describe("moonjob.codec.json's members fixed up after cjson", function()
  it("are the top object's big integers and [] with plain keys, blanks and all", function()
    for _, text in ipairs({
      '{"id":1700000001875161649,"user":"u","n":1}',
      ' \n{ "id" : 1700000001875161649 , "t":"x"}\t',
      '{"a":[],"b":18446744073709551615,"c":-9223372036854775808,"d":[ ]}',
      '{"id":1,"id":1700000001875161649}', -- (the last of a repeated key stands: the marker's)
      '{"\195\169":1700000001875161649,"x":{"id":5}}',
      '{"a":1700000001875161649,"b":{"a":5}}', -- (a nested key of the same name is another member)
    }) do
      assert.equal(FIXUPS, status_of(text), text)
    end
    local v = json.decode('{"a":[],"b":18446744073709551615,"c":-9223372036854775808,"d":[ ]}')
    assert.equal(json.array_mt, getmetatable(v.a))
    assert.equal(json.array_mt, getmetatable(v.d))
    assert.is_true(ffi.istype("uint64_t", v.b))
    assert.equal("18446744073709551615ULL", tostring(v.b))
    assert.is_true(ffi.istype("int64_t", v.c))
    assert.equal("-9223372036854775808LL", tostring(v.c))
    assert.equal("1700000001875161649LL", tostring(json.decode('{"id":1,"id":1700000001875161649}').id))
  end)

  it("leave to the copy what a key alone cannot find", function()
    for _, text in ipairs({
      '{"id":1700000001875161649,"id":1}', -- a later value of the same key stands
      '{"id":1700000001875161649,"i\\u0064":1}', -- the same key, escaped
      '{"i\\u0064":1700000001875161649}', -- an escaped key
      '{"a":{"id":1700000001875161649}}', -- nested
      '[1700000001875161649]', '1700000001875161649', -- no top object
      '{"a":[],"a":[1]}',
      '{"b":1,"a\\"b":12345678901234567890}', -- a key ending in an escaped quote
      '{"a":1700000001875161649,"b":[],"c":[],"d":[],"e":[],"f":[],"g":[],"h":[],"i":[]}', -- past 8
    }) do
      assert.equal(REWRITTEN, status_of(text), text)
    end
    assert.same({ id = 1 }, json.decode('{"id":1700000001875161649,"i\\u0064":1}'))
    assert.same({ a = { 1 } }, json.decode('{"a":[],"a":[1]}'))
    local v = json.decode('{"b":1,"a\\"b":12345678901234567890}')
    assert.equal(1, v.b)
    assert.equal("12345678901234567890ULL", tostring(v['a"b']))
    v = json.decode('{"b":{},"a\\"b":[]}')
    assert.is_nil(getmetatable(v.b))
    assert.equal(json.array_mt, getmetatable(v['a"b']))
    -- cjson reads up to a NUL: the scan refuses the text, the NUL and all
    assert.equal(NUL, status_of('{"a":1}\0{"a":12345678901234567890}'))
    assert.same({ nil, "trailing data at character 8: a NUL byte after the JSON value" },
      { json.decode('{"a":1}\0{"a":12345678901234567890}') })
  end)

  it("decode as the Lua decoder does, on 5,000 generated records", function()
    local KEYS = { '"a"', '"b"', '"a"', '"\\u0061"', '"\195\169"', '"id"', '"a\\"b"', '"\\""', '""' }
    local VALUES = { "1700000001875161649", "-9223372036854775808", "18446744073709551615", "[]", "[ ]",
      "1", '"s"', "null", '{"a":1700000001875161649}', "[1700000001875161649]", "[[]]", "2.5", "{}" }
    local BLANKS = { "", "", " ", "\n " }
    math.randomseed(11)
    local texts, fixups = {}, 0
    for n = 1, 5000 do
      local members = {}
      for i = 1, math.random(1, 10) do
        members[i] = KEYS[math.random(#KEYS)] .. BLANKS[math.random(#BLANKS)] .. ":"
          .. BLANKS[math.random(#BLANKS)] .. VALUES[math.random(#VALUES)]
      end
      texts[n] = BLANKS[math.random(#BLANKS)] .. "{" .. table.concat(members, ",") .. "}"
      if status_of(texts[n]) == FIXUPS then fixups = fixups + 1 end
    end
    local mine, lua = both(texts)
    for i, text in ipairs(texts) do assert.same(lua[i], mine[i], text) end
    assert.is_true(fixups > 300, "texts fixed up: " .. fixups)
  end)

  it("keep no big scratch buffer once a big record is decoded", function()
    local text = '{"id":1700000001875161649,"text":"' .. ("x"):rep(20 * 1024 * 1024) .. '"}'
    assert.equal(FIXUPS, status_of(text))
    collectgarbage()
    collectgarbage()
    local before = collectgarbage("count")
    local v = json.decode(text)
    assert.equal("1700000001875161649LL", tostring(v.id))
    v = nil -- luacheck: ignore
    collectgarbage()
    collectgarbage()
    local kept_kb = collectgarbage("count") - before
    assert.is_true(kept_kb < 4 * 1024, ("%.0f KiB kept after the decode"):format(kept_kb))
  end)

  it("say what is wrong with a text that is not JSON, in cjson's words", function()
    local v, err = json.decode('{"a":1700000001875161649 "b":2}')
    assert.is_nil(v)
    assert.equal("expected comma or object end but found T_STRING at character 26", err)
  end)
end)
