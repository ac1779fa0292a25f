local moonjob = require "moonjob"
local h = require "helpers"

describe("moonjob.pool", function()
  after_each(h.cleanup)

  describe("moonjob.pool()", function()
    it("returns nil and an ELOAD error at once when the processor file does not exist", function()
      local pool, err = moonjob.pool("spec/fixtures/nope.lua")
      assert.is_nil(pool)
      assert.equal("ELOAD", err.code)
      assert.equal("ELOAD: cannot open processor file 'spec/fixtures/nope.lua': no such file or directory",
        tostring(err))
    end)

    it("returns nil and an ELOAD error at once when the processor file does not compile", function()
      local pool, err = moonjob.pool(h.fixture("syntax_error.lua"))
      assert.is_nil(pool)
      assert.equal("ELOAD", err.code)
      assert.matches("syntax_error.lua:2:", err.message)
    end)

    it("raises on an unknown option, naming it", function()
      assert.has_error(function() moonjob.pool(h.fixture("echo.lua"), { sise = 2 }) end,
        "moonjob.pool: unknown option 'sise' (known: ack_timeout, attempts, backoff, cache, "
        .. "cache_max, child, codec, dedupe, echo, group_concurrency, group_rate, heartbeat, idle_timeout, jit, keep, keep_age, keep_failed_age, keep_logs, kill_after, lease, "
        .. "max_jobs_per_child, max_log_bytes, max_payload, max_procs, max_queue, memory_limit, min_size, name, "
        .. "pipeline, poll, pools, prefetch, queue, rate, raw, redis, size, start_timeout, timeout, user, worker_name)")
    end)

    it("raises on a size that is not a positive whole number", function()
      assert.has_error(function() moonjob.pool(h.fixture("echo.lua"), { size = 0 }) end,
        "moonjob.pool: option 'size' must be positive")
      assert.has_error(function() moonjob.pool(h.fixture("echo.lua"), { size = 1.5 }) end,
        "moonjob.pool: option 'size' must be a whole number")
    end)

    it("raises on numbers past what the pool can hold, naming the bound", function()
      assert.has_error(function() moonjob.pool(h.fixture("echo.lua"), { size = math.huge }) end,
        "moonjob.pool: option 'size' must be at most 1024")
      assert.has_error(function() moonjob.pool(h.fixture("echo.lua"), { max_payload = 2 ^ 32 }) end,
        "moonjob.pool: option 'max_payload' must be at most 1073741824")
      assert.has_error(function() moonjob.pool(h.fixture("echo.lua"), { timeout = math.huge }) end,
        "moonjob.pool: option 'timeout' must be at most 1000000000")
      assert.has_error(function() moonjob.pool(h.fixture("echo.lua"), { kill_after = 0 / 0 }) end,
        "moonjob.pool: option 'kill_after' must not be negative")
    end)

    it("defaults size to the number of logical CPUs", function()
      local pool = h.pool("echo.lua")
      assert.equal(require("moonjob.core").cpu_count(), pool:stats().size)
    end)

    it("returns before the children are ready; jobs added meanwhile wait and run", function()
      local pool = h.pool("echo.lua", { size = 2 })
      local jobs = {}
      for i = 1, 5 do jobs[i] = pool:add(i) end
      assert.equal("waiting", jobs[1].state)
      for i = 1, 5 do assert.equal(i, (jobs[i]:wait()).data) end
    end)
  end)

  describe(":run()", function()
    it("returns the job's result", function()
      local pool = h.pool("echo.lua", { size = 1 })
      local result = pool:run({ x = 7 }, { name = "seven" })
      assert.same({ x = 7 }, result.data)
      assert.equal("seven", result.name)
      assert.equal(1, result.attempt)
      assert.is_number(result.id)
    end)

    it("returns nil and the error when the job failed", function()
      local pool = h.pool("fails.lua", { size = 1 })
      local result, err = pool:run({ how = "string" })
      assert.is_nil(result)
      assert.equal("EPROCESSOR", err.code)
    end)
  end)

  describe(":add()", function()
    it("returns a job handle at once that prints well", function()
      local pool = h.pool("echo.lua", { size = 1 })
      local job = pool:add(3)
      assert.matches("^<moonjob.job %d+ waiting>$", tostring(job))
      assert.equal(3, (job:wait()).data)
      assert.matches("^<moonjob.job %d+ completed>$", tostring(job))
    end)

    it("fails the job with EPAYLOAD when the data is not serialisable, through the loop", function()
      local pool = h.pool("echo.lua", { size = 1 })
      local job = pool:add({ f = function() end })
      assert.equal("waiting", job.state) -- never answered inside add
      local result, err = job:wait()
      assert.is_nil(result)
      assert.equal("EPAYLOAD", err.code)
      assert.matches("cannot be serialised", err.message)
    end)

    it("fails the job with EPAYLOAD when the data is larger than max_payload", function()
      local pool = h.pool("echo.lua", { size = 1, max_payload = 1000 })
      local _, err = pool:add(string.rep("x", 2000)):wait()
      assert.equal("EPAYLOAD", err.code)
      assert.matches("more than max_payload %(1000%)", err.message)
      assert.equal("fine", (pool:run("fine")).data) -- the pool carries on
    end)
  end)

  describe(":map()", function()
    it("returns results in input order", function()
      local pool = h.pool("echo.lua", { size = 2 })
      local items = {}
      for i = 1, 20 do items[i] = i end
      local results, errs = pool:map(items)
      assert.is_nil(errs)
      for i = 1, 20 do assert.equal(i, results[i].data) end
    end)

    it("puts nil at a failed item's place and its error in the second table", function()
      local pool = h.pool("fails.lua", { size = 2 })
      local results, errs = pool:map({ { how = "none" }, { how = "string" }, { how = "none" } })
      assert.equal("ok", results[1])
      assert.is_nil(results[2])
      assert.equal("ok", results[3])
      assert.equal("EPROCESSOR", errs[2].code)
      assert.is_nil(errs[1])
    end)
  end)

  describe(":on()", function()
    it("emits active first, then progress and log, then completed, then drained", function()
      local pool = h.pool("noisy.lua", { size = 1 })
      local seen, lines = {}, {}
      for _, event in ipairs({ "active", "progress", "completed", "drained" }) do
        pool:on(event, function(_, value)
          seen[#seen + 1] = event == "progress" and "progress " .. value.pct or event
        end)
      end
      pool:on("log", function(job, line, stream)
        lines[stream] = (lines[stream] or "") .. line .. ";"
        seen[#seen + 1] = "log"
      end)
      pool:run({ n = 4 })
      h.wait_for(function() return seen[#seen] == "drained" end)
      assert.same({ "active", "log", "log", "log", "log", "completed", "drained" },
        (function() local t = {} for _, s in ipairs(seen) do
          if s ~= "progress 50" then t[#t + 1] = s end end return t end)())
      assert.is_true(table.concat(seen, ","):find("progress 50", 1, true) ~= nil)
      -- within one stream lines keep their order; across streams there is no order
      assert.same({ stdout = "out 4;partial 4;", stderr = "err 4;", log = "log 4;" }, lines)
    end)

    it("emits failed with the error", function()
      local pool = h.pool("fails.lua", { size = 1 })
      local got
      pool:on("failed", function(job, err) got = err end)
      pool:run({ how = "table" })
      assert.equal("EBADINPUT", got.code)
    end)

    it("keeps the loop running when a listener raises, and reports the error", function()
      local pool = h.pool("echo.lua", { size = 1 })
      local reports, calls = {}, 0
      pool:on("completed", function() error("listener bug") end)
      pool:on("completed", function() calls = calls + 1 end)
      pool:on("error", function(message, event) reports[#reports + 1] = event .. ": " .. message end)
      assert.equal(1, (pool:run(1)).data)
      assert.equal(2, (pool:run(2)).data)
      assert.equal(2, calls)
      assert.equal(2, #reports)
      assert.matches("^completed: .*listener bug", reports[1])
    end)

    it("reports a wait inside a listener as an error instead of hanging", function()
      local pool = h.pool("echo.lua", { size = 1 })
      local report
      pool:on("error", function(message) report = message end)
      pool:on("completed", function() pool:run(99) end)
      pool:run(1)
      assert.matches("cannot wait inside a moonjob event callback", report)
    end)

    it("raises on an unknown event", function()
      local pool = h.pool("echo.lua", { size = 1 })
      assert.has_error(function() pool:on("finished", print) end,
        "pool:on(): unknown event 'finished' (completed, failed, progress, log, active, retrying, "
        .. "drained, exit, error)")
    end)
  end)

  describe(":drain()", function()
    it("returns once nothing waits or runs", function()
      local pool = h.pool("echo.lua", { size = 2 })
      local jobs = {}
      for i = 1, 50 do jobs[i] = pool:add(i) end
      pool:drain()
      for i = 1, 50 do assert.equal("completed", jobs[i].state) end
      local s = pool:stats()
      assert.equal(0, s.waiting)
      assert.equal(0, s.active)
      assert.equal(50, s.completed)
    end)
  end)

  describe(":stats()", function()
    it("counts waiting, active, completed, failed and children, and prints", function()
      local pool = h.pool("fails.lua", { size = 2 })
      pool:map({ { how = "none" }, { how = "string" } })
      local s = pool:stats()
      assert.same({ waiting = 0, active = 0, completed = 1, failed = 1, children = 2, size = 2,
        spawned = 2, restarts = 0, crashed = 0, timeouts = 0, killed = 0, retries = 0, cache_hits = 0 },
        { waiting = s.waiting, active = s.active, completed = s.completed, failed = s.failed,
          children = s.children, size = s.size, spawned = s.spawned, restarts = s.restarts,
          crashed = s.crashed, timeouts = s.timeouts, killed = s.killed, retries = s.retries,
          cache_hits = s.cache_hits })
      assert.matches("^waiting 0, active 0, completed 1, failed 1, children 2/2, spawned 2, crashed 0, "
        .. "timeouts 0, killed 0, retries 0, cache hits 0, wait p50 [%d.]+ ms p99 [%d.]+ ms, "
        .. "run p50 [%d.]+ ms p99 [%d.]+ ms$", tostring(s))
    end)

    it("gives wait and run time percentiles and per-child job counts", function()
      local pool = h.pool("deaf.lua", { size = 1 })
      pool:map({ { seconds = 0.1 }, { seconds = 0.1 }, { seconds = 0.1 } })
      local s = pool:stats()
      assert.is_true(s.run_p50 >= 90 and s.run_p99 >= s.run_p50, tostring(s))
      assert.is_true(s.wait_p99 >= 90, "the third job waited for two others: " .. s.wait_p99)
      assert.equal(1, #s.workers)
      assert.equal(3, s.workers[1].jobs)
    end)
  end)

  describe(":close()", function()
    it("ends the children and fails later jobs with ECLOSED", function()
      local pool = h.pool("pid.lua", { size = 2 })
      local pids = pool:map({ 1, 2, 3, 4 })
      pool:close()
      for _, pid in ipairs(pids) do assert.is_false(h.unreaped(pid)) end
      assert.equal(0, pool:stats().children)
      local result, err = pool:run(1)
      assert.is_nil(result)
      assert.equal("ECLOSED: the pool is closed; create a new pool to add jobs", tostring(err))
      assert.matches("closed>$", tostring(pool))
    end)

    it("fails jobs still waiting with ECLOSED and lets running ones finish", function()
      local pool = h.pool("fails.lua", { size = 1 })
      local running = pool:add({ how = "sleep", seconds = 0.2 })
      local waiting = pool:add({ how = "none" })
      h.wait_for(function() return running.state == "active" end)
      pool:close()
      assert.equal("completed", running.state)
      assert.equal("slept", running.result)
      assert.equal("ECLOSED", waiting.error.code)
    end)
  end)

  describe("several pools", function()
    it("share the one loop and run side by side", function()
      local a = h.pool("echo.lua", { size = 1 })
      local b = h.pool("pid.lua", { size = 1 })
      local ja, jb = a:add("a"), b:add("b")
      assert.equal("a", (ja:wait()).data)
      assert.is_number(jb:wait())
    end)
  end)

  describe("Ctrl-C", function()
    it("during a blocking call raises 'interrupted' and leaves the pool usable", function()
      local pool = h.pool("fails.lua", { size = 1 })
      local job = pool:add({ how = "signal_parent", parent = require("moonjob.core").getpid() })
      local ok, err = pcall(job.wait, job)
      assert.is_false(ok)
      assert.matches("interrupted %(Ctrl%-C%)", err)
      assert.equal("after signal", job:wait())
      assert.equal("ok", pool:run({ how = "none" }))
    end)
  end)
end)
