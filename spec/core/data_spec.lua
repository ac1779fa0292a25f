local h = require "helpers"

describe("data across the channel", function()
  after_each(h.cleanup)

  it("keeps every number exact: integers up to 2^53 and any double", function()
    local pool = h.pool("echo.lua", { size = 1 })
    local numbers = { 2^53, -2^53, 2^53 - 1, 123456789012345, 0.1 + 0.2, 1e308, 5e-324,
      -0.0, math.pi, 1 / 3, 2^63, -1.5e-300 }
    local back = pool:run(numbers).data
    for i, n in ipairs(numbers) do
      assert.equal(n, back[i])
      assert.equal(string.format("%a", n), string.format("%a", back[i]))
    end
    assert.equal(math.huge, pool:run(math.huge).data)
    local nan = pool:run(0 / 0).data
    assert.is_true(nan ~= nan)
  end)

  it("keeps strings with NULs, nested tables, empty tables and booleans", function()
    local pool = h.pool("echo.lua", { size = 1 })
    local value = { s = "a\0b\255", nested = { deep = { { 1 }, {} } }, empty = {}, t = true, f = false,
      [1] = "one", [3] = "three" }
    assert.same(value, pool:run(value).data)
  end)

  it("carries a payload of several megabytes both ways", function()
    local pool = h.pool("echo.lua", { size = 1 })
    local big = string.rep("0123456789", 800000)
    assert.equal(big, pool:run(big).data)
  end)

  describe("in frames larger than the core's piece size", function()
    local unit = "abcdefghijklmnopqrstuvwxyz0123456789-" -- 37 bytes: pieces never repeat
    local n = 100000                                     -- 3.7 MB

    it("delivers a result whole to a completed listener and to wait()", function()
      local pool = h.pool("big_parts.lua", { size = 1 })
      local seen
      pool:on("completed", function(_, result) seen = result end)
      local result = pool:run({ how = "result", unit = unit, n = n })
      assert.equal(string.rep(unit, n), result.text)
      assert.equal(string.rep(unit, n), seen.text)
    end)

    it("delivers a progress value, a log line and an error whole", function()
      local pool = h.pool("big_parts.lua", { size = 1 })
      local progress
      pool:on("progress", function(_, value) progress = value end)
      local job = pool:add({ how = "progress", unit = unit, n = n })
      job:wait()
      assert.equal(string.rep(unit, n), progress.text)
      job = pool:add({ how = "log", unit = unit, n = n })
      job:wait()
      assert.equal(string.rep(unit, n), job.logs[1])
      local _, err = pool:run({ how = "error", unit = unit, n = n })
      assert.equal("EBIG", err.code)
      assert.equal(string.rep(unit, n), err.text)
    end)

    it("keeps results of jobs back to back apart", function()
      local pool = h.pool("big_parts.lua", { size = 2 })
      local jobs = {}
      for i = 1, 8 do jobs[i] = pool:add({ how = "result", unit = tostring(i):rep(37), n = 10000 + i }) end
      for i = 1, 8 do
        local result = jobs[i]:wait()
        assert.equal(10000 + i, result.n)
        assert.equal(tostring(i):rep(37 * (10000 + i)), result.text)
      end
    end)
  end)
end)

describe("the child's output", function()
  after_each(h.cleanup)

  it("never corrupts the channel, and is kept on the job", function()
    local pool = h.pool("noisy.lua", { size = 1 })
    local job = pool:add({ n = 1 })
    assert.equal(1, job:wait())
    table.sort(job.logs)
    assert.same({ "err 1", "log 1", "out 1", "partial 1" }, job.logs)
  end)

  it("is attributed to the job that printed it, even with many jobs back to back", function()
    local pool = h.pool("noisy.lua", { size = 2 })
    local jobs = {}
    for i = 1, 200 do jobs[i] = pool:add({ n = i }) end
    pool:drain()
    for i = 1, 200 do
      local logs = jobs[i].logs
      table.sort(logs)
      assert.same({ "err " .. i, "log " .. i, "out " .. i, "partial " .. i }, logs)
    end
  end)

  it("goes to the parent's stderr prefixed with the job id by default", function()
    local out, err, status = h.sh(h.LUAJIT .. [[ -e '
      local pool = require("moonjob").pool("spec/fixtures/noisy.lua", { size = 1 })
      local job = pool:add({ n = 5 })
      io.stdout:write("id=", job.id, "\n")
      job:wait()
      pool:close()']])
    assert.equal(0, status)
    local id = out:match("id=(%d+)")
    assert.truthy(err:find("[job " .. id .. "] out 5\n", 1, true))
    assert.truthy(err:find("[job " .. id .. "] err 5\n", 1, true))
    assert.truthy(err:find("[job " .. id .. "] log 5\n", 1, true))
  end)
end)

describe("moonjob.codec.json's UTF-8 check", function()
  it("agrees in the child program's C function and in Lua, on 200,000 strings near UTF-8's edges", function()
    local pool = h.pool("utf8_agree.lua", { size = 1 })
    local r = assert(pool:run({ seed = 42, count = 200000 }))
    assert.is_nil(r.disagree, "disagree on bytes " .. table.concat(r.disagree or {}, " "))
    assert.is_true(r.in_c) -- the child uses its C function
    assert.equal(200000, r.checked)
    assert.is_true(r.valid > 10000 and r.valid < 190000, "valid: " .. tostring(r.valid)) -- both kinds were met
  end)
end)
