-- moonjob.codec.resultline -- the result lines of `moonjob run`, one JSON object per
-- input line:
--   {"line":1,"status":"completed","result":...,"attempts":1,"ms":0.4}
--   {"line":2,"status":"failed","error":{"code":"...","message":"..."},"attempts":1,"ms":0.2}
--
-- Written in two places from this one module, so that both write the same
-- bytes: the parent (moonjob.cli.output) for a line run on its own, and the child
-- (moonjob.child.batch) for the lines of a batch, which it formats itself so
-- that the parent only copies them out. The put_* forms append to a
-- string.buffer and make no string: the child's per-line path.
local buffer = require "string.buffer"
local json = require "moonjob.codec.json"
local valid_text = require("moonjob.codec.utf8").valid_text

local M = {}

-- Kept at load: in a child, a processor may remove or replace the globals
-- (`pcall = nil`, `math = nil`), and the next job must still run.
local assert, ipairs, pairs, tostring, type = assert, ipairs, pairs, tostring, type
local floor, sort = math.floor, table.sort

-- The text of the integers 0..999 and of a thousandth's digits after the
-- point (".4", ".41", ".412"; "" for none): a batch writes a number per line
-- for its attempt and its milliseconds, and a number written by string.buffer
-- costs as much as the rest of the line.
local SMALL, THOUSANDTHS = {}, {}
for n = 0, 999 do
  SMALL[n] = tostring(n)
  local digits = ("%03d"):format(n):gsub("0+$", "")
  THOUSANDTHS[n] = digits == "" and "" or "." .. digits
end

-- Appends milliseconds, to the microsecond, to string.buffer `out`, the way
-- json.number_text writes them (no trailing zeros), without making a string
-- or searching for the shortest form.
local function put_ms(out, ms)
  local us = floor(ms * 1000 + 0.5)
  if us < 0 or us >= 1e15 then return out:put(json.number_text(us / 1000)) end
  local whole = floor(us / 1000)
  return out:put(SMALL[whole] or whole, THOUSANDTHS[us - whole * 1000])
end

-- Appends to string.buffer `out` the line of a job that completed with
-- `result_json` (exact JSON text): the child's per-line path, which makes no
-- string of it.
function M.put_completed(out, line, result_json, attempts, ms)
  out:put('{"line":', line, ',"status":"completed","result":', result_json, ',"attempts":',
    SMALL[attempts] or attempts, ',"ms":')
  return put_ms(out, ms):put("}\n")
end

local scratch = buffer.new()

-- The line of a job that completed with `result_json` (exact JSON text).
function M.completed(line, result_json, attempts, ms)
  return M.put_completed(scratch:reset(), line, result_json, attempts, ms):tostring()
end

-- The fields of an error besides its code and message that go in its line,
-- sorted by name: the processor's own (error({ code = "EBADSKU", sku = "A-1" })),
-- and moonjob's (ECRASH's pid and signal, ETIMEDOUT's killed). The traceback
-- stays out of the line; a value JSON cannot hold (a NaN, a function, a
-- table with a boolean key) is written as a string that says so. Text that is not UTF-8 (a
-- message, a name, a string value) has its bad bytes replaced by U+FFFD:
-- the line is always written, and always JSON.
local NOT_IN_LINE = { code = true, message = true, traceback = true }

local function text(s)
  return assert(json.encode(valid_text(tostring(s))))
end

local function put_error_fields(out, err)
  local names = nil
  for name in pairs(err) do
    if type(name) == "string" and not NOT_IN_LINE[name] then
      names = names or {}
      names[#names + 1] = name
    end
  end
  if not names then return end
  sort(names)
  for _, name in ipairs(names) do
    local value, why = err[name], nil
    if type(value) == "string" then value = text(value) else value, why = json.encode(value) end
    out:put(",", text(name), ":", value or text("[cannot be written as JSON: " .. tostring(why) .. "]"))
  end
end

-- Appends to string.buffer `out` the line of a job that failed with err (a
-- table with code and message, and maybe fields of its own).
function M.put_failed(out, line, err, attempts, ms)
  out:put('{"line":', line, ',"status":"failed","error":{"code":', text(err.code), ',"message":', text(err.message))
  put_error_fields(out, err)
  out:put('},"attempts":', attempts, ',"ms":')
  return put_ms(out, ms):put("}\n")
end

-- The line of a job that failed with err.
function M.failed(line, err, attempts, ms)
  return M.put_failed(scratch:reset(), line, err, attempts, ms):tostring()
end

return M
