-- moonjob.cli -- the `moonjob` command: parses its arguments, runs the
-- command they name, and returns its exit status.
--
--   moonjob run PROCESSOR [INPUT] [--raw] [-j N] [-k] [--halt WHEN,fail=N] [--timeout S]
--     [--attempts N] [--backoff SPEC] [--joblog FILE [--resume]] [--progress]
--   moonjob worker | add ... (moonjob.cli.redis)
--   moonjob status | queues | jobs | job | retry | remove | promote | clean | pause | resume
--     | limit | limits | drain | obliterate (moonjob.cli.status, moonjob.cli.operate);
--     moonjob schedule (moonjob.cli.schedule); moonjob workers (moonjob.cli.workers)
--   moonjob library [--line N]: the Redis function library (moonjob.redis.library)
--
-- Its options and help text: moonjob.cli.args; `moonjob run`: moonjob.cli.run
-- and the parts it names; what a terminal shows: moonjob.cli.progress.
--
-- Exit status: 0 when every job completed, 1 when any failed, 2 for usage,
-- set-up or I/O errors that stop the run, 3 and 4 for --halt now and soon,
-- 128 + N on signal N (moonjob.cli.stops).
--
-- Caveat: a usage error (the command line is wrong) is said on stderr with a
-- hint, and nothing else is written: the run had not started. A set-up
-- error (a processor that cannot load, an input that cannot be opened) is
-- said without the hint: the command line was right.
local args = require "moonjob.cli.args"
local core = require "moonjob.core"
local help = require "moonjob.cli.help"
local moonjob = require "moonjob"
local run = require "moonjob.cli.run"
local stops = require "moonjob.cli.stops"

local M = {}

local usage_error = stops.usage_error

-- MOONJOB_REDIS, read once, then wiped from this process's environment
-- block (/proc/PID/environ): the URL's password lives on only in memory.
local function redis_from_environment()
  local url = os.getenv("MOONJOB_REDIS") -- keeps a password out of `ps`
  if url then core.scrub_env("MOONJOB_REDIS") end
  return url
end

-- The commands that look at and act on a queue, and the positional
-- arguments each takes: "ids" one or more job ids, "id" exactly one.
local OPERATE = { status = "none", queues = "none", jobs = "none", job = "id", retry = "ids",
  remove = "ids", promote = "ids", clean = "none", pause = "none", resume = "none", schedule = "words",
  limit = "none", limits = "none", drain = "none", obliterate = "none", workers = "none" }

-- Options only one command takes: any other is told so (a limit meant for
-- a queue must not be dropped silently).
local ONLY_FOR = { group_rate = "limit", group_concurrency = "limit", clear = "limit", yes = "obliterate",
  force = "obliterate", debounce = "add", expire = "add" }

-- A usage error for an option of `o` that `command` does not take, or nil.
-- --concurrency past 1024 (or none) is moonjob limit's only.
local function foreign_option(command, o)
  for field, only in pairs(ONLY_FOR) do
    if o[field] ~= nil and command ~= only then
      local given = o.given and o.given[field]
      return usage_error(("%s is for moonjob %s, not moonjob %s"):format(given and given[1]
        or "--" .. field, only, command))
    end
  end
  local c = o.given and o.given.concurrency
  if c and command ~= "limit" and (o.concurrency == false or o.concurrency > 1024) then
    return usage_error(("%s needs a whole number from 1 to 1024, got '%s'"):format(c[1], c[2]))
  end
  if o.rate == false and command ~= "limit" then o.rate = nil end -- (none: no rate, as without it)
end

-- moonjob worker --queue a,b (or --queue repeated): the names, each once,
-- blanks around them dropped, in o.worker_queues; nil and a usage error
-- otherwise. Other commands take one --queue.
local function queue_list(command, o)
  local list = o.queues or {}
  if command ~= "worker" then
    if #list > 1 then
      return nil, usage_error(("moonjob %s takes one --queue (moonjob worker serves several)"):format(command))
    end
    return true
  end
  local names, seen = {}, {}
  for _, given in ipairs(list) do
    for name in (given .. ","):gmatch("%s*([^,]-)%s*,") do -- (blanks around a name: "a, b")
      local ok, why = require("moonjob.redis.names").check_name(name)
      if not ok then return nil, usage_error(("--queue %s: %s"):format(given, why)) end
      if seen[name] then return nil, usage_error(("--queue names %s twice"):format(name)) end
      seen[name], names[#names + 1] = true, name
    end
  end
  o.worker_queues = names
  return true
end

-- moonjob limit: something to set (each value was checked by the parser).
local function limit_command(o)
  if o.rate == nil and o.concurrency == nil and o.group_rate == nil and o.group_concurrency == nil
      and not o.clear then
    return usage_error("moonjob limit needs --rate, --concurrency, --group-rate, --group-concurrency or --clear "
      .. "(moonjob limits shows them)")
  end
  local c = o.given and o.given.concurrency
  if c and c[1] ~= "--concurrency" then -- (-j and --jobs count children)
    return usage_error(("%s is for moonjob run and worker (children): moonjob limit takes --concurrency"):format(c[1]))
  end
  return require("moonjob.cli.operate").limit(o)
end

local function operate_command(command, o)
  local operate = require "moonjob.cli.operate"
  local rest = { unpack(o.positional, 2) }
  local takes = OPERATE[command]
  if command == "retry" and o.all then
    if #rest > 0 then return usage_error("moonjob retry takes job ids or --all, not both") end
    if o.state and o.state ~= "failed" and o.state ~= "completed" then
      return usage_error("moonjob retry --all takes --state failed (the default) or --state completed")
    end
    return operate.retry_all(o)
  end
  if takes == "none" and rest[1] then return usage_error(("unexpected argument '%s'"):format(rest[1])) end
  if takes == "id" and #rest ~= 1 then
    return usage_error(("moonjob %s takes one job id: moonjob %s --queue NAME ID"):format(command, command))
  end
  if takes == "ids" and #rest == 0 then
    return usage_error(("moonjob %s takes job ids: moonjob %s --queue NAME ID...%s"):format(command, command,
      command == "retry" and " (or --all: every failed job)" or ""))
  end
  if command == "status" then return require("moonjob.cli.status").run(o) end
  if command == "schedule" then return require("moonjob.cli.schedule").run(rest, o) end
  if command == "queues" then return operate.queues(o) end
  if command == "workers" then return require("moonjob.cli.workers").run(o) end
  if command == "jobs" then
    if (o.limit or 0) > 1000 then return usage_error("--limit for moonjob jobs is at most 1000 (a page; --offset for the next)") end
    return operate.jobs(o)
  end
  if command == "job" then return operate.job(rest[1], o) end
  if command == "clean" then
    if o.state ~= "completed" and o.state ~= "failed" then
      return usage_error("moonjob clean needs --state completed or --state failed (jobs that wait: none)")
    end
    if not o.older_than then
      return usage_error("moonjob clean needs --older-than SECONDS (0 removes every one of them)")
    end
    return operate.clean(o)
  end
  if command == "pause" or command == "resume" then return operate.pause(o, command == "resume") end
  if command == "limit" then return limit_command(o) end
  if command == "limits" then return operate.show_limits(o) end
  if command == "drain" then return operate.drain(o) end
  if command == "obliterate" then
    if not o.yes then
      return usage_error(("moonjob obliterate removes queue %s and every job in it for good: add --yes to do it "
        .. "(moonjob drain removes only the jobs that wait)"):format(o.queue))
    end
    return operate.obliterate(o)
  end
  return operate.each(command, rest, o)
end

-- moonjob worker | add and the operating commands (moonjob.cli.redis,
-- moonjob.cli.operate): --redis and --queue checked first.
local function remote_command(command, o)
  local remote = require "moonjob.cli.redis"
  local from_environment = redis_from_environment() -- wiped even when --redis is given
  o.redis = o.redis or from_environment
  local bad = remote.check_target(o, usage_error, command == "queues" or command == "dashboard"
    or command == "workers")
  if bad then return bad end
  local listed, why = queue_list(command, o)
  if not listed then return why end
  if o.until_empty and not o.watch then return usage_error("--until-empty goes with --watch") end
  if o.raw and command ~= "add" then
    return usage_error(("--raw is for moonjob run and moonjob add, not moonjob %s (a queue's data is "
      .. "JSON already)"):format(command))
  end
  if o.rate and command ~= "limit" then -- (a queue on Redis is limited across its workers, not by one of them)
    return usage_error(("--rate is for moonjob run, not moonjob %s (a queue's rate: moonjob limit --rate)")
      :format(command))
  end
  if o.cascade and command ~= "remove" then
    return usage_error(("--cascade is for moonjob remove, not moonjob %s"):format(command))
  end
  if OPERATE[command] then return operate_command(command, o) end
  if command == "dashboard" then
    if o.positional[2] then return usage_error(("unexpected argument '%s'"):format(o.positional[2])) end
    return require("moonjob.cli.dashboard").run(o)
  end
  if command == "worker" then
    local processor = o.positional[2]
    if not processor then return usage_error("missing PROCESSOR: moonjob worker PROCESSOR --redis URL --queue NAME") end
    if o.positional[3] then return usage_error(("unexpected argument '%s'"):format(o.positional[3])) end
    return remote.worker(processor, o, run.pool_options)
  elseif command == "add" then
    if o.positional[3] then return usage_error(("unexpected argument '%s'"):format(o.positional[3])) end
    if o.debounce and (o.dedupe or o.delay) then
      return usage_error("--debounce draws the job's id and sets its delay: not with --dedupe or --delay")
    end
    return remote.add(o.positional[2], o)
  end
  return M.unknown_command(command)
end

-- moonjob library: prints the Redis function library, as FUNCTION LOAD takes
-- it; with --line N, where the library's line N is: its part's file and line.
local function library_command(o)
  if o.positional[2] then return usage_error(("unexpected argument '%s'"):format(o.positional[2])) end
  local library = require "moonjob.redis.library"
  if not o.line then return stops.print(library.text()) end
  local _, line, path = library.where(o.line)
  if not line then
    return usage_error(("line %d is not in a part of the library (line 1 is its #!lua line; it has %d)")
      :format(o.line, select(2, library.text():gsub("\n", ""))))
  end
  return stops.print(("%s:%d\n"):format(path, line))
end

-- `moonjob --help`, `moonjob COMMAND --help`: the overview, or that
-- command's own section; an unknown command is a usage error.
local function help_command(command)
  if command == nil then return stops.print(help.overview()) end
  if not help.command(command) then return M.unknown_command(command) end
  return stops.print(help.command_help(command))
end

-- An unknown command: a usage error naming the one it most likely mistypes.
function M.unknown_command(command)
  local names = help.names()
  return usage_error(("unknown command '%s'%s; the commands are %s and %s"):format(command,
    help.did_you_mean(command, names), table.concat(names, ", ", 1, #names - 1), names[#names]))
end

-- cli.main(args) -> exit status
function M.main(arguments)
  local o, err = args.parse(arguments)
  if not o then return usage_error(err) end
  if o.help then return help_command(o.positional[1]) end
  if o.positional[1] == "help" then return help_command(o.positional[2]) end -- (git's habit)
  if o.version then return stops.print(moonjob._VERSION, "\n") end
  local command = o.positional[1]
  if command == nil then return usage_error("missing command: moonjob run PROCESSOR [INPUT]") end
  local foreign = foreign_option(command, o)
  if foreign then return foreign end
  if command == "worker" or command == "add" or command == "dashboard" or OPERATE[command] then
    return remote_command(command, o)
  end
  if command == "library" then return library_command(o) end
  if command ~= "run" then return M.unknown_command(command) end
  local processor, input_path = o.positional[2], o.positional[3]
  if not processor then return usage_error("missing PROCESSOR: moonjob run PROCESSOR [INPUT]") end
  if o.positional[4] then return usage_error(("unexpected argument '%s'"):format(o.positional[4])) end
  if o.resume and not o.joblog then return usage_error("--resume needs --joblog FILE") end
  if o.progress == nil then o.progress = core.isatty(2) end
  local status, why, is_usage = run.run(processor, input_path, o)
  if not status then return (is_usage and usage_error or stops.setup_error)(why) end
  return status
end

return M
