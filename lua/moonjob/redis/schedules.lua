-- moonjob.redis.schedules -- repeating jobs on a durable queue: the methods
-- q:schedule, q:unschedule and q:schedules of `moonjob.queue(url, name)`
-- (the queue class, moonjob.redis.producer, takes them from here: each is a
-- function of the queue `q`, and raises at the user's line for a bad
-- argument).
--
--   q:schedule("report", { cron = "0 3 * * *", tz = "local" }, { kind = "daily" })
--   q:schedule("ping", { every = 30 }, "ping", { timeout = 5 })
--
-- Redis keeps the schedules and fires them (functions/schedules.lua: moonjob_schedule
-- and fetch): each due time (a slot) becomes one ordinary job whose id is
-- "s:<schedule id>:<slot ms>", so however many workers run, restart or have
-- their clocks wrong, a slot runs once. A schedule fires while at least one
-- worker of the queue runs; slots missed while none ran follow catch_up.
--
-- Time zones: Redis has none. tz = "Europe/Berlin" (a name of the tz
-- database) is read here (moonjob.tz) and Redis is handed the zone's
-- offsets for ZONE_YEARS ahead (the schedule's shifts), which the library
-- follows, daylight saving included; declaring the schedule again, or a
-- worker of the queue (moonjob.redis.zones), refreshes them. tz = "local"
-- is this machine's zone (TZ, else /etc/localtime): by its name when TZ or
-- /etc/timezone gives one, a fixed offset when it has no changes ahead.
-- "+05:30" is a fixed offset.
--
-- Pure Lua: moonjob.producer takes these methods too, on any Lua; data
-- goes through the queue's codec, q.json.
local add = require "moonjob.redis.add"
local errors = require "moonjob.errors"
local fcall = require "moonjob.redis.fcall"
local names = require "moonjob.redis.names"
local tz = require "moonjob.tz"

local M = {}

local unpack = table.unpack or unpack -- (Lua 5.1, LuaJIT: unpack)

local WHEN_OPTIONS = { cron = true, every = true, tz = true, start = true, stop = true, limit = true,
  catch_up = true }
local FIELDS = { "kind", "cron", "every", "offset", "start", "stop", "limit", "catch_up", "job", "runs",
  "last", "last_id", "next", "created", "note", "zone", "shifts" }
M.ZONE_YEARS = 3 -- a zone's offsets handed to Redis this far ahead
local PAGE = 10000 -- a whole listing in one call up to this many (moonjob_schedules' bound)

-- A zone's offsets from a day back for ZONE_YEARS, as moonjob_schedule takes
-- them: "UNTIL_S O0 T1 O1 ..." (seconds since the epoch, minutes east of
-- UTC), and the offset now (minutes).
function M.shifts_text(zone, now)
  now = math.floor(now or os.time())
  local to = now + math.floor(M.ZONE_YEARS * 365.25 * 86400)
  -- (from a day back: a change back just passed stays known, so that Redis
  -- skips the second pass of the hour it repeats)
  local list = tz.shifts(zone, now - 86400, to)
  local words = { ("%d"):format(to), ("%d"):format(math.floor(list[1][2] / 60 + 0.5)) }
  for i = 2, #list do
    words[#words + 1] = ("%d %d"):format(list[i][1], math.floor(list[i][2] / 60 + 0.5))
  end
  return table.concat(words, " "), math.floor(tz.offset_at(zone, now) / 60 + 0.5)
end

-- The name of this machine's zone (TZ, /etc/timezone when it agrees with
-- /etc/localtime), or nil: then "local" stays this machine's and only a
-- declaration here refreshes it.
local function local_name(zone)
  if zone.name ~= "local" then return zone.name end
  local f = io.open("/etc/timezone", "rb")
  local name = f and f:read("*l")
  if f then f:close() end
  local named = name and tz.zone(name)
  if named and tz.offset_at(named, os.time()) == tz.offset_at(zone, os.time()) then return name end
  return nil
end

-- tz -> minutes east of UTC now [, zone name, shifts], or nil and why.
local function offset_of(name)
  if name == nil or name == "UTC" or name == "utc" or name == "Z" then return 0 end
  local sign, h, m = tostring(name):match("^([+-])(%d%d):?(%d%d)$")
  h, m = tonumber(h), tonumber(m)
  if sign and h < 24 and m < 60 then return (sign == "-" and -1 or 1) * (h * 60 + m) end
  if type(name) ~= "string" then
    return nil, ("option 'tz' must be \"UTC\", \"local\", a zone such as \"Europe/Berlin\" or an offset such as "
      .. "\"+05:30\", not '%s'"):format(tostring(name))
  end
  local zone, why = tz.zone(name)
  if not zone then return nil, "option 'tz': " .. why end
  local shifts, offset = M.shifts_text(zone)
  if name == "local" then
    if not shifts:find(" %d+ %-?%d+$") then return offset end -- no change ahead: a fixed offset, as ever
    name = local_name(zone) or "local"
  end
  return offset, name, shifts
end

local function fail(why) error("queue:schedule(): " .. why, 4) end

-- Server ms (a number or its text) as UTC, such as 2026-12-01T03:00:00Z.
local function utc_text(ms)
  return os.date("!%Y-%m-%dT%H:%M:%SZ", math.floor(tonumber(ms) / 1000))
end

-- A time option (seconds since the epoch, as os.time() gives) -> ms, or "".
local function epoch_ms(when, name)
  local v = when[name]
  if v == nil then return "" end
  if type(v) ~= "number" or not (v >= 0 and v <= 1e12) then
    fail(("option '%s' must be a time in seconds since the epoch (as os.time() gives), not %s"):format(
      name, tostring(v)))
  end
  return ("%.0f"):format(v * 1000)
end

-- The when table -> kind, when, offset, start, stop, limit, catch_up, zone,
-- shifts (moonjob_schedule's arguments); raises on a mistake of the caller.
local function when_args(when)
  if type(when) ~= "table" then fail("its second argument must be a table: { cron = ... } or { every = s }") end
  for k in pairs(when) do
    if not WHEN_OPTIONS[k] then
      fail(("unknown option '%s' (known: catch_up, cron, every, limit, start, stop, tz)"):format(tostring(k)))
    end
  end
  if (when.cron == nil) == (when.every == nil) then
    fail("give one of cron (\"*/5 * * * *\") or every (seconds)")
  end
  local kind, spec = "cron", when.cron
  if when.every ~= nil then
    if type(when.every) ~= "number" or not (when.every >= 1 and when.every <= names.SECONDS_MAX) then
      fail(("option 'every' must be a number of seconds from 1 to 1e9, not %s"):format(tostring(when.every)))
    end
    kind, spec = "every", ("%.0f"):format(when.every * 1000)
  elseif type(spec) ~= "string" then
    fail("option 'cron' must be a text of 5 fields such as \"*/5 * * * *\"")
  end
  local offset, zone, shifts = offset_of(when.tz)
  if not offset then fail(zone) end
  if kind ~= "cron" then zone, shifts = nil, nil end -- (every: slots at fixed intervals, no wall time)
  local limit = when.limit or 0
  if type(limit) ~= "number" or limit < 0 or limit % 1 ~= 0 or limit > 2 ^ 53 then
    fail("option 'limit' must be a whole number of runs (0: no limit)")
  end
  local catch_up = when.catch_up or "one"
  if catch_up ~= "none" and catch_up ~= "one" then
    fail(("option 'catch_up' must be \"none\" (missed slots are skipped) or \"one\" (one job stands for "
      .. "them), not '%s'"):format(tostring(catch_up)))
  end
  local start, stop = epoch_ms(when, "start"), epoch_ms(when, "stop")
  if start ~= "" and stop ~= "" and tonumber(stop) < tonumber(start) then
    fail(("option 'stop' (%s) comes before 'start' (%s)"):format(utc_text(stop), utc_text(start)))
  end
  return kind, spec, offset, start, stop, limit, catch_up, zone, shifts
end

-- Redis refuses a stop that has passed by its own clock: said in the
-- option's words, not the library's argument names.
local function stop_passed(err, stop)
  local now = err and err.code == "EINPUT" and tostring(err.message):match("STOP_MS has passed %(the server's time is (%d+) ms%)")
  if not now then return err end
  return errors.new("EINPUT", ("option 'stop' (%s) has passed: Redis's clock reads %s, and a schedule whose stop "
    .. "has passed would never run"):format(utc_text(stop), utc_text(now)))
end

-- A row of moonjob_schedules' zone (nil: a fixed offset), how far ahead
-- its offsets are known (server ms) and their text (nil when unreadable).
local ZONE_AT, SHIFTS_AT -- (their places in a row: the id, then FIELDS)
for i, name in ipairs(FIELDS) do
  if name == "zone" then ZONE_AT = i + 1 elseif name == "shifts" then SHIFTS_AT = i + 1 end
end
function M.row_zone(row)
  local zone, shifts = row[ZONE_AT], row[SHIFTS_AT]
  if type(zone) ~= "string" or zone == "" then return nil end
  local known = type(shifts) == "string" and tonumber(shifts:match("^%d+") or "")
  return zone, known and known * 1000 or nil, known and shifts or nil
end

-- One row of moonjob_schedules as a table (times in server ms); json: the
-- queue's codec.
local function schedule_of(row, json)
  local f = {}
  for i, name in ipairs(FIELDS) do f[name] = row[i + 1] or nil end
  local ok, job = pcall(json.decode, f.job or "")
  if not ok or type(job) ~= "table" then job = {} end -- written by another client: no data to show
  local zone, known, shifts = M.row_zone(row)
  local s = { id = row[1], cron = f.cron ~= "" and f.cron or nil, tz_offset = tonumber(f.offset),
    tz = zone, tz_known = known, tz_shifts = shifts,
    start = tonumber(f.start), stop = tonumber(f.stop), limit = tonumber(f.limit) or 0,
    catch_up = f.catch_up, runs = tonumber(f.runs) or 0, last = tonumber(f.last), last_id = f.last_id,
    next = tonumber(f.next), created = tonumber(f.created), note = f.note ~= "" and f.note or nil,
    name = job[8] ~= "" and job[8] or nil }
  local every = tonumber(f.every or "")
  if every then s.every = every / 1000 end
  if type(job[1]) == "string" then
    local decoded, data = pcall(json.decode, job[1])
    if decoded then s.data = data end
  end
  s.ended = s.next == nil
  return s
end

-- The id of a schedule and opts that leave a slot's job its id; raises.
local function check_id(id, opts)
  if type(id) ~= "string" and type(id) ~= "number" then
    error("queue:schedule(): its first argument must be the schedule's id (a string)", 3)
  end
  if opts ~= nil and type(opts) == "table" and (opts.id ~= nil or opts.dedupe ~= nil or opts.debounce ~= nil) then
    error("queue:schedule(): a scheduled job's id is the schedule's and its slot's: options 'id', "
      .. "'dedupe' and 'debounce' cannot be given", 3)
  end
end

-- A slot's job as moonjob_schedule's DATA .. NOTIFY, EXPIRE_MS [, GROUP]
-- arguments, appended to args (q:add's, checked as q:add checks them) ->
-- args | nil, err (EPAYLOAD); raises on a bad option, as q:schedule's.
local function job_args(q, args, data, opts)
  local text, err = add.encode(data == nil and q.json.null or data, q.max_payload, q.json)
  if not text then return nil, err end
  local ok, a = pcall(add.args, q.prefix, text, opts, false, nil, nil, q.json)
  if not ok then
    error((tostring(a):gsub("^[^\n]-:%d+: ", ""):gsub("queue:add%(%)", "queue:schedule()")), 3)
  end
  for i = 6, 16 do args[#args + 1] = a[i] end -- DATA .. NOTIFY
  args[#args + 1] = a[19] -- EXPIRE_MS
  if a[22] ~= "" then args[#args + 1] = a[22] end -- GROUP (none: a definition as before groups)
  return args
end

-- q:schedule(id, when [, data [, opts]]) -> { id, state, next } | nil, err.
-- when: { cron = "m h dom mon dow" | every = seconds, tz = "UTC" | "local"
-- | "Europe/Berlin" | "+05:30", start, stop (os.time() seconds), limit (runs), catch_up =
-- "one" (default) | "none" }; data and opts: each slot's job, as q:add's
-- (but id and dedupe: the id is the slot's). state: "created", "updated"
-- or "unchanged" (the same definition again changes nothing); next: the
-- next slot, server ms (nil: the schedule has ended). A bad cron is
-- EINPUT, nothing changed.
function M.schedule(q, id, when, data, opts)
  check_id(id, opts)
  local kind, spec, offset, start, stop, limit, catch_up, zone, shifts = when_args(when)
  local args, err = job_args(q, { "moonjob_schedule", 1, q.prefix, tostring(id), kind, spec, offset, start,
    stop, limit, catch_up }, data, opts)
  if not args then return nil, err end
  if zone then
    if #args == 23 then args[24] = "" end -- GROUP: none
    args[25], args[26] = zone, shifts
  end
  local reply
  reply, err = fcall.call(q, unpack(args))
  if not reply then return nil, stop_passed(err, stop) end
  return { id = tostring(id), state = reply[1], next = reply[2] >= 0 and reply[2] or nil }
end

-- q:unschedule(id) -> true | nil, err (ENOTFOUND). The jobs it made stay.
function M.unschedule(q, id)
  local n, err = fcall.call(q, "moonjob_unschedule", 1, q.prefix, tostring(id))
  if not n then return nil, err end
  if n == 0 then
    return nil, fcall.no_queue_or(q, errors.new("ENOTFOUND", ("no schedule %s in queue %s (moonjob schedule "
      .. "list shows them)"):format(tostring(id), q.name)))
  end
  return true
end

local function check_page(opts)
  if opts ~= nil then
    if type(opts) ~= "table" or (opts.offset ~= nil and not (type(opts.offset) == "number" and opts.offset >= 0
        and opts.offset % 1 == 0)) or (opts.limit ~= nil and not (type(opts.limit) == "number"
        and opts.limit >= 1 and opts.limit <= PAGE and opts.limit % 1 == 0)) then
      error("queue:schedules(): options are { offset = n (0 or more), limit = n (1 to 10000) }", 3)
    end
  end
end

-- q:schedules([{ offset, limit }]) -> list, total | nil, err: the
-- schedules, the next due first (ended ones last), each { id, cron |
-- every, tz_offset (minutes), tz (a zone's name), tz_known (its offsets
-- known until then, ms), tz_shifts (them, as Redis keeps them), start, stop, next, last, created (server
-- ms), limit, runs, catch_up, last_id, data, name, note, ended }. Without
-- options, every one; with them, one page (limit 1 to 10000).
function M.schedules(q, opts)
  check_page(opts)
  -- pages are ranks by next slot, which firing reorders: an id already
  -- listed is not listed twice
  local out, seen, offset, total = {}, {}, opts and opts.offset or 0, nil
  repeat
    local reply, err = fcall.call(q, "moonjob_schedules", 1, q.prefix, offset, opts and opts.limit or PAGE)
    if not reply then return nil, err end
    total = reply[1]
    for i = 2, #reply do
      local sc = schedule_of(reply[i], q.json)
      if not seen[sc.id] then seen[sc.id], out[#out + 1] = true, sc end
    end
    offset = offset + PAGE
  until opts or offset >= total
  return out, total
end

return M
