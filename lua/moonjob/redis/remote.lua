-- moonjob.redis.remote -- a pool's second job source: a durable queue on Redis.
--
-- Policy only (the connection is moonjob.redis.client, the queue's atomic
-- steps are functions.lua). A pool created with { redis = url, queue = name }
-- has one Remote as its owner (pool.owner). It talks to the pool only
-- through the owner hook documented in moonjob.pool.source (a
-- moonjob.pool.port: new_job, accept, pump, fail_job, cancel_job, ...; its
-- own want, attempt_failed, ending, stop, close), and:
--   * fetches jobs in batches while the pool has room: `size` running plus
--     `prefetch` waiting in the pool (default: the `size` option, else 1), each
--     fetched job holding a lease (`lease` seconds) and a token;
--   * hands them to the pool's local source as ordinary jobs (JSON text, the
--     pool's "json" codec: the parent never parses or runs what it read);
--   * renews every lease it holds in one FCALL every lease/3, from the loop,
--     which user code cannot block (processors run in children);
--   * reports each end with the job's token: complete, fail (with the retry
--     delay the pool's backoff computed, or -1 for a final failure), release
--     (the pool is closing and the job never ran, or stopped: not counted);
--   * fences itself: a job whose lease was last confirmed more than
--     2/3 of a lease ago (renewals failing: Redis down, link cut) is stopped
--     (interrupted, then killed lease/12 later at most) and dropped without any
--     report, so it is stopped before the lease can expire and another
--     worker runs it. The same happens to a job Redis says is no longer
--     ours (ELOST). A cancel asked on any host ("cancel <id>" on the queue's
--     channel, or the next renew) interrupts the job here with ECANCELED.
--
-- Caveat (the documented window): a worker paused (SIGSTOP, a VM freeze) or
-- cut off for longer than the lease cannot stop its job in time; the job then
-- runs again elsewhere (ESTALLED) while the first run may have done side
-- effects. Its late report is refused by token. Processors must be idempotent.
local Backoff = require "moonjob.backoff"
local Job = require "moonjob.job"
local client = require "moonjob.redis.client"
local errors = require "moonjob.errors"
local json = require "moonjob.codec.json"
local loop = require "moonjob.loop"
local core = require "moonjob.core"
local Queue = require "moonjob.redis.producer"

local Remote = {}
Remote.__index = Remote

local function random_id()
  local f = io.open("/dev/urandom", "rb")
  local bytes = f and f:read(8) or tostring(loop.now()) .. tostring(core.getpid())
  if f then f:close() end
  return (bytes:gsub(".", function(c) return ("%02x"):format(c:byte()) end))
end

-- Remote.new(port, opts) -> remote: `port` is the pool's moonjob.pool.port;
-- opts (the pool's): redis, queue, lease
-- (seconds), prefetch, poll (seconds between looks at an empty queue), keep
-- and keep_age (retention), worker_name; docs/reference/options.md.
function Remote.new(port, opts)
  local self = setmetatable({
    port = port, name = opts.queue, prefix = Queue.prefix(opts.queue),
    lease_ms = math.floor((opts.lease or 30) * 1000),
    prefetch = opts.prefetch or opts.size or 1,
    poll_ms = math.floor((opts.poll or 1) * 1000),
    keep_count = opts.keep or 1000, keep_age_ms = math.floor((opts.keep_age or 86400) * 1000),
    worker_id = (opts.worker_name or "") .. random_id(),
    held = {},        -- remote id -> job (fetched, not reported yet)
    unreported = {},  -- reports that met a connection error: { what, args }, sent again once up
    nheld = 0,
    fetching = false, stopping = false, up = false,
    counts = { fetched = 0, completed = 0, failed = 0, released = 0, fenced = 0, lost = 0, refused = 0 },
  }, Remote)
  local c, err = client.new(opts.redis, {
    timeout_ms = math.max(500, math.min(self.lease_ms / 3, 5000)),
    max_reply = (port.max_payload + 4096) * math.max(1, self.prefetch + (opts.size or 1)) + 65536,
    on_state = function(up, why) self:_state(up, why) end,
  })
  if not c then error("moonjob.pool: option 'redis': " .. err, 4) end
  self.client = c
  c:subscribe(self.prefix .. "events", function(kind, message) self:_message(kind, message) end)
  self.renew_timer = core.timer(function() self:_renew() end)
  self.renew_timer:start(self.lease_ms / 3, self.lease_ms / 3)
  self.fence_timer = core.timer(function() self:_fence() end)
  local every = math.max(10, math.floor(self.lease_ms / 12))
  self.fence_timer:start(every, every)
  self.poll_timer = core.timer(function() self:want() end)
  self.poll_timer:start(self.poll_ms, self.poll_ms)
  return self
end

function Remote:_state(up, why)
  self.up = up
  self.port:emit_event("redis", up and "up" or "down", why)
  if not up then return end
  local unreported = self.unreported
  self.unreported = {}
  for _, r in ipairs(unreported) do self:_report(r[1], r[2]) end
  self:_renew()
  self:want()
end

function Remote:_message(kind, message)
  if kind == "resubscribed" or message == "added" then return self:want() end
  -- a cancel: channels are shared by every database of the server, so the
  -- message only says "look now"; the renewal asks Redis which of ours it is
  local id = message and message:match("^cancel (.*)$")
  if id and self.held[id] then self:_renew() end
end

-- How many more jobs the pool has room for: none while no child can start
-- (the breaker is open: healthy workers elsewhere should get the jobs).
function Remote:room()
  local port = self.port
  if not port:can_run() then return 0 end
  return port.size + self.prefetch - self.nheld
end

-- want(): fetch if there is room and no fetch is in flight.
function Remote:want()
  if self.stopping or self.fetching or not self.up then return end
  local n = self:room()
  if n <= 0 then return end
  self.fetching = true
  local sent_at = loop.now()
  self.client:call({ "FCALL", "moonjob_fetch", 1, self.prefix, self.worker_id, n, self.lease_ms,
      self.keep_count, self.keep_age_ms, self.port.max_payload },
    function(reply, err)
      self.fetching = false
      if not reply then
        self.port:emit_event("redis", "error", "fetch: " .. tostring(err))
        return
      end
      local got = 0
      for i = 2, #reply do
        if self.stopping then -- the pool closed while the fetch was in flight: give them back
          local f = reply[i]
          self.counts.released = self.counts.released + 1
          self:_report("release", { "FCALL", "moonjob_release", 1, self.prefix, f[1], f[2] })
        else
          got = got + 1
          self:_take(reply[i], sent_at)
        end
      end
      if got > 0 then
        self.port:pump()
        if got >= n then self:want() end
      end
      self:_arm_delayed(reply[1])
    end)
end

-- The earliest delayed job falls due in `ms` (server time): look then.
function Remote:_arm_delayed(ms)
  ms = tonumber(ms) or -1
  if ms < 0 or ms >= self.poll_ms then return end
  if not self.due_timer then self.due_timer = core.timer(function() self:want() end) end
  self.due_timer:start(ms + 1)
end

local function number_or_nil(s)
  local n = tonumber(s)
  if n and n > 0 then return n end
  return nil
end

-- A fetched job becomes a pool job. Malformed or oversized jobs fail at
-- once (reported to Redis, no attempt at running them).
function Remote:_take(f, sent_at)
  local port = self.port
  local id, token, data = f[1], f[2], f[3]
  local job = port:new_job()
  job.owner, job.remote_id, job.token, job.lease_from = self, id, token, sent_at
  job.attempts = (tonumber(f[4]) or 1) - 1
  job.max_attempts = tonumber(f[5]) or 1
  job.timeout, job.kill_after = number_or_nil(f[7]), number_or_nil(f[8])
  if f[9] and f[9] ~= "" then job.name = f[9] end
  self.held[id] = job
  self.nheld = self.nheld + 1
  self.counts.fetched = self.counts.fetched + 1
  if f[6] and f[6] ~= "" then -- written by any producer: checked as pool:add checks it
    local spec = json.decode(f[6])
    if type(spec) ~= "table" or not Backoff.check(spec) then
      return self:_refuse(job, "EINPUT", "the job's backoff in Redis is not a valid backoff: " .. f[6])
    end
    job.backoff = spec
  end
  if type(data) ~= "string" then
    return self:_refuse(job, "EINPUT", "the job's data in Redis is missing or not a string")
  elseif #data > port.max_payload then -- fetch refuses these in Redis; a server not ours may not
    return self:_refuse(job, "EPAYLOAD", ("the job data is %d bytes, more than max_payload (%d)")
      :format(#data, port.max_payload))
  end
  job.data_bytes = data
  port:accept(job)
end

function Remote:_refuse(job, code, message)
  job.attempts = job.attempts + 1
  job.retry_never = true
  self.port:fail_job(job, errors.new(code, message))
end

-- Stops a job here (running: interrupted; waiting in the pool: taken out)
-- with code. For ECANCELED the end is reported (the token is still ours);
-- for a fence or a lost lease it is not (abandoned).
function Remote:_cancel_here(job, code, reason)
  if code ~= "ECANCELED" then
    job.abandoned = true
    -- the soft stop cannot reach JIT-compiled loops or C calls: the hard kill
    -- must land before the lease ends (fence checked every lease/12 past 2/3,
    -- kill lease/12 later: by 5/6 of a lease)
    local kill_after = math.min(job.kill_after or self.port.kill_after, self.lease_ms / 12000)
    job.kill_after = kill_after
    -- already interrupted (its timeout): its kill comes sooner
    if self.port:hasten_kill(job, kill_after) then return end
  end
  self.port:cancel_job(job, reason, code)
end

-- Every lease we hold, renewed in one call.
function Remote:_renew()
  if self.nheld == 0 or not self.up then return end
  local args = { "FCALL", "moonjob_renew", 1, self.prefix, self.lease_ms }
  local sent = {}
  for id, job in pairs(self.held) do
    if not job.abandoned then
      args[#args + 1] = id
      args[#args + 1] = job.token
      args[#args + 1] = self.port:has_started(job) and "1" or "0"
      sent[#sent + 1] = job
    end
  end
  local sent_at = loop.now()
  self.client:call(args, function(reply, err)
    if not reply then
      self.port:emit_event("redis", "error", "renew: " .. tostring(err))
      return
    end
    local bad = {}
    for i = 1, #reply, 3 do bad[reply[i]] = { reply[i + 1], reply[i + 2] } end
    for _, job in ipairs(sent) do
      local b = bad[job.remote_id]
      if not b or b[1] == "ECANCELED" then job.lease_from = math.max(job.lease_from, sent_at) end
      if b and self.held[job.remote_id] == job and not job.abandoned then
        if b[1] == "ECANCELED" then
          self:_cancel_here(job, "ECANCELED", b[2])
        else
          self.counts.lost = self.counts.lost + 1
          self:_cancel_here(job, "ELOST", "the job's lease is no longer this worker's (it expired and "
            .. "the job was recovered); stopped here")
        end
      end
    end
  end)
end

-- Self-fencing: stop what we cannot prove we still hold.
function Remote:_fence()
  if self.nheld == 0 then return end
  local limit = loop.now() - self.lease_ms * 2 / 3
  for _, job in pairs(self.held) do
    if job.lease_from < limit and not job.abandoned then
      self.counts.fenced = self.counts.fenced + 1
      self:_cancel_here(job, "ELEASE", ("the lease could not be renewed for %.1f s (Redis unreachable); "
        .. "stopped so that another worker can run it"):format((loop.now() - job.lease_from) / 1000))
    end
  end
end

local function encode_error(err)
  local text = json.encode(err)
  if not text then
    text = json.encode({ code = tostring(err.code), message = tostring(err.message) })
  end
  return text
end

function Remote:_forget(job)
  if self.held[job.remote_id] == job then
    self.held[job.remote_id] = nil
    self.nheld = self.nheld - 1
  end
end

-- A report that could not reach Redis is sent again once it is back: the
-- job's lease may still be ours (else Redis answers ESTALE), and a lost
-- report would make the job run again.
function Remote:_report(what, args)
  self.client:call(args, function(reply, err, kind)
    if kind == "connection" and not self.closed then
      self.unreported[#self.unreported + 1] = { what, args }
      return
    end
    local stale = reply == "ESTALE" and 1 or 0
    if type(reply) == "table" then -- a batch of completions: one answer per job
      for _, answer in ipairs(reply) do if answer == "ESTALE" then stale = stale + 1 end end
    end
    if stale > 0 then
      self.counts.refused = self.counts.refused + stale
      self.port:emit_event("redis", "stale", ("%s refused for %d job(s): the lease had passed to another run")
        :format(what, stale))
    elseif not reply then
      self.port:emit_event("redis", "error", what .. ": " .. tostring(err))
    end
    self:want()
  end)
end

-- A remote job ended here.
-- Completions wait for the end of this loop turn and go in one FCALL.
function Remote:_completed(job, result_bytes)
  self:_forget(job)
  if job.abandoned then return self:want() end
  self.counts.completed = self.counts.completed + 1
  local batch = self.completions
  if not batch then
    batch = { "FCALL", "moonjob_complete", 1, self.prefix }
    self.completions = batch
    loop.defer(function()
      self.completions = nil
      self:_report("complete", batch)
    end)
  end
  batch[#batch + 1] = job.remote_id
  batch[#batch + 1] = job.token
  batch[#batch + 1] = Job.bytes(result_bytes)
end

-- retry_ms: the backoff before the next attempt, or nil for a final failure.
function Remote:_failed(job, err, retry_ms)
  self:_forget(job)
  if job.abandoned then return self:want() end
  if err.code == "ECLOSED" then return self:_release(job) end
  self.counts.failed = self.counts.failed + 1
  self:_report("fail", { "FCALL", "moonjob_fail", 1, self.prefix, job.remote_id, job.token,
    encode_error(err), retry_ms and math.floor(retry_ms) or -1 })
end

function Remote:_release(job)
  self:_forget(job)
  self.counts.released = self.counts.released + 1
  self:_report("release", { "FCALL", "moonjob_release", 1, self.prefix, job.remote_id, job.token })
end

------------------------------------------------------- the owner hook ---
-- The pool calls these for the jobs this remote brought (job.owner), as
-- moonjob.pool.source documents: want, attempt_failed, ending, stop, close.

-- An attempt failed: the queue decides on its retry, with the delay our
-- backoff computed (it knows the attempts across hosts); here the job only
-- leaves the pool. A job this worker stopped because its lease is no longer
-- provably its own (abandoned) is not reported at all.
function Remote:attempt_failed(job, err)
  local port = self.port
  if err.code == "ELOAD" and not job.abandoned then -- it cannot load here; it may elsewhere
    job.error = errors.new("ECLOSED", "given back: the processor cannot load on this worker")
    return port:finish_job(job, "failed") -- given back, not counted
  end
  -- closing or not: another host may retry it
  local delay = not job.retry_never and port:retry_delay(job, err)
  if not delay or job.abandoned then return port:finish_job(job, "failed") end
  job.reported = true
  self:_failed(job, err, delay * 1000)
  port:note_retry(job, err, delay)
  return port:leave_job(job)
end

-- The job ends in the pool ("completed" or "failed"): reported to Redis,
-- once. True when it leaves the pool instead of ending: given back to the
-- queue (the pool closed before it ran), or abandoned (left alone).
function Remote:ending(job, state)
  if job.reported then return false end
  job.reported = true
  if job.abandoned or (state == "failed" and job.error.code == "ECLOSED") then
    self:_failed(job, job.error)
    return true
  end
  if state == "completed" then self:_completed(job, job.result_bytes)
  else self:_failed(job, job.error) end
  return false
end

-- No more fetching (the pool is closing).
function Remote:stop()
  self.stopping = true
end

-- Reports still in flight (the pool's close waits for them, bounded).
function Remote:_busy()
  return self.client.conn ~= nil and self.client.conn:pending() > 0
end

-- Waits (at most 5 s) for the last reports to reach Redis, then closes. A
-- report that cannot be sent by then is lost: its job's lease expires and
-- the job runs again elsewhere (ESTALLED).
function Remote:close()
  self.stopping = true
  local deadline = loop.now() + 5000
  local ticker = core.timer(function() end)
  ticker:start(100, 100)
  pcall(loop.wait_until, function()
    local flushed = not self:_busy() and #self.client.waiting == 0 and #self.unreported == 0
      and not self.completions and not self.fetching
    return flushed or loop.now() > deadline
  end)
  ticker:close()
  self.closed = true
  for _, t in ipairs({ self.renew_timer, self.fence_timer, self.poll_timer, self.due_timer }) do
    t:close()
  end
  self.client:close()
end

return Remote
