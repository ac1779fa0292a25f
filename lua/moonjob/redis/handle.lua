-- moonjob.redis.handle -- the handle of a job that q:add returns (q: a
-- queue of moonjob.redis.producer): job:wait(), job:get(), job:cancel().
--
-- A handle holds its job's id and nonce; it asks its queue, which answers
-- for that job only (the producer's header says why). job:wait() listens on
-- the queue's "done" channel, one subscription per queue object for all its
-- handles, and looks at the job once a second besides.
local core = require "moonjob.core"
local loop = require "moonjob.loop"
local queue_calls = require "moonjob.redis.queue_calls"

local M = {}
local Handle = {}
Handle.__index = Handle

-- The handle of a job moonjob_add answered { id, state, joined, nonce }.
function M.new(queue, reply)
  -- a job joined that was added before nonces existed has none: not checked
  local nonce = reply[4] ~= "" and reply[4] or nil
  return setmetatable({ id = reply[1], state = reply[2], joined = reply[3] == 1, nonce = nonce,
    queue = queue }, Handle)
end


-- Listening on the queue's "done" channel: one subscription per queue
-- object; q.waiters maps a job's id to its waiter { check = true when the
-- job is to be looked at }.
local function listen(q)
  if q.listening then return end
  q.listening = true
  q.client:subscribe(q.prefix .. "done", function(kind, id)
    if kind == "resubscribed" then
      for _, w in pairs(q.waiters) do w.check = true end
      return
    end
    local w = id and q.waiters[id]
    if w then w.check = true end
  end)
end

-- Waits until the job ended or timeout seconds (nil: no end) passed ->
-- its q:get() info | nil, err. Raises what the loop raised.
local function wait_ended(self, timeout)
  local q = self.queue
  listen(q)
  local w = q.waiters[self.id] or { check = true }
  q.waiters[self.id] = w
  local deadline = timeout and loop.now() + timeout * 1000
  local info, err
  local next_look = 0
  local ticker = core.timer(function() w.check = true end)
  ticker:start(1000, 1000)
  local ok, raised = pcall(loop.wait_until, function()
    if w.check and loop.now() >= next_look then
      w.check, next_look = false, loop.now() + 1
      info, err = q:get(self)
      if err or not info or info.state == "completed" or info.state == "failed" then return true end
    end
    return deadline ~= nil and loop.now() >= deadline
  end)
  ticker:close()
  q.waiters[self.id] = nil
  if not ok then error(raised, 0) end
  return info, err
end

-- job:wait([timeout]) -> result | nil, err (ETIMEDOUT when timeout seconds pass).
function Handle:wait(timeout)
  local info, err = wait_ended(self, timeout)
  if info then self.state = info.state end
  return queue_calls.outcome(self.queue, self.id, info, err, timeout)
end

function Handle:get() return self.queue:get(self) end
function Handle:cancel(reason) return self.queue:cancel(self, reason) end

return M
