-- redis+sentinel:// URLs read by the Redis client (no server): the
-- sentinels' list with its default port, the master's name and database,
-- the data servers' user and password apart from the sentinels' own, the
-- TLS form; clear errors; and never a password printed.
local client = require "moonjob.redis.client"

describe("a redis+sentinel:// URL", function()
  it("names the sentinels (26379 by default), the master and the database", function()
    local t = assert(client.parse("redis+sentinel://10.0.0.1:26380,s2,[::1]:26381/mymaster/3"))
    assert.same({ { host = "10.0.0.1", port = 26380 }, { host = "s2", port = 26379 }, { host = "::1", port = 26381 } },
      t.sentinels)
    assert.equal("mymaster", t.master)
    assert.equal(3, t.db)
    assert.is_nil(t.tls)
    t = assert(client.parse("redis+sentinel://s1/mymaster"))
    assert.equal(0, t.db)
    assert.equal("mymaster", assert(client.parse("redis+sentinel://s1/mymaster/")).master)
  end)

  it("keeps the data servers' user and password apart from the sentinels' own", function()
    local t = assert(client.parse("redis+sentinel://app:p%40ss@s1:1,s2:2/m/0?sentinel_user=watch&sentinel_password=w%26pw"))
    assert.equal("app", t.user)
    assert.equal("p@ss", t.password)
    assert.equal("watch", t.sentinel_user)
    assert.equal("w&pw", t.sentinel_password)
    t = assert(client.parse("redis+sentinel://:a@b?c@s1/m"))
    assert.is_nil(t.user)
    assert.equal("a@b?c", t.password)
    assert.equal("s1", t.sentinels[1].host)
  end)

  it("has a TLS form that carries its settings", function()
    local t = assert(client.parse("rediss+sentinel://s1:26379/m/0?ca=/etc/ca.pem&servername=redis.internal"))
    assert.same({ ca = "/etc/ca.pem", servername = "redis.internal" }, t.tls)
    t = assert(client.parse("rediss+sentinel://s1/m"))
    assert.same({}, t.tls)
    local _, err = client.parse("redis+sentinel://s1/m?ca=/etc/ca.pem")
    assert.matches("'ca' is a TLS setting: write rediss+sentinel://", err, 1, true)
  end)

  it("checks the sentinels' certificate name apart from the data servers'", function()
    local t = assert(client.parse("rediss+sentinel://s1/m?ca=/etc/ca.pem&servername=redis.internal"
      .. "&sentinel_servername=sentinel.internal"))
    assert.same({ ca = "/etc/ca.pem", servername = "redis.internal" }, t.tls)
    assert.same({ ca = "/etc/ca.pem", servername = "sentinel.internal" }, t.sentinel_tls)
    t = assert(client.parse("rediss+sentinel://s1/m?ca=/etc/ca.pem&servername=redis.internal"))
    assert.same({ ca = "/etc/ca.pem" }, t.sentinel_tls) -- each sentinel's host as the URL gives it
    local _, err = client.parse("redis+sentinel://s1/m?sentinel_servername=x")
    assert.matches("'sentinel_servername' is a TLS setting: write rediss+sentinel://", err, 1, true)
  end)

  it("says what is wrong with a bad one", function()
    local cases = {
      ["redis+sentinel://s1:26379"] = "needs the master's name after the sentinels",
      ["redis+sentinel://s1:26379/"] = "needs the master's name after the sentinels",
      ["redis+sentinel:///m"] = "needs at least one sentinel",
      ["redis+sentinel://s1,,s2/m"] = "an empty sentinel address",
      ["redis+sentinel://s1:0/m"] = "from 1 to 65535",
      ["redis+sentinel://s1:70000/m"] = "from 1 to 65535",
      ["redis+sentinel://s1:2x/m"] = "'s1:2x' is not host:port",
      ["redis+sentinel://s1/m/x"] = "the database in a Redis URL must be a number, not 'x'",
      ["redis+sentinel://s1/m?password=x"] = "unknown setting 'password'",
      ["redis+sentinel://s1/m?sentinel_password"] = "'sentinel_password' needs a value",
    }
    for url, want in pairs(cases) do
      local t, err = client.parse(url)
      assert.is_nil(t, url)
      assert.matches(want, err, 1, true)
    end
  end)

  it("is printed without any password", function()
    local t = assert(client.parse("redis+sentinel://app:data-pw@s1:1,[::1]:2/m/2?sentinel_password=watch-pw"))
    local shown = client.display(t)
    assert.equal("redis+sentinel://app:***@s1:1,[::1]:2/m/2?sentinel_password=***", shown)
    t = assert(client.parse("rediss+sentinel://:data-pw@s1/m?sentinel_user=u&sentinel_password=watch-pw&ca=/x"))
    shown = client.display(t)
    assert.equal("rediss+sentinel://:***@s1:26379/m/0?sentinel_user=u&sentinel_password=***", shown)
    local _, err = client.parse("redis+sentinel://app:data-pw@s1:99999/m")
    assert.falsy(err:find("data-pw", 1, true), err)
  end)
end)
