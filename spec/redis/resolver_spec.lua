-- Durable queues on Redis: the resolver (core/parent/redis.c) tries every
-- address a name resolves to, in the resolver's order. This machine's
-- /etc/hosts may map localhost to 127.0.0.1 alone, so the spec runs its
-- client in a mount namespace whose /etc/hosts gives ::1 first, as many
-- systems do, against a server that listens on 127.0.0.1 only.
-- (spec/support/redis_faults.lua: in_namespace; needs root and unshare)
local helpers = require "helpers"
local faults = require "redis_faults"
local redis_server = require "redis_server"

local SCRIPT = [[
local moonjob = require "moonjob"
local h = io.popen("getent ahosts localhost")
print("first " .. ((h:read("*l") or ""):match("^(%%S+)") or "none"))
h:close()
local q, err = moonjob.queue("redis://localhost:%d/0", "resolver", { timeout = 3 })
if not q then print("error " .. tostring(err)) os.exit(1) end
print("connected, waiting " .. tostring(q:counts().waiting))
q:close()
local _, refused = moonjob.queue("redis://localhost:%d/0", "resolver", { timeout = 3 })
print("refused " .. tostring(refused))
]]

local function free_port()
  return assert(tonumber(helpers.first_line([[python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()']])))
end

describe("the Redis resolver #slow", function()
  it("reaches a server on 127.0.0.1 only when localhost gives ::1 first", function()
    local server = redis_server.start() -- --bind 127.0.0.1
    local ok, err = pcall(function()
      local out, status = faults.in_namespace("::1 localhost\n127.0.0.1 localhost\n",
        SCRIPT:format(server.port, free_port()))
      if not out then return print("skipped: mount namespaces need root and unshare") end
      assert.matches("first ::1", out) -- the resolver gives ::1 first there: the spec means something
      assert.matches("connected, waiting 0", out)
      -- nothing listens: every address tried, and the error says which
      assert.matches("refused EREDIS: [^\n]*Connection refused %(tried every address of localhost: ::1, 127%.0%.0%.1%)", out)
      assert.equal(0, status)
    end)
    server:stop()
    assert(ok, err)
  end)

  it("goes on to the next address when the first one does not answer at all", function()
    local server = redis_server.start()
    local hole = faults.black_hole(server.port) -- [::1], same port: SYNs dropped
    local ok, err = pcall(function()
      local script = ([[
local moonjob = require "moonjob"
local q, err = moonjob.queue("redis://localhost:%d/0", "resolver", { timeout = 4 })
print(q and "connected" or ("error " .. tostring(err)))
]]):format(server.port)
      local out, status = faults.in_namespace("::1 localhost\n127.0.0.1 localhost\n", script)
      if not out then return print("skipped: mount namespaces need root and unshare") end
      assert.matches("connected", out) -- within its 4 s: each address has half of them
      assert.equal(0, status)
    end)
    hole.stop()
    server:stop()
    assert(ok, err)
  end)

  it("reaches localhost as this machine resolves it", function()
    local moonjob = require "moonjob"
    local server = redis_server.start()
    local ok, err = pcall(function()
      local q = assert(moonjob.queue(("redis://localhost:%d/0"):format(server.port), "resolver"))
      assert.equal(0, q:counts().waiting)
      q:close()
    end)
    server:stop()
    assert(ok, err)
  end)
end)
