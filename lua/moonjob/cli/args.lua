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

-- --rate: N/s, N/m, N/h or N (per second) -> the pool's { max, per }. A
-- whole N allows bursts of N in each period; any other N, one start every
-- period / N (0.5/s: one every 2 s).
local RATE_PERIODS = { s = 1, m = 60, h = 3600 }
local function rate_spec(text)
  local n, unit = text:match("^(%d*%.?%d+)/([smh])$")
  if not n then n, unit = text:match("^(%d*%.?%d+)$"), "s" end
  n = tonumber(n)
  if not (n and n > 0 and n <= 1e6) then return nil end
  local period = RATE_PERIODS[unit]
  if n == math.floor(n) then return { max = n, per = period } end
  if period / n > SECONDS_MAX then return nil end -- one line per more than 1e9 s
  return { max = 1, per = period / n }
end

local function path(text)
  if text ~= "" then return text end
end

local WHOLE_1024 = "a whole number from 1 to 1024"
local WHOLE_2_31 = "a whole number from 1 to 2^31"
local SECONDS_POSITIVE = "a number of seconds from 0.001 to 1e9"
local SECONDS_ANY = "a number of seconds from 0 to 1e9"

-- option -> { field, parser, what it needs (in short), what it wants (in full) }
local VALUED = {
  ["-j"] = { "concurrency", children, "a number", WHOLE_1024 },
  ["--concurrency"] = { "concurrency", children, "a number", WHOLE_1024 },
  ["--jobs"] = { "concurrency", children, "a number", WHOLE_1024 }, -- GNU parallel's name
  ["--attempts"] = { "attempts", positive_integer, "a number", WHOLE_2_31 },
  ["--memory-limit"] = { "memory_limit", Options.size, "a size", Options.SIZE_WANTS }, -- none: false
  ["--rate"] = { "rate", rate_spec, "a rate",
    "N/s, N/m or N/h such as 10/s or 0.5/s (N above 0, at most 1e6)" },
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
  ["--tz"] = { "tz", path, "a zone", "UTC, local, a zone such as Europe/Berlin, or an offset such as +05:30" },
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
  ["--all"] = "all", ["--cascade"] = "cascade",
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
-- nil and a message.
local function option_value(name, value)
  local spec = VALUED[name]
  local field, parse_value, needs, wants = spec[1], spec[2], spec[3], spec[4]
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
      local field, v = option_value(name, value)
      if not field then return nil, v end
      o[field] = v
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
