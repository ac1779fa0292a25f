#!lua name=moonjob
-- moonjob's queue, as a library of Redis Functions (Redis 7). This file runs
-- inside Redis, not in moonjob: workers load it with FUNCTION LOAD REPLACE
-- when they connect, and every change of a queue's state is one FCALL, so it
-- is atomic. docs/REDIS.md is the contract for other languages.
--
-- KEYS[1] of every call is the queue's prefix, "mj:{<queue>}:"; every key of
-- the queue starts with it, so all of them share one hash tag (one cluster
-- slot). Keys:
--   <p>seq         counter: order of arrival (first in, first out per priority)
--   <p>ids         counter: the ids moonjob draws
--   <p>totals      hash: completed, failed (every job that ever ended so)
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
-- Job fields: data (JSON text), priority, attempts (allowed), made (attempts
-- started), backoff (JSON text or ""), timeout, kill_after, name, cache (s),
-- state (waiting, delayed, active, completed, failed), token (of the run
-- holding the lease), worker, result (JSON text), error (JSON text), cancel
-- (the reason, once asked while active), created, started, finished, run_at
-- (ms), member (its wait member), notify ("1": publish its id on <p>done),
-- cache_until (ms).
--
-- Time is always the server's (TIME), never a worker's clock. Results and
-- failures carrying a token that is not the job's current one are refused:
-- a worker that lost its lease cannot overwrite the run that replaced it.

-- A job's id, name and backoff are small: a fetch reply's bound counts on it.
local FIELD_MAX = 1024

local function now_ms()
  local t = redis.call("TIME")
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function job_key(p, id) return p .. "j:" .. id end

local function publish(p, message)
  redis.call("PUBLISH", p .. "events", message)
end

local function err_json(code, message)
  return cjson.encode({ code = code, message = message })
end

-- Finished jobs are kept by count and by age, a bounded amount of work per
-- call (so a backlog is removed over the next calls). A completed job whose
-- result is cached stays readable until its cache ends.
local function trim(p, set, keep_count, keep_age_ms, now, most)
  local removed = {}
  local old = redis.call("ZRANGEBYSCORE", p .. set, "-inf", now - keep_age_ms, "LIMIT", 0, most)
  for _, id in ipairs(old) do removed[#removed + 1] = id end
  local extra = redis.call("ZCARD", p .. set) - #removed - keep_count
  if extra > 0 then
    local oldest = redis.call("ZRANGE", p .. set, #removed, #removed + math.min(extra, most) - 1)
    for _, id in ipairs(oldest) do removed[#removed + 1] = id end
  end
  for _, id in ipairs(removed) do
    redis.call("ZREM", p .. set, id)
    local key = job_key(p, id)
    local cache_until = tonumber(redis.call("HGET", key, "cache_until") or "0") or 0
    if cache_until > now then
      redis.call("PEXPIREAT", key, cache_until)
    else
      redis.call("DEL", key)
    end
  end
end

-- keep_count and keep_age_ms come in args[args_at], args[args_at + 1].
-- At most max(100, 2 x the fetch's batch) per state and call: more than the
-- batch can finish, so retention keeps up under any load.
local function retain(p, args_at, args, now, batch)
  local keep_count = tonumber(args[args_at]) or 1000
  local keep_age = tonumber(args[args_at + 1]) or 86400000
  local most = math.max(100, 2 * batch)
  trim(p, "completed", keep_count, keep_age, now, most)
  trim(p, "failed", keep_count, keep_age, now, most)
end

local function make_waiting(p, id, key, now)
  local prio = tonumber(redis.call("HGET", key, "priority")) or 0
  local member = string.format("%016d", redis.call("INCR", p .. "seq")) .. ":" .. id
  redis.call("HSET", key, "state", "waiting", "member", member, "run_at", now)
  if redis.call("ZCARD", p .. "wait") == 0 then publish(p, "added") end
  redis.call("ZADD", p .. "wait", prio, member)
end

local function make_delayed(p, id, key, run_at)
  redis.call("HSET", key, "state", "delayed", "run_at", run_at)
  redis.call("ZADD", p .. "delayed", run_at, id)
end

-- f: the job's cache and notify fields when the caller read them already.
local function finish(p, id, key, state, field, value, now, f)
  f = f or redis.call("HMGET", key, "cache", "notify")
  local cache = state == "completed" and tonumber(f[1]) or 0
  redis.call("ZREM", p .. "active", id)
  if cache > 0 then
    redis.call("HSET", key, "state", state, field, value, "finished", now, "token", "",
      "cache_until", now + math.floor(cache * 1000))
  else
    redis.call("HSET", key, "state", state, field, value, "finished", now, "token", "")
  end
  redis.call("ZADD", p .. state, now, id)
  if not f.batched then redis.call("HINCRBY", p .. "totals", state, 1) end
  if f[2] == "1" then redis.call("PUBLISH", p .. "done", id) end
end

-- A job whose lease expired ran on a worker that stopped renewing (killed,
-- cut off, paused): it runs again, counting an attempt (ESTALLED), or fails
-- for good once its attempts are used up.
local function recover_stalled(p, now)
  local stalled = redis.call("ZRANGEBYSCORE", p .. "active", "-inf", now, "LIMIT", 0, 100)
  for _, id in ipairs(stalled) do
    local key = job_key(p, id)
    local f = redis.call("HMGET", key, "made", "attempts", "worker", "cancel", "ran")
    local made, attempts = tonumber(f[1]) or 0, tonumber(f[2]) or 1
    local e = err_json("ESTALLED", "the job's lease expired on worker " .. tostring(f[3])
      .. " (killed, cut off or paused)")
    if f[5] ~= "1" then -- its worker never said it started: the attempt is not counted
      made = redis.call("HINCRBY", key, "made", -1)
    end
    if f[4] then
      finish(p, id, key, "failed", "error", err_json("ECANCELED", f[4]), now)
    elseif made >= attempts then
      finish(p, id, key, "failed", "error", e, now)
    else
      redis.call("ZREM", p .. "active", id)
      redis.call("HSET", key, "error", e, "token", "")
      make_waiting(p, id, key, now)
    end
  end
  return #stalled
end

local function promote_delayed(p, now)
  local due = redis.call("ZRANGEBYSCORE", p .. "delayed", "-inf", now, "LIMIT", 0, 1000)
  for _, id in ipairs(due) do
    redis.call("ZREM", p .. "delayed", id)
    make_waiting(p, id, job_key(p, id), now)
  end
end

-- add(p; id, data, priority, delay_ms, attempts, backoff, timeout, kill_after,
--     name, cache, max_queue, notify) -> { id, state, joined }
-- id "" draws a number; id "\0dedupe" is "d:" .. the SHA-1 of data. A job with that id waiting, delayed or running is
-- joined (joined = 1); a completed one whose cache has not ended is returned
-- as it is; otherwise the id starts a new job.
local function add(keys, args)
  local p = keys[1]
  local id, data = args[1], args[2]
  local prio, delay = tonumber(args[3]) or 0, tonumber(args[4]) or 0
  local now = now_ms()
  if id == "" then -- a number no job holds (an explicit id may have taken it)
    repeat id = tostring(redis.call("INCR", p .. "ids")) until redis.call("EXISTS", job_key(p, id)) == 0
  elseif id == "\0dedupe" then id = "d:" .. redis.sha1hex(data) end
  local key = job_key(p, id)
  local state = redis.call("HGET", key, "state")
  if state == "waiting" or state == "delayed" or state == "active" then
    if args[12] == "1" then redis.call("HSET", key, "notify", "1") end
    return { id, state, 1 }
  elseif state == "completed" and (tonumber(redis.call("HGET", key, "cache_until")) or 0) > now then
    return { id, state, 1 }
  end
  if #id > FIELD_MAX or #args[9] > FIELD_MAX or #args[6] > FIELD_MAX then
    return redis.error_reply("EINPUT a job's id, name and backoff must each take at most "
      .. FIELD_MAX .. " bytes")
  end
  local max_queue = tonumber(args[11]) or 0
  if max_queue > 0 and redis.call("ZCARD", p .. "wait") + redis.call("ZCARD", p .. "delayed") >= max_queue then
    return redis.error_reply("EQUEUEFULL the queue holds max_queue (" .. max_queue .. ") waiting jobs")
  end
  if state then
    redis.call("ZREM", p .. "completed", id)
    redis.call("ZREM", p .. "failed", id)
    redis.call("DEL", key)
  end
  redis.call("HSET", key, "id", id, "data", data, "priority", prio, "attempts", args[5],
    "made", 0, "backoff", args[6], "timeout", args[7], "kill_after", args[8], "name", args[9],
    "cache", args[10], "notify", args[12], "created", now)
  if delay > 0 then
    make_delayed(p, id, key, now + delay)
    return { id, "delayed", 0 }
  end
  make_waiting(p, id, key, now)
  return { id, "waiting", 0 }
end

-- fetch(p; worker, n, lease_ms, keep_count, keep_age_ms, max_payload) -> { next_due_ms, job, ... }; each job is
-- { id, token, data, made, attempts, backoff, timeout, kill_after, name }.
-- Recovers stalled jobs, makes due delayed jobs ready and trims finished
-- jobs (keep_count, keep_age_ms; once per fetch, not per job) first. A job
-- whose data is over max_payload (0: no bound) fails with EPAYLOAD here, its
-- data never sent. next_due_ms:
-- when the earliest delayed job falls due (server ms from now), or -1.
local function fetch(keys, args)
  local p, worker = keys[1], args[1]
  local n, lease = tonumber(args[2]) or 1, tonumber(args[3]) or 30000
  local max_payload = tonumber(args[6]) or 0
  local now = now_ms()
  recover_stalled(p, now)
  promote_delayed(p, now)
  retain(p, 4, args, now, n)
  local out = { -1 }
  local popped = n > 0 and redis.call("ZPOPMIN", p .. "wait", n) or {}
  -- tokens: one counter step per batch, one number per job (never reused)
  local last_token = #popped > 0 and redis.call("INCRBY", p .. "tokens", #popped / 2) or 0
  local next_token = last_token - #popped / 2
  for i = 1, #popped, 2 do
    local member = popped[i]
    local id = string.sub(member, 18)
    local key = job_key(p, id)
    local f = redis.call("HMGET", key, "state", "data", "attempts", "backoff", "timeout", "kill_after",
      "name", "made")
    local made = (tonumber(f[8]) or 0) + 1
    local too_long = f[1] and (#id > FIELD_MAX or #(f[4] or "") > FIELD_MAX or #(f[7] or "") > FIELD_MAX)
    if too_long then -- written around moonjob_add: never sent, it fails here
      redis.call("HSET", key, "made", made)
      redis.call("ZADD", p .. "active", now, id)
      finish(p, id, key, "failed", "error", err_json("EINPUT", "the job's id, name or backoff takes more than "
        .. FIELD_MAX .. " bytes"), now)
    elseif f[1] and max_payload > 0 and f[2] and #f[2] > max_payload then -- never sent: it fails here
      redis.call("HSET", key, "made", made)
      redis.call("ZADD", p .. "active", now, id)
      finish(p, id, key, "failed", "error", err_json("EPAYLOAD", ("the job data is %d bytes, more than "
        .. "the worker's max_payload (%d)"):format(#f[2], max_payload)), now)
    elseif f[1] then
      next_token = next_token + 1
      local token = worker .. "/" .. next_token
      redis.call("HSET", key, "state", "active", "token", token, "worker", worker, "started", now,
        "ran", "0", "made", made)
      redis.call("ZADD", p .. "active", now + lease, id)
      out[#out + 1] = { id, token, f[2], made, f[3], f[4], f[5], f[6], f[7] }
    end
  end
  local first = redis.call("ZRANGE", p .. "delayed", 0, 0, "WITHSCORES")
  if first[2] then out[1] = math.max(0, tonumber(first[2]) - now) end
  return out
end

local function holds(key, token)
  if token == "" then return false end
  local f = redis.call("HMGET", key, "token", "state")
  return f[1] == token and f[2] == "active"
end

-- renew(p; lease_ms, id, token, ran, id, token, ran, ...) -> { id, code, reason, ... }
-- for each job whose lease this worker no longer holds (ELOST) or whose
-- cancel was asked (ECANCELED, with the reason). The others' leases now end
-- lease_ms from now. ran = "1": the job has started on its worker (a job
-- recovered after its lease counts an attempt only if it had).
local function renew(keys, args)
  local p, lease = keys[1], tonumber(args[1]) or 30000
  local now = now_ms()
  local out = {}
  for i = 2, #args, 3 do
    local id, token = args[i], args[i + 1]
    local key = job_key(p, id)
    if not holds(key, token) then
      out[#out + 1] = id; out[#out + 1] = "ELOST"; out[#out + 1] = ""
    else
      if args[i + 2] == "1" then redis.call("HSET", key, "ran", "1") end
      redis.call("ZADD", p .. "active", "XX", now + lease, id)
      local reason = redis.call("HGET", key, "cancel")
      if reason then
        out[#out + 1] = id; out[#out + 1] = "ECANCELED"; out[#out + 1] = reason
      end
    end
  end
  return out
end

-- complete(p; id, token, result [, id, token, result ...]) -> { "OK" | "ESTALE", ... }
-- one answer per job, in order.
local function complete(keys, args)
  local p = keys[1]
  local now = now_ms()
  local out, done = {}, 0
  for i = 1, #args - 2, 3 do
    local id, token = args[i], args[i + 1]
    local key = job_key(p, id)
    local f = redis.call("HMGET", key, "cache", "notify", "token", "state")
    if token ~= "" and f[3] == token and f[4] == "active" then
      f.batched = true -- totals counted once for the batch
      finish(p, id, key, "completed", "result", args[i + 2], now, f)
      out[#out + 1] = "OK"
      done = done + 1
    else
      out[#out + 1] = "ESTALE"
    end
  end
  if done > 0 then redis.call("HINCRBY", p .. "totals", "completed", done) end
  return out
end

-- fail(p; id, token, error, retry_ms) -> state | "ESTALE"
-- retry_ms >= 0: the job runs again after that many ms if it has attempts
-- left (the worker computed the backoff); -1: it fails for good.
local function fail(keys, args)
  local p, id, token = keys[1], args[1], args[2]
  local key = job_key(p, id)
  if not holds(key, token) then return "ESTALE" end
  local now = now_ms()
  local retry = tonumber(args[4]) or -1
  local f = redis.call("HMGET", key, "made", "attempts", "cancel")
  local made, attempts = tonumber(f[1]) or 0, tonumber(f[2]) or 1
  if retry >= 0 and made < attempts and not f[3] then
    redis.call("ZREM", p .. "active", id)
    redis.call("HSET", key, "error", args[3], "token", "")
    if retry > 0 then make_delayed(p, id, key, now + retry) else make_waiting(p, id, key, now) end
    return redis.call("HGET", key, "state")
  end
  finish(p, id, key, "failed", "error", args[3], now)
  return "failed"
end

-- release(p; id, token) -> "OK" | "ESTALE": a job the worker holds but gives
-- back unfinished (it stops): waiting again, its attempt not counted.
local function release(keys, args)
  local p, id, token = keys[1], args[1], args[2]
  local key = job_key(p, id)
  if not holds(key, token) then return "ESTALE" end
  local now = now_ms()
  redis.call("ZREM", p .. "active", id)
  redis.call("HINCRBY", key, "made", -1)
  redis.call("HSET", key, "token", "")
  local reason = redis.call("HGET", key, "cancel")
  if reason then
    finish(p, id, key, "failed", "error", err_json("ECANCELED", reason), now)
  else
    make_waiting(p, id, key, now)
  end
  return "OK"
end

-- cancel(p; id, reason) -> the state the job was in, or "ENOTFOUND". A
-- waiting or delayed job fails with ECANCELED at once; a running one is
-- interrupted by the worker that holds it ("cancel <id>" on the channel,
-- and the worker's next renew).
local function cancel(keys, args)
  local p, id, reason = keys[1], args[1], args[2]
  local key = job_key(p, id)
  local state = redis.call("HGET", key, "state")
  if not state then return "ENOTFOUND" end
  local now = now_ms()
  if state == "waiting" then
    redis.call("ZREM", p .. "wait", redis.call("HGET", key, "member"))
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

-- get(p; id) -> { state, result, error, made, attempts, name, created,
-- started, finished } or nil when no such job is kept.
local function get(keys, args)
  local f = redis.call("HMGET", job_key(keys[1], args[1]), "state", "result", "error", "made",
    "attempts", "name", "created", "started", "finished")
  if not f[1] then return nil end
  return f
end

-- counts(p) -> { waiting, delayed, active, completed, failed }: completed and
-- failed count every job that ended so (not only the ones kept).
local function counts(keys)
  local p = keys[1]
  local totals = redis.call("HMGET", p .. "totals", "completed", "failed")
  return { redis.call("ZCARD", p .. "wait"), redis.call("ZCARD", p .. "delayed"),
    redis.call("ZCARD", p .. "active"), tonumber(totals[1]) or 0, tonumber(totals[2]) or 0 }
end

local function version() return "2" end

redis.register_function("moonjob_add", add)
redis.register_function("moonjob_fetch", fetch)
-- allow-oom: a lease is kept while Redis refuses writes at maxmemory (it
-- only moves a score and sets a flag), so a pending report keeps its job
redis.register_function{ function_name = "moonjob_renew", callback = renew, flags = { "allow-oom" } }
redis.register_function("moonjob_complete", complete)
redis.register_function("moonjob_fail", fail)
redis.register_function("moonjob_release", release)
redis.register_function("moonjob_cancel", cancel)
redis.register_function{ function_name = "moonjob_get", callback = get, flags = { "no-writes" } }
redis.register_function{ function_name = "moonjob_counts", callback = counts, flags = { "no-writes" } }
redis.register_function{ function_name = "moonjob_version", callback = version, flags = { "no-writes" } }

-- writable() -> "OK": may write (no "no-writes" flag) and writes nothing, so
-- it is refused as every write is by a replica (READONLY), a replica cut off
-- from its primary (MASTERDOWN) or a server loading its data (LOADING):
-- clients call it at connect to know they reached a primary. allow-oom: a
-- full primary is still a primary.
redis.register_function{ function_name = "moonjob_writable", callback = function() return "OK" end,
  flags = { "allow-oom" } }
