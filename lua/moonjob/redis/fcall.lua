-- moonjob.redis.fcall -- a queue object's calls of the function library
-- (redis/functions/) and what their answers mean, in one place for the queue
-- class (moonjob.redis.producer) and the modules it calls (operate,
-- schedules, limits): a refusal as an error object, an error's JSON text,
-- "no such queue".
--
-- `q` is a queue object of moonjob.redis.producer or moonjob.producer: its
-- client (call_wait), prefix, name and counts() are what these use. Pure
-- Lua: moonjob.producer loads it on any Lua, where moonjob's exact codec
-- (LuaJIT's FFI) may not load; that codec is required only when no other is
-- given.
local errors = require "moonjob.errors"

local M = {}

-- A server refusal "EQUEUEFULL message" becomes an error table.
function M.reply_error(err)
  local code, message = tostring(err):match("^(E[A-Z]+):? (.*)$")
  if code then return errors.new(code, message) end
  return errors.new("EREDIS", tostring(err))
end

-- An error's JSON text (a job's `error` field) as an error object; codec:
-- the queue's JSON (default: moonjob's exact codec).
function M.decode_error(text, codec)
  local t = text and (codec or require("moonjob.codec.json")).decode(text)
  if type(t) ~= "table" then return errors.new("EREMOTE", tostring(text)) end
  return errors.wrap(t)
end

-- fcall.call(q, fname, numkeys, ...) -> reply | nil, err: one FCALL on the
-- queue's client, blocking the caller for its round trip.
function M.call(q, ...)
  local reply, err = q.client:call_wait({ "FCALL", ... })
  if err then return nil, M.reply_error(err) end
  return reply
end

-- ENOQUEUE: the queue has no key at all and is not registered.
function M.no_queue(q)
  return errors.new("ENOQUEUE", ("no queue '%s' on this server: nothing was ever added to it "
    .. "(moonjob queues lists the queues)"):format(q.name))
end

-- An error for a queue that does not exist, else the one given (err may
-- be nil: nil when the queue is there). A queue whose counts cannot be
-- read is taken as there.
function M.no_queue_or(q, err)
  local c = q:counts()
  if c and not c.exists then return M.no_queue(q) end
  return err
end

return M
