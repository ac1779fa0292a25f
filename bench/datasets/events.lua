-- bench/datasets/events.lua -- the web-log events' processor: a few string
-- operations per event (the path split into section and page, the method
-- lower-cased, the user agent classified, the hour and the status class
-- read), returning a table of 9 fields; the same file for moonjob and for
-- the plain loop.
local find, lower, match, sub = string.find, string.lower, string.match, string.sub

local function agent_kind(agent)
  if find(agent, "bot", 1, true) then return "bot" end
  if find(agent, "Mobile", 1, true) then return "mobile" end
  if find(agent, "Mozilla/", 1, true) then return "browser" end
  return "tool"
end

return function(job)
  local d = job.data
  local path = d.path
  local query = find(path, "?", 1, true)
  if query then path = sub(path, 1, query - 1) end
  local section, page = match(path, "^/([^/]+)/([^/]+)")
  return {
    ip = d.ip,
    method = lower(d.method),
    section = section,
    page = page,
    query = query ~= nil,
    status_class = (d.status - d.status % 100) / 100,
    kb = d.bytes / 1024,
    agent = agent_kind(d.agent),
    hour = tonumber(sub(d.time, 12, 13)),
  }
end
