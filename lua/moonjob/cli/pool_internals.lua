-- moonjob.cli.pool_internals -- the command line's only calls into the
-- pool beyond its documented API, in one place.
--
-- `moonjob run` needs three things a library user's pool does not offer by
-- name: the lines a running batch finished (to record them before a stop
-- kills it), a cancel that leaves a job a child started alone (--halt
-- soon), and the two batch hooks (lines handed back, lines finished).
--
-- Caveat: these are the pool's private names today; when the pool documents
-- them, only this file changes.
local M = {}

-- Hands what every running batch finished to the lines-kept hook now.
function M.publish_kept(pool)
  return pcall(pool._publish_kept, pool, 0)
end

-- Cancels `job` with `reason` unless a child started it: true when it did.
function M.cancel_unstarted(pool, job, reason)
  return pool:_cancel(job, reason, nil, true)
end

-- The batch hooks: cut(job, kept) when an idle child takes the lines after
-- `kept` that a slow line held up; kept(job, kept, text) when a running
-- batch finished its first `kept` lines, with their result lines `text`.
function M.on_lines(pool, cut, kept)
  pool.on_lines_cut = cut
  pool.on_lines_kept = kept
end

return M
