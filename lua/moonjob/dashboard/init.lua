-- moonjob.dashboard -- the web dashboard's server: `moonjob dashboard`.
--
--   local server = assert(dashboard.start({ redis = url, listen = "127.0.0.1:7411", token = nil }))
--   ... the loop runs ...
--   server:close()
--
-- Served from the C core's loop (core.http_listen: libhttp-parser over
-- uv_tcp), so it never blocks a pool in the same program. It serves the
-- static page (static/: index.html, app.js, style.css, read once at start,
-- shipped with the modules), the JSON API the page polls
-- (moonjob.dashboard.api) and /metrics for Prometheus
-- (moonjob.dashboard.metrics). Each request runs as a loop.async task, so
-- the queue methods it calls yield to the loop instead of blocking it.
--
-- Security (docs/guide/dashboard.md):
--   * it listens on loopback by default; any other address needs a token
--     (opts.token, `--token` or MOONJOB_DASHBOARD_TOKEN), refused otherwise;
--   * with a token, every API and /metrics request must carry it (header
--     X-Moonjob-Token, or Authorization: Bearer, or ?token= on a GET);
--     the static files carry no data and need none;
--   * every action is a POST that carries the X-Moonjob-Token header (the
--     token, or anything when none is set): a page of another site cannot
--     send that header without the browser asking first (CORS), so it
--     cannot act through a visitor's browser;
--   * on loopback without a token the Host header must name loopback: a
--     DNS name rebound to 127.0.0.1 by another site is refused;
--   * the Redis URL (and its password) is never sent to a page: when Redis
--     is unreachable a page reads "Redis is unreachable: connection refused",
--     and the URL (password masked) goes to stderr, once per outage.
local core = require "moonjob.core"
local client = require "moonjob.redis.client"
local api = require "moonjob.dashboard.api"

local M = {}

M.DEFAULT_LISTEN = "127.0.0.1:7411"

local Server = {}
Server.__index = Server

local STATIC = {
  ["/"] = { "index.html", "text/html; charset=utf-8" },
  ["/index.html"] = { "index.html", "text/html; charset=utf-8" },
  ["/static/app.js"] = { "app.js", "text/javascript; charset=utf-8" },
  ["/static/style.css"] = { "style.css", "text/css; charset=utf-8" },
}

local HEADERS = {
  ["Cache-Control"] = "no-store",
  ["X-Content-Type-Options"] = "nosniff",
  ["Content-Security-Policy"] = "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
  ["Referrer-Policy"] = "no-referrer",
  ["X-Frame-Options"] = "DENY",
}

-- The folder of static files, beside this module wherever it is installed.
local function static_dir()
  local path = package.searchpath("moonjob.dashboard", package.path)
  return path and path:gsub("init%.lua$", "") .. "static/" or nil
end

local function read_static()
  local dir = static_dir()
  local files = {}
  for url, f in pairs(STATIC) do
    local h = dir and io.open(dir .. f[1], "rb")
    if not h then return nil, ("the dashboard's page %s%s is missing: reinstall moonjob"):format(dir or "static/", f[1]) end
    files[url] = { h:read("*a"), f[2] }
    h:close()
  end
  return files
end

-- "host:port" -> host, port (an IPv6 host in brackets), or nil and why.
function M.parse_listen(text)
  local host, port = tostring(text):match("^%[([%x:.]+)%]:(%d+)$")
  if not host then host, port = tostring(text):match("^([%w.%-]+):(%d+)$") end
  port = tonumber(port)
  if not host or not port or port > 65535 then
    return nil, ("--listen needs HOST:PORT (127.0.0.1:7411, [::1]:7411), not '%s'"):format(tostring(text))
  end
  if host == "localhost" then host = "127.0.0.1" end
  return host, port
end

local function loopback(host)
  return host:match("^127%.") ~= nil or host == "::1"
end

-- Whether a request's Host header names this loopback server.
local function host_allowed(host_header)
  local name = (host_header or ""):lower():gsub(":%d+$", "")
  return name == "localhost" or name:match("^127%.%d+%.%d+%.%d+$") ~= nil or name == "[::1]"
end

local function header_with_extra(extra)
  local h = {}
  for k, v in pairs(HEADERS) do h[k] = v end
  for k, v in pairs(extra or {}) do h[k] = v end
  return h
end

function Server:respond(req, status, body, content_type, extra)
  local headers = header_with_extra(extra)
  headers["Content-Type"] = content_type or "application/json"
  req:respond(status, headers, body)
end

-- The token a request carries, if any.
local function token_of(req)
  local h = req.headers or {}
  if h["x-moonjob-token"] then return h["x-moonjob-token"] end
  local bearer = h["authorization"] and h["authorization"]:match("^[Bb]earer%s+(.+)$")
  if bearer then return bearer end
  if req.method == "GET" and req.query then return api.query_arg(req.query, "token") end
end

-- Equal texts, compared in a time that does not depend on where they differ.
local function same(a, b)
  if type(a) ~= "string" or #a ~= #b then return false end
  local diff = 0
  for i = 1, #a do diff = bit.bor(diff, bit.bxor(a:byte(i), b:byte(i))) end
  return diff == 0
end

-- nil when the request may go on, else status and message.
function Server:refusal(req, needs_data)
  if self.check_host and not host_allowed(req.headers and req.headers.host) then
    return 421, "this dashboard answers only to a loopback host name (127.0.0.1, localhost)"
  end
  if req.method == "POST" and not (req.headers and req.headers["x-moonjob-token"]) then
    return 403, "an action needs the X-Moonjob-Token header (the dashboard's page sends it)"
  end
  if needs_data and self.token and not same(token_of(req), self.token) then
    return 401, "this dashboard needs its token: open it with ?token=TOKEN (moonjob dashboard --token)"
  end
end

function Server:handle(req)
  local static = req.method == "GET" and self.files[req.path]
  local status, why = self:refusal(req, not static)
  if status then
    return self:respond(req, status, require("moonjob.codec.json").encode({
      error = { code = status == 401 and "EAUTH" or "EFORBIDDEN", message = why } }))
  end
  if static then return self:respond(req, 200, static[1], static[2]) end
  if req.path == "/metrics" and req.method == "GET" then
    local text, err = require("moonjob.dashboard.metrics").render(self)
    if not text then
      return self:respond(req, 503, "# " .. self.client:without_address(err) .. "\n", "text/plain; charset=utf-8")
    end
    return self:respond(req, 200, text, "text/plain; version=0.0.4; charset=utf-8")
  end
  if req.path:sub(1, 5) == "/api/" then return self.api:handle(self, req) end
  self:respond(req, 404, '{"error":{"code":"ENOTFOUND","message":"no such page"}}')
end

-- The operator hears on stderr when Redis goes (its URL, the password
-- masked, and why: once per reason while it lasts, as the client says it)
-- and when it is back; a page hears only "Redis is unreachable"
-- (client:without_address).
local function redis_state(target)
  local name, down = target and client.display(target) or "", false
  return function(up, why)
    if up and down then io.stderr:write(("moonjob dashboard: Redis %s is reachable again\n"):format(name)) end
    if up and why then io.stderr:write(("moonjob dashboard: Redis %s: %s\n"):format(name, why)) end -- (Sentinel)
    if not up then
      io.stderr:write(("moonjob dashboard: Redis %s is unreachable: %s\n"):format(name, tostring(why)))
    end
    down = not up
  end
end

-- dashboard.start(opts) -> server | nil, err. opts: redis (URL), listen
-- ("host:port", default 127.0.0.1:7411; port 0: any free one), token.
function M.start(opts)
  local host, port = M.parse_listen(opts.listen or M.DEFAULT_LISTEN)
  if not host then return nil, port end
  if opts.token == "" then opts.token = nil end
  if not loopback(host) and not opts.token then
    return nil, ("--listen %s is not a loopback address: give --token (or MOONJOB_DASHBOARD_TOKEN), so that "
      .. "only those who have it can see the queues and act on them"):format(opts.listen)
  end
  local files, ferr = read_static()
  if not files then return nil, ferr end
  local c, err = client.new(opts.redis, { timeout_ms = (opts.timeout or 5) * 1000,
    on_state = redis_state(client.parse(opts.redis)) })
  if not c then return nil, err end
  local self = setmetatable({ client = c, token = opts.token, files = files,
    check_host = loopback(host) and not opts.token, api = api.new(c) }, Server)
  local server
  server, err = core.http_listen(host, port, function(req)
    require("moonjob.loop").async(function()
      local ok, why = xpcall(self.handle, debug.traceback, self, req)
      if not ok then
        io.stderr:write("moonjob dashboard: ", tostring(why), "\n")
        pcall(self.respond, self, req, 500, '{"error":{"code":"EINTERNAL","message":"the dashboard failed; see its stderr"}}')
      end
    end)
  end)
  if not server then c:close(); return nil, err end
  self.http, self.host, self.port = server, host, server:port()
  return self
end

-- The address it listens on, for a URL: "127.0.0.1:7411", "[::1]:7411".
function Server:address()
  return (self.host:find(":") and ("[" .. self.host .. "]") or self.host) .. ":" .. self.port
end

function Server:close()
  if self.http then self.http:close() end
  self.client:close()
end

return M
