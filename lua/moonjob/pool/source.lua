-- moonjob.pool.source -- the job source: where the pool keeps its waiting jobs.
--
-- The pool reaches its waiting jobs only through pool.source, an object with
-- the eight methods below and, for a source that keeps something of a job
-- it handed out, a ninth, release; nothing else in the pool knows how or
-- where jobs wait. The source is the local one, a Waiting
-- (moonjob.pool.waiting: a queue and heaps in this process), or, for a pool
-- with rate limits or groups, a moonjob.pool.limits around one. A pool on
-- Redis keeps it: its moonjob.redis.remote fetches jobs from the durable
-- queue in batches and pushes them here (a bounded buffer: `size` +
-- `prefetch` jobs), so dispatch, priorities among fetched jobs,
-- give-backs and cancel work the same for both; Redis is asked only when
-- there is room, never inside pop_ready (which must answer at once).
-- Calls: nothing (a plain constructor and the interface's documentation).
--
--   source:push(job)      a job joins the waiting jobs: a new one (pool:add), a
--                         retry (job.run_at, loop.now() ms, lies ahead), a job
--                         given back because no child took it (it keeps its id,
--                         so it goes ahead of the jobs added after it at its
--                         priority), or one the breaker put back
--   source:pop_ready()    -> the next job that may run now, or nil: lowest
--                         job.priority first (default 0), then lowest id; delayed
--                         jobs whose run_at has passed count as ready
--   source:peek_ready()   -> the job pop_ready would return, left waiting, or
--                         nil (the pool compares its priority with the jobs
--                         sent ahead to busy children)
--   source:pop_any()      -> any waiting job, due or not, or nil (close and
--                         cancel_all empty the source with it)
--   source:remove(job)    -> true if the job was waiting here and is now out,
--                         false otherwise (a waiting job canceled)
--   source:count()        -> how many jobs wait, due or not (max_queue, drain,
--                         stats, the pool's idleness)
--   source:ready_count()  -> how many may run now (how many children to keep,
--                         the breaker)
--   source:next_due()     -> the run_at (loop.now() ms) of the earliest job not
--                         yet due, or nil (the pool arms a timer for it)
--   source:release(job)   (optional) a job pop_ready handed out ended: what
--                         the source kept for it is freed (a group's place,
--                         moonjob.pool.limits). The pool calls it only for a
--                         job whose job.holds_group the source set, so a
--                         source that never sets it needs no release
--
-- What a source must hold to: every method answers at once, on the loop (none
-- may wait, nor run the loop), and cheaply: pop_ready runs once per dispatch
-- and count inside drain()'s predicate on every loop turn. A popped job is the
-- pool's until it is pushed again or ends: the pool dispatches it, ends it or
-- pushes it back before any listener can run (a listener's cancel looks for a
-- waiting job only in the source). Jobs are the pool's moonjob.job objects;
-- the local source keeps each one's place in job.qindex, which no other code
-- may touch.
--
-- A second source: the owner hook. A source whose jobs live outside the
-- process (moonjob.redis.remote, a durable queue on Redis; a queue in
-- Postgres would be another) is the pool's `owner` (pool.owner, set by
-- Pool.new; nil for a pool with only local jobs). It brings jobs into the
-- pool's local source and hears how each ends, through these and nothing else.
--
-- What the pool calls on its owner:
--   owner:want()                the pool pumped: fetch more if there is room
--                               (called after every pump, so cheap when not)
--   owner:attempt_failed(job, err)
--                               an attempt of one of its jobs failed: the
--                               owner decides (retry elsewhere, fail for good)
--                               with the pool methods below; the pool does
--                               not retry it itself
--   owner:ending(job, state)    -> true when the job leaves the pool instead
--                               of ending ("left": given back, abandoned);
--                               called first by every ending ("completed" or
--                               "failed") of one of its jobs, to report it
--   owner:stop()                the pool is closing: fetch no more
--   owner:close()               the pool closed: flush and close (may run the
--                               loop, bounded)
--   owner:stats()               -> a table of its own counts (pool:stats().redis)
--   owner:started(job)          a child started one of its jobs
--   owner:progress(job, bytes)  (optional) a running job reported progress
--                               (the encoded value)
--   owner:output(job, stream, line)
--                               (optional) a line its job printed or logged
--   owner:late(job)             (for an owner that sets job.start_by) a job
--                               found ready past its start_by, never sent:
--                               the owner takes it back (port:cancel_job)
--
-- What an owner calls on its port (moonjob.pool.port: Pool.new hands the
-- owner a port, never the pool, so none of this is on the pool users hold):
--   port:new_job()              -> a waiting job without data; the owner sets
--                               job.owner = itself, job.data_bytes (the pool's
--                               codec), and any of name, timeout, kill_after,
--                               attempts, max_attempts, backoff
--   port:accept(job)            the job joins the waiting jobs (no pump)
--   port:pump()                 dispatch what can run now
--   port:fail_job(job, err)     an attempt failed without running (bad input)
--   port:cancel_job(job, reason [, code [, unstarted_only]])
--                               stop it: waiting, it ends now; running, it is
--                               interrupted (code: ECANCELED, or the owner's
--                               own, like ELEASE or ELOST); unstarted_only:
--                               only if no child started it (-> false if one did)
--   port:hasten_kill(job, s)    -> true if the job was running and already
--                               interrupted: its hard kill comes in s seconds
--   port:has_started(job)       -> whether a child started it
--   port:free()                 -> how many more jobs the pool could start the
--                               moment they come (children idle or not yet
--                               started, less the jobs waiting for one; not
--                               the children still loading)
--   port:can_run()              -> false while starts fail and no child is
--                               ready (take no jobs: they would only wait)
--   port:start_error()          -> why (the start error) while can_run is false
--   port:retry_delay(job, err)  -> seconds before another attempt, or nil
--   port:note_retry(job, err, delay)
--                               count the retry, tell `retrying` listeners
--   port:finish_job(job, state) end it here (after attempt_failed decides)
--   port:leave_job(job)         it leaves the pool without ending here
--   port:emit_event(event, ...) the pool's listeners (the `redis` event)
-- and reads port.size, port.max_payload and port.kill_after.
-- The fields of an owner's job the pool reads: job.owner, and job.remote_id,
-- the job's id in its source, which the child sees as job.id (the pool's own
-- number when unset). When the pool closes, a child holding an owner's job is
-- SIGKILLed at once rather than after SIGTERM's grace: the job goes back to
-- its source, where another host may start it right away. An owner also
-- keeps its own fields on its jobs (moonjob.redis.remote: token, lease_from,
-- abandoned, reported, retry_never). One more the pool reads: job.start_by
-- (loop.now() ms), set by an owner whose job must start by then (a Redis
-- rate counts it as started then): such a job is sent only to an idle child,
-- never prefetched behind a busy one, and found ready later it goes to
-- owner:late instead.

local Options = require "moonjob.pool.options"
local Waiting = require "moonjob.pool.waiting"

local Source = {}

-- The local source's methods are Waiting's own functions under the
-- interface's names, not calls forwarding to them (the pump takes every job
-- through pop_ready); promote is Waiting's helper that pop and ready_n call.
-- It sets no job.holds_group: no release.
local Local = {
  push = Waiting.push,
  pop_ready = Waiting.pop,
  peek_ready = Waiting.peek,
  pop_any = Waiting.pop_any,
  remove = Waiting.remove,
  ready_count = Waiting.ready_n,
  next_due = Waiting.next_due,
  promote = Waiting.promote,
}
Local.__index = Local

function Local:count()
  return self.n
end

-- Source.new_local(now [, opts]) -> the local source; now() -> milliseconds
-- (loop.now), the clock that decides which delayed jobs are due. With the
-- pool's options `opts` holding a rate, group_concurrency or group_rate, the source is
-- a moonjob.pool.limits (loaded only then) around the same queue.
function Source.new_local(now, opts)
  if opts and Options.limited(opts) then
    return require("moonjob.pool.limits").new(now, opts)
  end
  return setmetatable(Waiting.new(now), Local)
end

return Source
