-- part: workers.lua
-- The workers serving a queue, as their heartbeats tell it
-- (moonjob.redis.heartbeat): who they are, how many jobs their children run
-- and which. Keys (under the queue's hash tag, so a worker serving several
-- queues beats on each):
--   <p>workers  hash: worker id -> its entry, JSON: what the worker sent
--               (host, pid, version, queues, children) and, on the
--               server's clock (ms), id, seen, started, lapse, drop,
--               running, jobs ([{id, since}], absent when none)
--   <p>wdrop    sorted set: worker id by when its entry is dropped (ms)
-- An entry not seen for its `lapse` ms is lapsed (the worker died without a
-- word, or cannot reach Redis): readers show it so and count none of its
-- jobs as running; one not seen for its `drop` ms is deleted by the next
-- beat on the queue (readers skip it until then).

do
local W = {
  MAX = 1000,       -- workers per queue
  JOBS_MAX = 100,   -- running jobs named per beat
  INFO_MAX = 16384, -- bytes of a worker's own description
}

-- Entries past their drop time, deleted (a few per beat: a beat stays cheap).
function W.prune(p, now)
  local gone = redis.call("ZRANGE", p .. "wdrop", "-inf", now, "BYSCORE", "LIMIT", 0, 100)
  if #gone == 0 then return end
  redis.call("HDEL", p .. "workers", unpack(gone))
  redis.call("ZREM", p .. "wdrop", unpack(gone))
end

W.NUMBERS = {
  { 2, "LAPSE_MS must be a whole number of ms from 1 to 2^31", 1, 2 ^ 31, true },
  { 3, "DROP_MS must be a whole number of ms from 1 to 2^31", 1, 2 ^ 31, true },
  { 5, "UP_MS must be a whole number of ms from 0 to 2^53", 0, H.COUNT_MAX, true },
  { 6, "RUNNING must be a whole number from 0 to 2^31", 0, 2 ^ 31, true },
}

-- beat(p; id, lapse_ms, drop_ms, info, up_ms, running [, job, age_ms]...) ->
-- "OK": the worker's entry written (info: a JSON object, its own
-- description; up_ms: how long it has been up; running: the most jobs its
-- children ran at once since its last beat; each job it runs now with how
-- long ago it started, the first JOBS_MAX kept). info "": the worker
-- stopped, its entry is deleted. Each beat also deletes the queue's
-- entries past their drop time.
function W.beat(keys, args)
  local p, fn, id = keys[1], "moonjob_beat", args[1]
  local refused = H.check_args(fn, args, 6, "it takes ID LAPSE_MS DROP_MS INFO UP_MS RUNNING [JOB AGE_MS]...",
    W.NUMBERS)
  if refused then return refused end
  if id == "" or #id > 512 then return H.refuse(fn, "ID must be 1 to 512 bytes", id) end
  local now = H.now_ms()
  W.prune(p, now)
  if args[4] == "" then
    redis.call("HDEL", p .. "workers", id)
    redis.call("ZREM", p .. "wdrop", id)
    return "OK"
  end
  local ok, info = H.json_decode(args[4])
  if not ok or type(info) ~= "table" or #args[4] > W.INFO_MAX then
    return H.refuse(fn, "INFO must be a JSON object of at most " .. W.INFO_MAX .. " bytes", args[4])
  end
  if redis.call("HEXISTS", p .. "workers", id) == 0 and redis.call("HLEN", p .. "workers") >= W.MAX then
    return redis.error_reply(("EBUSY %s: queue has %d workers registered, the most kept"):format(fn, W.MAX))
  end
  info.id, info.seen, info.started = id, now, now - tonumber(args[5])
  info.lapse, info.drop, info.running = tonumber(args[2]), tonumber(args[3]), tonumber(args[6])
  local jobs = {}
  for i = 7, math.min(#args - 1, 6 + 2 * W.JOBS_MAX), 2 do
    jobs[#jobs + 1] = { id = args[i], since = now - (tonumber(args[i + 1]) or 0) }
  end
  info.jobs = #jobs > 0 and jobs or nil -- (Redis's cjson writes an empty table as {})
  redis.call("HSET", p .. "workers", id, cjson.encode(info))
  redis.call("ZADD", p .. "wdrop", now + info.drop, id)
  return "OK"
end

-- The queue's entries (JSON), at most MAX; none from a key another client
-- spoiled.
function W.entries(p)
  local entries = redis.pcall("HVALS", p .. "workers")
  if entries.err then return {} end
  for i = #entries, W.MAX + 1, -1 do entries[i] = nil end
  return entries
end

-- workers(p) -> { now, entry, ... }: the server's time (ms) and every entry
-- kept, as JSON; the reader tells lapsed and dropped ones by now.
function W.list(keys)
  local out = { H.now_ms() }
  for _, e in ipairs(W.entries(keys[1])) do out[#out + 1] = e end
  return out
end

-- live_workers(p) -> what the live workers (not lapsed) report: the jobs
-- their children run, summed; how many workers they are; and every worker
-- with an entry: id -> true when live, false when lapsed (their jobs are
-- theirs to report, not their jobs' "ran" flags).
function H.live_workers(p)
  local now = H.now_ms()
  local running, live, ids = 0, 0, {}
  for _, text in ipairs(W.entries(p)) do
    local ok, e = H.json_decode(text)
    if ok and type(e) == "table" and type(e.id) == "string" and tonumber(e.seen) and tonumber(e.lapse) then
      ids[e.id] = e.seen + e.lapse >= now
      if ids[e.id] then running, live = running + math.max(0, tonumber(e.running) or 0), live + 1 end
    end
  end
  return running, live, ids
end

F.beat, F.workers = W.beat, W.list
end
