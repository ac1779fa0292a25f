-- A batch line's result line is written by the child's C code
-- (core/child/result.c) with the bytes the Lua encoder and
-- moonjob.codec.resultline write; what that code declines goes through the
-- Lua encoder as before. The processor (spec/fixtures/result_values.lua)
-- returns generated values and counts the Lua encoder's calls in its child.
local h = require "helpers"
local cli = require "cli"
local json = require "moonjob.codec.json"
local resultline = require "moonjob.codec.resultline"

local ffi = require "ffi"
ffi.cdef "int snprintf(char *s, size_t n, const char *format, ...);"

local FIXTURE = "spec/fixtures/result_values.lua"
local values = dofile(FIXTURE)
local LINES = 3000

-- A result line with its milliseconds made 0.
local function without_ms(text)
  return (text:gsub(',"ms":[%d.e+-]+}$', ',"ms":0}'))
end

-- Whether number n is written as json.number_text does (the shortest of
-- %.15g, %.16g and %.17g that reads back equal) after a form that rounds a
-- tie (its exact value, from the C library, has p + 1 significant digits,
-- the last a 5): LuaJIT rounds it away from zero, the C library to even, and
-- the C writer leaves such a number to the Lua encoder.
local function rounds_a_tie(n)
  if n == math.floor(n) and math.abs(n) <= 2 ^ 53 then return false end
  local text = ffi.new("char[800]")
  ffi.C.snprintf(text, 800, "%.780e", ffi.new("double", n))
  local digits = ffi.string(text):gsub("e.*$", ""):gsub("%D", ""):gsub("0+$", "")
  for p = 15, 17 do
    if #digits == p + 1 and digits:sub(-1) == "5" then return true end
    if tonumber(("%." .. p .. "g"):format(n)) == n then return false end
  end
  return false
end

-- Whether the C writer declines generated value v (a number that rounds a tie).
local function declined_random(v)
  if type(v) == "number" then return rounds_a_tie(v) end
  if type(v) ~= "table" then return false end
  for _, x in pairs(v) do
    if declined_random(x) then return true end
  end
  return false
end

describe("moonjob run: result lines written in C", function()
  local input, out

  setup(function()
    local rows = {}
    for i = 1, LINES do rows[i] = ('{"i":%d}'):format(i) end
    input = h.write_file(os.tmpname(), table.concat(rows, "\n") .. "\n")
    local err, status
    out, err, status = h.sh(cli.MOONJOB .. "run -j 1 " .. FIXTURE .. " " .. input)
    assert.equal(1, status, err) -- (the lines whose result no JSON holds failed)
  end)
  teardown(function() os.remove(input) end)

  -- The output's lines by line number.
  local function printed()
    local by_line = {}
    for text in out:gmatch("[^\n]+") do
      by_line[tonumber(text:match('^{"line":(%d+),'))] = text
    end
    return by_line
  end

  it("writes every result line with the bytes of the Lua encoder", function()
    local by_line = printed()
    for i = 1, LINES do
      local text = assert(by_line[i], "line " .. i .. " printed")
      local value, declined = values.value(i)
      if declined and values.FAILING[declined] then
        assert.matches('"status":"failed","error":{"code":"EPAYLOAD","message":"the result cannot be encoded',
          text, 1, true)
      else
        local before = assert(tonumber(text:match('"before":(%d+)')), text)
        local job = assert(tonumber(text:match('"job":(%d+)')), text)
        local expected = resultline.completed(i, assert(json.encode({ before = before, job = job, value = value })),
          1, 0)
        assert.equal(expected:sub(1, -2), without_ms(text), "line " .. i)
      end
    end
  end)

  it("runs the Lua encoder only for the lines it declines", function()
    local by_line = printed()
    local checked = 0
    for i = 1, LINES - 1 do
      -- two lines one after the other in one batch: how many times the Lua
      -- encoder ran between the two calls of the processor
      local before, job = by_line[i]:match('"before":(%d+),"job":(%d+)')
      local after, next_job = by_line[i + 1]:match('"before":(%d+),"job":(%d+)')
      if job and job == next_job then
        local value, declined = values.value(i)
        declined = declined or declined_random(value)
        assert.equal(declined and 1 or 0, tonumber(after) - tonumber(before), "line " .. i)
        checked = checked + 1
      end
    end
    assert.is_true(checked > LINES / 2, checked .. " lines checked")
  end)
end)
