-- moonjob.producer.link -- a pure-Lua producer's calls on its Redis client
-- (an adapter of moonjob.producer.clients), with the function library made
-- sure of as moonjob's C-core producer makes sure of it:
--
--   * before the first call to a server in this Lua VM (each nginx worker
--     is one), moonjob.redis.setup's ensure_library runs on the client: the
--     library loaded when none is, an older one or ours in another text
--     replaced, a newer one kept (used while it serves this version, else
--     refused), under the same WATCH guard. The link is that module's
--     connection (command(args, cb)), each command answered before the next
--     is sent: the same decisions, from the same code;
--   * a call refused with "Function not found" (FUNCTION FLUSH, a restart
--     that lost the library) never ran: the library is made sure of again
--     and the call sent again, once.
--
-- call_wait(argv) -> reply | nil, err, where err is text as the C-core
-- client gives it ("EQUEUEFULL ...", "ECONNECT: ..."), made an error object
-- by moonjob.redis.fcall.reply_error: so the queue modules shared with
-- moonjob.queue (fcall, queue_calls, schedules) take a link as their client.
local setup = require "moonjob.redis.setup"

local M = {}
local Link = {}
Link.__index = Link

-- The servers whose library was found fit in this Lua VM: key -> true.
local settled = {}

-- A link on adapter a. key: the server's name for the check above (its
-- address, or the app's name for the server of a client it gave); name: how
-- errors name it; db: the database the client is on (the guard's SELECT).
function M.new(a, key, name, db)
  return setmetatable({ adapter = a, key = key, name = name, target = { db = db } }, Link)
end

-- A Redis Cluster node's redirection (MOVED, ASK): the producer talks to
-- one server and follows none -> the error that says so | e as it is.
local function unfollowed(e)
  if type(e) == "string" and (e:match("^MOVED %d+ ") or e:match("^ASK %d+ ")) then
    return ("moonjob.producer talks to one server and does not follow Redis Cluster redirections (%s):"
      .. " use moonjob.queue with a redis+cluster:// URL"):format(e)
  end
  return e
end

-- moonjob.redis.setup's connection: cb gets the reply before this returns.
function Link:command(args, cb)
  local v, e, kind = self.adapter:call(args)
  cb(v, unfollowed(e), kind)
  return true
end

function Link:_lost(why)
  return ("ECONNECT: %s: %s"):format(self.name, tostring(why))
end

-- The library made sure of, once per server in this VM -> true | nil, err.
function Link:settle()
  if settled[self.key] then return true end
  local why, kind
  setup.ensure_library(self, self.target, function(e, k) why, kind = e, k end)
  if why then return nil, kind == "connection" and self:_lost(why) or why end
  settled[self.key] = true
  return true
end

-- The library is gone ("Function not found"): made sure of again.
function Link:resettle()
  settled[self.key] = nil
  return self:settle()
end

-- One call -> reply | nil, err (text) [, unsent: true when the call was
-- not sent (the library could not be made sure of)].
function Link:call_wait(argv)
  local ok, err = self:settle()
  if not ok then return nil, err, true end
  local v, e, kind = self.adapter:call(argv)
  if kind == "reply" and setup.function_missing(e) then
    ok, err = self:resettle()
    if not ok then return nil, err end
    v, e, kind = self.adapter:call(argv)
  end
  if kind == "connection" then return nil, self:_lost(e) end
  return v, unfollowed(e)
end

-- The calls of list sent at once (a pipeline where the client has one) ->
-- { { reply, err }, ... } | nil, err (the link failed: which ran is unknown)
-- [, unsent: true when none was sent].
function Link:pipeline(list)
  local ok, err = self:settle()
  if not ok then return nil, err, true end
  local got
  got, err = self.adapter:pipeline(list)
  if not got then return nil, self:_lost(err) end
  local again, at = {}, {}
  for i, r in ipairs(got) do
    r[2] = unfollowed(r[2])
    if r[3] == "reply" and setup.function_missing(r[2]) then again[#again + 1], at[#at + 1] = list[i], i end
  end
  if #again == 0 then return got end
  ok, err = self:resettle()
  if not ok then return nil, err end
  local more
  more, err = self.adapter:pipeline(again)
  if not more then return nil, self:_lost(err) end
  for j, r in ipairs(more) do got[at[j]] = r end
  return got
end

return M
