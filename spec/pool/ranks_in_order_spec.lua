-- A child's read-ahead already in priority order stays where it is: the
-- look at read-aheads that have waited 10 ms (moonjob.pool.ranks, unstick)
-- compares one with the jobs queued in other children and the pool's next
-- job, never with its own worst job. The pool's time budget is raised
-- (white box, as in priority_spec) so that jobs are sent behind the long
-- one whatever the machine's load, and so that a read-ahead taken back
-- would be sent again at once (each time counted in ranked_back). While
-- such a read-ahead stays, the look comes back every 10 ms, not every 2.
local h = require "helpers"

-- A pool of one child that pipelines (its recent jobs short, its budget
-- raised), the child idle.
local function warm_pool()
  local pool = h.pool("ranked.lua", { size = 1 })
  pool.dispatch.budget_ms = 1000
  for _ = 1, 50 do pool:add({ file = "/dev/null" }) end
  pool:drain()
  h.wait_for(function() return pool.children:array()[1].state == "idle" end)
  return pool
end

describe("a read-ahead in priority order behind a long job", function()
  local file
  before_each(function() file = os.tmpname() end)
  after_each(function()
    os.remove(file)
    h.cleanup()
  end)

  it("is not taken back while nothing better waits elsewhere (size 1)", function()
    local pool = warm_pool()
    pool:add({ file = file, seconds = 0.2 }, { name = "long" })
    local better = pool:add({ file = file }, { name = "p1", priority = 1 })
    local worse = pool:add({ file = file }, { name = "p5", priority = 5 })
    assert.is_true(better.prefetched and worse.prefetched, "both sent behind the long job")
    pool:drain()
    assert.equal(0, pool.dispatch.ranks.ranked_back)
    local names = {}
    for line in io.lines(file) do names[#names + 1] = line end
    assert.same({ "long", "p1", "p5" }, names)
  end)
end)

describe("a long job with a read-ahead of mixed priorities behind it", function()
  local file
  before_each(function() file = os.tmpname() end)
  after_each(function()
    os.remove(file)
    h.cleanup()
  end)

  it("does not wake the parent every few milliseconds while it runs", function()
    local pool = warm_pool()
    local ranks, looks = pool.dispatch.ranks, 0
    local unstick = ranks.unstick
    ranks.unstick = function(self) looks = looks + 1 return unstick(self) end
    pool:add({ file = file, seconds = 0.5 }, { name = "long" })
    pool:add({ file = file }, { name = "p1", priority = 1 })
    pool:add({ file = file }, { name = "p5", priority = 5 })
    pool:drain()
    -- one look every 10 ms at most is about 50; every 2 ms would be about 250
    assert.is_true(looks < 120, looks .. " looks in 0.5 s")
  end)
end)
