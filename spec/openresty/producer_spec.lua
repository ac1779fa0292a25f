-- A producer where Lua web apps run: a real nginx with Debian's Lua module
-- (unpacked, not installed: spec/support/openresty.lua) whose handlers add
-- jobs to a real redis-server, and a real `moonjob worker` that runs them.
local helpers = require "helpers"
local openresty = require "openresty"
local rq = require "redis_queue"

local HTTP = [[
lua_package_path "%s";

server {
  listen 127.0.0.1:%d;

  location = /jobs {
    content_by_lua_block {
      local redis = require "nginx.redis"
      ngx.req.read_body()
      local red = redis:new()
      red:set_timeout(1000)
      local ok, err = red:connect("127.0.0.1", %d)
      if not ok then ngx.status = 503; ngx.say(err); return end
      local res, err = red:fcall("moonjob_add", 1, "mj:{web}:", "", ngx.req.get_body_data(),
        "0", "0", "1", "", "0", "0", "", "0", "0", "0")
      red:set_keepalive(10000, 16)
      if not res then ngx.status = 500; ngx.say(err); return end
      ngx.say(res[1])
    }
  }
}
]]

rq.describe(function()
  describe("nginx with the Lua module", function()
    local nginx

    setup(function()
      assert(openresty.check())
      local out = helpers.sh(("%s scripts/moonjob library | redis-cli -p %d -x FUNCTION LOAD REPLACE")
        :format(helpers.LUAJIT, rq.server().port))
      assert.equal("moonjob", (out:gsub("\n$", "")))
      nginx = openresty.start(function(port) return HTTP:format(openresty.LUA_PATH, port, rq.server().port) end)
    end)

    teardown(function()
      if nginx then nginx:stop() end
    end)

    it("runs on OpenResty's LuaJIT unpacked under build/, not on the system's", function()
      local mapped = nginx:mapped("libluajit")
      assert.equal(1, #mapped)
      assert.equal(openresty.ROOT, mapped[1]:sub(1, #openresty.ROOT))
      assert.equal(1, #nginx:mapped("ngx_http_lua_module.so"))
    end)

    it("adds a job per request and answers its id; a moonjob worker runs it", function()
      local status, body = nginx:request("POST", "/jobs", '{"echo":"from nginx"}')
      assert.equal(200, status, body)
      local id = body:match("^(%S+)\n$")
      local q = rq.new_producer("web")
      rq.start_worker("web", "-j 1")
      assert(rq.wait_for(function() local info = q:get(id) return info and info.state == "completed" end))
      assert.same({ id = id, attempt = 1, echo = "from nginx" }, q:get(id).result)
    end)
  end)
end)
