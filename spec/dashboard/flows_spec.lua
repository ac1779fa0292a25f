-- The dashboard's server on flows, on a real Redis: the parents waiting for
-- children counted and listed by the JSON API, a parent's children and a
-- child's parent in a job's JSON (queues named {TAG}NAME, percent-encoded
-- in the path), remove's refusal of a child its parent waits for unless
-- cascade is asked, and /metrics counting them (checked by promtool).
local json = require "moonjob.codec.json"
local dashboard = require "moonjob.dashboard"
local rq = require "redis_queue"
local http = require "dashboard_http"

local ACT = { ["X-Moonjob-Token"] = "x", ["Content-Type"] = "application/json" }

-- "{q1}/images" -> "%7Bq1%7D%2Fimages", as the page's encodeURIComponent.
local function encoded(name)
  return (name:gsub("[^%w%-_.~]", function(c) return ("%%%02X"):format(c:byte()) end))
end

local half_done_flow = rq.half_done_flow

rq.describe(function()
  describe("the dashboard's server on flows", function()
    local server
    after_each(function() if server then server:close() server = nil end end)

    it("counts and lists the parents waiting for children, and gives a job's parent and children", function()
      local q, images = half_done_flow()
      local name = q.name
      server = assert(dashboard.start({ redis = rq.server().url, listen = "127.0.0.1:0" }))
      local status, body = http(server, "GET", "/api/queues")
      assert.equal(200, status, body)
      local rows = {}
      for _, row in ipairs(json.decode(body).queues) do rows[row.name] = row end
      assert.equal(1, rows[name].waiting_children)
      assert.equal(0, rows[images].waiting_children)
      status, body = http(server, "GET", "/api/queues/" .. name)
      assert.equal(200, status, body)
      assert.equal(1, json.decode(body).counts.waiting_children)
      status, body = http(server, "GET", "/api/queues/" .. name .. "/jobs?state=waiting-children")
      assert.equal(200, status, body)
      local page = json.decode(body)
      assert.equal(1, page.total)
      assert.equal("page", page.jobs[1].id)
      status, body = http(server, "GET", "/api/queues/" .. name .. "/jobs/page")
      assert.equal(200, status, body)
      local parent = json.decode(body)
      assert.equal("waiting-children", parent.state)
      assert.equal(3, #parent.children)
      assert.same({ id = "img1", queue = images, state = "completed", result = { id = "img1", attempt = 1 } },
        parent.children[1])
      assert.equal("EBAD", parent.children[2].error.code)
      assert.equal("refused img2", parent.children[2].error.message)
      assert.same({ id = "txt", queue = name, state = "waiting" }, parent.children[3])
      -- a child on the queue "{name}/images", its name percent-encoded in the path
      status, body = http(server, "GET", "/api/queues/" .. encoded(images) .. "/jobs/img1")
      assert.equal(200, status, body)
      assert.same({ queue = name, id = "page", state = "waiting-children" }, json.decode(body).parent)
      status, body = http(server, "GET", "/api/queues/" .. encoded(images))
      assert.equal(200, status, body)
      assert.equal(images, json.decode(body).name)
    end)

    it("refuses to remove a child its parent waits for, unless cascade is asked", function()
      local q = half_done_flow()
      local name = q.name
      server = assert(dashboard.start({ redis = rq.server().url, listen = "127.0.0.1:0" }))
      local status, body = http(server, "POST", "/api/queues/" .. name .. "/jobs/txt/remove", ACT)
      assert.equal(409, status, body)
      assert.equal("ESTATE", json.decode(body).error.code)
      assert.matches("its parent page in queue " .. name .. " waits for it", json.decode(body).error.message)
      status, body = http(server, "POST", "/api/queues/" .. name .. "/jobs/txt/remove", ACT, '{"cascade":"yes"}')
      assert.equal(400, status, body)
      assert.equal("waiting", q:job("txt").state)
      status, body = http(server, "POST", "/api/queues/" .. name .. "/jobs/txt/remove", ACT, '{"cascade":true}')
      assert.equal(200, status, body)
      assert.equal("waiting", json.decode(body).was)
      assert.equal("ECHILD", q:job("page").error.code)
    end)

    it("counts the parents waiting for children in /metrics, in a text promtool accepts", function()
      local q, images = half_done_flow()
      server = assert(dashboard.start({ redis = rq.server().url, listen = "127.0.0.1:0" }))
      local status, text = http(server, "GET", "/metrics")
      assert.equal(200, status, text)
      assert.matches(('moonjob_queue_jobs{queue="%s",state="waiting-children"} 1\n'):format(q.name), text, 1, true)
      assert.matches(('moonjob_queue_jobs{queue="%s",state="waiting-children"} 0\n'):format(images), text, 1, true)
      local code, said = require("prometheus_text").promtool_check(text)
      assert.equal(0, code, said)
    end)
  end)
end)
