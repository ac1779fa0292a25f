-- The cluster chaos test's producer: while the test runs (until the file
-- STOP exists), adds a job to each of QUEUES, then waits MS milliseconds;
-- ids "<queue>-<n>" from n = FIRST up, data chaos/processor.lua's
-- ({ n, ms, log = RUNS }). An add that fails is retried until it lands; the
-- job is looked up first (a re-add of a job that was added and has
-- completed since would run it again). Writes to ACKS "<id> <wall ms>" for
-- each add acknowledged, and to stderr each failed try.
--
--   luajit chaos/cluster_producer.lua URL q1,q2,... FIRST MS RUNS ACKS STOP
local moonjob = require "moonjob"
local core = require "moonjob.core"
local loop = require "moonjob.loop"
local ffi = require "ffi"

ffi.cdef [[
typedef struct { long tv_sec; long tv_usec; } mj_producer_timeval;
int gettimeofday(mj_producer_timeval *tv, void *tz);
]]

local url, list, first, every, runs, acks_path, stop = unpack(arg)
first, every = assert(tonumber(first)), assert(tonumber(every))

local function wall_ms()
  local tv = ffi.new("mj_producer_timeval")
  ffi.C.gettimeofday(tv, nil)
  return tonumber(tv.tv_sec) * 1000 + math.floor(tonumber(tv.tv_usec) / 1000)
end

local function sleep(ms)
  local done = false
  local timer = core.timer(function() done = true end)
  timer:start(ms)
  loop.wait_until(function() return done end)
  timer:close()
end

local function stopped()
  local f = io.open(stop)
  if f then f:close() end
  return f ~= nil
end

local queues = {}
for name in list:gmatch("[^,]+") do queues[#queues + 1] = assert(moonjob.queue(url, name)) end
local acks = assert(io.open(acks_path, "a"))
acks:setvbuf("line")

-- Adds job n to q until it is there (added now, or found added before).
local function add(q, n)
  local id = ("%s-%d"):format(q.name, n)
  local data = { n = n, ms = (n * 7) % 61, log = runs }
  while true do
    local job, err = q:add(data, { id = id, attempts = 10 })
    if job then return acks:write(("%s %d\n"):format(id, wall_ms())) end
    io.stderr:write(("producer: add %s: %s\n"):format(id, tostring(err)))
    sleep(100)
    local info, get_err = q:get(id)
    if info then return acks:write(("%s %d\n"):format(id, wall_ms())) end
    if get_err then io.stderr:write(("producer: get %s: %s\n"):format(id, tostring(get_err))) end
    while get_err do -- (not known whether it is there: ask until Redis says)
      sleep(100)
      info, get_err = q:get(id)
      if info then return acks:write(("%s %d\n"):format(id, wall_ms())) end
    end
  end
end

local n = first
while not stopped() do
  for _, q in ipairs(queues) do add(q, n) end
  n = n + 1
  sleep(every)
end
acks:close()
for _, q in ipairs(queues) do q:close() end
