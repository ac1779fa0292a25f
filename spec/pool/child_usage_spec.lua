-- Each job's CPU time and peak RSS, as the child measures them
-- (core/child/channel.c, child_cpu_ms): the main thread's CPU on every job,
-- the other threads' counted too once seen to work.
local h = require "helpers"

local function cpu_of(pool, data)
  local job = pool:add(data)
  assert(job:wait())
  return job.cpu_ms, job.max_rss_kb
end

describe("job usage", function()
  after_each(h.cleanup)

  it("counts the CPU of threads a job starts through the FFI, after a few jobs at most", function()
    local pool = h.pool("thread_cpu.lua", { size = 1 })
    -- each job: 16 x 32 MB scanned in threads while the main thread waits
    local work = { how = "threads", bytes = 32 * 1024 * 1024, threads = 16 }
    local solo = {}
    for i = 1, 40 do solo[i] = cpu_of(pool, work) end
    -- the main thread alone spends next to nothing (it waits in pthread_join):
    -- the last jobs must show the threads' CPU
    local least, most = math.huge, 0
    for i = 35, 40 do
      assert.is_true(solo[i] >= 3, ("job %d: cpu_ms %s"):format(i, tostring(solo[i])))
      least = math.min(least, solo[i])
    end
    -- and no job is given what the threads spent before they were seen
    for i = 1, 40 do most = math.max(most, solo[i]) end
    assert.is_true(most < 5 * least + 20, ("a job reported %s ms, the last ones %s"):format(most, least))
  end)

  it("counts a spinning job's CPU after the child waited idle, and reports peak RSS", function()
    local pool = h.pool("thread_cpu.lua", { size = 1 })
    for _ = 1, 20 do cpu_of(pool, true) end
    h.sleep(0.3) -- the child waits idle for the next job
    local cpu, rss = cpu_of(pool, { how = "spin", ms = 150 })
    assert.is_true(cpu >= 100, "cpu_ms " .. tostring(cpu))
    assert.is_true(rss > 1000, "max_rss_kb " .. tostring(rss))
    -- and a no-op job after it does not carry its CPU or the idle time
    local noop_cpu = cpu_of(pool, true)
    assert.is_true(noop_cpu >= 0 and noop_cpu < 50, "cpu_ms " .. tostring(noop_cpu))
  end)
end)
