-- moonjob.pool.events -- the pool's listeners: on, off, and emitting events.
--
-- A part of the pool (see pool/init.lua), pool.events. Every listener runs
-- protected: an error in one is reported to the `error` listeners (or, for
-- an error in an `error` listener or when there is none, written to stderr)
-- and the loop carries on.
--
-- Owns: events.listeners (event -> list of functions). The table is made
-- once and never replaced, so the other parts keep it as their own
-- `listeners` field and test `listeners[event]` before calling emit on the
-- job path: an event nobody listens to costs no call and no vararg.
-- Exposes: events:on(event, fn), events:off(event, fn) (pool:on and pool:off),
-- events:emit(event, ...), events:internal_error(message).
-- Calls: nothing (no other part).
--
-- Caveat: events are emitted from inside the loop; a listener must not block
-- on a job (the loop cannot run inside itself) and gets a clear error if it tries.
local Events = {}
Events.__index = Events

local EVENTS = {
  completed = true, redis = true, failed = true, progress = true, log = true, active = true,
  drained = true, error = true, exit = true, retrying = true,
}

local function traceback(err)
  return debug.traceback(tostring(err), 2)
end

-- Events.new() -> the events of one pool, no listener yet.
function Events.new()
  return setmetatable({ listeners = {} }, Events)
end

function Events:report(event, message)
  if event ~= "error" and self.listeners.error then
    return self:emit("error", message, event)
  end
  io.stderr:write(("moonjob: error in a '%s' listener: %s\n"):format(event, message))
end

-- An error of moonjob's own, caught where a child's report was handled
-- (pool.sink:fault): told to the `error` listeners as (message,
-- "internal"), else written to stderr.
function Events:internal_error(message)
  if self.listeners.error then return self:emit("error", message, "internal") end
  io.stderr:write(("moonjob: internal error (please report it): %s\n"):format(tostring(message)))
end

-- events:emit(event, ...): calls event's listeners, in the order added.
function Events:emit(event, ...)
  local list = self.listeners[event]
  if not list then return end
  for i = 1, #list do
    local ok, err = xpcall(list[i], traceback, ...)
    if not ok then self:report(event, err) end
  end
end

-- pool:on(event, fn) -> pool. Events: completed(job, result), failed(job, err),
-- progress(job, value), log(job, line, stream), active(job), drained(),
-- retrying(job, err, delay), exit(pid, exit_status, signal) when a child is
-- gone, redis(what, why) for a pool on Redis, and error(message, event) for
-- errors raised by other listeners. The level counts pool:on's own call.
function Events:on(event, fn)
  if not EVENTS[event] then
    error(("pool:on(): unknown event '%s' (completed, failed, progress, log, active, "
      .. "retrying, drained, exit, error)"):format(tostring(event)), 3)
  end
  if type(fn) ~= "function" then error("pool:on(): the listener must be a function", 3) end
  local list = self.listeners[event] or {}
  list[#list + 1] = fn
  self.listeners[event] = list
end

-- pool:off(event, fn) -> true if fn was listening
function Events:off(event, fn)
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

return Events
