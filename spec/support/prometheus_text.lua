-- Reading Prometheus' text format back in specs, and checking it with
-- Debian's promtool (package prometheus, installed by make deps).
--
-- parse is deliberately small: it reads what moonjob.prometheus writes
-- (one sample per line, no timestamps) so that a spec can check values;
-- promtool is the judge of the format itself.
local h = require "helpers"

local M = {}

local UNESCAPE = { ["\\"] = "\\", ['"'] = '"', n = "\n" }

-- '{a="x",b="y"}' -> { a = "x", b = "y" } (escapes undone)
local function parse_labels(text)
  local labels = {}
  local i = 2
  while i < #text do
    local name, after = text:match("^([%a_][%w_]*)=\"()", i)
    assert(name, "bad labels at " .. i .. ": " .. text)
    local value, j = {}, after
    while true do
      local c = text:sub(j, j)
      assert(c ~= "", "unterminated label value: " .. text)
      if c == "\\" then
        value[#value + 1] = assert(UNESCAPE[text:sub(j + 1, j + 1)], "bad escape: " .. text)
        j = j + 2
      elseif c == '"' then
        break
      else
        value[#value + 1] = c
        j = j + 1
      end
    end
    labels[name] = table.concat(value)
    i = j + 1
    if text:sub(i, i) == "," then i = i + 1 end
  end
  return labels
end

-- parse(text) -> { samples = { { name, labels, value } ... }, help = { name = text },
-- type = { name = type } }; raises on a line it cannot read.
function M.parse(text)
  local out = { samples = {}, help = {}, type = {}, families = {} }
  for line in text:gmatch("([^\n]*)\n") do
    local kind, name, rest = line:match("^# (%u+) ([%w_:]+) (.*)$")
    if kind == "HELP" then
      assert(not out.help[name], "HELP twice for " .. name)
      out.help[name] = rest
      out.families[#out.families + 1] = name
    elseif kind == "TYPE" then
      assert(not out.type[name], "TYPE twice for " .. name)
      out.type[name] = rest
    else
      local sample, labels, value = line:match("^([%w_:]+)(%b{}) (%S+)$")
      if not sample then
        sample, value = line:match("^([%w_:]+) (%S+)$")
        labels = "{}"
      end
      assert(sample, "cannot read the line: " .. line)
      local number = ({ ["+Inf"] = math.huge, ["-Inf"] = -math.huge })[value] or tonumber(value)
      if value == "NaN" then number = 0 / 0 end
      assert(number, "not a number: " .. line)
      out.samples[#out.samples + 1] = { name = sample, labels = parse_labels(labels), value = number }
    end
  end
  return out
end

-- value(parsed, name, labels) -> the value of the one sample with that name
-- and those labels exactly (nil when none); raises when there are several.
function M.value(parsed, name, labels)
  labels = labels or {}
  local found
  for _, s in ipairs(parsed.samples) do
    local same = s.name == name
    for k, v in pairs(labels) do same = same and s.labels[k] == v end
    for k in pairs(s.labels) do same = same and labels[k] ~= nil end
    if same then
      assert(found == nil, "two samples " .. name)
      found = s.value
    end
  end
  return found
end

-- promtool_check(text) -> status, output: `promtool check metrics` on the
-- text (0 and no output: valid, no lint problem).
function M.promtool_check(text)
  local found = h.sh("command -v promtool")
  assert(found ~= "", "promtool is missing: make deps installs Debian's prometheus package")
  local out, err, status = h.sh("promtool check metrics", text)
  return status, out .. err
end

return M
