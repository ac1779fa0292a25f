-- examples/square_slow.lua -- the README's Redis walkthrough: squares data.n,
-- taking 50 ms per job so that a worker killed mid-run has jobs to give up.
local ffi = require "ffi"
ffi.cdef "int poll(void *fds, unsigned long n, int timeout);"

return function(job)
  ffi.C.poll(nil, 0, 50)
  return { n = job.data.n, square = job.data.n * job.data.n }
end
