-- moonjob.redis.remote -- a pool's second job source: a durable queue on Redis.
--
-- Policy only (the connection is moonjob.redis.client, the queue's atomic
-- steps are the library, functions/*.lua). A pool created with { redis =
-- url, queue = name } has one Remote as its owner (pool.owner). It talks to
-- the pool only through the owner hook documented in moonjob.pool.source (a
-- moonjob.pool.port: new_job, accept, pump, fail_job, cancel_job, free, ...;
-- its own want, attempt_failed, ending, late, stop, close, stats), and:
--   * fetches jobs in batches while the pool has room: `size` running plus
--     `prefetch` waiting in the pool, each fetched job holding a lease
--     (`lease` seconds) and a token; a fetch refused for now (OOM, LOADING,
--     ...) is tried again after a back-off; without `prefetch`, how many
--     wait follows the jobs' run time (remote.policy, fetch_policy.lua);
--   * fetches nothing while the queue is paused (moonjob_pause: fetch answers
--     -2, and "paused" on the queue's channel), gives back the jobs it
--     fetched that no child started, says so once (`redis` "paused", then
--     "resumed") and fetches again once fetch hands out jobs (a poll, or
--     "resumed");
--   * under a rate, asks for no more jobs than its children can start at
--     once (FREE: idle children, not those still loading or restarting; it
--     fetches again when one becomes free meanwhile), and gives back a job
--     no idle child took within the rate's start bound of sending the fetch
--     (moonjob.redis.start_bounds, remote.bounds);
--   * tells Redis which jobs started, a running job's progress and output
--     (moonjob.redis.updates), and beats: the jobs its children run, that
--     it lives (moonjob.redis.heartbeat, remote.heartbeat);
--   * fetches nothing while the processor cannot load (the pool's breaker
--     is open: healthy workers elsewhere get the jobs), says so once per
--     cause (`redis` event "broken", then "mended"), and keeps probing (the
--     pool starts a probe child after each back-off though no job waits);
--   * hands them to the pool's local source as ordinary jobs (JSON text, the
--     pool's "json" codec: the parent never parses or runs what it read);
--     a job whose fields a producer wrote out of range fails EINPUT here;
--   * renews every lease it holds in one FCALL every lease/12, from the
--     loop, which user code cannot block (processors run in children);
--   * reports each end with the job's token (moonjob.redis.reports,
--     remote.reports: complete, fail, ratelimited, release), sent again
--     until it lands, the job's lease renewed meanwhile: a job whose report
--     is unanswered is never fenced;
--   * fences itself: a job whose lease was last confirmed more than
--     4/5 of a lease ago (renewals failing: Redis down, link cut) is stopped
--     (interrupted, then killed lease/30 later at most) and dropped without
--     any report, so it is stopped before the lease can expire and another
--     worker runs it. The same happens to a job Redis says is no longer
--     ours (ELOST). Both are told (`redis` events "fenced" and "lost") and
--     counted (pool:stats().redis). A cancel asked on any
--     host ("cancel <id>" on the queue's channel, or the next renew)
--     interrupts the job here with ECANCELED.
--
-- Timing: a stall of Redis shorter than about 2/3 of the lease (DEBUG SLEEP,
-- a slow fork) costs no more than its length: the watchdog waits 4/5 of a
-- lease (at most 5 s) for a reply, and a renewal sent just before the stall
-- confirms the lease when it ends.
--
-- Caveat (the documented window): a worker paused (SIGSTOP, a VM freeze) or
-- cut off for longer than the lease cannot stop its job in time; the job then
-- runs again elsewhere (ESTALLED) while the first run may have done side
-- effects. Its late report is refused by token. Processors must be idempotent.
local client = require "moonjob.redis.client"
local errors = require "moonjob.errors"
local loop = require "moonjob.loop"
local core = require "moonjob.core"
local names = require "moonjob.redis.names"
local library = require "moonjob.redis.library"
local Options = require "moonjob.pool.options"
local Reports = require "moonjob.redis.reports"
local Updates = require "moonjob.redis.updates"
local StartBounds = require "moonjob.redis.start_bounds"
local FetchPolicy = require "moonjob.redis.fetch_policy"
local Heartbeat = require "moonjob.redis.heartbeat"
local Zones = require "moonjob.redis.zones"

local Remote = {}
Remote.__index = Remote

local RENEWALS_PER_LEASE = 12   -- a renewal every lease/12
local FENCE_AT = 4 / 5          -- unconfirmed for this part of a lease: stopped
local FENCE_STEPS = 30          -- fence checked every lease/30; its kill lease/30 later
local RETRY_FIRST_MS, RETRY_MAX_MS = Reports.RETRY_FIRST_MS, Reports.RETRY_MAX_MS -- fetches too
local PAUSED = names.PAUSED     -- fetch's answer while the queue is paused
local value = Options.value -- an option, or its default (REDIS_DEFAULTS)

-- Remote.new(port, opts) -> remote: `port` is the pool's moonjob.pool.port;
-- opts (the pool's): redis, queue, lease
-- (seconds), prefetch, poll (seconds between looks at an empty queue), keep,
-- keep_age and keep_failed_age (retention), keep_logs, worker_name;
-- docs/reference/options.md; the defaults are moonjob.pool.options'
-- (REDIS_DEFAULTS).
function Remote.new(port, opts)
  local prefetch = value(opts, "prefetch")
  local lease_ms = math.floor(value(opts, "lease") * 1000)
  local adapts = prefetch == "adaptive"
  local policy = adapts and FetchPolicy.new(port.size, lease_ms) or FetchPolicy.fixed(prefetch, port.size)
  local self = setmetatable({
    port = port, name = opts.queue, prefix = names.prefix(opts.queue), lease_ms = lease_ms,
    policy = policy, adapts = adapts, -- (adapts: no prefetch option; the policy follows run times)
    poll_ms = math.floor(value(opts, "poll") * 1000),
    keep_count = value(opts, "keep"), keep_age_ms = math.floor(value(opts, "keep_age") * 1000),
    keep_failed_age_ms = math.floor(value(opts, "keep_failed_age") * 1000),
    worker_id = value(opts, "worker_name") .. names.random_hex(8),
    fetched = {},     -- remote id -> job in the pool: held (no child started it yet) or running
    nfetched = 0, fetch_retry_ms = RETRY_FIRST_MS,
    max_token = 0,    -- the number of the newest token a fetch brought
    fetching = false, renewing = false, stopping = false, up = false,
    said = {},        -- messages of `redis` "error" events already said
    counts = { fetched = 0, completed = 0, failed = 0, released = 0, fenced = 0, lost = 0, refused = 0,
      rate_limited = 0 },
  }, Remote)
  local c, err = client.new(opts.redis, {
    timeout_ms = math.max(500, math.min(self.lease_ms * FENCE_AT, 5000)),
    -- a fetch's jobs (as many as the room it asks for: the pool's size, a
    -- child per CPU when unset, and prefetch or the policy's bound), or the
    -- library's text (setup's FUNCTION LIST WITHCODE)
    max_reply = (port.max_payload + 4096) * math.max(1, policy:most()) + 65536 + #library.text(),
    on_state = function(up, why) self:_state(up, why) end,
    key = self.prefix, -- (a cluster: its state is that of the queue's primary)
  })
  if not c then error("moonjob.pool: option 'redis': " .. err, 4) end
  self.client = c
  self.reports = Reports.new(self)            -- the jobs' ends, told to Redis
  self.updates = Updates.new(self, value(opts, "keep_logs")) -- starts, progress, output
  self.bounds = StartBounds.new(self)         -- jobs fetched under a rate, sent in time or given back
  self.heartbeat = Heartbeat.new(self, opts)  -- that it lives, what its children run
  c:subscribe(self.prefix .. "events", function(kind, message) self:_message(kind, message) end)
  self:_start_timers()
  self.zones = Zones.start(self)              -- its zoned schedules' offsets kept ahead
  return self
end

function Remote:_start_timers()
  local every = self.lease_ms / RENEWALS_PER_LEASE
  self.renew_timer = core.timer(function() self:_renew() end)
  self.renew_timer:start(every, every)
  self.fence_timer = core.timer(function() self:_fence() end)
  local step = math.max(10, math.floor(self.lease_ms / FENCE_STEPS))
  self.fence_timer:start(step, step)
  self.poll_timer = core.timer(function() self:want(true) end)
  self.poll_timer:start(self.poll_ms, self.poll_ms)
  self.fetch_timer = core.timer(function() self:want() end)
  if not self.adapts then return end
  self.policy_timer = core.timer(function() self:_look_at_held() end)
  self.policy_timer:start(self.policy.look_ms, self.policy.look_ms)
end

-- Every horizon: the policy sees the running jobs' age; jobs held beyond its
-- bound (longer than it thought) go back for other workers.
function Remote:_look_at_held()
  if self.stopping then return end
  local port, now, running, youngest = self.port, loop.now(), 0, math.huge
  for _, job in pairs(self.fetched) do
    if not job.abandoned and port:has_started(job) then
      running, youngest = running + 1, math.min(youngest, job.started and now - job.started or 0)
    end
  end
  local back = self.policy:look(running, youngest, self.nfetched - running)
  if back > 0 then self:_give_back_unstarted("held beyond the fetch policy's bound", nil, back) end
end

function Remote:_state(up, why)
  self.up = up
  self.port:emit_event("redis", up and "up" or "down", why)
  if not up then return end
  if not self.registered then
    self.registered = true
    names.register(self.client, self.name)
  end
  self.reports:send_again()
  self:_renew()
  self:want()
  self.heartbeat:soon()
end

function Remote:_message(kind, message)
  if kind == "resubscribed" or message == "added" then return self:want() end
  if message == "paused" or message == "resumed" then return self:want(true) end -- a fetch says
  -- a cancel: channels are shared by every database of the server, so the
  -- message only says "look now"; the renewal asks Redis which of ours it is
  local id = message and message:match("^cancel (.*)$")
  if id and self.fetched[id] then self:_renew() end
end

-- A trouble with Redis, told once (`redis` "error" event) until `what`
-- succeeds again: a refusal repeated at every retry must not fill a log.
function Remote:_trouble(what, message)
  if self.said[what] == message then return end
  self.said[what] = message
  self.port:emit_event("redis", "error", message)
end

function Remote:_fine(what)
  self.said[what] = nil
end

-- How many more jobs the pool has room for: none while no child can start
-- (the breaker is open: healthy workers elsewhere should get the jobs).
function Remote:room()
  local port = self.port
  if not port:can_run() then
    self:_broken(port:start_error())
    return 0
  end
  if self.broken_by then
    self.broken_by = nil
    port:emit_event("redis", "mended", "the processor loads again: fetching resumes")
  end
  return port.size + self.policy:held_max() - self.nfetched
end

-- The processor cannot load here: said once per cause. The pool keeps
-- probing it (a child started after each back-off) and fetching resumes
-- once one loads.
function Remote:_broken(err)
  local why = err and tostring(err.message or err) or "its children cannot start"
  if self.broken_by == why then return end
  self.broken_by = why
  self.port:emit_event("redis", "broken", ("the processor cannot load (%s); fetching nothing until it "
    .. "does, trying again with a back-off"):format(why))
end

-- want(): fetch if there is room and no fetch is in flight.
-- probe: fetch even without room (N = 0: nothing taken), to learn whether
-- the queue is paused: the poll does, so that a worker too busy to fetch
-- still hears of a pause whose message was lost, and so does the "paused"
-- message (channels are shared by every database of a server: a message
-- only says "look").
function Remote:want(probe)
  if self.stopping or not self.up then return end
  if self.fetching then
    if probe then self.probe_pending = true end
    -- a child became free since: under a rate the fetch in flight did not
    -- count it, so fetch again once it answers
    if not self.fetch_again and self.port:free() > self.fetch_free then self.fetch_again = true end
    return
  end
  if self.lost_fetch then return self:_recover_lost_fetch() end
  if self.paused and not probe then return end -- the poll and "resumed" look
  local n = self:room()
  if not probe and not self.policy:fetch_now(n, self.port:free()) then return end
  n = math.max(n, 0)
  self.fetching, self.fetch_again, self.fetch_free = true, false, self.port:free()
  local sent_at = loop.now() -- (no later than Redis hands the jobs out: their start bounds count from it)
  self.client:call({ "FCALL", "moonjob_fetch", 1, self.prefix, self.worker_id, n, self.lease_ms,
      self.keep_count, self.keep_age_ms, math.floor(self.port.max_payload), -- MAX_PAYLOAD is whole
      self.keep_failed_age_ms, self.fetch_free, -- FREE: under a limit, no more
      self.client.target.db }, -- DB: its jobs' updates go to <prefix>updates@DB, this database's listeners
    function(reply, err, kind)
      self.fetching = false
      if not reply then return self:_fetch_failed(err, kind) end
      self:_fine("fetch")
      self.fetch_retry_ms = RETRY_FIRST_MS
      self:_fetched(reply, n, sent_at)
      if self.probe_pending or self.fetch_again then
        local probe = self.probe_pending
        self.probe_pending, self.fetch_again = false, false
        self:want(probe)
      end
    end)
end

-- A fetch that failed is tried again: at once when the connection is back
-- (a lost connection), after a back-off when refused for now, at the next
-- poll otherwise.
function Remote:_fetch_failed(err, kind)
  if self.closed then return end
  if kind == "connection" then -- the `down` event said it; Redis may have run it
    self.lost_fetch = true
    return
  end
  if kind == "transient" then
    self:_trouble("fetch", "fetch refused for now: " .. tostring(err) .. "; trying again")
    self.fetch_timer:start(math.min(self.fetch_retry_ms, self.poll_ms))
    self.fetch_retry_ms = math.min(self.fetch_retry_ms * 2, RETRY_MAX_MS)
  else
    self:_trouble("fetch", "fetch failed: " .. tostring(err))
  end
end

-- Only a fetch's answer says the queue is paused ([-2]) or not (anything
-- else): one fetch is in flight at a time, so answers come in order.
function Remote:_fetched(reply, n, sent_at)
  if reply[1] == PAUSED then return self:_paused(true) end
  if self.paused then self:_paused(false) end
  local got, start_by = 0, nil
  for i = 2, #reply do
    if self.stopping then -- the pool closed while the fetch was in flight: give them back
      self.reports:release_unfetched(reply[i][1], reply[i][2])
    else
      got = got + 1
      local by = self:_take(reply[i], sent_at)
      start_by = by and math.min(start_by or math.huge, by) or start_by
    end
  end
  if start_by then self.bounds:fetched(start_by, sent_at) end
  if got > 0 then
    self.port:pump()
    if got >= n then self:want() end
  end
  self:_arm_delayed(reply[1])
end

-- A fetch whose answer was lost with the connection may have run in Redis
-- (a stall longer than the watchdog: the command ran once Redis woke up):
-- its jobs are active under tokens this worker never received, and would
-- sit idle until their lease ran out. Before fetching again (no fetch of
-- ours in flight), the active jobs last fetched by this worker under a
-- token newer than any it received are given back. A fetch that runs in
-- Redis later still (a cut network resending it) leaves its jobs to their
-- lease, as before. The recovery ends only once every look landed: one cut
-- off by the connection (before the ZRANGE's answer, or between it and the
-- HMGETs' answers) leaves lost_fetch set, and the whole recovery runs again
-- when the connection is back (_state calls want). Running it twice is
-- harmless: a job given back holds no token of ours any more.
function Remote:_recover_lost_fetch()
  self.fetching = true
  self.client:call({ "ZRANGE", self.prefix .. "active", -2000, -1 }, function(ids, _, kind)
    if type(ids) ~= "table" or #ids == 0 then -- nothing to look at, or cannot look (best effort)
      self.fetching = false
      if kind == "connection" then return end -- looked at once the connection is back
      self.lost_fetch = false
      return self:want()
    end
    local left, cut = #ids, false
    for _, id in ipairs(ids) do
      self.client:call({ "HMGET", self.prefix .. "j:" .. id, "worker", "token" }, function(f, _, hkind)
        if type(f) == "table" then self:_give_back_lost(id, f[1], f[2]) end
        cut = cut or hkind == "connection"
        left = left - 1
        if left > 0 then return end
        self.fetching, self.lost_fetch = false, cut -- (cut: again, whole, once the connection is back)
        self:want()
      end)
    end
  end)
end

function Remote:_give_back_lost(id, worker, token)
  local n = type(token) == "string" and tonumber(token:match("/(%d+)$"))
  if worker ~= self.worker_id or not n or n <= self.max_token then return end
  if self.fetched[id] or self.reports:unanswered(id) then return end
  self.reports:release_unfetched(id, token, true) -- ESTALE: it was taken meanwhile, nothing to say
end

-- The earliest delayed job falls due in `ms` (server time): look then.
function Remote:_arm_delayed(ms)
  ms = tonumber(ms) or -1
  if ms < 0 or ms >= self.poll_ms then return end
  if not self.due_timer then self.due_timer = core.timer(function() self:want() end) end
  self.due_timer:start(ms + 1)
end

-- A fetched job becomes a pool job (-> when it must start by, under a rate).
-- Malformed or oversized jobs fail at once (reported to Redis, no attempt
-- at running them).
function Remote:_take(f, sent_at)
  local port = self.port
  local id, token, data = f[1], f[2], f[3]
  local job = port:new_job()
  job.owner, job.remote_id, job.token, job.lease_from = self, id, token, sent_at
  local bound, by = tonumber(f[11]), nil -- (a rate's: started by then, or given back; a negative one: none)
  if bound and bound >= 0 then by = StartBounds.bind(job, bound, sent_at) end
  self.max_token = math.max(self.max_token, tonumber(token:match("/(%d+)$")) or 0)
  job.attempts, job.max_attempts = 0, 1
  if f[9] and f[9] ~= "" then job.name = f[9] end
  if type(f[10]) == "string" and f[10] ~= "" then job.group = f[10] end -- (its ERATELIMIT holds that group)
  if type(f[12]) == "table" then job.children = f[12] end -- (a flow's parent: its children's rows, decoded in the child)
  self.fetched[id] = job
  self.nfetched = self.nfetched + 1
  self.counts.fetched = self.counts.fetched + 1
  local bad = Options.check_stored(job, f)
  if bad then return self:_refuse(job, "EINPUT", bad) end
  if type(data) ~= "string" then
    return self:_refuse(job, "EINPUT", "the job's data in Redis is missing or not a string")
  elseif #data > port.max_payload then -- fetch refuses these in Redis; a server not ours may not
    return self:_refuse(job, "EPAYLOAD", ("the job data is %d bytes, more than max_payload (%d)")
      :format(#data, port.max_payload))
  end
  job.data_bytes = data
  port:accept(job)
  return by
end

function Remote:_refuse(job, code, message)
  job.attempts = job.attempts + 1
  job.retry_never = true
  self.port:fail_job(job, errors.new(code, message))
end

-- Stops a job here (running: interrupted; waiting in the pool: taken out)
-- with code. For ECANCELED the end is reported (the token is still ours);
-- for a fence or a lost lease it is not (abandoned), and it is told and
-- counted.
function Remote:_cancel_here(job, code, reason)
  if code ~= "ECANCELED" then
    job.abandoned = true
    local count = code == "ELEASE" and "fenced" or "lost"
    self.counts[count] = self.counts[count] + 1
    self.port:emit_event("redis", count, ("job %s: %s"):format(job.remote_id, reason), job.remote_id)
    -- the soft stop cannot reach JIT-compiled loops or C calls: the hard kill
    -- must land before the lease ends (fence checked every lease/30 past 4/5,
    -- kill lease/30 later: by 13/15 of a lease)
    local kill_after = math.min(job.kill_after or self.port.kill_after, self.lease_ms / (1000 * FENCE_STEPS))
    job.kill_after = kill_after
    -- already interrupted (its timeout): its kill comes sooner
    if self.port:hasten_kill(job, kill_after) then return end
  end
  self.port:cancel_job(job, reason, code)
end

-- RAN of a renewal: "0", or "1:<ms since its child started it>" (Redis
-- keeps when it began: its run time on the dashboard leaves out its time
-- prefetched).
function Remote:_ran(job)
  if not self.port:has_started(job) then return "0" end
  local started = job.started
  if not started then return "1" end
  return ("1:%d"):format(math.max(0, math.floor(loop.now() - started)))
end

-- Every lease we hold, renewed in one call (one in flight at a time): the
-- jobs in the pool, and those whose report has not landed yet.
-- only: a set of jobs to renew (those that just started), else every one.
-- A full renewal asked while one is in flight is sent when it answers
-- (never lost: the fence counts on it).
function Remote:_renew(only)
  if self.renewing then
    if not only then self.renew_pending = true end
    return
  end
  if (self.nfetched == 0 and self.reports.nreports == 0) or not self.up then return end
  local args = { "FCALL", "moonjob_renew", 1, self.prefix, self.lease_ms }
  local sent = {}
  for id, job in pairs(only or self.fetched) do
    if only then id, job = id.remote_id, id end -- only is a set: job -> true
    if not job.abandoned and self.fetched[id] == job then
      args[#args + 1] = id
      args[#args + 1] = job.token
      args[#args + 1] = self:_ran(job)
      sent[#sent + 1] = job
    end
  end
  for id, job in pairs(only and {} or self.reports.reporting) do
    args[#args + 1] = id
    args[#args + 1] = job.token
    args[#args + 1] = job.ran_here and "1" or "0"
  end
  if #args == 5 then return end
  self.renewing = true
  local sent_at = loop.now()
  self.client:call(args, function(reply, err, kind)
    self.renewing = false
    if reply then
      self:_fine("renew")
      self:_renewed(reply, sent, sent_at)
    elseif kind ~= "connection" and not self.closed then
      self:_trouble("renew", "renewing the leases failed: " .. tostring(err))
    end
    if self.renew_pending and not self.closed then
      self.renew_pending = false
      self:_renew()
    end
  end)
end

-- The renewal's answer: every lease it does not name is ours until
-- sent_at + lease. A job whose report is unanswered is not looked at: the
-- report's own answer says whether it landed.
function Remote:_renewed(reply, sent, sent_at)
  local bad = {}
  for i = 1, #reply, 3 do bad[reply[i]] = { reply[i + 1], reply[i + 2] } end
  for _, job in ipairs(sent) do
    local b = bad[job.remote_id]
    if not b or b[1] == "ECANCELED" then job.lease_from = math.max(job.lease_from, sent_at) end
    if b and self.fetched[job.remote_id] == job and not job.abandoned then
      if b[1] == "ECANCELED" then
        self:_cancel_here(job, "ECANCELED", b[2])
      else
        self:_cancel_here(job, "ELOST", "the job's lease is no longer this worker's (it expired and "
          .. "the job was recovered); stopped here")
      end
    end
  end
end

-- Self-fencing: stop what we cannot prove we still hold.
function Remote:_fence()
  if self.nfetched == 0 then return end
  local limit = loop.now() - self.lease_ms * FENCE_AT
  for _, job in pairs(self.fetched) do
    if job.lease_from < limit and not job.abandoned then
      self:_cancel_here(job, "ELEASE", ("the lease could not be renewed for %.1f s (Redis unreachable); "
        .. "stopped so that another worker can run it"):format((loop.now() - job.lease_from) / 1000))
    end
  end
end

function Remote:_forget(job)
  if self.fetched[job.remote_id] == job then
    self.fetched[job.remote_id] = nil
    self.nfetched = self.nfetched - 1
  end
end

------------------------------------------------------------ pausing ---

-- The jobs fetched here that no child started (of group `group`, if given;
-- `most` of them at most, if given) go back to the queue, at their place in
-- line (released uncounted). -> how many.
function Remote:_give_back_unstarted(why, group, most)
  local given = 0
  for _, job in pairs(self.fetched) do
    if most and given >= most then break end
    if not job.abandoned and (group == nil or job.group == group)
        and self.port:cancel_job(job, why, "ECLOSED", true) then
      given = given + 1
    end
  end
  return given
end

-- The queue is paused (on), or fetch handed out jobs again (not on): said
-- once each way. Paused, the jobs fetched here that no child started go back
-- to the queue (running ones finish).
function Remote:_paused(on)
  if on == self.paused then return end
  self.paused = on
  if not on then
    return self.port:emit_event("redis", "resumed", "the queue was resumed: fetching again")
  end
  local given = self:_give_back_unstarted("the queue was paused")
  self.port:emit_event("redis", "paused", ("the queue is paused: fetching nothing until it is resumed; "
    .. "%d job(s) not started given back, running ones finish"):format(given))
end

------------------------------------------------------- the owner hook ---
-- The pool calls these for the jobs this remote brought (job.owner), as
-- moonjob.pool.source documents: want, attempt_failed, ending, started,
-- progress, output, stop, close, stats.

-- An attempt failed (the queue decides on its retry), or the job ends in
-- the pool: told to Redis (moonjob.redis.reports). ending: true when the
-- job leaves the pool instead.
-- Either way its run time is a sample for the fetch policy.
function Remote:attempt_failed(job, err)
  self.policy:ended(job, loop.now()); self.heartbeat:ended(job)
  return self.reports:attempt_failed(job, err)
end
function Remote:ending(job, state)
  self.policy:ended(job, loop.now()); self.heartbeat:ended(job)
  return self.reports:ending(job, state)
end

-- A job fetched under a rate that no child took by its start_by: given
-- back (moonjob.redis.start_bounds).
function Remote:late(job) return self.bounds:late(job) end

-- A job started (the heartbeat counts it), reported progress, wrote a line: told to Redis.
function Remote:started(job) self.updates:started(job) self.heartbeat:started(job) end
function Remote:progress(job) self.updates:progress(job) end
function Remote:output(job, _, line) self.updates:output(job, line) end

-- What this worker did with the queue's jobs (pool:stats().redis): fetched,
-- completed, failed, released (given back), fenced (ELEASE), lost (ELOST),
-- refused (reports answered ESTALE).
function Remote:stats()
  local c = {}
  for k, v in pairs(self.counts) do c[k] = v end
  return c
end

function Remote:stop() self.stopping = true end -- no more fetching (the pool is closing)

-- Reports still in flight (the pool's close waits for them, bounded).
function Remote:_busy() return self.client:in_flight() > 0 end

-- Waits (at most 5 s) for the last reports to reach Redis, then closes. A
-- report that cannot be sent by then is lost: its job's lease expires and
-- the job runs again elsewhere (ESTALLED).
function Remote:close()
  self.stopping = true
  self.heartbeat:stop() -- (its entry deleted: flushed with the reports)
  local deadline = loop.now() + 5000
  local ticker = core.timer(function() end)
  ticker:start(100, 100)
  pcall(loop.wait_until, function()
    local flushed = not self:_busy() and self.reports:idle()
      and not self.fetching
    return flushed or loop.now() > deadline
  end)
  ticker:close()
  self.closed = true
  for _, t in ipairs({ self.renew_timer, self.fence_timer, self.poll_timer, self.fetch_timer, self.policy_timer,
    self.zones.timer }) do t:close() end
  if self.due_timer then self.due_timer:close() end -- made when first needed
  self.reports:close(); self.updates:close(); self.heartbeat:close()
  self.bounds:close()
  self.client:close()
end

return Remote
