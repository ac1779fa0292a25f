-- moonjob.codec.json_lua -- moonjob.codec.json's decoder in Lua, for where
-- its C half (core/json_scan.c) is not there: a plain luajit without
-- moonjob's build.
--
-- Loaded only when needed: by json.decode without the C half, by its rare
-- fallback with it (a top object's fixups that the scan misread), and by
-- the specs that compare decode with it (json_lua.decode in its place). It
-- gives the same values and refuses the same texts, slower: the UTF-8 check
-- in Lua, then cjson for a text cjson reads exactly, else the Lua parser
-- below (a text with an empty array, or a number cjson could change).
local buffer = require "string.buffer"
local ffi = require "ffi"
local json = require "moonjob.codec.json"
local lua_utf8_error_at = require("moonjob.codec.utf8").lua_error_at

-- Kept at load: in a child, a processor may remove or replace the globals
-- (`pcall = nil`, `math = nil`), and the next job must still run.
local error, pcall, setmetatable, tonumber = error, pcall, setmetatable, tonumber
local char, floor, huge = string.char, math.floor, math.huge

local M = {}

local MAX_DEPTH, array_mt, null = json.MAX_DEPTH, json.array_mt, json.null
local TOO_DEEP = json.too_deep(MAX_DEPTH)
local cjson_decode, cjson_message, nul_message = json.cjson_decode, json.cjson_message, json.nul_message

------------------------------------------------------ the Lua parser ---
-- For texts with an empty array or a number that cjson would change in them.
local parse_value, parse_number

local function fail_at(s, i, what)
  error(("%s at character %d"):format(what, i), 0)
end

local function skip(s, i)
  return s:find("[^ \t\r\n]", i) or #s + 1
end

local function utf8_char(code)
  if code < 0x80 then return char(code) end
  if code < 0x800 then
    return char(0xC0 + floor(code / 0x40), 0x80 + code % 0x40)
  end
  if code < 0x10000 then
    return char(0xE0 + floor(code / 0x1000),
      0x80 + floor(code / 0x40) % 0x40, 0x80 + code % 0x40)
  end
  return char(0xF0 + floor(code / 0x40000), 0x80 + floor(code / 0x1000) % 0x40,
    0x80 + floor(code / 0x40) % 0x40, 0x80 + code % 0x40)
end

local simple_escapes = { b = "\b", f = "\f", n = "\n", r = "\r", t = "\t",
  ['"'] = '"', ["\\"] = "\\", ["/"] = "/" }

local function parse_string(s, i)
  local out, j = buffer.new(), i + 1
  while true do
    local k = s:find('["\\]', j)
    if not k then fail_at(s, i, "unterminated string") end
    out:put(s:sub(j, k - 1))
    if s:sub(k, k) == '"' then return out:tostring(), k + 1 end
    local e = s:sub(k + 1, k + 1)
    if simple_escapes[e] then
      out:put(simple_escapes[e]); j = k + 2
    elseif e == "u" then
      local code = tonumber(s:sub(k + 2, k + 5):match("^%x%x%x%x$") or "", 16)
      if not code then fail_at(s, k, "bad \\u escape") end
      j = k + 6
      if code >= 0xD800 and code < 0xE000 then -- a surrogate: only as a high-low pair
        local low = code < 0xDC00 and s:sub(j, j + 1) == "\\u"
          and tonumber(s:sub(j + 2, j + 5):match("^%x%x%x%x$") or "", 16)
        if not (low and low >= 0xDC00 and low < 0xE000) then fail_at(s, k, "invalid unicode escape code") end
        code = 0x10000 + (code - 0xD800) * 0x400 + (low - 0xDC00)
        j = j + 6
      end
      out:put(utf8_char(code))
    else
      fail_at(s, k, "bad escape")
    end
  end
end

local function parse_array(s, i, depth)
  local arr, n = {}, 0
  i = skip(s, i + 1)
  if s:sub(i, i) == "]" then return setmetatable(arr, array_mt), i + 1 end
  while true do
    n = n + 1
    arr[n], i = parse_value(s, i, depth + 1)
    i = skip(s, i)
    local c = s:sub(i, i)
    if c == "]" then return arr, i + 1 end
    if c ~= "," then fail_at(s, i, "expected ',' or ']'") end
    i = skip(s, i + 1)
  end
end

local function parse_object(s, i, depth)
  local obj = {}
  i = skip(s, i + 1)
  if s:sub(i, i) == "}" then return obj, i + 1 end
  while true do
    if s:sub(i, i) ~= '"' then fail_at(s, i, "expected a string key") end
    local key
    key, i = parse_string(s, i)
    i = skip(s, i)
    if s:sub(i, i) ~= ":" then fail_at(s, i, "expected ':'") end
    obj[key], i = parse_value(s, skip(s, i + 1), depth + 1)
    i = skip(s, i)
    local c = s:sub(i, i)
    if c == "}" then return obj, i + 1 end
    if c ~= "," then fail_at(s, i, "expected ',' or '}'") end
    i = skip(s, i + 1)
  end
end

local literals = { t = { "true", true }, f = { "false", false }, n = { "null", null } }

local U64_MAX = ffi.new("uint64_t", 0) - 1
local I64_MAX = ffi.new("uint64_t", 2 ^ 63) - 1

-- A number that cannot cross exactly: where it is, then why.
local function number_fails(text, i, why)
  error(("number %s at character %d %s"):format(text, i, why), 0)
end

-- An integer beyond ±2^53, as 64-bit integer cdata; an error past 64 bits.
local function big_integer(s, i, negative, digits)
  local function beyond()
    number_fails((negative and "-" or "") .. digits, i, "is an integer beyond 64 bits; write it as a string")
  end
  local v = ffi.new("uint64_t", 0)
  for k = 1, #digits do
    local d = digits:byte(k) - 48
    if v > (U64_MAX - d) / 10 then beyond() end
    v = v * 10 + d
  end
  if not negative then return v <= I64_MAX and ffi.new("int64_t", v) or v end
  if v > I64_MAX + 1 then beyond() end
  return -ffi.cast("int64_t", v) -- -2^63 wraps onto itself: still right
end

-- A JSON number: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][-+]?[0-9]+)?
function parse_number(s, i)
  local negative, digits, j = s:match("^(-?)(%d+)()", i)
  if not digits then fail_at(s, i, "invalid number") end
  if #digits > 1 and digits:sub(1, 1) == "0" then fail_at(s, i, "invalid number (leading zero)") end
  local fraction = s:match("^%.%d+", j) or (s:sub(j, j) == "." and fail_at(s, j, "invalid number"))
  j = j + #(fraction or "")
  local exponent = s:match("^[eE][-+]?%d+", j) or (s:find("^[eE]", j) and fail_at(s, j, "invalid number"))
  j = j + #(exponent or "")
  if not fraction and not exponent and (#digits > 16 or (#digits == 16 and digits > "9007199254740992")) then
    return big_integer(s, i, negative == "-", digits), j -- beyond ±2^53: digits, not a double
  end
  local text = s:sub(i, j - 1)
  local v = tonumber(text)
  local zero = not (digits .. (fraction or "")):find("[1-9]")
  if v == nil then -- LuaJIT gives up on an exponent this long: its sign says which way
    v = (zero or exponent:find("^[eE]%-")) and 0 or huge
    if negative == "-" then v = -v end
  end
  if v == huge or v == -huge then
    number_fails(text, i, "is beyond the range of a double (about 1.8e308)")
  end
  if v == 0 and not zero then
    number_fails(text, i, "is too small for a double (it would read as 0)")
  end
  return v, j
end

parse_value = function(s, i, depth) -- depth: the arrays and objects around it
  local c = s:sub(i, i)
  if depth >= MAX_DEPTH and (c == "{" or c == "[") then fail_at(s, i, TOO_DEEP) end
  if c == "{" then return parse_object(s, i, depth) end
  if c == "[" then return parse_array(s, i, depth) end
  if c == '"' then return parse_string(s, i) end
  local lit = literals[c]
  if lit then
    if s:sub(i, i + #lit[1] - 1) ~= lit[1] then fail_at(s, i, "invalid token") end
    return lit[2], i + #lit[1]
  end
  if c == "-" or c:find("^%d") then return parse_number(s, i) end
  fail_at(s, i, "invalid token")
end

local function lua_decode(s) -- (in cjson's place only: its caller checks UTF-8)
  local value, i = parse_value(s, skip(s, 1), 0)
  if skip(s, i) <= #s then fail_at(s, skip(s, i), "trailing characters") end
  return value
end

-- What the Lua decoder must read when the C half is not there: a text with
-- an empty array, a number cjson could change (16 digits in a row, an
-- exponent of 3 digits), or a point with no digit after it (`1.`: cjson
-- takes it, JSON does not; the C scan refuses it too).
local function needs_lua_decoder(text)
  return text:find("%[%s*%]") or text:find("%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d")
    or text:find("[eE][-+]?%d%d%d") or text:find("%d%.%D") or text:find("%d%.$")
end

-- json_lua.decode(text) -> value | nil, message, as json.decode: the
-- UTF-8 check in Lua, then cjson or the Lua decoder.
function M.decode(text)
  local bad = lua_utf8_error_at(text)
  if bad then return nil, ("invalid UTF-8 at byte %d (JSON text is UTF-8)"):format(bad) end
  local nul = text:find("\0", 1, true) -- (cjson would stop there; never JSON, in a string or out)
  if nul then return nil, nul_message(text, nul) end
  local decode = needs_lua_decoder(text) and lua_decode or cjson_decode
  local ok, value = pcall(decode, text)
  if not ok then return nil, cjson_message(value) end
  if value == null then return nil end -- (JSON null at the top: nil, as json.decode)
  return value
end

return M
