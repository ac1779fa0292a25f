-- moonjob.redis.producer -- the producer's side of a durable queue on Redis.
--
--   local q = assert(moonjob.queue("redis://127.0.0.1:6379/0", "images"))
--   local job = assert(q:add({ file = "a.png" }, { attempts = 3 }))
--   print(job:wait())           -- the result, whichever host ran it
--
-- Every call is one FCALL of moonjob's function library (functions/*.lua);
-- add, get, cancel and counts block the caller for one round trip (the loop
-- keeps running: pools in the same program go on). job:wait() listens on the
-- queue's "done" channel for the job's id and looks at it once a second besides,
-- so a message lost while the connection was down costs a second at most.
--
-- Data and results cross as exact JSON (moonjob.codec.json): numbers keep every
-- digit, 64-bit integers stay integers. A backoff function cannot cross to
-- another host; give the worker pool a `backoff` option instead.
--
-- A handle holds its job's nonce (random, given to moonjob_add): its wait,
-- get and cancel answer only for that job, never for a later job that got
-- the same id (Redis lost its data and its id counter restarted, or the id
-- was reused): such a job is "no such job" (ENOTFOUND) to the handle.
local Backoff = require "moonjob.backoff"
local client = require "moonjob.redis.client"
local errors = require "moonjob.errors"
local json = require "moonjob.codec.json"
local loop = require "moonjob.loop"

local core = require "moonjob.core"
local Operate = require "moonjob.redis.operate"

local M = {}
local Queue = {}
Queue.__index = Queue
local Handle = {}
Handle.__index = Handle

local SECONDS_MAX = require("moonjob.pool.options").SECONDS_MAX

-- The key prefix of a queue: every key shares the hash tag {name}.
function M.prefix(name)
  return "mj:{" .. name .. "}:"
end

function M.check_name(name)
  if type(name) ~= "string" or name == "" or #name > 200 or name:find("[{}%c]") then
    return nil, "a queue name must be a non-empty string of at most 200 characters without { } or control characters"
  end
  return true
end

-- moonjob.queue(url, name [, opts]) -> queue | nil, err. Waits for the first
-- connection (opts.timeout, seconds, default 5). opts.max_payload: bytes of
-- JSON a job's data may take (default 1 MiB).
function M.new(url, name, opts)
  opts = opts or {}
  local ok, err = M.check_name(name)
  if not ok then return nil, err end
  local c
  c, err = client.new(url, { timeout_ms = (opts.timeout or 5) * 1000 })
  if not c then return nil, err end
  ok, err = c:wait_ready()
  if not ok then c:close(); return nil, err end
  return M.attach(c, name, opts.max_payload)
end

-- A queue handle on client c (moonjob.queue's own, or the dashboard's one
-- connection for every queue); closing it closes that client.
function M.attach(c, name, max_payload)
  return setmetatable({ client = c, name = name, prefix = M.prefix(name), max_payload = max_payload or 1024 * 1024,
    waiters = {}, listeners = {}, nonce_prefix = M.random_hex(8), nonces = 0 }, Queue)
end

-- The queue's name in the registry moonjob.queues() reads (best effort: a
-- user the ACL keeps to its own keys may not write it; docs/REDIS.md).
function M.register(c, name)
  c:call({ "SADD", Operate.REGISTRY, name }, function() end)
end

-- moonjob.queues(url [, opts]) -> { { name, counts... }, ... } sorted by
-- name | nil, err: the queues moonjob programs registered on the server
-- that hold any key (a name only connected to, or obliterated, is not
-- listed), each with its counts.
function M.queues(url, opts)
  local c, err = client.new(url, { timeout_ms = ((opts or {}).timeout or 5) * 1000 })
  if not c then return nil, err end
  local ok
  ok, err = c:wait_ready()
  if not ok then c:close(); return nil, err end
  local list
  list, err = M.list_queues(c)
  c:close()
  return list, err
end

-- The registered queues that exist, with their counts, on client c. A
-- queue whose counts cannot be read (a key another client spoiled) is
-- listed with its error (counts.error), never failing the whole list.
function M.list_queues(c)
  local names, err = c:call_wait({ "SMEMBERS", Operate.REGISTRY })
  if not names then return nil, M.reply_error(err) end
  table.sort(names)
  local out = {}
  for _, name in ipairs(names) do
    local counts, cerr = M.attach(c, name):counts()
    if not counts then
      out[#out + 1] = { name = name, error = cerr, waiting = 0, delayed = 0, active = 0, held = 0,
        completed = 0, failed = 0, missing = 0, paused = false }
    elseif counts.exists then
      counts.name = name
      out[#out + 1] = counts
    end
  end
  return out
end

-- queue:on(event, fn): "progress" fn(id, value) when a running job reports
-- progress on its worker, "log" fn(id, line) for each line it logs (what
-- it prints and job:log()). Heard while this program runs its loop; lines
-- sent while the connection was down are not heard again (q:job() reads them).
function Queue:on(event, fn)
  if event ~= "progress" and event ~= "log" then
    error(("queue:on(): unknown event '%s' (progress, log)"):format(tostring(event)), 2)
  end
  if type(fn) ~= "function" then error("queue:on(): the listener must be a function", 2) end
  self.listeners[event] = fn
  if self.updating then return end
  self.updating = true
  self.client:subscribe(self.prefix .. "updates", function(kind, message)
    if kind ~= "message" then return end
    local m = json.decode(message)
    if type(m) ~= "table" or m.id == nil then return end
    local name = m.log ~= nil and "log" or "progress"
    local listener = self.listeners[name]
    if listener then
      local ok, why = xpcall(listener, debug.traceback, m.id, m[name])
      if not ok then io.stderr:write("moonjob: error in a queue '", name, "' listener: ", tostring(why), "\n") end
    end
  end)
end

-- n random bytes as hex (the clock and pid, whole, when /dev/urandom is not
-- there). Also the worker's id (moonjob.redis.remote).
function M.random_hex(n)
  local f = io.open("/dev/urandom", "rb")
  local bytes = f and f:read(n) or tostring(loop.now()) .. tostring(core.getpid())
  if f then f:close() end
  return (bytes:gsub(".", function(ch) return ("%02x"):format(ch:byte()) end))
end

-- A nonce no other add gives: this queue object's random prefix and a count.
function Queue:_nonce()
  self.nonces = self.nonces + 1
  return self.nonce_prefix .. "." .. self.nonces
end

function Queue:__tostring()
  return ("moonjob queue %s on %s"):format(self.name, self.client.name)
end

local ADD_OPTIONS = { id = true, priority = true, delay = true, attempts = true, backoff = true,
  timeout = true, kill_after = true, name = true, dedupe = true, cache = true, max_queue = true,
  expire = true, debounce = true, group = true }

local function seconds(opts, k)
  local v = opts[k]
  if v == nil then return nil end
  if type(v) ~= "number" or v < 0 or v > SECONDS_MAX then
    error(("queue:add(): option '%s' must be a number of seconds (0 to %.0f)"):format(k, SECONDS_MAX), 4)
  end
  return v
end

-- A positive number of seconds option as whole ms (at least 1), or "".
-- (level: error's, from add_args's caller's caller)
local function ms_option(opts, name, v, level)
  v = v or opts[name]
  if v == nil then return "" end
  if type(v) ~= "number" or not (v > 0 and v <= SECONDS_MAX) then
    error(("queue:add(): option '%s' must be a number of seconds, more than 0"):format(name), level or 4)
  end
  return ("%.0f"):format(math.max(1, math.floor(v * 1000 + 0.5)))
end

-- debounce = { id = text, seconds = s } -> DEBOUNCE_ID, DEBOUNCE_MS ("" without).
local function debounce_args(opts, id)
  local d = opts.debounce
  if d == nil then return "", "" end
  if type(d) ~= "table" or type(d.id) ~= "string" or d.id == "" or #d.id > 1024 or type(d.seconds) ~= "number" then
    error("queue:add(): option 'debounce' must be { id = text (1 to 1024 bytes), seconds = s }", 4)
  end
  for k in pairs(d) do
    if k ~= "id" and k ~= "seconds" then error(("queue:add(): option 'debounce' takes id and seconds, not '%s'")
      :format(tostring(k)), 4) end
  end
  if id ~= nil or opts.delay ~= nil then
    error("queue:add(): option 'debounce' draws the job's id and sets its delay: options 'id', 'dedupe' and "
      .. "'delay' cannot go with it", 4)
  end
  return d.id, ms_option(opts, "debounce.seconds", d.seconds, 5)
end

-- The FCALL arguments of an add; raises on a bad option (a bug of the caller).
-- notify (default true): Redis says on the queue's "done" channel when the
-- job ends (job:wait() listens there); moonjob add, whose jobs nobody here
-- waits for, passes false. nonce: stored with a new job (see the header);
-- existing "join": a finished job still kept with the id is returned, not
-- replaced (a re-add of the same lines adds nothing twice).
function M.add_args(prefix, text, opts, notify, nonce, existing)
  opts = opts or {}
  if type(opts) ~= "table" then error("queue:add(): options must be a table", 3) end
  for k in pairs(opts) do
    if not ADD_OPTIONS[k] then
      error(("queue:add(): unknown option '%s' (known: attempts, backoff, cache, debounce, dedupe, delay, "
        .. "expire, group, id, kill_after, max_queue, name, priority, timeout)"):format(tostring(k)), 3)
    end
  end
  local id = opts.id
  if id ~= nil and type(id) ~= "string" and type(id) ~= "number" then
    error("queue:add(): option 'id' must be a string or a number", 3)
  end
  if id == nil and opts.dedupe ~= nil then
    if opts.dedupe == true then id = "\0dedupe"
    elseif type(opts.dedupe) == "string" then id = "d:" .. opts.dedupe
    elseif opts.dedupe ~= false then
      error("queue:add(): option 'dedupe' must be true (key = the data) or a string key", 3)
    end
  end
  local prio = opts.priority or 0
  if type(prio) ~= "number" or not (prio > -math.huge and prio < math.huge) then
    error("queue:add(): option 'priority' must be a finite number (lower runs first)", 3)
  end
  local attempts = opts.attempts or 1
  if type(attempts) ~= "number" or attempts < 1 or attempts > 2 ^ 31 or attempts % 1 ~= 0 then
    error("queue:add(): option 'attempts' must be a whole number, 1 or more", 3)
  end
  local backoff = ""
  if opts.backoff ~= nil then
    if type(opts.backoff) == "function" then
      error("queue:add(): a backoff function cannot cross to another host; give the worker "
        .. "pool a backoff option, or use { type = \"exponential\", delay = s }", 3)
    end
    local ok, why = Backoff.check(opts.backoff)
    if not ok then error("queue:add(): option 'backoff' " .. why, 3) end
    backoff = assert(json.encode(opts.backoff))
  end
  local name = opts.name
  if name ~= nil and type(name) ~= "string" then error("queue:add(): option 'name' must be a string", 3) end
  if (name and #name > 1024) or (id ~= nil and #tostring(id) > 1024) then
    error("queue:add(): options 'id' and 'name' take at most 1024 bytes", 3)
  end
  local max_queue = opts.max_queue or 0
  local debounce_id, debounce_ms = debounce_args(opts, id)
  local group = opts.group
  if group ~= nil and (type(group) ~= "string" or group == "" or #group > 1024) then
    error("queue:add(): option 'group' must be a name of 1 to 1024 bytes (a tenant, a customer)", 3)
  end
  return { "FCALL", "moonjob_add", 1, prefix, id ~= nil and tostring(id) or "", text, prio,
    math.floor((seconds(opts, "delay") or 0) * 1000), attempts, backoff,
    seconds(opts, "timeout") or 0, seconds(opts, "kill_after") or 0, name or "",
    seconds(opts, "cache") or 0, max_queue, notify == false and "0" or "1", nonce or "", existing or "",
    ms_option(opts, "expire"), debounce_id, debounce_ms, group or "" }
end

-- Encodes data for the queue: exact JSON, at most max_payload bytes.
function M.encode(data, max_payload)
  local text, err = json.encode(data)
  if not text then return nil, errors.new("EPAYLOAD", "the job data cannot be written as JSON: " .. err) end
  if #text > max_payload then
    return nil, errors.new("EPAYLOAD", ("the job data takes %d bytes of JSON, more than max_payload (%d)")
      :format(#text, max_payload))
  end
  return text
end

-- A server refusal "EQUEUEFULL message" becomes an error table.
local function reply_error(err)
  local code, message = tostring(err):match("^(E[A-Z]+):? (.*)$")
  if code then return errors.new(code, message) end
  return errors.new("EREDIS", tostring(err))
end
M.reply_error = reply_error

-- queue:add(data [, opts]) -> job | nil, err. opts as pool:add's (id, priority,
-- delay, attempts, backoff, timeout, kill_after, name, dedupe) and cache
-- (seconds the result is kept and returned to an add with the same id),
-- max_queue (refuse with EQUEUEFULL when that many jobs wait).
function Queue:add(data, opts)
  local text, err = M.encode(data, self.max_payload)
  if not text then return nil, err end
  local reply
  reply, err = self.client:call_wait(M.add_args(self.prefix, text, opts, true, self:_nonce()))
  if not reply then return nil, reply_error(err) end
  -- a job joined that was added before nonces existed has none: not checked
  local nonce = reply[4] ~= "" and reply[4] or nil
  return setmetatable({ id = reply[1], state = reply[2], joined = reply[3] == 1, nonce = nonce,
    queue = self }, Handle)
end

-- An id, or a handle (its id and nonce).
local function id_and_nonce(job)
  if getmetatable(job) == Handle then return job.id, job.nonce or "" end
  return tostring(job), ""
end

-- An error's JSON text (a job's `error` field) as an error object.
function M.decode_error(text)
  local t = text and json.decode(text)
  if type(t) ~= "table" then return errors.new("EREMOTE", tostring(text)) end
  return errors.wrap(t)
end

-- queue:get(id or job) -> { id, state, result, error, attempts, ... } | nil (not
-- kept; for a handle also: another job holds its id now), err
function Queue:get(job)
  local id, nonce = id_and_nonce(job)
  local f, err = self.client:call_wait({ "FCALL", "moonjob_get", 1, self.prefix, id, nonce })
  if err then return nil, reply_error(err) end
  if not f then return nil end
  local info = { id = tostring(id), state = f[1], attempts = tonumber(f[4]) or 0,
    max_attempts = tonumber(f[5]), name = f[6] ~= "" and f[6] or nil,
    created = tonumber(f[7]), started = tonumber(f[8]), finished = tonumber(f[9]) }
  if f[2] then info.result = json.decode(f[2]) end
  if f[3] then info.error = M.decode_error(f[3]) end
  return info
end

-- queue:cancel(id or job [, reason]) -> state it was in | nil, err. A running
-- job is interrupted on the host that runs it and fails with ECANCELED.
function Queue:cancel(job, reason)
  local id, nonce = id_and_nonce(job)
  local state, err = self.client:call_wait({ "FCALL", "moonjob_cancel", 1, self.prefix, id,
    reason and tostring(reason) or "canceled", nonce })
  if err then return nil, reply_error(err) end
  if state == "ENOTFOUND" then return nil, errors.new("ENOTFOUND", "no job " .. tostring(id) .. " in queue " .. self.name) end
  return state
end

-- queue:counts() -> { waiting, delayed, active, completed, failed, missing,
-- paused, held, exists } | nil, err. missing: jobs found gone from Redis
-- (evicted, deleted by hand); paused: true while the queue is paused; held:
-- active jobs whose worker has not said yet that they started (workers say
-- so within 200 ms of a start); exists: false when the queue has no key at
-- all and is not registered (a name never used, or obliterated; a queue a
-- worker waits on is registered).
function Queue:counts()
  local c, err = self.client:call_wait({ "FCALL", "moonjob_counts", 1, self.prefix })
  if not c then return nil, reply_error(err) end
  return { waiting = c[1], delayed = c[2], active = c[3], completed = c[4], failed = c[5],
    missing = c[6] or 0, paused = c[7] == 1, held = c[8] or 0, exists = c[9] ~= 0 }
end

-- Listening on the queue's "done" channel: one subscription per queue object.
function Queue:_listen()
  if self.listening then return end
  self.listening = true
  self.client:subscribe(self.prefix .. "done", function(kind, id)
    if kind == "resubscribed" then
      for _, w in pairs(self.waiters) do w.check = true end
      return
    end
    local w = id and self.waiters[id]
    if w then w.check = true end
  end)
end

-- job:wait([timeout]) -> result | nil, err (ETIMEDOUT when timeout seconds pass).
function Handle:wait(timeout)
  local q = self.queue
  q:_listen()
  local w = q.waiters[self.id] or { check = true }
  q.waiters[self.id] = w
  local deadline = timeout and loop.now() + timeout * 1000
  local info, err
  local next_look = 0
  local ticker = require("moonjob.core").timer(function() w.check = true end)
  ticker:start(1000, 1000)
  local ok, raised = pcall(loop.wait_until, function()
    if w.check and loop.now() >= next_look then
      w.check, next_look = false, loop.now() + 1
      info, err = q:get(self)
      if err or not info or info.state == "completed" or info.state == "failed" then return true end
    end
    return deadline ~= nil and loop.now() >= deadline
  end)
  ticker:close()
  q.waiters[self.id] = nil
  if not ok then error(raised, 0) end
  if err then return nil, err end
  if not info then
    return nil, errors.new("ENOTFOUND", ("job %s is not in queue %s: no longer kept (retention), or lost "
      .. "by Redis (a restart without persistence, a failover) and its id may be another job's now")
      :format(self.id, q.name))
  end
  self.state = info.state
  if info.state == "completed" then return info.result end
  if info.state == "failed" then return nil, info.error end
  return nil, errors.new("ETIMEDOUT", ("job %s did not finish within %g s"):format(self.id, timeout))
end

function Handle:get() return self.queue:get(self) end
function Handle:cancel(reason) return self.queue:cancel(self, reason) end

function Queue:close()
  self.client:close()
end

Operate.extend(Queue, M)
require("moonjob.redis.schedules").extend(Queue, M)
require("moonjob.redis.limits").extend(Queue)

return M
