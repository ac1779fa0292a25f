-- part: operate.lua
-- Acting on a queue's jobs (moonjob.redis.operate, the CLI, the dashboard):
-- retry, remove, promote, pause, resume. Calls that may touch many jobs
-- (retry_all, clean, drain, obliterate) do at most LIMIT (<= BULK_MAX) per
-- call and say how many are left, so one call never blocks the server for
-- long; the caller calls again.

do
local REGISTRY, now_ms, job_key, publish, refuse = H.REGISTRY, H.now_ms, H.job_key, H.publish, H.refuse
local job_fields, log_key, delete_job, SETS = H.job_fields, H.log_key, H.delete_job, H.SETS
local member_id, check_numbers, METRICS_TTL = H.member_id, H.check_numbers, H.METRICS_TTL
local make_waiting = H.make_waiting
local schedule_key = S.schedule_key

local BULK_MAX = 10000

local function state_error(fn, id, state, wanted)
  return redis.error_reply(("ESTATE %s: job %s is %s; %s"):format(fn, id, state, wanted))
end

local function not_found(fn, id)
  return redis.error_reply(("ENOTFOUND %s: no job %s in this queue (never added, or no longer kept)")
    :format(fn, tostring(id):sub(1, 200)))
end

-- A retried job's expiry counts anew from now, the span it was added with
-- (expire_ms; a job stored without it: its expire_at less its created), so
-- that a job failed EEXPIRED runs when retried. A span that is not a
-- positive number drops the expiry.
local function expire_again(key, now)
  local f = redis.call("HMGET", key, "expire_ms", "expire_at", "created")
  if not f[1] and not f[2] then return end
  local span = tonumber(f[1] or "") or ((tonumber(f[2]) or 0) - (tonumber(f[3] or "") or math.huge))
  if span > 0 and span < math.huge then redis.call("HSET", key, "expire_at", now + span)
  else redis.call("HDEL", key, "expire_at", "expire_ms") end
end

-- A finished job made to wait again, as new: its attempts, result, error,
-- progress and log are cleared (its data, options and nonce kept), its
-- expiry counted from now.
local function run_again(p, id, key, state, now)
  redis.call("ZREM", p .. state, id)
  expire_again(key, now)
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

-- remove(p; id [, "cascade"]) -> the state it was in. A running job is
-- refused (cancel it first: its worker would report into a job that is
-- gone); so is a flow's child its parent waits for, unless "cascade": then
-- its parent counts it as canceled (by default the parent fails, and its
-- other pending children are canceled). A parent's pending children are
-- canceled with it (flows.lua).
local function remove(keys, args)
  local p, id, fn = keys[1], args[1], "moonjob_remove"
  if not id or id == "" then return refuse(fn, "it takes ID [cascade]", "") end
  if args[2] and args[2] ~= "" and args[2] ~= "cascade" then return refuse(fn, "the second argument may only be cascade", args[2]) end
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
  local pq, pid = H.counted_by(key)
  if pq and args[2] ~= "cascade" then
    return state_error(fn, id, f[1], ("its parent %s in queue %s waits for it: remove it with cascade (the parent"
      .. " then counts it as canceled, and by default fails), or cancel the parent"):format(pid, pq))
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
    local key = job_key(p, id)
    local f = job_fields(key, "state") -- (read first: an error of the read leaves the entry)
    redis.call("ZREM", p .. state, id)
    if not f or f[1] == state then delete_job(p, id, key) end -- one that ran again is kept
  end
  return { #ids, redis.call("ZCOUNT", p .. state, "-inf", before), before }
end

-- Up to limit jobs of set removed (wait: from its members); -> how many.
local function empty_set(p, set, limit)
  local members = redis.call("ZRANGE", p .. set, 0, limit - 1)
  for _, m in ipairs(members) do
    local id = member_id(set, m)
    local key = job_key(p, id)
    local f = job_fields(key, "state", "group") -- (read first, as clean)
    redis.call("ZREM", p .. set, m)
    local here = f and f[1] and SETS[f[1]] == set
    if here and set == "wait" then G.unindex(p, f[2], m) end
    if here and set == "active" and f[2] then redis.call("SREM", p .. "ga:" .. f[2], id) end
    if here or not f then delete_job(p, id, key) end
    if set == "parents" and f and not f[1] then redis.call("DEL", p .. "deps:" .. id, p .. "kids:" .. id) end -- (its hash gone)
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

-- Up to limit members of the sorted set <p><set> dropped, each with what
-- drop_one(p, member) deletes; -> how many were, how many are left. A key
-- of another type (another client's) lists nothing: it goes.
local function drop_listed(p, set, limit, drop_one)
  local members = redis.pcall("ZRANGE", p .. set, 0, limit - 1)
  if members.err then
    redis.call("DEL", p .. set)
    return 0, 0
  end
  for _, m in ipairs(members) do
    redis.call("ZREM", p .. set, m)
    drop_one(p, m)
  end
  return #members, redis.call("ZCARD", p .. set)
end

-- What obliterate's drop_listed deletes with a schedule, a group noted in
-- <p>gkeys (its window and hold), a job noted in <p>cached (kept past its
-- trimming for its cache), a sheet of named adds noted in <p>sheets.
local DROP = {
  schedules = function(p, id) redis.call("DEL", schedule_key(p, id)) end,
  gkeys = function(p, g) redis.call("DEL", p .. "gs:" .. g, p .. "gl:" .. g) end,
  cached = function(p, id) delete_job(p, id, job_key(p, id)) end,
  sheets = function(p, sheet) redis.call("DEL", p .. "added:" .. sheet) end, -- (producers' named adds: add.lua)
}

-- The keys of a queue that are not jobs (H.QUEUE_KEYS: obliterate deletes
-- them last). tokens stays: a run of a job obliterated must never share its
-- token with a run of a job added after (its late report would land in the
-- new job).

-- obliterate(p; limit [, force]) -> { removed, left }: every job, schedule
-- and key of the queue (but its token counter), limit jobs per call, then
-- the groups and the keys that outlive a job or group (<p>gkeys,
-- <p>cached; left counts them once no job is left); refused (EBUSY)
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
    return redis.error_reply(("EBUSY %s: %d job(s) are active (fetched by workers: running, or held to run next); "
      .. "stop the workers, or force"):format(fn, running))
  end
  redis.call("SET", p .. "paused", "obliterating")
  local limit, removed = tonumber(args[1]) or 1000, 0
  for _, set in ipairs({ "parents", "wait", "delayed", "active", "completed", "failed" }) do
    if removed < limit then removed = removed + empty_set(p, set, limit - removed) end
  end
  if removed < limit then removed = removed + drop_listed(p, "schedules", limit - removed, DROP.schedules) end
  local left = 0
  for _, set in ipairs({ "parents", "wait", "delayed", "active", "completed", "failed", "schedules" }) do
    left = left + redis.call("ZCARD", p .. set)
  end
  if left == 0 then left = G.sweep(p, true) end -- (SWEEP_MAX groups per call)
  for _, set in ipairs({ "gkeys", "cached", "sheets" }) do
    if left == 0 then
      local _, rest = drop_listed(p, set, limit, DROP[set])
      left = rest
    end
  end
  if left == 0 then
    for _, k in ipairs(H.QUEUE_KEYS) do redis.call("UNLINK", p .. k) end -- (starts may hold a million entries)
    local minute = math.floor(now_ms() / 60000)
    for m = minute - METRICS_TTL / 60, minute do redis.call("DEL", p .. "m:" .. m) end
  end
  return { removed, left }
end

-- pause(p) / resume(p) -> "OK": while <p>paused exists, fetch hands out no
-- job (running jobs go on); workers hear "paused" / "resumed" on <p>events.
local function pause(keys)
  redis.call("SET", keys[1] .. "paused", "1")
  redis.pcall("SADD", REGISTRY, H.queue_name(keys[1])) -- listed, though nothing was added yet
  publish(keys[1], "paused")
  return "OK"
end

local function resume(keys)
  if redis.call("DEL", keys[1] .. "paused") == 1 then publish(keys[1], "resumed") end
  return "OK"
end

F.retry, F.retry_all, F.remove, F.promote, F.clean = retry, retry_all, remove, promote, clean
F.drain, F.obliterate, F.pause, F.resume = drain, obliterate, pause, resume
end
