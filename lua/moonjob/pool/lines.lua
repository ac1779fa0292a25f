-- moonjob.pool.lines -- the pool's side of batches of lines (moonjob.cli).
--
-- A part of the pool (see pool/init.lua), pool.lines. The command line
-- (moonjob.cli) hands tiny NDJSON lines to the children in batches: one pool
-- job holds many lines (pool:add's internal `lines` option: { first line's
-- number, number of lines [, end_on_failure] }), which the child runs one by
-- one (child/batch.lua), keeping each line's result in the area it shares
-- with the parent (core/frame.h). Everything the pool does for batches is
-- here; the rest of the pool sees only pool.batches (set once the first batch
-- is added: the depth keeps two jobs per child, the workers allow the bigger
-- DONE, the steal and the sweep look at batches).
--
-- The hook, for the one owner of batches (moonjob.cli), as two fields it sets
-- on the pool (nil: nothing is handed over):
--
--   pool.on_lines_cut(job, lines_kept)
--       An idle child found nothing to run while batch `job` has run for
--       STEAL_AFTER_MS (moonjob.pool.dispatch): its lines not started were
--       cut off, its first `lines_kept` lines excepted (the child starts no
--       more of them). The owner adds the lines after those again.
--   pool.on_lines_kept(job, lines_kept, kept_text)
--       Batch `job`, running, has finished its first `lines_kept` lines,
--       whose result lines are kept_text: the owner prints them now, so that
--       a slow line holds up no output of the lines before it. Called by the
--       sweep for batches running for STEAL_AFTER_MS or more, and by
--       pool:publish_kept(min_ms).
--
-- Both are called as the pool's listeners are (moonjob.pool.events): an
-- error in one is reported (the `error` listeners, or stderr) and the pool
-- carries on; it never escapes into the dispatch or the sweep.
--
-- Owns: pool.batches (written only here) and, on each batch job,
-- first_line, line_count, lines_end_on_failure, line_timeout and lines_cut
-- (the worker sets job.batch_state at its child's exit, for the CLI; so do
-- the deadlines when they kill its child).
--
-- Deadlines: a batch job's timeout is each of its lines' (line_timeout, in
-- its metadata): the child enforces each line's soft deadline itself and
-- goes on with the next line (child/batch.lua); the parent keeps the hard
-- one, timeout + kill_after from the start of the line running, read in the
-- shared page when the job's timer fires (line_overdue, called by
-- moonjob.pool.deadlines). A batch job itself is never retried: the owner
-- runs a failed line again alone (pool:line_retry_delay).
-- Exposes: Lines.wire_first_line(job) (a plain function: the metadata the
-- child reads), lines:add_option(job, spec), lines:line_overdue(w, job),
-- lines:retry_delay(attempt, err)
-- (pool:line_retry_delay), lines:cuttable(head),
-- lines:cut(w, head), lines:hand_back(jobs), lines:publish_kept(min_ms)
-- (pool:publish_kept).
-- Calls: pool.children:array(), pool.events:report (a hook's error), and on
-- workers expect_batches, batch_cut and batch (moonjob.worker).
local loop = require "moonjob.loop"

local Lines = {}
Lines.__index = Lines

-- Lines.new(pool, steal_after_ms) -> the pool's lines; steal_after_ms is
-- dispatch's STEAL_AFTER_MS, the age from which a batch is published.
function Lines.new(pool, steal_after_ms)
  return setmetatable({ pool = pool, steal_after_ms = steal_after_ms }, Lines)
end

-- What the child's metadata says of a job's lines: its first line's number
-- (negative: the batch ends at its first failure), or, when each line has
-- a timeout, { that number, the timeout in seconds }; false for a job that
-- is not a batch.
function Lines.wire_first_line(job)
  local first = job.first_line
  if not first then return false end
  if job.lines_end_on_failure then first = -first end
  local timeout = job.line_timeout
  if timeout then return { first, timeout } end
  return first
end

-- pool:add's `lines` option: job is a batch of lines. The job's timeout
-- (its own, or the pool's) is each line's (see the top of this file).
function Lines:add_option(job, spec)
  job.first_line, job.line_count, job.lines_end_on_failure = spec[1], spec[2], spec[3]
  job.line_timeout = job.timeout or self.pool.timeout
  if not self.pool.batches then self:expect() end
end

-- The hard deadline of batch `job`, which w's child runs: the job's
-- timeout timer (moonjob.pool.deadlines) calls this instead of interrupting
-- the batch, since each line's soft deadline is the child's own. The line
-- running started `line_ms` ago (the shared page, core/frame.h): once it has
-- run timeout + kill_after, true (the child is killed for it); else false
-- and the seconds until that line's hard deadline.
function Lines:line_overdue(w, job)
  local pool = self.pool
  local timeout = job.line_timeout -- (set by add_option: the timer fires only when there is one)
  local hard_ms = (timeout + (job.kill_after or pool.kill_after)) * 1000
  local started, _, _, line_ms = w:batch(job)
  if not (started and started > 0 and line_ms) then return false, timeout end -- not (or no longer) running it
  if line_ms >= hard_ms then return true end
  return false, (hard_ms - line_ms) / 1000
end

-- pool:line_retry_delay(attempt, err): the seconds before a line of a batch
-- that failed with err on attempt `attempt` runs again alone, or nil when
-- it fails for good: the pool's own rule for a job's retries (attempts,
-- backoff, codes no attempt can fix, err.retry == false).
function Lines:retry_delay(attempt, err)
  local pool = self.pool
  if pool.closing then return nil end
  return pool.endings:retry_delay({ attempts = attempt }, err)
end

-- The first batch: idle children may cut batches from now on (the steal),
-- and children may send their bigger DONE.
function Lines:expect()
  self.pool.batches = true
  for _, w in ipairs(self.pool.children:array()) do w:expect_batches() end
end

-- Whether `head`, a child's running job, is a batch whose lines may be cut.
function Lines:cuttable(head)
  return head.first_line and not head.lines_cut
end

-- Cuts off the lines of w's batch `head` that its child has not started:
-- how many it keeps, or nil when the child has not taken the batch yet.
function Lines:cut(w, head)
  head.lines_cut = w:batch_cut(head)
  return head.lines_cut
end

local function traceback(err)
  return debug.traceback(tostring(err), 2)
end

-- Calls the owner's hook `name` (pool.on_lines_cut, pool.on_lines_kept) as
-- a listener is called: protected, an error reported.
function Lines:call_hook(name, ...)
  local hook = self.pool[name]
  if not hook then return end
  local ok, err = xpcall(hook, traceback, ...)
  if not ok then self.pool.events:report(name, err) end
end

-- The lines cut off go back to their owner, who adds them again.
function Lines:hand_back(jobs)
  for i = 1, #jobs do self:call_hook("on_lines_cut", jobs[i], jobs[i].lines_cut) end
end

-- pool:publish_kept([min_ms]): hands what long batches of lines have finished
-- so far to pool.on_lines_kept, for each batch running for min_ms (default
-- STEAL_AFTER_MS) or more: a slow line holds up no output of the lines before
-- it, and a run stopped by a signal records them. The sweep calls it; so does
-- the command line before it kills the children.
function Lines:publish_kept(min_ms)
  local pool = self.pool
  local listener = pool.on_lines_kept
  if not (listener and pool.batches) then return end
  min_ms = min_ms or self.steal_after_ms
  local now, heads = loop.now(), {}
  for _, w in ipairs(pool.children:array()) do
    local head = w.job
    if head and head.first_line and head.started and now - head.started >= min_ms then
      heads[#heads + 1] = { head, w:batch(head) }
    end
  end
  for _, h in ipairs(heads) do -- the listener may add jobs: not while walking the workers
    local head, kept, text = h[1], h[3], h[4] -- h[2]: the lines started
    if kept and kept > 0 then self:call_hook("on_lines_kept", head, kept, text) end
  end
end

return Lines
