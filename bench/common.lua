-- bench/common.lua -- what the Redis benches share: the command that runs
-- moonjob from the checkout, a shell command's first line, a wait on the
-- loop (a 10 ms timer keeps it turning) for a condition or a deadline, and
-- `moonjob worker` processes (and other commands, in a process group of
-- their own) started and ended by their pid.
local core = require "moonjob.core"
local loop = require "moonjob.loop"

local M = {}

M.LUAJIT = 'env LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="build/?.so;;" luajit'

local helpers = require "helpers" -- spec/support's: the benches use its Redis server too
M.first_line = helpers.first_line
local running_process = helpers.running

-- spec/support's hang catcher ends a process whose loop runs more than a
-- minute past its last bounded wait's start: a bench's waits are bounded by
-- their own deadline, so each wait and each turn of its poll tells it so.
local progress = debug.getregistry()["moonjob.spec.progress"]

-- pred() once true, or false after `seconds`.
function M.wait_for(pred, seconds)
  progress.last = core.hrtime()
  local deadline = loop.now() + seconds * 1000
  local poll = core.timer(function() progress.last = core.hrtime() end)
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

-- A shell command (its output redirected) started by setsid in a process
-- group of its own; -> its pid, which is also the group's id: stop() ends
-- the group, so what it forked (BullMQ's sandboxed processors) goes too.
function M.start_group(cmd)
  local pid = assert(tonumber(M.first_line(("setsid %s & echo $!"):format(cmd))))
  running[pid] = "group"
  return pid
end

-- Waits until pid has ended (a zombie counts as ended); false after `seconds`.
function M.wait_gone(pid, seconds)
  return M.wait_for(function() return not running_process(pid) end, seconds)
end

function M.stop(pid)
  if running[pid] == "group" then -- (its leader too: no kill of a pid that may be reused since)
    os.execute(("kill -KILL -- -%d 2>/dev/null"):format(pid))
  else
    os.execute(("kill -KILL %d 2>/dev/null"):format(pid))
  end
  running[pid] = nil
end

function M.stop_all()
  for pid in pairs(running) do M.stop(pid) end
end

return M
