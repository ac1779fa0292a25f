-- moonjob.redis.names -- the names and numbers moonjob's Lua side shares with
-- its function library in Redis: a queue's key prefix and the rule for its
-- name, the registry of queues, the markers of fetch and complete, and the
-- bounds of a job's fields.
--
-- The library (redis/functions/) runs inside Redis, as text, and cannot
-- require this module: it keeps its own copies (REGISTRY, PAUSED,
-- RUN_MS_MARK, SECONDS_MAX, ATTEMPTS_MAX, ADDED_KEEP_MS, RUN_BUCKETS_PER_DOUBLING,
-- RUN_BUCKET_DOUBLINGS and run_bound's rule), which must stay
-- equal to these (spec/redis/library_spec.lua compares them). Small, and requiring
-- nothing when loaded: a pool's options and its Redis owner
-- (moonjob.redis.remote) load it without the producer.

local M = {}

-- The set of queue names (the library's REGISTRY: adds, pauses and
-- workers at connect write it; the one key outside a queue's prefix).
M.REGISTRY = "mj:queues"
M.PAUSED = -2          -- moonjob_fetch's answer while the queue is paused
M.RUN_MS_MARK = "\0ms" -- moonjob_complete's first argument: quads, each with its run ms

-- Bounds of a job's fields, checked on this side before a call and by
-- Redis again (for producers in other languages).
M.SECONDS_MAX = 1e9    -- every time: timeout, kill_after, cache, delay, a rate's window
M.ATTEMPTS_MAX = 2 ^ 31 -- attempts; also a rate's max and a concurrency

-- An add whose reply was lost: Redis remembers a named call's reply for
-- ADDED_KEEP_MS; the producer sends such a call again for at most
-- RESOLVE_MAX seconds from its first send (the default, and the most
-- `resolve` takes): every copy of it then runs well within what Redis keeps.
M.ADDED_KEEP_MS = 600000
M.RESOLVE_MAX = 300

-- The run-time histogram's buckets, one set for every histogram of run
-- times (a pool's, a worker's and the dashboard's /metrics, Redis' metrics):
-- log-linear, RUN_BUCKETS_PER_DOUBLING buckets per power of two from 1 ms
-- to 2^RUN_BUCKET_DOUBLINGS ms (17.5 min). Bound k (k = 0 ..) is 2^(k/8) ms
-- written as a short exact decimal: 4 significant digits below 1 s, whole
-- ms from there (run_bound). The first bucket holds runs of 1 ms or less,
-- one more (after the last bound) those above 2^20 ms.
M.RUN_BUCKETS_PER_DOUBLING = 8
M.RUN_BUCKET_DOUBLINGS = 20

-- names.run_bound(k) -> bound k's text (ms); Redis' copy writes the same.
function M.run_bound(k)
  local v = 2 ^ (k / M.RUN_BUCKETS_PER_DOUBLING)
  if v < 999.5 then return ("%.4g"):format(v) end
  return ("%d"):format(math.floor(v + 0.5))
end

-- The bounds in ms (numbers), bound k at k + 1.
M.RUN_BOUNDS_MS = {}
for k = 0, M.RUN_BUCKETS_PER_DOUBLING * M.RUN_BUCKET_DOUBLINGS do
  M.RUN_BOUNDS_MS[k + 1] = tonumber(M.run_bound(k))
end

-- The key prefix of a queue: every key shares one hash tag, so one cluster
-- slot. A plain name is the tag, whole: "images" -> "mj:{images}:". A name
-- "{TAG}REST" shares TAG's slot with every queue named so, and with the
-- queue TAG: "{shop}/images" -> "mj:{shop}/images:" (a flow's jobs may be on
-- such queues: one FCALL reaches them all). REST has no ":", so no two
-- queues' keys can meet.
function M.prefix(name)
  if name:sub(1, 1) == "{" then return "mj:" .. name .. ":" end
  return "mj:{" .. name .. "}:"
end

local NAME_RULE = "a queue name must be a non-empty string of at most 200 characters without control characters:"
  .. " a plain name without { } (\"images\"), or {TAG}NAME (\"{shop}/images\": queues of one TAG share a"
  .. " Redis slot) with a TAG and a NAME that are not empty, neither with { }, NAME without ':'"

-- names.check_name(name) -> true | nil, why: a queue's name goes into its
-- prefix (M.prefix) and into the registry.
function M.check_name(name)
  if type(name) ~= "string" or name == "" or #name > 200 or name:find("%c") then return nil, NAME_RULE end
  if not name:find("[{}]") then return true end
  local tag, rest = name:match("^{([^{}]+)}([^{}]+)$")
  if not tag or rest:find(":", 1, true) then return nil, NAME_RULE end
  return true
end

-- The hash tag of a queue's keys (M.prefix's): queues with one tag share a
-- Redis slot, and only they may be in one flow.
function M.tag(name)
  return name:match("^{([^{}]+)}") or name
end

-- A queue's name from its prefix (M.prefix's inverse; the library's
-- queue_name): "mj:{images}:" -> "images", "mj:{shop}/images:" ->
-- "{shop}/images"; nil for a key that is no queue's prefix.
function M.queue_name(prefix)
  if type(prefix) ~= "string" or prefix:sub(1, 3) ~= "mj:" or prefix:sub(-1) ~= ":" then return nil end
  if prefix:sub(-2) == "}:" and prefix:sub(4, 4) == "{" then return prefix:sub(5, -3) end
  return prefix:sub(4, -2)
end

-- The library's functions that register the queues of their keys (their
-- own SADD to REGISTRY): a cluster, where that SADD is refused (another
-- slot), has its client write it instead (moonjob.redis.cluster).
M.REGISTERING = { moonjob_add = true, moonjob_add_bulk = true, moonjob_add_flow = true, moonjob_limit = true,
  moonjob_pause = true, moonjob_schedule = true }

-- The queue's name in the registry moonjob.queues() reads (best effort: a
-- user the ACL keeps to its own keys may not write it; docs/REDIS.md). A
-- cluster's client keeps it registered (c:register).
function M.register(c, name)
  if c.register then return c:register(name) end
  c:call({ "SADD", M.REGISTRY, name }, function() end)
end

-- What stands for random bytes when /dev/urandom is not there: the clock
-- and pid, whole; without moonjob's core (moonjob.producer on any Lua), the
-- time, the CPU clock and a fresh table's address.
local function not_random()
  local ok, core = pcall(require, "moonjob.core")
  if ok then return tostring(require("moonjob.loop").now()) .. tostring(core.getpid()) end
  return tostring(os.time()) .. tostring(os.clock()) .. tostring({})
end

-- n random bytes as hex: a worker's id (moonjob.redis.remote), a queue
-- object's nonces.
function M.random_hex(n)
  local f = io.open("/dev/urandom", "rb")
  local bytes = f and f:read(n) or not_random()
  if f then f:close() end
  return (bytes:gsub(".", function(ch) return ("%02x"):format(ch:byte()) end))
end

-- This machine's name (a worker's id starts with it; its heartbeat says it),
-- or nil when /proc does not tell it.
function M.hostname()
  local f = io.open("/proc/sys/kernel/hostname")
  local host = f and f:read("*l")
  if f then f:close() end
  return host
end

return M
