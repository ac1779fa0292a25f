-- Two moonjob versions on one server, as in a rolling upgrade: the library a
-- newer moonjob loaded is never replaced by an older moonjob's. An older
-- program carries on with it when the newer library still serves its calls,
-- and is refused, told to upgrade, when it does not; an older library is
-- replaced by this version's; two programs loading at once do not undo each
-- other (moonjob.redis.setup; docs/REDIS.md, "Versions on one server").
-- The other version is this one's library text with its version changed.
local helpers = require "helpers"
local core = require "moonjob.core"
local faults = require "redis_faults"
local library = require "moonjob.redis.library"
local moonjob = require "moonjob"
local rq = require "redis_queue"
local setup = require "moonjob.redis.setup"

local OURS = tonumber(library.version())
local NEWER = tostring(OURS + 1)

local text_at, load_text = faults.library_at, faults.load_text

local function loaded_version(server)
  return server:cli("FCALL_RO", "moonjob_version", "0")
end

local function run_one(url, queue)
  local q = rq.close_after(assert(moonjob.queue(url, queue)))
  local job = assert(q:add({ echo = queue }))
  rq.close_after(assert(moonjob.pool(rq.PROCESSOR, { redis = url, queue = queue, size = 1, echo = false })))
  assert.equal(queue, assert(job:wait(20)).echo)
end

-- A raw connection of the spec's own (a newer moonjob's, seen from Redis),
-- connected; -> conn.
local function raw_connection(server)
  local up
  local conn = assert(core.redis("127.0.0.1", server.port, 5000, 64 * 1024 * 1024, function(kind)
    up = kind == "up"
  end))
  rq.close_after({ close = function() conn:close() end })
  assert(rq.wait_for(function() return up end), "the spec's own connection did not come up")
  return conn
end

local function blocked_clients(server)
  return tonumber(server:cli("INFO", "clients"):match("blocked_clients:(%d+)"))
end

rq.describe(function()
  describe("a library loaded by a newer moonjob", function()
    it("is kept, and this moonjob works on it while it serves this version's calls", function()
      local server = rq.server()
      load_text(server, text_at(NEWER, tostring(OURS)))
      run_one(server.url, rq.new_queue())
      assert.equal(NEWER, loaded_version(server))
      -- a tenant that may not load it uses it too, with and without function|list
      run_one(faults.tenant(server, "tenant-a", "pw-a", { list = true }), "tenant-a-jobs")
      run_one(faults.tenant(server, "tenant-b", "pw-b"), "tenant-b-jobs")
      assert.equal(NEWER, loaded_version(server))
    end)

    it("is kept when it no longer serves this version: told to upgrade moonjob; a worker waits", function()
      local server = rq.server()
      load_text(server, text_at(NEWER))
      local q, err = moonjob.queue(server.url, rq.new_queue(), { timeout = 20 })
      assert.is_nil(q)
      assert.matches(("the Redis server has moonjob library version %s, newer than this moonjob's %d")
        :format(NEWER, OURS), err, 1, true)
      assert.matches("upgrade moonjob on this host", err, 1, true)
      assert.equal(NEWER, loaded_version(server))
      -- a worker says so once and waits; the library an admin loads then is used
      local name = rq.new_queue()
      local pid, log = rq.start_worker(name)
      assert(rq.wait_for(function()
        return table.concat(rq.read_lines(log), "\n"):find("upgrade moonjob on this host", 1, true) ~= nil
      end, 30), "the worker did not say why")
      assert.is_true(helpers.running(pid))
      assert.equal(NEWER, loaded_version(server))
      faults.load_library(server)
      local job = assert(rq.new_producer(name):add({ echo = 1 }))
      assert.equal(1, assert(job:wait(30)).echo)
    end)
  end)

  describe("no library loaded yet", function()
    it("is loaded by a user that may read the guard but not write it (unguarded)", function()
      local server = rq.server()
      server:cli("FUNCTION", "DELETE", "moonjob")
      assert.equal("OK", server:cli("ACL", "SETUSER", "reader", "on", ">pw", "~mj:{guard-ro}:*", "~mj:queues",
        "%R~" .. setup.LIBRARY_GUARD, "&*", "+@all"))
      run_one(("redis://reader:pw@127.0.0.1:%d/0"):format(server.port), "guard-ro")
      assert.equal(tostring(OURS), loaded_version(server))
    end)
  end)

  describe("a library loaded by an older moonjob", function()
    it("is replaced by this version's", function()
      local server = rq.server()
      load_text(server, text_at(tostring(OURS - 1)))
      run_one(server.url, rq.new_queue())
      assert.equal(tostring(OURS), loaded_version(server))
      assert.equal(library.text(), server:cli("FUNCTION", "LIST", "LIBRARYNAME", "moonjob", "WITHCODE")
        :match("library_code\n(.*)$"))
    end)

    it("is not replaced by this version's once a newer moonjob loaded its own meanwhile", function()
      local server = rq.server()
      load_text(server, text_at(tostring(OURS - 1)))
      local loads = tonumber(server:cli("GET", setup.LIBRARY_GUARD)) or 0
      -- Redis holds writes (CLIENT PAUSE WRITE) and then runs them in the order they came: the newer
      -- moonjob's load first, this one's after it, though this one found the older library there
      assert.equal("OK", server:cli("CLIENT", "PAUSE", "30000", "WRITE"))
      local newer = raw_connection(server)
      local replies = {}
      local function keep(v, e) replies[#replies + 1] = v or e or "aborted" end
      for _, args in ipairs({ { "MULTI" }, { "FUNCTION", "LOAD", "REPLACE", text_at(NEWER, tostring(OURS)) },
        { "INCR", setup.LIBRARY_GUARD }, { "EXEC" } }) do
        assert(newer:command(args, keep))
      end
      assert(rq.wait_for(function() return blocked_clients(server) == 1 end), "the newer load was not held")
      local this = rq.close_after(assert(require("moonjob.redis.client").new(server.url, { timeout_ms = 20000 })))
      assert(rq.wait_for(function() return blocked_clients(server) == 2 end), "this moonjob's load was not held")
      assert.equal("OK", server:cli("CLIENT", "UNPAUSE"))
      assert(rq.wait_for(function() return this.ready or this.refused end), "this moonjob did not connect")
      assert.equal(4, #replies)
      assert.equal(NEWER, loaded_version(server))
      assert.is_true(this.ready)
      -- the newer load counted, this moonjob's transaction aborted
      assert.equal(loads + 1, tonumber(server:cli("GET", setup.LIBRARY_GUARD)))
    end)
  end)
end)
