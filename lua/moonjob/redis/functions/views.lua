-- part: views.lua
-- Seeing a queue's jobs (moonjob.redis.operate, the CLI, the dashboard):
-- listings are paged in Redis (ZRANGE with offset and count), never a walk
-- over every job; one job with its log; the queue's counts.

do
local REGISTRY, ATTEMPTS_MAX, COUNT_MAX = H.REGISTRY, H.ATTEMPTS_MAX, H.COUNT_MAX
local LOG_KEEP_MAX, job_key, refuse, log_key, SETS = H.LOG_KEEP_MAX, H.job_key, H.refuse, H.log_key, H.SETS
local member_id, check_numbers = H.member_id, H.check_numbers

local LIST_MAX = 1000

-- A job's fields as listings give them, after its id, in this order
-- (docs/REDIS.md); absent ones are false.
local VIEW_FIELDS = { "state", "name", "data", "result", "error", "made", "attempts", "progress",
  "created", "started", "finished", "worker", "run_at", "priority", "cancel", "ran", "began" }

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
  if H.wrong_type(f, "HMGET", job_key(p, id)) then
    out[2] = "invalid"
    for i = 2, #VIEW_FIELDS do out[i + 1] = false end
    return out
  end
  if f[1] then H.defaulted(f, VIEW_FIELDS) end
  if f[1] == "waiting" then f[13] = f[13] or f[9] end -- (one an add made waiting has no run_at: it could run from then)
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
  return nil, refuse(fn, "STATE must be waiting, delayed, active, completed, failed or waiting-children", state or "")
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

-- job(p; id [, log_lines]) -> { view..., flow, log } (flow: H.flow_of's;
-- log: its last log_lines lines, default all kept) or nil when no such job
-- is kept.
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
  v[#v + 1] = H.flow_of(p, id) -- (before the log: a client of version 7 reads the log last)
  v[#v + 1] = log
  return v
end

-- Among the first 2,000 active jobs (counts() stays cheap): those whose
-- worker said they started and has no heartbeat entry (beating: worker id
-- -> true when live, false when lapsed), an older moonjob's workers, which
-- tell of their running jobs only so; and those of a lapsed worker (gone
-- without a word: they wait for their lease to end, then are recovered).
local function ran_and_lapsed(p, beating)
  local ids = redis.call("ZRANGE", p .. "active", 0, 1999)
  local ran, lapsed = 0, 0
  for _, id in ipairs(ids) do
    local f = redis.pcall("HMGET", job_key(p, id), "ran", "worker")
    if not f.err then
      local worker = beating[f[2] or ""]
      if worker == false then lapsed = lapsed + 1
      elseif worker == nil and f[1] == "1" then ran = ran + 1 end
    end
  end
  return ran, lapsed
end

-- Whether the queue exists: it has a key (a job's set, or one an operator
-- or an add makes: H.QUEUE_KEYS, but a worker's heartbeat), or it is
-- registered (a worker registers what it serves, and waits on
-- it though nothing was added yet). pcall: the registry is outside the
-- queue's keys, which an ACL user may not read, and on a cluster lives on
-- another slot (refused: the client asks it).
local function exists(p)
  local keys = { "wait", "delayed", "active", "completed", "failed", "schedules", "parents" }
  for _, k in ipairs(H.QUEUE_KEYS) do -- (a heartbeat alone makes none: it beats on after an obliterate)
    if k ~= "workers" and k ~= "wdrop" then keys[#keys + 1] = k end
  end
  for i, k in ipairs(keys) do keys[i] = p .. k end
  if redis.call("EXISTS", unpack(keys)) > 0 then return 1 end
  local registered = redis.pcall("SISMEMBER", REGISTRY, H.queue_name(p))
  return registered == 1 and 1 or 0
end

-- counts(p) -> { waiting, delayed, active, completed_ever, failed_ever,
-- missing, paused, held, exists, waiting_children, completed, failed,
-- running, workers, lapsed }: completed_ever and failed_ever count every
-- job that ever ended so (positions 4 and 5: what clients before version
-- 11 read as their completed and failed, and export as counters that never
-- go down); completed and failed (11, 12) are the jobs in those sets now
-- (kept: retention trims them, a retry moves them); missing, the set
-- entries found with their job gone (evicted); paused 1 while the queue is
-- paused; running, the jobs the live workers' children run (their
-- heartbeats; and the jobs said started by a worker with no heartbeat
-- entry, an older moonjob), at most active; lapsed, the active jobs of a
-- lapsed worker (not running: they wait for their lease to end); held =
-- active - running - lapsed: fetched, not yet run by a child; exists 0
-- when the queue has no key at all; workers, the live workers (heartbeats
-- not lapsed). New positions go at the end: an older client reads the
-- ones it knows, with their old meanings.
local function counts(keys)
  local p = keys[1]
  local totals = redis.pcall("HMGET", p .. "totals", "completed", "failed", "missing")
  if totals.err then totals = {} end -- a spoiled totals key: its counts read as 0
  local active = redis.call("ZCARD", p .. "active")
  local reported, live, beating = H.live_workers(p)
  local ran, lapsed = ran_and_lapsed(p, beating)
  local running = math.min(active, reported + ran)
  lapsed = math.min(active - running, lapsed)
  return { redis.call("ZCARD", p .. "wait"), redis.call("ZCARD", p .. "delayed"), active,
    tonumber(totals[1]) or 0, tonumber(totals[2]) or 0, tonumber(totals[3]) or 0,
    redis.call("EXISTS", p .. "paused"), active - running - lapsed, exists(p), redis.call("ZCARD", p .. "parents"),
    redis.call("ZCARD", p .. "completed"), redis.call("ZCARD", p .. "failed"), running, live, lapsed }
end

F.jobs, F.job, F.counts = jobs, job, counts
end
