-- part: metrics.lua
-- Run-time metrics, kept by the calls that end jobs: per minute (<p>m:<minute
-- number>, a hash kept METRICS_TTL seconds) and since ever (<p>m:all). Fields:
-- c (completed), f (failed), n (runs with a run time), s (their run ms
-- summed), h1..h15 (runs per bucket: run ms <= RUN_BUCKETS[i]; h15 above the last).
-- moonjob_metrics reads them.

do
local now_ms, check_numbers = H.now_ms, H.check_numbers

local RUN_BUCKETS = { 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 300000 }
local METRICS_TTL = 90000 -- 25 hours: the last day, whole

-- Each bucket's field (h1..h15), named once: a number in a string costs
-- Redis's Lua a format.
local BUCKET_FIELDS = {}
for i = 1, #RUN_BUCKETS + 1 do BUCKET_FIELDS[i] = "h" .. i end

local function run_bucket(ms)
  for i = 1, #RUN_BUCKETS do
    if ms <= RUN_BUCKETS[i] then return i end
  end
  return #RUN_BUCKETS + 1
end

-- completed, failed: jobs that ended so; runs: the run ms of those that ran
-- (a list). A spoiled metrics key (another type) is skipped, never raised.
local function record_metrics(p, now, completed, failed, runs)
  local fields = {}
  if completed > 0 then fields.c = completed end
  if failed > 0 then fields.f = failed end
  if #runs > 0 then
    local sum = 0
    for _, ms in ipairs(runs) do
      sum = sum + ms
      local h = BUCKET_FIELDS[run_bucket(ms)]
      fields[h] = (fields[h] or 0) + 1
    end
    fields.n, fields.s = #runs, sum
  end
  local minute = p .. "m:" .. math.floor(now / 60000)
  for _, key in ipairs({ minute, p .. "m:all" }) do
    for field, n in pairs(fields) do redis.pcall("HINCRBY", key, field, n) end
  end
  redis.pcall("EXPIRE", minute, METRICS_TTL, "NX")
end

-- The run ms of a job that ran from `started` (text) to now, or nil.
local function run_ms(started, now)
  local t = tonumber(started)
  if t and t <= now then return now - t end
end

local METRIC_FIELDS = { "c", "f", "n", "s" }
for i = 1, #RUN_BUCKETS + 1 do METRIC_FIELDS[#METRIC_FIELDS + 1] = "h" .. i end

local function metric_row(key)
  local row = redis.pcall("HMGET", key, unpack(METRIC_FIELDS))
  if row.err then row = {} end
  local out = {}
  for i = 1, #METRIC_FIELDS do out[i] = tonumber(row[i]) or 0 end
  return out
end

-- metrics(p; minutes) -> { first_minute, bounds, all, row, ... }: the last
-- `minutes` minutes (the current one last), each row { completed, failed,
-- runs, run_ms_sum, h1..h15 }; all: the same since ever; bounds: the
-- buckets' upper bounds in ms (the last bucket has none). A minute is
-- floor(server ms / 60000).
local function metrics(keys, args)
  local p = keys[1]
  local refused = check_numbers("moonjob_metrics", args,
    { { 1, "MINUTES must be a whole number from 0 to 1500", 0, 1500, true } })
  if refused then return refused end
  local n = tonumber(args[1]) or 60
  local last = math.floor(now_ms() / 60000)
  local out = { last - n + 1, RUN_BUCKETS, metric_row(p .. "m:all") }
  for m = last - n + 1, last do out[#out + 1] = metric_row(p .. "m:" .. m) end
  return out
end

H.METRICS_TTL, H.record_metrics, H.run_ms = METRICS_TTL, record_metrics, run_ms
F.metrics = metrics
end
