-- moonjob.prometheus -- writing metrics in Prometheus' text exposition format
-- (version 0.0.4, the one `promtool check metrics` reads).
--
--   local text = prometheus.render({
--     { name = "moonjob_jobs_completed_total", help = "Jobs completed.", type = "counter",
--       samples = { { labels = { queue = "a" }, value = 3 }, { labels = { queue = "b" }, value = 5 } } },
--     { name = "moonjob_job_duration_seconds", help = "Run time.", type = "histogram",
--       samples = { prometheus.histogram({ queue = "a" }, { 0.1, 1 }, { 4, 2, 1 }, 2.5) } },
--   })
--
-- A family is { name, help, type = "counter" | "gauge" | "histogram" |
-- "untyped", samples }; each sample is { labels = { name = value }, value =
-- number }, or for a histogram what prometheus.histogram returns. Families
-- given twice under one name (several pools, several queues) are written
-- once, their samples together, in the order first seen. Label values and
-- HELP text are escaped; numbers are written as promtool reads them (whole
-- numbers without an exponent, +Inf, -Inf, NaN).
--
-- Bad input raises an error naming the family and what is wrong: a name or
-- label name outside Prometheus' rules (a label name starting with "__" is
-- reserved), a counter whose name does not end in _total (the convention
-- promtool's lint checks), a value that is not a number, the same label set
-- twice in a family, a histogram's bounds not increasing.
--
-- Caveat: no timestamps, no summaries; the writer keeps no state, so a
-- counter's monotonicity is the caller's.
local M = {}

local TYPES = { counter = true, gauge = true, histogram = true, untyped = true }

-------------------------------------------------------------- numbers ---

-- A number as the text format writes it: whole numbers without an exponent
-- (up to 2^53, where every whole number is exact), else the shortest
-- decimal that reads back as the same double.
local function format_number(v)
  if v ~= v then return "NaN" end
  if v == math.huge then return "+Inf" end
  if v == -math.huge then return "-Inf" end
  if v == math.floor(v) and v >= -2 ^ 53 and v <= 2 ^ 53 then
    return ("%.0f"):format(v)
  end
  for digits = 15, 17 do
    local s = ("%." .. digits .. "g"):format(v)
    if tonumber(s) == v then return s end
  end
  return ("%.17g"):format(v)
end
M.format_number = format_number

--------------------------------------------------------------- checks ---

local function fail(family, message)
  error(("moonjob.prometheus: metric '%s': %s"):format(tostring(family), message), 0)
end

local function check_family(f)
  if type(f) ~= "table" then
    error("moonjob.prometheus: each metric family must be a table { name, help, type, samples }", 0)
  end
  local name = f.name
  if type(name) ~= "string" or not name:match("^[a-zA-Z_:][a-zA-Z0-9_:]*$") then
    fail(name, "the name must match [a-zA-Z_:][a-zA-Z0-9_:]*")
  end
  if not TYPES[f.type] then
    fail(name, "type must be \"counter\", \"gauge\", \"histogram\" or \"untyped\", not " .. tostring(f.type))
  end
  if type(f.help) ~= "string" or f.help == "" then fail(name, "help must be a non-empty string") end
  if f.type == "counter" and not name:match("_total$") then
    fail(name, "a counter's name must end in _total")
  elseif f.type ~= "counter" and name:match("_total$") then
    fail(name, "only a counter's name may end in _total")
  end
  if type(f.samples) ~= "table" then fail(name, "samples must be a list (table)") end
end

local function check_value(family, v, what)
  if type(v) ~= "number" then
    fail(family, ("%s must be a number, not %s"):format(what, type(v) == "nil" and "nil" or type(v)))
  end
end

------------------------------------------------------------- escaping ---

local LABEL_ESCAPES = { ["\\"] = "\\\\", ['"'] = '\\"', ["\n"] = "\\n" }
local HELP_ESCAPES = { ["\\"] = "\\\\", ["\n"] = "\\n" }

local function escape_label_value(s)
  return (s:gsub('[\\"\n]', LABEL_ESCAPES))
end

local function escape_help(s)
  return (s:gsub("[\\\n]", HELP_ESCAPES))
end
M.escape_label_value, M.escape_help = escape_label_value, escape_help

--------------------------------------------------------------- labels ---

-- '{a="x",b="y"}' (names sorted), or "" without labels. `extra` (the le of
-- a histogram's bucket, already formatted) comes last.
local function label_text(family, labels, extra)
  if labels == nil then labels = {} end
  if type(labels) ~= "table" then fail(family, "a sample's labels must be a table { name = value }") end
  local names = {}
  for k, v in pairs(labels) do
    if type(k) ~= "string" or not k:match("^[a-zA-Z_][a-zA-Z0-9_]*$") then
      fail(family, ("label name '%s' must match [a-zA-Z_][a-zA-Z0-9_]*"):format(tostring(k)))
    end
    if k:sub(1, 2) == "__" then
      fail(family, ("label name '%s': names starting with __ are reserved"):format(k))
    end
    if type(v) ~= "string" and type(v) ~= "number" then
      fail(family, ("label '%s' must be a string or a number, not %s"):format(k, type(v)))
    end
    names[#names + 1] = k
  end
  table.sort(names)
  local parts = {}
  for i, k in ipairs(names) do
    local v = labels[k]
    if type(v) == "number" then v = format_number(v) end
    parts[i] = ('%s="%s"'):format(k, escape_label_value(v))
  end
  if extra then parts[#parts + 1] = extra end
  if #parts == 0 then return "" end
  return "{" .. table.concat(parts, ",") .. "}"
end

------------------------------------------------------------ histogram ---

-- prometheus.histogram(labels, bounds, counts, sum) -> a histogram sample.
-- bounds: the buckets' upper bounds, increasing and finite (+Inf is added);
-- counts: how many observations fell in each bucket, not cumulative:
-- counts[i] those <= bounds[i] and > bounds[i - 1], counts[#bounds + 1]
-- those above the last bound; sum: the observations' sum. The tables are
-- read when rendered, not copied.
function M.histogram(labels, bounds, counts, sum)
  return { labels = labels, bounds = bounds, counts = counts, sum = sum }
end

local function check_histogram(family, s)
  local bounds, counts = s.bounds, s.counts
  if type(bounds) ~= "table" or type(counts) ~= "table" then
    fail(family, "a histogram sample needs bounds and counts (prometheus.histogram)")
  end
  for i = 1, #bounds do
    check_value(family, bounds[i], "a bucket bound")
    if not (bounds[i] < math.huge) or (i > 1 and not (bounds[i] > bounds[i - 1])) then
      fail(family, "bucket bounds must be finite and increasing (+Inf is added)")
    end
  end
  if #counts ~= #bounds + 1 then
    fail(family, ("%d bounds need %d counts (the last: above the last bound), not %d")
      :format(#bounds, #bounds + 1, #counts))
  end
  for i = 1, #counts do check_value(family, counts[i], "a bucket's count") end
  check_value(family, s.sum, "a histogram's sum")
  if type(s.labels) == "table" and s.labels.le ~= nil then
    fail(family, "a histogram's labels cannot include le")
  end
end

-- Writes a histogram sample's lines: cumulative buckets, +Inf, _sum, _count.
local function put_histogram(out, name, s)
  check_histogram(name, s)
  local bounds, counts, total = s.bounds, s.counts, 0
  for i = 1, #bounds + 1 do
    total = total + counts[i]
    local le = ('le="%s"'):format(i <= #bounds and format_number(bounds[i]) or "+Inf")
    out[#out + 1] = ("%s_bucket%s %s\n"):format(name, label_text(name, s.labels, le), format_number(total))
  end
  local labels = label_text(name, s.labels)
  out[#out + 1] = ("%s_sum%s %s\n"):format(name, labels, format_number(s.sum))
  out[#out + 1] = ("%s_count%s %s\n"):format(name, labels, format_number(total))
  return labels
end

--------------------------------------------------------------- render ---

-- The families by name, in the order first seen; samples of a name given
-- twice are put together (its help and type must agree).
local function merged(families)
  if type(families) ~= "table" then
    error("moonjob.prometheus.render: expects a list of metric families", 0)
  end
  local order, by_name = {}, {}
  for _, f in ipairs(families) do
    check_family(f)
    local seen = by_name[f.name]
    if not seen then
      seen = { name = f.name, help = f.help, type = f.type, lists = {} }
      by_name[f.name] = seen
      order[#order + 1] = seen
    elseif seen.type ~= f.type or seen.help ~= f.help then
      fail(f.name, "given twice with a different type or help")
    end
    seen.lists[#seen.lists + 1] = f.samples
  end
  return order
end

-- Writes one family's lines; the same label set twice is an error.
local function put_family(out, f)
  out[#out + 1] = ("# HELP %s %s\n# TYPE %s %s\n"):format(f.name, escape_help(f.help), f.name, f.type)
  local seen = {}
  for _, samples in ipairs(f.lists) do
    for _, s in ipairs(samples) do
      if type(s) ~= "table" then fail(f.name, "each sample must be a table { labels, value }") end
      local labels
      if f.type == "histogram" then
        labels = put_histogram(out, f.name, s)
      else
        check_value(f.name, s.value, "a sample's value")
        labels = label_text(f.name, s.labels)
        out[#out + 1] = ("%s%s %s\n"):format(f.name, labels, format_number(s.value))
      end
      if seen[labels] then fail(f.name, "the same labels twice: " .. (labels == "" and "{}" or labels)) end
      seen[labels] = true
    end
  end
end

-- prometheus.render(families) -> the exposition text (empty for no families).
function M.render(families)
  local out = {}
  for _, f in ipairs(merged(families)) do put_family(out, f) end
  return table.concat(out)
end

-- The content type to serve the text with.
M.CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

return M
