-- moonjob.redis.queue_calls -- what both producers do alike: q:get,
-- q:cancel, q:counts, q:workers, q:exists, q:children and an add's nonce, of
-- moonjob.queue (moonjob.redis.producer) and of the pure-Lua
-- moonjob.producer, which take them from here by name. Each is a function of the queue `q`: its client
-- (call_wait(args) -> reply | nil, err), prefix, name and json (the codec
-- that reads results: moonjob.queue's is moonjob's exact one).
--
-- Pure Lua, as moonjob.redis.fcall: loaded on any Lua.
local errors = require "moonjob.errors"
local fcall = require "moonjob.redis.fcall"
local flow = require "moonjob.redis.flow"
local names = require "moonjob.redis.names"

local M = {}

local reply_error = fcall.reply_error

-- An id, or a job handle of either producer (its id and nonce: the calls
-- then answer for that job only, never for a later job given its id).
function M.id_and_nonce(job)
  if type(job) == "table" and job.id ~= nil then return job.id, job.nonce or "" end
  return tostring(job), ""
end

-- A nonce no other add gives: the queue object's random prefix
-- (q.nonce_prefix) and a count (q.nonces).
function M.nonce(q)
  q.nonces = q.nonces + 1
  return q.nonce_prefix .. "." .. q.nonces
end

-- queue:get(id or job) -> { id, state, result, error, attempts, ... } | nil (not
-- kept; for a handle also: another job holds its id now), err
function M.get(q, job)
  local id, nonce = M.id_and_nonce(job)
  local f, err = q.client:call_wait({ "FCALL", "moonjob_get", 1, q.prefix, id, nonce })
  if err then return nil, reply_error(err) end
  if not f then return nil end
  local info = { id = tostring(id), state = f[1], attempts = tonumber(f[4]) or 0,
    max_attempts = tonumber(f[5]), name = f[6] ~= "" and f[6] or nil,
    created = tonumber(f[7]), started = tonumber(f[8]), finished = tonumber(f[9]) }
  if f[2] then info.result = q.json.decode(f[2]) end
  if f[3] then info.error = fcall.decode_error(f[3], q.json) end
  return info
end

-- queue:cancel(id or job [, reason]) -> state it was in | nil, err. A running
-- job is interrupted on the host that runs it and fails with ECANCELED.
function M.cancel(q, job, reason)
  local id, nonce = M.id_and_nonce(job)
  local state, err = q.client:call_wait({ "FCALL", "moonjob_cancel", 1, q.prefix, id,
    reason and tostring(reason) or "canceled", nonce })
  if err then return nil, reply_error(err) end
  if state == "ENOTFOUND" then return nil, errors.new("ENOTFOUND", "no job " .. tostring(id) .. " in queue " .. q.name) end
  return state
end

-- queue:counts() -> { waiting, delayed, active, running, held, lapsed,
-- completed, failed, completed_ever, failed_ever, missing, paused, exists,
-- waiting_children, workers } | nil, err. completed, failed: the jobs in
-- those states now (kept; a retry moves them back); completed_ever,
-- failed_ever: every job that ever ended so (never go down). running: the
-- jobs the live workers' children run, as their heartbeats say (within
-- 200 ms, however short the job); lapsed: the active jobs of a worker
-- gone without a word (they wait for their lease to end, then are
-- recovered); held: the other active jobs, fetched by a worker and not yet
-- handed to a child. missing: jobs found gone from
-- Redis (evicted, deleted by hand); paused: true while the queue is paused;
-- exists: false when the queue has no key at all and is not registered (a
-- name never used, or obliterated; a queue a worker waits on is
-- registered); workers: the live workers (heartbeat not lapsed).
function M.counts(q)
  local c, err = q.client:call_wait({ "FCALL", "moonjob_counts", 1, q.prefix })
  if not c then return nil, reply_error(err) end
  local counts = M.read_counts(c)
  if not counts.exists and q.client.cluster then counts.exists = M.registered(q) end
  return counts
end

-- Whether the registry lists q: on a cluster the library cannot read it
-- (another slot), so the client asks it; a failed read says no.
function M.registered(q)
  return q.client:call_wait({ "SISMEMBER", names.REGISTRY, q.name }) == 1
end

-- moonjob_counts' reply -> q:counts()'s table.
function M.read_counts(c)
  return { waiting = c[1], delayed = c[2], active = c[3], completed = c[11], failed = c[12], missing = c[6],
    paused = c[7] == 1, held = c[8], exists = c[9] ~= 0, waiting_children = c[10], completed_ever = c[4],
    failed_ever = c[5], running = c[13], workers = c[14], lapsed = c[15] } -- (the library is ours or newer: setup)
end

-- A worker's entry (moonjob_workers' JSON) as q:workers gives it, seen at
-- `now` (server ms); nil when past its drop time.
local function worker_row(text, now, json)
  local ok, e = pcall(json.decode, text)
  if not ok or type(e) ~= "table" or type(e.seen) ~= "number" then return nil end
  e.started, e.running = tonumber(e.started), math.max(0, tonumber(e.running) or 0) -- (as written by any client)
  if type(e.id) ~= "string" then e.id = tostring(e.id) end
  if e.seen + (tonumber(e.drop) or 0) < now then return nil end
  e.jobs = e.jobs or setmetatable({}, json.array_mt) -- (written back as [])
  e.ago = math.max(0, now - e.seen) / 1000
  e.lapsed = now - e.seen > (tonumber(e.lapse) or 0)
  if e.lapsed then e.running = 0 end -- (its jobs: those it ran when last seen; none runs now)
  return e
end

-- queue:workers() -> { worker, ... } | nil, err: the workers serving the
-- queue, as their heartbeats last said, oldest first: { id, host, pid,
-- version, queues, children, running, jobs = { { id, since }, ... },
-- started, seen (server ms), ago (s since seen), lapsed (not seen for a
-- few beats: gone without a word, or cut off from Redis) }. A worker that
-- stopped cleanly is not listed; a lapsed one is, until its drop time.
function M.workers(q)
  local r, err = q.client:call_wait({ "FCALL", "moonjob_workers", 1, q.prefix })
  if not r then return nil, reply_error(err) end
  local out = {}
  for i = 2, #r do out[#out + 1] = worker_row(r[i], r[1], q.json) end
  table.sort(out, function(a, b)
    if a.started ~= b.started then return (a.started or 0) < (b.started or 0) end
    return a.id < b.id
  end)
  return out
end

-- What a wait for job `id` gives once it ended or timeout seconds passed,
-- from q:get's info, err then: its result | nil, its error (failed), err,
-- ENOTFOUND (not kept) or ETIMEDOUT (not ended).
function M.outcome(q, id, info, err, timeout)
  if err then return nil, err end
  if not info then
    return nil, errors.new("ENOTFOUND", ("job %s is not in queue %s: no longer kept (retention), or lost "
      .. "by Redis (a restart without persistence, a failover) and its id may be another job's now")
      :format(tostring(id), q.name))
  end
  if info.state == "completed" then return info.result end
  if info.state == "failed" then return nil, info.error end
  return nil, errors.new("ETIMEDOUT", ("job %s did not finish within %g s"):format(tostring(id), timeout))
end

-- queue:children(id or job) -> { { id, queue, state, result | error }, ... }
-- in the flow's order | nil, err: a flow's parent's children, each as it
-- ended (its result or error, kept with the parent whatever retention did
-- to the child), or the state of one still pending ("missing": gone).
function M.children(q, job)
  local id, nonce = M.id_and_nonce(job)
  local rows, err = q.client:call_wait({ "FCALL", "moonjob_children", 1, q.prefix, id, nonce })
  if err then return nil, reply_error(err) end
  if not rows then return nil, errors.new("ENOTFOUND", "no job " .. tostring(id) .. " in queue " .. q.name) end
  return flow.children(rows, q.json)
end

-- Whether the queue exists: it has a key, or a worker or producer has
-- registered it (a worker waits on it, though nothing was added yet).
function M.exists(q)
  local c, err = q:counts()
  if not c then return nil, err end
  return c.exists
end

return M
