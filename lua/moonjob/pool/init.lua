-- moonjob.pool -- a pool of children running one processor file: the policy.
--
-- The pool queues jobs (by priority, then first in first out; delayed jobs
-- wait for their time), hands each to an idle child, keeps `size`
-- children alive (or, with idle_timeout, as many as the work needs, at least
-- min_size), replaces crashed ones, recycles them (max_jobs_per_child, ENOMEM)
-- and emits events. Jobs added before any child is ready simply wait (a
-- pre-initialisation queue); nothing fails for that reason.
--
-- This file is the entry point: Pool.new, add, run, map, drain, cancel_all,
-- close; a second job source gets a port (moonjob.pool.port), not the pool.
-- The pool is made of parts, each an object that owns its state and says at
-- its top what it owns, exposes and calls on the others:
--
--   options.lua    option checking and defaults (plain functions)
--   source.lua     the job source (pool.source: the waiting jobs) and the
--                  owner hook a second source (Redis) plugs into (pool.owner)
--   waiting.lua    the local source (Waiting): a run queue of jobs in
--                  order, a ready heap for the others, a delayed heap
--   limits.lua     the local source of a pool with rate limits or a group
--                  concurrency: the start windows and each group's places
--   port.lua       what the owner of a second source may do to the pool
--   sink.lua       pool.sink: how a child reports to its pool (sink:done,
--                  sink:exit, ...), routed to the parts below
--   child.lua      one child process seen from the parent (child.sent, its
--                  head child.job), and child_output.lua, its output part
--   children.lua   pool.children: the children, how many, starting, freeing,
--                  ending
--   breaker.lua    pool.breaker: start failures, the circuit breaker, its probes
--   deadlines.lua  pool.deadlines: start_timeout, a job's soft and hard
--                  deadlines, ack_timeout
--   dispatch.lua   pool.dispatch: the pump, several jobs in flight per child
--                  (depth, prefetch, take back)
--   endings.lua    pool.endings: fail and retry, finish, cancel, give back
--   lines.lua      pool.lines: batches of lines, and the hooks and calls of
--                  the command line, their one owner (not public API)
--   tally.lua      pool.tally: pool:stats()'s counters and recent times
--   events.lua     pool.events: pool:on, pool:off and emitting events
--   metrics.lua    pool:metrics() and moonjob.metrics() (plain functions)
--
-- The pool itself holds the configuration, pool.by_key (key -> the waiting
-- or running job with that id or dedupe key), nactive (jobs running:
-- dispatch counts them up, endings down), ndeferred (endings and breaker
-- passes due on a later loop turn: drain waits for them) and closing. Every
-- part keeps the pool (part.pool), reads its configuration (size, timeout,
-- kill_after, max_jobs_per_child, ...) and closing, and reaches the other
-- parts as pool.<part>, through the methods their top comments list. A
-- child reaches its pool only through the sink.
--
-- Caveat: events are emitted from inside the loop; a listener must not block
-- on a job (the loop cannot run inside itself) and gets a clear error if it tries.
local buffer = require "string.buffer"
local core = require "moonjob.core"
local errors = require "moonjob.errors"
local Job = require "moonjob.job"
local json = require "moonjob.codec.json"
local loop = require "moonjob.loop"
local Cache = require "moonjob.cache"
local Options = require "moonjob.pool.options"
local Sink = require "moonjob.pool.sink"
local Source = require "moonjob.pool.source"
local Events = require "moonjob.pool.events"
local Tally = require "moonjob.pool.tally"
local Children = require "moonjob.pool.children"
local Breaker = require "moonjob.pool.breaker"
local Deadlines = require "moonjob.pool.deadlines"
local Dispatch = require "moonjob.pool.dispatch"
local Endings = require "moonjob.pool.endings"
local Lines = require "moonjob.pool.lines"
local Port = require "moonjob.pool.port"
local Metrics = require "moonjob.pool.metrics"

local Pool = {}
Pool.__index = Pool

local value = Options.value -- an option, or its default (moonjob.pool.options)
local DATA_BYTES = Job.SLOT.data_bytes

local next_seq = 0 -- job numbers are unique across the pools of a program

-------------------------------------------------------------- creation ---

-- The processor file's directory, absolute with symbolic links resolved
-- (the processor's `...` and job.dir, child/runner.lua): found here, once, so that
-- it names the same directory whatever the working directory of later
-- children. nil when it cannot be resolved (the child then uses the path's own).
local function processor_dir(processor)
  local path = core.realpath(processor)
  return path and (path:match("^(.*)/[^/]*$") or ""):gsub("^$", "/") or nil
end

-- A new job of `pool`, waiting, without data yet.
local function new_job(pool)
  next_seq = next_seq + 1
  return Job.new(pool.job_mt, next_seq, loop.now())
end

-- The parts, in the order they may need each other at creation.
local function make_parts(self, opts)
  self.events = Events.new()
  self.tally = Tally.new(self)
  self.dispatch = Dispatch.new(self, value(opts, "pipeline"))
  self.endings = Endings.new(self)
  self.deadlines = Deadlines.new(self)
  self.breaker = Breaker.new(self)
  self.lines = Lines.new(self, Dispatch.STEAL_AFTER_MS)
  self.sink = Sink.new(self)
  self.children = Children.new(self)
end

-- Pool.new(processor, opts) -> pool | nil, err. Options: docs/reference/options.md.
function Pool.new(processor, opts)
  if type(processor) ~= "string" then
    error("moonjob.pool: the processor must be a file path (string)", 3)
  end
  opts = Options.check(opts)
  local ok, err = Options.check_processor(processor)
  if not ok then return nil, err end
  local child_program = value(opts, "child")
  ok, err = Options.check_child_program(child_program)
  if not ok then return nil, err end
  local memory = Options.memory_limit(opts) -- (its default reads the machine: once)

  local self = setmetatable({
    processor = processor,
    name = opts.name, -- its label in pool:metrics() (moonjob.pool.metrics)
    size = value(opts, "size"),
    min_size = value(opts, "min_size"),
    idle_timeout = opts.idle_timeout,
    max_payload = value(opts, "max_payload"),
    timeout = opts.timeout,
    kill_after = value(opts, "kill_after"),
    ack_timeout = value(opts, "ack_timeout"),
    start_timeout = value(opts, "start_timeout"),
    max_jobs_per_child = opts.max_jobs_per_child,
    max_log_bytes = value(opts, "max_log_bytes"),
    codec = value(opts, "codec"),
    echo = value(opts, "echo"), -- true, false or a function(line, job, pid)
    child_program = child_program,
    memory_limit = memory, -- bytes of Lua heap per child, nil: no cap
    child_args = Options.child_args(opts, memory),
    child_env = { "LUA_PATH=" .. package.path, "LUA_CPATH=" .. package.cpath,
      "MOONJOB_REDIS=" }, -- a Redis URL (its password) is the parent's, not the processors',
    source = Source.new_local(loop.now, opts), -- the waiting jobs (moonjob.pool.source)
    attempts = value(opts, "attempts"),
    backoff = opts.backoff,
    dedupe = opts.dedupe,
    cache_ttl = opts.cache,
    cache = opts.cache and Cache.new(value(opts, "cache_max")),
    max_queue = opts.max_queue,
    by_key = {},                   -- key -> the waiting or running job with that key
    nactive = 0, ndeferred = 0,    -- jobs running; deferred endings and breaker passes (drain waits)
  }, Pool)
  make_parts(self, opts)
  self.job_mt = Job.metatable(self)
  self.min_size = math.min(self.min_size, self.size)
  self.init_bytes = buffer.encode({
    processor = processor, codec = self.codec, max_payload = self.max_payload,
    jit = opts.jit ~= false, memory_limit = self.memory_limit, dir = processor_dir(processor),
    raw = opts.raw, -- the job's text is its data, not decoded (moonjob run --raw)
  })
  self.children:start()
  Metrics.track(self)
  if opts.redis then -- a pool on Redis: loaded only then (moonjob.pool.source: the owner hook)
    local port = Port.new(self, function() return new_job(self) end)
    local several = type(opts.queue) == "table" -- (one worker, several queues: moonjob.redis.remotes)
    self.owner = require(several and "moonjob.redis.remotes" or "moonjob.redis.remote").new(port, opts)
  end
  return self
end

-------------------------------------------------------------- public API ---

local function encode_data(self, data)
  if self.codec == "json" then
    if type(data) ~= "string" then
      return nil, "with codec \"json\" the job data must be JSON text (a string)"
    end
    return data
  end
  local ok, bytes = pcall(buffer.encode, data)
  if not ok then
    return nil, "the job data cannot be serialised: "
      .. tostring(bytes):gsub("^too deep to serialize$", json.too_deep(100)) -- LuaJIT's limit
  end
  return bytes
end

-- The job's key: "id:<id>" for an explicit id, "data:<key>" for dedupe by
-- content (dedupe = true: the serialised data itself), or nil.
local function job_key(self, data, bytes, opts)
  if opts and opts.id ~= nil then return "id:" .. tostring(opts.id) end
  local dedupe = self.dedupe
  if opts and opts.dedupe ~= nil then dedupe = opts.dedupe end
  if dedupe == true then return "data:" .. bytes end
  if type(dedupe) == "function" then
    local key = dedupe(data)
    if key ~= nil then return "data:" .. tostring(key) end
  end
  return nil
end

-- pool:add(data [, opts]) -> job, at once | nil, err (EQUEUEFULL past max_queue).
-- opts: name (job.name), priority (lower first), delay (seconds before it may
-- run), id (a job with that id already waiting or running is returned instead
-- of a new one), dedupe, group (a name: the pool's group_concurrency and
-- group_rate count the jobs of each, moonjob.pool.limits), and timeout, kill_after, attempts,
-- backoff (overriding the pool's); lines is the command line's (moonjob.pool.lines).
function Pool:add(data, opts)
  Options.check_add(opts)
  local job = new_job(self)
  if opts then
    job.name = opts.name
    job.timeout, job.kill_after, job.priority = opts.timeout, opts.kill_after, opts.priority
    job.max_attempts, job.backoff = opts.attempts, opts.backoff
    if opts.lines then self.lines:add_option(job, opts.lines) end
    if opts.first_attempt then job.attempts = opts.first_attempt - 1 end -- (the attempts before it ran in a batch)
    if opts.delay and opts.delay > 0 then job.run_at = loop.now() + opts.delay * 1000 end
    if opts.group then rawset(job, "group", opts.group) end
  end
  local endings = self.endings
  if self.closing then
    return endings:refuse(job, errors.new("ECLOSED", "the pool is closed; create a new pool to add jobs"))
  end
  local bytes, message = encode_data(self, data)
  if not bytes then return endings:refuse(job, errors.new("EPAYLOAD", message)) end
  if #bytes > self.max_payload then
    return endings:refuse(job, errors.new("EPAYLOAD", ("the job data is %d bytes, more than "
      .. "max_payload (%d); send less or raise max_payload"):format(#bytes, self.max_payload)))
  end
  local key = job_key(self, data, bytes, opts)
  if key then
    local same = self.by_key[key]
    if same then return same end
    local cached = self.cache and self.cache:get(key, loop.now())
    job.key = key
    if cached then return endings:complete_from_cache(job, cached) end
  end
  if self.max_queue and self.source:count() >= self.max_queue then
    return nil, errors.new("EQUEUEFULL", ("%d jobs are waiting, the pool's max_queue; wait for "
      .. "some to finish (pool:drain(), the drained event) and add again"):format(self.source:count()))
  end
  if key then self.by_key[key] = job end
  job[DATA_BYTES] = bytes -- its slot (Job.SLOT)
  self.source:push(job)
  self.dispatch:pump()
  return job
end

-- pool:run(data [, opts]) -> result | nil, err. Runs the loop until the job ends.
function Pool:run(data, opts)
  local job, err = self:add(data, opts)
  if not job then return nil, err end
  return job:wait()
end

-- pool:map(items [, opts]) -> results, errors|nil, in input order. A failed
-- item is nil in results and its error is errors[i]. opts are add()'s. With
-- max_queue, map adds no faster than the pool drains.
function Pool:map(items, opts)
  if type(items) ~= "table" then error("pool:map(): items must be a list (table)", 2) end
  local jobs = {}
  for i = 1, #items do
    local job, err = self:add(items[i], opts)
    while not job and err.code == "EQUEUEFULL" do -- backpressure: wait for room
      loop.wait_until(function() return self.source:count() < self.max_queue end)
      job, err = self:add(items[i], opts)
    end
    jobs[i] = job
  end
  local n = 1
  loop.wait_until(function()
    while n <= #jobs and jobs[n]:is_finished() do n = n + 1 end
    return n > #jobs
  end)
  local results, errs = {}, nil
  for i = 1, #jobs do
    local result, err = jobs[i]:wait()
    results[i] = result
    if err then errs = errs or {}; errs[i] = err end
  end
  return results, errs
end

-- pool:is_idle() -> true when no job waits, runs or is due to end.
function Pool:is_idle()
  return self.nactive == 0 and self.dispatch:prefetched_count() == 0 and self.source:count() == 0
    and self.ndeferred == 0
end

-- pool:drain(): runs the loop until no job waits or runs.
function Pool:drain()
  loop.wait_until(function() return self:is_idle() end)
end

-- pool:on(event, fn) -> pool; pool:off(event, fn) -> true if fn was
-- listening. The events: moonjob.pool.events.
function Pool:on(event, fn)
  self.events:on(event, fn)
  return self
end

function Pool:off(event, fn)
  return self.events:off(event, fn)
end

-- pool:stats(): moonjob.pool.tally.
function Pool:stats()
  return self.tally:report()
end

-- pool:metrics() -> the pool's metrics (and the process's) in Prometheus'
-- text format: moonjob.pool.metrics.
function Pool:metrics()
  return Metrics.pool_text(self)
end

-- pool:cancel_all([reason]) -> number of jobs canceled (waiting and running)
function Pool:cancel_all(reason)
  local n = 0
  local endings = self.endings
  while self.source:count() > 0 do
    if endings:cancel(self.source:pop_any(), reason) then n = n + 1 end
  end
  for _, child in ipairs(self.children:snapshot()) do -- canceling may start a child: a copy
    for _, job in ipairs({ unpack(child.sent) }) do -- canceling changes child.sent
      if endings:cancel(job, reason) then n = n + 1 end
    end
  end
  return n
end

-- pool:cancel_job(job [, reason [, code]]) -> true, or false when it had
-- ended (job:cancel).
function Pool:cancel_job(job, reason, code)
  return self.endings:cancel(job, reason, code)
end

--------------------------------------------------------------------- close ---

-- pool:close([{ timeout = s, force = true }]) -> true. Stops taking jobs (later
-- adds fail with ECLOSED), fails jobs still waiting with ECLOSED, lets running
-- jobs finish (at most `timeout` seconds; `force` does not wait), then ends the
-- children (end of file; SIGTERM then SIGKILL for busy ones) and waits until
-- they are gone. Inside an event listener it does not wait.
function Pool:close(opts)
  if opts ~= nil and type(opts) ~= "table" then error("pool:close(): options must be a table", 2) end
  opts = opts or {}
  local children, owner = self.children, self.owner
  if not self.closing then
    self.closing = true
    Metrics.untrack(self) -- out of moonjob.metrics(); the last one stops the lag sampler
    if owner then owner:stop() end
    while self.source:count() > 0 do
      local job = self.source:pop_any()
      job.error = errors.new("ECLOSED", "the pool was closed before the job ran")
      self.endings:finish(job, "failed")
    end
    for _, child in ipairs(children:snapshot()) do -- a starting child may never get ready: killed
      self.dispatch:take_back_prefetched(child) -- jobs behind its head: ECLOSED, as waiting ones
      if child.state ~= "busy" then children:retire(child, child.state == "starting") end
    end
  end
  if opts.force then
    children:terminate()
  elseif opts.timeout and not self.close_timer then
    self.close_timer = core.timer(function() children:terminate() end)
    self.close_timer:start(opts.timeout * 1000)
  end
  if core.running() then return true end
  local ok, err = pcall(loop.wait_until, function() return children:count_all() == 0 end)
  if not ok then error(err, 0) end
  if owner then ok, err = pcall(owner.close, owner) end
  children:close()
  self.breaker:close()
  self.dispatch:close()
  if self.close_timer then self.close_timer:close(); self.close_timer = nil end
  if not ok then error(err, 0) end
  return true
end

-- "1 child", "2 children"
local function children_text(n)
  return n == 1 and "1 child" or (n .. " children")
end

function Pool:__tostring()
  return ("<moonjob.pool %s: %s, %d waiting, %d active%s>"):format(
    self.processor, children_text(self.children:count_all()),
    self.source:count() + self.dispatch:prefetched_count(), self.nactive,
    self.closing and ", closed" or "")
end

return Pool
