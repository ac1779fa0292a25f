-- part: register.lua
-- The library's version, and the functions Redis calls by name (FCALL),
-- with their flags.

do
-- VERSION: a whole number, one more whenever the library changes; the
-- programs of other versions compare it (moonjob.redis.setup). OLDEST_CLIENT:
-- the oldest moonjob version whose calls this library still serves as that
-- version's own library did; a program of that version or later that finds
-- this newer library loaded keeps it and uses it (one of an older version is
-- refused, told to upgrade). Raise it when a call of an older program would
-- be misread (docs/REDIS.md, "Versions on one server").
local VERSION, OLDEST_CLIENT = "12", "8"

-- moonjob_version -> VERSION; with the argument "oldest" -> OLDEST_CLIENT.
local function version(_, args)
  if args[1] == "oldest" then return OLDEST_CLIENT end
  return VERSION
end

redis.register_function("moonjob_add", F.add)
redis.register_function("moonjob_add_bulk", F.add_bulk)
redis.register_function("moonjob_add_flow", F.add_flow)
redis.register_function{ function_name = "moonjob_children", callback = F.children, flags = { "no-writes" } }
redis.register_function("moonjob_fetch", F.fetch)
-- allow-oom: a lease is kept while Redis refuses writes at maxmemory (it
-- only moves a score and sets a flag), so a pending report keeps its job
redis.register_function{ function_name = "moonjob_renew", callback = F.renew, flags = { "allow-oom" } }
redis.register_function("moonjob_complete", F.complete)
redis.register_function("moonjob_fail", F.fail)
redis.register_function("moonjob_release", F.release)
redis.register_function("moonjob_cancel", F.cancel)
redis.register_function("moonjob_retry", F.retry)
redis.register_function("moonjob_retry_all", F.retry_all)
redis.register_function("moonjob_remove", F.remove)
redis.register_function("moonjob_promote", F.promote)
redis.register_function("moonjob_clean", F.clean)
redis.register_function("moonjob_drain", F.drain)
redis.register_function("moonjob_obliterate", F.obliterate)
redis.register_function("moonjob_pause", F.pause)
redis.register_function("moonjob_resume", F.resume)
redis.register_function("moonjob_progress", F.progress)
redis.register_function("moonjob_log", F.log)
redis.register_function("moonjob_limit", F.limit)
redis.register_function("moonjob_ratelimited", F.ratelimited)
redis.register_function{ function_name = "moonjob_limits", callback = F.limits, flags = { "no-writes" } }
redis.register_function{ function_name = "moonjob_groups", callback = F.groups, flags = { "no-writes" } }
redis.register_function("moonjob_schedule", F.schedule)
redis.register_function("moonjob_unschedule", F.unschedule)
redis.register_function("moonjob_schedule_shifts", F.schedule_shifts)
redis.register_function{ function_name = "moonjob_schedules", callback = F.schedules, flags = { "no-writes" } }
redis.register_function{ function_name = "moonjob_jobs", callback = F.jobs, flags = { "no-writes" } }
redis.register_function{ function_name = "moonjob_job", callback = F.job, flags = { "no-writes" } }
redis.register_function{ function_name = "moonjob_metrics", callback = F.metrics, flags = { "no-writes" } }
redis.register_function{ function_name = "moonjob_get", callback = F.get, flags = { "no-writes" } }
redis.register_function("moonjob_beat", F.beat)
redis.register_function{ function_name = "moonjob_workers", callback = F.workers, flags = { "no-writes" } }
redis.register_function{ function_name = "moonjob_counts", callback = F.counts, flags = { "no-writes" } }
redis.register_function{ function_name = "moonjob_version", callback = version, flags = { "no-writes" } }
redis.register_function{ function_name = "moonjob_cron", callback = F.cron, flags = { "no-writes" } }

-- writable() -> "OK": may write (no "no-writes" flag) and writes nothing, so
-- it is refused as every write is by a replica (READONLY), a replica cut off
-- from its primary (MASTERDOWN) or a server loading its data (LOADING):
-- clients call it at connect to know they reached a primary. allow-oom: a
-- full primary is still a primary.
redis.register_function{ function_name = "moonjob_writable", callback = function() return "OK" end,
  flags = { "allow-oom" } }
end
