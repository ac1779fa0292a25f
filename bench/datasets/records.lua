-- bench/datasets/records.lua -- the records dataset's processor: counts the
-- words of the free text, hashes it (FNV-1a, in pure Lua) and parses the
-- ISO timestamp; the same file for moonjob and for the plain loop.
local bit = require "bit"
local bxor, tobit, byte = bit.bxor, bit.tobit, string.byte

local function fnv(s)
  local h = 2166136261
  for i = 1, #s do h = tobit(bxor(h, byte(s, i)) * 16777619) end
  return h
end

local function words(s)
  local n = 0
  for _ in s:gmatch("%S+") do n = n + 1 end
  return n
end

local function parse_ts(s)
  local y, mo, d, h, mi, se = s:match("^(%d+)-(%d+)-(%d+)T(%d+):(%d+):(%d+)Z$")
  return os.time({ year = y, month = mo, day = d, hour = h, min = mi, sec = se })
end

return function(job)
  local d = job.data
  return { id = d.id, user = d.user, words = words(d.text), hash = fnv(d.text), t = parse_ts(d.ts) }
end
