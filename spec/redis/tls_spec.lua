-- Redis over TLS: rediss:// URLs against a real redis-server whose only
-- port is a TLS port, with certificates the spec makes with openssl
-- (spec/support/tls_certs.lua): a worker, a producer, `moonjob add`,
-- `moonjob status` and the dashboard over it; the server's certificate and
-- name always checked, a client certificate for a server that asks for one,
-- and never a plaintext fallback.
local moonjob = require "moonjob"
local helpers = require "helpers"
local json = require "moonjob.codec.json"
local client = require "moonjob.redis.client"
local redis_server = require "redis_server"
local rq = require "redis_queue"
local tls_certs = require "tls_certs"

local read = require("redis_workers").read -- (the whole file, or "")

local function quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- The `moonjob` command with env (a string of NAME=VALUE words) -> out, err, status.
local function moonjob_cli(env, args, stdin)
  return helpers.sh(("env %s %s scripts/moonjob %s"):format(env, helpers.LUAJIT, args), stdin)
end

-- A command in the background, killed after the test -> its pid and its stderr's path.
local function background(env, args)
  local log = os.tmpname()
  local pid = assert(tonumber(helpers.first_line(("env %s %s scripts/moonjob %s >/dev/null 2>%s & echo $!")
    :format(env, helpers.LUAJIT, args, log))))
  rq.close_after({ close = function() os.execute(("kill -KILL %d 2>/dev/null"):format(pid)) end })
  return pid, log
end

-- The error of a queue that cannot be opened (url, within timeout s) and how long that took.
local function refused(url, timeout)
  local t0 = helpers.wall_ms()
  local q, err = moonjob.queue(url, "never", { timeout = timeout or 5 })
  if q then q:close() end
  assert.is_nil(q, "the queue opened")
  return tostring(err), (helpers.wall_ms() - t0) / 1000
end

describe("Redis over TLS #slow", function()
  local certs, server, mtls, plain

  setup(function()
    certs = tls_certs.make()
    server = redis_server.start({ tls = { cert = certs.server_cert, key = certs.server_key, ca = certs.ca } })
    mtls = redis_server.start({ tls = { cert = certs.server_cert, key = certs.server_key, ca = certs.ca,
      auth_clients = true, client_cert = certs.client_cert, client_key = certs.client_key } })
    plain = redis_server.start()
  end)

  teardown(function()
    for _, s in ipairs({ server, mtls, plain }) do s:stop() end
    certs:remove()
  end)

  after_each(rq.close_all)

  -- The TLS server's URL with ca= the spec's CA, and more query (without its &).
  local function url(s, more)
    return ("%s?ca=%s%s"):format((s or server).url, certs.ca, more and "&" .. more or "")
  end

  it("carries a worker's jobs that a producer and `moonjob add` added; status and the dashboard see them", function()
    local name = "tls-jobs"
    local q = rq.close_after(assert(moonjob.queue(url(), name)))
    local jobs = {}
    for i = 1, 5 do jobs[i] = assert(q:add({ echo = i })) end
    -- the CA from the environment (a URL without ca=); the worker's from its URL
    local env_ca = "MOONJOB_REDIS_CA=" .. quote(certs.ca)
    local out, err, status = moonjob_cli(env_ca, ("add --queue %s --redis %s"):format(name, server.url),
      '{"echo":"a"}\n{"echo":"b"}\n{"echo":"c"}\n')
    assert.equal(0, status, err)
    assert.equal(3, select(2, out:gsub("\n", "")), out)
    local _, log = background("", ("worker %s --redis %s --queue %s"):format(rq.PROCESSOR, quote(url()), name))
    for i = 1, 5 do assert.equal(i, assert(jobs[i]:wait(30)).echo) end
    helpers.wait_for(function() return q:counts().completed == 8 end, 30)
    assert.matches("connected to rediss://127%.0%.0%.1:" .. server.port, read(log))

    out, err, status = moonjob_cli(env_ca, ("status --queue %s --redis %s"):format(name, server.url))
    assert.equal(0, status, err)
    assert.matches("completed 8", out)

    local dlog
    _, dlog = background(env_ca, ("dashboard --redis %s --listen 127.0.0.1:0"):format(server.url))
    local base
    helpers.wait_for(function()
      base = read(dlog):match("(http://127%.0%.0%.1:%d+/)")
      return base ~= nil
    end, 20)
    local body = helpers.sh(("curl -s -m 20 '%sapi/queues'"):format(base))
    local rows = {}
    for _, row in ipairs(json.decode(body).queues) do rows[row.name] = row end
    assert.is_truthy(rows[name], body)
    assert.equal(8, rows[name].completed, body)
  end)

  it("refuses a server whose certificate another CA signed, saying what to check", function()
    local err = refused(("%s?ca=%s"):format(server.url, certs.other_ca))
    assert.matches("TLS: certificate verify failed", err, 1, true)
    assert.matches("ca=", err, 1, true)
  end)

  it("refuses a server whose certificate is not for the name checked, and takes one that is", function()
    local err = refused(url(nil, "servername=wrongname"))
    assert.matches("certificate is not for 'wrongname'", err, 1, true)
    -- localhost is in the certificate: the name checked (and sent) need not be the address dialled
    local q = rq.close_after(assert(moonjob.queue(url(nil, "servername=localhost"), "named")))
    assert.truthy(q:add({ n = 1 }))
    -- by default the URL's host is checked: 127.0.0.1 above as an IP address, localhost as a name
    q = rq.close_after(assert(moonjob.queue(("rediss://localhost:%d/0?ca=%s"):format(server.port, certs.ca), "byname")))
    assert.truthy(q:add({ n = 1 }))
  end)

  it("never falls back to plaintext: redis:// to the TLS port and rediss:// to a plaintext one fail clearly", function()
    local err = refused(("redis://127.0.0.1:%d/0"):format(server.port))
    assert.matches("rediss://", err, 1, true)
    assert.matches("TLS", err, 1, true)
    err = refused(("rediss://127.0.0.1:%d/0?ca=%s"):format(plain.port, certs.ca))
    assert.matches("the server did not answer in TLS", err, 1, true)
    assert.matches("redis://", err, 1, true)
  end)

  it("says at once that a ca=, cert= or key= file cannot be used", function()
    local err, took = refused(url(nil, "x=1"))
    assert.matches("unknown", err)
    assert.matches("ca, cert, key, servername", err, 1, true)
    err, took = refused(("%s?ca=/no/such/ca.pem"):format(server.url), 30)
    assert.matches("TLS: cannot read ca= file '/no/such/ca.pem': No such file or directory", err, 1, true)
    assert.is_true(took < 5, took)
    err = refused(url(nil, "cert=" .. certs.client_cert .. "&key=" .. certs.ca), 30)
    assert.matches("TLS: key= file '" .. certs.ca .. "'", err, 1, true)
    err = refused(url(nil, "key=" .. certs.client_key), 30)
    assert.matches("key= needs cert=", err, 1, true)
  end)

  it("shows a client certificate to a server that asks for one, and says so when none was given", function()
    local err = refused(url(mtls))
    assert.matches("client certificate", err, 1, true)
    local q = rq.close_after(assert(moonjob.queue(
      url(mtls, ("cert=%s&key=%s"):format(certs.client_cert, certs.client_key)), "mutual")))
    local job = assert(q:add({ n = 1 }))
    assert.equal("waiting", job.state)
    -- from the environment, as a worker's unit file would give them
    local env = ("MOONJOB_REDIS_CA=%s MOONJOB_REDIS_CERT=%s MOONJOB_REDIS_KEY=%s")
      :format(quote(certs.ca), quote(certs.client_cert), quote(certs.client_key))
    local out, cerr, status = moonjob_cli(env, ("status --queue mutual --redis %s"):format(mtls.url))
    assert.equal(0, status, cerr)
    assert.matches("waiting 1", out)
  end)

  it("writes a loop turn's commands in one write, and bounds a reply, as without TLS", function()
    local core = require "moonjob.core"
    local up
    local conn = rq.close_after(assert(core.redis("127.0.0.1", server.port, 5000, 1024 * 1024,
      function(kind, why) up = kind == "up" or why end, { ca = certs.ca })))
    helpers.wait_for(function() return up ~= nil end)
    assert.is_true(up, up)
    local function reads() return tonumber(server:cli("INFO", "stats"):match("total_reads_processed:(%d+)")) end
    local before, answered = reads(), 0
    for i = 1, 200 do conn:command({ "SET", "k" .. i, ("v"):rep(20) }, function() answered = answered + 1 end) end
    helpers.wait_for(function() return answered == 200 end)
    local read = reads() - before - 1 -- (less the INFO's own)
    assert.is_true(read <= 3, read .. " reads for 200 commands")
    local err
    conn:command({ "SET", "big", ("x"):rep(3 * 1024 * 1024) }, function(v) assert.equal("OK", v) end)
    conn:command({ "GET", "big" }, function(_, e) err = e end)
    helpers.wait_for(function() return err ~= nil end)
    assert.matches("larger than 1048576 bytes", err)
    helpers.wait_for(function() return up ~= true end) -- and the connection went down, saying so
    assert.matches("larger than 1048576 bytes", up)
  end)

  -- openssl s_server, TLS 1.2, on loopback, for one connection -> { port, out(), tell(line) }: out()
  -- is what it printed (what the client sent, its errors); a line told on its standard input goes
  -- to the client as data (-crlf: ending with \r\n, a Redis reply), or "r" asks the client to
  -- renegotiate. Its standard input stays open (at its end, it would end the connection).
  local function s_server()
    local dir = helpers.tmpdir()
    rq.close_after({ close = function() os.execute("rm -rf " .. dir) end })
    assert(os.execute(("mkfifo %s/in"):format(dir)) == 0)
    local pid = assert(tonumber(helpers.first_line(("openssl s_server -accept 127.0.0.1:0 -tls1_2 -naccept 1 -crlf"
      .. " -cert %s -key %s < %s/in > %s/out 2>&1 & echo $!"):format(certs.server_cert, certs.server_key, dir, dir))))
    rq.close_after({ close = function() os.execute(("kill -KILL %d 2>/dev/null"):format(pid)) end })
    local stdin = rq.close_after(assert(io.open(dir .. "/in", "w")))
    local self = { out = function() return read(dir .. "/out") end }
    function self.tell(line)
      stdin:write(line .. "\n")
      stdin:flush()
      os.execute("sleep 0.3") -- (the loop not run: what it sends waits, unread, for the next read)
    end
    helpers.wait_for(function()
      self.port = tonumber(self.out():match("ACCEPT 127%.0%.0%.1:(%d+)"))
      return self.port ~= nil
    end)
    return self
  end

  -- A connection to s_server's port, up -> conn, and a function that says how it is (true: up; else why).
  local function connect(port)
    local core = require "moonjob.core"
    local up
    local conn = rq.close_after(assert(core.redis("127.0.0.1", port, 30000, 1024 * 1024,
      function(kind, why) up = kind == "up" or why end, { ca = certs.ca })))
    helpers.wait_for(function() return up ~= nil end)
    assert.is_true(up, up)
    return conn, function() return up end
  end

  it("takes a server's renegotiation request as a connection loss, not a refusal a person must act on", function()
    local server_ = s_server()
    local conn, state = connect(server_.port)
    local replies = {}
    conn:command({ "PING" }, function(v, err)
      replies[#replies + 1] = v or err
      conn:command({ "PING" }, function(v2, err2) replies[#replies + 1] = v2 or err2 end) -- sent mid-renegotiation
    end)
    helpers.wait_for(function() return server_.out():find("PING", 1, true) ~= nil end)
    server_.tell("+PONG") -- the reply, then the request to renegotiate: read together
    server_.tell("r")
    helpers.wait_for(function() return state() ~= true end)
    assert.equal("PONG", replies[1])
    assert.is_nil(state():match("^TLS: "), state())
    assert.matches("TLS session", state(), 1, true)
  end)

  it("ends a session with a close_notify when the connection is closed", function()
    local server_ = s_server()
    local conn = connect(server_.port)
    conn:command({ "PING" }, function() end)
    helpers.wait_for(function() return server_.out():find("PING", 1, true) ~= nil end)
    conn:close()
    helpers.wait_for(function() return server_.out():find("DONE", 1, true) or server_.out():find("ERROR", 1, true) end)
    assert.is_nil(server_.out():find("ERROR", 1, true), server_.out())
  end)

  it("carries small commands after a big one as before it", function()
    local core = require "moonjob.core"
    local up
    local conn = rq.close_after(assert(core.redis("127.0.0.1", server.port, 30000, 8 * 1024 * 1024,
      function(kind, why) up = kind == "up" or why end, { ca = certs.ca })))
    helpers.wait_for(function() return up ~= nil end)
    assert.is_true(up, up)
    local big
    conn:command({ "SET", "big", ("x"):rep(48 * 1024 * 1024) }, function(v, err) big = v or err end)
    helpers.wait_for(function() return big ~= nil end, 60)
    assert.equal("OK", big)
    -- one after another: each its own loop turn, its own encryption
    local answered = 0
    local function ping()
      conn:command({ "PING" }, function(v)
        assert.equal("PONG", v)
        answered = answered + 1
        if answered < 1000 then ping() end
      end)
    end
    ping()
    helpers.wait_for(function() return answered == 1000 end, 60)
    assert.is_true(up, up)
  end)

  it("refuses an @ left as such in a URL's query, which would end the password there", function()
    for _, url in ipairs({ "rediss://h:6380/0?ca=/x@y", "rediss://u:pw@h:6380/0?servername=a&ca=/x@y",
      "redis://h/0?ca=/x@y", "redis+sentinel://s1:26379/m/0?sentinel_password=a@b" }) do
      local t, err = client.parse(url)
      assert.is_nil(t, url)
      assert.matches("%40", err, 1, true)
    end
    -- a password may hold @ and ?, with no query key after the ?
    local t = assert(client.parse("rediss://u:p@ss?w@example.com/2"))
    assert.equal("p@ss?w", t.password)
    assert.equal("example.com", t.host)
  end)

  it("reads rediss:// URLs: query values percent-decoded, the query over the environment, no password shown", function()
    local t = assert(client.parse("rediss://u:p%40ss@example.com/2?ca=%2Ftmp%2Fmy%20ca.pem&servername=redis.internal"))
    assert.same({ ca = "/tmp/my ca.pem", servername = "redis.internal" }, t.tls)
    assert.equal(6379, t.port)
    assert.equal("p@ss", t.password)
    assert.equal("rediss://u:***@example.com:6379/2", client.display(t))
    assert.is_nil(client.parse("redis://h:1/0").tls)
    local _, err = client.parse("redis://h:1/0?ca=/x")
    assert.matches("rediss://", err, 1, true)
    _, err = client.parse("rediss://h:1/0?insecure=1")
    assert.matches("'insecure'", err, 1, true)
    assert.matches("ca, cert, key, servername", err, 1, true)
    local out = helpers.sh(("env MOONJOB_REDIS_CA=/env/ca MOONJOB_REDIS_CERT=/env/cert %s -e %s"):format(
      helpers.LUAJIT, quote([[
        local c = require "moonjob.redis.client"
        local t = c.parse("rediss://h/0?ca=/url/ca")
        print(t.tls.ca, t.tls.cert, t.tls.key, c.parse("redis://h/0").tls)]])))
    assert.equal("/url/ca\t/env/cert\tnil\tnil\n", out)
  end)
end)
