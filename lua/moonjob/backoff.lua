-- moonjob.backoff -- how long a failed job waits before its next attempt.
--
-- A backoff is { type = "fixed" | "exponential", delay = seconds, jitter = 0..1 }
-- or a function(attempt, err) -> seconds | false (false or nil: do not retry;
-- a negative or non-numeric delay waits 0).
-- "exponential" waits delay * 2^(attempt - 1) after attempt `attempt`;
-- jitter j takes a random share of up to j off each wait, so that jobs that
-- failed together do not all come back at the same moment.
local M = {}

local TYPES = { fixed = true, exponential = true }

-- backoff.check(value) -> true | false, why
function M.check(b)
  if type(b) == "function" then return true end
  if type(b) ~= "table" then return false, "must be a table or a function" end
  if not TYPES[b.type] then return false, "needs type = \"fixed\" or \"exponential\"" end
  if type(b.delay) ~= "number" or not (b.delay >= 0) then
    return false, "needs delay = a number of seconds"
  end
  if b.jitter ~= nil and not (type(b.jitter) == "number" and b.jitter >= 0 and b.jitter <= 1) then
    return false, "jitter must be between 0 and 1"
  end
  return true
end

-- backoff.delay(b, attempt, err) -> seconds | false, the wait after attempt
-- `attempt` failed with err. No backoff: 0.
function M.delay(b, attempt, err)
  if b == nil then return 0 end
  if type(b) == "function" then
    local d = b(attempt, err)
    if d == false or d == nil then return false end
    return math.max(0, tonumber(d) or 0)
  end
  local d = b.delay
  if b.type == "exponential" then d = d * 2 ^ (attempt - 1) end
  if b.jitter then d = d * (1 - b.jitter * math.random()) end
  return d
end

return M
