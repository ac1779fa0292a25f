-- moonjob.cli.dashboard -- `moonjob dashboard [--redis URL] [--listen HOST:PORT] [--token T]`:
-- serves the web dashboard (moonjob.dashboard) until SIGTERM, SIGINT or
-- SIGHUP, then exits 0. It says on stderr where it listens. The token may
-- come from MOONJOB_DASHBOARD_TOKEN (read once, then wiped from the
-- process's environment block, as MOONJOB_REDIS is): a --token is visible to
-- every process of the machine through `ps`.
local core = require "moonjob.core"
local loop = require "moonjob.loop"
local stops = require "moonjob.cli.stops"

local M = {}

local function say(...)
  io.stderr:write("moonjob dashboard: ", ...)
  io.stderr:write("\n")
end

function M.run(o)
  local token = os.getenv("MOONJOB_DASHBOARD_TOKEN")
  if token then core.scrub_env("MOONJOB_DASHBOARD_TOKEN") end
  local server, err = require("moonjob.dashboard").start({ redis = o.redis, listen = o.listen,
    token = o.token or token })
  if not server then
    say(tostring(err))
    return stops.EXIT_USAGE
  end
  say(("http://%s/%s (Ctrl-C to stop)"):format(server:address(), server.token and "?token=..." or ""))
  core.hold_stop_signals()
  pcall(loop.wait_until, function() return false end)
  server:close()
  return stops.EXIT_OK
end

return M
