-- json.encode run again from inside itself, through a metamethod it reads.
local json = require "moonjob.codec.json"

describe("json.encode inside json.encode", function()
  it("leaves the outer text and its key lists whole", function()
    local inner_text
    local holes = setmetatable({ [1] = 1, [3] = 3 }, { __index = function()
      inner_text = json.encode({ q = { s = 2, r = 1 }, p = 0 })
      return nil
    end })
    local text = assert(json.encode({ x = "before", y = holes, z = "after", w = { b = 1, a = 2 } }))
    assert.equal('{"w":{"a":2,"b":1},"x":"before","y":{"1":1,"3":3},"z":"after"}', text)
    assert.equal('{"p":0,"q":{"r":1,"s":2}}', inner_text)
    assert.equal('{"a":1,"b":2}', json.encode({ b = 2, a = 1 }))
  end)
end)
