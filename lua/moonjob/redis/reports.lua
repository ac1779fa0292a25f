-- moonjob.redis.reports -- a remote's reports to Redis of the jobs that end
-- here, each with the job's token, sent until they land.
--
-- A part of a moonjob.redis.remote (remote.reports, made in Remote.new).
-- The reports: complete (the completions gathered while the last batch
-- was in flight, or of one loop turn, in one FCALL),
-- fail (with the retry delay the pool's backoff computed, or -1 for a final
-- failure), ratelimited, release (the pool is closing and the job never
-- ran, or stopped: not counted).
--
-- A report refused for now (OOM, BUSY, LOADING, READONLY, ...) or lost
-- with the connection is sent again (after a back-off, or once the
-- connection is back) until it lands or Redis answers ESTALE, and the job's
-- lease is renewed meanwhile (the remote's renewals name the jobs in
-- `reporting`): a job whose report is unanswered is never fenced. An ESTALE
-- answer to a report sent again after its first send's answer was lost is
-- checked against the job in Redis (the first send may have landed), so a
-- refusal said is a true one. A report Redis refuses for good is said once
-- (`redis` event "error") and dropped.
--
-- Owns: `reporting` (remote id -> job whose report is not answered yet:
-- the remote's renewals keep their leases), `nreports`, the reports to send
-- again (`retry`, its back-off `retry_ms` and timer), the `completions` not
-- sent yet and whether a batch of them is in flight (`completing`).
-- Exposes: attempt_failed(job, err) and ending(job, state) (the owner
-- hook's, passed on by the remote), completed, failed, rate_limited,
-- release, release_unfetched(id, token [, unsure]), send_again(),
-- unanswered(id), idle(), close(); the fields reporting and nreports (read by
-- the remote's renewal).
-- Calls: the remote's client, prefix, worker_id, counts, port, up, closed,
-- want, _forget, _trouble, _fine, _give_back_unstarted; remote.updates:send.
local Job = require "moonjob.job"
local core = require "moonjob.core"
local errors = require "moonjob.errors"
local json = require "moonjob.codec.json"
local loop = require "moonjob.loop"
local names = require "moonjob.redis.names"
local to_utf8 = require("moonjob.codec.utf8").to_utf8

local Reports = {}
Reports.__index = Reports

-- Reports refused for now are sent again after a back-off from the first
-- to the last (doubling); the remote's fetches back off the same way.
Reports.RETRY_FIRST_MS, Reports.RETRY_MAX_MS = 100, 2000
local RETRY_FIRST_MS, RETRY_MAX_MS = Reports.RETRY_FIRST_MS, Reports.RETRY_MAX_MS
local RUN_MS_MARK = names.RUN_MS_MARK -- moonjob_complete's first argument: quads, each with its run ms

-- Reports.new(remote) -> the remote's reports (its client is made).
function Reports.new(remote)
  local self = setmetatable({
    remote = remote,
    reporting = {},   -- remote id -> job (ended here, its report not answered yet)
    retry = {},       -- reports to send again (refused for now, or the connection lost)
    nreports = 0,     -- reports sent and not settled yet
    retry_ms = RETRY_FIRST_MS,
    completions = nil, -- completions not sent yet: at the loop turn's end, or once the batch in flight is answered
    completing = false, -- the batch of completions in flight (its first send), or false
  }, Reports)
  self.retry_timer = core.timer(function()
    self.retry_armed = false
    self:send_again()
  end)
  return self
end

-- Nothing left to send or to hear about (the remote's close waits for it).
function Reports:idle()
  return self.nreports == 0 and not self.completions
end

-- The job of remote id `id` whose report is not answered yet, or nil.
function Reports:unanswered(id)
  return self.reporting[id]
end

function Reports:close()
  self.retry_timer:close()
end

local function encode_error(err)
  local text = json.encode(err)
  if not text then -- a field JSON cannot hold, or text that is not UTF-8
    text = json.encode({ code = to_utf8(tostring(err.code)), message = to_utf8(tostring(err.message)) })
  end
  return text
end

-- The run time of a job's attempt, whole ms, as its child measured it (the
-- parent's clock when the child said nothing).
local function run_ms(job)
  local ms = job.ms
  if not ms and job.started then ms = loop.now() - job.started end
  return math.floor(math.max(0, ms or 0))
end

------------------------------------------------------ the jobs' ends ---

-- An attempt failed: the queue decides on its retry, with the delay our
-- backoff computed (it knows the attempts across hosts); here the job only
-- leaves the pool. A job this worker stopped because its lease is no longer
-- provably its own (abandoned) is not reported at all.
function Reports:attempt_failed(job, err)
  local port = self.remote.port
  if err.code == "ERATELIMIT" and not job.abandoned then return self:rate_limited(job, err) end
  if err.code == "ELOAD" and not job.abandoned then -- it cannot load here; it may elsewhere
    job.error = errors.new("ECLOSED", "given back: the processor cannot load on this worker")
    return port:finish_job(job, "failed") -- given back, not counted
  end
  -- closing or not: another host may retry it
  local delay = not job.retry_never and port:retry_delay(job, err)
  if not delay or job.abandoned then return port:finish_job(job, "failed") end
  job.reported = true
  self:failed(job, err, delay * 1000)
  port:note_retry(job, err, delay)
  return port:leave_job(job)
end

-- The job ends in the pool ("completed" or "failed"): reported to Redis,
-- once. True when it leaves the pool instead of ending: given back to the
-- queue (the pool closed before it ran), or abandoned (left alone).
function Reports:ending(job, state)
  if job.reported then return false end
  job.reported = true
  if job.abandoned or (state == "failed" and job.error.code == "ECLOSED") then
    self:failed(job, job.error)
    return true
  end
  if state == "completed" then self:completed(job, job.result_bytes)
  else self:failed(job, job.error) end
  return false
end

-- A remote job ended here.
-- Completions wait for the end of this loop turn and go in one FCALL.
function Reports:completed(job, result_bytes)
  local remote = self.remote
  remote:_forget(job)
  if job.abandoned then return remote:want() end
  remote.updates:send(job)
  remote.counts.completed = remote.counts.completed + 1
  job.ran_here = true
  local batch = self.completions
  if not batch then
    batch = { args = { "FCALL", "moonjob_complete", 1, remote.prefix, RUN_MS_MARK }, jobs = {} }
    self.completions = batch
    if not self.completing then loop.defer(function() self:_send_completions() end) end
  end
  local args = batch.args
  args[#args + 1] = job.remote_id
  args[#args + 1] = job.token
  args[#args + 1] = Job.bytes(result_bytes)
  args[#args + 1] = run_ms(job)
  batch.jobs[#batch.jobs + 1] = job
  self.reporting[job.remote_id] = job -- (its lease renewed while it waits to be sent)
end

-- The completions gathered, in one FCALL. One is in flight at a time: those
-- that end meanwhile go in the next, sent when its answer comes (a busy
-- worker's batches grow with its rate, an idle one's wait a loop turn).
function Reports:_send_completions()
  local batch = self.completions
  if not batch or self.completing then return end
  self.completions = nil
  self.completing = self:_report("complete", batch.args, batch.jobs)
end

-- moonjob_fail's RETRY_MS: -1 (no retry), else whole ms up to 10^12 (the
-- function refuses more, and a refused report would let the job run again
-- once its lease ran out); a backoff may compute any number, math.huge too.
local RETRY_MS_MAX = 1e12
local function retry_arg(retry_ms)
  if not retry_ms then return -1 end
  if retry_ms ~= retry_ms or retry_ms < 0 then return 0 end
  return math.floor(math.min(retry_ms, RETRY_MS_MAX))
end

-- retry_ms: the backoff before the next attempt, or nil for a final failure.
function Reports:failed(job, err, retry_ms)
  local remote = self.remote
  remote:_forget(job)
  if job.abandoned then return remote:want() end
  if err.code == "ECLOSED" then return self:release(job) end
  remote.updates:send(job)
  remote.counts.failed = remote.counts.failed + 1
  job.ran_here = true
  self:_report("fail", { "FCALL", "moonjob_fail", 1, remote.prefix, job.remote_id, job.token,
    encode_error(err), retry_arg(retry_ms), run_ms(job) }, { job })
end

-- The processor said the remote side pushed back: error({ code =
-- "ERATELIMIT", retry_after = s }). The job waits again, its attempt not
-- counted, and the queue (for a job of a group: its group) hands out
-- nothing for retry_after seconds (1 by default; at most a day), on every
-- worker; the jobs fetched here that no child started (of that group) go
-- back.
local RATE_RETRY_MAX_S = 86400
function Reports:rate_limited(job, err)
  local remote = self.remote
  local after = tonumber(err.retry_after)
  if not after or after ~= after or after < 0 then after = 1 end
  after = math.min(after, RATE_RETRY_MAX_S)
  job.reported = true
  remote:_forget(job)
  remote.updates:send(job)
  remote.counts.rate_limited = remote.counts.rate_limited + 1
  local what = job.group and ("group " .. job.group) or "the queue"
  remote.port:emit_event("redis", "rate_limited", ("job %s: the remote side pushed back (ERATELIMIT); %s "
    .. "holds back for %g s"):format(tostring(job.remote_id), what, after))
  self:_report("ratelimited", { "FCALL", "moonjob_ratelimited", 1, remote.prefix, job.remote_id, job.token,
    math.floor(after * 1000), encode_error(err) }, { job })
  remote.port:leave_job(job)
  remote:_give_back_unstarted(what .. " holds back after ERATELIMIT", job.group)
end

function Reports:release(job)
  local remote = self.remote
  remote:_forget(job)
  remote.counts.released = remote.counts.released + 1
  self:_report("release", { "FCALL", "moonjob_release", 1, remote.prefix, job.remote_id, job.token }, { job })
end

-- A job a fetch brought while the pool was closing, or one a lost fetch
-- took under a token this worker never received (unsure: ESTALE then
-- means it was taken meanwhile, nothing to say), given back by id and
-- token: no pool job.
function Reports:release_unfetched(id, token, unsure)
  local remote = self.remote
  remote.counts.released = remote.counts.released + 1
  local report = { what = "release", args = { "FCALL", "moonjob_release", 1, remote.prefix, id, token },
    jobs = {}, unsure = unsure }
  self.nreports = self.nreports + 1
  self:_send(report)
end

------------------------------------------------- sending and answers ---
-- A report is { what, args, jobs, unsure }: the FCALL and the jobs it
-- reports, in order (a completion batch reports many). Until it is answered
-- its jobs stay in self.reporting, whose leases the renewals keep.

function Reports:_report(what, args, jobs)
  local report = { what = what, args = args, jobs = jobs }
  self.nreports = self.nreports + 1
  for _, job in ipairs(jobs) do self.reporting[job.remote_id] = job end
  self:_send(report)
  return report
end

function Reports:_send(report)
  self.remote.client:call(report.args, function(reply, err, kind) self:_answered(report, reply, err, kind) end)
end

-- Sends again the reports waiting for it (the connection is back, or the
-- back-off after a refusal passed).
function Reports:send_again()
  if not self.remote.up then return end -- sent when the connection is back
  local retry = self.retry
  self.retry = {}
  for _, report in ipairs(retry) do self:_send(report) end
end

function Reports:_retry_later(report)
  self.retry[#self.retry + 1] = report
  if self.remote.up and not self.retry_armed then
    self.retry_armed = true
    self.retry_timer:start(self.retry_ms)
    self.retry_ms = math.min(self.retry_ms * 2, RETRY_MAX_MS)
  end
end

function Reports:_answered(report, reply, err, kind)
  local remote = self.remote
  if report == self.completing then -- the next batch's turn (this one, if retried, apart)
    self.completing = false
    if not remote.closed then self:_send_completions() end
  end
  if remote.closed then return self:_settled(report) end
  if kind == "connection" then -- it may have been sent and run: the next answer is checked
    report.unsure = true
    return self:_retry_later(report)
  elseif kind == "transient" then
    remote:_trouble(report.what, ("%s refused for now: %s; sent again until it lands"):format(
      report.what, tostring(err)))
    return self:_retry_later(report)
  elseif not reply then
    remote:_trouble(report.what, ("%s failed: %s; not sent again (the job's lease will run out and it "
      .. "will run again)"):format(report.what, tostring(err)))
    return self:_settled(report)
  end
  remote:_fine(report.what)
  self.retry_ms = RETRY_FIRST_MS
  local stale = {}
  if type(reply) == "table" then -- a batch of completions: one answer per job
    for i, answer in ipairs(reply) do if answer == "ESTALE" then stale[#stale + 1] = i end end
  elseif reply == "ESTALE" then
    stale[1] = 1
  end
  if #stale == 0 then return self:_settled(report) end
  if report.unsure then return self:_check_stale(report, stale) end
  self:_stale(report.what, #stale)
  self:_settled(report)
end

-- The jobs of a report left the reporting set: answered, or dropped.
function Reports:_settled(report)
  self.nreports = self.nreports - 1
  for _, job in ipairs(report.jobs) do
    if self.reporting[job.remote_id] == job then self.reporting[job.remote_id] = nil end
  end
  if self.retry_armed and #self.retry == 0 then self.retry_timer:stop(); self.retry_armed = false end
  if not self.remote.closed then self.remote:want() end
end

function Reports:_stale(what, n)
  local remote = self.remote
  remote.counts.refused = remote.counts.refused + n
  remote.port:emit_event("redis", "stale", ("%s refused for %d job(s): the lease had passed to another run")
    :format(what, n))
end

-- What a landed report leaves in the job's hash: the field to read and the
-- value it must hold (the result, or the error, sent).
local function trace_of(report, i)
  if report.what == "complete" then return "result", report.args[4 + 4 * i] end -- after RUN_MS_MARK, quads
  if report.what == "fail" then return "error", report.args[7] end
end

-- ESTALE for a report sent again after its first send's answer was lost:
-- that first send may have landed (then the token was already spent). It
-- did if the job, no longer active, was last run by this worker and holds
-- what we sent; otherwise the refusal is true. A release either way leaves
-- the job to run again: nothing to say.
function Reports:_check_stale(report, stale)
  if report.what == "release" then return self:_settled(report) end
  local remote = self.remote
  local left, refused = #stale, 0
  for _, i in ipairs(stale) do
    local field, sent = trace_of(report, i)
    local key = remote.prefix .. "j:" .. report.jobs[i].remote_id
    remote.client:call({ "HMGET", key, "state", "worker", field }, function(f)
      local landed = type(f) == "table" and f[1] ~= "active" and f[2] == remote.worker_id and f[3] == sent
      if not landed then refused = refused + 1 end
      left = left - 1
      if left > 0 then return end
      if refused > 0 and not remote.closed then self:_stale(report.what, refused) end
      self:_settled(report)
    end)
  end
end

return Reports
