-- part: runs.lua
-- A run's calls, each from the worker whose token holds the job's lease:
-- renew, complete, fail, release, ratelimited, progress, log; and the
-- producer's calls on one job: cancel, get.

do
local DELAY_MS_MAX, LOG_KEEP_MAX, now_ms, job_key = H.DELAY_MS_MAX, H.LOG_KEEP_MAX, H.now_ms, H.job_key
local publish, err_json, number_in, refuse = H.publish, H.err_json, H.number_in, H.refuse
local job_fields, count_total, log_key, check_numbers = H.job_fields, H.count_total, H.log_key, H.check_numbers
local check_args, record_metrics, run_ms = H.check_args, H.record_metrics, H.run_ms
local make_waiting, make_delayed, finish = H.make_waiting, H.make_delayed, H.finish
local slot_freed = L.slot_freed

-- The job's fields when token holds its lease, else nil (a key of another
-- type holds nothing).
local function holds(key, token, ...)
  if token == "" or token == nil then return nil end
  local f = job_fields(key, "token", "state", ...)
  if f and f[1] == token and f[2] == "active" then return f end
  return nil
end

-- The channel of a running job's progress and log lines: <p>updates@<db>,
-- the database its worker said it fetched from (fetch's DB), since a
-- channel is shared by every database of the server and a queue's name may
-- be used in several; <p>updates when its worker said none.
local function updates_channel(p, db)
  if not db then return p .. "updates@0" end -- (fetch writes no db for database 0)
  if db ~= "" then return p .. "updates@" .. db end -- ("": fetched by a worker that passed none)
  return p .. "updates"
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

local NONE = {} -- (never written)

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
  local out, runs, done, now_text, moved = {}, {}, 0, tostring(now), {}
  for i = first, #args - step + 1, step do
    local id, token = args[i], args[i + 1]
    local key = job_key(p, id)
    -- (holds' read, inline: its calls cost Redis's Lua on every job; a key
    -- of another type goes through holds, which says so)
    local f = token ~= "" and redis.pcall("HMGET", key, "token", "state", "plain")
    if f and f.err then f = holds(key, token, "plain")
    elseif f and not (f[1] == token and f[2] == "active") then f = nil end
    if f then
      local ms = timed and number_in(args[i + 3], 0, 1e15) or nil
      local o = NONE
      if (f[3] == "1" or f[3] == "n") and ms then -- (base.lua's plain: finish's steps, all it needs)
        moved[#moved + 1] = id
        redis.call("HSET", key, "state", "completed", "result", args[i + 2], "finished", now_text,
          "began", ms == 0 and now_text or now - ms)
        if f[3] == "n" then H.announce(p .. "done", id) end
      else -- (its options; when it started, when its worker did not say how long it ran)
        o = redis.call("HMGET", key, "cache", "notify", "started", "group", "parent")
        -- totals and metrics counted once for the batch
        local fin = { o[1], o[2], o[3], o[4], o[5], batched = true, run_ms = ms, now_text = now_text, moved = moved }
        finish(p, id, key, "completed", "result", args[i + 2], now, fin)
      end
      out[#out + 1] = "OK"
      done = done + 1
      runs[#runs + 1] = ms or run_ms(o[3], now)
    else
      out[#out + 1] = "ESTALE"
    end
  end
  H.move_finished(p, moved, "completed", now_text)
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
  local refused = check_args("moonjob_fail", args, 3, "it takes ID TOKEN ERROR [RETRY_MS]",
    { { 4, "RETRY_MS must be -1 (no retry) or a number of ms up to 1e12", -1, DELAY_MS_MAX } })
  if refused then return refused end
  local key = job_key(p, id)
  local f = holds(key, token, "made", "attempts", "cancel", "cache", "notify", "started", "group", "parent")
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
  local fin = { f[6], f[7], f[8], f[9], f[10], ran = true, run_ms = number_in(args[5], 0, 1e15) }
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
-- for a job of a group, only its group holds back (groups.lua).
local function ratelimited(keys, args)
  local p, id, token, fn = keys[1], args[1], args[2], "moonjob_ratelimited"
  local refused = check_args(fn, args, 3, "it takes ID TOKEN RETRY_MS [ERROR]",
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
-- that holds it ("cancel <id>" on the channel, and the worker's next renew);
-- a parent waiting for its children fails at once, and they are canceled.
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
  elseif state == "waiting-children" then -- (flows.lua: its pending children are canceled too)
    H.cancel_parent(p, id, key, reason, now)
    return state
  else
    return state
  end
  finish(p, id, key, "failed", "error", err_json("ECANCELED", reason), now)
  return state
end

local GET_FIELDS = { "state", "result", "error", "made", "attempts", "name", "created", "started", "finished",
  "nonce" }

-- get(p; id [, nonce]) -> { state, result, error, made, attempts, name,
-- created, started, finished } or nil when no such job is kept (also when
-- nonce is given and is not the job's). A key of another type reads as the
-- failed job (EINPUT) the next fetch makes of it.
local function get(keys, args)
  if not args[1] then return refuse("moonjob_get", "it takes ID [NONCE]", "") end
  local f, why = job_fields(job_key(keys[1], args[1]), unpack(GET_FIELDS))
  if not f then return { "failed", false, err_json("EINPUT", why), "0", "1", "" } end
  if not f[1] or not nonce_fits(f[10], args[2]) then return nil end
  f[10] = nil
  H.defaulted(f, GET_FIELDS)
  return f
end

-- progress(p; id, token, json) -> "OK" | "ESTALE": a running job's progress
-- (the last one wins), published on its updates_channel as
-- {"id":..,"progress":..}.
local function progress(keys, args)
  local p, id, token = keys[1], args[1], args[2]
  if #args < 3 then return refuse("moonjob_progress", "it takes ID TOKEN PROGRESS; arguments given", #args) end
  if not H.json_decode(args[3]) then
    return refuse("moonjob_progress", "PROGRESS must be JSON text", args[3])
  end
  local key = job_key(p, id)
  local f = holds(key, token, "db")
  if not f then return "ESTALE" end
  redis.call("HSET", key, "progress", args[3])
  H.announce(updates_channel(p, f[3]), '{"id":' .. cjson.encode(id) .. ',"progress":' .. args[3] .. "}")
  return "OK"
end

-- log(p; id, token, keep, line...) -> "OK" | "ESTALE": lines appended to a
-- running job's log, of which the last keep are kept; each published on
-- its updates_channel as {"id":..,"log":"<line>"}.
local function log(keys, args)
  local p, id, token, fn = keys[1], args[1], args[2], "moonjob_log"
  local refused = check_args(fn, args, 4, "it takes ID TOKEN KEEP LINE...",
    { { 3, "KEEP must be a whole number from 1 to " .. LOG_KEEP_MAX, 1, LOG_KEEP_MAX, true } })
  if refused then return refused end
  local f = holds(job_key(p, id), token, "db")
  if not f then return "ESTALE" end
  local lk, channel = log_key(p, id), updates_channel(p, f[3])
  for i = 4, #args do
    redis.call("RPUSH", lk, args[i])
    H.announce(channel, '{"id":' .. cjson.encode(id) .. ',"log":' .. cjson.encode(args[i]) .. "}")
  end
  redis.call("LTRIM", lk, -tonumber(args[3]), -1)
  return "OK"
end

F.renew, F.complete, F.fail, F.release, F.ratelimited = renew, complete, fail, release, ratelimited
F.cancel, F.get, F.progress, F.log = cancel, get, progress, log
end
