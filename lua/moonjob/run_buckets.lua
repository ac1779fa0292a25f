-- moonjob.run_buckets -- the one set of run-time histogram buckets: a
-- pool's (pool:metrics(), a worker's /metrics), a queue's in Redis
-- (q:metrics(), the dashboard and its /metrics). Prometheus can sum them:
-- every /metrics writes the same `le`s.
--
-- The bounds (moonjob.redis.names.RUN_BOUNDS_MS): 8 per power of two from
-- 1 ms to 2^20 ms (17.5 min). Bucket 1 holds runs of 1 ms or less, bucket i
-- (2 .. 161) runs above bound i - 1 up to bound i, bucket 162 runs above the
-- last bound.
--
-- A quantile is read as the geometric middle of the bucket its rank falls
-- in: the true value (the run at that rank) is in the bucket, so the
-- estimate is off by at most the square root of the bucket's width,
-- ERROR (4.45%: the widest bucket, rounding of the bounds included). In the
-- first and last bucket there is no middle: the estimate is the bound,
-- with `bound` "below" (1 ms or less) or "above" (more than 17.5 min).
local names = require "moonjob.redis.names"

local M = {}

local BOUNDS_MS = names.RUN_BOUNDS_MS
local NBOUNDS = #BOUNDS_MS
local LOG_STEP = names.RUN_BUCKETS_PER_DOUBLING / math.log(2)

M.BOUNDS_MS = BOUNDS_MS
M.COUNT = NBOUNDS + 1 -- buckets: one more than bounds

-- The bounds in seconds, for Prometheus' `le` (each a short decimal).
M.BOUNDS_SECONDS = {}
for i, ms in ipairs(BOUNDS_MS) do M.BOUNDS_SECONDS[i] = ms / 1000 end

-- The worst error of an estimate inside the bounds: sqrt of the widest
-- bucket's ratio, less one.
local widest = 1
for i = 2, NBOUNDS do widest = math.max(widest, BOUNDS_MS[i] / BOUNDS_MS[i - 1]) end
M.ERROR = math.sqrt(widest) - 1

-- run_buckets.bucket(ms) -> the bucket of a run of ms: a guess from the
-- logarithm set right against the table (the bounds are rounded): O(1),
-- for every job.
function M.bucket(ms)
  if not (ms > 1) then return 1 end -- (NaN too: never a reason to raise)
  if ms > BOUNDS_MS[NBOUNDS] then return NBOUNDS + 1 end
  local i = math.ceil(math.log(ms) * LOG_STEP) + 1
  if i < 2 then i = 2 elseif i > NBOUNDS then i = NBOUNDS end
  while ms > BOUNDS_MS[i] do i = i + 1 end
  while ms <= BOUNDS_MS[i - 1] do i = i - 1 end
  return i
end

-- run_buckets.estimate(i) -> ms, bound: what a quantile in bucket i reads
-- as (bound: nil, "below" or "above").
function M.estimate(i)
  if i <= 1 then return BOUNDS_MS[1], "below" end
  if i > NBOUNDS then return BOUNDS_MS[NBOUNDS], "above" end
  return math.sqrt(BOUNDS_MS[i - 1] * BOUNDS_MS[i])
end

-- run_buckets.quantile(counts, n, q) -> ms, bound | nil: the q-th quantile
-- (0 < q <= 1) of n runs counted per bucket (counts[i], nil for none: a
-- sparse table does). nil without runs.
function M.quantile(counts, n, q)
  if not (n and n > 0) then return nil end
  local want, seen = q * n, 0
  for i = 1, NBOUNDS + 1 do
    local c = counts[i]
    if c and c > 0 then
      seen = seen + c
      if seen >= want then return M.estimate(i) end
    end
  end
  return nil
end

return M
