-- cli -- what the specs of the `moonjob` command share (spec/cli/*): the
-- command line to run it from the source tree, small readers and writers of
-- NDJSON files, and a counter of the result lines a run printed.
--
-- Caveat: MOONJOB runs scripts/moonjob with the tree's modules and build
-- (helpers.LUAJIT): the specs run from the worktree's root.
local h = require "helpers"
local json = require "moonjob.codec.json"
local luassert = require "luassert"

local M = {}

M.MOONJOB = h.LUAJIT .. " scripts/moonjob "
M.HABITS = "spec/fixtures/habits.lua"

-- Output lines decoded, keyed by input line; every line must be valid JSON.
function M.by_line(out)
  local lines, n = {}, 0
  for text in out:gmatch("[^\n]+") do
    local v = assert(json.decode(text), "not JSON: " .. text)
    lines[v.line] = v
    n = n + 1
  end
  return lines, n
end

-- NDJSON output decoded, a row per line; every line must be valid JSON.
function M.ndjson(out)
  local rows = {}
  for text in out:gmatch("[^\n]+") do rows[#rows + 1] = assert(json.decode(text), "not JSON: " .. text) end
  return rows
end

-- An input file of the given lines (strings, or tables written as JSON).
function M.input_file(list)
  local t = {}
  for i, v in ipairs(list) do t[i] = type(v) == "string" and v or assert(json.encode(v)) end
  return h.write_file(os.tmpname(), table.concat(t, "\n") .. "\n")
end

-- The loop's clock, in seconds.
function M.now() return require("moonjob.loop").now() / 1000 end

-- The whole of file `path`, or nil when it cannot be read.
function M.read(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

-- The line numbers of the whole result lines in `text` (a line cut short,
-- without its newline, is not printed), each counted in `seen`; a line seen
-- twice fails the test (`what` names the output in the message).
function M.count_lines(text, seen, what)
  for line in (text or ""):gmatch('{"line":(%d+),[^\n]*\n') do
    line = tonumber(line)
    luassert.is_nil(seen[line], ("line %d printed twice (%s)"):format(line, what))
    seen[line] = true
  end
  return seen
end

-- NDJSON input: the numbers 1..n, one per line.
function M.numbers(n)
  local t = {}
  for i = 1, n do t[i] = tostring(i) end
  return table.concat(t, "\n") .. "\n"
end

-- Calls fn with io.stderr replaced; returns fn's result and what it wrote.
function M.stderr_of(fn)
  local said, saved = {}, io.stderr
  io.stderr = { write = function(_, ...) for _, s in ipairs({ ... }) do said[#said + 1] = s end end }
  local ok, result = pcall(fn)
  io.stderr = saved
  assert(ok, result)
  return result, table.concat(said)
end

return M
