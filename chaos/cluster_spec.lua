-- make chaos: a Redis Cluster (3 primaries, a replica each) that clients in
-- network namespaces reach at the address its nodes announce: the host
-- side of a bridge this spec creates (spec/support/redis_cluster.lua,
-- spec/support/netns.lua). Needs root (ip netns).
--
-- Addresses: 10.231.79.0/24, on the bridge mjclus0 only; everything is
-- deleted afterwards, whatever happened.
local helpers = require "helpers"
local redis_server = require "redis_server"
local redis_cluster = require "redis_cluster"
local netns = require "netns"

local NET, HOSTS = "10.231.79", 3

local hosts = netns.new("mjclus", NET, HOSTS)

describe("chaos: a Redis Cluster reached from network namespaces", function()
  local cluster

  setup(function()
    hosts:setup()
    cluster = redis_cluster.start({ announce = NET .. ".1" })
  end)

  teardown(function()
    if cluster then cluster:stop() end
    hosts:teardown()
  end)

  it("answers every host at the address its nodes announce, following MOVED to each shard", function()
    assert.matches("^redis%+cluster://" .. NET:gsub("%.", "%%.") .. "%.1:%d+,", cluster.url)
    local seed = cluster:primaries()[1]
    local queues, of = cluster:spread_queues("ns", 1)
    for i = 1, HOSTS do
      for _, name in ipairs(queues) do
        local key = ("mj:{%s}:host%d"):format(name, i)
        local out = helpers.sh(("%s %s -c -h %s -p %d SET %s %d")
          :format(hosts:exec(i), redis_server.CLI, seed.host, seed.port, key, i))
        assert.equal("OK\n", out)
        assert.equal(tostring(i), of[name]:cli("GET", key))
      end
    end
  end)
end)
