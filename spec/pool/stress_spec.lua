local core = require "moonjob.core"
local h = require "helpers"

local function children_of_this_process()
  local pid = core.getpid()
  local f = io.open(("/proc/%d/task/%d/children"):format(pid, pid))
  local text = f and f:read("*a") or ""
  if f then f:close() end
  local list = {}
  for child in text:gmatch("%d+") do list[#list + 1] = tonumber(child) end
  return list
end

describe("stress", function()
  after_each(h.cleanup)

  it("10,000 jobs with children killed at random: each ends exactly once, nothing is left", function()
    -- a first pool makes libuv create its once-per-loop descriptors (the
    -- signal pipe), so that what is new afterwards is a leak
    local warm = h.pool("pid.lua", { size = 1 })
    warm:run(0)
    warm:close()
    local fds_before = h.open_fds()
    local pool = h.pool("pid.lua", { size = 2 })
    local ends, codes = {}, {}
    local function ended(job, err)
      ends[job.id] = (ends[job.id] or 0) + 1
      if err then codes[err.code] = (codes[err.code] or 0) + 1 end
    end
    pool:on("completed", function(job) ended(job) end)
    pool:on("failed", ended)
    math.randomseed(7)
    local kills = 0
    local killer = core.timer(function()
      for _, child in ipairs(pool.children:snapshot()) do
        if child.state == "busy" and math.random() < 0.3 then
          os.execute("kill -KILL " .. child.pid .. " 2>/dev/null")
          kills = kills + 1
        end
      end
    end)
    killer:start(3, 3)
    local jobs = {}
    for i = 1, 10000 do jobs[i] = pool:add(i) end
    pool:drain()
    killer:close()
    pool:close()
    local once = 0
    for i = 1, 10000 do
      assert.equal(1, ends[jobs[i].id], "job " .. i .. " ended " .. tostring(ends[jobs[i].id]) .. " times")
      once = once + 1
    end
    assert.equal(10000, once)
    for code in pairs(codes) do assert.equal("ECRASH", code) end
    local s = pool:stats()
    assert.equal(10000, s.completed + s.failed)
    assert.is_true(kills > 0 and s.crashed > 0)
    local left = {}
    for _, pid in ipairs(children_of_this_process()) do
      local f = io.open("/proc/" .. pid .. "/stat")
      left[#left + 1] = f and f:read("*l") or tostring(pid)
      if f then f:close() end
    end
    assert.same({}, left)
    for fd in pairs(h.open_fds()) do
      assert.is_true(fds_before[fd], "descriptor left open: " .. fd)
    end
  end)
end)
