-- bench/json.lua -- moonjob.codec.json next to plain cjson, per line, in one
-- process (not part of `make bench`: run it by hand, from the checkout's root).
--
--   luajit bench/json.lua [CODEC_FILE]
--
-- Decodes each kind of text below many times with cjson (Debian's, default
-- settings) and with the codec, and encodes two kinds of result, then prints
-- microseconds per text, the best of ROUNDS runs, and codec / cjson (above 1:
-- the codec is slower). CODEC_FILE, when given, is a copy of the codec to time
-- instead of lua/moonjob/codec/json.lua (an older version, to compare). The
-- records are the first BENCH_LINES lines of the NDJSON file BENCH_RECORDS
-- names, else generated: a 19-digit id, a user, a time stamp and ~400 bytes
-- of words.
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
package.cpath = "build/?.so;" .. package.cpath

local cjson = require "cjson"
local json = arg[1] and dofile(arg[1]) or require "moonjob.codec.json"

local ROUNDS = tonumber(os.getenv("BENCH_ROUNDS")) or 7
local LINES = tonumber(os.getenv("BENCH_LINES")) or 20000

local function records()
  local path = os.getenv("BENCH_RECORDS")
  local lines = {}
  local f = path and assert(io.open(path, "rb"))
  if f then
    for line in f:lines() do
      lines[#lines + 1] = line
      if #lines == LINES then break end
    end
    f:close()
    return lines
  end
  math.randomseed(7)
  local words = { "lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit" }
  for i = 1, LINES do
    local text = {}
    for k = 1, 70 do text[k] = words[math.random(#words)] end
    lines[i] = ('{"id":%d%09d,"user":"user%d","ts":"2026-07-14T19:37:11Z","text":"%s"}')
      :format(1700000000, math.random(0, 999999999), i, table.concat(text, " "))
  end
  return lines
end

local function repeated(text, n)
  local t = {}
  for i = 1, n do t[i] = text end
  return t
end

local function deep(levels, inner)
  return ('{"k":['):rep(levels) .. inner .. (']}'):rep(levels)
end

local DECODE = {
  { "records (19-digit ids)", records() },
  { "tiny lines", repeated('{"i":12345,"s":"abc","f":0.5}', LINES) },
  { "500 levels deep", repeated(deep(250, "1"), LINES / 20) },
  { "500 levels, [] inside", repeated(deep(250, "[]"), LINES / 20) },
  { "fractional digit runs", repeated('{"x":0.1234567890123456,"y":[3.14159265358979323846,2.718281828459045235]}', LINES) },
}

-- (cjson cannot write 64-bit integer cdata: its copy of the records' result
-- has a double for an id, the same digits)
local big = json.decode("1700000001875161649")
local function record_result(id)
  return { id = id, user = "user2676", words = 70, hash = -123456789, t = 1784057831 }
end
local ENCODE = {
  { "small object", repeated({ n = 2, name = "item 1", ok = true }, LINES) },
  { "records' result", repeated(record_result(big), LINES), repeated(record_result(1700000001875161649), LINES) },
}

-- Seconds per input of f over inputs, once.
local clock = os.clock
local function timed(f, inputs)
  local t0 = clock()
  for i = 1, #inputs do f(inputs[i]) end
  return (clock() - t0) / #inputs
end

-- cjson's and the codec's best of ROUNDS, taking turns in every round (a
-- load on the machine falls on both), as microseconds per input.
local function side_by_side(name, base_f, base_inputs, f, inputs)
  local base, mine = math.huge, math.huge
  for _ = 1, ROUNDS do
    base = math.min(base, timed(base_f, base_inputs))
    mine = math.min(mine, timed(f, inputs))
  end
  print(("%-26s %8.2f %8.2f %6.2f"):format(name, base * 1e6, mine * 1e6, mine / base))
end

print(("%-26s %8s %8s %6s"):format("decode, us per text", "cjson", "codec", "ratio"))
for _, case in ipairs(DECODE) do
  for _, text in ipairs(case[2]) do assert(json.decode(text)) end -- they all decode
  side_by_side(case[1], cjson.decode, case[2], json.decode, case[2])
end
print(("%-26s %8s %8s %6s"):format("encode, us per value", "cjson", "codec", "ratio"))
for _, case in ipairs(ENCODE) do
  side_by_side(case[1], cjson.encode, case[3] or case[2], json.encode, case[2])
end
