-- moonjob.cli.output -- what `moonjob run` writes: result lines on stdout
-- (and the joblog), and what processors print, tagged, on stderr.
--
-- Result lines go out through a writer that never blocks the loop and that
-- sees its reader go (| head) without writing (core.output). The joblog is
-- that writer's record: each result line is copied to it right after stdout
-- took it (written to the kernel), so the joblog holds what was printed, in
-- the same order, also with --keep-order, whatever stops the run (SIGKILL
-- included): --resume runs exactly the lines not printed. A joblog that
-- cannot be written, and an output error, are told to the run
-- (hooks.joblog_failed, seen by poll(); hooks.closed): it stops, and what was
-- not printed is not recorded.
--
-- With --keep-order a finished job's results wait here, pending, until every
-- earlier line was written; without it, lines go out as jobs finish. Lines that make no output
-- (blank, resumed) are emitted as "". What waits for stdout is bounded by
-- the input (moonjob.cli.input pauses while backlog() is over its bound).
--
-- What processors print goes to stderr as "[line N] text". A job of one line
-- is tagged here (echo). In a batch the child tags each output line with the
-- line that wrote it (core/child/output.c), job:log's included, and the
-- batch's output comes here in whole lines (echo_lines, the pool's output
-- hook: moonjob.pool.lines), written as it is: printing does not end a batch.
-- Lines in it the child could not tag (a command run by os.execute, a
-- write(2): they bypass its stdio) are tagged here with the batch's last
-- line started when they are read (the child's batch area), which may be
-- later than the line that wrote them; once the batch is no longer the
-- child's, with its last line run (echo_to_tag).
--
-- Caveat: the progress line (display) shares stderr, and stdout's terminal
-- when stdout is not a regular file: it is erased before each write there
-- (the write itself may come later, when the terminal has room), and drawn
-- again once the turn's writes are out (flush_now, moonjob.cli.progress).
local batches = require "moonjob.cli.batches"
local core = require "moonjob.core"
local lines = require "moonjob.codec.resultline"
local loop = require "moonjob.loop"
local moonjob_job = require "moonjob.job"

local M = {}

local PENDING_ENTRY_BYTES = 100 -- what keeping one result pending costs beside its text

local Output = {}
Output.__index = Output

-- Whether open file f is a regular file (it can seek): what is written to
-- anything else (a terminal, a pipe to a pager or to `cat`) may show on the
-- terminal where the progress line is.
function M.regular_file(f)
  return f:seek("cur") ~= nil
end

-- The result line of a job that ran one line.
function M.result_line(job)
  if job.state == "completed" then
    return lines.completed(job.line, moonjob_job.bytes(job.result_bytes), job.attempts, job.ms or 0)
  end
  return lines.failed(job.line, job.error, job.attempts, job.ms or 0)
end

-- The joblog's descriptor, for the writer to copy what stdout took to it.
local function record_fd(log)
  return log and log.fd and log:fd()
end

-- An output on stdout (or `out`, a core.output-like writer), recording in
-- joblog `log` (a moonjob.cli.joblog, or nil) what stdout took.
-- hooks.joblog_failed(err), hooks.closed(): the run stops.
function M.new(keep_order, log, hooks, out)
  return setmetatable({
    out = out or core.output(1, record_fd(log)), keep_order = keep_order,
    joblog = log, joblog_may_show = log and not M.regular_file(log.file), -- (--joblog /dev/stderr)
    display = nil, -- the progress line (moonjob.cli.progress), set by the run
    joblog_failed = false, write_error = nil, -- the reader went (EPIPE) or a write failed
    given = 0, -- the bytes given to stdout's writer
    on_joblog_failed = hooks.joblog_failed, on_closed = hooks.closed,
    pending_text = {}, covers = {}, next_line = 1, pending_bytes = 0, pending_lines = 0, -- (-k)
  }, Output)
end

-- Writes result lines `text` to stdout (the writer records them once written).
function Output:write(text)
  if text == "" or self.joblog_failed or self.write_error then return end
  local display = self.display
  if display then
    if self.joblog_may_show then display.erase() end
    display.before_stdout()
  end
  self.given = self.given + #text
  local written, e = self.out:write(text)
  if not written then -- nobody reads the output any more, or it failed: stop
    self.write_error = e
    self.on_closed()
  end
end

-- Text holds the results of `count` lines (default 1) from `line` on: written
-- now, or with --keep-order once every line before `line` was.
function Output:emit(line, text, count)
  if not self.keep_order then return self:write(text) end
  count = count or 1
  if count == 0 then return end -- covers no line (a batch that ran none)
  local pending_text, covers = self.pending_text, self.covers
  assert(pending_text[line] == nil, "line written twice")
  pending_text[line], covers[line] = text, count
  self.pending_bytes = self.pending_bytes + #text + PENDING_ENTRY_BYTES
  self.pending_lines = self.pending_lines + count
  while pending_text[self.next_line] do
    local at = self.next_line
    local out = pending_text[at]
    self.pending_bytes = self.pending_bytes - #out - PENDING_ENTRY_BYTES
    self.pending_lines = self.pending_lines - covers[at]
    self.next_line = at + covers[at]
    pending_text[at], covers[at] = nil, nil
    self:write(out)
  end
end

-- The memory (bytes, about) of the pending results (-k: they wait for an
-- earlier line), and how many lines they cover (0, 0 once the run is whole).
function Output:pending_results()
  return self.pending_bytes, self.pending_lines
end

-- Writes every pending result, in input order, past the lines missing
-- before them (a run that stops: they did not run).
function Output:flush_pending()
  local starts = {}
  for line in pairs(self.pending_text) do starts[#starts + 1] = line end
  table.sort(starts)
  for _, line in ipairs(starts) do self:write(self.pending_text[line]) end
  self.pending_text, self.covers, self.pending_bytes, self.pending_lines = {}, {}, 0, 0
end

-- Whether stdout took every byte it was given (a writer that cannot say:
-- true).
function Output:all_taken()
  local out = self.out
  return not out.written or out:written() >= self.given
end

-- The writer's error, if a write failed (or its reader went), else nil.
function Output:write_failure()
  return select(2, self.out:pending())
end

-- Writes out now what stdout was given (a pipe or terminal with room),
-- rather than at the start of the loop's next turn: the bytes it has not
-- taken yet (0 after an error). The progress line is drawn after them.
function Output:flush_now()
  local out = self.out
  if out.flush then out:flush() end
  return self:backlog()
end

-- The bytes given to stdout that it has not taken yet (0 after an error).
function Output:backlog()
  return self.out:pending() or 0
end

-- As backlog(), and notes a write error (a reader gone shows here before
-- any write: core/parent/output.c) and a joblog that could not be written.
function Output:poll()
  local backlog, e = self.out:pending()
  self.write_error = self.write_error or e
  if not self.joblog_failed and self.joblog and self.out.record_error then
    local record_error = self.out:record_error()
    if record_error then
      self.joblog_failed = true
      self.on_joblog_failed(record_error)
    end
  end
  return backlog
end

-- Nothing more is written: what stdout has not taken is dropped (neither
-- printed nor recorded), and the joblog's reserved space is given back.
function Output:close()
  if self.out.close then self.out:close() end
end

-- Runs the loop until what was written went out, for at most `ms`; a stop
-- signal ends it early.
function Output:drain(ms)
  local expired = false
  local timer = core.timer(function() expired = true end)
  timer:start(ms)
  pcall(loop.wait_until, function() return expired or (self.out:pending() or 0) == 0 end)
  timer:close()
end

--------------------------------------------------- what processors print ---

-- Which input line printed what job `job` printed: a job of one line is that
-- line; a batch's is its last line started, nil once the child's area is
-- another batch's (known when the batch ends: last_line_run).
local function line_of_output(job)
  if not job.count then return job.line end
  local child = job.child
  local started = child and child:batch_started(job)
  if started and started > 0 then return job.line + started - 1 end
end

-- The last line batch `job` ran (it ended: completed, or failed).
local function last_line_run(job)
  local run = job.state == "completed" and batches.parse_done(moonjob_job.bytes(job.result_bytes))
  if not run and job.batch_state then run = job.batch_state.started end
  return job.line + math.max(run or 1, 1) - 1
end

function Output:to_stderr(text)
  if self.display then return self.display.write_stderr(text) end
  io.stderr:write(text)
end

-- The pool's echo: what a child printed, with its job (nil between jobs).
function Output:echo(text, job, pid)
  if not job then return self:to_stderr(("[child %d] %s\n"):format(pid, text)) end
  local line = not job.output_to_tag and line_of_output(job)
  if line then return self:to_stderr(("[line %d] %s\n"):format(line, text)) end
  job.output_to_tag = job.output_to_tag or {} -- its line is known once the batch ends
  table.insert(job.output_to_tag, text)
end

-- What ended job `job` printed whose line was not known yet.
function Output:echo_to_tag(job)
  local to_tag = job.output_to_tag
  if not to_tag then return end
  job.output_to_tag = nil
  local line = last_line_run(job)
  for _, text in ipairs(to_tag) do self:to_stderr(("[line %d] %s\n"):format(line, text)) end
end

local find, byte, sub = string.find, string.byte, string.sub

-- Where the first line of `text` from `pos` on that the child did not tag
-- (it does not begin with "[line ") begins, or nil.
local function untagged_at(text, pos)
  local len = #text
  while pos <= len do
    local a, b, c, d, e, f = byte(text, pos, pos + 5)
    if not (a == 91 and b == 108 and c == 105 and d == 110 and e == 101 and f == 32) then return pos end
    pos = (find(text, "\n", pos, true) or len) + 1
  end
end

-- What batch `job`'s child wrote: whole lines, most tagged by the child
-- (the output hook of moonjob.pool.lines). Tagged lines go out as
-- they are, in one write; the others are tagged as echo does.
function Output:echo_lines(text, job)
  local pos = 1
  while true do
    local at = untagged_at(text, pos)
    if not at then
      if pos > #text then return end
      return self:to_stderr(pos == 1 and text or sub(text, pos))
    end
    if at > pos then self:to_stderr(sub(text, pos, at - 1)) end
    local nl = find(text, "\n", at, true)
    self:echo(sub(text, at, nl - 1), job)
    pos = nl + 1
  end
end

return M
