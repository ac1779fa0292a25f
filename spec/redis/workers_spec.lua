-- What an operator sees of a queue on a real Redis: counts of the jobs in
-- each state now (the totals of ever apart), running as the workers'
-- heartbeats report it, and the workers themselves (q:workers(), `moonjob
-- workers`): live, lapsed after a kill -9, dropped later, gone at a clean
-- stop; /metrics's counters never go down.
local helpers = require "helpers"
local json = require "moonjob.codec.json"
local dashboard = require "moonjob.dashboard"
local rq = require "redis_queue"
local http = require "dashboard_http"
local prom = require "prometheus_text"

local moonjob, ndjson = rq.moonjob, require("cli").ndjson
local wait_for = rq.wait_for

-- A worker process: a pool of one child beating every `beat` seconds
-- (the heartbeat option: short, so that a lapse comes within a second).
local function beating_worker(name, beat, lease)
  local cmd = ("%s spec/fixtures/beating_worker.lua %s %s %s %s %s >/dev/null 2>&1 & echo $!"):format(
    helpers.LUAJIT, rq.PROCESSOR, rq.server().url, name, beat, lease or "")
  local pid = assert(tonumber(helpers.first_line(cmd)))
  rq.close_after({ close = function() os.execute(("kill -KILL %d 2>/dev/null"):format(pid)) end })
  return pid
end

local function hostname()
  local f = assert(io.open("/proc/sys/kernel/hostname"))
  local host = f:read("*l")
  f:close()
  return host
end

-- The workers `moonjob workers --queue name --json` lists.
local function listed(name)
  local out, err, status = moonjob("workers --json --queue " .. name)
  assert.equal(0, status, err)
  return ndjson(out)
end

-- Jobs of `ms` milliseconds each, n of them, added in bulk.
local function short_jobs(q, n, ms)
  local list = {}
  for i = 1, n do list[i] = { sleep = ms / 1000, n = i } end
  assert(q:add_bulk(list))
end

rq.describe(function()
  describe("counts", function()
    it("count the failed jobs there are now, and the jobs that ever failed apart, after a retry", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      for i = 1, 3 do assert(q:add({ fail = true }, { id = "x" .. i })) end
      assert(q:add({ n = 1 }, { id = "fine" }))
      local pool = rq.pool(name, { size = 1 })
      assert(wait_for(function() local c = q:counts() return c.waiting + c.active == 0 end), "all ran")
      pool:close()
      assert.equal(3, assert(q:retry_all()))
      local c = q:counts()
      assert.equal(0, c.failed) -- the failed list is empty now
      assert.equal(3, c.waiting)
      assert.equal(3, c.failed_ever)
      assert.equal(1, c.completed_ever)
      pool = rq.pool(name, { size = 1 }) -- they fail again
      assert(wait_for(function() return q:counts().failed == 3 end), "failed again")
      pool:close()
      c = q:counts()
      assert.equal(6, c.failed_ever)
      local out, err, status = moonjob("status --json --queue " .. name)
      assert.equal(0, status, err)
      local s = json.decode(out)
      assert.equal(1, s.completed)
      assert.equal(6, s.failed_ever)
      assert.equal(3, s.failed)
      assert.equal(3, q:retry_all())
      out = moonjob("status --queue " .. name)
      assert.matches("completed 1, failed 0", out, 1, true)
      assert.matches("ever: completed 1, failed 6", out, 1, true)
      local found
      for _, row in ipairs(ndjson((moonjob("queues")))) do if row.name == name then found = row end end
      assert.equal(0, found.failed)
      assert.equal(6, found.failed_ever)
      -- a client before version 11 reads positions 4 and 5 as its completed and failed, which it
      -- exports as counters: they stay the totals of ever; the counts of now come at 11 and 12
      local raw = rq.server():cli("FCALL", "moonjob_counts", "1", "mj:{" .. name .. "}:")
      local at = {}
      for v in raw:gmatch("[^\n]+") do at[#at + 1] = v end
      assert.same({ "1", "6" }, { at[4], at[5] })
      assert.same({ "1", "0" }, { at[11], at[12] })
    end)

    it("never count a worker's hostile entry below zero, nor fail the listing on it", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      local entry = ('{"id":"w-bad","seen":%d,"lapse":60000,"drop":600000,"running":-5,"started":"x"}')
        :format(os.time() * 1000)
      rq.server():cli("HSET", "mj:{" .. name .. "}:workers", "w-bad", entry)
      assert(q:add({ n = 1 }))
      local c = assert(q:counts())
      assert.equal(0, c.running)
      assert.equal(0, c.held)
      local w = assert(q:workers())
      assert.equal(1, #w)
      assert.equal(0, w[1].running)
      local _, err, status = moonjob("workers --queue " .. name)
      assert.equal(0, status, err)
    end)

    it("give /metrics gauges of the jobs kept now and counters that never go down", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      for i = 1, 2 do assert(q:add({ fail = true }, { id = "bad" .. i })) end
      local pool = rq.pool(name, { size = 1 })
      assert(wait_for(function() return q:counts().failed == 2 end), "two failed")
      pool:close()
      local server = rq.close_after(assert(dashboard.start({ redis = rq.server().url, listen = "127.0.0.1:0" })))
      local function scrape()
        local status, text = http(server, "GET", "/metrics")
        assert.equal(200, status, text)
        local m = prom.parse(text)
        return function(family, labels)
          labels = labels or {}
          labels.queue = name
          return prom.value(m, family, labels)
        end, text
      end
      local before = scrape()
      assert.equal(2, before("moonjob_queue_failed_total"))
      assert.equal(2, before("moonjob_queue_jobs", { state = "failed" }))
      assert.equal(2, q:retry_all())
      local after, text = scrape()
      assert.equal(2, after("moonjob_queue_failed_total")) -- a counter: never down
      assert.equal(0, after("moonjob_queue_jobs", { state = "failed" }))
      assert.equal(2, after("moonjob_queue_jobs", { state = "waiting" }))
      local code, said = prom.promtool_check(text)
      assert.equal(0, code, said)
    end)
  end)

  describe("running", function()
    it("counts a worker's 10 ms jobs as running, and held as the active jobs no child runs", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      short_jobs(q, 3000, 10)
      local pid, log = rq.start_worker(name, "-j 3 --quiet")
      assert(rq.worker_connected(log))
      assert(wait_for(function() local c = q:counts() return c.active - c.held >= 1 end, 15),
        "jobs of 10 ms seen running once")
      -- then seen running at nearly every look while they run non-stop (a
      -- starved worker may miss a beat window; before heartbeats: 2 of 20)
      local looks, running = 20, 0
      for _ = 1, looks do
        local c = q:counts()
        if c.active - c.held >= 1 then running = running + 1 end
        assert.is_true(c.held >= 0 and c.active - c.held <= 3, "running: at most the children")
        wait_for(function() return false end, 0.05)
      end
      assert.is_true(running >= looks * 3 / 4, ("seen running at %d of %d looks"):format(running, looks))
      local out, err = moonjob("status --json --queue " .. name)
      local s = json.decode(out)
      assert(s, err)
      assert.is_true(s.held >= 0 and s.running >= 0, out)
      rq.stop_worker(pid)
    end)
  end)

  describe("workers", function()
    it("lists a live worker: host, pid, version, queue, children, the jobs it runs and since when", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      assert(q:add({ sleep = 20 }, { id = "long" }))
      local pid, log = rq.start_worker(name, "-j 2")
      assert(rq.worker_connected(log))
      local row
      assert(wait_for(function()
        local rows = listed(name)
        row = rows[1]
        return row and row.jobs and row.jobs[1] ~= nil
      end, 15), "the worker listed with its job")
      assert.equal(pid, row.pid)
      assert.equal(hostname(), row.host)
      assert.same({ name }, row.queues)
      assert.equal(2, row.children)
      assert.equal(1, row.running)
      assert.equal("long", row.jobs[1].id)
      assert.is_number(row.jobs[1].since)
      assert.is_string(row.version)
      assert.is_true(row.started <= row.seen)
      assert.is_false(row.lapsed)
      local list = assert(q:workers())
      assert.equal(1, #list)
      assert.equal(row.id, list[1].id)
      local out = moonjob("workers --queue " .. name)
      assert.matches(tostring(pid), out, 1, true)
      -- without --queue: every registered queue's workers
      local all = ndjson((moonjob("workers --json")))
      local mine = 0
      for _, r in ipairs(all) do if r.queue == name then mine = mine + 1 end end
      assert.equal(1, mine)
      -- a clean stop removes it at once
      rq.stop_worker(pid, "TERM")
      assert.same({}, listed(name))
    end)

    it("lists a worker serving several queues on each of them, naming them all", function()
      local a, b = rq.new_queue(), rq.new_queue()
      local pid, log = rq.start_worker(a .. "," .. b, "-j 1")
      assert(rq.worker_connected(log))
      local rows
      assert(wait_for(function()
        rows = { listed(a)[1], listed(b)[1] }
        return rows[1] ~= nil and rows[2] ~= nil
      end, 15), "listed on both queues")
      for _, row in ipairs(rows) do
        assert.equal(pid, row.pid)
        assert.same({ a, b }, row.queues)
      end
      rq.stop_worker(pid, "TERM")
      assert.same({}, listed(a))
      assert.same({}, listed(b))
    end)

    it("shows a worker killed without a word as lapsed, its job no longer running, then drops it", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      assert(q:add({ sleep = 30 }, { id = "orphan" }))
      -- lapsed after 0.3 s unseen; dropped after two leases (6 s), when its job was recovered
      local pid = beating_worker(name, 0.1, 3)
      assert(wait_for(function()
        local w = q:workers()
        return #w == 1 and w[1].jobs[1] ~= nil and q:counts().running == 1
      end, 15), "the worker registered, running its job")
      assert.is_false(q:workers()[1].lapsed)
      -- the job said started too (a 30 s job): a lapsed worker's job must not count by that
      assert(wait_for(function() return rq.server():cli("HGET", "mj:{" .. name .. "}:j:orphan", "ran") == "1" end))
      rq.stop_worker(pid, "KILL")
      assert(wait_for(function()
        local w = q:workers()
        return w[1] and w[1].lapsed
      end, 10), "shown lapsed")
      local c = q:counts()
      assert.equal(1, c.active) -- (its lease has not ended yet)
      assert.equal(0, c.running)
      assert.equal(0, c.held) -- (no worker holds it to run next)
      assert.equal(1, c.lapsed)
      assert.equal(0, c.workers)
      local out = moonjob("workers --queue " .. name)
      assert.matches("lapsed", out, 1, true)
      assert.equal(0, q:workers()[1].running)
      -- a live worker's beats prune the dead one's entry at its drop time; by then the job's
      -- lease ended, and the live worker recovered it: it never counts as running again
      beating_worker(name, 0.1, 3)
      assert(wait_for(function()
        local w = assert(q:workers())
        return #w == 1 and not w[1].lapsed and w[1].id ~= nil
      end, 20), "dropped")
      assert(wait_for(function() return q:counts().lapsed == 0 end, 10), "its job recovered")
      local c2 = q:counts()
      assert.equal(c2.active, c2.running + c2.held) -- each active job: one a live worker holds or runs
    end)
  end)
end)
