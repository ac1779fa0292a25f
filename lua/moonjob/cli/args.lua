-- moonjob.cli.args -- the command line's words: its help text and the parser
-- that turns arguments into one table of options for every command.
--
-- Options are written the ways GNU tools take them: `-j 4`, `-j4`, `-j=4`,
-- `--concurrency 4`, `--concurrency=4`. A value that is missing or wrong is a
-- usage error naming the option and what it wants ("-j needs a number: a
-- whole number from 1 to 1024"). `--halt` takes GNU parallel's WHEN,fail=N
-- and WHEN,fail=P% (WHEN: now or soon), or never.
local M = {}

M.USAGE = [=[
usage: moonjob run PROCESSOR [INPUT] [options]
       moonjob worker PROCESSOR --redis URL --queue NAME[,NAME...] [-j N] [--lease S] [--grace S]
       moonjob add --redis URL --queue NAME [INPUT] [--raw] [--dedupe] [--attempts N] [--priority P] [--delay S]
                   [--group G] [--expire S] [--debounce ID:SECONDS]
       moonjob status --redis URL --queue NAME [--watch [--until-empty]]
       moonjob queues | jobs | job | retry | remove | promote | clean | pause | resume ...
       moonjob limit | limits | drain | obliterate --redis URL --queue NAME ...
       moonjob schedule add | list | remove ...
       moonjob dashboard --redis URL [--listen 127.0.0.1:7411] [--token T]
       moonjob library [--line N]

Runs the processor file PROCESSOR once per line of INPUT, an NDJSON file
(one job's data per line, any JSON value; default: standard input), in a pool
of child processes. Prints one JSON line per finished line, as it finishes:
  {"line":1,"status":"completed","result":...,"attempts":1,"ms":0.4}
  {"line":2,"status":"failed","error":{"code":"...","message":"..."},"attempts":1,"ms":0.2}
What the processor prints goes to standard error as "[line N] text".
Plain-text lines (file names, words): --raw, e.g. ls *.log | moonjob run count.lua --raw

options:
  --raw                 each input line is a job's data as it is, a string
                        (no JSON needed; blank lines still run nothing)
  -j, --concurrency N   children to run (default: the number of CPUs; also --jobs N)
  -k, --keep-order      print results in input order (default: as they finish)
  --halt WHEN,fail=N    stop after N failed lines: WHEN is now (running jobs
                        are killed; exit 3) or soon (nothing more starts,
                        running jobs finish; exit 4); fail=P% stops when P% of
                        the lines finished have failed (from 3 finished lines)
  --rate N/s            start at most N lines a second (also N/m, N/h; plain
                        N is N/s): N whole lets N start together in each
                        period (10/s, 60/m); N below 1 or fractional spaces
                        them evenly (0.5/s: one every 2 s); each line then
                        runs as a job of its own
  --attempts N          runs per job before it fails for good (default 1)
  --backoff SPEC        wait between attempts: fixed:SECONDS or
                        exponential:SECONDS[:JITTER] (JITTER 0..1)
  --joblog FILE         append one line per finished job to FILE
  --resume              skip the lines FILE (--joblog) records as completed
  --timeout S           seconds a job may run; then it is interrupted, its
                        cleanup runs, and it fails with ETIMEDOUT
  --kill-after S        seconds after the timeout before the child is killed
                        (default 5)
  --start-timeout S     seconds a child may take to load the processor
                        (default 60); then the run stops with ELOAD
  --progress, --no-progress   show a progress line and a summary on stderr, or
                        not (default: when stderr is a terminal; none is drawn
                        while the input is typed on a terminal)

durable queues on Redis (README "Durable queues on Redis"):
  worker                run jobs from the queue until SIGTERM or Ctrl-C, then
                        give back what was not started and exit 0
  add                   add one job per NDJSON line of INPUT; prints the ids
                        (--raw: per line of text, its data a JSON string)
  status                print the queue's counts (--watch: every second, with
                        the rate and an ETA; --until-empty: end when nothing
                        waits or runs)
  --keep-logs N         log lines kept in Redis per job (default 100)
  --quiet, --verbose    for worker: no line per failed or retried job; a
                        line per job, completed ones too
  --metrics HOST:PORT   for worker: serve /metrics for Prometheus there

operating a queue (each prints NDJSON, or a table on a terminal; --json:
NDJSON there too):
  queues                the server's queues with their counts
  jobs [--state S] [--limit N] [--offset N]
                        a page of the jobs in state S: waiting (default),
                        delayed, active, completed, failed or
                        waiting-children (a flow's parents whose children
                        have not all ended)
  job ID                one job: data, result or error, log, attempts, times;
                        a flow's parent: its children (id, queue, state,
                        result or error); a flow's child: its parent
  retry ID... | --all [--state completed]
                        run failed (or completed) jobs again
  remove ID... [--cascade]
                        remove jobs that are not running (a flow's parent:
                        its pending children are canceled); a flow's child
                        its parent waits for only with --cascade (the parent
                        counts it as canceled: by default it then fails)
  promote ID...         run delayed jobs now
  clean --state S --older-than SECONDS [--limit N]
                        remove completed or failed jobs older than SECONDS
  pause, resume         stop every worker fetching from the queue, or resume
  limit [--rate R] [--concurrency N] [--group-rate R] [--group-concurrency N]
        [--clear]       set the queue's limits, on all its workers together
                        (R: 100/s, 10/1m, 3/250ms, 0.5/s; none lifts one;
                        --clear lifts every one first); prints them
  limits                the queue's limits, and what they hold back now
  drain                 remove the jobs that wait (waiting and delayed)
  obliterate --yes [--force]
                        remove the queue, every job and key; refused while
                        jobs run unless --force

repeating jobs (docs/guide/schedules.md); Redis fires them while a worker runs:
  schedule add ID --cron "m h dom mon dow" | --every S
                        one job per due time, its id s:ID:<ms>; also --tz
                        UTC|local|+05:30, --start T, --stop T, --limit N (runs),
                        --catch-up none|one (slots missed while no worker ran:
                        skipped, or one job for them; default one), --data
                        JSON and add's job options
  schedule list         the schedules, the next due first
  schedule remove ID... remove schedules (the jobs they made stay)

the web dashboard (docs/guide/dashboard.md):
  dashboard             serve it until Ctrl-C: queues, jobs, actions, /metrics
  --listen HOST:PORT    default 127.0.0.1:7411 (loopback); another address
                        needs a token
  --token T             what every visitor must give (?token=T); default:
                        $MOONJOB_DASHBOARD_TOKEN (keeps it out of `ps`)

the Redis function library (docs/REDIS.md); workers and producers load it:
  library               print it, for an admin to load: moonjob library |
                        redis-cli -x FUNCTION LOAD REPLACE
  library --line N      the part and its line that a Redis error's
                        user_function:N names

the commands on Redis (worker, add, status, the operating commands, schedule,
dashboard) take --redis, those on one queue --queue, the others as they say:
  --redis URL           redis://[user:password@]host[:port][/db]; default:
                        $MOONJOB_REDIS (keeps a password out of `ps`)
  --queue NAME          the queue's name; for worker also a,b (or --queue
                        repeated): one worker serves them all, in turn
  --lease S             for worker: seconds a fetched job is held before
                        another worker may take it, renewed every S/12
                        (default 30)
  --grace S             for worker: seconds running jobs get to finish when
                        the worker stops (default 30)
  --prefetch N          for worker: jobs held beyond the running ones
                        (default: about 100 ms of work per child, from the
                        jobs' measured run time)
  --keep N, --keep-age S  for worker: finished jobs kept in Redis, by count
                        per state (default: any number) and age (default
                        86400 s: a day; failed ones: --keep-failed-age, a week)
  --keep-failed-age S   for worker: seconds failed jobs are kept (default 604800)
  --priority P, --delay S   for add: lower runs first; seconds before it may run
  --group NAME          for add and schedule add: the jobs' group (a tenant, a
                        customer): groups take turns, each under its limits
  --expire S            for add: a job not started within S seconds fails
                        (EEXPIRED) instead of running late
  --debounce ID:SECONDS for add: one delayed job per ID; each line joins it
                        (its data the line's) and starts its delay again:
                        it runs once, SECONDS after the last line
  --dedupe              for add: each job's id from its line (SHA-1), so adding
                        the same lines again adds nothing twice
  --resolve S           for add: seconds a line whose reply was lost (Redis
                        stalled, the link dropped) is asked for again, and
                        Redis is waited for (default and most 300; 0: such a
                        line is unknown at once)

  -h, --help            show this help
  --version             show the version

exit status: 0 every job completed, 1 some job failed, 2 usage, set-up or I/O
error (the processor cannot load, the joblog cannot be written), 3 stopped by
--halt now, 4 stopped by --halt soon, 128+N when stopped by signal N (130
Ctrl-C, 143 SIGTERM, 129 SIGHUP)
]=]

local SECONDS_MAX = require("moonjob.pool.options").SECONDS_MAX -- the pool's own bound on its times
local RESOLVE_MAX = require("moonjob.redis.names").RESOLVE_MAX

local function positive_integer(text)
  local n = tonumber(text)
  if n and n >= 1 and n <= 2 ^ 31 and n == math.floor(n) then return n end
end

local function children(text)
  local n = positive_integer(text)
  if n and n <= 1024 then return n end
end

local function seconds(text)
  local n = tonumber(text)
  if n and n >= 0 and n <= SECONDS_MAX then return n end
end

local function positive_seconds(text) -- timers count milliseconds
  local n = seconds(text)
  if n and n >= 0.001 then return n end
end

local function whole_up_to_million(text)
  local n = tonumber(text)
  if n and n >= 0 and n <= 1e6 and n % 1 == 0 then return n end
end

local function backoff_spec(text)
  local kind, delay, jitter = text:match("^(%a+):([%d.]+):?([%d.]*)$")
  delay, jitter = tonumber(delay), tonumber(jitter)
  if not (kind == "fixed" or kind == "exponential") or not delay then return nil end
  if jitter and jitter > 1 then return nil end
  return { type = kind, delay = delay, jitter = jitter }
end

-- --halt: never | now,fail=N | soon,fail=N | now,fail=P% | soon,fail=P%
-- -> { when = "now"|"soon", count = N } or { when = ..., percent = P },
-- false for never.
local function halt_spec(text)
  if text == "never" then return false end
  local when, n, percent = text:match("^(%a+),fail=(%d+%.?%d*)(%%?)$")
  n = tonumber(n)
  if not (when == "now" or when == "soon") or not n then return nil end
  if percent == "%" then
    if n > 0 and n <= 100 then return { when = when, percent = n } end
  elseif n >= 1 and n == math.floor(n) then
    return { when = when, count = n }
  end
end

-- --rate (also --group-rate): N/s, N/m, N/h or N (per second), or N over
-- a period of D units, N/Ds, N/Dm, N/Dh, N/Dms (10/1m, 5/2s, 1/500ms) ->
-- the pool's (and q:set_rate's) { max, per }. A whole N allows bursts of N
-- in each period; any other N, one start every period / N (0.5/s: one
-- every 2 s). "none" -> false: no limit (moonjob limit lifts it).
local RATE_PERIODS = { ms = 0.001, s = 1, m = 60, h = 3600 }
local function rate_spec(text)
  if text == "none" then return false end
  local n, d, unit = text:match("^(%d*%.?%d+)/(%d*%.?%d*)(m?[smh])$")
  if not n then n, d, unit = text:match("^(%d*%.?%d+)$"), "", "s" end
  n, d = tonumber(n), d == "" and 1 or tonumber(d)
  if not (n and n > 0 and n <= 1e6 and RATE_PERIODS[unit] and d and d > 0) then return nil end
  local period = RATE_PERIODS[unit] * d
  if n == math.floor(n) then
    if period >= 0.001 and period <= SECONDS_MAX then return { max = n, per = period } end
    return nil
  end
  if period / n > SECONDS_MAX or period / n < 0.001 then return nil end -- one line per more than 1e9 s
  return { max = 1, per = period / n }
end

-- --concurrency and --group-concurrency: a whole number, or none (false:
-- no limit; moonjob limit). run and worker hold --concurrency to 1024
-- children (moonjob.cli checks it, as -j's parser does).
local function limit_count(text)
  if text == "none" then return false end
  return positive_integer(text)
end

-- --debounce ID:SECONDS -> { id, seconds } (the id may hold colons: the
-- last one ends it).
local function debounce_spec(text)
  local id, s = text:match("^(.+):([^:]+)$")
  s = tonumber(s)
  if id and #id <= 1024 and s and s > 0 and s <= SECONDS_MAX then return { id = id, seconds = s } end
end

local function path(text)
  if text ~= "" then return text end
end

local WHOLE_1024 = "a whole number from 1 to 1024"
local WHOLE_2_31 = "a whole number from 1 to 2^31"
local SECONDS_POSITIVE = "a number of seconds from 0.001 to 1e9"
local SECONDS_ANY = "a number of seconds from 0 to 1e9"
local RATE_WANTS = "N/s, N/m or N/h such as 10/s or 0.5/s, or N/D followed by ms, s, m or h such as 10/1m or "
  .. "3/250ms (N above 0, at most 1e6; a period from 1 ms to 1e9 s), or none (no limit)"

-- option -> { field, parser, what it needs (in short), what it wants (in full) }
local VALUED = {
  ["-j"] = { "concurrency", children, "a number", WHOLE_1024 },
  ["--concurrency"] = { "concurrency", limit_count, "a number", WHOLE_1024,
    limit = WHOLE_2_31 .. ", or none (no limit)" },
  ["--jobs"] = { "concurrency", children, "a number", WHOLE_1024 }, -- GNU parallel's name
  ["--attempts"] = { "attempts", positive_integer, "a number", WHOLE_2_31 },
  ["--rate"] = { "rate", rate_spec, "a rate", "N/s, N/m or N/h such as 10/s or 0.5/s (N above 0, at most 1e6)",
    limit = RATE_WANTS },
  ["--group-rate"] = { "group_rate", rate_spec, "a rate", RATE_WANTS },
  ["--group-concurrency"] = { "group_concurrency", limit_count, "a number", WHOLE_2_31 .. ", or none" },
  ["--debounce"] = { "debounce", debounce_spec, "a value",
    "ID:SECONDS, such as user-7:30 (the debounce id, then seconds above 0)" },
  ["--expire"] = { "expire", positive_seconds, "a number", SECONDS_POSITIVE },
  ["--backoff"] = { "backoff", backoff_spec, "a value", "fixed:SECONDS or exponential:SECONDS[:JITTER]" },
  ["--halt"] = { "halt", halt_spec, "a value",
    "now,fail=N, soon,fail=N, now,fail=P% or soon,fail=P% (N at least 1, P above 0 and at most 100), or never" },
  ["--joblog"] = { "joblog", path, "a file", "a file path" },
  ["--timeout"] = { "timeout", positive_seconds, "a number", SECONDS_POSITIVE },
  ["--start-timeout"] = { "start_timeout", positive_seconds, "a number", SECONDS_POSITIVE },
  ["--kill-after"] = { "kill_after", seconds, "a number", SECONDS_ANY },
  ["--redis"] = { "redis", path, "a URL", "a URL: redis://[user:password@]host[:port][/db]" },
  ["--queue"] = { "queue", path, "a name", "a queue name" },
  ["--lease"] = { "lease", positive_seconds, "a number", SECONDS_POSITIVE },
  ["--grace"] = { "grace", seconds, "a number", SECONDS_ANY },
  ["--keep"] = { "keep", positive_integer, "a number", WHOLE_2_31 },
  ["--keep-age"] = { "keep_age", positive_seconds, "a number", SECONDS_POSITIVE },
  ["--prefetch"] = { "prefetch", whole_up_to_million, "a number", "a whole number from 0 to 1e6" },
  ["--delay"] = { "delay", seconds, "a number", SECONDS_ANY },
  ["--resolve"] = { "resolve", function(text)
    local n = tonumber(text)
    if n and n >= 0 and n <= RESOLVE_MAX then return n end
  end, "a number", ("a number of seconds from 0 to %d"):format(RESOLVE_MAX) },
  ["--keep-failed-age"] = { "keep_failed_age", positive_seconds, "a number", SECONDS_POSITIVE },
  ["--keep-logs"] = { "keep_logs", function(text)
    local n = tonumber(text)
    if n and n >= 0 and n <= 10000 and n % 1 == 0 then return n end
  end, "a number", "a whole number from 0 to 10000" },
  ["--state"] = { "state", function(text)
    if text == "waiting" or text == "delayed" or text == "active" or text == "completed" or text == "failed"
        or text == "waiting-children" then
      return text
    end
  end, "a state", "waiting, delayed, active, completed, failed or waiting-children" },
  ["--limit"] = { "limit", positive_integer, "a number", WHOLE_2_31 },
  ["--offset"] = { "offset", function(text)
    local n = tonumber(text)
    if n and n >= 0 and n <= 2 ^ 53 and n % 1 == 0 then return n end
  end, "a number", "a whole number, 0 or more" },
  ["--older-than"] = { "older_than", seconds, "a number", SECONDS_ANY },
  ["--line"] = { "line", positive_integer, "a number", "a line number of the library, 1 or more" },
  ["--metrics"] = { "metrics", path, "an address", "HOST:PORT to serve /metrics on, such as 127.0.0.1:9464" },
  ["--listen"] = { "listen", path, "an address", "HOST:PORT, such as 127.0.0.1:7411" },
  ["--token"] = { "token", path, "a token", "a text that the dashboard's users must give" },
  ["--cron"] = { "cron", path, "an expression", "5 fields: minute hour day-of-month month day-of-week" },
  ["--every"] = { "every", function(text)
    local n = tonumber(text)
    if n and n >= 1 and n <= SECONDS_MAX then return n end
  end, "a number", "a number of seconds from 1 to 1e9" },
  ["--tz"] = { "tz", path, "a zone", "UTC, local or an offset such as +05:30" },
  ["--start"] = { "start", path, "a time", "seconds since the epoch, or UTC such as 2026-12-01T03:00Z" },
  ["--stop"] = { "stop", path, "a time", "seconds since the epoch, or UTC such as 2026-12-01T03:00Z" },
  ["--catch-up"] = { "catch_up", function(text)
    if text == "none" or text == "one" then return text end
  end, "a value", "none (missed slots are skipped) or one (one job stands for them)" },
  ["--data"] = { "data", path, "JSON", "JSON text, such as '{\"a\":1}'" },
  ["--group"] = { "group", function(text) if #text <= 1024 then return path(text) end end, "a name",
    "a group's name of 1 to 1024 bytes" },
  ["--priority"] = { "priority", function(text) -- finite: "nan" and "inf" read as numbers
    local n = tonumber(text)
    if n and n > -math.huge and n < math.huge then return n end
  end, "a number", "a finite number (lower runs first)" },
}

local FLAGS = {
  ["-h"] = "help", ["--help"] = "help", ["--version"] = "version",
  ["-k"] = "keep_order", ["--keep-order"] = "keep_order", ["--resume"] = "resume",
  ["--watch"] = "watch", ["--progress"] = "progress", ["--dedupe"] = "dedupe", ["--raw"] = "raw",
  ["--until-empty"] = "until_empty", ["--quiet"] = "quiet", ["--verbose"] = "verbose", ["--json"] = "json",
  ["--all"] = "all", ["--cascade"] = "cascade", ["--clear"] = "clear", ["--yes"] = "yes", ["--force"] = "force",
}

-- An option with its value in the same word: `--name=value`, `-jVALUE` or
-- `-j=VALUE`. Returns the option's name and the value, or nil.
local function inline_value(word)
  local name, value = word:match("^(%-%-[%w-]+)=(.*)$")
  if name then return name, value end
  name, value = word:match("^(%-%a)(.+)$")
  if name and VALUED[name] then return name, (value:gsub("^=", "")) end
end

-- The value of valued option `name` (`value`, or nil when it is missing), or
-- nil and a message; command: the command named so far (moonjob limit's
-- limits take more than run's).
local function option_value(name, value, command)
  local spec = VALUED[name]
  local field, parse_value, needs, wants = spec[1], spec[2], spec[3], spec[4]
  if command == "limit" and spec.limit then wants = spec.limit end
  if value == nil or value == "" then
    return nil, ("%s needs %s: %s"):format(name, needs, wants)
  end
  local v = parse_value(value)
  if v == nil then return nil, ("%s needs %s, got '%s'"):format(name, wants, value) end
  return field, v
end

-- args.parse(args) -> options | nil, message
function M.parse(args)
  local o = { positional = {} }
  local i = 1
  while i <= #args do
    local a = args[i]
    local name, value = inline_value(a)
    name = name or a
    if FLAGS[a] then
      o[FLAGS[a]] = true
    elseif a == "--no-progress" then
      o.progress = false
    elseif VALUED[name] then
      if value == nil then i = i + 1; value = args[i] end
      local field, v = option_value(name, value, o.positional[1])
      if not field then return nil, v end
      o[field] = v
      o.given = o.given or {} -- (as written: a command that takes less says what it got)
      o.given[field] = { name, value }
      if field == "queue" then -- (moonjob worker serves each one given)
        o.queues = o.queues or {}
        o.queues[#o.queues + 1] = v
      end
    elseif a:sub(1, 1) == "-" and a ~= "-" then
      return nil, ("unknown option '%s'"):format(a)
    else
      o.positional[#o.positional + 1] = a
    end
    i = i + 1
  end
  return o
end

return M
