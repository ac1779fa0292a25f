-- One connection to Redis (core.redis: core/parent/redis.c) against a real
-- redis-server: subscriptions of both kinds on one connection, a refused
-- subscription, the commands of a loop turn in one write, a close from
-- inside a reply's callback, the reply timeout of a server that stopped
-- answering while calls keep coming, the bound on bytes waiting to be
-- written.
local core = require "moonjob.core"
local client = require "moonjob.redis.client"
local helpers = require "helpers"
local loop = require "moonjob.loop"
local rq = require "redis_queue"

-- A connection to the file's server, up -> conn.
local function connect()
  local up
  local conn = assert(core.redis("127.0.0.1", rq.server().port, 5000, 1024 * 1024, function(kind, why)
    up = kind == "up" or why
  end))
  rq.close_after(conn)
  helpers.wait_for(function() return up ~= nil end)
  assert(up == true, up)
  return conn
end

-- A fake server on loopback (Python): takes one connection, waits until the
-- client sent `until_seen` (bytes), then sends each of `pushes` (RESP text)
-- 0.1 s apart, and holds the connection until the client ends it. -> its
-- port; it is killed after the test.
local FAKE = [==[
import socket, sys, time
until_seen, pushes = sys.argv[1].encode(), [p.encode() for p in sys.argv[2:]]
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(1)
print(s.getsockname()[1], flush=True)
c, _ = s.accept()
seen = b""
while until_seen not in seen:
    data = c.recv(65536)
    if not data:
        sys.exit(0)
    seen += data
for p in pushes:
    c.sendall(p.replace(b"|", b"\r\n"))
    time.sleep(0.1)
while c.recv(65536):
    pass
]==]

local function fake_server(until_seen, pushes)
  local args = {}
  for i, p in ipairs(pushes) do args[i] = "'" .. p .. "'" end
  return rq.python_server(FAKE, ("'%s' %s"):format(until_seen, table.concat(args, " ")))
end

-- A fake server on loopback (Python) that closes every connection at once,
-- as a TLS port does to plaintext: -> its port; it is killed after the test.
local CLOSER = [==[
import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(8)
print(s.getsockname()[1], flush=True)
while True:
    c, _ = s.accept()
    c.close()
]==]

local function closing_server()
  return rq.python_server(CLOSER)
end

-- The server's count of reads it processed (INFO stats), less the one of the INFO.
local function reads()
  return tonumber(rq.server():cli("INFO", "stats"):match("total_reads_processed:(%d+)"))
end

rq.describe(function()
  describe("a connection", function()
    it("takes SUBSCRIBE and SSUBSCRIBE on one connection, each channel's messages to its callback", function()
      local conn = connect()
      local plain, sharded = {}, {}
      assert(conn:subscribe({ "SUBSCRIBE", "news" }, function(msg, err)
        plain[#plain + 1] = msg and table.concat(msg, " ") or "end: " .. err
      end))
      assert(conn:subscribe({ "SSUBSCRIBE", "{q}:events" }, function(msg, err)
        sharded[#sharded + 1] = msg and table.concat(msg, " ") or "end: " .. err
      end))
      helpers.wait_for(function() return #plain == 1 and #sharded == 1 end)
      assert.equal("subscribe news 1", plain[1])
      assert.equal("ssubscribe {q}:events 1", sharded[1])
      assert(conn:ping()) -- its answer (["pong", ""]) is nobody's
      assert.equal("1", rq.server():cli("SPUBLISH", "{q}:events", "one"))
      assert.equal("1", rq.server():cli("PUBLISH", "news", "two"))
      assert.equal("1", rq.server():cli("SPUBLISH", "{q}:events", "three"))
      helpers.wait_for(function() return #sharded == 3 and #plain == 2 end)
      assert.same({ "ssubscribe {q}:events 1", "smessage {q}:events one", "smessage {q}:events three" }, sharded)
      assert.same({ "subscribe news 1", "message news two" }, plain)
      assert.equal(0, conn:pending())
      conn:close()
      assert.equal("end: closed", plain[3])
      assert.equal("end: closed", sharded[4])
    end)

    it("tells a subscription the server refused, as its last call, and goes on", function()
      rq.server():cli("ACL", "SETUSER", "nochan", "on", ">pw", "~*", "resetchannels", "&allowed", "+@all")
      local conn = connect()
      local got, done = {}, false
      conn:command({ "AUTH", "nochan", "pw" }, function(v) got.auth = v end)
      for _, command in ipairs({ "SUBSCRIBE", "SSUBSCRIBE" }) do
        assert(conn:subscribe({ command, "forbidden" }, function(msg, err, kind)
          got[#got + 1] = { command, msg, err, kind }
        end))
      end
      assert(conn:subscribe({ "SUBSCRIBE", "allowed" }, function(msg)
        if msg and msg[1] == "subscribe" then done = true end
      end))
      helpers.wait_for(function() return done end)
      assert.equal("OK", got.auth)
      assert.equal(2, #got)
      for i, command in ipairs({ "SUBSCRIBE", "SSUBSCRIBE" }) do
        assert.equal(command, got[i][1])
        assert.is_nil(got[i][2])
        assert.matches("NOPERM", got[i][3])
        assert.equal("reply", got[i][4])
      end
      assert(conn:ping())
      assert.equal("1", rq.server():cli("PUBLISH", "allowed", "x")) -- the connection still serves
    end)

    it("writes the commands of one loop turn together: the server reads them at once", function()
      local conn = connect()
      local answered = 0
      local before = reads()
      for i = 1, 200 do
        assert(conn:command({ "SET", "k" .. i, i }, function(v) if v == "OK" then answered = answered + 1 end end))
      end
      helpers.wait_for(function() return answered == 200 end)
      local read = reads() - before - 1 -- (less the INFO's own)
      assert.is_true(read <= 2, read .. " reads for 200 commands")
    end)

    it("lets a reply's callback close the connection: the others hear it once that callback returned", function()
      local conn = connect()
      local log = {}
      conn:command({ "PING" }, function(v)
        log[#log + 1] = "first " .. v
        conn:close()
        log[#log + 1] = "closed"
      end)
      conn:command({ "PING" }, function(v, err) log[#log + 1] = "second " .. tostring(v or err) end)
      conn:command({ "PING" }, function(v, err) log[#log + 1] = "third " .. tostring(v or err) end)
      helpers.wait_for(function() return #log == 4 end)
      assert.same({ "first PONG", "closed", "second closed", "third closed" }, log)
      assert.has_error(function() conn:command({ "PING" }, function() end) end)
    end)

    it("keeps a plain subscription's messages once the server ended the sharded one", function()
      -- a server-side sunsubscribe (a slot moved) leaves no sharded channel, one plain
      local port = fake_server("SSUBSCRIBE", {
        "*3|$9|subscribe|$1|a|:1|", "*3|$10|ssubscribe|$1|b|:1|", "*3|$12|sunsubscribe|$1|b|:0|",
        "*3|$7|message|$1|a|$5|hello|", "*3|$7|message|$1|a|$5|world|" })
      local up
      local conn = rq.close_after(assert(core.redis("127.0.0.1", port, 5000, 1024 * 1024, function(kind, why)
        up = kind == "up" or why
      end)))
      helpers.wait_for(function() return up ~= nil end)
      assert.is_true(up, up)
      local plain, sharded = {}, {}
      assert(conn:subscribe({ "SUBSCRIBE", "a" }, function(msg, err)
        plain[#plain + 1] = msg and table.concat(msg, " ") or "end: " .. err
      end))
      assert(conn:subscribe({ "SSUBSCRIBE", "b" }, function(msg, err)
        sharded[#sharded + 1] = msg and table.concat(msg, " ") or "end: " .. err
      end))
      assert.is_truthy(rq.wait_for(function() return #plain >= 3 or up ~= true end, 10), "nothing came")
      assert.is_true(up, up)
      assert.same({ "subscribe a 1", "message a hello", "message a world" }, plain)
      assert.same({ "ssubscribe b 1", "sunsubscribe b 0" }, sharded)
    end)

    it("drops a connection whose server stopped answering, though calls keep coming", function()
      local c = rq.close_after(assert(client.new(rq.server().url, { timeout_ms = 1000 })))
      assert(c:wait_ready())
      local answered, failed = 0, nil
      local pinger = core.timer(function()
        c:call({ "PING" }, function(v, err)
          if v == "PONG" then answered = answered + 1
          elseif not failed then failed = { err = err, at = loop.now() } end
        end)
      end)
      rq.close_after({ close = function() pinger:close() end })
      pinger:start(250, 250) -- as the watchdog ticks (a quarter of the timeout): a call at each of its ticks
      helpers.wait_for(function() return answered >= 2 end)
      rq.close_after({ close = function() rq.server():signal("CONT") end })
      rq.server():signal("STOP")
      local stopped = loop.now()
      assert.is_truthy(rq.wait_for(function() return failed ~= nil end, 8), "no call failed within 8 s")
      assert.is_true(failed.at - stopped < 5000, ("the first error came %d ms after the stop"):format(failed.at - stopped))
      assert.matches("no reply from the server within 1000 ms", failed.err, 1, true)
    end)

    it("bounds the bytes waiting to be written: 16 times max_reply, then a clear refusal", function()
      local up
      local conn = rq.close_after(assert(core.redis("127.0.0.1", rq.server().port, 5000, 1024 * 1024,
        function(kind, why) up = kind == "up" or why end)))
      helpers.wait_for(function() return up ~= nil end)
      local mib = ("x"):rep(1024 * 1024 - 64)
      local answered, refused = 0, nil
      for i = 1, 20 do -- one loop turn: none written yet
        local ok, err, code = conn:command({ "SET", "big" .. i, mib }, function(v)
          if v == "OK" then answered = answered + 1 end
        end)
        if not ok then
          refused = refused or { at = i, err = err, code = code }
        end
      end
      assert.is_truthy(refused, "20 MiB of commands were taken")
      assert.equal(17, refused.at) -- 16 MiB at most
      assert.equal("ENOBUFS", refused.code)
      assert.matches("bytes waiting to be written to the server past 16777216", refused.err, 1, true)
      local ok, err = conn:command({ "SET", "huge", mib:rep(17) }, function() end)
      assert.is_nil(ok)
      assert.matches("ENOBUFS", err, 1, true)
      -- once written, there is room again; the connection serves on
      helpers.wait_for(function() return answered == 16 end)
      local v
      assert(conn:command({ "DBSIZE" }, function(x) v = x end))
      helpers.wait_for(function() return v ~= nil end)
      assert.is_true(up, up)
      -- a client's call fails at once, saying why
      local c = rq.close_after(assert(client.new(rq.server().url, { max_reply = 1024 * 1024 })))
      assert(c:wait_ready())
      local value, cerr = c:call_wait({ "SET", "huge", mib:rep(17) })
      assert.is_nil(value)
      assert.matches("ENOBUFS: this command would take", cerr, 1, true)
    end)

    it("hints at the TLS form of its own URL when a server closes before any reply", function()
      local port = closing_server()
      local c = assert(client.new(("redis://:s3cret@127.0.0.1:%d/0"):format(port), { timeout_ms = 1000 }))
      rq.close_after(c)
      local _, err = c:wait_ready()
      assert.matches("use a rediss:// URL", err, 1, true)
      c = assert(client.new(("redis+sentinel://:s3cret@127.0.0.1:%d/mymaster/0"):format(port), { timeout_ms = 1000 }))
      rq.close_after(c)
      _, err = c:wait_ready()
      assert.matches("rediss+sentinel://", err, 1, true)
      assert.falsy(err:find("use a rediss:// URL", 1, true), err)
      assert.falsy(err:find("s3cret", 1, true), err)
    end)

    it("refuses a command of subscriptions sent as a plain command", function()
      local conn = connect()
      local ok, err = pcall(conn.command, conn, { "SUBSCRIBE", "x" }, function() end)
      assert.is_false(ok)
      assert.matches("SUBSCRIBE and SSUBSCRIBE go through conn:subscribe", err, 1, true)
      assert.has_error(function() conn:subscribe({ "PSUBSCRIBE", "x*" }, function() end) end)
      local v
      conn:command({ "PING" }, function(x) v = x end)
      helpers.wait_for(function() return v ~= nil end)
      assert.equal("PONG", v)
    end)
  end)
end)
