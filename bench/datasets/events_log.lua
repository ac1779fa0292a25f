-- bench/datasets/events_log.lua -- the events processor (events.lua beside
-- this file), calling job:log on every line first: what a processor that
-- logs costs `moonjob run` (its log lines go to the command's stderr).
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local work = dofile(here .. "events.lua")
return function(job)
  job:log(job.name)
  return work(job)
end
