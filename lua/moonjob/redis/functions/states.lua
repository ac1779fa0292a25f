-- part: states.lua
-- The moves between a job's states that every path shares: made waiting
-- (in line, and in its group's index) or delayed; finished, completed or
-- failed (totals, metrics, its cache, notify); failed in place when it
-- cannot run. And fetch's housekeeping before it takes jobs: expired
-- leases recovered, due delayed jobs promoted, finished jobs trimmed.

do
local SECONDS_MAX, job_key, publish, err_json = H.SECONDS_MAX, H.job_key, H.publish, H.err_json
local number_in, job_fields, count_total = H.number_in, H.job_fields, H.count_total
local count_missing, log_key, delete_job, note = H.count_missing, H.log_key, H.delete_job, H.note
local record_metrics, run_ms = H.record_metrics, H.run_ms

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
    local key = job_key(p, id)
    local f = job_fields(key, "cache_until") -- (read first: an error of the read leaves the entry)
    redis.call("ZREM", p .. set, id)
    local cache_until = f and tonumber(f[1]) or 0
    if cache_until > now then
      redis.call("PEXPIREAT", key, cache_until)
      redis.call("PEXPIREAT", log_key(p, id), cache_until)
      redis.call("PEXPIREAT", p .. "kids:" .. id, cache_until) -- (a flow's parent's children)
      note(p, "cached", id, cache_until, now) -- (for obliterate)
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

-- A job in line: its entry in wait (member, score prio) and in its
-- group's index (group: "" none). "added" is said on the queue's channel
-- when the line was empty; batch (a bulk add's): said once per call, and
-- the groups' switch read once (a bulk add's jobs share their group).
local function line_up(p, prio, member, group, now, batch)
  if not (batch and batch.said) then
    if redis.call("ZCARD", p .. "wait") == 0 then publish(p, "added") end
    if batch then batch.said = true end
  end
  if batch and group == "" then
    if batch.grouped == nil then batch.grouped = G.on(p) end
    if not batch.grouped and batch.waiting then -- (in wait with the batch's others: enter_wait)
      batch.waiting[#batch.waiting + 1] = batch.prio_text or prio -- (text: a number costs a format)
      batch.waiting[#batch.waiting + 1] = member
      return
    end
    if not batch.grouped then return redis.call("ZADD", p .. "wait", prio, member) end
  end
  G.index(p, group, prio, member, now) -- (before wait: the switch to groups copies wait)
  redis.call("ZADD", p .. "wait", prio, member)
end

-- The entries line_up left in batch.waiting (score, member, ...) put in
-- wait at once, in ZADDs of at most 1,000 (unpack's bound is about 8,000).
local function enter_wait(p, batch)
  local waiting = batch.waiting or {}
  for first = 1, #waiting, 2000 do
    redis.call("ZADD", p .. "wait", unpack(waiting, first, math.min(#waiting, first + 1999)))
  end
  batch.waiting = nil
end

-- Zeros that pad a number of n digits to 16 (a literal: the string
-- library is out of reach while a library loads).
local PAD = { "000000000000000", "00000000000000", "0000000000000", "000000000000", "00000000000",
  "0000000000", "000000000", "00000000", "0000000", "000000", "00000", "0000",
  "000", "00", "0", "" }

-- A job's place in line: its arrival number (one step of <p>seq), 16
-- digits, and id; -> it, and the number's digits. (Padded by hand below
-- 10^14, where digits_of writes every digit: string.format costs Redis's
-- Lua several times more, on every add.) digits: digits_of's, for numbers
-- in a row.
local function wait_member(seq, id, digits)
  if seq < 1e14 then
    local text = H.digits_of(seq, digits or {})
    return PAD[#text] .. text .. ":" .. id, text
  end
  local text = string.format("%d", seq)
  return string.format("%016d", seq) .. ":" .. id, text
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
    member = wait_member(redis.call("INCR", p .. "seq"), id)
  end
  redis.call("HSET", key, "state", "waiting", "member", member, "run_at", now)
  line_up(p, prio, member, group or "", now)
end

local function make_delayed(p, id, key, run_at)
  redis.call("HSET", key, "state", "delayed", "run_at", run_at)
  redis.call("ZADD", p .. "delayed", run_at, id)
end

-- f: the job's cache, notify, started, group and parent fields when the
-- caller read them already; f.batched: the caller records metrics and totals
-- for the batch; f.run_ms: the run time its worker measured (then it began
-- run_ms ago); f.now_text: now as text; f.moved: a list the job's id goes
-- in, for its caller to move from active to its state's set with the
-- batch's others (H.move_finished: fewer calls), unless it has a group
-- (G.left reads active). A flow's child tells its parent, in this call (flows.lua).
-- (moonjob_complete takes these steps itself for a plain job: runs.lua;
-- a step added here that such a job needs goes there too)
local function finish(p, id, key, state, field, value, now, f)
  f = f or redis.call("HMGET", key, "cache", "notify", "started", "group", "parent")
  local cache = state == "completed" and number_in(f[1], 0, SECONDS_MAX) or 0
  local moved = f.moved
  if moved and not f[4] then
    moved[#moved + 1] = id -- (its caller moves it from active to state with the batch's others)
  else
    redis.call("ZREM", p .. "active", id)
  end
  G.left(p, f[4], id)
  local at = f.now_text or now -- (a batch's time as text once: Redis's Lua formats a number slowly)
  local fields = { "HSET", key, "state", state, field, value, "finished", at } -- (its token kept: base.lua)
  if cache > 0 then
    fields[#fields + 1] = "cache_until"; fields[#fields + 1] = now + math.floor(cache * 1000)
  end
  if f.run_ms then fields[#fields + 1] = "began"; fields[#fields + 1] = now - f.run_ms end
  redis.call(unpack(fields))
  if not (moved and not f[4]) then redis.call("ZADD", p .. state, at, id) end
  if not f.batched then
    count_total(p, state, 1)
    local ms = f.ran and (f.run_ms or run_ms(f[3], now))
    record_metrics(p, now, state == "completed" and 1 or 0, state == "failed" and 1 or 0, { ms })
  end
  if f[2] == "1" then H.announce(p .. "done", id) end
  if f[5] then H.child_ended(key, f[5], state, value, now) end
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
      or state == "failed" or state == "waiting-children" then
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
    local key = job_key(p, id)
    -- read first: a read that raises (an error of the call, not WRONGTYPE)
    -- must leave the entry in place, as Redis undoes no write before it
    local kind, f = look_at(p, id, key, "delayed", now, "priority", "group")
    redis.call("ZREM", p .. "delayed", id)
    if kind == "ok" then
      make_waiting(p, id, key, now, f[2], nil, f[3])
    elseif kind == "missing" then
      missing = missing + 1
    end
  end
  count_missing(p, missing)
end

-- The jobs finish left in f.moved moved at once from active to the set of
-- state, with the score at (now as text), in calls of at most 1,000 jobs
-- (unpack's bound is about 8,000 values).
local function move_finished(p, moved, state, at)
  for first = 1, #moved, 1000 do
    local last = math.min(#moved, first + 999)
    redis.call("ZREM", p .. "active", unpack(moved, first, last))
    local scored = {}
    for i = first, last do scored[#scored + 1] = at; scored[#scored + 1] = moved[i] end
    redis.call("ZADD", p .. state, unpack(scored))
  end
end

H.retain, H.make_waiting, H.make_delayed, H.finish = retain, make_waiting, make_delayed, finish
H.move_finished = move_finished
H.line_up, H.wait_member, H.enter_wait = line_up, wait_member, enter_wait
H.fail_entry, H.look_at, H.recover_stalled = fail_entry, look_at, recover_stalled
H.promote_delayed = promote_delayed
end
