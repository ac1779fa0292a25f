-- moonjob.redis.fetch_policy -- how many jobs a worker holds beyond its
-- running ones when no `prefetch` was given: adapted to the jobs' run time.
--
-- Pure Lua, no clock of its own (the remote feeds it run times and the age
-- of its running jobs; spec/unit/fetch_policy_spec.lua checks the numbers):
--
--   * the estimate is a moving average of the run times of the jobs that
--     ended here (WEIGHT for the newest), raised to the age of the youngest
--     running job while every child is busy (`look`, every horizon): jobs
--     already running longer than the average say the next ones may be as
--     long, and the jobs held beyond twice the bound then go back (`look`
--     says how many);
--   * the worker holds at most size * horizon / estimate jobs beyond its
--     running ones, horizon HORIZON_MS (100 ms of work per child) or
--     lease/LEASE_PARTS if less: a worker never sits on more than that
--     much work, so a worker started later gets the rest at once, and jobs
--     too long for the horizon are not held at all;
--   * and at most `cap` = size * PER_CHILD_MAX jobs (from MIN_CAP to
--     MAX_CAP), which also bounds a fetch's reply (moonjob.redis.client's
--     max_reply: jobs of max_payload each);
--   * cautious at first: size jobs beyond the running ones before any run
--     time is known, then one more for each run measured, up to the bound;
--   * it fetches when it may take at least half of what it may hold, or
--     when a child is free: fewer, larger fetches (and so larger batches of
--     reports and renewals) for the same work held.
-- An explicit `prefetch` bypasses all this: FetchPolicy.fixed, the same
-- methods, holding that many and fetching whenever there is room.
local FetchPolicy = {}
FetchPolicy.__index = FetchPolicy
local Fixed = {}
Fixed.__index = Fixed

FetchPolicy.HORIZON_MS = 100   -- estimated work held per child, at most
FetchPolicy.LEASE_PARTS = 20   -- and no more than lease/20 of it
FetchPolicy.PER_CHILD_MAX = 64 -- jobs held per child, at most
FetchPolicy.MIN_CAP = 256      -- ... though a small worker may hold this many
FetchPolicy.MAX_CAP = 1024     -- ... and a large one no more
FetchPolicy.WEIGHT = 1 / 8     -- weight of the newest run time in the average
local FLOOR_MS = 0.001         -- an estimate below this counts as this

-- FetchPolicy.new(size, lease_ms) -> the policy of a worker of `size`
-- children whose leases last lease_ms.
function FetchPolicy.new(size, lease_ms)
  local size_ = math.max(1, size)
  local horizon_ms = math.min(FetchPolicy.HORIZON_MS, lease_ms / FetchPolicy.LEASE_PARTS)
  return setmetatable({
    size = size_, horizon_ms = horizon_ms,
    look_ms = math.max(1, math.floor(horizon_ms)), -- how often the worker calls look
    cap = math.min(FetchPolicy.MAX_CAP, math.max(FetchPolicy.MIN_CAP, size_ * FetchPolicy.PER_CHILD_MAX)),
    avg = nil,     -- ms, nil until a run ended
    samples = 0,   -- runs measured
    busy_ms = 0,   -- the youngest running job's age while every child is busy, else 0
  }, FetchPolicy)
end

-- FetchPolicy.fixed(prefetch, size) -> a policy that holds `prefetch` jobs
-- beyond the running ones, whatever they take.
function FetchPolicy.fixed(prefetch, size)
  return setmetatable({ prefetch = prefetch, size = size }, Fixed)
end
function Fixed:held_max() return self.prefetch end
function Fixed:most() return self.prefetch + self.size end
function Fixed:fetch_now(room) return room > 0 end
function Fixed.ended() end

-- A job's run ended after ms.
function FetchPolicy:ran(ms)
  ms = math.max(0, tonumber(ms) or 0)
  local avg = self.avg
  if avg then self.avg = avg + (ms - avg) * FetchPolicy.WEIGHT else self.avg = ms end
  self.samples = self.samples + 1
end

-- A look at the worker (every horizon): `running` jobs started by its
-- children, the youngest started `youngest` ms ago, `held` jobs fetched and
-- not started. -> how many held jobs to give back: those beyond what may be
-- held now, once they are more than twice that (the jobs proved longer
-- than thought; not for a mere wobble of the average).
function FetchPolicy:look(running, youngest, held)
  self.busy_ms = running >= self.size and math.max(0, youngest) or 0
  local allowed = self:held_max()
  if held > 2 * allowed then return held - allowed end
  return 0
end

-- A job ended (now: the clock job.started is on); its run, if it started,
-- is a sample (once: a failed attempt may end again).
function FetchPolicy:ended(job, now)
  if job.sampled or not job.started then return end
  job.sampled = true
  self:ran(job.ms or (now - job.started))
end

-- The run time a job held now is expected to take (ms), nil when nothing
-- is known yet.
function FetchPolicy:estimate()
  local avg = self.avg
  if not avg then
    if self.busy_ms > 0 then return self.busy_ms end
    return nil
  end
  return math.max(avg, self.busy_ms)
end

-- How many jobs to hold beyond the running ones now.
function FetchPolicy:held_max()
  local est = self:estimate()
  local by_count = math.min(self.cap, self.size + self.samples)
  if not est then return math.min(self.size, by_count) end
  local by_work = math.floor(self.size * self.horizon_ms / math.max(est, FLOOR_MS))
  return math.max(0, math.min(by_work, by_count))
end

-- The most jobs a worker may ever hold, running ones with them (a fetch's
-- reply is bounded by it).
function FetchPolicy:most()
  return self.size + self.cap
end

-- Whether to fetch now, with `room` jobs it may take and `free` children
-- idle: when at least half of what it may hold is missing, or a child is
-- free.
function FetchPolicy:fetch_now(room, free)
  if room <= 0 then return false end
  return free > 0 or room >= math.max(1, math.ceil(self:held_max() / 2))
end

return FetchPolicy
