-- part: cron.lua
-- Cron expressions: cron_parse reads the standard 5 fields (minute hour
-- day-of-month month day-of-week: numbers, names, '*', ranges, steps, lists)
-- and the @ macros; cron_next finds the next minute they match. Days follow
-- Vixie cron: when day-of-month and day-of-week are both restricted (neither
-- starts with '*'), a day matching either one runs; otherwise both must
-- match. Wall times are in a fixed offset from UTC, or in a zone's offsets
-- as the client read them from its tz database (shifts: Redis has none;
-- cron_next_in); the calendar is computed here (Redis's Lua has no os.date):
-- proleptic Gregorian, leap years by its rule. moonjob_cron answers an
-- expression's next times; schedules.lua fires by them.

do
local now_ms, check_args = H.now_ms, H.check_args

local CRON_TEXT_MAX = 256
-- cron_next looks this far ahead: more than the longest gap between two
-- runs of an expression cron_parse takes (40 years: "0 0 29 2 */7", a 29
-- February that is a Sunday, across 2100, which is no leap year).
local CRON_YEARS = 50
local CRON_MONTH_DAYS = { 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31 }
local CRON_FIELDS = {
  { name = "minute", low = 0, high = 59, allowed = "0-59" },
  { name = "hour", low = 0, high = 23, allowed = "0-23" },
  { name = "day-of-month", low = 1, high = 31, allowed = "1-31" },
  { name = "month", low = 1, high = 12, allowed = "1-12 (or JAN-DEC)", names = { JAN = 1, FEB = 2, MAR = 3,
    APR = 4, MAY = 5, JUN = 6, JUL = 7, AUG = 8, SEP = 9, OCT = 10, NOV = 11, DEC = 12 } },
  { name = "day-of-week", low = 0, high = 7, allowed = "0-7 (0 and 7 are Sunday)", names = { SUN = 0,
    MON = 1, TUE = 2, WED = 3, THU = 4, FRI = 5, SAT = 6 } },
}
local CRON_MACROS = { ["@yearly"] = "0 0 1 1 *", ["@annually"] = "0 0 1 1 *", ["@monthly"] = "0 0 1 * *",
  ["@weekly"] = "0 0 * * 0", ["@daily"] = "0 0 * * *", ["@midnight"] = "0 0 * * *", ["@hourly"] = "0 * * * *" }

-- Days since 1970-01-01 of a date, and back (the proleptic Gregorian
-- calendar counted in 400-year eras of 146097 days, each year starting on
-- 1 March so that a leap day ends it).
local function days_from_civil(y, m, d)
  if m <= 2 then y = y - 1 end
  local era = math.floor(y / 400)
  local year_of_era = y - era * 400
  local day_of_year = math.floor((153 * (m > 2 and m - 3 or m + 9) + 2) / 5) + d - 1
  local day_of_era = year_of_era * 365 + math.floor(year_of_era / 4) - math.floor(year_of_era / 100) + day_of_year
  return era * 146097 + day_of_era - 719468
end

local function civil_from_days(days)
  local z = days + 719468
  local era = math.floor(z / 146097)
  local day_of_era = z - era * 146097
  local year_of_era = math.floor((day_of_era - math.floor(day_of_era / 1460) + math.floor(day_of_era / 36524)
    - math.floor(day_of_era / 146096)) / 365)
  local day_of_year = day_of_era - (365 * year_of_era + math.floor(year_of_era / 4) - math.floor(year_of_era / 100))
  local mp = math.floor((5 * day_of_year + 2) / 153)
  local d = day_of_year - math.floor((153 * mp + 2) / 5) + 1
  local m = mp < 10 and mp + 3 or mp - 9
  return era * 400 + year_of_era + (m <= 2 and 1 or 0), m, d
end

local function month_days(y, m)
  if m == 2 and y % 4 == 0 and (y % 100 ~= 0 or y % 400 == 0) then return 29 end
  return CRON_MONTH_DAYS[m]
end

-- One value of a field (a number, or a name in month and day-of-week) -> n,
-- or nil, why (item: the list item it is part of).
local function cron_value(field, text, item)
  local n
  if text:find("^%d+$") then
    n = tonumber(text)
  elseif text:find("^%a+$") and field.names then
    n = field.names[text:upper()]
    if not n then
      return nil, ("cron field %s '%s' is not a name; use %s"):format(field.name, text,
        field.name == "month" and "JAN-DEC or 1-12" or "SUN-SAT or 0-7")
    end
  elseif text:find("^%a+$") then
    return nil, ("cron field %s '%s' is not a number; names are allowed only in month (JAN-DEC)"
      .. " and day-of-week (SUN-SAT)"):format(field.name, text)
  else
    return nil, ("cron field %s '%s' is not a number, a range a-b or '*', each with an optional /step"
      .. " (e.g. 5, 1-5, */15, 10-50/5)"):format(field.name, item)
  end
  if n < field.low or n > field.high then
    return nil, ("cron field %s '%s' is out of range %s"):format(field.name, text, field.allowed)
  end
  return n
end

-- One item of a field's list -> first, last, step, or nil, why.
local function cron_item(field, item, text)
  if item == "" then return nil, ("cron field %s '%s' has an empty list item"):format(field.name, text) end
  local base, step_text = item:match("^([^/]*)/(.*)$")
  base = base or item
  local step = 1
  if step_text then
    if not step_text:find("^%d+$") then
      return nil, ("cron field %s '%s': a step must be a whole number after one '/'"):format(field.name, item)
    end
    step = tonumber(step_text)
    if step < 1 then return nil, ("cron field %s '%s': a step must be 1 or more"):format(field.name, item) end
    if step > field.high - field.low then
      return nil, ("cron field %s '%s': a step must be at most %d (a longer period needs every = N seconds)")
        :format(field.name, item, field.high - field.low)
    end
  end
  if base == "*" then return field.low, field.high, step end
  local a, b = base:match("^([^-]*)-(.*)$")
  local first, why = cron_value(field, a or base, item)
  if not first then return nil, why end
  if not a then return first, step_text and field.high or first, step end
  local last, why_last = cron_value(field, b, item)
  if not last then return nil, why_last end
  if last == 0 and first > 0 and b:find("^%a") then last = 7 end -- MON-SUN: Sunday ending a range is 7
  if first > last then
    return nil, ("cron field %s '%s': the range's start %d exceeds its end %d (a range does not wrap"
      .. " around: write two, as 22-23,0-2)"):format(field.name, item, first, last)
  end
  return first, last, step
end

-- t[v] = the smallest value of the set >= v, or false, for v = low..high + 1.
local function cron_ahead(set, low, high)
  local t, ahead = {}, false
  for v = high + 1, low, -1 do
    if set[v] then ahead = v end
    t[v] = ahead
  end
  return t
end

-- A field's text -> its set of values (true at each), or nil, why.
local function cron_field(field, text)
  local bad = text:match("[^%w%*/,%-]")
  if bad then
    return nil, ("cron field %s '%s' holds '%s'; allowed are numbers, names, '*', '-', '/' and ','")
      :format(field.name, text, bad)
  end
  local set = {}
  for item in (text .. ","):gmatch("([^,]*),") do
    local first, last, step = cron_item(field, item, text)
    if not first then return nil, last end
    for v = first, last, step do set[v] = true end
  end
  return set
end

-- A spec whose day-of-month never falls in its months (only when
-- day-of-week does not widen it) -> why, or nil.
local function cron_never(text, fields, spec)
  if spec.dom_star or not spec.dow_star then return nil end
  for m = 1, 12 do
    if spec.month[m] == m and spec.dom[1] <= month_days(2000, m) then return nil end
  end
  return ("cron '%s' never runs: no month of '%s' has a day '%s'"):format(text, fields[4], fields[3])
end

-- cron_parse(text) -> spec, or nil, why (a sentence for a user). spec:
-- minute, hour, dom, month (cron_ahead tables), dow_ahead[weekday 0-6] (the
-- days to the next weekday that matches), dom_star, dow_star (the field
-- starts with '*'), wild (minute or hour does: the repeated hour of a
-- change back runs again, as Vixie cron's wildcard jobs).
local function cron_parse(text)
  if type(text) ~= "string" then return nil, "cron must be text such as '*/5 * * * *'" end
  if #text > CRON_TEXT_MAX then
    return nil, ("cron text is %d bytes; it takes at most %d"):format(#text, CRON_TEXT_MAX)
  end
  local trimmed = text:match("^%s*(.-)%s*$")
  if trimmed:sub(1, 1) == "@" then
    trimmed = CRON_MACROS[trimmed:lower()]
    if not trimmed then
      return nil, ("cron '%s' is not a macro; they are @yearly, @annually, @monthly, @weekly, @daily,"
        .. " @midnight and @hourly, each alone"):format(text)
    end
  end
  local fields = {}
  for f in trimmed:gmatch("%S+") do fields[#fields + 1] = f end
  if #fields == 0 then return nil, "cron is empty; it takes 5 fields, as '*/5 * * * *'" end
  if #fields ~= 5 then
    return nil, ("cron '%s' has %d fields; it takes 5: minute hour day-of-month month day-of-week%s")
      :format(text, #fields, #fields == 6 and " (no seconds field: use every = N seconds)" or "")
  end
  local sets = {}
  for i, field in ipairs(CRON_FIELDS) do
    local set, why = cron_field(field, fields[i])
    if not set then return nil, why end
    sets[i] = set
  end
  sets[5][0] = sets[5][0] or sets[5][7]
  local spec = { minute = cron_ahead(sets[1], 0, 59), hour = cron_ahead(sets[2], 0, 23),
    dom = cron_ahead(sets[3], 1, 31), month = cron_ahead(sets[4], 1, 12), dow_ahead = {},
    dom_star = fields[3]:sub(1, 1) == "*", dow_star = fields[5]:sub(1, 1) == "*",
    wild = fields[1]:sub(1, 1) == "*" or fields[2]:sub(1, 1) == "*" }
  for wd = 0, 6 do
    local k = 0
    while not sets[5][(wd + k) % 7] do k = k + 1 end
    spec.dow_ahead[wd] = k
  end
  local never = cron_never(text, fields, spec)
  if never then return nil, never end
  return spec
end

-- The first day >= d of month m of year y that matches spec, or nil.
local function cron_day(spec, y, m, d)
  local dim = month_days(y, m)
  if d > dim then return nil end
  local wd = (days_from_civil(y, m, d) + 4) % 7 -- 1970-01-01 was a Thursday
  if not spec.dom_star and not spec.dow_star then -- either one
    local by_dom, by_dow = spec.dom[d], d + spec.dow_ahead[wd]
    local day = (by_dom and by_dom < by_dow) and by_dom or by_dow
    return day <= dim and day or nil
  end
  local day = d -- both: each field's next day, in turn, until they agree
  while day <= dim do
    local by_dom = spec.dom[day]
    if not by_dom or by_dom > dim then return nil end
    day = by_dom + spec.dow_ahead[(wd + by_dom - d) % 7]
    if day == by_dom then return day end
  end
  return nil
end

-- The first hour and minute >= h:mi of a day that match spec, or nil.
local function cron_in_day(spec, h, mi)
  local hour = spec.hour[h]
  while hour do
    local minute = spec.minute[hour == h and mi or 0]
    if minute then return hour, minute end
    hour = spec.hour[hour + 1]
  end
  return nil
end

-- cron_next(spec, after_ms, offset_min) -> the first whole minute (ms since
-- the epoch, UTC) after after_ms whose wall time at UTC + offset_min
-- minutes matches spec, or nil if none within CRON_YEARS. Whole months,
-- days and hours that cannot match are skipped, never walked a minute at a
-- time.
local function cron_next(spec, after_ms, offset_min)
  local wall = math.floor(after_ms / 60000) + 1 + offset_min
  local days = math.floor(wall / 1440)
  local y, m, d = civil_from_days(days)
  local h, mi = math.floor((wall - days * 1440) / 60), wall % 60
  local last_year = y + CRON_YEARS
  while y <= last_year do
    local month = spec.month[m]
    if month ~= m then -- the next month it names, this year or the next
      if month then m = month else y, m = y + 1, spec.month[1] end
      d, h, mi = 1, 0, 0
    else
      local day = cron_day(spec, y, m, d)
      if not day then
        if m == 12 then y, m = y + 1, 1 else m = m + 1 end
        d, h, mi = 1, 0, 0
      else
        if day ~= d then d, h, mi = day, 0, 0 end
        local hour, minute = cron_in_day(spec, h, mi)
        if hour then return ((days_from_civil(y, m, d) * 1440 + hour * 60 + minute) - offset_min) * 60000 end
        d, h, mi = d + 1, 0, 0
      end
    end
  end
  return nil
end

-- A zone's offsets as the client hands them ("UNTIL_S O0 T1 O1 ... Tn On":
-- seconds since the epoch, minutes east of UTC; On in force from Tn, O0
-- before T1; UNTIL_S: how far ahead the client knew them) -> { known
-- (UNTIL_S in ms), times (ms, rising), offsets }, or nil, why.
local SHIFTS_MAX = 64
local function shifts_parse(text)
  local n = {}
  for word in string.gmatch(text or "", "%S+") do
    n[#n + 1] = tonumber(word)
    if not n[#n] or n[#n] % 1 ~= 0 then return nil, "SHIFTS holds '" .. word .. "', not a whole number" end
  end
  if #n < 2 or #n % 2 ~= 0 or #n > 2 * SHIFTS_MAX + 2 then
    return nil, "SHIFTS must be UNTIL_S O0 [T1 O1 ...] (at most " .. SHIFTS_MAX .. " changes)"
  end
  local z = { known = n[1] * 1000, times = {}, offsets = { n[2] } }
  for i = 3, #n, 2 do
    local t = n[i] * 1000
    if (z.times[#z.times] or -math.huge) >= t then return nil, "SHIFTS' times must rise" end
    z.times[#z.times + 1], z.offsets[#z.offsets + 1] = t, n[i + 1]
  end
  for _, o in ipairs(z.offsets) do
    if o < -1439 or o > 1439 then return nil, "SHIFTS' offsets must be minutes from -1439 to 1439" end
  end
  return z
end

-- cron_next_in(spec, after_ms, zone) -> as cron_next, in a fixed offset
-- (zone a number) or a zone's offsets (shifts_parse's; after the last
-- change its offset is kept). A wall time a change forward skips runs once,
-- at the change (the first instant after the gap); one a change back
-- repeats runs at its first occurrence only (a wild spec goes on by the
-- new wall clock: hourly jobs stay hourly).
local function cron_next_in(spec, after_ms, zone)
  if type(zone) == "number" then return cron_next(spec, after_ms, zone) end
  local times, offsets, i = zone.times, zone.offsets, 1
  while times[i] and times[i] <= after_ms do i = i + 1 end
  local floor = after_ms
  if times[i - 1] and offsets[i - 1] > offsets[i] and not spec.wild then
    -- asked in the second pass of a repeated hour: its wall times ran in the first
    floor = math.max(floor, math.ceil(times[i - 1] / 60000) * 60000 + (offsets[i - 1] - offsets[i]) * 60000 - 1)
  end
  while true do
    local o, t = offsets[i], times[i]
    local c = cron_next(spec, floor, o)
    if not c or not t or c < t then return c end
    local o_new = offsets[i + 1]
    t = math.ceil(t / 60000) * 60000 -- slots are whole minutes
    if o_new > o and c < t + (o_new - o) * 60000 then return t end
    floor = math.max(floor, t - 1 + ((o > o_new and not spec.wild) and (o - o_new) * 60000 or 0))
    i = i + 1
  end
end

local CRON_NUMBERS = {
  { 2, "FROM_MS must be a whole number of ms from 0 to 1e15 (empty: the server's time)", 0, 1e15, true },
  { 3, "OFFSET_MIN must be a whole number of minutes from -1439 to 1439 (the zone's offset from UTC)",
    -1439, 1439, true },
  { 4, "COUNT must be a whole number from 1 to 100", 1, 100, true },
}

-- cron(p; cron, from_ms, offset_min | shifts, count) -> { ms, ... }: the
-- next count (default 1) times after from_ms (empty: the server's time)
-- whose wall time at UTC + offset_min (default 0) minutes, or in a zone's
-- shifts (as a schedule's: shifts_parse), matches cron; fewer only if none
-- comes within CRON_YEARS. Writes nothing; p only routes the call (an
-- operator's preview of a schedule's slots).
local function cron(keys, args)
  local fn = "moonjob_cron"
  local zoned = string.find(args[3] or "", " ", 1, true)
  local refused = check_args(fn, args, 1, "it takes CRON [FROM_MS [OFFSET_MIN | SHIFTS [COUNT]]]",
    zoned and { CRON_NUMBERS[1], CRON_NUMBERS[3] } or CRON_NUMBERS)
  if refused then return refused end
  local spec, why = cron_parse(args[1])
  if not spec then return redis.error_reply("EINPUT " .. fn .. ": " .. why) end
  local after = (args[2] == nil or args[2] == "") and now_ms() or tonumber(args[2])
  local zone = tonumber(args[3]) or 0
  if zoned then
    zone, why = shifts_parse(args[3])
    if not zone then return redis.error_reply("EINPUT " .. fn .. ": " .. why) end
  end
  local out = {}
  for i = 1, tonumber(args[4]) or 1 do
    after = cron_next_in(spec, after, zone)
    if not after then break end
    out[i] = after
  end
  return out
end

H.cron_parse, H.cron_next, H.cron_next_in, H.shifts_parse = cron_parse, cron_next, cron_next_in, shifts_parse
F.cron = cron
end
