-- spec/support/flow_runs.lua -- what the flow specs share: `moonjob worker`
-- processes of the flow fixture (spec/fixtures/flow.lua), its trace file
-- read back, and a server's keys.
--
--   local fr = require "flow_runs"
--   local pid, log = fr.worker(server, "{shop}/images", "-j 2")   -- connected
--   local t = fr.trace(path)    -- t.starts[name], t.ends[name]: line numbers
local helpers = require "helpers"
local rf = require "redis_workers"

local M = {}

M.FLOW = helpers.abs(helpers.fixture("flow.lua"))

-- A `moonjob worker` of the flow fixture on queue, connected; -> pid,
-- its stderr's path. Ended after the test (rf.close_all).
function M.worker(server, queue, args)
  local pid, log = rf.worker(server, queue, args or "-j 4", M.FLOW)
  helpers.wait_for(function() return rf.read(log):find("connected to", 1, true) end, 20)
  return pid, log
end

-- The trace file's lines (the fixture's trace option): for each job's
-- name, the numbers of its start lines and of its end lines.
function M.trace(path)
  local t = { starts = {}, ends = {}, lines = rf.lines(path) }
  for i, line in ipairs(t.lines) do
    local what, name = line:match("^(%a+) (%S+)")
    local list = what == "start" and t.starts or t.ends
    list[name] = list[name] or {}
    table.insert(list[name], i)
  end
  return t
end

function M.count(list) return list and #list or 0 end

-- The server's keys that match pattern, sorted.
function M.keys(server, pattern)
  local out = {}
  for k in server:cli("KEYS", pattern):gmatch("[^\n]+") do out[#out + 1] = k end
  table.sort(out)
  return out
end

-- A path no file has yet (for the fixture's touch and gate options).
function M.no_file()
  local path = os.tmpname()
  os.remove(path)
  return path
end

return M
