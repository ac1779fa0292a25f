-- moonjob.dashboard.api -- the JSON API the dashboard's page polls and
-- posts to (docs/guide/dashboard.md lists it). Each handler runs in a
-- loop.async task (moonjob.dashboard), so the queue methods of
-- moonjob.redis.operate it calls yield to the loop while Redis answers.
--
--   GET  /api/queues                         every queue, counts, a 30-minute sparkline
--   GET  /api/queues/NAME                    counts, the last hour's metrics, limits, groups held back, schedules
--   GET  /api/queues/NAME/jobs?state=&offset=&limit=   a page of jobs (previews)
--   GET  /api/queues/NAME/jobs/ID            one job, whole, with its log (a flow's: its
--                                            parent with its state, its children)
--   GET  /api/workers[?queue=NAME]           the workers of every queue (or of NAME), as
--                                            their heartbeats say (q:workers rows, with queue)
--   POST /api/queues/NAME/pause | resume | retry-all | clean
--   POST /api/queues/NAME/limits {"rate":{"max","per"},"concurrency","group_rate","group_concurrency"}
--                                            each given is set, each null lifted, others kept
--   POST /api/queues/NAME/obliterate {"force":true}   the queue removed (EBUSY while jobs run)
--   POST /api/queues/NAME/jobs/ID/retry | remove | promote | cancel
--                                            (remove {"cascade":true}: a flow's child
--                                            its parent waits for, too)
--
-- NAME and ID are percent-encoded path segments ("{shop}/images" is
-- %7Bshop%7D%2Fimages): each segment is decoded after the path is split.
--
-- Errors are {"error":{"code","message"}} with a status that says the kind:
-- 400 bad input, 404 no such queue or job, 409 a job in another state or a
-- busy queue, 502 Redis failed.
local json = require "moonjob.codec.json"
local fcall = require "moonjob.redis.fcall"
local names = require "moonjob.redis.names"
local producer = require "moonjob.redis.producer"
local Operate = require "moonjob.redis.operate"
local limits = require "moonjob.redis.limits"

local Api = {}
Api.__index = Api

local M = {}

local SPARK_MINUTES, CHART_MINUTES, PREVIEW = 30, 60, 300
local STATUS = { ENOTFOUND = 404, ENOQUEUE = 404, ESTATE = 409, EBUSY = 409, EINPUT = 400, ERANGE = 400 }

function M.new(c)
  return setmetatable({ client = c }, Api)
end

local function array(t) return setmetatable(t, json.array_mt) end

local function decode_uri(s)
  return (s:gsub("%%(%x%x)", function(h) return string.char(tonumber(h, 16)) end))
end

-- The value of name in a query string (a=1&b=2), decoded, or nil.
function M.query_arg(query, name)
  for pair in (query or ""):gmatch("[^&]+") do
    local k, v = pair:match("^([^=]*)=?(.*)$")
    if decode_uri((k:gsub("%+", " "))) == name then return decode_uri((v:gsub("%+", " "))) end
  end
end
local query_arg = M.query_arg

-- The path after /api/ as decoded segments.
local function segments(path)
  local out = {}
  for s in path:sub(6):gmatch("[^/]+") do out[#out + 1] = decode_uri(s) end
  return out
end

local function reply(server, req, status, t)
  server:respond(req, status, Operate.encode(t))
end

-- An error's message as a page may see it: without the Redis URL.
local function public(server, message)
  return server.client:without_address(message)
end

local function fail(server, req, err)
  local code = type(err) == "table" and err.code or "EINTERNAL"
  reply(server, req, STATUS[code] or 502, { error = { code = code,
    message = public(server, type(err) == "table" and err.message or err) } })
end

local function counts_of(c)
  return { waiting = c.waiting, delayed = c.delayed, active = c.active, held = c.held, running = c.running,
    lapsed = c.lapsed,
    completed = c.completed, failed = c.failed, completed_ever = c.completed_ever, failed_ever = c.failed_ever,
    paused = c.paused, missing = c.missing, waiting_children = c.waiting_children or 0, workers = c.workers }
end

local function minute_row(row)
  return { at = row.at, completed = row.completed, failed = row.failed, runs = row.runs,
    mean_ms = row.mean_ms, p50_ms = row.p50_ms, p90_ms = row.p90_ms, p99_ms = row.p99_ms,
    p50_bound = row.p50_bound, p90_bound = row.p90_bound, p99_bound = row.p99_bound }
end

local job_out = Operate.record -- (a job's log is an array already: q:job)

local SCHEDULES_SHOWN, HELD_GROUPS_SHOWN = 50, 50

-- A schedule as the page shows it (its data and options stay in Redis).
local function schedule_out(sc)
  return { id = sc.id, cron = sc.cron, every = sc.every, tz_offset = sc.tz_offset, tz = sc.tz, next = sc.next,
    last = sc.last, last_id = sc.last_id, runs = sc.runs, limit = sc.limit, note = sc.note, ended = sc.ended }
end

-- The groups of q with waiting jobs: { ready, held_back, held = the first
-- HELD_GROUPS_SHOWN held back (q:groups' rows) }, or nil and an error.
local function groups_out(q, counts)
  local held, err = q:held_groups(counts, HELD_GROUPS_SHOWN)
  if not held then return nil, err end
  return { ready = counts.ready, held_back = counts.held_back, held = held }
end

function Api:queue(name)
  if not names.check_name(name) then return nil end
  return producer.attach(self.client, name)
end

function Api:queues(server, req)
  local list, err = producer.list_queues(self.client)
  if not list then return fail(server, req, err) end
  local out = {}
  for _, c in ipairs(list) do
    local row = counts_of(c)
    row.name = c.name
    if c.error then row.error = { code = c.error.code, message = public(server, c.error.message) } end
    local m = not c.error and producer.attach(self.client, c.name):metrics({ minutes = SPARK_MINUTES })
    local spark = {}
    for i, minute in ipairs(m and m.minutes or {}) do spark[i] = minute.completed end
    row.spark = array(spark)
    out[#out + 1] = row
  end
  reply(server, req, 200, { queues = array(out) })
end

function Api:overview(server, req, q)
  local c, err = q:counts()
  if not c then return fail(server, req, err) end
  if not c.exists then return fail(server, req, fcall.no_queue(q)) end
  local m
  m, err = q:metrics({ minutes = CHART_MINUTES })
  if not m then return fail(server, req, err) end
  local minutes = {}
  for i, row in ipairs(m.minutes) do minutes[i] = minute_row(row) end
  local limits, schedules, total
  limits, err = q:limits()
  if not limits then return fail(server, req, err) end
  local groups
  groups, err = groups_out(q, limits.groups)
  if not groups then return fail(server, req, err) end
  schedules, total = q:schedules({ limit = SCHEDULES_SHOWN })
  if not schedules then return fail(server, req, total) end
  for i, sc in ipairs(schedules) do schedules[i] = schedule_out(sc) end
  reply(server, req, 200, { name = q.name, counts = counts_of(c),
    metrics = { minutes = array(minutes), total = minute_row(m.total) },
    limits = { rate = limits.rate, concurrency = limits.concurrency, held_back = limits.held_back,
      started = limits.started, group_rate = limits.group_rate, group_concurrency = limits.group_concurrency },
    groups = groups, schedules = { total = total, list = array(schedules) } })
end

function Api:jobs(server, req, q)
  local offset = tonumber(query_arg(req.query, "offset") or "0")
  local limit = tonumber(query_arg(req.query, "limit") or "20")
  if not offset or offset < 0 or offset > 2 ^ 53 or offset % 1 ~= 0 or not limit or limit < 1 or limit > 1000
      or limit % 1 ~= 0 then
    return fail(server, req, { code = "EINPUT", message = "offset must be a whole number, 0 or more, and limit one from 1 to 1000" })
  end
  local jobs, total = q:jobs(query_arg(req.query, "state") or "waiting",
    { offset = offset, limit = limit, preview = PREVIEW })
  if not jobs then return fail(server, req, total) end
  local out = {}
  for i, job in ipairs(jobs) do out[i] = job_out(job) end
  reply(server, req, 200, { total = total, jobs = array(out) })
end

function Api:job(server, req, q, id)
  local job, err = q:job(id)
  if not job then return fail(server, req, err) end
  reply(server, req, 200, job_out(Operate.parent_state(q, job)))
end

local QUEUE_ACTIONS = {
  pause = function(q) return q:pause() end,
  resume = function(q) return q:resume() end,
  ["retry-all"] = function(q, body) return q:retry_all({ state = body.state or "failed" }) end,
  clean = function(q, body)
    if type(body.older_than) ~= "number" and body.older_than ~= nil then
      return nil, { code = "EINPUT", message = "older_than must be a number of seconds" }
    end
    return q:clean(body.state, { older_than = body.older_than or 0 })
  end,
}

-- The limits a POST .../limits sets: each one its body names (null: lifted),
-- all checked before any is written.
local LIMIT_KINDS = { "rate", "concurrency", "group_rate", "group_concurrency" }

function QUEUE_ACTIONS.limits(q, body)
  local set = {}
  for _, kind in ipairs(LIMIT_KINDS) do
    local v = body[kind]
    if v ~= nil then
      if v == json.null then v = nil end
      local ok, why = pcall(limits.check[kind], v, "set_" .. kind)
      if not ok then
        return nil, { code = "EINPUT", message = kind .. ": " .. tostring(why):gsub("^[^:]*:%d+: ", "")
          :gsub("^queue:set_[%a_]+%(%): ", "") }
      end
      set[#set + 1] = { kind, v }
    end
  end
  if #set == 0 then
    return nil, { code = "EINPUT", message = "name at least one of rate, concurrency, group_rate, group_concurrency" }
  end
  for _, one in ipairs(set) do
    local ok, err = q["set_" .. one[1]](q, one[2])
    if not ok then return nil, err end
  end
  return true
end

function QUEUE_ACTIONS.obliterate(q, body)
  if body.force ~= nil and type(body.force) ~= "boolean" then
    return nil, { code = "EINPUT", message = "force must be true or false" }
  end
  return q:obliterate({ force = body.force or nil })
end

local JOB_ACTIONS = {
  retry = function(q, id) return q:retry(id) end,
  remove = function(q, id, body)
    if body.cascade ~= nil and type(body.cascade) ~= "boolean" then
      return nil, { code = "EINPUT", message = "cascade must be true or false" }
    end
    return q:remove(id, body.cascade and { cascade = true } or nil)
  end,
  promote = function(q, id) return q:promote(id) end,
  cancel = function(q, id) return q:cancel(id, "canceled from the dashboard") end,
}

function Api:act(server, req, q, action, id)
  local body = {}
  if req.body and req.body ~= "" then
    body = json.decode(req.body)
    if type(body) ~= "table" then return fail(server, req, { code = "EINPUT", message = "the body must be a JSON object" }) end
  end
  local c = q:counts()
  if c and not c.exists then return fail(server, req, fcall.no_queue(q)) end
  local ok, result, err
  if id then
    ok, result, err = pcall(JOB_ACTIONS[action], q, id, body)
  else
    ok, result, err = pcall(QUEUE_ACTIONS[action], q, body)
  end
  if not ok then return fail(server, req, { code = "EINPUT", message = tostring(result):gsub("^[^:]*:%d+: ", "") }) end
  if result == nil then return fail(server, req, err) end
  if id then return reply(server, req, 200, { ok = true, was = result }) end
  reply(server, req, 200, { ok = true, count = type(result) == "number" and result or nil })
end

local function worker_out(w)
  local jobs = {}
  for i, j in ipairs(w.jobs) do jobs[i] = { id = j.id, since = j.since } end
  return { id = w.id, queue = w.queue, host = w.host, pid = w.pid, version = w.version,
    queues = array(w.queues or {}), children = w.children, running = w.running, jobs = array(jobs),
    started = w.started, seen = w.seen, ago = w.ago, lapsed = w.lapsed }
end

function Api:workers(server, req)
  local name = query_arg(req.query, "queue")
  if name and not names.check_name(name) then return fail(server, req, { code = "EINPUT", message = "not a queue name" }) end
  local list, err = producer.list_workers(self.client, name)
  if not list then return fail(server, req, err) end
  for i, w in ipairs(list) do list[i] = worker_out(w) end
  reply(server, req, 200, { workers = array(list) })
end

-- Routes a request under /api/.
function Api:handle(server, req)
  local s = segments(req.path)
  if s[1] == "workers" and #s == 1 and req.method == "GET" then return self:workers(server, req) end
  if s[1] ~= "queues" then return fail(server, req, { code = "ENOTFOUND", message = "no such API path" }) end
  if #s == 1 and req.method == "GET" then return self:queues(server, req) end
  local q = s[2] and self:queue(s[2])
  if not q then return fail(server, req, { code = "EINPUT", message = "not a queue name" }) end
  if req.method == "GET" then
    if #s == 2 then return self:overview(server, req, q) end
    if #s == 3 and s[3] == "jobs" then return self:jobs(server, req, q) end
    if #s == 4 and s[3] == "jobs" then return self:job(server, req, q, s[4]) end
  elseif req.method == "POST" then
    if #s == 3 and QUEUE_ACTIONS[s[3]] then return self:act(server, req, q, s[3]) end
    if #s == 5 and s[3] == "jobs" and JOB_ACTIONS[s[5]] then return self:act(server, req, q, s[5], s[4]) end
  end
  fail(server, req, { code = "ENOTFOUND", message = ("no API for %s %s"):format(req.method, req.path) })
end

return M
