-- moonjob.cli.schedule -- `moonjob schedule`: a queue's repeating jobs from
-- the command line (moonjob.redis.schedules does the work).
--
--   moonjob schedule add --queue Q ID --cron "0 3 * * *" [--tz local] [--data JSON]
--   moonjob schedule add --queue Q ID --every 30 [--limit N] [--start T] [--stop T]
--   moonjob schedule list --queue Q
--   moonjob schedule next --queue Q ID [--limit N]   (its next N slots: a preview)
--   moonjob schedule remove --queue Q ID...
--
-- add also takes --catch-up none|one and the job options of moonjob add
-- (--attempts, --backoff, --timeout, --kill-after, --priority, --delay,
-- --group).
-- --tz is UTC, local, a zone of the tz database (Europe/Berlin: its
-- daylight saving time kept) or an offset (+05:30). --start and --stop are
-- times: seconds since the epoch, or UTC written 2026-12-01T03:00Z or
-- 2026-12-01T03:00:00Z (a stop already passed is refused). Output and exit
-- status as moonjob.cli.operate's: NDJSON (or a table on a terminal), 1
-- when something failed, 2 for usage errors (a definition Redis refuses,
-- as a cron field out of range, included).
local json = require "moonjob.codec.json"
local fcall = require "moonjob.redis.fcall"
local operate = require "moonjob.cli.operate"
local stops = require "moonjob.cli.stops"

local M = {}
local EXIT_OK, EXIT_FAILED = stops.EXIT_OK, stops.EXIT_FAILED
local say, usage_error = operate.say, stops.usage_error

-- Days from 1970-01-01 to a civil date (proleptic Gregorian).
local function days_from_civil(y, m, d)
  if m <= 2 then y = y - 1 end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local mp = (m + 9) % 12
  local doy = math.floor((153 * mp + 2) / 5) + d - 1
  local doe = yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy
  return era * 146097 + doe - 719468
end

-- A time as --start and --stop take it -> seconds since the epoch, or nil.
function M.parse_time(text)
  if text:match("^%d+%.?%d*$") then return tonumber(text) end
  local y, mo, d, h, mi, sec = text:match("^(%d%d%d%d)%-(%d%d)%-(%d%d)T(%d%d):(%d%d):?(%d*)Z$")
  if not y then return nil end
  y, mo, d, h, mi, sec = tonumber(y), tonumber(mo), tonumber(d), tonumber(h), tonumber(mi), tonumber(sec) or 0
  if mo < 1 or mo > 12 or d < 1 or d > 31 or h > 23 or mi > 59 or sec > 59 then return nil end
  return days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + sec
end

local function job_options(o)
  return { attempts = o.attempts, backoff = o.backoff, timeout = o.timeout, kill_after = o.kill_after,
    priority = o.priority, delay = o.delay, group = o.group }
end

-- The when table of q:schedule from the options, or nil and a usage message.
local function when_of(o)
  if (o.cron == nil) == (o.every == nil) then
    return nil, "moonjob schedule add needs one of --cron \"m h dom mon dow\" or --every SECONDS"
  end
  local when = { cron = o.cron, every = o.every, tz = o.tz, limit = o.limit, catch_up = o.catch_up }
  for _, k in ipairs({ "start", "stop" }) do
    if o[k] then
      when[k] = M.parse_time(o[k])
      if not when[k] then
        return nil, ("--%s needs a time: seconds since the epoch, or UTC such as 2026-12-01T03:00Z, not '%s'")
          :format(k, o[k])
      end
    end
  end
  return when
end

local function add(ids, o)
  if #ids ~= 1 then return usage_error("moonjob schedule add takes one schedule id: moonjob schedule add --queue NAME ID --cron ...") end
  local when, why = when_of(o)
  if not when then return usage_error(why) end
  local data = json.null
  if o.data then
    local ok, decoded = pcall(json.decode, o.data)
    if not ok or decoded == nil then return usage_error(("--data needs JSON text, such as '{\"a\":1}', not '%s'"):format(o.data)) end
    data = decoded
  end
  local q = operate.open_queue(o)
  if not q then return EXIT_FAILED end
  local ok, s, err = pcall(q.schedule, q, ids[1], when, data, job_options(o))
  q:close()
  if not ok then return usage_error((tostring(s):gsub("^queue:schedule%(%): ", ""))) end
  if not s and err.code == "EINPUT" then -- the definition was refused: the user's to mend
    return usage_error((tostring(err.message):gsub("^moonjob_%w+: ", "")))
  end
  if not s then say(tostring(err)) return EXIT_FAILED end
  local out = operate.new_out(o)
  out:object({ id = s.id, action = "schedule", state = s.state, next = s.next,
    next_at = out.table and operate.when(s.next) or nil })
  return out:flush({ "id", "action", "state", "next_at" }) and EXIT_OK or EXIT_FAILED
end

local function zone(minutes)
  if not minutes or minutes == 0 then return "UTC" end
  local sign = minutes < 0 and "-" or "+"
  minutes = math.abs(minutes)
  return ("%s%02d:%02d"):format(sign, math.floor(minutes / 60), minutes % 60)
end

local function list(o)
  local q = operate.existing_queue(o)
  if not q then return EXIT_FAILED end
  local all, err = q:schedules()
  q:close()
  if not all then say(tostring(err)) return EXIT_FAILED end
  local out = operate.new_out(o)
  for _, s in ipairs(all) do
    if out.table then
      s = { id = s.id, when = s.cron or ("every %gs"):format(s.every), tz = s.cron and (s.tz or zone(s.tz_offset)) or "",
        next = s.ended and "ended" or operate.when(s.next), last = operate.when(s.last),
        runs = s.limit > 0 and ("%d/%d"):format(s.runs, s.limit) or s.runs, note = s.note }
    end
    out:object(s)
  end
  if out.table and #all == 0 then say("no schedule on queue ", o.queue, " (moonjob schedule add makes one)") end
  return out:flush({ "id", "when", "tz", "next", "last", "runs", "note" }) and EXIT_OK or EXIT_FAILED
end

-- A schedule's next `count` slots from its next one, as Redis computes them
-- (moonjob_cron, read-only: its zone's offsets included), within its stop.
local function slots_of(q, sc, count)
  if not sc.next then return {} end
  local list = {}
  if sc.every then
    for k = 0, count - 1 do list[#list + 1] = sc.next + k * sc.every * 1000 end
  else
    local reply, err = fcall.call(q, "moonjob_cron", 1, q.prefix, sc.cron, ("%.0f"):format(sc.next - 1),
      sc.tz_shifts or tostring(sc.tz_offset or 0), count)
    if not reply then return nil, err end
    list = reply
  end
  local kept = {}
  for _, ms in ipairs(list) do
    if not sc.stop or ms <= sc.stop then kept[#kept + 1] = ms end
  end
  return kept
end

-- moonjob schedule next ID [--limit N]: an operator's preview of a schedule's slots.
local function next_slots(ids, o)
  if #ids ~= 1 then return usage_error("moonjob schedule next takes one schedule id: moonjob schedule next --queue NAME ID [--limit N]") end
  local count = o.limit or 5
  if count > 100 then return usage_error("moonjob schedule next shows at most 100 slots (--limit 1 to 100)") end
  local q = operate.existing_queue(o)
  if not q then return EXIT_FAILED end
  local all, err = q:schedules()
  local sc, slots
  for _, s in ipairs(all or {}) do if s.id == ids[1] then sc = s end end
  if sc then slots, err = slots_of(q, sc, count) end
  q:close()
  if not all or (sc and not slots) then say(tostring(err)) return EXIT_FAILED end
  if not sc then say(("no schedule %s in queue %s (moonjob schedule list shows them)"):format(ids[1], o.queue)) return EXIT_FAILED end
  local out = operate.new_out(o)
  for _, ms in ipairs(slots) do out:object({ id = sc.id, slot = ms, at = operate.when(ms) }) end
  return out:flush({ "id", "at" }) and EXIT_OK or EXIT_FAILED
end

local function remove(ids, o)
  if #ids == 0 then return usage_error("moonjob schedule remove takes schedule ids: moonjob schedule remove --queue NAME ID...") end
  local q = operate.existing_queue(o)
  if not q then return EXIT_FAILED end
  local out, failed = operate.new_out(o), 0
  for _, id in ipairs(ids) do
    local ok, err = q:unschedule(id)
    if ok then out:object({ id = id, action = "unschedule" })
    else
      failed = failed + 1
      say(("schedule remove %s: %s"):format(id, tostring(err)))
    end
  end
  q:close()
  local printed = out:flush({ "id", "action" })
  return (failed == 0 and printed) and EXIT_OK or EXIT_FAILED
end

-- moonjob schedule add | list | remove ... -> exit status
function M.run(words, o)
  local sub = words[1]
  local rest = { unpack(words, 2) }
  if sub == "add" then return add(rest, o) end
  if sub == "remove" then return remove(rest, o) end
  if sub == "next" then return next_slots(rest, o) end
  if sub == "list" then
    if rest[1] then return usage_error(("unexpected argument '%s'"):format(rest[1])) end
    return list(o)
  end
  return usage_error(("moonjob schedule takes add, list, next or remove%s"):format(
    sub and (", not '" .. sub .. "'") or ""))
end

return M
