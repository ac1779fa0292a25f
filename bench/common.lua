-- bench/common.lua -- what the Redis benches share: the command that runs
-- moonjob from the checkout, a shell command's first line, a wait on the
-- loop (a 10 ms timer keeps it turning) for a condition or a deadline, and
-- `moonjob worker` processes started and ended by their pid.
local core = require "moonjob.core"
local loop = require "moonjob.loop"

local M = {}

M.LUAJIT = 'env LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="build/?.so;;" luajit'

M.first_line = require("helpers").first_line -- (spec/support's: the benches use its Redis server too)

-- pred() once true, or false after `seconds`.
function M.wait_for(pred, seconds)
  local deadline = loop.now() + seconds * 1000
  local poll = core.timer(function() end)
  poll:start(10, 10)
  loop.wait_until(function() return pred() or loop.now() > deadline end)
  poll:close()
  return pred()
end

-- The `moonjob worker` processes not stopped yet: ended by their pid
-- however the benchmark ends (stop_all), so a failed run leaves nothing.
local running = {}

-- A `moonjob worker` of processor (default bench/noop.lua) on queue of the
-- server at url, with args; -> its pid.
function M.start_worker(url, queue, args, processor)
  local cmd = ("%s scripts/moonjob worker %s --redis %s --queue %s %s 2>/dev/null >/dev/null & echo $!")
    :format(M.LUAJIT, processor or "bench/noop.lua", url, queue, args or "")
  local pid = assert(tonumber(M.first_line(cmd)))
  running[pid] = true
  return pid
end

function M.stop(pid)
  os.execute(("kill -KILL %d 2>/dev/null"):format(pid))
  running[pid] = nil
end

function M.stop_all()
  for pid in pairs(running) do M.stop(pid) end
end

return M
