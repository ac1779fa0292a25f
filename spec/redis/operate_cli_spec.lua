-- The command line's operating commands on a real Redis: queues, jobs,
-- job, retry, remove, promote, clean, pause, resume, status, and what a
-- worker says on stderr. Output is NDJSON off a terminal; each refusal is
-- one line on stderr and exit 1; usage errors exit 2.
local helpers = require "helpers"
local rq = require "redis_queue"

local moonjob, ndjson = rq.moonjob, require("cli").ndjson

local wait_for = rq.wait_for

rq.describe(function()
  describe("the operating commands", function()
    it("list queues and jobs as NDJSON, page them, and show one job with its error", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      for i = 1, 5 do assert(q:add({ n = i }, { id = "w" .. i })) end
      local bad = assert(q:add({ fail = true }, { id = "bad" }))
      rq.pool(name, { size = 1 }) -- runs everything; w1..w5 complete
      bad:wait(20)
      assert(wait_for(function() return q:counts().completed == 5 end))
      local out, err, status = moonjob("queues")
      assert.equal(0, status, err)
      local found
      for _, row in ipairs(ndjson(out)) do if row.name == name then found = row end end
      assert.same({ name = name, waiting = 0, delayed = 0, active = 0, held = 0, completed = 5, failed = 1,
        paused = false, waiting_children = 0, running = 0, completed_ever = 5, failed_ever = 1, workers = 1, -- (the pool beats)
        lapsed = 0 },
        found)
      out, err, status = moonjob("jobs --queue " .. name .. " --state completed --limit 2 --offset 1 --order x")
      assert.equal(2, status)
      assert.matches("unknown option '%-%-order'", err)
      out, err, status = moonjob("jobs --queue " .. name .. " --state completed --limit 2 --offset 1")
      assert.equal(0, status, err)
      local rows = ndjson(out)
      assert.equal(2, #rows)
      assert.equal("completed", rows[1].state)
      out, err, status = moonjob("jobs --queue " .. name .. " --state completed --offset 5")
      assert.equal(1, status)
      assert.equal("", out)
      assert.matches("ERANGE: offset 5 is past the end: queue " .. name .. " holds 5 completed job%(s%)", err)
      out, err, status = moonjob("job --queue " .. name .. " bad")
      assert.equal(0, status, err)
      local job = ndjson(out)[1]
      assert.equal("EBAD", job.error.code)
      assert.equal("A-1", job.error.sku)
      assert.same({ fail = true }, job.data)
      out, err, status = moonjob("job --queue " .. name .. " nope")
      assert.equal(1, status)
      assert.matches("ENOTFOUND: no job nope in queue " .. name, err)
      out, err, status = moonjob("job --queue " .. name)
      assert.equal(2, status)
      assert.matches("moonjob job takes one job id", err)
    end)

    it("retry, remove and promote each id, say each refusal, and exit 1 when any was refused", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      for i = 1, 3 do assert(q:add({ n = i }, { id = "d" .. i, delay = 600 })) end
      local out, err, status = moonjob("promote --queue " .. name .. " d1 d2")
      assert.equal(0, status, err)
      assert.same({ { action = "promote", id = "d1", was = "delayed" }, { action = "promote", id = "d2", was = "delayed" } },
        ndjson(out))
      out, err, status = moonjob("remove --queue " .. name .. " d1 zz d3")
      assert.equal(1, status)
      assert.equal(2, #ndjson(out))
      assert.matches("remove zz: ENOTFOUND", err)
      assert.same({ 1, 0 }, { q:counts().waiting, q:counts().delayed })
      out, err, status = moonjob("retry --queue " .. name .. " d2")
      assert.equal(1, status)
      assert.matches("retry d2: ESTATE: .*job d2 is waiting; only a failed or completed job can be retried", err)
      out, err, status = moonjob("retry --queue " .. name)
      assert.equal(2, status)
      assert.matches("or %-%-all", err)
      out, err, status = moonjob("retry --queue " .. name .. " --all")
      assert.equal(0, status, err)
      assert.same({ action = "retry", count = 0, queue = name, state = "failed" }, ndjson(out)[1])
      out, err, status = moonjob("clean --queue " .. name)
      assert.equal(2, status)
      assert.matches("needs %-%-state completed or %-%-state failed", err)
      out, err, status = moonjob("clean --queue " .. name .. " --state failed")
      assert.equal(2, status)
      assert.matches("needs %-%-older%-than SECONDS %(0 removes every one of them%)", err)
      out, err, status = moonjob("retry --queue " .. name .. " --all --state waiting")
      assert.equal(2, status)
      out, err, status = moonjob("clean --queue " .. name .. " --state failed --older-than 60")
      assert.equal(0, status, err)
      assert.equal(0, ndjson(out)[1].count)
    end)

    it("say 'no such queue' naming the queues there, for status and every command", function()
      local name = rq.new_queue()
      assert(rq.new_producer(name):add({ n = 1 }))
      for _, command in ipairs({ "status", "jobs", "pause", "retry --all", "remove x" }) do
        local out, err, status = moonjob(command .. " --queue no-such-q")
        assert.equal(1, status, command)
        assert.equal("", out)
        assert.matches("no such queue: 'no%-such%-q' has no key on this server", err)
        assert.matches("The queues there: .*" .. name, err)
      end
    end)

    it("name ENOQUEUE, the code errors.md explains, for a queue never used: clean, job, schedule list", function()
      local name = rq.new_queue()
      assert(rq.new_producer(name):add({ n = 1 }))
      for _, command in ipairs({ "clean --state failed --older-than 0", "job x", "schedule list" }) do
        local out, err, status = moonjob(command .. " --queue never_used")
        assert.equal(1, status, command)
        assert.equal("", out)
        assert.matches("^moonjob: ENOQUEUE: no such queue: 'never_used' has no key on this server %(nothing was "
          .. "ever added to it, or it was removed%); check %-%-queue and %-%-redis%. The queues there: .*" .. name
          .. "\n$", err)
      end
      local errors_md = require("cli").read("docs/reference/errors.md")
      assert.matches("\n### ENOQUEUE\n", errors_md)
      assert.matches("%[`ENOQUEUE`%]%(#enoqueue%)", errors_md)
    end)

    it("pause and resume a queue that workers run: status says paused, then it empties", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      local _, werr = rq.start_worker(name, "-j 1")
      assert(wait_for(function() return q:exists() end)) -- the worker registered it
      local out, err, status = moonjob("pause --queue " .. name)
      assert.equal(0, status, err)
      assert.same({ action = "pause", paused = true, queue = name }, ndjson(out)[1])
      for i = 1, 20 do assert(q:add({ n = i, sleep = 0.1 })) end
      helpers.sleep(1.5)
      out = moonjob("status --queue " .. name)
      assert.matches("^waiting 20, delayed 0, running 0, held 0, completed 0, failed 0; paused", out)
      out, err, status = moonjob("resume --queue " .. name)
      assert.equal(0, status, err)
      out, err, status = moonjob("status --queue " .. name .. " --watch --until-empty")
      assert.equal(0, status, err)
      assert.matches("completed 20, failed 0 | [%d.]+ jobs/s, done\n$", out) -- the last of several looks
      assert.matches("^waiting %d+, delayed 0, running [0-2], held [0-2], completed %d+, failed 0\n", out)
      local said = table.concat(rq.read_lines(werr), "\n")
      assert.matches("the queue is paused: fetching nothing until it is resumed", said)
      assert.matches("the queue was resumed", said)
      out, err, status = moonjob("status --queue " .. name .. " --until-empty")
      assert.equal(2, status)
      assert.matches("%-%-until%-empty goes with %-%-watch", err)
    end)

    it("has workers say each failed and retried job on stderr, every job with --verbose, none with --quiet", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      local bad = assert(q:add({ fail = true }, { id = "bad", name = "charge" }))
      local flaky = assert(q:add({ fail_until = 2 }, { id = "flaky", attempts = 2 }))
      local fine = assert(q:add({ n = 1 }, { id = "fine" }))
      local pid, werr = rq.start_worker(name, "-j 1 --verbose")
      bad:wait(20); flaky:wait(20); fine:wait(20)
      rq.stop_worker(pid, "TERM")
      local said = table.concat(rq.read_lines(werr), "\n")
      assert.matches("job bad %(charge%) failed, attempt 1/1: EBAD: refused bad", said)
      assert.matches("job flaky failed, attempt 1/2: [^\n]*not yet: attempt 1; retried in", said)
      assert.matches("job fine completed, attempt 1/1 in [%d.]+ ms", said)
      local again = assert(q:add({ fail = true }, { id = "again" }))
      pid, werr = rq.start_worker(name, "-j 1 --quiet")
      again:wait(20)
      rq.stop_worker(pid, "TERM")
      said = table.concat(rq.read_lines(werr), "\n")
      assert.not_matches("job again", said)
    end)

    it("serves a worker's metrics for Prometheus with --metrics, in a text promtool accepts", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      local jobs = {}
      for i = 1, 3 do jobs[i] = assert(q:add({ n = i })) end
      jobs[4] = assert(q:add({ fail = true }))
      local port = assert(tonumber(helpers.first_line([[python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()']])))
      local pid, werr = rq.start_worker(name, "-j 2 --metrics 127.0.0.1:" .. port)
      for _, j in ipairs(jobs) do j:wait(20) end
      local text, err, status = helpers.sh(("curl -s http://127.0.0.1:%d/metrics"):format(port))
      assert.equal(0, status, err)
      assert.matches('moonjob_pool_children{[^}]*} 2\n', text)
      assert.matches('moonjob_jobs_completed_total{[^}]*} 3\n', text)
      assert.matches('moonjob_jobs_failed_total{[^}]*} 1\n', text)
      assert.matches("moonjob_event_loop_lag_seconds", text, 1, true)
      local code, said = require("prometheus_text").promtool_check(text)
      assert.equal(0, code, said)
      rq.stop_worker(pid, "TERM")
      assert.matches("metrics for Prometheus: http://127.0.0.1:" .. port .. "/metrics",
        table.concat(rq.read_lines(werr), "\n"), 1, true)
      local _, said, bad = moonjob("worker " .. rq.PROCESSOR .. " --queue " .. name .. " --metrics nowhere")
      assert.equal(2, bad)
      assert.matches("%-%-metrics needs HOST:PORT", said)
    end)

    it("keeps every result of a 2,000-job run by default (kept by age, not count)", function()
      local name = rq.new_queue()
      local lines = {}
      for i = 1, 2000 do lines[i] = ('{"n":%d}'):format(i) end
      local out, err, status = moonjob("add --queue " .. name, table.concat(lines, "\n") .. "\n")
      assert.equal(0, status, err)
      assert.equal(2000, select(2, out:gsub("\n", "")))
      rq.start_worker(name, "-j 2")
      local q = rq.new_producer(name)
      assert(wait_for(function() return q:counts().completed == 2000 end, 60))
      helpers.sleep(1.2) -- a poll's fetch, which trims
      assert.equal("2000", rq.server():cli("ZCARD", "mj:{" .. name .. "}:completed"))
    end)
  end)
end)
