-- The chaos test's processor: logs "<id> <attempt> <worker pid> <ms since epoch>"
-- when a run starts, waits data.ms milliseconds, returns { n = data.n }.
local ffi = require "ffi"
ffi.cdef [[
int poll(void *fds, unsigned long n, int timeout);
int getppid(void);
typedef struct { long tv_sec; long tv_usec; } mj_timeval;
int gettimeofday(mj_timeval *tv, void *tz);
]]
local tv = ffi.new("mj_timeval")

return function(job)
  local d = job.data
  ffi.C.gettimeofday(tv, nil)
  local f = assert(io.open(d.log, "a"))
  f:write(("%s %d %d %d\n"):format(job.id, job.attempt, ffi.C.getppid(),
    tonumber(tv.tv_sec) * 1000 + math.floor(tonumber(tv.tv_usec) / 1000)))
  f:close()
  if d.ms > 0 then ffi.C.poll(nil, 0, d.ms) end
  return { n = d.n }
end
