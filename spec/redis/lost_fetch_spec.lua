-- Durable queues on Redis: a fetch whose answer is lost with the link (it ran
-- in Redis, the worker never saw its jobs). The worker gives those jobs back
-- when the link returns, not when their lease ends; a second drop in the
-- middle of that recovery only delays it until the link is back again.
local helpers = require "helpers"
local faults = require "redis_faults"
local redis_queue = require "redis_queue"
local rf = require "redis_workers"

local LEASE = 60 -- the lost jobs' lease: far longer than the wait below

local recovered = rf.recovered

describe("a fetch whose answer was lost", function()
  after_each(rf.close_all)

  -- where the second drop falls: on the recovery's ZRANGE of the active set,
  -- or between its answer and the HMGETs (of a job's worker and token)
  for _, cut in ipairs({ { "ZRANGE", "ZRANGE.*active.*-2000" }, { "HMGET", "HMGET.*worker.*token" } }) do
    it("a drop on the recovery's " .. cut[1] .. ": the recovery runs again, the jobs run at once", function()
      local server = rf.server()
      -- the first fetch answer carrying our jobs is lost (Redis ran the
      -- fetch); then, on the next link, the recovery's look is cut before
      -- it reaches Redis
      local proxy = faults.proxy(server, { { "answer", "lost-fetch-mark" }, { "ask", cut[2] } })
      redis_queue.close_after({ close = function() proxy:stop() end })
      local log = os.tmpname()
      local pid, stderr = rf.worker({ url = proxy.url }, "lostfetch", "-j 2 --lease " .. LEASE)
      helpers.wait_for(function() return rf.read(stderr):find("connected to", 1, true) end, 20)
      local q = rf.producer(server, "lostfetch")
      local jobs = {}
      for i = 1, 4 do jobs[i] = assert(q:add({ log = log, echo = i, tag = "lost-fetch-mark" })) end
      -- every job runs, once, well before the lost ones' lease could end
      for i, job in ipairs(jobs) do assert.equal(i, assert(job:wait(15)).echo) end
      assert.same({ "answer", "ask" }, proxy:fired()) -- both drops happened
      local seen = {}
      for _, line in ipairs(rf.lines(log)) do
        local id = line:match("^(%S+)")
        assert.is_nil(seen[id], "job " .. id .. " ran twice")
        seen[id] = true
      end
      assert.equal(0, recovered(server, "lostfetch"))
      rf.stop_worker(pid, "TERM")
      assert.equal(4, q:counts().completed)
    end)
  end
end)
