-- spec/support/counting.lua -- small measures the failure specs share.
--
--   counting.lines_in(path)     -> how many lines a file has (0 when missing):
--                                 processors append one per load or run
--   counting.seconds_since(t0)  -> seconds since core.hrtime() was t0
local core = require "moonjob.core"

local M = {}

function M.lines_in(path)
  local f = io.open(path)
  if not f then return 0 end
  local n = 0
  for _ in f:lines() do n = n + 1 end
  f:close()
  return n
end

function M.seconds_since(t0)
  return (core.hrtime() - t0) / 1e9
end

return M
