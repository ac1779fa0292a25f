-- What `moonjob status` says of a queue's groups, on a real Redis: the
-- groups' limits on the limits line, the groups line (how many have waiting
-- jobs, which are held back and why: an ERATELIMIT hold, a full cap, a
-- full rate window), the same in --json, and --watch's mention of groups
-- held back. The groups are held back for real (held_groups.lua).
local helpers = require "helpers"
local json = require "moonjob.codec.json"
local rq = require "redis_queue"
local held_groups = require "held_groups"

-- `moonjob status` on the queue; -> stdout, stderr, exit code.
local function status(name, args, after)
  return helpers.sh(("timeout 60 %s scripts/moonjob status --queue %s --redis %s %s %s"):format(helpers.LUAJIT,
    name, rq.server().url, args or "", after or ""))
end

-- The lines of a text, without their ends.
local function lines_of(text)
  local out = {}
  for line in text:gmatch("[^\n]+") do out[#out + 1] = line end
  return out
end

rq.describe(function()
  describe("moonjob status on a queue with groups", function()
    it("names the group limits and the groups held back, at their cap or by ERATELIMIT", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      held_groups.cap_and_hold(q, 600000)
      local out, err, code = status(name)
      assert.equal(0, code, err)
      local lines = lines_of(out)
      assert.equal(3, #lines, out)
      assert.equal("waiting 4, delayed 0, running 0, held 1, completed 0, failed 0", lines[1])
      assert.equal("limits: each group: 1 at once", lines[2])
      -- (held back ones by when they are looked at again: A at its running
      -- job's lease end, 30 s; B's hold: 600.0 s, or a little less on a slow machine)
      assert.matches("^groups: 3 with waiting jobs, 2 held back: A at its cap, B held %d%d%d%.%d s %(ERATELIMIT%)$",
        lines[3])
      -- with the queue's own limits and a group rate: all on one line
      assert(q:set_concurrency(3))
      assert(q:set_group_rate({ max = 5, per = 2 }))
      out = status(name)
      assert.equal("limits: 3 at once; each group: 5 jobs per 2 s, 1 at once", lines_of(out)[2])
      out, err, code = status(name, "--json")
      assert.equal(0, code, err)
      local t = json.decode(out)
      assert.equal(3, t.limits.concurrency)
      held_groups.assert_cap_and_hold(t.limits, t.groups)
    end)

    it("names five groups whose rate window is full and counts the rest; --json lists them all", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      held_groups.rate_full(q, 7, 600)
      local out, err, code = status(name)
      assert.equal(0, code, err)
      local lines = lines_of(out)
      assert.equal("limits: each group: 1 job per 600 s", lines[2])
      local named = {}
      for g = 1, 5 do named[g] = ("g%d rate window full %%d%%d%%d%%.%%d s"):format(g) end
      assert.matches("^groups: 7 with waiting jobs, 7 held back: " .. table.concat(named, ", ") .. " and 2 more$",
        lines[3])
      local t = json.decode((status(name, "--json")))
      assert.same({ max = 1, per = 600 }, t.limits.group_rate)
      assert.equal(0, t.groups.ready)
      assert.equal(7, t.groups.held_back)
      assert.equal(7, #t.groups.held)
      for g, row in ipairs(t.groups.held) do
        assert.equal("g" .. g, row.group)
        assert.equal("rate", row.state)
        assert.equal(1, row.waiting)
        assert.equal(1, row.active)
      end
    end)

    it("says nothing of groups while none has waiting jobs, and 'none held back' when none is", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      assert(q:add({ n = 1 }))
      local out, err, code = status(name)
      assert.equal(0, code, err)
      assert.equal("waiting 1, delayed 0, running 0, held 0, completed 0, failed 0\n", out)
      local t = json.decode((status(name, "--json")))
      assert.same({ ready = 0, held_back = 0, held = {} }, t.groups)
      assert.matches('"held":%[%]', (status(name, "--json"))) -- an array, also when empty
      assert(q:add({ n = 2 }, { group = "A" }))
      assert(q:add({ n = 3 }, { group = "B" }))
      out = status(name)
      assert.equal("groups: 2 with waiting jobs, none held back", lines_of(out)[2])
    end)

    it("--watch ends its line with the number of groups held back", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      held_groups.cap_and_hold(q, 600000)
      -- the first line, then the command ends (its next write meets a closed pipe; timeout: a bound)
      local out = status(name, "--watch", "2>/dev/null | head -n 1")
      assert.equal("waiting 4, delayed 0, running 0, held 1, completed 0, failed 0; 2 groups held back\n", out)
    end)
  end)
end)
