-- part: limits.lua
-- Limits across every worker of a queue, kept in Redis and applied by
-- fetch with the server's clock:
--   <p>limits   hash: rate_max, rate_per (ms): at most rate_max jobs
--               start in any rate_per ms; concurrency: at most that many
--               active at once (held or running); group_rate_max,
--               group_rate_per, group_concurrency: the same for each
--               group (groups.lua)
--   <p>starts   sorted set: the tokens handed out lately, each scored by
--               the latest time its job may start: its hand-out plus the
--               rate's start bound (a sliding window: exact for any
--               window, not only whole seconds)
--   <p>limited  string: present while the queue holds back after a job
--               said the remote side pushed back (ERATELIMIT); its TTL is
--               how long
-- A job is counted when it is handed out, but it starts on the worker a
-- little later: the rate's start bound B (start_bound) is how much later
-- at most. Each fetch's reply gives its jobs' bound; the worker gives back
-- a job it has not sent to an idle child within B of sending its fetch
-- (which is no later than the hand-out: no clock between hosts matters). A
-- hand-out at t counts as a start at t + B, so that at most rate_max are
-- handed out in any rate_per + B ms: then, each starting within [t, t + B],
-- at most rate_max start in any rate_per ms. The same holds for each
-- group's rate (groups.lua).
-- The proof needs no common bound: a job counted at t + B_j starts within
-- [t, t + B_j]; a hand-out at now sees every job counted at now - rate_per
-- or later, which takes in every job whose start may share a window of
-- rate_per with its own. So a worker may hold jobs ahead under a rate: the
-- first FREE of a fetch (the worker's children that can start one now)
-- take the start bound B, the others the ahead bound (ahead_bound: up to
-- 1 s), while the window stays far from full: after the fetch, at least
-- half of rate_max left (near it, no more than FREE: one worker holding
-- ahead would leave the others' children idle, and the ahead bound keeps
-- its entries counted longer). The same for each group's rate, and for a
-- group's cap (held jobs count as active): ahead only while the group has
-- more than the fetch's N places left (groups.lua, G.room). Under a
-- concurrency cap held jobs count as active: a worker may hold them ahead
-- while the cap is far, but near it takes no more than FREE.

do
local REGISTRY, DELAY_MS_MAX, ATTEMPTS_MAX, now_ms = H.REGISTRY, H.DELAY_MS_MAX, H.ATTEMPTS_MAX, H.now_ms
local publish, refuse, check_numbers = H.publish, H.refuse, H.check_numbers

local LIMIT_FIELDS = { "rate_max", "rate_per", "concurrency", "group_rate_max", "group_rate_per",
  "group_concurrency" }

-- A rate's start bound (ms): per/20, from 10 ms to 1 s. It costs the
-- rate per/(per + B) of its throughput: at most 5% from per = 200 ms on.
local function start_bound(per)
  return math.min(1000, math.max(10, math.floor(per / 20)))
end

-- The bound of a job held ahead (ms): rate_per, from the start bound to
-- 1 s. A held job starts within it or goes back; its entry counts that much
-- longer in the window (what a rate that comes to bind pays once).
local function ahead_bound(per)
  return math.max(start_bound(per), math.min(1000, per))
end

-- Limits { rate_max, rate_per, start_ms, ahead_ms, concurrency } (numbers
-- or nil) from three fields, or nil when they say none.
local function limit_set(max, per, concurrency)
  local lim = { rate_max = tonumber(max), rate_per = tonumber(per), concurrency = tonumber(concurrency) }
  if not (lim.rate_max and lim.rate_per) then lim.rate_max, lim.rate_per = nil, nil
  else lim.start_ms, lim.ahead_ms = start_bound(lim.rate_per), ahead_bound(lim.rate_per) end
  if not (lim.rate_max or lim.concurrency) then return nil end
  return lim
end

-- The queue's limits and each group's (limit_set's tables, or nil when
-- none). A limits key of another type holds none; strict (fetch, before it
-- takes a job): any other error raises, as no limit would be applied.
local function read_limits(p, strict)
  local f = redis.pcall("HMGET", p .. "limits", unpack(LIMIT_FIELDS))
  if strict and H.wrong_type(f, "HMGET", p .. "limits") or f.err then return nil, nil end
  return limit_set(f[1], f[2], f[3]), limit_set(f[4], f[5], f[6])
end

-- The rate's window: how many more jobs it takes now, and when (ms from
-- now) it next has room if none. An entry counts while its score (its
-- job's latest start) is at most rate_per ms ago. A starts key of another type (written by
-- another client) is bookkeeping of ours: it is replaced.
local function rate_room(p, lim, now)
  local key = p .. "starts"
  local trimmed = redis.pcall("ZREMRANGEBYSCORE", key, "-inf", "(" .. (now - lim.rate_per))
  if H.wrong_type(trimmed, "ZREMRANGEBYSCORE", key) then redis.call("DEL", key) end
  local left = lim.rate_max - redis.call("ZCARD", key)
  if left > 0 then return left, nil end
  local oldest = redis.call("ZRANGE", key, 0, 0, "WITHSCORES")
  return 0, oldest[2] and (tonumber(oldest[2]) + lim.rate_per + 1 - now) or lim.rate_per
end

-- How many jobs fetch may hand out now under lim (at most n; near a cap or
-- a full rate window, at most free), and when to look again (ms from now)
-- when the rate says none, else nil.
local function allowance(p, lim, n, free, now)
  if lim.concurrency then
    local room = math.max(0, lim.concurrency - redis.call("ZCARD", p .. "active"))
    -- near the cap, no more than the worker can start now: one worker
    -- holding jobs ahead would leave the others' children idle
    if room <= n and free then room = math.min(room, free) end
    n = math.min(n, room)
  end
  if lim.rate_max and n > 0 then
    local left, wait = rate_room(p, lim, now)
    if free and n > free and left - n < lim.rate_max / 2 then n = free end -- (near: none ahead)
    if left < n then return left, wait end
  end
  return n, nil
end

-- Jobs handed out count in the rate's window as starts at now + their
-- bound: the start bound for the first `short`, the ahead bound for the
-- others (one entry per token; ZADD in chunks: Lua's unpack has a bound).
local function count_starts(p, lim, tokens, now, short)
  if not (lim and lim.rate_max) or #tokens == 0 then return end
  for first = 1, #tokens, 500 do
    local args = { "ZADD", p .. "starts" }
    for i = first, math.min(first + 499, #tokens) do
      args[#args + 1] = now + (i > short and lim.ahead_ms or lim.start_ms)
      args[#args + 1] = tokens[i]
    end
    redis.call(unpack(args))
  end
  redis.call("PEXPIRE", p .. "starts", lim.rate_per + lim.ahead_ms + 1000)
end

-- The bound of a row held ahead (beyond the fetch's first `short`) that
-- carries a start bound: the least ahead bound of the rates it is counted
-- under (lim's; glim's for a job of a group), as its entries.
local function bound_ahead(rows, short, lim, glim)
  if not ((lim and lim.rate_max) or (glim and glim.rate_max)) then return end
  for i = short + 1, #rows do
    local row = rows[i]
    if type(row[11]) == "number" then -- (a flow's parent has "" there: no bound)
      local b = lim and lim.rate_max and lim.ahead_ms or math.huge
      if glim and glim.rate_max and (row[10] or "") ~= "" then b = math.min(b, glim.ahead_ms) end
      row[11] = b
    end
  end
end

-- freed jobs left the active set: under a concurrency limit, when that
-- brings it below the cap while jobs wait, workers refused for it are
-- told to look again ("added" on <p>events; once per crossing, not per job).
local function slot_freed(p, freed)
  local c = redis.pcall("HGET", p .. "limits", "concurrency")
  c = type(c) == "string" and tonumber(c)
  if not c or freed < 1 then return end
  local active = redis.call("ZCARD", p .. "active")
  if active < c and active + freed >= c and redis.call("ZCARD", p .. "wait") > 0 then publish(p, "added") end
end

local RATE_NUMBERS = { { 2, "MAX must be a whole number of jobs from 0 (no limit) to 2^31", 0, ATTEMPTS_MAX, true },
  { 3, "PER_MS must be a whole number of ms from 1 to 1e12", 1, DELAY_MS_MAX, true } }
local CONCURRENCY_NUMBERS = { { 2, "N must be a whole number from 0 (no limit) to 2^31", 0, ATTEMPTS_MAX, true } }
local LIMIT_NUMBERS = { rate = RATE_NUMBERS, concurrency = CONCURRENCY_NUMBERS,
  group_rate = RATE_NUMBERS, group_concurrency = CONCURRENCY_NUMBERS }

-- limit(p; "rate", max, per_ms) | limit(p; "concurrency", n), and the same
-- with group_rate and group_concurrency (each group's) -> "OK": the limit
-- set, or removed with 0.
local function limit(keys, args)
  local p, fn, kind = keys[1], "moonjob_limit", args[1]
  local specs = LIMIT_NUMBERS[kind or ""]
  if not specs then
    return refuse(fn, "KIND must be rate (MAX PER_MS), concurrency (N), group_rate (MAX PER_MS) or "
      .. "group_concurrency (N)", kind or "")
  end
  local given = true
  for i = 2, #args do given = given and args[i] ~= "" end
  if #args ~= #specs + 1 or not given then
    return refuse(fn, ("%s takes %d number(s), none empty; arguments given"):format(kind, #specs), #args - 1)
  end
  local refused = check_numbers(fn, args, specs)
  if refused then return refused end
  local key = p .. "limits"
  if redis.call("TYPE", key).ok ~= "hash" then redis.call("DEL", key) end -- another client's: replaced
  local field = kind == "rate" and "rate_max" or kind == "group_rate" and "group_rate_max" or kind
  if tonumber(args[2]) == 0 then
    redis.call("HDEL", key, field, (field:gsub("_max$", "_per")))
  elseif specs == RATE_NUMBERS then
    redis.call("HSET", key, field, args[2], (field:gsub("_max$", "_per")), args[3])
  else
    redis.call("HSET", key, field, args[2])
  end
  if kind:find("^group_") then G.unpark_all(p) end -- each parked group is looked at again
  if specs == CONCURRENCY_NUMBERS or tonumber(args[2]) == 0 or kind:find("^group_") then
    publish(p, "added") -- workers look again
  end
  redis.pcall("SADD", REGISTRY, H.queue_name(p))
  return "OK"
end

-- limits(p) -> { rate_max, rate_per_ms, concurrency, limited_ms,
-- started_in_window (handed out, counted until rate_per ms after their
-- start bound), active, group_rate_max, group_rate_per_ms,
-- group_concurrency, groups_ready, groups_parked } (0 for none; groups_*:
-- groups with waiting jobs that may take one now, and that may not).
local function limits(keys)
  local p = keys[1]
  local lim, glim = read_limits(p)
  lim, glim = lim or {}, glim or {}
  local in_window = 0
  if lim.rate_max then
    in_window = redis.call("ZCOUNT", p .. "starts", "(" .. (now_ms() - lim.rate_per), "+inf")
  end
  return { lim.rate_max or 0, lim.rate_per or 0, lim.concurrency or 0,
    math.max(0, redis.call("PTTL", p .. "limited")), in_window, redis.call("ZCARD", p .. "active"),
    glim.rate_max or 0, glim.rate_per or 0, glim.concurrency or 0,
    redis.call("ZCARD", p .. "groups") - (redis.call("ZSCORE", p .. "groups", "") and 1 or 0)
      + redis.call("ZCOUNT", p .. "gparked", "-inf", now_ms()), -- (their time came: the next fetch takes them back)
    redis.call("ZCOUNT", p .. "gparked", "(" .. now_ms(), "+inf") }
end

L.read_limits, L.rate_room, L.allowance, L.count_starts = read_limits, rate_room, allowance, count_starts
L.bound_ahead = bound_ahead
L.slot_freed = slot_freed
F.limit, F.limits = limit, limits
end
