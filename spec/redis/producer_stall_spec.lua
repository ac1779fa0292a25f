-- Durable queues on Redis: adds whose replies a stalled Redis lost (DEBUG
-- SLEEP past the producer's 5 s watchdog, as a fork of a large dataset or a
-- slow fsync does). The producer sends such a call again under the same name,
-- and Redis answers it from what it remembered of the first one: every line
-- gets its id, exit 0, no job twice. Past the bound (--resolve 0 here, or the
-- remembered answer gone) the old honest answer stays: "unknown".
local helpers = require "helpers"
local loop = require "moonjob.loop"
local moonjob = require "moonjob"
local redis_server = require "redis_server"
local rq = require "redis_queue"

local STALL = 7 -- seconds: the watchdog (5 s, looked at every 1.25 s) fires within it

-- Starts DEBUG SLEEP on another connection and returns once the server
-- sleeps (a PING gets no answer).
local function stall(server, seconds)
  os.execute(("%s -p %d DEBUG SLEEP %s >/dev/null 2>&1 &"):format(redis_server.CLI, server.port, seconds))
  for _ = 1, 50 do
    local pong = helpers.first_line(("timeout 0.3 %s -p %d PING 2>/dev/null"):format(redis_server.CLI, server.port))
    if pong ~= "PONG" then return end
  end
  error("the server did not start sleeping")
end

-- Every job of queue `name` as id -> data, read from its hashes.
local function jobs_of(server, name)
  local out = server:cli("EVAL", [[
    local out = {}
    for _, key in ipairs(redis.call("KEYS", KEYS[1])) do
      out[#out + 1] = redis.call("HGET", key, "id") .. " " .. redis.call("HGET", key, "data")
    end
    return table.concat(out, "\n")]], "1", ("mj:{%s}:j:*"):format(name))
  local jobs, n = {}, 0
  for id, data in out:gmatch("([^\n ]+) ([^\n]+)") do jobs[id] = data; n = n + 1 end
  return jobs, n
end

-- Runs `moonjob add` on a FIFO; lines 1..half are written and mostly
-- answered, then Redis sleeps, then the rest is written. -> exit status, stdout lines, stderr.
local function add_through_stall(server, dir, queue, lines, half, extra)
  local fifo = dir .. "/in"
  assert(os.execute("mkfifo " .. fifo) == 0)
  local cmd = ("(%s scripts/moonjob add --redis %s --queue %s %s %s >%s/out 2>%s/err; echo $? >%s/rc) & echo $!")
    :format(helpers.LUAJIT, server.url, queue, extra or "", fifo, dir, dir, dir)
  local pid = assert(tonumber(helpers.first_line(cmd)))
  rq.close_after({ close = function() os.execute(("kill -KILL %d 2>/dev/null"):format(pid)) end })
  local w = assert(io.open(fifo, "r+")) -- read-write: never blocks, even with no reader (Linux)
  w:write(table.concat(lines, "\n", 1, half), "\n")
  w:flush()
  -- it holds up to a window of calls unsent while it waits for input
  local rc = dir .. "/rc"
  helpers.wait_for(function()
    return rq.read_lines(rc)[1] or tonumber(server:cli("ZCARD", ("mj:{%s}:wait"):format(queue))) >= half - 256
  end, 60)
  assert.is_nil(rq.read_lines(rc)[1], "moonjob add ended early: " .. table.concat(rq.read_lines(dir .. "/err"), "\n"))
  stall(server, STALL)
  -- sent while it sleeps: more than the window (256 calls) waits in its socket
  w:write(table.concat(lines, "\n", half + 1), "\n")
  w:close()
  helpers.wait_for(function() return rq.read_lines(dir .. "/rc")[1] ~= nil end, 60)
  return rq.read_lines(dir .. "/rc")[1], rq.read_lines(dir .. "/out"), table.concat(rq.read_lines(dir .. "/err"), "\n")
end

describe("adds through a Redis stall past the reply deadline #slow", function()
  local server, dir

  before_each(function()
    server = redis_server.start({ extra = "--enable-debug-command yes" })
    dir = helpers.tmpdir()
  end)

  after_each(function()
    rq.close_all()
    server:stop()
    os.execute("rm -rf " .. dir)
  end)

  it("moonjob add prints every line's id once, exits 0, and adds no job twice", function()
    local lines, N, HALF = {}, 20000, 10000
    for i = 1, N do lines[i] = ('{"n":%d}'):format(i) end
    local rc, printed, stderr = add_through_stall(server, dir, "s", lines, HALF)
    assert.equal("0", rc, stderr)
    assert.not_matches("unknown", stderr)
    assert.equal(N, #printed, stderr)
    local jobs, count = jobs_of(server, "s")
    assert.equal(N, count) -- one job per line: none twice
    local seen = {}
    for i, id in ipairs(printed) do
      assert.is_nil(seen[id], "id printed twice: " .. id)
      seen[id] = true
      assert.equal(lines[i], jobs[id], "line " .. i .. "'s id " .. id)
    end
  end)

  it("q:add answers with its job once Redis is back, added once", function()
    local q = assert(moonjob.queue(server.url, "api"))
    rq.close_after(q)
    assert(q:add({ n = 0 }))
    stall(server, STALL)
    local handles, errs = {}, {}
    for i = 1, 3 do -- three calls in flight on one connection, each lost
      loop.async(function() handles[i], errs[i] = q:add({ n = i }) end)
    end
    helpers.wait_for(function() return (handles[1] or errs[1]) and (handles[2] or errs[2]) and (handles[3] or errs[3]) end, 60)
    for i = 1, 3 do assert.truthy(handles[i], tostring(errs[i])) end
    local jobs, count = jobs_of(server, "api")
    assert.equal(4, count)
    for i = 1, 3 do
      assert.equal(('{"n":%d}'):format(i), jobs[handles[i].id])
      assert.equal("waiting", assert(q:get(handles[i])).state) -- its nonce is the job's
    end
  end)

  it("past the bound (--resolve 0) a line whose reply was lost is unknown, and a re-add with --dedupe adds nothing twice",
    function()
      local lines = {}
      for i = 1, 600 do lines[i] = ('{"n":%d}'):format(i) end
      helpers.write_file(dir .. "/all.ndjson", table.concat(lines, "\n") .. "\n")
      local rc, printed, stderr = add_through_stall(server, dir, "s", lines, 300, "--dedupe --resolve 0")
      assert.equal("1", rc, stderr)
      assert.matches("unknown whether it was added", stderr)
      assert.matches("running the same lines again with --dedupe is safe", stderr, 1, true)
      assert.not_matches("line %d+: not added", stderr)
      -- (128 lines per call: those of the calls answered before the stall)
      assert.is_true(#printed >= 300 - 128 and #printed < 600, "ids printed: " .. #printed .. "\n" .. stderr)
      -- the same lines again: every id comes back, and no job is there twice
      local out, err, status = helpers.sh(("%s scripts/moonjob add --redis %s --queue s --dedupe %s")
        :format(helpers.LUAJIT, server.url, dir .. "/all.ndjson"))
      assert.equal(0, status, err)
      local ids = {}
      for id in out:gmatch("[^\n]+") do ids[#ids + 1] = id end
      assert.equal(600, #ids)
      local again = {}
      for _, id in ipairs(ids) do assert.is_nil(again[id]); again[id] = true end
      for _, id in ipairs(printed) do assert.is_true(again[id], id) end
      for i = 1, 300 - 256 do assert.equal(printed[i], ids[i]) end -- answered before the stall
      local _, count = jobs_of(server, "s")
      assert.equal(600, count)
    end)

  it("the library answers a named call sent again from what it remembered, until its sheet is gone", function()
    local function add(data, sheet, call, forget)
      return server:cli("FCALL", "moonjob_add", "1", "mj:{lib}:", "", data, "0", "0", "1", "", "0", "0", "", "0",
        "0", "0", "n-" .. data, "", "", "", "", "", sheet, call, forget or "")
    end
    local q = assert(moonjob.queue(server.url, "lib")) -- loads the library
    rq.close_after(q)
    local first = add('{"a":1}', "p1.0", "1")
    assert.equal(first, add('{"a":1}', "p1.0", "1")) -- the same id, state, joined and nonce
    assert.equal(first, add('{"a":2}', "p1.0", "1")) -- by its name alone
    local _, count = jobs_of(server, "lib")
    assert.equal(1, count)
    local ttl = tonumber(server:cli("PTTL", "mj:{lib}:added:p1.0"))
    assert.is_true(ttl > 590000 and ttl <= 600000, tostring(ttl))
    assert.equal("2", server:cli("HLEN", "mj:{lib}:added:p1.0")) -- the call and the mark of its expiry
    assert.not_equal(first, add('{"a":3}', "p1.0", "2")) -- another call of the sheet
    -- a later call forgets the sheet; past it, the same call adds again
    add('{"a":4}', "p1.1", "1", "p1.0")
    assert.equal("0", server:cli("EXISTS", "mj:{lib}:added:p1.0"))
    assert.not_equal(first, add('{"a":1}', "p1.0", "1"))
    _, count = jobs_of(server, "lib")
    assert.equal(4, count)
    server:cli("SET", "mj:{lib}:added:bad", "x")
    assert.matches("EINPUT moonjob_add: mj:{lib}:added:bad is not a hash", add('{"a":5}', "bad", "1"), 1, true)
    assert.matches("SHEET needs CALL", add('{"a":5}', "p1.2", ""), 1, true)
    assert.equal(4, select(2, jobs_of(server, "lib")))
    -- obliterate finds every sheet (p1.0 was made again after it was forgotten)
    assert.equal("p1.1\np1.0", server:cli("ZRANGE", "mj:{lib}:sheets", "0", "-1"))
    server:cli("DEL", "mj:{lib}:added:bad") -- not a sheet: none of moonjob's
    assert(q:obliterate({ force = true }))
    assert.equal("", server:cli("KEYS", "mj:{lib}:added:*"))
    assert.equal("0", server:cli("EXISTS", "mj:{lib}:sheets"))
  end)

  it("refuse a resolve out of range", function()
    assert.has_error(function() moonjob.queue(server.url, "x", { resolve = 301 }) end,
      "moonjob.queue(): option 'resolve' must be a number of seconds from 0 to 300")
    local _, err, status = helpers.sh(("%s scripts/moonjob add --redis %s --queue x --resolve -1 </dev/null")
      :format(helpers.LUAJIT, server.url))
    assert.equal(2, status)
    assert.matches("--resolve needs a number of seconds from 0 to 300", err, 1, true)
  end)

  it("q:add with resolve = 0 says the job may or may not have been added", function()
    local q = assert(moonjob.queue(server.url, "api", { resolve = 0 }))
    rq.close_after(q)
    stall(server, STALL)
    local job, err = q:add({ n = 1 })
    assert.is_nil(job)
    assert.equal("EREDIS", err.code)
    assert.matches("unknown whether the job was added", err.message)
  end)
end)
