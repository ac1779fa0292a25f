-- dashboard_http -- a request to a dashboard server (moonjob.dashboard) the
-- spec's own loop runs: curl in the background while the loop turns, for
-- the specs of spec/dashboard/.
local helpers = require "helpers"

-- http(server, method, path [, headers [, body]]) -> status, body. path is
-- sent as written (-g: braces are not curl's globs; percent-encode what
-- the URL needs encoded).
return function(server, method, path, headers, body)
  local out = os.tmpname()
  local args = { "curl -g -s -o " .. out .. " -w '%{http_code}' -X " .. method }
  for k, v in pairs(headers or {}) do args[#args + 1] = ("-H '%s: %s'"):format(k, v) end
  if body then args[#args + 1] = "--data-binary '" .. body:gsub("'", "'\\''") .. "'" end
  args[#args + 1] = "'http://" .. server:address() .. path .. "'"
  local code_file = os.tmpname()
  local pid = tonumber(helpers.first_line(table.concat(args, " ") .. " >" .. code_file .. " 2>/dev/null & echo $!"))
  helpers.wait_for(function() return not helpers.running(pid) end, 20)
  local status = tonumber(helpers.first_line("cat " .. code_file))
  local f = io.open(out, "rb")
  local text = f and f:read("*a") or ""
  if f then f:close() end
  os.remove(out); os.remove(code_file)
  return status, text
end
