-- part: fetch.lua
-- moonjob_fetch, the queue's clock: before it hands out jobs it recovers
-- stalled ones, fires due schedules, promotes due delayed jobs, unparks
-- groups and trims finished jobs; then it takes waiting jobs (in turn
-- between groups), under the queue's limits and its groups'.

do
local FIELD_MAX, SECONDS_MAX, DELAY_MS_MAX = H.FIELD_MAX, H.SECONDS_MAX, H.DELAY_MS_MAX
local ATTEMPTS_MAX, COUNT_MAX, FINITE, now_ms = H.ATTEMPTS_MAX, H.COUNT_MAX, H.FINITE, H.now_ms
local job_key, number_in, refuse, count_missing = H.job_key, H.number_in, H.refuse, H.count_missing
local check_numbers, retain, fail_entry, look_at = H.check_numbers, H.retain, H.fail_entry, H.look_at
local recover_stalled, promote_delayed = H.recover_stalled, H.promote_delayed
local fire_schedules, next_schedule = S.fire_schedules, S.next_schedule
local read_limits, rate_room, allowance = L.read_limits, L.rate_room, L.allowance
local count_starts, bound_ahead, wrong_type = L.count_starts, L.bound_ahead, H.wrong_type
local defaulted, PLAIN = H.defaulted, H.JOB_DEFAULTS -- (a plain job's options: base.lua)

local FETCH_NUMBERS = {
  { 2, "N must be a whole number from 0 to 2^31", 0, ATTEMPTS_MAX, true },
  { 3, "LEASE_MS must be a number of ms from 1 to 1e12", 1, DELAY_MS_MAX },
  { 4, "KEEP_COUNT must be a whole number from 0 to 2^53", 0, COUNT_MAX, true },
  { 5, "KEEP_AGE_MS must be a number of ms from 0 to 1e15", 0, 1e15 },
  { 6, "MAX_PAYLOAD must be a whole number of bytes from 0 (no bound) to 2^53", 0, COUNT_MAX, true },
  { 7, "KEEP_FAILED_AGE_MS must be a number of ms from 0 to 1e15", 0, 1e15 },
  { 8, "FREE must be a whole number from 0 to 2^31", 0, ATTEMPTS_MAX, true },
  { 9, "DB must be the worker's database, a whole number from 0 to 2^31", 0, ATTEMPTS_MAX, true },
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

-- take_one's fields of a job (state first), to default (H.defaulted).
local TAKE_FIELDS = { "state", "data", "attempts", "backoff", "timeout", "kill_after", "name", "made", "priority" }

-- Job id's entry in active: in w.leased for take to add with the fetch's
-- others (one ZADD), or now (G.take: G.room reads them).
local function add_lease(p, w, id)
  local leased = w.leased
  if leased then
    leased[#leased + 1] = w.until_ms
    leased[#leased + 1] = id
  else
    redis.call("ZADD", p .. "active", w.until_ms, id)
  end
end

-- A job's first run begun: its fields written (none of a run to reset; no
-- db for database 0: runs.lua's updates_channel). -> redis.pcall's answer.
local function start_first_run(key, w, token)
  if w.db_text == "0" then
    return redis.pcall("HSET", key, "state", "active", "token", token, "worker", w.id, "started", w.now, "made", "1")
  end
  return redis.pcall("HSET", key, "state", "active", "token", token, "worker", w.id, "started", w.now, "made", "1",
    "db", w.db_text)
end

-- A waiting entry popped by fetch: its reply row (handed out to worker w
-- { id, lease, max_payload, db } with token number token_no; its entry in
-- active added, or left in w.leased for the caller to add), or nil and
-- "failed" (failed in place: out of range, over max_payload, expired;
-- never sent) or what look_at said. The job keeps w.db (its channel of
-- updates: runs.lua).
local function take_one(p, id, w, token_no, now, s)
  local key = job_key(p, id)
  if not (s and s[1] == "waiting") then -- (s: its fields state, data, made, plain when the caller read them)
    local kind
    kind, s = look_at(p, id, key, "waiting", now, "data", "made", "plain")
    if kind ~= "ok" then return nil, kind end
  end
  -- (its options written: read them; the layout of TAKE_FIELDS)
  local o = (s[4] == "1" or s[4] == "n") and {} or redis.call("HMGET", key, "attempts", "backoff", "timeout", "kill_after", "name",
    "priority", "expire_at", "kids")
  local f = { s[1], s[2], o[1], o[2], o[3], o[4], o[5], s[3], o[6], o[7], o[8] }
  local first = not f[8] -- never fetched, released or retried: no field of a run to reset
  defaulted(f, TAKE_FIELDS)
  local made = (tonumber(f[8]) or 0) + 1
  local expired = tonumber(f[10] or "")
  if expired and now > expired then
    fail_entry(p, id, key, now, ("the job expired %.0f ms ago, before a worker took it (its expire option)")
      :format(now - expired), false, "EEXPIRED")
    return nil, "failed"
  end
  local why, code = unfit(id, f), nil
  local children, bytes = nil, #(f[2] or "")
  if f[11] and not why then -- a flow's parent: its children's ends come with it (flows.lua)
    children = H.children_rows(p, id)
    for _, text in ipairs(children) do bytes = bytes + #text + 8 end -- (+ RESP's framing, about)
  end
  if not why and w.max_payload > 0 and bytes > w.max_payload then
    why = children and ("the job's data and its children's ends (results, errors, ids) take %d bytes, more than the"
      .. " worker's max_payload (%d)"):format(bytes, w.max_payload)
      or ("the job data is %d bytes, more than the worker's max_payload (%d)"):format(bytes, w.max_payload)
    code = "EPAYLOAD"
  end
  if why then
    redis.call("HSET", key, "made", made)
    fail_entry(p, id, key, now, why, false, code)
    return nil, "failed"
  end
  -- (every job passes here: the fetch's times are text already, and the
  -- first run's HSET writes no field of a run before it)
  local token = w.token .. H.digits_of(token_no, w.digits)
  if first then
    local r = start_first_run(key, w, token)
    if type(r) == "table" and r.err then error(r) end
  else
    redis.call("HSET", key, "state", "active", "token", token, "worker", w.id, "started", w.now,
      "ran", "0", "made", made, "began", "", "db", w.db_text)
  end
  add_lease(p, w, id)
  if children then return { id, token, f[2], made, f[3], f[4], f[5], f[6], f[7], "", "", children } end
  return { id, token, f[2], made, f[3], f[4], f[5], f[6], f[7] }
end

-- take_one's steps for the usual job (base.lua's plain, waiting, never
-- run, its id in bounds, its data within the worker's max_payload), on its
-- fields s (state, data, made, plain): the same writes, fewer steps. -> its row, or nil for take_one to take it.
-- Its HSET is protected as take_one's is: an error of it leaves the job
-- unwritten (the caller puts its entry back).
local function take_plain(p, id, key, w, token_no, s)
  if not ((s[4] == "1" or s[4] == "n") and s[1] == "waiting" and not s[3] and s[2]) or #id > FIELD_MAX
      or (w.max_payload > 0 and #s[2] > w.max_payload) then
    return nil
  end
  local token = w.token .. H.digits_of(token_no, w.digits)
  local r = start_first_run(key, w, token)
  if type(r) == "table" and r.err then return false, r end
  local leased = w.leased
  leased[#leased + 1] = w.until_ms
  leased[#leased + 1] = id
  return { id, token, s[2], 1, PLAIN.attempts, PLAIN.backoff, PLAIN.timeout, PLAIN.kill_after, PLAIN.name }
end

-- Entries failed in place do not count against n: a fetch pops up to
-- POP_BUDGET more, so a backlog of expired jobs is cleared in a few calls.
local POP_BUDGET = 1000

-- take_one, protected: a raise (an error of a read that is not the key's,
-- wrong_type) comes back as nil, false, the error, its entry not yet
-- written (take_one reads before it writes).
local function try_take(...)
  local ok, row, kind = pcall(take_one, ...)
  if ok then return row, kind end
  return nil, false, row
end

-- An entry popped for a job that take_one could not read goes back in
-- line, where it was (group g, if given: in its group's index too). The
-- error is the fetch's when it hands out no job; else the jobs taken come
-- back and the next fetch meets the error first.
local function put_back(p, member, score, e, rows, now, g)
  if g then G.index(p, g, score, member, now) end -- (before wait: indexing may switch into group mode, copying wait)
  redis.call("ZADD", p .. "wait", score, member)
  if #rows == 0 then error(e) end
end

-- The reply row's start bound (its 11th element; its 10th, its group, ""
-- for none): the least of the queue rate's (bound: nil without one) and,
-- for a job of a group, the group rate's. None when no rate applies.
local function bind_start(row, bound, g, glim)
  if g and g ~= "" and glim and glim.rate_max then bound = math.min(bound or glim.start_ms, glim.start_ms) end
  if bound then row[10], row[11] = row[10] or "", bound end
end

-- take in group mode: each job from the group whose turn it is (G.pick),
-- under the groups' limits glim. A job of a group comes with its group
-- (its row's 10th element). -> rows, tokens, missing.
function G.take(p, w, n, now, glim, bound)
  local rows, tokens, missing, budget = {}, {}, 0, n + POP_BUDGET
  local cur = G.cursor(p) -- (the switch into group mode, if it goes on: G.copy)
  while #rows < n and budget > 0 do
    local g, member, dropped, score = G.pick(p, now, glim, cur)
    if not (g or dropped) then break end
    budget = budget - 1
    if g and redis.call("ZREM", p .. "wait", member) == 1 then -- (else: an entry whose job no longer waits)
      local token_no = redis.call("INCR", p .. "tokens")
      local row, kind, e = try_take(p, string.sub(member, 18), w, token_no, now)
      if e then
        put_back(p, member, score, e, rows, now, g)
        break
      elseif row then
        if g ~= "" then row[10] = g end
        bind_start(row, bound, g, glim)
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

-- The entries in active of the jobs take handed out (w.leased: score,
-- id, ...), in ZADDs of at most 1,000 (unpack's bound is about 8,000).
local function add_leased(p, w)
  local leased = w.leased
  for first = 1, #leased, 2000 do
    redis.call("ZADD", p .. "active", unpack(leased, first, math.min(#leased, first + 1999)))
  end
  w.leased = nil
end

-- Up to n waiting jobs handed out to worker w (grouped: G.on; bound: the
-- queue rate's start bound, nil without a rate). -> their reply rows,
-- tokens. Tokens: one counter step per pop, one number per job (never
-- reused).
local function take(p, w, n, now, glim, grouped, bound)
  if n > 0 and grouped then
    local rows, tokens, missing = G.take(p, w, n, now, glim, bound)
    count_missing(p, missing)
    return rows, tokens
  end
  local rows, tokens, missing = {}, {}, 0
  local budget = n + POP_BUDGET
  w.leased = {} -- their entries in active, added at once below (G.take adds each as it goes: G.room reads them)
  while #rows < n and budget > 0 do
    local popped = redis.call("ZPOPMIN", p .. "wait", math.min(n - #rows, budget))
    if #popped == 0 then break end
    budget = budget - #popped / 2
    local token_no = redis.call("INCRBY", p .. "tokens", #popped / 2) - #popped / 2
    for i = 1, #popped, 2 do
      local id = string.sub(popped[i], 18)
      local key = job_key(p, id)
      local s = redis.pcall("HMGET", key, "state", "data", "made", "plain")
      local row, kind, e = take_plain(p, id, key, w, token_no + 1, s)
      if row == false then e = kind; row, kind = nil, nil
      elseif not row then row, kind, e = try_take(p, id, w, token_no + 1, now, s) end
      if e then
        for j = #popped - 1, i + 2, -2 do redis.call("ZADD", p .. "wait", popped[j + 1], popped[j]) end
        put_back(p, popped[i], popped[i + 1], e, rows, now)
        budget = 0
        break
      elseif row then
        token_no = token_no + 1
        if bound then bind_start(row, bound) end
        rows[#rows + 1] = row
        tokens[#tokens + 1] = row[2]
      elseif kind == "missing" then
        missing = missing + 1
      end
    end
  end
  add_leased(p, w)
  count_missing(p, missing)
  return rows, tokens
end

-- A fetch's first element while the queue is paused: no job comes with it.
local PAUSED = -2

-- Parents due a look (flows.lua) bring an idle worker back no sooner.
local PARENTS_AGAIN_MS = 1000

-- fetch(p; worker, n, lease_ms, keep_count, keep_age_ms, max_payload [, keep_failed_age_ms [, free [, db]]])
-- -> { next_due_ms, job, ... } ({ -2 } while the queue is paused); each job is
-- { id, token, data, made, attempts, backoff, timeout, kill_after, name
-- [, group [, start_ms [, children]]] }: its group ("" for none), under a
-- rate the ms within which the worker must start it (from when it sent this
-- call), else give it back ("" for none), and for a flow's parent its
-- children's rows (flows.lua's children_rows).
-- Recovers stalled jobs, makes due delayed jobs ready and trims finished
-- jobs (keep_count, keep_age_ms; once per fetch, not per job) first. A job
-- whose fields are out of range fails with EINPUT here, one whose data is
-- over max_payload (0: no bound) with EPAYLOAD, their data never sent; an
-- entry whose job is gone is counted in totals "missing". next_due_ms:
-- when the earliest delayed job or schedule falls due (server ms from now),
-- or -1. Due schedules fire first (fire_schedules). Under the queue's limits
-- (rate, concurrency, an ERATELIMIT hold) it hands out fewer jobs (under a
-- rate at most free, the worker's idle children), and next_due_ms says when to look
-- again for a rate window or hold. db: the worker's database (its jobs'
-- progress and log lines go to <p>updates@<db>: runs.lua). With groups, jobs come round-robin
-- between them (groups.lua), under each group's limits. free: the worker's
-- children that can start a job now.
local function fetch(keys, args)
  local p, worker = keys[1], args[1]
  if not worker or worker == "" then return refuse("moonjob_fetch", "WORKER must be a name", "") end
  local refused = check_numbers("moonjob_fetch", args, FETCH_NUMBERS)
  if refused then return refused end
  local n = tonumber(args[2]) or 1
  local w = { id = worker, lease = tonumber(args[3]) or 30000, max_payload = tonumber(args[6]) or 0,
    db = tonumber(args[9] or "") }
  local now = now_ms()
  -- what take_one writes for each job, as text once (Redis's Lua formats
  -- a number slowly)
  w.token, w.now, w.until_ms = worker .. "/", tostring(now), tostring(now + w.lease)
  w.db_text = w.db and tostring(w.db) or ""
  w.digits = {} -- (its tokens' thousands: H.digits_of)
  recover_stalled(p, now)
  fire_schedules(p, now)
  promote_delayed(p, now)
  local grouped = G.on(p) -- (looked at once: nothing below makes a job wait)
  -- whatever this fetch may take: its answer counts the parked groups'
  -- times; a step of the switch into group mode and of a walk over the
  -- parked groups, if one goes on (then its answer says: again at once)
  local steps = false
  if grouped then
    G.unpark_due(p, now)
    steps = G.copy(p, now)
    steps = G.unpark_step(p, now) or steps
  end
  retain(p, args, now, n)
  H.look_at_parents(p, now)
  if redis.call("EXISTS", p .. "paused") == 1 then return { PAUSED } end
  local out = { -1 }
  local lim, glim = read_limits(p, true)
  local held_back, free = nil, tonumber(args[8] or "")
  local hold = redis.call("PTTL", p .. "limited") -- an ERATELIMIT hold: nothing now
  if hold > 0 then
    n, held_back = 0, hold
  elseif lim then
    n, held_back = allowance(p, lim, n, free, now)
  end
  -- the first `short` jobs go to children free now; the others are held
  -- ahead: under a rate with the ahead bound, under a group limit only from
  -- groups far from it (G.room). Without FREE (an older worker) all are short.
  local short = math.min(n, free or n)
  if glim then glim.short, glim.taken, glim.margin = short, 0, n end
  -- the token counter is checked before anything is popped (a pop is not
  -- undone if the call then fails): a key another client spoiled is said
  local counter = redis.pcall("INCRBY", p .. "tokens", 0)
  if type(counter) == "table" and counter.err and (counter.err:find("not an integer", 1, true)
      or wrong_type(counter, "INCRBY", p .. "tokens")) then -- (another error: the call's, raised)
    return redis.error_reply(("ERR %stokens is not a counter (%s): another client wrote it; delete it "
      .. "(DEL %stokens) and restart the workers"):format(p, counter.err, p))
  end
  local rows, tokens = take(p, w, n, now, glim, grouped, lim and lim.start_ms)
  for _, row in ipairs(rows) do out[#out + 1] = row end
  count_starts(p, lim, tokens, now, short)
  bound_ahead(rows, short, lim, glim)
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
  local parent = tonumber(redis.call("ZRANGE", p .. "parents", 0, 0, "WITHSCORES")[2] or "") -- (its deadline, its look)
  if parent then parent = math.max(parent, now + PARENTS_AGAIN_MS) end -- (more due than one look takes: not at once)
  if parent and not (due and due <= parent) then due = parent end
  if held_back and not (due and due <= now + held_back) then due = now + held_back end
  if steps then due = now end
  if due then out[1] = math.max(0, due - now) end
  return out
end

F.fetch = fetch
end
