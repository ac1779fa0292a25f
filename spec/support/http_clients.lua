-- spec/support/http_clients.lua -- HTTP clients for the core's server spec,
-- run as background processes so that the loop runs while they talk.
--
-- curl(dir, args): curl with `args` (a shell-quoted string), its output in
-- files under dir; raw(dir, port, text, after): bash's /dev/tcp, writes
-- `text` on a connection to 127.0.0.1:port, then runs `after` (default: read
-- everything the server sends until it closes). Each returns a client:
-- client.done() is true once the process ended, client.result() gives its
-- stdout, stderr and exit status. Every command has a time bound of its own:
-- no client outlives a spec for long.
local M = {}

local count = 0

local function slurp(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

local function start(dir, command)
  count = count + 1
  local base = ("%s/client%d"):format(dir, count)
  local f = assert(io.open(base .. ".sh", "wb"))
  f:write(command, "\n")
  f:close()
  os.execute(("(bash %s.sh >%s.out 2>%s.err </dev/null; echo $? >%s.tmp; mv %s.tmp %s.rc) 2>/dev/null &")
    :format(base, base, base, base, base, base))
  local client = { base = base }
  function client.done() return slurp(base .. ".rc") ~= nil end
  function client.result()
    return slurp(base .. ".out"), slurp(base .. ".err"), tonumber(slurp(base .. ".rc"))
  end
  return client
end

function M.curl(dir, args)
  return start(dir, "exec timeout 20 curl -sS " .. args)
end

function M.raw(dir, port, text, after)
  count = count + 1
  local request = ("%s/request%d"):format(dir, count)
  local f = assert(io.open(request, "wb"))
  f:write(text)
  f:close()
  return start(dir, ("exec 3<>/dev/tcp/127.0.0.1/%d || exit 9\ncat %s >&3\n%s")
    :format(port, request, after or "exec timeout 20 cat <&3"))
end

return M
