-- moonjob.redis.heartbeat -- a worker tells its queue that it lives and what
-- its children run: one FCALL moonjob_beat per beat (the library's
-- workers.lua keeps the entry), every FAST_MS while any job ran since the
-- last beat, every `heartbeat` seconds (option; 2 by default) when idle.
-- A remote (moonjob.redis.remote) has one; a worker serving several queues
-- has one remote per queue (moonjob.redis.remotes), so it beats on each of
-- them, each beat naming all its queues.
--
-- What a beat says: the worker's host, pid, moonjob version, queue and
-- children; how long it has been up; `running`, the most jobs its children
-- ran at once since the last beat (so a job of 8 ms counts as running in
-- the next beat, within FAST_MS, though no beat falls inside it), and the
-- jobs running now with their age; the lapse (3 beats) and drop (30 beats,
-- at least two leases) after which readers show it lapsed and Redis
-- deletes it. A clean stop
-- deletes the entry (stop); a worker killed without a word lapses.
--
--   hb = Heartbeat.new(remote, opts)   hb:soon()   hb:started(job)
--   hb:ended(job)   hb:stop()   hb:close()
local core = require "moonjob.core"
local loop = require "moonjob.loop"
local json = require "moonjob.codec.json"
local Options = require "moonjob.pool.options"
local names = require "moonjob.redis.names"

local Heartbeat = {}
Heartbeat.__index = Heartbeat

local FAST_MS = 150 -- while jobs run: a job counts as running within 200 ms of its start
local LAPSE_BEATS, DROP_BEATS = 3, 30
local JOBS_NAMED = 100 -- running jobs named per beat (the library keeps as many)

function Heartbeat.new(remote, opts)
  local every_ms = math.max(1, math.floor(Options.value(opts, "heartbeat") * 1000))
  local self = setmetatable({
    remote = remote, every_ms = every_ms, fast_ms = math.min(FAST_MS, every_ms),
    lapse_ms = LAPSE_BEATS * every_ms,
    -- (kept past two leases: by then a dead worker's jobs were recovered, so
    -- none is left "started" by a worker Redis no longer knows)
    drop_ms = math.min(2 ^ 31, math.max(DROP_BEATS * every_ms, math.floor(2 * Options.value(opts, "lease") * 1000))),
    born = loop.now(),
    live = {}, nlive = 0, peak = 0, -- jobs a child runs now; the most at once since the last beat
    beating = false, stopped = false,
  }, Heartbeat)
  self.info = json.encode({ host = names.hostname() or "localhost", pid = core.getpid(), version = require("moonjob")._VERSION,
    queues = setmetatable({ unpack(opts.serving or { remote.name }) }, json.array_mt), -- (all a worker serves)
    children = remote.port.size })
  self.timer = core.timer(function() self:beat() end)
  return self
end

-- Beat now (the connection is up again, or a job started while idle).
function Heartbeat:soon()
  if not self.beating and not self.stopped then self.timer:start(0) end
end

function Heartbeat:started(job)
  if self.live[job] then return end
  self.live[job] = true
  self.nlive = self.nlive + 1
  if self.nlive > self.peak then self.peak = self.nlive end
  if not self.fast then -- (idle until now: the next beat is FAST_MS away at most)
    self.fast = true
    if not self.beating and not self.stopped then self.timer:start(self.fast_ms) end
  end
end

function Heartbeat:ended(job)
  if not self.live[job] then return end
  self.live[job] = nil
  self.nlive = self.nlive - 1
end

-- The jobs a child runs now, as FCALL arguments (id, age ms), and their
-- count; a job the remote dropped without an end (fenced, lost) leaves.
function Heartbeat:_running(args)
  local fetched, now, named = self.remote.fetched, loop.now(), 0
  for job in pairs(self.live) do
    if job.abandoned or fetched[job.remote_id] ~= job then
      self:ended(job)
    elseif named < JOBS_NAMED then
      named = named + 1
      args[#args + 1] = job.remote_id
      args[#args + 1] = math.max(0, math.floor(now - (job.started or now)))
    end
  end
end

function Heartbeat:beat()
  if self.stopped or self.beating then return end
  local r = self.remote
  if not r.up then return end -- (soon() when it is back)
  local running = math.min(math.max(self.peak, self.nlive), r.port.size)
  local args = { "FCALL", "moonjob_beat", 1, r.prefix, r.worker_id, self.lapse_ms, self.drop_ms, self.info,
    math.floor(loop.now() - self.born), running }
  self:_running(args)
  self.fast = running > 0 or self.nlive > 0
  self.peak = self.nlive
  self.beating = true
  r.client:call(args, function(_, err, kind)
    self.beating = false
    if self.stopped then return end
    if err and kind ~= "connection" then r:_trouble("beat", "the heartbeat failed: " .. tostring(err)) end
    if not err then r:_fine("beat") end
    self.timer:start(self.fast and self.fast_ms or self.every_ms)
  end)
end

-- The worker stops: its entry is deleted (sent now, flushed by the
-- remote's close); no more beats.
function Heartbeat:stop()
  if self.stopped then return end
  self.stopped = true
  self.timer:stop()
  local r = self.remote
  if r.up then
    r.client:call({ "FCALL", "moonjob_beat", 1, r.prefix, r.worker_id, self.lapse_ms, self.drop_ms, "", 0, 0 },
      function() end)
  end
end

function Heartbeat:close()
  self.stopped = true
  self.timer:close()
end

return Heartbeat
