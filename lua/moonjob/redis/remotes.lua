-- moonjob.redis.remotes -- one pool serving several durable queues: the
-- owner of a pool given { redis = url, queue = { "a", "b", ... } }
-- (`moonjob worker --queue a,b`).
--
-- Composition, no new policy of fetching: one moonjob.redis.remote per
-- queue, each with its own connection, worker id, leases and reports, all
-- on the pool's one port. Each job keeps the remote that fetched it
-- (job.owner), so the pool tells its start, progress, output and end to
-- that queue alone; only the pool's own calls (want, stop, close, stats)
-- come here, and go to every remote.
--
-- Fairness: each remote holds at most what a worker on its queue alone
-- would (the pool's size plus its prefetch, or the adaptive bound), so a
-- busy queue cannot take the room of the others; when the pool has room,
-- the queues are asked in turn, starting one further each time; and the
-- pool starts the jobs it holds in the order they were fetched (one
-- priority: a fetched job's priority is its queue's business). A queue
-- with jobs waiting therefore waits at most behind what the others hold
-- (a fetch each), never behind their whole backlog.
local Remote = require "moonjob.redis.remote"

local Remotes = {}
Remotes.__index = Remotes

local M = {}

-- The pool's port as the remote of queue `name` sees it: the same, but
-- its `redis` events name the queue (a fifth argument: "connected", a
-- refusal, a pause are one queue's).
function M.named_port(port, name)
  local named = setmetatable({}, { __index = port })
  function named.emit_event(_, event, kind, why, id)
    if event == "redis" then return port:emit_event(event, kind, why, id, name) end
    return port:emit_event(event, kind, why, id)
  end
  return named
end

-- Remotes.new(port, opts) -> the owner: opts as Remote.new's, opts.queue a
-- list of names (moonjob.pool.options checked them).
function M.new(port, opts)
  local list = {}
  for i, name in ipairs(opts.queue) do
    local one = {}
    for k, v in pairs(opts) do one[k] = v end
    one.queue, one.serving = name, opts.queue -- (serving: what each queue's heartbeat names)
    list[i] = Remote.new(M.named_port(port, name), one)
  end
  return setmetatable({ remotes = list, first = 1 }, Remotes)
end

-- The pool pumped: each queue may fetch, in turn, from one further than
-- last time.
function Remotes:want()
  local list, n = self.remotes, #self.remotes
  local first = self.first
  self.first = first % n + 1
  for k = 0, n - 1 do list[(first + k - 1) % n + 1]:want() end
end

function Remotes:stop()
  for _, r in ipairs(self.remotes) do r:stop() end
end

-- Closes every remote (each waits, bounded, for its last reports); the
-- first error is raised once all were closed.
function Remotes:close()
  local failed
  for _, r in ipairs(self.remotes) do
    local ok, err = pcall(r.close, r)
    if not ok then failed = failed or err end
  end
  if failed then error(failed, 0) end
end

-- The counts of every queue added up (pool:stats().redis), and each
-- queue's own in .queues[name].
function Remotes:stats()
  local total, per = { queues = {} }, nil
  for _, r in ipairs(self.remotes) do
    per = r:stats()
    total.queues[r.name] = per
    for k, v in pairs(per) do
      if type(v) == "number" then total[k] = (total[k] or 0) + v end
    end
  end
  return total
end

return M
