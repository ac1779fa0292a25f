-- Schedules on a real Redis: slots fired by fetch with the server's clock,
-- each one job however many workers run, restart, or have a clock far off;
-- catch_up, limit, stop, re-declaring, the CLI, and bad input that changes
-- nothing.
local helpers = require "helpers"
local json = require "moonjob.codec.json"
local rq = require "redis_queue"

local LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"

-- A `moonjob worker` whose clock (wall and monotonic) is `offset` off
-- (libfaketime: FAKETIME="+400d"); -> pid, stderr path. Under the
-- sanitizers it runs the plain build (make sanitize builds it first):
-- libfaketime and ASan's runtime in one process hang at start.
local function start_skewed_worker(queue, offset)
  local log = os.tmpname()
  local luajit = ('env LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="build/?.so;;" LD_PRELOAD=%s luajit')
    :format(LIBFAKETIME)
  if not helpers.SANITIZED then luajit = helpers.LUAJIT:gsub("luajit$", "LD_PRELOAD=" .. LIBFAKETIME .. " luajit") end
  assert(io.open("build/moonjob/core.so"), "the plain build is missing: make all")
  local cmd = ("FAKETIME=%s %s scripts/moonjob worker %s --redis %s --queue %s 2>%s >/dev/null & echo $!")
    :format(offset, luajit, rq.PROCESSOR, rq.server().url, queue, log)
  local pid = assert(tonumber(helpers.first_line(cmd)))
  rq.close_after({ close = function() os.execute(("kill -KILL %d 2>/dev/null"):format(pid)) end })
  return pid, log
end

local connected = rq.worker_connected

-- Sleeps until the server's clock (this machine's: same host) is `ms` past
-- a whole second: kills then fall between two slots of an every-1 s schedule.
local function sleep_to_mid_second(ms)
  local now = helpers.wall_ms()
  local wait = (ms - now % 1000) % 1000
  helpers.sleep(wait / 1000)
end

-- The runs logged (the fixture's "<id> <attempt> <pid> [<time>]" lines).
local function runs(path)
  local out = {}
  for _, line in ipairs(rq.read_lines(path)) do
    local id, attempt, pid, t = line:match("^(%S+) (%d+) (%d+) ?(%d*)$")
    out[#out + 1] = { id = id, attempt = tonumber(attempt), pid = tonumber(pid), time = tonumber(t) }
  end
  return out
end

-- Each slot ran once, slots one second apart: -> the slot times.
local function assert_each_slot_once(list, schedule_id)
  local seen, slots = {}, {}
  for _, r in ipairs(list) do
    assert.is_nil(seen[r.id], "slot run twice: " .. r.id)
    seen[r.id] = true
    assert.equal(1, r.attempt, r.id)
    local sid, ms = r.id:match("^s:(.-):(%d+)$")
    assert.equal(schedule_id, sid)
    slots[#slots + 1] = tonumber(ms)
  end
  table.sort(slots)
  for i = 2, #slots do assert.equal(1000, slots[i] - slots[i - 1], "slots not one second apart") end
  return slots
end

-- Waits until the queue holds nothing waiting or running.
local function settled(q)
  assert(rq.wait_for(function()
    local c = q:counts()
    return c.waiting == 0 and c.active == 0 and c.delayed == 0
  end, 30), "the queue's jobs did not finish")
end

local function server_ms(q)
  local t = assert(q.client:call_wait({ "TIME" }))
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local poll = rq.poll

rq.describe(function()
  describe("a schedule", function()
    it("every second with 3 workers for 5.5 s makes 5 or 6 jobs, each slot once", function()
      local name, log = rq.new_queue(), os.tmpname()
      local q = rq.new_producer(name)
      local logs = {}
      for i = 1, 3 do
        local _, l = rq.start_worker(name)
        logs[i] = l
      end
      for _, l in ipairs(logs) do assert(connected(l), "a worker did not connect") end
      local s = assert(q:schedule("tick", { every = 1 }, { log = log }))
      assert.equal("created", s.state)
      assert.equal(0, s.next % 1000)
      helpers.sleep(5.5)
      assert(q:unschedule("tick"))
      settled(q)
      local list = runs(log)
      assert_each_slot_once(list, "tick")
      assert.is_true(#list == 5 or #list == 6, "runs: " .. #list)
      local c = q:counts()
      assert.equal(#list, c.completed)
    end)

    it("fires each slot once while workers restart and one worker's clock is 400 days off", function()
      local name, log = rq.new_queue(), os.tmpname()
      local q = rq.new_producer(name)
      local skewed, skewed_log = start_skewed_worker(name, "+400d")
      assert(connected(skewed_log), "the skewed worker did not connect")
      assert(q:schedule("tick", { every = 1 }, { log = log, clock = true }))
      local started = helpers.wall_ms()
      sleep_to_mid_second(500)
      helpers.sleep(1) -- the skewed worker alone fires one or two slots
      local w2 = rq.start_worker(name)
      local w3 = rq.start_worker(name)
      sleep_to_mid_second(500)
      rq.stop_worker(skewed, "KILL") -- between two slots, while w2 and w3 run
      rq.start_worker(name)
      sleep_to_mid_second(500)
      rq.stop_worker(w2, "TERM")
      helpers.sleep(math.max(0, (started + 5500 - helpers.wall_ms()) / 1000))
      assert(q:unschedule("tick"))
      settled(q)
      local list = runs(log)
      assert_each_slot_once(list, "tick")
      assert.is_true(#list >= 5 and #list <= 7, "runs: " .. #list) -- the restarts took their own time
      local skewed_runs = 0
      for _, r in ipairs(list) do
        if r.pid and r.time > os.time() + 300 * 86400 then skewed_runs = skewed_runs + 1 end
      end
      assert.is_true(skewed_runs >= 1, "the skewed worker ran no slot")
      assert.is_true(helpers.running(w3))
    end)

    it("fires its latest slot when a fetch comes late, whatever catch_up says", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      assert(q:schedule("none", { every = 1, catch_up = "none" }, { n = 1 }))
      assert(q:schedule("one", { every = 1 }, { n = 2 }))
      helpers.sleep(2.6) -- no fetch: two or three slots of each fall due
      local before = server_ms(q)
      poll(q)
      local jobs = assert(q:jobs("waiting"))
      assert.equal(2, #jobs) -- one per schedule: the latest slot, on time
      for _, s in ipairs(assert(q:schedules())) do
        assert.equal(1, s.runs)
        assert.is_true(s.last > before - 1000 and s.last <= before + 1000, "the latest slot fired")
        assert.is_true(s.next > s.last)
        assert.is_nil(s.note)
      end
    end)

    it("skips slots missed for long with catch_up none, and makes one job for them with one", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      local now = server_ms(q)
      local start = math.floor(now / 1000) - 1800 -- hourly slots from half an hour ago
      for _, mode in ipairs({ "none", "one" }) do
        assert(q:schedule(mode, { every = 3600, start = start, catch_up = mode }, { mode = mode }))
        -- as if no worker had run since that slot: it is the next, half an hour late
        q.client:call_wait({ "HSET", q.prefix .. "s:" .. mode, "next", ("%.0f"):format(start * 1000) })
        q.client:call_wait({ "ZADD", q.prefix .. "schedules", ("%.0f"):format(start * 1000), mode })
      end
      poll(q)
      local jobs = assert(q:jobs("waiting"))
      assert.equal(1, #jobs)
      assert.equal("s:one:" .. ("%.0f"):format(start * 1000), jobs[1].id)
      local by_id = {}
      for _, s in ipairs(assert(q:schedules())) do by_id[s.id] = s end
      assert.matches("missed", by_id.none.note)
      assert.equal(0, by_id.none.runs)
      assert.equal(1, by_id.one.runs)
      for _, s in pairs(by_id) do assert.equal((start + 3600) * 1000, s.next) end
    end)

    it("ends at its limit and at its stop, and says so", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      local now = server_ms(q)
      assert(q:schedule("two", { every = 1, limit = 2 }))
      assert(q:schedule("stop", { every = 1, stop = (now + 1500) / 1000 }))
      for _ = 1, 4 do
        helpers.sleep(1)
        poll(q)
      end
      local by_id = {}
      for _, s in ipairs(assert(q:schedules())) do by_id[s.id] = s end
      assert.equal(2, by_id.two.runs)
      assert.is_true(by_id.two.ended)
      assert.matches("limit", by_id.two.note)
      assert.is_true(by_id.stop.ended)
      assert.is_true(by_id.stop.runs >= 1 and by_id.stop.runs <= 2)
      assert.matches("stop", by_id.stop.note)
      local c = q:counts()
      assert.equal(2 + by_id.stop.runs, c.waiting)
      -- an ended schedule wakes no worker
      assert.equal(-1, poll(q)[1])
    end)

    it("is unchanged when declared again, and takes a change from now", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      local first = assert(q:schedule("s", { every = 60 }, { a = 1 }, { attempts = 3 }))
      local again = assert(q:schedule("s", { every = 60 }, { a = 1 }, { attempts = 3 }))
      assert.same({ id = "s", state = "unchanged", next = first.next }, again)
      local changed = assert(q:schedule("s", { every = 3600 }, { a = 2 }))
      assert.equal("updated", changed.state)
      assert.equal(0, changed.next % 3600000)
      local list = assert(q:schedules())
      assert.equal(1, #list)
      assert.same({ a = 2 }, list[1].data)
      assert.equal(3600, list[1].every)
    end)

    it("starts at its start, and wakes an idle worker when due", function()
      local name, log = rq.new_queue(), os.tmpname()
      local q = rq.new_producer(name)
      local now = server_ms(q)
      local start = math.floor(now / 1000) + 2.25 -- between two whole seconds
      local s = assert(q:schedule("later", { every = 7, start = start, limit = 1 }, { log = log }))
      assert.equal(start * 1000, s.next)
      local c = poll(q)
      assert.is_true(c[1] > 0 and c[1] <= 2250 + 1000, "fetch says when the schedule is due")
      local _, wlog = rq.start_worker(name)
      assert(connected(wlog))
      assert(rq.wait_for(function() return #rq.read_lines(log) == 1 end, 20), "the slot did not run")
      assert.equal("s:later:" .. ("%.0f"):format(start * 1000), runs(log)[1].id)
    end)

    it("fires on a paused queue (its jobs wait), and obliterate removes it", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      assert(q:pause())
      assert(q:schedule("p", { every = 1 }))
      helpers.sleep(1.1)
      assert.equal(-2, poll(q)[1]) -- paused
      assert.equal(1, q:counts().waiting)
      assert.equal(2, (q:obliterate()))
      assert.same({}, assert(q:schedules()))
      assert.equal(0, q.client:call_wait({ "EXISTS", q.prefix .. "s:p", q.prefix .. "schedules" }))
    end)

    it("refuses bad input with a clear error and changes nothing", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      local function raises(pattern, ...)
        local ok, err = pcall(q.schedule, q, ...)
        assert.is_false(ok)
        assert.matches(pattern, err)
      end
      assert(q:schedule("kept", { every = 60 }, { n = 1 }))
      local kept = assert(q:schedules())
      raises("give one of cron", "x", {})
      raises("give one of cron", "x", { every = 1, cron = "* * * * *" })
      raises("option 'every' must be a number of seconds from 1", "x", { every = 0 })
      raises("unknown option 'group'", "x", { every = 5, group = "a" })
      raises("option 'tz': time zone 'Mars/Base' is not in the tz database", "x", { every = 5, tz = "Mars/Base" })
      raises("option 'catch_up' must be", "x", { every = 5, catch_up = "all" })
      raises("option 'limit' must be a whole number", "x", { every = 5, limit = -1 })
      raises("option 'start' must be a time", "x", { every = 5, start = "tomorrow" })
      raises("options 'id', 'dedupe' and 'debounce' cannot be given", "x", { every = 5 }, nil, { id = "y" })
      raises("queue:schedule%(%): option 'priority' must be a finite number", "x", { every = 5 }, nil,
        { priority = 0 / 0 })
      raises("option 'stop' %(1970%-01%-01T00:16:40Z%) comes before 'start'", "x", { every = 5, start = 2000, stop = 1000 })
      local s, err
      -- a key of another type where the schedule would go
      q.client:call_wait({ "SET", q.prefix .. "s:taken", "x" })
      s, err = q:schedule("taken", { every = 5 })
      assert.is_nil(s)
      assert.matches("not a schedule hash", err.message)
      s, err = q:schedule("kept", { cron = "0 0 * * * *" }, { n = 2 })
      assert.is_nil(s)
      assert.matches("has 6 fields", err.message)
      assert.same(kept, assert(q:schedules())) -- the one there is untouched
      assert.equal(0, q.client:call_wait({ "EXISTS", q.prefix .. "s:x" }))
      local ok, missing = q:unschedule("x")
      assert.is_nil(ok)
      assert.equal("ENOTFOUND", missing.code)
    end)

    it("whose hash another client spoiled ends, saying why, and fetch goes on", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      assert(q:schedule("every", { every = 1 }))
      assert(q:schedule("job", { every = 1 }))
      assert(q:schedule("list", { every = 1 }))
      q.client:call_wait({ "HSET", q.prefix .. "s:every", "every", "soon" })
      q.client:call_wait({ "HSET", q.prefix .. "s:job", "job", "not json" })
      q.client:call_wait({ "HSET", q.prefix .. "s:list", "job", "[1]" })
      assert(q:add({ n = 1 }))
      helpers.sleep(1.1)
      local reply = assert(q.client:call_wait({ "FCALL", "moonjob_fetch", 1, q.prefix, "spec", 5, 30000, "",
        86400000, 0 }))
      assert.equal(2, #reply) -- the job added by hand
      local list = assert(q:schedules())
      assert.equal(3, #list)
      for _, sc in ipairs(list) do
        assert.is_true(sc.ended, sc.id)
        assert.matches(sc.id == "every" and "every" or "template", sc.note)
      end
      -- a schedules key of another type fires nothing and stops no fetch
      q.client:call_wait({ "DEL", q.prefix .. "schedules" })
      q.client:call_wait({ "SET", q.prefix .. "schedules", "x" })
      assert(q:add({ n = 2 }))
      reply = assert(q.client:call_wait({ "FCALL", "moonjob_fetch", 1, q.prefix, "spec", 5, 30000, "",
        86400000, 0 }))
      assert.equal(2, #reply)
    end)
  end)

  describe("moonjob schedule", function()
    local moonjob = rq.moonjob

    it("adds, lists and removes schedules; a bad one is a usage error", function()
      local name = rq.new_queue()
      local out, err, status = moonjob(("schedule add --queue %s nightly --every 86400 --start "
        .. "2030-01-01T03:00Z --limit 5 --data '{\"kind\":\"report\"}' --attempts 2"):format(name))
      assert.equal(0, status, err)
      local row = json.decode(out)
      assert.same({ id = "nightly", action = "schedule", state = "created", next = 1893466800000 }, row)
      out, err, status = moonjob("schedule list --queue " .. name)
      assert.equal(0, status, err)
      local s = json.decode(out)
      assert.equal("nightly", s.id)
      assert.same({ kind = "report" }, s.data)
      assert.equal(5, s.limit)
      out, err, status = moonjob("schedule add --queue " .. name .. " x --every 0.5")
      assert.equal(2, status)
      assert.matches("%-%-every needs a number of seconds from 1", err)
      out, err, status = moonjob("schedule add --queue " .. name .. " x --every 5 --start soon")
      assert.equal(2, status)
      assert.matches("%-%-start needs a time", err)
      out, err, status = moonjob("schedule add --queue " .. name .. " x --every 5 --data '{bad'")
      assert.equal(2, status)
      assert.matches("%-%-data needs JSON", err)
      out, err, status = moonjob("schedule remove --queue " .. name .. " nightly ghost")
      assert.equal(1, status)
      assert.same({ id = "nightly", action = "unschedule" }, json.decode(out))
      assert.matches("schedule remove ghost: ENOTFOUND", err)
      out, err, status = moonjob("schedule list --queue " .. name)
      assert.equal(0, status, err)
      assert.equal("", out)
    end)
  end)
end)
