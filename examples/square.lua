-- examples/square.lua -- a processor file: squares job.data.x.
return function(job)
  job:progress(50)                 -- any serialisable value
  job:log("squaring " .. job.data.x)
  return job.data.x * job.data.x   -- the job's result
end
