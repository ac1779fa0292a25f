-- Flows on Redis with real `moonjob worker` processes: a tree runs every
-- child before its parent and the parent sees every result, exactly; a
-- worker killed or paused while it holds a child; retention trimming
-- children; 1,000 flows at once; queues named {TAG}NAME; bad trees refused
-- whole, nothing written. (Failures, deadlines, cascades:
-- flows_failures_spec.lua.)
local flow = require "moonjob.redis.flow"
local helpers = require "helpers"
local redis_queue = require "redis_queue"
local fr = require "flow_runs"
local rf = require "redis_workers"

local BIG = 9007199254740993LL -- 2^53 + 1: a double would round it

local worker, trace_of, count, keys, no_file = fr.worker, fr.trace, fr.count, fr.keys, fr.no_file

-- Each node of tree (by name: its data's name) started once, and after
-- each of its children ended.
local function assert_children_first(tree, t)
  assert.equal(1, count(t.starts[tree.data.name]), tree.data.name .. " started once")
  for _, child in ipairs(tree.children or {}) do
    assert_children_first(child, t)
    local ended = t.ends[child.data.name]
    assert.equal(1, count(ended), child.data.name .. " ended once")
    assert.is_true(t.starts[tree.data.name][1] > ended[1],
      ("%s started (line %d) before its child %s ended (line %d)"):format(tree.data.name,
        t.starts[tree.data.name][1], child.data.name, ended[1]))
  end
end

-- The part of key that Redis Cluster hashes (its rule: the text between the
-- first { and the next }, when not empty; else the whole key).
local function hash_tag(key)
  local open = key:find("{", 1, true)
  local close = open and key:find("}", open + 1, true)
  if not close or close == open + 1 then return key end
  return key:sub(open + 1, close - 1)
end

describe("flows on Redis #slow", function()
  after_each(rf.close_all)

  it("a tree 3 deep and 50 wide on three queues of one tag: every child runs before its parent, "
      .. "which sees each result exactly", function()
    local server = rf.server()
    local trace = os.tmpname()
    local tree = { data = { name = "root", trace = trace }, children = {} }
    for i = 1, 50 do
      local child = { data = { name = "c" .. i, trace = trace }, children = {} }
      for k = 1, 18 do
        child.children[k] = { queue = "{tree}/leaves", data = { name = ("g%d.%d"):format(i, k), trace = trace,
          big = BIG } }
      end
      tree.children[i] = child
    end
    for i = 1, 50 do tree.children[i].queue = "{tree}/parents" end
    local q = rf.producer(server, "tree") -- (a plain name is its own tag: "{tree}/..." queues share its slot)
    local root = assert(q:add_flow(tree))
    assert.equal("waiting-children", root.state)
    assert.equal(50, #root.children)
    assert.equal(18, #root.children[50].children)
    assert.equal("{tree}/leaves", root.children[1].children[1].queue.name)
    worker(server, "tree", "-j 1")
    worker(server, "{tree}/parents")
    worker(server, "{tree}/leaves")
    local result = assert(root:wait(120))
    assert_children_first(tree, trace_of(trace))
    assert.equal(951, #trace_of(trace).lines / 2)
    assert.equal(50, #result.children)
    for i, child in ipairs(result.children) do
      assert.same({ id = root.children[i].id, queue = "{tree}/parents", state = "completed" },
        { id = child.id, queue = child.queue, state = child.state })
      assert.equal("c" .. i, child.result.data.name)
      assert.equal(18, #child.result.children)
      for k, leaf in ipairs(child.result.children) do
        assert.equal(root.children[i].children[k].id, leaf.id)
        assert.equal("{tree}/leaves", leaf.queue)
        assert.equal("completed", leaf.state)
        assert.equal(("g%d.%d"):format(i, k), leaf.result.data.name)
        assert.equal("cdata", type(leaf.result.data.big))
        assert.is_true(leaf.result.data.big == BIG, tostring(leaf.result.data.big))
      end
    end
    -- one hash tag, so one cluster slot: every key of the queues (not
    -- the server's registry and library version)
    local tags = {}
    for _, k in ipairs(keys(server, "*")) do
      if k ~= "mj:queues" and k ~= "mj:library" then tags[hash_tag(k)] = true end
    end
    assert.same({ tree = true }, tags)
  end)

  it("a worker killed while it runs a child: another runs it again, the tree completes, its parent runs once",
      function()
    local server = rf.server()
    local trace, started = os.tmpname(), no_file()
    local tree = { data = { name = "root", trace = trace }, children = {} }
    for i = 1, 6 do tree.children[i] = { attempts = 3, data = { name = "c" .. i, trace = trace, sleep = 0.1 } } end
    tree.children[3].data = { name = "c3", trace = trace, touch = started, sleep = 0.5 }
    local q = rf.producer(server, "killed")
    local root = assert(q:add_flow(tree))
    local first = worker(server, "killed", "-j 2 --lease 1")
    helpers.wait_for(function() return helpers.exists(started) end, 20)
    rf.stop_worker(first, "KILL")
    worker(server, "killed", "-j 2 --lease 1")
    local result = assert(root:wait(60))
    local t = trace_of(trace)
    assert.equal(1, count(t.starts.root))
    assert.equal(2, count(t.starts.c3)) -- (killed, then run again)
    for i = 1, 6 do
      local ends = assert(t.ends["c" .. i], "c" .. i .. " ended")
      assert.is_true(t.starts.root[1] > ends[#ends])
      assert.same({ "c" .. i, "completed" }, { result.children[i].result.data.name, result.children[i].state })
    end
    assert.equal(6, #result.children)
    assert.is_true(rf.recovered(server, "killed") >= 1) -- c3 was taken back from the killed worker
  end)

  it("a child run again after its worker paused past the lease counts once: the late report is refused", function()
    local server = rf.server()
    local trace, started, gate = os.tmpname(), no_file(), no_file()
    local tree = { data = { name = "root", trace = trace }, children = {
      { attempts = 3, data = { name = "x", trace = trace, touch = started, gate = gate } },
      { queue = "{paused}/later", data = { name = "y", trace = trace } } } }
    local q = rf.producer(server, "{paused}/main")
    local root = assert(q:add_flow(tree))
    local x, y = root.children[1], root.children[2]
    -- a long lease: its renewals (every lease/12) are not due when it wakes,
    -- so its first act then is the report of its run of x, refused
    local paused, paused_log = worker(server, "{paused}/main", "-j 1 --prefetch 0 --lease 120")
    helpers.wait_for(function() return helpers.exists(started) end, 20)
    helpers.wait_for(function() return server:cli("HGET", "mj:{paused}/main:j:" .. x.id, "ran") == "1" end, 20)
    os.execute("kill -STOP " .. paused)
    redis_queue.close_after({ close = function() os.execute("kill -CONT " .. paused .. " 2>/dev/null") end })
    -- its lease made to run out now (what a pause past the lease does)
    assert.equal("1", server:cli("ZADD", "mj:{paused}/main:active", "XX", "CH", "0", x.id))
    worker(server, "{paused}/main", "-j 1")
    helpers.wait_for(function() return count(trace_of(trace).starts.x) == 2 end, 20)
    helpers.write_file(gate, "") -- both runs of x end; the paused worker's is not reported yet
    helpers.wait_for(function() return x:get().state == "completed" end, 20)
    os.execute("kill -CONT " .. paused)
    helpers.wait_for(function() return rf.read(paused_log):find("refused for 1 job", 1, true) end, 20)
    -- counted once: the parent still waits for y, x's slot is out of its pending set
    assert.equal("waiting-children", root:get().state)
    local deps = keys(server, "*deps:*")
    assert.same({ "mj:{paused}/main:deps:" .. root.id }, deps)
    assert.equal("0003mj:{paused}/later:j:" .. y.id, server:cli("SMEMBERS", deps[1]))
    worker(server, "{paused}/later", "-j 1")
    local result = assert(root:wait(20))
    assert.equal(1, count(trace_of(trace).starts.root))
    assert.same({ x.id, y.id }, { result.children[1].id, result.children[2].id })
    assert.equal(2, #result.children)
    assert.same({}, keys(server, "*deps:*"))
    assert.equal("2", server:cli("HLEN", "mj:{paused}/main:kids:" .. root.id))
  end)

  it("children trimmed or removed before their parent runs: the parent still sees each result and error", function()
    local server = rf.server()
    local gate_queue = "{kept}/gate"
    local tree = { data = { name = "root" }, children = {} }
    for i = 1, 5 do tree.children[i] = { queue = "{kept}/trimmed", data = { name = "t" .. i } } end
    tree.children[6] = { queue = "{kept}/trimmed", on_fail = "continue", data = { name = "t6", fail = true } }
    tree.children[7] = { data = { name = "removed" } }
    tree.children[8] = { data = { name = "cleaned" } }
    tree.children[9] = { queue = gate_queue, data = { name = "last" } }
    local q = rf.producer(server, "{kept}/parents")
    local root = assert(q:add_flow(tree))
    local kids = root.children
    worker(server, "{kept}/trimmed", "-j 2 --keep-age 0.001 --keep-failed-age 0.001") -- (trimmed by the next fetch)
    worker(server, "{kept}/parents", "-j 2")
    for i = 7, 8 do
      helpers.wait_for(function() return kids[i]:get().state == "completed" end, 20)
    end
    assert.equal("completed", q:remove(kids[7].id)) -- (no longer counted: no cascade needed)
    assert.equal(1, q:clean("completed", { older_than = 0 }))
    helpers.wait_for(function()
      for i = 1, 6 do
        if server:cli("EXISTS", "mj:{kept}/trimmed:j:" .. kids[i].id) ~= "0" then return false end
      end
      return true
    end, 20)
    assert.equal(0, tonumber(server:cli("EXISTS", "mj:{kept}/parents:j:" .. kids[7].id,
      "mj:{kept}/parents:j:" .. kids[8].id)))
    assert.equal("waiting-children", root:get().state)
    worker(server, gate_queue, "-j 1")
    local result = assert(root:wait(20))
    assert.equal(9, #result.children)
    for i = 1, 5 do
      assert.same({ kids[i].id, "completed", "t" .. i }, { result.children[i].id, result.children[i].state,
        result.children[i].result.data.name })
    end
    assert.same({ "failed", "EBAD" }, { result.children[6].state, result.children[6].error.code })
    assert.matches("job " .. kids[6].id .. " failed on purpose", result.children[6].error.message, 1, true)
    assert.same({ "removed", "cleaned", "last" }, { result.children[7].result.data.name,
      result.children[8].result.data.name, result.children[9].result.data.name })
    -- and q:children, after the parent ran, still from what was copied
    local listed = assert(q:children(root))
    assert.same({ "completed", "t1" }, { listed[1].state, listed[1].result.data.name })
    assert.same({ "failed", "EBAD" }, { listed[6].state, listed[6].error.code })
  end)

  it("1,000 flows added at once all complete, each parent once, with both children's results", function()
    local server = rf.server()
    local trace = os.tmpname()
    local producers = { rf.producer(server, "many"), rf.producer(server, "many") }
    local logs = {}
    for w = 1, 2 do logs[w] = select(2, worker(server, "many", "-j 4")) end
    local roots = {}
    for i = 1, 1000 do
      roots[i] = assert(producers[i % 2 + 1]:add_flow({ data = { name = "r" .. i, trace = trace },
        children = { { data = { n = 2 * i } }, { data = { n = 2 * i + 1 } } } }))
    end
    local q = producers[1]
    helpers.wait_for(function() return q:counts().completed == 3000 end, 120)
    local t = trace_of(trace)
    assert.equal(1000, #t.lines / 2)
    for i = 1, 1000 do
      assert.equal(1, count(t.starts["r" .. i]), "r" .. i .. " ran once")
      local info = assert(q:get(roots[i]))
      assert.equal("completed", info.state)
      local c = info.result.children
      assert.same({ 2 * i, 2 * i + 1, "completed", "completed" }, { c[1].result.data.n, c[2].result.data.n,
        c[1].state, c[2].state })
    end
    local counts = q:counts()
    assert.same({ 3000, 0, 0, 0 }, { counts.completed, counts.failed, counts.waiting_children, counts.waiting })
    -- parents held ahead (the default policy holds many) are run, never given back as past a start bound
    for _, log in ipairs(logs) do assert.not_matches("start bound", rf.read(log)) end
  end)

  it("ids a flow names are not drawn for its other jobs", function()
    local server = rf.server()
    local q = rf.producer(server, "ids")
    -- the root and the first child draw ids 1 and 2 (a fresh queue's
    -- counter); the second child names 2, the third 3
    local root = assert(q:add_flow({ data = { name = "root" }, children = { { data = { name = "drawn" } },
      { id = "2", data = { name = "two" } }, { id = "3", data = { name = "three" } } } }))
    local ids = { root.id }
    for i, child in ipairs(root.children) do ids[i + 1] = child.id end
    local seen = {}
    for _, id in ipairs(ids) do
      assert.is_nil(seen[id], "two jobs of the flow have the id " .. id)
      seen[id] = true
    end
    assert.same({ "2", "3" }, { ids[3], ids[4] })
    assert.equal("3", server:cli("SCARD", "mj:{ids}:deps:" .. root.id))
    worker(server, "ids", "-j 2")
    local result = assert(root:wait(20))
    assert.same({ "drawn", "two", "three" }, { result.children[1].result.data.name,
      result.children[2].result.data.name, result.children[3].result.data.name })
  end)

  describe("a bad tree is refused whole, nothing written", function()
    local server, q, before

    -- What a refusal must leave as it was: every key and value.
    local function dataset()
      return server:cli("DEBUG", "DIGEST") .. "\n" .. table.concat(keys(server, "*"), "\n")
    end

    local function refused(code, text, reply, err)
      assert.is_nil(reply)
      assert.equal(code, err.code)
      assert.matches(text, err.message, 1, true)
      assert.equal(before, dataset())
    end

    before_each(function()
      server = rf.server("--enable-debug-command yes")
      server:cli("SET", "mj:{bad}/a:j:text", "a key of another client")
      q = rf.producer(server, "{bad}/a")
      assert(q:add({ n = 1 }, { id = "taken" }))
      assert(q:add_flow({ data = { n = 2 }, children = { { queue = "{bad}/b", data = { n = 3 } } } }))
      before = dataset()
    end)

    it("by q:add_flow", function()
      local function chain(depth)
        local node = { data = depth }
        for d = depth - 1, 1, -1 do node = { data = d, children = { node } } end
        return node
      end
      local wide = { data = 0, children = {} }
      for i = 1, 1000 do wide.children[i] = { data = i } end
      refused("EINPUT", "an id must be in the flow once: jobs 2 and 4", q:add_flow({ data = 1, children = {
        { id = "x", data = 2 }, { data = 3, children = { { id = "x", data = 4 } } } } }))
      refused("EINPUT", "root.children[2]: unknown option 'colour'", q:add_flow({ data = 1, children = {
        { data = 2 }, { data = 3, colour = "red" } } }))
      refused("EPAYLOAD", "root.children[2].children[1]", q:add_flow({ data = 1, children = {
        { data = 2 }, { data = 3, children = { { data = string.rep("x", 1024 * 1024) } } } } }))
      refused("EINPUT", "queue 'other' is outside the flow's hash tag {bad}", q:add_flow({ data = 1, children = {
        { data = 2 }, { queue = "other", data = 3 } } }))
      refused("EINPUT", "queue '{worse}/b' is outside the flow's hash tag {bad}", q:add_flow({ data = 1,
        children = { { queue = "{worse}/b", data = 3 } } }))
      refused("EINPUT", "a flow is at most 32 jobs deep", q:add_flow(chain(33)))
      refused("EINPUT", "a flow holds at most 1000 jobs", q:add_flow(wide))
      refused("EEXISTS", "a job taken is kept (waiting)", q:add_flow({ data = 1, children = {
        { data = 2 }, { id = "taken", data = 3 } } }))
      refused("EINPUT", "on_fail must be", q:add_flow({ data = 1, children = { { data = 2, on_fail = "retry" } } }))
      refused("EINPUT", "children_deadline must be", q:add_flow({ data = 1, children = {
        { data = 2, children_deadline = 5 } } }))
      refused("EINPUT", "its DELAY_MS must be 0", q:add_flow({ data = 1, children = {
        { data = 2, delay = 5, children = { { data = 3 } } } } }))
      refused("EINPUT", "the key mj:{bad}/a:j:text holds a string, not a job hash", q:add_flow({ data = 1,
        children = { { id = "text", data = 2 } } }))
      -- the largest flow, and the deepest, are taken
      wide.children[1000] = nil
      assert(q:add_flow(wide))
      assert(q:add_flow(chain(32)))
    end)

    it("by a hand-made moonjob_add_flow call with a bad job in the middle", function()
      local good = { data = 1, children = { { data = 2, children = { { data = 3 } } },
        { queue = "{bad}/b", data = 4 }, { data = 5 } } }
      -- the call's place of job i's field f (1: QUEUE ... 5: ID, 7: PRIORITY, 8: DELAY_MS)
      local function at(call, i, f) return 4 + call[3] + (i - 1) * 18 + f end
      local function call_with(change)
        local call = assert(flow.args(good, "{bad}/a"))
        change(call)
        return q.client:call_wait(call)
      end
      local function raw(code, text, change)
        local reply, err = call_with(change)
        refused(code, text, reply, { code = tostring(err):match("^(%u+)"), message = tostring(err) })
      end
      raw("EINPUT", "PRIORITY", function(c) c[at(c, 3, 7)] = "high" end)
      raw("EINPUT", "PARENT must be the place of a job before it, 1 to 2", function(c) c[at(c, 3, 2)] = "3" end)
      raw("EINPUT", "the root's PARENT must be 0", function(c) c[at(c, 1, 2)] = "1" end)
      raw("EINPUT", "ON_FAIL must be", function(c) c[at(c, 4, 3)] = "retry" end)
      raw("EINPUT", "must share the root's hash tag", function(c) c[5] = "mj:{other}/b:" end)
      raw("EINPUT", "QUEUE must be its queue's place in KEYS", function(c) c[at(c, 2, 1)] = "3" end)
      raw("EINPUT", "an id must be in the flow once", function(c) c[at(c, 2, 5)], c[at(c, 5, 5)] = "d", "d" end)
      raw("EEXISTS", "a job taken is kept", function(c) c[at(c, 5, 5)] = "taken" end)
      raw("EINPUT", "its DELAY_MS must be 0", function(c) c[at(c, 2, 8)] = "10" end)
      raw("EINPUT", "CHILDREN_DEADLINE_MS is for a job with children", function(c) c[at(c, 3, 4)] = "10" end)
      raw("EINPUT", "the count of arguments was", function(c) c[#c] = nil end)
      raw("EINPUT", "COUNT must be", function(c) c[4 + c[3]] = "0" end)
      -- 33 deep, by hand: each job the child of the one before
      raw("EINPUT", "a flow is at most 32 jobs deep", function(c)
        local node = { unpack(c, at(c, 2, 1), at(c, 2, 18)) }
        for i = #c, 4 + c[3], -1 do c[i] = nil end
        c[#c + 1] = 33
        for i = 1, 33 do
          for f = 1, 18 do c[#c + 1] = node[f] end
          c[at(c, i, 1)], c[at(c, i, 2)], c[at(c, i, 3)] = "1", tostring(i - 1), i == 1 and "" or "fail"
        end
      end)
      assert(call_with(function() end)) -- the call unchanged is taken
    end)
  end)
end)
