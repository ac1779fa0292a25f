-- part: bulk.lua
-- moonjob_add_bulk: many jobs of one set of options in one call, each made
-- as moonjob_add makes it (add.lua), each answered with its own row or
-- refusal; jobs of drawn ids made waiting take a shorter path (add_plain),
-- answered in runs to a caller that takes them.

do
local FIELD_MAX, NONCE_MAX, now_ms, job_key, refuse = H.FIELD_MAX, H.NONCE_MAX, H.now_ms, H.job_key, H.refuse
local wait_member, line_up, register = H.wait_member, H.line_up, H.register
local draw, free_id, check_add, answer_once, add_job = H.draw, H.free_id, H.check_add, H.answer_once, H.add_job
local shared = H.shared

-- A plain job's row (add's reply), or, to a caller that takes runs
-- (batch.runs), nil when it joins the run of rows before it: ids from the
-- call's free range and places in line are then both one more than the
-- job's before (n: its id's number, seq: its place's).
local function plain_row(batch, id, n, seq, nonce)
  local rows = batch.runs
  if not (rows and n and n < 1e14) then return { id, "waiting", 0, nonce } end
  local run = batch.run
  if run and rows[#rows] == run and batch.run_next == n then
    run[2] = run[2] + 1
  else
    batch.run = { "\0run", 1, n, batch.common.now, seq }
    rows[#rows + 1] = batch.run
  end
  batch.run_next = n + 1
end

-- A bulk add's job of a drawn id, no delay, no group and no max_queue
-- (batch.plain): made waiting as add_job makes it, without the checks (Lua's
-- own work was a third of a bulk add's cost), its entry in wait put with
-- the call's others (line_up, enter_wait).
local function add_plain(p, data, now, batch)
  local ids, seqs = batch.ids, batch.seq
  local n, id = ids.free and ids[1] <= ids[2] and ids[1], nil
  if n then -- (free_id's and draw's steps, inline: a call costs Redis's Lua on every job)
    ids[1], id = n + 1, H.digits_of(n, batch.id_digits)
  else
    id = free_id(p, batch)
  end
  local seq = seqs[1] -- (the call drew one for each of its jobs)
  seqs[1] = seq + 1
  local member, digits = wait_member(seq, id, batch.seq_digits)
  local common = batch.common
  local nonce = common.now .. "." .. digits
  redis.call("HSET", job_key(p, id), "id", id, "data", data, "created", common.now, "nonce", nonce, "state",
    "waiting", "member", member, unpack(common.fields))
  if batch.grouped == false then -- (line_up's own step once it looked: its entry in wait with the call's others)
    local waiting = batch.waiting
    waiting[#waiting + 1] = batch.prio_text
    waiting[#waiting + 1] = member
  else
    register(p, batch)
    line_up(p, batch.prio, member, "", now, batch)
  end
  return plain_row(batch, id, n or nil, seq, nonce)
end

-- add_bulk's arguments before its jobs (16, or 17 with REPLY), and its
-- jobs' most in one call (a call holds Redis: about 10 us a job).
local BULK = { head = 16, most = 1000 }

-- How many of the ids of range (first, last) a job holds.
function H.held_ids(p, range)
  local held = 0
  for first = range[1], range[2], 1000 do
    local keys = {}
    local digits = {}
    for n = first, math.min(range[2], first + 999) do keys[#keys + 1] = job_key(p, H.digits_of(n, digits)) end
    held = held + redis.call("EXISTS", unpack(keys))
  end
  return held
end

-- Each job of a bulk add made or joined: its row as add's reply, or its
-- refusal as text ("EINPUT ...", "EQUEUEFULL ..."), in order.
local function bulk_rows(p, args, t, now, head)
  local n = (#args - head) / 2
  local drawn, named = 0, false
  for i = head + 1, #args, 2 do
    if args[i] == "" then drawn = drawn + 1 elseif args[i] ~= "\0dedupe" then named = true end
  end
  local batch = { seq = { redis.call("INCRBY", p .. "seq", n) - n + 1 }, common = shared(t, now) }
  batch.prio = H.number_in(batch.common.prio, -math.huge, math.huge) or 0
  -- (its text in wait's ZADDs when it is the number's own: ZADD reads
  -- fewer forms than tonumber, " 5" or "1e-400")
  batch.prio_text = tostring(batch.prio) == batch.common.prio and batch.common.prio or batch.prio
  batch.seq[2] = batch.seq[1] + n - 1
  if drawn > 0 then
    local last = redis.call("INCRBY", p .. "ids", drawn)
    batch.ids = { last - drawn + 1, last }
    -- (one look for them all; an id named in this call may take one of them)
    batch.ids.free = not named and H.held_ids(p, batch.ids) == 0
  end
  -- its jobs' entries in wait go in at once at the end, unless max_queue
  -- counts the jobs waiting after each
  if (tonumber(t[11]) or 0) == 0 then batch.waiting = {} end
  -- its jobs of drawn ids take add_job's steps but the checks none needs
  batch.plain = batch.waiting and (tonumber(t[4]) or 0) == 0 and t[18] == ""
  batch.id_digits, batch.seq_digits = {}, {}
  local rows = {}
  if head > BULK.head then batch.runs = rows end
  for i = head + 1, #args, 2 do
    local id, data, row = args[i], args[i + 1], nil
    if #id > FIELD_MAX then
      row = "EINPUT moonjob_add_bulk: a job's id must take at most " .. FIELD_MAX .. " bytes"
    elseif data == "" then
      row = "EINPUT moonjob_add_bulk: DATA must be JSON text, not ''"
    else
      t[1], t[2] = id, data
      -- (protected: a job's raise must not leave the others out of wait, whose
      -- entries go in at the end)
      local ok, made
      if id == "" and batch.plain then ok, made = pcall(add_plain, p, data, now, batch)
      else ok, made = pcall(add_job, p, t, now, batch) end
      row = made
      if not ok then row = type(made) == "table" and made.err or tostring(made)
      elseif made and made.err then row = string.gsub(made.err, "^(%u+) moonjob_add:", "%1 moonjob_add_bulk:") end
    end
    if row then rows[#rows + 1] = row end -- (else counted in a run: plain_row)
  end
  H.enter_wait(p, batch)
  return rows
end

-- add_bulk(p; sheet, call, forget, priority, delay_ms, attempts, backoff,
--     timeout, kill_after, name, cache, max_queue, notify, existing,
--     expire_ms, group [, reply], id, data [, id, data ...]) -> { row, ... }
-- Up to BULK.most jobs in one call, all with the options given once (as
-- add's), each with its id ("" draws one, "\0dedupe" the data's) and data.
-- Each job's row is add's reply { id, state, joined, nonce } (the nonce
-- made here), or the text of its refusal: a bad id or data, EQUEUEFULL,
-- a job key of another type, an error of its own writes. With reply
-- "runs" (a 17th argument before the jobs: the count of arguments is
-- then odd), jobs of drawn ids made waiting in a row may come as one run
-- { "\0run", count, first id, created, first seq } (integers but created):
-- job k (from 0) of the run is { first id + k, "waiting", 0, created ..
-- "." .. (first seq + k) }. The options are
-- checked before anything is written (EINPUT: no job added); sheet, call
-- and forget name the call as add's do ("" sheet: not named).
local function add_bulk(keys, args)
  local fn = "moonjob_add_bulk"
  local head = #args % 2 == 1 and BULK.head + 1 or BULK.head
  local form = "it takes SHEET CALL FORGET PRIORITY DELAY_MS ATTEMPTS BACKOFF TIMEOUT KILL_AFTER NAME CACHE "
    .. "MAX_QUEUE NOTIFY EXISTING EXPIRE_MS GROUP [REPLY], then ID DATA pairs"
  if #args < head + 2 then return refuse(fn, form .. "; the count of arguments was", #args) end
  if head > BULK.head and args[head] ~= "runs" then
    return refuse(fn, form .. " (an odd count: the 17th is REPLY, which must be runs, else an ID or a DATA is "
      .. "missing)", args[head])
  end
  if (#args - head) / 2 > BULK.most then
    return refuse(fn, "it takes at most " .. BULK.most .. " jobs per call; the count of jobs was", (#args - head) / 2)
  end
  if #args[1] > NONCE_MAX or #args[2] > NONCE_MAX or #args[3] > NONCE_MAX then
    return refuse(fn, "SHEET, CALL and FORGET must take at most " .. NONCE_MAX .. " bytes each", "...")
  end
  if args[1] ~= "" and args[2] == "" then return refuse(fn, "SHEET needs CALL (the call's name in it)", "") end
  -- its options as one add's arguments (ID and DATA: each job's)
  local t = { "", "{}", args[4], args[5], args[6], args[7], args[8], args[9], args[10], args[11], args[12], args[13],
    "", args[14], args[15], "", "", args[16] }
  local refused = check_add(t, fn)
  if refused then return refused end
  local p, now = keys[1], now_ms()
  return answer_once(p, args[1], args[2], args[3], now, fn, function() return bulk_rows(p, args, t, now, head) end,
    function() return true end)
end

F.add_bulk = add_bulk
end
