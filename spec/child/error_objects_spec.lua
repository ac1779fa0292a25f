-- Whatever a processor raises fails its job with EPROCESSOR and the best
-- message that can be had: error objects whose metamethods raise (the
-- strict-class pattern, a raising __tostring), values that are no table, a
-- cycle, and errors too large to cross whole. The child survives each one
-- (same pid after): reading the error never crashes the runner.
local h = require "helpers"

describe("an error object a processor raises", function()
  after_each(h.cleanup)

  -- The error of one job raising `how` (and `size`), on a pool of one child
  -- that must still be the same child afterwards.
  local function raised(how, opts, size)
    opts = opts or {}
    opts.size = 1
    local pool = h.pool("raises_objects.lua", opts)
    local pid = assert(pool:run({ how = "pid" }))
    local result, err = pool:run({ how = how, size = size })
    assert.is_nil(result)
    assert.equal(pid, pool:run({ how = "pid" }), "the child crashed on the error of '" .. how .. "'")
    assert.equal("EPROCESSOR", err.code, tostring(err.message))
    assert.is_string(err.message)
    assert.not_matches("moonjob/child/", err.message)
    assert.is_string(err.traceback)
    return err
  end

  it("whose __index raises (a strict class) reads as its own fields", function()
    local err = raised("strict")
    assert.equal('a table was raised: { reason = "x" }', err.message)
    assert.equal("x", err.reason)
  end)

  it("whose __index raises keeps its own message and fields", function()
    local err = raised("strict_message")
    assert.equal("unknown sku", err.message)
    assert.equal("A-1", err.sku)
    assert.matches("stack traceback:", err.traceback)
    assert.matches("raises_objects.lua", err.traceback)
  end)

  it("of a class gets its message and code from the class, through __index", function()
    local _, err = h.pool("raises_objects.lua", { size = 1 }):run({ how = "class" })
    assert.equal("ECLASS", err.code)
    assert.equal("the class's message", err.message)
    assert.equal("A-2", err.sku)
  end)

  it("whose __tostring raises or gives no text is described by its fields", function()
    assert.equal('a table was raised: { reason = "y" }', raised("raising_tostring").message)
    assert.equal("a table was raised: {}", raised("tostring_not_text").message)
  end)

  it("whose metatable is locked (__metatable) and __index raises", function()
    assert.equal("a table was raised: {}", raised("locked").message)
  end)

  it("whose message is an object whose __tostring raises", function()
    assert.equal("a table was raised: {}", raised("raising_message").message)
  end)

  it("that is a cdata whose __index and __tostring raise", function()
    assert.equal("a cdata was raised (its __tostring failed)", raised("cdata").message)
  end)

  it("that is a userdata, a function or a coroutine", function()
    assert.matches("^file %(0x%x+%)$", raised("userdata").message)
    assert.matches("^function: ", raised("function").message)
    assert.matches("^thread: ", raised("coroutine").message)
  end)

  it("that holds itself, as its message too", function()
    local err = raised("cyclic")
    assert.matches("^a table was raised: {.*reason = \"loop\"", err.message)
    assert.equal("[Circular]", err.self)
  end)

  it("too large to cross: a message is cut to fit max_payload, saying so", function()
    local err = raised("huge_message", { max_payload = 1024 * 1024 }, 3 * 1024 * 1024)
    assert.matches("%.%.%. %[cut: 3145728 bytes in all%]$", err.message)
    assert.is_true(#err.message < 1024 * 1024)
  end)

  it("too large to cross: its own fields are left out, the message says so", function()
    local err = raised("huge_field", { max_payload = 1024 * 1024 }, 3 * 1024 * 1024)
    assert.matches("^kept %[its other fields were left out: %d+ bytes, more than max_payload %(1048576%)%]$",
      err.message)
    assert.is_nil(err.blob)
  end)

  it("read after the processor removed globals that reading uses (debug, tostring, next, ...)", function()
    assert.equal("with the globals gone", raised("globals_removed").message)
  end)

  it("raised by init() fails the job with ELOAD and the object's message", function()
    local dir = h.tmpdir()
    local file = h.write_file(dir .. "/strict_init.lua", [[
      local strict = { __index = function(_, k) error("no field " .. k) end }
      return { init = function() error(setmetatable({ message = "no database" }, strict)) end,
        process = function() end }
    ]])
    local pool = assert(require("moonjob").pool(file, { size = 1, echo = false }))
    local _, err = pool:run({})
    pool:close()
    os.execute("rm -rf " .. dir)
    assert.equal("ELOAD", err.code)
    assert.equal("init() failed: no database", err.message)
  end)
end)
