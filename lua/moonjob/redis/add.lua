-- moonjob.redis.add -- what an add sends: its options checked and turned
-- into moonjob_add's arguments, its data written as JSON. The producer's
-- q:add, q:schedule (each slot's job), `moonjob add` and the benches build
-- their calls here.
--
-- A bad option raises (a bug of the caller), at the level of the user's
-- line: args is called straight from q:add (or under pcall), never through
-- another function, or the error blames the wrong line.
--
-- Pure Lua, for moonjob.producer too (any Lua): JSON goes through the codec
-- a caller gives (encode(v) -> text | nil, err), moonjob's exact one
-- (moonjob.codec.json, LuaJIT only) when none is given.
local Backoff = require "moonjob.backoff"
local errors = require "moonjob.errors"
local fcall = require "moonjob.redis.fcall"
local names = require "moonjob.redis.names"

local M = {}

local SECONDS_MAX = names.SECONDS_MAX

local ADD_OPTIONS = { id = true, priority = true, delay = true, attempts = true, backoff = true,
  timeout = true, kill_after = true, name = true, dedupe = true, cache = true, max_queue = true,
  expire = true, debounce = true, group = true }

local function seconds(opts, k)
  local v = opts[k]
  if v == nil then return nil end
  if type(v) ~= "number" or v < 0 or v > SECONDS_MAX then
    error(("queue:add(): option '%s' must be a number of seconds (0 to %.0f)"):format(k, SECONDS_MAX), 4)
  end
  return v
end

-- A positive number of seconds option as whole ms (at least 1), or "".
-- (level: error's; 4, the default, is the line that called q:add when
-- called from args)
local function ms_option(opts, name, v, level)
  v = v or opts[name]
  if v == nil then return "" end
  if type(v) ~= "number" or not (v > 0 and v <= SECONDS_MAX) then
    error(("queue:add(): option '%s' must be a number of seconds, more than 0"):format(name), level or 4)
  end
  return ("%.0f"):format(math.max(1, math.floor(v * 1000 + 0.5)))
end

-- debounce = { id = text, seconds = s } -> DEBOUNCE_ID, DEBOUNCE_MS ("" without).
local function debounce_args(opts, id)
  local d = opts.debounce
  if d == nil then return "", "" end
  if type(d) ~= "table" or type(d.id) ~= "string" or d.id == "" or #d.id > 1024 or type(d.seconds) ~= "number" then
    error("queue:add(): option 'debounce' must be { id = text (1 to 1024 bytes), seconds = s }", 4)
  end
  for k in pairs(d) do
    if k ~= "id" and k ~= "seconds" then error(("queue:add(): option 'debounce' takes id and seconds, not '%s'")
      :format(tostring(k)), 4) end
  end
  if id ~= nil or opts.delay ~= nil then
    error("queue:add(): option 'debounce' draws the job's id and sets its delay: options 'id', 'dedupe' and "
      .. "'delay' cannot go with it", 4)
  end
  return d.id, ms_option(opts, "debounce.seconds", d.seconds, 5)
end

-- The FCALL arguments of an add; raises on a bad option (a bug of the caller).
-- notify (default true): Redis says on the queue's "done" channel when the
-- job ends (job:wait() listens there); moonjob add, whose jobs nobody here
-- waits for, passes false. nonce: stored with a new job (see
-- moonjob.redis.producer's header); existing "join": a finished job still
-- kept with the id is returned, not replaced (a re-add of the same lines
-- adds nothing twice). codec: writes the backoff (default: moonjob's exact).
function M.args(prefix, text, opts, notify, nonce, existing, codec)
  opts = opts or {}
  if type(opts) ~= "table" then error("queue:add(): options must be a table", 3) end
  for k in pairs(opts) do
    if not ADD_OPTIONS[k] then
      error(("queue:add(): unknown option '%s' (known: attempts, backoff, cache, debounce, dedupe, delay, "
        .. "expire, group, id, kill_after, max_queue, name, priority, timeout)"):format(tostring(k)), 3)
    end
  end
  local id = opts.id
  if id ~= nil and type(id) ~= "string" and type(id) ~= "number" then
    error("queue:add(): option 'id' must be a string or a number", 3)
  end
  if id == nil and opts.dedupe ~= nil then
    if opts.dedupe == true then id = "\0dedupe"
    elseif type(opts.dedupe) == "string" then id = "d:" .. opts.dedupe
    elseif opts.dedupe ~= false then
      error("queue:add(): option 'dedupe' must be true (key = the data) or a string key", 3)
    end
  end
  local prio = opts.priority or 0
  if type(prio) ~= "number" or not (prio > -math.huge and prio < math.huge) then
    error("queue:add(): option 'priority' must be a finite number (lower runs first)", 3)
  end
  local attempts = opts.attempts or 1
  if type(attempts) ~= "number" or attempts < 1 or attempts > names.ATTEMPTS_MAX or attempts % 1 ~= 0 then
    error("queue:add(): option 'attempts' must be a whole number, 1 or more", 3)
  end
  local backoff = ""
  if opts.backoff ~= nil then
    if type(opts.backoff) == "function" then
      error("queue:add(): a backoff function cannot cross to another host; give the worker "
        .. "pool a backoff option, or use { type = \"exponential\", delay = s }", 3)
    end
    local ok, why = Backoff.check(opts.backoff)
    if not ok then error("queue:add(): option 'backoff' " .. why, 3) end
    backoff = assert((codec or require("moonjob.codec.json")).encode(opts.backoff))
  end
  local name = opts.name
  if name ~= nil and type(name) ~= "string" then error("queue:add(): option 'name' must be a string", 3) end
  if (name and #name > 1024) or (id ~= nil and #tostring(id) > 1024) then
    error("queue:add(): options 'id' and 'name' take at most 1024 bytes", 3)
  end
  local max_queue = opts.max_queue or 0
  local debounce_id, debounce_ms = debounce_args(opts, id)
  local group = opts.group
  if group ~= nil and (type(group) ~= "string" or group == "" or #group > 1024) then
    error("queue:add(): option 'group' must be a name of 1 to 1024 bytes (a tenant, a customer)", 3)
  end
  return { "FCALL", "moonjob_add", 1, prefix, id ~= nil and tostring(id) or "", text, prio,
    math.floor((seconds(opts, "delay") or 0) * 1000), attempts, backoff,
    seconds(opts, "timeout") or 0, seconds(opts, "kill_after") or 0, name or "",
    seconds(opts, "cache") or 0, max_queue, notify == false and "0" or "1", nonce or "", existing or "",
    ms_option(opts, "expire"), debounce_id, debounce_ms, group or "" }
end

-- Jobs per moonjob_add_bulk call (the library takes up to 1,000): a call
-- holds Redis for about 10 us a job, and pipelined calls overlap.
M.BULK_CALL = 500

-- moonjob_add_bulk calls adding texts (JSON, each a job's data) with the
-- options of `one`, an add's arguments from M.args (made with any data; no
-- id but a dedupe of the data, no debounce: each names one job; the caller
-- refused them). Their SHEET CALL FORGET (args[5..7]) are "", for a ledger
-- to name. -> { { args, first = index of its first text }, ... }
function M.bulk_calls(one, texts)
  local calls, id = {}, one[5] == "\0dedupe" and one[5] or ""
  for first = 1, #texts, M.BULK_CALL do
    local args = { "FCALL", "moonjob_add_bulk", 1, one[4], "", "", "", one[7], one[8], one[9], one[10], one[11],
      one[12], one[13], one[14], one[15], one[16], one[18], one[19], one[22], "runs" }
    local last = math.min(#texts, first + M.BULK_CALL - 1)
    for i = first, last do
      args[#args + 1] = id
      args[#args + 1] = texts[i]
    end
    calls[#calls + 1] = { args = args, first = first, count = last - first + 1 }
  end
  return calls
end

-- A moonjob_add_bulk reply (its REPLY "runs") -> one row per job: each run
-- { "\0run", count, first id, created, first seq } (five elements; a row
-- has four) becomes its jobs' rows, as functions/bulk.lua says (integers
-- read as numbers or as text: clients differ).
function M.bulk_rows(reply)
  if type(reply) ~= "table" then return reply end
  local rows = {}
  for _, item in ipairs(reply) do
    if type(item) == "table" and item[1] == "\0run" and item[5] ~= nil then
      local count, id, created, seq = tonumber(item[2]), tonumber(item[3]), item[4], tonumber(item[5])
      for k = 0, count - 1 do
        rows[#rows + 1] = { ("%.0f"):format(id + k), "waiting", 0, created .. "." .. ("%.0f"):format(seq + k) }
      end
    else
      rows[#rows + 1] = item
    end
  end
  return rows
end

-- The data of a bulk add written as JSON (as M.encode) -> texts | nil, err
-- naming the first that cannot be ("job 2: ...").
function M.encode_all(list, max_payload, codec)
  local texts = {}
  for i = 1, #list do
    local text, err = M.encode(list[i], max_payload, codec)
    if not text then return nil, errors.new(err.code, ("job %d: %s"):format(i, err.message)) end
    texts[i] = text
  end
  return texts
end

-- What a bulk add's calls answered, gathered: tally:take(call, rows,
-- make, refusal) for each call (rows: its reply, nil when the call failed;
-- make(row) -> a job's handle; refusal(text or nil) -> the error of a job
-- whose row is a refusal, or of every job of a failed call), then
-- tally:result() -> jobs, or jobs and an error naming the refused ones.
local Tally = {}
Tally.__index = Tally

function M.bulk_tally(total)
  return setmetatable({ jobs = {}, failed = nil, first = nil, total = total }, Tally)
end

function Tally:take(call, rows, make, refusal)
  rows = M.bulk_rows(rows)
  for k = 1, call.count do
    local i, row = call.first + k - 1, rows and rows[k]
    if type(row) == "table" then
      self.jobs[i] = make(row)
    else
      self.failed = self.failed or {}
      self.failed[i], self.jobs[i] = refusal(row), false
      if not self.first or i < self.first then self.first = i end
    end
  end
end

function Tally:result()
  if self.failed then return self.jobs, M.bulk_error(self.failed, self.first, self.total) end
  return self.jobs
end

-- Why bulk options are refused (they name one job), or nil.
function M.bulk_refusal(opts)
  if type(opts) == "table" and (opts.id ~= nil or opts.debounce ~= nil or type(opts.dedupe) == "string") then
    return "queue:add_bulk(): options 'id', 'debounce' and a dedupe key name one job: use q:add"
  end
end

-- A bulk add's error: how many of total were refused, the first (its
-- index) said, each in .errors[i].
function M.bulk_error(failed, first, total)
  local n = 0
  for _ in pairs(failed) do n = n + 1 end
  return errors.new(failed[first].code, ("%d of %d adds were refused; the first, job %d: %s")
    :format(n, total, first, failed[first].message), { errors = failed })
end

-- The error of an add without a reply (moonjob.redis.ledger's send): a
-- refusal as fcall.reply_error makes it; unknown (sent, no reply within
-- resolve_ms): EREDIS saying that the job may or may not have been added.
function M.send_error(err, unknown, resolve_ms)
  local e = fcall.reply_error(err)
  if not unknown then return e end
  return errors.new("EREDIS", ("unknown whether the job was added: it was sent, but no reply came (asked again for "
    .. "%g s): %s"):format(resolve_ms / 1000, e.message))
end

-- Encodes data for the queue, at most max_payload bytes of JSON: with
-- codec (encode(v) -> text | nil, err), default moonjob's exact JSON.
function M.encode(data, max_payload, codec)
  local text, err = (codec or require("moonjob.codec.json")).encode(data)
  if not text then return nil, errors.new("EPAYLOAD", "the job data cannot be written as JSON: " .. err) end
  if #text > max_payload then
    return nil, errors.new("EPAYLOAD", ("the job data takes %d bytes of JSON, more than max_payload (%d)")
      :format(#text, max_payload))
  end
  return text
end

return M
