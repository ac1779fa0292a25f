-- The traceback of a failed job shows the processor's frames (and those of
-- what it required), down to the function the runner called, and none of
-- the runner's own (moonjob/child/*.lua, the C function that ran the job).
local h = require "helpers"

describe("a failed job's traceback", function()
  after_each(h.cleanup)

  -- The frame lines of a traceback (after "stack traceback:").
  local function frames(traceback)
    local list = {}
    for line in traceback:match("stack traceback:\n(.*)$"):gmatch("[^\n]+") do list[#list + 1] = line end
    return list
  end

  local function assert_processor_frames(err, first)
    assert.is_string(err.traceback)
    assert.not_matches("moonjob/child/", err.traceback)
    assert.not_matches("in function 'run'", err.traceback)
    local list = frames(err.traceback)
    assert.matches(first, table.concat(list, "\n"))
    assert.matches("nested_raise.lua:14: in function 'middle'", err.traceback, 1, true)
    -- the last frame is the processor's function the runner called
    assert.matches("nested_raise%.lua:19: in function <[^>]*nested_raise%.lua:18>$", list[#list])
  end

  it("raised in a nested function ends at the processor's own function", function()
    local pool = h.pool("nested_raise.lua", { size = 1 })
    local _, err = pool:run("raise")
    assert.equal("EPROCESSOR", err.code)
    assert_processor_frames(err, "nested_raise%.lua:7: in function 'innermost'")
  end)

  it("raised in a module the processor required keeps the module's frames", function()
    local pool = h.pool("nested_raise.lua", { size = 1 })
    local _, err = pool:run("module")
    assert.equal("EPROCESSOR", err.code)
    assert_processor_frames(err, "deep_module%.lua:6: in function")
  end)

  it("of an interrupted job shows where it stood, without the runner's frames", function()
    local pool = h.pool("nested_raise.lua", { size = 1, jit = false, timeout = 0.2 })
    local _, err = pool:run("spin")
    assert.equal("ETIMEDOUT", err.code)
    assert.matches("interrupted here", err.traceback, 1, true)
    assert_processor_frames(err, "nested_raise%.lua:9: in function 'innermost'")
  end)
end)
