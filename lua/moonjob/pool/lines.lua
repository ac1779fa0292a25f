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
-- first_line, line_count, lines_end_on_failure and lines_cut (the worker
-- sets job.batch_state at its child's exit, for the CLI).
-- Exposes: Lines.wire_first_line(job) (a plain function: the metadata the
-- child reads), lines:add_option(job, spec), lines:cuttable(head),
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
-- (negative: the batch ends at its first failure), or false for a job that
-- is not a batch.
function Lines.wire_first_line(job)
  local first = job.first_line
  if not first then return false end
  return job.lines_end_on_failure and -first or first
end

-- pool:add's `lines` option: job is a batch of lines.
function Lines:add_option(job, spec)
  job.first_line, job.line_count, job.lines_end_on_failure = spec[1], spec[2], spec[3]
  if not self.pool.batches then self:expect() end
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
