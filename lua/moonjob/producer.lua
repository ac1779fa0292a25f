-- moonjob.producer -- adds jobs to moonjob's Redis queues from any Lua: a
-- pure-Lua producer (no C, no FFI, no moonjob.core) for OpenResty and plain
-- Lua 5.1 to 5.4 or LuaJIT, over a Redis client the app already has.
--
--   local producer = require "moonjob.producer"
--   local q = assert(producer.queue(red, "images"))      -- red: connected
--   local job, err = q:add({ file = "a.png" }, { attempts = 3 })
--
-- The client (moonjob.producer.clients): an OpenResty object (nginx.redis,
-- resty.redis), a redis-lua client, any object with call(self, argv), or
-- connection options ({ host, port, db, user, password, timeout }: the
-- producer opens a connection of its own, and q:close() closes it). Calls
-- block the caller (a cosocket yields to nginx) for their round trips.
--
-- The same Redis calls and arguments as moonjob.queue: options checked by
-- moonjob.redis.add, get/cancel/counts from moonjob.redis.queue_calls,
-- schedules from moonjob.redis.schedules, the library made sure of by
-- moonjob.redis.setup (moonjob.producer.link). Unlike moonjob.queue, which
-- raises on a bad argument, every method answers nil, err (an error of
-- moonjob.errors: EINPUT for bad input, the codes of moonjob.queue for the
-- rest, ECONNECT when the link to Redis fails), so that a request handler
-- never dies of it. JSON: moonjob.producer.codec. docs/guide/producer.md.
local add = require "moonjob.redis.add"
local clients = require "moonjob.producer.clients"
local codec = require "moonjob.producer.codec"
local errors = require "moonjob.errors"
local fcall = require "moonjob.redis.fcall"
local flow = require "moonjob.redis.flow"
local link = require "moonjob.producer.link"
local names = require "moonjob.redis.names"
local queue_calls = require "moonjob.redis.queue_calls"
local schedules = require "moonjob.redis.schedules"

local M = {}
local Queue = {}
Queue.__index = Queue
local Job = {}
Job.__index = Job

local unpack = table.unpack or unpack -- (Lua 5.1, LuaJIT: unpack)
local reply_error = fcall.reply_error

local function input_error(message) return nil, errors.new("EINPUT", message) end

-- Runs fn(...), which raises on a mistake of the caller ("queue:add(): ..."):
-- such a mistake is nil, EINPUT; anything else is raised again.
local function pack(...) return { n = select("#", ...), ... } end

local function checked(fn, ...)
  local r = pack(pcall(fn, ...))
  if r[1] then return unpack(r, 2, r.n) end
  local message = type(r[2]) == "string" and r[2]:gsub("^[^\n]-:%d+: ", "")
  if message and message:match("^queue:") then return input_error(message) end
  error(r[2], 0)
end

local QUEUE_OPTIONS = { json = true, max_payload = true, server = true, db = true }
local CONNECT_OPTIONS = { host = true, port = true, db = true, user = true, password = true, timeout = true }

-- Connection options -> { host, port, db, user, password, timeout } | nil, why.
local function connect_options(c)
  for k in pairs(c) do
    if not CONNECT_OPTIONS[k] then
      return nil, ("unknown connection option '%s' (host, port, db, user, password, timeout)"):format(tostring(k))
    end
  end
  local o = { host = c.host or "127.0.0.1", port = c.port or 6379, db = c.db or 0, user = c.user,
    password = c.password, timeout = c.timeout or 1000 }
  if type(o.host) ~= "string" or o.host == "" then return nil, "option 'host' must be a host name or address" end
  if type(o.port) ~= "number" or o.port % 1 ~= 0 or o.port < 1 or o.port > 65535 then
    return nil, "option 'port' must be a port number (1 to 65535)"
  end
  if type(o.timeout) ~= "number" or not (o.timeout > 0) then return nil, "option 'timeout' must be ms, more than 0" end
  if (o.user ~= nil and type(o.user) ~= "string") or (o.password ~= nil and type(o.password) ~= "string") then
    return nil, "options 'user' and 'password' must be strings"
  end
  return o
end

-- The link to Redis for queue(): the client the app gave, or a connection
-- opened as c says -> link | nil, err.
local function make_link(c, opts)
  local db = opts.db or 0
  if type(db) ~= "number" or db < 0 or db % 1 ~= 0 then return input_error("option 'db' must be a database number") end
  local a = clients.wrap(c)
  if a then return link.new(a, opts.server or "client", "Redis (the client given)", db) end
  if type(c) ~= "table" then
    return input_error("producer.queue(): its first argument must be a Redis client (nginx.redis, resty.redis, "
      .. "redis-lua, or an object with call(self, argv)) or connection options { host, port, ... }")
  end
  local o, why = connect_options(c)
  if not o then return input_error(why) end
  local name = ("Redis at %s:%d"):format(o.host, o.port)
  local err
  a, err = clients.open(o)
  if not a then return nil, errors.new("ECONNECT", ("%s: %s"):format(name, tostring(err))) end
  return link.new(a, opts.server or ("%s:%d"):format(o.host, o.port), name, o.db)
end

-- A queue object on link l.
local function new_queue(l, name, max_payload, json)
  return setmetatable({ client = l, name = name, prefix = names.prefix(name), max_payload = max_payload,
    json = json, nonce_prefix = names.random_hex(8), nonces = 0 }, Queue)
end

-- producer.queue(client, name [, opts]) -> queue | nil, err. opts: json (a
-- codec: encode, decode), max_payload (bytes of a job's JSON, default 1
-- MiB), server (a name for the server of a client given: the library is
-- checked once per server name in a Lua VM; default "client"), db (the
-- database a given client is on, where the library's guard is kept: 0).
function M.queue(client, name, opts)
  opts = opts or {}
  if type(opts) ~= "table" then return input_error("producer.queue(): options must be a table") end
  for k in pairs(opts) do
    if not QUEUE_OPTIONS[k] then
      return input_error(("producer.queue(): unknown option '%s' (db, json, max_payload, server)"):format(tostring(k)))
    end
  end
  local ok, why = names.check_name(name)
  if not ok then return input_error(why) end
  local max_payload = opts.max_payload or 1024 * 1024
  if type(max_payload) ~= "number" or not (max_payload > 0) then
    return input_error("option 'max_payload' must be a number of bytes, more than 0")
  end
  local json
  json, why = codec.choose(opts.json)
  if not json then return input_error(why) end
  local l, err = make_link(client, opts)
  if not l then return nil, err end
  return new_queue(l, name, max_payload, json)
end

function Queue:__tostring()
  return ("moonjob producer queue %s on %s"):format(self.name, self.client.name)
end

-- A nonce no other add gives (moonjob.redis.queue_calls).
Queue._nonce = queue_calls.nonce

-- The job moonjob_add answered { id, state, joined, nonce }.
local function new_job(q, reply)
  return setmetatable({ id = reply[1], state = reply[2], joined = reply[3] == 1,
    nonce = reply[4] ~= "" and reply[4] or nil, queue = q }, Job)
end

-- An add's error: a link that failed once the call may have been sent
-- leaves it unknown whether the job was added (unsent: it was not sent).
local function add_error(err, unsent)
  local e = reply_error(err)
  if e.code == "ECONNECT" and not unsent then
    e.message = e.message .. "; the job may or may not have been added (an add with an id may be sent again: "
      .. "it joins the job the first one added)"
  end
  return e
end

-- moonjob_add's arguments for data and opts -> args | nil, err.
function Queue:_add_args(data, opts)
  local text, err = add.encode(data, self.max_payload, self.json)
  if not text then return nil, err end
  return checked(add.args, self.prefix, text, opts, true, self:_nonce(), nil, self.json)
end

-- q:add(data [, opts]) -> job | nil, err. opts as moonjob.queue's q:add.
function Queue:add(data, opts)
  local args, err = self:_add_args(data, opts)
  if not args then return nil, err end
  local reply, unsent
  reply, err, unsent = self.client:call_wait(args)
  if err then return nil, add_error(err, unsent) end
  return new_job(self, reply)
end

-- q:add_bulk(list [, opts]) -> jobs | nil, err, or jobs, err when some
-- adds were refused (jobs[i] false for those; err.errors[i] says why).
-- Every job checked before any is sent, then up to 500 jobs per call
-- (moonjob_add_bulk), the calls in one pipeline where the client has one.
-- opts: as q:add's, the same for every job (no id, dedupe key or
-- debounce: each names one job).
function Queue:add_bulk(list, opts)
  if type(list) ~= "table" then return input_error("queue:add_bulk(): its first argument must be a list of data") end
  local refusal = add.bulk_refusal(opts)
  if refusal then return input_error(refusal) end
  local texts, err = add.encode_all(list, self.max_payload, self.json)
  if not texts then return nil, err end
  local one
  one, err = checked(add.args, self.prefix, "{}", opts, true, "", nil, self.json)
  if not one then return nil, err end
  if #texts == 0 then return {} end
  local calls, argv = add.bulk_calls(one, texts), {}
  for i, call in ipairs(calls) do argv[i] = call.args end
  local got, unsent
  got, err, unsent = self.client:pipeline(argv)
  if not got then return nil, add_error(err, unsent) end
  local tally = add.bulk_tally(#texts)
  for c, r in ipairs(got) do
    tally:take(calls[c], r[1], function(row) return new_job(self, row) end,
      function(row) return add_error(r[2] or row or "EREDIS no reply for this job") end)
  end
  return tally:result()
end

-- q:add_flow(tree) -> the root's job | nil, err: a parent job and its
-- children (to any depth) added whole in one call, or nothing of it, as
-- moonjob.queue's q:add_flow (moonjob.redis.flow checks and writes the
-- tree; docs/guide/flows.md). Each job has .children, its children's jobs
-- in the tree's order.
function Queue:add_flow(tree)
  local args, nodes = flow.args(tree, self.name, { max_payload = self.max_payload, codec = self.json,
    nonce = function() return self:_nonce() end })
  if not args then return nil, nodes end
  local reply, err, unsent = self.client:call_wait(args)
  if err then return nil, add_error(err, unsent) end
  return flow.handles(nodes, reply, function(name) -- (a child's queue: on this queue's link)
    return name == self.name and self or new_queue(self.client, name, self.max_payload, self.json)
  end, new_job)
end

-- q:wait(id or job [, timeout]) -> result | nil, err: its error (failed),
-- ETIMEDOUT once timeout seconds passed (nil: no end), ENOTFOUND. Looks at
-- the job with a growing pause (10 ms, then half as long again each time,
-- up to 0.5 s): ngx.sleep under OpenResty, LuaSocket's sleep elsewhere.
function Queue:wait(job, timeout)
  if timeout ~= nil and (type(timeout) ~= "number" or not (timeout >= 0)) then
    return input_error("queue:wait(): timeout must be a number of seconds (nil: no end)")
  end
  local sleep, now = clients.sleeper()
  if not sleep then return input_error(now) end
  local deadline, pause = timeout and now() + timeout, 0.01
  local info, err
  while true do
    info, err = self:get(job)
    local ended = err or not info or info.state == "completed" or info.state == "failed"
    if ended or (deadline and now() >= deadline) then break end
    sleep(deadline and math.min(pause, math.max(0, deadline - now())) or pause)
    pause = math.min(pause * 1.5, 0.5)
  end
  if info and getmetatable(job) == Job then job.state = info.state end
  return queue_calls.outcome(self, (queue_calls.id_and_nonce(job)), info, err, timeout)
end

-- One job, and the counts (moonjob.redis.queue_calls): q:get(id or job),
-- q:cancel(id or job [, reason]), q:counts(), q:workers(), q:exists(), q:children(id or
-- job) (a flow's parent's children, each as it ended).
Queue.get = queue_calls.get
Queue.cancel = queue_calls.cancel
Queue.counts = queue_calls.counts
Queue.workers = queue_calls.workers
Queue.exists = queue_calls.exists
Queue.children = queue_calls.children

-- Repeating jobs (moonjob.redis.schedules), as moonjob.queue's, a mistake
-- as nil, EINPUT: q:schedule(id, when [, data [, opts]]), q:unschedule(id),
-- q:schedules([opts]).
function Queue:schedule(...) return checked(schedules.schedule, self, ...) end
function Queue:unschedule(...) return checked(schedules.unschedule, self, ...) end
function Queue:schedules(...) return checked(schedules.schedules, self, ...) end

-- q:close(): a connection the producer opened is closed (under OpenResty:
-- back to its pool); a client the app gave is left to the app.
function Queue:close()
  self.client.adapter:close()
end

-- A job's handle: job.id, state (as added, or as its last wait saw it),
-- joined, nonce; job:wait([timeout]), job:get(), job:cancel([reason]).
function Job:wait(timeout) return self.queue:wait(self, timeout) end
function Job:get() return self.queue:get(self) end
function Job:cancel(reason) return self.queue:cancel(self, reason) end

return M
