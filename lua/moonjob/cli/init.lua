-- moonjob.cli -- the `moonjob` command: run a processor over NDJSON input.
--
--   moonjob run PROCESSOR [INPUT] [-j N] [-k] [--halt WHEN,fail=N] [--timeout S]
--     [--attempts N] [--backoff SPEC] [--joblog FILE [--resume]] [--progress]
--
-- (Its options and help text: moonjob.cli.args; what a terminal shows:
-- moonjob.cli.progress; its batches as text: moonjob.cli.batches.)
--
-- Tiny lines go to the children in batches (many lines per job, see
-- moonjob.cli.batches and README "Batches of lines"), once lines are known to
-- be short; with --timeout or --attempts above 1, one line per job. A line
-- that prints ends its batch, so what processors print is tagged with its
-- line ("[line N] text").
--
-- Input lines go to the children as JSON text and results come back as exact
-- JSON text (the pool's "json" codec), so the parent never parses a payload:
-- it only cuts lines and writes result lines around the children's bytes.
-- Input is read as a stream and paused while enough jobs are queued, so a file
-- of millions of lines runs in bounded memory. Output lines are written as
-- jobs finish, through a writer that never blocks the loop, and that sees
-- its reader go (| head) without writing.
--
-- --joblog appends each finished job's line (as on stdout, in the same order)
-- to a file, flushed at once and before the stdout line; a failed write (a
-- full disk) stops the run, and a record cut short by it is dropped when the
-- joblog is next opened. --resume skips the lines it records as completed.
--
-- A run stops early on SIGINT, SIGTERM and SIGHUP (the children and
-- everything they started are killed), on --halt's rule, on a processor that
-- fails to load before any job completed, on a joblog it cannot write and on
-- a closed output; each records what it should of the jobs that end
-- meanwhile (recorded_in_stop).
--
-- Exit status: 0 when every job completed, 1 when any failed, 2 for usage,
-- set-up or I/O errors that stop the run, 3 and 4 for --halt now and soon,
-- 128 + N on signal N.
local args = require "moonjob.cli.args"
local batches = require "moonjob.cli.batches"
local core = require "moonjob.core"
local ffi = require "ffi"
local lines = require "moonjob.codec.resultline"
local loop = require "moonjob.loop"
local moonjob = require "moonjob"
local moonjob_job = require "moonjob.job"
local progress = require "moonjob.cli.progress"

local M = {}

ffi.cdef [[
int truncate(const char *path, int64_t length);
char *strerror(int errnum);
]]

local EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_HALTED_NOW, EXIT_HALTED_SOON = 0, 1, 2, 3, 4
local SIGNAL_NAMES = { [1] = "SIGHUP", [2] = "SIGINT", [15] = "SIGTERM" }
local BATCH_BUDGET_MS = 4 -- a batch of lines runs about this long in its child
local BATCH_LINES_MAX = 4096 -- and holds at most this many lines
local HOLD_BYTES_PER_CHILD = 8 * 1024 * 1024 -- --keep-order: results held, per child

local function usage_error(message)
  io.stderr:write("moonjob: ", message, "\n", "Try 'moonjob --help'.\n")
  return EXIT_USAGE
end

---------------------------------------------------------------- output ---

-- The result line of a job that ran one line.
local function result_line(job)
  if job.state == "completed" then
    return lines.completed(job.line, moonjob_job.bytes(job.result_bytes), job.attempts, job.ms or 0)
  end
  return lines.failed(job.line, job.error, job.attempts, job.ms or 0)
end

-- What a batch job (pool:add's `lines`, moonjob.cli.batches) ran: its result
-- lines, the positions they cover (1 to covered), and how many completed and
-- failed. A batch whose child died keeps what its finished lines wrote to the
-- shared area (job.batch_state); the line it was running fails with the
-- child's error; the lines after are not covered (they go out again). A batch
-- that failed before it started (the processor no longer loads, the run
-- stops) fails each of its lines with that error.
local function batch_outcome(job)
  if job.state == "completed" then
    local run, ok_n, failed_n, body = batches.parse_done(moonjob_job.bytes(job.result_bytes))
    if run then return body, run, ok_n, failed_n end
    job.error = moonjob.errors.new("EPROTO", "the child's batch result is not one")
  end
  local state, body, covered = job.batch_state, "", 0
  if state then body, covered = state.text, state.kept end
  local ok_n, failed_n = batches.count(body)
  local last = covered -- the last line that fails with it
  if not state then last = job.count
  elseif state.started > state.kept then last = covered + 1 end
  local ms = state and state.line_ms or 0 -- how long the line it died in had run
  local failing = {} -- the line it died in, or every line of a batch that never ran
  for _, pos in ipairs(batches.non_blank(job.text, covered + 1, last)) do
    failing[#failing + 1] = lines.failed(job.line + pos - 1, job.error, math.max(job.attempts, 1), ms)
  end
  return body .. table.concat(failing), last, ok_n, failed_n + #failing
end

------------------------------------------------------------------- run ---

local function open_input(path)
  if path == nil or path == "-" then return 0 end
  local fd, err = core.open(path)
  if not fd then -- "EACCES: permission denied": the reason, as for the processor and the joblog
    return nil, ("cannot open input '%s': %s"):format(path, (err:gsub("^E%u+: ", "")))
  end
  return fd
end

------------------------------------------------------------- the joblog ---

-- io.open's message without the path it starts with: "No such file or directory".
local function reason(err, path)
  err = tostring(err)
  if err:sub(1, #path + 2) == path .. ": " then return err:sub(#path + 3) end
  return err
end

-- Reads a joblog: the line numbers it records as completed (for --resume),
-- and the length of its whole records. Only records ended by a newline count:
-- a write cut short (a full disk, a crash) leaves a last record without one.
local function read_joblog(path)
  local done, whole, offset = {}, 0, 0
  local f = io.open(path, "rb")
  if not f then return done, 0 end
  while true do
    local text = f:read("*L") -- the line with its newline, if it has one
    if not text then break end
    offset = offset + #text
    if text:sub(-1) ~= "\n" then break end
    whole = offset
    local line, status = text:match('^{"line":(%d+),"status":"(%a+)"')
    if line and status == "completed" then done[tonumber(line)] = true end
  end
  f:close()
  return done, whole
end

-- What a joblog ends with after its last newline: "" when it ends whole (or
-- cannot be read back: a pipe, a terminal), else that last line's first bytes
-- and the offset where it starts.
local RECORD_START = '{"line":'

local function joblog_tail(path, size)
  local f = size and size > 0 and io.open(path, "rb")
  if not f then return "" end
  f:seek("set", size - 1)
  local last = f:read(1)
  f:close()
  if last == "\n" then return "" end
  local _, whole = read_joblog(path)
  f = assert(io.open(path, "rb"))
  f:seek("set", whole)
  local start = f:read(8) or ""
  f:close()
  return start, whole
end

-- Opens the joblog for appending. A last record that a failed write cut short
-- (a full disk, a crash) is cut off first, with a note on stderr: the next
-- record would be glued to it. A last line that is not a record (the file was
-- not only a joblog) is left and ended with a newline instead. Every record
-- is one unbuffered write: the joblog is the record --resume trusts, so it is
-- written before the output line.
local function open_joblog(path)
  local f, err = io.open(path, "a")
  if not f then return nil, ("cannot open joblog '%s': %s"):format(path, reason(err, path)) end
  local start, whole = joblog_tail(path, f:seek("end")) -- no size for what cannot seek
  if start ~= "" and RECORD_START:sub(1, #start) == start:sub(1, #RECORD_START) then -- a record's start, maybe cut inside it
    f:close()
    if ffi.C.truncate(path, whole) ~= 0 then
      return nil, ("cannot cut the unfinished last record of joblog '%s': %s"):format(path,
        ffi.string(ffi.C.strerror(ffi.errno())))
    end
    io.stderr:write(("moonjob: joblog '%s' ended in a record cut short (a full disk or a crash); "
      .. "it was dropped, and its line runs again with --resume\n"):format(path))
    f, err = io.open(path, "a")
    if not f then return nil, ("cannot open joblog '%s': %s"):format(path, reason(err, path)) end
  elseif start ~= "" then
    f:write("\n")
  end
  f:setvbuf("no")
  return f
end

------------------------------------------------------------------- run ---

local function pool_options(o)
  return { size = o.concurrency, codec = "json", timeout = o.timeout, kill_after = o.kill_after,
    start_timeout = o.start_timeout, attempts = o.attempts, backoff = o.backoff }
end

-- Writes result lines in input order: a finished job waits here until every
-- earlier line was written. Without keep_order, lines go out as jobs finish.
-- Lines that make no output (blank, resumed) are emitted as "".
-- emit(line, text, count): text holds the results of `count` lines (default
-- 1) from `line` on.
-- Also returns held(): the memory (bytes, about) of the results that wait for
-- an earlier line, and how many lines they cover (0, 0 once the run is whole).
-- And flush(): writes every result held, in input order, past the lines
-- missing before them (a run that stops: they did not run).
local HELD_ENTRY_BYTES = 100 -- what holding one result costs beside its text
local function ordered_writer(write, keep_order)
  if not keep_order then
    return function(_, text) write(text) end, function() return 0, 0 end, function() end
  end
  local pending, covers, next_line = {}, {}, 1
  local held_bytes, held_lines = 0, 0
  return function(line, text, count)
    count = count or 1
    if count == 0 then return end -- covers no line (a batch that ran none)
    assert(pending[line] == nil, "line written twice")
    pending[line], covers[line] = text, count
    held_bytes, held_lines = held_bytes + #text + HELD_ENTRY_BYTES, held_lines + count
    while pending[next_line] do
      local at = next_line
      local out = pending[at]
      held_bytes, held_lines = held_bytes - #out - HELD_ENTRY_BYTES, held_lines - covers[at]
      next_line = at + covers[at]
      pending[at], covers[at] = nil, nil
      write(out)
    end
  end, function() return held_bytes, held_lines end, function()
    local lines = {}
    for line in pairs(pending) do lines[#lines + 1] = line end
    table.sort(lines)
    for _, line in ipairs(lines) do write(pending[line]) end
    pending, covers, held_bytes, held_lines = {}, {}, 0, 0
  end
end

-- The pool, or nil and a usage message. Options were checked by parse(); a
-- pool that still refuses them gets the same treatment, not a stack trace.
-- echo(line, job, pid) gets what the children print.
local function new_pool(processor, o, echo)
  local opts = pool_options(o)
  opts.echo = echo
  local ok, pool, err = pcall(moonjob.pool, processor, opts)
  if not ok then return nil, (tostring(pool):gsub("^[^:]*:%d+: ", ""):gsub("^moonjob%.pool: ", "")) end
  if not pool then return nil, tostring(err) end
  return pool
end

-- The bytes left to read in the input when it is a regular file (named, or
-- redirected to stdin), else nil (a pipe, a terminal).
local function input_size(path)
  local stdin = path == nil or path == "-"
  local f = stdin and io.stdin or io.open(path, "rb")
  if not f then return nil end
  local at = f:seek("cur")
  local size = at and f:seek("end")
  if at then f:seek("set", at) end -- (the input reads the descriptor itself: its offset must stay)
  if not stdin then f:close() end
  return size and size - at
end

-- Whether open file f is a regular file (it can seek): what is written to
-- anything else (a terminal, a pipe to a pager or to `cat`) may show on the
-- terminal where the progress line is.
local function regular_file(f)
  return f:seek("cur") ~= nil
end

-- Runs the loop until done() or the bound; a stop signal ends it early.
local function run_for(done, ms)
  local expired = false
  local timer = core.timer(function() expired = true end)
  timer:start(ms)
  pcall(loop.wait_until, function() return expired or done() end)
  timer:close()
end

-- Why the run stops when a wait raised: a stop signal (exit 128 + N), or an
-- error of moonjob's own (exit 1, its message).
local function stopped_by(why)
  why = tostring(why)
  local signum = why:find("^interrupted") and loop.signal
  if not signum then return { status = EXIT_FAILED, message = why } end
  return { status = 128 + signum, record = "completed",
    message = ("interrupted by %s; running jobs were killed"):format(SIGNAL_NAMES[signum] or signum) }
end

local HALTED = "halted" -- the reason of the jobs --halt soon cancels (none a child started)

-- Whether --halt's condition `h` holds after `failed_n` of `finished_n`
-- lines failed: a count, or a percentage judged from the third finished line on.
local function halt_reached(h, finished_n, failed_n)
  if not h or failed_n == 0 then return false end
  if h.count then return failed_n >= h.count end
  return finished_n >= 3 and failed_n * 100 >= h.percent * finished_n
end

-- The stop that --halt `h` makes once `failed_n` lines failed.
local function halted(h, failed_n)
  local rule = ("--halt %s,fail=%s"):format(h.when, h.count and h.count or h.percent .. "%")
  local lines_failed = ("%d %s failed"):format(failed_n, failed_n == 1 and "line" or "lines")
  if h.when == "now" then
    return { status = EXIT_HALTED_NOW, record = "completed",
      message = ("halted (%s): %s; running jobs were killed"):format(rule, lines_failed) }
  end
  return { status = EXIT_HALTED_SOON, record = "ran", soon = true,
    message = ("halted (%s): %s; running jobs finished, no more were started"):format(rule, lines_failed) }
end

-- Which input line printed what job `job` printed: a job of one line is that
-- line. A line of a batch that prints ends its batch (child/runner.lua), so what a
-- batch printed is from its last line started: read in the child's batch
-- area while the batch is the child's, else nil (known when the batch ends:
-- last_line_run).
local function line_of_output(job)
  if not job.count then return job.line end
  local w = job.worker
  local started = w and w:batch_started(job) -- (nil once the child's area is another batch's)
  if started and started > 0 then return job.line + started - 1 end
end

-- The last line batch `job` ran (it ended: completed, or failed).
local function last_line_run(job)
  local run = job.state == "completed" and batches.parse_done(moonjob_job.bytes(job.result_bytes))
  if not run and job.batch_state then run = job.batch_state.started end
  return job.line + math.max(run or 1, 1) - 1
end

-- Ends a run that stops early: what running batches finished is recorded,
-- every child is ended with what it started (more signals meanwhile do not
-- cut this short), and what was written goes out.
local function end_children(pool, out)
  pcall(pool._publish_kept, pool, 0)
  for _ = 1, 100 do -- a wait cut short by a signal is resumed; the close itself is bounded
    if pcall(pool.close, pool, { force = true }) then break end
  end
  run_for(function() return (out:pending() or 0) == 0 end, 1000)
end

-- The exit status of a run that ended, saying why on stderr when it is not
-- the jobs' own outcome. A closed output (| head) ends quietly, with the
-- status of the jobs that finished.
local function outcome(stop, failed, held, read_error, write_error)
  local jobs_status = failed == 0 and EXIT_OK or EXIT_FAILED
  if stop and stop.message then io.stderr:write("moonjob: ", stop.message, "\n") end
  if stop and stop.status then return stop.status end
  if write_error and not write_error:find("^EPIPE") then
    io.stderr:write("moonjob: writing the output failed: ", write_error, "\n")
    return EXIT_USAGE
  end
  if stop then return jobs_status end -- the output closed
  local _, unwritten = held()
  if unwritten > 0 then -- a gap in --keep-order's output: never silent
    io.stderr:write(("moonjob: internal error: %d results were never written (a line before them "
      .. "is missing); they are neither printed nor in the joblog\n"):format(unwritten))
    return EXIT_FAILED
  end
  if read_error then
    io.stderr:write("moonjob: reading the input failed: ", read_error, "\n")
    return EXIT_USAGE
  end
  return jobs_status
end

local function run(processor, input_path, o)
  local fd, err = open_input(input_path)
  if not fd then return usage_error(err) end
  local resumed = o.resume and read_joblog(o.joblog) or {}
  local joblog
  if o.joblog then
    joblog, err = open_joblog(o.joblog)
    if not joblog then return usage_error(err) end
  end
  -- From here on SIGINT, SIGTERM, SIGHUP only stop the loop (until now they
  -- ended the program at once: no child existed yet).
  core.hold_stop_signals()
  local display -- the progress line on a terminal (moonjob.cli.progress), or nil
  local function to_stderr(text)
    if display then return display.write_stderr(text) end
    io.stderr:write(text)
  end
  -- What the processor prints: "[line N] text" on stderr; a batch's, once its
  -- line is known (last_line_run).
  local function echo(text, job, pid)
    if not job then return to_stderr(("[child %d] %s\n"):format(pid, text)) end
    job.wrote_output = true
    local line = not job.output_held and line_of_output(job)
    if line then return to_stderr(("[line %d] %s\n"):format(line, text)) end
    job.output_held = job.output_held or {}
    table.insert(job.output_held, text)
  end
  local function echo_held(job)
    local held_output = job.output_held
    if not held_output then return end
    job.output_held = nil
    local line = last_line_run(job)
    for _, text in ipairs(held_output) do to_stderr(("[line %d] %s\n"):format(line, text)) end
  end

  local pool
  pool, err = new_pool(processor, o, echo)
  if not pool then return usage_error(err) end

  local out = core.output(1)
  local inflight, completed, failed, ended, paused, input = 0, 0, 0, false, false, nil
  local line_no, write_error, read_error = 0, nil, nil
  local lines_over, bytes_read, input_done = 0, 0, false -- lines written or skipped; read
  local open_jobs = {} -- the jobs added and not ended
  local stop -- why the run stops early: { status = n, message = text, record = ... }, or nil
  if o.progress then
    local size = input_size(input_path)
    display = progress.new(function()
      return { completed = completed, failed = failed, skipped = lines_over - completed - failed,
        read = line_no, bytes = bytes_read, input_ended = input_done, size = size }
    end, not regular_file(io.stdout), function() return (out:pending() or 0) == 0 end)
  end
  local resumed_last = 0 -- the last line --resume skips
  for line in pairs(resumed) do resumed_last = math.max(resumed_last, line) end
  local function is_resumed(line) return resumed[line] end

  -- Lines in flight before input pauses (high) and resumes (low): room for
  -- a few batches per child.
  local batching = o.timeout == nil and (o.attempts or 1) == 1
  local batch_lines, line_ms = 1, nil
  -- A line that prints ends its batch (the rest go out again): while lines
  -- print, batches are no longer than the lines run before one printed; the
  -- cap doubles with each job that printed nothing.
  local print_cap = BATCH_LINES_MAX
  local high, low
  local function set_bounds()
    high = math.max(pool.size * 64, pool.size * batch_lines * 3)
    low = math.floor(high / 4)
  end
  set_bounds()
  -- and bytes of batches in flight (blocks are at most 1 MiB: core/stdio.c)
  local inflight_bytes, bytes_high = 0, pool.size * 4 * 1024 * 1024
  local bytes_low = bytes_high / 4
  -- and, with --keep-order, memory of the results that wait for an earlier
  -- line still running, counting those the lines in flight will bring (at
  -- the recent bytes per result line): a slow early line pauses the input at
  -- this bound rather than hold every later result. Each child keeps a line
  -- in flight whatever the size of results.
  local held_high = pool.size * HOLD_BYTES_PER_CHILD
  local held_low = held_high / 4
  local result_line_bytes = 0 -- a moving average

  -- Batches are as long as BATCH_BUDGET_MS of recent lines (1 line each until
  -- lines are known to be short): the run time of `n` lines was `ms`.
  local function lines_took(ms, n, printed)
    if not batching or n < 1 or ended then return end -- ended: the input is read (or closed)
    local per_line = math.max(ms / n, 1e-4)
    line_ms = line_ms and line_ms * 0.8 + per_line * 0.2 or per_line
    print_cap = printed and n or math.min(BATCH_LINES_MAX, print_cap * 2)
    local want = math.max(1, math.min(print_cap, math.floor(BATCH_BUDGET_MS / line_ms)))
    if want ~= batch_lines then
      batch_lines = want
      input:batch(want)
      set_bounds()
    end
  end

  -- Every result line goes to the joblog first (one unbuffered write), then
  -- to stdout: the joblog holds what was printed, in the same order, also
  -- with --keep-order (a result waiting for an earlier line is in neither).
  local joblog_failed = false
  local joblog_may_show = joblog and not regular_file(joblog) -- (--joblog /dev/stderr)
  local function write(text)
    if text == "" or joblog_failed then return end
    if joblog then
      if display and joblog_may_show then display.erase() end
      local ok, e = joblog:write(text)
      if not ok then
        joblog_failed = true
        stop = { status = EXIT_USAGE, message = ("writing the joblog '%s' failed: %s; the run stopped "
          .. "(the joblog records every line printed so far; --resume goes on from there)")
          :format(o.joblog, tostring(e)) }
        return
      end
    end
    if write_error then return end
    if display then display.before_stdout() end
    local written, e = out:write(text)
    if not written then -- nobody reads the output any more: stop
      write_error = e
      input:pause()
    end
  end
  local emit, held, flush_held = ordered_writer(write, o.keep_order)

  -- Whether the results held for --keep-order, with those the lines in
  -- flight will bring (about), are at least `bound` bytes. Each child may
  -- have a line in flight whatever the size of results, unless the results
  -- already held are past the bound; until a result's size is known, a few.
  local function results_past(bound)
    if not o.keep_order then return false end
    if result_line_bytes == 0 then return inflight >= pool.size * 4 end
    local bytes = held()
    return bytes >= bound or (inflight >= pool.size and bytes + inflight * result_line_bytes >= bound)
  end

  local function pause_if_full()
    if paused or ended then return end
    if inflight >= high or inflight_bytes >= bytes_high or results_past(held_high) then
      paused = true
      input:pause()
    end
  end

  -- Called wherever lines in flight or results held may have gone down: every
  -- path that frees room must come here, or a paused input stays paused.
  local function resume_if_room()
    if not paused or ended or write_error then return end
    if inflight <= low and inflight_bytes <= bytes_low and not results_past(held_low + 1) then
      paused = false
      input:resume()
    end
  end

  -- Results held for --keep-order may grow past their bound (results can be
  -- bigger than recent ones): the input pauses then too.
  local function written(line, text, count)
    count = count or 1
    inflight = inflight - count
    if count > 0 and text ~= "" then
      local per_line = #text / count
      result_line_bytes = result_line_bytes == 0 and per_line or result_line_bytes * 0.8 + per_line * 0.2
    end
    emit(line, text, count)
    pause_if_full()
    resume_if_room()
  end

  -- A job that fails with ELOAD before any completed: the processor cannot
  -- load, so no job will run; the run stops as for a syntax error.
  local function cannot_load(job)
    return completed == 0 and job.state == "failed" and job.error.code == "ELOAD"
  end

  local add_line, add_batch

  -- The lines of batch `job` from position `from` on that it did not run go
  -- out again, as a batch of their own (or a line), ahead of every later line
  -- (a job's priority is its first line number), so that results held for
  -- --keep-order do not wait for them behind the whole queue.
  local function hand_back(job, from)
    local to = job.handed_back - 1
    if from > to then return end
    job.handed_back = from
    inflight = inflight - (to - from + 1)
    if stop then return end -- a run that stops adds nothing more (--resume runs them)
    local text = batches.slice(job.text, from, to)
    if from == to then return add_line(job.line + from - 1, text, #text) end
    add_batch(job.line + from - 1, to - from + 1, text)
  end
  pool.on_lines_cut = function(job, kept) -- an idle child takes what a slow line held up
    hand_back(job, kept + 1)
  end

  -- --halt soon: no more input, and every job in flight that no child
  -- started is canceled (waiting ones first, so that a child a cancel frees
  -- takes nothing; the pool asks the child's gate and leaves a started job
  -- to run): only what runs finishes, as in GNU parallel. The main wait goes
  -- on until those end.
  local function halt_soon()
    ended = true
    local waiting, sent = {}, {}
    for job in pairs(open_jobs) do
      if job.state == "waiting" then waiting[#waiting + 1] = job else sent[#sent + 1] = job end
    end
    for _, list in ipairs({ waiting, sent }) do
      for _, job in ipairs(list) do
        job.halted = true -- (read when it ends, inside the cancel)
        if not pool:_cancel(job, HALTED, nil, true) then job.halted = nil end
      end
    end
  end

  -- Records the result lines `text` of `count` lines from `line` on (the
  -- joblog, then stdout: write). False when the joblog cannot be written
  -- (the run stops).
  local function record(line, text, count, ok_n, failed_n)
    if joblog_failed then return false end
    completed, failed, lines_over = completed + ok_n, failed + failed_n, lines_over + count
    written(line, text, count)
    if not stop and halt_reached(o.halt, completed + failed, failed) then
      stop = halted(o.halt, failed)
      input:pause() -- nothing more is read, nor added
      if stop.soon then halt_soon() end
    end
    return not joblog_failed
  end

  -- A batch still running has finished its first `kept` lines (their result
  -- lines are `text`): the ones not recorded yet are recorded now, so that a
  -- slow line holds up no output of the lines before it, and a run stopped by
  -- a signal keeps them (pool:_publish_kept).
  pool.on_lines_kept = function(job, kept, text)
    local done = job.printed or 0
    if kept <= done then return end
    local new = text:sub((job.printed_bytes or 0) + 1)
    local ok_n, failed_n = batches.count(new)
    job.printed, job.printed_bytes = kept, #text
    job.printed_ok, job.printed_failed = (job.printed_ok or 0) + ok_n, (job.printed_failed or 0) + failed_n
    record(job.line + done, new, kept - done, ok_n, failed_n)
  end

  -- Whether a stop lets finished `job` be recorded. A stop signal or --halt
  -- now (record "completed"): jobs that completed meanwhile are (they ran),
  -- and what a killed batch had finished; failures are not (the kill caused
  -- them). --halt soon (record "ran"): the jobs that run to their end are,
  -- those it canceled or the close failed before they started are not.
  -- Any other stop records nothing more.
  local function recorded_in_stop(job)
    if not stop.record then return false end
    local e = job.state ~= "completed" and job.error
    local never_ran = e and (stop.record == "completed" or e.code == "ECLOSED" or job.halted)
    if not never_ran then return true end
    local state = job.count and job.batch_state
    if state then pool.on_lines_kept(job, state.kept, state.text) end
    return false
  end

  -- A job that ends unrecorded in a stop: its lines not recorded leave the
  -- count in flight (--halt soon waits for it to reach 0).
  local function forget(job)
    if not job.count then
      inflight = inflight - 1
      return
    end
    inflight_bytes = inflight_bytes - #job.text
    hand_back(job, (job.printed or 0) + 1) -- (under a stop: dropped)
  end

  local function finished(job)
    open_jobs[job] = nil
    echo_held(job)
    if stop and not recorded_in_stop(job) then return forget(job) end
    if cannot_load(job) then
      stop = { status = EXIT_USAGE, message = tostring(job.error) } -- "ELOAD: ...", as a syntax error reads
      return
    end
    if not job.count then
      local ok_n = job.state == "completed" and 1 or 0
      if record(job.line, result_line(job), 1, ok_n, 1 - ok_n) and job.ms then
        lines_took(job.ms, 1, job.wrote_output)
      end
      return
    end
    local text, covered, ok_n, failed_n = batch_outcome(job)
    local done = job.printed or 0 -- lines recorded while it ran
    if done > 0 then
      text = text:sub(job.printed_bytes + 1)
      ok_n, failed_n = ok_n - job.printed_ok, failed_n - job.printed_failed
    end
    inflight_bytes = inflight_bytes - #job.text
    if not record(job.line + done, text, covered - done, ok_n, failed_n) then return end
    if job.ms and covered > 0 and not stop then lines_took(job.ms, covered, job.wrote_output) end
    hand_back(job, covered + 1)
  end
  -- A listener that raises would leave its line in flight for ever (a hang):
  -- the run stops instead, saying why.
  local function guarded(listener)
    return function(job)
      local ok, e = pcall(listener, job)
      if not ok and not (stop and stop.internal) then
        stop = { status = EXIT_FAILED, internal = true,
          message = ("internal error on line %s: %s (please report it)"):format(tostring(job.line), tostring(e)) }
      end
    end
  end
  pool:on("completed", guarded(finished))
  pool:on("failed", guarded(finished))

  add_line = function(line, text, len)
    if (text and not text:find("%S")) or resumed[line] then -- no job: written at once
      lines_over = lines_over + 1
      emit(line, "")
      return resume_if_room() -- (a line handed back may be the one the others waited for)
    end
    inflight = inflight + 1
    if not text then -- longer than max_payload: fails without running
      local e = moonjob.errors.new("EINPUT", ("line %d is %d bytes or more, more than max_payload (%d)")
        :format(line, len, pool.max_payload))
      finished({ line = line, state = "failed", error = e, attempts = 0 })
    else
      local job = pool:add(text, { name = "line " .. line, priority = line })
      job.line = line
      open_jobs[job] = true
    end
  end

  add_batch = function(first, count, text)
    if first <= resumed_last then text = batches.blank(text, first, count, is_resumed) end
    inflight, inflight_bytes = inflight + count, inflight_bytes + #text
    local job = pool:add(text, { name = ("lines %d-%d"):format(first, first + count - 1),
      lines = { first, count, o.halt and true or nil }, priority = first }) -- (--halt: ends at a failure)
    job.line, job.count, job.text, job.handed_back = first, count, text, count + 1
    open_jobs[job] = true
  end

  local function on_line(text, len, count)
    if stop then return end -- (--halt paused the input: lines read meanwhile do not run)
    local first = line_no + 1
    line_no = line_no + count
    bytes_read = bytes_read + len + 1
    if count > 1 then add_batch(first, count, text) else add_line(first, text, len) end
    pause_if_full()
  end
  input = core.input(fd, pool.max_payload, on_line, function(e)
    ended, read_error, input_done = true, e, true
  end)
  input:resume()

  local ok, why = pcall(loop.wait_until, function()
    resume_if_room() -- a safety net: a path that frees room and misses resuming would hang the run
    local pending, e = out:pending() -- (a reader gone shows here before any write: core/stdio.c)
    write_error = write_error or e
    return (stop and not stop.soon) or write_error or (ended and inflight == 0 and pending == 0)
  end)
  ended = true -- no more resuming: the input is closed
  input:close()
  if not ok then stop = stopped_by(why) end
  if write_error and not stop then -- nobody reads the output any more: stop
    stop = { closed_output = true }
  end
  if not stop or stop.soon then -- every job is over (--halt soon waited for its lines): the idle
    ok, why = pcall(pool.close, pool) -- children end (a signal meanwhile still counts)
    if not ok then stop = stopped_by(why) end
  end
  if stop then
    end_children(pool, out)
    flush_held() -- with --keep-order, what finished after a line that never will
    run_for(function() return (out:pending() or 0) == 0 end, 1000)
  end
  if joblog then joblog:close() end
  if display then display.close(lines_over > 0) end -- the summary, once a line ended
  return outcome(stop, failed, held, read_error, write_error or select(2, out:pending()))
end

-- moonjob worker | add | status (moonjob.cli.redis).
local function remote_command(command, o)
  local remote = require "moonjob.cli.redis"
  o.redis = o.redis or os.getenv("MOONJOB_REDIS") -- keeps a password out of `ps`
  local bad = remote.check_target(o, usage_error)
  if bad then return bad end
  if command == "worker" then
    local processor = o.positional[2]
    if not processor then return usage_error("missing PROCESSOR: moonjob worker PROCESSOR --redis URL --queue NAME") end
    if o.positional[3] then return usage_error(("unexpected argument '%s'"):format(o.positional[3])) end
    return remote.worker(processor, o, pool_options)
  elseif command == "add" then
    if o.positional[3] then return usage_error(("unexpected argument '%s'"):format(o.positional[3])) end
    return remote.add(o.positional[2], o)
  end
  if o.positional[2] then return usage_error(("unexpected argument '%s'"):format(o.positional[2])) end
  return remote.status(o)
end

-- cli.main(args) -> exit status
function M.main(arguments)
  local o, err = args.parse(arguments)
  if not o then return usage_error(err) end
  if o.help then io.stdout:write(args.USAGE) return EXIT_OK end
  if o.version then io.stdout:write(moonjob._VERSION, "\n") return EXIT_OK end
  local command = o.positional[1]
  if command == nil then return usage_error("missing command: moonjob run PROCESSOR [INPUT]") end
  if command == "worker" or command == "add" or command == "status" then return remote_command(command, o) end
  if command ~= "run" then
    return usage_error(("unknown command '%s'; the commands are run, worker, add and status"):format(command))
  end
  local processor, input_path = o.positional[2], o.positional[3]
  if not processor then return usage_error("missing PROCESSOR: moonjob run PROCESSOR [INPUT]") end
  if o.positional[4] then return usage_error(("unexpected argument '%s'"):format(o.positional[4])) end
  if o.resume and not o.joblog then return usage_error("--resume needs --joblog FILE") end
  if o.progress == nil then o.progress = core.isatty(2) end
  return run(processor, input_path, o)
end

return M
