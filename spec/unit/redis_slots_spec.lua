-- Where a key lives in a Redis Cluster (moonjob.redis.slots: CRC16, hash
-- tags, the key a command is routed by) and a cluster's URL
-- (moonjob.redis.cluster_map, through client.parse), with no server.
local slots = require "moonjob.redis.slots"
local client = require "moonjob.redis.client"
local names = require "moonjob.redis.names"
local map = require "moonjob.redis.cluster_map"

describe("a Redis Cluster's slots", function()
  it("hashes with CRC16/XMODEM as the Redis Cluster specification says", function()
    assert.equal(0x31C3, slots.crc16("123456789"))
    assert.equal(0, slots.crc16(""))
    -- the slots redis-cli CLUSTER KEYSLOT gives
    assert.equal(15495, slots.key_slot("a"))
    assert.equal(12182, slots.key_slot("foo"))
    assert.equal(696, slots.key_slot("mj:queues"))
  end)

  it("hashes a key's tag alone: the first {...} that is not empty", function()
    assert.equal(slots.key_slot("user1000"), slots.key_slot("{user1000}.following"))
    assert.equal(slots.key_slot("user1000"), slots.key_slot("foo{user1000}bar{zap}"))
    assert.equal(slots.key_slot("foo{}{bar}"), slots.crc16("foo{}{bar}") % 16384) -- empty tag: the whole key
    assert.equal(slots.key_slot("{bar"), slots.key_slot("foo{{bar}}zap")) -- "{bar" is the tag
    assert.equal(8363, slots.key_slot("foo{}{bar}"))
    assert.equal(4015, slots.key_slot("foo{{bar}}zap"))
    -- every key of a queue is on its name's slot, a {TAG}NAME queue on TAG's
    for _, key in ipairs({ "wait", "active", "j:17", "events", "updates@0" }) do
      assert.equal(slots.key_slot("images"), slots.key_slot(names.prefix("images") .. key))
      assert.equal(slots.key_slot("shop"), slots.key_slot(names.prefix("{shop}/images") .. key))
    end
  end)

  it("routes a command by its key: an FCALL's first, a keyless one by none", function()
    assert.equal("mj:{a}:", slots.command_key({ "FCALL", "moonjob_add", 1, "mj:{a}:", "x" }))
    assert.equal("mj:{a}:", slots.command_key({ "FCALL_RO", "moonjob_get", "2", "mj:{a}:", "mj:{a}/b:" }))
    assert.is_nil(slots.command_key({ "FCALL", "moonjob_writable", 0 }))
    assert.equal("mj:queues", slots.command_key({ "SADD", "mj:queues", "a" }))
    assert.equal("k", slots.command_key({ "hget", "k", "f" }))
    assert.equal("k", slots.command_key({ "OBJECT", "ENCODING", "k" }))
    for _, keyless in ipairs({ { "PING" }, { "SCAN", 0 }, { "FUNCTION", "LIST" }, { "INFO" }, { "CLUSTER", "SLOTS" } }) do
      assert.is_nil(slots.command_slot(keyless), keyless[1])
    end
    assert.same({ "mj:{a}:", "mj:{a}/b:" }, slots.script_keys({ "FCALL", "f", 2, "mj:{a}:", "mj:{a}/b:", "arg" }))
    assert.is_true(slots.is_script({ "FCALL", "f", 0 }))
    assert.is_false(slots.is_script({ "HGET", "k", "f" }))
  end)

  it("names a queue from its prefix, the library's way", function()
    for _, name in ipairs({ "images", "{shop}/images", "a b" }) do
      assert.equal(name, names.queue_name(names.prefix(name)))
    end
    assert.is_nil(names.queue_name("other:key"))
  end)
end)

describe("a Redis Cluster's URL", function()
  it("lists seeds, with a user and password for every node, database 0", function()
    local t = assert(client.parse("redis+cluster://u:p%40ss@127.0.0.1:7000,[::1]:7001,host/"))
    assert.is_true(t.cluster)
    assert.same({ { host = "127.0.0.1", port = 7000 }, { host = "::1", port = 7001 }, { host = "host", port = 6379 } },
      t.seeds)
    assert.same({ "u", "p@ss", 0 }, { t.user, t.password, t.db })
    assert.equal("redis+cluster://u:***@127.0.0.1:7000,[::1]:7001,host:6379/", client.display(t))
    assert.equal(0, assert(client.parse("redis+cluster://h:1/0")).db)
    assert.equal(0, assert(client.parse("redis+cluster://h:1")).db)
  end)

  it("takes a password holding a raw '?' (the user info ends at the last @)", function()
    local t = assert(client.parse("redis+cluster://u:p?ss@127.0.0.1:7000,127.0.0.1:7001/"))
    assert.same({ "u", "p?ss" }, { t.user, t.password })
    assert.same({ { host = "127.0.0.1", port = 7000 }, { host = "127.0.0.1", port = 7001 } }, t.seeds)
    t = assert(client.parse("redis+cluster://:a?b@c@h:1/0"))
    assert.same({ "a?b@c", "h", 1 }, { t.password, t.host, t.port })
  end)

  it("reads MOVED and ASK: an IPv6 host without brackets, a host left out", function()
    local function read(err, from) return { map.redirection(err, from) } end
    assert.same({ "MOVED", 3999, "127.0.0.1:7002" }, read("MOVED 3999 127.0.0.1:7002", "127.0.0.1:7000"))
    assert.same({ "MOVED", 3999, "::1:7002" }, read("MOVED 3999 ::1:7002", "127.0.0.1:7000"))
    assert.same({ "ASK", 12, "fe80::1:7002" }, read("ASK 12 fe80::1:7002", "::1:7000"))
    assert.same({ "MOVED", 5, "::1:7002" }, read("MOVED 5 [::1]:7002", "10.0.0.1:7000"))
    -- no endpoint ("?" or nothing): the host of the node that answered
    assert.same({ "ASK", 12, "10.0.0.5:7002" }, read("ASK 12 ?:7002", "10.0.0.5:7000"))
    assert.same({ "MOVED", 12, "10.0.0.5:7002" }, read("MOVED 12 :7002", "10.0.0.5:7000"))
    assert.same({ "MOVED", 12, "::1:7002" }, read("MOVED 12 :7002", "::1:7000"))
    assert.same({}, read("ERR unknown command", "h:1"))
    assert.same({}, read("MOVED 12 nowhere", "h:1"))
  end)

  it("refuses a database other than 0, and empty or bad nodes, saying why", function()
    local t, err = client.parse("redis+cluster://127.0.0.1:7000/2")
    assert.is_nil(t)
    assert.matches("a Redis Cluster has one database, 0", err, 1, true)
    assert.matches("not /2", err, 1, true)
    t, err = client.parse("redis+cluster://127.0.0.1:7000,,127.0.0.1:7001/")
    assert.is_nil(t)
    assert.matches("none empty", err, 1, true)
    t, err = client.parse("redis+cluster://127.0.0.1:99999/")
    assert.is_nil(t)
    assert.matches("port", err)
    t, err = client.parse("redis+cluster:///")
    assert.is_nil(t)
    assert.matches("needs a host", err, 1, true)
  end)

  it("names the form a bad URL needs, and never its password", function()
    local function refused(url)
      local t, err = client.parse(url)
      assert.is_nil(t, url)
      assert.falsy(err:find("s3cret", 1, true), err)
      return err
    end
    local err = refused("redis://u:s3cret@h1:1,h2:2/0")
    assert.matches("redis+cluster://", err, 1, true)
    assert.matches("redis+sentinel://", err, 1, true)
    assert.falsy(err:find("needs a host", 1, true), err)
    err = refused("redis+cluster://u:s3cret@h:notaport/")
    assert.matches("'h:notaport'", err, 1, true)
    assert.matches("port", err, 1, true)
    assert.falsy(err:find("redis://", 1, true), err)
    err = refused("redis://:s3cret@h:notaport/0")
    assert.matches("'h:notaport'", err, 1, true)
    err = refused("redis+cluster://:s3cret@h:1,h:2/?ca=x")
    assert.matches("a redis+cluster:// URL takes no query", err, 1, true)
    assert.matches("rediss+cluster://", err, 1, true)
    if client.parse("rediss://h:1/0") then -- (a build with TLS)
      err = refused("rediss+cluster://:s3cret@h:1/?sentinel_user=x")
      assert.matches("'sentinel_user' is unknown in a rediss+cluster:// URL", err, 1, true)
    end
    err = refused("http://u:s3cret@h:1/")
    for _, form in ipairs({ "redis://", "rediss://", "redis+sentinel://", "rediss+sentinel://", "redis+cluster://",
      "rediss+cluster://" }) do
      assert.matches(form, err, 1, true)
    end
  end)

  it("takes rediss+cluster:// when this build speaks TLS, carrying its settings to every node", function()
    local plain_tls = client.parse("rediss://127.0.0.1:7000/0")
    local t, err = client.parse("rediss+cluster://127.0.0.1:7000,127.0.0.1:7001/")
    if not plain_tls then -- (no TLS yet: refused as rediss:// is)
      assert.is_nil(t)
      assert.is_string(err)
      return
    end
    assert.is_true(t.cluster)
    assert.equal("rediss", t.scheme)
    assert.same(plain_tls.tls, t.tls)
    assert.matches("^rediss%+cluster://", client.display(t))
  end)
end)
