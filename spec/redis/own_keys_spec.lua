-- A queue keeps to its own, on a real redis-server: a listener
-- (q:on("progress" | "log")) hears only its queue's jobs, not those of a
-- queue of the same name in another database of the server; obliterate
-- leaves none of the queue's keys but the one docs/REDIS.md names (its
-- token counter), whatever the queue used: groups and their limits and
-- holds, debounce, limits, schedules, metrics, logs.
local helpers = require "helpers"
local moonjob = require "moonjob"
local rq = require "redis_queue"

local fetch_ids = require("held_groups").fetch

-- Every key of queue q, sorted (SCAN over the prefix).
local function keys_of(q)
  local found, cursor = {}, "0"
  repeat
    local r = assert(q.client:call_wait({ "SCAN", cursor, "MATCH", q.prefix .. "*", "COUNT", 1000 }))
    cursor = r[1]
    for _, k in ipairs(r[2]) do found[#found + 1] = k end
  until cursor == "0"
  table.sort(found)
  return found
end

local function fcall(q, fn, ...)
  return q.client:call_wait({ "FCALL", fn, 1, q.prefix, ... })
end

-- The token a fetch gave job id (reply: fetch_ids' second value).
local function token_of(reply, id)
  for i = 2, #reply do if reply[i][1] == id then return reply[i][2] end end
end

-- What a queue's listeners hear, as "progress <id> <step>" and "log <id> <line>".
local function listen(q)
  local heard = {}
  q:on("progress", function(id, v) heard[#heard + 1] = ("progress %s %s"):format(id, tostring(v.step)) end)
  q:on("log", function(id, line) heard[#heard + 1] = ("log %s %s"):format(id, line) end)
  return heard
end

rq.describe(function()
  describe("a queue's own messages", function()
    it("a listener hears only its own database's queue, not one of the same name in another", function()
      local name = rq.new_queue()
      local url1 = rq.server().url:gsub("/0$", "/1")
      local q0 = rq.new_producer(name)
      local q1 = rq.close_after(assert(moonjob.queue(url1, name)))
      local heard0, heard1 = listen(q0), listen(q1)
      local j0 = assert(q0:add({ progress = 2, say = "db0" }, { id = "same" }))
      rq.pool(name, { size = 1 })
      assert(j0:wait(20))
      local j1 = assert(q1:add({ progress = 1, say = "db1" }, { id = "same" }))
      rq.close_after(assert(moonjob.pool(rq.PROCESSOR, { redis = url1, queue = name, echo = false, size = 1 })))
      assert(j1:wait(20))
      -- a listener's messages come in the order they were published: db 0's first
      local function has(heard, what)
        for _, h in ipairs(heard) do if h == what then return true end end
      end
      assert(rq.wait_for(function() return has(heard0, "progress same 2") and has(heard1, "progress same 1")
        and has(heard0, "log same db0 printed") and has(heard1, "log same db1 printed") end, 10),
        "the listeners did not hear their own jobs")
      table.sort(heard0)
      table.sort(heard1)
      assert.same({ "log same db0", "log same db0 printed", "progress same 2" }, heard0)
      assert.same({ "log same db1", "log same db1 printed", "progress same 1" }, heard1)
    end)
  end)

  describe("a queue's own keys", function()
    it("obliterate leaves only the token counter: groups, holds, debounce, limits, schedules, metrics", function()
      local q = rq.new_producer(rq.new_queue())
      assert(q:set_rate({ max = 100, per = 1 }))
      assert(q:set_concurrency(10))
      assert(q:set_group_rate({ max = 1, per = 3600 }))
      assert(q:set_group_concurrency(2))
      assert(q:add({ n = 1 }, { id = "a1", group = "A" }))
      assert(q:add({ n = 2 }, { id = "b1", group = "B" }))
      assert(q:add({ n = 3 }, { id = "b2", group = "B" }))
      assert(q:add({ n = 4 }, { id = "u1", cache = 3600 }))
      local d = assert(q:add({ n = 5 }, { debounce = { id = "k", seconds = 0.05 } }))
      assert(q:schedule("s", { every = 3600 }, { n = 6 }))
      local ids, reply = fetch_ids(q, 10, 30000, 10)
      local reply0 = reply
      table.sort(ids)
      assert.same({ "a1", "b1", "u1" }, ids)
      assert.equal("OK", fcall(q, "moonjob_log", "a1", token_of(reply, "a1"), 10, "a line"))
      assert.same({ "OK" }, { unpack(fcall(q, "moonjob_complete", "a1", token_of(reply, "a1"), "{\"ok\":true}")) })
      assert.equal("OK", fcall(q, "moonjob_ratelimited", "b1", token_of(reply, "b1"), 600000))
      assert(rq.wait_for(function() return rq.poll(q) and q:counts().waiting >= 3 end), "the debounced job did not wait")
      ids, reply = fetch_ids(q, 10, 30000, 10)
      assert.same({ d.id }, ids)
      assert.same({ "OK" }, { unpack(fcall(q, "moonjob_complete", d.id, reply[2][2], "1")) })
      -- what the queue holds now: the group's window and hold, the debounce key among them
      local before = table.concat(keys_of(q), " ")
      for _, k in ipairs({ "gs:A", "gl:B", "debounce:k", "starts", "limits", "s:s" }) do
        assert.matches(q.prefix .. k, before, 1, true)
      end
      -- u1's result, cached an hour, outlives its trimming (keep_count 0)
      assert.same({ "OK" }, { unpack(fcall(q, "moonjob_complete", "u1", token_of(reply0, "u1"), "7")) })
      assert(fcall(q, "moonjob_fetch", "spec", 0, 30000, 0, 86400000, 0))
      assert.equal(0, q.client:call_wait({ "ZCARD", q.prefix .. "completed" }))
      assert.equal(1, q.client:call_wait({ "EXISTS", q.prefix .. "j:u1" }))
      assert(q:obliterate({ force = true }))
      assert.same({ q.prefix .. "tokens" }, keys_of(q))
      local again = assert(q:add({ n = 8 }, { id = "u1", cache = 3600 })) -- a new job, not the cached one
      assert.is_false(again.joined)
      assert.equal("waiting", again.state)
    end)
  end)
end)
