-- part: groups.lua
-- A job added with GROUP belongs to that group (a tenant, a customer).
-- fetch hands out jobs round-robin between groups, within a priority (the
-- best priority waiting first), so a group with a huge backlog takes its
-- turn like one with a few jobs; jobs of no group take their turns together,
-- as one more group. Each group may have its own rate and concurrency cap
-- (the same numbers for every group: group_rate_max, group_rate_per,
-- group_concurrency in <p>limits), and a job's ERATELIMIT holds back only its
-- group. Keys:
--   <p>gw:<group>  sorted set: the group's waiting jobs (wait's scores and
--                  members)
--   <p>ungrouped   sorted set: the same for the jobs of no group, kept only
--                  while groups have waiting jobs
--   <p>groups      sorted set: the ring: groups with waiting jobs that may
--                  take one, by their turn ("": the jobs of no group)
--   <p>gparked     sorted set: groups with waiting jobs that may not now, by
--                  when to look again (ms; one at its cap: when the first
--                  lease of its jobs ends, or sooner, when one leaves active)
--   <p>ga:<group>  set: the group's active jobs (its cap counts them)
--   <p>gs:<group>  sorted set: the group's rate window (as <p>starts: each
--                  hand-out scored by its job's latest start)
--   <p>gl:<group>  string: the group's ERATELIMIT hold; its TTL is how long
--   <p>turn        counter: the ring's turns
--   <p>gkeys       sorted set: groups whose gs: or gl: key may be there, by
--                  when it expires at the latest (ms; for obliterate)
--   <p>gswitch     hash: s, m: the score and member of wait's last job
--                  copied into <p>ungrouped, while the switch into group
--                  mode goes on (s "": none yet)
--   <p>gunpark     string: the ZSCAN cursor of the walk over <p>gparked
--                  after a group limit changed, while it goes on
-- <p>wait stays the set of every waiting job (listings, counts and drain
-- see no difference); the group sets index it. A queue whose waiting jobs
-- have no group keeps no index ("group mode" is off: groups and gparked are
-- empty) and fetch pops wait directly; the first grouped job made waiting
-- turns it on (every job waiting then is of no group: wait is copied into
-- <p>ungrouped, SWITCH_STEP jobs per call, G.copy), and it turns off once
-- the index is empty. An index
-- entry whose job no longer waits is dropped when fetch reaches it (its
-- ZREM from wait says 0), so a path that misses one loses nothing.

do
local now_ms, job_key, publish, check_numbers = H.now_ms, H.job_key, H.publish, H.check_numbers
local read_limits = L.read_limits

local GROUP_WALK_MAX = 64 -- groups looked at per job handed out (then: the group of the job first in line)
local UNPARK_MAX = 100 -- parked groups whose time came, back in the ring per fetch
-- Work of one call over a whole set, at most: no call blocks Redis long
-- however many jobs wait (one step of each is a few ms).
local SWITCH_STEP = 1000 -- waiting jobs looked at per step of the switch into group mode
local UNPARK_STEP = 1000 -- parked groups looked at again per step after a group limit changed
local SWEEP_MAX = 1000 -- groups swept per call (drain, obliterate)
local LIST_GROUPS_MAX = 1000

function G.set(p, g)
  if g == "" then return p .. "ungrouped" end
  return p .. "gw:" .. g
end

function G.on(p) return redis.call("EXISTS", p .. "groups", p .. "gparked") > 0 end

-- ZADD to a key of the groups' bookkeeping; one of another type (written
-- by another client) is replaced, so that it never fails a call half-way.
-- Any other error raises (H.wrong_type): the key is not deleted for it.
function G.zadd(key, ...)
  local r = redis.pcall("ZADD", key, ...)
  if H.wrong_type(r, "ZADD", key) then
    redis.call("DEL", key)
    r = redis.call("ZADD", key, ...)
  end
  return r
end

-- Whether g is a member of sorted set key (one of another type is deleted:
-- it holds none).
function G.has(key, g)
  local r = redis.pcall("ZSCORE", key, g)
  if H.wrong_type(r, "ZSCORE", key) then
    redis.call("DEL", key)
    return false
  end
  return r ~= false
end

-- Group g has waiting jobs: it joins the ring, last, unless it is there or
-- parked already (or held back by ERATELIMIT: then parked until then); a
-- group with no waiting job left stays out. -> true when it joined the
-- ring now.
function G.enter(p, g, now)
  if not G.has(p .. "groups", g) and not G.has(p .. "gparked", g) and redis.call("ZCARD", G.set(p, g)) > 0 then
    local hold = g ~= "" and redis.call("PTTL", p .. "gl:" .. g) or -2
    if hold > 0 then G.zadd(p .. "gparked", now + hold, g)
    else
      G.zadd(p .. "groups", redis.call("INCR", p .. "turn"), g)
      return true
    end
  end
  return false
end

-- A job made waiting (member, score prio) of group g ("": none) indexed.
-- A group that joins an empty ring is announced ("added"): workers that
-- found every group parked look again.
function G.index(p, g, prio, member, now)
  local on = G.on(p)
  if g == "" then
    if not on then return end
  elseif not on and redis.call("EXISTS", p .. "wait") == 1 then
    G.switch(p, now) -- every job waiting until now is of no group
  end
  G.zadd(G.set(p, g), prio, member)
  if G.enter(p, g, now) and redis.call("ZCARD", p .. "groups") == 1
      and redis.call("EXISTS", p .. "limited") == 0 then
    publish(p, "added")
  end
end

-- The switch into group mode: every job waiting now is of no group, and
-- <p>ungrouped must index them. They are copied in wait's order, from its
-- head, SWITCH_STEP per call (this one, then each fetch: G.copy); "" keeps
-- its turn in the ring meanwhile, and G.pick takes a job of no group only
-- while the first of <p>ungrouped comes before the cursor (every job not
-- copied comes after it), else nothing of a worse priority.
function G.switch(p, now)
  redis.call("UNLINK", p .. "ungrouped") -- (entries of jobs that no longer wait, if any)
  redis.call("DEL", p .. "gswitch")
  redis.call("HSET", p .. "gswitch", "s", "", "m", "")
  G.zadd(p .. "groups", redis.call("INCR", p .. "turn"), "")
  G.copy(p, now)
end

-- The switch's cursor { score, member } (score "": nothing copied yet), or
-- nil when no switch goes on.
function G.cursor(p)
  local c = redis.pcall("HMGET", p .. "gswitch", "s", "m")
  if c.err or not c[1] then return nil end
  return c
end

-- Whether first ({ member, score } of <p>ungrouped, or empty) comes before
-- every job of no group not copied yet (cur: G.cursor's; nil: no switch).
-- wait orders equal scores by member: "<16-digit arrival>:<id>".
function G.copied(cur, first)
  if not cur then return true end
  if not first[1] or cur[1] == "" then return false end
  local s, cs = tonumber(first[2]), tonumber(cur[1])
  if s ~= cs then return s < cs end
  local a, b = tonumber(string.sub(first[1], 1, 16)), tonumber(string.sub(cur[2], 1, 16))
  if a and b then return a <= b end
  return first[1] == cur[2]
end

-- One step of the switch: the next SWITCH_STEP members of wait after the
-- cursor, those of no group copied into <p>ungrouped (a member already
-- there is set again, never doubled). A sentinel member just after the
-- cursor, added and removed in this call, gives their rank (the cursor's
-- job may have left wait). -> whether the switch goes on.
function G.copy(p, now)
  local cur = G.cursor(p)
  if not cur then return false end
  local wait, start = p .. "wait", 0
  if cur[1] ~= "" then
    local sentinel = cur[2] .. "\0"
    redis.call("ZADD", wait, cur[1], sentinel)
    start = redis.call("ZRANK", wait, sentinel)
    redis.call("ZREM", wait, sentinel)
  end
  local got = redis.call("ZRANGE", wait, start, start + SWITCH_STEP - 1, "WITHSCORES")
  for i = 1, #got, 2 do
    local g = redis.pcall("HGET", job_key(p, string.sub(got[i], 18)), "group")
    if type(g) ~= "string" or g == "" then G.zadd(p .. "ungrouped", got[i + 1], got[i]) end
  end
  if #got < 2 * SWITCH_STEP then -- the last step
    redis.call("DEL", p .. "gswitch")
    G.enter(p, "", now)
    return false
  end
  redis.call("HSET", p .. "gswitch", "s", got[#got], "m", got[#got - 1])
  if not G.has(p .. "groups", "") then G.zadd(p .. "groups", redis.call("INCR", p .. "turn"), "") end
  return true
end

-- A waiting job (member) of group g (nil: none) no longer waits; a group
-- left with none leaves the ring (or the parked set: a hold stays in its
-- gl key, and G.enter parks the group again).
function G.unindex(p, g, member)
  if not member then return end
  g = g or ""
  local set = G.set(p, g)
  if redis.call("ZREM", set, member) == 1 and redis.call("ZCARD", set) == 0
      and (g ~= "" or redis.call("EXISTS", p .. "gswitch") == 0) then -- (while the switch goes on, "" stays)
    redis.call("ZREM", p .. "groups", g)
    redis.call("ZREM", p .. "gparked", g)
  end
end

-- Job id of group g (nil: none) left active: its group's place is free,
-- and a parked group may take a job again (a hold parks it again).
function G.left(p, g, id)
  if not g or g == "" or redis.pcall("SREM", p .. "ga:" .. g, id) ~= 1 then return end
  if redis.call("ZREM", p .. "gparked", g) == 0 then return end
  local now = now_ms()
  local _, glim = read_limits(p)
  if G.enter(p, g, now) and G.room(p, g, now, glim) then publish(p, "added") end -- (else parked again)
end

-- Group g may take no job until ms until_ms; hold: a later time already
-- there stays.
function G.park(p, g, until_ms, hold)
  redis.call("ZREM", p .. "groups", g)
  if hold then redis.call("ZADD", p .. "gparked", "GT", until_ms, g)
  else redis.call("ZADD", p .. "gparked", until_ms, g) end
end

-- The parked groups whose time came go back to the ring (once per fetch).
function G.unpark_due(p, now)
  for _, g in ipairs(redis.call("ZRANGEBYSCORE", p .. "gparked", "-inf", now, "LIMIT", 0, UNPARK_MAX)) do
    redis.call("ZREM", p .. "gparked", g)
    G.enter(p, g, now)
  end
end

-- Every parked group is looked at again under the new limits (a group
-- limit changed): back to the ring, or parked again as G.enter (a hold)
-- and G.room (a cap, a window) say. In steps: this call takes the first
-- (G.unpark_step), each fetch the next, until the walk is over.
function G.unpark_all(p)
  redis.call("SET", p .. "gunpark", "0")
  G.unpark_step(p, now_ms())
end

-- One step of the walk over the parked groups (ZSCAN: a group parked
-- again meanwhile may come twice, none that stays parked is missed). ->
-- whether the walk goes on.
function G.unpark_step(p, now)
  local cursor = redis.pcall("GET", p .. "gunpark")
  if type(cursor) ~= "string" then
    if cursor then redis.call("DEL", p .. "gunpark") end -- (a key of another type: no walk)
    return false
  end
  local _, glim = read_limits(p)
  local r = redis.call("ZSCAN", p .. "gparked", cursor, "COUNT", UNPARK_STEP)
  for i = 1, #r[2], 2 do
    local g = r[2][i]
    if redis.call("ZREM", p .. "gparked", g) == 1 and G.enter(p, g, now) then G.room(p, g, now, glim) end
  end
  if r[1] == "0" then
    redis.call("DEL", p .. "gunpark")
    return false
  end
  redis.call("SET", p .. "gunpark", r[1])
  return true
end

-- The job of group g that fetch hands out now counts against its cap and
-- rate (a start at now + the rate's start bound, or its ahead bound for a
-- job beyond the fetch's first glim.short, as count_starts).
function G.started(p, g, id, token, now, glim)
  if glim then glim.taken = (glim.taken or 0) + 1 end
  if g == "" then return end
  local added = redis.call("SADD", p .. "ga:" .. g, id)
  if not glim then return end
  local seen = G.seen(glim, g)
  if seen.a then seen.a = seen.a + added end
  if glim.rate_max then
    local ahead = glim.taken > (glim.short or glim.taken)
    redis.call("ZADD", p .. "gs:" .. g, now + (ahead and glim.ahead_ms or glim.start_ms), token)
    if seen.w then seen.w = seen.w + 1 end -- (a token is never in the window already)
    if seen.noted then return end -- (once per group and call: now is the call's)
    seen.noted = true
    redis.call("ZREMRANGEBYSCORE", p .. "gs:" .. g, "-inf", "(" .. (now - glim.rate_per)) -- (G.room may not trim)
    redis.call("PEXPIRE", p .. "gs:" .. g, glim.rate_per + glim.ahead_ms + 1000)
    H.note(p, "gkeys", g, now + glim.rate_per + glim.ahead_ms + 1000, now)
  end
end

-- What this call knows of group g under glim (a table of read_limits',
-- made for this call): a, its active count; w, its window's count, trimmed
-- or not (never fewer than those in it); noted, its window's keys noted.
-- Nothing else changes them while a fetch takes jobs: G.started counts
-- what it adds.
function G.seen(glim, g)
  local all = glim.seen
  if not all then all = {}; glim.seen = all end
  local one = all[g]
  if not one then one = {}; all[g] = one end
  return one
end

-- Whether group g may take a job now under the groups' limits glim; if
-- not, it is parked until it may. For a job held ahead (fetch's glim.taken
-- at its glim.short or past it), only while the fetch's N (glim.margin)
-- stays far from the cap and from half the rate's window (as the queue's
-- rate); else false, true: not now, though not parked.
function G.room(p, g, now, glim)
  if g == "" or not glim then return true end
  local c, near = glim.concurrency, false
  local ahead = glim.short and glim.taken >= glim.short
  local seen = G.seen(glim, g)
  if c then
    local active = seen.a or redis.call("SCARD", p .. "ga:" .. g)
    seen.a = active
    if active >= c then
      -- a job that left active by another way (its hash deleted by hand, an
      -- obliterate) must not hold its group's place for ever: one no longer
      -- active is dropped, and a full group is parked until the first lease
      -- of its jobs ends (or one leaves active: G.left), then looked at again
      local first_end = math.huge
      for _, id in ipairs(redis.call("SMEMBERS", p .. "ga:" .. g)) do
        local lease_end = tonumber(redis.call("ZSCORE", p .. "active", id) or "")
        if lease_end then first_end = math.min(first_end, lease_end)
        else redis.call("SREM", p .. "ga:" .. g, id) end
      end
      active = redis.call("SCARD", p .. "ga:" .. g)
      seen.a = active
      if active >= c then
        G.park(p, g, math.max(first_end, now) + 1)
        return false
      end
    end
    near = ahead and active + glim.margin >= c
  end
  if glim.rate_max then
    local key = p .. "gs:" .. g
    local count, half = seen.w or redis.call("ZCARD", key), ahead and glim.rate_max / 2 - glim.margin
    if count >= glim.rate_max or half and count > half then -- (else far whatever has left the window: no trim)
      redis.call("ZREMRANGEBYSCORE", key, "-inf", "(" .. (now - glim.rate_per))
      count = redis.call("ZCARD", key)
    end
    seen.w = count
    if count >= glim.rate_max then
      local oldest = redis.call("ZRANGE", key, 0, 0, "WITHSCORES")
      G.park(p, g, tonumber(oldest[2]) + glim.rate_per + 1)
      return false
    end
    near = near or half and count > half
  end
  if near then return false, true end
  return true
end

-- The group of the job first in line (wait's head), if it is in the ring
-- and may take a job now: what G.pick takes when its walk found no group
-- with that priority (a group further on in turn order). nil, true: the
-- head is of no group and not copied yet (cur: the switch's cursor).
function G.of_head(p, head, now, glim, cur)
  local g = redis.pcall("HGET", job_key(p, string.sub(head, 18)), "group")
  if type(g) ~= "string" then g = "" end
  if g == "" and not G.copied(cur, redis.call("ZRANGE", p .. "ungrouped", 0, 0, "WITHSCORES")) then
    return nil, true
  end
  if redis.call("ZSCORE", p .. "groups", g) and G.room(p, g, now, glim) then return g end
end

-- The group whose turn it is, and the member popped from its index: the
-- first group in the ring whose first job has the best priority waiting
-- (among the next GROUP_WALK_MAX, else the group of the job first in
-- line), else the best that may take one, and the member's score; nil, nil
-- when none may, and whether the walk took groups out of the ring (parked or
-- empty: a walk again reaches further).
function G.pick(p, now, glim, cur)
  local head = redis.call("ZRANGE", p .. "wait", 0, 0, "WITHSCORES")
  if #head == 0 then return nil, nil, false end
  local best = tonumber(head[2])
  local found, found_prio, after, walked, dropped = nil, nil, "-inf", 0, false
  while walked < GROUP_WALK_MAX and not (found and found_prio <= best) do
    local ring = redis.call("ZRANGEBYSCORE", p .. "groups", after, "+inf", "WITHSCORES", "LIMIT", 0, 16)
    if #ring == 0 then break end
    for i = 1, #ring, 2 do
      local g = ring[i]
      after, walked = "(" .. ring[i + 1], walked + 1
      local first = redis.call("ZRANGE", G.set(p, g), 0, 0, "WITHSCORES")
      if #first == 0 and not (g == "" and cur) then
        redis.call("ZREM", p .. "groups", g)
        dropped = true
      elseif #first > 0 and (g ~= "" or G.copied(cur, first)) then -- ("" while its next job may not be copied: not now)
        local prio = tonumber(first[2])
        if not found or prio < found_prio then
          local ok, near = G.room(p, g, now, glim)
          if ok then
            found, found_prio = g, prio
            if prio <= best then break end
          elseif not near then
            dropped = true
          end
        end
      end
    end
  end
  if not (found and found_prio <= best) then
    local g, uncopied = G.of_head(p, head[1], now, glim, cur)
    if uncopied then return nil, nil, false end -- no job of a worse priority before it: the next fetch copies it
    found = g or found
  end
  if not found then return nil, nil, dropped end
  local set, turn = G.set(p, found), redis.call("INCR", p .. "turn") -- (drawn first: a pop is not undone)
  local popped = redis.call("ZPOPMIN", set)
  if redis.call("ZCARD", set) == 0 and not (found == "" and cur) then redis.call("ZREM", p .. "groups", found)
  else redis.call("ZADD", p .. "groups", turn, found) end -- its turn is over
  return found, popped[1], false, popped[2]
end

-- Once no job waits (a drain, an obliterate), the groups leave the ring
-- and the parked set with their waiting sets (entries whose job no longer
-- waits); with all, their other keys are deleted too (obliterate). At most
-- SWEEP_MAX groups per call; -> how many are left in the ring and the
-- parked set.
function G.sweep(p, all)
  redis.call("DEL", p .. "gswitch", p .. "gunpark") -- (nothing left to copy or to walk)
  local left = 0
  for _, ring in ipairs({ "groups", "gparked" }) do
    for _, g in ipairs(redis.call("ZRANGE", p .. ring, 0, SWEEP_MAX - 1)) do
      redis.call("ZREM", p .. ring, g)
      redis.call("UNLINK", G.set(p, g))
      if all and g ~= "" then redis.call("DEL", p .. "ga:" .. g, p .. "gs:" .. g, p .. "gl:" .. g) end
    end
    left = left + redis.call("ZCARD", p .. ring)
  end
  return left
end

-- ratelimited for a job of group g: the group holds back for ms.
-- (A group with no waiting job is not parked: G.enter parks it, by its
-- hold, when one comes.)
function G.hold(p, g, ms, now)
  if redis.call("PTTL", p .. "gl:" .. g) < ms then
    redis.call("SET", p .. "gl:" .. g, "1", "PX", ms)
    H.note(p, "gkeys", g, now + ms, now)
  end
  if redis.call("ZCARD", G.set(p, g)) > 0 then G.park(p, g, now + ms, true) end
end

-- groups(p; limit) -> { { group, state, waiting, active, ms }, ... }: the
-- groups with waiting jobs, those that may not take one first (state
-- "held": an ERATELIMIT hold, ms left; "at_cap"; "rate": its window is
-- full, ms until it has room), then the ring's ("ready", in turn order).
-- waiting may count entries that fetch drops when it reaches them.
local function groups(keys, args)
  local p = keys[1]
  local refused = check_numbers("moonjob_groups", args,
    { { 1, "LIMIT must be a whole number from 1 to " .. LIST_GROUPS_MAX, 1, LIST_GROUPS_MAX, true } })
  if refused then return refused end
  local limit, now, out = tonumber(args[1]) or 100, now_ms(), {}
  local _, glim = read_limits(p)
  local cap = glim and glim.concurrency
  local function row(g, state, ms)
    out[#out + 1] = { g, state, redis.call("ZCARD", G.set(p, g)), g == "" and 0 or redis.call("SCARD",
      p .. "ga:" .. g), math.max(0, math.floor(ms)) }
  end
  local parked = redis.call("ZRANGE", p .. "gparked", 0, limit - 1, "WITHSCORES")
  for i = 1, #parked, 2 do
    local g, at, hold = parked[i], tonumber(parked[i + 1]), redis.call("PTTL", p .. "gl:" .. parked[i])
    if hold > 0 then row(g, "held", hold)
    elseif at > now and cap and redis.call("SCARD", p .. "ga:" .. g) >= cap then row(g, "at_cap", 0)
    elseif at > now then row(g, "rate", at - now)
    else row(g, "ready", 0) end -- (its time came: the next fetch takes it back)
  end
  if #out < limit then
    for _, g in ipairs(redis.call("ZRANGE", p .. "groups", 0, limit - #out)) do -- (+1: "" is skipped)
      if g ~= "" and #out < limit then row(g, "ready", 0) end
    end
  end
  return out
end

F.groups = groups
end
