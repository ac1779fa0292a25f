-- bench/redis.lua's long job: logs its start to data.log, then waits data.seconds.
local ffi = require "ffi"
ffi.cdef "int poll(void *fds, unsigned long n, int timeout);"
return function(job)
  local f = assert(io.open(job.data.log, "a"))
  f:write(job.id, " ", job.attempt, "\n")
  f:close()
  for _ = 1, job.data.seconds * 100 do ffi.C.poll(nil, 0, 10) end
  return true
end
