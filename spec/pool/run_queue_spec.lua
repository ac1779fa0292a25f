-- The order jobs start in when they wait in the local source's run queue
-- (moonjob.pool.waiting): jobs added one after the other at one priority
-- wait in a plain queue, the others in the heap, and the pool still starts
-- them lower priority first, then in order of arrival, delayed ones by their
-- id once due. One child holding one job at a time (pipeline = 1), so the
-- order is the source's; the processor (fixtures/ranked.lua) writes each
-- job's name to a file as it starts.
local h = require "helpers"

local names_in = h.lines -- (the processor writes one name a line)

describe("the run queue's order in a pool", function()
  local file
  before_each(function() file = os.tmpname() end)
  after_each(function()
    os.remove(file)
    h.cleanup()
  end)

  it("starts a better priority added after jobs in order first, a worse one last", function()
    local pool = h.pool("ranked.lua", { size = 1, pipeline = 1 })
    -- added before the child is ready: they all wait in the source
    for _, name in ipairs({ "a", "b", "c" }) do pool:add({ file = file }, { name = name }) end
    pool:add({ file = file }, { name = "better", priority = -1 })
    pool:add({ file = file }, { name = "worse", priority = 5 })
    pool:add({ file = file }, { name = "d" })
    pool:add({ file = file }, { name = "better-2", priority = -1 })
    pool:drain()
    assert.same({ "better", "better-2", "a", "b", "c", "d", "worse" }, names_in(file))
  end)

  it("starts a delayed job once due before the jobs added after it", function()
    local pool = h.pool("ranked.lua", { size = 1, pipeline = 1 })
    local long = pool:add({ file = file, seconds = 0.3 }, { name = "long" })
    h.wait_for(function() return long.state == "active" end)
    pool:add({ file = file }, { name = "delayed", delay = 0.05 })
    for _, name in ipairs({ "a", "b", "c" }) do pool:add({ file = file }, { name = name }) end
    pool:drain()
    assert.same({ "long", "delayed", "a", "b", "c" }, names_in(file))
  end)
end)
