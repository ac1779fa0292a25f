-- bench/datasets/tiny.lua -- the tiny lines' processor: next to nothing, so
-- that the per-line cost of the machinery shows.
return function(job)
  local d = job.data
  return { i = d.i * 2, s = d.s, f = d.f }
end
