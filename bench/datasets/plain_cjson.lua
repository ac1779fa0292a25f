-- bench/datasets/plain_cjson.lua -- the plainest loop: plain.lua's, its
-- results encoded with lua-cjson too (cjson.encode), as a user's own
-- LuaJIT + cjson script would. Faster than plain.lua, whose encoder writes
-- moonjob's bytes; not the same bytes (lua-cjson 2.1 writes 14 digits of a
-- number, escapes "/", orders keys as each table does). The light-lines
-- goal (moonjob run -j 2 at 1.4x one plain process) is judged against both.
-- Usage: luajit bench/datasets/plain_cjson.lua PROCESSOR [FILE]  (stdin without FILE)
local cjson = require "cjson"
local process = dofile(assert(arg[1], "usage: plain_cjson.lua PROCESSOR [FILE]"))
local decode, encode = cjson.decode, cjson.encode

local out = io.stdout
out:setvbuf("full")
local n = 0
for line in (arg[2] and io.lines(arg[2]) or io.stdin:lines()) do
  n = n + 1
  local result = assert(encode(process({ data = decode(line), id = n, name = "line " .. n })))
  out:write('{"line":', n, ',"status":"completed","result":', result, ',"attempts":1,"ms":0}\n')
end
out:flush()
