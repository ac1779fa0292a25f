-- moonjob.cli.batch_jobs -- `moonjob run`'s batch jobs: pool jobs that each
-- carry many input lines (pool:add's `lines` option; their text helpers are
-- moonjob.cli.batches).
--
-- A batch's lines are recorded as it goes: what a running batch finished is
-- recorded at once (lines_kept), so that a slow line holds up no output of
-- the lines before it; the lines it did not run (an idle child took them, a
-- line printed, its child died) go out again, as a batch of their own or a
-- line, ahead of every later line (a job's priority is its first line
-- number), so that results pending for --keep-order do not wait for them
-- behind the whole queue.
--
-- With -k, lines handed back while the pending results are past their bound
-- are parked here, not added (unpark, asked by the run's main wait).
--
-- --attempts: a batch job is never retried as a whole (attempts = 1 to the
-- pool). A line of it that fails with attempts left (the pool's rule,
-- pool.lines:retry_delay: --attempts, --backoff, errors no attempt can fix)
-- is not recorded: it runs again alone, as a job of its own whose attempts
-- go on from 2 (pool:add's first_attempt) after its backoff, so that its
-- result line says how many attempts it took, exactly as without batches,
-- and --halt counts it only once its last attempt failed. This holds for a
-- line that failed in the child and for the line a batch's child died in
-- (a crash, or killed at the line's hard deadline, moonjob.pool.deadlines).
-- The lines around it are recorded as they are (-k keeps those after it pending).
--
-- Fields a batch job carries: line (its first), count, text, handed_back
-- (the first position handed back), printed and printed_bytes / _ok /
-- _failed (what lines_kept recorded).
--
-- Caveat: this is a part of the run (moonjob.cli.run), not a thing of its
-- own: it records through run:record and adds lines through run:add_line
-- (a line run again: through the pool, as add_line does, with its attempt),
-- and keeps the run's counts of lines in flight (run.input).
local batches = require "moonjob.cli.batches"
local json = require "moonjob.codec.json"
local lines = require "moonjob.codec.resultline"
local moonjob = require "moonjob"
local moonjob_job = require "moonjob.job"

local M = {}

local BatchJobs = {}
BatchJobs.__index = BatchJobs

-- The batch jobs of `run`.
function M.new(run)
  local resumed = run.resumed
  return setmetatable({ run = run, is_resumed = function(line) return resumed[line] end,
    parked = {}, -- lines handed back while -k's pending results are past their bound
    retries = (run.o.attempts or 1) > 1 }, BatchJobs)
end

-- Their part of the pool's batch hooks (moonjob.pool.lines; the run sets
-- them): lines an idle child takes because a slow line kept them waiting, and
-- lines a running batch finished. Guarded as the run's listeners are: one
-- that raises stops the run.
function BatchJobs:hooks()
  local run = self.run
  return { cut = run:guard(function(job, kept) self:hand_back(job, kept + 1) end),
    kept = run:guard(function(job, kept, text) self:lines_kept(job, kept, text) end) }
end

-- What batch job `job` ran: its result lines, the positions they cover (1
-- to covered), and how many completed and failed. A batch whose child died
-- keeps what its finished lines wrote to the shared area (job.batch_state);
-- the line it was running fails with the child's error; the lines after are
-- not covered (they go out again). A batch that failed before it started
-- (the processor no longer loads, the run stops) fails each of its lines
-- with that error.
function M.outcome(job)
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

-- Adds the `count` lines `text` from line `first` on as one job (lines that
-- --resume skips made blank).
function BatchJobs:add(first, count, text)
  local run, input = self.run, self.run.input
  if first <= run.resumed_last then text = batches.blank(text, first, count, self.is_resumed) end
  input:sent(count, #text)
  local job = run.pool:add(text, { name = ("lines %d-%d"):format(first, first + count - 1),
    lines = { first, count, run.o.halt and true or nil }, priority = first, -- (--halt: ends at a failure)
    attempts = 1 }) -- (a failed line runs again alone: retry)
  job.line, job.count, job.text, job.handed_back = first, count, text, count + 1
  run.open_jobs[job] = true
end

-- Adds `count` lines `text` from line `first` on again: a line alone, or a batch.
function BatchJobs:add_again(first, count, text)
  if count == 1 then return self.run:add_line(first, text, #text) end
  self:add(first, count, text)
end

-- The lines of batch `job` from position `from` on that it did not run go
-- out again (not once the run stops: --resume runs them). While -k holds
-- results past its bound they are parked instead: a batch ends when its
-- results fill the child's area, and adding the rest at once would run
-- every line past the bound when results are big (the input's pause does
-- not hold them back).
function BatchJobs:hand_back(job, from)
  local to = job.handed_back - 1
  if from > to then return end
  local run = self.run
  job.handed_back = from
  run.input:dropped(to - from + 1)
  if run.stop then return end -- a run that stops adds nothing more (--resume runs them)
  local text = batches.slice(job.text, from, to)
  if run.input:keep_order_full() then
    self.parked[#self.parked + 1] = { job.line + from - 1, to - from + 1, text }
    return
  end
  self:add_again(job.line + from - 1, to - from + 1, text)
end

-- The parked lines go out again once -k's pending results are back under
-- the bound's low mark, and the first parked piece at once when the output
-- waits for a line of it (the pending results wait for it: keeping it
-- parked would never free them). The run's main wait asks; a run that stops
-- drops them (--resume runs them). Whether lines are still parked.
function BatchJobs:unpark()
  local parked, run = self.parked, self.run
  if #parked == 0 then return false end
  self.parked = {}
  if run.stop then return false end
  table.sort(parked, function(a, b) return a[1] < b[1] end)
  local room, waited_for = not run.input:keep_order_full(true), run.output.next_line
  for _, p in ipairs(parked) do
    if room or p[1] <= waited_for then self:add_again(p[1], p[2], p[3])
    else self.parked[#self.parked + 1] = p end
  end
  return #self.parked > 0
end

-- The failed lines among result lines `text` that run again (the pool's
-- rule for their attempt and error): a list of { line, from, to, error,
-- attempt, delay } (from, to: the bytes of the line's result in text), in
-- order.
function BatchJobs:to_retry(text)
  local found, pool = {}, self.run.pool
  local from, lined = 1, "\n" .. text -- (a record starts each line)
  while true do
    local at, line = lined:match('\n(){"line":(%d+),"status":"failed"', from)
    if not at then break end
    at = at - 1 -- in text itself
    local to = text:find("\n", at, true) or #text + 1
    local record = json.decode(text:sub(at, to - 1))
    local err = type(record) == "table" and record.error
    local attempt = type(record) == "table" and tonumber(record.attempts) or 1
    local delay = type(err) == "table" and pool.lines:retry_delay(attempt, err)
    if delay then found[#found + 1] = { tonumber(line), at, to, err, attempt, delay } end
    from = to + 1
  end
  return found
end

-- Line `line` (`text`) of a batch failed on attempt `attempt`: it runs
-- again alone after `delay` seconds (not once the run stops: --resume runs
-- it).
function BatchJobs:retry(line, text, attempt, delay)
  local run = self.run
  run.input:dropped(1) -- (sent again below, or left to --resume)
  if run.stop then return end
  run.input:sent(1, 0)
  local job = run.pool:add(text, { name = "line " .. line, priority = line, delay = delay,
    first_attempt = attempt + 1 })
  job.line = line
  run.open_jobs[job] = true
end

-- Records result lines `text` of batch `job` from position `pos` on,
-- covering `count` positions, ok_n completed and failed_n failed: the
-- failed lines that run again (retry) are left out, the rest recorded as
-- the pieces between them. False when the joblog cannot be written.
function BatchJobs:record(job, pos, text, count, ok_n, failed_n)
  local run = self.run
  local line = job.line + pos - 1
  local retried = failed_n > 0 and self.retries and self:to_retry(text)
  if not retried or #retried == 0 then return run:record(line, text, count, ok_n, failed_n) end
  local last, at = line + count - 1, 1
  for _, r in ipairs(retried) do
    local piece = text:sub(at, r[2] - 1)
    local piece_ok, piece_failed = batches.count(piece)
    if not run:record(line, piece, r[1] - line, piece_ok, piece_failed) then return false end
    local n = r[1] - job.line + 1
    self:retry(r[1], batches.slice(job.text, n, n), r[5], r[6])
    line, at = r[1] + 1, r[3] + 1
  end
  local piece = text:sub(at)
  local piece_ok, piece_failed = batches.count(piece)
  return run:record(line, piece, last - line + 1, piece_ok, piece_failed)
end

-- A batch still running has finished its first `kept` lines (their result
-- lines are `text`): the ones not recorded yet are recorded now, so that a
-- slow line holds up no output of the lines before it, and a run stopped by
-- a signal keeps them (pool.lines:publish_kept).
function BatchJobs:lines_kept(job, kept, text)
  local done = job.printed or 0
  if kept <= done then return end
  local new = text:sub((job.printed_bytes or 0) + 1)
  local ok_n, failed_n = batches.count(new)
  job.printed, job.printed_bytes = kept, #text
  job.printed_ok, job.printed_failed = (job.printed_ok or 0) + ok_n, (job.printed_failed or 0) + failed_n
  self:record(job, done + 1, new, kept - done, ok_n, failed_n)
end

-- Batch `job` ended: what it ran and lines_kept did not record is recorded,
-- its run time sizes the next batches, and the lines it did not run go out
-- again.
function BatchJobs:finished(job)
  local run = self.run
  local text, covered, ok_n, failed_n = M.outcome(job)
  local done = job.printed or 0 -- lines recorded while it ran
  if done > 0 then
    text = text:sub(job.printed_bytes + 1)
    ok_n, failed_n = ok_n - job.printed_ok, failed_n - job.printed_failed
  end
  run.input:batch_ended(#job.text)
  if not self:record(job, done + 1, text, covered - done, ok_n, failed_n) then return end
  -- (a line that ran to its deadline says nothing of how long lines take)
  local timed_out = failed_n > 0 and text:find('"code":"ETIMEDOUT"', 1, true)
  if job.ms and covered > 0 and not run.stop and not timed_out then
    run.input:lines_took(job.ms, covered)
  end
  self:hand_back(job, covered + 1)
end

-- Batch `job` ended unrecorded in a stop: its lines not recorded leave the
-- counts in flight.
function BatchJobs:forget(job)
  self.run.input:batch_ended(#job.text)
  self:hand_back(job, (job.printed or 0) + 1) -- (under a stop: dropped)
end

return M
