-- moonjob.pool.children -- the children: how many, starting, freeing, ending.
--
-- A part of the pool (see pool/init.lua), pool.children. The pool keeps
-- `size` children alive (or, with idle_timeout, as many as the work needs, at
-- least min_size), replaces the ones that end, recycles them
-- (max_jobs_per_child, ENOMEM: a free child past its count is ended instead
-- of taking a job) and, every SWEEP_MS, checks that dispatched jobs were
-- taken and ends children idle past idle_timeout. While starts fail, how
-- many to start is the breaker's (moonjob.pool.breaker).
--
-- Owns: every child (a moonjob.pool.child) until its exit is handled, in
-- one array (the order they started, give or take removals), how many of
-- them were asked to end (they no longer count toward the size), the stack
-- of free children (most recently freed on top; an entry whose child is no
-- longer idle is dropped when met), and the sweep and kill timers.
-- Exposes:
--   children:count()       -> how many count toward the size (not retiring)
--   children:count_all()   -> every child until its exit is handled
--   children:live()        -> ready (idle or busy), starting
--   children:array()       -> the children's array, to walk without a copy: read
--                             only, and only where no child can start or end
--   children:snapshot()    -> a copy of it (walks that may start or end children)
--   children:next_idle()   -> the free child on top of the stack, or nil
--   children:pop_idle()    -> takes it off the stack
--   children:has_idle()    -> whether one is free
--   children:can_start()   -> how many could start a job now (free_count)
--   children:free(child)   a child is free: it waits on the stack or retires
--   children:retire(child, kill), children:remove(child) (its exit),
--   children:start()
--   (the first ones, and the sweep), children:spawn(), children:target() ->
--   how many to keep now, children:ensure(), children:terminate(),
--   children:close()
-- Calls: pool.breaker (failed, failing, stalled, probe), pool.dispatch (pump,
-- room_again, take_back), pool.deadlines:unacknowledged, pool.endings:finish,
-- pool.lines:publish_kept, pool.tally:bump, pool.source:ready_count.
--
-- Caveats: starting a child never waits (core.spawn runs on a libuv thread);
-- a child ended here leaves the pool only when its exit comes in (remove),
-- which a process it started in a session of its own can hold back: so
-- retire takes it out of the count at once.
local core = require "moonjob.core"
local errors = require "moonjob.errors"
local loop = require "moonjob.loop"
local Child = require "moonjob.pool.child"

local Children = {}
Children.__index = Children

local SWEEP_MS = 100            -- how often acknowledgements and idle children are checked
local TERM_GRACE_MS = 1000      -- SIGTERM to SIGKILL when a close ends busy children

-- Children.new(pool) -> no children yet; start() starts the sweep and the first ones.
function Children.new(pool)
  return setmetatable({
    pool = pool,
    list = {},       -- every child (dispatch walks it)
    idle = {},       -- a stack of free children
    nretiring = 0,
  }, Children)
end

--------------------------------------------------------------- counting ---

function Children:count()
  return #self.list - self.nretiring
end

function Children:count_all()
  return #self.list
end

-- How many children are ready (idle or busy) and starting.
function Children:live()
  local ready, starting = 0, 0
  local list = self.list
  for i = 1, #list do
    local child = list[i]
    if child.state == "idle" or child.state == "busy" then ready = ready + 1
    elseif child.state == "starting" then starting = starting + 1 end
  end
  return ready, starting
end

function Children:array()
  return self.list
end

function Children:snapshot()
  return { unpack(self.list) }
end

----------------------------------------------------------- the free ones ---

-- The free child that takes the next job: the top of the stack, once
-- entries whose child is no longer idle are dropped.
function Children:next_idle()
  local idle = self.idle
  local child = idle[#idle]
  while child and child.state ~= "idle" do
    idle[#idle] = nil
    child = idle[#idle]
  end
  return child
end

function Children:pop_idle()
  local idle = self.idle
  idle[#idle] = nil
end

function Children:has_idle()
  return #self.idle > 0
end

-- How many children could start a job the moment it is sent: the idle ones
-- (a walk of the stack: entries whose child is no longer idle do not
-- count), and the places no child fills yet (a pool that starts children
-- as the work needs them); not the children still loading their processor,
-- nor those ending.
function Children:can_start()
  local n, idle = math.max(0, self.pool.size - self:count()), self.idle
  for i = 1, #idle do
    local child = idle[i]
    if child.state == "idle" and not child.retiring then n = n + 1 end
  end
  return n
end

-- A child is free again: it takes the next job, or is recycled.
function Children:free(child)
  local pool = self.pool
  local max_jobs = pool.max_jobs_per_child
  if pool.closing or child.recycle or (max_jobs and child.jobs_done >= max_jobs) then
    self:retire(child)
  else
    child.idle_since = loop.now()
    self.idle[#self.idle + 1] = child
    pool.dispatch:room_again() -- prefetching may fill it past one job
  end
  pool.dispatch:pump()
end

------------------------------------------------------ starting, ending ---

-- Starts the sweep (see sweep), which does not keep the loop alive, and the
-- children the pool wants.
function Children:start()
  self.sweeper = core.timer(function() self:sweep() end)
  self.sweeper:start(SWEEP_MS, SWEEP_MS)
  self.sweeper:unref()
  self:ensure()
end

-- Starts one child; false when it cannot even be spawned (a start failure).
function Children:spawn()
  local pool = self.pool
  local child, err = Child.spawn(pool)
  if not child then
    pool.breaker:failed(errors.new("ESPAWN", "cannot start a child process: " .. tostring(err)))
    return false
  end
  self.list[#self.list + 1] = child
  pool.tally:bump("spawned")
  return true
end

-- How many children the pool wants now: `size`; with idle_timeout, what the
-- work needs (at least min_size); while starts fail and no child is ready,
-- one probe while jobs wait (always for a pool with an owner: its jobs wait
-- outside the process, fetched only once a child can run).
function Children:target()
  local pool = self.pool
  local waiting = pool.source:ready_count()
  if pool.breaker:stalled() then return (waiting > 0 or pool.owner) and 1 or 0 end
  if pool.idle_timeout then
    return math.max(pool.min_size, math.min(pool.size, pool.nactive + waiting))
  end
  return pool.size
end

-- Starts the children the pool wants; after start failures, one at a time
-- and not before the back-off has passed (the breaker's probe).
function Children:ensure()
  if self.pool.closing then return end
  local target = self:target()
  if self.pool.breaker:failing() then return self.pool.breaker:probe(target) end
  while self:count() < target do
    if not self:spawn() then return end
  end
end

-- Ends a child: an idle one reads end of file and exits; kill = true
-- SIGKILLs its process group. It no longer counts toward the pool's size.
-- Returns what the kill returned (nil, err once the child was reaped).
function Children:retire(child, kill)
  if not child.retiring then
    child.retiring = true
    self.nretiring = self.nretiring + 1
  end
  if kill then
    child.state = "killed"
    return child:kill()
  end
  child:finish()
  return true
end

-- A child's exit came in: it leaves the pool. One that ended unasked (not
-- retired) and was not reported as a failed start counts as crashed.
function Children:remove(child)
  if child.removed then return end -- once (the sink's fault may ask again)
  child.removed = true
  local list = self.list
  for i = 1, #list do
    if list[i] == child then
      list[i] = list[#list]
      list[#list] = nil
      break
    end
  end
  if child.retiring then self.nretiring = self.nretiring - 1 end
  if not child.retiring and not child.start_reported then
    self.pool.tally:bump("crashed")
  end
end

-- Every SWEEP_MS: acknowledgements of dispatched jobs, and idle children past
-- idle_timeout (down to min_size).
function Children:sweep()
  local pool = self.pool
  local now = loop.now()
  local ack_ms, idle_ms = pool.ack_timeout * 1000, pool.idle_timeout and pool.idle_timeout * 1000
  for _, child in ipairs(self:snapshot()) do -- replacing a child adds one: never while walking them
    if child.state == "busy" and not child.acked and now - child.dispatched_at >= ack_ms then
      if child:taken() then child.acked = true else pool.deadlines:unacknowledged(child) end
    elseif idle_ms and child.state == "idle" and now - child.idle_since >= idle_ms
        and self:count() > pool.min_size then
      self:retire(child)
    end
  end
  if pool.batches then pool.lines:publish_kept() end
end

-- Ends every child now: busy ones get SIGTERM, and whatever is still there
-- TERM_GRACE_MS later gets SIGKILL. Their active jobs (each child's head,
-- which users saw start, whether or not the child had read it yet) fail with
-- ECLOSED and killed = true; the jobs prefetched behind a head and not
-- started end as waiting jobs do (ECLOSED, never run).
function Children:terminate()
  if self.terminating then return end
  self.terminating = true
  local pool = self.pool
  for _, child in ipairs(self:snapshot()) do
    pool.dispatch:take_back_prefetched(child)
    for _, job in ipairs(child.sent) do
      if job.owner then
        -- given back to its owner's queue below: another host may start it
        -- at once, so this child stops now, not after SIGTERM's grace
        child:kill("SIGKILL")
        break
      end
    end
    while child.job do
      local job = child:end_job()
      job.error = errors.new("ECLOSED", "the pool was closed while the job ran", { killed = true })
      pool.endings:finish(job, "failed")
    end
    self:retire(child)
    child:kill("SIGTERM")
  end
  self.killer = core.timer(function()
    for _, child in ipairs(self.list) do child:kill() end
  end)
  self.killer:start(TERM_GRACE_MS)
end

-- Closes the timers (the pool's close, once every child is gone).
function Children:close()
  for _, name in ipairs({ "sweeper", "killer" }) do
    if self[name] then self[name]:close(); self[name] = nil end
  end
end

return Children
