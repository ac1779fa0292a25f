-- part: base.lua
-- moonjob's queue, as a library of Redis Functions (Redis 7). This library
-- runs inside Redis, not in moonjob: workers and producers load it (FUNCTION
-- LOAD REPLACE) when they connect and the server's copy is not this text and
-- not a newer version, or when a call meets "Function not found"
-- (moonjob.redis.setup; an ACL user that may not load it uses an admin's
-- copy at this version), and every change of a queue's state is one FCALL,
-- so it is atomic. docs/REDIS.md is the contract for other languages. Bump
-- VERSION (register.lua) with any change of the library, and OLDEST_CLIENT
-- with any change an older moonjob's calls would be misread by.
--
-- One library, assembled from the parts in this folder in a fixed order
-- (moonjob.redis.library: this part first, register.lua last). Each part is
-- one do ... end block, unindented: its locals end with it, since Redis
-- refuses a main chunk of more than 200 locals. What another part uses goes
-- on the tables below, and a part takes it into locals of its own at its top.
-- Each part opens with a "-- part: NAME.lua" line: a Redis error's line
-- (user_function:1234) counts in the assembled text, and `moonjob library
-- --line 1234` names the part and the line in it.
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
--   <p>debounce:<id>  string: the job a debounce id names while it is delayed
--   <p>cached      sorted set: completed jobs trimmed but kept for their
--                  cache (their hash expires then), by when (ms)
--   <p>added:<sheet>, <p>sheets  the replies of a producer's named adds (add.lua)
--   <p>schedules, <p>s:<id>  the schedules (schedules.lua)
--   <p>parents, <p>deps:<id>, <p>kids:<id>  the flows (flows.lua)
--   <p>groups, <p>gparked, <p>gw:<group>, <p>ga:<group>, <p>gs:<group>,
--   <p>gl:<group>, <p>ungrouped, <p>turn, <p>gswitch, <p>gunpark, <p>gkeys
--                  the groups (groups.lua)
-- Job fields: data (JSON text), priority, attempts (allowed), made (attempts
-- started), backoff (JSON text or ""), timeout, kill_after, name, cache (s),
-- state (waiting, delayed, active, completed, failed, waiting-children), token (of the run
-- holding the lease; kept when the job ends, which the state says, and
-- emptied when it waits again), worker, result (JSON text), error (JSON
-- text), cancel (the reason, once asked while active), created, started,
-- finished, run_at (ms; absent on a job an add made waiting: created), db
-- (its worker's database; absent: 0), member (its wait member), notify
-- ("1": publish its id on <p>done), plain (below),
-- cache_until (ms), nonce (tells this job from a later one with its id),
-- progress (JSON text, the last reported), expire_at (ms: not started by
-- then, it fails with EEXPIRED), expire_ms (the span expire_at was counted
-- with: a retry by hand counts it anew), group (its group, absent for none),
-- parent, pslot (a flow's child: its parent's job key, its entry there),
-- kids (a flow's parent: how many children it was added with), deadline.
--
-- A job's options (priority, attempts, backoff, timeout, kill_after, name,
-- cache, notify) and made are written only when not their default (each
-- field written costs Redis, and most jobs take the defaults): readers take
-- an absent one as JOB_DEFAULTS says (H.defaulted). A job made with all of
-- them at their default, and no expiry, group, parent or children, has
-- plain = "1" ("n": the same but notify "1"): fetch and complete then read
-- none of them (each field asked costs Redis, present or not). Whatever writes one of them on a job later
-- deletes plain (HDEL); a hash without it is read in full.
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
-- Only WRONGTYPE says a key is of another type: any other error of a read
-- (an ACL's denial) is the call's, raised before that job's first write.

local H = {} -- helpers and bounds: base.lua, metrics, states, cron, add
local G = {} -- the groups' functions: fairness and limits per group (groups.lua, G.take: fetch.lua)
local S = {} -- the schedules' (schedules.lua), which fetch fires
local L = {} -- the limits' (limits.lua), which fetch applies
local F = {} -- the functions Redis calls, by their names less "moonjob_"

do
-- A job's id, name and backoff are small: a fetch reply's bound counts on it.
local FIELD_MAX = 1024
local REGISTRY = "mj:queues"   -- the names of the queues (moonjob.queues); see add
local SECONDS_MAX = 1e9        -- timeout, kill_after, cache: the pool's own bound
local DELAY_MS_MAX = 1e12      -- SECONDS_MAX in ms
local ATTEMPTS_MAX = 2 ^ 31
local COUNT_MAX = 2 ^ 53
local NONCE_MAX = 128
local LOG_KEEP_MAX = 10000     -- a job's log lines kept, at most
local FINITE = 1.7976931348623157e308 -- the largest double: inf and NaN are beyond it

-- The value of each job field the hash holds only when it is not this.
local JOB_DEFAULTS = { priority = "0", attempts = "1", backoff = "", timeout = "0", kill_after = "0", name = "",
  cache = "0", notify = "0", made = "0" }

-- f, the fields names read of an existing job (HMGET), with an absent one
-- of JOB_DEFAULTS as its default.
local function defaulted(f, names)
  for i, name in ipairs(names) do
    if f[i] == nil or f[i] == false then f[i] = JOB_DEFAULTS[name] or f[i] end
  end
  return f
end

local function now_ms()
  local t = redis.call("TIME")
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function job_key(p, id) return p .. "j:" .. id end

-- Whole numbers as text without a format each: Redis's Lua writes a number
-- with sprintf, about 0.25 us, and a fetch or a bulk add writes several per
-- job. Numbers in a row share their thousands, written once (digits: a
-- table kept by the caller); the last three digits come from a table made
-- at load (with the .. operator: no library is in reach then).
local LAST3, SMALL = {}, {}
for x = 0, 999 do
  SMALL[x] = "" .. x
  LAST3[x] = (x < 10 and "00" or x < 100 and "0" or "") .. x
end

-- n (a whole number from 0 to 1e14) as text; digits: {} kept between
-- calls for numbers in a row.
local function digits_of(n, digits)
  if n >= 1e14 then return tostring(n) end -- (as it always was written there)
  local t = math.floor(n / 1000)
  local r = n - t * 1000
  if t == 0 then return SMALL[r] end
  if digits.t ~= t then digits.t, digits.text = t, tostring(t) end
  return digits.text .. LAST3[r]
end

-- A message on one of a queue's channels (the name holds the queue's hash
-- tag): on one server PUBLISH, heard by SUBSCRIBE (every moonjob version);
-- on a cluster node SPUBLISH, heard by SSUBSCRIBE on the shard of the
-- channel's slot alone (PUBLISH would go to every node over the cluster
-- bus; moonjob before this library did not run on a cluster). H.cluster:
-- whether this server is a cluster node, kept for the load once an answer
-- says it (a server cannot change it without a restart): an id, or
-- "cluster support disabled". Any other answer (an ACL that denies the
-- caller CLUSTER MYID) says nothing: the next call asks again, and this
-- message goes both ways (SPUBLISH protected: one server's ACL may deny it).
local function announce(channel, message)
  if H.cluster == "unknown" then
    local id = redis.pcall("CLUSTER", "MYID")
    if type(id) == "string" then
      H.cluster = true
    elseif type(id) == "table" and string.find(tostring(id.err), "cluster support disabled", 1, true) then
      H.cluster = false
    else
      redis.call("PUBLISH", channel, message)
      return redis.pcall("SPUBLISH", channel, message)
    end
  end
  redis.call(H.cluster and "SPUBLISH" or "PUBLISH", channel, message)
end

local function publish(p, message)
  announce(p .. "events", message)
end

local function err_json(code, message) -- (keys in sorted order, as moonjob.codec.json writes them)
  return '{"code":' .. cjson.encode(code) .. ',"message":' .. cjson.encode(message) .. "}"
end

-- JSON text decoded: true, the value; or false. A NUL byte is refused
-- (Redis's cjson stops reading at one: "1\0junk" would pass as 1).
local function json_decode(text)
  if type(text) ~= "string" or text:find("\0", 1, true) then return false end
  return pcall(cjson.decode, text)
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

-- r, what a redis.pcall answered -> true when it is WRONGTYPE (a key of
-- another type, written by another client: the caller's case). Any other
-- error (an ACL that denies the command, ...) says nothing of the key: it is
-- the call's, raised with what (the command and its key) added.
local function wrong_type(r, command, key)
  if type(r) ~= "table" or not r.err then return false end
  if string.find(r.err, "^WRONGTYPE") then return true end
  error({ err = r.err .. " (" .. command .. " " .. key .. ")" })
end

-- A job's fields, or nil and why: redis.pcall, since HMGET on a key of
-- another type raises (and a raise would stop the call half done). Any
-- other error raises (wrong_type): callers read before they write.
local function job_fields(key, ...)
  local f = redis.pcall("HMGET", key, ...)
  if wrong_type(f, "HMGET", key) then
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

-- A job's log lines (job:log() and its output on a worker): a list.
local function log_key(p, id) return p .. "log:" .. id end

-- <p>debounce:<id>: the job a debounce id names (add.lua).
local function debounce_key(p, debounce_id) return p .. "debounce:" .. debounce_id end

-- A job and its log, deleted, and the debounce key that names it (it
-- would name no job, and outlive an obliterate). A job of a flow tells its
-- flow first (flows.lua): a child its parent still counts counts as
-- canceled there; a parent's pending children are canceled, its own keys go.
local function delete_job(p, id, key)
  local d = redis.pcall("HMGET", key, "debounce", "parent", "kids")
  if type(d) ~= "table" or d.err then d = {} end
  if d[1] and d[1] ~= "" and redis.pcall("GET", debounce_key(p, d[1])) == id then
    redis.call("DEL", debounce_key(p, d[1]))
  end
  if d[2] or d[3] then H.flow_gone(p, id, key, d[2], d[3]) end
  redis.call("DEL", key, log_key(p, id))
end

-- A queue's name from its prefix (moonjob.redis.names.prefix's inverse):
-- "mj:{images}:" -> "images", "mj:{shop}/images:" -> "{shop}/images".
local function queue_name(p)
  if string.sub(p, -2) == "}:" then return string.sub(p, 5, -3) end
  return string.sub(p, 4, -2)
end

-- member noted in the sorted set <p><set> until until_ms (a later time
-- there stays): keys that outlive their job or group and expire by
-- themselves, listed for obliterate; two whose time passed go each time,
-- so the list holds about the live ones. A key of another type (another
-- client's) is replaced: a note must not stop a call half done.
local function note(p, set, member, until_ms, now)
  local r = redis.pcall("ZADD", p .. set, "GT", until_ms, member)
  if type(r) == "table" and r.err then
    redis.call("DEL", p .. set)
    redis.call("ZADD", p .. set, until_ms, member)
  end
  local old = redis.call("ZRANGEBYSCORE", p .. set, "-inf", now, "LIMIT", 0, 2)
  if #old > 0 then redis.call("ZREM", p .. set, unpack(old)) end
end

-- The sorted set of each state's jobs, and the id in one of its members.
local SETS = { waiting = "wait", delayed = "delayed", active = "active", completed = "completed",
  failed = "failed", ["waiting-children"] = "parents" }

local function member_id(set, member) -- (wait's members are "<arrival>:<id>")
  if set == "wait" then return string.sub(member, 18) end
  return member
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

-- A call's first checks: at least `least` arguments (else the refusal says
-- usage and the count given), then its numbers (check_numbers), if any.
local function check_args(fn, args, least, usage, numbers)
  if #args < least then return refuse(fn, usage .. "; arguments given", #args) end
  if numbers then return check_numbers(fn, args, numbers) end
end

H.FIELD_MAX, H.REGISTRY, H.SECONDS_MAX, H.DELAY_MS_MAX = FIELD_MAX, REGISTRY, SECONDS_MAX, DELAY_MS_MAX
H.ATTEMPTS_MAX, H.COUNT_MAX, H.NONCE_MAX, H.FINITE = ATTEMPTS_MAX, COUNT_MAX, NONCE_MAX, FINITE
H.LOG_KEEP_MAX = LOG_KEEP_MAX
H.now_ms, H.job_key, H.publish, H.err_json, H.number_in = now_ms, job_key, publish, err_json, number_in
H.digits_of = digits_of
H.json_decode = json_decode
H.refuse, H.job_fields, H.count_total, H.count_missing = refuse, job_fields, count_total, count_missing
H.log_key, H.delete_job, H.check_numbers, H.check_args = log_key, delete_job, check_numbers, check_args
H.SETS, H.member_id, H.wrong_type = SETS, member_id, wrong_type
H.debounce_key, H.note, H.queue_name = debounce_key, note, queue_name
H.announce, H.cluster = announce, "unknown"
H.JOB_DEFAULTS, H.defaulted = JOB_DEFAULTS, defaulted

-- The keys of a queue that are not jobs, nor their sets: what a worker
-- (workers, wdrop), an operator (paused, limits) or an add makes. Obliterate
-- deletes them last; a queue with one of them exists (views.lua), but for
-- the heartbeats' two. tokens is not one: it outlives an obliterate
-- (operate.lua).
H.QUEUE_KEYS = { "seq", "ids", "totals", "paused", "m:all", "limits", "limited", "starts", "groups", "gparked",
  "ungrouped", "turn", "gswitch", "gunpark", "gkeys", "cached", "sheets", "workers", "wdrop" }
end
