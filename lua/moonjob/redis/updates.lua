-- moonjob.redis.updates -- what a remote tells Redis about its running jobs:
-- that they started, their progress and their output lines.
--
-- A part of a moonjob.redis.remote (remote.updates, made in Remote.new).
-- Progress and output lines are gathered for 100 ms and sent before the
-- job's end is reported (the last `keep_logs` lines of each job are kept in
-- Redis); best effort: an update that fails is not sent again. Starts are
-- told within 200 ms, in one renewal of the jobs that started meanwhile.
--
-- Owns: the updates gathered per job (`gathered`), the jobs started and
-- not told yet (`starts`), keep_logs, the updates and started timers (made
-- when first needed).
-- Exposes: started(job), progress(job), output(job, line) (the owner
-- hook's, passed on by the remote), send(job) (before a job's report),
-- close().
-- Calls: the remote's client, prefix, up, fetched, renewing, _renew.
local core = require "moonjob.core"
local json = require "moonjob.codec.json"
local to_utf8 = require("moonjob.codec.utf8").to_utf8

local Updates = {}
Updates.__index = Updates

local UPDATES_MS = 100          -- progress and output lines gathered this long
local STARTED_MS = 200          -- jobs that started are told to Redis within this

-- Updates.new(remote, keep_logs) -> the remote's updates; keep_logs: the
-- lines of each job Redis keeps (0: none sent).
function Updates.new(remote, keep_logs)
  return setmetatable({
    remote = remote, keep_logs = keep_logs,
    gathered = {},    -- job -> { progress = true, lines = { ... } } not sent yet
    starts = {},      -- job -> true: started here, Redis not told yet (Updates:started)
  }, Updates)
end

-- The timers, made when first needed.
function Updates:close()
  if self.updates_timer then self.updates_timer:close() end
  if self.started_timer then self.started_timer:close() end
end

function Updates:_update_of(job)
  if job.abandoned or self.remote.fetched[job.remote_id] ~= job then return nil end
  local u = self.gathered[job]
  if not u then
    u = { lines = {} }
    self.gathered[job] = u
    if not self.updates_armed then
      self.updates_armed = true
      if not self.updates_timer then
        self.updates_timer = core.timer(function()
          self.updates_armed = false
          for j in pairs(self.gathered) do self:send(j) end
        end)
      end
      self.updates_timer:start(UPDATES_MS)
    end
  end
  return u
end

-- A child started the job: Redis hears it within STARTED_MS (so that
-- counts tell running from held), in one renewal of the jobs that started
-- meanwhile (only theirs: the others' leases are the periodic renewal's).
function Updates:started(job)
  self.starts[job] = true
  if self.started_armed then return end
  self.started_armed = true
  if not self.started_timer then
    self.started_timer = core.timer(function()
      if self.remote.renewing then return self.started_timer:start(STARTED_MS) end -- after this one
      self.started_armed = false
      local starts = self.starts
      self.starts = {}
      self.remote:_renew(starts)
    end)
  end
  self.started_timer:start(STARTED_MS)
end

-- Only the last progress of a gathering is sent: it is read (LuaJIT's
-- serialisation across the channel) and written as JSON then.
function Updates:progress(job)
  local u = self:_update_of(job)
  if u then u.progress = true end
end

-- Only the last keep_logs lines are kept in Redis: fewer are sent.
function Updates:output(job, line)
  if self.keep_logs == 0 then return end
  local u = self:_update_of(job)
  if not u then return end
  local lines = u.lines
  lines[#lines + 1] = to_utf8(line) -- a reader decodes it as JSON text
  if #lines > 2 * self.keep_logs then
    local kept = {}
    for i = #lines - self.keep_logs + 1, #lines do kept[#kept + 1] = lines[i] end
    u.lines = kept
  end
end

-- The job's gathered updates, sent (before its end's report: one
-- connection keeps their order). Answers are not looked at: ESTALE only
-- means the job is no longer this worker's.
function Updates:send(job)
  local u = self.gathered[job]
  if not u then return end
  self.gathered[job] = nil
  local remote = self.remote
  if not remote.up then return end
  local lines = u.lines
  if #lines > 0 then
    local args = { "FCALL", "moonjob_log", 1, remote.prefix, job.remote_id, job.token, self.keep_logs }
    for i = math.max(1, #lines - self.keep_logs + 1), #lines do args[#args + 1] = lines[i] end
    remote.client:call(args, function() end)
  end
  local progress = u.progress and json.encode(job.progress) -- nil: a value JSON cannot hold
  if progress then
    remote.client:call({ "FCALL", "moonjob_progress", 1, remote.prefix, job.remote_id, job.token, progress },
      function() end)
  end
end

return Updates
