-- spec/support/redis_workers.lua -- a redis-server with extra settings for
-- the specs that make Redis refuse or stall (maxmemory, DEBUG SLEEP), and
-- the `moonjob worker` processes, pools and producers of one test, ended by
-- their pid after it even when it fails.
--
--   local rf = require "redis_workers"
--   local server = rf.server("--enable-debug-command yes")   -- stopped by rf.close_all()
--   local pid, log = rf.worker(server, "q", "-j 2 --lease 2")
--   rf.fill_memory(server) ... rf.free_memory(server)       -- OOM under noeviction
--   after_each(rf.close_all)
--
-- What a test opened is kept in redis_queue's list (close_all ends it, last
-- first), and files are read with cli's reader: one copy of each.
local moonjob = require "moonjob"
local helpers = require "helpers"
local redis_server = require "redis_server"
local redis_queue = require "redis_queue"
local cli = require "cli"

local M = {}

M.PROCESSOR = helpers.abs(helpers.fixture("remote.lua"))

local close_after = redis_queue.close_after
M.close_all = redis_queue.close_all

-- A redis-server (AOF on, noeviction) with `extra` arguments.
function M.server(extra)
  local server = redis_server.start({ extra = extra })
  return close_after({ close = function() server:stop() end, server = server }).server
end

-- A `moonjob worker` process on `queue`; returns its pid and its stderr's path.
function M.worker(server, queue, args, processor)
  local log = os.tmpname()
  local cmd = ("%s scripts/moonjob worker %s --redis %s --queue %s %s 2>%s >/dev/null & echo $!")
    :format(helpers.LUAJIT, processor or M.PROCESSOR, server.url, queue, args or "", log)
  local pid = assert(tonumber(helpers.first_line(cmd)))
  close_after({ close = function() os.execute(("kill -KILL %d 2>/dev/null"):format(pid)) end })
  return pid, log
end

function M.stop_worker(pid, signal)
  os.execute(("kill -%s %d 2>/dev/null"):format(signal or "TERM", pid))
  helpers.wait_for(function() return not helpers.running(pid) end, 40)
end

-- A pool on `queue` in this process (echo off).
function M.pool(server, queue, opts, processor)
  opts = opts or {}
  opts.redis, opts.queue, opts.echo = server.url, queue, false
  return close_after(assert(moonjob.pool(processor or M.PROCESSOR, opts)))
end

function M.producer(server, queue)
  return close_after(assert(moonjob.queue(server.url, queue)))
end

-- Makes Redis refuse writes (OOM under noeviction): maxmemory a little over
-- what it uses now, then one big value that takes it past the limit.
function M.fill_memory(server)
  local used = tonumber(server:cli("INFO", "memory"):match("used_memory:(%d+)"))
  server:cli("CONFIG", "SET", "maxmemory", tostring(used + 2 * 1024 * 1024))
  server:cli("EVAL", "redis.call('SET', KEYS[1], string.rep('x', tonumber(ARGV[1]))) return 1",
    "1", "spec:filler", tostring(4 * 1024 * 1024))
end

function M.free_memory(server)
  server:cli("DEL", "spec:filler")
  server:cli("CONFIG", "SET", "maxmemory", "0")
end

-- How many of a queue's jobs were taken back from a worker when their lease
-- ran out (ESTALLED kept in the job's error though it completed later): a
-- job left idle for a lease, or fenced, is; a job given back is not.
function M.recovered(server, queue)
  return tonumber(server:cli("EVAL", [[
    local n = 0
    for _, key in ipairs(redis.call("KEYS", KEYS[1])) do
      local e = redis.call("HGET", key, "error")
      if e and e:find("ESTALLED", 1, true) then n = n + 1 end
    end
    return n]], "1", ("mj:{%s}:j:*"):format(queue)))
end

-- The whole of file `path`, or "" when it cannot be read (yet).
function M.read(path)
  return cli.read(path) or ""
end

-- The non-empty lines of file `path` (none when it cannot be read).
function M.lines(path)
  local lines = {}
  for line in M.read(path):gmatch("[^\n]+") do lines[#lines + 1] = line end
  return lines
end

return M
