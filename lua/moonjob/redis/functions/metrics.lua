-- part: metrics.lua
-- Run-time metrics, kept by the calls that end jobs: per minute (<p>m:<minute
-- number>, a hash kept METRICS_TTL seconds) and since ever (<p>m:all). Fields:
-- c (completed), f (failed), n (runs with a run time), s (their run ms
-- summed), b1..b162 (runs per bucket, only those hit: run ms <= bound i of
-- the log-linear bounds below, b1: 1 ms or less, b162: above the last).
-- A library before these buckets wrote h1..h15 (its 14 coarse bounds,
-- OLD_BOUNDS); they are read still, each as the fine bucket of its bound.
-- moonjob_metrics reads them.

do
local now_ms, check_numbers, refuse = H.now_ms, H.check_numbers, H.refuse

-- The bounds: 2^(k/8) ms for k = 0 .. 8 * 20, written as
-- moonjob.redis.names.run_bound writes them (4 significant digits below
-- 1 s, whole ms from there); the two must stay equal (library_spec).
local RUN_BUCKETS_PER_DOUBLING = 8
local RUN_BUCKET_DOUBLINGS = 20
local OLD_BOUNDS = { 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 300000 }
local METRICS_TTL = 90000 -- 25 hours: the last day, whole

-- R: the buckets' tables, made at the first call (Redis lets a library's
-- load run no library function): text (bound texts), ms (their numbers),
-- field (b1..), to_old (each fine bucket's coarse one), of_old (each
-- coarse field's fine bucket), log_step (8 / ln 2).
local R = { text = {}, ms = {}, field = {}, to_old = {}, of_old = {} }

function R.make()
  R.log_step = RUN_BUCKETS_PER_DOUBLING / math.log(2)
  for k = 0, RUN_BUCKETS_PER_DOUBLING * RUN_BUCKET_DOUBLINGS do
    local v = 2 ^ (k / RUN_BUCKETS_PER_DOUBLING)
    R.text[k + 1] = v < 999.5 and string.format("%.4g", v) or string.format("%d", math.floor(v + 0.5))
    R.ms[k + 1] = tonumber(R.text[k + 1])
  end
  R.top = #R.ms + 1 -- the bucket above the last bound
  for i = 1, R.top do
    R.field[i] = "b" .. i
    local j = 1 -- (a fine bucket across a coarse bound goes above it: the old reply is approximate)
    while OLD_BOUNDS[j] and R.ms[i] and R.ms[i] > OLD_BOUNDS[j] do j = j + 1 end
    R.to_old[i] = j
  end
  for j = 1, #OLD_BOUNDS + 1 do
    local i = 1
    while R.ms[i] and (not OLD_BOUNDS[j] or R.ms[i] < OLD_BOUNDS[j]) do i = i + 1 end
    R.of_old["h" .. j] = i
  end
end

-- The bucket of a run of ms: a guess from the logarithm, set right against
-- the table (the bounds are rounded): a step or two at most, for every job.
local function run_bucket(ms)
  if ms <= 1 then return 1 end
  local ms_of = R.ms
  if ms > ms_of[R.top - 1] then return R.top end
  local i = math.ceil(math.log(ms) * R.log_step) + 1
  if i < 2 then i = 2 elseif i > R.top - 1 then i = R.top - 1 end
  while ms > ms_of[i] do i = i + 1 end
  while ms <= ms_of[i - 1] do i = i - 1 end
  return i
end

-- completed, failed: jobs that ended so; runs: the run ms of those that ran
-- (a list). A spoiled metrics key (another type) is skipped, never raised.
local function record_metrics(p, now, completed, failed, runs)
  if not R.top then R.make() end
  local fields = {}
  if completed > 0 then fields.c = completed end
  if failed > 0 then fields.f = failed end
  if #runs > 0 then
    local sum = 0
    for _, ms in ipairs(runs) do
      sum = sum + ms
      local h = R.field[run_bucket(ms)]
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

-- A metrics hash read whole (only the fields written: the buckets hit) ->
-- { c, f, n, s } and { [fine bucket] = runs }, the coarse fields folded in.
local function read_row(key)
  local flat = redis.pcall("HGETALL", key)
  if flat.err then flat = {} end
  local row, hits = { c = 0, f = 0, n = 0, s = 0 }, {}
  for i = 1, #flat - 1, 2 do
    local name, v = flat[i], tonumber(flat[i + 1]) or 0
    local b = string.byte(name) == 98 and tonumber(string.sub(name, 2)) or R.of_old[name]
    if b then hits[b] = (hits[b] or 0) + v elseif row[name] then row[name] = v end
  end
  return row, hits
end

-- The fine layout's row: { c, f, n, s, bucket, runs, bucket, runs, ... }
-- (only the buckets hit, in order).
local function fine_row(key)
  local row, hits = read_row(key)
  local out = { row.c, row.f, row.n, row.s }
  for i = 1, R.top do
    if hits[i] then out[#out + 1] = i; out[#out + 1] = hits[i] end
  end
  return out
end

-- The coarse layout's row (a client before the fine buckets):
-- { c, f, n, s, h1..h15 }, each fine bucket counted in a coarse one.
local function coarse_row(key)
  local row, hits = read_row(key)
  local out = { row.c, row.f, row.n, row.s }
  for j = 1, #OLD_BOUNDS + 1 do out[4 + j] = 0 end
  for i, v in pairs(hits) do
    local j = 4 + (R.to_old[i] or #OLD_BOUNDS + 1)
    out[j] = out[j] + v
  end
  return out
end

-- metrics(p; minutes [, "fine"]) -> { first_minute, bounds, all, row, ... }:
-- the last `minutes` minutes (the current one last); all: the same since
-- ever. A minute is floor(server ms / 60000). With "fine": bounds are the
-- 161 bounds' texts (ms) and each row { completed, failed, runs,
-- run_ms_sum, then bucket, runs pairs: only the buckets hit, bucket 1 at
-- or below the first bound, 162 above the last }. Without it (clients
-- before): bounds the 14 coarse ones (ms) and each row { completed,
-- failed, runs, run_ms_sum, h1..h15 }, folded from the fine buckets (a
-- fine bucket across a coarse bound counts in the coarse bucket above).
local function metrics(keys, args)
  local p = keys[1]
  local refused = check_numbers("moonjob_metrics", args,
    { { 1, "MINUTES must be a whole number from 0 to 1500", 0, 1500, true } })
  if refused then return refused end
  if not R.top then R.make() end
  local fine = args[2] == "fine"
  if args[2] and args[2] ~= "" and not fine then
    return refuse("moonjob_metrics", "LAYOUT must be \"fine\" or absent", args[2])
  end
  local row = fine and fine_row or coarse_row
  local n = tonumber(args[1]) or 60
  local last = math.floor(now_ms() / 60000)
  local out = { last - n + 1, fine and R.text or OLD_BOUNDS, row(p .. "m:all") }
  for m = last - n + 1, last do out[#out + 1] = row(p .. "m:" .. m) end
  return out
end

H.METRICS_TTL, H.record_metrics, H.run_ms = METRICS_TTL, record_metrics, run_ms
F.metrics = metrics
end
