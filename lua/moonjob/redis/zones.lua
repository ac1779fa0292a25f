-- moonjob.redis.zones -- a worker keeps its queue's zoned schedules' offsets
-- ahead. A schedule in a zone of the tz database holds the zone's offsets
-- for a few years (moonjob.redis.schedules' shifts: Redis cannot read the
-- tz database); a worker of the queue looks soon after it starts, then
-- every LOOK_MS, and hands fresh ones (moonjob_schedule_shifts) for each
-- zone whose offsets run out within LOW_S, read from this machine's tz
-- database. A zone this machine does not know, and "local" (another
-- machine's zone), are left to the producer that declares them.
--
--   local zones = Zones.start(remote)  -- remote: moonjob.redis.remote
--   zones.timer                         -- closed with the remote's timers
local core = require "moonjob.core"
local schedules = require "moonjob.redis.schedules"
local tz = require "moonjob.tz"

local M = {}

local FIRST_MS = 1000            -- the first look, once the worker has had time to connect
local LOOK_MS = 6 * 3600 * 1000  -- then this often
local RETRY_MS = 60 * 1000       -- after a look that failed (Redis down, ...)
local LOW_S = 366 * 86400        -- offsets known for less than this ahead are refreshed

-- The zones of the rows whose offsets run out within LOW_S: { name = true }.
local function low_zones(rows, now)
  local low = {}
  for i = 2, #rows do
    local zone, known_ms = schedules.row_zone(rows[i])
    if zone and zone ~= "local" and (not known_ms or known_ms < (now + LOW_S) * 1000) then low[zone] = true end
  end
  return low
end

-- Hands Redis each low zone's offsets from now (a zone unknown here is skipped).
local function refresh(remote, low, now)
  for name in pairs(low) do
    local zone = tz.zone(name)
    if zone then
      remote.client:call({ "FCALL", "moonjob_schedule_shifts", 1, remote.prefix, name,
        (schedules.shifts_text(zone, now)) }, function() end)
    end
  end
end

-- Zones.start(remote) -> { timer }: looks at the queue's schedules now and then.
function M.start(remote)
  local self = {}
  local function look()
    if remote.closed or remote.stopping then return end
    remote.client:call({ "FCALL", "moonjob_schedules", 1, remote.prefix, 0, 10000 }, function(rows)
      if remote.closed then return end
      if type(rows) == "table" then refresh(remote, low_zones(rows, os.time()), os.time()) end
      self.timer:start(type(rows) == "table" and LOOK_MS or RETRY_MS)
    end)
  end
  self.timer = core.timer(look)
  self.timer:start(FIRST_MS)
  return self
end

return M
