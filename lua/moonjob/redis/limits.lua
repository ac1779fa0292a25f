-- moonjob.redis.limits -- how fast and how many jobs of a durable queue run,
-- across every worker on every host: the methods q:set_rate,
-- q:set_concurrency, q:set_group_rate, q:set_group_concurrency, q:limits,
-- q:groups and q:held_groups of `moonjob.queue(url, name)` (the queue
-- class, moonjob.redis.producer, takes them from here: each is a function
-- of the queue `q`, and raises at the user's line for a bad argument).
--
--   q:set_rate({ max = 100, per = 1 })   -- at most 100 jobs start in any second
--   q:set_concurrency(5)                 -- at most 5 run at once, all hosts together
--   q:set_rate(nil); q:set_concurrency(nil)   -- no limit again
--   q:set_group_rate({ max = 10, per = 1 })   -- each group (add's group option): 10 a second
--   q:set_group_concurrency(2)           -- each group: at most 2 at once
--
-- Jobs of different groups are handed out round-robin (within a priority)
-- whether or not a group limit is set (functions/groups.lua).
--
-- Redis keeps the limits and fetch applies them with the server's clock
-- (functions/limits.lua): the rate is a sliding window over the times
-- jobs were handed out, exact for any window; the concurrency counts the
-- queue's active jobs (held ahead by a worker, or running). Near a limit a
-- worker takes no job beyond its idle children, so a job starts within
-- milliseconds of being counted; far from it, it holds jobs ahead, each
-- under a rate counted until its longer ahead bound (functions/limits.lua).
-- A processor that meets the remote side's own limit raises
-- error({ code = "ERATELIMIT", retry_after = s }): its job waits again
-- without costing an attempt, and the queue (for a job of a group: its
-- group) holds back for s seconds.
local fcall = require "moonjob.redis.fcall"
local json = require "moonjob.codec.json"
local names = require "moonjob.redis.names"

local M = {}

-- { max, per } | nil -> MAX, PER_MS (0, 1: no limit); raises naming `fn`.
local function check_rate(rate, fn)
  if rate == nil or rate == false then return 0, 1 end
  local ok = type(rate) == "table" and type(rate.max) == "number" and rate.max >= 1 and rate.max % 1 == 0
    and rate.max <= names.ATTEMPTS_MAX and type(rate.per) == "number" and rate.per >= 0.001
    and rate.per <= names.SECONDS_MAX
  if ok then
    for k in pairs(rate) do if k ~= "max" and k ~= "per" then ok = false end end
  end
  if not ok then
    error(("queue:%s(): takes { max = N (a whole number, 1 or more), per = S (seconds, 0.001 or more) }"
      .. " or nil (no limit), not %s"):format(fn, type(rate) == "table" and "that table" or tostring(rate)), 3)
  end
  return rate.max, math.floor(rate.per * 1000 + 0.5)
end

-- n | nil -> N (0: no limit); raises naming `fn`.
local function check_concurrency(n, fn)
  if n ~= nil and n ~= false and (type(n) ~= "number" or n < 1 or n % 1 ~= 0 or n > names.ATTEMPTS_MAX) then
    error(("queue:%s(): takes a whole number, 1 or more, or nil (no limit), not %s"):format(fn, tostring(n)), 3)
  end
  return n or 0
end

-- limits.check[kind](value, fn): raises (naming fn) unless value is one
-- q:set_<kind> takes; a caller setting several checks them all first.
M.check = { rate = check_rate, concurrency = check_concurrency, group_rate = check_rate,
  group_concurrency = check_concurrency }

-- The method q:set_<kind>(value) -> true | nil, err, its value read by
-- check (which raises naming the method) into moonjob_limit's numbers.
local function setter(kind, check)
  local name = "set_" .. kind
  return function(q, value)
    local ok, err = fcall.call(q, "moonjob_limit", 1, q.prefix, kind, check(value, name))
    if not ok then return nil, err end
    return true
  end
end

-- q:set_rate({ max, per } | nil): at most max jobs start in any `per`
-- seconds, on all workers together; nil: no limit.
M.set_rate = setter("rate", check_rate)
-- q:set_concurrency(n | nil): at most n jobs of the queue active at once
-- (held by a worker or running), on all workers.
M.set_concurrency = setter("concurrency", check_concurrency)
-- q:set_group_rate({ max, per } | nil): the same for each group (each
-- group its own window); q:set_group_concurrency(n | nil): at most n jobs
-- of each group active at once.
M.set_group_rate = setter("group_rate", check_rate)
M.set_group_concurrency = setter("group_concurrency", check_concurrency)

-- q:groups' options -> its limit; raises.
local function groups_limit(opts)
  local limit = type(opts) == "table" and opts.limit or 100
  if type(opts) ~= "nil" and type(opts) ~= "table" or type(limit) ~= "number" or limit < 1 or limit > 1000
      or limit % 1 ~= 0 then
    error("queue:groups(): takes nil or { limit = n } (a whole number from 1 to 1000)", 3)
  end
  for k in pairs(opts or {}) do
    if k ~= "limit" then error(("queue:groups(): unknown option '%s' (known: limit)"):format(tostring(k)), 3) end
  end
  return limit
end

-- q:groups([{ limit = n }]) -> { { group, state, waiting, active,
-- seconds }, ... } | nil, err: the groups with waiting jobs (at most
-- limit, 100 by default, 1,000 at most), those held back first: state
-- "held" (a job said ERATELIMIT; seconds left), "at_cap" (its
-- concurrency is full), "rate" (its window is full; seconds until it has
-- room), then "ready" ones in turn order.
function M.groups(q, opts)
  local rows, err = fcall.call(q, "moonjob_groups", 1, q.prefix, groups_limit(opts))
  if not rows then return nil, err end
  local out = {}
  for i, r in ipairs(rows) do
    out[i] = { group = r[1], state = r[2], waiting = r[3], active = r[4], seconds = r[5] / 1000 }
  end
  return out
end

-- q:held_groups(counts, limit) -> the first `limit` groups held back
-- (q:groups' rows, as a JSON array: empty when none) | nil, err; counts:
-- q:limits().groups, so that a queue with none held back costs no look.
function M.held_groups(q, counts, limit)
  local held = setmetatable({}, json.array_mt)
  if counts.held_back == 0 then return held end
  local rows, err = M.groups(q, { limit = limit })
  if not rows then return nil, err end
  for _, row in ipairs(rows) do
    if row.state ~= "ready" then held[#held + 1] = row end
  end
  return held
end

-- q:limits() -> { rate = { max, per } | nil, concurrency = n | nil,
-- held_back = s (an ERATELIMIT hold left, 0 none), started = jobs handed
-- out in the rate's current window, active = jobs active, group_rate =
-- { max, per } | nil, group_concurrency = n | nil, groups = { ready = n,
-- held_back = n } (groups with waiting jobs: that may take one now, that
-- may not: q:groups() says why) } | nil, err.
function M.limits(q)
  local r, err = fcall.call(q, "moonjob_limits", 1, q.prefix)
  if not r then return nil, err end
  return { rate = r[1] > 0 and { max = r[1], per = r[2] / 1000 } or nil,
    concurrency = r[3] > 0 and r[3] or nil, held_back = r[4] / 1000, started = r[5], active = r[6],
    group_rate = (r[7] or 0) > 0 and { max = r[7], per = r[8] / 1000 } or nil,
    group_concurrency = (r[9] or 0) > 0 and r[9] or nil,
    groups = { ready = r[10] or 0, held_back = r[11] or 0 } }
end

return M
