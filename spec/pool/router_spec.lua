-- Named processors: moonjob.pool({ name = file, ... }), a pool per name.
local h = require "helpers"

describe("named processors", function()
  local router
  after_each(function()
    if router then router:close() end
    router = nil
  end)

  it("route by name to pools of their own, sharing the loop", function()
    router = assert(require("moonjob").pool({ square = "examples/square.lua",
      pid = h.fixture("pid.lua") }, { size = 1, echo = false, pools = { pid = { size = 2 } } }))
    assert.equal(49, router:run({ x = 7 }, { name = "square" }))
    assert.is_number(router:run(1, { name = "pid" }))
    local s = router:stats()
    assert.equal(1, s.square.size)
    assert.equal(2, s.pid.size)
    assert.matches("^<moonjob.router pid, square>$", tostring(router))
  end)

  it("fail an unknown name with ENOPROCESSOR", function()
    router = assert(require("moonjob").pool({ square = "examples/square.lua" }, { size = 1 }))
    local job, err = router:add({ x = 1 }, { name = "cube" })
    assert.is_nil(job)
    assert.equal("ENOPROCESSOR: no processor named 'cube'; known: square", tostring(err))
  end)

  it("keep short jobs flowing while another pool is busy with long ones", function()
    router = assert(require("moonjob").pool({ slow = h.fixture("deaf.lua"),
      fast = h.fixture("identity.lua") }, { size = 1, echo = false }))
    local slow = router:add({ seconds = 1.5 }, { name = "slow" })
    h.wait_for(function() return slow.state == "active" end)
    for i = 1, 20 do assert.equal(i, router:run(i, { name = "fast" })) end
    assert.equal("active", slow.state) -- the fast jobs did not wait for it
    slow:wait()
  end)

  it("return nil and the error when one file is missing", function()
    local r, err = require("moonjob").pool({ ok = "examples/square.lua", bad = "nowhere.lua" })
    assert.is_nil(r)
    assert.equal("ELOAD", err.code)
    assert.matches("^bad: cannot open processor file 'nowhere.lua'", err.message)
  end)
end)
