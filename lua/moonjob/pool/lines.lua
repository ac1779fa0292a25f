-- moonjob.pool.lines -- the pool's side of batches of lines (moonjob.cli).
--
-- A part of the pool (see pool/init.lua), pool.lines: the one place the
-- command line (moonjob.cli), the only owner of batches, reaches besides the
-- public API. It hands tiny NDJSON lines to the children in batches: one pool
-- job holds many lines (pool:add's internal `lines` option: { first line's
-- number, number of lines [, end_on_failure] }), which the child runs one by
-- one (child/batch.lua), keeping each line's result in the area it shares
-- with the parent (core/frame.h). Everything the pool does for batches is
-- here; the rest of the pool sees only pool.batches (set once the first batch
-- is added: the depth keeps two jobs per child, the children allow the bigger
-- DONE, the steal and the sweep look at batches) and pool.tagged_output.
--
-- The hooks, set by the owner of batches in one call (none set: nothing is
-- handed over; a later call replaces them all):
--
--   pool.lines:set_hooks{ cut = fn, kept = fn, output = fn }
--     cut(job, lines_kept)
--       An idle child found nothing to run while batch `job` has run for
--       STEAL_AFTER_MS (moonjob.pool.dispatch): its lines not started were
--       cut off, its first `lines_kept` lines excepted (the child starts no
--       more of them). The owner adds the lines after those again.
--     kept(job, lines_kept, kept_text)
--       Batch `job`, running, has finished its first `lines_kept` lines,
--       whose result lines are kept_text: the owner prints them now, so that
--       a slow line holds up no output of the lines before it. Called by the
--       sweep for batches running for STEAL_AFTER_MS or more, and by
--       lines:publish_kept(min_ms).
--     output(text, job)
--       `text` is whole lines (each ending in "\n") batch `job`'s child
--       wrote, passed on as the child tagged them (moonjob.pool.child_output:
--       while it is set, pool.tagged_output is true and batches' output is
--       not cut into lines): lines the child tagged begin with "[line N] ",
--       others (a command's output, a write(2)) are for the owner to tag.
--
-- Each is called as the pool's listeners are (moonjob.pool.events): an
-- error in one is reported (the `error` listeners, or stderr, with the
-- event "on_lines_cut", "on_lines_kept" or "echo") and the pool carries on;
-- it never escapes into the dispatch, the sweep or the child's output.
--
-- The owner's other calls: lines:publish_kept([min_ms]) (before a stop),
-- lines:retry_delay(attempt, err) (a failed line runs again alone) and
-- lines:cancel_unstarted(job [, reason]) (--halt soon).
--
-- Owns: the hooks, pool.batches and pool.tagged_output (written only here)
-- and, on each batch job, first_line, line_count, lines_end_on_failure,
-- line_timeout and lines_cut (the child sets job.batch_state at its exit,
-- for the CLI; so do the deadlines when they kill it).
--
-- Deadlines: a batch job's timeout is each of its lines' (line_timeout, in
-- its metadata): the child enforces each line's soft deadline itself and
-- goes on with the next line (child/batch.lua); the parent keeps the hard
-- one, timeout + kill_after from the start of the line running, read in the
-- shared page when the job's timer fires (line_overdue, called by
-- moonjob.pool.deadlines). A batch job itself is never retried: the owner
-- runs a failed line again alone (lines:retry_delay).
-- Exposes: Lines.wire_first_line(job) (a plain function: the metadata the
-- child reads), lines:add_option(job, spec), lines:line_overdue(child, job),
-- lines:cuttable(head), lines:cut(child, head), lines:hand_back(jobs),
-- lines:output(text, job) (the sink's lines), and the owner's
-- calls above.
-- Calls: pool.children:array(), pool.endings (retry_delay, cancel),
-- pool.events:report (a hook's error), and on children expect_batches,
-- batch_cut and batch (moonjob.pool.child).
local loop = require "moonjob.loop"

local Lines = {}
Lines.__index = Lines

-- Lines.new(pool, steal_after_ms) -> the pool's lines; steal_after_ms is
-- dispatch's STEAL_AFTER_MS, the age from which a batch is published.
function Lines.new(pool, steal_after_ms)
  pool.tagged_output = false
  return setmetatable({ pool = pool, steal_after_ms = steal_after_ms, hooks = {} }, Lines)
end

-- The event each hook's error is reported with (see the top of this file).
local HOOK_EVENT = { cut = "on_lines_cut", kept = "on_lines_kept", output = "echo" }

-- lines:set_hooks{ cut = fn, kept = fn, output = fn }: the owner's hooks
-- (see the top of this file); any may be left out.
function Lines:set_hooks(hooks)
  for name, fn in pairs(hooks) do
    local why = not HOOK_EVENT[name] and "is not cut, kept or output"
      or type(fn) ~= "function" and "is not a function"
    if why then error(("lines:set_hooks(): hook '%s' %s"):format(tostring(name), why), 2) end
  end
  self.hooks = { cut = hooks.cut, kept = hooks.kept, output = hooks.output }
  self.pool.tagged_output = hooks.output ~= nil
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

-- The hard deadline of batch `job`, which `child` runs: the job's
-- timeout timer (moonjob.pool.deadlines) calls this instead of interrupting
-- the batch, since each line's soft deadline is the child's own. The line
-- running started `line_ms` ago (the shared page, core/frame.h): once it has
-- run timeout + kill_after, true (the child is killed for it); else false
-- and the seconds until that line's hard deadline.
function Lines:line_overdue(child, job)
  local pool = self.pool
  local timeout = job.line_timeout -- (set by add_option: the timer fires only when there is one)
  local hard_ms = (timeout + (job.kill_after or pool.kill_after)) * 1000
  local started, _, _, line_ms = child:batch(job)
  if not (started and started > 0 and line_ms) then return false, timeout end -- not (or no longer) running it
  if line_ms >= hard_ms then return true end
  return false, (hard_ms - line_ms) / 1000
end

-- lines:retry_delay(attempt, err): the seconds before a line of a batch
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
  for _, child in ipairs(self.pool.children:array()) do child:expect_batches() end
end

-- Whether `head`, a child's running job, is a batch whose lines may be cut.
function Lines:cuttable(head)
  return head.first_line and not head.lines_cut
end

-- Cuts off the lines of batch `head` that `child` has not started:
-- how many it keeps, or nil when the child has not taken the batch yet.
function Lines:cut(child, head)
  head.lines_cut = child:batch_cut(head)
  return head.lines_cut
end

local function traceback(err)
  return debug.traceback(tostring(err), 2)
end

-- Calls the owner's hook `name` (cut, kept, output) as a listener is
-- called: protected, an error reported.
function Lines:call_hook(name, ...)
  local hook = self.hooks[name]
  if not hook then return end
  local ok, err = xpcall(hook, traceback, ...)
  if not ok then self.pool.events:report(HOOK_EVENT[name], err) end
end

-- The lines cut off go back to their owner, who adds them again.
function Lines:hand_back(jobs)
  for i = 1, #jobs do self:call_hook("cut", jobs[i], jobs[i].lines_cut) end
end

-- Whole lines `text` batch `job`'s child wrote (the sink's lines)
-- go to the owner's output hook.
function Lines:output(text, job)
  self:call_hook("output", text, job)
end

-- lines:publish_kept([min_ms]): hands what long batches of lines have finished
-- so far to the kept hook, for each batch running for min_ms (default
-- STEAL_AFTER_MS) or more: a slow line holds up no output of the lines before
-- it, and a run stopped by a signal records them. The sweep calls it; so does
-- the command line before it kills the children.
function Lines:publish_kept(min_ms)
  local pool = self.pool
  if not (self.hooks.kept and pool.batches) then return end
  min_ms = min_ms or self.steal_after_ms
  local now, heads = loop.now(), {}
  for _, child in ipairs(pool.children:array()) do
    local head = child.job
    if head and head.first_line and head.started and now - head.started >= min_ms then
      heads[#heads + 1] = { head, child:batch(head) }
    end
  end
  for _, h in ipairs(heads) do -- the hook may add jobs: not while walking the children
    local head, kept, text = h[1], h[3], h[4] -- h[2]: the lines started
    if kept and kept > 0 then self:call_hook("kept", head, kept, text) end
  end
end

-- lines:cancel_unstarted(job [, reason]) -> true when canceled: a job no
-- child has started yet ends as a cancel does; one a child started is left
-- to run (false). The command line's --halt soon.
function Lines:cancel_unstarted(job, reason)
  return self.pool.endings:cancel(job, reason, nil, true)
end

return Lines
