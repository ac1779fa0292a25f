-- The dashboard while its Redis is unreachable, as a user meets it: a
-- `moonjob dashboard` process whose URL names a user, a password, a port
-- and a database, spoken to by curl. Every API route and /metrics say
-- "Redis is unreachable" and carry nothing of the URL (user, host, port,
-- database); the URL, its password masked, goes to the dashboard's stderr,
-- once per outage rather than once per request. First nothing listens on
-- the port; then a redis-server starts there (the answers are served), and
-- is killed.
local helpers = require "helpers"
local json = require "moonjob.codec.json"
local redis_server = require "redis_server"

local USER, PASSWORD, DB = "dashuser", "dash-pw-9", 3

-- Every route of the API, and /metrics; a POST carries the header the page sends.
local ROUTES = {
  { "GET", "/api/queues" }, { "GET", "/api/queues/orders" }, { "GET", "/api/queues/orders/jobs?state=failed" },
  { "GET", "/api/queues/orders/jobs/j1" }, { "GET", "/metrics" },
  { "POST", "/api/queues/orders/pause" }, { "POST", "/api/queues/orders/resume" },
  { "POST", "/api/queues/orders/retry-all" }, { "POST", "/api/queues/orders/clean", '{"state":"failed"}' },
  { "POST", "/api/queues/orders/jobs/j1/retry" }, { "POST", "/api/queues/orders/jobs/j1/remove" },
  { "POST", "/api/queues/orders/jobs/j1/promote" }, { "POST", "/api/queues/orders/jobs/j1/cancel" },
}

local read = require("redis_workers").read -- (the whole file, or "")

-- Every route at once (each waits for Redis up to the dashboard's 5 s);
-- -> { { route, status, body } } in ROUTES' order.
local function fetch_all(base)
  local dir = helpers.tmpdir()
  local lines = {}
  for i, r in ipairs(ROUTES) do
    lines[i] = ("curl -s -m 30 -o %s/%d.body -w '%%{http_code}' -X %s -H 'X-Moonjob-Token: x'"
      .. " -H 'Content-Type: application/json' %s '%s%s' >%s/%d.code &")
      :format(dir, i, r[1], r[3] and ("--data-binary '" .. r[3] .. "'") or "", base, r[2]:sub(2), dir, i)
  end
  helpers.sh(table.concat(lines, "\n") .. "\nwait")
  local out = {}
  for i, r in ipairs(ROUTES) do
    out[i] = { route = r[1] .. " " .. r[2], status = tonumber(read(("%s/%d.code"):format(dir, i))),
      body = read(("%s/%d.body"):format(dir, i)) }
  end
  os.execute("rm -rf " .. dir)
  return out
end

-- What every answer must say, and must not.
local function assert_unreachable(answers, port)
  for _, a in ipairs(answers) do
    local said = a.route .. " answered " .. tostring(a.status) .. ": " .. a.body
    assert.is_true(a.status == 502 or a.status == 503, said)
    assert.matches("Redis is unreachable", a.body, 1, true)
    for _, secret in ipairs({ USER, PASSWORD, "redis://", "127.0.0.1", tostring(port) }) do
      assert.is_nil(a.body:find(secret, 1, true), said)
    end
    if a.route:find("^GET /metrics") then
      assert.matches("^# Redis is unreachable: ", a.body)
    else
      assert.equal("EREDIS", json.decode(a.body).error.code, said)
    end
  end
end

-- The lines of the dashboard's stderr that name its Redis (its URL, the
-- password masked) and say `what`.
local function url_lines(log, port, what)
  local found = {}
  for line in read(log):gmatch("[^\n]+") do
    assert.is_nil(line:find(PASSWORD, 1, true), line)
    if line:find(("redis://%s:***@127.0.0.1:%d/%d"):format(USER, port, DB), 1, true) and line:find(what, 1, true) then
      found[#found + 1] = line
    end
  end
  return found
end

describe("the dashboard while Redis is unreachable #slow", function()
  local server, pid
  after_each(function()
    if pid then os.execute(("kill -KILL %d 2>/dev/null"):format(pid)) end
    if server then server:stop() end
    server, pid = nil, nil
  end)

  it("says so on every route and /metrics without the URL; the URL goes to stderr, once per outage", function()
    -- a server whose port, user and password the URL names; killed at once: nothing listens there
    server = redis_server.start({ extra = ("--user %s on '>%s' '~*' '&*' '+@all'"):format(USER, PASSWORD) })
    server:kill9()
    local url = ("redis://%s:%s@127.0.0.1:%d/%d"):format(USER, PASSWORD, server.port, DB)
    local log = os.tmpname()
    pid = assert(tonumber(helpers.first_line(("%s scripts/moonjob dashboard --redis %s --listen 127.0.0.1:0"
      .. " >/dev/null 2>%s & echo $!"):format(helpers.LUAJIT, url, log))))
    local base
    helpers.wait_for(function()
      assert(helpers.running(pid), "moonjob dashboard exited: " .. read(log))
      base = read(log):match("(http://127%.0%.0%.1:%d+/)")
      return base ~= nil
    end, 20)

    assert_unreachable(fetch_all(base), server.port)
    assert.equal(1, #url_lines(log, server.port, " is unreachable: "), read(log))

    -- Redis comes up: the answers are served again
    server:restart()
    helpers.wait_for(function()
      local out = helpers.sh(("curl -s -m 10 -w ' %%{http_code}' '%sapi/queues'"):format(base))
      return out:match(" 200$") ~= nil
    end, 30)
    assert.equal(1, #url_lines(log, server.port, " is reachable again"), read(log))

    -- and goes: every answer says so again, stderr one outage more
    server:kill9()
    assert_unreachable(fetch_all(base), server.port)
    local said = #url_lines(log, server.port, " is unreachable: ")
    assert.is_true(said >= 2 and said <= 3, read(log)) -- once per reason, not once per request (26 of them)
  end)
end)
