-- bench/noop.lua -- the cheapest processor: the benchmark measures moonjob itself.
return function(job) return job.data end
