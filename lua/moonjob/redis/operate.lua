-- moonjob.redis.operate -- seeing and acting on a durable queue: the
-- operating methods of `moonjob.queue(url, name)` (the queue class,
-- moonjob.redis.producer, takes them from here: each is a function of the
-- queue `q`), and the job records they return.
--
--   local q = assert(moonjob.queue(url, "images"))
--   for _, job in ipairs(assert(q:jobs("failed", { limit = 10 }))) do print(job.id, job.error) end
--   q:retry_all()             -- every failed job runs again
--   q:pause(); q:resume()     -- every worker, on every host
--
-- Each method is one FCALL of the library (functions/operate.lua:
-- moonjob_jobs, moonjob_retry, ...), or a few for the bulk ones (retry_all,
-- clean, drain, obliterate), which Redis does LIMIT jobs at a time so that
-- no call blocks the server for long: they are not atomic as a whole (a
-- job that fails meanwhile may be retried by the same retry_all). Methods
-- block their caller for their round trips, as q:add does (the loop keeps
-- running).
--
-- Errors are returned, never raised, for what a user may mistype (an
-- unknown id: ENOTFOUND; a job in the wrong state: ESTATE; a queue with no
-- key at all: ENOQUEUE; a page past the end: ERANGE; a bad state or
-- number: EINPUT). Nothing is changed by a call that returns an error.
-- A bad option raises (a bug of the caller): the queue class takes these
-- functions as its methods, not wrapped, so that the error levels count
-- from the user's call.
--
-- Times are the Redis server's, in ms since the epoch; run times in ms.
local errors = require "moonjob.errors"
local fcall = require "moonjob.redis.fcall"
local flow = require "moonjob.redis.flow"
local json = require "moonjob.codec.json"
local names = require "moonjob.redis.names"
local run_buckets = require "moonjob.run_buckets"
local utf8 = require "moonjob.codec.utf8"

local M = {}

local call, no_queue_or, decode_error = fcall.call, fcall.no_queue_or, fcall.decode_error

local STATES = { waiting = true, delayed = true, active = true, completed = true, failed = true,
  ["waiting-children"] = true }
local STATE_LIST = "waiting, delayed, active, completed, failed or waiting-children"
local VIEW_FIELDS = { "state", "name", "data", "result", "error", "made", "attempts", "progress",
  "created", "started", "finished", "worker", "run_at", "priority", "cancel", "ran", "began" }
local BULK = 1000 -- jobs per call of the bulk functions

local function decode(text)
  if not text then return nil end
  return (json.decode(text))
end

-- One job of a listing (the library's view, functions/views.lua) as a table.
local function job_of(row)
  local f = {}
  for i, name in ipairs(VIEW_FIELDS) do f[name] = row[i + 1] or nil end
  local cut = {}
  for name in (row[#VIEW_FIELDS + 2] or ""):gmatch("[^,]+") do cut[name] = true end
  local job = { id = row[1], state = f.state, name = f.name ~= "" and f.name or nil,
    attempts = tonumber(f.made) or 0, max_attempts = tonumber(f.attempts),
    created = tonumber(f.created), started = tonumber(f.started), finished = tonumber(f.finished),
    worker = f.worker, run_at = tonumber(f.run_at), priority = tonumber(f.priority),
    cancel = f.cancel, running = f.state == "active" and f.ran == "1" or nil }
  for _, name in ipairs({ "data", "result", "error", "progress" }) do
    if name == "error" then
      job.error = f.error and decode_error(f.error)
      job.error_cut = cut.error -- only its code and the start of its message
    elseif cut[name] then job[name .. "_preview"] = f[name]
    else
      job[name] = decode(f[name])
      -- not JSON (written by another client): its text, rather than nothing
      if job[name] == nil and f[name] and f[name] ~= "null" then job[name .. "_preview"] = f[name] end
    end
  end
  -- when its child started it (the worker says so); started is when it was fetched
  job.started = tonumber(f.began) or job.started
  if job.started and job.finished then job.ms = job.finished - job.started end
  return job
end
M.job_of = job_of

local function check_state(fn, state, allowed, list)
  if not (allowed or STATES)[state] then
    return errors.new("EINPUT", ("%s: state must be %s, not '%s'"):format(fn, list or STATE_LIST,
      tostring(state)))
  end
end

local function whole(fn, opts, name, low, high)
  local v = opts[name]
  if v == nil then return nil end
  if type(v) ~= "number" or v % 1 ~= 0 or v < low or v > high then
    error(("%s: option '%s' must be a whole number from %d to %.0f"):format(fn, name, low, high), 4)
  end
  return v
end

local function check_options(fn, opts, known)
  if opts == nil then return {} end
  if type(opts) ~= "table" then error(fn .. ": options must be a table", 4) end
  for k in pairs(opts) do
    if not known[k] then
      local list = {}
      for n in pairs(known) do list[#list + 1] = n end
      table.sort(list)
      error(("%s: unknown option '%s' (known: %s)"):format(fn, tostring(k), table.concat(list, ", ")), 4)
    end
  end
  return opts
end

-- q:jobs(state [, { offset, limit, order, preview }]) -> jobs, total | nil, err.
-- order "asc" or "desc" (default: next to run first; finished: newest
-- first); limit 1 to 1000 (default 20); preview: bytes of data and result
-- beyond which they come cut, as text in data_preview and result_preview,
-- and an error keeps only its code and message's start (error_cut)
-- (default: whole). A page past the end is ERANGE.
function M.jobs(q, state, opts)
  local fn = "queue:jobs()"
  opts = check_options(fn, opts, { offset = true, limit = true, order = true, preview = true })
  local bad = check_state(fn, state)
  if bad then return nil, bad end
  if opts.order ~= nil and opts.order ~= "asc" and opts.order ~= "desc" then
    error(fn .. ": option 'order' must be \"asc\" or \"desc\"", 2)
  end
  local offset = whole(fn, opts, "offset", 0, 2 ^ 53) or 0
  local reply, err = call(q, "moonjob_jobs", 1, q.prefix, state, offset,
    whole(fn, opts, "limit", 1, 1000) or 20, opts.order or "", whole(fn, opts, "preview", 0, 2 ^ 31) or 0)
  if not reply then return nil, err end
  local total = reply[1]
  if total == 0 then
    local missing = no_queue_or(q, nil)
    if missing then return nil, missing end
  end
  if offset > 0 and offset >= total then
    return nil, errors.new("ERANGE", ("offset %.0f is past the end: queue %s holds %d %s job(s)")
      :format(offset, q.name, total, state))
  end
  local out = {}
  for i = 2, #reply do out[#out + 1] = job_of(reply[i]) end
  return out, total
end

-- q:job(id [, { log = n }]) -> job (with job.log, its last n log lines;
-- a flow's child: job.parent = { queue, id }; a parent: job.children, as
-- q:children gives them;
-- default every line kept) | nil, err (ENOTFOUND, ENOQUEUE).
function M.job(q, id, opts)
  local fn = "queue:job()"
  opts = check_options(fn, opts, { log = true })
  local reply, err = call(q, "moonjob_job", 1, q.prefix, tostring(id), whole(fn, opts, "log", 0, 10000) or "")
  if err then return nil, err end
  if not reply then
    return nil, no_queue_or(q, errors.new("ENOTFOUND", ("no job %s in queue %s (never added, or no "
      .. "longer kept)"):format(tostring(id), q.name)))
  end
  local job = job_of(reply)
  local place = reply[#VIEW_FIELDS + 3] -- (a library before flows has none: the log is then there)
  if #reply > #VIEW_FIELDS + 3 and type(place) == "table" then
    if place[1] ~= "" then job.parent = { queue = place[1], id = place[2] } end
    if #place[3] > 0 then job.children = flow.children(place[3]) end
  end
  local log = reply[#reply]
  job.log = setmetatable({}, json.array_mt) -- written as [] when empty
  for i = 1, #log do job.log[i] = log[i] end -- without the reply's n
  return job
end

-- An action on one job (retry, remove, promote): the state it was in.
local function act(q, fname, id, extra)
  local state, err = call(q, fname, 1, q.prefix, tostring(id), extra)
  if state then return state end
  if err.code == "ENOTFOUND" then return nil, no_queue_or(q, err) end
  return nil, err
end

-- q:retry(id) -> the state it was in ("failed" or "completed") | nil, err:
-- the job runs again, its attempts counted anew.
function M.retry(q, id) return act(q, "moonjob_retry", id) end
-- q:remove(id [, { cascade = true }]) -> the state it was in | nil, err; a
-- running job is ESTATE (cancel it first), and so is a flow's child its
-- parent waits for, unless cascade: the parent then counts it as canceled
-- (by default it fails, its other pending children canceled). Removing a
-- parent cancels its pending children.
function M.remove(q, id, opts)
  opts = check_options("queue:remove()", opts, { cascade = true })
  if not opts.cascade then return act(q, "moonjob_remove", id) end
  return act(q, "moonjob_remove", id, "cascade")
end
-- q:promote(id) -> "delayed" (the state it was in) | nil, err: a delayed
-- job may run now.
function M.promote(q, id) return act(q, "moonjob_promote", id) end

-- Calls a bulk function until nothing is left, limit jobs are done, or
-- as many as its first answer saw (done + left): a queue fed faster than
-- it is emptied never keeps it going. call_n(n, before) gets the cut the
-- first answer gave (retry_all, clean). -> how many | nil, err (some may
-- have been done: their count in err.done).
local function bulk(q, limit, call_n, until_empty)
  local done, before, total, last_left = 0, nil, nil, nil
  while not limit or done < limit do
    local n = limit and math.min(BULK, limit - done) or BULK
    local reply, err = call_n(n, before)
    if not reply then
      err.done = done
      return nil, err
    end
    done = done + reply[1]
    before = before or reply[3]
    total = total or (reply[1] + reply[2])
    local looked_at = reply[4] or reply[1] -- retry_all: entries whose job was gone count too
    -- (until empty, a call that removed no job but left less did work: obliterate's groups)
    local progress = looked_at > 0 or (until_empty and reply[2] < (last_left or math.huge))
    if reply[2] == 0 or not progress or (done >= total and not until_empty) then break end
    last_left = reply[2]
  end
  if done == 0 then -- nothing done: say so when the queue is not there at all
    local missing = no_queue_or(q, nil)
    if missing then return nil, missing end
  end
  return done
end

-- q:retry_all([{ state = "failed" | "completed", limit }]) -> how many ran again | nil, err
function M.retry_all(q, opts)
  local fn = "queue:retry_all()"
  opts = check_options(fn, opts, { state = true, limit = true })
  local state = opts.state or "failed"
  local bad = check_state(fn, state, { failed = true, completed = true }, "failed or completed")
  if bad then return nil, bad end
  local limit = whole(fn, opts, "limit", 1, 2 ^ 53)
  return bulk(q, limit, function(n, before)
    return call(q, "moonjob_retry_all", 1, q.prefix, state, n, before or "")
  end)
end

-- q:clean(state [, { older_than = seconds, limit }]) -> how many removed | nil, err:
-- completed or failed jobs that ended more than older_than seconds ago (default 0: all).
function M.clean(q, state, opts)
  local fn = "queue:clean()"
  opts = check_options(fn, opts, { older_than = true, limit = true })
  local bad = check_state(fn, state, { failed = true, completed = true },
    "completed or failed (jobs that wait: queue:drain())")
  if bad then return nil, bad end
  local older = opts.older_than or 0
  if type(older) ~= "number" or not (older >= 0 and older <= 1e12) then
    error(fn .. ": option 'older_than' must be a number of seconds, 0 or more", 2)
  end
  local limit = whole(fn, opts, "limit", 1, 2 ^ 53)
  return bulk(q, limit, function(n, before)
    return call(q, "moonjob_clean", 1, q.prefix, state, math.floor(older * 1000), n, before or "")
  end)
end

-- q:drain([{ delayed = false }]) -> how many removed | nil, err: the jobs
-- that wait (and, unless delayed = false, the delayed ones); running and
-- finished jobs stay.
function M.drain(q, opts)
  opts = check_options("queue:drain()", opts, { delayed = true })
  local delayed = opts.delayed ~= false and "1" or "0"
  return bulk(q, nil, function(n) return call(q, "moonjob_drain", 1, q.prefix, n, delayed) end)
end

-- q:obliterate([{ force = true }]) -> how many jobs removed | nil, err:
-- the whole queue, every job and key. EBUSY while jobs run, unless force
-- (their workers' reports are then refused and the jobs stopped there).
function M.obliterate(q, opts)
  opts = check_options("queue:obliterate()", opts, { force = true })
  local force = opts.force and "1" or "0"
  local n, err = bulk(q, nil, function(limit)
    return call(q, "moonjob_obliterate", 1, q.prefix, limit, force)
  end, true) -- to the end: the queue is paused meanwhile, and gone only then
  if n then
    if q.client.forget then q.client:forget(q.name) end -- (a cluster's client: not written back)
    q.client:call_wait({ "SREM", names.REGISTRY, q.name })
  end
  return n, err
end

-- q:pause() / q:resume() -> true | nil, err. While paused, no worker on
-- any host fetches a job (they ask at least once a second, and hear the
-- pause at once); running jobs finish; counts().paused is true.
function M.pause(q)
  local ok, err = call(q, "moonjob_pause", 1, q.prefix)
  return ok and true, err
end

function M.resume(q)
  local ok, err = call(q, "moonjob_resume", 1, q.prefix)
  return ok and true, err
end

-- q:metrics([{ minutes = 60 }]) -> { minutes = { row, ... }, total = row, buckets } | nil, err.
-- Each row: at (ms, the minute's start), completed, failed, runs, and the
-- run time's mean_ms, p50_ms, p90_ms, p99_ms (nil without runs), and
-- counts (runs per bucket, only the buckets hit: buckets are the bounds
-- in ms, moonjob.run_buckets). A percentile is the middle of its bucket,
-- within 4.5% of the true value (moonjob.run_buckets.ERROR); in the first
-- or the last bucket it is that bound, and p50_bound (p90_bound, ...) says
-- "below" (1 ms or less) or "above" (more than 17.5 min). Kept in Redis
-- for 25 hours.
function M.metrics(q, opts)
  local fn = "queue:metrics()"
  opts = check_options(fn, opts, { minutes = true })
  local minutes = whole(fn, opts, "minutes", 1, 1500) or 60
  local reply, err = call(q, "moonjob_metrics", 1, q.prefix, minutes, "fine")
  if not reply then return nil, err end
  if (reply[3][1] or 0) + (reply[3][2] or 0) == 0 then -- nothing ever ended: is it there at all?
    local missing = no_queue_or(q, nil)
    if missing then return nil, missing end
  end
  local out = { buckets = run_buckets.BOUNDS_MS, total = M.metric_row(reply[3]), minutes = {} }
  for i = 4, #reply do
    local row = M.metric_row(reply[i])
    row.at = (reply[1] + i - 4) * 60000
    out.minutes[#out.minutes + 1] = row
  end
  return out
end

-- operate.record(job) -> a job of q:jobs or q:job as plain data, to be
-- written as JSON: its error an object of code, message and its other
-- fields (an error object is not plain data).
local function plain_error(err)
  local e = { code = err.code, message = err.message }
  for k, v in pairs(err) do if type(k) == "string" then e[k] = v end end
  return e
end

function M.record(job)
  local out = {}
  for k, v in pairs(job) do out[k] = v end
  if job.error then out.error = plain_error(job.error) end
  if job.children then -- (a flow's parent: each child's error too)
    out.children = setmetatable({}, json.array_mt)
    for i, child in ipairs(job.children) do
      local c = {}
      for k, v in pairs(child) do c[k] = v end
      if child.error then c.error = plain_error(child.error) end
      out.children[i] = c
    end
  end
  return out
end

-- operate.parent_state(q, job) -> job, its parent (a flow's child's
-- job.parent, as q:job gives it) with the state it is in now ("missing"
-- when it is no longer kept): one call more, for views of the job.
function M.parent_state(q, job)
  local parent = job.parent
  if not parent then return job end
  local info, err = q:_sibling(parent.queue):get(parent.id)
  if info then parent.state = info.state elseif not err then parent.state = "missing" end
  return job
end

-- A copy of v whose strings (keys too) are UTF-8 (utf8.to_utf8).
local function to_utf8(v, depth)
  if type(v) == "string" then return utf8.to_utf8(v) end
  if type(v) ~= "table" or depth > 100 then return v end
  local out = setmetatable({}, getmetatable(v))
  for k, x in pairs(v) do out[to_utf8(k, depth + 1)] = to_utf8(x, depth + 1) end
  return out
end

-- operate.encode(v) -> JSON text of a job, a row, anything read from a
-- queue: text that is not UTF-8 (a processor's output, data another client
-- wrote) is written with U+FFFD rather than refused.
function M.encode(v)
  local text = json.encode(v)
  if text then return text end
  local err
  text, err = json.encode(to_utf8(v, 0))
  if text then return text end
  return assert(json.encode({ error = { code = "EINTERNAL", message = "cannot write as JSON: " .. tostring(err) } }))
end

-- The percentiles a metrics row gives: p50_ms, p90_ms, p99_ms.
local QUANTILES = { { "p50", 0.5 }, { "p90", 0.9 }, { "p99", 0.99 } }

-- A metrics row of the library's fine layout (functions/metrics.lua:
-- { c, f, n, s, bucket, runs, ... }, only the buckets hit) as a table;
-- counts: runs per bucket (sparse).
function M.metric_row(r)
  local counts = {}
  for i = 5, #r - 1, 2 do counts[r[i]] = r[i + 1] end
  local row = { completed = r[1], failed = r[2], runs = r[3], sum_ms = r[4], counts = counts }
  if r[3] > 0 then
    row.mean_ms = r[4] / r[3]
    for _, q in ipairs(QUANTILES) do
      row[q[1] .. "_ms"], row[q[1] .. "_bound"] = run_buckets.quantile(counts, r[3], q[2])
    end
  end
  return row
end

return M
