-- moonjob.cli.run -- `moonjob run PROCESSOR [INPUT]`: one Run object that
-- reads the input, adds its lines to a pool, records what ends, and says
-- how the run ended.
--
-- A Run composes its parts and owns the flow between them: the input and its
-- back-pressure (moonjob.cli.input), the output, --keep-order and tags
-- (moonjob.cli.output), the joblog (moonjob.cli.joblog), batches of lines
-- (moonjob.cli.batch_jobs), the reasons a run stops and its exit status
-- (moonjob.cli.stops), and the progress line (moonjob.cli.progress).
--
-- Tiny lines go to the children in batches (many lines per job, see
-- docs/guide/cli.md), once lines are known to be short (not with --rate,
-- which counts lines: the pool's rate counts jobs), also with
-- --timeout (each line's own) and --attempts (a failed line runs again
-- alone: moonjob.cli.batch_jobs). Input lines go to the
-- children as JSON text and results come back as exact JSON text (the pool's
-- "json" codec), so the parent never parses a payload: it only cuts lines
-- and writes result lines around the children's bytes. With --raw the
-- children take each line's text as its data (the pool's raw option);
-- without it, the first line that is not blank is checked here once, so that
-- plain-text input stops before any line runs (moonjob.cli.input), and the
-- lines that fail as not JSON are counted, to be said once at the end.
--
-- A run stops early on SIGINT, SIGTERM and SIGHUP (the children and
-- everything they started are killed), on --halt's rule, on a processor that
-- fails to load before any job completed, on a joblog it cannot write, on
-- an output that fails (a full disk) and on a closed output (| head); it
-- does not start with stdout closed. Each records what it should of the jobs that end
-- meanwhile (recorded_in_stop). `self.stop` is the first of these (a
-- moonjob.cli.stops table), nil while the run goes on.
--
-- Caveat: the pool's listeners and batch hooks run inside the loop; one
-- that raises would leave its line in flight for ever, so each is guarded
-- and the run stops, saying why.
local BatchJobs = require "moonjob.cli.batch_jobs"
local core = require "moonjob.core"
local Input = require "moonjob.cli.input"
local Joblog = require "moonjob.cli.joblog"
local loop = require "moonjob.loop"
local moonjob = require "moonjob"
local Output = require "moonjob.cli.output"
local progress = require "moonjob.cli.progress"
local stops = require "moonjob.cli.stops"

local M = {}

local STOP_DRAIN_MS = 1000 -- what stdout gets, on a stop, to take what was written
local NOT_JSON = '"code":"EINPUT","message":"' .. moonjob.errors.NOT_JSON -- (as result lines write it)

local Run = {}
Run.__index = Run

-- The pool options of parsed options `o` (also for `moonjob worker`).
function M.pool_options(o)
  return { size = o.concurrency, codec = "json", timeout = o.timeout, kill_after = o.kill_after,
    start_timeout = o.start_timeout, attempts = o.attempts, backoff = o.backoff, raw = o.raw or nil,
    rate = o.rate, -- (--rate: one line per job, moonjob.cli.input)
    memory_limit = o.memory_limit } -- (none: false; not given: the pool's default)
end

-- The pool, or nil, a message and whether it is a usage error. Options
-- were checked by parse(); a pool that still refuses them gets the same
-- treatment, not a stack trace. A processor that cannot load (ELOAD) is a
-- set-up error: the command line was right. echo(line, job, pid) gets what
-- the children print.
local function new_pool(processor, o, echo)
  local opts = M.pool_options(o)
  opts.echo = echo
  local ok, pool, err = pcall(moonjob.pool, processor, opts)
  if not ok then return nil, (tostring(pool):gsub("^[^:]*:%d+: ", ""):gsub("^moonjob%.pool: ", "")), true end
  if not pool then return nil, tostring(err) end
  return pool
end

-- A listener or batch hook fn(job, ...) that raises stops the run, saying
-- why, instead of a hang.
function Run:guard(fn)
  return function(job, ...)
    local ok, e = pcall(fn, job, ...)
    if not ok and not (self.stop and self.stop.internal) then
      self.stop = stops.internal_error(job.line, e)
    end
  end
end

local function guarded(self, listener)
  return self:guard(function(job) return listener(self, job) end)
end

-- The progress line's counts, on a terminal; none drawn while the input is
-- typed on a terminal.
function Run:show_progress(input_path)
  local size, input = Input.size(input_path), self.input
  self.display = progress.new(function()
    return { completed = self.completed, failed = self.failed, skipped = self.lines_over - self.completed - self.failed,
      read = input.line_no, bytes = input.bytes_read, input_ended = input.at_end, size = size }
  end, { stdout_may_show = not Output.regular_file(io.stdout) or self.output.joblog_may_show,
    flush_output = function() return self.output:flush_now() end,
    hidden = function() return input.from_terminal and not input.at_end end })
  self.output.display = self.display
end

-- A run ready to start, or nil, a message and whether it is a usage error
-- (else a set-up error: stdout closed, an input or joblog that cannot be
-- opened, a processor that cannot load); nothing ran.
function M.new(processor, input_path, o)
  if core.closed_at_start(1) then -- (its results would go nowhere, and the joblog would say they went)
    return nil, "standard output is closed: moonjob run writes its results there; "
      .. "run it with stdout open (> FILE, or > /dev/null to drop the results)"
  end
  local fd, err = Input.open(input_path)
  if not fd then return nil, err end
  local resumed, resumed_last = {}, 0 -- the lines --resume skips, and the last of them
  if o.resume then resumed, resumed_last = Joblog.resumed(o.joblog) end
  local log
  if o.joblog then
    log, err = Joblog.open(o.joblog)
    if not log then return nil, err end
  end
  -- From here on SIGINT, SIGTERM, SIGHUP only stop the loop (until now they
  -- ended the program at once: no child existed yet).
  core.hold_stop_signals()
  local self = setmetatable({ o = o, fd = fd, joblog = log, resumed = resumed, resumed_last = resumed_last,
    completed = 0, failed = 0, lines_over = 0, -- lines over: written or skipped
    open_jobs = {}, -- the jobs added and not ended
    stop = nil }, Run)
  local is_usage
  self.pool, err, is_usage = new_pool(processor, o, function(text, job, pid) return self.output:echo(text, job, pid) end)
  if not self.pool then return nil, err, is_usage end
  self.output = Output.new(o.keep_order, log, {
    joblog_failed = function(e) self.stop = stops.joblog_failed(o.joblog, e) end,
    closed = function() self.input:stop_reading() end,
  })
  self.input = Input.new(o, self.pool.size, self.output)
  if o.progress then self:show_progress(input_path) end
  self.batches = BatchJobs.new(self)
  local hooks = self.batches:hooks() -- the pool's batch hooks (moonjob.pool.lines)
  hooks.output = function(text, job) self.output:echo_lines(text, job) end -- tagged by the child
  self.pool.lines:set_hooks(hooks)
  local listener = guarded(self, Run.finished)
  self.pool:on("completed", listener)
  self.pool:on("failed", listener)
  return self
end

------------------------------------------------------------- recording ---

-- Results `text` of `count` lines from `line` on leave the lines in flight
-- and are written (or kept pending for --keep-order, which may pause the
-- input too).
function Run:written(line, text, count)
  local input = self.input
  input:written(text, count)
  self.output:emit(line, text, count)
  input:pause_if_full()
  input:resume_if_room()
end

-- Records the result lines `text` of `count` lines from `line` on (stdout,
-- and the joblog once stdout took them), and judges --halt's rule. False
-- when the joblog cannot be written (the run stops).
function Run:record(line, text, count, ok_n, failed_n)
  local out = self.output
  if out.joblog_failed then return false end
  self.completed, self.failed, self.lines_over = self.completed + ok_n, self.failed + failed_n, self.lines_over + count
  if failed_n > 0 and not self.o.raw then self:note_not_json(text) end
  self:written(line, text, count)
  if not self.stop and stops.halt_reached(self.o.halt, self.completed + self.failed, self.failed) then
    self.stop = stops.halted(self.o.halt, self.failed)
    self.input:stop_reading() -- nothing more is read, nor added
    if self.stop.soon then self:halt_soon() end
  end
  return not out.joblog_failed
end

-- --halt soon: no more input, and every job in flight that no child
-- started is canceled (waiting ones first, so that a child a cancel frees
-- takes nothing; the pool asks the child's gate and leaves a started job
-- to run): only what runs finishes, as in GNU parallel. The main wait goes
-- on until those end.
function Run:halt_soon()
  self.input:take_no_more()
  local waiting, sent = {}, {}
  for job in pairs(self.open_jobs) do
    if job.state == "waiting" then waiting[#waiting + 1] = job else sent[#sent + 1] = job end
  end
  for _, list in ipairs({ waiting, sent }) do
    for _, job in ipairs(list) do
      job.halted = true -- (read when it ends, inside the cancel)
      if not self.pool.lines:cancel_unstarted(job, stops.HALTED) then job.halted = nil end
    end
  end
end

-- Whether a stop lets finished `job` be recorded. A stop signal or --halt
-- now (record "completed"): jobs that completed meanwhile are (they ran),
-- and what a killed batch had finished; failures are not (the kill caused
-- them). --halt soon (record "ran"): the jobs that run to their end are,
-- those it canceled or the close failed before they started are not.
-- Any other stop records nothing more.
function Run:recorded_in_stop(job)
  local stop = self.stop
  if not stop.record then return false end
  local e = job.state ~= "completed" and job.error
  local never_ran = e and (stop.record == "completed" or e.code == "ECLOSED" or job.halted)
  if not never_ran then return true end
  local state = job.count and job.batch_state
  if state then self.batches:lines_kept(job, state.kept, state.text) end
  return false
end

-- A job that ends unrecorded in a stop: its lines not recorded leave the
-- count in flight (--halt soon waits for it to reach 0).
function Run:forget(job)
  if job.count then return self.batches:forget(job) end
  self.input:dropped(1)
end

-- The pool's completed and failed listener.
function Run:finished(job)
  self.open_jobs[job] = nil
  self.output:echo_to_tag(job)
  if self.stop and not self:recorded_in_stop(job) then return self:forget(job) end
  -- A job that fails with ELOAD before any completed: the processor cannot
  -- load, so no job will run; the run stops as for a syntax error.
  if self.completed == 0 and job.state == "failed" and job.error.code == "ELOAD" then
    self.stop = stops.cannot_load(job.error)
    return
  end
  if job.count then return self.batches:finished(job) end
  local ok_n = job.state == "completed" and 1 or 0
  if self:record(job.line, Output.result_line(job), 1, ok_n, 1 - ok_n) and job.ms then
    self.input:lines_took(job.ms, 1)
  end
end

-- Counts the lines of result lines `text` that failed as not JSON: the run
-- says once, at its end, how many and which was first, and that --raw
-- takes plain text (say_not_json).
function Run:note_not_json(text)
  if not text:find(NOT_JSON, 1, true) then return end
  for result_line in text:gmatch("[^\n]+") do
    local at = result_line:find(NOT_JSON, 1, true) -- (not for bytes that are not UTF-8: not a sign of text)
    if at and not result_line:find("^invalid UTF%-8", at + #NOT_JSON) then
      local line = tonumber(result_line:match('^{"line":(%d+)'))
      self.not_json = (self.not_json or 0) + 1
      if line and line < (self.first_not_json or math.huge) then self.first_not_json = line end
    end
  end
end

function Run:say_not_json()
  local n = self.not_json
  if not n then return end
  io.stderr:write(("moonjob: %d %s not valid JSON (the first: line %s), and failed with EINPUT; "
    .. "for plain-text lines use --raw, which passes each line as a string in job.data\n")
    :format(n, n == 1 and "line was" or "lines were", tostring(self.first_not_json)))
end

---------------------------------------------------------------- adding ---

-- Adds input line `line` (`text`, `len` bytes; text nil: longer than
-- max_payload) as a job, or writes it at once (blank, or resumed).
function Run:add_line(line, text, len)
  local input = self.input
  if (text and not text:find("%S")) or self.resumed[line] then -- no job: written at once
    self.lines_over = self.lines_over + 1
    self.output:emit(line, "")
    return input:resume_if_room() -- (a line handed back may be the one the others waited for)
  end
  input:sent(1, 0)
  if not text then -- longer than max_payload: fails without running
    local e = moonjob.errors.new("EINPUT", ("line %d is %d bytes or more, more than max_payload (%d)")
      :format(line, len, self.pool.max_payload))
    self:finished({ line = line, state = "failed", error = e, attempts = 0 })
  else
    local job = self.pool:add(text, { name = "line " .. line, priority = line })
    job.line = line
    self.open_jobs[job] = true
  end
end

-- The input's on_line: a line, or a batch of `count` lines.
function Run:lines_read(text, len, count)
  if self.stop then return end -- (--halt paused the input: lines read meanwhile do not run)
  local input = self.input
  local first = input:read(count, len)
  if not input.checked then
    local problem = input:first_line_problem(first, text, count)
    if problem then -- plain text, not NDJSON: said once, and no line runs
      self.stop = { status = stops.EXIT_USAGE, message = problem }
      return input:stop_reading()
    end
  end
  if count > 1 then self.batches:add(first, count, text) else self:add_line(first, text, len) end
  input:pause_if_full()
end

------------------------------------------------------------- the flow ---

-- Reads the input and runs its lines until every line ended or the run
-- stops (--halt soon: until what runs ended).
function Run:wait()
  local input, out = self.input, self.output
  input:start(self.fd, self.pool.max_payload, function(text, len, count) self:lines_read(text, len, count) end)
  local ok, why = pcall(loop.wait_until, function()
    local parked = self.batches:unpark() -- (-k: lines a batch handed back past the bound)
    input:resume_if_room() -- a safety net: a path that frees room and misses resuming would hang the run
    local backlog = out:poll()
    if self.display then self.display.refresh() end -- after the turn's results (moonjob.cli.progress)
    return (self.stop and not self.stop.soon) or out.write_error
      or (input.ended and input.inflight == 0 and backlog == 0 and not parked)
  end)
  input:close()
  if not ok then self.stop = stops.stopped_by(why) end
  if out.write_error and not self.stop then -- nobody reads the output any more, or it failed
    self.stop = stops.output_failed(out.write_error)
    if self.stop.closed_output and self.joblog and not self:delivered() then
      self.stop = stops.undelivered(self.o.joblog) -- (the joblog is the run's record: a gap is said)
    end
  end
end

-- Whether every line's result went out: the input read to its end, no line
-- in flight or pending, and stdout took every byte.
function Run:delivered()
  local input, out = self.input, self.output
  return input.at_end and input.inflight == 0 and select(2, out:pending_results()) == 0 and out:all_taken()
end

-- Ends a run that stops early: what running batches finished is recorded,
-- every child is ended with what it started (more signals meanwhile do not
-- cut this short), and what was written goes out.
function Run:end_children()
  local lines = self.pool.lines
  pcall(lines.publish_kept, lines, 0) -- a raising hook must not keep the children alive
  for _ = 1, 100 do -- a wait cut short by a signal is resumed; the close itself is bounded
    if pcall(self.pool.close, self.pool, { force = true }) then break end
  end
  self:drain_output()
end

-- On a stop, stdout gets STOP_DRAIN_MS in all (across both waits of a stop)
-- to take what was written; what it has not taken by then is neither
-- printed nor recorded.
function Run:drain_output()
  self.drain_until = self.drain_until or core.hrtime() + STOP_DRAIN_MS * 1e6
  local left = math.ceil((self.drain_until - core.hrtime()) / 1e6)
  if left > 0 then self.output:drain(left) end
end

-- Closes the pool, the joblog and the progress line: the exit status.
function Run:finish()
  local out = self.output
  if not self.stop or self.stop.soon then -- every job is over (--halt soon waited for its lines): the idle
    local ok, why = pcall(self.pool.close, self.pool) -- children end (a signal meanwhile still counts)
    if not ok then self.stop = stops.stopped_by(why) end
  end
  if self.stop then
    self:end_children()
    out:flush_pending() -- with --keep-order, what finished after a line that never will
    self:drain_output()
  end
  local write_error = out.write_error or out:write_failure()
  if self.joblog then self.joblog:close() end -- (stdout's writer records through a descriptor of its own)
  if self.display then self.display.close(self.lines_over > 0) end -- the summary, once a line ended
  self:say_not_json()
  out:close() -- what stdout did not take by now is neither printed nor recorded
  local _, unwritten = out:pending_results()
  return stops.outcome(self.stop, self.failed, unwritten, self.input.read_error, write_error)
end

-- Runs `processor` over `input_path` (nil or "-": stdin) with parsed options
-- `o`: the exit status, or nil, a message and whether it is a usage error
-- when it could not start.
function M.run(processor, input_path, o)
  local run, err, is_usage = M.new(processor, input_path, o)
  if not run then return nil, err, is_usage end
  run:wait()
  return run:finish()
end

return M
