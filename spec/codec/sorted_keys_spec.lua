-- moonjob.codec.json writes object keys sorted by their bytes (as `jq -S`),
-- so that the same value is the same text whatever order its keys were
-- made in, and two runs of `moonjob run` can be diffed.
local h = require "helpers"
local json = require "moonjob.codec.json"
local cli = require "cli"

-- A table with keys inserted in the order given.
local function made_in(order, value_of)
  local t = {}
  for _, k in ipairs(order) do t[k] = value_of and value_of(k) or k end
  return t
end

describe("moonjob.codec.json's key order", function()
  it("sorts keys by their bytes, at every depth", function()
    local v = { zeta = 1, alpha = { y = true, b = { d = 1, c = 2 } }, Beta = "x", ["_"] = {} }
    assert.equal('{"Beta":"x","_":{},"alpha":{"b":{"c":2,"d":1},"y":true},"zeta":1}', json.encode(v))
  end)

  it("writes the same text whatever order the keys went in", function()
    local keys = {}
    for i = 1, 40 do keys[i] = ("k%02d"):format(i) end
    local reversed = {}
    for i = #keys, 1, -1 do reversed[#reversed + 1] = keys[i] end
    local a, b = json.encode(made_in(keys)), json.encode(made_in(reversed))
    assert.equal(a, b)
    assert.matches('^{"k01":"k01","k02":"k02",', a)
  end)

  it("sorts number keys by their text, with the string keys", function()
    assert.equal('{"1":"a","10":"c","9":"b","x":0}', json.encode({ [1] = "a", [9] = "b", [10] = "c", x = 0 }))
    assert.equal('{"1.5":1,"2":2}', json.encode({ [2] = 2, [1.5] = 1 }))
    assert.equal('{"1":"number","1":"string"}', json.encode({ [1] = "number", ["1"] = "string" }))
  end)

  it("sorts unicode keys in code point order (their UTF-8 bytes)", function()
    local v = { ["é"] = 1, z = 2, ["€"] = 3, ["😀"] = 4, A = 5 }
    assert.equal('{"A":5,"z":2,"é":1,"€":3,"😀":4}', json.encode(v))
  end)

  it("starts clean after an object that could not be written", function()
    assert.is_nil((json.encode({ a = 1, b = { c = 0 / 0, d = 1 }, e = 2 })))
    assert.is_nil((json.encode({ a = 1, [true] = 2 })))
    assert.equal('{"p":1,"q":{"r":2}}', json.encode({ q = { r = 2 }, p = 1 }))
    assert.equal('{"x":[1,2]}', json.encode({ x = { 1, 2 } }))
  end)

  it("makes `moonjob run` print the same bytes in two runs #slow", function()
    local lines = {}
    for i = 1, 200 do
      local obj = { id = i, nested = { deep = { a = 1, b = 2, c = 3 } }, ["é"] = "x", [""] = 0 }
      for k = 1, 30 do obj["key" .. k] = k end
      lines[i] = assert(json.encode(obj))
    end
    local input = cli.input_file(lines)
    local function run()
      local out, err, status = h.sh(cli.MOONJOB .. "run -j 2 -k spec/fixtures/shuffled_keys.lua " .. input)
      assert.equal(0, status, err)
      return (out:gsub(',"ms":[%d.e+-]+}', "}")) -- (the time each line took: the one field that varies)
    end
    local first, second = run(), run()
    os.remove(input)
    assert.equal(200, select(2, first:gsub("\n", "")))
    assert.equal(first, second)
    assert.matches('"result":{"":0,"id":1,"key1":1,"key10":10,', first, 1, true)
  end)
end)
