-- Cron expressions in Redis (FCALL moonjob_cron, lua/moonjob/redis/functions/cron.lua):
-- every form of the syntax, the day-of-month / day-of-week rule, the
-- calendar (leap years, month ends, year ends, offsets from UTC), every
-- refusal, and a cross-check of 2,000 random expressions against a
-- brute-force search written here (a minute at a time, its calendar checked
-- against os.date), through moonjob's own client on a real redis-server.
local rq = require "redis_queue"
local redis_client = require "moonjob.redis.client"

local PREFIX = "mj:{cron}:"
local client

local function is_leap(y) return y % 4 == 0 and (y % 100 ~= 0 or y % 400 == 0) end

local function days_in(y, m)
  if m == 2 then return is_leap(y) and 29 or 28 end
  return ({ 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31 })[m]
end

-- "YYYY-MM-DD HH:MM[:SS]" (UTC) -> ms since the epoch, by counting days.
local function ms_of(text)
  local y, m, d, h, mi, s = text:match("^(%d+)-(%d+)-(%d+) (%d+):(%d+):?(%d*)$")
  y, m, d = tonumber(y), tonumber(m), tonumber(d)
  local days = d - 1
  for year = 1970, y - 1 do days = days + (is_leap(year) and 366 or 365) end
  for month = 1, m - 1 do days = days + days_in(y, month) end
  return ((days * 24 + tonumber(h)) * 60 + tonumber(mi)) * 60000 + (tonumber(s) or 0) * 1000
end

local function text_of(ms) return os.date("!%Y-%m-%d %a %H:%M", ms / 1000) end

-- FCALL moonjob_cron -> the reply (a list of ms) or nil, the error's text.
local function fcall(cron, from, offset, count, command)
  local args = { command or "FCALL", "moonjob_cron", "1", PREFIX }
  for _, a in ipairs({ cron, from, offset, count }) do args[#args + 1] = tostring(a) end
  return client:call_wait(args)
end

-- The next runs as UTC texts with their weekday.
local function runs(cron, from, count, offset)
  local reply, err = fcall(cron, ms_of(from), offset or 0, count or 1)
  assert(reply, err)
  local out = {}
  for i, ms in ipairs(reply) do out[i] = text_of(ms) end
  return out
end

local function refused(cron, fragment, from, offset, count)
  local reply, err = fcall(cron, from or "", offset or 0, count or 1)
  assert.is_nil(reply, "accepted: " .. tostring(cron))
  assert.matches("^EINPUT moonjob_cron: ", err)
  assert.matches(fragment, err, 1, true)
end

-- The random expressions of the cross-check, built as sets and as text.
local FIELDS = {
  { low = 0, high = 59 }, { low = 0, high = 23 }, { low = 1, high = 31, likely = { 28, 29, 30, 31 } },
  { low = 1, high = 12, likely = { 2 }, names = { "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG",
    "SEP", "OCT", "NOV", "DEC" } },
  { low = 0, high = 7, names = { [0] = "SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT", "SUN" } },
}

local function random_value(f)
  if f.likely and math.random() < 0.4 then return f.likely[math.random(#f.likely)] end
  return math.random(f.low, f.high)
end

-- v as a number or (sometimes) a name in any case; SUN is 7 only ending a
-- range that starts after Sunday (MON-SUN), so 7 is named only there.
local function show(f, v, sun_is_seven)
  if not f.names or math.random() < 0.5 or (v == 7 and not sun_is_seven) then return tostring(v) end
  local name = f.names[v]
  if math.random() < 0.3 then name = name:lower() end
  return name
end

-- One item -> its text, marking its values in set.
local function random_item(f, set)
  local kind, first, last, step, text = math.random(5), nil, nil, 1, nil
  if kind == 1 then
    first = random_value(f)
    last, text = first, show(f, first)
  elseif kind <= 3 then
    first, last = random_value(f), random_value(f)
    if first > last then first, last = last, first end
    text = show(f, first) .. "-" .. show(f, last, first > 0)
  else
    first, last = random_value(f), f.high
    text = show(f, first)
  end
  if kind >= 3 then
    step = math.random(1, f.high - f.low)
    text = text .. "/" .. step
  end
  for v = first, last, step do set[v] = true end
  return text
end

local function random_field(f)
  local set, r = {}, math.random()
  if r < 0.4 then
    for v = f.low, f.high do set[v] = true end
    return "*", set
  elseif r < 0.5 then
    local step = math.random(1, f.high - f.low)
    for v = f.low, f.high, step do set[v] = true end
    return "*/" .. step, set
  end
  local items = {}
  for i = 1, math.random(3) do items[i] = random_item(f, set) end
  return table.concat(items, ","), set
end

-- -> text, sets (minute, hour, dom, month, dow 0-6), dom_star, dow_star
local function random_cron()
  local texts, sets = {}, {}
  for i, f in ipairs(FIELDS) do texts[i], sets[i] = random_field(f) end
  sets[5][0] = sets[5][0] or sets[5][7]
  return table.concat(texts, math.random() < 0.9 and " " or " \t "), sets,
    texts[3]:sub(1, 1) == "*", texts[5]:sub(1, 1) == "*"
end

-- A wall time's fields, from os.date (the C library's calendar).
local function wall_fields(wall_minute)
  local t = os.date("!*t", wall_minute * 60)
  return { t.year, t.month, t.day, t.hour, t.min, t.wday - 1 }
end

-- The first `want` wall minutes after `wall` (exclusive) within `limit`
-- minutes that match, a minute at a time; the calendar is stepped here and
-- checked against os.date at each new day.
local function brute_force(sets, dom_star, dow_star, wall, limit, want)
  local found = {}
  local t = wall_fields(wall + 1)
  local y, mo, d, h, mi, wd = t[1], t[2], t[3], t[4], t[5], t[6]
  for w = wall + 1, wall + limit do
    local day_ok
    if dom_star or dow_star then day_ok = sets[3][d] and sets[5][wd] else day_ok = sets[3][d] or sets[5][wd] end
    if day_ok and sets[4][mo] and sets[2][h] and sets[1][mi] then
      found[#found + 1] = w
      if #found == want then break end
    end
    mi = mi + 1
    if mi == 60 then mi, h = 0, h + 1 end
    if h == 24 then
      h, d, wd = 0, d + 1, (wd + 1) % 7
      if d > days_in(y, mo) then d, mo = 1, mo + 1 end
      if mo == 13 then mo, y = 1, y + 1 end
      local c = wall_fields(w + 1)
      assert(c[1] == y and c[2] == mo and c[3] == d and c[6] == wd, "the reference's calendar is wrong")
    end
  end
  return found
end

rq.describe(function()
  setup(function()
    client = assert(redis_client.new(rq.server().url))
    assert(client:wait_ready())
  end)
  teardown(function() if client then client:close() end end)

  describe("cron expressions (moonjob_cron)", function()
    it("reads numbers, ranges, steps, lists and names in any case; runs come strictly after FROM_MS", function()
      local from = "2025-01-01 00:00"
      assert.same({ "2025-01-01 Wed 00:15", "2025-01-01 Wed 00:30", "2025-01-01 Wed 00:45" },
        runs("*/15 * * * *", from, 3))
      assert.same({ "2025-01-01 Wed 01:07", "2025-01-01 Wed 02:07" }, runs("7 * * * *", "2025-01-01 00:07", 2))
      assert.same({ "2025-01-01 Wed 00:01" }, runs("* * * * *", "2025-01-01 00:00:59"))
      assert.same({ "2025-01-01 Wed 09:00", "2025-01-01 Wed 10:00", "2025-01-01 Wed 11:00", "2025-01-02 Thu 09:00" },
        runs("0 9-11 * * *", from, 4))
      assert.same({ "2025-01-01 Wed 00:10", "2025-01-01 Wed 00:20", "2025-01-01 Wed 00:30", "2025-01-01 Wed 01:10" },
        runs("10-30/10 * * * *", from, 4))
      assert.same({ "2025-01-01 Wed 00:50", "2025-01-01 Wed 00:54", "2025-01-01 Wed 00:58", "2025-01-01 Wed 01:50" },
        runs("50/4 * * * *", from, 4)) -- a/s: from a to the field's end
      assert.same({ "2025-01-01 Wed 12:00", "2025-01-01 Wed 12:20", "2025-01-02 Thu 00:00" },
        runs("0,20 */12 * * *", "2025-01-01 11:00", 3))
      assert.same({ "2025-04-15 Tue 00:00", "2025-05-01 Thu 00:00", "2025-05-15 Thu 00:00", "2025-05-31 Sat 00:00" },
        runs("0 0 1,15,31 * *", "2025-04-01 00:00", 4))
      assert.same({ "2025-07-01 Tue 12:00", "2025-07-02 Wed 12:00" }, runs("0 12 * JAN,jul *", "2025-01-31 12:00", 2))
      assert.same({ "2025-03-01 Sat 12:00", "2025-04-01 Tue 12:00", "2025-05-01 Thu 12:00", "2026-03-01 Sun 12:00" },
        runs("0 12 1 mar-May *", from, 4))
      assert.same({ "2025-01-03 Fri 00:00", "2025-01-06 Mon 00:00" }, runs("0 0 * * mon-FRI", "2025-01-02 00:00", 2))
      assert.same({ "2025-01-03 Fri 00:00", "2025-01-04 Sat 00:00", "2025-01-05 Sun 00:00", "2025-01-10 Fri 00:00" },
        runs("0 0 * * 5-7", "2025-01-02 00:00", 4))
      assert.same({ "2025-01-04 Sat 00:00", "2025-01-05 Sun 00:00", "2025-01-11 Sat 00:00" },
        runs("0 0 * * SAT-SUN", from, 3)) -- Sunday ending a range is 7
      assert.same({ "2025-01-05 Sun 00:00", "2025-01-12 Sun 00:00" }, runs("0 0 * * SUN-SUN", from, 2))
      assert.same({ "2025-01-05 Sun 00:00", "2025-01-12 Sun 00:00" }, runs("0 0 * * 0-sun", from, 2))
      assert.same({ "2025-01-01 Wed 00:00", "2025-01-02 Thu 00:00" }, runs("0 0 * * MON-SUN", "2024-12-31 00:00", 2))
      assert.same({ "2025-01-02 Thu 00:00", "2025-01-04 Sat 00:00", "2025-01-07 Tue 00:00" },
        runs("0 0 * * tue/2", from, 3)) -- from Tuesday to the field's end: TUE, THU, SAT
      assert.same({ "2025-04-01 Tue 00:00", "2025-07-01 Tue 00:00", "2025-10-01 Wed 00:00", "2026-01-01 Thu 00:00" },
        runs("0 0 1 */3 *", from, 4))
      assert.same({ "2025-01-01 Wed 00:00", "2026-01-01 Thu 00:00" }, runs(" 0\t0  1 1 * ", "2024-12-31 12:00", 2))
    end)

    it("takes 7 and SUN for Sunday, as 0", function()
      local sundays = { "2025-01-05 Sun 00:00", "2025-01-12 Sun 00:00" }
      for _, cron in ipairs({ "0 0 * * 0", "0 0 * * 7", "0 0 * * SUN", "0 0 * * sun", "0 0 * * Sun" }) do
        assert.same(sundays, runs(cron, "2025-01-01 00:00", 2), cron)
      end
    end)

    it("takes the macros, in any case", function()
      local from = "2025-01-01 00:00" -- a Wednesday
      local want = {
        ["@yearly"] = "2026-01-01 Thu 00:00", ["@annually"] = "2026-01-01 Thu 00:00",
        ["@monthly"] = "2025-02-01 Sat 00:00", ["@weekly"] = "2025-01-05 Sun 00:00",
        ["@daily"] = "2025-01-02 Thu 00:00", ["@midnight"] = "2025-01-02 Thu 00:00",
        ["@hourly"] = "2025-01-01 Wed 01:00", ["@DAILY"] = "2025-01-02 Thu 00:00",
        [" @Weekly "] = "2025-01-05 Sun 00:00",
      }
      for cron, first in pairs(want) do assert.same({ first }, runs(cron, from), cron) end
    end)

    it("runs on a day that matches day-of-month OR day-of-week when both are restricted, AND otherwise", function()
      local from = "2025-01-01 00:00"
      assert.same({ "2025-01-03 Fri 00:00", "2025-01-10 Fri 00:00", "2025-01-13 Mon 00:00", "2025-01-17 Fri 00:00" },
        runs("0 0 13 * FRI", from, 4))
      assert.same({ "2025-01-13 Mon 00:00", "2025-02-13 Thu 00:00" }, runs("0 0 13 * *", from, 2))
      assert.same({ "2025-01-03 Fri 00:00", "2025-01-10 Fri 00:00" }, runs("0 0 * * FRI", from, 2))
      -- day-of-month starting with '*' (a step): both must match, Vixie cron's rule
      assert.same({ "2025-01-13 Mon 00:00", "2025-01-27 Mon 00:00", "2025-02-03 Mon 00:00" },
        runs("0 0 */2 * MON", from, 3))
      -- day-of-week starting with '*': the first Sunday of each month
      assert.same({ "2025-01-05 Sun 00:00", "2025-02-02 Sun 00:00", "2025-03-02 Sun 00:00" },
        runs("0 0 1-7 * */7", from, 3))
      -- both restricted: 30 February never comes, but the Mondays of February do
      assert.same({ "2025-02-03 Mon 00:00", "2025-02-10 Mon 00:00" }, runs("0 0 30 2 MON", from, 2))
    end)

    it("knows leap years, month ends and year ends", function()
      assert.same({ "2028-02-29 Tue 00:00", "2032-02-29 Sun 00:00" }, runs("0 0 29 2 *", "2025-01-01 00:00", 2))
      assert.same({ "2104-02-29 Fri 00:00" }, runs("0 0 29 2 *", "2096-03-01 00:00")) -- 2100 is no leap year
      assert.same({ "2400-02-29 Tue 00:00" }, runs("0 0 29 2 *", "2399-03-01 00:00")) -- 2400 is one
      assert.same({ "2025-02-28 Fri 00:00", "2026-02-28 Sat 00:00", "2027-02-28 Sun 00:00", "2028-02-28 Mon 00:00",
        "2028-02-29 Tue 00:00" }, runs("0 0 28-31 2 *", "2025-01-01 00:00", 5))
      assert.same({ "2025-01-31 Fri 00:00", "2025-03-31 Mon 00:00", "2025-05-31 Sat 00:00", "2025-07-31 Thu 00:00",
        "2025-08-31 Sun 00:00", "2025-10-31 Fri 00:00", "2025-12-31 Wed 00:00", "2026-01-31 Sat 00:00" },
        runs("0 0 31 * *", "2025-01-01 00:00", 8))
      assert.same({ "2025-04-30 Wed 00:00", "2025-05-30 Fri 00:00", "2025-06-30 Mon 00:00", "2026-04-30 Thu 00:00" },
        runs("0 0 30 4-6 *", "2025-01-01 00:00", 4))
      assert.same({ "2026-01-01 Thu 00:00", "2026-01-01 Thu 00:30" }, runs("*/30 * * * *", "2025-12-31 23:45", 2))
      assert.same({ "2026-12-31 Thu 23:59" }, runs("59 23 31 12 *", "2025-12-31 23:59"))
      assert.same({ "2032-02-29 Sun 00:00", "2060-02-29 Sun 00:00", "2088-02-29 Sun 00:00", "2128-02-29 Sun 00:00" },
        runs("0 0 29 2 */7", "2025-01-01 00:00", 4)) -- the longest gap there is: 40 years
      assert.same({ "1970-01-01 Thu 00:01" }, runs("* * * * *", "1970-01-01 00:00"))
    end)

    it("matches the wall time of a zone OFFSET_MIN minutes from UTC", function()
      local from = "2025-01-01 00:00"
      assert.same({ "2025-01-01 Wed 03:30" }, runs("0 9 * * *", from, 1, 330)) -- 09:00 at UTC+5:30
      assert.same({ "2025-01-01 Wed 17:00" }, runs("0 9 * * *", from, 1, -480)) -- 09:00 at UTC-8
      assert.same({ "2025-12-31 Wed 18:30" }, runs("0 0 1 1 *", from, 1, 330))
      assert.same({ "2025-01-01 Wed 08:00" }, runs("0 0 1 1 *", from, 1, -480))
      assert.same({ "2025-01-05 Sun 18:30" }, runs("0 0 * * MON", from, 1, 330)) -- Monday there
      assert.same({ "2028-02-29 Tue 08:00" }, runs("0 0 29 2 *", from, 1, -480))
      assert.same({ "2025-01-01 Wed 00:01" }, runs("0 0 2 1 *", from, 1, 1439))
      assert.same({ "2025-01-01 Wed 23:59" }, runs("0 0 1 1 *", from, 1, -1439))
      assert.same({ "2025-01-02 Thu 00:00" }, runs("0 0 * * *", from, 1, 0))
    end)

    it("counts from the server's time when FROM_MS is empty, and writes nothing (FCALL_RO)", function()
      local keys = client:call_wait({ "DBSIZE" }) -- (mj:library, the loads' guard: moonjob.redis.setup)
      local t = assert(client:call_wait({ "TIME" }))
      local now = tonumber(t[1]) * 1000
      local reply = assert(fcall("* * * * *", "", "", ""))
      assert.equal(1, #reply)
      assert.truthy(reply[1] > now - 1000 and reply[1] <= now + 61000, "not within a minute of the server's time")
      assert.equal(0, reply[1] % 60000)
      local ro = assert(fcall("0 0 * * *", ms_of("2025-01-01 00:00"), 0, 2, "FCALL_RO"))
      assert.same({ ms_of("2025-01-02 00:00"), ms_of("2025-01-03 00:00") }, { ro[1], ro[2], ro[3] })
      assert.equal(keys, client:call_wait({ "DBSIZE" }))
    end)

    it("takes FROM_MS 0..1e15, OFFSET_MIN -1439..1439 and COUNT 1..100, and refuses the rest", function()
      assert.equal(1, #assert(fcall("* * * * *", 0, 0, 1)))
      assert.equal(1, #assert(fcall("* * * * *", "1000000000000000", 0, 1)))
      assert.equal(1, #assert(fcall("* * * * *", 0, -1439, 1)))
      local hundred = assert(fcall("* * * * *", 0, 1439, 100))
      assert.equal(100, #hundred)
      assert.equal(60000 * 100, hundred[100] - hundred[1] + 60000)
      for _, from in ipairs({ "x", "-1", "1.5", "1e16", "nan", "inf" }) do
        refused("* * * * *", "FROM_MS must be a whole number of ms from 0 to 1e15", from)
      end
      for _, offset in ipairs({ "1440", "-1440", "1.5", "+", "nan" }) do
        refused("* * * * *", "OFFSET_MIN must be a whole number of minutes from -1439 to 1439", 0, offset)
      end
      for _, count in ipairs({ "0", "101", "1.5", "-1", "many" }) do
        refused("* * * * *", "COUNT must be a whole number from 1 to 100", 0, 0, count)
      end
      local _, err = client:call_wait({ "FCALL", "moonjob_cron", "1", PREFIX })
      assert.matches("EINPUT moonjob_cron: it takes CRON [FROM_MS [OFFSET_MIN | SHIFTS [COUNT]]]", err, 1, true)
    end)

    it("refuses a wrong number of fields, empty items, reversed ranges, out-of-range values, bad steps", function()
      refused("0 0 * * * *", "cron '0 0 * * * *' has 6 fields; it takes 5: minute hour day-of-month month"
        .. " day-of-week (no seconds field: use every = N seconds)")
      refused("0 0 * *", "cron '0 0 * *' has 4 fields; it takes 5")
      refused("0 0 * * * 2025 x", "has 7 fields; it takes 5")
      refused("", "cron is empty; it takes 5 fields")
      refused(" \t ", "cron is empty")
      refused("1,,2 * * * *", "cron field minute '1,,2' has an empty list item")
      refused("0 1, * * *", "cron field hour '1,' has an empty list item")
      refused("0 0 ,1 * *", "cron field day-of-month ',1' has an empty list item")
      refused("5-1 * * * *", "cron field minute '5-1': the range's start 5 exceeds its end 1")
      refused("0 0 * * FRI-MON", "cron field day-of-week 'FRI-MON': the range's start 5 exceeds its end 1")
      refused("0 0 * DEC-JAN *", "the range's start 12 exceeds its end 1")
      refused("60 * * * *", "cron field minute '60' is out of range 0-59")
      refused("0 24 * * *", "cron field hour '24' is out of range 0-23")
      refused("0 0 0 * *", "cron field day-of-month '0' is out of range 1-31")
      refused("0 0 32 * *", "cron field day-of-month '32' is out of range 1-31")
      refused("0 0 * 13 *", "cron field month '13' is out of range 1-12 (or JAN-DEC)")
      refused("0 0 * 0 *", "cron field month '0' is out of range 1-12")
      refused("0 0 * * 8", "cron field day-of-week '8' is out of range 0-7 (0 and 7 are Sunday)")
      refused("0 0 * * 1-8", "cron field day-of-week '8' is out of range 0-7")
      refused("99999999999999999999 * * * *", "is out of range 0-59")
      refused("*/0 * * * *", "cron field minute '*/0': a step must be 1 or more")
      refused("0 1-5/0 * * *", "cron field hour '1-5/0': a step must be 1 or more")
      refused("*/60 * * * *", "cron field minute '*/60': a step must be at most 59")
      refused("*/x * * * *", "cron field minute '*/x': a step must be a whole number")
      refused("*/ * * * *", "a step must be a whole number")
      refused("1/2/3 * * * *", "a step must be a whole number")
    end)

    it("refuses garbage, misplaced or unknown names, unknown macros, long text", function()
      refused("1.5 * * * *", "cron field minute '1.5' holds '.'; allowed are numbers, names, '*', '-', '/' and ','")
      refused("0 0 ? * *", "cron field day-of-month '?' holds '?'")
      refused("0 0 * * 5#2", "holds '#'")
      refused("0 0 L * *", "cron field day-of-month 'L' is not a number; names are allowed only in month")
      refused("0 0 1W * *", "cron field day-of-month '1W' is not a number, a range a-b or '*'")
      refused("-5 * * * *", "cron field minute '-5' is not a number, a range a-b or '*'")
      refused("5- * * * *", "cron field minute '5-' is not a number")
      refused("1-2-3 * * * *", "cron field minute '1-2-3' is not a number")
      refused("** * * * *", "cron field minute '**' is not a number")
      refused("MON * * * *", "cron field minute 'MON' is not a number; names are allowed only in month (JAN-DEC)"
        .. " and day-of-week (SUN-SAT)")
      refused("0 0 * JANUARY *", "cron field month 'JANUARY' is not a name; use JAN-DEC or 1-12")
      refused("0 0 * * FUNDAY", "cron field day-of-week 'FUNDAY' is not a name; use SUN-SAT or 0-7")
      refused("0 0 * MON *", "cron field month 'MON' is not a name")
      refused("@reboot", "cron '@reboot' is not a macro; they are @yearly, @annually, @monthly, @weekly, @daily,"
        .. " @midnight and @hourly, each alone")
      refused("@daily 5", "is not a macro")
      refused("@", "is not a macro")
      local long = ("0,"):rep(126) .. "0 * * * *" -- 261 bytes
      refused(long, "cron text is 261 bytes; it takes at most 256")
      assert.equal(1, #runs(("0,"):rep(123) .. "0 * * * *", "2025-01-01 00:00")) -- 255 bytes
    end)

    it("refuses an expression that never matches a date, naming why", function()
      refused("0 0 30 2 *", "cron '0 0 30 2 *' never runs: no month of '2' has a day '30'")
      refused("0 0 31 4,6,9,11 *", "cron '0 0 31 4,6,9,11 *' never runs: no month of '4,6,9,11' has a day '31'")
      refused("0 0 31 feb,APR *", "never runs")
      refused("0 0 30-31 2 */2", "never runs") -- day-of-week starts with '*': both must match
      assert.same({ "2025-03-31 Mon 00:00" }, runs("0 0 31 2,3 *", "2025-01-01 00:00"))
    end)

    it("agrees with a minute-by-minute search on 2,000 random expressions, start times and offsets", function()
      math.randomseed(20251127)
      local LIMIT = 40 * 1440 -- minutes searched by brute force after each start
      local first, last = ms_of("1971-01-01 00:00"), ms_of("2400-06-01 00:00")
      local wrong, checked = {}, 0
      for case = 1, 2000 do
        local cron, sets, dom_star, dow_star = random_cron()
        local from = math.random(first / 60000, last / 60000) * 60000
        if case % 10 == 0 then -- near the end of February of a century year (2000 and 2400 are leap years)
          local year = ({ 2000, 2100, 2200, 2300, 2400 })[math.random(5)]
          from = ms_of(year .. "-03-01 00:00") - math.random(0, 3 * 1440) * 60000
        end
        if math.random() < 0.5 then from = from + math.random(0, 59999) end
        local offsets = { 0, 330, -480, math.random(-1439, 1439) }
        local offset = offsets[math.random(#offsets)]
        local reply, err = fcall(cron, from, offset, 3)
        if not reply then
          -- only the never-matching ones may be refused: the search must find none either
          assert.matches("never runs", err, 1, true)
          reply = {}
        end
        local wall = math.floor(from / 60000) + offset
        local want = brute_force(sets, dom_star, dow_star, wall, LIMIT, 3)
        for i = 1, 3 do
          local expected = want[i] and (want[i] - offset) * 60000
          local got = reply[i]
          local ok = expected == got or (not expected and (got == nil or got > (wall + LIMIT - offset) * 60000))
          if not ok and #wrong < 10 then
            wrong[#wrong + 1] = ("case %d: '%s' from %s offset %d: run %d is %s, the search says %s"):format(case,
              cron, text_of(from), offset, i, got and text_of(got) or "none", expected and text_of(expected) or "none")
          end
          if expected then checked = checked + 1 end
          if not expected then break end
        end
      end
      assert.same({}, wrong)
      assert.truthy(checked > 3000, "too few runs found to compare: " .. checked)
    end)
  end)
end)
