-- spec/unit/flow_args_spec.lua -- moonjob.redis.flow and the queue names
-- that share a hash tag, on their own (no Redis): a tree checked whole into
-- moonjob_add_flow's arguments, or refused naming its bad part.
local flow = require "moonjob.redis.flow"
local names = require "moonjob.redis.names"

local NODE = 18 -- arguments per job (functions/flows.lua)

-- Node i's arguments of a built call (after FCALL, the name, K, the K keys, COUNT).
local function node(call, i)
  local k = call[3]
  local first = 4 + k + 1 + (i - 1) * NODE
  local out = {}
  for j = 0, NODE - 1 do out[j + 1] = call[first + j] end
  return out
end

describe("queue names", function()
  it("give a plain name its own tag and {TAG}NAME the tag's slot", function()
    assert.equal("mj:{images}:", names.prefix("images"))
    assert.equal("mj:{shop}/images:", names.prefix("{shop}/images"))
    assert.equal("shop", names.tag("{shop}/images"))
    assert.equal("shop", names.tag("shop"))
    assert.equal("a:b", names.tag("a:b"))
    assert.is_true(names.check_name("{shop}/images"))
    assert.is_true(names.check_name("a/b:c"))
  end)

  it("refuse braces anywhere else, an empty tag or name, and ':' after the tag", function()
    for _, bad in ipairs({ "{}x", "{shop}", "{shop}a:b", "a{b}c", "{a{b}c", "x}", "{shop}a}" }) do
      local ok, why = names.check_name(bad)
      assert.is_nil(ok, bad)
      assert.matches("{TAG}NAME", why, 1, true)
    end
  end)
end)

describe("moonjob.redis.flow.args", function()
  it("lays a tree out parents first, each queue's prefix once in KEYS", function()
    local call, nodes = assert(flow.args({ data = { n = 0 }, children = {
      { data = 1, queue = "{s}/b", on_fail = "continue", children = { { data = 2 } } },
      { data = 3, attempts = 3 } }, children_deadline = 1.5 }, "{s}/a"))
    assert.same({ "FCALL", "moonjob_add_flow", 2, "mj:{s}/a:", "mj:{s}/b:", 4 }, { unpack(call, 1, 6) })
    assert.equal(6 + 4 * NODE, #call)
    assert.same({ "root", "root.children[1]", "root.children[1].children[1]", "root.children[2]" },
      { nodes[1].path, nodes[2].path, nodes[3].path, nodes[4].path })
    local root, b, b1, c = node(call, 1), node(call, 2), node(call, 3), node(call, 4)
    assert.same({ 1, 0, "", "1500" }, { unpack(root, 1, 4) })
    assert.equal('{"n":0}', root[6])
    assert.same({ 2, 1, "continue", "" }, { unpack(b, 1, 4) })
    assert.same({ 2, 2, "", "" }, { unpack(b1, 1, 4) }) -- its parent's queue by default
    assert.same({ 1, 1, "", "" }, { unpack(c, 1, 4) })
    assert.equal(3, c[9]) -- attempts
  end)

  local function refused(tree, code, text, opts)
    local call, err = flow.args(tree, "{s}/a", opts)
    assert.is_nil(call)
    assert.equal(code, err.code)
    assert.matches(text, err.message, 1, true)
  end

  it("refuses a bad part of the tree, naming it", function()
    refused({ data = 1, children = { { data = 2, colour = "red" } } }, "EINPUT",
      "root.children[1]: unknown option 'colour'")
    refused({ data = 1, children = { { data = 2, queue = "other" } } }, "EINPUT",
      "root.children[1]: queue 'other' is outside the flow's hash tag {s}")
    refused({ data = 1, children = { { data = ("x"):rep(100) } } }, "EPAYLOAD", "root.children[1]: ", { max_payload = 50 })
    refused({ data = 1, on_fail = "ignore" }, "EINPUT", "root: the root has no parent")
    refused({ data = 1, children = { { data = 2, on_fail = "maybe" } } }, "EINPUT", "on_fail must be")
    refused({ data = 1, children_deadline = 5 }, "EINPUT", "on a job with children")
    refused({ data = 1, expire = 5, children = { { data = 2 } } }, "EINPUT", "root: expire is for a job without children")
    refused({ data = 1, children = { { data = 2, max_queue = 5 } } }, "EINPUT", "option 'max_queue' is not for flows")
    refused({ data = 1, children = { { data = 2, attempts = 0 } } }, "EINPUT", "root.children[1]: option 'attempts'")
    refused({ data = 1, children = "x" }, "EINPUT", "children must be a list")
    refused("x", "EINPUT", "root: a job of a flow must be a table")
  end)

  it("refuses a tree deeper than 32 or larger than 1,000 jobs", function()
    local deep = { data = 0 }
    local at = deep
    for i = 1, 32 do at.children = { { data = i } }; at = at.children[1] end
    refused(deep, "EINPUT", "at most 32 jobs deep")
    local wide = { data = 0, children = {} }
    for i = 1, 1000 do wide.children[i] = { data = i } end
    refused(wide, "EINPUT", "at most 1000 jobs")
    wide.children[1000] = nil
    assert.truthy(flow.args(wide, "{s}/a"))
  end)
end)
