-- Durable queues on Redis: how often a client tries again while the server
-- refuses it. Both of its connections (calls, and the subscription) back
-- off (0.1 s doubling to 5 s): a worker with a wrong password, or a server
-- down for an hour, must not hammer it with connections.
local helpers = require "helpers"
local moonjob = require "moonjob"
local redis_server = require "redis_server"
local rf = require "redis_workers"

local function connections(server)
  return tonumber(server:cli("INFO", "stats"):match("total_connections_received:(%d+)"))
end

describe("a Redis client refused at every connect #slow", function()
  after_each(rf.close_all)

  it("backs off on its subscription's connection too", function()
    local server = redis_server.start({ password = "right" })
    local ok, err = pcall(function()
      local url = ("redis://:wrong@127.0.0.1:%d/0"):format(server.port)
      local before = connections(server)
      local p = assert(moonjob.pool(rf.PROCESSOR, { redis = url, queue = "q", size = 1, echo = false }))
      helpers.sleep(6)
      local made = connections(server) - before - 1 -- the INFO's own
      p:close()
      -- with back-off: about 7 for each connection in 6 s; without, one every 0.2 s or less
      assert.is_true(made <= 20, made .. " connections in 6 s")
      assert.is_true(made >= 2, made .. " connections in 6 s") -- it did try
    end)
    server:stop()
    assert(ok, err)
  end)
end)
