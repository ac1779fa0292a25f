-- The pure-Lua producer where Lua web apps run: a real nginx with Debian's
-- Lua module (unpacked, not installed: spec/support/openresty.lua) serving
-- the site of docs/guide/producer.md ("A whole nginx site", read from the
-- page), its handlers adding jobs to a real redis-server, and a real
-- `moonjob worker` running them.
local helpers = require "helpers"
local openresty = require "openresty"
local rq = require "redis_queue"

local GUIDE = "docs/guide/producer.md"
local PROCESSOR = helpers.abs(helpers.fixture("flow.lua")) -- returns { id, data, children }

-- Locations of the spec's own, beside the guide's: refusals a handler gets
-- from q:add as nil, err; a flow of 500 children, whose 9,000 arguments are
-- more than LuaJIT passes to the client's methods (the producer writes them
-- on the client's cosocket itself).
local REFUSALS = [[
  location = /refusals {
    content_by_lua_block {
      local redis = require "nginx.redis"
      local producer = require "moonjob.producer"
      local red = redis:new()
      red:set_timeout(1000)
      assert(red:connect("127.0.0.1", REDIS_PORT))
      local q = assert(producer.queue(red, "full"))
      local _, not_json = q:add({ f = function() end })
      assert(q:add({ n = 1 }, { max_queue = 1 }))
      local _, full = q:add({ n = 2 }, { max_queue = 1 })
      red:set_keepalive(10000, 100)
      ngx.say(tostring(not_json))
      ngx.say(tostring(full))
    }
  }
  location = /wide-flow {
    content_by_lua_block {
      local redis = require "nginx.redis"
      local producer = require "moonjob.producer"
      local red = redis:new()
      red:set_timeout(5000)
      assert(red:connect("127.0.0.1", REDIS_PORT))
      local tree = { data = { parent = true }, children = {} }
      for i = 1, 500 do tree.children[i] = { data = { part = i } } end
      local root = assert(producer.queue(red, "wide")):add_flow(tree)
      red:set_keepalive(10000, 100)
      ngx.say(root.id, " ", #root.children)
    }
  }
]]

-- The guide's site with the test's port, Redis's port and the Lua path (the
-- checkout's lua/, the unpacked resty.core and nginx.redis), and REFUSALS.
local function site(port, redis_port)
  local f = assert(io.open(GUIDE))
  local page = f:read("*a")
  f:close()
  local section = assert(page:match("\n## A whole nginx site\n(.-)\n## "), GUIDE .. ": no section 'A whole nginx site'")
  local conf = assert(section:match("\n```nginx\n(.-)```"), GUIDE .. ": no nginx block in 'A whole nginx site'")
  local function swap(pattern, by)
    local n
    conf, n = conf:gsub(pattern, (by:gsub("%%", "%%%%")))
    assert(n > 0, GUIDE .. ": the site has no " .. pattern)
  end
  swap('lua_package_path "[^"]*";', ('lua_package_path "%s";'):format(openresty.LUA_PATH))
  swap("listen 127%.0%.0%.1:8080;", ("listen 127.0.0.1:%d;"):format(port))
  swap("6379", tostring(redis_port))
  swap("}%s*$", (REFUSALS:gsub("REDIS_PORT", tostring(redis_port))) .. "}\n")
  return conf
end

rq.describe(function()
  describe("nginx with the Lua module", function()
    local nginx

    setup(function()
      assert(openresty.check())
      nginx = openresty.start(function(port) return site(port, rq.server().port) end)
    end)

    teardown(function()
      if nginx then nginx:stop() end
    end)

    -- nginx logged no error (a handler that raised, a timer's add refused).
    local function no_errors()
      local log = nginx:error_log()
      assert.not_matches("%[error%]", log)
      assert.not_matches("%[alert%]", log)
      assert.not_matches("%[emerg%]", log)
    end

    local function completed(q, id)
      assert(rq.wait_for(function()
        local info = q:get(id)
        return info and info.state == "completed"
      end), "job " .. id .. " did not complete")
      return q:get(id)
    end

    it("runs on OpenResty's LuaJIT unpacked under build/, not on the system's", function()
      local mapped = nginx:mapped("libluajit")
      assert.equal(1, #mapped)
      assert.equal(openresty.ROOT .. "/", mapped[1]:sub(1, #openresty.ROOT + 1))
      local module = nginx:mapped("ngx_http_lua_module.so")
      assert.same({ openresty.ROOT .. "/usr/lib/nginx/modules/ngx_http_lua_module.so" }, module)
    end)

    it("adds a job per request and answers its id; a moonjob worker runs it", function()
      assert.equal("OK", rq.server():cli("FUNCTION", "FLUSH")) -- the producer loads the library
      local status, body = nginx:request("POST", "/jobs", '{"n":1,"from":"nginx"}')
      assert.equal(200, status, body)
      local id = assert(body:match("^(%S+)\n$"), body)
      local status2, body2 = nginx:request("POST", "/jobs", '{"n":2}') -- a pooled connection
      assert.equal(200, status2, body2)
      rq.start_worker("web", "-j 2", PROCESSOR)
      local q = rq.new_producer("web")
      local info = completed(q, id)
      assert.same({ n = 1, from = "nginx" }, info.result.data)
      assert.equal(3, info.max_attempts)
      assert.same({ n = 2 }, completed(q, body2:match("^(%S+)\n$")).result.data)
      no_errors()
    end)

    it("answers a body that is not JSON, or data JSON cannot hold, with the error", function()
      local q = rq.new_producer("web")
      local before = q:counts()
      local status, body = nginx:request("POST", "/jobs", "not json")
      assert.equal(400, status)
      assert.equal("the body must be JSON\n", body)
      status, body = nginx:request("POST", "/jobs", "[1e400]") -- cjson reads inf, cannot write it
      assert.equal(413, status)
      assert.matches("^EPAYLOAD: ", body)
      local after = q:counts()
      assert.equal(before.waiting + before.completed, after.waiting + after.completed)
      no_errors()
    end)

    it("gets q:add's refusals as nil, err in a handler: data not JSON, EQUEUEFULL", function()
      local status, body = nginx:request("GET", "/refusals")
      assert.equal(200, status, body)
      local not_json, full = body:match("^([^\n]*)\n([^\n]*)\n$")
      assert.matches("^EPAYLOAD: ", not_json)
      assert.matches("^EQUEUEFULL: ", full)
      assert.equal(1, rq.new_producer("full"):counts().waiting)
      no_errors()
    end)

    it("adds a flow of 500 children from a handler, in one call", function()
      local status, body = nginx:request("POST", "/wide-flow")
      assert.equal(200, status, body)
      local id, n = body:match("^(%S+) (%d+)\n$")
      assert.equal("500", n, body)
      local q = rq.new_producer("wide")
      assert.equal("waiting-children", q:get(id).state)
      assert.equal(500, #assert(q:children(id)))
      assert.equal(500, q:counts().waiting)
      no_errors()
    end)

    it("adds a job from the log phase through a timer, after the answer", function()
      local status, body = nginx:request("GET", "/pages/about")
      assert.equal(200, status)
      assert.equal("page /pages/about\n", body)
      rq.start_worker("web", "-j 2", PROCESSOR)
      local q = rq.new_producer("web")
      local found
      assert(rq.wait_for(function()
        for _, job in ipairs(q:jobs("completed", { limit = 100 })) do
          if type(job.data) == "table" and job.data.page == "/pages/about" then found = job end
        end
        return found
      end), "no job for /pages/about completed")
      assert.same({ page = "/pages/about", status = 200 }, found.data)
      no_errors()
    end)

    it("adds a flow whose parent runs once each part ended, seeing their results", function()
      local status, body = nginx:request("POST", "/reports",
        '{"report":{"title":"r"},"parts":[{"part":1},{"part":2},{"part":3}]}')
      assert.equal(200, status, body)
      local id = assert(body:match("^(%S+)\n$"), body)
      local q = rq.new_producer("web")
      assert.equal("waiting-children", q:get(id).state)
      rq.start_worker("web", "-j 2", PROCESSOR)
      local parent = completed(q, id)
      assert.same({ title = "r" }, parent.result.data)
      local seen = parent.result.children
      assert.equal(3, #seen)
      for i, child in ipairs(seen) do
        assert.equal("completed", child.state)
        assert.same({ part = i }, child.result.data)
        assert.is_true(q:get(child.id).finished <= parent.started)
      end
      status, body = nginx:request("POST", "/reports", '{"parts":[]}')
      assert.equal(400, status, body)
      no_errors()
    end)
  end)
end)
