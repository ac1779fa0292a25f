-- moonjob.errors -- the error values that jobs fail with.
--
-- An error is a plain table { code = "E...", message = "...", traceback = ...,
-- plus fields that fit the code } with a metatable whose __tostring gives
-- "CODE: message". Plain tables cross the channel; the parent puts the
-- metatable back on arrival (errors.wrap).
local M = {}

local Error = {}
Error.__index = Error
Error.__tostring = function(e) return tostring(e.code) .. ": " .. tostring(e.message) end

-- errors.new(code, message [, fields]) -> error table
function M.new(code, message, fields)
  local err = {}
  if fields then for k, v in pairs(fields) do err[k] = v end end
  err.code, err.message = code, message
  return setmetatable(err, Error)
end

-- errors.wrap(t) -> t with the error metatable (t must have code and message)
function M.wrap(t)
  t.code = t.code or "EPROCESSOR"
  t.message = t.message ~= nil and tostring(t.message) or "(no message)"
  return setmetatable(t, Error)
end

return M
