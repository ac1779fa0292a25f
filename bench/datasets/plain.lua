-- bench/datasets/plain.lua -- the plain loop moonjob is measured against:
-- one LuaJIT process that decodes each NDJSON line with lua-cjson, calls the
-- processor, encodes its result and writes the result line moonjob run
-- writes ({"line":N,"status":"completed","result":...}). GNU parallel and
-- xargs run it too, on their parts of the input.
-- Usage: [PLAIN_ENCODE=cjson] luajit bench/datasets/plain.lua PROCESSOR [FILE]  (stdin without FILE)
--
-- The result is encoded with moonjob's own encoder (moonjob.codec.json), not
-- cjson's: so the loop writes its results as moonjob run does, the same
-- code making the same bytes for the same value (cjson writes numbers and
-- escapes otherwise, and its cost would differ), and the difference left
-- is the decoder, the user's choice the comparison is about. What still
-- differs: "ms" is 0 here; cjson reads the 19-digit ids as doubles, so this
-- loop's ids are not exact (1.7000000017234716e+18, moonjob's
-- 1700000001723471715); and key order, which follows each table.
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
package.path = here .. "../../lua/?.lua;" .. here .. "../../lua/?/init.lua;" .. package.path

local cjson = require "cjson"
local json = require "moonjob.codec.json"
local process = dofile(assert(arg[1], "usage: plain.lua PROCESSOR [FILE]"))
-- PLAIN_ENCODE=cjson: the results written by cjson.encode, as a user's own
-- LuaJIT + cjson script would (faster; not moonjob's bytes: lua-cjson 2.1
-- writes 14 digits of a number, escapes "/", orders keys as each table does)
local decode, encode = cjson.decode, os.getenv("PLAIN_ENCODE") == "cjson" and cjson.encode or json.encode

local out = io.stdout
out:setvbuf("full")
local n = 0
for line in (arg[2] and io.lines(arg[2]) or io.stdin:lines()) do
  n = n + 1
  local result = assert(encode(process({ data = decode(line), id = n, name = "line " .. n })))
  out:write('{"line":', n, ',"status":"completed","result":', result, ',"attempts":1,"ms":0}\n')
end
out:flush()
