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
--
-- The queue class is declared here, once, with every method: those of this
-- file (add, on, close) and those it takes from moonjob.redis.queue_calls
-- (get, cancel, counts, exists: the pure-Lua moonjob.producer's too),
-- moonjob.redis.operate (jobs, retry, clean, pause, metrics...),
-- moonjob.redis.schedules and moonjob.redis.limits, plain functions of the
-- queue. Their calls of the function library go through
-- moonjob.redis.fcall; a job's handle is moonjob.redis.handle's.
local add = require "moonjob.redis.add"
local client = require "moonjob.redis.client"
local fcall = require "moonjob.redis.fcall"
local flow = require "moonjob.redis.flow"
local handle = require "moonjob.redis.handle"
local loop = require "moonjob.loop"
local json = require "moonjob.codec.json"
local ledger = require "moonjob.redis.ledger"
local limits = require "moonjob.redis.limits"
local names = require "moonjob.redis.names"
local operate = require "moonjob.redis.operate"
local queue_calls = require "moonjob.redis.queue_calls"
local schedules = require "moonjob.redis.schedules"

local M = {}
local Queue = {}
Queue.__index = Queue

local reply_error = fcall.reply_error

-- moonjob.queue(url, name [, opts]) -> queue | nil, err. Waits for the first
-- connection (opts.timeout, seconds, default 5). opts.max_payload: bytes of
-- JSON a job's data may take (default 1 MiB). opts.resolve: seconds an add
-- whose reply was lost is sent again for (moonjob.redis.ledger; default and
-- most names.RESOLVE_MAX, 0: none, the add is then "unknown" at once).
function M.new(url, name, opts)
  opts = opts or {}
  local resolve = opts.resolve or names.RESOLVE_MAX
  if type(resolve) ~= "number" or not (resolve >= 0 and resolve <= names.RESOLVE_MAX) then
    error(("moonjob.queue(): option 'resolve' must be a number of seconds from 0 to %d"):format(names.RESOLVE_MAX), 2)
  end
  local ok, err = names.check_name(name)
  if not ok then return nil, err end
  local c
  c, err = client.new(url, { timeout_ms = (opts.timeout or 5) * 1000, key = names.prefix(name) })
  if not c then return nil, err end
  ok, err = c:wait_ready()
  if not ok then c:close(); return nil, err end
  local q = M.attach(c, name, opts.max_payload)
  q.resolve_ms = resolve * 1000
  return q
end

-- A queue handle on client c (moonjob.queue's own, or the dashboard's one
-- connection for every queue); closing it closes that client. Its random
-- text makes its nonces and names its adds (moonjob.redis.ledger).
function M.attach(c, name, max_payload)
  local random = names.random_hex(8)
  return setmetatable({ client = c, name = name, prefix = names.prefix(name), max_payload = max_payload or 1024 * 1024,
    waiters = {}, listeners = {}, nonce_prefix = random, nonces = 0, ledger = ledger.new(random),
    resolve_ms = names.RESOLVE_MAX * 1000, json = json }, Queue)
end

-- fn(c, ...) on a connection of its own to url, closed after it
-- (opts.timeout: seconds to connect, 5) -> what fn returns | nil, err.
local function on_own_connection(url, opts, fn, ...)
  local c, err = client.new(url, { timeout_ms = ((opts or {}).timeout or 5) * 1000 })
  if not c then return nil, err end
  local ok
  ok, err = c:wait_ready()
  if not ok then c:close(); return nil, err end
  local list
  list, err = fn(c, ...)
  c:close()
  return list, err
end

-- moonjob.queues(url [, opts]) -> { { name, counts... }, ... } sorted by
-- name | nil, err: the queues moonjob programs registered on the server
-- that hold any key (a name only connected to, or obliterated, is not
-- listed), each with its counts.
function M.queues(url, opts)
  return on_own_connection(url, opts, M.list_queues)
end

-- moonjob.redis.producer.workers(url [, name [, opts]]) -> list | nil, err:
-- list_workers on a connection of its own (opts.timeout: seconds, 5).
function M.workers(url, name, opts)
  return on_own_connection(url, opts, M.list_workers, name)
end

-- Every registered queue's moonjob_counts reply, the calls all sent at
-- once (a cluster's shards answer together; one down answers at once:
-- no_wait) -> { { reply, err, kind }, ... } in list's order.
local function all_counts(c, list)
  local got, left = {}, #list
  loop.await(function(done)
    if left == 0 then return done() end
    for i, name in ipairs(list) do
      c:call({ "FCALL", "moonjob_counts", 1, names.prefix(name), no_wait = true }, function(v, e, kind)
        got[i], left = { v, e, kind }, left - 1
        if left == 0 then done() end
      end)
    end
  end)
  return got
end

-- The registered queues that exist, with their counts, on client c. A
-- queue whose counts cannot be read (a key another client spoiled; its
-- shard unreachable: unreachable = true) is listed with its error
-- (counts.error) and zeros, never failing the whole list.
function M.list_queues(c)
  local list, err = c:call_wait({ "SMEMBERS", names.REGISTRY })
  if not list then return nil, reply_error(err) end
  table.sort(list)
  local out = {}
  for i, r in ipairs(all_counts(c, list)) do
    local name = list[i]
    if not r[1] then
      out[#out + 1] = { name = name, error = reply_error(r[2]), unreachable = r[3] == "connection" or nil,
        waiting = 0, delayed = 0, active = 0, held = 0, lapsed = 0, running = 0, completed = 0, failed = 0,
        completed_ever = 0, failed_ever = 0, workers = 0, missing = 0, paused = false }
    else
      local counts = queue_calls.read_counts(r[1])
      if counts.exists or c.cluster then -- (a cluster's library cannot read the registry: listed is registered)
        counts.name = name
        out[#out + 1] = counts
      end
    end
  end
  return out
end

-- The workers of queue `name` (every registered queue's when nil) on
-- client c, as q:workers gives them, each with its queue's name (queue):
-- by queue, then oldest first. -> list | nil, err.
function M.list_workers(c, name)
  local list, err = { name }, nil
  if not name then
    list, err = c:call_wait({ "SMEMBERS", names.REGISTRY })
    if not list then return nil, reply_error(err) end
    table.sort(list)
  end
  local out = {}
  for _, queue in ipairs(list) do
    local rows, werr = M.attach(c, queue):workers()
    if not rows then return nil, werr end
    for _, row in ipairs(rows) do
      row.queue = queue
      out[#out + 1] = row
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
  -- (a channel is the server's, not a database's: the library publishes
  -- on the one of the database the job's worker fetched it from)
  self.client:subscribe(self.prefix .. "updates@" .. self.client.target.db, function(kind, message)
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

-- A nonce no other add gives (moonjob.redis.queue_calls).
Queue._nonce = queue_calls.nonce

function Queue:__tostring()
  return ("moonjob queue %s on %s"):format(self.name, self.client.name)
end

-- queue:add(data [, opts]) -> job | nil, err. opts as pool:add's (id, priority,
-- delay, attempts, backoff, timeout, kill_after, name, dedupe) and cache
-- (seconds the result is kept and returned to an add with the same id),
-- max_queue (refuse with EQUEUEFULL when that many jobs wait). A reply lost
-- (Redis stalled, the link dropped) is asked for again for up to the
-- queue's `resolve` seconds; past them the error says the job may or may
-- not have been added.
function Queue:add(data, opts)
  local text, err = add.encode(data, self.max_payload)
  if not text then return nil, err end
  local args = add.args(self.prefix, text, opts, true, self:_nonce())
  local reply, unknown
  reply, err, unknown = loop.await(function(cb)
    ledger.send(self.client, self.ledger, args, self.resolve_ms, function(r, e, _, u) cb(r, e, u) end)
  end)
  if not reply then return nil, add.send_error(err, unknown, self.resolve_ms) end
  return handle.new(self, reply)
end

-- queue:add_bulk(list [, opts]) -> jobs | nil, err, or jobs, err when some
-- adds were refused (jobs[i] false for those; err.errors[i] says why), as
-- moonjob.producer's: every job checked before any is sent, then up to 500
-- jobs per moonjob_add_bulk call, the calls pipelined, each named by the
-- ledger (a lost reply is asked for again, as q:add's). opts: as q:add's,
-- the same for every job (no id, dedupe key or debounce).
function Queue:add_bulk(list, opts)
  if type(list) ~= "table" then error("queue:add_bulk(): its first argument must be a list of data", 2) end
  local refusal = add.bulk_refusal(opts)
  if refusal then error(refusal, 2) end
  local texts, err = add.encode_all(list, self.max_payload)
  if not texts then return nil, err end
  local calls, tally = add.bulk_calls(add.args(self.prefix, "{}", opts, true, ""), texts), add.bulk_tally(#texts)
  local left = #calls
  for _, call in ipairs(calls) do
    ledger.send(self.client, self.ledger, call.args, self.resolve_ms, function(rows, e, _, unknown)
      tally:take(call, rows, function(row) return handle.new(self, row) end, function(row)
        return row and reply_error(row) or add.send_error(e, unknown, self.resolve_ms)
      end)
      left = left - 1
    end)
  end
  loop.wait_until(function() return left == 0 end)
  return tally:result()
end

-- queue:add_flow(tree) -> the root's job | nil, err: a tree of jobs added
-- whole in one call (moonjob.redis.flow says the tree's form), or nothing
-- of it when any part is refused (EINPUT, EPAYLOAD naming the part; EEXISTS
-- when an id given is kept already). Each job's handle has .children, the
-- handles of its children in the tree's order (a child on another queue of
-- the tag: a handle of that queue, on this queue's connection). A parent
-- runs once each child has ended (docs/guide/flows.md).
function Queue:add_flow(tree)
  local args, nodes = flow.args(tree, self.name, { max_payload = self.max_payload,
    nonce = function() return self:_nonce() end })
  if not args then return nil, nodes end
  local reply, err = self.client:call_wait(args)
  if not reply then return nil, reply_error(err) end
  return flow.handles(nodes, reply, function(name) return self:_sibling(name) end, handle.new)
end

-- This queue, or another on its connection (a flow's child's or parent's).
function Queue:_sibling(name)
  if name == self.name then return self end
  self.siblings = self.siblings or {}
  local q = self.siblings[name] or M.attach(self.client, name, self.max_payload)
  self.siblings[name] = q
  return q
end

function Queue:close()
  self.client:close()
end

-- One job, and the counts (moonjob.redis.queue_calls): q:get(id or job),
-- q:cancel(id or job [, reason]), q:counts(), q:workers(), q:exists(), q:children(id or job).
Queue.get = queue_calls.get
Queue.cancel = queue_calls.cancel
Queue.counts = queue_calls.counts
Queue.workers = queue_calls.workers
Queue.exists = queue_calls.exists
Queue.children = queue_calls.children

-- Seeing and acting on jobs (moonjob.redis.operate): q:jobs(state [, opts]),
-- q:job(id [, opts]), q:retry(id), q:remove(id), q:promote(id),
-- q:retry_all([opts]), q:clean(state [, opts]), q:drain([opts]),
-- q:obliterate([opts]), q:pause(), q:resume(), q:metrics([opts]).
Queue.jobs = operate.jobs
Queue.job = operate.job
Queue.retry = operate.retry
Queue.remove = operate.remove
Queue.promote = operate.promote
Queue.retry_all = operate.retry_all
Queue.clean = operate.clean
Queue.drain = operate.drain
Queue.obliterate = operate.obliterate
Queue.pause = operate.pause
Queue.resume = operate.resume
Queue.metrics = operate.metrics

-- Repeating jobs (moonjob.redis.schedules): q:schedule(id, when [, data
-- [, opts]]), q:unschedule(id), q:schedules([opts]).
Queue.schedule = schedules.schedule
Queue.unschedule = schedules.unschedule
Queue.schedules = schedules.schedules

-- Limits across workers (moonjob.redis.limits): q:set_rate(rate),
-- q:set_concurrency(n), q:set_group_rate(rate), q:set_group_concurrency(n),
-- q:limits(), q:groups([opts]), q:held_groups(counts, limit).
Queue.set_rate = limits.set_rate
Queue.set_concurrency = limits.set_concurrency
Queue.set_group_rate = limits.set_group_rate
Queue.set_group_concurrency = limits.set_group_concurrency
Queue.limits = limits.limits
Queue.groups = limits.groups
Queue.held_groups = limits.held_groups

return M
