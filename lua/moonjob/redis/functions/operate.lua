-- part: operate.lua
-- Seeing and acting on a queue's jobs (moonjob.redis.operate, the CLI, the
-- dashboard). Listings are paged in Redis (ZRANGE with offset and count):
-- never a walk over every job. Calls that may touch many jobs (retry_all,
-- clean, drain, obliterate) do at most LIMIT (<= BULK_MAX) per call and say
-- how many are left, so one call never blocks the server for long; the
-- caller calls again.

do
local REGISTRY, ATTEMPTS_MAX, COUNT_MAX = H.REGISTRY, H.ATTEMPTS_MAX, H.COUNT_MAX
local LOG_KEEP_MAX, now_ms, job_key, publish = H.LOG_KEEP_MAX, H.now_ms, H.job_key, H.publish
local refuse, job_fields, log_key, delete_job = H.refuse, H.job_fields, H.log_key, H.delete_job
local check_numbers, METRICS_TTL, make_waiting = H.check_numbers, H.METRICS_TTL, H.make_waiting
local schedule_key = S.schedule_key

local BULK_MAX = 10000
local LIST_MAX = 1000

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

F.jobs, F.job, F.retry, F.retry_all, F.remove, F.promote = jobs, job, retry, retry_all, remove, promote
F.clean, F.drain, F.obliterate, F.pause, F.resume, F.counts = clean, drain, obliterate, pause, resume, counts
end
