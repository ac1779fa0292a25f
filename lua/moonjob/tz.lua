-- moonjob.tz -- time zones from the system's tz database, for schedules:
-- Redis has no time zones, so the producer reads a zone here and hands
-- Redis its offsets for a window ahead (moonjob.redis.schedules).
--
--   tz.zone("Europe/Berlin") -> zone | nil, why
--   tz.zone("local")         -> this machine's zone (TZ, else /etc/localtime)
--   tz.offset_at(zone, t)    -> seconds east of UTC in force at t (epoch s)
--   tz.shifts(zone, from, to) -> { { t, offset }... }: the offset at from,
--                               then each change in (from, to]
--
-- A zone file is TZif (RFC 8536, `man 5 tzfile`): the version 2+ block of
-- 64-bit transition times is read (the 32-bit first block is skipped), and
-- times after its last transition follow the footer's POSIX TZ rule
-- ("CET-1CEST,M3.5.0,M10.5.0/3"). A TZ variable that holds such a rule
-- itself is read with the same code. Pure Lua (5.1 to 5.4, LuaJIT): the
-- producer runs on any Lua.
local M = {}

M.DIR = "/usr/share/zoneinfo"
local NAME_MAX = 128
local HEADER = 44

-- The database's folder: TZDIR (as the C library reads it), else M.DIR.
local function dir()
  local d = os.getenv("TZDIR")
  return (d and d ~= "") and d or M.DIR
end

-- Big-endian integers of n bytes at i (1-based) of s, signed.
local function int_at(s, i, n)
  local v = 0
  for k = i, i + n - 1 do v = v * 256 + s:byte(k) end
  if s:byte(i) >= 128 then v = v - 256 ^ n end
  return v
end

-- Days since 1970-01-01 of a civil date (proleptic Gregorian).
local function days_from_civil(y, m, d)
  if m <= 2 then y = y - 1 end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local doy = math.floor((153 * ((m + 9) % 12) + 2) / 5) + d - 1
  return era * 146097 + yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy - 719468
end

local function is_leap(y) return y % 4 == 0 and (y % 100 ~= 0 or y % 400 == 0) end
local MONTH_DAYS = { 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31 }

local function year_of(t) -- the civil year of epoch seconds t (UTC)
  local y = 1970 + math.floor(t / 31556952)
  while days_from_civil(y, 1, 1) * 86400 > t do y = y - 1 end
  while days_from_civil(y + 1, 1, 1) * 86400 <= t do y = y + 1 end
  return y
end

-- POSIX TZ rules ----------------------------------------------------------

-- "[+-]hh[:mm[:ss]]" at position i of s -> seconds, next position, or nil.
local function clock_at(s, i)
  local sign, h, rest = s:match("^([+-]?)(%d%d?%d?)()", i)
  if not h then return nil end
  local v, j = tonumber(h) * 3600, rest
  local mm = s:match("^:(%d%d)", j)
  if mm then
    v, j = v + tonumber(mm) * 60, j + 3
    local ss = s:match("^:(%d%d)", j)
    if ss then v, j = v + tonumber(ss), j + 3 end
  end
  return sign == "-" and -v or v, j
end

-- A zone abbreviation ("CET" or "<+0530>") at i -> next position, or nil.
local function abbr_at(s, i)
  local j = s:match("^<[%w+-]+>()", i) or s:match("^%a%a%a+()", i)
  return j
end

-- A rule's date ("Mm.w.d", "Jn", "n") and time ("/time", default 02:00)
-- at i -> { kind, ... , time }, next position, or nil.
local function date_at(s, i)
  local r, j = {}, nil
  local m, w, d, k = s:match("^M(%d%d?)%.(%d)%.(%d)()", i)
  if m then
    r.kind, r.m, r.w, r.d, j = "M", tonumber(m), tonumber(w), tonumber(d), k
    if r.m < 1 or r.m > 12 or r.w < 1 or r.w > 5 or r.d > 6 then return nil end
  else
    local julian, n
    julian, n, k = s:match("^(J?)(%d%d?%d?)()", i)
    if not n then return nil end
    r.kind, r.n, j = julian == "J" and "J" or "n", tonumber(n), k
  end
  r.time = 7200
  if s:sub(j, j) == "/" then
    r.time, j = clock_at(s, j + 1)
    if not r.time then return nil end
  end
  return r, j
end

-- The day (days since the epoch) a rule date falls on in year y.
local function rule_day(r, y)
  if r.kind == "J" then -- 1..365, February 29 never counted
    local n = r.n
    if is_leap(y) and n >= 60 then n = n + 1 end
    return days_from_civil(y, 1, 1) + n - 1
  elseif r.kind == "n" then
    return days_from_civil(y, 1, 1) + r.n
  end
  local first = days_from_civil(y, r.m, 1)
  local wd = (first + 4) % 7 -- 1970-01-01 was a Thursday
  local day = first + (r.d - wd) % 7 + (r.w - 1) * 7
  local dim = (r.m == 2 and is_leap(y)) and 29 or MONTH_DAYS[r.m]
  while day >= first + dim do day = day - 7 end -- week 5: the last one
  return day
end

-- A POSIX TZ text -> { std, dst, start, finish } (offsets in seconds east
-- of UTC; start, finish: rule dates) or nil.
function M.posix(s)
  local i = abbr_at(s, 1)
  if not i then return nil end
  local west, j = clock_at(s, i)
  if not west then return nil end
  local rule = { std = -west }
  if j > #s then return rule end
  i = abbr_at(s, j)
  if not i then return nil end
  local dst_west
  dst_west, j = clock_at(s, i)
  if dst_west then i = j end
  rule.dst = dst_west and -dst_west or rule.std + 3600
  if s:sub(i, i) ~= "," then
    if i > #s then rule.start, rule.finish = date_at("M3.2.0", 1), date_at("M11.1.0", 1) return rule end
    return nil
  end
  rule.start, j = date_at(s, i + 1)
  if not rule.start or s:sub(j, j) ~= "," then return nil end
  rule.finish, j = date_at(s, j + 1)
  if not rule.finish or j <= #s then return nil end
  return rule
end

-- A rule's two changes in year y: { t, offset } each, in time order.
local function rule_changes(rule, y)
  local on = rule_day(rule.start, y) * 86400 + rule.start.time - rule.std
  local off = rule_day(rule.finish, y) * 86400 + rule.finish.time - rule.dst
  if on < off then return { { on, rule.dst }, { off, rule.std } } end
  return { { off, rule.std }, { on, rule.dst } }
end

-- TZif files ---------------------------------------------------------------

local function counts_at(s, at)
  local c = {}
  for k, name in ipairs({ "isut", "isstd", "leap", "time", "type", "char" }) do
    c[name] = int_at(s, at + 20 + (k - 1) * 4, 4)
  end
  return c
end

-- The text of a TZif file -> zone { times, offsets (per transition), first
-- (offset before them), rule (the footer's, or nil) }, or nil, why.
function M.parse(s)
  if #s < HEADER or s:sub(1, 4) ~= "TZif" then return nil, "not a TZif file" end
  local c = counts_at(s, 1)
  if s:byte(5) < 50 then return nil, "a version 1 TZif file (the tz database of before 2005)" end
  local at = HEADER + 1 + c.time * 5 + c.type * 6 + c.char + c.leap * 8 + c.isstd + c.isut
  if #s < at + HEADER - 1 or s:sub(at, at + 3) ~= "TZif" then return nil, "a TZif file cut short" end
  c = counts_at(s, at)
  local times_at = at + HEADER
  local index_at = times_at + c.time * 8
  local types_at = index_at + c.time
  local footer_at = types_at + c.type * 6 + c.char + c.leap * 12 + c.isstd + c.isut
  if c.type < 1 or #s < footer_at - 1 then return nil, "a TZif file cut short" end
  local function utoff(k) return int_at(s, types_at + k * 6, 4) end
  local zone = { times = {}, offsets = {}, first = utoff(0) }
  for k = 1, c.time do
    local ti = s:byte(index_at + k - 1)
    if ti >= c.type then return nil, "a TZif file with a bad time type" end
    zone.times[k], zone.offsets[k] = int_at(s, times_at + (k - 1) * 8, 8), utoff(ti)
  end
  local footer = s:match("^\n([^\n]*)\n", footer_at)
  if footer and footer ~= "" then
    zone.rule = M.posix(footer)
    if not zone.rule then return nil, ("a TZif file whose rule '%s' is not understood"):format(footer) end
  end
  return zone
end

-- Seconds east of UTC in force at t.
function M.offset_at(zone, t)
  local times, rule = zone.times, zone.rule
  if #times > 0 and t < times[1] then return zone.first end
  if rule and (#times == 0 or t >= times[#times]) then
    if not rule.start then return rule.std end
    local changes = rule_changes(rule, year_of(t) - 1)
    local before = changes[2][2]
    for _, ch in ipairs(rule_changes(rule, year_of(t))) do
      if ch[1] <= t then before = ch[2] end
    end
    return before
  end
  if #times == 0 then return zone.first end
  local lo, hi = 1, #times -- the last transition at or before t
  while lo < hi do
    local mid = math.floor((lo + hi + 1) / 2)
    if times[mid] <= t then lo = mid else hi = mid - 1 end
  end
  return zone.offsets[lo]
end

-- The offset at from, then each change of offset in (from, to]:
-- { { from, offset }, { t, offset }... } (offsets in seconds east of UTC).
function M.shifts(zone, from, to)
  local out = { { from, M.offset_at(zone, from) } }
  local function add(t, offset)
    if t > from and t <= to and offset ~= out[#out][2] then out[#out + 1] = { t, offset } end
  end
  local last = zone.times[#zone.times]
  for k, t in ipairs(zone.times) do add(t, zone.offsets[k]) end
  if zone.rule and zone.rule.start then
    for y = year_of(math.max(from, last or from)), year_of(to) do
      for _, ch in ipairs(rule_changes(zone.rule, y)) do
        if not last or ch[1] > last then add(ch[1], ch[2]) end
      end
    end
  end
  return out
end

-- Zones by name -------------------------------------------------------------

local function read(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

-- A name of the database -> the zone, or nil, why. Names are made of
-- letters, digits and _ + - / only (no "..": nothing outside the folder).
local function named(name)
  if #name > NAME_MAX or not name:find("^[%w_+%-]+[%w_+%-/]*$") or name:find("//") or name:sub(-1) == "/" then
    return nil, ("time zone '%s' is not a zone name: names such as Europe/Berlin are made of letters, digits, "
      .. "'_', '+', '-' and '/'"):format(name)
  end
  local path = dir() .. "/" .. name
  local s = read(path)
  if not s or s == "" then
    return nil, ("time zone '%s' is not in the tz database (no file %s; is tzdata installed?)"):format(name, path)
  end
  local zone, why = M.parse(s)
  if not zone then return nil, ("time zone '%s': %s is %s"):format(name, path, why) end
  zone.name = name
  return zone
end

-- This machine's zone: TZ (a zone name, ":name", or a POSIX rule), else
-- /etc/localtime (named by the link's target when it is one), else UTC.
local function machine_zone()
  local tz = os.getenv("TZ")
  if tz then
    local name = tz:gsub("^:", "")
    if name == "" then return { times = {}, offsets = {}, first = 0, name = "UTC" } end
    if name:sub(1, 1) == "/" then
      local s = read(name)
      local zone = s and M.parse(s)
      if not zone then return nil, ("TZ names the file %s, which is not a TZif zone file"):format(name) end
      zone.name = "local"
      return zone
    end
    local rule = M.posix(name)
    if rule then return { times = {}, offsets = {}, first = rule.std, rule = rule, name = "local" } end
    return named(name)
  end
  local s = read("/etc/localtime")
  if not s then return { times = {}, offsets = {}, first = 0, name = "UTC" } end
  local zone, why = M.parse(s)
  if not zone then return nil, "/etc/localtime is " .. why end
  zone.name = "local"
  return zone
end

-- tz.zone(name) -> zone | nil, why. "local": this machine's zone.
function M.zone(name)
  if type(name) ~= "string" then return nil, "a time zone is a name such as Europe/Berlin" end
  if name == "local" then return machine_zone() end
  return named(name)
end

return M
