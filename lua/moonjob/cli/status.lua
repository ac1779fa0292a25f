-- moonjob.cli.status -- `moonjob status --queue Q [--watch [--until-empty]] [--json]`:
-- a queue's counts, once or every second.
--
--   waiting 120, delayed 0, running 4, held 2, completed 880, failed 3
--   ever: completed 1204, failed 9
--
-- running: jobs the workers' children run, as their heartbeats say (within
-- 200 ms of a start, however short the job); held: the other active jobs,
-- fetched by a worker and not yet handed to a child. completed and failed:
-- the jobs in those states now (kept by retention; a retry moves them);
-- the "ever" line counts every job that ever ended so (--json:
-- completed_ever, failed_ever), said once retention, a retry or a removal
-- made it differ from the line's (and not by --watch).
-- `paused` ends the line while the queue is paused, `missing N` once jobs
-- were found gone from Redis, `waiting-children N` while N of a flow's
-- parents wait for their children (said only then, so that the line of a
-- queue without flows reads as before; --json always has waiting_children). A queue with no key at all is "no such
-- queue" (exit 1), not a line of zeros.
--
-- --watch: every second; on a terminal the line is redrawn in place with the
-- rate (jobs ended per second over the last 10 s) and an ETA for what waits
-- and runs; elsewhere one line per second. --until-empty: ends (exit 0) once
-- nothing waits, is delayed, runs or waits for children (a flow's parent
-- whose children run on another queue still has to run). Ctrl-C ends a watch with exit 0.
-- --json: one JSON object per look instead of the line.
--
-- Once (not --watch), a line for the queue's limits, one for its groups
-- and one for its schedules follow when it has them, then the "ever" line
-- when it differs:
--   limits: 10 jobs per 1 s (7 in the current window), 5 at once; each group: 3 jobs per 1 s, 2 at once
--   groups: 12 with waiting jobs, 2 held back: tenant-42 held 3.0 s (ERATELIMIT), tenant-7 at its cap
--   schedules: 3; next: nightly at 2026-12-01T03:00:00Z
-- The groups line names the first 5 groups held back (Redis orders them:
-- by when it looks at them again; a group at its cap, when the first lease
-- of its running jobs ends) and counts the rest; --json lists the first 50.
-- --watch ends its line with "; held back N s" during an ERATELIMIT hold
-- and "; N groups held back" while groups are.
local core = require "moonjob.core"
local json = require "moonjob.codec.json"
local loop = require "moonjob.loop"
local operate = require "moonjob.cli.operate"
local stops = require "moonjob.cli.stops"

local M = {}
local EXIT_OK, EXIT_FAILED = stops.EXIT_OK, stops.EXIT_FAILED
local say = operate.say

local GROUPS_NAMED, GROUPS_LISTED = 5, 50 -- held-back groups named on the line, listed in --json

-- "10 jobs per 1 s (7 in the current window), 5 at once" for the queue,
-- "each group: 3 jobs per 1 s, 2 at once" for its groups; nil for none.
local function rate_text(rate, concurrency, started)
  local parts = {}
  if rate then
    parts[1] = ("%d job%s per %g s"):format(rate.max, rate.max == 1 and "" or "s", rate.per)
    if started then parts[1] = parts[1] .. (" (%d in the current window)"):format(started) end
  end
  if concurrency then parts[#parts + 1] = ("%d at once"):format(concurrency) end
  return #parts > 0 and table.concat(parts, ", ") or nil
end

-- The limits line, or nil without limits or hold.
local function limits_line(l)
  local parts = {}
  parts[#parts + 1] = rate_text(l.rate, l.concurrency, l.started)
  local each = rate_text(l.group_rate, l.group_concurrency)
  if each then parts[#parts + 1] = "each group: " .. each end
  if l.held_back > 0 then parts[#parts + 1] = ("held back %.1f s (ERATELIMIT)"):format(l.held_back) end
  return #parts > 0 and "limits: " .. table.concat(parts, "; ") or nil
end

-- Why a held-back group (a row of q:groups) takes no job now.
local function held_back_text(row)
  if row.state == "held" then return ("%s held %.1f s (ERATELIMIT)"):format(row.group, row.seconds) end
  if row.state == "at_cap" then return row.group .. " at its cap" end
  if row.state == "rate" then return ("%s rate window full %.1f s"):format(row.group, row.seconds) end
  return row.group .. " " .. tostring(row.state)
end

-- The groups line, or nil while no group has waiting jobs. counts:
-- limits().groups; rows: the held-back rows of q:groups.
local function groups_line(counts, rows)
  local total = counts.ready + counts.held_back
  if total == 0 then return nil end
  local line = ("groups: %d with waiting jobs, "):format(total)
  if counts.held_back == 0 then return line .. "none held back" end
  local named = {}
  for i = 1, math.min(GROUPS_NAMED, #rows) do named[i] = held_back_text(rows[i]) end
  line = line .. ("%d held back"):format(counts.held_back)
  if #named == 0 then return line end
  line = line .. ": " .. table.concat(named, ", ")
  if counts.held_back > #named then line = line .. (" and %d more"):format(counts.held_back - #named) end
  return line
end

-- The schedules line, or nil without schedules.
local function schedules_line(list, total)
  if total == 0 then return nil end
  local first = list[1]
  if first.ended then return ("schedules: %d, all ended"):format(total) end
  return ("schedules: %d; next: %s at %s"):format(total, first.id, operate.when(first.next))
end

-- What once (not --watch) shows besides the counts: { limits, schedules }
-- lines and the JSON fields; nil and an error when Redis refused.
local function extras(q)
  local l, err = q:limits()
  if not l then return nil, err end
  local rows
  rows, err = q:held_groups(l.groups, GROUPS_LISTED)
  if not rows then return nil, err end
  local list, total = q:schedules({ limit = 1 })
  if not list then return nil, total end
  local lines = {}
  lines[#lines + 1] = limits_line(l)
  lines[#lines + 1] = groups_line(l.groups, rows)
  lines[#lines + 1] = schedules_line(list, total)
  return { lines = lines, limits = l, schedules = total,
    groups = { ready = l.groups.ready, held_back = l.groups.held_back, held = rows }, -- (--json's names)
    next_schedule = list[1] and not list[1].ended and { id = list[1].id, at = list[1].next } or nil }
end

function M.counts_line(c)
  local line = ("waiting %d, delayed %d, running %d, held %d, completed %d, failed %d"):format(
    c.waiting, c.delayed, c.running, c.held, c.completed, c.failed)
  if c.lapsed > 0 then
    line = line .. (", lapsed %d (their worker is gone: recovered when their lease ends)"):format(c.lapsed)
  end
  if (c.waiting_children or 0) > 0 then line = line .. (", waiting-children %d"):format(c.waiting_children) end
  if (c.missing or 0) > 0 then
    line = line .. (", missing %d (gone from Redis: evicted or deleted)"):format(c.missing)
  end
  if c.paused then line = line .. "; paused" end
  if (c.held_back or 0) > 0 then line = line .. ("; held back %.1f s (ERATELIMIT)"):format(c.held_back) end
  if (c.groups_held_back or 0) > 0 then
    line = line .. ("; %d group%s held back"):format(c.groups_held_back, c.groups_held_back == 1 and "" or "s")
  end
  return line
end

-- Jobs ended per second over the last samples (up to 10 s), or nil.
local Rate = {}
Rate.__index = Rate

local function new_rate() return setmetatable({ samples = {} }, Rate) end

function Rate:add(c)
  local s = self.samples
  s[#s + 1] = { at = loop.now(), ended = c.completed_ever + c.failed_ever }
  if #s > 11 then table.remove(s, 1) end
  if #s < 2 then return nil end
  local first, last = s[1], s[#s]
  return (last.ended - first.ended) * 1000 / math.max(1, last.at - first.at)
end

local function eta_text(left, rate)
  if left == 0 then return "done" end
  if not rate or rate <= 0 then return "ETA -" end
  local s = math.floor(left / rate + 0.5)
  return ("ETA %d:%02d:%02d"):format(math.floor(s / 3600), math.floor(s % 3600 / 60), s % 60)
end

-- True, or false and whether the reader went away (| head: said nothing).
local function write(...)
  local ok, err, errno = io.stdout:write(...)
  if ok then ok, err, errno = io.stdout:flush() end
  if ok then return true end
  if stops.reader_gone(err, errno) then return false, true end
  say("writing to standard output failed: ", tostring(err))
  return false, false
end

-- One look's output; false when stdout failed, and whether its reader went.
local function show(c, rate, o, in_place, more)
  if o.json then
    local t = { waiting = c.waiting, delayed = c.delayed, running = c.running, held = c.held, lapsed = c.lapsed,
      completed = c.completed, failed = c.failed, missing = c.missing, paused = c.paused, rate = rate,
      waiting_children = c.waiting_children or 0, completed_ever = c.completed_ever,
      failed_ever = c.failed_ever, workers = c.workers }
    if more then
      t.limits = { rate = more.limits.rate, concurrency = more.limits.concurrency,
        held_back = more.limits.held_back, group_rate = more.limits.group_rate,
        group_concurrency = more.limits.group_concurrency }
      t.schedules, t.next_schedule, t.groups = more.schedules, more.next_schedule, more.groups
    end
    return write(json.encode(t), "\n")
  end
  local line = M.counts_line(c)
  if more then
    for _, extra in ipairs(more.lines) do line = line .. "\n" .. extra end
  end
  if not o.watch and (c.completed_ever ~= c.completed or c.failed_ever ~= c.failed) then
    line = line .. ("\never: completed %d, failed %d"):format(c.completed_ever, c.failed_ever)
  end
  if o.watch and rate then
    line = line .. (" | %.1f jobs/s, %s"):format(rate, eta_text(c.waiting + c.active + (c.waiting_children or 0), rate))
  end
  if in_place then -- one row, so that \r and erase-line redraw all of it
    return write("\r\27[K", line:sub(1, operate.terminal_width() - 1))
  end
  return write(line, "\n")
end

-- c, with what --watch's line says of holds: an ERATELIMIT hold's seconds
-- left, the number of groups held back.
local function with_holds(q, c)
  local l = q:limits() -- a look that fails only loses the holds' mention
  c.held_back, c.groups_held_back = l and l.held_back, l and l.groups.held_back
  return c
end

-- Sleeps a second; false when a stop signal came.
local function second()
  local fired = false
  local t = core.timer(function() fired = true end)
  t:start(1000)
  core.hold_stop_signals()
  local ok = pcall(loop.wait_until, function() return fired end)
  t:close()
  return ok
end

function M.run(o)
  local q, c = operate.existing_queue(o)
  if not q then return EXIT_FAILED end
  local in_place = o.watch and core.isatty(1) and not o.json
  local rate_of = new_rate()
  local status = EXIT_OK
  local more
  if o.watch then
    with_holds(q, c)
  else
    local err
    more, err = extras(q)
    if not more then say(tostring(err)) q:close() return EXIT_FAILED end
  end
  while true do
    local rate = rate_of:add(c)
    local shown, reader_gone = show(c, rate, o, in_place, more)
    if not shown then status = reader_gone and status or EXIT_FAILED break end
    if not o.watch then break end
    if o.until_empty and c.waiting + c.delayed + c.active + (c.waiting_children or 0) == 0 then break end
    if not second() then break end
    local err
    c, err = q:counts()
    if not c then say(tostring(err)) status = EXIT_FAILED break end
    with_holds(q, c)
  end
  if in_place then io.stdout:write("\n") end
  q:close()
  return status
end

return M
