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
-- close, and dispatch (_pump pairs waiting jobs with idle children). Every
-- other concern lives in moonjob/pool/, and its methods are mixed into Pool
-- at the end of this file, so callers and specs see one class:
--
--   options.lua    option checking and defaults (plain functions, not mixed in)
--   source.lua     the job source: the only way to the waiting jobs (pool.source)
--   sink.lua       the worker sink: how a worker reports to its pool (on_worker_*)
--   children.lua   the children: how many, spawning, freeing, recycling, sweeps
--   breaker.lua    start failures: the circuit breaker, its probes and back-off
--   deadlines.lua  start_timeout, a job's soft and hard deadlines, ack_timeout
--   dispatch.lua   several jobs in flight per child: depth, prefetch, take back
--   endings.lua    a job's endings: fail and retry, finish, cancel, give back
--   stats.lua      pool:stats(): counters and recent wait and run times
--   events.lua     pool:on, pool:off and emitting events to listeners
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
local Source = require "moonjob.pool.source"
local Remote = require "moonjob.redis.remote"

local Pool = {}
Pool.__index = Pool

local DEFAULTS = Options.DEFAULTS

local next_seq = 0 -- job numbers are unique across the pools of a program

-------------------------------------------------------------- creation ---

-- The processor file's directory, absolute with symbolic links resolved
-- (the processor's `...` and job.dir, runner.lua): found here, once, so that
-- it names the same directory whatever the working directory of later
-- children. nil when it cannot be resolved (the child then uses the path's own).
local function processor_dir(processor)
  local path = core.realpath(processor)
  return path and (path:match("^(.*)/[^/]*$") or ""):gsub("^$", "/") or nil
end

-- Pool.new(processor, opts) -> pool | nil, err. See README for the options.
function Pool.new(processor, opts)
  if type(processor) ~= "string" then
    error("moonjob.pool: the processor must be a file path (string)", 3)
  end
  opts = Options.check(opts)
  local ok, err = Options.check_processor(processor)
  if not ok then return nil, err end
  local child_program = opts.child or core.child_path()
  ok, err = Options.check_child_program(child_program)
  if not ok then return nil, err end

  local self = setmetatable({
    processor = processor,
    size = opts.size or core.cpu_count(),
    min_size = opts.min_size or 0,
    idle_timeout = opts.idle_timeout,
    max_payload = opts.max_payload or (opts.redis and DEFAULTS.remote_max_payload) or DEFAULTS.max_payload,
    timeout = opts.timeout,
    kill_after = opts.kill_after or DEFAULTS.kill_after,
    ack_timeout = opts.ack_timeout or DEFAULTS.ack_timeout,
    start_timeout = opts.start_timeout or DEFAULTS.start_timeout,
    max_jobs_per_child = opts.max_jobs_per_child,
    max_log_bytes = opts.max_log_bytes or DEFAULTS.max_log_bytes,
    codec = opts.codec or (opts.redis and "json") or "lua",
    echo = opts.echo ~= false and (opts.echo or true), -- true, or a function(line, job, pid)
    child_program = child_program,
    child_args = Options.child_args(opts),
    child_env = { "LUA_PATH=" .. package.path, "LUA_CPATH=" .. package.cpath,
      "MOONJOB_REDIS=" }, -- a Redis URL (its password) is the parent's, not the processors',
    workers = {}, nworkers = 0, nretiring = 0, idle = {}, -- the children (moonjob.pool.children)
    worker_list = {},              -- the same workers in an array (dispatch.lua walks it per job)
    source = Source.new_local(loop.now), -- the waiting jobs (moonjob.pool.source)
    attempts = opts.attempts or 1,
    backoff = opts.backoff,
    dedupe = opts.dedupe,
    cache_ttl = opts.cache,
    cache = opts.cache and Cache.new(opts.cache_max or 1000),
    max_queue = opts.max_queue,
    inflight = {},                 -- key -> the waiting or running job with that key
    wait_ms = { n = 0 }, run_ms = { n = 0 }, -- rings of recent times (moonjob.pool.stats)
    nactive = 0, ndeferred = 0,    -- jobs running; deferred endings and breaker passes (drain waits)
    pipeline = opts.pipeline or DEFAULTS.pipeline, nqueued = 0, -- moonjob.pool.pipeline
    start_failures = 0,            -- the breaker's (moonjob.pool.breaker)
    listeners = {},                -- event -> list of functions (moonjob.pool.events)
    counts = { completed = 0, failed = 0, spawned = 0, crashed = 0, timeouts = 0, killed = 0,
      retries = 0, cache_hits = 0 },
    meta = buffer.new(),
  }, Pool)
  self.job_mt = Job.metatable(self)
  self.min_size = math.min(self.min_size, self.size)
  self.init_bytes = buffer.encode({
    processor = processor, codec = self.codec, max_payload = self.max_payload,
    jit = opts.jit ~= false, memory_limit = opts.memory_limit, dir = processor_dir(processor),
  })
  self:_start_sweeper()
  self:_ensure_workers()
  if opts.redis then self.remote = Remote.new(self, opts) end
  return self
end

-- A new job of this pool, waiting, without data yet.
function Pool:_new_job()
  next_seq = next_seq + 1
  return Job.new(self.job_mt, next_seq, loop.now())
end

-------------------------------------------------------------- dispatch ---

-- Sends a job to a child: an idle one runs it now; a busy one queues it
-- behind the jobs it holds (moonjob.pool.pipeline). A child found gone is
-- retired and the job goes back to the source at once (it never left the
-- parent).
function Pool:_dispatch(w, job)
  local attempt = job.attempts + 1
  local meta = self.meta:reset():encode(job.remote_id or job.id):encode(attempt):encode(job.name)
    :encode(job.first_line and (job.lines_end_on_failure and -job.first_line or job.first_line) or false)
  if not w:run(job, meta:tostring()) then -- the child is gone: it holds no place either
    self:_retire(w, true)
    return self.source:push(job)
  end
  job.attempts, job.worker = attempt, w
  if w.job == job then return self:_job_started(w, job) end
  job.queued = true
  self.nqueued = self.nqueued + 1
end

-- A function that runs pool:_pump(). Closures are made here, never in the
-- methods _pump runs for every job: LuaJIT cannot compile a function that
-- makes one (it aborts its traces), and those methods must stay compiled.
function Pool:_pump_later()
  return function() self:_pump() end
end

-- Wakes the pool when the earliest delayed job becomes due.
function Pool:_arm_delay()
  local due = self.source:next_due()
  if not due then return end
  if not self.delay_timer then self.delay_timer = core.timer(self:_pump_later()) end
  self.delay_timer:start(math.max(0, due - loop.now()) + 1)
end

-- The pool's heartbeat, run after anything that may free a child or make a
-- job ready: idle children take ready jobs (the most recently freed child
-- first), then the delay timer, the number of children and the breaker are
-- brought up to date.
function Pool:_pump()
  local idle, source = self.idle, self.source
  while #idle > 0 do
    local w = idle[#idle]
    if w.state == "idle" then
      local job = source:pop_ready()
      if not job and not ((self.nqueued > 0 or self.batches) and self:_steal()) then break end
      if job then
        idle[#idle] = nil
        self:_dispatch(w, job)
      end
    else
      idle[#idle] = nil
    end
  end
  if not self.saturated and self.pipeline > 1 and #idle == 0 then self:_prefetch() end
  self:_arm_delay()
  self:_ensure_workers()
  self:_check_breaker()
  if self.remote then self.remote:want() end
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
-- of a new one), dedupe, and timeout, kill_after, attempts, backoff
-- (overriding the pool's).
function Pool:add(data, opts)
  Options.check_add(opts)
  local job = self:_new_job()
  if opts then
    job.name = opts.name
    job.timeout, job.kill_after, job.priority = opts.timeout, opts.kill_after, opts.priority
    job.max_attempts, job.backoff = opts.attempts, opts.backoff
    if opts.lines then -- a batch of NDJSON lines (moonjob.cli, runner.lua): { first, count [, end_on_failure] }
      job.first_line, job.line_count, job.lines_end_on_failure = opts.lines[1], opts.lines[2], opts.lines[3]
    end
    if opts.lines and not self.batches then self:_expect_batches() end
    if opts.delay and opts.delay > 0 then job.run_at = loop.now() + opts.delay * 1000 end
  end
  if self.closing then
    return self:_refuse(job, errors.new("ECLOSED", "the pool is closed; create a new pool to add jobs"))
  end
  local bytes, message = encode_data(self, data)
  if not bytes then return self:_refuse(job, errors.new("EPAYLOAD", message)) end
  if #bytes > self.max_payload then
    return self:_refuse(job, errors.new("EPAYLOAD", ("the job data is %d bytes, more than "
      .. "max_payload (%d); send less or raise max_payload"):format(#bytes, self.max_payload)))
  end
  local key = job_key(self, data, bytes, opts)
  if key then
    local same = self.inflight[key]
    if same then return same end
    local cached = self.cache and self.cache:get(key, loop.now())
    job.key = key
    if cached then return self:_complete_from_cache(job, cached) end
  end
  if self.max_queue and self.source:count() >= self.max_queue then
    return nil, errors.new("EQUEUEFULL", ("%d jobs are waiting, the pool's max_queue; wait for "
      .. "some to finish (pool:drain(), the drained event) and add again"):format(self.source:count()))
  end
  if key then self.inflight[key] = job end
  job.data_bytes = bytes
  self.source:push(job)
  self:_pump()
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

function Pool:_idle()
  return self.nactive == 0 and self.nqueued == 0 and self.source:count() == 0 and self.ndeferred == 0
end

-- pool:drain(): runs the loop until no job waits or runs.
function Pool:drain()
  loop.wait_until(function() return self:_idle() end)
end

-- pool:cancel_all([reason]) -> number of jobs canceled (waiting and running)
function Pool:cancel_all(reason)
  local n = 0
  while self.source:count() > 0 do
    if self:_cancel(self.source:pop_any(), reason) then n = n + 1 end
  end
  for _, w in ipairs({ unpack(self.worker_list) }) do -- canceling may start a child: a copy
    for _, job in ipairs({ unpack(w.queue) }) do -- canceling changes the queue
      if self:_cancel(job, reason) then n = n + 1 end
    end
  end
  return n
end

--------------------------------------------------------------------- close ---

function Pool:_close_timers()
  for _, name in ipairs({ "sweeper", "respawn_timer", "killer", "close_timer", "delay_timer", "steal_timer" }) do
    if self[name] then self[name]:close(); self[name] = nil end
  end
end

-- pool:close([{ timeout = s, force = true }]) -> true. Stops taking jobs (later
-- adds fail with ECLOSED), fails jobs still waiting with ECLOSED, lets running
-- jobs finish (at most `timeout` seconds; `force` does not wait), then ends the
-- children (end of file; SIGTERM then SIGKILL for busy ones) and waits until
-- they are gone. Inside an event listener it does not wait.
function Pool:close(opts)
  if opts ~= nil and type(opts) ~= "table" then error("pool:close(): options must be a table", 2) end
  opts = opts or {}
  if not self.closing then
    self.closing = true
    if self.remote then self.remote:stop() end
    while self.source:count() > 0 do
      local job = self.source:pop_any()
      job.error = errors.new("ECLOSED", "the pool was closed before the job ran")
      self:_finish(job, "failed")
    end
    for w in pairs(self.workers) do -- a starting child may never get ready: killed
      self:_take_back_queued(w) -- jobs queued behind its head: ECLOSED, as waiting ones
      if w.state ~= "busy" then self:_retire(w, w.state == "starting") end
    end
  end
  if opts.force then
    self:_terminate()
  elseif opts.timeout and not self.close_timer then
    self.close_timer = core.timer(function() self:_terminate() end)
    self.close_timer:start(opts.timeout * 1000)
  end
  if core.running() then return true end
  local ok, err = pcall(loop.wait_until, function() return self.nworkers == 0 end)
  if not ok then error(err, 0) end
  if self.remote then ok, err = pcall(self.remote.close, self.remote) end
  self:_close_timers()
  if not ok then error(err, 0) end
  return true
end

-- "1 child", "2 children"
local function children(n)
  return n == 1 and "1 child" or (n .. " children")
end

function Pool:__tostring()
  return ("<moonjob.pool %s: %s, %d waiting, %d active%s>"):format(
    self.processor, children(self.nworkers), self.source:count() + self.nqueued, self.nactive,
    self.closing and ", closed" or "")
end

---------------------------------------------------------------- mix-in ---

-- Each concern's methods live in moonjob/pool/*.lua and are copied into Pool
-- here, so pool:on() and self:_emit() work as if defined in this file (and
-- calls between them go through self, so one can be replaced on Pool).
local function mix_in(methods)
  for name, fn in pairs(methods) do
    assert(Pool[name] == nil, "moonjob.pool: two definitions of " .. name)
    Pool[name] = fn
  end
end

mix_in(require "moonjob.pool.events")
mix_in(require "moonjob.pool.stats")
mix_in(require "moonjob.pool.endings")
mix_in(require "moonjob.pool.children")
mix_in(require "moonjob.pool.breaker")
mix_in(require "moonjob.pool.deadlines")
mix_in(require "moonjob.pool.dispatch")
mix_in(require "moonjob.pool.sink")

return Pool
