-- moonjob.cli.help -- the command line's help: one entry per command (its
-- synopsis, what it does, the options it takes), the texts of the options,
-- and "did you mean" for a mistyped command or option.
--
-- `moonjob --help` prints the overview: every command with its one-line
-- summary. `moonjob COMMAND --help` prints that command's section: its
-- synopsis, what it does and the text of each option it lists. A command
-- is added with one entry in COMMANDS; an option's text with one entry in
-- OPTIONS (an entry's own `notes` override the shared text for that command).
local M = {}

-- Every option's text, by the name a command lists it under: the option as
-- written, then its text in parts (wrapped when shown).
local OPTIONS = {
  ["--raw"] = { "--raw", "each input line is a job's data as it is, a string",
    "(no JSON needed; blank lines still run nothing)" },
  ["-j"] = { "-j, --concurrency N", "children to run (default: the number of CPUs; also --jobs N)" },
  ["-k"] = { "-k, --keep-order", "print results in input order (default: as they finish)" },
  ["--halt"] = { "--halt WHEN,fail=N", "stop after N failed lines: WHEN is now (running jobs",
    "are killed; exit 3) or soon (nothing more starts, running jobs finish; exit 4);",
    "fail=P% stops when P% of the lines finished have failed (from 3 finished lines)" },
  ["--rate"] = { "--rate N/s", "start at most N lines a second (also N/m, N/h; plain",
    "N is N/s): N whole lets N start together in each period (10/s, 60/m); N below 1",
    "or fractional spaces them evenly (0.5/s: one every 2 s); each line then runs",
    "as a job of its own" },
  ["--attempts"] = { "--attempts N", "runs per job before it fails for good (default 1)" },
  ["--memory-limit"] = { "--memory-limit SIZE", "each child's Lua heap at most SIZE (512M, 2G, 1.5G,",
    "64K, bytes): a job that needs more fails with ENOMEM and its child is replaced; none: no",
    "cap (default: $MOONJOB_MEMORY_LIMIT, else half the machine's memory shared among the",
    "children, at least 64M and at most 2G each)" },
  ["--backoff"] = { "--backoff SPEC", "wait between attempts: fixed:SECONDS or",
    "exponential:SECONDS[:JITTER] (JITTER 0..1)" },
  ["--joblog"] = { "--joblog FILE", "append one line per finished job to FILE" },
  ["--resume"] = { "--resume", "skip the lines FILE (--joblog) records as completed" },
  ["--timeout"] = { "--timeout S", "seconds a job may run; then it is interrupted, its",
    "cleanup runs, and it fails with ETIMEDOUT" },
  ["--kill-after"] = { "--kill-after S", "seconds after the timeout before the child is killed (default 5)" },
  ["--start-timeout"] = { "--start-timeout S", "seconds a child may take to load the processor",
    "(default 60); then the run stops with ELOAD" },
  ["--progress"] = { "--progress, --no-progress", "show a progress line and a summary on stderr, or",
    "not (default: when stderr is a terminal; none is drawn while the input is typed on a terminal)" },
  ["--redis"] = { "--redis URL", "redis://[user:password@]host[:port][/db]; Sentinel:",
    "redis+sentinel://S1:P1,S2:P2/MASTER[/DB]; Cluster: redis+cluster://H1:P1,H2:P2/;",
    "TLS: rediss://, rediss+sentinel://, rediss+cluster:// (CA: ?ca=PATH or $MOONJOB_REDIS_CA);",
    "default: $MOONJOB_REDIS (keeps a password out of `ps`)" },
  ["--queue"] = { "--queue NAME", "the queue's name" },
  ["--expire"] = { "--expire S", "a job not started within S seconds fails (EEXPIRED)",
    "instead of running late" },
  ["--debounce"] = { "--debounce ID:SECONDS", "one delayed job per ID; each line joins it (its data",
    "the line's) and starts its delay again: it runs once, SECONDS after the last line",
    "(not with --dedupe or --delay)" },
  ["--group-rate"] = { "--group-rate R", "each group's own rate (as --rate)" },
  ["--group-concurrency"] = { "--group-concurrency N", "each group's jobs running at once, at most N" },
  ["--clear"] = { "--clear", "lift every limit first (then set any given)" },
  ["--yes"] = { "--yes", "yes, remove the queue: required" },
  ["--force"] = { "--force", "remove it even while jobs run (their reports are then refused)" },
  ["--lease"] = { "--lease S", "seconds a fetched job is held before another worker may",
    "take it, renewed every S/12 (default 30)" },
  ["--grace"] = { "--grace S", "seconds running jobs get to finish when the worker stops (default 30)" },
  ["--prefetch"] = { "--prefetch N", "jobs held beyond the running ones (default: about",
    "100 ms of work per child, from the jobs' measured run time)" },
  ["--keep"] = { "--keep N, --keep-age S", "finished jobs kept in Redis, by count per state",
    "(default: any number) and age (default 86400 s: a day)" },
  ["--keep-failed-age"] = { "--keep-failed-age S", "seconds failed jobs are kept (default 604800: a week)" },
  ["--keep-logs"] = { "--keep-logs N", "log lines kept in Redis per job (default 100)" },
  ["--quiet"] = { "--quiet, --verbose", "no line per failed or retried job; a line per job,",
    "completed ones too" },
  ["--metrics"] = { "--metrics HOST:PORT", "serve /metrics for Prometheus there" },
  ["--priority"] = { "--priority P", "lower runs first (default 0)" },
  ["--delay"] = { "--delay S", "seconds before the jobs may run (default 0)" },
  ["--group"] = { "--group NAME", "the jobs' group (a tenant, a customer): groups take",
    "turns, each under its limits" },
  ["--dedupe"] = { "--dedupe", "each job's id from its line (SHA-1), so adding the same",
    "lines again adds nothing twice" },
  ["--resolve"] = { "--resolve S", "seconds a line whose reply was lost (Redis stalled, the",
    "link dropped) is asked for again, and Redis is waited for (default and most",
    "300; 0: such a line is unknown at once)" },
  ["--watch"] = { "--watch", "print the counts every second, with the rate and an ETA" },
  ["--until-empty"] = { "--until-empty", "with --watch: end when nothing waits or runs" },
  ["--json"] = { "--json", "NDJSON on a terminal too (off a terminal it always is)" },
  ["--state"] = { "--state S", "waiting (default), delayed, active, completed, failed or",
    "waiting-children (a flow's parents whose children have not all ended)" },
  ["--limit"] = { "--limit N", "at most N" },
  ["--offset"] = { "--offset N", "skip the first N (default 0)" },
  ["--older-than"] = { "--older-than S", "only jobs that ended more than S seconds ago (required;",
    "0: every one of them)" },
  ["--all"] = { "--all", "every failed job (--state completed: every completed one)" },
  ["--cascade"] = { "--cascade", "also a flow's child its parent waits for (the parent counts",
    "it as canceled: by default it then fails)" },
  ["--cron"] = { "--cron \"m h dom mon dow\"", "one job per time the 5-field cron expression names" },
  ["--every"] = { "--every S", "one job every S seconds (1 or more), on multiples of S since --start" },
  ["--tz"] = { "--tz Z", "the zone --cron is read in: UTC (default), local, a zone of the tz database such as Europe/Berlin (its daylight saving time kept), or an offset such as +05:30" },
  ["--start"] = { "--start T, --stop T", "seconds since the epoch, or UTC such as 2026-12-01T03:00Z" },
  ["--catch-up"] = { "--catch-up none|one", "slots missed while no worker ran: skipped, or one",
    "job for them (default one)" },
  ["--data"] = { "--data JSON", "each job's data (default null)" },
  ["--listen"] = { "--listen HOST:PORT", "default 127.0.0.1:7411 (loopback); another address",
    "needs a token" },
  ["--token"] = { "--token T", "what every visitor must give (?token=T); default:",
    "$MOONJOB_DASHBOARD_TOKEN (keeps it out of `ps`)" },
  ["--line"] = { "--line N", "the part and its line that a Redis error's user_function:N names" },
}

local JOB_OPTIONS = { "--attempts", "--backoff", "--timeout", "--kill-after", "--priority", "--delay", "--group" }
local function with(list, more)
  local t = {}
  for _, v in ipairs(list) do t[#t + 1] = v end
  for _, v in ipairs(more) do t[#t + 1] = v end
  return t
end

-- The commands, in the overview's order. name, summary (one line), usage
-- (the synopsis lines), about (what it does, more lines), options (names
-- in OPTIONS), notes (option name -> lines that replace its shared text).
M.COMMANDS = {
  { name = "run", summary = "run PROCESSOR once per NDJSON line of INPUT, in a pool of children",
    usage = { "moonjob run PROCESSOR [INPUT] [options]" },
    about = [[
Runs the processor file PROCESSOR once per line of INPUT, an NDJSON file
(one job's data per line, any JSON value; default: standard input), in a pool
of child processes. Prints one JSON line per finished line, as it finishes:
  {"line":1,"status":"completed","result":...,"attempts":1,"ms":0.4}
  {"line":2,"status":"failed","error":{"code":"...","message":"..."},"attempts":1,"ms":0.2}
What the processor prints goes to standard error as "[line N] text".
Plain-text lines (file names, words): --raw, e.g. ls *.log | moonjob run count.lua --raw
]],
    options = { "--raw", "-j", "--memory-limit", "-k", "--halt", "--rate", "--attempts", "--backoff", "--joblog", "--resume",
      "--timeout", "--kill-after", "--start-timeout", "--progress" } },
  { name = "worker", summary = "run jobs from a queue on Redis until SIGTERM or Ctrl-C",
    usage = { "moonjob worker PROCESSOR --queue NAME [--redis URL] [options]" },
    about = [[
Runs jobs from the queue until SIGTERM or Ctrl-C, then gives back what was
not started and exits 0 (README "Durable queues on Redis").
]],
    options = { "--redis", "--queue", "-j", "--memory-limit", "--lease", "--grace", "--prefetch", "--keep", "--keep-failed-age",
      "--keep-logs", "--quiet", "--metrics", "--timeout", "--kill-after", "--start-timeout", "--attempts",
      "--backoff" },
    notes = { ["--timeout"] = { "--timeout S", "as for run: the pool's defaults for the jobs it runs" },
      ["--queue"] = { "--queue NAME[,NAME...]", "the queue to serve; several (a,b, or --queue repeated): one",
        "worker serves them all, fetching from each in turn" } } },
  { name = "add", summary = "add one job per NDJSON line of INPUT to a queue; prints the ids",
    usage = { "moonjob add --queue NAME [--redis URL] [INPUT] [options]" },
    about = [[
Adds one job per NDJSON line of INPUT (default: standard input) and prints
each job's id, in input order (--raw: per line of text, its data a JSON
string). From a slow pipe (tail -f log | moonjob add) a line is sent at most
50 ms after it arrived.
]],
    options = with({ "--redis", "--queue", "--raw", "--dedupe", "--resolve" }, with(JOB_OPTIONS,
      { "--expire", "--debounce" })) },
  { name = "status", summary = "print a queue's counts (--watch: every second)",
    usage = { "moonjob status --queue NAME [--redis URL] [--watch [--until-empty]]",
      "    [--json]" },
    about = "Prints the queue's counts; --watch again every second, with the rate and an ETA.\n",
    options = { "--redis", "--queue", "--watch", "--until-empty", "--json" } },
  { name = "queues", summary = "the server's queues with their counts",
    usage = { "moonjob queues [--redis URL] [--json]" },
    about = [[
Prints the server's queues with their counts (NDJSON, or a table on a
terminal): completed and failed are the jobs kept now, completed_ever and
failed_ever every one that ever ended so; running is what the workers'
children run, held the other active jobs.
]],
    options = { "--redis", "--json" } },
  { name = "workers", summary = "the workers of a queue (or every queue), as their heartbeats say",
    usage = { "moonjob workers [--queue NAME] [--redis URL] [--json]" },
    about = [[
Prints the workers serving the queue (without --queue: every queue's), as
their heartbeats last said: host, pid, children, the jobs their children run,
when they started and were last seen. One gone without a word (kill -9) is
"lapsed" once it missed 3 beats (6 s by default), and dropped after 30.
]],
    options = { "--redis", "--queue", "--json" },
    notes = { ["--queue"] = { "--queue NAME", "only this queue's workers" } } },
  { name = "jobs", summary = "a page of a queue's jobs in one state",
    usage = { "moonjob jobs --queue NAME [--state S] [--limit N] [--offset N] [--json]" },
    about = "Prints a page of the queue's jobs in state S (NDJSON, or a table on a terminal).\n",
    options = { "--redis", "--queue", "--state", "--limit", "--offset", "--json" },
    notes = { ["--limit"] = { "--limit N", "jobs on the page: 1 to 1000 (default 20)" } } },
  { name = "job", summary = "one job: data, result or error, log, attempts, times",
    usage = { "moonjob job --queue NAME ID [--json]" },
    about = [[
Prints one job: data, result or error, log, attempts, times; a flow's parent:
its children; a flow's child: its parent.
]],
    options = { "--redis", "--queue", "--json" } },
  { name = "retry", summary = "run failed (or completed) jobs again",
    usage = { "moonjob retry --queue NAME ID... | --all [--state S] [--limit N]" },
    about = "Failed (or completed) jobs wait again, their attempts counted anew.\n",
    options = { "--redis", "--queue", "--all", "--state", "--limit", "--json" },
    notes = { ["--state"] = { "--state S", "with --all: failed (default) or completed" } } },
  { name = "remove", summary = "remove jobs that are not running",
    usage = { "moonjob remove --queue NAME ID... [--cascade]" },
    about = "Removes jobs that are not running (a flow's parent: its pending children are\ncanceled).\n",
    options = { "--redis", "--queue", "--cascade", "--json" } },
  { name = "promote", summary = "run delayed jobs now",
    usage = { "moonjob promote --queue NAME ID..." },
    about = "Delayed jobs may run now.\n",
    options = { "--redis", "--queue", "--json" } },
  { name = "clean", summary = "remove completed or failed jobs older than S seconds",
    usage = { "moonjob clean --queue NAME --state S --older-than S [--limit N]" },
    about = "Removes completed or failed jobs that ended more than --older-than seconds ago.\n",
    options = { "--redis", "--queue", "--state", "--older-than", "--limit", "--json" },
    notes = { ["--state"] = { "--state S", "completed or failed (required)" } } },
  { name = "pause", summary = "stop every worker fetching from a queue",
    usage = { "moonjob pause --queue NAME" },
    about = "Every worker on every host stops fetching from the queue within a second.\n",
    options = { "--redis", "--queue", "--json" } },
  { name = "resume", summary = "let workers fetch from a paused queue again",
    usage = { "moonjob resume --queue NAME" },
    about = "Workers fetch from the queue again.\n",
    options = { "--redis", "--queue", "--json" } },
  { name = "limit", summary = "set a queue's limits, on all its workers together",
    usage = { "moonjob limit --queue NAME [--rate R] [--concurrency N] [--group-rate R]",
      "    [--group-concurrency N] [--clear] [--json]" },
    about = [[
Sets the queue's limits, held by every worker on it together, and prints
them. R: 100/s, 10/1m, 3/250ms, 0.5/s (a fraction spaces starts evenly);
none lifts one limit; --clear lifts every one first.
]],
    options = { "--redis", "--queue", "--rate", "--concurrency", "--group-rate", "--group-concurrency", "--clear",
      "--json" },
    notes = { ["--rate"] = { "--rate R", "jobs started a period, across the queue's workers: 100/s, 10/1m,",
      "3/250ms, 0.5/s (one every 2 s); none lifts it" },
      ["--concurrency"] = { "--concurrency N", "the queue's jobs running at once, across its workers" } } },
  { name = "limits", summary = "a queue's limits, and what they hold back now",
    usage = { "moonjob limits --queue NAME [--json]" },
    about = "Prints the queue's limits and what they hold back now.\n",
    options = { "--redis", "--queue", "--json" } },
  { name = "drain", summary = "remove a queue's waiting and delayed jobs",
    usage = { "moonjob drain --queue NAME [--json]" },
    about = "Removes the jobs that wait (waiting and delayed) and says how many.\n",
    options = { "--redis", "--queue", "--json" } },
  { name = "obliterate", summary = "remove a queue: every job and key",
    usage = { "moonjob obliterate --queue NAME --yes [--force] [--json]" },
    about = "Removes the queue, every job and key; refused while jobs run unless --force.\n",
    options = { "--redis", "--queue", "--yes", "--force", "--json" } },
  { name = "schedule", summary = "repeating jobs: schedule add, list, next, remove",
    usage = { "moonjob schedule add --queue NAME ID (--cron EXPR | --every S) [options]",
      "moonjob schedule list --queue NAME [--json]",
      "moonjob schedule next --queue NAME ID [--limit N] [--json]",
      "moonjob schedule remove --queue NAME ID..." },
    about = [[
Repeating jobs, kept and fired by Redis while a worker runs
(docs/guide/schedules.md). add: one job per due time, its id s:ID:<ms>, with
add's job options; list: the schedules, the next due first; next: a
schedule's next slots as Redis computes them in its zone (--limit N, default
5), a preview; remove: the schedules (the jobs they made stay).
]],
    options = with({ "--redis", "--queue", "--cron", "--every", "--tz", "--start", "--limit", "--catch-up",
      "--data" }, with(JOB_OPTIONS, { "--json" })),
    notes = { ["--limit"] = { "--limit N", "add: at most N runs; next: how many slots to show (default 5)" } } },
  { name = "dashboard", summary = "serve the web dashboard until Ctrl-C",
    usage = { "moonjob dashboard [--redis URL] [--listen HOST:PORT] [--token T]" },
    about = [[
Serves the web dashboard until Ctrl-C: queues, jobs, actions, /metrics
(docs/guide/dashboard.md).
]],
    options = { "--redis", "--listen", "--token" } },
  { name = "library", summary = "print the Redis function library, for an admin to load",
    usage = { "moonjob library [--line N]" },
    about = [[
Prints the Redis function library, for an admin to load:
moonjob library | redis-cli -x FUNCTION LOAD REPLACE (docs/REDIS.md).
]],
    options = { "--line" } },
}

local BY_NAME = {}
for _, c in ipairs(M.COMMANDS) do BY_NAME[c.name] = c end

-- The command named `name`, or nil.
function M.command(name)
  return BY_NAME[name]
end

-- The commands' names, in order.
function M.names()
  local t = {}
  for i, c in ipairs(M.COMMANDS) do t[i] = c.name end
  return t
end

M.EXIT_STATUS = [[
exit status: 0 every job completed (or what was asked was done), 1 some job
failed (or something was refused), 2 usage, set-up or I/O error (the
processor cannot load, the joblog cannot be written), 3 stopped by --halt
now, 4 stopped by --halt soon, 128+N when stopped by signal N (130 Ctrl-C,
143 SIGTERM, 129 SIGHUP)
]]

local WIDTH, COLUMN = 79, 24 -- a line's most characters; where an option's text begins

-- `text` cut into lines of at most `width` characters, at spaces.
local function wrapped(text, width)
  local lines, line = {}, ""
  for word in text:gmatch("%S+") do
    if line ~= "" and #line + 1 + #word > width then lines[#lines + 1], line = line, word
    else line = line == "" and word or line .. " " .. word end
  end
  lines[#lines + 1] = line
  return lines
end

-- An option's text (the option as written, then its text in parts) as
-- lines: the option, its text from column COLUMN (on the next line when the
-- option is longer), wrapped.
local function option_lines(text)
  local body = wrapped(table.concat(text, " ", 2), WIDTH - COLUMN)
  local head, indent = "  " .. text[1], (" "):rep(COLUMN)
  local out = {}
  if #head < COLUMN - 1 then out[1] = head .. (" "):rep(COLUMN - #head) .. table.remove(body, 1) else out[1] = head end
  for _, line in ipairs(body) do out[#out + 1] = indent .. line end
  return table.concat(out, "\n") .. "\n"
end

-- `moonjob NAME --help`: the command's synopsis, what it does, its options.
function M.command_help(name)
  local c = assert(BY_NAME[name], name)
  local parts = { "usage: " .. table.concat(c.usage, "\n       ") .. "\n\n", c.about, "\noptions:\n" }
  for _, option in ipairs(c.options) do
    local text = (c.notes and c.notes[option]) or assert(OPTIONS[option], option)
    parts[#parts + 1] = option_lines(text)
  end
  parts[#parts + 1] = option_lines({ "-h, --help", "show this help" })
  parts[#parts + 1] = "\n" .. M.EXIT_STATUS
  return table.concat(parts)
end

-- `moonjob --help`: every command with its summary.
function M.overview()
  local parts = { "usage: moonjob run PROCESSOR [INPUT] [options]\n",
    "       moonjob worker PROCESSOR --queue NAME [--redis URL] [options]\n",
    "       moonjob COMMAND [options]\n\n", BY_NAME.run.about, "\ncommands:\n" }
  for _, c in ipairs(M.COMMANDS) do parts[#parts + 1] = ("  %-11s %s\n"):format(c.name, c.summary) end
  parts[#parts + 1] = "\nEach command's own options: moonjob COMMAND --help (moonjob run --help).\n"
    .. "The commands on Redis take --redis URL (default: $MOONJOB_REDIS) and, on one\n"
    .. "queue, --queue NAME.\n\n"
  parts[#parts + 1] = option_lines({ "-h, --help", "show this help (moonjob COMMAND --help: that command's)" })
  parts[#parts + 1] = option_lines({ "--version", "show the version" })
  parts[#parts + 1] = "\n" .. M.EXIT_STATUS
  return table.concat(parts)
end

-------------------------------------------------------- did you mean ---

-- The edit distance (insertions, deletions, substitutions, swaps of two
-- neighbours) between a and b.
local function distance(a, b)
  local d = {}
  for i = 0, #a do d[i] = { [0] = i } end
  for j = 0, #b do d[0][j] = j end
  for i = 1, #a do
    for j = 1, #b do
      local cost = a:byte(i) == b:byte(j) and 0 or 1
      d[i][j] = math.min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost)
      if i > 1 and j > 1 and a:byte(i) == b:byte(j - 1) and a:byte(i - 1) == b:byte(j) then
        d[i][j] = math.min(d[i][j], d[i - 2][j - 2] + 1)
      end
    end
  end
  return d[#a][#b]
end

-- The shortest of `candidates` that cut-short `word` (3 letters or more)
-- begins, when each other one it begins starts with it too (work: worker,
-- not workers), else nil.
local function completed(word, candidates)
  if #word < 3 then return nil end
  local starts = {}
  for _, c in ipairs(candidates) do
    if c ~= word and c:sub(1, #word) == word then starts[#starts + 1] = c end
  end
  table.sort(starts, function(a, b) return #a < #b or (#a == #b and a < b) end)
  local shortest = starts[1]
  for i = 2, #starts do
    if starts[i]:sub(1, #shortest) ~= shortest then return nil end
  end
  return shortest
end

-- The word of `candidates` that `word` most likely mistypes: the one it
-- begins (completed), else the nearest by edit distance within a third of
-- its length (at least 1, at most 2). Nil when none is near, or two are as
-- near.
function M.suggest(word, candidates)
  local starts = completed(word, candidates)
  if starts then return starts end
  local best, best_d, tie
  local most = math.max(1, math.min(2, math.floor(#word / 3)))
  for _, c in ipairs(candidates) do
    local d = distance(word, c)
    if d <= most then
      if best_d == nil or d < best_d then best, best_d, tie = c, d, false
      elseif d == best_d then tie = true end
    end
  end
  if not tie then return best end
end

-- " (did you mean 'x'?)" for `word` among `candidates`, or "".
function M.did_you_mean(word, candidates)
  local s = M.suggest(word, candidates)
  return s and (" (did you mean '%s'?)"):format(s) or ""
end

return M
