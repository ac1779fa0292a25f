-- bench/small_table.lua -- the CLI bench's processor: a small table back for
-- each line (the kind of work people hand to GNU parallel, only tinier).
return function(job)
  local d = job.data
  return { n = d.n * 2, name = d.name, ok = true }
end
