-- moonjob.pool.options -- checking a pool's options and add()'s, and their defaults.
--
-- Pool.new and pool:add call these before anything else: an option that is
-- unknown, of the wrong type or out of range is a programming error and
-- raises (with the caller's position), while a processor that cannot load or
-- a missing child program is a run-time condition and is returned as
-- nil, err. Every number is bounded (MAXIMUM) so that no option reaches C as
-- a number it cannot hold. The options a producer stored with a job on Redis
-- are held to add()'s bounds too (check_stored: a message, not an error).
--
-- Caveat: the error levels (4 in check, 3 in check_add) count the calls
-- between the checker and the user's line, exactly as they did when these
-- lived in the pool module: call check only from Pool.new and check_add only from
-- pool:add, directly, or the error blames the wrong line.
--
-- Calls: nothing (plain functions; every default is here: DEFAULTS,
-- REDIS_DEFAULTS, and Options.value for those computed from other options).
local errors = require "moonjob.errors"
local Backoff = require "moonjob.backoff"
local names = require "moonjob.redis.names"

local Options = {}

Options.DEFAULTS = {
  max_payload = 64 * 1024 * 1024,
  remote_max_payload = 1024 * 1024, -- a pool on Redis: what it reads is untrusted
  kill_after = 5,
  ack_timeout = 2,
  start_timeout = 60,
  max_log_bytes = 1024 * 1024,
  pipeline = 8, -- jobs one child may hold at once (moonjob.pool.dispatch)
  min_size = 0, -- (with idle_timeout: the children kept when idle)
  attempts = 1,
  cache_max = 1000, -- results kept by key (with cache)
}

-- A pool on Redis (moonjob.redis.remote reads these): a lease of 30 s, a
-- look at an empty queue every second, `prefetch` adapted to the jobs' run
-- time (moonjob.redis.fetch_policy) unless given. Retention: finished jobs are kept by age, any number of
-- them (a count bound, `keep`, is the user's choice: "" is moonjob_fetch's
-- empty KEEP_COUNT): completed ones a day, failed ones a week (to be looked
-- at and retried); the last 100 log lines of each job. No worker_name: the
-- worker's id is its random part alone. A heartbeat every 2 s while idle.
Options.REDIS_DEFAULTS = {
  lease = 30, poll = 1, prefetch = "adaptive",
  keep = "", keep_age = 86400, keep_failed_age = 7 * 86400, keep_logs = 100,
  worker_name = "",
  heartbeat = 2, -- s between an idle worker's beats (moonjob.redis.heartbeat)
}

-- Options.limited(opts): whether a pool has limits of its own (a rate or a
-- group limit): its source is then moonjob.pool.limits, and a child takes
-- one job at a time (a job starts as the limits count it).
function Options.limited(opts)
  return (opts.rate or opts.group_concurrency or opts.group_rate) ~= nil
end

---------------------------------------------------------------- memory ---
-- Every pool's children are capped (memory_limit) unless told otherwise:
-- the default is a share of the machine's memory per child, so that a
-- pool's children together cannot take more than half of it, and at most
-- MEMORY_CEILING each (a runaway on a big machine is stopped in seconds,
-- not after it took gigabytes; a job that needs more says so with
-- --memory-limit).

Options.MEMORY_SHARE = 0.5             -- of the machine's memory, for a pool's children together
Options.MEMORY_FLOOR = 64 * 1024 * 1024 -- a child's default cap, at least (a big pool on a small machine)
Options.MEMORY_CEILING = 2 * 1024 ^ 3   -- a child's default cap, at most
local MEMORY_MAX = 2 ^ 46
local MIB = 1024 * 1024
local SIZE_UNITS = { [""] = 1, k = 1024, m = MIB, g = 1024 * MIB, t = 1024 * 1024 * MIB }
Options.SIZE_WANTS = "a size such as 512M, 2G, 1.5G, 64K or a number of bytes "
  .. "(K, M, G, T: powers of 1024), or none (no cap)"

-- Options.size(text) -> bytes (whole), false for "none" | nil: a memory
-- size as the command line and MOONJOB_MEMORY_LIMIT write it.
function Options.size(text)
  if type(text) ~= "string" then return nil end
  if text:lower() == "none" then return false end
  local n, unit = text:match("^(%d*%.?%d+)%s*([kKmMgGtT]?)[iI]?[bB]?$")
  local bytes = n and math.floor(tonumber(n) * SIZE_UNITS[unit:lower()])
  if bytes and bytes >= 1 and bytes <= MEMORY_MAX then return bytes end
end

-- The first number in file `path`, or nil ("max", no such file).
local function number_in(path)
  local f = io.open(path, "r")
  if not f then return nil end
  local n = tonumber((f:read("*l") or ""):match("^%d+$"))
  f:close()
  return n
end

-- The memory.max of this process's cgroup (v2) and of each above it, the
-- smallest; nil without one.
local function cgroup_limit()
  local f = io.open("/proc/self/cgroup", "r")
  local path = f and f:read("*a"):match("0::(/[^\n]*)")
  if f then f:close() end
  local least
  while path do
    local n = number_in("/sys/fs/cgroup" .. path:gsub("/$", "") .. "/memory.max")
    if n and (not least or n < least) then least = n end
    if path == "/" then break end
    path = path:match("^(.*)/[^/]*$")
    if path == "" then path = "/" end
  end
  return least
end

-- Options.machine_memory() -> bytes: the machine's memory, or less when a
-- cgroup (v1 or v2) limits this process's.
function Options.machine_memory()
  local total, constrained = require("moonjob.core").total_memory()
  local least = total
  for _, n in ipairs({ constrained, cgroup_limit() or 0 }) do
    if n > 0 and n < least then least = n end
  end
  return least
end

-- The default memory_limit of a pool of `size` children: MOONJOB_MEMORY_LIMIT
-- when set (raises when it is no size), else the machine's share per child
-- in whole MiB, at least MEMORY_FLOOR and at most MEMORY_CEILING.
local function default_memory_limit(opts)
  local env = os.getenv("MOONJOB_MEMORY_LIMIT")
  if env and env ~= "" then
    local bytes = Options.size(env)
    if bytes == nil then
      error(("moonjob.pool: MOONJOB_MEMORY_LIMIT must be %s, not '%s'"):format(Options.SIZE_WANTS, env), 0)
    end
    return bytes
  end
  local share = Options.machine_memory() * Options.MEMORY_SHARE / Options.value(opts, "size")
  return math.max(Options.MEMORY_FLOOR, math.min(Options.MEMORY_CEILING, math.floor(share / MIB) * MIB))
end

-- Options.memory_limit(opts) -> bytes, or nil when lifted (false, "none").
function Options.memory_limit(opts)
  local v = Options.value(opts, "memory_limit")
  if type(v) == "string" then v = Options.size(v) end
  return v or nil
end

-- Defaults that depend on the machine or on the other options.
local COMPUTED = {
  memory_limit = default_memory_limit, -- a share of the machine's memory per child
  size = function() return require("moonjob.core").cpu_count() end, -- a child per CPU
  child = function() return require("moonjob.core").child_path() end, -- beside core.so
  codec = function(opts) return opts.redis and "json" or "lua" end, -- Redis carries JSON
  max_payload = function(opts)
    return opts.redis and Options.DEFAULTS.remote_max_payload or Options.DEFAULTS.max_payload
  end,
  pipeline = function(opts) return Options.limited(opts) and 1 or Options.DEFAULTS.pipeline end,
  echo = function() return true end, -- children's output on stderr, tagged
}

-- Options.value(opts, name) -> option `name`: the one given, else its
-- default (computed, or from DEFAULTS or REDIS_DEFAULTS), nil for an
-- option that has none.
function Options.value(opts, name)
  local v = opts[name]
  if v ~= nil then return v end
  local compute = COMPUTED[name]
  if compute then return compute(opts) end
  v = Options.DEFAULTS[name]
  if v ~= nil then return v end
  return Options.REDIS_DEFAULTS[name]
end

local OPTIONS = {
  size = "number", max_payload = "number", codec = "string", echo = "echo",
  jit = "boolean", child = "string", timeout = "number", kill_after = "number",
  ack_timeout = "number", start_timeout = "number", max_jobs_per_child = "number", memory_limit = "memory",
  idle_timeout = "number", min_size = "number", max_procs = "number",
  max_log_bytes = "number", user = "string", attempts = "number", backoff = "backoff",
  dedupe = "dedupe", cache = "number", cache_max = "number", max_queue = "number",
  pools = "table",
  redis = "string", queue = "queue", lease = "number", prefetch = "number", poll = "number",
  keep = "number", keep_age = "number", keep_failed_age = "number", keep_logs = "number",
  worker_name = "string", pipeline = "number", heartbeat = "number",
  raw = "boolean",
  name = "string", -- the pool's label in its metrics (moonjob.pool.metrics)
  rate = "rate", group_concurrency = "number", group_rate = "rate", -- moonjob.pool.limits
}
local POSITIVE = { size = true, max_payload = true, timeout = true, ack_timeout = true,
  start_timeout = true, attempts = true, pipeline = true,
  cache = true, cache_max = true, max_queue = true, group_concurrency = true,
  max_jobs_per_child = true, idle_timeout = true, max_procs = true,
  max_log_bytes = true, lease = true, poll = true, keep_age = true, keep_failed_age = true, heartbeat = true }
local WHOLE = { size = true, max_jobs_per_child = true, min_size = true, max_procs = true,
  attempts = true, cache_max = true, max_queue = true, prefetch = true, keep = true,
  keep_logs = true, pipeline = true, group_concurrency = true }
-- Upper bounds, so that no option reaches C as a number it cannot hold;
-- those of a job's fields are Redis's too (moonjob.redis.names).
local SECONDS_MAX, ATTEMPTS_MAX = names.SECONDS_MAX, names.ATTEMPTS_MAX
Options.SECONDS_MAX = SECONDS_MAX -- the bound on every time, also moonjob.redis's and the CLI's
local MAXIMUM = { size = 1024, max_payload = 2 ^ 30, max_procs = 2 ^ 31 - 1,
  max_log_bytes = 2 ^ 40, attempts = ATTEMPTS_MAX, cache_max = 2 ^ 31, max_queue = 2 ^ 53,
  min_size = 1024, max_jobs_per_child = 2 ^ 53, timeout = SECONDS_MAX, kill_after = SECONDS_MAX,
  ack_timeout = SECONDS_MAX, start_timeout = SECONDS_MAX, idle_timeout = SECONDS_MAX,
  cache = SECONDS_MAX, lease = SECONDS_MAX, poll = 3600, heartbeat = 3600, keep_age = SECONDS_MAX, prefetch = 1e6,
  keep_failed_age = SECONDS_MAX, keep_logs = 10000, keep = 2 ^ 31, group_concurrency = 2 ^ 31, pipeline = require("moonjob.core").frame.MAX_INFLIGHT }
local CODECS = { lua = true, json = true }

------------------------------------------------------- pool options ---

local function option_names()
  local names = {}
  for k in pairs(OPTIONS) do names[#names + 1] = k end
  table.sort(names)
  return table.concat(names, ", ")
end

-- Options.check(opts) -> opts (a table, {} for nil); raises on a bad option.
function Options.check(opts)
  if opts == nil then return {} end
  if type(opts) ~= "table" then error("moonjob.pool: options must be a table", 4) end
  for k, v in pairs(opts) do
    local want = OPTIONS[k]
    if not want then
      error(("moonjob.pool: unknown option '%s' (known: %s)"):format(tostring(k), option_names()), 4)
    end
    if want == "backoff" then
      local ok, why = Backoff.check(v)
      if not ok then error("moonjob.pool: option 'backoff' " .. why, 4) end
    elseif want == "echo" then
      if type(v) ~= "boolean" and type(v) ~= "function" then
        error("moonjob.pool: option 'echo' must be a boolean or a function(line, job, pid)", 4)
      end
    elseif want == "dedupe" then
      if v ~= true and type(v) ~= "function" then
        error("moonjob.pool: option 'dedupe' must be true or a function(data) -> key", 4)
      end
    elseif want == "rate" then
      local ok, why = Options.check_rate(v, k)
      if not ok then error("moonjob.pool: " .. why, 4) end
    elseif want == "memory" then
      if not (v == false or (type(v) == "number" and v >= 1 and v <= MEMORY_MAX) or Options.size(v) ~= nil) then
        error(("moonjob.pool: option 'memory_limit' must be a number of bytes (1 to 2^46), %s, "
          .. "or false (no cap), not %s"):format(Options.SIZE_WANTS,
          type(v) == "string" and ("'%s'"):format(v:sub(1, 40)) or tostring(v)), 4)
      end
    elseif want == "queue" then
      if type(v) ~= "string" and type(v) ~= "table" then
        error("moonjob.pool: option 'queue' must be a queue's name or a list of them, not a " .. type(v), 4)
      end
    elseif type(v) ~= want then
      error(("moonjob.pool: option '%s' must be a %s, not a %s"):format(k, want, type(v)), 4)
    end
  end
  for k, v in pairs(opts) do
    if WHOLE[k] and v ~= math.floor(v) then
      error(("moonjob.pool: option '%s' must be a whole number"):format(k), 4)
    end
    if POSITIVE[k] and not (v > 0) then
      error(("moonjob.pool: option '%s' must be positive"):format(k), 4)
    end
    if type(v) == "number" and not (v >= 0) then
      error(("moonjob.pool: option '%s' must not be negative"):format(k), 4)
    end
    if MAXIMUM[k] and not (v <= MAXIMUM[k]) then
      error(("moonjob.pool: option '%s' must be at most %.0f"):format(k, MAXIMUM[k]), 4)
    end
  end
  if opts.heartbeat and opts.heartbeat < 0.1 then -- (a beat a millisecond on each queue: Redis's time, not news)
    error(("moonjob.pool: option 'heartbeat' must be at least 0.1 s, not %g"):format(opts.heartbeat), 4)
  end
  if opts.codec and not CODECS[opts.codec] then
    error("moonjob.pool: option 'codec' must be \"lua\" or \"json\"", 4)
  end
  if opts.raw and opts.codec ~= "json" and not opts.redis then -- (the text is handed over as it is)
    error("moonjob.pool: option 'raw' needs codec \"json\" (job data given as text)", 4)
  end
  Options.check_remote(opts)
  Options.check_limits(opts)
  return opts
end

------------------------------------------------- rate and groups ---
-- moonjob.pool.limits applies them; these are their rules.

local RATE_MAX = 1e6 -- the starts a rate's window may count (its ring holds their times)
local GROUP_BYTES = 1024 -- a group's name, at most
local RATE_WANTS = "option '%s' must be { max = N (a whole number, 1 or more), per = S "
  .. "(seconds, more than 0) }"

-- A short view of a bad value, for the messages.
local function shown(v)
  if type(v) == "string" then return ("the string %q"):format(v:sub(1, 40)) end
  if type(v) ~= "table" then return tostring(v) end
  local parts = {}
  for k, x in pairs(v) do
    parts[#parts + 1] = ("%s = %s"):format(tostring(k), type(x) == "string" and ("%q"):format(x:sub(1, 40)) or tostring(x))
  end
  table.sort(parts)
  return "{ " .. table.concat(parts, ", ") .. " }"
end

-- Options.check_rate(rate, name) -> true | nil, why: { max = N, per = S }, N
-- a whole number from 1 to 1e6, S seconds above 0 and at most SECONDS_MAX;
-- name: the option's (rate, group_rate).
function Options.check_rate(rate, name)
  local wants = RATE_WANTS:format(name)
  if type(rate) ~= "table" then return nil, wants .. ", not " .. shown(rate) end
  for k in pairs(rate) do
    if k ~= "max" and k ~= "per" then
      return nil, ("option '%s' has an unknown key '%s' (known: max, per)"):format(name, tostring(k))
    end
  end
  local max, per = rate.max, rate.per
  if not (type(max) == "number" and max >= 1 and max <= RATE_MAX and max == math.floor(max))
      or not (type(per) == "number" and per > 0 and per <= SECONDS_MAX) then
    return nil, ("%s, not %s (max at most %.0f, per at most %.0f)"):format(wants, shown(rate),
      RATE_MAX, SECONDS_MAX)
  end
  return true
end

-- Rate, group_concurrency and group_rate: a local pool's (a pool on Redis
-- would count only its own host's jobs), and each child holds one job at a
-- time (a job counts as started when it is sent: none may wait in a child's
-- read-ahead).
function Options.check_limits(opts)
  local which = opts.rate and "rate" or opts.group_concurrency and "group_concurrency"
    or opts.group_rate and "group_rate"
  if not which then return end
  if opts.redis then
    error(("moonjob.pool: option '%s' is for a local pool; a queue on Redis is limited across "
      .. "all its workers by q:set_rate, q:set_concurrency and their group forms"):format(which), 5)
  end
  if opts.pipeline and opts.pipeline > 1 then
    error(("moonjob.pool: option 'pipeline' must be 1 with option '%s' (each child holds one job "
      .. "at a time, so that a job starts when it is sent)"):format(which), 5)
  end
end

-- Option queue: a name, or a list of 1 to QUEUES_MAX names, each once (a
-- worker serving several queues: moonjob.redis.remotes); raises.
local QUEUES_MAX = 64
function Options.check_queues(queue)
  local list = type(queue) == "table" and queue or { queue }
  if #list == 0 or #list > QUEUES_MAX then
    error(("moonjob.pool: option 'queue' must list 1 to %d queues"):format(QUEUES_MAX), 6)
  end
  local seen = {}
  for i = 1, #list do
    local ok, why = names.check_name(list[i])
    if not ok then error("moonjob.pool: option 'queue': " .. why, 6) end
    if seen[list[i]] then error(("moonjob.pool: option 'queue' lists '%s' twice"):format(list[i]), 6) end
    seen[list[i]] = true
  end
end

-- A pool on a Redis queue: redis and queue go together, jobs cross as JSON
-- text, and lease must leave room for renewals (every lease/12) and the
-- self-fence (at 4/5 of a lease).
-- The queue name's rule is moonjob.redis.names's, the URL's
-- moonjob.redis.client's (one definition each); the client is required here,
-- lazily, only for a pool given the redis option.
function Options.check_remote(opts)
  local remote_only = { "lease", "prefetch", "poll", "keep", "keep_age", "keep_failed_age", "keep_logs",
    "worker_name", "heartbeat" }
  if not opts.redis then
    if opts.queue then error("moonjob.pool: option 'queue' needs option 'redis' (a redis:// URL)", 5) end
    for _, k in ipairs(remote_only) do
      if opts[k] ~= nil then error(("moonjob.pool: option '%s' is for a pool on Redis (option 'redis')"):format(k), 5) end
    end
    return
  end
  if not opts.queue then error("moonjob.pool: option 'redis' needs option 'queue' (the queue's name)", 5) end
  Options.check_queues(opts.queue)
  local parsed, perr = require("moonjob.redis.client").parse(opts.redis)
  if not parsed then error("moonjob.pool: option 'redis': " .. perr, 5) end
  if opts.codec and opts.codec ~= "json" then
    error("moonjob.pool: a pool on Redis takes JSON text (codec \"json\"); jobs cross hosts as JSON", 5)
  end
  if opts.lease and opts.lease < 0.3 then
    error("moonjob.pool: option 'lease' must be at least 0.3 seconds (renewed every lease/12)", 5)
  end
end

-- Options.check_processor(file) -> true | nil, ELOAD
function Options.check_processor(file)
  local chunk, message = loadfile(file)
  if chunk then return true end
  local f, why = io.open(file, "r")
  if f then
    f:close()
  else -- io.open's reason names it: "No such file or directory", "Permission denied", ...
    message = ("cannot open processor file '%s': %s"):format(file, why:gsub("^.-: ", ""):lower())
  end
  return nil, errors.new("ELOAD", message)
end

-- Options.check_child_program(path) -> true | nil, ESETUP
function Options.check_child_program(path)
  local f = io.open(path, "rb")
  if f then f:close() return true end
  return nil, errors.new("ESETUP", ("the child program is missing at %s; reinstall moonjob "
    .. "(make install or luarocks make) or pass { child = path }"):format(path))
end

-- Options.child_args(opts, memory) -> the child program's command-line
-- arguments; memory: Options.memory_limit(opts), read once by the pool.
function Options.child_args(opts, memory)
  local args = {}
  if memory then
    args[#args + 1] = "--memory-limit"
    args[#args + 1] = ("%.0f"):format(memory)
  end
  if opts.max_procs then
    args[#args + 1] = "--max-procs"
    args[#args + 1] = ("%.0f"):format(opts.max_procs)
  end
  if opts.user then
    args[#args + 1] = "--user"
    args[#args + 1] = opts.user
  end
  return args
end

------------------------------------------------------- add()'s options ---

local ADD_OPTIONS = { name = true, timeout = "number", kill_after = "number", delay = "number",
  priority = "priority", attempts = "attempts", backoff = "backoff", id = "id", dedupe = "dedupe",
  lines = "lines", first_attempt = "attempts", group = "group" } -- lines, first_attempt: moonjob.cli's batches
  -- (child/batch.lua; a line of a batch that runs again alone), not for users

-- Options.check_add(opts): raises on a bad option of pool:add (nil is fine).
function Options.check_add(opts)
  if opts == nil then return end
  if type(opts) ~= "table" then error("pool:add(): options must be a table", 3) end
  for k, v in pairs(opts) do
    local want = ADD_OPTIONS[k]
    if not want then
      error(("pool:add(): unknown option '%s' (known: attempts, backoff, dedupe, delay, group, "
        .. "id, kill_after, name, priority, timeout)"):format(tostring(k)), 3)
    end
    if want == "number" and not (type(v) == "number" and v >= 0 and v <= SECONDS_MAX) then
      error(("pool:add(): option '%s' must be a number of seconds (0 to %.0f)"):format(k, SECONDS_MAX), 3)
    elseif want == "lines" and not (type(v) == "table" and type(v[1]) == "number" and v[1] >= 1
        and v[1] % 1 == 0 and type(v[2]) == "number" and v[2] >= 1 and v[2] % 1 == 0) then
      error("pool:add(): option 'lines' must be { first line's number, number of lines }", 3)
    elseif want == "priority" and not (type(v) == "number" and v > -math.huge and v < math.huge) then
      error("pool:add(): option 'priority' must be a finite number (lower runs first)", 3)
    elseif want == "attempts" and not (type(v) == "number" and v >= 1 and v <= ATTEMPTS_MAX
        and v == math.floor(v)) then
      error(("pool:add(): option '%s' must be a whole number, 1 or more"):format(k), 3)
    elseif want == "backoff" then
      local ok, why = Backoff.check(v)
      if not ok then error("pool:add(): option 'backoff' " .. why, 3) end
    elseif want == "id" and type(v) ~= "string" and type(v) ~= "number" then
      error("pool:add(): option 'id' must be a string or a number", 3)
    elseif want == "dedupe" and v ~= true and v ~= false and type(v) ~= "function" then
      error("pool:add(): option 'dedupe' must be true, false or a function(data) -> key", 3)
    elseif want == "group" and not (type(v) == "string" and #v >= 1 and #v <= GROUP_BYTES) then
      error(("pool:add(): option 'group' must be a name (a string of 1 to %d bytes), not %s")
        :format(GROUP_BYTES, type(v) == "string" and ("a string of %d bytes"):format(#v) or shown(v)), 3)
    end
  end
end

------------------------------------- a job's options stored on Redis ---

-- A job's timeout or kill_after as a producer wrote it: nil (empty or 0:
-- the worker's), seconds, or false when out of range (any producer may
-- write "inf", "nan", "1e13" or "-1").
local function stored_seconds(s)
  if s == nil or s == "" then return nil end
  local n = tonumber(s)
  if n == 0 then return nil end
  if not n or n ~= n or n < 0 or n > SECONDS_MAX then return false end
  return n
end

-- Options.check_stored(job, f) -> nil | message: the options a producer
-- stored with a job on Redis, as moonjob.redis.remote fetched them (f[4]
-- the attempt's number, f[5] attempts, f[6] backoff as JSON, f[7] timeout,
-- f[8] kill_after), checked as pool:add checks them and set on job; a
-- message for the first out of range.
function Options.check_stored(job, f)
  local timeout, kill_after = stored_seconds(f[7]), stored_seconds(f[8])
  if timeout == false or kill_after == false then
    return ("the job's timeout (%s) or kill_after (%s) in Redis is not a number of seconds from 0 to %.0f")
      :format(tostring(f[7]), tostring(f[8]), SECONDS_MAX)
  end
  job.timeout, job.kill_after = timeout, kill_after
  local made, attempts = tonumber(f[4]) or 1, tonumber(f[5]) or 1
  if made ~= made or attempts ~= attempts or attempts < 1 or attempts > ATTEMPTS_MAX or made < 1 then
    return ("the job's attempts (%s) or attempt number (%s) in Redis is out of range")
      :format(tostring(f[5]), tostring(f[4]))
  end
  job.attempts, job.max_attempts = math.floor(made) - 1, math.floor(attempts)
  if f[6] and f[6] ~= "" then -- written by any producer: checked as pool:add checks it
    local spec = require("moonjob.codec.json").decode(f[6]) -- (a pool on Redis only: loaded then)
    if type(spec) ~= "table" or not Backoff.check(spec) then
      return "the job's backoff in Redis is not a valid backoff: " .. f[6]
    end
    job.backoff = spec
  end
end

return Options
