-- The web dashboard in a real browser: Debian's chromium, headless, driven by
-- puppeteer-core (spec/browser/dashboard.js; `make browser-deps` installs
-- them) through a `moonjob dashboard` process, on a real redis-server with a
-- real `moonjob worker` process. The page shows a failed job with its error;
-- Retry there runs it again and it completes; it pages through 1,234 jobs;
-- Pause stops the worker (a job added then stays waiting) and Resume runs
-- it. With a token: refused without it, kept by the tab once given; and no
-- polling while the tab is hidden. A queue's groups held back, with why
-- (dashboard.js --groups). A flow: its parent on the Waiting children tab,
-- its children on its page, linked across queues (dashboard.js --flow).
-- A chart of 20,000 jobs in a minute: no label meets another (dashboard.js
-- --chart). A queue's limits set in the page's dialog, read back from
-- Redis; another queue removed (confirmed first); POSTs without the token
-- refused (dashboard.js --limits, without a token and with one). The
-- Workers page lists a live worker; a Failed tab's count follows its list
-- after "Retry all failed" (dashboard.js --workers). A
-- Redis that is down: the banner says so, and
-- nothing of its URL is on the page (dashboard.js --unreachable).
--
-- MOONJOB_SCREENSHOTS=DIR saves the three pages there (docs/images/ holds
-- the ones the guide shows: MOONJOB_SCREENSHOTS=docs/images busted <this file>).
local helpers = require "helpers"
local rq = require "redis_queue"

local PROCESSOR = helpers.fixture("dashboard_gate.lua") -- relative: tracebacks in the screenshots say so
local DRIVER = "spec/browser/dashboard.js"

-- A `moonjob` process of this tree in the background, ended after the test;
-- -> its pid and the path of its stderr.
local function start(args, env)
  local log = os.tmpname()
  local pid = assert(tonumber(helpers.first_line(("%s %s scripts/moonjob %s >/dev/null 2>%s & echo $!")
    :format(env or "", helpers.LUAJIT, args, log))))
  rq.close_after({ close = function() os.execute(("kill -KILL %d 2>/dev/null"):format(pid)) end })
  return pid, log
end

-- `moonjob dashboard` on a free loopback port; -> its URL, read from the
-- line it says on stderr once it listens. env: set before the command.
local function start_dashboard(env, redis_url)
  local pid, log = start(("dashboard --redis %s --listen 127.0.0.1:0"):format(redis_url or rq.server().url), env)
  local url
  helpers.wait_for(function()
    assert(helpers.running(pid), "moonjob dashboard exited: " .. table.concat(rq.read_lines(log), "\n"))
    local line = rq.read_lines(log)[1]
    url = line and line:match("(http://127%.0%.0%.1:%d+/)")
    return url ~= nil
  end, 20)
  return url
end

local function need_driver()
  assert(os.execute("test -d spec/browser/node_modules/puppeteer-core") == 0,
    "puppeteer-core is not installed: run make browser-deps (npm ci --prefix spec/browser)")
end

-- Runs the driver with `args` (before it: `env`, shell words) within
-- `seconds`; asserts it passed and said each of `oks` ("ok: " patterns).
local function drive(args, oks, seconds, env)
  local out, errout, status = helpers.sh(("%s timeout %d node %s %s"):format(env or "", seconds or 120, DRIVER, args))
  local said = out .. errout
  assert.equal(0, status, said)
  for _, ok in ipairs(oks) do assert.matches("ok: " .. ok, said) end
  assert.matches("PASSED", said)
end

local function shell_quote(text)
  return "'" .. text:gsub("'", "'\\''") .. "'"
end

rq.describe(function()
  describe("the dashboard in chromium", function()
    it("shows a failed job with its error, retries it to completion, pauses and resumes the queue", function()
      need_driver()
      local name = "payments" -- names of a queue as a user would have, for the screenshots
      local q = rq.new_producer(name)
      local dir = helpers.tmpdir()
      local gate = helpers.write_file(dir .. "/declined", "the card is declined while this file is here\n")
      local done = {}
      for i = 1, 12 do done[i] = assert(q:add({ order = 1000 + i, sleep = 0.02 * (i % 4) }, { name = "charge" })) end
      local bad = assert(q:add({ order = 1042, gate = gate }, { id = "order-1042", name = "charge <b>card</b>" }))
      -- a second queue, no worker: 1,234 jobs waiting to page through, 3 delayed
      local later = rq.new_producer("reports")
      for i = 1, 3 do assert(later:add({ report = i }, { delay = 3600 })) end
      local lines = {}
      for i = 1, 1234 do lines[i] = ('{"report":%d}'):format(i) end
      local _, adderr, added = helpers.sh(("%s scripts/moonjob add --redis %s --queue reports >/dev/null")
        :format(helpers.LUAJIT, rq.server().url), table.concat(lines, "\n") .. "\n")
      assert.equal(0, added, adderr)

      start(("worker %s --redis %s --queue %s -j 2 --quiet"):format(PROCESSOR, rq.server().url, name))
      for i = 1, 12 do assert(done[i]:wait(30)) end
      local _, err = bad:wait(30)
      assert.equal("ECARD", err and err.code)
      os.remove(gate) -- from now on the job passes: the page's Retry completes it
      os.remove(dir)

      local url = start_dashboard()
      local add = ("echo '{\"order\":2001}' | %s scripts/moonjob add --redis %s --queue %s")
        :format(helpers.LUAJIT, rq.server().url, name)
      drive(("%s %s order-1042 ECARD reports 1234"):format(url, name), { "the failed job order%-1042 with its "
        .. "error code ECARD", "the retried job completed", "the job stayed waiting for %d+ s: the workers stopped",
        "the second page", "the job ran after Resume" }, 180, "MOONJOB_ADD_JOB=" .. shell_quote(add))

      helpers.wait_for(function() return true end) -- a new bound: the browser took a while
      local job = assert(q:job("order-1042"))
      assert.equal("completed", job.state)
      assert.is_false(q:counts().paused)
    end)

    it("shows the group limits and the groups held back, with why", function()
      need_driver()
      local q = rq.new_producer("tenants")
      require("held_groups").cap_and_hold(q, 600000) -- A at its cap, B held by ERATELIMIT, C ready
      assert(q:set_group_rate({ max = 5, per = 2 }))
      local url = start_dashboard()
      drive("--groups " .. url .. " tenants", { "the group limits in the limits note", "group B held by ERATELIMIT",
        "group A at its cap" })
    end)

    it("shows a flow: the parent waiting on its tab, its children on its page, linked across queues", function()
      need_driver()
      local images = "{pages}/images"
      local q = rq.new_producer("pages")
      assert(q:add_flow({ id = "page", data = { page = 1 }, children = {
        { id = "img1", queue = images, data = { order = 1 } },
        { id = "img2", queue = images, data = { fail = true }, on_fail = "continue" },
        { id = "txt", data = { n = 3 } },
      } }))
      rq.pool(images, { size = 1 })
      local qi = rq.new_producer(images)
      assert(rq.wait_for(function() local c = qi:counts() return c.completed + c.failed == 2 end), "the images ran")
      drive("--flow " .. start_dashboard() .. " pages", { "the Waiting children tab with its count",
        "img2 failed EBAD", "its parent linked", "back on the parent's page" })
    end)

    it("lists a live worker on the Workers page; a Failed tab's count follows its list after a retry", function()
      need_driver()
      local q = rq.new_producer("thumbnails")
      assert(q:add({ sleep = 60 }, { id = "thumb-7" }))
      local pid = start(("worker %s --redis %s --queue thumbnails -j 2 --quiet"):format(PROCESSOR, rq.server().url))
      local failing = rq.new_producer("invoices")
      for i = 1, 2 do assert(failing:add({ fail = true }, { id = "inv-" .. i })) end
      local pool = rq.pool("invoices", { size = 1 })
      assert(rq.wait_for(function() return failing:counts().failed == 2 end), "two invoices failed")
      pool:close()
      drive(("--workers %s thumbnails %d thumb-7 invoices"):format(start_dashboard(), pid), {
        "the worker of thumbnails listed with its pid", "its running job thumb%-7", "the Failed tab counting 0" })
      assert.equal(0, failing:counts().failed)
    end)

    it("draws the chart's labels apart with 5-digit counts per minute and minutes-long run times", function()
      need_driver()
      local q = rq.new_producer("busy")
      -- 20,000 jobs ended through the library's complete, each with its run time: in one
      -- minute, or two, one of which then has 10,000 or more
      local fetch = require("held_groups").fetch
      for _ = 1, 20 do
        local list = {}
        for i = 1, 1000 do list[i] = { n = i } end
        assert(q:add_bulk(list))
        local _, reply = fetch(q, 1000)
        local args = { "FCALL", "moonjob_complete", 1, q.prefix, "\0ms" }
        for i = 2, #reply do
          for _, v in ipairs({ reply[i][1], reply[i][2], "1", i % 50 == 0 and 95000 or 40 }) do args[#args + 1] = v end
        end
        assert.equal(1000, #assert(q.client:call_wait(args)))
      end
      drive("--chart " .. start_dashboard() .. " busy", { "5%-digit tick labels on the chart",
        "no two of the chart's %d+ labels overlap" })
    end)

    for _, token in ipairs({ false, "l1mits-t0ken" }) do
      it(("changes a queue's limits and removes another queue%s; POSTs without the token refused")
          :format(token and ", with a token" or ""), function()
        need_driver()
        local name, other = token and "invoices" or "mailers", token and "invoices-old" or "mailers-old"
        local q, old = rq.new_producer(name), rq.new_producer(other)
        assert(q:add({ order = 1 }, { delay = 3600 }))
        for i = 1, 3 do assert(old:add({ order = i }, { delay = 3600 })) end
        local url = start_dashboard(token and "MOONJOB_DASHBOARD_TOKEN=" .. token or nil)
        drive(("--limits %s %s %s %s"):format(url, name, other, token or ""), { "the rate set in the limits note",
          "the concurrency set", other:gsub("%-", "%%-") .. " removed: gone from the queues page",
          "the limits POST without the token header refused", "the obliterate POST without the token header refused",
          token and "the obliterate POST with a wrong token refused" or nil })
        local l = assert(q:limits())
        assert.same({ max = 50, per = 2 }, l.rate)
        assert.equal(7, l.concurrency)
        assert.is_nil(l.group_rate)
        assert.is_false(old:counts().exists)
        assert.equal(1, q:counts().delayed)
      end)
    end

    it("says Redis is unreachable in the banner, with nothing of its URL on the page", function()
      need_driver()
      local down = require("redis_server").start()
      down:kill9() -- nothing listens on its port now
      local user, password = "dashuser", "dash-pw-9"
      local url = start_dashboard(nil, ("redis://%s:%s@127.0.0.1:%d/3"):format(user, password, down.port))
      drive(("--unreachable %s %s %s redis:// 127.0.0.1:%d"):format(url, user, password, down.port),
        { "Redis is unreachable, in the banner of the queues page", "nothing of the Redis URL on the queues page",
          "nothing of the Redis URL on a queue's page" })
      down:stop()
    end)

    it("needs its token: EAUTH without it; opened once with ?token=, the tab keeps it; polls while visible", function()
      need_driver()
      local q = rq.new_producer("tokens")
      assert(q:add({ order = 1 }, { delay = 3600 }))
      local url = start_dashboard("MOONJOB_DASHBOARD_TOKEN=s3cret-t0ken")
      drive(("--token %s s3cret-t0ken tokens"):format(url), { "EAUTH in the banner without the token",
        "an action with the kept token", "no requests while the tab was hidden", "the page asked again once shown" })
      helpers.wait_for(function() return true end) -- a new bound: the browser took a while
      assert.is_false(q:counts().paused)
    end)
  end)
end)
