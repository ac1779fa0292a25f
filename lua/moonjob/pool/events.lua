-- moonjob.pool.events -- the pool's listeners: on, off, and emitting events.
--
-- Methods mixed into the Pool class (see pool/init.lua). Every listener runs
-- protected: an error in one is reported to the `error` listeners (or, for
-- an error in an `error` listener or when there is none, written to stderr)
-- and the loop carries on. Callers test `self.listeners[event]` before
-- calling _emit on the job path, so an event nobody listens to costs no call
-- and no vararg.
--
-- Caveat: events are emitted from inside the loop; a listener must not block
-- on a job (the loop cannot run inside itself) and gets a clear error if it tries.
local Pool = {}

local EVENTS = {
  completed = true, redis = true, failed = true, progress = true, log = true, active = true,
  drained = true, error = true, exit = true, retrying = true,
}

local function traceback(err)
  return debug.traceback(tostring(err), 2)
end

function Pool:_report(event, message)
  if event ~= "error" and self.listeners.error then
    return self:_emit("error", message, event)
  end
  io.stderr:write(("moonjob: error in a '%s' listener: %s\n"):format(event, message))
end

function Pool:_emit(event, ...)
  local list = self.listeners[event]
  if not list then return end
  for i = 1, #list do
    local ok, err = xpcall(list[i], traceback, ...)
    if not ok then self:_report(event, err) end
  end
end

-- pool:on(event, fn) -> pool. Events: completed(job, result), failed(job, err),
-- progress(job, value), log(job, line, stream), active(job), drained(),
-- retrying(job, err, delay), exit(pid, exit_status, signal) when a child is
-- gone, and error(message, event) for errors raised by other listeners.
function Pool:on(event, fn)
  if not EVENTS[event] then
    error(("pool:on(): unknown event '%s' (completed, failed, progress, log, active, "
      .. "retrying, drained, exit, error)"):format(tostring(event)), 2)
  end
  if type(fn) ~= "function" then error("pool:on(): the listener must be a function", 2) end
  local list = self.listeners[event] or {}
  list[#list + 1] = fn
  self.listeners[event] = list
  return self
end

-- pool:off(event, fn) -> true if fn was listening
function Pool:off(event, fn)
  local list = self.listeners[event]
  for i = 1, list and #list or 0 do
    if list[i] == fn then
      table.remove(list, i)
      if #list == 0 then self.listeners[event] = nil end
      return true
    end
  end
  return false
end

return Pool
