-- The dashboard's server on a real Redis, spoken to by curl: the JSON API,
-- its actions and errors, /metrics through Debian's promtool, and its
-- guards (token, the X-Moonjob-Token header on actions, the Host check).
local helpers = require "helpers"
local json = require "moonjob.codec.json"
local dashboard = require "moonjob.dashboard"
local rq = require "redis_queue"
local held_groups = require "held_groups"

-- curl in the background while the loop runs; -> status, body.
local function http(server, method, path, headers, body)
  local out = os.tmpname()
  local args = { "curl -s -o " .. out .. " -w '%{http_code}' -X " .. method }
  for k, v in pairs(headers or {}) do args[#args + 1] = ("-H '%s: %s'"):format(k, v) end
  if body then args[#args + 1] = "--data-binary '" .. body:gsub("'", "'\\''") .. "'" end
  args[#args + 1] = "'http://" .. server:address() .. path .. "'"
  local code_file = os.tmpname()
  local pid = tonumber(helpers.first_line(table.concat(args, " ") .. " >" .. code_file .. " 2>/dev/null & echo $!"))
  helpers.wait_for(function() return not helpers.running(pid) end, 20)
  local status = tonumber(helpers.first_line("cat " .. code_file))
  local f = io.open(out, "rb")
  local text = f and f:read("*a") or ""
  if f then f:close() end
  os.remove(out); os.remove(code_file)
  return status, text
end

local ACT = { ["X-Moonjob-Token"] = "x", ["Content-Type"] = "application/json" }

rq.describe(function()
  describe("the dashboard's server", function()
    local server
    after_each(function() if server then server:close() server = nil end end)

    it("serves the page, the queues, a queue's metrics, a page of jobs and one job", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      for i = 1, 3 do assert(q:add({ n = i }, { id = "j" .. i })) end
      local bad = assert(q:add({ fail = true }, { id = "bad" }))
      local pool = rq.pool(name, { size = 1 })
      bad:wait(20)
      pool:close()
      server = assert(dashboard.start({ redis = rq.server().url, listen = "127.0.0.1:0" }))
      local status, page = http(server, "GET", "/")
      assert.equal(200, status)
      assert.matches("<script src=\"/static/app.js\"", page, 1, true)
      local body
      status, body = http(server, "GET", "/api/queues")
      assert.equal(200, status, body)
      local found
      for _, row in ipairs(json.decode(body).queues) do if row.name == name then found = row end end
      assert.equal(3, found.completed)
      assert.equal(1, found.failed)
      assert.equal(30, #found.spark)
      status, body = http(server, "GET", "/api/queues/" .. name)
      assert.equal(200, status, body)
      local overview = json.decode(body)
      assert.equal(60, #overview.metrics.minutes)
      assert.equal(3, overview.metrics.total.completed)
      assert.same({ held_back = 0, started = 0 }, overview.limits)
      assert.same({ total = 0, list = {} }, overview.schedules)
      assert(q:set_rate({ max = 7, per = 1 }))
      assert(q:schedule("hourly", { cron = "@hourly" }, { n = 1 }))
      status, body = http(server, "GET", "/api/queues/" .. name)
      overview = json.decode(body)
      assert.same({ max = 7, per = 1 }, overview.limits.rate)
      assert.equal(1, overview.schedules.total)
      assert.equal("hourly", overview.schedules.list[1].id)
      assert.equal(0, overview.schedules.list[1].next % 3600000)
      assert.is_nil(overview.schedules.list[1].data) -- the page shows no job data
      status, body = http(server, "GET", "/api/queues/" .. name .. "/jobs?state=failed&limit=5")
      assert.equal(200, status, body)
      local page1 = json.decode(body)
      assert.equal(1, page1.total)
      assert.equal("EBAD", page1.jobs[1].error.code)
      assert.is_true(page1.jobs[1].error_cut) -- its traceback is the page's to fetch
      status, body = http(server, "GET", "/api/queues/" .. name .. "/jobs/bad")
      assert.equal(200, status, body)
      local whole = json.decode(body)
      assert.same({ fail = true }, whole.data)
      assert.equal("A-1", whole.error.sku)
      assert.matches("remote.lua", whole.error.traceback)
      status, body = http(server, "GET", "/api/queues/" .. name .. "/jobs/none")
      assert.equal(404, status)
      assert.equal("ENOTFOUND", json.decode(body).error.code)
      status, body = http(server, "GET", "/api/queues/no-such-queue")
      assert.equal(404, status)
      assert.equal("ENOQUEUE", json.decode(body).error.code)
      status, body = http(server, "GET", "/api/queues/" .. name .. "/jobs?state=bogus")
      assert.equal(400, status)
      assert.matches("state must be", json.decode(body).error.message)
      status = http(server, "GET", "/nothing")
      assert.equal(404, status)
      -- a queue a worker waits on, nothing added yet: shown empty
      local waited = rq.new_queue()
      rq.pool(waited, { size = 1 })
      helpers.wait_for(function() return rq.server():cli("SISMEMBER", "mj:queues", waited) == "1" end)
      status, body = http(server, "GET", "/api/queues/" .. waited)
      assert.equal(200, status, body)
      assert.equal(0, json.decode(body).counts.waiting)
      assert.equal("completed", require("moonjob.dashboard.api").query_arg("xstate=failed&state=completed", "state"))
      assert.equal("a b&c", require("moonjob.dashboard.api").query_arg("token=a+b%26c", "token"))
    end)

    it("gives a queue's group limits and its groups held back, and why", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      assert(q:add({ n = 1 }, { id = "plain" }))
      server = assert(dashboard.start({ redis = rq.server().url, listen = "127.0.0.1:0" }))
      local status, body = http(server, "GET", "/api/queues/" .. name)
      assert.equal(200, status, body)
      assert.same({ ready = 0, held_back = 0, held = {} }, json.decode(body).groups)
      assert.matches('"held":[]', body, 1, true) -- an array, also when empty
      assert(q:remove("plain"))
      held_groups.cap_and_hold(q, 600000) -- A at its cap, B held by ERATELIMIT, C ready
      assert(q:set_group_rate({ max = 5, per = 2 }))
      status, body = http(server, "GET", "/api/queues/" .. name)
      assert.equal(200, status, body)
      local overview = json.decode(body)
      held_groups.assert_cap_and_hold(overview.limits, overview.groups)
      -- at most 50 listed, the count whole
      local many = rq.new_producer(rq.new_queue())
      held_groups.rate_full(many, 53, 600)
      status, body = http(server, "GET", "/api/queues/" .. many.name)
      assert.equal(200, status, body)
      overview = json.decode(body)
      assert.equal(53, overview.groups.held_back)
      assert.equal(50, #overview.groups.held)
      assert.equal("rate", overview.groups.held[50].state)
    end)

    it("acts only on POSTs that carry X-Moonjob-Token, and says why a job cannot be acted on", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      assert(q:add({ n = 1 }, { id = "d", delay = 600 }))
      server = assert(dashboard.start({ redis = rq.server().url, listen = "127.0.0.1:0" }))
      local status, body = http(server, "POST", "/api/queues/" .. name .. "/pause", { ["Content-Type"] = "application/json" })
      assert.equal(403, status)
      assert.matches("X%-Moonjob%-Token", body)
      assert.is_false(q:counts().paused)
      status, body = http(server, "POST", "/api/queues/" .. name .. "/pause", ACT)
      assert.equal(200, status, body)
      assert.is_true(q:counts().paused)
      status, body = http(server, "POST", "/api/queues/" .. name .. "/jobs/d/retry", ACT)
      assert.equal(409, status)
      assert.equal("ESTATE", json.decode(body).error.code)
      status, body = http(server, "POST", "/api/queues/" .. name .. "/jobs/d/promote", ACT)
      assert.equal(200, status, body)
      assert.equal("delayed", json.decode(body).was)
      status, body = http(server, "POST", "/api/queues/" .. name .. "/clean", ACT, '{"state":"waiting"}')
      assert.equal(400, status)
      status = http(server, "GET", "/api/queues", { Host = "evil.example:7411" })
      assert.equal(421, status)
    end)

    it("needs its token for data and actions when it has one; refuses another address without one", function()
      local name = rq.new_queue()
      assert(rq.new_producer(name):add({ n = 1 }))
      local _, err = dashboard.start({ redis = rq.server().url, listen = "0.0.0.0:0" })
      assert.matches("is not a loopback address: give %-%-token", err)
      server = assert(dashboard.start({ redis = rq.server().url, listen = "127.0.0.1:0", token = "s3cret" }))
      assert.equal(200, (http(server, "GET", "/")))
      local status, body = http(server, "GET", "/api/queues")
      assert.equal(401, status)
      assert.matches("needs its token", body)
      assert.equal(401, (http(server, "GET", "/api/queues", { ["X-Moonjob-Token"] = "wrong" })))
      assert.equal(200, (http(server, "GET", "/api/queues", { ["X-Moonjob-Token"] = "s3cret" })))
      assert.equal(200, (http(server, "GET", "/api/queues?token=s3cret")))
      assert.equal(200, (http(server, "GET", "/metrics", { Authorization = "Bearer s3cret" })))
      assert.equal(401, (http(server, "POST", "/api/queues/" .. name .. "/pause", ACT)))
      status, body = http(server, "GET", "/api/queues", { ["X-Moonjob-Token"] = "s3cret" })
      assert.not_matches(tostring(rq.server().port), body) -- no Redis address reaches a page
    end)

    it("gives every queue's metrics in a text promtool accepts", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      local jobs = {}
      for i = 1, 4 do jobs[i] = assert(q:add({ n = i })) end
      jobs[5] = assert(q:add({ fail = true }))
      rq.pool(name, { size = 1 })
      for _, j in ipairs(jobs) do j:wait(20) end
      server = assert(dashboard.start({ redis = rq.server().url, listen = "127.0.0.1:0" }))
      local status, text = http(server, "GET", "/metrics")
      assert.equal(200, status, text)
      assert.matches(('moonjob_queue_completed_total{queue="%s"} 4\n'):format(name), text, 1, true)
      assert.matches(('moonjob_queue_failed_total{queue="%s"} 1\n'):format(name), text, 1, true)
      assert.matches(('moonjob_queue_job_duration_seconds_count{queue="%s"} 5\n'):format(name), text, 1, true)
      local code, said = require("prometheus_text").promtool_check(text)
      assert.equal(0, code, said)
    end)
  end)
end)
