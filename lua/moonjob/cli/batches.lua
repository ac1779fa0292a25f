-- moonjob.cli.batches -- the command line's batches of lines: text helpers.
--
-- `moonjob run` hands tiny jobs to its children in batches: one pool job
-- carries many NDJSON lines (pool:add's `lines` option), the child runs the
-- processor once per line and writes each line's result line itself
-- (moonjob.child.batch, moonjob.codec.resultline). A batch's lines are
-- numbered by position, 1 to count; these helpers cut, blank and read such blocks of text. They
-- scan text only for what is rare (lines handed back, --resume, a crash):
-- the common path (a batch that completes) costs one match per batch.
local M = {}

-- The byte offset where position `pos` (1-based) starts in block `text`, or
-- nil when the block has fewer lines.
local function start_of(text, pos)
  local at = 1
  for _ = 2, pos do
    local nl = text:find("\n", at, true)
    if not nl then return nil end
    at = nl + 1
  end
  return at
end

-- The lines `from` to `to` of block `text`, joined by newlines.
function M.slice(text, from, to)
  local a = start_of(text, from)
  local b = start_of(text, to + 1)
  return text:sub(a, b and b - 2 or #text)
end

-- Block `text` (first line numbered `first`, `count` lines) with the lines
-- that skip(line_number) names made blank (they run as nothing).
function M.blank(text, first, count, skip)
  local out, at = {}, 1
  for i = 0, count - 1 do
    local nl = text:find("\n", at, true) or #text + 1
    out[#out + 1] = skip(first + i) and "" or text:sub(at, nl - 1)
    at = nl + 1
  end
  return table.concat(out, "\n")
end

-- A batch's DONE result: lines run, completed, failed, and the result lines.
function M.parse_done(bytes)
  local run, completed, failed, at = bytes:match("^(%d+) (%d+) (%d+)\n()")
  if not run then return nil end
  return tonumber(run), tonumber(completed), tonumber(failed), bytes:sub(at)
end

-- How many of the result lines in `text` completed and failed (after a
-- crash or while a batch runs, when no DONE header counted them). Results are
-- one-line JSON, so a record starts each line.
function M.count(text)
  local lines, failed = 0, 0
  for _ in text:gmatch("\n") do lines = lines + 1 end
  for _ in ("\n" .. text):gmatch('\n{"line":%d+,"status":"failed"') do failed = failed + 1 end
  return lines - failed, failed
end

-- The positions from `from` to `to` of block `text` that are not blank
-- lines (they ran, or would have), in one pass.
function M.non_blank(text, from, to)
  local found, at, pos = {}, 1, 1
  while pos <= to do
    local nl = text:find("\n", at, true) or #text + 1
    if pos >= from and text:sub(at, nl - 1):find("%S") then found[#found + 1] = pos end
    at, pos = nl + 1, pos + 1
  end
  return found
end

return M
