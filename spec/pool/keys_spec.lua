-- Job ids, dedupe and the result cache: one execution per key.
local h = require "helpers"

describe("job ids, dedupe and the cache", function()
  after_each(h.cleanup)

  local function runs(file)
    local n = 0
    local f = io.open(file)
    if not f then return 0 end
    for _ in f:lines() do n = n + 1 end
    f:close()
    return n
  end

  it("add with the id of a waiting or running job returns that job: one execution, one result", function()
    local file = os.tmpname()
    local pool = h.pool("counted.lua", { size = 2 })
    local jobs = {}
    for i = 1, 10 do jobs[i] = pool:add({ file = file, value = 7, sleep = 0.1 }, { id = "k" }) end
    for i = 1, 10 do
      assert.equal(jobs[1], jobs[i])
      assert.equal(7, jobs[i]:wait())
    end
    assert.equal(1, runs(file))
    assert.equal(14, pool:run({ file = file, value = 14 }, { id = "k" })) -- ended: a new job
    assert.equal(2, runs(file))
    os.remove(file)
  end)

  it("dedupe = true joins jobs with the same data", function()
    local file = os.tmpname()
    local pool = h.pool("counted.lua", { size = 2, dedupe = true })
    local a = pool:add({ file = file, value = 1, sleep = 0.1 })
    local b = pool:add({ file = file, value = 1, sleep = 0.1 })
    local c = pool:add({ file = file, value = 2, sleep = 0.1 })
    assert.equal(a, b)
    assert.is_not.equal(a, c)
    pool:drain()
    assert.equal(2, runs(file))
    os.remove(file)
  end)

  it("dedupe = function(data) -> key joins jobs by that key", function()
    local file = os.tmpname()
    local pool = h.pool("counted.lua", { size = 2, dedupe = function(d) return d.value end })
    local a = pool:add({ file = file, value = 1, sleep = 0.1, note = "x" })
    local b = pool:add({ file = file, value = 1, sleep = 0.1, note = "y" })
    assert.equal(a, b)
    pool:drain()
    assert.equal(1, runs(file))
    os.remove(file)
  end)

  it("cache keeps completed results for `cache` seconds, and answers through the loop", function()
    local file = os.tmpname()
    local pool = h.pool("counted.lua", { size = 1, dedupe = true, cache = 0.3 })
    local data = { file = file, value = 5 }
    assert.equal(5, pool:run(data))
    local hit = pool:add(data)
    assert.equal("waiting", hit.state) -- not answered inside add
    assert.equal(5, hit:wait())
    assert.equal(1, runs(file))
    assert.equal(1, pool:stats().cache_hits)
    h.sleep(0.4)
    assert.equal(5, pool:run(data)) -- expired: runs again
    assert.equal(2, runs(file))
    os.remove(file)
  end)

  it("never caches failures", function()
    local file = os.tmpname()
    local pool = h.pool("counted.lua", { size = 1, dedupe = true, cache = 60 })
    local data = { file = file, fail = true }
    assert.is_nil(pool:run(data))
    assert.is_nil(pool:run(data))
    assert.equal(2, runs(file))
    os.remove(file)
  end)

  it("bounds the cache to cache_max entries, least recently used first out", function()
    local file = os.tmpname()
    local pool = h.pool("counted.lua", { size = 1, dedupe = true, cache = 60, cache_max = 2 })
    local function run(v) return pool:run({ file = file, value = v }) end
    run(1); run(2)
    run(1)          -- hit: 1 is now the most recent
    run(3)          -- evicts 2
    assert.equal(3, runs(file))
    run(1)          -- still cached
    assert.equal(3, runs(file))
    run(2)          -- was evicted: runs again
    assert.equal(4, runs(file))
    os.remove(file)
  end)
end)
