-- bench/common.lua -- what the Redis benches share: the command that runs
-- moonjob from the checkout, a shell command's first line, and a wait on
-- the loop (a 10 ms timer keeps it turning) for a condition or a deadline.
local core = require "moonjob.core"
local loop = require "moonjob.loop"

local M = {}

M.LUAJIT = 'env LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="build/?.so;;" luajit'

function M.first_line(cmd)
  local p = io.popen(cmd)
  local line = p:read("*l")
  p:close()
  return line
end

-- pred() once true, or false after `seconds`.
function M.wait_for(pred, seconds)
  local deadline = loop.now() + seconds * 1000
  local poll = core.timer(function() end)
  poll:start(10, 10)
  loop.wait_until(function() return pred() or loop.now() > deadline end)
  poll:close()
  return pred()
end

return M
