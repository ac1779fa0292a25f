-- spec/support/openresty.lua -- a real nginx with the Lua module (Debian's
-- OpenResty parts) for the specs, run from packages unpacked, never installed.
--
--   local openresty = require "openresty"
--   local nginx = openresty.start(function(port) return http_block_text end)
--   nginx.port; nginx:request("POST", "/jobs", body)  -- -> status, body
--   nginx:error_log()                              -- its error log's text
--   nginx:mapped("libluajit")                      -- files of that name it has mapped
--   nginx:stop()                                   -- by its pid, directory removed
--
-- Why unpacked: Debian's ngx_http_lua_module runs only on OpenResty's LuaJIT
-- (libluajit2-5.1-2), and installing it replaces the system's LuaJIT, which
-- moonjob builds with. `make openresty-deps` (part of `make test`) downloads
-- the .debs with `apt-get download` and unpacks them with `dpkg -x` into
-- build/openresty/root; nginx runs from there with LD_LIBRARY_PATH on the
-- unpacked libraries, so the module loads the unpacked libluajit2 (the spec
-- checks /proc/PID/maps), not the system's.
--
-- Each start writes an nginx.conf into a fresh temporary directory (the main
-- context: the two modules, one process in the foreground, pid, logs and
-- temporary paths there; the caller's text inside `http { }`), listens on a
-- free loopback port, and is ended by its pid. nginx runs with
-- `master_process off`, so the pid the shell reports is the one process
-- serving requests (and, under root, no worker switches user).
local helpers = require "helpers"
local redis_server = require "redis_server"

local M = {}

M.ROOT = helpers.abs("build/openresty/root")
local NGINX = M.ROOT .. "/usr/sbin/nginx"
local MODULES = M.ROOT .. "/usr/lib/nginx/modules"
local LIBS = { M.ROOT .. "/usr/lib/x86_64-linux-gnu", M.ROOT .. "/lib/x86_64-linux-gnu" }

-- The Lua path nginx needs for the checkout's modules and the unpacked
-- OpenResty ones (resty.core, nginx.redis), then the module's default (;;).
M.LUA_PATH = table.concat({
  helpers.abs("lua") .. "/?.lua", helpers.abs("lua") .. "/?/init.lua",
  M.ROOT .. "/usr/share/lua/5.1/?.lua", M.ROOT .. "/usr/share/luajit-2.1.0-beta3/?.lua",
}, ";") .. ";;"

-- Whether the unpacked nginx is there; else a message saying how to get it.
function M.check()
  if helpers.exists(NGINX) and helpers.exists(MODULES .. "/ngx_http_lua_module.so") then return true end
  return false, "nginx with the Lua module is not unpacked under " .. M.ROOT
    .. ": run `make openresty-deps` (it downloads Debian's packages with apt-get download)"
end

local MAIN = [[
daemon off;
master_process off;
worker_processes 1;
pid %s/nginx.pid;
error_log %s/error.log info;
load_module %s/ndk_http_module.so;
load_module %s/ngx_http_lua_module.so;
events { worker_connections 64; }
http {
  access_log off;
  log_not_found off; # (the probe of start: GET / answers 404)
  default_type text/plain;
  client_body_temp_path %s/body;
  proxy_temp_path %s/proxy;
  fastcgi_temp_path %s/fastcgi;
  uwsgi_temp_path %s/uwsgi;
  scgi_temp_path %s/scgi;
%s
}
]]

local Nginx = {}
Nginx.__index = Nginx

function Nginx:error_log()
  local f = io.open(self.dir .. "/error.log")
  if not f then return "" end
  local text = f:read("*a")
  f:close()
  return text
end

-- The status and body of one request (curl, on loopback only).
function Nginx:request(method, path, body)
  local data = ""
  if body then data = " --data-binary @" .. helpers.write_file(self.dir .. "/request.body", body) end
  local out = helpers.sh(("curl -s -m 20 -X %s%s -o - -w '\\n%%{http_code}' 'http://127.0.0.1:%d%s'")
    :format(method, data, self.port, path))
  local text, status = out:match("^(.*)\n(%d%d%d)$")
  return tonumber(status), text
end

-- The paths of the mapped files of nginx whose name contains `name`.
function Nginx:mapped(name)
  local seen, list = {}, {}
  for line in io.lines("/proc/" .. self.pid .. "/maps") do
    local path = line:match("%s(/%S+)$")
    if path and path:find(name, 1, true) and not seen[path] then
      seen[path] = true
      list[#list + 1] = path
    end
  end
  return list
end

function Nginx:_wait_ready()
  local deadline = os.time() + 10
  repeat
    if not helpers.running(self.pid) then
      error("nginx exited at start; its log:\n" .. self:error_log() .. helpers.sh("cat " .. self.dir .. "/stderr"))
    end
    local status = self:request("GET", "/")
    if status and status > 0 then return end -- (curl's 000: no connection yet)
    helpers.sleep(0.02)
  until os.time() > deadline
  error("nginx did not answer within 10 s; its log:\n" .. self:error_log())
end

-- Starts nginx; http(port) returns the text that goes inside `http { }`.
function M.start(http)
  assert(M.check())
  local self = setmetatable({ dir = helpers.tmpdir(), port = redis_server.free_port() }, Nginx)
  local d = self.dir
  helpers.write_file(d .. "/nginx.conf",
    MAIN:format(d, d, MODULES, MODULES, d, d, d, d, d, http(self.port)))
  local cmd = ("env LD_LIBRARY_PATH=%s %s -p %s/ -c %s/nginx.conf -e %s/error.log 2>%s/stderr >/dev/null & echo $!")
    :format(table.concat(LIBS, ":"), NGINX, d, d, d, d)
  self.pid = assert(tonumber(helpers.first_line(cmd)), "cannot start nginx")
  local ok, err = pcall(self._wait_ready, self)
  if not ok then self:stop(); error(err, 0) end
  return self
end

function Nginx:stop()
  if self.pid then
    os.execute(("kill -QUIT %d 2>/dev/null"):format(self.pid))
    local deadline = os.time() + 10
    while helpers.running(self.pid) and os.time() <= deadline do helpers.sleep(0.02) end
    if helpers.running(self.pid) then os.execute(("kill -KILL %d 2>/dev/null"):format(self.pid)) end
    self.pid = nil
  end
  os.execute("rm -rf " .. self.dir)
end

return M
