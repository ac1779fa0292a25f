-- The command line on flows, on a real Redis: the parents waiting for their
-- children listed (jobs --state waiting-children) and counted (status,
-- queues), one job's place in its flow (a parent's children, a child's
-- parent) in NDJSON and on a terminal, and remove's refusal of a child its
-- parent waits for, unless --cascade.
local cli = require "cli"
local helpers = require "helpers"
local json = require "moonjob.codec.json"
local rq = require "redis_queue"
local terminal = require "terminal"

local moonjob, half_done_flow, ndjson = rq.moonjob, rq.half_done_flow, cli.ndjson

rq.describe(function()
  describe("the operating commands on flows", function()
    it("list the parents waiting for children, and status and queues count them", function()
      local q, images = half_done_flow()
      local name = q.name
      local out, err, status = moonjob("jobs --queue " .. name .. " --state waiting-children")
      assert.equal(0, status, err)
      local rows = ndjson(out)
      assert.equal(1, #rows)
      assert.equal("page", rows[1].id)
      assert.equal("waiting-children", rows[1].state)
      out, err, status = moonjob("status --queue " .. name)
      assert.equal(0, status, err)
      assert.matches("^waiting 1, delayed 0, running 0, held 0, completed 0, failed 0, waiting%-children 1\n", out)
      out = moonjob("status --queue " .. images)
      assert.matches("^waiting 0, delayed 0, running 0, held 0, completed 1, failed 1\n", out) -- none: not said
      out, err, status = moonjob("status --queue " .. name .. " --json")
      assert.equal(0, status, err)
      assert.equal(1, json.decode(out).waiting_children)
      assert.equal(0, json.decode((moonjob("status --queue " .. images .. " --json"))).waiting_children)
      out, err, status = moonjob("queues")
      assert.equal(0, status, err)
      local found = {}
      for _, row in ipairs(ndjson(out)) do found[row.name] = row end
      assert.equal(1, found[name].waiting_children)
      assert.equal(0, found[images].waiting_children)
      assert.equal(1, found[name].waiting)
      -- --watch --until-empty does not end while a parent waits for its children (on another queue)
      local pages, later = "{" .. name .. "}/pages", "{" .. name .. "}/later"
      assert(rq.new_producer(pages):add_flow({ id = "p", data = {}, children = { { queue = later, data = {} } } }))
      out, err, status = helpers.sh(("timeout 3 %s scripts/moonjob status --redis %s --queue '%s' --watch --until-empty")
        :format(helpers.LUAJIT, rq.server().url, pages))
      assert.equal(124, status, out .. err) -- still watching
      assert.matches("^waiting 0, delayed 0, running 0, held 0, completed 0, failed 0, waiting%-children 1\n", out)
    end)

    it("show a parent's children and a child's parent, in NDJSON and on a terminal", function()
      local q, images = half_done_flow()
      local name = q.name
      local out, err, status = moonjob("job --queue " .. name .. " page")
      assert.equal(0, status, err)
      local page = ndjson(out)[1]
      assert.equal("waiting-children", page.state)
      assert.is_nil(page.parent)
      assert.same({ { id = "img1", queue = images, state = "completed", result = { id = "img1", attempt = 1 } },
        { id = "img2", queue = images, state = "failed",
          error = { code = "EBAD", message = "refused img2", sku = "A-1" } },
        { id = "txt", queue = name, state = "waiting" } },
        (function() -- (a traceback is the error's too: left out here)
          for _, c in ipairs(page.children) do if c.error then c.error.traceback = nil end end
          return page.children
        end)())
      out, err, status = moonjob("job --queue " .. images .. " img1")
      assert.equal(0, status, err)
      assert.same({ queue = name, id = "page", state = "waiting-children" }, ndjson(out)[1].parent)
      local shown, code = terminal.run({ argv = terminal.moonjob("job", "--redis", rq.server().url, "--queue",
        name, "page"), tty = { 1 } })
      assert.equal(0, code, shown)
      assert.matches("children  3: 1 completed, 1 failed, 1 pending\r?\n", shown)
      local images_pattern = images:gsub("%p", "%%%0")
      assert.matches("\n  img1  " .. images_pattern .. "  completed  {\"attempt\":1,\"id\":\"img1\"}\r?\n", shown)
      assert.matches("\n  img2  " .. images_pattern .. "  failed     EBAD: refused img2\r?\n", shown)
      assert.matches("\n  txt   " .. name .. " +waiting\r?\n", shown)
      shown, code = terminal.run({ argv = terminal.moonjob("job", "--redis", rq.server().url, "--queue",
        images, "img1"), tty = { 1 } })
      assert.equal(0, code, shown)
      assert.matches("parent    page in queue " .. name .. " %(waiting%-children%)", shown)
    end)

    it("refuse to remove a child its parent waits for, and remove it with --cascade", function()
      local q = half_done_flow()
      local name = q.name
      local out, err, status = moonjob("remove --queue " .. name .. " txt")
      assert.equal(1, status)
      assert.equal("", out)
      assert.matches("remove txt: ESTATE: .*its parent page in queue " .. name .. " waits for it", err)
      assert.matches("%-%-cascade", err)
      assert.equal("waiting-children", q:job("page").state)
      out, err, status = moonjob("retry --queue " .. name .. " --cascade txt")
      assert.equal(2, status)
      assert.matches("%-%-cascade is for moonjob remove", err)
      out, err, status = moonjob("remove --queue " .. name .. " --cascade txt")
      assert.equal(0, status, err)
      assert.same({ { action = "remove", id = "txt", was = "waiting" } }, ndjson(out))
      local page = q:job("page")
      assert.equal("failed", page.state) -- its child canceled, and a child's failure fails it by default
      assert.equal("ECHILD", page.error.code)
      -- removing a parent with --cascade, or without: its pending children are canceled either way
      local images = "{" .. name .. "}/images"
      assert(q:add_flow({ id = "p2", data = {}, children = { { id = "c2", queue = images, data = {} } } }))
      out, err, status = moonjob("remove --queue " .. name .. " p2")
      assert.equal(0, status, err)
      assert.same({ { action = "remove", id = "p2", was = "waiting-children" } }, ndjson(out))
      assert.equal("failed", rq.new_producer(images):job("c2").state)
    end)
  end)
end)
