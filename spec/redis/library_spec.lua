-- The Redis function library as its parts make it (moonjob.redis.library,
-- lua/moonjob/redis/functions/*.lua): each part named on its first line
-- and found again from a line of the text (as Redis names one in an error),
-- the main chunk's locals few enough that Redis takes 150 more, no name
-- read that nothing set, and `moonjob library`, the admin's load command,
-- printing exactly the text moonjob loads. Loads go to a real redis-server
-- (spec/support/redis_queue.lua) with redis-cli, as an admin's would.
local cli = require "cli"
local faults = require "redis_faults"
local helpers = require "helpers"
local library = require "moonjob.redis.library"
local redis_server = require "redis_server"
local rq = require "redis_queue"

local REDIS_LOCALS_MAX = 200 -- "main function has more than 200 local variables"

-- The text's lines, by number.
local function lines_of(text)
  local lines = {}
  for line in text:gmatch("([^\n]*)\n") do lines[#lines + 1] = line end
  return lines
end

-- The names a column-0 `local` statement declares (`local a, b = ...`,
-- `local function f`): the part's own block level, where the main chunk's
-- count is kept (a function's body has its own).
local function declared(line)
  local fn = line:match("^local function ([%w_]+)")
  if fn then return 1 end
  local names = line:match("^local ([%w_, ]+)")
  if not names then return 0 end
  return select(2, (names:gsub("=.*$", "")):gsub("[%w_]+", ""))
end

-- The main chunk's top-level locals (before base.lua's do), and the most any
-- part's do-block declares (they count with the top level's while it runs).
local function local_counts()
  local top, most, block = 0, 0, nil -- block: the locals of the part's block so far
  for _, line in ipairs(lines_of(library.text())) do
    if line:match("^%-%- part: ") then
      block = nil
    elseif line == "do" and not block then
      block = 0
    elseif block then
      block = block + declared(line)
      most = math.max(most, block)
    else
      top = top + declared(line)
    end
  end
  return top, most
end

-- The text with n more top-level locals, after its #!lua line.
local function padded(n)
  local pads = {}
  for i = 1, n do pads[i] = ("local pad_%d = %d"):format(i, i) end
  return (library.text():gsub("^([^\n]*\n)", function(shebang) return shebang .. table.concat(pads, "\n") .. "\n" end))
end

-- FUNCTION LOAD REPLACE of text by redis-cli (from a file: the text is
-- longer than one argument may be) -> its first line.
local function load(server, text)
  local path = helpers.write_file(os.tmpname(), text)
  local out = helpers.first_line(("%s -p %d -x FUNCTION LOAD REPLACE < %s 2>&1"):format(redis_server.CLI, server.port, path))
  os.remove(path)
  return out
end

describe("the Redis library's parts", function()
  it("each opens with its -- part: line, and where() finds the part and line of each line of the text", function()
    local text = library.text()
    assert.equal("#!lua name=moonjob\n", text:sub(1, 19))
    local lines = lines_of(text)
    assert.equal(#lines, select(2, text:gsub("\n", "")))
    local seen = {}
    for _, name in ipairs(library.PARTS) do
      local f = assert(io.open("lua/moonjob/redis/functions/" .. name .. ".lua"))
      assert.equal("-- part: " .. name .. ".lua", f:read("*l"))
      f:close()
    end
    assert.is_nil(library.where(1)) -- the #!lua line
    for n = 2, #lines do
      local part, line, path = library.where(n)
      assert.truthy(part, "line " .. n)
      local f = seen[path] or lines_of(assert(io.open(path)):read("*a"))
      seen[path] = f
      assert.equal(f[line], lines[n], ("line %d: %s:%d"):format(n, part, line))
      if line == 1 then assert.equal("-- part: " .. part, lines[n]) end
    end
    assert.is_nil(library.where(#lines + 1))
    local n = 0
    for _ in pairs(seen) do n = n + 1 end
    assert.equal(#library.PARTS, n)
  end)

  it("joins every part file of its folder, each once", function()
    local listed, found = {}, {}
    for _, name in ipairs(library.PARTS) do
      assert.is_nil(listed[name .. ".lua"], name .. " is listed twice")
      listed[name .. ".lua"] = true
    end
    local p = io.popen("ls lua/moonjob/redis/functions")
    for file in p:lines() do found[file] = true end
    p:close()
    assert.same(found, listed)
  end)

  it("keeps each part under 500 lines, and version() in register.lua", function()
    for _, name in ipairs(library.PARTS) do
      local f = assert(io.open("lua/moonjob/redis/functions/" .. name .. ".lua"))
      local count = select(2, f:read("*a"):gsub("\n", ""))
      f:close()
      assert.is_true(count <= 500, name .. ": " .. count .. " lines")
    end
    assert.equal("12", library.version())
    assert.equal("8", library.oldest_client())
    local text = library.text()
    local before = text:sub(1, text:find('local VERSION, OLDEST_CLIENT = "', 1, true) - 1)
    assert.equal("register.lua", (library.where(select(2, before:gsub("\n", "")) + 1)))
  end)

  it("reads no global that Redis's Lua lacks, and sets none", function()
    local bc = require "jit.bc"
    local fn = assert(loadstring((library.text():gsub("^#![^\n]*", "")), "=library"))
    local listing = {}
    bc.dump(fn, { write = function(_, s) listing[#listing + 1] = s end, flush = function() end }, true)
    local read, set = {}, {}
    for op, name in table.concat(listing):gmatch("(G[GS]ET)[^\n]-; \"([^\"]+)\"") do
      (op == "GGET" and read or set)[name] = true
    end
    assert.same({}, set)
    local allowed = { redis = true, cjson = true, cmsgpack = true, math = true, string = true, table = true, tonumber = true,
      tostring = true, type = true, pairs = true, ipairs = true, unpack = true, pcall = true, assert = true,
      error = true }
    for name in pairs(read) do assert.is_true(allowed[name] == true, "the library reads the global " .. name) end
  end)

  it("sets each H, S, L, G, F entry it reads, those read as it loads before they are read", function()
    local lines = lines_of(library.text())
    local set_at = {} -- "T.name" -> line
    for n, line in ipairs(lines) do
      local lhs = line:match("^([HSLGF]%.[%w_., ]-) = ")
      for name in (lhs or ""):gmatch("[HSLGF]%.[%w_]+") do set_at[name] = set_at[name] or n end
      local fn = line:match("^function ([HSLGF]%.[%w_]+)")
      if fn then set_at[fn] = set_at[fn] or n end
    end
    for n, line in ipairs(lines) do
      local code = line:gsub("%-%-.*$", "")
      local at_load = code:match("^local .* = [HSL]%.") or code:match("^redis%.register_function")
      if not code:match("^[HSLGF]%.[%w_., ]- = ") then
        for name in code:gmatch("%f[%w_][HSLGF]%.[%w_]+") do
          assert.truthy(set_at[name], ("line %d (%s:%d) reads %s, which no part sets"):format(n,
            library.where(n), select(2, library.where(n)), name))
          if at_load then assert.is_true(set_at[name] < n, ("line %d reads %s before it is set"):format(n, name)) end
        end
      end
    end
  end)

  it("keeps copies equal to moonjob.redis.names' of what both sides share", function()
    local names = require "moonjob.redis.names"
    local text = library.text()
    local function copy(name) -- the value of the library's `local NAME = value -- comment`
      local expr = assert(text:match("\nlocal " .. name .. " = ([^\n]*)"), name)
      return assert(loadstring("return " .. expr:gsub("%s*%-%-.*$", "")))()
    end
    for _, name in ipairs({ "REGISTRY", "PAUSED", "RUN_MS_MARK", "SECONDS_MAX", "ATTEMPTS_MAX",
      "ADDED_KEEP_MS", "RUN_BUCKETS_PER_DOUBLING", "RUN_BUCKET_DOUBLINGS" }) do
      assert.equal(names[name], copy(name), name)
    end
  end)

  it("explains a Redis error's user_function:N lines with their part and line", function()
    local lines = lines_of(library.text())
    local n
    for i, line in ipairs(lines) do if line == "-- part: groups.lua" then n = i + 3 end end
    local placed = ("user_function:%d (groups.lua:4)"):format(n)
    assert.equal(("ERR %s: x script: f, on @%s."):format(placed, placed),
      library.explain(("ERR user_function:%d: x script: f, on @user_function:%d."):format(n, n)))
    assert.equal("ERR user_function:1: x", library.explain("ERR user_function:1: x"))
    assert.equal("no line", library.explain("no line"))
  end)
end)

rq.describe(function()
  describe("the library in a real Redis", function()
    it("has few top-level locals: it loads with 150 more, and with all the room its largest part leaves", function()
      local server = rq.server()
      local top, most = local_counts()
      assert.is_true(top < 60, top .. " top-level locals")
      local room = REDIS_LOCALS_MAX - top - most
      assert.is_true(room >= 150, ("room for %d locals (%d top-level, the largest part %d)"):format(room, top, most))
      assert.equal("moonjob", load(server, padded(150)))
      assert.equal("12", server:cli("FCALL", "moonjob_version", "0"))
      assert.equal("180000", server:cli("FCALL", "moonjob_cron", "1", "mj:{lib}:", "3 * * * *", "0", "0", "1"))
      -- the count above is Redis's: one more than the room is refused
      assert.equal("moonjob", load(server, padded(room)))
      assert.matches("more than 200 local variables", load(server, padded(room + 1)))
      assert.equal("moonjob", load(server, library.text()))
    end)

    it("writes the run-time buckets' bounds as moonjob.redis.names does, text for text", function()
      local server = rq.server()
      assert.equal("moonjob", load(server, library.text()))
      local names = require "moonjob.redis.names"
      local want = {}
      for k = 0, #names.RUN_BOUNDS_MS - 1 do want[#want + 1] = names.run_bound(k) end
      local reply = server:cli("FCALL", "moonjob_metrics", "1", "mj:{lib}:", "1", "fine")
      local bounds = {}
      for line in reply:gmatch("[^\n]+") do bounds[#bounds + 1] = line end
      -- (redis-cli prints the reply's elements one a line: first minute, the bounds, rows of zeros)
      assert.same(want, { unpack(bounds, 2, #want + 1) })
    end)

    it("names the part of a line Redis refuses", function()
      local server = rq.server()
      local lines = lines_of(library.text())
      local at
      for i, line in ipairs(lines) do if line == "-- part: limits.lua" then at = i + 1 end end
      lines[at] = "local broken = = 1"
      local err = load(server, table.concat(lines, "\n") .. "\n")
      assert.matches("user_function:" .. at .. ":", err, 1, true)
      assert.matches(("user_function:%d (limits.lua:2)"):format(at), library.explain(err), 1, true)
      assert.equal("moonjob", load(server, library.text()))
    end)

    it("is what `moonjob library` prints, and what the admin's pipe into redis-cli loads", function()
      local server = rq.server()
      local out, err, status = helpers.sh(cli.MOONJOB .. "library")
      assert.equal(0, status, err)
      assert.equal(library.text(), out)
      assert.equal("OK", server:cli("FUNCTION", "FLUSH"))
      faults.load_library(server) -- moonjob library | redis-cli -x FUNCTION LOAD REPLACE
      assert.equal("12", server:cli("FCALL", "moonjob_version", "0"))
      local listed = server:cli("FUNCTION", "LIST", "LIBRARYNAME", "moonjob")
      assert.matches("moonjob_fetch", listed, 1, true)
      local part, line, path = library.where(1234)
      out, err, status = helpers.sh(cli.MOONJOB .. "library --line 1234")
      assert.equal(0, status, err)
      assert.equal(("%s:%d\n"):format(path, line), out)
      assert.matches("/functions/" .. part .. ":", out, 1, true)
      out, err, status = helpers.sh(cli.MOONJOB .. "library --line 1")
      assert.equal(2, status)
      assert.equal("", out)
      assert.matches("line 1 is not in a part of the library", err, 1, true)
    end)
  end)
end)
