-- spec/support/redis_queue.lua -- what the specs of spec/redis/ share.
--
-- A real redis-server (AOF on) on a free loopback port, one per spec file
-- (start in its setup, stop in its teardown), and the pools, producers and
-- `moonjob worker` processes of the running test, ended after it even when
-- it fails (close_all in after_each):
--
--   local rq = require "redis_queue"
--   rq.describe(function()
--     describe("a pool on the queue", function()
--       it("...", function() ... rq.pool(rq.new_queue(), { size = 1 }) ... end)
--     end)
--   end)
--
-- rq.server() is the file's server (its port, url, cli, signal) inside a test.
local moonjob = require "moonjob"
local helpers = require "helpers"
local redis_server = require "redis_server"

local M = {}

M.PROCESSOR = helpers.abs(helpers.fixture("remote.lua"))

local server
local queues = 0
local open = {} -- what close_all ends, last first

-- The server of this spec file, started.
function M.start()
  server = redis_server.start()
  return server
end

function M.stop()
  if server then server:stop() end
  server = nil
end

-- The running server of this spec file.
function M.server()
  return server
end

-- The outer block of a spec file of spec/redis/: its tests, declared by
-- body(), share one server, and what each test opened is ended after it.
-- (busted's functions live in the spec file's environment, not in _G.)
function M.describe(body)
  local spec = getfenv(2)
  spec.describe("a durable queue on Redis #slow", function()
    spec.setup(M.start)
    spec.teardown(M.stop)
    spec.after_each(M.close_all)
    body()
  end)
end

-- A fresh queue name per test.
function M.new_queue()
  queues = queues + 1
  return "q" .. queues
end

-- The "<id> <start ms> <end ms>" lines of the remote.lua fixture's span
-- option, in the order the processors wrote them (as they returned).
function M.spans(path)
  local out = {}
  for _, line in ipairs(M.read_lines(path)) do
    local id, s, e = line:match("^(%S+) (%S+) (%S+)$")
    out[#out + 1] = { id = id, start = tonumber(s), finish = tonumber(e) }
  end
  return out
end

function M.read_lines(path)
  local lines = {}
  local f = io.open(path)
  if not f then return lines end
  for line in f:lines() do lines[#lines + 1] = line end
  f:close()
  return lines
end

-- obj (anything with a close method) is closed after the test.
function M.close_after(obj)
  open[#open + 1] = obj
  return obj
end

-- A `moonjob worker` process (of processor, a path: remote.lua by default);
-- returns its pid and the path of its stderr.
function M.start_worker(queue, args, processor)
  local log = os.tmpname()
  local cmd = ("%s scripts/moonjob worker %s --redis %s --queue %s %s 2>%s >/dev/null & echo $!")
    :format(helpers.LUAJIT, processor or M.PROCESSOR, server.url, queue, args or "", log)
  local pid = assert(tonumber(helpers.first_line(cmd)))
  M.close_after({ close = function() os.execute(("kill -KILL %d 2>/dev/null"):format(pid)) end })
  return pid, log
end

-- Waits until a worker's stderr (start_worker's path) says it connected.
function M.worker_connected(log)
  return M.wait_for(function()
    for _, line in ipairs(M.read_lines(log)) do
      if line:find("connected to", 1, true) then return true end
    end
  end, 30)
end

-- The `moonjob` command on this file's server: `moonjob ARGS --redis URL`;
-- -> stdout, stderr, exit status (helpers.sh's).
function M.moonjob(args, stdin)
  return helpers.sh(("%s scripts/moonjob %s --redis %s"):format(helpers.LUAJIT, args, server.url), stdin)
end

-- A flow half done on this file's server: a parent "page" on a new queue
-- with three children, img1 (completes) and img2 (fails, on_fail continue)
-- on "{queue}/images", which a pool runs, and txt on the queue itself,
-- which nothing runs: the parent keeps waiting. -> the producer of the
-- queue, the images queue's name.
function M.half_done_flow()
  local name = M.new_queue()
  local images = "{" .. name .. "}/images"
  local q = M.new_producer(name)
  assert(q:add_flow({ id = "page", data = { page = 1 }, children = {
    { id = "img1", queue = images, data = { n = 1 } },
    { id = "img2", queue = images, data = { fail = true }, on_fail = "continue" },
    { id = "txt", data = { n = 3 } },
  } }))
  M.pool(images, { size = 1 })
  local qi = M.new_producer(images)
  assert(M.wait_for(function() local c = qi:counts() return c.completed + c.failed == 2 end), "the images ran")
  return q, images
end

-- One fetch that hands out nothing (N = 0): what an idle worker's poll
-- does (it fires due schedules, promotes delayed jobs); -> its reply.
function M.poll(q)
  return assert(q.client:call_wait({ "FCALL", "moonjob_fetch", 1, q.prefix, "spec", 0, 30000, "", 86400000, 0 }))
end

function M.stop_worker(pid, signal)
  os.execute(("kill -%s %d 2>/dev/null"):format(signal or "KILL", pid))
  helpers.wait_for(function() return not helpers.running(pid) end, 40)
end

-- A pool on `queue` (the remote.lua fixture, no echo).
function M.pool(queue, opts)
  opts = opts or {}
  opts.redis, opts.queue, opts.echo = server.url, queue, false
  return M.close_after(assert(moonjob.pool(M.PROCESSOR, opts)))
end

-- A fake server on loopback: a Python script that prints its port, run
-- with args (a string, already quoted for the shell) -> its port; it is
-- killed and its folder removed after the test.
function M.python_server(script, args)
  local dir = helpers.tmpdir()
  helpers.write_file(dir .. "/server.py", script)
  local pid = assert(tonumber(helpers.first_line(("python3 %s/server.py %s > %s/port & echo $!")
    :format(dir, args or "", dir))))
  M.close_after({ close = function()
    os.execute(("kill -KILL %d 2>/dev/null"):format(pid))
    os.execute("rm -rf " .. dir)
  end })
  local port
  helpers.wait_for(function()
    port = tonumber(helpers.first_line("cat " .. dir .. "/port"))
    return port ~= nil
  end)
  return port
end

-- Runs the loop until cond() is true or `seconds` (default 20) pass; ->
-- cond() (a spec asserts it, saying what it waited for).
function M.wait_for(cond, seconds)
  local loop = require "moonjob.loop"
  local deadline = loop.now() + (seconds or 20) * 1000
  local t = require("moonjob.core").timer(function() end)
  t:start(20, 20)
  loop.wait_until(function() return cond() or loop.now() > deadline end)
  t:close()
  return cond()
end

function M.new_producer(name, opts)
  return M.close_after(assert(moonjob.queue(server.url, name, opts)))
end

function M.close_all()
  for i = #open, 1, -1 do pcall(open[i].close, open[i]) end
  open = {}
end

return M
