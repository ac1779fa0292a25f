-- bench/datasets/gen.lua -- writes the two datasets of bench/datasets.lua,
-- deterministically (the same bytes on every run and machine):
--   records.ndjson  RECORDS lines of about 485 bytes: a 19-digit integer id,
--                   a user, an ISO timestamp and about 400 bytes of words
--   tiny.ndjson     TINY lines {"i":N,"s":"abc","f":0.5}
-- Usage: luajit bench/datasets/gen.lua DIR [RECORDS] [TINY]
--
-- The pseudo-random numbers are a 32-bit xorshift of its own rather than
-- math.random, whose sequence differs between LuaJIT builds.
local bit = require "bit"

local dir = assert(arg[1], "usage: gen.lua DIR [RECORDS] [TINY]")
local records, tiny = tonumber(arg[2]) or 100000, tonumber(arg[3]) or 200000

local state = 2463534242
local function random(lo, hi) -- an integer in [lo, hi]
  state = bit.bxor(state, bit.lshift(state, 13))
  state = bit.bxor(state, bit.rshift(state, 17))
  state = bit.bxor(state, bit.lshift(state, 5))
  local u = state % 4294967296 -- (bit ops give a signed 32-bit number)
  return lo + u % (hi - lo + 1)
end

local WORDS = {}
for w in ([[lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor
  incididunt ut labore et dolore magna aliqua enim ad minim veniam quis nostrud exercitation
  ullamco laboris nisi aliquip ex ea commodo consequat]]):gmatch("%S+") do
  WORDS[#WORDS + 1] = w
end

local function text()
  local t, len = {}, 0
  while len < 400 do
    local w = WORDS[random(1, #WORDS)]
    t[#t + 1], len = w, len + #w + 1
  end
  return table.concat(t, " ")
end

local out = assert(io.open(dir .. "/records.ndjson", "w"))
for i = 1, records do
  out:write(('{"id":%d%09d,"user":"user%d","ts":"2026-%02d-%02dT%02d:%02d:%02dZ","text":"%s"}\n'):format(
    1700000000 + i, random(0, 999999999), random(1, 5000), random(1, 12), random(1, 28),
    random(0, 23), random(0, 59), random(0, 59), text()))
end
out:close()

out = assert(io.open(dir .. "/tiny.ndjson", "w"))
for i = 1, tiny do out:write(('{"i":%d,"s":"abc","f":0.5}\n'):format(i)) end
out:close()
