-- The local source's run queue (moonjob.pool.waiting): jobs pushed in order
-- wait in a plain queue, the others in the heap, and pop takes the better
-- first of the two. Whichever place a job waits in, the order is the heap's:
-- lower priority first, then lower id.
local Source = require "moonjob.pool.source"
local Job = require "moonjob.job"

local SLOT = Job.SLOT

-- A job as the source sees it: id, qindex and priority in their slots.
local function job(id, priority, run_at)
  local j = { run_at = run_at }
  j[SLOT.id], j[SLOT.qindex], j[SLOT.priority] = id, false, priority or false
  return j
end

local function ids(list)
  local out = {}
  for i, j in ipairs(list) do out[i] = j[SLOT.id] end
  return out
end

-- Pops every ready job; their ids in that order.
local function drain(source)
  local out = {}
  while true do
    local j = source:pop_ready()
    if not j then return out end
    out[#out + 1] = j[SLOT.id]
  end
end

local function new_source()
  local clock = { now = 0 }
  return Source.new_local(function() return clock.now end), clock
end

describe("the local source's run queue", function()
  it("keeps first in first out, and a better priority arriving later goes first", function()
    local source = new_source()
    for id = 1, 5 do source:push(job(id)) end
    source:push(job(6, -1)) -- better: before all of them
    source:push(job(7, 5))  -- worse: after all of them
    source:push(job(8))     -- default again: after 1..5, before 7
    source:push(job(9, -1)) -- better again: after 6
    assert.equal(9, source:count())
    assert.equal(6, source:peek_ready()[SLOT.id])
    assert.same({ 6, 9, 1, 2, 3, 4, 5, 8, 7 }, drain(source))
    assert.equal(0, source:count())
  end)

  it("puts a job given back (its old id) ahead of those added after it", function()
    local source = new_source()
    local jobs = {}
    for id = 1, 6 do jobs[id] = job(id); source:push(jobs[id]) end
    local a, b = source:pop_ready(), source:pop_ready()
    assert.same({ 1, 2 }, ids({ a, b }))
    source:push(b) -- given back: no child took it
    source:push(job(7))
    source:push(a)
    assert.same({ 1, 2, 3, 4, 5, 6, 7 }, drain(source))
  end)

  it("orders delayed jobs that become due among the jobs in the queue by id", function()
    local source, clock = new_source()
    source:push(job(1, nil, 10)) -- delayed, before the others by id
    for id = 2, 4 do source:push(job(id)) end
    source:push(job(5, nil, 10)) -- delayed, after them by id
    source:push(job(6, 1, 10))   -- delayed, worse priority
    assert.equal(3, source:ready_count())
    assert.equal(2, source:pop_ready()[SLOT.id])
    clock.now = 10
    assert.equal(5, source:ready_count())
    source:push(job(7))
    source:push(job(8, -1))
    assert.same({ 8, 1, 3, 4, 5, 7, 6 }, drain(source))
  end)

  it("removes a job from the queue's start, middle and end, the others in order", function()
    local source = new_source()
    local jobs = {}
    for id = 1, 6 do jobs[id] = job(id); source:push(jobs[id]) end
    assert.is_true(source:remove(jobs[3]))
    assert.is_true(source:remove(jobs[6])) -- the last: a job pushed now goes after 5
    assert.is_true(source:remove(jobs[5])) -- then the new last, with a hole before it
    assert.is_true(source:remove(jobs[1]))
    assert.is_false(source:remove(jobs[1]))
    assert.is_false(jobs[3][SLOT.qindex])
    assert.equal(2, source:count())
    source:push(job(7))
    source:push(job(8, -1))
    assert.same({ 8, 2, 4, 7 }, drain(source))
    for _, j in ipairs(jobs) do assert.is_false(source:remove(j)) end
  end)

  it("keeps its order and places while it is refilled and emptied for long", function()
    local source = new_source()
    local next_id, expected, waiting = 0, {}, {}
    local function add(priority)
      next_id = next_id + 1
      local j = job(next_id, priority)
      waiting[next_id] = j
      source:push(j)
    end
    -- mostly in order, with holes (removals) and jobs given back, so that the
    -- queue moves its jobs down to its start many times
    local got = {}
    for round = 1, 200 do
      for _ = 1, 7 do add() end
      if round % 3 == 0 then add(-1) end
      local victim = waiting[next_id - 3]
      if victim and round % 2 == 0 then
        assert.is_true(source:remove(victim))
        waiting[victim[SLOT.id]] = nil
      end
      for _ = 1, 5 do
        local j = source:pop_ready()
        got[#got + 1] = j
        waiting[j[SLOT.id]] = nil
      end
      if round % 5 == 0 then -- the last one popped is given back
        local back = table.remove(got)
        waiting[back[SLOT.id]] = back
        source:push(back)
      end
    end
    -- what is left comes out in (priority, id) order, and each removal by
    -- place still finds its job
    for id, j in pairs(waiting) do expected[#expected + 1] = { id, j[SLOT.priority] or 0 } end
    table.sort(expected, function(x, y)
      if x[2] ~= y[2] then return x[2] < y[2] end
      return x[1] < y[1]
    end)
    local left = drain(source)
    assert.equal(#expected, #left)
    for i, e in ipairs(expected) do assert.equal(e[1], left[i]) end
    assert.equal(0, source:count())
  end)

  it("finds its jobs by place after moving them down to its start", function()
    local source = new_source()
    local jobs = {}
    for id = 1, 300 do jobs[id] = job(id); source:push(jobs[id]) end
    for id = 1, 250 do assert.equal(id, source:pop_ready()[SLOT.id]) end
    source:push(job(301)) -- 250 places free at the start, 50 jobs: they move down
    assert.is_true(source:remove(jobs[260]))
    assert.is_true(source:remove(jobs[300]))
    assert.is_true(source:remove(jobs[251]))
    local left = drain(source)
    assert.equal(48, #left)
    assert.same({ 252, 253 }, { left[1], left[2] })
    assert.equal(301, left[#left])
  end)

  it("empties, due or not, with pop_any", function()
    local source = new_source()
    source:push(job(1, nil, 10))
    source:push(job(2))
    source:push(job(3, -1))
    local out = {}
    for _ = 1, 3 do out[#out + 1] = source:pop_any()[SLOT.id] end
    assert.same({ 3, 2, 1 }, out)
    assert.is_nil(source:pop_any())
    assert.equal(0, source:count())
  end)
end)
