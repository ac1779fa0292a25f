-- part: add.lua
-- moonjob_add: a job made, waiting or delayed, or the one holding its id
-- joined; its expiry and debounce; a named call's reply remembered, so that
-- the call sent again answers the same. add_job also makes a schedule's jobs.

do
local FIELD_MAX, REGISTRY, SECONDS_MAX, DELAY_MS_MAX = H.FIELD_MAX, H.REGISTRY, H.SECONDS_MAX, H.DELAY_MS_MAX
local ATTEMPTS_MAX, COUNT_MAX, NONCE_MAX, FINITE = H.ATTEMPTS_MAX, H.COUNT_MAX, H.NONCE_MAX, H.FINITE
local now_ms, job_key, refuse, job_fields = H.now_ms, H.job_key, H.refuse, H.job_fields
local delete_job, check_numbers, line_up, wait_member = H.delete_job, H.check_numbers, H.line_up, H.wait_member
local make_delayed, debounce_key, JOB_DEFAULTS = H.make_delayed, H.debounce_key, H.JOB_DEFAULTS

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
    local ok, spec = H.json_decode(args[6])
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
  for i = 19, 21 do
    if args[i] and #args[i] > NONCE_MAX then
      return refuse(fn, "SHEET, CALL and FORGET must take at most " .. NONCE_MAX .. " bytes each", "...")
    end
  end
  if (args[19] or "") ~= "" and (args[20] or "") == "" then
    return refuse(fn, "SHEET needs CALL (the call's name in it)", "")
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
-- EEXPIRED once past (it never runs, nor runs again by its own retries).
-- expire_ms keeps the span: a retry by hand counts it anew (operate.lua).
local function set_expire(key, args, now)
  local expire = tonumber(args[15] or "")
  if expire then redis.call("HSET", key, "expire_at", now + expire, "expire_ms", expire) end
end

-- <p>debounce:<id>: the id of the job a debounce id names while it is
-- delayed (kept DEBOUNCE_KEEP_MS past its delay, then it expires; deleted
-- with the job).
local DEBOUNCE_KEEP_MS = 60000

-- An add with DEBOUNCE_ID whose job is still delayed: that job takes this
-- add's data and options, and its delay starts again. -> add's reply, or
-- nil (no such job delayed: a new one is made, and the key names it).
local function debounce(p, args, now)
  local joined_id = redis.pcall("GET", debounce_key(p, args[16]))
  H.wrong_type(joined_id, "GET", debounce_key(p, args[16])) -- (any other error: the add's)
  if type(joined_id) ~= "string" then return nil end -- none, or a key of another type (SET replaces it)
  local key = job_key(p, joined_id)
  local f = job_fields(key, "state", "nonce", "debounce", "made")
  -- only the job it made, delayed and never run (not one waiting out a
  -- retry's backoff, nor another job that got its id after a data loss)
  if not (f and f[1] == "delayed" and f[3] == args[16] and (f[4] or "0") == "0") then return nil end
  local delay = tonumber(args[17])
  redis.call("HSET", key, "data", args[2], "priority", or_default(args[3], "0"), "attempts",
    or_default(args[5], "1"), "backoff", args[6], "timeout", or_default(args[7], "0"), "kill_after",
    or_default(args[8], "0"), "name", args[9], "cache", or_default(args[10], "0"))
  if args[12] == "1" then redis.call("HSET", key, "notify", "1") end
  redis.call("HDEL", key, "expire_at", "expire_ms", "group", "plain")
  set_expire(key, args, now)
  if (args[18] or "") ~= "" then redis.call("HSET", key, "group", args[18]) end
  make_delayed(p, joined_id, key, now + delay)
  redis.call("PEXPIRE", debounce_key(p, args[16]), delay + DEBOUNCE_KEEP_MS)
  return added(args, joined_id, "delayed", 1, f[2])
end

-- The options a job's hash holds only when not their default (JOB_DEFAULTS),
-- by their place in add's arguments.
local OPTION_FIELDS = { { 3, "priority" }, { 5, "attempts" }, { 6, "backoff" }, { 7, "timeout" },
  { 8, "kill_after" }, { 9, "name" }, { 10, "cache" }, { 12, "notify" } }

-- A number of counter <p>NAME: drawn one INCR at a time, or from the range a
-- bulk add took for its whole call (batch[name] = { next, last }; past it,
-- one INCR more: a drawn id an explicit one had taken).
local function draw(p, name, batch)
  local range = batch and batch[name]
  if not range or range[1] > range[2] then return redis.call("INCR", p .. name) end
  range[1] = range[1] + 1
  return range[1] - 1
end

-- A number no job holds as an id (an explicit id may have taken it): its
-- key is free. A bulk add's range of ids all found free (batch.ids.free)
-- needs no look at each; its numbers are written with digits_of.
local function free_id(p, batch)
  local range, digits = batch and batch.ids, batch and batch.id_digits or {}
  if range and range.free and range[1] <= range[2] then return H.digits_of(draw(p, "ids", batch), digits) end
  local id
  repeat id = H.digits_of(draw(p, "ids", batch), digits) until redis.call("EXISTS", job_key(p, id)) == 0
  return id
end

-- The queue in the registry moonjob.queues() reads, once per call; pcall:
-- the one key outside the queue's prefix, which an ACL user kept to its own
-- keys may not write.
local function register(p, batch)
  if batch and batch.registered then return end
  redis.pcall("SADD", REGISTRY, H.queue_name(p))
  if batch then batch.registered = true end
end

-- What an add's jobs share, worked out once per call (a bulk add's jobs
-- share their options): the time as text, and the fields of the options
-- that are not their default (with the expiry and the group).
local function shared(args, now)
  local fields = {}
  for _, o in ipairs(OPTION_FIELDS) do
    local v = args[o[1]]
    if v and v ~= "" and v ~= JOB_DEFAULTS[o[2]] then fields[#fields + 1] = o[2]; fields[#fields + 1] = v end
  end
  local expire = tonumber(args[15] or "")
  if expire then
    fields[#fields + 1] = "expire_at"; fields[#fields + 1] = now + expire
    fields[#fields + 1] = "expire_ms"; fields[#fields + 1] = expire
  end
  local group = args[18] or ""
  if group ~= "" then fields[#fields + 1] = "group"; fields[#fields + 1] = group end
  -- (no option but notify, no expiry nor group: fetch and complete read no
  -- more of it; base.lua)
  if #fields == 0 then fields = { "plain", "1" }
  elseif #fields == 2 and fields[1] == "notify" then fields[3], fields[4] = "plain", "n" end
  return { now = tostring(now), fields = fields, prio = or_default(args[3], "0"), group = group }
end

-- A new job's hash written, in one HSET, from add's checked arguments (id:
-- the job's), with extra's fields (its state's, the caller's). seq: its
-- step of <p>seq (drawn when nil), which with the time makes its
-- nonce when the add gave none; common: shared(args, now), when the caller
-- worked it out. -> its nonce, priority and group ("" none).
local function store_job(p, id, key, args, now, seq, extra, common)
  common = common or shared(args, now)
  local nonce = args[13] ~= "" and args[13]
  if not nonce then nonce = common.now .. "." .. (seq or tostring(redis.call("INCR", p .. "seq"))) end
  local hset = { "HSET", key, "id", id, "data", args[2], "created", common.now, "nonce", nonce }
  local fields = common.fields
  for i = 1, #fields do hset[#hset + 1] = fields[i] end
  for i = 1, extra and #extra or 0 do hset[#hset + 1] = extra[i] end
  redis.call(unpack(hset))
  return nonce, common.prio, common.group
end

-- A job with the id an add names, still there: joined when it waits,
-- is delayed or runs (or its flow's children run), or is completed and
-- cached, or finished and EXISTING is "join". -> add's reply, or nil.
local function joined(key, args, f, id, now)
  local state = f[1]
  if state == "waiting" or state == "delayed" or state == "active" or state == "waiting-children"
      or (state == "completed" and (tonumber(f[2]) or 0) > now)
      or ((state == "completed" or state == "failed") and args[14] == "join") then
    if args[12] == "1" and state ~= "completed" and state ~= "failed" then
      redis.call("HSET", key, "notify", "1")
      redis.call("HDEL", key, "plain") -- (an option written: see base.lua)
    end
    return added(args, id, state, 1, f[3])
  end
end

-- add(p; id, data, priority, delay_ms, attempts, backoff, timeout, kill_after,
--     name, cache, max_queue, notify [, nonce [, existing [, expire_ms
--     [, debounce_id, debounce_ms [, group [, sheet, call [, forget]]]]]]])
--     -> { id, state, joined [, nonce] }
-- id "" draws a number; id "\0dedupe" is "d:" .. the SHA-1 of data. A job with
-- that id waiting, delayed, running or waiting for its children (a flow's
-- parent) is joined (joined = 1); a completed one
-- whose cache has not ended is returned as it is, and with existing "join"
-- any finished one still kept; otherwise the id starts a new job. nonce (""
-- or absent: made here) is stored with the job; a call that passed one gets
-- the job's nonce back (its own, or the joined job's): get and cancel given it
-- answer only for this job, never for a later one with the same id (a data
-- loss restarts the id counter). expire_ms: a job not started by then fails
-- with EEXPIRED. debounce_id (id empty, delay_ms 0): while the job it last
-- made is delayed, an add replaces that job's data and options and restarts
-- its delay of debounce_ms (joined = 1); otherwise a new job is made,
-- delayed debounce_ms. group: the job's group (groups.lua; "" none).
-- sheet, call, forget: the call's name, remembered with its reply (add,
-- below).
-- add_job does it once the arguments are checked (a schedule's slots are
-- added through it too; batch: a bulk add's, add_bulk).
local function add_job(p, args, now, batch)
  local id = args[1]
  local debounce_id = args[16] or ""
  if debounce_id ~= "" then
    local reply = debounce(p, args, now)
    if reply then return reply end
  end
  local drawn, state = id == "", nil
  if drawn then id = free_id(p, batch)
  elseif id == "\0dedupe" then id = "d:" .. redis.sha1hex(args[2]) end
  local key = job_key(p, id)
  if not drawn then
    local f, why = job_fields(key, "state", "cache_until", "nonce")
    if not f then return redis.error_reply("EINPUT moonjob_add: " .. why .. "; delete it or choose another id") end
    local reply = joined(key, args, f, id, now)
    if reply then return reply end
    state = f[1]
  end
  local max_queue = tonumber(or_default(args[11], 0))
  if max_queue > 0 and redis.call("ZCARD", p .. "wait") + redis.call("ZCARD", p .. "delayed") >= max_queue then
    return redis.error_reply("EQUEUEFULL the queue holds max_queue (" .. max_queue .. ") waiting jobs")
  end
  if state then
    redis.call("ZREM", p .. "completed", id)
    redis.call("ZREM", p .. "failed", id)
  end
  if not drawn then delete_job(p, id, key) end -- a finished job, or a hash written around moonjob_add
  local delay = debounce_id ~= "" and tonumber(args[17]) or math.floor(tonumber(or_default(args[4], 0)))
  local common = batch and batch.common or shared(args, now)
  local member, seq = wait_member(draw(p, "seq", batch), id, batch and batch.seq_digits)
  local extra = delay > 0 and { "state", "delayed", "run_at", now + delay }
    or { "state", "waiting", "member", member } -- (run_at: created, read so by views.lua)
  if debounce_id ~= "" then extra[#extra + 1] = "debounce"; extra[#extra + 1] = debounce_id end
  local nonce, prio, group = store_job(p, id, key, args, now, seq, extra, common)
  register(p, batch)
  if debounce_id ~= "" then redis.call("SET", debounce_key(p, debounce_id), id, "PX", delay + DEBOUNCE_KEEP_MS) end
  if delay > 0 then
    redis.call("ZADD", p .. "delayed", now + delay, id)
    return added(args, id, "delayed", 0, nonce)
  end
  line_up(p, batch and batch.prio or H.number_in(prio, -math.huge, math.huge) or 0, member, group, now, batch)
  return added(args, id, "waiting", 0, nonce)
end

-- <p>added:<sheet>: a hash, a call's name -> the reply (msgpack) moonjob_add
-- gave it, for a producer that names its calls (SHEET and CALL): a call sent
-- again after its reply was lost (a stall past the producer's reply deadline,
-- a dropped link) gets that reply and adds nothing, and so does the first
-- send should it run after the second. The key lives ADDED_KEEP_MS from when
-- it was made (its field "" says it has its expiry: no PEXPIRE per add); a
-- producer names a new sheet each minute at least, and deletes a sheet whose
-- every reply it got at once (FORGET). <p>sheets: the sheets by when they
-- expire (ms), for obliterate; pruned as sheets are made, and expiring with
-- the last (redis.pcall: a key of another type there costs only that).
local ADDED_KEEP_MS = 600000

-- A named call's reply kept; sheet: its name when its key is new (the key
-- then gets its expiry and joins <p>sheets).
local function remember(p, key, call, reply, sheet, now)
  if not sheet then return redis.call("HSET", key, call, cmsgpack.pack(reply)) end
  redis.call("HSET", key, call, cmsgpack.pack(reply), "", "1")
  redis.call("PEXPIRE", key, ADDED_KEEP_MS)
  -- (the ended ones go 100 at a time, one step per new sheet: bounded
  -- after a burst of short-lived producers)
  local ended = redis.pcall("ZRANGEBYSCORE", p .. "sheets", "-inf", now, "LIMIT", 0, 100)
  if type(ended) == "table" and not ended.err and #ended > 0 then redis.pcall("ZREM", p .. "sheets", unpack(ended)) end
  redis.pcall("ZADD", p .. "sheets", now + ADDED_KEEP_MS, sheet)
  redis.pcall("PEXPIRE", p .. "sheets", ADDED_KEEP_MS)
end

-- A named call's reply: the one remembered when the call ran already,
-- else make()'s, remembered when ok(reply) (sheet, call, forget: the call's
-- name, as add's SHEET CALL FORGET; "" sheet: not named). fn names the
-- function in a refusal.
local function answer_once(p, sheet, call, forget, now, fn, make, ok)
  if sheet == "" then return make() end
  local key = p .. "added:" .. sheet
  local before = redis.pcall("HMGET", key, call, "")
  if H.wrong_type(before, "HMGET", key) then -- (any other error is the call's: raised, sent again)
    return redis.error_reply("EINPUT " .. fn .. ": " .. key .. " is not a hash; delete it or choose another SHEET")
  end
  local reply = before[1] and cmsgpack.unpack(before[1]) or make()
  if not before[1] and ok(reply) then remember(p, key, call, reply, not before[2] and sheet, now) end
  if forget ~= "" then
    redis.call("DEL", p .. "added:" .. forget)
    redis.pcall("ZREM", p .. "sheets", forget)
  end
  return reply
end

local function add(keys, args)
  local refused = check_add(args)
  if refused then return refused end
  local p, now = keys[1], now_ms()
  return answer_once(p, args[19] or "", args[20], args[21] or "", now, "moonjob_add",
    function() return add_job(p, args, now) end, function(reply) return reply.err == nil end)
end

-- obliterate's: every sheet of the queue.
H.check_add, H.or_default, H.add_job, H.store_job, H.register = check_add, or_default, add_job, store_job, register
H.draw, H.free_id, H.shared, H.answer_once = draw, free_id, shared, answer_once
F.add = add
end
