-- Schedules in a zone of the tz database on a real Redis: the producer
-- reads the zone (moonjob.tz) and hands Redis its offsets ahead; the
-- library's slots (FCALL moonjob_cron with those offsets, and a schedule's
-- next slot) keep 03:00 local through both changes of a year, checked
-- against `date` under TZ=Europe/Berlin (the C library's reading of the
-- same files); the rules for times a change skips or repeats; fixed
-- offsets as before; refreshing the offsets; bad zones; and the CLI's
-- usage errors (a bad cron field, a stop already passed).
local helpers = require "helpers"
local json = require "moonjob.codec.json"
local rq = require "redis_queue"
local schedules = require "moonjob.redis.schedules"
local tz = require "moonjob.tz"

local BERLIN = "Europe/Berlin"

-- Epoch seconds of a UTC date "YYYY-MM-DD HH:MM".
local function utc(text)
  local out = helpers.first_line(("TZ=UTC date -d '%s' +%%s"):format(text))
  return assert(tonumber(out), text)
end

-- The local times of epoch ms in zone, as `date` gives them: { "YYYY-MM-DD HH:MM" ... }.
local function local_times(zone, list)
  local path = os.tmpname()
  local f = assert(io.open(path, "w"))
  for _, ms in ipairs(list) do f:write(("@%d\n"):format(ms / 1000)) end
  f:close()
  local p = assert(io.popen(("TZ=%s date -f %s '+%%Y-%%m-%%d %%H:%%M %%Z'"):format(zone, path)))
  local out = {}
  for line in p:lines() do out[#out + 1] = line end
  p:close()
  os.remove(path)
  return out
end

-- The library's slots of cron in zone from `from` (epoch s): count of them
-- (FCALL_RO moonjob_cron, 100 at a time), with the zone's shifts read here.
local function slots(q, cron, zone, from, count)
  local shifts = schedules.shifts_text(assert(tz.zone(zone)), from)
  local out, after = {}, from * 1000
  while #out < count do
    local reply = assert(q.client:call_wait({ "FCALL_RO", "moonjob_cron", 1, q.prefix, cron,
      ("%.0f"):format(after), shifts, tostring(math.min(100, count - #out)) }))
    assert(#reply > 0, "no slot")
    for _, ms in ipairs(reply) do out[#out + 1] = ms end
    after = out[#out]
  end
  return out
end

local function day_after(date) -- "YYYY-MM-DD" -> the next day
  return helpers.first_line(("TZ=UTC date -d '%s + 1 day' +%%Y-%%m-%%d"):format(date))
end

rq.describe(function()
  describe("a schedule in a zone of the tz database", function()
    it("runs a 0 3 * * * job in Europe/Berlin once a local day at 03:00 through the changes of 2026 and 2027",
      function()
      local q = rq.new_producer(rq.new_queue())
      local from = utc("2026-01-01 00:00")
      local list = slots(q, "0 3 * * *", BERLIN, from, 730)
      local times = local_times(BERLIN, list)
      local date = "2026-01-01"
      local zones = {}
      for i, text in ipairs(times) do
        local d, hm, abbr = text:match("^(%S+) (%S+) (%S+)$")
        assert.equal(date .. " 03:00", d .. " " .. hm, "slot " .. i)
        zones[abbr] = (zones[abbr] or 0) + 1
        date = day_after(date)
      end
      assert.equal("2027-12-31", times[#times]:sub(1, 10))
      assert.is_true(zones.CET > 300 and zones.CEST > 400, "both offsets crossed")
    end)

    it("runs a time a change skips once, at the change, and a time it repeats once, the first time", function()
      local q = rq.new_producer(rq.new_queue())
      local spring = local_times(BERLIN, slots(q, "30 2 * * *", BERLIN, utc("2026-03-27 00:00"), 4))
      assert.same({ "2026-03-27 02:30 CET", "2026-03-28 02:30 CET", "2026-03-29 03:00 CEST",
        "2026-03-30 02:30 CEST" }, spring)
      local autumn = local_times(BERLIN, slots(q, "30 2 * * *", BERLIN, utc("2026-10-24 00:00"), 3))
      assert.same({ "2026-10-24 02:30 CEST", "2026-10-25 02:30 CEST", "2026-10-26 02:30 CET" }, autumn)
      -- asked inside the repeated hour, after its first 02:30 (a slot fired late, offsets
      -- refreshed, the schedule declared again): not the second 02:30, the next day's
      for _, from in ipairs({ "2026-10-25 01:10", "2026-10-25 01:29", "2026-10-25 00:31" }) do
        assert.same({ "2026-10-26 02:30 CET" }, local_times(BERLIN, slots(q, "30 2 * * *", BERLIN, utc(from), 1)),
          from)
      end
      -- every 15 minutes in the skipped hour: one run at the change, then on
      local gap = local_times(BERLIN, slots(q, "*/15 2 * * *", BERLIN, utc("2026-03-29 00:00"), 2))
      assert.same({ "2026-03-29 03:00 CEST", "2026-03-30 02:00 CEST" }, gap)
      -- an hourly job stays hourly through the repeated hour (Vixie cron's wildcard jobs)
      local hourly = local_times(BERLIN, slots(q, "0 * * * *", BERLIN, utc("2026-10-24 23:30"), 4))
      assert.same({ "2026-10-25 02:00 CEST", "2026-10-25 02:00 CET", "2026-10-25 03:00 CET",
        "2026-10-25 04:00 CET" }, hourly)
      -- a zone south of the equator, whose summer spans the new year
      local sydney = local_times("Australia/Sydney", slots(q, "0 3 * * *", "Australia/Sydney",
        utc("2026-12-01 00:00"), 200))
      for _, text in ipairs(sydney) do assert.matches("^%S+ 03:00 ", text) end
    end)

    it("keeps 03:00 Berlin time in q:schedule and moonjob schedule --tz, and lists the zone", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      local s = assert(q:schedule("night", { cron = "0 3 * * *", tz = BERLIN }))
      assert.equal("created", s.state)
      assert.matches("^%S+ 03:00 ", local_times(BERLIN, { s.next })[1])
      local fields = q.client:call_wait({ "HMGET", q.prefix .. "s:night", "zone", "shifts" })
      assert.equal(BERLIN, fields[1])
      local known = tonumber(fields[2]:match("^%d+"))
      assert.is_true(known > os.time() + 2 * 365 * 86400, "offsets handed for years ahead")
      assert.same("unchanged", assert(q:schedule("night", { cron = "0 3 * * *", tz = BERLIN })).state)
      -- declared again after a change of clocks (the zone's offset now differs): still unchanged
      local shifts_text = schedules.shifts_text
      schedules.shifts_text = function(...)
        local text, offset = shifts_text(...)
        return text, offset == 60 and 120 or 60
      end
      local ok, again = pcall(q.schedule, q, "night", { cron = "0 3 * * *", tz = BERLIN })
      schedules.shifts_text = shifts_text
      assert.is_true(ok, again)
      assert.same({ id = "night", state = "unchanged", next = s.next }, again)
      local out, err, status = rq.moonjob(("schedule add --queue %s cli --cron '30 7 * * MON' --tz %s")
        :format(name, BERLIN))
      assert.equal(0, status, err)
      assert.matches("^%S+ 07:30 ", local_times(BERLIN, { json.decode(out).next })[1])
      local list = assert(q:schedules())
      for _, sc in ipairs(list) do
        assert.equal(BERLIN, sc.tz)
        assert.is_true(sc.tz_known > os.time() * 1000)
      end
      out, err, status = rq.moonjob("schedule list --queue " .. name)
      assert.equal(0, status, err)
      for line in out:gmatch("[^\n]+") do assert.equal(BERLIN, json.decode(line).tz) end
      -- the operator's preview: the next slots as Redis computes them, each 03:00 Berlin time
      out, err, status = rq.moonjob("schedule next --queue " .. name .. " night --limit 100")
      assert.equal(0, status, err)
      local preview = {}
      for line in out:gmatch("[^\n]+") do preview[#preview + 1] = json.decode(line).slot end
      assert.equal(100, #preview)
      assert.equal(s.next, preview[1])
      for _, text in ipairs(local_times(BERLIN, preview)) do assert.matches("^%S+ 03:00 ", text) end
    end)

    it("reads local as this machine's zone: TZ's name, its POSIX rule, or a fixed offset when it has no change",
      function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      local function add(id, zone)
        local out, err, status = helpers.sh(("TZ='%s' %s scripts/moonjob schedule add --queue %s %s --cron '0 3 * * *' "
          .. "--tz local --redis %s"):format(zone, helpers.LUAJIT, name, id, rq.server().url))
        assert.equal(0, status, err)
        local f = q.client:call_wait({ "HMGET", q.prefix .. "s:" .. id, "zone", "offset" })
        return f[1], f[2], json.decode(out).next
      end
      local zone, _, nxt = add("named", BERLIN)
      assert.equal(BERLIN, zone)
      assert.matches("^%S+ 03:00 ", local_times(BERLIN, { nxt })[1])
      zone, _, nxt = add("rule", "CET-1CEST,M3.5.0,M10.5.0/3")
      assert.equal("local", zone)
      assert.matches("^%S+ 03:00 ", local_times(BERLIN, { nxt })[1])
      local offset
      zone, offset = add("utc", "UTC")
      assert.is_true(not zone or zone == "")
      assert.equal("0", offset)
      zone, offset = add("kolkata", "Asia/Kolkata")
      assert.is_true(not zone or zone == "")
      assert.equal("330", offset)
    end)

    it("keeps fixed offsets as before, and an every schedule takes no zone", function()
      local q = rq.new_producer(rq.new_queue())
      local s = assert(q:schedule("india", { cron = "0 9 * * *", tz = "+05:30" }))
      assert.equal(0, (s.next / 60000 + 330) % 1440 - 540)
      local f = q.client:call_wait({ "HMGET", q.prefix .. "s:india", "offset", "zone" })
      assert.equal("330", f[1])
      assert.is_true(not f[2] or f[2] == "", "no zone")
      assert(q:schedule("tick", { every = 60, tz = BERLIN }))
      assert.equal("", q.client:call_wait({ "HGET", q.prefix .. "s:tick", "zone" }))
      -- an older client's call (no zone arguments) is taken as ever
      local reply = assert(q.client:call_wait({ "FCALL", "moonjob_cron", 1, q.prefix, "0 0 * * *",
        tostring(utc("2026-07-01 00:00") * 1000), "120", "1" }))
      assert.equal(utc("2026-07-01 22:00") * 1000, reply[1])
    end)

    it("is refreshed by a worker when its offsets run low, and keeps the last one when they ran out", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      assert(q:schedule("night", { cron = "0 3 * * *", tz = BERLIN }))
      local key = q.prefix .. "s:night"
      -- offsets that ran out an hour ago, in winter time: the library keeps it and says so
      local stale = ("%d 60"):format(os.time() - 3600)
      assert.equal(1, q.client:call_wait({ "FCALL", "moonjob_schedule_shifts", 1, q.prefix, BERLIN, stale }))
      local sc = assert(q:schedules())[1]
      assert.matches("zone Europe/Berlin: its offsets are known until", sc.note)
      assert.equal(0, ((sc.next / 60000) + 60) % 1440 - 180) -- 03:00 at UTC+1
      -- a worker of the queue hands fresh ones
      local _, log = rq.start_worker(name)
      assert(rq.worker_connected(log))
      assert(rq.wait_for(function()
        local text = q.client:call_wait({ "HGET", key, "shifts" })
        return tonumber(text:match("^%d+")) > os.time() + 2 * 365 * 86400
      end, 20), "the worker did not refresh the zone's offsets")
      sc = assert(q:schedules())[1]
      assert.is_nil(sc.note)
      assert.matches("^%S+ 03:00 ", local_times(BERLIN, { sc.next })[1])
    end)

    it("refuses an unknown zone, a name outside the database, and bad shifts, naming them", function()
      local q = rq.new_producer(rq.new_queue())
      local function raises(pattern, zone)
        local ok, err = pcall(q.schedule, q, "x", { cron = "0 3 * * *", tz = zone })
        assert.is_false(ok)
        assert.matches(pattern, err)
      end
      raises("option 'tz': time zone 'Europe/Berln' is not in the tz database %(no file "
        .. "/usr/share/zoneinfo/Europe/Berln", "Europe/Berln")
      raises("time zone '../../etc/passwd' is not a zone name", "../../etc/passwd")
      raises("time zone '/etc/passwd' is not a zone name", "/etc/passwd")
      raises("option 'tz' must be", 5)
      local _, err = q.client:call_wait({ "FCALL_RO", "moonjob_cron", 1, q.prefix, "0 3 * * *", "0",
        "100 60 50 120 40 60", "1" })
      assert.matches("EINPUT moonjob_cron: SHIFTS' times must rise", err)
      local out, stderr, status = rq.moonjob(("schedule add --queue %s x --cron '0 3 * * *' --tz Mars/Olympus")
        :format(rq.new_queue()))
      assert.equal(2, status, out)
      assert.matches("time zone 'Mars/Olympus' is not in the tz database", stderr)
    end)
  end)

  describe("moonjob schedule add's usage errors", function()
    it("exits 2 for a cron field out of range, naming the field and no internal function", function()
      local name = rq.new_queue()
      local out, err, status = rq.moonjob(("schedule add --queue %s x --cron '61 * * * *'"):format(name))
      assert.equal(2, status, out .. err)
      assert.matches("cron field minute '61' is out of range 0%-59", err)
      assert.is_nil(err:find("moonjob_", 1, true), err)
    end)

    it("refuses a stop already passed (exit 2), but not the same definition declared again", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      local s, err = q:schedule("late", { every = 60, stop = os.time() - 60 })
      assert.is_nil(s)
      assert.equal("EINPUT", err.code)
      assert.matches("option 'stop' %(%d+%-%d+%-%d+T[%d:]+Z%) has passed: Redis's clock reads", err.message)
      assert.same({}, assert(q:schedules()))
      local out, stderr, status = rq.moonjob(("schedule add --queue %s late --every 60 --stop 2020-01-01T00:00Z")
        :format(name))
      assert.equal(2, status, out)
      assert.matches("option 'stop' (2020-01-01T00:00:00Z) has passed", stderr, 1, true)
      assert.is_nil(stderr:find("STOP_MS", 1, true), stderr)
      assert.is_nil(stderr:find("moonjob_", 1, true), stderr)
      assert.has_error(function() q:schedule("backwards", { every = 60, start = os.time() + 60, stop = os.time() + 30 }) end)
      _, stderr, status = rq.moonjob(("schedule add --queue %s backwards --every 60 --start 2031-01-02T00:00Z "
        .. "--stop 2031-01-01T00:00Z"):format(name))
      assert.equal(2, status)
      assert.matches("option 'stop' (2031-01-01T00:00:00Z) comes before 'start' (2031-01-02T00:00:00Z)", stderr, 1, true)
      -- declared while its stop was ahead, it may be declared again unchanged after
      local stop = os.time() + 2
      assert(q:schedule("soon", { every = 60, stop = stop }))
      assert(rq.wait_for(function() return os.time() > stop + 1 end, 10))
      assert.equal("unchanged", assert(q:schedule("soon", { every = 60, stop = stop })).state)
    end)
  end)
end)
