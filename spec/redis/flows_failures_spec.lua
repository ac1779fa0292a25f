-- Flows on Redis when things go wrong, with real `moonjob worker` processes:
-- each on_fail of a child, a child retried then completed, a parent past its
-- children_deadline, a child or a parent gone from Redis, cancel and remove
-- cascades, an add or a stale entry meeting a waiting parent's id. (Trees
-- that run, and trees refused whole: flows_spec.lua.)
local fr = require "flow_runs"
local helpers = require "helpers"
local rf = require "redis_workers"

local worker, trace_of, count, keys, no_file = fr.worker, fr.trace, fr.count, fr.keys, fr.no_file

-- The job's state and error code (q:get's), as a pair.
local function ended(job)
  local info = assert(job:get())
  return { info.state, info.error and info.error.code }
end

-- A job that runs until canceled: it says it started (touch), then sleeps
-- (interruptible; killed 0.2 s past an interrupt it did not heed).
local function runs_long(name, trace, started, queue)
  return { queue = queue, kill_after = 0.2, data = { name = name, trace = trace, touch = started, sleep = 60 } }
end

describe("a flow's failures on Redis #slow", function()
  after_each(rf.close_all)

  it("a child failing with on_fail fail (the default) fails its parent at once with ECHILD naming it; "
      .. "a running sibling is interrupted, a waiting one canceled without running", function()
    local server = rf.server()
    local trace, started = os.tmpname(), no_file()
    local q = rf.producer(server, "{ff}/main")
    local root = assert(q:add_flow({ data = { name = "root", trace = trace }, children = {
      { data = { name = "a", trace = trace, gate = started, fail = true } }, -- fails once b runs
      runs_long("b", trace, started),
      { queue = "{ff}/idle", data = { name = "c", trace = trace } } } })) -- (no worker: it waits)
    local a, b, c = root.children[1], root.children[2], root.children[3]
    worker(server, "{ff}/main", "-j 2 --prefetch 0")
    local _, err = root:wait(20)
    assert.equal("ECHILD", err.code)
    assert.same({ id = a.id, queue = "{ff}/main" }, err.child)
    assert.equal("EBAD", err.error.code)
    assert.matches(("its child %s in queue {ff}/main failed: EBAD: job %s failed on purpose"):format(a.id, a.id),
      err.message, 1, true)
    assert.same({ "failed", "ECANCELED" }, ended(c)) -- in the same call as the parent's failure
    helpers.wait_for(function() return b:get().state == "failed" end, 20)
    assert.same({ "failed", "ECANCELED" }, ended(b))
    local t = trace_of(trace)
    assert.same({ 1, 0, 0, 0 }, { count(t.starts.b), count(t.ends.b), count(t.starts.c), count(t.starts.root) })
    assert.same({}, keys(server, "*deps:*"))
    assert.same({ "failed", "failed", "failed" }, { q:children(root)[1].state, q:children(root)[2].state,
      q:children(root)[3].state })
  end)

  it("on_fail continue: the parent runs and sees the error; ignore: it runs, the child in its place without "
      .. "its error; a child retried "
      .. "then completed counts as completed", function()
    local server = rf.server()
    local trace = os.tmpname()
    local q = rf.producer(server, "oc")
    local root = assert(q:add_flow({ data = { name = "root", trace = trace }, children = {
      { on_fail = "continue", data = { name = "a", trace = trace, fail = true } },
      { on_fail = "ignore", data = { name = "b", trace = trace, fail = true } },
      { attempts = 2, data = { name = "c", trace = trace, fail_first = true } },
      { data = { name = "d", trace = trace } } } }))
    local kids = root.children
    worker(server, "oc", "-j 2")
    local result = assert(root:wait(20))
    local seen = result.children -- job.children as the parent's processor had it
    assert.equal(4, #seen) -- each in its place: b as ignored, without its error
    assert.same({ kids[1].id, "failed", "EBAD" }, { seen[1].id, seen[1].state, seen[1].error.code })
    assert.same({ kids[2].id, "ignored" }, { seen[2].id, seen[2].state })
    assert.is_nil(seen[2].error)
    assert.same({ kids[3].id, "completed", "c" }, { seen[3].id, seen[3].state, seen[3].result.data.name })
    assert.same({ kids[4].id, "completed", "d" }, { seen[4].id, seen[4].state, seen[4].result.data.name })
    assert.equal(2, assert(kids[3]:get()).attempts)
    local t = trace_of(trace)
    assert.equal(2, count(t.starts.c))
    assert.equal(1, count(t.starts.root))
    for _, name in ipairs({ "a", "b", "c", "d" }) do
      assert.is_true(t.starts.root[1] > t.ends[name][#t.ends[name]], name .. " ended before the parent started")
    end
    -- q:children lists the ignored child too, with its error
    local listed = assert(q:children(root))
    assert.same({ "failed", "ignored", "completed", "completed" },
      { listed[1].state, listed[2].state, listed[3].state, listed[4].state })
    assert.equal("EBAD", listed[2].error.code)
  end)

  it("a parent past its children_deadline fails ETIMEDOUT; its pending children are canceled", function()
    local server = rf.server()
    local trace, started = os.tmpname(), no_file()
    local q = rf.producer(server, "{dl}/main")
    local root = assert(q:add_flow({ data = { name = "root", trace = trace }, children_deadline = 600,
      children = { runs_long("a", trace, started), { queue = "{dl}/idle", data = { name = "b" } } } }))
    local short = assert(q:add_flow({ data = { name = "short" }, children_deadline = 0.3,
      children = { { queue = "{dl}/idle", data = { name = "c" } } } }))
    local key = "mj:{dl}/main:j:" .. root.id
    local made, deadline = server:cli("HGET", key, "created"), server:cli("HGET", key, "deadline")
    assert.equal(600000, tonumber(deadline) - tonumber(made))
    worker(server, "{dl}/main", "-j 1")
    local _, late = short:wait(8) -- (its deadline's own time: not the next look, 10 s later)
    assert.same({ "ETIMEDOUT", "failed", "ECANCELED" }, { late.code, ended(short.children[1])[1],
      ended(short.children[1])[2] })
    helpers.wait_for(function() return helpers.exists(started) end, 20)
    assert.equal("waiting-children", root:get().state)
    -- the deadline made to pass now: fetch looks at a parent when its score
    -- in <p>parents is due
    server:cli("HSET", key, "deadline", tostring(tonumber(made) + 1))
    server:cli("ZADD", "mj:{dl}/main:parents", "XX", "0", root.id)
    local _, err = root:wait(8) -- (within a poll or two: not at the next look, 10 s later)
    assert.equal("ETIMEDOUT", err.code)
    assert.matches("its children did not all end by its children_deadline (2 pending)", err.message, 1, true)
    assert.same({ "failed", "ECANCELED" }, ended(root.children[2]))
    helpers.wait_for(function() return root.children[1]:get().state == "failed" end, 20)
    assert.same({ "failed", "ECANCELED" }, ended(root.children[1]))
    local t = trace_of(trace)
    assert.same({ 1, 0, 0 }, { count(t.starts.a), count(t.ends.a), count(t.starts.root) })
    assert.same({}, keys(server, "*:parents"))
  end)

  it("a child gone from Redis while its parent waits is found and counts as failed EMISSING", function()
    local server = rf.server()
    local q = rf.producer(server, "{gone}/main")
    local failing = assert(q:add_flow({ data = { name = "r1" }, children = {
      { queue = "{gone}/idle", data = { name = "x" } }, { queue = "{gone}/idle", data = { name = "y" } } } }))
    local going_on = assert(q:add_flow({ data = { name = "r2" }, children = {
      { queue = "{gone}/idle", on_fail = "continue", data = { name = "x2" } }, { data = { name = "z" } } } }))
    worker(server, "{gone}/main", "-j 2")
    helpers.wait_for(function() return going_on.children[2]:get().state == "completed" end, 20)
    server:cli("DEL", "mj:{gone}/idle:j:" .. failing.children[1].id, "mj:{gone}/idle:j:" .. going_on.children[1].id)
    assert.same({ "missing", "waiting" }, { q:children(failing)[1].state, q:children(failing)[2].state })
    -- both parents due a look now (fetch looks every 10 s)
    server:cli("ZADD", "mj:{gone}/main:parents", "XX", "0", failing.id, "0", going_on.id)
    local _, err = failing:wait(8)
    assert.equal("ECHILD", err.code)
    assert.same({ "EMISSING", failing.children[1].id }, { err.error.code, err.child.id })
    assert.same({ "failed", "ECANCELED" }, ended(failing.children[2]))
    local result = assert(going_on:wait(8))
    assert.same({ "failed", "EMISSING" }, { result.children[1].state, result.children[1].error.code })
    assert.same({ "completed", "z" }, { result.children[2].state, result.children[2].result.data.name })
  end)

  it("canceling a waiting parent cancels its waiting children, deep too, and interrupts running ones", function()
    local server = rf.server()
    local trace, started = os.tmpname(), no_file()
    local q = rf.producer(server, "{cc}/main")
    local root = assert(q:add_flow({ data = { name = "root", trace = trace }, children = {
      runs_long("a", trace, started),
      { queue = "{cc}/idle", data = { name = "b", trace = trace } },
      { data = { name = "m", trace = trace }, children = { { queue = "{cc}/idle", data = { name = "g" } } } } } }))
    local a, b, m = root.children[1], root.children[2], root.children[3]
    worker(server, "{cc}/main", "-j 2")
    helpers.wait_for(function() return helpers.exists(started) end, 20)
    assert.equal("waiting-children", q:cancel(root, "not needed"))
    assert.same({ "failed", "ECANCELED" }, ended(root))
    for _, job in ipairs({ b, m, m.children[1] }) do assert.same({ "failed", "ECANCELED" }, ended(job)) end
    helpers.wait_for(function() return a:get().state == "failed" end, 20)
    assert.same({ "failed", "ECANCELED" }, ended(a))
    local t = trace_of(trace)
    assert.same({ 1, 0, 0, 0, 0 }, { count(t.starts.a), count(t.ends.a), count(t.starts.b), count(t.starts.m),
      count(t.starts.root) })
    assert.same({}, keys(server, "*deps:*"))
    assert.same({}, keys(server, "*:parents"))
  end)

  it("removing a waiting parent cancels its pending children, running ones interrupted", function()
    local server = rf.server()
    local trace, started = os.tmpname(), no_file()
    local q = rf.producer(server, "{rp}/main")
    local root = assert(q:add_flow({ data = { name = "root", trace = trace }, children = {
      runs_long("a", trace, started), { queue = "{rp}/idle", data = { name = "b", trace = trace } } } }))
    local a, b = root.children[1], root.children[2]
    worker(server, "{rp}/main", "-j 2")
    helpers.wait_for(function() return helpers.exists(started) end, 20)
    assert.equal("waiting-children", q:remove(root.id))
    assert.is_nil(root:get())
    assert.same({ "failed", "ECANCELED" }, ended(b))
    helpers.wait_for(function() return a:get().state == "failed" end, 20)
    assert.same({ "failed", "ECANCELED" }, ended(a))
    local t = trace_of(trace)
    assert.same({ 1, 0, 0, 0 }, { count(t.starts.a), count(t.ends.a), count(t.starts.b), count(t.starts.root) })
    assert.same({}, keys(server, "mj:{rp}/main:*:" .. root.id)) -- (deps and kids gone with it)
    assert.same({}, keys(server, "*:parents"))
  end)

  it("removing a child its parent waits for is ESTATE, unless cascaded: its parent then fails ECHILD", function()
    local server = rf.server()
    local q = rf.producer(server, "rc")
    local root = assert(q:add_flow({ data = { name = "root" }, children = {
      { data = { name = "a" } }, { data = { name = "b" } } } }))
    local a, b = root.children[1], root.children[2]
    -- where jobs are seen: the parent's pending children, a child's parent
    local seen = assert(q:job(root.id))
    assert.same({ "waiting-children", a.id, "waiting", b.id, "waiting" }, { seen.state, seen.children[1].id,
      seen.children[1].state, seen.children[2].id, seen.children[2].state })
    assert.same({ queue = "rc", id = root.id }, assert(q:job(b.id)).parent)
    assert.is_nil(assert(q:job(b.id)).children)
    assert.same({ 1, 2 }, { q:counts().waiting_children, q:counts().waiting })
    local page = assert(q:jobs("waiting-children"))
    assert.same({ root.id }, { page[1].id, page[2] })
    local before = keys(server, "*")
    local state, err = q:remove(a.id)
    assert.is_nil(state)
    assert.equal("ESTATE", err.code)
    assert.matches(("its parent %s in queue rc waits for it: remove it with cascade"):format(root.id), err.message,
      1, true)
    assert.same(before, keys(server, "*"))
    assert.same({ "waiting-children", "waiting" }, { root:get().state, a:get().state })
    assert.equal("waiting", q:remove(a.id, { cascade = true }))
    assert.is_nil(a:get())
    local _, failed = root:wait(5)
    assert.same({ "ECHILD", a.id, "ECANCELED" }, { failed.code, failed.child.id, failed.error.code })
    assert.same({ "failed", "ECANCELED" }, ended(b))
    -- a parent counts a removed child once: removing b now (ended) changes nothing there
    assert.equal("failed", q:remove(b.id))
    assert.same({ "failed", "ECHILD" }, ended(root))
    -- a child that is a parent itself: removed with cascade, its own pending children are canceled
    local top = assert(q:add_flow({ data = { name = "top" }, children = {
      { data = { name = "m" }, children = { { data = { name = "g" } } } } } }))
    local m = top.children[1]
    assert.equal("ESTATE", select(2, q:remove(m.id)).code)
    assert.equal("waiting-children", q:remove(m.id, { cascade = true }))
    assert.same({ "failed", "ECANCELED" }, ended(m.children[1]))
    local _, top_err = top:wait(5)
    assert.same({ "ECHILD", m.id, "ECANCELED" }, { top_err.code, top_err.child.id, top_err.error.code })
    assert.same({}, keys(server, "*deps:*"))
  end)

  it("a parent gone from Redis while its children run is not brought back when they end", function()
    local server = rf.server()
    local q = rf.producer(server, "{vp}/main")
    local root = assert(q:add_flow({ data = { name = "root" }, children = {
      { queue = "{vp}/kids", data = { name = "a" } }, { queue = "{vp}/kids", data = { name = "b" } } } }))
    server:cli("DEL", "mj:{vp}/main:j:" .. root.id) -- (evicted, or deleted around moonjob)
    worker(server, "{vp}/kids", "-j 1")
    helpers.wait_for(function() return root.children[2]:get().state == "completed" end, 20)
    assert.equal("completed", root.children[1]:get().state)
    assert.same({ "mj:{vp}/main:ids" }, keys(server, "mj:{vp}/main:*")) -- (its id counter)
  end)

  it("adding a job with the id of a waiting parent joins it, as it joins any pending job", function()
    local server = rf.server()
    local q = rf.producer(server, "join")
    local root = assert(q:add_flow({ id = "p", data = { name = "root" }, children = {
      { id = "m", data = { name = "m" }, children = { { data = { name = "g" } } } } } }))
    for _, id in ipairs({ "p", "m" }) do
      local job = assert(q:add({ name = "another" }, { id = id }))
      assert.same({ id, "waiting-children", true }, { job.id, job.state, job.joined })
      assert.same({ name = id == "p" and "root" or "m" }, q:job(id).data)
    end
    assert.equal("waiting", root.children[1].children[1]:get().state)
    worker(server, "join", "-j 2")
    local result = assert(root:wait(20))
    assert.same({ "m", "g" }, { result.children[1].result.data.name,
      result.children[1].result.children[1].result.data.name })
  end)

  it("a waiting parent is not failed for a stale entry an earlier job with its id left behind", function()
    local server = rf.server()
    local q = rf.producer(server, "stale")
    local root = assert(q:add_flow({ id = "p", data = { name = "root" }, children = {
      { queue = "{stale}/gate", data = { name = "a" } } } }))
    -- what a job p lost by Redis (evicted) leaves in the sets of the states it was in
    server:cli("ZADD", "mj:{stale}:active", "0", "p")
    server:cli("ZADD", "mj:{stale}:wait", "0", "0000000000000001:p")
    worker(server, "stale", "-j 1")
    helpers.wait_for(function()
      return server:cli("ZCARD", "mj:{stale}:active") == "0" and server:cli("ZCARD", "mj:{stale}:wait") == "0"
    end, 20)
    assert.equal("waiting-children", root:get().state)
    worker(server, "{stale}/gate", "-j 1")
    assert.equal("a", assert(root:wait(20)).children[1].result.data.name)
  end)
end)
