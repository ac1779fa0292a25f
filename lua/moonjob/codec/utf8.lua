-- moonjob.codec.utf8 -- UTF-8 text for the JSON codec and the text edges:
-- where a string stops being UTF-8, and text made fit to be written as JSON.
--
-- JSON text is UTF-8 (RFC 8259): moonjob.codec.json checks every string it
-- writes and every text it reads with error_at; a processor's output lines
-- and error messages, whatever their bytes, go through to_utf8 on their way
-- to JSON (moonjob.redis.remote, moonjob.redis.operate,
-- moonjob.codec.resultline). The check is the C half's
-- (moonjob.codec.json_c) where it is found, else the Lua one here, which
-- gives the same answers (the specs compare the two).
local C = require("moonjob.codec.json_c").lib
local ffi = require "ffi"

local M = {}

local find, byte, sub = string.find, string.byte, string.sub
-- Kept at load: in a child, a processor may remove or replace the globals
-- (`pcall = nil`, `math = nil`), and the next job must still run.
local tonumber, concat = tonumber, table.concat
local NON_ASCII = "[\128-\255]"

-- The bytes a lead byte `c` takes after it, and the range of the first of
-- them (RFC 3629's table: no overlong forms, no surrogates, nothing past
-- U+10FFFF); nil for a byte that cannot start a character.
local function utf8_sequence(c)
  if c >= 0xC2 and c <= 0xDF then return 1, 0x80, 0xBF end
  if c == 0xE0 then return 2, 0xA0, 0xBF end
  if c == 0xED then return 2, 0x80, 0x9F end
  if c >= 0xE1 and c <= 0xEF then return 2, 0x80, 0xBF end
  if c == 0xF0 then return 3, 0x90, 0xBF end
  if c == 0xF4 then return 3, 0x80, 0x8F end
  if c >= 0xF1 and c <= 0xF3 then return 3, 0x80, 0xBF end
end

-- Where string s stops being UTF-8 (a byte position), looking from byte
-- `init` (default 1) on, or nil when it is. Runs of ASCII are skipped by
-- string.find.
local function lua_error_at(s, init)
  local i = find(s, NON_ASCII, init)
  while i do
    local n, low, high = utf8_sequence(byte(s, i))
    if not n then return i end
    local c = byte(s, i + 1)
    if not c or c < low or c > high then return i end
    for k = 2, n do
      c = byte(s, i + k)
      if not c or c < 0x80 or c > 0xBF then return i end
    end
    i = find(s, NON_ASCII, i + n + 1)
  end
end
M.lua_error_at = lua_error_at -- (the specs compare the two)

-- Every line and string, through the FFI when the C half is there: Lua's
-- pattern matching cost 12% of a batch line's time.
local error_at = lua_error_at
if C then
  local c_error_at = C.moonjob_utf8_error_at
  error_at = function(s, init)
    if not init then -- (every line and string: no cast)
      local at = tonumber(c_error_at(s, #s))
      if at > 0 then return at end
      return nil
    end
    local at = tonumber(c_error_at(ffi.cast("const char *", s) + (init - 1), #s - init + 1))
    if at > 0 then return init + at - 1 end
  end
end
-- utf8.error_at(s [, init]) -> where s stops being UTF-8 (from byte init
-- on), or nil when it is UTF-8
M.error_at = error_at

-- utf8.to_utf8(s) -> s, with each byte that is not part of UTF-8 text
-- replaced by U+FFFD: text from a processor's output or an error message,
-- made fit to be written as JSON (encode refuses what is not UTF-8).
function M.to_utf8(s)
  local at = error_at(s)
  if not at then return s end
  local parts, from = {}, 1
  while at do
    parts[#parts + 1] = sub(s, from, at - 1)
    parts[#parts + 1] = "\239\191\189"
    from = at + 1
    at = error_at(s, from)
  end
  parts[#parts + 1] = sub(s, from)
  return concat(parts)
end

-- utf8.valid_text(s) -> s, with each byte where it stops being UTF-8
-- replaced by U+FFFD: for messages, which must reach JSON whatever their bytes.
function M.valid_text(s)
  local at = error_at(s)
  if not at then return s end
  local parts, from = {}, 1
  while at do
    parts[#parts + 1] = s:sub(from, at - 1)
    parts[#parts + 1] = "\239\191\189"
    from = at + 1
    at = from <= #s and error_at(s, from)
  end
  parts[#parts + 1] = s:sub(from)
  return concat(parts)
end

return M
