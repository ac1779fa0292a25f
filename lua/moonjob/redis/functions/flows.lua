-- part: flows.lua
-- Flows: jobs that wait for jobs. moonjob_add_flow adds a tree in one call:
-- each job with children (a parent) waits in the state waiting-children
-- until each child has ended, then waits to run like any job; a leaf waits
-- to run at once. Everything about a parent is decided here, in the call
-- that ends a child (finish, states.lua), so nothing decides outside the
-- atomic step, and a child counts once: it leaves its parent's pending set
-- (SREM) only once, whatever re-delivers it.
--
-- Keys of a parent ID under its queue's prefix p (one hash tag: a child may
-- be on another queue of the same tag, "{TAG}NAME", its key named whole):
--   <p>parents     sorted set: the parents waiting for children, by when to
--                  look at them next (their deadline, or LOOK_MS from now:
--                  fetch looks for children gone meanwhile)
--   <p>deps:ID     set: the parent's pending children, as slots
--   <p>kids:ID     hash: slot -> what the child ended with: "c" .. result,
--                  "f" .. error, "i" .. error (ignored), or "?" .. its on_fail
--                  while pending. Results are copied here as children end, so
--                  a child trimmed or removed later strands no parent.
-- A slot is the child's place in the flow (4 digits) then its job key:
-- "0003mj:{shop}/images:j:12". A child's hash holds parent (its parent's job
-- key) and pslot; a parent's holds kids (how many) and deadline (ms).
-- What a child's final failure does is its on_fail: "fail" (the parent
-- fails with ECHILD at once, its other pending children are canceled),
-- "continue" (counted as ended; the parent sees the error), "ignore"
-- (counted as ended; the parent does not see it).

do
local DELAY_MS_MAX, job_key, err_json, refuse = H.DELAY_MS_MAX, H.job_key, H.err_json, H.refuse
local job_fields, now_ms, finish, make_waiting = H.job_fields, H.now_ms, H.finish, H.make_waiting
local make_delayed, queue_name = H.make_delayed, H.queue_name

local NODE_FIELDS, NODES_MAX, DEPTH_MAX = 18, 1000, 32
-- How often a waiting parent's children are looked at for gone ones
-- (EMISSING): every LOOK_MS, and LOOK_MS_PER_PARENT more for each parent
-- waiting; each fetch looks at LOOK_PARENTS due parents at most, and stops
-- once it looked at about LOOK_BUDGET children.
local LOOK_MS, LOOK_MS_PER_PARENT, LOOK_PARENTS, LOOK_BUDGET = 10000, 10, 20, 1000
local ON_FAIL = { [""] = "fail", fail = "fail", continue = "continue", ignore = "ignore" }
local FN = "moonjob_add_flow"

-- A job key -> its queue's prefix and the job's id (nil: not a moonjob key).
local function split_key(key)
  return string.match(key, "^(mj:{[^}]*}[^:]*:)j:(.*)$")
end

local function tag_of(p)
  return string.match(p, "^mj:{([^}]+)}[^:]*:$")
end

-- Node i's arguments as moonjob_add takes its own (add.lua's check_add and
-- store_job). A node: QUEUE PARENT ON_FAIL CHILDREN_DEADLINE_MS, then ID
-- DATA PRIORITY DELAY_MS ATTEMPTS BACKOFF TIMEOUT KILL_AFTER NAME CACHE
-- NOTIFY NONCE EXPIRE_MS GROUP.
local function add_args(args, b)
  return { args[b + 5], args[b + 6], args[b + 7], args[b + 8], args[b + 9], args[b + 10], args[b + 11],
    args[b + 12], args[b + 13], args[b + 14], "0", args[b + 15], args[b + 16], "", args[b + 17], "", "",
    args[b + 18] }
end

local function whole_in(text, low, high)
  local n = tonumber(text)
  return n and n >= low and n <= high and n % 1 == 0 and n or nil
end

-- Node i checked -> { prefix, parent, on_fail, deadline, args, depth }, or
-- nil and the refusal (naming the node).
local function check_node(keys, args, i, nodes)
  local b, where = 1 + (i - 1) * NODE_FIELDS, (" (job %d of the flow)"):format(i)
  local q = whole_in(args[b + 1], 1, #keys)
  if not q then return nil, refuse(FN, "QUEUE must be its queue's place in KEYS, 1 to " .. #keys .. where, args[b + 1]) end
  local parent = whole_in(args[b + 2], i == 1 and 0 or 1, i - 1)
  if not parent then
    return nil, refuse(FN, (i == 1 and "the root's PARENT must be 0" or "PARENT must be the place of a job"
      .. " before it, 1 to " .. (i - 1)) .. where, args[b + 2])
  end
  local on_fail = ON_FAIL[args[b + 3]]
  if not on_fail or (i == 1 and args[b + 3] ~= "") then
    return nil, refuse(FN, (i == 1 and "the root's ON_FAIL must be empty (it has no parent)"
      or "ON_FAIL must be fail, continue, ignore or empty (fail)") .. where, args[b + 3])
  end
  local deadline = args[b + 4] ~= "" and whole_in(args[b + 4], 1, DELAY_MS_MAX)
  if deadline == nil then
    return nil, refuse(FN, "CHILDREN_DEADLINE_MS must be a whole number of ms from 1 to 1e12, or empty" .. where,
      args[b + 4])
  end
  local a = add_args(args, b)
  local refused = H.check_add(a, FN)
  if refused then return nil, redis.error_reply(refused.err .. where) end
  local depth = parent > 0 and nodes[parent].depth + 1 or 1
  if depth > DEPTH_MAX then return nil, refuse(FN, "a flow is at most " .. DEPTH_MAX .. " jobs deep" .. where, depth) end
  if parent > 0 then nodes[parent].kids = (nodes[parent].kids or 0) + 1 end
  return { prefix = keys[q], parent = parent, on_fail = on_fail, deadline = deadline or nil, args = a, depth = depth }
end

-- A node's own id, when it names one: each new, and not twice in the flow.
local function check_id(node, i, seen)
  local a = node.args
  local id = a[1] == "\0dedupe" and "d:" .. redis.sha1hex(a[2]) or a[1]
  if id == "" then return end
  local key = job_key(node.prefix, id)
  local where = (" (job %d of the flow, in queue %s)"):format(i, queue_name(node.prefix))
  if seen[key] then return refuse(FN, "an id must be in the flow once: jobs " .. seen[key] .. " and " .. i
    .. " have the id", string.sub(id, 1, 64)) end
  seen[key] = i
  local f, why = job_fields(key, "state")
  if not f then return redis.error_reply("EINPUT " .. FN .. ": " .. why .. where) end
  if redis.call("EXISTS", key) == 1 then
    return redis.error_reply(("EEXISTS %s: a job %s is kept (%s)%s: a flow's jobs are new; remove it or"
      .. " choose another id"):format(FN, string.sub(id, 1, 200), tostring(f[1] or "no state"), where))
  end
  node.id = id
end

-- The whole call checked before its first write -> nil, the nodes, the job
-- keys the flow names (key -> its node); or the refusal.
local function check_flow(keys, args)
  local tag = tag_of(keys[1] or "")
  if not tag then return refuse(FN, "KEYS[1] must be the root's queue prefix, mj:{NAME}: or mj:{TAG}NAME:", keys[1] or "") end
  for k = 1, #keys do
    if tag_of(keys[k]) ~= tag then
      return refuse(FN, ("the queues of a flow must share the root's hash tag: name them {%s}NAME"):format(tag), keys[k])
    end
    local t = redis.call("TYPE", keys[k] .. "parents").ok -- (written after the jobs: checked before them)
    if t ~= "none" and t ~= "zset" then
      return redis.error_reply(("EINPUT %s: %sparents is a %s, not moonjob's sorted set of waiting parents (written"
        .. " by another client); delete it"):format(FN, keys[k], t))
    end
  end
  local count = whole_in(args[1], 1, NODES_MAX)
  if not count then return refuse(FN, "COUNT must be a whole number of jobs from 1 to " .. NODES_MAX, args[1] or "") end
  if #args ~= 1 + count * NODE_FIELDS then
    return refuse(FN, ("it takes COUNT, then %d arguments per job (%d for %d jobs); the count of arguments was")
      :format(NODE_FIELDS, 1 + count * NODE_FIELDS, count), #args)
  end
  local nodes, seen = {}, {}
  for i = 1, count do
    local node, refused = check_node(keys, args, i, nodes)
    if not node then return refused end
    nodes[i] = node
  end
  for i, node in ipairs(nodes) do
    if node.kids and (tonumber(node.args[4]) or 0) > 0 then
      return refuse(FN, ("a job with children waits for them: its DELAY_MS must be 0 (job %d)"):format(i), node.args[4])
    elseif node.kids and (node.args[15] or "") ~= "" then -- (it would count its children's time too)
      return refuse(FN, ("a job with children takes no EXPIRE_MS: bound its children with CHILDREN_DEADLINE_MS"
        .. " (job %d)"):format(i), node.args[15])
    elseif node.deadline and not node.kids then
      return refuse(FN, ("CHILDREN_DEADLINE_MS is for a job with children (job %d)"):format(i), node.deadline)
    end
    local refused = check_id(node, i, seen)
    if refused then return refused end
  end
  return nil, nodes, seen
end

-- Child node (the i-th) linked to its parent node: pending there.
local function link(parent, child, i)
  local slot = string.format("%04d", i) .. child.key
  redis.call("HSET", child.key, "parent", parent.key, "pslot", slot)
  redis.call("HDEL", child.key, "plain") -- (its parent is read as it ends: base.lua)
  redis.call("SADD", parent.prefix .. "deps:" .. parent.id, slot)
  redis.call("HSET", parent.prefix .. "kids:" .. parent.id, slot, "?" .. child.on_fail)
end

local function wait_children(node, now)
  local deadline = node.deadline and now + node.deadline or ""
  -- (an earlier parent with this id may have left them: a cached result expired)
  redis.call("DEL", node.prefix .. "deps:" .. node.id, node.prefix .. "kids:" .. node.id)
  redis.call("HSET", node.key, "state", "waiting-children", "kids", node.kids, "deadline", deadline)
  redis.call("HDEL", node.key, "plain") -- (fetch reads its kids: base.lua)
  redis.call("ZADD", node.prefix .. "parents", math.min(now + LOOK_MS, tonumber(deadline) or math.huge), node.id)
end

-- add_flow(K prefixes; COUNT, node...) -> { id, nonce, ... } in node order.
local function add_flow(keys, args)
  local refused, nodes, named = check_flow(keys, args)
  if refused then return refused end
  local now, out = now_ms(), {}
  for i, node in ipairs(nodes) do
    local p, a = node.prefix, node.args
    local id = node.id
    if not id then -- a number no job holds, as add's, nor a later job of the flow names
      repeat id = tostring(redis.call("INCR", p .. "ids"))
      until redis.call("EXISTS", job_key(p, id)) == 0 and not named[job_key(p, id)]
    end
    node.id, node.key = id, job_key(p, id)
    local nonce, prio, group = H.store_job(p, id, node.key, a, now)
    H.register(p)
    if node.parent > 0 then link(nodes[node.parent], node, i) end
    local delay = math.floor(tonumber(a[4]) or 0)
    if node.kids then wait_children(node, now)
    elseif delay > 0 then make_delayed(p, id, node.key, now + delay)
    else make_waiting(p, id, node.key, now, prio, nil, group) end
    out[#out + 1] = id
    out[#out + 1] = nonce
  end
  return out
end

-- A parent's pending children canceled (each as moonjob_cancel does: a
-- running one is interrupted by its worker).
local function cancel_children(pending, reason)
  for _, slot in ipairs(pending) do
    local cp, cid = split_key(string.sub(slot, 5))
    if cp then F.cancel({ cp }, { cid, reason }) end
  end
end

-- A waiting parent fails with the error err (JSON text): its pending
-- children are canceled.
local function end_parent(p, id, key, err, code, now)
  redis.call("ZREM", p .. "parents", id)
  local pending = redis.call("SMEMBERS", p .. "deps:" .. id)
  redis.call("DEL", p .. "deps:" .. id)
  finish(p, id, key, "failed", "error", err, now)
  cancel_children(pending, ("its parent %s in queue %s failed (%s)"):format(id, queue_name(p), code))
end

-- The error a parent fails with when its child's failure fails it: the
-- child's own error within (fields in sorted order, as moonjob's JSON).
local function child_error(slot, value)
  local cp, cid = split_key(string.sub(slot, 5))
  local ok, e = H.json_decode(value)
  local what = ok and type(e) == "table" and tostring(e.code) .. ": " .. tostring(e.message) or "?"
  local message = ("its child %s in queue %s failed: %s"):format(cid, queue_name(cp), string.sub(what, 1, 200))
  return '{"child":' .. cjson.encode({ id = cid, queue = queue_name(cp) }) .. ',"code":"ECHILD","error":'
    .. (ok and value or cjson.encode(value)) .. ',"message":' .. cjson.encode(message) .. "}"
end

-- The child in slot of the parent (p, id, key) ended: state completed or
-- failed (for good), value its result or error. Counted once: only the
-- call that takes it out of the parent's pending set counts it (another,
-- or one after the parent ended, finds it gone there).
local function count_child(p, id, key, slot, state, value, now)
  local deps = p .. "deps:" .. id
  if redis.call("SREM", deps, slot) == 0 then return end
  local kids = p .. "kids:" .. id
  if redis.call("EXISTS", key) == 0 then -- the parent is gone (evicted, deleted around moonjob): its keys too
    redis.call("ZREM", p .. "parents", id)
    return redis.call("DEL", deps, kids)
  end
  local on_fail = string.sub(redis.call("HGET", kids, slot) or "?fail", 2)
  if state == "completed" then
    redis.call("HSET", kids, slot, "c" .. value)
  elseif on_fail == "ignore" then
    redis.call("HSET", kids, slot, "i" .. value)
  elseif on_fail == "continue" then
    redis.call("HSET", kids, slot, "f" .. value)
  else
    redis.call("HSET", kids, slot, "f" .. value)
    return end_parent(p, id, key, child_error(slot, value), "ECHILD", now)
  end
  if redis.call("SCARD", deps) == 0 then
    redis.call("ZREM", p .. "parents", id)
    make_waiting(p, id, key, now)
  end
end

-- finish's: the job (key) whose parent is parent_key ended.
function H.child_ended(key, parent_key, state, value, now)
  local slot = redis.call("HGET", key, "pslot")
  local pp, pid = split_key(parent_key)
  if slot and pp then count_child(pp, pid, parent_key, slot, state, value, now) end
end

-- delete_job's: a job of a flow is deleted. A parent's pending children
-- are canceled and its keys go; a child its parent still counts counts as
-- canceled (by default its parent then fails).
function H.flow_gone(p, id, key, parent_key, kids)
  if kids then
    redis.call("ZREM", p .. "parents", id)
    local pending = redis.call("SMEMBERS", p .. "deps:" .. id)
    redis.call("DEL", p .. "deps:" .. id, p .. "kids:" .. id)
    cancel_children(pending, ("its parent %s in queue %s was removed"):format(id, queue_name(p)))
  end
  if parent_key then H.child_ended(key, parent_key, "failed", err_json("ECANCELED", "the job was removed"), now_ms()) end
end

-- The parent (queue and id) that still counts the job at key, or nil.
function H.counted_by(key)
  local f = redis.call("HMGET", key, "parent", "pslot")
  if not (f[1] and f[2]) then return nil end
  local pp, pid = split_key(f[1])
  if pp and redis.call("SISMEMBER", pp .. "deps:" .. pid, f[2]) == 1 then return queue_name(pp), pid end
end

-- cancel's: a parent waiting for its children fails ECANCELED.
function H.cancel_parent(p, id, key, reason, now)
  end_parent(p, id, key, err_json("ECANCELED", reason), "ECANCELED", now)
end

-- A waiting parent's pending children looked at: one whose hash is gone,
-- or is no longer this parent's child (another job took its id, another
-- client wrote its key), counts as failed (EMISSING). -> how many looked at.
local function look_for_missing(p, id, key, now)
  local pending = redis.call("SMEMBERS", p .. "deps:" .. id)
  for _, slot in ipairs(pending) do
    if redis.pcall("HGET", string.sub(slot, 5), "pslot") ~= slot then
      count_child(p, id, key, slot, "failed", err_json("EMISSING", "the child's job was gone from Redis"
        .. " (evicted, replaced, or deleted around moonjob) before it ended"), now)
    end
  end
  return #pending
end

-- fetch's: the parents due a look (at most LOOK_PARENTS per call, and about
-- LOOK_BUDGET children): one past its deadline fails
-- (ETIMEDOUT); a child found gone (evicted, deleted around moonjob) counts
-- as failed (EMISSING).
function H.look_at_parents(p, now)
  local due = redis.call("ZRANGEBYSCORE", p .. "parents", "-inf", now, "LIMIT", 0, LOOK_PARENTS)
  if #due == 0 then return end -- (every fetch of the queue: one command when none is due)
  local budget = LOOK_BUDGET
  -- (the more parents wait, the rarer each one's look: a steady cost per fetch)
  local spacing = LOOK_MS + redis.call("ZCARD", p .. "parents") * LOOK_MS_PER_PARENT
  for _, id in ipairs(due) do
    if budget <= 0 then break end
    local key = job_key(p, id)
    local f = job_fields(key, "state", "deadline")
    local deadline = f and tonumber(f[2] or "")
    if not (f and f[1] == "waiting-children") then
      redis.call("ZREM", p .. "parents", id)
      if f and not f[1] then redis.call("DEL", p .. "deps:" .. id, p .. "kids:" .. id) end -- (its hash gone)
    elseif deadline and deadline <= now then
      end_parent(p, id, key, err_json("ETIMEDOUT", ("its children did not all end by its children_deadline"
        .. " (%d pending)"):format(redis.call("SCARD", p .. "deps:" .. id))), "ETIMEDOUT", now)
    else
      budget = budget - look_for_missing(p, id, key, now)
      redis.call("ZADD", p .. "parents", "XX", math.min(now + spacing, deadline or math.huge), id)
    end
  end
end

-- A parent's children: { queue, id, state, value, ... } in the flow's order;
-- state completed, failed or ignored (value: the result or error, JSON
-- text), or the pending child's state now ("missing": gone; value "").
function H.children_rows(p, id)
  local all = redis.call("HGETALL", p .. "kids:" .. id)
  local slots, values, out = {}, {}, {}
  for i = 1, #all, 2 do
    slots[#slots + 1] = all[i]
    values[all[i]] = all[i + 1]
  end
  table.sort(slots)
  local ENDED = { c = "completed", f = "failed", i = "ignored" }
  for _, slot in ipairs(slots) do
    local ckey = string.sub(slot, 5)
    local cp, cid = split_key(ckey)
    local v = values[slot]
    local state, value = ENDED[string.sub(v, 1, 1)], string.sub(v, 2)
    if not state then -- pending (or, its parent failed first, ended on its own)
      local s = redis.pcall("HMGET", ckey, "state", "result", "error")
      if type(s) ~= "table" or s.err or not s[1] then s = { "missing" } end
      state = s[1]
      value = state == "completed" and s[2] or state == "failed" and s[3] or ""
    end
    out[#out + 1] = queue_name(cp)
    out[#out + 1] = cid
    out[#out + 1] = state
    out[#out + 1] = value
  end
  return out
end

-- A job's place in a flow, as moonjob_job adds it: { parent's queue,
-- parent's id (both "" for none), its children's rows (children_rows) }.
function H.flow_of(p, id)
  local f = redis.pcall("HMGET", job_key(p, id), "parent", "kids")
  if type(f) ~= "table" or f.err then return { "", "", {} } end
  local pp, pid = split_key(f[1] or "")
  return { pp and queue_name(pp) or "", pid or "", f[2] and H.children_rows(p, id) or {} }
end

-- children(p; id [, nonce]) -> children_rows, or nil (no such job, or
-- another job with that id).
local function children(keys, args)
  if not args[1] or args[1] == "" then return refuse("moonjob_children", "it takes ID [NONCE]", "") end
  local f = job_fields(job_key(keys[1], args[1]), "state", "nonce")
  if not (f and f[1]) then return nil end
  if args[2] and args[2] ~= "" and f[2] ~= args[2] and f[2] ~= "*" then return nil end
  return H.children_rows(keys[1], args[1])
end

F.add_flow, F.children = add_flow, children
end
