-- moonjob.redis.library -- the text of moonjob's Redis function library:
-- its parts (the folder functions/ beside this file: installed with it by
-- `make install` and LuaRocks) joined in a fixed order after the
-- `#!lua name=moonjob` line, read once per process. One library, in parts:
-- Redis refuses a main chunk of more than 200 locals, and each part keeps
-- its own in a do ... end block (functions/base.lua says how they share).
--
--   library.text()      -> the library, as FUNCTION LOAD takes it
--   library.version()   -> what its moonjob_version answers ("8")
--   library.oldest_client() -> the oldest moonjob version it serves
--   library.where(n)    -> the part and the line in it of the text's line n
--   library.explain(e)  -> a Redis error with its user_function:N lines placed
--
-- `moonjob library` prints the text (an admin's `moonjob library | redis-cli
-- -x FUNCTION LOAD REPLACE`); `moonjob library --line N` says where line N is.
local M = {}

-- The parts, in the order they are joined: each takes from the ones before.
M.PARTS = { "base", "metrics", "states", "cron", "add", "bulk", "schedules", "limits", "groups", "fetch", "runs",
  "flows", "workers", "views", "operate", "register" }

M.SHEBANG = "#!lua name=moonjob"

-- This file's folder, from where it was loaded (a checkout or an installed
-- tree), else from package.path.
local function own_dir()
  local source = debug.getinfo(1, "S").source
  local path = source:sub(1, 1) == "@" and source:sub(2)
    or (package.searchpath and package.searchpath("moonjob.redis.library", package.path)) -- (Lua 5.1: none)
  assert(path, "moonjob.redis.library: cannot tell where this module is")
  return path:match("^(.*)/[^/]*$") or "."
end

local DIR = own_dir() .. "/functions/"

local text, version, oldest, parts -- parts: { { name, path, first line, line count } } in order

local function read_part(name)
  local path = DIR .. name .. ".lua"
  local f = io.open(path, "rb")
  if not f then
    error(("moonjob.redis.library: the library's part %s is missing (installed beside moonjob?)"):format(path), 0)
  end
  local body = f:read("*a")
  f:close()
  local first = "-- part: " .. name .. ".lua"
  if body:sub(1, #first + 1) ~= first .. "\n" then
    error(("moonjob.redis.library: %s must open with the line '%s'"):format(path, first), 0)
  end
  if body:sub(-1) ~= "\n" then body = body .. "\n" end
  return path, body
end

local function assemble()
  local pieces, line = { M.SHEBANG, "\n" }, 2
  parts = {}
  for _, name in ipairs(M.PARTS) do
    local path, body = read_part(name)
    local lines = select(2, body:gsub("\n", ""))
    parts[#parts + 1] = { name = name .. ".lua", path = path, first = line, count = lines }
    pieces[#pieces + 1] = body
    line = line + lines
  end
  text = table.concat(pieces)
  version, oldest = text:match('local VERSION, OLDEST_CLIENT = "(%d+)", "(%d+)"')
  if not version then
    error("moonjob.redis.library: register.lua must declare local VERSION, OLDEST_CLIENT = \"N\", \"M\"", 0)
  end
end

-- library.text() -> the assembled library (the same text for the process's life)
function M.text()
  if not text then assemble() end
  return text
end

-- library.version() -> the version its moonjob_version answers ("8")
function M.version()
  if not text then assemble() end
  return version
end

-- library.oldest_client() -> the oldest moonjob version whose calls it
-- serves ("8"): what `FCALL moonjob_version 0 oldest` answers
function M.oldest_client()
  if not text then assemble() end
  return oldest
end

-- library.where(n) -> the part's file name ("groups.lua"), the line in it,
-- and the part's path, for line n of the text; nil for line 1 (the
-- shebang) or a line beyond the text.
function M.where(n)
  if not text then assemble() end
  for _, part in ipairs(parts) do
    if n >= part.first and n < part.first + part.count then
      return part.name, n - part.first + 1, part.path
    end
  end
  return nil
end

-- library.explain(message) -> message with each "user_function:N" (a line of
-- the text, as Redis names it in an error) followed by its part and line:
-- "user_function:1234 (groups.lua:57)".
function M.explain(message)
  if type(message) ~= "string" then return message end
  return (message:gsub("user_function:(%d+)", function(n)
    local name, line = M.where(tonumber(n))
    if name then return ("user_function:%s (%s:%d)"):format(n, name, line) end
  end))
end

return M
