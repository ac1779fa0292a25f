-- moonjob.pool -- a pool of children running one processor file: the policy.
--
-- The pool queues jobs (FIFO), hands each to an idle child, keeps `size`
-- children alive, replaces crashed ones, and emits events. Jobs added before
-- any child is ready simply wait (a pre-initialisation queue); nothing fails
-- for that reason.
--
-- A processor that cannot load fails one waiting job per attempt with ELOAD
-- and the pool then starts at most one child at a time, and only while jobs
-- wait, so a broken file never turns into a fork storm; a successful load
-- puts the pool back to full size.
--
-- Caveat: events are emitted from inside the loop; a listener must not block
-- on a job (the loop cannot run inside itself) and gets a clear error if it tries.
local buffer = require "string.buffer"
local core = require "moonjob.core"
local errors = require "moonjob.errors"
local Job = require "moonjob.job"
local loop = require "moonjob.loop"
local Worker = require "moonjob.worker"

local Pool = {}
Pool.__index = Pool

local DEFAULT_MAX_PAYLOAD = 64 * 1024 * 1024
local CLOSE_GRACE_MS = 5000 -- children that have not exited by then are killed

local OPTIONS = {
  size = "number", max_payload = "number", codec = "string", echo = "boolean",
  jit = "boolean", child = "string",
}
local CODECS = { lua = true, json = true }
local EVENTS = {
  completed = true, failed = true, progress = true, log = true, active = true,
  drained = true, error = true,
}

local next_seq = 0 -- job numbers are unique across the pools of a program

------------------------------------------------------------ validation ---

local function option_names()
  local names = {}
  for k in pairs(OPTIONS) do names[#names + 1] = k end
  table.sort(names)
  return table.concat(names, ", ")
end

local function check_options(opts)
  if opts == nil then return {} end
  if type(opts) ~= "table" then error("moonjob.pool: options must be a table", 4) end
  for k, v in pairs(opts) do
    local want = OPTIONS[k]
    if not want then
      error(("moonjob.pool: unknown option '%s' (known: %s)"):format(tostring(k), option_names()), 4)
    end
    if type(v) ~= want then
      error(("moonjob.pool: option '%s' must be a %s, not a %s"):format(k, want, type(v)), 4)
    end
  end
  if opts.size and (opts.size < 1 or opts.size ~= math.floor(opts.size)) then
    error("moonjob.pool: option 'size' must be a positive integer", 4)
  end
  if opts.max_payload and opts.max_payload < 1 then
    error("moonjob.pool: option 'max_payload' must be positive", 4)
  end
  if opts.codec and not CODECS[opts.codec] then
    error("moonjob.pool: option 'codec' must be \"lua\" or \"json\"", 4)
  end
  return opts
end

local function check_processor(file)
  local chunk, message = loadfile(file)
  if chunk then return true end
  if not io.open(file, "r") then
    message = ("cannot open processor file '%s': no such readable file"):format(file)
  end
  return nil, errors.new("ELOAD", message)
end

local function check_child_program(path)
  local f = io.open(path, "rb")
  if f then f:close() return true end
  return nil, errors.new("ESETUP", ("the child program is missing at %s; reinstall moonjob "
    .. "(make install or luarocks make) or pass { child = path }"):format(path))
end

-------------------------------------------------------------- creation ---

-- Pool.new(processor, opts) -> pool | nil, err. See README for the options.
function Pool.new(processor, opts)
  if type(processor) ~= "string" then
    error("moonjob.pool: the processor must be a file path (string)", 3)
  end
  opts = check_options(opts)
  local ok, err = check_processor(processor)
  if not ok then return nil, err end
  local child_program = opts.child or core.child_path()
  ok, err = check_child_program(child_program)
  if not ok then return nil, err end

  local self = setmetatable({
    processor = processor,
    size = opts.size or core.cpu_count(),
    max_payload = opts.max_payload or DEFAULT_MAX_PAYLOAD,
    codec = opts.codec or "lua",
    echo = opts.echo ~= false,
    child_program = child_program,
    child_env = { "LUA_PATH=" .. package.path, "LUA_CPATH=" .. package.cpath },
    workers = {}, nworkers = 0, idle = {},
    queue = {}, qfirst = 1, qlast = 0,
    nactive = 0, nrefusing = 0,
    listeners = {},
    counts = { completed = 0, failed = 0, spawned = 0, crashed = 0 },
    meta = buffer.new(),
  }, Pool)
  self.init_bytes = buffer.encode({
    processor = processor, codec = self.codec, max_payload = self.max_payload,
    jit = opts.jit ~= false,
  })
  self:_ensure_workers()
  return self
end

------------------------------------------------------------------ queue ---

function Pool:_enqueue(job)
  self.qlast = self.qlast + 1
  self.queue[self.qlast] = job
end

function Pool:_dequeue()
  local first = self.qfirst
  if first > self.qlast then return nil end
  local job = self.queue[first]
  self.queue[first] = nil
  self.qfirst = first + 1
  return job
end

function Pool:_waiting()
  return self.qlast - self.qfirst + 1
end

------------------------------------------------------------------ events ---

local function traceback(err)
  return debug.traceback(tostring(err), 2)
end

function Pool:_report(event, message)
  if event ~= "error" and self.listeners.error then
    return self:_emit("error", message, event)
  end
  io.stderr:write(("moonjob: error in a '%s' listener: %s\n"):format(event, message))
end

function Pool:_emit(event, ...)
  local list = self.listeners[event]
  if not list then return end
  for i = 1, #list do
    local ok, err = xpcall(list[i], traceback, ...)
    if not ok then self:_report(event, err) end
  end
end

-- pool:on(event, fn) -> pool. Events: completed(job, result), failed(job, err),
-- progress(job, value), log(job, line, stream), active(job), drained(),
-- error(message, event) for errors raised by other listeners.
function Pool:on(event, fn)
  if not EVENTS[event] then
    error(("pool:on(): unknown event '%s' (completed, failed, progress, log, active, "
      .. "drained, error)"):format(tostring(event)), 2)
  end
  if type(fn) ~= "function" then error("pool:on(): the listener must be a function", 2) end
  local list = self.listeners[event] or {}
  list[#list + 1] = fn
  self.listeners[event] = list
  return self
end

-- pool:off(event, fn) -> true if fn was listening
function Pool:off(event, fn)
  local list = self.listeners[event]
  for i = 1, list and #list or 0 do
    if list[i] == fn then
      table.remove(list, i)
      if #list == 0 then self.listeners[event] = nil end
      return true
    end
  end
  return false
end

---------------------------------------------------------------- workers ---

function Pool:_spawn()
  local w, err = Worker.spawn(self)
  if not w then
    self.broken = errors.new("ESPAWN", "cannot start a child process: " .. tostring(err))
    local job = self:_dequeue()
    if job then self:_refuse(job, self.broken) end
    return false
  end
  self.workers[w] = true
  self.nworkers = self.nworkers + 1
  self.counts.spawned = self.counts.spawned + 1
  return true
end

-- Keeps `size` children, or, while loads fail, one probe while jobs wait.
function Pool:_ensure_workers()
  if self.closing then return end
  local target = self.size
  if self.broken then target = self:_waiting() > 0 and 1 or 0 end
  while self.nworkers < target do
    if not self:_spawn() then return end
  end
end

-- Puts a job that never reached a child back at the head of the queue.
function Pool:_requeue_first(job)
  self.qfirst = self.qfirst - 1
  self.queue[self.qfirst] = job
end

function Pool:_dispatch(w, job)
  local attempt = job.attempts + 1
  local meta = self.meta:reset():encode({ id = job.id, name = job.name, attempt = attempt })
  if not w:run(job, meta:tostring()) then return self:_requeue_first(job) end
  job.state, job.pid, job.attempts = "active", w.pid, attempt
  job.started = loop.now()
  self.nactive = self.nactive + 1
  if self.listeners.active then self:_emit("active", job) end
end

function Pool:_pump()
  local idle = self.idle
  while self.qfirst <= self.qlast and #idle > 0 do
    local w = table.remove(idle)
    if w.state == "idle" then self:_dispatch(w, self:_dequeue()) end
  end
  self:_ensure_workers()
end

function Pool:_worker_ready(w)
  self.broken = nil
  if self.closing then return w:finish() end
  self.idle[#self.idle + 1] = w
  self:_pump()
end

function Pool:_worker_load_failed(w, err)
  self.broken = err
  local job = self:_dequeue()
  if job then
    job.attempts = job.attempts + 1
    job.error = err
    self:_finish(job, "failed")
  end
end

function Pool:_worker_gone(w, job, err, previous)
  self.workers[w] = nil
  self.nworkers = self.nworkers - 1
  if previous ~= "exiting" and previous ~= "broken" then
    self.counts.crashed = self.counts.crashed + 1
  end
  if job then
    job.error = err
    self:_finish(job, "failed")
  elseif previous == "starting" then
    err.message = err.message .. " before it was ready"
    self:_worker_load_failed(w, err)
  end
  self:_pump()
end

----------------------------------------------------------- job endings ---

function Pool:_finish(job, state)
  local was_active = job.state == "active"
  job.state = state
  if job.started then job.ms = loop.now() - job.started end
  if was_active then self.nactive = self.nactive - 1 end
  self.counts[state] = self.counts[state] + 1
  if state == "completed" then
    if self.listeners.completed then self:_emit("completed", job, job.result) end
  else
    if self.listeners.failed then self:_emit("failed", job, job.error) end
  end
  if self.listeners.drained and self.nactive == 0 and self:_waiting() == 0 then
    self:_emit("drained")
  end
end

function Pool:_job_completed(w, job, result_bytes)
  job.result_bytes = result_bytes
  self:_finish(job, "completed")
  self:_worker_ready(w)
end

function Pool:_job_failed(w, job, err)
  job.error = err
  self:_finish(job, "failed")
  self:_worker_ready(w)
end

function Pool:_job_progress(job, bytes)
  job.progress_bytes = bytes
  if self.listeners.progress then self:_emit("progress", job, job.progress) end
end

function Pool:_output_line(w, job, stream, line)
  if job then job.logs[#job.logs + 1] = line end
  if self.echo then
    local who = job and ("job " .. tostring(job.id)) or ("child " .. tostring(w.pid))
    io.stderr:write("[", who, "] ", line, "\n")
  end
  if job and self.listeners.log then self:_emit("log", job, line, stream) end
end

-- Fails a job that never ran, on a later loop turn (never inside add).
function Pool:_refuse(job, err)
  job.error = err
  self.nrefusing = self.nrefusing + 1
  loop.defer(function()
    self.nrefusing = self.nrefusing - 1
    self:_finish(job, "failed")
  end)
  return job
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
  if not ok then return nil, "the job data cannot be serialised: " .. tostring(bytes) end
  return bytes
end

-- pool:add(data [, opts]) -> job, at once. opts.name is visible as job.name.
function Pool:add(data, opts)
  if opts ~= nil and type(opts) ~= "table" then error("pool:add(): options must be a table", 2) end
  next_seq = next_seq + 1
  local job = Job.new(self, next_seq, opts and opts.name, nil)
  job.seq = next_seq
  if self.closing then
    return self:_refuse(job, errors.new("ECLOSED", "the pool is closed; create a new pool to add jobs"))
  end
  local bytes, message = encode_data(self, data)
  if not bytes then return self:_refuse(job, errors.new("EPAYLOAD", message)) end
  if #bytes > self.max_payload then
    return self:_refuse(job, errors.new("EPAYLOAD", ("the job data is %d bytes, more than "
      .. "max_payload (%d); send less or raise max_payload"):format(#bytes, self.max_payload)))
  end
  job.data_bytes = bytes
  self:_enqueue(job)
  self:_pump()
  return job
end

-- pool:run(data [, opts]) -> result | nil, err. Runs the loop until the job ends.
function Pool:run(data, opts)
  return self:add(data, opts):wait()
end

-- pool:map(items [, opts]) -> results, errors|nil, in input order. A failed
-- item is nil in results and its error is errors[i].
function Pool:map(items, opts)
  if type(items) ~= "table" then error("pool:map(): items must be a list (table)", 2) end
  local jobs = {}
  for i = 1, #items do jobs[i] = self:add(items[i], opts) end
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
  return self.nactive == 0 and self:_waiting() == 0 and self.nrefusing == 0
end

-- pool:drain(): runs the loop until no job waits or runs.
function Pool:drain()
  loop.wait_until(function() return self:_idle() end)
end

-- pool:stats() -> { waiting, active, completed, failed, children, size, spawned, crashed }
function Pool:stats()
  local c = self.counts
  return setmetatable({
    waiting = self:_waiting(), active = self.nactive, completed = c.completed,
    failed = c.failed, children = self.nworkers, size = self.size,
    spawned = c.spawned, crashed = c.crashed,
  }, { __tostring = function(s)
    return ("waiting %d, active %d, completed %d, failed %d, children %d/%d, spawned %d, crashed %d")
      :format(s.waiting, s.active, s.completed, s.failed, s.children, s.size, s.spawned, s.crashed)
  end })
end

function Pool:_finish_children()
  for w in pairs(self.workers) do
    if w.state ~= "busy" then w:finish() end
  end
end

-- pool:close() -> true. Stops taking jobs, fails waiting ones with ECLOSED,
-- lets running ones finish, then ends the children and waits until they are
-- gone (children still there after 5 s are killed). Called from inside an
-- event listener it does not wait: the children end in the background.
function Pool:close()
  if self.closing then return true end
  self.closing = true
  while true do
    local job = self:_dequeue()
    if not job then break end
    job.error = errors.new("ECLOSED", "the pool was closed before the job ran")
    self:_finish(job, "failed")
  end
  self:_finish_children()
  if core.running() then return true end
  local killer = core.timer(function()
    for w in pairs(self.workers) do w:kill() end
  end)
  killer:start(CLOSE_GRACE_MS)
  local ok, err = pcall(loop.wait_until, function() return self.nworkers == 0 end)
  killer:close()
  if not ok then error(err, 2) end
  return true
end

function Pool:__tostring()
  return ("<moonjob.pool %s: %d children, %d waiting, %d active%s>"):format(
    self.processor, self.nworkers, self:_waiting(), self.nactive, self.closing and ", closed" or "")
end

return Pool
