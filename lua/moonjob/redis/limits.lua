-- moonjob.redis.limits -- how fast and how many jobs of a durable queue run,
-- across every worker on every host: the methods q:set_rate,
-- q:set_concurrency and q:limits of `moonjob.queue(url, name)`.
--
--   q:set_rate({ max = 100, per = 1 })   -- at most 100 jobs start in any second
--   q:set_concurrency(5)                 -- at most 5 run at once, all hosts together
--   q:set_rate(nil); q:set_concurrency(nil)   -- no limit again
--
-- Redis keeps the limits and fetch applies them with the server's clock
-- (functions.lua, "limits"): the rate is a sliding window over the times
-- jobs were handed out, exact for any window; the concurrency counts the
-- queue's active jobs (held ahead by a worker, or running). Under a rate a
-- worker takes no job beyond its idle children, so a job starts within
-- milliseconds of being counted (and each start costs a round trip).
-- A processor that meets the remote side's own limit raises
-- error({ code = "ERATELIMIT", retry_after = s }): its job waits again
-- without costing an attempt, and the queue holds back for s seconds.
local M = {}

local function check_rate(rate)
  if rate == nil or rate == false then return 0, 1 end
  local ok = type(rate) == "table" and type(rate.max) == "number" and rate.max >= 1 and rate.max % 1 == 0
    and rate.max <= 2 ^ 31 and type(rate.per) == "number" and rate.per >= 0.001 and rate.per <= 1e9
  if ok then
    for k in pairs(rate) do if k ~= "max" and k ~= "per" then ok = false end end
  end
  if not ok then
    error(("queue:set_rate(): takes { max = N (a whole number, 1 or more), per = S (seconds, 0.001 or more) }"
      .. " or nil (no limit), not %s"):format(type(rate) == "table" and "that table" or tostring(rate)), 3)
  end
  return rate.max, math.floor(rate.per * 1000 + 0.5)
end

function M.extend(Queue)
  -- q:set_rate({ max, per } | nil) -> true | nil, err: at most max jobs
  -- start in any `per` seconds, on all workers together; nil: no limit.
  function Queue:set_rate(rate)
    local max, per_ms = check_rate(rate)
    local ok, err = self:_call("moonjob_limit", 1, self.prefix, "rate", max, per_ms)
    if not ok then return nil, err end
    return true
  end

  -- q:set_concurrency(n | nil) -> true | nil, err: at most n jobs of the
  -- queue active at once (held by a worker or running), on all workers.
  function Queue:set_concurrency(n)
    if n ~= nil and n ~= false and (type(n) ~= "number" or n < 1 or n % 1 ~= 0 or n > 2 ^ 31) then
      error(("queue:set_concurrency(): takes a whole number, 1 or more, or nil (no limit), not %s")
        :format(tostring(n)), 2)
    end
    local ok, err = self:_call("moonjob_limit", 1, self.prefix, "concurrency", n or 0)
    if not ok then return nil, err end
    return true
  end

  -- q:limits() -> { rate = { max, per } | nil, concurrency = n | nil,
  -- held_back = s (an ERATELIMIT hold left, 0 none), started = jobs handed
  -- out in the rate's current window, active = jobs active } | nil, err.
  function Queue:limits()
    local r, err = self:_call("moonjob_limits", 1, self.prefix)
    if not r then return nil, err end
    return { rate = r[1] > 0 and { max = r[1], per = r[2] / 1000 } or nil,
      concurrency = r[3] > 0 and r[3] or nil, held_back = r[4] / 1000, started = r[5], active = r[6] }
  end
end

return M
