-- moonjob.cli.redis -- the command line's durable-queue commands:
--
--   moonjob worker PROCESSOR --redis URL --queue NAME[,NAME...] [-j N] [--lease S] [--grace S]
--   moonjob add --redis URL --queue NAME [INPUT] [--raw] [--dedupe] [--attempts N] [--backoff SPEC] ...
--
-- (status and the commands that act on a queue: moonjob.cli.status and
-- moonjob.cli.operate.) moonjob.cli parses the options (one table for every
-- command) and calls these. A worker runs until SIGTERM, SIGINT or SIGHUP,
-- then stops fetching, gives back the jobs it holds but has not started,
-- lets running jobs finish within --grace seconds (default 30; then they are
-- stopped and given back), and exits 0. Its lines on stderr say when Redis
-- goes down and comes back, every `redis` event of the pool (refusals, a
-- processor that cannot load, a pause and a resume, jobs fenced or lost),
-- one line per job that failed or will be retried (--quiet: none;
-- --verbose: every job), and at the end what it did.
local core = require "moonjob.core"
local json = require "moonjob.codec.json"
local loop = require "moonjob.loop"
local moonjob = require "moonjob"
local add = require "moonjob.redis.add"
local client = require "moonjob.redis.client"
local ledger = require "moonjob.redis.ledger"
local names = require "moonjob.redis.names"
local stops = require "moonjob.cli.stops"

local M = {}
local EXIT_OK, EXIT_FAILED, EXIT_USAGE = stops.EXIT_OK, stops.EXIT_FAILED, stops.EXIT_USAGE

-- A memory cap as the worker's first line says it: whole MiB as such
-- ("64 MiB"), else to a tenth ("1.5 MiB"), below 1 MiB in KiB.
local function size_text(bytes)
  local mib = bytes / 1048576
  if mib == math.floor(mib) then return ("%d MiB"):format(mib) end
  if mib >= 1 then return ("%.1f MiB"):format(mib) end
  return ("%.0f KiB"):format(bytes / 1024)
end

local function say(...)
  io.stderr:write("moonjob: ", ...)
  io.stderr:write("\n")
end

-- --redis and --queue, checked before anything connects.
-- no_queue: the command works on the whole server (queues, dashboard).
function M.check_target(o, usage_error, no_queue)
  if not o.redis then return usage_error("--redis URL (or MOONJOB_REDIS) is needed: redis://host:6379/0") end
  local t, err = client.parse(o.redis)
  if not t then return usage_error(err) end
  if no_queue and not o.queue then return end
  if not o.queue then return usage_error("--queue NAME is needed") end
  local ok, why = names.check_name(o.queue)
  if not ok then return usage_error(why) end
end

-- "host:pid:": the start of this worker's id in Redis (a job's `worker`
-- field, ESTALLED messages), so that a user can tell which one it was.
local function worker_name()
  local host = names.hostname() or "host"
  return ("%s:%d:"):format((host:gsub("[^%w.-]", "")), core.getpid())
end

-- A job as a worker's log line names it: its id in the queue, its name,
-- and, when the worker serves several queues (ids repeat across them), its
-- queue.
local function job_text(job, several)
  local id = tostring(job.remote_id or job.id)
  local queue = several and job.owner and job.owner.name -- (a Remote: moonjob.redis.remote)
  local about = {}
  if job.name then about[#about + 1] = job.name end
  if queue then about[#about + 1] = "queue " .. queue end
  return #about > 0 and ("job %s (%s)"):format(id, table.concat(about, ", ")) or ("job " .. id)
end

local function error_text(err)
  return ("%s: %s"):format(tostring(err and err.code), (tostring(err and err.message):gsub("\n.*", "")))
end

-- One stderr line per job that failed for good or will be retried (and,
-- verbose, per completed job), attempt n of max.
local function log_jobs(pool, verbose, several)
  local function attempt(job) return ("attempt %d/%d"):format(job.attempts or 0, job.max_attempts or 1) end
  local function text(job) return job_text(job, several) end
  pool:on("failed", function(job, err)
    if err and err.code == "ECLOSED" then return end -- given back to the queue: not a failure
    say(("%s failed, %s: %s"):format(text(job), attempt(job), error_text(err)))
  end)
  pool:on("retrying", function(job, err, delay)
    say(("%s failed, %s: %s; retried in %.3g s"):format(text(job), attempt(job), error_text(err), delay or 0))
  end)
  if verbose then
    pool:on("completed", function(job)
      local ms = job.ms and (" in %.1f ms"):format(job.ms) or ""
      say(("%s completed, %s%s"):format(text(job), attempt(job), ms))
    end)
  end
end

-- --metrics HOST:PORT: GET /metrics answers pool:metrics() (children, busy,
-- jobs, restarts, the loop's lag, memory) for Prometheus. Any address may
-- be given (a scraper is usually on another host); the text names the
-- queue and counts, nothing more. -> the server | nil, why.
local function serve_metrics(pool, listen)
  local host, port = require("moonjob.dashboard").parse_listen(listen)
  if not host then return nil, (port:gsub("^%-%-listen", "--metrics")) end
  local server, err = core.http_listen(host, port, function(req)
    if req.method == "GET" and req.path == "/metrics" then
      return req:respond(200, { ["Content-Type"] = "text/plain; version=0.0.4; charset=utf-8" }, pool:metrics())
    end
    req:respond(404, { ["Content-Type"] = "text/plain" }, "moonjob worker serves /metrics only\n")
  end)
  if not server then return nil, ("--metrics %s: %s"):format(listen, tostring(err)) end
  say(("metrics for Prometheus: http://%s:%d/metrics"):format(host:find(":") and "[" .. host .. "]" or host,
    server:port()))
  return server
end

-- Runs the loop until a stop signal; returns its number.
local function until_signal()
  core.hold_stop_signals()
  local ok = pcall(loop.wait_until, function() return false end)
  return not ok and loop.signal or nil
end

function M.worker(processor, o, pool_options)
  local opts = pool_options(o)
  local queues = o.worker_queues or { o.queue }
  local several = #queues > 1 -- (one pool, a remote per queue: moonjob.redis.remotes)
  opts.redis, opts.queue, opts.lease, opts.echo = o.redis, several and queues or queues[1], o.lease, true
  opts.keep, opts.keep_age, opts.prefetch = o.keep, o.keep_age, o.prefetch
  opts.keep_failed_age, opts.keep_logs = o.keep_failed_age, o.keep_logs
  opts.worker_name = worker_name()
  local ok, pool, err = pcall(moonjob.pool, processor, opts)
  if not ok or not pool then
    say((tostring(ok and err or pool):gsub("^[^:]*:%d+: ", ""))) -- the message only, not gsub's count
    return EXIT_USAGE
  end
  local display = client.display(assert(client.parse(o.redis)))
  local shown = table.concat(queues, ", ")
  pool:on("redis", function(kind, why, _, queue) -- (queue: with several, the one it is about)
    local of = queue and (" (queue %s)"):format(queue) or ""
    if kind == "up" then say("connected to ", display, ", queue ", queue or shown, why and "; " .. why or "")
    elseif kind == "down" then
      say("Redis unreachable (", tostring(why), "); running jobs go on, fetching resumes when it is back", of)
    else say(tostring(why), of) end -- stale, error, broken, mended, fenced, lost: each says what and why
  end)
  if not o.quiet then log_jobs(pool, o.verbose, several) end
  local metrics
  if o.metrics then
    metrics, err = serve_metrics(pool, o.metrics)
    if not metrics then
      say(err)
      pcall(pool.close, pool, { force = true })
      return EXIT_USAGE
    end
  end
  local size = pool.size -- without -j: one per CPU
  local memory = pool.memory_limit and ("memory limit %s per child"):format(size_text(pool.memory_limit))
    or "no memory limit"
  say(("worker %s: %d %s on %s %s%s, %s"):format(processor, size, size == 1 and "child" or "children",
    several and "queues" or "queue", shown, several and " (fetched in turn: docs/guide/cli.md)" or "", memory))
  local signum = until_signal()
  say(("stopping (%s): no more fetching; running jobs have %g s to finish"):format(
    signum == 15 and "SIGTERM" or signum == 1 and "SIGHUP" or "SIGINT", o.grace or 30))
  if metrics then metrics:close() end
  local stopped = pcall(pool.close, pool, { timeout = o.grace or 30 })
  for _ = 1, 3 do -- another signal: no more grace; running jobs are stopped and given back
    if stopped then break end
    say("stopping now: running jobs are stopped and given back to the queue")
    stopped = pcall(pool.close, pool, { force = true })
  end
  local s = pool:stats()
  local r = s.redis or {}
  say(("stopped: %d completed, %d failed here; %d stopped unreported (%d fenced, %d lost)"):format(
    s.completed, s.failed, (r.fenced or 0) + (r.lost or 0), r.fenced or 0, r.lost or 0))
  return EXIT_OK
end

local function add_options(o)
  return { attempts = o.attempts, backoff = o.backoff, timeout = o.timeout,
    kill_after = o.kill_after, priority = o.priority, delay = o.delay, dedupe = o.dedupe or nil, group = o.group,
    expire = o.expire, debounce = o.debounce }
end

-- Jobs of drawn ids made waiting come back as runs (add.bulk_rows), a few
-- bytes a call; with --dedupe, --delay or --group each job's row comes
-- whole (up to about 80 bytes a line), and 128 keep a reply under 16 KB (a
-- 256-row reply was seen cut by a stall).
local BATCH, WHOLE_BATCH = add.BULK_CALL, 128 -- (one call of add.bulk_calls)
local FLUSH_MS = 50 -- a batch not full is sent this long after its first line came
local HELD_MAX = 4096 -- lines read and not yet taken: reading pauses past them

-- What each line came to: ids[n] = the job's id, or false (blank, skipped,
-- refused, unknown); printed in input order as the gaps close.
local Adds = {}
Adds.__index = Adds

function Adds.new(q, opts, dedupe, raw)
  -- one: an add's arguments with these options, which the batches take
  local one = add.args(q.prefix, "{}", opts, false, nil, dedupe and "join" or nil)
  -- (runs only come for waiting jobs of drawn ids: else every row whole)
  local whole = dedupe or (opts.delay or 0) > 0 or (opts.group or "") ~= ""
  local self = setmetatable({ q = q, one = one, opts = opts, dedupe = dedupe, raw = raw, ids = {}, next_print = 1,
    inflight = 0, added = 0, failed = 0, unknown = 0, batch = { lines = {}, texts = {} },
    batch_size = whole and WHOLE_BATCH or BATCH, due = false }, Adds)
  self.timer = core.timer(function() self.due = true end) -- a partial batch waited FLUSH_MS
  return self
end

-- Prints the ids known, in input order up to the first line still in
-- flight, and hands them to stdout at once (a reader of a slow pipe's ids
-- gets each as its reply comes).
function Adds:flush()
  local ids, printed = self.ids, false
  while ids[self.next_print] ~= nil do
    if ids[self.next_print] ~= false then self:print(ids[self.next_print]) printed = true end
    ids[self.next_print] = nil
    self.next_print = self.next_print + 1
  end
  if printed and not self.output_error then
    local ok, err = io.stdout:flush()
    if not ok then self.output_error = err end
  end
end

-- An id printed; the first write error is kept (the jobs stay added: what
-- is lost is their ids, which the summary says).
function Adds:print(id)
  if self.output_error then return end
  local ok, err = io.stdout:write(id, "\n")
  if not ok then self.output_error = err end
end

-- Whether stdout took every id, else says what was lost.
function Adds:printed()
  if not self.output_error then
    local ok, err = io.stdout:flush()
    if not ok then self.output_error = err end
  end
  if not self.output_error then return true end
  say(("writing the ids to standard output failed (%s): the jobs were added but some ids were not printed; "
    .. "q:get or moonjob status shows them"):format(tostring(self.output_error)))
  return false
end

function Adds:refused(n, why)
  self.failed, self.ids[n] = self.failed + 1, false
  say(("line %d: not added: %s"):format(n, why))
end

-- Waits (up to --resolve seconds from when it went down, at least the
-- client's timeout) for a connection, so that every call is sent at once: a
-- stall the lost replies outlive is one the lines still to come wait out.
function Adds:connected()
  local c = self.q.client
  if c.ready then self.down_since = nil return true end
  self.down_since = self.down_since or loop.now()
  local deadline = self.down_since + math.max(c.timeout_ms, self.q.resolve_ms)
  loop.wait_until(function() return c.ready or c.closed or loop.now() >= deadline end)
  return c.ready
end

-- The lines waiting to be sent go in one moonjob_add_bulk call of up to
-- batch_size lines (add.bulk_calls). A reply that did not come (the connection
-- dropped, Redis stalled past the reply deadline) after the call was sent is
-- asked for again, for up to --resolve seconds (moonjob.redis.ledger); past
-- them its jobs may or may not have been added: "unknown".
function Adds:send()
  local batch = self.batch
  self.timer:stop()
  self.due = false
  if #batch.lines == 0 then return end
  self.batch = { lines = {}, texts = {} }
  if not self:connected() then
    for _, n in ipairs(batch.lines) do
      self:refused(n, "Redis unreachable: " .. tostring(self.q.client.why or "no connection"))
    end
    return
  end
  if self.opts.debounce then return self:send_each(batch) end
  local args = add.bulk_calls(self.one, batch.texts)[1].args
  self:sent(batch, args, add.bulk_rows)
end

-- Each line of the batch in a moonjob_add of its own, in order: a debounce
-- names one job, which each line joins in turn (a bulk add makes new jobs).
function Adds:send_each(batch)
  for k, n in ipairs(batch.lines) do
    local args = add.args(self.q.prefix, batch.texts[k], self.opts, false)
    self:sent({ lines = { n } }, args, function(row) return row and { row } end)
  end
end

-- Sends args for the lines of batch (through the ledger); rows(reply) ->
-- a row per line.
function Adds:sent(batch, args, rows_of)
  local q = self.q
  self.inflight = self.inflight + #batch.lines
  ledger.send(q.client, q.ledger, args, q.resolve_ms, function(rows, err, _, unknown)
    self.inflight = self.inflight - #batch.lines
    rows = rows_of(rows)
    for k, n in ipairs(batch.lines) do
      local row = rows and rows[k]
      if type(row) == "table" then
        self.added, self.ids[n] = self.added + 1, row[1]
      elseif unknown then
        self.unknown, self.ids[n] = self.unknown + 1, false
        say(("line %d: unknown whether it was added (sent, but no reply: %s)"):format(n, tostring(err)))
      else
        self:refused(n, tostring(row or err))
      end
    end
    self:flush()
  end)
end

-- A line to add, sent with the next batch: once it is full, or FLUSH_MS
-- after its first line came (input that comes slowly is not held back).
function Adds:take(n, line)
  local batch = self.batch
  batch.lines[#batch.lines + 1] = n
  batch.texts[#batch.texts + 1] = line
  if #batch.lines == 1 then self.timer:start(FLUSH_MS) end
  if #batch.lines >= self.batch_size then self:send() end
end

-- Input line `n` (`line`; false: longer than max_payload, `len` bytes or more).
function Adds:line(n, line, len)
  if not line then
    say(("line %d takes %d bytes or more, more than max_payload (%d); skipped"):format(n, len, self.q.max_payload))
    self.failed, self.ids[n] = self.failed + 1, false
    return
  end
  if line:match("^%s*$") then
    self.ids[n] = false
    return
  end
  local perr
  if self.raw then -- the line's text becomes a JSON string, the job's data
    line, perr = json.encode(line)
  else
    perr = select(2, json.decode(line)) -- nil, message for a line that is not JSON
  end
  if perr then
    say(("line %d is not %s (%s); skipped"):format(n, self.raw and "UTF-8 text, which a JSON string must be"
      or "JSON", tostring(perr)) .. (self.raw and "" or " (for plain-text lines use --raw)"))
    self.failed, self.ids[n] = self.failed + 1, false
  elseif #line > self.q.max_payload then
    say(("line %d takes %d bytes, more than max_payload (%d); skipped"):format(n, #line, self.q.max_payload))
    self.failed, self.ids[n] = self.failed + 1, false
  else
    self:take(n, line)
  end
end

function Adds:summary()
  if self.unknown == 0 then return end
  say(("%d line(s) added, %d not added, %d unknown: sent, but Redis did not reply within --resolve (%g s), so "
    .. "they may or may not have been added"):format(self.added, self.failed, self.unknown, self.q.resolve_ms / 1000))
  if self.dedupe then
    say("running the same lines again with --dedupe is safe: jobs Redis still keeps are joined, not added twice")
  else
    say("adding them again may add some twice; with --dedupe (each job's id from its line) a re-add is safe")
  end
end

-- The lines of descriptor `fd`, read on the loop (core.input: every byte of
-- a line kept, NULs too), held in order until the command takes them
-- (take_lines); reading pauses while HELD_MAX wait. A line longer than
-- `max_line` is held as false, with the bytes it had. r.ended once the input
-- ended; r.read_error then says why, when a read failed.
local function reader(fd, max_line)
  local r = { texts = {}, lens = {}, first = 1, last = 0, line_no = 0, ended = false, read_error = nil,
    stopped = false } -- (stopped: by a signal, reading is not resumed)
  r.handle = core.input(fd, max_line, function(text, len)
    local last = r.last + 1
    r.texts[last], r.lens[last], r.last = text or false, len, last
    if last - r.first + 1 >= HELD_MAX then r.handle:pause() end
  end, function(e) r.ended, r.read_error = true, e end)
  r.handle:resume()
  return r
end

-- Hands the lines read so far to adds, numbered on from r.line_no, with
-- at most `window` lines sent and not answered.
local function take_lines(r, adds, window)
  while r.first <= r.last do
    local i = r.first
    local text, len = r.texts[i], r.lens[i]
    r.texts[i], r.lens[i], r.first = nil, nil, i + 1
    r.line_no = r.line_no + 1
    adds:line(r.line_no, text, len)
    if adds.inflight >= window then loop.wait_until(function() return adds.inflight < window / 2 end) end
    adds:flush()
  end
  if not (r.ended or r.stopped) then r.handle:resume() end
end

-- Reads and adds every line of the input; raises on a stop signal.
local function add_all(r, adds, window)
  repeat -- (a batch not full goes once it waited FLUSH_MS: adds.due)
    loop.wait_until(function() return r.first <= r.last or r.ended or adds.due end)
    if adds.due then adds:send() end
    take_lines(r, adds, window)
  until r.ended and r.first > r.last
end

-- Adds the lines read and not yet taken (the input gave them up), sends
-- the last batch and waits for every reply: false when a stop signal cut
-- that short.
local function add_rest(r, adds, window)
  return pcall(function()
    take_lines(r, adds, window)
    adds:send()
    loop.wait_until(function() return adds.inflight == 0 end)
  end)
end

local SIGNAL_NAMES = { [1] = "SIGHUP", [2] = "SIGINT", [15] = "SIGTERM" }

-- What a stop signal `signum` left: said, and the exit status 128 + signum.
local function interrupted(signum, r, adds, replied)
  local name = SIGNAL_NAMES[signum] or ("signal " .. signum)
  if r.stopped then
    say(("interrupted by %s: the input after line %d was not read; the lines before it were sent (their ids "
      .. "are printed)"):format(name, r.line_no))
  end
  if not replied then
    say(("interrupted by %s while waiting for Redis: %d line(s) sent got no reply: unknown whether they were "
      .. "added"):format(name, adds.inflight))
  end
  return 128 + signum
end

-- moonjob add: one job per NDJSON line (--raw: per line of text, its data
-- the line as a JSON string), sent BATCH lines per call with up to WINDOW
-- lines in flight; prints each job's id in input order. A line whose call was sent but
-- got no reply is sent again (moonjob.redis.ledger: Redis answers it once);
-- past --resolve it is "unknown", never "failed" (the job may be in Redis). With
-- --dedupe each line's id is "d:" .. the SHA-1 of the line and a finished job
-- still kept with it is joined, not replaced: adding the same lines again
-- adds only what is missing (identical lines are one job).
function M.add(input_path, o)
  local WINDOW = 2048 -- lines sent and not answered
  local fd = 0
  if (input_path == nil or input_path == "-") and core.closed_at_start(0) then
    say("standard input is closed", input_path and " (INPUT is -)" or " and no INPUT file was given",
      ": name the file (moonjob add --queue NAME INPUT) or give the lines on stdin")
    return EXIT_USAGE
  end
  if input_path and input_path ~= "-" then
    local err
    fd, err = core.open(input_path)
    if not fd then say("cannot read ", input_path, ": ", err) return EXIT_USAGE end
  end
  local opts = add_options(o)
  local ok, why = pcall(add.args, "", "{}", opts) -- raises on a bad option
  if not ok then say((tostring(why):gsub("^[^:]*:%d+: ", ""))) return EXIT_USAGE end
  local q, err = moonjob.queue(o.redis, o.queue, { resolve = o.resolve })
  if not q then say(tostring(err)) return EXIT_FAILED end
  local adds = Adds.new(q, opts, o.dedupe, o.raw)
  core.hold_stop_signals() -- (Ctrl-C, SIGTERM, SIGHUP: what was read is added, then the command ends)
  local r = reader(fd, q.max_payload)
  local read_all, why = pcall(add_all, r, adds, WINDOW)
  local signum = not read_all and tostring(why):find("^interrupted") and loop.signal
  if not read_all and not signum then error(why, 0) end
  if signum then r.stopped = true r.handle:pause() end
  local replied, rest_why = add_rest(r, adds, WINDOW)
  if not replied and not tostring(rest_why):find("^interrupted") then error(rest_why, 0) end
  signum = signum or (not replied and loop.signal)
  adds:flush()
  adds:summary()
  local printed = adds:printed()
  r.handle:close()
  adds.timer:close()
  q:close()
  if signum then return interrupted(signum, r, adds, replied) end
  if r.read_error then
    say("cannot read ", input_path or "standard input", " after line ", r.line_no, ": ", r.read_error,
      "; the lines before it were added (their ids are printed)")
    return EXIT_FAILED
  end
  return (adds.failed == 0 and adds.unknown == 0 and printed) and EXIT_OK or EXIT_FAILED
end

return M
