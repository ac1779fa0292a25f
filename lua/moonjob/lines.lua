-- moonjob.lines -- the result lines of `moonjob run`, one JSON object per
-- input line:
--   {"line":1,"status":"completed","result":...,"attempts":1,"ms":0.4}
--   {"line":2,"status":"failed","error":{"code":"...","message":"..."},"attempts":1,"ms":0.2}
--
-- Written in two places from this one module: the parent (moonjob.cli) for a
-- job run on its own, and the child (moonjob.runner) for the lines of a batch,
-- which it formats itself so that the parent only copies them out.
local json = require "moonjob.json"

local M = {}

local floor = math.floor

-- Milliseconds, to the microsecond.
local function ms_text(ms)
  return json.number_text(floor(ms * 1000 + 0.5) / 1000)
end

-- The line of a job that completed with `result_json` (exact JSON text).
function M.completed(line, result_json, attempts, ms)
  return '{"line":' .. line .. ',"status":"completed","result":' .. result_json
    .. ',"attempts":' .. attempts .. ',"ms":' .. ms_text(ms) .. "}\n"
end

-- The line of a job that failed with err (a table with code and message).
function M.failed(line, err, attempts, ms)
  return '{"line":' .. line .. ',"status":"failed","error":{"code":'
    .. assert(json.encode(tostring(err.code))) .. ',"message":'
    .. assert(json.encode(tostring(err.message))) .. '},"attempts":' .. attempts
    .. ',"ms":' .. ms_text(ms) .. "}\n"
end

return M
