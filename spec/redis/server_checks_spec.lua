-- Durable queues on Redis: what a connection checks on the server it reaches
-- (moonjob.redis.setup): an ACL user limited to its own queues, with the
-- library an admin loaded; a server whose eviction policy would lose jobs.
-- (a real redis-server per file: spec/support/redis_queue.lua; ACL rules and
-- the admin's load: spec/support/redis_faults.lua)
local helpers = require "helpers"
local faults = require "redis_faults"
local moonjob = require "moonjob"
local redis_server = require "redis_server"
local rq = require "redis_queue"

local function run_one(url, queue, data)
  local q = rq.close_after(assert(moonjob.queue(url, queue)))
  local job = assert(q:add(data))
  local p = rq.close_after(assert(moonjob.pool(rq.PROCESSOR, { redis = url, queue = queue, size = 1, echo = false })))
  local result = assert(job:wait(20))
  p:close()
  q:close()
  return result
end

rq.describe(function()
  describe("an ACL user limited to its own queues", function()
    it("runs jobs with the library an admin loaded, and cannot reach another tenant's queue", function()
      local server = rq.server()
      faults.load_library(server)
      local url = faults.tenant(server, "tenant-a", "pw-a", { list = true })
      assert.equal("x", run_one(url, "tenant-a-jobs", { echo = "x" }).echo)
      local q = rq.close_after(assert(moonjob.queue(url, "tenant-a-other")))
      local other = rq.close_after(assert(moonjob.queue(url, "tenant-b-jobs"))) -- connects: the checks pass
      local job, err = other:add({ echo = 1 })
      assert.is_nil(job)
      assert.matches("NOPERM", tostring(err))
      assert(q:add({ echo = 2 }))
      -- the code every tenant's calls run, and other tenants' key names, are out of its reach
      for _, command in ipairs({ "FUNCTION FLUSH", "FUNCTION DELETE moonjob", "KEYS '*'", "SCAN 0", "FLUSHDB" }) do
        local out = helpers.first_line(("%s -p %d --user tenant-a --pass pw-a --no-auth-warning %s 2>&1")
          :format(redis_server.CLI, server.port, command))
        assert.matches("NOPERM", out, command)
      end
    end)

    it("without function|list, uses a library at its version", function()
      local server = rq.server()
      faults.load_library(server)
      local url = faults.tenant(server, "tenant-c", "pw-c")
      assert.equal("y", run_one(url, "tenant-c-jobs", { echo = "y" }).echo)
    end)

    it("is told at once what an admin must run when the library is missing or another version", function()
      local server = rq.server()
      local url = faults.tenant(server, "tenant-d", "pw-d", { list = true })
      assert.equal("OK", server:cli("FUNCTION", "FLUSH"))
      local q, err = moonjob.queue(url, "tenant-d-jobs", { timeout = 20 })
      assert.is_nil(q)
      assert.matches("is not loaded", err)
      assert.matches("moonjob library | redis-cli -x FUNCTION LOAD REPLACE", err, 1, true)
      assert.not_matches("pw%-d", err)
      -- another moonjob's library (another text, the same name)
      local other = helpers.write_file(os.tmpname(),
        (require("moonjob.redis.library").text():gsub('VERSION, OLDEST_CLIENT = "(%d+)"', 'VERSION, OLDEST_CLIENT = "%1-other"')))
      faults.load_library(server, other)
      q, err = moonjob.queue(url, "tenant-d-jobs", { timeout = 20 })
      assert.is_nil(q)
      assert.matches("is version %d+%-other, not this moonjob's %d+", err)
      -- without function|list the version says it
      local url_c = faults.tenant(server, "tenant-e", "pw-e")
      q, err = moonjob.queue(url_c, "tenant-e-jobs", { timeout = 20 })
      assert.is_nil(q)
      assert.matches("is version .*%-other", err)
      os.remove(other)
      -- the admin loads ours: the same user gets in
      faults.load_library(server)
      assert(rq.close_after(assert(moonjob.queue(url, "tenant-d-jobs"))):add({ echo = 3 }))
    end)
  end)

  describe("a server that may evict keys", function()
    it("is refused with what to set, by producers and by workers, until it is changed", function()
      local server = redis_server.start({ extra = "--maxmemory-policy allkeys-lru" })
      local ok, err = pcall(function()
        local q, qerr = moonjob.queue(server.url, "evicted", { timeout = 20 })
        assert.is_nil(q)
        assert.matches("maxmemory%-policy is allkeys%-lru", qerr)
        assert.matches("CONFIG SET maxmemory%-policy noeviction", qerr)
        local log = os.tmpname()
        local cmd = ("%s scripts/moonjob worker %s --redis %s --queue evicted 2>%s >/dev/null & echo $!")
          :format(helpers.LUAJIT, rq.PROCESSOR, server.url, log)
        local pid = assert(tonumber(helpers.first_line(cmd)))
        rq.close_after({ close = function() os.execute(("kill -KILL %d 2>/dev/null"):format(pid)) end })
        local function said(pattern)
          return select(2, table.concat(rq.read_lines(log), "\n"):gsub(pattern, ""))
        end
        helpers.wait_for(function() return said("allkeys%-lru") > 0 end, 20)
        assert.equal("OK", server:cli("CONFIG", "SET", "maxmemory-policy", "noeviction"))
        helpers.wait_for(function() return said("connected to") > 0 end, 20)
        assert.equal(1, said("allkeys%-lru")) -- said once, not at every retry
        local q2 = rq.close_after(assert(moonjob.queue(server.url, "evicted")))
        assert(assert(q2:add({ echo = 1 })):wait(20))
        rq.stop_worker(pid, "TERM")
        os.remove(log)
      end)
      server:stop()
      assert(ok, err)
    end)

    it("volatile policies are accepted: moonjob sets a TTL only on results kept for `cache`", function()
      local server = redis_server.start({ extra = "--maxmemory-policy volatile-lru" })
      local ok, err = pcall(function()
        local q = assert(moonjob.queue(server.url, "volatile"))
        q:close()
      end)
      server:stop()
      assert(ok, err)
    end)
  end)
end)
