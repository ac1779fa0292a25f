-- moonjob.cli.operate -- the command line's commands that look at and act
-- on a durable queue (moonjob.redis.operate does the work):
--
--   moonjob queues                                   the queues, with counts
--   moonjob jobs --queue Q [--state S] [--limit N] [--offset N]
--   moonjob job --queue Q ID                         (a flow's: its parent, its children)
--   moonjob retry --queue Q ID... | --all [--state completed]
--   moonjob remove --queue Q ID... [--cascade]
--   moonjob promote --queue Q ID...
--   moonjob clean --queue Q --state S --older-than SECONDS [--limit N]
--   moonjob pause | resume --queue Q
--   moonjob limit --queue Q [--rate R] [--concurrency N] [--group-rate R] [--group-concurrency N] [--clear]
--   moonjob limits --queue Q                         the limits, what they hold back now
--   moonjob drain --queue Q                          waiting and delayed jobs removed
--   moonjob obliterate --queue Q --yes [--force]     the whole queue removed
--   moonjob status --queue Q [--watch [--until-empty]]
--
-- All take --redis URL (or MOONJOB_REDIS). What they print goes to stdout:
-- one JSON object per line (NDJSON: keys sorted, for jq and scripts), or,
-- when stdout is a terminal, a table (--json asks for NDJSON there too).
-- Errors go to stderr, one line each. A reader that goes away (| head) ends
-- the output quietly. Exit status: 0 when everything asked was done, 1 when something was refused (an unknown id, a job in another
-- state, no such queue: each said), 2 for usage errors.
local core = require "moonjob.core"
local json = require "moonjob.codec.json"
local moonjob = require "moonjob"
local stops = require "moonjob.cli.stops"
local Operate = require "moonjob.redis.operate"

local M = {}
local EXIT_OK, EXIT_FAILED = stops.EXIT_OK, stops.EXIT_FAILED

local function say(...)
  io.stderr:write("moonjob: ", ...)
  io.stderr:write("\n")
end
M.say = say

-- Output: NDJSON lines or a table, and the first write error.
local Out = {}
Out.__index = Out

local function new_out(o)
  return setmetatable({ table = core.isatty(1) and not o.json, rows = {} }, Out)
end

-- The first write error is kept; a reader gone (| head) is noted apart.
function Out:fail(err, errno)
  self.err, self.reader_gone = err, stops.reader_gone(err, errno)
end

function Out:write(...)
  if self.err then return end
  local ok, err, errno = io.stdout:write(...)
  if not ok then self:fail(err, errno) end
end

function Out:object(t)
  if self.table then self.rows[#self.rows + 1] = t return end
  self:write(Operate.encode(t), "\n")
end

-- Text for a terminal: control characters (an escape sequence a job
-- printed) shown as "?", lines and tabs kept.
local function clean(s)
  return (tostring(s):gsub("[%z\1-\8\11-\31\127]", "?"))
end

-- The terminal's width in columns (stdout's), else COLUMNS, else 120.
local ffi = require "ffi"
pcall(ffi.cdef, [[
struct moonjob_winsize { unsigned short rows, cols, xpixel, ypixel; };
int ioctl(int fd, unsigned long request, ...);
]])
function M.terminal_width()
  local ws = ffi.new("struct moonjob_winsize")
  if ffi.C.ioctl(1, 0x5413, ws) == 0 and ws.cols > 0 then return ws.cols end -- TIOCGWINSZ
  return tonumber(os.getenv("COLUMNS")) or 120
end

local function cell(v)
  if v == nil then return "" end
  if type(v) == "table" then v = Operate.encode(v) end
  return (tostring(v):gsub("%c", " "))
end

-- The rows gathered, as a table of `columns`; the last column is cut to the
-- terminal's width.
function Out:flush(columns)
  if not self.table then return self:done() end
  local width = M.terminal_width()
  local widths = {}
  for i, c in ipairs(columns) do widths[i] = #c end
  local cells = {}
  for r, row in ipairs(self.rows) do
    cells[r] = {}
    for i, c in ipairs(columns) do
      cells[r][i] = cell(row[c])
      if i < #columns then widths[i] = math.min(40, math.max(widths[i], #cells[r][i])) end
    end
  end
  local function line(values)
    local parts, used = {}, 0
    for i, v in ipairs(values) do
      if i < #values then
        v = v:sub(1, widths[i])
        parts[i] = v .. string.rep(" ", widths[i] - #v + 2)
        used = used + widths[i] + 2
      else
        parts[i] = v:sub(1, math.max(10, width - used))
      end
    end
    self:write(table.concat(parts):gsub("%s+$", ""), "\n")
  end
  local head = {}
  for i, c in ipairs(columns) do head[i] = c:upper() end
  line(head)
  for _, r in ipairs(cells) do line(r) end
  self.rows = {}
  return self:done()
end

-- Whether what was written went out. A reader that went away (| head)
-- read what it wanted: that is not a failure, and nothing is said.
function Out:done()
  if not self.err then
    local ok, err, errno = io.stdout:flush()
    if not ok then self:fail(err, errno) end
  end
  if self.reader_gone then return true end
  if self.err then say("writing to standard output failed: ", tostring(self.err)) end
  return not self.err
end

local function open_queue(o)
  local q, err = moonjob.queue(o.redis, o.queue)
  if not q then say(tostring(err)) end
  return q
end

-- The queue and its counts, or nil after saying it does not exist (naming
-- those that do).
local function existing_queue(o)
  local q = open_queue(o)
  if not q then return nil end
  local c, err = q:counts()
  if not c then say(tostring(err)) q:close() return nil end
  if c.exists then return q, c end
  q:close()
  M.no_such_queue(o)
  return nil
end

-- Says that queue o.queue has no key on the server (ENOQUEUE: docs/reference/errors.md),
-- naming the queues it holds.
function M.no_such_queue(o)
  local names = {}
  for _, info in ipairs(moonjob.queues(o.redis) or {}) do names[#names + 1] = info.name end
  say(("ENOQUEUE: no such queue: '%s' has no key on this server (nothing was ever added to it, or it was "
    .. "removed); check --queue and --redis. %s"):format(o.queue,
    #names > 0 and "The queues there: " .. table.concat(names, ", ") or "The server holds no queue."))
end

local function when(ms)
  if not ms then return nil end
  return os.date("!%Y-%m-%dT%H:%M:%SZ", math.floor(ms / 1000))
end

-- A job as printed: every field of moonjob.redis.operate's, times as ms;
-- in a table also an outcome column.
local function job_row(job, table_form)
  local row = Operate.record(job)
  if table_form then
    row.outcome = job.error and (tostring(job.error.code) .. ": " .. tostring(job.error.message))
      or (job.result ~= nil and Operate.encode(job.result)) or job.result_preview
      or (job.data ~= nil and "data " .. Operate.encode(job.data)) or job.data_preview
    row.attempts = ("%d/%d"):format(job.attempts or 0, job.max_attempts or 1)
    row.at = when(job.finished or job.started or job.created)
  end
  return row
end

M.existing_queue = existing_queue
M.open_queue, M.new_out, M.when = open_queue, new_out, when

function M.queues(o)
  local list, err = moonjob.queues(o.redis)
  if not list then say(tostring(err)) return EXIT_FAILED end
  local out = new_out(o)
  local columns, parents, lapsed = { "name", "waiting", "delayed", "active", "running", "held", "completed",
    "failed", "completed_ever", "failed_ever", "workers", "paused" }, 0, 0
  local failing = false
  for _, q in ipairs(list) do
    out:object({ name = q.name, waiting = q.waiting, delayed = q.delayed, active = q.active, held = q.held,
      running = q.running, lapsed = q.lapsed, completed = q.completed, failed = q.failed, completed_ever = q.completed_ever,
      failed_ever = q.failed_ever, workers = q.workers, paused = q.paused,
      waiting_children = q.waiting_children or 0, error = q.error and tostring(q.error) or nil,
      unreachable = q.unreachable })
    parents, lapsed = parents + (q.waiting_children or 0), lapsed + q.lapsed
    failing = failing or q.error ~= nil
  end
  if failing then columns[#columns + 1] = "error" end -- (a shard unreachable, a key spoiled: say it)
  if out.table and #list == 0 then say("no queue on this server (a queue appears once a moonjob program used it)") end
  if parents > 0 then table.insert(columns, 3, "waiting_children") end -- (a column only where flows wait)
  if lapsed > 0 then -- (a column only while a worker lapsed: after held)
    for i, name in ipairs(columns) do if name == "held" then table.insert(columns, i + 1, "lapsed") break end end
  end
  return out:flush(columns) and EXIT_OK or EXIT_FAILED
end

function M.jobs(o)
  local q = existing_queue(o)
  if not q then return EXIT_FAILED end
  local out = new_out(o)
  local jobs, err = q:jobs(o.state or "waiting", { limit = o.limit or 20, offset = o.offset,
    preview = out.table and 200 or nil })
  q:close()
  if not jobs then say(tostring(err)) return EXIT_FAILED end
  for _, job in ipairs(jobs) do out:object(job_row(job, out.table)) end
  return out:flush({ "id", "state", "name", "attempts", "at", "outcome" }) and EXIT_OK or EXIT_FAILED
end

local CHILDREN_SHOWN = 50 -- a parent's children listed on a terminal (--json: each one)

-- A flow's child's end in short: its result, or its error's code and message.
local function child_outcome(child)
  if child.error then return tostring(child.error.code) .. ": " .. tostring(child.error.message) end
  if child.result ~= nil then return Operate.encode(child.result) end
  return ""
end

-- "3: 1 completed, 1 failed, 1 pending" of a parent's children.
local function children_summary(children)
  local n, order = {}, { "completed", "failed", "ignored", "pending" }
  for _, child in ipairs(children) do
    local kind = (child.state == "completed" or child.state == "failed" or child.state == "ignored")
      and child.state or "pending"
    n[kind] = (n[kind] or 0) + 1
  end
  local parts = {}
  for _, kind in ipairs(order) do if n[kind] then parts[#parts + 1] = n[kind] .. " " .. kind end end
  return #children .. ": " .. table.concat(parts, ", ")
end

-- A parent's children on a terminal: a summary line, then one line each
-- (id, queue, state, its result or error in short, cut to the width).
local function write_children(out, children)
  out:write("children  ", children_summary(children), "\n")
  local shown, widths = math.min(#children, CHILDREN_SHOWN), { 0, 0, 0 }
  for i = 1, shown do
    local c = children[i]
    for k, v in ipairs({ c.id, c.queue, c.state }) do widths[k] = math.min(40, math.max(widths[k], #cell(v))) end
  end
  local width = M.terminal_width()
  for i = 1, shown do
    local c, parts = children[i], { "" }
    for k, v in ipairs({ c.id, c.queue, c.state }) do
      v = cell(v):sub(1, widths[k])
      parts[#parts + 1] = v .. string.rep(" ", widths[k] - #v)
    end
    parts[#parts + 1] = cell(child_outcome(c))
    out:write((table.concat(parts, "  "):sub(1, math.max(10, width - 1)):gsub("%s+$", "")), "\n")
  end
  if #children > shown then
    out:write(("  and %d more (--json lists each one)\n"):format(#children - shown))
  end
end

function M.job(id, o)
  local q = open_queue(o)
  if not q then return EXIT_FAILED end
  local job, err = q:job(id)
  if job then Operate.parent_state(q, job) end
  q:close()
  if not job and type(err) == "table" and err.code == "ENOQUEUE" then M.no_such_queue(o) return EXIT_FAILED end
  if not job then say(tostring(err)) return EXIT_FAILED end
  local out = new_out(o)
  if not out.table then
    out:object(job_row(job))
    return out:done() and EXIT_OK or EXIT_FAILED
  end
  local row = job_row(job, true)
  for _, k in ipairs({ "id", "state", "name", "attempts", "priority", "worker", "progress" }) do
    if row[k] ~= nil then out:write(("%-9s %s\n"):format(k, cell(row[k]))) end
  end
  for _, k in ipairs({ "created", "started", "finished" }) do
    if job[k] then out:write(("%-9s %s\n"):format(k, when(job[k]))) end
  end
  if job.ms then out:write(("%-9s %d ms\n"):format("ran", job.ms)) end
  if job.parent then
    local p = job.parent
    out:write(("%-9s %s in queue %s%s\n"):format("parent", cell(p.id), cell(p.queue), p.state and " (" .. p.state .. ")" or ""))
  end
  out:write("data      ", clean(Operate.encode(job.data)), "\n")
  if job.result ~= nil then out:write("result    ", clean(Operate.encode(job.result)), "\n") end
  if job.error then
    out:write("error     ", clean(job.error.code), ": ", clean(job.error.message), "\n")
    if job.error.traceback then out:write(clean(job.error.traceback), "\n") end
  end
  if job.children then write_children(out, job.children) end
  if #job.log > 0 then out:write("log\n  ", clean(table.concat(job.log, "\n  ")), "\n") end
  return out:done() and EXIT_OK or EXIT_FAILED
end

-- retry, remove, promote: each id in turn; one line per id done, one
-- message per id refused.
function M.each(action, ids, o)
  local q = existing_queue(o)
  if not q then return EXIT_FAILED end
  local out, failed = new_out(o), 0
  local opts = action == "remove" and o.cascade and { cascade = true } or nil
  for _, id in ipairs(ids) do
    local was, err = q[action](q, id, opts)
    if was then
      out:object({ id = id, action = action, was = was })
    else
      failed = failed + 1
      local hint = action == "remove" and err.code == "ESTATE" and tostring(err.message):find("with cascade", 1, true)
        and " (here: moonjob remove --cascade)" or ""
      say(("%s %s: %s%s"):format(action, id, tostring(err), hint))
    end
  end
  q:close()
  local printed = out:flush({ "id", "action", "was" })
  return (failed == 0 and printed) and EXIT_OK or EXIT_FAILED
end

-- moonjob retry --all [--state completed] [--limit N]; moonjob clean;
-- moonjob pause / resume: one line saying what was done.
local function report(o, fields)
  local out = new_out(o)
  if out.table then
    local parts = {}
    for _, k in ipairs({ "queue", "action", "state", "count", "paused" }) do
      if fields[k] ~= nil then parts[#parts + 1] = k .. " " .. tostring(fields[k]) end
    end
    out:write(table.concat(parts, ", "), "\n")
    return out:done() and EXIT_OK or EXIT_FAILED
  end
  out:object(fields)
  return out:done() and EXIT_OK or EXIT_FAILED
end

function M.retry_all(o)
  local q = existing_queue(o)
  if not q then return EXIT_FAILED end
  local n, err = q:retry_all({ state = o.state or "failed", limit = o.limit })
  q:close()
  if not n then say(tostring(err)) return EXIT_FAILED end
  return report(o, { queue = o.queue, action = "retry", state = o.state or "failed", count = n })
end

function M.clean(o)
  local q = existing_queue(o)
  if not q then return EXIT_FAILED end
  local n, err = q:clean(o.state, { older_than = o.older_than or 0, limit = o.limit })
  q:close()
  if not n then say(tostring(err)) return EXIT_FAILED end
  return report(o, { queue = o.queue, action = "clean", state = o.state, count = n })
end

function M.pause(o, resume)
  local q = existing_queue(o)
  if not q then return EXIT_FAILED end
  local ok, err
  if resume then ok, err = q:resume() else ok, err = q:pause() end
  q:close()
  if not ok then say(tostring(err)) return EXIT_FAILED end
  return report(o, { queue = o.queue, action = resume and "resume" or "pause", paused = not resume })
end


------------------------------------------------------------- limits ---

-- "100/1s", "1/2s": a rate as moonjob limit takes it back.
local function rate_text(rate)
  if not rate then return "none" end
  return ("%d/%gs"):format(rate.max, rate.per)
end

-- The queue's limits as printed: the four limits (null: none), and what
-- they hold back now (held_back: seconds an ERATELIMIT holds it; started:
-- jobs started in the rate's window; active: jobs held or running).
local function limits_row(name, l)
  local null = json.null
  return { queue = name, rate = l.rate or null, concurrency = l.concurrency or null,
    group_rate = l.group_rate or null, group_concurrency = l.group_concurrency or null,
    held_back = l.held_back, started = l.started, active = l.active }
end

local function write_limits(o, q)
  local l, err = q:limits()
  q:close()
  if not l then say(tostring(err)) return EXIT_FAILED end
  local out = new_out(o)
  if not out.table then
    out:object(limits_row(o.queue, l))
    return out:done() and EXIT_OK or EXIT_FAILED
  end
  out:write(("queue              %s\n"):format(o.queue))
  out:write(("rate               %s\n"):format(rate_text(l.rate)))
  out:write(("concurrency        %s\n"):format(l.concurrency or "none"))
  out:write(("group rate         %s\n"):format(rate_text(l.group_rate)))
  out:write(("group concurrency  %s\n"):format(l.group_concurrency or "none"))
  out:write(("now                %d active, %d started in the rate's window%s\n"):format(l.active, l.started,
    l.held_back > 0 and (", held back %.1f s more (ERATELIMIT)"):format(l.held_back) or ""))
  return out:done() and EXIT_OK or EXIT_FAILED
end

function M.show_limits(o)
  local q = existing_queue(o)
  if not q then return EXIT_FAILED end
  return write_limits(o, q)
end

-- moonjob limit: --clear lifts every limit first, then each limit given is
-- set (none lifts it); prints the limits as moonjob limits does. Each value
-- was checked by moonjob.cli.args: a call that fails is Redis's refusal.
function M.limit(o)
  local q = existing_queue(o)
  if not q then return EXIT_FAILED end
  local steps = {}
  local function set(method, v, given)
    if given or o.clear then steps[#steps + 1] = { method, given and v or nil } end
  end
  set("set_rate", o.rate or nil, o.rate ~= nil)
  set("set_concurrency", o.concurrency or nil, o.concurrency ~= nil)
  set("set_group_rate", o.group_rate or nil, o.group_rate ~= nil)
  set("set_group_concurrency", o.group_concurrency or nil, o.group_concurrency ~= nil)
  for _, step in ipairs(steps) do
    local ok, err = q[step[1]](q, step[2])
    if not ok then
      q:close()
      say(("%s: %s"):format(step[1]:gsub("_", "-"):gsub("^set%-", "--"), tostring(err)))
      return EXIT_FAILED
    end
  end
  return write_limits(o, q)
end

------------------------------------------------- drain and obliterate ---

function M.drain(o)
  local q = existing_queue(o)
  if not q then return EXIT_FAILED end
  local n, err = q:drain()
  q:close()
  if not n then
    say(tostring(err), err and err.done and (" (%d removed before it)"):format(err.done) or "")
    return EXIT_FAILED
  end
  return report(o, { queue = o.queue, action = "drain", count = n })
end

-- moonjob obliterate --yes [--force]: the queue, every job and key, gone.
-- Refused while jobs run (EBUSY) unless --force: their workers' reports
-- are then refused, and those workers stop the jobs.
function M.obliterate(o)
  local q = existing_queue(o)
  if not q then return EXIT_FAILED end
  local n, err = q:obliterate({ force = o.force or nil })
  q:close()
  if n then return report(o, { queue = o.queue, action = "obliterate", count = n }) end
  if err.code == "EBUSY" then
    local active = tostring(err.message):match("(%d+) job%(s%) are active") or "some"
    say(("obliterate %s: refused: %s job(s) are active (running, or held by a worker to run next). Stop the "
      .. "workers and try again, or add --force: the queue goes at once, the running jobs' workers stop them and "
      .. "their reports are refused"):format(o.queue, active))
  else
    say(("obliterate %s: %s"):format(o.queue, tostring(err)), err.done and err.done > 0
      and (" (%d job(s) removed before it)"):format(err.done) or "")
  end
  return EXIT_FAILED
end

return M
