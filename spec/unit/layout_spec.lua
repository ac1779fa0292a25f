-- The map stays true: docs/ARCHITECTURE.md's table names every source file
-- (and only files that exist), each pool part calls only the parts its
-- header's `Calls:` line names, a pool option's default lives in
-- pool/options.lua (Options.DEFAULTS), not where the option is read, and
-- no Lua module grows past the sizes the house keeps to (600 lines a file,
-- 80 a function). Read as text: no module is loaded.
local ARCHITECTURE = "docs/ARCHITECTURE.md"
local FILE_LINES_MAX, FUNCTION_LINES_MAX = 600, 80

local function read(path)
  local f = assert(io.open(path, "rb"))
  local text = f:read("*a")
  f:close()
  return text
end

local function lines_of(path)
  local list = {}
  for line in io.lines(path) do list[#list + 1] = line end
  return list
end

local function find(command)
  local list, p = {}, io.popen(command)
  for line in p:lines() do list[#list + 1] = line end
  p:close()
  return list
end

-- The source files the table must name: the C core, the Lua modules, the
-- dashboard's page.
local function source_files()
  return find("find core lua/moonjob -type f \\( -name '*.c' -o -name '*.h' -o -name '*.lua' "
    .. "-o -path '*/static/*' \\) | sort")
end

-- The table rows of the "## Files" section, each with the prefix its
-- subsection's heading gives (`core/`, `lua/moonjob/`, or the root).
local function file_rows()
  local rows, prefix, in_files = {}, nil, false
  for line in read(ARCHITECTURE):gmatch("[^\n]*") do
    if line:match("^## ") then in_files = line:match("^## Files") ~= nil end
    if in_files and line:match("^### ") then
      prefix = line:match("`([^`]*/)`") or ""
    elseif in_files and prefix and line:match("^| `") then
      rows[#rows + 1] = { prefix = prefix, first = line:match("^|([^|]*)|"), text = line }
    end
  end
  return rows
end

local function glob_match(pattern, path)
  local lua_pattern = "^" .. pattern:gsub("[%.%-%+]", "%%%0"):gsub("%*", "[^/]*") .. "$"
  return path:match(lua_pattern) ~= nil
end

-- True when a row names path: its own entry (a glob too), or a folder entry
-- (`dir/`) whose row names the file's base name.
local function row_names(row, path)
  for entry in row.first:gmatch("`([^`]+)`") do
    local full = row.prefix .. entry
    if full == path or (entry:find("*", 1, true) and glob_match(full, path)) then return true end
    if entry:sub(-1) == "/" and path:sub(1, #full) == full then
      local base = path:match("[^/]+$")
      if row.text:find("`" .. base .. "`", 1, true) or row.text:find("`" .. base:gsub("%.%w+$", "") .. "`", 1, true)
      then return true end
    end
  end
  return false
end

------------------------------------------------------------ pool parts ---

-- field -> module file name, for the parts Pool.new makes (pool/init.lua:
-- `local Name = require "moonjob.pool.file"` and `self.field = Name.new...`).
local function pool_parts()
  local init = read("lua/moonjob/pool/init.lua")
  local modules, parts = {}, {}
  for var, file in init:gmatch('local (%w+) = require "moonjob%.pool%.([%w_]+)"') do modules[var] = file end
  for field, var in init:gmatch("self%.([%w_]+) = (%w+)%.new") do
    if modules[var] then parts[field] = modules[var] end
  end
  for field, var in init:gmatch("\n%s+([%w_]+) = (%w+)%.new_local") do -- source = Source.new_local(...)
    if modules[var] then parts[field] = modules[var] end
  end
  return parts
end

-- A file's header: its leading comment lines, joined.
local function header(lines)
  local out = {}
  for _, line in ipairs(lines) do
    if not line:match("^%-%-") then break end
    out[#out + 1] = line:gsub("^%-%-%s?", "")
  end
  return table.concat(out, "\n")
end

-- The header's Calls: text ("Calls:" or "Calls, for x:", up to the next
-- label or the header's end).
local function calls_text(head)
  local from, to = head:find("Calls[^:\n]*:")
  if not from then return nil end
  local rest = head:sub(to + 1)
  local stop = rest:find("\n%u%w+:") or rest:find("\n\n")
  return stop and rest:sub(1, stop) or rest
end

-- A line's code: no comment, no string literal.
local function code_of(line)
  return (line:gsub('"[^"]*"', '""'):gsub("'[^']*'", "''"):gsub("%-%-.*$", ""))
end

-- The parts a file's code reaches through the pool (`pool.dispatch:pump()`,
-- `local b = self.pool.breaker`, ...).
local function parts_called(lines, parts)
  local called = {}
  for _, line in ipairs(lines) do
    for field in code_of(line):gmatch("%f[%w_]pool%.([%w_]+)%f[^%w_]") do
      if parts[field] then called[field] = true end
    end
  end
  return called
end

--------------------------------------------------------- option defaults ---

-- The pool's option names (pool/options.lua's OPTIONS table).
local function option_names()
  local text = read("lua/moonjob/pool/options.lua")
  local body = assert(text:match("\nlocal OPTIONS = (%b{})"), "pool/options.lua: no OPTIONS table")
  local names = {}
  for name in body:gmatch("([%w_]+) = \"") do names[name] = true end
  return names
end

-- What may follow `opts.NAME or`: a default read from pool/options.lua.
local FROM_OPTIONS = { "^DEFAULTS%.", "^REDIS_DEFAULTS%.", "^Options%." }

local function from_options(after)
  for _, pattern in ipairs(FROM_OPTIONS) do
    if after:match(pattern) then return true end
  end
  return false
end

-- Lines of the files that read a pool's options where anything but a
-- default from pool/options.lua follows `opts.NAME or` (a number, a
-- string, true, a call, another option...).
local function defaults_outside(files, names)
  local found = {}
  for _, path in ipairs(files) do
    for i, line in ipairs(lines_of(path)) do
      local code = line:gsub("%-%-.*$", "")
      for name, at in code:gmatch("opts%.([%w_]+)%s+or%s+()") do
        local after = code:sub(at)
        local default = from_options(after) and after:match("^[%w_%.]+%s*(.*)$")
        local chained = default and default:match("^or%f[^%w_]") -- `or DEFAULTS.x or 30`
        if names[name] and (not default or chained) then
          found[#found + 1] = ("%s:%d: %s"):format(path, i, name)
        end
      end
    end
  end
  return found
end

----------------------------------------------------------------- sizes ---

-- The functions of a Lua file longer than `max` lines, from the line
-- ranges LuaJIT records for each function it compiles (the file is compiled,
-- not run).
local jutil = require "jit.util"
local function long_functions(path, max)
  local long = {}
  local function walk(proto)
    local info = jutil.funcinfo(proto)
    local lines = info.lastlinedefined - info.linedefined + 1
    if info.linedefined > 0 and lines > max then
      long[#long + 1] = ("%s:%d (%d lines)"):format(path, info.linedefined, lines)
    end
    local i = -1
    while true do -- the function's constants, the functions inside it among them
      local k = jutil.funck(proto, i)
      if k == nil then break end
      if type(k) == "proto" then walk(k) end
      i = i - 1
    end
  end
  walk(assert(loadfile(path)))
  return long
end

describe("the map of the code", function()
  it("docs/ARCHITECTURE.md's table names every source file", function()
    local rows, missing = file_rows(), {}
    for _, path in ipairs(source_files()) do
      local named = false
      for _, row in ipairs(rows) do
        if row_names(row, path) then named = true; break end
      end
      if not named then missing[#missing + 1] = path end
    end
    assert.same({}, missing)
  end)

  it("docs/ARCHITECTURE.md's table names no file that is not there", function()
    local gone = {}
    for _, row in ipairs(file_rows()) do
      for entry in row.first:gmatch("`([^`]+)`") do
        local path = row.prefix .. entry
        if not entry:find("*", 1, true) and entry:match("%.%a+$") and not io.open(path) then
          gone[#gone + 1] = path
        end
      end
    end
    assert.same({}, gone)
  end)

  it("each pool part calls only the parts its Calls: line names", function()
    local parts, wrong = pool_parts(), {}
    assert.truthy(parts.dispatch and parts.children and parts.endings, "Pool.new's parts not found")
    for _, path in ipairs(find("ls lua/moonjob/pool/*.lua")) do
      local lines = lines_of(path)
      local calls = calls_text(header(lines))
      local own = path:match("([%w_]+)%.lua$")
      if not calls and own ~= "init" then
        wrong[#wrong + 1] = path .. " has no Calls: line in its header (\"Calls: nothing.\" will do)"
      elseif calls then
        for field in pairs(parts_called(lines, parts)) do
          if parts[field] ~= own and not calls:find("%f[%w_]" .. field .. "%f[^%w_]") then
            wrong[#wrong + 1] = ("%s calls pool.%s, not named in its Calls: line"):format(path, field)
          end
        end
      end
    end
    table.sort(wrong)
    assert.same({}, wrong)
  end)

  it("keeps a pool option's default in pool/options.lua", function()
    local files = find("ls lua/moonjob/pool/*.lua lua/moonjob/redis/remote.lua lua/moonjob/redis/reports.lua "
      .. "lua/moonjob/redis/updates.lua 2>/dev/null | grep -v pool/options.lua")
    assert.same({}, defaults_outside(files, option_names()))
  end)

  it("finds a default put where the option is read (the check can fail)", function()
    local path = os.tmpname()
    local f = assert(io.open(path, "w"))
    f:write("local lease = opts.lease or 30\nlocal size = opts.size or DEFAULTS.size\n",
      "local echo = opts.echo or true\nlocal codec = opts.codec or (opts.redis and 'json')\n",
      "local k, l = opts.keep or REDIS_DEFAULTS.keep, opts.lease or 30\n",
      "local p = opts.poll or REDIS_DEFAULTS.poll or 1\n")
    f:close()
    local found = defaults_outside({ path }, option_names())
    os.remove(path)
    assert.same({ path .. ":1: lease", path .. ":3: echo", path .. ":4: codec", path .. ":5: lease",
      path .. ":6: poll" }, found)
  end)

  it("keeps every Lua module under lua/ within 600 lines, and its functions within 80", function()
    local long = {}
    for _, path in ipairs(find("find lua -name '*.lua' | sort")) do
      local n = #lines_of(path)
      if n > FILE_LINES_MAX then long[#long + 1] = ("%s (%d lines)"):format(path, n) end
      for _, fn in ipairs(long_functions(path, FUNCTION_LINES_MAX)) do long[#long + 1] = fn end
    end
    assert.same({}, long)
  end)

  it("has no class extended from another file", function()
    local real = {}
    for _, hit in ipairs(find("grep -rn 'extend(' lua --include='*.lua' || true")) do
      local code = hit:match("^[^:]+:%d+:(.*)$"):gsub("%-%-.*$", "")
      if code:find("extend(", 1, true) then real[#real + 1] = hit end
    end
    assert.same({}, real)
  end)
end)
