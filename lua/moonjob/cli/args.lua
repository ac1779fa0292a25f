-- moonjob.cli.args -- the parser that turns the command line's arguments
-- into one table of options for every command (their help: moonjob.cli.help).
--
-- Options are written the ways GNU tools take them: `-j 4`, `-j4`, `-j=4`,
-- `--concurrency 4`, `--concurrency=4`. A value that is missing or wrong is a
-- usage error naming the option and what it wants ("-j needs a number: a
-- whole number from 1 to 1024"). `--halt` takes GNU parallel's WHEN,fail=N
-- and WHEN,fail=P% (WHEN: now or soon), or never.
local help = require "moonjob.cli.help"

local M = {}

local Options = require "moonjob.pool.options"
local SECONDS_MAX = Options.SECONDS_MAX -- the pool's own bound on its times
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
  ["--memory-limit"] = { "memory_limit", Options.size, "a size", Options.SIZE_WANTS }, -- none: false
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
  ["--redis"] = { "redis", path, "a URL", "a URL: redis://[user:password@]host[:port][/db]"
    .. " (or rediss://, redis+sentinel://, redis+cluster://...)" },
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

-- Every option the parser knows, sorted.
function M.option_names()
  local t = { "--no-progress" }
  for name in pairs(VALUED) do t[#t + 1] = name end
  for name in pairs(FLAGS) do t[#t + 1] = name end
  table.sort(t)
  return t
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
      return nil, ("unknown option '%s'%s"):format(a, help.did_you_mean(name, M.option_names()))
    else
      o.positional[#o.positional + 1] = a
    end
    i = i + 1
  end
  return o
end

return M
