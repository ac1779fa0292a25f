-- The core's HTTP server (core.http_listen), over real sockets on 127.0.0.1:
-- curl and bash's /dev/tcp as clients, run in the background while the loop
-- serves them.
local core = require "moonjob.core"
local h = require "helpers"
local clients = require "http_clients"

describe("core.http_listen", function()
  local dir, servers

  local function listen(handler, opts, host)
    local server, err = core.http_listen(host or "127.0.0.1", 0, handler, opts)
    assert(server, err)
    servers[#servers + 1] = server
    return server, ("http://%s:%d"):format(host == "::1" and "[::1]" or "127.0.0.1", server:port())
  end

  local function finished(client)
    h.wait_for(client.done, 15)
    return client.result()
  end

  local function later(ms, fn)
    local timer
    timer = core.timer(function()
      timer:close()
      fn()
    end)
    timer:start(ms)
  end

  before_each(function()
    dir = h.tmpdir()
    servers = {}
  end)

  after_each(function()
    for _, server in ipairs(servers) do server:close() end
    h.sleep(0.05) -- the handles close
    os.execute("rm -rf " .. dir)
  end)

  it("gives the handler method, path, query, headers, body and peer", function()
    local seen
    local _, url = listen(function(req)
      seen = { method = req.method, path = req.path, query = req.query, headers = req.headers,
               body = req.body, peer = req.peer, url = req.url }
      req:respond(201, { ["Content-Type"] = "text/plain", ["X-Answer"] = 42 }, "made\n")
    end)
    local out, err, rc = finished(clients.curl(dir, ("-i -H 'X-Twice: a' -H 'X-Twice: b' -H 'X-Empty;' "
      .. "--data-binary 'the body' '%s/jobs%%20x?state=failed&limit=2'"):format(url)))
    assert.equal(0, rc, err)
    assert.matches("^HTTP/1.1 201 Created\r\n", out)
    assert.matches("\r\nX%-Answer: 42\r\n", out)
    assert.matches("\r\nContent%-Length: 5\r\n", out)
    assert.matches("\r\n\r\nmade\n$", out)
    assert.equal("POST", seen.method)
    assert.equal("/jobs%20x", seen.path) -- not decoded
    assert.equal("state=failed&limit=2", seen.query)
    assert.equal("/jobs%20x?state=failed&limit=2", seen.url)
    assert.equal("a, b", seen.headers["x-twice"])
    assert.equal("", seen.headers["x-empty"])
    assert.equal("8", seen.headers["content-length"])
    assert.equal("the body", seen.body)
    assert.equal("127.0.0.1", seen.peer)
  end)

  it("has no query for a path without one, and takes a chunked body whole", function()
    local seen
    local _, url = listen(function(req)
      seen = { query = req.query, body = req.body, path = req.path }
      req:respond(200)
    end)
    local _, err, rc = finished(clients.curl(dir, ("-H 'Transfer-Encoding: chunked' --data-binary %s '%s/x'")
      :format(("y"):rep(5000), url)))
    assert.equal(0, rc, err)
    assert.is_nil(seen.query)
    assert.equal("/x", seen.path)
    assert.equal(("y"):rep(5000), seen.body)
  end)

  it("keeps a connection alive across requests", function()
    local ports = {}
    local _, url = listen(function(req)
      ports[#ports + 1] = req.peer_port
      req:respond(200, nil, req.path)
    end)
    local out, err, rc = finished(clients.curl(dir, ("-v %s/one %s/two"):format(url, url)))
    assert.equal(0, rc, err)
    assert.equal("/one/two", out)
    assert.equal(2, #ports)
    assert.equal(ports[1], ports[2])
    assert.matches("Re%-using existing connection", err)
  end)

  it("answers later, from a timer, and pipelined requests in order", function()
    local _, url = listen(function(req)
      if req.path == "/slow" then later(50, function() assert(req:respond(200, nil, "slow;")) end)
      else assert(req:respond(200, nil, "fast;")) end
    end)
    local out, err, rc = finished(clients.curl(dir, url .. "/slow"))
    assert.equal(0, rc, err)
    assert.equal("slow;", out)
    local port = url:match("(%d+)$")
    local raw = clients.raw(dir, port, "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n"
      .. "GET /fast HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    out = finished(raw)
    assert.matches("slow;HTTP/1.1 200 OK\r\n.*Connection: close\r\n\r\nfast;$", out)
  end)

  it("streams server-sent events in order and tells the handler when the client left", function()
    local closed_why, write_after
    local _, url = listen(function(req)
      assert(req:start(200, { ["Content-Type"] = "text/event-stream" }))
      req:on_close(function(why)
        closed_why = why
        write_after = { req:write("data: late\n\n") }
      end)
      local n = 0
      local function tick()
        n = n + 1
        if n > 3 or req:closed() then return end
        assert(req:write(("data: %d\n\n"):format(n)))
        later(20, tick)
      end
      tick()
    end)
    local out = finished(clients.curl(dir, ("-N --max-time 1 %s/events"):format(url)))
    assert.equal("data: 1\n\ndata: 2\n\ndata: 3\n\n", out)
    h.wait_for(function() return closed_why ~= nil end)
    assert.matches("closed", closed_why)
    assert.is_false(write_after[1])
    assert.matches("closed", write_after[2])
  end)

  it("ends a stream with its last chunk and serves the connection on", function()
    local _, url = listen(function(req)
      if req.path == "/stream" then
        req:start(200)
        req:write("a")
        later(20, function()
          req:write("b")
          assert(req:finish())
        end)
      else
        req:respond(200, nil, "c")
      end
    end)
    local out, err, rc = finished(clients.curl(dir, ("-v %s/stream %s/other"):format(url, url)))
    assert.equal(0, rc, err)
    assert.equal("abc", out)
    assert.matches("Transfer%-Encoding: chunked", err)
    assert.matches("Re%-using existing connection", err)
  end)

  it("answers 431 to headers past max_header and 413 to a body past max_body", function()
    local called = 0
    local _, url = listen(function(req)
      called = called + 1
      req:respond(200)
    end, { max_header = 4096, max_body = 1000 })
    local big = h.write_file(dir .. "/big", ("b"):rep(2000))
    local status = finished(clients.curl(dir, ("-o /dev/null -w '%%{http_code}' -H 'X-Big: %s' %s/")
      :format(("h"):rep(5000), url)))
    assert.equal("431", status)
    status = finished(clients.curl(dir, ("-o /dev/null -w '%%{http_code}' --data-binary @%s %s/")
      :format(big, url)))
    assert.equal("413", status)
    status = finished(clients.curl(dir, ("-o /dev/null -w '%%{http_code}' -H 'Transfer-Encoding: chunked' "
      .. "--data-binary @%s %s/"):format(big, url)))
    assert.equal("413", status)
    assert.equal(0, called)
  end)

  it("answers HTTP/1.0 and HEAD requests as they expect", function()
    local _, url = listen(function(req)
      if req.path == "/stream" then
        req:start(200)
        req:write("streamed")
        req:finish()
      else
        req:respond(200, { ["X-Method"] = req.method }, "whole")
      end
    end)
    local out, err, rc = finished(clients.curl(dir, ("-i --http1.0 %s/stream"):format(url)))
    assert.equal(0, rc, err)
    assert.matches("\r\nConnection: close\r\n\r\nstreamed$", out) -- ended by the close
    assert.not_matches("chunked", out)
    out, err, rc = finished(clients.curl(dir, ("-I %s/whole"):format(url)))
    assert.equal(0, rc, err)
    assert.matches("\r\nX%-Method: HEAD\r\n", out)
    assert.matches("\r\nDate: %a%a%a, %d%d %a%a%a %d%d%d%d %d%d:%d%d:%d%d GMT\r\n", out)
    assert.matches("\r\nContent%-Length: 5\r\n\r\n$", out) -- no body
  end)

  it("answers 400 to what is not HTTP", function()
    local server = listen(function(req) req:respond(200) end)
    local out = finished(clients.raw(dir, server:port(), "HELLO THERE\r\n\r\n"))
    assert.matches("^HTTP/1.1 400 Bad Request\r\n", out)
  end)

  it("closes a connection whose request is not whole within idle_timeout_ms", function()
    local called = false
    local server = listen(function() called = true end, { idle_timeout_ms = 300 })
    local half = clients.raw(dir, server:port(), "GET / HTTP/1.1\r\nHost: x\r\n")
    local out = finished(half) -- cat ends: the server closed
    assert.equal("", out)
    assert.is_false(called)
    h.wait_for(function() return server:connections() == 0 end)
  end)

  it("drops a client that does not read a streamed answer, never buffering without end", function()
    local written, why, closed = 0, nil, nil
    local server = listen(function(req)
      req:on_close(function(w) closed = w end)
      req:start(200)
      local chunk = ("z"):rep(256 * 1024)
      local function pour()
        local ok, err = req:write(chunk)
        if not ok then why = err return end
        written = written + #chunk
        assert(written < 512 * 1024 * 1024, "buffered without end")
        later(5, pour)
      end
      pour()
    end, { max_unsent = 64 * 1024 })
    clients.raw(dir, server:port(), "GET / HTTP/1.1\r\nHost: x\r\n\r\n", "exec sleep 8")
    h.wait_for(function() return why ~= nil end, 30)
    assert.matches("not reading", why)
    assert.matches("not reading", closed)
    h.wait_for(function() return server:connections() == 0 end)
  end)

  it("drops a client that takes nothing of a queued answer within idle_timeout_ms", function()
    local wrote, why
    local server = listen(function(req)
      req:on_close(function(w) why = w end)
      req:start(200)
      wrote = req:write(("w"):rep(32 * 1024 * 1024)) -- more than the socket holds; then nothing
    end, { idle_timeout_ms = 300 })
    clients.raw(dir, server:port(), "GET / HTTP/1.1\r\nHost: x\r\n\r\n", "exec sleep 8")
    h.wait_for(function() return why ~= nil end, 5) -- the client still sleeps
    assert.is_true(wrote)
    assert.matches("took nothing of the answer within the idle timeout", why)
    h.wait_for(function() return server:connections() == 0 end)
  end)

  it("says 100 Continue to a client that waits for it before its body", function()
    local size
    local _, url = listen(function(req)
      size = #req.body
      req:respond(200)
    end, { max_body = 4 * 1024 * 1024 })
    local body = h.write_file(dir .. "/body", ("c"):rep(2 * 1024 * 1024))
    local _, err, rc = finished(clients.curl(dir, ("-v -H 'Expect: 100-continue' --data-binary @%s %s/")
      :format(body, url)))
    assert.equal(0, rc, err)
    assert.matches("< HTTP/1.1 100 Continue", err)
    assert.equal(2 * 1024 * 1024, size)
  end)

  it("answers 500 to a handler that raises and reports the error", function()
    local reported
    local _, url = listen(function(req)
      if req.path == "/boom" then error("the handler broke") end
      req:respond(200, nil, "fine")
    end, { on_error = function(message, what) reported = { message, what } end })
    local out, err, rc = finished(clients.curl(dir, ("-i %s/boom %s/ok"):format(url, url)))
    assert.equal(0, rc, err)
    assert.matches("^HTTP/1.1 500 Internal Server Error\r\n", out)
    assert.matches("fine$", out) -- the connection serves on
    assert.matches("the handler broke", reported[1])
    assert.matches("stack traceback", reported[1])
    assert.equal("request handler", reported[2])
  end)

  it("frees a request never answered when its connection closes", function()
    local held = setmetatable({}, { __mode = "k" })
    local gone
    local server, url = listen(function(req)
      held[req] = true
      req:on_close(function(why) gone = why end)
    end)
    local _, _, rc = finished(clients.curl(dir, ("--max-time 0.5 %s/"):format(url)))
    assert.equal(28, rc) -- curl's time-out
    h.wait_for(function() return gone ~= nil and server:connections() == 0 end)
    collectgarbage()
    collectgarbage()
    assert.is_nil(next(held))
  end)

  it("picks a free port for port 0 and says which", function()
    local server, url = listen(function(req) req:respond(200, nil, "here") end)
    assert.is_true(server:port() > 0)
    assert.equal("here", (finished(clients.curl(dir, url))))
  end)

  it("listens on an IPv6 literal", function()
    local _, url = listen(function(req) req:respond(200, nil, req.peer) end, nil, "::1")
    local out, err, rc = finished(clients.curl(dir, "-g " .. url))
    assert.equal(0, rc, err)
    assert.equal("::1", out)
  end)

  it("says clearly when the address is in use or not an address", function()
    local server = listen(function() end)
    local none, err, code = core.http_listen("127.0.0.1", server:port(), function() end)
    assert.is_nil(none)
    assert.equal("EADDRINUSE", code)
    assert.matches("cannot listen on 127.0.0.1 port %d+: address already in use", err)
    none, err = core.http_listen("localhost", 0, function() end)
    assert.is_nil(none)
    assert.matches("not an IPv4 or IPv6 address", err)
    assert.has_error(function() core.http_listen("127.0.0.1", 70000, function() end) end)
    assert.has_error(function() core.http_listen("127.0.0.1", 0, function() end, { max_body = -1 }) end)
    assert.has_error(function() core.http_listen("127.0.0.1", 0, function() end, { max_header = 65536 }) end,
      "core.http_listen: option max_header must be a number from 256 to 65535")
  end)

  it("closes connections past max_connections as soon as they come", function()
    local server = listen(function() end, { max_connections = 2, idle_timeout_ms = 60000 })
    local port = server:port()
    local first, second = clients.raw(dir, port, ""), clients.raw(dir, port, "")
    h.wait_for(function() return server:connections() == 2 end)
    local third = clients.raw(dir, port, "")
    finished(third)
    assert.equal(2, server:connections())
    assert.is_false(first.done() or second.done())
    server:close() -- with clients connected
    finished(first)
    finished(second)
  end)

  it("closes with clients connected: a stream hears it, the server is gone", function()
    local why
    local server, url = listen(function(req)
      req:on_close(function(w) why = w end)
      req:start(200)
      req:write("data: 1\n\n")
    end)
    local client = clients.curl(dir, "-N " .. url)
    h.wait_for(function() return server:connections() == 1 and h.sh("cat " .. client.base .. ".out") ~= "" end)
    server:close()
    assert.equal("the server closed", why)
    local out = finished(client)
    assert.equal("data: 1\n\n", out)
    local ok, err = pcall(server.port, server)
    assert.is_false(ok)
    assert.matches("the server is closed", err)
    server:close() -- again: nothing
  end)

  it("runs handlers inside the loop, where a blocking wait refuses", function()
    local refused
    local _, url = listen(function(req)
      refused = select(2, pcall(require("moonjob.loop").wait_until, function() return false end))
      req:respond(200)
    end)
    finished(clients.curl(dir, url))
    assert.matches("cannot wait inside a moonjob event callback", refused)
  end)

  it("refuses misuse of a request with a clear error", function()
    local errors = {}
    local _, url = listen(function(req)
      errors.header = select(2, pcall(req.respond, req, 200, { ["Bad Name"] = "x" }))
      errors.length = select(2, pcall(req.respond, req, 200, { ["Content-Length"] = "3" }))
      errors.value = select(2, pcall(req.respond, req, 200, { ["X-A"] = "a\r\nX-B: b" }))
      errors.status = select(2, pcall(req.respond, req, 99))
      errors.write = select(2, pcall(req.write, req, "x"))
      req:respond(200)
      errors.twice = select(2, pcall(req.respond, req, 200))
    end)
    finished(clients.curl(dir, url))
    assert.matches("bad header name 'Bad Name'", errors.header)
    assert.matches("set by the core", errors.length)
    assert.matches("without CR, LF or NUL", errors.value)
    assert.matches("from 200 to 599", errors.status)
    assert.matches("call req:start%(%) first", errors.write)
    assert.matches("answered already", errors.twice)
  end)
end)
