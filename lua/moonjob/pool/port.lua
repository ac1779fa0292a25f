-- moonjob.pool.port -- the pool as the owner of a second job source sees it.
--
-- A source whose jobs live outside the process (moonjob.redis.remote, a
-- durable queue on Redis) is given a Port, never the pool itself: these are
-- the only things it may do to the pool, and they stay off the pool object
-- a user holds. The contract, both ways, is documented in
-- moonjob.pool.source ("A second source: the owner hook").
--
-- Owns: nothing; a port's fields size, max_payload and kill_after are the
-- pool's settings, fixed when the pool is made.
-- Calls: pool.source (push, ready_count), pool.children:can_start,
-- pool.dispatch (pump, has_started),
-- pool.events:emit, pool.endings (fail, cancel, finish, leave, retry_delay,
-- retried), pool.breaker (stalled, failing), pool.deadlines:hasten_kill.
local Port = {}
Port.__index = Port

local M = {}

-- The port of `pool`; make_job() makes a waiting job of the pool, without data.
function M.new(pool, make_job)
  return setmetatable({ pool = pool, make_job = make_job, size = pool.size,
    max_payload = pool.max_payload, kill_after = pool.kill_after }, Port)
end

function Port:new_job() return self.make_job() end
function Port:accept(job) self.pool.source:push(job) end
function Port:pump() self.pool.dispatch:pump() end
function Port:emit_event(event, ...) self.pool.events:emit(event, ...) end
function Port:fail_job(job, err) self.pool.endings:fail(job, err) end
function Port:cancel_job(job, reason, code, unstarted_only)
  return self.pool.endings:cancel(job, reason, code, unstarted_only)
end
function Port:finish_job(job, state) self.pool.endings:finish(job, state) end
function Port:leave_job(job) self.pool.endings:leave(job) end
function Port:retry_delay(job, err) return self.pool.endings:retry_delay(job, err) end
function Port:note_retry(job, err, delay) self.pool.endings:retried(job, err, delay) end
function Port:has_started(job) return self.pool.dispatch:has_started(job) end
function Port:hasten_kill(job, seconds) return self.pool.deadlines:hasten_kill(job, seconds) end

-- How many more jobs the pool could start the moment they come: its
-- children that could start one now, less the jobs already waiting for
-- one (never below 0).
function Port:free()
  local pool = self.pool
  return math.max(0, pool.children:can_start() - pool.source:ready_count())
end

-- False while starts fail and no child is ready: jobs taken now would wait.
function Port:can_run() return not self.pool.breaker:stalled() end
-- The last start failure's error while starts fail (why can_run is false), else nil.
function Port:start_error() return self.pool.breaker:failing() end

return M
