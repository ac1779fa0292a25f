-- spec/support/pure_lua.lua -- runs a piece of Lua under another
-- interpreter (luajit, lua5.2, lua5.3, lua5.4), as a plain Lua program that uses
-- moonjob.producer would: moonjob's modules from this checkout's lua/, the
-- system's Lua libraries (lua-socket, lua-redis, lua-cjson), and nothing
-- of moonjob's build (no core.so, no FFI codec).
--
--   local out, err, status = pure_lua.run("lua5.4", port, [[
--     local q = assert(producer.queue({ port = PORT }, "q"))
--     print(q:add({ n = 1 }).id)
--   ]])
--
-- The piece sees `producer` (moonjob.producer), PORT, and say(...) (print
-- with tostring on each value, tab-separated). After it the program prints
-- "pure" when neither moonjob.core nor the FFI was loaded.
local helpers = require "helpers"

local M = {}

-- The interpreters of the specs: LuaJIT and two PUC Luas (Debian's packages).
M.INTERPRETERS = { "luajit", "lua5.2", "lua5.3", "lua5.4" }

-- Debian packages redis-lua for Lua 5.1 to 5.3 only. (Not Debian's lua5.1:
-- with it installed, LuaRocks' 5.1 tree runs lua5.1 rather than LuaJIT, and
-- the install spec's `luarocks make` would make a moonjob command without the FFI.)
M.HAS_REDIS_LUA = { luajit = true, ["lua5.2"] = true, ["lua5.3"] = true }

local PRELUDE = [[
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
producer = require "moonjob.producer"
PORT = %d
function say(...)
  local t = {}
  for i = 1, select("#", ...) do t[i] = tostring((select(i, ...))) end
  print(table.concat(t, "\t"))
end
]]

local CODA = [[
if package.loaded["moonjob.core"] == nil and package.loaded.ffi == nil then print("pure") end
]]

-- run(interpreter, port, body) -> stdout, stderr, exit status.
function M.run(interpreter, port, body)
  local path = os.tmpname()
  helpers.write_file(path, PRELUDE:format(port) .. "do\n" .. body .. "\nend\n" .. CODA)
  local out, err, status = helpers.sh(("env -u LUA_PATH -u LUA_CPATH %s %s"):format(interpreter, path))
  os.remove(path)
  return out, err, status
end

-- The lines of out, each split at tabs: { { "a", "b" }, ... }.
function M.rows(out)
  local rows = {}
  for line in out:gmatch("[^\n]+") do
    local row = {}
    for cell in (line .. "\t"):gmatch("([^\t]*)\t") do row[#row + 1] = cell end
    rows[#rows + 1] = row
  end
  return rows
end

return M
