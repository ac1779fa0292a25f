-- Flows on Redis at their edges: a parent whose children's results are
-- more than a worker takes, a cached parent's keys, many parents due a
-- look at once, a child replaced by another job with its id, and an
-- obliterate that meets a parent gone from Redis. (Trees that run:
-- flows_spec.lua; failures and cascades: flows_failures_spec.lua.)
local fr = require "flow_runs"
local helpers = require "helpers"
local names = require "moonjob.redis.names"
local rf = require "redis_workers"

local keys = fr.keys

-- moonjob_fetch by hand, as a worker "w" would (n jobs, lease 30 s, keep
-- every finished job): its reply's lines, as redis-cli prints them.
local function fetch(server, queue, n)
  return server:cli("FCALL", "moonjob_fetch", "1", names.prefix(queue), "w", tostring(n or 0), "30000",
    "", "", "0")
end

describe("flows at their edges on Redis #slow", function()
  after_each(rf.close_all)

  it("a parent whose children's results are more than the worker's max_payload fails EPAYLOAD, "
      .. "and the worker goes on", function()
    local server = rf.server()
    local q = rf.producer(server, "big")
    local children = {}
    for i = 1, 30 do children[i] = { data = { i = i, pad = ("x"):rep(15000) } } end -- each echoed back
    local root = assert(q:add_flow({ data = { name = "root" }, children = children }))
    rf.pool(server, "big", { size = 2, max_payload = 20000 }, fr.FLOW)
    local _, err = root:wait(30)
    assert.equal("EPAYLOAD", err.code)
    assert.matches("its children's ends", err.message, 1, true)
    assert.matches("more than the worker's max_payload (20000)", err.message, 1, true)
    local after = assert(q:add({ name = "after" }))
    assert.equal("after", assert(after:wait(20)).data.name) -- the worker was not stuck on the parent
  end)

  it("a cached parent's children expire with it, and a new flow with its id sees only its own", function()
    local server = rf.server()
    local q = rf.producer(server, "cached")
    local first = assert(q:add_flow({ id = "p1", cache = 60, data = { name = "root" },
      children = { { id = "c1", data = { name = "c1" } } } }))
    fr.worker(server, "cached", "-j 2 --keep-age 0.001")
    assert(first:wait(20))
    helpers.wait_for(function() return server:cli("ZCARD", "mj:{cached}:completed") == "0" end, 20)
    local ttl = tonumber(server:cli("PTTL", "mj:{cached}:kids:p1"))
    assert.is_true(ttl > 0 and ttl <= 60000, "kids:p1 does not expire with its parent: " .. ttl)
    assert.is_true(math.abs(ttl - tonumber(server:cli("PTTL", "mj:{cached}:j:p1"))) < 1000)
    -- as if the parent's hash expired first and its children's ends stayed (what an older
    -- moonjob left): a new flow with its id must not take them
    server:cli("PERSIST", "mj:{cached}:kids:p1")
    server:cli("DEL", "mj:{cached}:j:p1")
    local second = assert(q:add_flow({ id = "p1", cache = 60, data = { name = "root" }, -- (kept to be read)
      children = { { id = "c9", data = { name = "c9" } } } }))
    local result = assert(second:wait(20))
    assert.equal(1, #result.children)
    assert.equal("c9", result.children[1].id)
  end)

  it("many parents due a look at once are looked at a few at a time, and bring no fetch back at once", function()
    local server = rf.server()
    local q = rf.producer(server, "due")
    for i = 1, 30 do
      assert(q:add_flow({ data = { i = i }, children = { { queue = "{due}/idle", data = { i = i } } } }))
    end
    for _, id in ipairs(keys(server, "mj:{due}:j:*")) do
      server:cli("ZADD", "mj:{due}:parents", "0", id:match("j:(.*)$"))
    end
    local next_ms = tonumber(fetch(server, "{due}"):match("^(%-?%d+)"))
    assert.is_true(next_ms >= 900, "the next fetch is asked for in " .. next_ms .. " ms")
    assert.equal("10", server:cli("ZCOUNT", "mj:{due}:parents", "0", "0")) -- 20 looked at, 10 left due
  end)

  it("a child replaced by another job with its id counts as gone (EMISSING) at its parent's next look", function()
    local server = rf.server()
    local q = rf.producer(server, "swap")
    local root = assert(q:add_flow({ data = { name = "root" }, children = { { id = "c", queue = "{swap}/b",
      data = { name = "c" } } } }))
    server:cli("DEL", "mj:{swap}/b:j:c")
    local other = rf.producer(server, "{swap}/b")
    assert(other:add({ name = "someone else" }, { id = "c" }))
    server:cli("ZADD", "mj:{swap}:parents", "0", root.id)
    fetch(server, "swap")
    local info = assert(root:get())
    assert.equal("failed", info.state)
    assert.equal("ECHILD", info.error.code)
    assert.equal("EMISSING", info.error.error.code)
  end)

  it("a flow meeting a parents key of another type, or a parent with an expiry, is refused whole", function()
    local server = rf.server()
    local q = rf.producer(server, "hx")
    server:cli("SET", "mj:{hx}:parents", "not a sorted set")
    local _, err = q:add_flow({ data = 1, children = { { data = 2 } } })
    assert.equal("EINPUT", err.code)
    assert.matches("mj:{hx}:parents is a string", err.message, 1, true)
    server:cli("DEL", "mj:{hx}:parents")
    local reply = server:cli("FCALL", "moonjob_add_flow", "1", "mj:{hx}:", "2",
      "1", "0", "", "", "", "{}", "0", "0", "1", "", "0", "0", "", "0", "0", "", "5000", "",
      "1", "1", "", "", "", "{}", "0", "0", "1", "", "0", "0", "", "0", "0", "", "", "")
    assert.matches("a job with children takes no EXPIRE_MS", reply, 1, true)
    assert.same({}, keys(server, "mj:{hx}:*"))
  end)

  it("a child counted once stays as it was counted when it is run again by hand", function()
    local server = rf.server()
    local q = rf.producer(server, "{once}main")
    local failing = os.tmpname() -- (the child fails while this file exists)
    local root = assert(q:add_flow({ data = { name = "root" }, children = {
      { on_fail = "continue", data = { name = "a", fail_while = failing } },
      { queue = "{once}/idle", data = { name = "b" } } } })) -- (no worker: the parent keeps waiting)
    fr.worker(server, "{once}main", "-j 1")
    local a = root.children[1]
    helpers.wait_for(function() return a:get().state == "failed" end, 20)
    os.remove(failing)
    assert.equal("failed", assert(q:retry(a.id)))
    helpers.wait_for(function() return a:get().state == "completed" end, 20)
    local listed = assert(q:children(root))
    assert.same({ "failed", "EBAD" }, { listed[1].state, listed[1].error.code }) -- its first end, counted
    assert.equal("waiting-children", assert(root:get()).state)
    assert.equal("1", server:cli("SCARD", "mj:{once}main:deps:" .. root.id))
  end)

  it("draining or obliterating a children's queue counts them as canceled in their parents", function()
    local server = rf.server()
    local q = rf.producer(server, "{dr}main")
    local drained = assert(q:add_flow({ data = 1, children = { { queue = "{dr}/b", data = 2 } } }))
    local gone = assert(q:add_flow({ data = 1, children = { { queue = "{dr}/c", data = 3 } } }))
    assert(rf.producer(server, "{dr}/b"):drain())
    assert(rf.producer(server, "{dr}/c"):obliterate())
    for _, root in ipairs({ drained, gone }) do
      local info = assert(root:get())
      assert.same({ "failed", "ECHILD", "ECANCELED" }, { info.state, info.error.code, info.error.error.code })
    end
  end)

  it("obliterate deletes a gone parent's keys too", function()
    local server = rf.server()
    local q = rf.producer(server, "gone")
    local root = assert(q:add_flow({ data = { name = "root" },
      children = { { queue = "{gone}/b", data = { name = "c" } } } })) -- (not obliterated with it)
    server:cli("DEL", "mj:{gone}:j:" .. root.id)
    assert(q:obliterate())
    assert.same({}, keys(server, "mj:{gone}:deps:*"))
    assert.same({}, keys(server, "mj:{gone}:kids:*"))
  end)
end)
