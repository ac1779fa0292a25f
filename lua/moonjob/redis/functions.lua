#!lua name=moonjob
-- moonjob's queue, as a library of Redis Functions (Redis 7). This file runs
-- inside Redis, not in moonjob: workers and producers load it (FUNCTION LOAD
-- REPLACE) when they connect and the server's copy is not this text, or when
-- a call meets "Function not found" (moonjob.redis.setup; an ACL user that
-- may not load it uses an admin's copy at this version), and every change
-- of a queue's state is one FCALL, so it is atomic. docs/REDIS.md is the
-- contract for other languages. Bump version() below with any change of
-- what a function takes or answers.
--
-- KEYS[1] of every call is the queue's prefix, "mj:{<queue>}:"; every key of
-- the queue starts with it, so all of them share one hash tag (one cluster
-- slot). Keys:
--   <p>seq         counter: order of arrival (first in, first out per priority)
--   <p>ids         counter: the ids moonjob draws
--   <p>totals      hash: completed, failed (every job that ever ended so),
--                  missing (set entries whose job hash was gone: evicted,
--                  deleted by hand)
--   <p>j:<id>      hash: one job (fields below)
--   <p>wait        sorted set: jobs ready to run; score = priority (lower
--                  first), member = 16-digit arrival number .. ":" .. id
--   <p>delayed     sorted set: id by the time it may run (ms, server clock)
--   <p>active      sorted set: id by the time its lease expires (ms)
--   <p>completed   sorted set: id by the time it finished (ms)
--   <p>failed      sorted set: id by the time it failed for good (ms)
--   <p>events      pub/sub channel for workers: "added", "cancel <id>"
--   <p>done        pub/sub channel for producers: "<id>" of a job added with
--                  notify that ended
--   <p>tokens      counter: the tokens of runs
--   <p>paused      string: present while the queue is paused (fetch hands
--                  out nothing)
--   <p>log:<id>    list: a job's last log lines (moonjob_log)
--   <p>m:<minute>  hash: one minute's metrics (record_metrics), kept 25 h
--   <p>m:all       hash: the same since ever
--   <p>updates     pub/sub channel for producers: a running job's progress
--                  and log lines, as JSON
--   <p>debounce:<id>  string: the job a debounce id holds while it is delayed
--   <p>schedules, <p>s:<id>  the schedules (see "schedules" below)
--   <p>groups, <p>gparked, <p>gw:<group>, <p>ga:<group>, <p>gs:<group>,
--   <p>gl:<group>, <p>ungrouped, <p>turn  the groups (see "groups" below)
-- Job fields: data (JSON text), priority, attempts (allowed), made (attempts
-- started), backoff (JSON text or ""), timeout, kill_after, name, cache (s),
-- state (waiting, delayed, active, completed, failed), token (of the run
-- holding the lease), worker, result (JSON text), error (JSON text), cancel
-- (the reason, once asked while active), created, started, finished, run_at
-- (ms), member (its wait member), notify ("1": publish its id on <p>done),
-- cache_until (ms), nonce (tells this job from a later one with its id),
-- progress (JSON text, the last reported), expire_at (ms: not started by
-- then, it fails with EEXPIRED), group (its group, absent for none).
--
-- Time is always the server's (TIME), never a worker's clock. Results and
-- failures carrying a token that is not the job's current one are refused:
-- a worker that lost its lease cannot overwrite the run that replaced it.
--
-- Redis does not roll a function back when it raises, so every function
-- checks all its arguments before its first write (EINPUT error replies), and
-- reads job hashes with redis.pcall: a job key of another type, a hash that
-- is gone or a field out of range is that job's failure (EINPUT, kept in
-- <p>failed) or a count in <p>totals "missing", never the whole call's.

-- A job's id, name and backoff are small: a fetch reply's bound counts on it.
local FIELD_MAX = 1024
local REGISTRY = "mj:queues"   -- the names of the queues (moonjob.queues); see add
local SECONDS_MAX = 1e9        -- timeout, kill_after, cache: the pool's own bound
local DELAY_MS_MAX = 1e12      -- SECONDS_MAX in ms
local ATTEMPTS_MAX = 2 ^ 31
local COUNT_MAX = 2 ^ 53
local NONCE_MAX = 128

local function now_ms()
  local t = redis.call("TIME")
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function job_key(p, id) return p .. "j:" .. id end

-- The groups' functions (fairness and limits per group), filled in under
-- "groups" below; a table, since the paths that move jobs call them.
local G = {}

local function publish(p, message)
  redis.call("PUBLISH", p .. "events", message)
end

local function err_json(code, message) -- (keys in sorted order, as moonjob.codec.json writes them)
  return '{"code":' .. cjson.encode(code) .. ',"message":' .. cjson.encode(message) .. "}"
end

-- text as a number from low to high (whole: no fraction), or nil. tonumber
-- reads "nan" and "inf" as numbers: NaN fails every comparison.
local function number_in(text, low, high, whole)
  local n = tonumber(text)
  if not n or not (n >= low and n <= high) then return nil end
  if whole and n % 1 ~= 0 then return nil end
  return n
end

-- A refusal of a call's arguments (nothing was written).
local function refuse(fn, what, value)
  return redis.error_reply(("EINPUT %s: %s, not '%s'"):format(fn, what, tostring(value):sub(1, 64)))
end

-- A job's fields, or nil and why: redis.pcall, since HMGET on a key of
-- another type raises (and a raise would stop the call half done).
local function job_fields(key, ...)
  local f = redis.pcall("HMGET", key, ...)
  if f.err then
    return nil, ("the key %s holds a %s, not a job hash (written by another client)"):format(
      key, redis.call("TYPE", key).ok)
  end
  return f
end

-- Adds n to a count of <p>totals. redis.pcall: the totals are statistics,
-- and a totals key another client spoiled (a field that is not a number, a
-- key of another type) must not stop the state change that counts in it
-- half written.
local function count_total(p, field, n)
  redis.pcall("HINCRBY", p .. "totals", field, n)
end

local function count_missing(p, n)
  if n > 0 then count_total(p, "missing", n) end
end

-- Run-time metrics, kept by the calls that end jobs: per minute (<p>m:<minute
-- number>, a hash kept METRICS_TTL seconds) and since ever (<p>m:all). Fields:
-- c (completed), f (failed), n (runs with a run time), s (their run ms
-- summed), h1..h15 (runs per bucket: run ms <= RUN_BUCKETS[i]; h15 above the last).
local RUN_BUCKETS = { 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 300000 }
local METRICS_TTL = 90000 -- 25 hours: the last day, whole

local function run_bucket(ms)
  for i, bound in ipairs(RUN_BUCKETS) do
    if ms <= bound then return i end
  end
  return #RUN_BUCKETS + 1
end

-- completed, failed: jobs that ended so; runs: the run ms of those that ran
-- (a list). A spoiled metrics key (another type) is skipped, never raised.
local function record_metrics(p, now, completed, failed, runs)
  local fields = {}
  if completed > 0 then fields.c = completed end
  if failed > 0 then fields.f = failed end
  if #runs > 0 then
    local sum = 0
    for _, ms in ipairs(runs) do
      sum = sum + ms
      local h = "h" .. run_bucket(ms)
      fields[h] = (fields[h] or 0) + 1
    end
    fields.n, fields.s = #runs, sum
  end
  local minute = p .. "m:" .. math.floor(now / 60000)
  for _, key in ipairs({ minute, p .. "m:all" }) do
    for field, n in pairs(fields) do redis.pcall("HINCRBY", key, field, n) end
  end
  redis.pcall("EXPIRE", minute, METRICS_TTL, "NX")
end

-- The run ms of a job that ran from `started` (text) to now, or nil.
local function run_ms(started, now)
  local t = tonumber(started)
  if t and t <= now then return now - t end
end

-- A job's log lines (job:log() and its output on a worker): a list.
local function log_key(p, id) return p .. "log:" .. id end

-- A job and its log, deleted.
local function delete_job(p, id, key)
  redis.call("DEL", key, log_key(p, id))
end

-- Finished jobs are kept by count and by age, a bounded amount of work per
-- call (so a backlog is removed over the next calls). A completed job whose
-- result is cached stays readable until its cache ends.
local function trim(p, set, keep_count, keep_age_ms, now, most)
  local removed = {}
  local old = redis.call("ZRANGEBYSCORE", p .. set, "-inf", now - keep_age_ms, "LIMIT", 0, most)
  for _, id in ipairs(old) do removed[#removed + 1] = id end
  local extra = keep_count < math.huge and redis.call("ZCARD", p .. set) - #removed - keep_count or 0
  if extra > 0 then
    local oldest = redis.call("ZRANGE", p .. set, #removed, #removed + math.min(extra, most) - 1)
    for _, id in ipairs(oldest) do removed[#removed + 1] = id end
  end
  for _, id in ipairs(removed) do
    redis.call("ZREM", p .. set, id)
    local key = job_key(p, id)
    local f = job_fields(key, "cache_until")
    local cache_until = f and tonumber(f[1]) or 0
    if cache_until > now then
      redis.call("PEXPIREAT", key, cache_until)
      redis.call("PEXPIREAT", log_key(p, id), cache_until)
    else
      delete_job(p, id, key)
    end
  end
end

-- fetch's KEEP_COUNT and KEEP_AGE_MS come in args[4], args[5].
-- At most max(100, 2 x the fetch's batch) per state and call: more than the
-- batch can finish, so retention keeps up under any load.
-- An empty keep_count keeps any number (by age only); keep_failed_age_ms
-- (args[7]) is failed jobs' age, keep_age_ms when absent.
local function retain(p, args, now, batch)
  local keep_count = tonumber(args[4]) or math.huge
  local keep_age = tonumber(args[5]) or 86400000
  local keep_failed_age = tonumber(args[7] or "") or keep_age
  local most = math.max(100, 2 * batch)
  trim(p, "completed", keep_count, keep_age, now, most)
  trim(p, "failed", keep_count, keep_failed_age, now, most)
end

-- prio: the job's priority when the caller read it already. One that is not
-- a finite number (written around moonjob_add) waits with 0: ZADD refuses NaN,
-- and the fetch that takes the job fails it with EINPUT.
-- member: its place in line to keep (a job given back goes where it was).
-- group: the job's group when the caller passed prio (nil or "": none).
local function make_waiting(p, id, key, now, prio, member, group)
  if prio == nil then
    local f = redis.call("HMGET", key, "priority", "group")
    prio, group = f[1], f[2]
  end
  prio = number_in(prio, -math.huge, math.huge) or 0
  if not (member and string.sub(member, 18) == id) then
    member = string.format("%016d", redis.call("INCR", p .. "seq")) .. ":" .. id
  end
  redis.call("HSET", key, "state", "waiting", "member", member, "run_at", now)
  if redis.call("ZCARD", p .. "wait") == 0 then publish(p, "added") end
  G.index(p, group or "", prio, member, now) -- (before wait: the switch to groups copies wait)
  redis.call("ZADD", p .. "wait", prio, member)
end

local function make_delayed(p, id, key, run_at)
  redis.call("HSET", key, "state", "delayed", "run_at", run_at)
  redis.call("ZADD", p .. "delayed", run_at, id)
end

-- f: the job's cache, notify, started and group fields when the caller read
-- them already; f.batched: the caller records metrics and totals for the batch;
-- f.run_ms: the run time its worker measured (then it began run_ms ago).
local function finish(p, id, key, state, field, value, now, f)
  f = f or redis.call("HMGET", key, "cache", "notify", "started", "group")
  local cache = state == "completed" and number_in(f[1], 0, SECONDS_MAX) or 0
  redis.call("ZREM", p .. "active", id)
  G.left(p, f[4], id)
  local fields = { "HSET", key, "state", state, field, value, "finished", now, "token", "" }
  if cache > 0 then
    fields[#fields + 1] = "cache_until"; fields[#fields + 1] = now + math.floor(cache * 1000)
  end
  if f.run_ms then fields[#fields + 1] = "began"; fields[#fields + 1] = now - f.run_ms end
  redis.call(unpack(fields))
  redis.call("ZADD", p .. state, now, id)
  if not f.batched then
    count_total(p, state, 1)
    local ms = f.ran and (f.run_ms or run_ms(f[3], now))
    record_metrics(p, now, state == "completed" and 1 or 0, state == "failed" and 1 or 0, { ms })
  end
  if f[2] == "1" then redis.call("PUBLISH", p .. "done", id) end
end

-- A job moonjob cannot run fails for good with EINPUT (or code), kept in
-- <p>failed with the reason. wrong_type: its key is not a hash; it is
-- replaced by a failed job's hash that says so.
local function fail_entry(p, id, key, now, why, wrong_type, code)
  if wrong_type then -- its nonce is lost with it: "*" answers to any handle
    redis.call("DEL", key)
    redis.call("HSET", key, "id", id, "made", 0, "attempts", 1, "created", now, "nonce", "*")
    why = why .. "; replaced by this failed job"
  end
  finish(p, id, key, "failed", "error", err_json(code or "EINPUT", why), now)
end

-- A set entry whose job is not in want_state: f, its fields read with
-- job_fields (f[1] the state), or nil and why (its key is not a hash). ->
-- "missing" (its hash is gone: counted), "stale" (the job is in another state:
-- only the entry is dropped) or "bad" (failed with EINPUT here).
local function classify(p, id, key, now, f, why)
  if not f then
    fail_entry(p, id, key, now, why, true)
    return "bad"
  end
  local state = f[1]
  if not state then
    if redis.call("EXISTS", key) == 0 then return "missing" end
    fail_entry(p, id, key, now, "the job's hash has no state (written around moonjob_add)")
    return "bad"
  end
  if state == "waiting" or state == "delayed" or state == "active" or state == "completed"
      or state == "failed" then
    return "stale"
  end
  fail_entry(p, id, key, now, "the job's state '" .. tostring(state):sub(1, 64) .. "' is not one moonjob knows")
  return "bad"
end

-- A set entry found by fetch's housekeeping: "ok" with the job's fields
-- (state first, then the ones asked), or what classify says.
local function look_at(p, id, key, want_state, now, ...)
  local f, why = job_fields(key, "state", ...)
  if f and f[1] == want_state then return "ok", f end
  return classify(p, id, key, now, f, why)
end
-- Checks numeric arguments: each spec { index, what it must be, low, high,
-- whole }; an empty or absent argument takes its default. -> an EINPUT error
-- reply, or nil.
local function check_numbers(fn, args, specs)
  for _, s in ipairs(specs) do
    local v = args[s[1]]
    if v ~= nil and v ~= "" and not number_in(v, s[3], s[4], s[5]) then
      return refuse(fn, s[2], v)
    end
  end
end

local FINITE = 1.7976931348623157e308 -- the largest double: inf and NaN are beyond it

-- A job whose lease expired ran on a worker that stopped renewing (killed,
-- cut off, paused): it runs again, counting an attempt (ESTALLED), or fails
-- for good once its attempts are used up. f: state, made, attempts, worker,
-- cancel, ran, group.
local function recover_one(p, id, key, now, f)
  local made, attempts = tonumber(f[2]) or 0, tonumber(f[3]) or 1
  local e = err_json("ESTALLED", "the job's lease expired on worker " .. tostring(f[4])
    .. " (killed, cut off or paused)")
  if f[6] ~= "1" then -- its worker never said it started: the attempt is not counted
    made = redis.call("HINCRBY", key, "made", -1)
  end
  if f[5] then
    finish(p, id, key, "failed", "error", err_json("ECANCELED", f[5]), now)
  elseif made >= attempts then
    finish(p, id, key, "failed", "error", e, now)
  else
    redis.call("ZREM", p .. "active", id)
    G.left(p, f[7], id)
    redis.call("HSET", key, "error", e, "token", "")
    make_waiting(p, id, key, now)
  end
end

local function recover_stalled(p, now)
  local stalled = redis.call("ZRANGEBYSCORE", p .. "active", "-inf", now, "LIMIT", 0, 100)
  local missing = 0
  for _, id in ipairs(stalled) do
    local key = job_key(p, id)
    local kind, f = look_at(p, id, key, "active", now, "made", "attempts", "worker", "cancel", "ran", "group")
    if kind == "ok" then
      recover_one(p, id, key, now, f)
    elseif kind ~= "bad" then -- gone, or in another state: only the entry goes
      redis.call("ZREM", p .. "active", id)
      if kind == "missing" then missing = missing + 1 end
    end
  end
  count_missing(p, missing)
  return #stalled
end

local function promote_delayed(p, now)
  local due = redis.call("ZRANGEBYSCORE", p .. "delayed", "-inf", now, "LIMIT", 0, 1000)
  local missing = 0
  for _, id in ipairs(due) do
    redis.call("ZREM", p .. "delayed", id)
    local key = job_key(p, id)
    local kind, f = look_at(p, id, key, "delayed", now, "priority", "group")
    if kind == "ok" then
      make_waiting(p, id, key, now, f[2], nil, f[3])
    elseif kind == "missing" then
      missing = missing + 1
    end
  end
  count_missing(p, missing)
end

-- Cron expressions: cron_parse reads the standard 5 fields (minute hour
-- day-of-month month day-of-week: numbers, names, '*', ranges, steps, lists)
-- and the @ macros; cron_next finds the next minute they match. Days follow
-- Vixie cron: when day-of-month and day-of-week are both restricted (neither
-- starts with '*'), a day matching either one runs; otherwise both must
-- match. Wall times are in a fixed offset from UTC (daylight saving is not
-- modelled), and the calendar is computed here (Redis's Lua has no os.date):
-- proleptic Gregorian, leap years by its rule.
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
-- starts with '*').
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
    dom_star = fields[3]:sub(1, 1) == "*", dow_star = fields[5]:sub(1, 1) == "*" }
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

local CRON_NUMBERS = {
  { 2, "FROM_MS must be a whole number of ms from 0 to 1e15 (empty: the server's time)", 0, 1e15, true },
  { 3, "OFFSET_MIN must be a whole number of minutes from -1439 to 1439 (the zone's offset from UTC)",
    -1439, 1439, true },
  { 4, "COUNT must be a whole number from 1 to 100", 1, 100, true },
}

-- cron(p; cron, from_ms, offset_min, count) -> { ms, ... }: the next count
-- (default 1) times after from_ms (empty: the server's time) whose wall time
-- at UTC + offset_min (default 0) minutes matches cron; fewer only if none
-- comes within CRON_YEARS. Writes nothing; p only routes the call.
local function cron(keys, args)
  local fn = "moonjob_cron"
  if #args < 1 then return refuse(fn, "it takes CRON [FROM_MS [OFFSET_MIN [COUNT]]]; arguments given", #args) end
  local refused = check_numbers(fn, args, CRON_NUMBERS)
  if refused then return refused end
  local spec, why = cron_parse(args[1])
  if not spec then return redis.error_reply("EINPUT " .. fn .. ": " .. why) end
  local after = (args[2] == nil or args[2] == "") and now_ms() or tonumber(args[2])
  local offset = tonumber(args[3]) or 0
  local out = {}
  for i = 1, tonumber(args[4]) or 1 do
    after = cron_next(spec, after, offset)
    if not after then break end
    out[i] = after
  end
  return out
end

local ADD_NUMBERS = {
  { 3, "PRIORITY must be a finite number (lower runs first)", -FINITE, FINITE },
  { 4, "DELAY_MS must be a number of ms from 0 to 1e12", 0, DELAY_MS_MAX },
  { 5, "ATTEMPTS must be a whole number from 1 to 2^31", 1, ATTEMPTS_MAX, true },
  { 7, "TIMEOUT must be a number of seconds from 0 (none) to 1e9", 0, SECONDS_MAX },
  { 8, "KILL_AFTER must be a number of seconds from 0 (the worker's) to 1e9", 0, SECONDS_MAX },
  { 10, "CACHE must be a number of seconds from 0 to 1e9", 0, SECONDS_MAX },
  { 11, "MAX_QUEUE must be a whole number from 0 (no bound) to 2^53", 0, COUNT_MAX, true },
}

-- add's EXPIRE_MS, DEBOUNCE_ID and DEBOUNCE_MS (args[15..17], optional) ->
-- an EINPUT error reply, or nil.
local function check_expire_debounce(args, fn)
  local refused = check_numbers(fn, args, {
    { 15, "EXPIRE_MS must be a whole number of ms from 1 to 1e12, or empty", 1, DELAY_MS_MAX, true },
    { 17, "DEBOUNCE_MS must be a whole number of ms from 1 to 1e12", 1, DELAY_MS_MAX, true } })
  if refused then return refused end
  local debounce_id, debounce_ms = args[16] or "", tonumber(args[17] or "")
  if debounce_id ~= "" then
    if #debounce_id > FIELD_MAX then return refuse(fn, "DEBOUNCE_ID must take at most " .. FIELD_MAX .. " bytes", "...") end
    if not debounce_ms then return refuse(fn, "DEBOUNCE_ID needs DEBOUNCE_MS (the delay each add restarts)", "") end
    if args[1] ~= "" then return refuse(fn, "ID must be empty with DEBOUNCE_ID (the job's id is drawn)", args[1]) end
    if (tonumber(args[4]) or 0) > 0 then
      return refuse(fn, "DELAY_MS must be 0 with DEBOUNCE_ID (DEBOUNCE_MS is the delay)", args[4])
    end
  elseif debounce_ms then
    return refuse(fn, "DEBOUNCE_MS needs DEBOUNCE_ID", args[17])
  end
  local expire, delay = tonumber(args[15] or ""), debounce_ms or tonumber(args[4]) or 0
  if expire and expire <= delay then
    return refuse(fn, ("EXPIRE_MS must be more than the delay (%.0f ms): the job would expire before it may run")
      :format(delay), args[15])
  end
end

-- add's arguments -> an EINPUT error reply, or nil.
local function check_add(args, fn)
  fn = fn or "moonjob_add"
  if #args < 12 then
    return refuse(fn, "it takes 12 arguments after the key (ID DATA PRIORITY DELAY_MS ATTEMPTS BACKOFF TIMEOUT "
      .. "KILL_AFTER NAME CACHE MAX_QUEUE NOTIFY [NONCE [EXISTING]]), got", #args)
  end
  if #args[1] > FIELD_MAX or #args[9] > FIELD_MAX or #args[6] > FIELD_MAX then
    return redis.error_reply("EINPUT a job's id, name and backoff must each take at most "
      .. FIELD_MAX .. " bytes")
  end
  if args[2] == "" then return refuse(fn, "DATA must be JSON text", "") end
  local refused = check_numbers(fn, args, ADD_NUMBERS)
  if refused then return refused end
  if args[6] ~= "" then
    local ok, spec = pcall(cjson.decode, args[6])
    if not ok or type(spec) ~= "table" then
      return refuse(fn, "BACKOFF must be empty or a JSON object such as {\"type\":\"fixed\",\"delay\":1}", args[6])
    end
  end
  if args[12] ~= "" and args[12] ~= "0" and args[12] ~= "1" then
    return refuse(fn, "NOTIFY must be 1 (publish the id on <prefix>done when the job ends) or 0", args[12])
  end
  if args[13] and #args[13] > NONCE_MAX then
    return refuse(fn, "NONCE must take at most " .. NONCE_MAX .. " bytes", args[13])
  end
  if args[14] and args[14] ~= "" and args[14] ~= "replace" and args[14] ~= "join" then
    return refuse(fn, "EXISTING must be replace (a finished job with the id is replaced) or join", args[14])
  end
  if args[18] and #args[18] > FIELD_MAX then
    return refuse(fn, "GROUP must take at most " .. FIELD_MAX .. " bytes (empty: no group)", "...")
  end
  return check_expire_debounce(args, fn)
end

-- add's reply: the nonce only to a caller that passed NONCE (an older one
-- may take exactly three elements).
local function added(args, id, state, joined, nonce)
  if args[13] == nil then return { id, state, joined } end
  return { id, state, joined, nonce or "" }
end

local function or_default(text, default)
  if text == nil or text == "" then return default end
  return text
end

-- A job's expire_at: EXPIRE_MS (args[15]) from now; fetch fails it with
-- EEXPIRED once past (it never runs, nor runs again).
local function set_expire(key, args, now)
  local expire = tonumber(args[15] or "")
  if expire then redis.call("HSET", key, "expire_at", now + expire) end
end

-- <p>debounce:<id>: the id of the job a debounce id holds while it is
-- delayed (kept DEBOUNCE_KEEP_MS past its delay, then it expires).
local DEBOUNCE_KEEP_MS = 60000
local function debounce_key(p, debounce_id) return p .. "debounce:" .. debounce_id end

-- An add with DEBOUNCE_ID whose job is still delayed: that job takes this
-- add's data and options, and its delay starts again. -> add's reply, or
-- nil (no such job delayed: a new one is made, and the key names it).
local function debounce(p, args, now)
  local held = redis.pcall("GET", debounce_key(p, args[16]))
  if type(held) ~= "string" then return nil end -- none, or a key of another type (SET replaces it)
  local key = job_key(p, held)
  local f = job_fields(key, "state", "nonce", "debounce", "made")
  -- only the job it made, delayed and never run (not one waiting out a
  -- retry's backoff, nor another job that got its id after a data loss)
  if not (f and f[1] == "delayed" and f[3] == args[16] and f[4] == "0") then return nil end
  local delay = tonumber(args[17])
  redis.call("HSET", key, "data", args[2], "priority", or_default(args[3], "0"), "attempts",
    or_default(args[5], "1"), "backoff", args[6], "timeout", or_default(args[7], "0"), "kill_after",
    or_default(args[8], "0"), "name", args[9], "cache", or_default(args[10], "0"))
  if args[12] == "1" then redis.call("HSET", key, "notify", "1") end
  redis.call("HDEL", key, "expire_at", "group")
  set_expire(key, args, now)
  if (args[18] or "") ~= "" then redis.call("HSET", key, "group", args[18]) end
  make_delayed(p, held, key, now + delay)
  redis.call("PEXPIRE", debounce_key(p, args[16]), delay + DEBOUNCE_KEEP_MS)
  return added(args, held, "delayed", 1, f[2])
end

-- add(p; id, data, priority, delay_ms, attempts, backoff, timeout, kill_after,
--     name, cache, max_queue, notify [, nonce [, existing [, expire_ms
--     [, debounce_id, debounce_ms [, group]]]]]) -> { id, state, joined [, nonce] }
-- id "" draws a number; id "\0dedupe" is "d:" .. the SHA-1 of data. A job with
-- that id waiting, delayed or running is joined (joined = 1); a completed one
-- whose cache has not ended is returned as it is, and with existing "join"
-- any finished one still kept; otherwise the id starts a new job. nonce (""
-- or absent: made here) is stored with the job; a call that passed one gets
-- the job's nonce back (its own, or the joined job's): get and cancel given it
-- answer only for this job, never for a later one with the same id (a data
-- loss restarts the id counter). expire_ms: a job not started by then fails
-- with EEXPIRED. debounce_id (id empty, delay_ms 0): while the job it last
-- made is delayed, an add replaces that job's data and options and restarts
-- its delay of debounce_ms (joined = 1); otherwise a new job is made,
-- delayed debounce_ms. group: the job's group (see "groups"; "" none).
-- add_job does it once the arguments are checked (a schedule's slots are
-- added through it too).
local function add_job(p, args, now)
  local id, data = args[1], args[2]
  if (args[16] or "") ~= "" then
    local reply = debounce(p, args, now)
    if reply then return reply end
  end
  if id == "" then -- a number no job holds (an explicit id may have taken it)
    repeat id = tostring(redis.call("INCR", p .. "ids")) until redis.call("EXISTS", job_key(p, id)) == 0
  elseif id == "\0dedupe" then id = "d:" .. redis.sha1hex(data) end
  local key = job_key(p, id)
  local f, why = job_fields(key, "state", "cache_until", "nonce")
  if not f then return redis.error_reply("EINPUT moonjob_add: " .. why .. "; delete it or choose another id") end
  local state = f[1]
  if state == "waiting" or state == "delayed" or state == "active"
      or (state == "completed" and (tonumber(f[2]) or 0) > now)
      or ((state == "completed" or state == "failed") and args[14] == "join") then
    if args[12] == "1" and state ~= "completed" and state ~= "failed" then redis.call("HSET", key, "notify", "1") end
    return added(args, id, state, 1, f[3])
  end
  local max_queue = tonumber(or_default(args[11], 0))
  if max_queue > 0 and redis.call("ZCARD", p .. "wait") + redis.call("ZCARD", p .. "delayed") >= max_queue then
    return redis.error_reply("EQUEUEFULL the queue holds max_queue (" .. max_queue .. ") waiting jobs")
  end
  if state then
    redis.call("ZREM", p .. "completed", id)
    redis.call("ZREM", p .. "failed", id)
  end
  delete_job(p, id, key) -- a finished job, or a hash written around moonjob_add
  local nonce = or_default(args[13], nil) or (now .. "." .. redis.call("INCR", p .. "seq"))
  local prio = or_default(args[3], "0")
  redis.call("HSET", key, "id", id, "data", data, "priority", prio, "attempts", or_default(args[5], "1"),
    "made", 0, "backoff", args[6], "timeout", or_default(args[7], "0"), "kill_after", or_default(args[8], "0"),
    "name", args[9], "cache", or_default(args[10], "0"), "notify", args[12], "created", now, "nonce", nonce)
  set_expire(key, args, now)
  local group = args[18] or ""
  if group ~= "" then redis.call("HSET", key, "group", group) end
  -- the registry moonjob.queues() reads; pcall: the one key outside the
  -- queue's prefix, which an ACL user kept to its own keys may not write
  redis.pcall("SADD", REGISTRY, string.sub(p, 5, -3))
  local delay = math.floor(tonumber(or_default(args[4], 0)))
  if (args[16] or "") ~= "" then
    delay = tonumber(args[17])
    redis.call("HSET", key, "debounce", args[16])
    redis.call("SET", debounce_key(p, args[16]), id, "PX", delay + DEBOUNCE_KEEP_MS)
  end
  if delay > 0 then
    make_delayed(p, id, key, now + delay)
    return added(args, id, "delayed", 0, nonce)
  end
  make_waiting(p, id, key, now, prio, nil, group)
  return added(args, id, "waiting", 0, nonce)
end

local function add(keys, args)
  local refused = check_add(args)
  if refused then return refused end
  return add_job(keys[1], args, now_ms())
end

-------------------------------------------------------------- schedules ---
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
--                 why a slot made no job).
-- A slot's job has the id "s:<schedule id>:<slot ms>". A slot fires once:
-- the call that fires it moves next past it, a slot at or before last never
-- fires, and the job is added with existing "join" (a job kept with its id
-- is never replaced), so workers, restarts or a worker's clock cannot make
-- two runs of one slot.

local SCHEDULE_ID_MAX = 512
local FIRE_MAX = 100           -- due schedules fired per fetch (the rest on the next)
local EVERY_MS_MIN = 1000
local LIST_SCHEDULES_MAX = 10000

local SCHEDULE_FIELDS = { "kind", "cron", "every", "offset", "start", "stop", "limit", "catch_up",
  "job", "runs", "last", "last_id", "next", "created", "note" }

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
    slot = cron_next(s.spec, math.max(t, start - 1), s.offset)
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
-- nothing, and never stops a fetch.
local function fire_schedules(p, now)
  local due = redis.pcall("ZRANGEBYSCORE", p .. "schedules", "-inf", now, "LIMIT", 0, FIRE_MAX)
  if due.err then return end
  for _, id in ipairs(due) do fire_one(p, id, now) end
end

-- When the next schedule is due (server ms), or nil.
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
  if #args ~= 20 and #args ~= 21 then
    return nil, refuse(fn, "it takes 20 or 21 arguments after the key (ID KIND WHEN OFFSET_MIN START_MS STOP_MS "
      .. "LIMIT CATCH_UP, then add's DATA PRIORITY DELAY_MS ATTEMPTS BACKOFF TIMEOUT KILL_AFTER NAME CACHE "
      .. "MAX_QUEUE NOTIFY EXPIRE_MS [GROUP]), got", #args)
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
  return { unpack(args, 9, #args) }
end

-- schedule(p; id, kind, when, offset_min, start_ms, stop_ms, limit, catch_up,
--   data, priority, delay_ms, attempts, backoff, timeout, kill_after, name,
--   cache, max_queue, notify, expire_ms [, group]) -> { "created" | "updated" | "unchanged", next_ms }
-- (next_ms -1: it has ended). kind "cron" (when: 5 fields; offset_min: the
-- zone's minutes east of UTC) or "every" (when: ms; slots at start + k x
-- every, start 0 by default). An unchanged definition changes nothing (a
-- worker may declare its schedules each time it starts); a changed one
-- takes effect from now, its runs and last slot kept.
local function schedule(keys, args)
  local p = keys[1]
  local job, refused = check_schedule(args)
  if not job then return refused end
  local id, key = args[1], schedule_key(p, args[1])
  local spec = cjson.encode({ unpack(args, 2, #args) })
  local old = redis.pcall("HMGET", key, "spec", "next")
  if old.err then return redis.error_reply("EINPUT moonjob_schedule: the key " .. key .. " is not a schedule "
    .. "hash (written by another client); delete it or choose another id") end
  if old[1] == spec then return { "unchanged", tonumber(old[2] or "") or -1 } end
  local now = now_ms()
  redis.call("HSET", key, "kind", args[2], "cron", args[2] == "cron" and args[3] or "",
    "every", args[2] == "every" and args[3] or "", "offset", or_default(args[4], "0"), "start", args[5],
    "stop", args[6], "limit", or_default(args[7], "0"), "catch_up", or_default(args[8], "one"),
    "job", cjson.encode(job), "spec", spec)
  if not old[1] then redis.call("HSET", key, "runs", 0, "created", now) end
  redis.pcall("SADD", REGISTRY, string.sub(p, 5, -3))
  local s = assert(read_schedule(key))
  advance(p, id, key, s, now - 1, nil) -- a slot at now is due now
  local nxt = redis.call("HGET", key, "next")
  return { old[1] and "updated" or "created", tonumber(nxt) or -1 }
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
    for i = 1, #SCHEDULE_FIELDS do row[i + 1] = (not f.err and f[i]) or false end
    out[#out + 1] = row
  end
  return out
end

---------------------------------------------------------------- limits ---
-- Limits across every worker of a queue, kept in Redis and applied by
-- fetch with the server's clock:
--   <p>limits   hash: rate_max, rate_per (ms): at most rate_max jobs handed
--               out in any rate_per ms; concurrency: at most that many
--               active at once (held or running); group_rate_max,
--               group_rate_per, group_concurrency: the same for each
--               group (see "groups")
--   <p>starts   sorted set: the tokens handed out in the last rate_per ms,
--               by the time they were (a sliding window: exact for any
--               window, not only whole seconds)
--   <p>limited  string: present while the queue holds back after a job
--               said the remote side pushed back (ERATELIMIT); its TTL is
--               how long
-- Under a rate, fetch hands out no more jobs than the worker has idle
-- children (FREE): a job held, not started, would start later than it
-- counted. Under a concurrency cap held jobs count as active: a worker may
-- hold them ahead while the cap is far, but near it takes no more than
-- FREE (else one worker could hold every place with its children busy).

local LIMIT_FIELDS = { "rate_max", "rate_per", "concurrency", "group_rate_max", "group_rate_per",
  "group_concurrency" }

-- Limits { rate_max, rate_per, concurrency } (numbers or nil) from three
-- fields, or nil when they say none.
local function limit_set(max, per, concurrency)
  local lim = { rate_max = tonumber(max), rate_per = tonumber(per), concurrency = tonumber(concurrency) }
  if not (lim.rate_max and lim.rate_per) then lim.rate_max, lim.rate_per = nil, nil end
  if not (lim.rate_max or lim.concurrency) then return nil end
  return lim
end

-- The queue's limits and each group's (limit_set's tables, or nil when
-- none). A limits key of another type holds none.
local function read_limits(p)
  local f = redis.pcall("HMGET", p .. "limits", unpack(LIMIT_FIELDS))
  if f.err then return nil, nil end
  return limit_set(f[1], f[2], f[3]), limit_set(f[4], f[5], f[6])
end

-- The rate's window: how many more jobs it takes now, and when (ms from
-- now) it next has room if none. A starts key of another type (written by
-- another client) is bookkeeping of ours: it is replaced.
local function rate_room(p, lim, now)
  local key = p .. "starts"
  local trimmed = redis.pcall("ZREMRANGEBYSCORE", key, "-inf", "(" .. (now - lim.rate_per))
  if type(trimmed) == "table" and trimmed.err then redis.call("DEL", key) end
  local left = lim.rate_max - redis.call("ZCARD", key)
  if left > 0 then return left, nil end
  local oldest = redis.call("ZRANGE", key, 0, 0, "WITHSCORES")
  return 0, oldest[2] and (tonumber(oldest[2]) + lim.rate_per + 1 - now) or lim.rate_per
end

-- How many jobs fetch may hand out now under lim (at most n; under a rate,
-- at most free), and when to look again (ms from now) when the rate says
-- none, else nil.
local function allowance(p, lim, n, free, now)
  if free and lim.rate_max then n = math.min(n, free) end
  if lim.concurrency then
    local room = math.max(0, lim.concurrency - redis.call("ZCARD", p .. "active"))
    -- near the cap, no more than the worker can start now: one worker
    -- holding jobs ahead would leave the others' children idle
    if room <= n and free then room = math.min(room, free) end
    n = math.min(n, room)
  end
  if lim.rate_max and n > 0 then
    local left, wait = rate_room(p, lim, now)
    if left < n then return left, wait end
  end
  return n, nil
end

-- Jobs handed out count in the rate's window (one entry per token; ZADD
-- in chunks: Lua's unpack has a bound).
local function count_starts(p, lim, tokens, now)
  if not (lim and lim.rate_max) or #tokens == 0 then return end
  for first = 1, #tokens, 500 do
    local args = { "ZADD", p .. "starts" }
    for i = first, math.min(first + 499, #tokens) do args[#args + 1] = now; args[#args + 1] = tokens[i] end
    redis.call(unpack(args))
  end
  redis.call("PEXPIRE", p .. "starts", lim.rate_per + 1000)
end

-- freed jobs left the active set: under a concurrency limit, when that
-- brings it below the cap while jobs wait, workers refused for it are
-- told to look again ("added" on <p>events; once per crossing, not per job).
local function slot_freed(p, freed)
  local c = redis.pcall("HGET", p .. "limits", "concurrency")
  c = type(c) == "string" and tonumber(c)
  if not c or freed < 1 then return end
  local active = redis.call("ZCARD", p .. "active")
  if active < c and active + freed >= c and redis.call("ZCARD", p .. "wait") > 0 then publish(p, "added") end
end

local RATE_NUMBERS = { { 2, "MAX must be a whole number of jobs from 0 (no limit) to 2^31", 0, ATTEMPTS_MAX, true },
  { 3, "PER_MS must be a whole number of ms from 1 to 1e12", 1, DELAY_MS_MAX, true } }
local CONCURRENCY_NUMBERS = { { 2, "N must be a whole number from 0 (no limit) to 2^31", 0, ATTEMPTS_MAX, true } }
local LIMIT_NUMBERS = { rate = RATE_NUMBERS, concurrency = CONCURRENCY_NUMBERS,
  group_rate = RATE_NUMBERS, group_concurrency = CONCURRENCY_NUMBERS }

-- limit(p; "rate", max, per_ms) | limit(p; "concurrency", n), and the same
-- with group_rate and group_concurrency (each group's) -> "OK": the limit
-- set, or removed with 0.
local function limit(keys, args)
  local p, fn, kind = keys[1], "moonjob_limit", args[1]
  local specs = LIMIT_NUMBERS[kind or ""]
  if not specs then
    return refuse(fn, "KIND must be rate (MAX PER_MS), concurrency (N), group_rate (MAX PER_MS) or "
      .. "group_concurrency (N)", kind or "")
  end
  local given = true
  for i = 2, #args do given = given and args[i] ~= "" end
  if #args ~= #specs + 1 or not given then
    return refuse(fn, ("%s takes %d number(s), none empty; arguments given"):format(kind, #specs), #args - 1)
  end
  local refused = check_numbers(fn, args, specs)
  if refused then return refused end
  local key = p .. "limits"
  if redis.call("TYPE", key).ok ~= "hash" then redis.call("DEL", key) end -- another client's: replaced
  local field = kind == "rate" and "rate_max" or kind == "group_rate" and "group_rate_max" or kind
  if tonumber(args[2]) == 0 then
    redis.call("HDEL", key, field, (field:gsub("_max$", "_per")))
  elseif specs == RATE_NUMBERS then
    redis.call("HSET", key, field, args[2], (field:gsub("_max$", "_per")), args[3])
  else
    redis.call("HSET", key, field, args[2])
  end
  if kind:find("^group_") then G.unpark_all(p) end -- each parked group is looked at again
  if specs == CONCURRENCY_NUMBERS or tonumber(args[2]) == 0 or kind:find("^group_") then
    publish(p, "added") -- workers look again
  end
  redis.pcall("SADD", REGISTRY, string.sub(p, 5, -3))
  return "OK"
end

-- limits(p) -> { rate_max, rate_per_ms, concurrency, limited_ms,
-- started_in_window, active, group_rate_max, group_rate_per_ms,
-- group_concurrency, groups_ready, groups_parked } (0 for none; groups_*:
-- groups with waiting jobs that may take one now, and that may not).
local function limits(keys)
  local p = keys[1]
  local lim, glim = read_limits(p)
  lim, glim = lim or {}, glim or {}
  local in_window = 0
  if lim.rate_max then
    in_window = redis.call("ZCOUNT", p .. "starts", "(" .. (now_ms() - lim.rate_per), "+inf")
  end
  return { lim.rate_max or 0, lim.rate_per or 0, lim.concurrency or 0,
    math.max(0, redis.call("PTTL", p .. "limited")), in_window, redis.call("ZCARD", p .. "active"),
    glim.rate_max or 0, glim.rate_per or 0, glim.concurrency or 0,
    redis.call("ZCARD", p .. "groups") - (redis.call("ZSCORE", p .. "groups", "") and 1 or 0)
      + redis.call("ZCOUNT", p .. "gparked", "-inf", now_ms()), -- (their time came: the next fetch takes them back)
    redis.call("ZCOUNT", p .. "gparked", "(" .. now_ms(), "+inf") }
end

----------------------------------------------------------------- groups ---
-- A job added with GROUP belongs to that group (a tenant, a customer).
-- fetch hands out jobs round-robin between groups, within a priority (the
-- best priority waiting first), so a group with a huge backlog takes its
-- turn like one with a few jobs; jobs of no group take their turns together,
-- as one more group. Each group may have its own rate and concurrency cap
-- (the same numbers for every group: group_rate_max, group_rate_per,
-- group_concurrency in <p>limits), and a job's ERATELIMIT holds back only its
-- group. Keys:
--   <p>gw:<group>  sorted set: the group's waiting jobs (wait's scores and
--                  members)
--   <p>ungrouped   sorted set: the same for the jobs of no group, kept only
--                  while groups have waiting jobs
--   <p>groups      sorted set: the ring: groups with waiting jobs that may
--                  take one, by their turn ("": the jobs of no group)
--   <p>gparked     sorted set: groups with waiting jobs that may not now, by
--                  when to look again (ms; one at its cap: when the first
--                  lease of its jobs ends, or sooner, when one leaves active)
--   <p>ga:<group>  set: the group's active jobs (its cap counts them)
--   <p>gs:<group>  sorted set: the group's rate window (as <p>starts)
--   <p>gl:<group>  string: the group's ERATELIMIT hold; its TTL is how long
--   <p>turn        counter: the ring's turns
-- <p>wait stays the set of every waiting job (listings, counts and drain
-- see no difference); the group sets index it. A queue whose waiting jobs
-- have no group keeps no index ("group mode" is off: groups and gparked are
-- empty) and fetch pops wait directly; the first grouped job made waiting
-- turns it on (every job waiting then is of no group: wait is copied into
-- <p>ungrouped), and it turns off once the index is empty. An index
-- entry whose job no longer waits is dropped when fetch reaches it (its
-- ZREM from wait says 0), so a path that misses one loses nothing.

local GROUP_WALK_MAX = 64 -- groups looked at per job handed out (then: the group of the job first in line)
local UNPARK_MAX = 100 -- parked groups whose time came, back in the ring per fetch
local LIST_GROUPS_MAX = 1000

function G.set(p, g)
  if g == "" then return p .. "ungrouped" end
  return p .. "gw:" .. g
end

function G.on(p) return redis.call("EXISTS", p .. "groups", p .. "gparked") > 0 end

-- ZADD to a key of the groups' bookkeeping; one of another type (written
-- by another client) is replaced, so that it never fails a call half-way.
function G.zadd(key, ...)
  local r = redis.pcall("ZADD", key, ...)
  if type(r) == "table" and r.err then
    redis.call("DEL", key)
    r = redis.call("ZADD", key, ...)
  end
  return r
end

-- Whether g is a member of sorted set key (one of another type is deleted:
-- it holds none).
function G.has(key, g)
  local r = redis.pcall("ZSCORE", key, g)
  if type(r) == "table" and r.err then
    redis.call("DEL", key)
    return false
  end
  return r ~= false
end

-- Group g has waiting jobs: it joins the ring, last, unless it is there or
-- parked already (or held back by ERATELIMIT: then parked until then); a
-- group with no waiting job left stays out. -> true when it joined the
-- ring now.
function G.enter(p, g, now)
  if not G.has(p .. "groups", g) and not G.has(p .. "gparked", g) and redis.call("ZCARD", G.set(p, g)) > 0 then
    local hold = g ~= "" and redis.call("PTTL", p .. "gl:" .. g) or -2
    if hold > 0 then G.zadd(p .. "gparked", now + hold, g)
    else
      G.zadd(p .. "groups", redis.call("INCR", p .. "turn"), g)
      return true
    end
  end
  return false
end

-- A job made waiting (member, score prio) of group g ("": none) indexed.
-- A group that joins an empty ring is announced ("added"): workers that
-- found every group parked look again.
function G.index(p, g, prio, member, now)
  local on = G.on(p)
  if g == "" then
    if not on then return end
  elseif not on and redis.call("ZUNIONSTORE", p .. "ungrouped", 1, p .. "wait") > 0 then
    G.enter(p, "", now) -- the switch: every job waiting until now is of no group
  end
  G.zadd(G.set(p, g), prio, member)
  if G.enter(p, g, now) and redis.call("ZCARD", p .. "groups") == 1
      and redis.call("EXISTS", p .. "limited") == 0 then
    publish(p, "added")
  end
end

-- A waiting job (member) of group g (nil: none) no longer waits; a group
-- left with none leaves the ring (or the parked set: a hold stays in its
-- gl key, and G.enter parks the group again).
function G.unindex(p, g, member)
  if not member then return end
  local set = G.set(p, g or "")
  if redis.call("ZREM", set, member) == 1 and redis.call("ZCARD", set) == 0 then
    redis.call("ZREM", p .. "groups", g or "")
    redis.call("ZREM", p .. "gparked", g or "")
  end
end

-- Job id of group g (nil: none) left active: its group's place is free,
-- and a parked group may take a job again (a hold parks it again).
function G.left(p, g, id)
  if not g or g == "" or redis.pcall("SREM", p .. "ga:" .. g, id) ~= 1 then return end
  if redis.call("ZREM", p .. "gparked", g) == 0 then return end
  local now = now_ms()
  local _, glim = read_limits(p)
  if G.enter(p, g, now) and G.room(p, g, now, glim) then publish(p, "added") end -- (else parked again)
end

-- Group g may take no job until ms until_ms; hold: a later time already
-- there stays.
function G.park(p, g, until_ms, hold)
  redis.call("ZREM", p .. "groups", g)
  if hold then redis.call("ZADD", p .. "gparked", "GT", until_ms, g)
  else redis.call("ZADD", p .. "gparked", until_ms, g) end
end

-- The parked groups whose time came go back to the ring (once per fetch).
function G.unpark_due(p, now)
  for _, g in ipairs(redis.call("ZRANGEBYSCORE", p .. "gparked", "-inf", now, "LIMIT", 0, UNPARK_MAX)) do
    redis.call("ZREM", p .. "gparked", g)
    G.enter(p, g, now)
  end
end

-- Every parked group is looked at again under the new limits (a group
-- limit changed): back to the ring, or parked again as G.enter (a hold)
-- and G.room (a cap, a window) say. One call over all of them.
function G.unpark_all(p)
  local now = now_ms()
  local _, glim = read_limits(p)
  for _, g in ipairs(redis.call("ZRANGE", p .. "gparked", 0, -1)) do
    redis.call("ZREM", p .. "gparked", g)
    if G.enter(p, g, now) then G.room(p, g, now, glim) end
  end
end

-- The job of group g that fetch hands out now counts against its cap and
-- rate.
function G.started(p, g, id, token, now, glim)
  if g == "" then return end
  redis.call("SADD", p .. "ga:" .. g, id)
  if glim and glim.rate_max then
    redis.call("ZADD", p .. "gs:" .. g, now, token)
    redis.call("PEXPIRE", p .. "gs:" .. g, glim.rate_per + 1000)
  end
end

-- Whether group g may take a job now under the groups' limits glim; if
-- not, it is parked until it may.
function G.room(p, g, now, glim)
  if g == "" or not glim then return true end
  local c = glim.concurrency
  if c and redis.call("SCARD", p .. "ga:" .. g) >= c then
    -- a job that left active by another way (its hash deleted by hand, an
    -- obliterate) must not hold its group's place for ever: one no longer
    -- active is dropped, and a full group is parked until the first lease
    -- of its jobs ends (or one leaves active: G.left), then looked at again
    local first_end = math.huge
    for _, id in ipairs(redis.call("SMEMBERS", p .. "ga:" .. g)) do
      local lease_end = tonumber(redis.call("ZSCORE", p .. "active", id) or "")
      if lease_end then first_end = math.min(first_end, lease_end)
      else redis.call("SREM", p .. "ga:" .. g, id) end
    end
    if redis.call("SCARD", p .. "ga:" .. g) >= c then
      G.park(p, g, math.max(first_end, now) + 1)
      return false
    end
  end
  if glim.rate_max then
    local key = p .. "gs:" .. g
    redis.call("ZREMRANGEBYSCORE", key, "-inf", "(" .. (now - glim.rate_per))
    if redis.call("ZCARD", key) >= glim.rate_max then
      local oldest = redis.call("ZRANGE", key, 0, 0, "WITHSCORES")
      G.park(p, g, tonumber(oldest[2]) + glim.rate_per + 1)
      return false
    end
  end
  return true
end

-- The group of the job first in line (wait's head), if it is in the ring
-- and may take a job now: what G.pick takes when its walk found no group
-- with that priority (a group further on in turn order).
function G.of_head(p, head, now, glim)
  local g = redis.pcall("HGET", job_key(p, string.sub(head, 18)), "group")
  if type(g) ~= "string" then g = "" end
  if redis.call("ZSCORE", p .. "groups", g) and G.room(p, g, now, glim) then return g end
end

-- The group whose turn it is, and the member popped from its index: the
-- first group in the ring whose first job has the best priority waiting
-- (among the next GROUP_WALK_MAX, else the group of the job first in
-- line), else the best that may take one; nil, nil when none may, and whether
-- the walk took groups out of the ring (parked or empty: a walk again
-- reaches further).
function G.pick(p, now, glim)
  local head = redis.call("ZRANGE", p .. "wait", 0, 0, "WITHSCORES")
  if #head == 0 then return nil, nil, false end
  local best = tonumber(head[2])
  local found, found_prio, after, walked, dropped = nil, nil, "-inf", 0, false
  while walked < GROUP_WALK_MAX and not (found and found_prio <= best) do
    local ring = redis.call("ZRANGEBYSCORE", p .. "groups", after, "+inf", "WITHSCORES", "LIMIT", 0, 16)
    if #ring == 0 then break end
    for i = 1, #ring, 2 do
      local g = ring[i]
      after, walked = "(" .. ring[i + 1], walked + 1
      local first = redis.call("ZRANGE", G.set(p, g), 0, 0, "WITHSCORES")
      if #first == 0 then
        redis.call("ZREM", p .. "groups", g)
        dropped = true
      else
        local prio = tonumber(first[2])
        if not found or prio < found_prio then
          if G.room(p, g, now, glim) then
            found, found_prio = g, prio
            if prio <= best then break end
          else
            dropped = true
          end
        end
      end
    end
  end
  if not (found and found_prio <= best) then found = G.of_head(p, head[1], now, glim) or found end
  if not found then return nil, nil, dropped end
  local set, turn = G.set(p, found), redis.call("INCR", p .. "turn") -- (drawn first: a pop is not undone)
  local member = redis.call("ZPOPMIN", set)[1]
  if redis.call("ZCARD", set) == 0 then redis.call("ZREM", p .. "groups", found)
  else redis.call("ZADD", p .. "groups", turn, found) end -- its turn is over
  return found, member
end

-- Groups with no waiting job left (after a drain) leave the ring and the
-- parked set; with all, every group goes and its keys are deleted
-- (obliterate).
function G.sweep(p, all)
  for _, ring in ipairs({ "groups", "gparked" }) do
    for _, g in ipairs(redis.call("ZRANGE", p .. ring, 0, -1)) do
      if all or redis.call("ZCARD", G.set(p, g)) == 0 then
        redis.call("ZREM", p .. ring, g)
        if all then redis.call("DEL", G.set(p, g), p .. "ga:" .. g, p .. "gs:" .. g, p .. "gl:" .. g) end
      end
    end
  end
end

-- ratelimited for a job of group g: the group holds back for ms.
-- (A group with no waiting job is not parked: G.enter parks it, by its
-- hold, when one comes.)
function G.hold(p, g, ms, now)
  if redis.call("PTTL", p .. "gl:" .. g) < ms then redis.call("SET", p .. "gl:" .. g, "1", "PX", ms) end
  if redis.call("ZCARD", G.set(p, g)) > 0 then G.park(p, g, now + ms, true) end
end

-- groups(p; limit) -> { { group, state, waiting, active, ms }, ... }: the
-- groups with waiting jobs, those that may not take one first (state
-- "held": an ERATELIMIT hold, ms left; "at_cap"; "rate": its window is
-- full, ms until it has room), then the ring's ("ready", in turn order).
-- waiting may count entries that fetch drops when it reaches them.
local function groups(keys, args)
  local p = keys[1]
  local refused = check_numbers("moonjob_groups", args,
    { { 1, "LIMIT must be a whole number from 1 to " .. LIST_GROUPS_MAX, 1, LIST_GROUPS_MAX, true } })
  if refused then return refused end
  local limit, now, out = tonumber(args[1]) or 100, now_ms(), {}
  local _, glim = read_limits(p)
  local cap = glim and glim.concurrency
  local function row(g, state, ms)
    out[#out + 1] = { g, state, redis.call("ZCARD", G.set(p, g)), g == "" and 0 or redis.call("SCARD",
      p .. "ga:" .. g), math.max(0, math.floor(ms)) }
  end
  local parked = redis.call("ZRANGE", p .. "gparked", 0, limit - 1, "WITHSCORES")
  for i = 1, #parked, 2 do
    local g, at, hold = parked[i], tonumber(parked[i + 1]), redis.call("PTTL", p .. "gl:" .. parked[i])
    if hold > 0 then row(g, "held", hold)
    elseif at > now and cap and redis.call("SCARD", p .. "ga:" .. g) >= cap then row(g, "at_cap", 0)
    elseif at > now then row(g, "rate", at - now)
    else row(g, "ready", 0) end -- (its time came: the next fetch takes it back)
  end
  if #out < limit then
    for _, g in ipairs(redis.call("ZRANGE", p .. "groups", 0, limit - #out)) do -- (+1: "" is skipped)
      if g ~= "" and #out < limit then row(g, "ready", 0) end
    end
  end
  return out
end

local FETCH_NUMBERS = {
  { 2, "N must be a whole number from 0 to 2^31", 0, ATTEMPTS_MAX, true },
  { 3, "LEASE_MS must be a number of ms from 1 to 1e12", 1, DELAY_MS_MAX },
  { 4, "KEEP_COUNT must be a whole number from 0 to 2^53", 0, COUNT_MAX, true },
  { 5, "KEEP_AGE_MS must be a number of ms from 0 to 1e15", 0, 1e15 },
  { 6, "MAX_PAYLOAD must be a whole number of bytes from 0 (no bound) to 2^53", 0, COUNT_MAX, true },
  { 7, "KEEP_FAILED_AGE_MS must be a number of ms from 0 to 1e15", 0, 1e15 },
  { 8, "FREE must be a whole number from 0 to 2^31", 0, ATTEMPTS_MAX, true },
}

-- A field out of its range ("" or absent: its default) -> why, or nil.
local function bad_field(name, v, low, high, whole, want)
  if v and v ~= "" and not number_in(v, low, high, whole) then
    return ("the job's %s '%s' is not %s (written around moonjob_add)"):format(name, tostring(v):sub(1, 64), want)
  end
end

-- Why a waiting job's fields (fetch's HMGET: state, data, attempts, backoff,
-- timeout, kill_after, name, made, priority) cannot be run, or nil.
local function unfit(id, f)
  if #id > FIELD_MAX or #(f[4] or "") > FIELD_MAX or #(f[7] or "") > FIELD_MAX then
    return "the job's id, name or backoff takes more than " .. FIELD_MAX .. " bytes"
  end
  if not f[2] then return "the job has no data (written around moonjob_add)" end
  -- the usual job: every number a plain one in range (checked at add)
  local attempts, timeout, kill_after = tonumber(f[3]), tonumber(f[5]), tonumber(f[6])
  local made, prio = tonumber(f[8] or 0), tonumber(f[9] or 0)
  if attempts and attempts >= 1 and attempts <= ATTEMPTS_MAX and attempts % 1 == 0
      and timeout and timeout >= 0 and timeout <= SECONDS_MAX
      and kill_after and kill_after >= 0 and kill_after <= SECONDS_MAX
      and made and made >= 0 and made <= ATTEMPTS_MAX and made % 1 == 0
      and prio and prio >= -FINITE and prio <= FINITE then
    return nil
  end
  return bad_field("attempts", f[3], 1, ATTEMPTS_MAX, true, "a whole number from 1 to 2^31")
    or bad_field("timeout", f[5], 0, SECONDS_MAX, false, "a number of seconds from 0 to 1e9")
    or bad_field("kill_after", f[6], 0, SECONDS_MAX, false, "a number of seconds from 0 to 1e9")
    or bad_field("made", f[8], 0, ATTEMPTS_MAX, true, "a whole number from 0 to 2^31")
    or bad_field("priority", f[9], -FINITE, FINITE, false, "a finite number")
end

-- A waiting entry popped by fetch: its reply row (handed out to worker
-- with token number token_no), or nil and "failed" (failed in place: out
-- of range, over max_payload, expired; never sent) or what look_at said.
local function take_one(p, id, worker, token_no, lease, max_payload, now)
  local key = job_key(p, id)
  local kind, f = look_at(p, id, key, "waiting", now, "data", "attempts", "backoff", "timeout",
    "kill_after", "name", "made", "priority", "expire_at")
  if kind ~= "ok" then return nil, kind end
  local made = (tonumber(f[8]) or 0) + 1
  local expired = tonumber(f[10] or "")
  if expired and now > expired then
    fail_entry(p, id, key, now, ("the job expired %.0f ms ago, before a worker took it (its expire option)")
      :format(now - expired), false, "EEXPIRED")
    return nil, "failed"
  end
  local why, code = unfit(id, f), nil
  if not why and max_payload > 0 and #f[2] > max_payload then
    why = ("the job data is %d bytes, more than the worker's max_payload (%d)"):format(#f[2], max_payload)
    code = "EPAYLOAD"
  end
  if why then
    redis.call("HSET", key, "made", made)
    fail_entry(p, id, key, now, why, false, code)
    return nil, "failed"
  end
  local token = worker .. "/" .. token_no
  redis.call("HSET", key, "state", "active", "token", token, "worker", worker, "started", now,
    "ran", "0", "made", made, "began", "")
  redis.call("ZADD", p .. "active", now + lease, id)
  return { id, token, f[2], made, f[3], f[4], f[5], f[6], f[7] }
end

-- Entries failed in place do not count against n: a fetch pops up to
-- POP_BUDGET more, so a backlog of expired jobs is cleared in a few calls.
local POP_BUDGET = 1000

-- take in group mode: each job from the group whose turn it is (G.pick),
-- under the groups' limits glim. A job of a group comes with its group
-- (its row's 10th element). -> rows, tokens, missing.
function G.take(p, worker, n, lease, max_payload, now, glim)
  local rows, tokens, missing, budget = {}, {}, 0, n + POP_BUDGET
  while #rows < n and budget > 0 do
    local g, member, dropped = G.pick(p, now, glim)
    if not (g or dropped) then break end
    budget = budget - 1
    if g and redis.call("ZREM", p .. "wait", member) == 1 then -- (else: an entry whose job no longer waits)
      local token_no = redis.call("INCR", p .. "tokens")
      local row, kind = take_one(p, string.sub(member, 18), worker, token_no, lease, max_payload, now)
      if row then
        if g ~= "" then row[10] = g end
        rows[#rows + 1] = row
        tokens[#tokens + 1] = row[2]
        G.started(p, g, row[1], row[2], now, glim)
      elseif kind == "missing" then
        missing = missing + 1
      end
    end
  end
  return rows, tokens, missing
end

-- Up to n waiting jobs handed out to worker (grouped: G.on). -> their
-- reply rows, tokens. Tokens: one counter step per pop, one number per job
-- (never reused).
local function take(p, worker, n, lease, max_payload, now, glim, grouped)
  if n > 0 and grouped then
    local rows, tokens, missing = G.take(p, worker, n, lease, max_payload, now, glim)
    count_missing(p, missing)
    return rows, tokens
  end
  local rows, tokens, missing = {}, {}, 0
  local budget = n + POP_BUDGET
  while #rows < n and budget > 0 do
    local popped = redis.call("ZPOPMIN", p .. "wait", math.min(n - #rows, budget))
    if #popped == 0 then break end
    budget = budget - #popped / 2
    local token_no = redis.call("INCRBY", p .. "tokens", #popped / 2) - #popped / 2
    for i = 1, #popped, 2 do
      local row, kind = take_one(p, string.sub(popped[i], 18), worker, token_no + 1, lease, max_payload, now)
      if row then
        token_no = token_no + 1
        rows[#rows + 1] = row
        tokens[#tokens + 1] = row[2]
      elseif kind == "missing" then
        missing = missing + 1
      end
    end
  end
  count_missing(p, missing)
  return rows, tokens
end

-- A fetch's first element while the queue is paused: no job comes with it.
local PAUSED = -2

-- fetch(p; worker, n, lease_ms, keep_count, keep_age_ms, max_payload [, keep_failed_age_ms [, free]])
-- -> { next_due_ms, job, ... } ({ -2 } while the queue is paused); each job is
-- { id, token, data, made, attempts, backoff, timeout, kill_after, name }.
-- Recovers stalled jobs, makes due delayed jobs ready and trims finished
-- jobs (keep_count, keep_age_ms; once per fetch, not per job) first. A job
-- whose fields are out of range fails with EINPUT here, one whose data is
-- over max_payload (0: no bound) with EPAYLOAD, their data never sent; an
-- entry whose job is gone is counted in totals "missing". next_due_ms:
-- when the earliest delayed job or schedule falls due (server ms from now),
-- or -1. Due schedules fire first (fire_schedules). Under the queue's limits
-- (rate, concurrency, an ERATELIMIT hold) it hands out fewer jobs (under a
-- rate at most free, the worker's idle children), and next_due_ms says when to look
-- again for a rate window or hold. With groups, jobs come round-robin
-- between them (see "groups"), under each group's limits.
local function fetch(keys, args)
  local p, worker = keys[1], args[1]
  if not worker or worker == "" then return refuse("moonjob_fetch", "WORKER must be a name", "") end
  local refused = check_numbers("moonjob_fetch", args, FETCH_NUMBERS)
  if refused then return refused end
  local n, lease = tonumber(args[2]) or 1, tonumber(args[3]) or 30000
  local max_payload = tonumber(args[6]) or 0
  local now = now_ms()
  recover_stalled(p, now)
  fire_schedules(p, now)
  promote_delayed(p, now)
  local grouped = G.on(p) -- (looked at once: nothing below makes a job wait)
  -- whatever this fetch may take: its answer counts the parked groups' times
  if grouped then G.unpark_due(p, now) end
  retain(p, args, now, n)
  if redis.call("EXISTS", p .. "paused") == 1 then return { PAUSED } end
  local out = { -1 }
  local lim, glim = read_limits(p)
  local held_back, free = nil, tonumber(args[8] or "")
  local hold = redis.call("PTTL", p .. "limited") -- an ERATELIMIT hold: nothing now
  if hold > 0 then
    n, held_back = 0, hold
  elseif lim then
    n, held_back = allowance(p, lim, n, free, now)
  end
  if glim and free then n = math.min(n, free) end -- (any group limit: no job held ahead, as under a rate)
  -- the token counter is checked before anything is popped (a pop is not
  -- undone if the call then fails): a key another client spoiled is said
  local counter = redis.pcall("INCRBY", p .. "tokens", 0)
  if type(counter) == "table" and counter.err then
    return redis.error_reply(("ERR %stokens is not a counter (%s): another client wrote it; delete it "
      .. "(DEL %stokens) and restart the workers"):format(p, counter.err, p))
  end
  local rows, tokens = take(p, worker, n, lease, max_payload, now, glim, grouped)
  for _, row in ipairs(rows) do out[#out + 1] = row end
  count_starts(p, lim, tokens, now)
  if lim and lim.rate_max and not held_back then -- the window just filled: when it has room
    local _, wait = rate_room(p, lim, now)
    held_back = wait
  end
  local first = redis.call("ZRANGE", p .. "delayed", 0, 0, "WITHSCORES")
  local due = tonumber(first[2] or "")
  local slot = next_schedule(p)
  if slot and not (due and due <= slot) then due = slot end
  local parked = grouped and tonumber(redis.call("ZRANGE", p .. "gparked", 0, 0, "WITHSCORES")[2] or "")
  if parked and parked < math.huge and not (due and due <= parked) then due = parked end
  if held_back and not (due and due <= now + held_back) then due = now + held_back end
  if due then out[1] = math.max(0, due - now) end
  return out
end

-- The job's fields when token holds its lease, else nil (a key of another
-- type holds nothing).
local function holds(key, token, ...)
  if token == "" or token == nil then return nil end
  local f = job_fields(key, "token", "state", ...)
  if f and f[1] == token and f[2] == "active" then return f end
  return nil
end

-- renew(p; lease_ms, id, token, ran, id, token, ran, ...) -> { id, code, reason, ... }
-- for each job whose lease this worker no longer holds (ELOST) or whose
-- cancel was asked (ECANCELED, with the reason). The others' leases now end
-- lease_ms from now. ran = "1": the job has started on its worker (a job
-- recovered after its lease counts an attempt only if it had).
local function renew(keys, args)
  local p = keys[1]
  local refused = check_numbers("moonjob_renew", args,
    { { 1, "LEASE_MS must be a number of ms from 1 to 1e12", 1, DELAY_MS_MAX } })
  if refused then return refused end
  if (#args - 1) % 3 ~= 0 then
    return refuse("moonjob_renew", "it takes LEASE_MS then ID TOKEN RAN triples; the count of arguments was", #args)
  end
  local lease = tonumber(args[1]) or 30000
  local now = now_ms()
  local out = {}
  for i = 2, #args, 3 do
    local id, token = args[i], args[i + 1]
    local key = job_key(p, id)
    local f = holds(key, token, "cancel", "ran")
    if not f then
      out[#out + 1] = id; out[#out + 1] = "ELOST"; out[#out + 1] = ""
    else
      local ran = args[i + 2]
      if ran ~= "0" and ran ~= "" and f[4] ~= "1" then -- "1", or "1:<ms since it started>"
        local ago = tonumber(string.match(ran, "^1:(%d+)$") or "")
        if ago then redis.call("HSET", key, "ran", "1", "began", now - ago)
        else redis.call("HSET", key, "ran", "1") end
      end
      redis.call("ZADD", p .. "active", "XX", now + lease, id)
      if f[3] then
        out[#out + 1] = id; out[#out + 1] = "ECANCELED"; out[#out + 1] = f[3]
      end
    end
  end
  return out
end

-- The first argument of a moonjob_complete whose jobs come with their run
-- time measured by the worker (the child's own: its time prefetched is not
-- counted, as started, set at fetch, would).
local RUN_MS_MARK = "\0ms"

-- complete(p; id, token, result [, id, token, result ...]) -> { "OK" | "ESTALE", ... }
-- one answer per job, in order; complete(p; "\0ms", id, token, result,
-- run_ms, ...) the same with each job's run time (for the metrics).
local function complete(keys, args)
  local p = keys[1]
  local timed = args[1] == RUN_MS_MARK -- then quads: id, token, result, run ms
  local first, step = timed and 2 or 1, timed and 4 or 3
  if #args < first + step - 1 or (#args - first + 1) % step ~= 0 then
    return refuse("moonjob_complete", "it takes ID TOKEN RESULT triples (or, after \\0ms, ID TOKEN RESULT "
      .. "RUN_MS quads); the count of arguments was", #args)
  end
  local now = now_ms()
  local out, runs, done = {}, {}, 0
  for i = first, #args - step + 1, step do
    local id, token = args[i], args[i + 1]
    local key = job_key(p, id)
    local f = holds(key, token, "cache", "notify", "started", "group")
    if f then
      local ms = timed and number_in(args[i + 3], 0, 1e15) or nil
      -- totals and metrics counted once for the batch
      local fin = { f[3], f[4], f[5], f[6], batched = true, run_ms = ms }
      finish(p, id, key, "completed", "result", args[i + 2], now, fin)
      out[#out + 1] = "OK"
      done = done + 1
      runs[#runs + 1] = ms or run_ms(f[5], now)
    else
      out[#out + 1] = "ESTALE"
    end
  end
  if done > 0 then
    count_total(p, "completed", done)
    record_metrics(p, now, done, 0, runs)
    slot_freed(p, done)
  end
  return out
end

-- fail(p; id, token, error, retry_ms [, run_ms]) -> state | "ESTALE"; run_ms:
-- the attempt's run time as the worker measured it (for the metrics).
-- retry_ms >= 0: the job runs again after that many ms if it has attempts
-- left (the worker computed the backoff); -1: it fails for good.
local function fail(keys, args)
  local p, id, token = keys[1], args[1], args[2]
  if #args < 3 then return refuse("moonjob_fail", "it takes ID TOKEN ERROR [RETRY_MS]; arguments given", #args) end
  local refused = check_numbers("moonjob_fail", args,
    { { 4, "RETRY_MS must be -1 (no retry) or a number of ms up to 1e12", -1, DELAY_MS_MAX } })
  if refused then return refused end
  local key = job_key(p, id)
  local f = holds(key, token, "made", "attempts", "cancel", "cache", "notify", "started", "group")
  if not f then return "ESTALE" end
  local now = now_ms()
  local retry = tonumber(args[4]) or -1
  local made, attempts = tonumber(f[3]) or 0, tonumber(f[4]) or 1
  if retry >= 0 and made < attempts and not f[5] then
    redis.call("ZREM", p .. "active", id)
    G.left(p, f[9], id)
    redis.call("HSET", key, "error", args[3], "token", "")
    if retry > 0 then make_delayed(p, id, key, now + math.floor(retry)) else make_waiting(p, id, key, now) end
    slot_freed(p, 1)
    return redis.call("HGET", key, "state")
  end
  local fin = { f[6], f[7], f[8], f[9], ran = true, run_ms = number_in(args[5], 0, 1e15) }
  finish(p, id, key, "failed", "error", args[3], now, fin)
  slot_freed(p, 1)
  return "failed"
end

-- release(p; id, token) -> "OK" | "ESTALE": a job the worker holds but gives
-- back unfinished (it stops): waiting again, its attempt not counted.
local function release(keys, args)
  local p, id, token = keys[1], args[1], args[2]
  if #args < 2 then return refuse("moonjob_release", "it takes ID TOKEN; arguments given", #args) end
  local key = job_key(p, id)
  local f = holds(key, token, "cancel", "member", "group")
  if not f then return "ESTALE" end
  local now = now_ms()
  redis.call("ZREM", p .. "active", id)
  G.left(p, f[5], id)
  redis.call("HINCRBY", key, "made", -1)
  redis.call("HSET", key, "token", "")
  if f[3] then
    finish(p, id, key, "failed", "error", err_json("ECANCELED", f[3]), now)
  else
    make_waiting(p, id, key, now, nil, f[4]) -- given back: its place in line kept
  end
  slot_freed(p, 1)
  return "OK"
end

-- ratelimited(p; id, token, retry_ms [, error]) -> "OK" | "ESTALE":
-- the job's processor said the remote side pushed back (ERATELIMIT): it
-- waits again where it was, its attempt not counted, and the queue hands
-- out nothing for retry_ms (<p>limited; a longer hold already there stays);
-- for a job of a group, only its group holds back (see "groups").
local function ratelimited(keys, args)
  local p, id, token, fn = keys[1], args[1], args[2], "moonjob_ratelimited"
  if #args < 3 then return refuse(fn, "it takes ID TOKEN RETRY_MS [ERROR]; arguments given", #args) end
  local refused = check_numbers(fn, args,
    { { 3, "RETRY_MS must be a whole number of ms from 0 to 1e12", 0, DELAY_MS_MAX, true } })
  if refused then return refused end
  local key = job_key(p, id)
  local f = holds(key, token, "cancel", "member", "group")
  if not f then return "ESTALE" end
  local now, retry, group = now_ms(), tonumber(args[3]), f[5]
  local grouped = group and group ~= ""
  -- (held first: the group G.left would free stays parked, unannounced)
  if grouped and retry > 0 and not f[3] then G.hold(p, group, retry, now) end
  redis.call("ZREM", p .. "active", id)
  G.left(p, group, id)
  redis.call("HINCRBY", key, "made", -1)
  redis.call("HSET", key, "token", "")
  if args[4] and args[4] ~= "" then redis.call("HSET", key, "error", args[4]) end
  if f[3] then
    finish(p, id, key, "failed", "error", err_json("ECANCELED", f[3]), now)
  else
    make_waiting(p, id, key, now, nil, f[4])
  end
  if grouped or retry == 0 then
    slot_freed(p, 1) -- (a group's hold: other groups may take its place under the queue's cap)
  elseif redis.call("PTTL", p .. "limited") < retry then
    redis.call("SET", p .. "limited", "1", "PX", retry)
  end
  return "OK"
end

-- A job's nonce answers to the one a caller gave ("" or none: any). "*": a
-- job whose key another client overwrote, its nonce lost with it.
local function nonce_fits(own, given)
  return given == nil or given == "" or own == given or own == "*"
end

-- cancel(p; id, reason [, nonce]) -> the state the job was in, or "ENOTFOUND"
-- (also when nonce is given and is not the job's). A waiting or delayed job
-- fails with ECANCELED at once; a running one is interrupted by the worker
-- that holds it ("cancel <id>" on the channel, and the worker's next renew).
local function cancel(keys, args)
  local p, id, reason, nonce = keys[1], args[1], args[2] or "canceled", args[3]
  if not id or id == "" then return refuse("moonjob_cancel", "it takes ID [REASON [NONCE]]", "") end
  local key = job_key(p, id)
  local f = job_fields(key, "state", "member", "nonce", "group")
  if not f or not f[1] or not nonce_fits(f[3], nonce) then return "ENOTFOUND" end
  local state = f[1]
  local now = now_ms()
  if state == "waiting" then
    if f[2] then redis.call("ZREM", p .. "wait", f[2]) end
    G.unindex(p, f[4], f[2])
  elseif state == "delayed" then
    redis.call("ZREM", p .. "delayed", id)
  elseif state == "active" then
    redis.call("HSET", key, "cancel", reason)
    publish(p, "cancel " .. id)
    return state
  else
    return state
  end
  finish(p, id, key, "failed", "error", err_json("ECANCELED", reason), now)
  return state
end

-- get(p; id [, nonce]) -> { state, result, error, made, attempts, name,
-- created, started, finished } or nil when no such job is kept (also when
-- nonce is given and is not the job's). A key of another type reads as the
-- failed job (EINPUT) the next fetch makes of it.
local function get(keys, args)
  if not args[1] then return refuse("moonjob_get", "it takes ID [NONCE]", "") end
  local f, why = job_fields(job_key(keys[1], args[1]), "state", "result", "error", "made",
    "attempts", "name", "created", "started", "finished", "nonce")
  if not f then return { "failed", false, err_json("EINPUT", why), "0", "1", "" } end
  if not f[1] or not nonce_fits(f[10], args[2]) then return nil end
  f[10] = nil
  return f
end

------------------------------------------------------------- operating ---
-- Seeing and acting on a queue's jobs (moonjob.redis.operate, the CLI, the
-- dashboard). Listings are paged in Redis (ZRANGE with offset and count):
-- never a walk over every job. Calls that may touch many jobs (retry_all,
-- clean, drain, obliterate) do at most LIMIT (<= BULK_MAX) per call and say
-- how many are left, so one call never blocks the server for long; the
-- caller calls again.

local BULK_MAX = 10000
local LIST_MAX = 1000
local LOG_KEEP_MAX = 10000

-- A job's fields as listings give them, after its id, in this order
-- (docs/REDIS.md); absent ones are false.
local VIEW_FIELDS = { "state", "name", "data", "result", "error", "made", "attempts", "progress",
  "created", "started", "finished", "worker", "run_at", "priority", "cancel", "ran", "began" }

local SETS = { waiting = "wait", delayed = "delayed", active = "active", completed = "completed",
  failed = "failed" }

local function state_error(fn, id, state, wanted)
  return redis.error_reply(("ESTATE %s: job %s is %s; %s"):format(fn, id, state, wanted))
end

local function not_found(fn, id)
  return redis.error_reply(("ENOTFOUND %s: no job %s in this queue (never added, or no longer kept)")
    :format(fn, tostring(id):sub(1, 200)))
end

-- The id in a set's member (wait's members are "<arrival>:<id>").
local function member_id(set, member)
  if set == "wait" then return string.sub(member, 18) end
  return member
end

-- s cut to at most n bytes, never inside a UTF-8 character (a cut there
-- would not be text).
local function cut_text(s, n)
  if #s <= n then return s end
  local b = string.byte(s, n + 1)
  while n > 0 and b and b >= 0x80 and b <= 0xBF do -- s[n + 1] continues a character
    n = n - 1
    b = string.byte(s, n + 1)
  end
  return string.sub(s, 1, n)
end

-- An error cut for a listing: still JSON, its code and the start of its
-- message (its other fields, a traceback, dropped), or its text cut when
-- it is not an object.
local function short_error(text, preview)
  local ok, e = pcall(cjson.decode, text)
  if not ok or type(e) ~= "table" then return cut_text(text, preview) end
  return cjson.encode({ code = tostring(e.code), message = cut_text(tostring(e.message), preview) })
end

-- One job as listings give it: { id, fields... [, cut] }. preview > 0: data
-- and result longer than preview bytes are cut to it, an error to its code
-- and message (short_error), and the last element names the fields cut
-- ("data,error"). A key of another type reads
-- as state "invalid"; a hash that is gone as "missing".
local function view(p, id, preview)
  local f = redis.pcall("HMGET", job_key(p, id), unpack(VIEW_FIELDS))
  local out = { id }
  if f.err then
    out[2] = "invalid"
    for i = 2, #VIEW_FIELDS do out[i + 1] = false end
    return out
  end
  local cut = {}
  for i, v in ipairs(VIEW_FIELDS) do
    local value = f[i]
    if preview > 0 and value and (v == "data" or v == "result" or v == "error") and #value > preview then
      value = v == "error" and short_error(value, preview) or cut_text(value, preview)
      cut[#cut + 1] = v
    end
    out[i + 1] = value or false
  end
  if not f[1] then out[2] = "missing" end
  out[#VIEW_FIELDS + 2] = table.concat(cut, ",")
  return out
end

local JOBS_NUMBERS = {
  { 2, "OFFSET must be a whole number from 0 to 2^53", 0, COUNT_MAX, true },
  { 3, "LIMIT must be a whole number from 1 to " .. LIST_MAX, 1, LIST_MAX, true },
  { 5, "PREVIEW must be a whole number of bytes from 0 (whole) to 2^31", 0, ATTEMPTS_MAX, true },
}

local function set_of(fn, state)
  local set = SETS[state or ""]
  if set then return set end
  return nil, refuse(fn, "STATE must be waiting, delayed, active, completed or failed", state or "")
end

-- jobs(p; state, offset, limit, order, preview) -> { total, job, ... }: a page
-- of one state's jobs (each as view gives it). order: "asc" or "desc"; by
-- default the next to run first (waiting: priority then arrival; delayed:
-- run time; active: lease end) and finished jobs newest first.
local function jobs(keys, args)
  local p, fn = keys[1], "moonjob_jobs"
  local set, refused = set_of(fn, args[1])
  if not set then return refused end
  refused = check_numbers(fn, args, JOBS_NUMBERS)
  if refused then return refused end
  local order = args[4] or ""
  if order == "" then order = (set == "completed" or set == "failed") and "desc" or "asc" end
  if order ~= "asc" and order ~= "desc" then return refuse(fn, "ORDER must be asc or desc", order) end
  local offset, limit = tonumber(args[2]) or 0, tonumber(args[3]) or 20
  local preview = tonumber(args[5]) or 0
  local total = redis.call("ZCARD", p .. set)
  local out = { total }
  if offset >= total then return out end
  local members
  if order == "asc" then
    members = redis.call("ZRANGE", p .. set, offset, offset + limit - 1)
  else
    members = redis.call("ZRANGE", p .. set, offset, offset + limit - 1, "REV")
  end
  for _, m in ipairs(members) do out[#out + 1] = view(p, member_id(set, m), preview) end
  return out
end

-- job(p; id [, log_lines]) -> { view..., log } (log: its last log_lines
-- lines, default all kept) or nil when no such job is kept.
local function job(keys, args)
  local p, id = keys[1], args[1]
  if not id or id == "" then return refuse("moonjob_job", "it takes ID [LOG_LINES]", "") end
  local refused = check_numbers("moonjob_job", args,
    { { 2, "LOG_LINES must be a whole number from 0 to " .. LOG_KEEP_MAX, 0, LOG_KEEP_MAX, true } })
  if refused then return refused end
  local v = view(p, id, 0)
  if v[2] == "missing" then return nil end
  local n = tonumber(args[2] or "")
  local log = {}
  if n ~= 0 then
    local got = redis.pcall("LRANGE", log_key(p, id), n and -n or 0, -1)
    if not got.err then log = got end
  end
  v[#v + 1] = log
  return v
end

-- A finished job made to wait again, as new: its attempts, result, error,
-- progress and log are cleared (its data, options and nonce kept).
local function run_again(p, id, key, state, now)
  redis.call("ZREM", p .. state, id)
  redis.call("PERSIST", key) -- a cached result's expiry
  redis.call("HDEL", key, "result", "error", "finished", "cancel", "progress", "cache_until", "ran",
    "started", "began", "worker")
  redis.call("HSET", key, "made", 0, "token", "")
  redis.call("DEL", log_key(p, id))
  make_waiting(p, id, key, now)
end

-- The job's state, or nil and the refusal: ENOTFOUND, or its key is not a
-- job hash (EINPUT).
local function state_of(fn, p, id)
  if not id or id == "" then return nil, refuse(fn, "it takes ID", "") end
  local f, why = job_fields(job_key(p, id), "state")
  if not f then return nil, redis.error_reply("EINPUT " .. fn .. ": " .. why .. "; remove it") end
  if not f[1] then return nil, not_found(fn, id) end
  return f[1]
end

-- retry(p; id) -> the state it was in: a failed or completed job runs again.
local function retry(keys, args)
  local p, id, fn = keys[1], args[1], "moonjob_retry"
  local state, refused = state_of(fn, p, id)
  if not state then return refused end
  if state ~= "failed" and state ~= "completed" then
    return state_error(fn, id, state, "only a failed or completed job can be retried")
  end
  run_again(p, id, job_key(p, id), state, now_ms())
  return state
end

local BULK_NUMBERS = { { 2, "LIMIT must be a whole number from 1 to " .. BULK_MAX, 1, BULK_MAX, true } }

-- retry_all(p; state, limit [, before_ms]) -> { retried, left, before_ms,
-- looked_at } (looked_at: entries taken, gone ones included):
-- up to limit jobs of state (failed or completed; oldest first) that ended
-- at before_ms or earlier (default: now) run again; left counts those that
-- remain. A caller that calls again passes the before_ms answered, so jobs
-- that end again meanwhile (retried, failed anew) are not taken twice.
local function retry_all(keys, args)
  local p, fn = keys[1], "moonjob_retry_all"
  local state = args[1] or "failed"
  if state ~= "failed" and state ~= "completed" then
    return refuse(fn, "STATE must be failed or completed", state)
  end
  local refused = check_numbers(fn, args, { BULK_NUMBERS[1],
    { 3, "BEFORE_MS must be a number of ms (server time)", 0, 1e15 } })
  if refused then return refused end
  local now = now_ms()
  local before = tonumber(args[3] or "") or now
  local ids = redis.call("ZRANGEBYSCORE", p .. state, "-inf", before, "LIMIT", 0, tonumber(args[2]) or 1000)
  local retried = 0
  for _, id in ipairs(ids) do
    local key = job_key(p, id)
    local f = job_fields(key, "state")
    if f and f[1] == state then
      run_again(p, id, key, state, now)
      retried = retried + 1
    else -- gone or elsewhere: only the entry goes
      redis.call("ZREM", p .. state, id)
    end
  end
  return { retried, redis.call("ZCOUNT", p .. state, "-inf", before), before, #ids }
end

-- A job out of its set and deleted. member: its wait member, if waiting;
-- group: its group.
local function drop(p, id, key, state, member, group)
  local set = SETS[state]
  if set == "wait" then
    if member then redis.call("ZREM", p .. "wait", member) end
    G.unindex(p, group, member)
  elseif set then
    redis.call("ZREM", p .. set, id)
  end
  delete_job(p, id, key)
end

-- remove(p; id) -> the state it was in. A running job is refused (cancel it
-- first: its worker would report into a job that is gone).
local function remove(keys, args)
  local p, id, fn = keys[1], args[1], "moonjob_remove"
  if not id or id == "" then return refuse(fn, "it takes ID", "") end
  local key = job_key(p, id)
  local f = job_fields(key, "state", "member", "group")
  if not f then -- a key of another type: it holds no job, it goes
    redis.call("DEL", key)
    return "invalid"
  end
  if not f[1] then return not_found(fn, id) end
  if f[1] == "active" then
    return state_error(fn, id, "active", "cancel it first (moonjob_cancel), then remove it")
  end
  drop(p, id, key, f[1], f[2], f[3])
  return f[1]
end

-- promote(p; id) -> "delayed" (the state it was in, as retry and remove
-- answer): a delayed job may run now.
local function promote(keys, args)
  local p, id, fn = keys[1], args[1], "moonjob_promote"
  local state, refused = state_of(fn, p, id)
  if not state then return refused end
  if state ~= "delayed" then return state_error(fn, id, state, "only a delayed job can be promoted") end
  redis.call("ZREM", p .. "delayed", id)
  make_waiting(p, id, job_key(p, id), now_ms())
  return "delayed"
end

-- clean(p; state, older_than_ms, limit [, before_ms]) -> { removed, left,
-- before_ms }: finished jobs (completed or failed) that ended more than
-- older_than_ms ago (or, given, at before_ms or earlier: a caller that calls
-- again passes the before_ms answered), oldest first; left: how many of
-- them remain.
local function clean(keys, args)
  local p, fn = keys[1], "moonjob_clean"
  local state = args[1]
  if state ~= "failed" and state ~= "completed" then
    return refuse(fn, "STATE must be completed or failed (waiting and delayed jobs: moonjob_drain)",
      state or "")
  end
  local refused = check_numbers(fn, args, {
    { 2, "OLDER_THAN_MS must be a number of ms from 0 to 1e15", 0, 1e15 },
    { 3, "LIMIT must be a whole number from 1 to " .. BULK_MAX, 1, BULK_MAX, true },
    { 4, "BEFORE_MS must be a number of ms (server time)", 0, 1e15 } })
  if refused then return refused end
  local before = tonumber(args[4] or "") or (now_ms() - (tonumber(args[2]) or 0))
  local ids = redis.call("ZRANGEBYSCORE", p .. state, "-inf", before, "LIMIT", 0, tonumber(args[3]) or 1000)
  for _, id in ipairs(ids) do
    redis.call("ZREM", p .. state, id)
    local key = job_key(p, id)
    local f = job_fields(key, "state")
    if not f or f[1] == state then delete_job(p, id, key) end -- one that ran again is kept
  end
  return { #ids, redis.call("ZCOUNT", p .. state, "-inf", before), before }
end

-- Up to limit jobs of set removed (wait: from its members); -> how many.
local function empty_set(p, set, limit)
  local members = redis.call("ZRANGE", p .. set, 0, limit - 1)
  for _, m in ipairs(members) do
    local id = member_id(set, m)
    redis.call("ZREM", p .. set, m)
    local key = job_key(p, id)
    local f = job_fields(key, "state", "group")
    local here = f and f[1] and SETS[f[1]] == set
    if here and set == "wait" then G.unindex(p, f[2], m) end
    if here and set == "active" and f[2] then redis.call("SREM", p .. "ga:" .. f[2], id) end
    if here or not f then delete_job(p, id, key) end
  end
  return #members
end

-- drain(p; limit [, with_delayed]) -> { removed, left }: jobs that wait
-- (with_delayed "1": delayed ones too) removed; running and finished jobs stay.
local function drain(keys, args)
  local p, fn = keys[1], "moonjob_drain"
  local refused = check_numbers(fn, args,
    { { 1, "LIMIT must be a whole number from 1 to " .. BULK_MAX, 1, BULK_MAX, true } })
  if refused then return refused end
  local limit = tonumber(args[1]) or 1000
  local removed = empty_set(p, "wait", limit)
  local delayed = args[2] == "1"
  if delayed and removed < limit then removed = removed + empty_set(p, "delayed", limit - removed) end
  if redis.call("ZCARD", p .. "wait") == 0 then G.sweep(p, false) end
  local left = redis.call("ZCARD", p .. "wait") + (delayed and redis.call("ZCARD", p .. "delayed") or 0)
  return { removed, left }
end

-- Up to limit schedules deleted; -> how many.
local function drop_schedules(p, limit)
  local ids = redis.call("ZRANGE", p .. "schedules", 0, limit - 1)
  for _, id in ipairs(ids) do
    redis.call("ZREM", p .. "schedules", id)
    redis.call("DEL", schedule_key(p, id))
  end
  return #ids
end

-- The keys of a queue that are not jobs (obliterate deletes them last).
-- tokens stays: a run of a job obliterated must never share its token with a
-- run of a job added after (its late report would land in the new job).
local QUEUE_KEYS = { "seq", "ids", "totals", "paused", "m:all", "limits", "limited", "starts", "groups", "gparked",
  "ungrouped", "turn" }

-- obliterate(p; limit [, force]) -> { removed, left }: every job, schedule
-- and key of the queue (but its token counter), limit jobs per call; refused (EBUSY)
-- while jobs run, unless force "1" (their workers' reports are then
-- refused). It pauses the queue until it is gone, so no worker takes a job
-- between two calls (and a later call is not refused). Per-minute metrics
-- keys expire by themselves (METRICS_TTL) and are deleted for the last day.
local function obliterate(keys, args)
  local p, fn = keys[1], "moonjob_obliterate"
  local refused = check_numbers(fn, args,
    { { 1, "LIMIT must be a whole number from 1 to " .. BULK_MAX, 1, BULK_MAX, true } })
  if refused then return refused end
  local running = redis.call("ZCARD", p .. "active")
  if running > 0 and args[2] ~= "1" then
    return redis.error_reply(("EBUSY %s: %d job(s) are running; stop the workers, or force"):format(fn, running))
  end
  redis.call("SET", p .. "paused", "obliterating")
  local limit, removed = tonumber(args[1]) or 1000, 0
  for _, set in ipairs({ "wait", "delayed", "active", "completed", "failed" }) do
    if removed < limit then removed = removed + empty_set(p, set, limit - removed) end
  end
  if removed < limit then removed = removed + drop_schedules(p, limit - removed) end
  local left = 0
  for _, set in ipairs({ "wait", "delayed", "active", "completed", "failed", "schedules" }) do
    left = left + redis.call("ZCARD", p .. set)
  end
  if left == 0 then
    G.sweep(p, true)
    for _, k in ipairs(QUEUE_KEYS) do redis.call("DEL", p .. k) end
    local minute = math.floor(now_ms() / 60000)
    for m = minute - METRICS_TTL / 60, minute do redis.call("DEL", p .. "m:" .. m) end
  end
  return { removed, left }
end

-- pause(p) / resume(p) -> "OK": while <p>paused exists, fetch hands out no
-- job (running jobs go on); workers hear "paused" / "resumed" on <p>events.
local function pause(keys)
  redis.call("SET", keys[1] .. "paused", "1")
  redis.pcall("SADD", REGISTRY, string.sub(keys[1], 5, -3)) -- listed, though nothing was added yet
  publish(keys[1], "paused")
  return "OK"
end

local function resume(keys)
  if redis.call("DEL", keys[1] .. "paused") == 1 then publish(keys[1], "resumed") end
  return "OK"
end

-- progress(p; id, token, json) -> "OK" | "ESTALE": a running job's progress
-- (the last one wins), published on <p>updates as {"id":..,"progress":..}.
local function progress(keys, args)
  local p, id, token = keys[1], args[1], args[2]
  if #args < 3 then return refuse("moonjob_progress", "it takes ID TOKEN PROGRESS; arguments given", #args) end
  if not pcall(cjson.decode, args[3]) then
    return refuse("moonjob_progress", "PROGRESS must be JSON text", args[3])
  end
  local key = job_key(p, id)
  if not holds(key, token) then return "ESTALE" end
  redis.call("HSET", key, "progress", args[3])
  redis.call("PUBLISH", p .. "updates", '{"id":' .. cjson.encode(id) .. ',"progress":' .. args[3] .. "}")
  return "OK"
end

-- log(p; id, token, keep, line...) -> "OK" | "ESTALE": lines appended to a
-- running job's log, of which the last keep are kept; each published on
-- <p>updates as {"id":..,"log":"<line>"}.
local function log(keys, args)
  local p, id, token, fn = keys[1], args[1], args[2], "moonjob_log"
  if #args < 4 then return refuse(fn, "it takes ID TOKEN KEEP LINE...; arguments given", #args) end
  local refused = check_numbers(fn, args,
    { { 3, "KEEP must be a whole number from 1 to " .. LOG_KEEP_MAX, 1, LOG_KEEP_MAX, true } })
  if refused then return refused end
  if not holds(job_key(p, id), token) then return "ESTALE" end
  local lk = log_key(p, id)
  for i = 4, #args do
    redis.call("RPUSH", lk, args[i])
    redis.call("PUBLISH", p .. "updates", '{"id":' .. cjson.encode(id) .. ',"log":' .. cjson.encode(args[i]) .. "}")
  end
  redis.call("LTRIM", lk, -tonumber(args[3]), -1)
  return "OK"
end

local METRIC_FIELDS = { "c", "f", "n", "s" }
for i = 1, #RUN_BUCKETS + 1 do METRIC_FIELDS[#METRIC_FIELDS + 1] = "h" .. i end

local function metric_row(key)
  local row = redis.pcall("HMGET", key, unpack(METRIC_FIELDS))
  if row.err then row = {} end
  local out = {}
  for i = 1, #METRIC_FIELDS do out[i] = tonumber(row[i]) or 0 end
  return out
end

-- metrics(p; minutes) -> { first_minute, bounds, all, row, ... }: the last
-- `minutes` minutes (the current one last), each row { completed, failed,
-- runs, run_ms_sum, h1..h15 }; all: the same since ever; bounds: the
-- buckets' upper bounds in ms (the last bucket has none). A minute is
-- floor(server ms / 60000).
local function metrics(keys, args)
  local p = keys[1]
  local refused = check_numbers("moonjob_metrics", args,
    { { 1, "MINUTES must be a whole number from 0 to 1500", 0, 1500, true } })
  if refused then return refused end
  local n = tonumber(args[1]) or 60
  local last = math.floor(now_ms() / 60000)
  local out = { last - n + 1, RUN_BUCKETS, metric_row(p .. "m:all") }
  for m = last - n + 1, last do out[#out + 1] = metric_row(p .. "m:" .. m) end
  return out
end

-- held(p) -> active jobs whose worker has not said they started (counted
-- among the first 2,000 active jobs: counts() stays cheap).
local function held_count(p)
  local ids = redis.call("ZRANGE", p .. "active", 0, 1999)
  local held = 0
  for _, id in ipairs(ids) do
    local ran = redis.pcall("HGET", job_key(p, id), "ran")
    if ran ~= "1" then held = held + 1 end
  end
  return held
end

-- Whether the queue exists: it has a key, or it is registered (a worker
-- waits on it though nothing was added yet). pcall: the registry is outside
-- the queue's keys, which an ACL user may not read.
local function exists(p)
  local keys = { "wait", "delayed", "active", "completed", "failed", "totals", "seq", "ids", "paused",
    "schedules" }
  for i, k in ipairs(keys) do keys[i] = p .. k end
  if redis.call("EXISTS", unpack(keys)) > 0 then return 1 end
  local registered = redis.pcall("SISMEMBER", REGISTRY, string.sub(p, 5, -3))
  return registered == 1 and 1 or 0
end

-- counts(p) -> { waiting, delayed, active, completed, failed, missing,
-- paused, held, exists }: completed and failed count every job that ended so
-- (not only the ones kept); missing, the set entries found with their job
-- gone (evicted); paused 1 while the queue is paused; held, the active jobs
-- not started yet (held_count); exists 0 when the queue has no key at all.
local function counts(keys)
  local p = keys[1]
  local totals = redis.pcall("HMGET", p .. "totals", "completed", "failed", "missing")
  if totals.err then totals = {} end -- a spoiled totals key: its counts read as 0
  return { redis.call("ZCARD", p .. "wait"), redis.call("ZCARD", p .. "delayed"),
    redis.call("ZCARD", p .. "active"), tonumber(totals[1]) or 0, tonumber(totals[2]) or 0,
    tonumber(totals[3]) or 0, redis.call("EXISTS", p .. "paused"), held_count(p), exists(p) }
end

local function version() return "6" end

redis.register_function("moonjob_add", add)
redis.register_function("moonjob_fetch", fetch)
-- allow-oom: a lease is kept while Redis refuses writes at maxmemory (it
-- only moves a score and sets a flag), so a pending report keeps its job
redis.register_function{ function_name = "moonjob_renew", callback = renew, flags = { "allow-oom" } }
redis.register_function("moonjob_complete", complete)
redis.register_function("moonjob_fail", fail)
redis.register_function("moonjob_release", release)
redis.register_function("moonjob_cancel", cancel)
redis.register_function("moonjob_retry", retry)
redis.register_function("moonjob_retry_all", retry_all)
redis.register_function("moonjob_remove", remove)
redis.register_function("moonjob_promote", promote)
redis.register_function("moonjob_clean", clean)
redis.register_function("moonjob_drain", drain)
redis.register_function("moonjob_obliterate", obliterate)
redis.register_function("moonjob_pause", pause)
redis.register_function("moonjob_resume", resume)
redis.register_function("moonjob_progress", progress)
redis.register_function("moonjob_log", log)
redis.register_function("moonjob_limit", limit)
redis.register_function("moonjob_ratelimited", ratelimited)
redis.register_function{ function_name = "moonjob_limits", callback = limits, flags = { "no-writes" } }
redis.register_function{ function_name = "moonjob_groups", callback = groups, flags = { "no-writes" } }
redis.register_function("moonjob_schedule", schedule)
redis.register_function("moonjob_unschedule", unschedule)
redis.register_function{ function_name = "moonjob_schedules", callback = schedules, flags = { "no-writes" } }
redis.register_function{ function_name = "moonjob_jobs", callback = jobs, flags = { "no-writes" } }
redis.register_function{ function_name = "moonjob_job", callback = job, flags = { "no-writes" } }
redis.register_function{ function_name = "moonjob_metrics", callback = metrics, flags = { "no-writes" } }
redis.register_function{ function_name = "moonjob_get", callback = get, flags = { "no-writes" } }
redis.register_function{ function_name = "moonjob_counts", callback = counts, flags = { "no-writes" } }
redis.register_function{ function_name = "moonjob_version", callback = version, flags = { "no-writes" } }
redis.register_function{ function_name = "moonjob_cron", callback = cron, flags = { "no-writes" } }

-- writable() -> "OK": may write (no "no-writes" flag) and writes nothing, so
-- it is refused as every write is by a replica (READONLY), a replica cut off
-- from its primary (MASTERDOWN) or a server loading its data (LOADING):
-- clients call it at connect to know they reached a primary. allow-oom: a
-- full primary is still a primary.
redis.register_function{ function_name = "moonjob_writable", callback = function() return "OK" end,
  flags = { "allow-oom" } }
