-- Durable queues on Redis: how often a client tries again while the server
-- refuses it. Both of its connections (calls, and the subscription) back
-- off (0.1 s doubling to 5 s): a worker with a wrong password, or a server
-- down for an hour, must not hammer it with connections.
local helpers = require "helpers"
local moonjob = require "moonjob"
local client = require "moonjob.redis.client"
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

  it("ends a call refused for the server's state at every connection at its timeout, not later", function()
    -- each answer READONLY (a script's, as a server that flaps between
    -- replica and primary gives): the call never ran, waits for the next
    -- connection, whose set-up passes, and meets READONLY again
    local server = redis_server.start()
    local c = assert(client.new(server.url, { timeout_ms = 1000 }))
    local ok, err = pcall(function()
      local started, got = helpers.wall_ms(), nil
      c:call({ "EVAL", "return redis.error_reply('READONLY as a replica would')", "0" }, function(_, e, kind)
        got = { e, kind, helpers.wall_ms() - started }
      end)
      helpers.wait_for(function() return got ~= nil end, 6)
      assert.equal("connection", got[2])
      assert.matches("read-only replica", got[1], 1, true)
      assert.is_true(got[3] < 2500, got[3] .. " ms")
    end)
    c:close()
    server:stop()
    assert(ok, err)
  end)
end)
