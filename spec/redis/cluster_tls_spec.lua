-- Queues on a Redis Cluster over TLS (rediss+cluster://): 3 primaries on
-- loopback whose ports and cluster bus speak TLS only, with certificates
-- the spec makes (spec/support/tls_certs.lua): `moonjob add`, one worker
-- running queues of two shards, `moonjob queues` listing them; a wrong CA
-- refused clearly.
local moonjob = require "moonjob"
local helpers = require "helpers"
local json = require "moonjob.codec.json"
local redis_cluster = require "redis_cluster_min"
local rq = require "redis_queue"
local tls_certs = require "tls_certs"

local read = require("redis_workers").read -- (the whole file, or "")
local PROCESSOR = helpers.abs(helpers.fixture("remote.lua"))

describe("queues on a Redis Cluster over TLS #slow", function()
  local certs, cluster

  setup(function()
    certs = tls_certs.make()
    cluster = redis_cluster.start(3, { tls = { cert = certs.server_cert, key = certs.server_key, ca = certs.ca,
      client_cert = certs.client_cert, client_key = certs.client_key } })
  end)

  teardown(function()
    if cluster then cluster:stop() end
    certs:remove()
  end)

  after_each(rq.close_all)

  local function moonjob_cli(args, stdin, url)
    return helpers.sh(("%s scripts/moonjob %s --redis '%s'"):format(helpers.LUAJIT, args, url or cluster.url), stdin)
  end

  it("adds, runs queues of two shards on one worker, and lists them", function()
    local list = cluster:spread_names(1, "tls")
    local a, b = list[1], list[2]
    assert.is_not.equal(cluster:owner(a), cluster:owner(b))
    for _, name in ipairs({ a, b }) do
      local _, err, status = moonjob_cli("add --queue " .. name, '{"echo":1}\n{"echo":2}\n')
      assert.equal(0, status, err)
    end
    local log = os.tmpname()
    local pid = assert(tonumber(helpers.first_line(("%s scripts/moonjob worker %s --redis '%s' --queue %s,%s"
      .. " >/dev/null 2>%s & echo $!"):format(helpers.LUAJIT, PROCESSOR, cluster.url, a, b, log))))
    rq.close_after({ close = function() os.execute(("kill -KILL %d 2>/dev/null"):format(pid)) end })
    local qa = rq.close_after(assert(moonjob.queue(cluster.url, a)))
    local qb = rq.close_after(assert(moonjob.queue(cluster.url, b)))
    assert(rq.wait_for(function() return qa:counts().completed == 2 and qb:counts().completed == 2 end, 30),
      "both queues' jobs completed: " .. read(log))
    local out, err, status = moonjob_cli("queues")
    assert.equal(0, status, err)
    local rows = {}
    for line in out:gmatch("[^\n]+") do
      local row = json.decode(line)
      rows[row.name] = row
    end
    assert.equal(2, rows[a] and rows[a].completed, out)
    assert.equal(2, rows[b] and rows[b].completed, out)
  end)

  it("refuses a wrong CA clearly, without falling back to plaintext", function()
    local url = cluster.url:gsub("ca=.*$", "ca=" .. certs.other_ca)
    local q, err = moonjob.queue(url, "never", { timeout = 5 })
    if q then q:close() end
    assert.is_nil(q)
    assert.matches("certificate", tostring(err))
    local _, said, status = moonjob_cli("status --queue never", nil, url)
    assert.is_not.equal(0, status)
    assert.matches("certificate", said)
  end)
end)
