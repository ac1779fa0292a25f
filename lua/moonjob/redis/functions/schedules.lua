-- part: schedules.lua
-- A schedule makes one ordinary job per due time (a slot), with the server's
-- clock: fetch fires the due ones, so schedules fire while at least one
-- worker of the queue runs (a paused queue's too: its jobs then wait).
--   <p>schedules  sorted set: schedule id by its next slot (ms); +inf once
--                 it has ended (its stop or limit reached)
--   <p>s:<id>     hash: one schedule. kind (cron | every), cron (text),
--                 every (ms), offset (the zone's minutes east of UTC, for
--                 cron), start, stop (ms, "": none), limit (runs, 0: none),
--                 catch_up (none | one), job (JSON array: add's DATA ..
--                 NOTIFY, then EXPIRE_MS), spec (the definition, to tell an unchanged
--                 one), runs, last (its last slot fired, ms), last_id,
--                 next (ms, "" once ended), created, note (why it ended, or
--                 why a slot made no job); for a cron in a zone of the tz
--                 database: zone (its name) and shifts (its offsets ahead,
--                 as the client read them: cron.lua's shifts_parse; the
--                 client refreshes them, the library keeps the last one
--                 when they run out).
-- Older schedules have no zone: their offset is fixed.
-- A slot's job has the id "s:<schedule id>:<slot ms>". A slot fires once:
-- the call that fires it moves next past it, a slot at or before last never
-- fires, and the job is added with existing "join" (a job kept with its id
-- is never replaced), so workers, restarts or a worker's clock cannot make
-- two runs of one slot.

do
local REGISTRY, DELAY_MS_MAX, COUNT_MAX, now_ms = H.REGISTRY, H.DELAY_MS_MAX, H.COUNT_MAX, H.now_ms
local number_in, refuse, job_fields, check_numbers = H.number_in, H.refuse, H.job_fields, H.check_numbers
local cron_parse, cron_next_in, check_add, or_default = H.cron_parse, H.cron_next_in, H.check_add, H.or_default
local add_job = H.add_job

local SCHEDULE_ID_MAX = 512
local FIRE_MAX = 100           -- due schedules fired per fetch (the rest on the next)
local EVERY_MS_MIN = 1000
local LIST_SCHEDULES_MAX = 10000

local SCHEDULE_FIELDS = { "kind", "cron", "every", "offset", "start", "stop", "limit", "catch_up",
  "job", "runs", "last", "last_id", "next", "created", "note", "zone", "shifts" }

local function schedule_key(p, id) return p .. "s:" .. id end

-- The job template of a schedule hash (a JSON array of 11 to 13 texts:
-- add's DATA .. NOTIFY, then EXPIRE_MS and GROUP), or nil.
local function job_template(text)
  local ok, t = pcall(cjson.decode, text or "")
  if not ok or type(t) ~= "table" or #t < 11 or #t > 13 then return nil end
  for i = 1, #t do if type(t[i]) ~= "string" then return nil end end
  return t
end

-- A schedule's hash read as numbers and a parsed cron, or nil and why.
local function read_schedule(key)
  local f, why = job_fields(key, unpack(SCHEDULE_FIELDS))
  if not f then return nil, why end
  local s = {}
  for i, name in ipairs(SCHEDULE_FIELDS) do s[name] = f[i] end
  if s.kind ~= "cron" and s.kind ~= "every" then return nil, "the schedule's hash has no kind" end
  for _, k in ipairs({ "every", "offset", "start", "stop", "limit", "runs", "last", "next" }) do
    s[k] = tonumber(s[k] or "")
  end
  s.limit, s.runs, s.last, s.offset = s.limit or 0, s.runs or 0, s.last or -1, s.offset or 0
  if s.kind == "cron" then
    s.spec, why = cron_parse(s.cron or "")
    if not s.spec then return nil, why end
    if (s.zone or "") ~= "" then
      s.zoned, why = H.shifts_parse(s.shifts)
      if not s.zoned then return nil, "the schedule's shifts are not a zone's offsets: " .. why end
    end
  elseif not (s.every and s.every >= EVERY_MS_MIN) then
    return nil, "the schedule's every is not a number of ms"
  end
  if not job_template(s.job) then return nil, "the schedule's job is not a template moonjob_schedule wrote" end
  return s
end

-- The first slot of s strictly after t (ms) and not before its start, or
-- nil: none before its stop (or a cron that never matches again).
local function slot_after(s, t)
  local start = s.start or 0
  local slot
  if s.kind == "every" then
    if t < start then slot = start
    else slot = start + (math.floor((t - start) / s.every) + 1) * s.every end
  else
    slot = cron_next_in(s.spec, math.max(t, start - 1), s.zoned or s.offset)
  end
  if slot and s.stop and slot > s.stop then return nil end
  return slot
end

-- Adds the job of slot (existing "join": a job kept with its id stays).
-- -> its id, or nil and why (EQUEUEFULL: the slot makes no job).
local function add_slot(p, id, s, slot, now)
  local t = job_template(s.job) -- add's DATA .. NOTIFY, then EXPIRE_MS (checked by read_schedule)
  local args = { "s:" .. id .. ":" .. string.format("%.0f", slot) }
  for i = 1, 11 do args[i + 1] = t[i] end
  args[13], args[14], args[15] = "", "join", t[12] or ""
  args[16], args[17], args[18] = "", "", t[13] or ""
  local reply = add_job(p, args, now)
  if reply.err then return nil, reply.err end
  return reply[1]
end

-- Where s goes after slot: its next slot after now, or ended (with why).
local function advance(p, id, key, s, now, note)
  local nxt = slot_after(s, now)
  if s.limit > 0 and s.runs >= s.limit then nxt, note = nil, "ended: its limit of runs was reached" end
  if not nxt then note = note or "ended: no slot before its stop" end
  if nxt and s.zoned and nxt > s.zoned.known and not note then
    note = "zone " .. s.zone .. ": its offsets are known until " .. string.format("%.0f", s.zoned.known)
      .. " ms; the last one is kept (declare the schedule again, or run a worker, to refresh them)"
  end
  redis.call("HSET", key, "next", nxt and string.format("%.0f", nxt) or "", "note", note or "")
  redis.call("ZADD", p .. "schedules", nxt or "+inf", id)
end

-- A slot fired less than ON_TIME_MS after its time is on time: a late
-- fetch (workers busy, a restart) still fires it, whatever catch_up says.
local ON_TIME_MS = 60000

-- The slot to fire of s, whose next slot is due: the latest slot at or
-- before now (earlier ones are passed over: one job per fetch), and
-- whether it is on time. When no slot fell within ON_TIME_MS, the latest
-- is not looked for: s.next (the first missed) stands for them.
local function slot_to_fire(s, now)
  local from = math.max(s.next, now - ON_TIME_MS)
  local t = from == s.next and s.next or slot_after(s, from - 1)
  if not t or t > now then return s.next, false end
  while true do
    local following = slot_after(s, t)
    if not following or following > now then return t, true end
    t = following
  end
end

-- A due schedule fires one job: for its latest due slot when that is on
-- time; else (no worker ran for a while) for the first missed slot with
-- catch_up "one", none with "none". Either way its next slot is the first
-- after now.
local function fire_one(p, id, now)
  local key = schedule_key(p, id)
  local s, why = read_schedule(key)
  if not s or not s.next then -- written around moonjob_schedule: it ends, saying why
    redis.call("ZADD", p .. "schedules", "+inf", id)
    redis.pcall("HSET", key, "next", "", "note", "ended: " .. (why or "the schedule's hash has no next"))
    return
  end
  local slot, on_time = slot_to_fire(s, now)
  local note
  if slot > s.last then
    if not on_time and s.catch_up == "none" then
      note = "slots from " .. string.format("%.0f", s.next) .. " were missed (no worker ran): skipped"
    else
      local job_id, err = add_slot(p, id, s, slot, now)
      if job_id then
        s.runs = s.runs + 1
        redis.call("HSET", key, "runs", s.runs, "last", string.format("%.0f", slot), "last_id", job_id)
      else
        note = "slot " .. string.format("%.0f", slot) .. " made no job: " .. tostring(err)
      end
    end
  end
  advance(p, id, key, s, now, note)
end

-- pcall: a schedules key of another type (written by another client) fires
-- nothing, and never stops a fetch; any other error is the fetch's (raised
-- before it takes a job). A schedule's hash that cannot be read for another
-- reason than its type raises too (read_schedule): it is not ended.
local function fire_schedules(p, now)
  local due = redis.pcall("ZRANGEBYSCORE", p .. "schedules", "-inf", now, "LIMIT", 0, FIRE_MAX)
  if H.wrong_type(due, "ZRANGEBYSCORE", p .. "schedules") then return end
  for _, id in ipairs(due) do fire_one(p, id, now) end
end

-- When the next schedule is due (server ms), or nil, also when it cannot be
-- read (fetch asks after it took jobs: a raise would lose their answer).
local function next_schedule(p)
  local first = redis.pcall("ZRANGE", p .. "schedules", 0, 0, "WITHSCORES")
  if first.err then return nil end
  local t = first[2] and tonumber(first[2])
  if t and t < math.huge then return t end
end

local SCHEDULE_NUMBERS = {
  { 4, "OFFSET_MIN must be a whole number of minutes from -1439 to 1439", -1439, 1439, true },
  { 5, "START_MS must be a whole number of ms (server time), or empty", 0, 1e15, true },
  { 6, "STOP_MS must be a whole number of ms (server time), or empty", 0, 1e15, true },
  { 7, "LIMIT must be a whole number of runs from 0 (no limit) to 2^53", 0, COUNT_MAX, true },
}

-- schedule's arguments -> the job's template (add's DATA .. NOTIFY, then
-- EXPIRE_MS), or nil and an EINPUT error reply.
local function check_schedule(args)
  local fn = "moonjob_schedule"
  if #args ~= 20 and #args ~= 21 and #args ~= 23 then
    return nil, refuse(fn, "it takes 20, 21 or 23 arguments after the key (ID KIND WHEN OFFSET_MIN START_MS STOP_MS "
      .. "LIMIT CATCH_UP, then add's DATA PRIORITY DELAY_MS ATTEMPTS BACKOFF TIMEOUT KILL_AFTER NAME CACHE "
      .. "MAX_QUEUE NOTIFY EXPIRE_MS [GROUP [ZONE SHIFTS]]), got", #args)
  end
  local id, kind, when = args[1], args[2], args[3]
  if id == "" or #id > SCHEDULE_ID_MAX then
    return nil, refuse(fn, "ID must be a name of 1 to " .. SCHEDULE_ID_MAX .. " bytes", id)
  end
  if kind == "cron" then
    local spec, why = cron_parse(when)
    if not spec then return nil, redis.error_reply("EINPUT " .. fn .. ": " .. why) end
  elseif kind == "every" then
    if not number_in(when, EVERY_MS_MIN, DELAY_MS_MAX, true) then
      return nil, refuse(fn, "WHEN of an every schedule must be a whole number of ms from 1000 to 1e12", when)
    end
  else
    return nil, refuse(fn, "KIND must be cron or every", kind)
  end
  if #args == 23 then -- a zone's
    if kind ~= "cron" or not string.find(args[22], "^[%w_+%-/]+$") or #args[22] > 128 then
      return nil, refuse(fn, "ZONE must be a zone's name (letters, digits, _ + - /) of a cron schedule", args[22])
    end
    local zone, why = H.shifts_parse(args[23])
    if not zone then return nil, redis.error_reply("EINPUT " .. fn .. ": " .. why) end
  end
  local refused = check_numbers(fn, args, SCHEDULE_NUMBERS)
  if refused then return nil, refused end
  if args[5] ~= "" and args[6] ~= "" and tonumber(args[6]) < tonumber(args[5]) then
    return nil, refuse(fn, "STOP_MS must not come before START_MS", args[6])
  end
  if args[8] ~= "" and args[8] ~= "none" and args[8] ~= "one" then
    return nil, refuse(fn, "CATCH_UP must be none (missed slots are skipped) or one (one job for them)", args[8])
  end
  local job = { "" }
  for i = 9, 19 do job[#job + 1] = args[i] end
  job[13], job[14], job[15], job[18] = "", "", args[20], args[21]
  refused = check_add(job, fn)
  if refused then return nil, refused end
  return { unpack(args, 9, math.min(#args, 21)) }
end

-- Puts fresh shifts (the client's) in a zoned schedule, and its next slot
-- by them when that is still ahead (a due one stays due: it fires).
local function refresh_shifts(p, id, key, shifts, now)
  redis.call("HSET", key, "shifts", shifts)
  local s = read_schedule(key)
  if not s or not s.next or s.next <= now then return end
  advance(p, id, key, s, now - 1, nil)
end

-- schedule(p; id, kind, when, offset_min, start_ms, stop_ms, limit, catch_up,
--   data, priority, delay_ms, attempts, backoff, timeout, kill_after, name,
--   cache, max_queue, notify, expire_ms [, group [, zone, shifts]]) -> { "created" | "updated" | "unchanged",
--   next_ms } (next_ms -1: it has ended). kind "cron" (when: 5 fields;
-- offset_min: the zone's minutes east of UTC; or zone, a name of the tz
-- database, and shifts, its offsets ahead: cron.lua's shifts_parse) or
-- "every" (when: ms; slots at start + k x every, start 0 by default). An
-- unchanged definition changes nothing but its shifts (a worker may
-- declare its schedules each time it starts: that refreshes them); a
-- changed one takes effect from now, its runs and last slot kept. A stop
-- already passed is refused, unless the definition is unchanged.
local function schedule(keys, args)
  local p = keys[1]
  local job, refused = check_schedule(args)
  if not job then return refused end
  local id, key = args[1], schedule_key(p, args[1])
  local def = { unpack(args, 2, math.min(#args, 22)) } -- (not shifts: they are refreshed)
  if (args[22] or "") ~= "" then def[3] = "" end -- nor a zone's offset now, which its changes change
  local spec = cjson.encode(def)
  local old = redis.pcall("HMGET", key, "spec", "next")
  if H.wrong_type(old, "HMGET", key) then return redis.error_reply("EINPUT moonjob_schedule: the key " .. key .. " is not a schedule "
    .. "hash (written by another client); delete it or choose another id") end
  local now = now_ms()
  if old[1] == spec then
    if args[23] then
      redis.call("HSET", key, "offset", args[4])
      refresh_shifts(p, id, key, args[23], now)
    end
    return { "unchanged", tonumber(redis.call("HGET", key, "next") or "") or -1 }
  end
  if args[6] ~= "" and tonumber(args[6]) <= now then -- (declared again unchanged, it is no mistake)
    return refuse("moonjob_schedule", "STOP_MS has passed (the server's time is "
      .. string.format("%.0f", now) .. " ms)", args[6])
  end
  redis.call("HSET", key, "kind", args[2], "cron", args[2] == "cron" and args[3] or "",
    "every", args[2] == "every" and args[3] or "", "offset", or_default(args[4], "0"), "start", args[5],
    "stop", args[6], "limit", or_default(args[7], "0"), "catch_up", or_default(args[8], "one"),
    "job", cjson.encode(job), "spec", spec, "zone", args[22] or "", "shifts", args[23] or "")
  if not old[1] then redis.call("HSET", key, "runs", 0, "created", now) end
  redis.pcall("SADD", REGISTRY, H.queue_name(p))
  local s = assert(read_schedule(key))
  advance(p, id, key, s, now - 1, nil) -- a slot at now is due now
  local nxt = redis.call("HGET", key, "next")
  return { old[1] and "updated" or "created", tonumber(nxt) or -1 }
end

-- schedule_shifts(p; zone, shifts) -> how many schedules of the zone took
-- them: a worker's refresh of its zones' offsets ahead (moonjob.redis.zones).
local function schedule_shifts(keys, args)
  local p, fn = keys[1], "moonjob_schedule_shifts"
  if #args ~= 2 or args[1] == "" then return refuse(fn, "it takes ZONE SHIFTS; arguments given", #args) end
  local _, why = H.shifts_parse(args[2])
  if why then return redis.error_reply("EINPUT " .. fn .. ": " .. why) end
  local ids = redis.pcall("ZRANGE", p .. "schedules", 0, -1)
  if H.wrong_type(ids, "ZRANGE", p .. "schedules") then return 0 end
  local n, now = 0, now_ms()
  for _, id in ipairs(ids) do
    local key = schedule_key(p, id)
    local zone = redis.pcall("HGET", key, "zone")
    if zone == args[1] then
      refresh_shifts(p, id, key, args[2], now)
      n = n + 1
    end
  end
  return n
end

-- unschedule(p; id) -> 1, or 0 when no such schedule (its jobs stay).
local function unschedule(keys, args)
  local p, id = keys[1], args[1]
  if not id or id == "" then return refuse("moonjob_unschedule", "it takes ID", "") end
  local gone = redis.call("ZREM", p .. "schedules", id)
  return math.max(gone, redis.call("DEL", schedule_key(p, id)))
end

-- schedules(p; offset, limit) -> { total, { id, field... }, ... }: the
-- schedules by next slot (ended ones last), fields as SCHEDULE_FIELDS.
local function schedules(keys, args)
  local p, fn = keys[1], "moonjob_schedules"
  local refused = check_numbers(fn, args, {
    { 1, "OFFSET must be a whole number from 0 to 2^53", 0, COUNT_MAX, true },
    { 2, "LIMIT must be a whole number from 1 to " .. LIST_SCHEDULES_MAX, 1, LIST_SCHEDULES_MAX, true } })
  if refused then return refused end
  local offset, limit = tonumber(args[1] or "") or 0, tonumber(args[2] or "") or 100
  local out = { redis.call("ZCARD", p .. "schedules") }
  for _, id in ipairs(redis.call("ZRANGE", p .. "schedules", offset, offset + limit - 1)) do
    local f = redis.pcall("HMGET", schedule_key(p, id), unpack(SCHEDULE_FIELDS))
    local row = { id }
    local bad = H.wrong_type(f, "HMGET", schedule_key(p, id))
    for i = 1, #SCHEDULE_FIELDS do row[i + 1] = (not bad and f[i]) or false end
    out[#out + 1] = row
  end
  return out
end

S.schedule_key, S.fire_schedules, S.next_schedule = schedule_key, fire_schedules, next_schedule
F.schedule, F.unschedule, F.schedules, F.schedule_shifts = schedule, unschedule, schedules, schedule_shifts
end
