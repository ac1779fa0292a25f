-- spec/support/held_groups.lua -- groups of a Redis queue held back for
-- real, for the specs of what `moonjob status` and the dashboard show:
-- jobs fetched by direct FCALLs (as a worker's fetch does, without one),
-- a group parked at its cap, one held by a job's ERATELIMIT, groups whose
-- rate window is full.
--
--   local held_groups = require "held_groups"
--   held_groups.cap_and_hold(q, 600000)   -- A at its cap, B held 600 s, C ready
local assert = require "luassert" -- (busted's assert, for a module outside the spec files)
local M = {}

-- One fetch of up to n jobs by worker "spec" (leases of lease_ms, 30 s by
-- default; free: its idle children, none said by default); -> their ids,
-- the reply (its rows: { id, token, ... } from element 2 on).
function M.fetch(q, n, lease_ms, free)
  local reply = assert(q.client:call_wait({ "FCALL", "moonjob_fetch", 1, q.prefix, "spec", n, lease_ms or 30000,
    "", 86400000, 0, "", free or "" }))
  local ids = {}
  for i = 2, #reply do ids[#ids + 1] = reply[i][1] end
  return ids, reply
end

-- With each group's concurrency at 1: group A at its cap (a1 fetched, a2
-- waiting), group B held back hold_ms by b1's ERATELIMIT (b1 and b2
-- waiting), group C ready (c1 waiting). A and B are parked by a fetch that
-- finds them so, as a worker's would.
function M.cap_and_hold(q, hold_ms)
  assert(q:set_group_concurrency(1))
  for _, g in ipairs({ "a", "b" }) do
    for i = 1, 2 do assert(q:add({ n = i }, { id = g .. i, group = g:upper() })) end
  end
  local ids = M.fetch(q, 1)
  assert(ids[1] == "a1", "the first fetch took " .. tostring(ids[1]))
  local reply
  ids, reply = M.fetch(q, 1)
  assert(ids[1] == "b1", "the second fetch took " .. tostring(ids[1]))
  assert(q.client:call_wait({ "FCALL", "moonjob_ratelimited", 1, q.prefix, "b1", reply[2][2], hold_ms }) == "OK")
  ids = M.fetch(q, 1)
  assert(#ids == 0, "a fetch took " .. tostring(ids[1]) .. " of a group held back")
  assert(q:add({ n = 1 }, { id = "c1", group = "C" }))
end

-- Asserts what status --json and the dashboard's API say of cap_and_hold's
-- queue after set_group_rate({ max = 5, per = 2 }): limits and groups (A
-- first: a group at its cap is looked at again when its job's lease ends,
-- before B's hold of about 600 s ends).
function M.assert_cap_and_hold(limits, groups)
  assert.same({ max = 5, per = 2 }, limits.group_rate)
  assert.equal(1, limits.group_concurrency)
  assert.equal(1, groups.ready)
  assert.equal(2, groups.held_back)
  assert.equal(2, #groups.held)
  local a, b = groups.held[1], groups.held[2]
  assert.same({ group = "A", state = "at_cap", waiting = 1, active = 1, seconds = 0 }, a)
  assert.same({ "B", "held", 2, 0 }, { b.group, b.state, b.waiting, b.active })
  assert.is_true(b.seconds > 500 and b.seconds <= 600, "B's hold: " .. tostring(b.seconds))
end

-- With each group's rate at 1 per `per` seconds: n groups g1..gn of 2
-- waiting jobs each, one of each fetched, then all parked by a fetch that
-- finds their windows full.
function M.rate_full(q, n, per)
  assert(q:set_group_rate({ max = 1, per = per }))
  for g = 1, n do
    for i = 1, 2 do assert(q:add({ n = i }, { id = ("g%d-%d"):format(g, i), group = "g" .. g })) end
  end
  local ids = M.fetch(q, n)
  assert(#ids == n, ("the first fetch took %d jobs, not one of each of %d groups"):format(#ids, n))
  ids = M.fetch(q, 1)
  assert(#ids == 0, "a fetch took " .. tostring(ids[1]) .. " of a group whose window is full")
end

return M
