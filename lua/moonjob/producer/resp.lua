-- moonjob.producer.resp -- Redis's wire format (RESP2), written and read by
-- moonjob.producer itself on a socket of the LuaSocket kind (send(text),
-- receive("*l"), receive(n)): LuaSocket's TCP objects (plain Lua; the one a
-- redis-lua client holds) and OpenResty's cosockets alike. Pure Lua.
--
-- Why its own: redis-lua raises on an error reply, and in a pipeline stops
-- reading at the first one, leaving the other replies unread on the
-- connection; OpenResty's clients take a command's arguments as Lua
-- arguments, which LuaJIT bounds at 8,000 (a big flow has more).
--
-- A reply is a string, a number, a list (nil stays nil, so a list may have
-- holes), or nil; an error reply is nil, message, "reply" (inside a list:
-- { err = message }, as moonjob's C client gives it); a failure of the link
-- is nil, why, "connection", after which the socket must be closed (a reply
-- may be left half read).
local M = {}

local concat, format = table.concat, string.format
local math_type = math.type -- (Lua 5.3 and later: integers of their own)

-- A command's argument as text: whole numbers in full, never "1e+15" or
-- "5.0" (tostring's, on some Luas), other numbers with every digit.
function M.text(v)
  if type(v) == "string" then return v end
  if type(v) ~= "number" then return tostring(v) end
  if math_type and math_type(v) == "integer" then return format("%d", v) end
  if v % 1 == 0 and v > -2 ^ 63 and v < 2 ^ 63 then return format("%.0f", v) end
  return format("%.17g", v)
end

-- A command (argv: its name and arguments) as RESP text.
function M.encode(argv)
  local n = #argv
  local out = { "*", n, "\r\n" }
  for i = 1, n do
    local a = M.text(argv[i])
    out[#out + 1] = "$" .. #a .. "\r\n"
    out[#out + 1] = a
    out[#out + 1] = "\r\n"
  end
  return concat(out)
end

local read

-- A list of n replies.
local function read_list(sock, n)
  local list = {}
  for i = 1, n do
    local v, err, kind = read(sock, true)
    if kind == "connection" then return nil, err, kind end
    list[i] = v
  end
  return list
end

-- read(sock [, nested]) -> one reply, as the header says.
function read(sock, nested)
  local line, err = sock:receive("*l")
  if not line then return nil, err, "connection" end
  local prefix, rest = line:sub(1, 1), line:sub(2)
  if prefix == "$" then
    local n = tonumber(rest)
    if not n or n < 0 then return nil end
    local data
    data, err = sock:receive(n + 2)
    if not data then return nil, err, "connection" end
    return data:sub(1, n)
  elseif prefix == ":" then
    return tonumber(rest)
  elseif prefix == "+" then
    return rest
  elseif prefix == "-" then
    if nested then return { err = rest } end
    return nil, rest, "reply"
  elseif prefix == "*" then
    local n = tonumber(rest)
    if not n or n < 0 then return nil end
    return read_list(sock, n)
  end
  return nil, "not a Redis reply: " .. line:sub(1, 80), "connection"
end
M.read = read

-- Sends the commands of list (each an argv) at once and reads their
-- replies -> { { reply, err, kind }, ... } in order; a failure of the link
-- is nil, why (the socket is then to be closed).
function M.pipeline(sock, list)
  local texts = {}
  for i, argv in ipairs(list) do texts[i] = M.encode(argv) end
  local ok, err = sock:send(concat(texts))
  if not ok then return nil, err end
  local out = {}
  for i = 1, #list do
    local v, e, kind = read(sock)
    if kind == "connection" then return nil, e end
    out[i] = { v, e, kind }
  end
  return out
end

return M
