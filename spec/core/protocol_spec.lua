-- The channel is checked, not trusted: a processor that writes to fd 3 fails
-- its own job with EPROTO, and cannot stall, forge or mis-attribute anything.
local core = require "moonjob.core"
local h = require "helpers"

local PROTOCOL = "^the child broke the channel protocol %(.+%); a processor must not write to the channel, fd 3$"

describe("a processor writing to the channel", function()
  after_each(h.cleanup)

  for _, case in ipairs({
    { "a truncated header", "truncated", "a frame header with unknown flags" },
    { "a READY frame mid-job", "ready", "a start-up frame after start-up" },
    { "a LOADERR frame mid-job", "loaderr", "a start-up frame after start-up" },
    { "a frame of unknown type", "unknown", "a frame of unknown type" },
    { "a header declaring a huge length", "huge", "a job frame with a wrong job token" },
    { "DONE frames for other jobs", "forge", "a job frame with a wrong job token" },
  }) do
    it("fails its job with EPROTO on " .. case[1] .. ", and the pool goes on", function()
      local pool = h.pool("channel_writer.lua", { size = 1 })
      local _, err = pool:run({ kind = case[2], v = 1 })
      assert.equal("EPROTO", err.code)
      assert.matches(PROTOCOL, err.message)
      assert.truthy(err.message:find(case[3], 1, true), err.message)
      assert.equal(42, pool:run({ v = 21 }))
      assert.equal(2, pool:stats().spawned)
    end)
  end

  it("ends a job that sent READY and then blocks, without a timeout, and close() returns", function()
    local pool = h.pool("channel_writer.lua", { size = 1 })
    local _, err = pool:run({ kind = "ready", block = true, v = 1 })
    assert.equal("EPROTO", err.code)
    local t0 = core.hrtime()
    pool:close()
    assert.is_true((core.hrtime() - t0) / 1e9 < 5)
  end)

  it("sending LOADERR mid-job fails no other job", function()
    local pool = h.pool("channel_writer.lua", { size = 1 })
    local bad = pool:add({ kind = "loaderr", v = 1 })
    local others = {}
    for i = 1, 5 do others[i] = pool:add({ v = i }) end
    local _, err = bad:wait()
    assert.equal("EPROTO", err.code)
    for i = 1, 5 do assert.equal(i * 2, (others[i]:wait())) end
  end)

  it("cannot complete any job with a forged result", function()
    local pool = h.pool("channel_writer.lua", { size = 2 })
    local jobs = {}
    for i = 1, 300 do jobs[i] = pool:add({ kind = i % 7 == 0 and "forge" or nil, v = i }) end
    pool:drain()
    local forged = 0
    for i = 1, 300 do
      local result, err = jobs[i]:wait()
      if err then
        assert.equal("EPROTO", err.code)
        assert.equal(0, i % 7)
      else
        assert.equal(i * 2, result)
      end
      if i % 7 == 0 then forged = forged + 1 end
    end
    assert.equal(42, forged)
  end)

  it("sending a progress value that does not decode reads as nil; the job and listeners go on", function()
    local pool = h.pool("garbage_progress.lua", { size = 1 })
    local seen = {}
    pool:on("progress", function(job, value) seen[#seen + 1] = value == nil end)
    local job = pool:add(1)
    assert.equal("finished", (job:wait()))
    assert.is_nil(job.progress)
    assert.same({ true }, seen)
    assert.equal(0, pool:stats().failed)
  end)

  it("keeps progress values that decode as sent, false included", function()
    local pool = h.pool("progress_value.lua", { size = 1 })
    for _, value in ipairs({ false, 0, "", { 1, 2 } }) do
      local seen
      pool:on("progress", function(_, v) seen = v end)
      local job = pool:add(value)
      job:wait()
      assert.same(value, job.progress)
      assert.same(value, seen)
    end
  end)

  it("cannot require the runner's channel module", function()
    local pool = h.pool("channel_probe.lua", { size = 1 })
    local result = pool:run(1)
    assert.is_false(result.ok)
    assert.matches("module 'moonjob.channel' not found", result.err)
  end)
end)

describe("a frame fuzzer", function()
  after_each(h.cleanup)

  it("never crashes the parent nor mis-attributes a result over 3,000 jobs", function()
    local kinds = { "truncated", "ready", "loaderr", "unknown", "huge", "forge", "garbage" }
    local pool = h.pool("channel_writer.lua", { size = 2 })
    local ends, n = {}, 3000
    local function ended(job) ends[job.id] = (ends[job.id] or 0) + 1 end
    pool:on("completed", ended)
    pool:on("failed", ended)
    local jobs, expect_fail = {}, {}
    local seed = 12345
    for i = 1, n do
      seed = (seed * 1103515245 + 12345) % 2147483648
      local kind = nil
      if seed % 10 == 0 then kind = kinds[seed % 7 + 1] end
      expect_fail[i] = kind ~= nil
      jobs[i] = pool:add({ kind = kind, v = i, seed = seed, len = seed % 200 + 1 })
    end
    local t0 = core.hrtime()
    pool:drain()
    assert.is_true((core.hrtime() - t0) / 1e9 < 120)
    local failed = 0
    for i = 1, n do
      local job = jobs[i]
      assert.equal(1, ends[job.id])
      local result, err = job:wait()
      if err then
        failed = failed + 1
        assert.is_true(expect_fail[i], tostring(err))
        assert.equal("EPROTO", err.code)
      else
        assert.equal(i * 2, result)
      end
    end
    assert.is_true(failed > 100, failed .. " failures")
    assert.equal(7, pool:run({ v = 3.5 })) -- healthy at the end
  end)
end)
