-- The pure-Lua producer (moonjob.producer): plain Lua programs, run by
-- LuaJIT, Lua 5.2, 5.3 and 5.4 with nothing of moonjob's build (no core.so,
-- no FFI), add jobs that a real `moonjob worker` process runs, through
-- Debian's redis-lua (LuaJIT, 5.2, 5.3: Debian packages it for 5.1 to 5.3) or
-- a connection the producer opens from host and port (5.4: LuaSocket); they
-- load the function library themselves, load it again after FUNCTION FLUSH,
-- and get errors as nil, err. (spec/support/pure_lua.lua runs the programs.)
local faults = require "redis_faults"
local helpers = require "helpers"
local library = require "moonjob.redis.library"
local pure_lua = require "pure_lua"
local redis_server = require "redis_server"
local rq = require "redis_queue"

local OURS = library.version()

-- The client a program of interpreter `lua` uses: redis-lua's where Debian
-- has it, else connection options.
local function client_of(lua)
  if pure_lua.HAS_REDIS_LUA[lua] then return 'require("redis").connect("127.0.0.1", PORT)' end
  return "{ port = PORT }"
end

-- Runs body under lua (its QUEUE, CLIENT and REDIS_CLI, the client program
-- as a shell word, replaced) -> its output's rows; the program must end well
-- and be pure.
local function run(lua, queue, body)
  local server = rq.server()
  local cli_program = ("%q"):format(redis_server.CLI)
  body = body:gsub("QUEUE", queue):gsub("REDIS_CLI", function() return cli_program end):gsub("CLIENT", client_of(lua))
  local out, err, status = pure_lua.run(lua, server.port, body)
  assert.equal(0, status, "the program failed: " .. err .. out)
  local rows = pure_lua.rows(out)
  assert.same({ "pure" }, rows[#rows], "moonjob.core or the FFI was loaded")
  rows[#rows] = nil
  return rows
end

-- A fake server on loopback (Python), serving one connection after
-- another: "moved" answers each command -MOVED 3300 127.0.0.1:1 (a Redis
-- Cluster node that does not serve the key's slot); "close" closes each
-- connection at once (a TLS port does so to plaintext) -> its port; it is
-- killed after the test.
local FAKE = [==[
import socket, sys
mode = sys.argv[1]
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(8)
print(s.getsockname()[1], flush=True)
while True:
    c, _ = s.accept()
    if mode == "close":
        c.close()
        continue
    while True:
        data = c.recv(65536)
        if not data:
            break
        n = sum(1 for line in data.split(b"\r\n") if line.startswith(b"*"))
        c.sendall(b"-MOVED 3300 127.0.0.1:1\r\n" * n)
    c.close()
]==]

local function fake_server(mode)
  return rq.python_server(FAKE, mode)
end

local function loaded_version(server)
  return rq.server():cli("FCALL_RO", "moonjob_version", "0")
end

rq.describe(function()
  for _, lua in ipairs(pure_lua.INTERPRETERS) do
    describe("moonjob.producer under " .. lua, function()
      it("adds jobs a moonjob worker runs: add, add_bulk, wait, get, counts", function()
        local queue = rq.new_queue()
        rq.start_worker(queue, "-j 2")
        local rows = run(lua, queue, [[
          local q = assert(producer.queue(CLIENT, "QUEUE"))
          local a = assert(q:add({ echo = "one" }, { attempts = 2 }))
          say("added", a.state)
          local jobs = assert(q:add_bulk({ { echo = "two" }, { echo = 3 }, { echo = 1234567890123 } }))
          say("bulk", #jobs)
          say("result", assert(a:wait(30)).echo, a.state)
          for _, j in ipairs(jobs) do
            local echo = assert(q:wait(j.id, 30)).echo
            -- (as %.0f: cjson reads every number as a float on Lua 5.3 and later)
            say("result", type(echo) == "number" and ("%.0f"):format(echo) or echo)
          end
          local info = assert(q:get(a))
          say("get", info.state, info.result.echo, info.attempts, info.max_attempts)
          local c = assert(q:counts())
          say("counts", c.completed, c.waiting, c.exists)
        ]])
        assert.same({ { "added", "waiting" }, { "bulk", "3" }, { "result", "one", "completed" }, { "result", "two" },
          { "result", "3" }, { "result", "1234567890123" }, { "get", "completed", "one", "1", "2" },
          { "counts", "4", "0", "true" } }, rows)
      end)

      it("adds a flow: the children run before their parent, whose children's results are kept", function()
        local queue = rq.new_queue()
        rq.start_worker(queue, "-j 2")
        local rows = run(lua, queue, [[
          local q = assert(producer.queue(CLIENT, "QUEUE"))
          local root = assert(q:add_flow({ data = { echo = "parent" }, children = {
            { data = { echo = "a" } }, { data = { echo = "b" }, children = { { data = { echo = "c" } } } } } }))
          say("root", root.state, #root.children, #root.children[2].children)
          say("parent", assert(root:wait(30)).echo)
          for _, c in ipairs(assert(q:children(root))) do say("child", c.state, c.result.echo) end
          local _, err = q:add_flow({ data = {}, children = { { data = {}, on_fail = "sometimes" } } })
          say("bad", err.code, err.message)
          local c = assert(q:counts())
          say("counts", c.completed, c.waiting_children)
        ]])
        assert.same({ { "root", "waiting-children", "2", "1" }, { "parent", "parent" }, { "child", "completed", "a" },
          { "child", "completed", "b" } }, { unpack(rows, 1, 4) })
        assert.equal("EINPUT", rows[5][2])
        assert.matches("root.children[1]: on_fail must be", rows[5][3], 1, true)
        assert.same({ "counts", "4", "0" }, rows[6])
      end)

      it("loads the library on a server without one, and again after FUNCTION FLUSH, resending the call", function()
        local server = rq.server()
        server:cli("FUNCTION", "FLUSH")
        local rows = run(lua, rq.new_queue(), [[
          local q = assert(producer.queue(CLIENT, "QUEUE"))
          say("first", assert(q:add({ n = 1 })).state)
          os.execute(REDIS_CLI .. " -p " .. PORT .. " FUNCTION FLUSH >/dev/null")
          say("after flush", assert(q:add({ n = 2 })).state)
          os.execute(REDIS_CLI .. " -p " .. PORT .. " FUNCTION FLUSH >/dev/null")
          say("bulk after flush", #assert(q:add_bulk({ { n = 3 }, { n = 4 } })))
          os.execute(REDIS_CLI .. " -p " .. PORT .. " FUNCTION FLUSH >/dev/null")
          say("waiting", assert(q:counts()).waiting)
        ]])
        assert.same({ { "first", "waiting" }, { "after flush", "waiting" }, { "bulk after flush", "2" },
          { "waiting", "4" } }, rows)
        assert.equal(OURS, loaded_version(server))
        assert.equal(library.text(), server:cli("FUNCTION", "LIST", "LIBRARYNAME", "moonjob", "WITHCODE")
          :match("library_code\n(.*)$"))
      end)

      it("answers mistakes and refusals with nil, err", function()
        local queue = rq.new_queue()
        rq.start_worker(queue)
        local rows = run(lua, queue, [[
          local function code(v, err) say(v == nil and err.code or "no error", err and err.message or "") end
          code(producer.queue(CLIENT, "bad{name"))
          code(producer.queue(CLIENT, "QUEUE", { colour = "red" }))
          code(producer.queue({ port = 1 }, "QUEUE"))
          local q = assert(producer.queue(CLIENT, "QUEUE", { max_payload = 100 }))
          code(q:add({ n = 1 }, { attempts = 0 }))
          code(q:add({ n = 1 }, { colour = "red" }))
          code(q:add({ text = string.rep("x", 200) }))
          code(q:add({ f = print }))
          code(q:add_bulk({ { n = 1 }, { text = string.rep("x", 200) } }))
          code(q:add_bulk({ { n = 1 } }, { id = "same" }))
          code(q:schedule("s", { every = 0 }))
          code(q:cancel("no-such-job"))
          code(q:wait(assert(q:add({ n = 1 }, { delay = 60 })), 0.1))
          code(q:wait(assert(q:add({ fail = true })), 30))
          say("queued", assert(q:counts()).waiting + assert(q:counts()).delayed)
          code(q:add({ n = 2 }, { delay = 60, max_queue = 1 }))
          local jobs, err = q:add_bulk({ { n = 3 }, { n = 4 } }, { delay = 60, max_queue = 2 })
          say("bulk", tostring(jobs[1] and jobs[1].state), tostring(jobs[2]), err.code, err.errors[2].code, err.message)
          code(q:add({ id = 123456789012345 })) -- more digits than cjson writes: refused, not rounded
        ]])
        local function row(i, code, message)
          assert.equal(code, rows[i][1], "row " .. i)
          assert.matches(message, rows[i][2], 1, true)
        end
        row(1, "EINPUT", "a queue name must be")
        row(2, "EINPUT", "unknown option 'colour'")
        row(3, "ECONNECT", "Redis at 127.0.0.1:1: ")
        row(4, "EINPUT", "queue:add(): option 'attempts' must be a whole number")
        row(5, "EINPUT", "queue:add(): unknown option 'colour'")
        row(6, "EPAYLOAD", "more than max_payload (100)")
        row(7, "EPAYLOAD", "cannot be written as JSON")
        row(8, "EPAYLOAD", "job 2: the job data takes")
        row(9, "EINPUT", "queue:add_bulk(): options 'id'")
        row(10, "EINPUT", "queue:schedule(): option 'every'")
        row(11, "ENOTFOUND", "no job no-such-job in queue " .. queue)
        row(12, "ETIMEDOUT", "did not finish within 0.1 s")
        row(13, "EBAD", "refused ")
        assert.same({ "queued", "1" }, rows[14])
        row(15, "EQUEUEFULL", "max_queue (1)")
        assert.same({ "bulk", "delayed", "false", "EQUEUEFULL", "EQUEUEFULL" }, { unpack(rows[16], 1, 5) })
        assert.matches("1 of 2 adds were refused; the first, job 2: ", rows[16][6], 1, true)
        row(17, "EPAYLOAD", "the number 123456789012345 would lose digits in cjson")
      end)
    end)
  end

  describe("moonjob.producer with moonjob's exact JSON codec (LuaJIT)", function()
    it("adds and reads back integers beyond 2^53 whole", function()
      local queue = rq.new_queue()
      rq.start_worker(queue)
      local server = rq.server()
      local out, err, status = pure_lua.run("luajit", server.port, ([[
        local q = assert(producer.queue({ port = PORT }, "%s", { json = require "moonjob.codec.json" }))
        local job = assert(q:add({ echo = 9007199254740993LL }))
        say(tostring(assert(job:wait(30)).echo))
      ]]):format(queue))
      assert.equal(0, status, err)
      assert.equal("9007199254740993LL\n", out)
    end)
  end)

  describe("moonjob.producer's version check", function()
    it("replaces an older library, and keeps a newer one that no longer serves it, saying to upgrade", function()
      local server = rq.server()
      faults.load_text(server, faults.library_at(tostring(OURS - 1)))
      local rows = run("lua5.4", rq.new_queue(), [[
        local q = assert(producer.queue(CLIENT, "QUEUE"))
        say(assert(q:add({ n = 1 })).state)
      ]])
      assert.same({ { "waiting" } }, rows)
      assert.equal(OURS, loaded_version(server))
      local newer = tostring(OURS + 1)
      faults.load_text(server, faults.library_at(newer))
      rows = run("lua5.4", rq.new_queue(), [[
        local q = assert(producer.queue(CLIENT, "QUEUE"))
        local job, err = q:add({ n = 1 })
        say(tostring(job), err.code, err.message)
      ]])
      assert.same({ "nil", "EREDIS" }, { rows[1][1], rows[1][2] })
      assert.matches(("the Redis server has moonjob library version %s, newer than this moonjob's %s"):format(newer,
        OURS), rows[1][3], 1, true)
      assert.matches("upgrade moonjob on this host", rows[1][3], 1, true)
      assert.equal(newer, loaded_version(server))
      faults.load_library(server)
    end)
  end)

  describe("moonjob.producer on OpenResty's client", function()
    -- Debian's nginx.redis (lua-nginx-redis, which depends on nginx-extras:
    -- unpacked by `make openresty-deps`, not installed), run by LuaJIT with
    -- LuaSocket standing in for ngx.socket.tcp: the client's own code, the
    -- adapter's use of it.
    local dir = require("openresty").ROOT
    setup(function()
      assert(helpers.exists(dir .. "/usr/share/lua/5.1/nginx/redis.lua"),
        "Debian's lua-nginx-redis is not unpacked under " .. dir .. ": run `make openresty-deps`")
    end)

    it("adds jobs and bulks through its methods, and a flow too long for them through its socket", function()
      local queue = rq.new_queue()
      rq.start_worker(queue, "-j 2")
      local body = ([==[
        package.path = "%s/usr/share/lua/5.1/?.lua;" .. package.path
        local socket = require "socket"
        local function flat(t, out) -- a cosocket sends nested lists of strings and numbers
          for _, v in ipairs(t) do if type(v) == "table" then flat(v, out) else out[#out + 1] = tostring(v) end end
          return out
        end
        ngx = { null = setmetatable({}, { __tostring = function() return "null" end }), socket = {},
          sleep = socket.sleep, now = socket.gettime, update_time = function() end }
        function ngx.socket.tcp()
          local s, w = socket.tcp(), {}
          function w:settimeout(ms) s:settimeout(ms / 1000) end
          function w:connect(host, port) return s:connect(host, port) end
          function w:send(data) return s:send(type(data) == "table" and table.concat(flat(data, {})) or data) end
          function w:receive(pattern) return s:receive(pattern) end
          function w:close() return s:close() end
          return w
        end
        local red = require("nginx.redis"):new()
        red:set_timeout(5000)
        assert(red:connect("127.0.0.1", PORT))
        local q = assert(producer.queue(red, "QUEUE"))
        local job = assert(q:add({ echo = "one" }))
        say("one", assert(job:wait(30)).echo)
        local jobs = assert(q:add_bulk({ { echo = "a" }, { echo = "b" } }))
        say("bulk", assert(jobs[1]:wait(30)).echo, assert(jobs[2]:wait(30)).echo)
        local _, err = q:add({}, { delay = 60, max_queue = 1 }) -- one job delayed, a second refused
        _, err = q:add({}, { delay = 60, max_queue = 1 })
        say("full", err.code)
        say("missing", tostring(q:get("no-such-job")))
        local children = {}
        for i = 1, 500 do children[i] = { data = { echo = i } } end
        local root = assert(q:add_flow({ data = { echo = "root" }, children = children }))
        say("flow", #root.children, assert(root:wait(60)).echo, #assert(q:children(root)))
        say("still usable", red:get("no-such-key") == ngx.null)
      ]==]):format(dir)
      local rows = run("luajit", queue, body)
      assert.same({ { "one", "one" }, { "bulk", "a", "b" }, { "full", "EQUEUEFULL" }, { "missing", "nil" },
        { "flow", "500", "root", "500" }, { "still usable", "true" } }, rows)
    end)
  end)

  describe("moonjob.producer on a server it cannot use", function()
    it("says a Redis Cluster's redirection is not followed, naming moonjob.queue", function()
      local out, err, status = pure_lua.run("lua5.4", fake_server("moved"), [[
        local q = assert(producer.queue({ port = PORT }, "q"))
        local job, e = q:add({ n = 1 })
        say("add", job, e.code, e.message)
        local jobs, be = q:add_bulk({ { n = 1 }, { n = 2 } })
        say("bulk", jobs, be and be.message)
      ]])
      assert.equal(0, status, err .. out)
      local rows = pure_lua.rows(out)
      for i = 1, 2 do
        local said = table.concat(rows[i], " ")
        assert.matches("does not follow Redis Cluster redirections (MOVED 3300 127.0.0.1:1)", said, 1, true)
        assert.matches("use moonjob.queue with a redis+cluster:// URL", said, 1, true)
      end
    end)

    it("hints at TLS when a connection it opened is closed before any reply, and says nothing was sent", function()
      local port = fake_server("close")
      local out, err, status = pure_lua.run("lua5.4", port, [[
        local q = assert(producer.queue({ port = PORT }, "q"))
        local job, e = q:add({ n = 1 })
        say("add", job, e.code, e.message)
        local q2, e2 = producer.queue({ port = PORT, password = "s3cret" }, "q")
        say("auth", q2, e2.code, e2.message)
      ]])
      assert.equal(0, status, err .. out)
      local rows = pure_lua.rows(out)
      for i = 1, 2 do
        local said = table.concat(rows[i], " ")
        assert.matches("ECONNECT", said, 1, true)
        assert.matches("if the server's port is a TLS port, connect with TLS through your own client", said, 1, true)
        assert.falsy(said:find("may or may not have been added", 1, true), said)
        assert.falsy(said:find("s3cret", 1, true), said)
      end
    end)
  end)

  describe("moonjob.producer on a client of the app's own kind", function()
    it("works through any object with call(self, argv), the library loaded through it too", function()
      local server = rq.server()
      server:cli("FUNCTION", "FLUSH")
      local queue = rq.new_queue()
      rq.start_worker(queue)
      local rows = run("lua5.3", queue, [==[
        local redis = require "redis"
        local c = redis.connect("127.0.0.1", PORT)
        local calls, commands = 0, {}
        local client = { call = function(self, argv) -- redis-lua raises on an error reply
          calls = calls + 1
          commands[argv[1]] = commands[argv[1]] or redis.command(argv[1])
          local ok, v = pcall(commands[argv[1]], c, (table.unpack or unpack)(argv, 2))
          if ok then return v end
          local refused = tostring(v):match("redis error: (.*)$")
          if refused then return nil, refused end
          return nil, tostring(v), "connection"
        end }
        local q = assert(producer.queue(client, "QUEUE"))
        local job = assert(q:add({ echo = "mine" }))
        say("result", assert(job:wait(30)).echo)
        assert(q:add({ n = 1 }, { delay = 60 }))
        say("full", select(2, q:add({ n = 2 }, { delay = 60, max_queue = 1 })).code)
        say("through it", calls > 3)
      ]==])
      assert.same({ { "result", "mine" }, { "full", "EQUEUEFULL" }, { "through it", "true" } }, rows)
      assert.equal(OURS, loaded_version(server))
    end)
  end)
end)
