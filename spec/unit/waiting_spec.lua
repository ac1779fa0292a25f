-- The pool's local source (moonjob.pool.waiting through moonjob.pool.source):
-- peek_ready shows the job pop_ready would return and leaves it waiting.
local Source = require "moonjob.pool.source"

-- A job as the heaps see it: its id, qindex and priority in their slots.
local function job(id, priority, run_at)
  local Job = require "moonjob.job"
  local j = { run_at = run_at }
  j[Job.SLOT.id], j[Job.SLOT.qindex], j[Job.SLOT.priority] = id, false, priority or false
  return j
end

describe("the local source's peek_ready", function()
  it("shows the next job without taking it: lowest priority, then first in", function()
    local clock = 0
    local source = Source.new_local(function() return clock end)
    assert.is_nil(source:peek_ready())
    local a, b, c = job(1, 5), job(2, 1), job(3, 1)
    source:push(a); source:push(b); source:push(c)
    assert.equal(b, source:peek_ready())
    assert.equal(3, source:count())
    assert.equal(b, source:pop_ready())
    assert.equal(c, source:peek_ready())
    assert.equal(c, source:pop_ready())
    assert.equal(a, source:pop_ready())
    assert.is_nil(source:peek_ready())
  end)

  it("counts a delayed job once it is due", function()
    local clock = 0
    local source = Source.new_local(function() return clock end)
    local later = job(1, 0, 10)
    source:push(later)
    assert.is_nil(source:peek_ready())
    clock = 10
    assert.equal(later, source:peek_ready())
    assert.equal(1, source:ready_count())
  end)
end)
