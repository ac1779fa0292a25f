-- Closing a Lua state gives back everything moonjob took in it: a C program
-- (spec/support/host/states.c) runs a pool in many fresh states, one after the other,
-- and counts descriptors, children and the C heap between the first state and
-- the last. Before the loop context had a __gc, every state kept 5
-- descriptors and 576 bytes, and a state closed with children running could
-- crash the program (its signal handler's library unloaded).
local h = require "helpers"

local CHUNK = [[
local moonjob = require "moonjob"
local pool = assert(moonjob.pool("spec/fixtures/echo.lua", { size = 2, echo = false }))
assert(pool:run({ x = 1 }).data.x == 1)
pool:add({ x = 2 }) -- still queued or running when the state closes
]]

local function run_states(n, env)
  local out, err, status = h.sh(("%s LUA_PATH='lua/?.lua;lua/?/init.lua;;' LUA_CPATH='%s/?.so;;' %s/spec-states %d %q")
    :format(env or "", h.BUILD, h.BUILD, n, CHUNK))
  assert.equal(0, status, "stdout: " .. out .. "\nstderr: " .. err)
  local fds_first, fds_last, children, growth =
    out:match("^states %d+ fds (%d+) (%d+) children (%d+) heap_growth (%-?%d+)")
  assert.is_not_nil(fds_first, out)
  return tonumber(fds_first), tonumber(fds_last), tonumber(children), tonumber(growth)
end

describe("a Lua state closed with a pool open #slow", function()
  it("gives back every descriptor and child, in 120 states in a row", function()
    local first, last, children = run_states(120)
    assert.equal(first, last)
    assert.equal(0, children)
  end)

  it("gives back its C heap: 100 more states grow it by less than 100 bytes each", function()
    if h.SANITIZED then
      -- mallinfo2 counts nothing under ASan; its leak checker judges instead.
      run_states(20, "ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:log_path=" .. h.BUILD .. "/logs/lsan")
      return
    end
    local _, _, _, growth20 = run_states(20)
    local _, _, _, growth120 = run_states(120)
    assert.is_true(growth120 - growth20 < 100 * 100,
      ("the heap grew by %d bytes over 100 states"):format(growth120 - growth20))
  end)
end)
