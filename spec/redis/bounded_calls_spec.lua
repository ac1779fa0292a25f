-- No single call of the library blocks Redis for long, on a real
-- redis-server: the switch of a queue with 200,000 waiting jobs into group
-- mode copies them in steps, over the fetches that follow, and every job
-- is still fetched once, best priority first and in arrival order within
-- its group; a group limit changed over thousands of parked groups looks
-- at them in steps. The assertions count the work each call did (jobs
-- copied, groups looked at); Redis's own timings (SLOWLOG) of calls past
-- SLOW_US are printed for the record, not asserted: on a loaded machine a
-- plain HSET was seen to take 188 ms (the server descheduled), as long as
-- an unbounded call.
local helpers = require "helpers"
local redis_server = require "redis_server"
local rq = require "redis_queue"

local fetch_ids = require("held_groups").fetch

local SLOW_US = 150000 -- calls this long are printed (one copy of 200,000 members took 285-340 ms here)
local STEP = 1000      -- members a step of the switch copies, at most

-- n jobs added to queue q in one pipeline (redis-cli --pipe): job i of
-- priority i % 3, data {"n":i}, and id and group as of(i) says (default:
-- ids drawn, 1..n, no group).
local function pipe_adds(q, n, of)
  local path = os.tmpname()
  local out = assert(io.open(path, "wb"))
  local function arg(s) s = tostring(s); return "$" .. #s .. "\r\n" .. s .. "\r\n" end
  local buf = {}
  for i = 1, n do
    local id, group = "", ""
    if of then id, group = of(i) end
    local args = { "FCALL", "moonjob_add", 1, q.prefix, id, '{"n":' .. i .. "}", i % 3, 0, 1, "", 0, 0, "", 0, 0, 0,
      "", "", "", "", "", group }
    local cmd = { "*" .. #args .. "\r\n" }
    for _, a in ipairs(args) do cmd[#cmd + 1] = arg(a) end
    buf[#buf + 1] = table.concat(cmd)
    if #buf == 1000 then out:write(table.concat(buf)); buf = {} end
  end
  out:write(table.concat(buf))
  out:close()
  local said = helpers.sh(("%s -p %d --pipe < %s"):format(redis_server.CLI, rq.server().port, path))
  os.remove(path)
  assert(said:find("errors: 0, replies: " .. n, 1, true), said)
end

local function zcard(q, key) return q.client:call_wait({ "ZCARD", q.prefix .. key }) end

-- The calls that ran SLOW_US or longer since slow_calls_reset, printed.
local function slow_calls_reset(q)
  assert(q.client:call_wait({ "CONFIG", "SET", "slowlog-log-slower-than", SLOW_US }))
  assert(q.client:call_wait({ "SLOWLOG", "RESET" }))
end

local function print_slow_calls(q)
  local said = {}
  for _, e in ipairs(q.client:call_wait({ "SLOWLOG", "GET", 10 })) do
    said[#said + 1] = ("%d us: %s"):format(e[3], table.concat(e[4], " "):sub(1, 80))
  end
  assert(q.client:call_wait({ "CONFIG", "SET", "slowlog-log-slower-than", 10000 }))
  if #said > 0 then io.stderr:write("calls past " .. SLOW_US .. " us: " .. table.concat(said, "; ") .. "\n") end
end

-- The priority of a job of the spec's: ids 1..n are i % 3, "a<i>" too.
local function priority(id) return tonumber(id:match("%d+$")) % 3 end

rq.describe(function()
  describe("bounded calls", function()
    it("switches 200,000 waiting jobs into groups in steps; each job is fetched once, in order", function()
      local q = rq.new_producer(rq.new_queue())
      assert(q:counts()) -- (the library loaded)
      local N, GROUPED = 200000, 30
      pipe_adds(q, N)
      assert.equal(N, zcard(q, "wait"))
      slow_calls_reset(q)
      for i = 1, GROUPED do assert(q:add({ g = i }, { id = "a" .. i, group = "A", priority = i % 3 })) end
      local copied = zcard(q, "ungrouped")
      assert.is_true(copied <= STEP, ("the switch copied %d jobs in one call"):format(copied))
      local seen, order, fetches = {}, {}, 0
      repeat
        local ids = fetch_ids(q, 250) -- (a fetch of 250 takes ~8 ms here)
        fetches = fetches + 1
        local taken = 0 -- of no group: out of <p>ungrouped
        for _, id in ipairs(ids) do
          assert.is_nil(seen[id], id .. " fetched twice")
          seen[id] = true
          order[#order + 1] = id
          if id:sub(1, 1) ~= "a" then taken = taken + 1 end
        end
        local now_copied = zcard(q, "ungrouped")
        assert.is_true(now_copied + taken - copied <= STEP, "a fetch copied more than a step")
        copied = now_copied
      until #ids == 0 and zcard(q, "wait") == 0 or fetches > 2000
      assert.equal(N + GROUPED, #order)
      -- best priority first; within a priority and a group, in arrival order
      local last_prio, last_of = -1, {}
      for i, id in ipairs(order) do
        local prio, group = priority(id), id:sub(1, 1) == "a" and "A" or ""
        assert.is_true(prio >= last_prio, ("%s (priority %d) came %dth, after priority %d"):format(id, prio, i, last_prio))
        if prio > last_prio then last_prio, last_of = prio, {} end
        local n = tonumber(id:match("%d+$"))
        assert.is_true(n > (last_of[group] or 0), ("%s came after %s%d"):format(id, group == "A" and "a" or "", last_of[group] or 0))
        last_of[group] = n
      end
      print_slow_calls(q)
      assert.equal(0, q.client:call_wait({ "EXISTS", q.prefix .. "groups", q.prefix .. "ungrouped" }))
    end)

    it("keeps every job once and in order through adds, cancels, removes and a give-back during the switch", function()
      local q = rq.new_producer(rq.new_queue())
      local N = 2500
      pipe_adds(q, N) -- priority 0: 3, 6, ...; 1: 1, 4, ...; 2: 2, 5, ...
      assert(q:add({ g = 1 }, { id = "a1", group = "A", priority = 1 }))
      assert.is_true(q.client:call_wait({ "EXISTS", q.prefix .. "gswitch" }) == 1, "the switch is over at once")
      assert(q:add({ n = 0 }, { id = "late0" }))
      assert(q:add({ n = 2 }, { id = "late2", priority = 2 }))
      assert(q:cancel("2"))  -- not copied yet
      assert(q:remove("5"))  -- not copied yet
      assert(q:cancel("3"))  -- copied
      local ids, reply = fetch_ids(q, 1)
      assert.same({ "6" }, ids)
      assert.equal("OK", q.client:call_wait({ "FCALL", "moonjob_release", 1, q.prefix, "6", reply[2][2] }))
      local order, seen = {}, {}
      repeat
        ids = fetch_ids(q, 100)
        for _, id in ipairs(ids) do
          assert.is_nil(seen[id], id .. " fetched twice")
          seen[id] = true
          order[#order + 1] = id
        end
      until #ids == 0 and zcard(q, "wait") == 0 or #order > 3 * N
      assert.equal(N - 3 + 3, #order) -- less 2, 3 and 5; a1, late0, late2
      local prio_of = { a1 = 1, late0 = 0, late2 = 2 }
      local last_prio, last_arrival = -1, 0 -- (of the jobs of no group; a1 is A's only job)
      for i, id in ipairs(order) do
        local prio = prio_of[id] or tonumber(id) % 3
        assert.is_true(prio >= last_prio, ("%s (priority %d) came %dth, after priority %d"):format(id, prio, i, last_prio))
        if prio > last_prio then last_prio, last_arrival = prio, 0 end
        if id ~= "a1" then
          local arrival = tonumber(id) or 1e9
          assert.is_true(arrival > last_arrival, ("%s came %dth, after a job that arrived later"):format(id, i))
          last_arrival = arrival
        end
      end
      assert.equal("6", order[1]) -- given back: its place kept
      assert.equal(0, q.client:call_wait({ "EXISTS", q.prefix .. "gswitch", q.prefix .. "groups", q.prefix .. "ungrouped" }))
    end)

    it("looks at 3,000 parked groups again in steps when a group limit changes; each job is fetched once", function()
      local q = rq.new_producer(rq.new_queue())
      assert(q:set_group_concurrency(1))
      local G = 3000
      pipe_adds(q, 2 * G, function(i) return "j" .. i, "g" .. ((i - 1) % G) end) -- j<g+1> then j<g+1+G>
      local first = {} -- one per group: each at its cap, its second job parked
      repeat
        local ids = fetch_ids(q, 1000)
        for _, id in ipairs(ids) do first[#first + 1] = id end
      until #ids == 0
      assert.equal(G, #first)
      assert.equal(G, zcard(q, "gparked"))
      slow_calls_reset(q)
      assert(q:set_group_concurrency(2))
      local parked = zcard(q, "gparked")
      assert.is_true(parked >= G - 2 * STEP, ("the limit call looked at %d groups at once"):format(G - parked))
      local seen, fetches = {}, 0
      for _, id in ipairs(first) do seen[id] = true end
      repeat
        local ids = fetch_ids(q, 250)
        for _, id in ipairs(ids) do
          assert.is_nil(seen[id], id .. " fetched twice")
          seen[id] = true
        end
        fetches = fetches + 1
      until #ids == 0 and zcard(q, "wait") == 0 or fetches > 200
      for i = 1, 2 * G do assert.is_true(seen["j" .. i], "j" .. i .. " never fetched") end
      assert.equal(0, q.client:call_wait({ "EXISTS", q.prefix .. "gunpark" }))
      assert(q:obliterate({ force = true }))
      print_slow_calls(q)
    end)

    -- (a job taken out of wait takes its group out of the ring with it: the
    -- sweep meets groups whose jobs left wait by another way, here a DEL)
    it("sweeps 3,000 groups left in the ring in steps when a queue is obliterated", function()
      local q = rq.new_producer(rq.new_queue())
      assert(q:counts()) -- (the library loaded)
      local G = 3000
      pipe_adds(q, G, function(i) return "j" .. i, "g" .. i end) -- a group each, all waiting
      assert.equal(G, zcard(q, "groups"))
      assert.equal(1, q.client:call_wait({ "DEL", q.prefix .. "wait" }))
      local got = assert(q.client:call_wait({ "FCALL", "moonjob_obliterate", 1, q.prefix, 10000, 1 }))
      local rest = zcard(q, "groups") + zcard(q, "gparked")
      assert.is_true(rest >= G - 2 * STEP, ("the obliterate swept %d groups in one call"):format(G - rest))
      assert.equal(rest, got[2]) -- what is left, said
      assert(q:obliterate({ force = true })) -- the client's loop sweeps the rest
      assert.equal(0, zcard(q, "groups") + zcard(q, "gparked"))
    end)
  end)
end)
