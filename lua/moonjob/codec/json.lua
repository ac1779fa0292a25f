-- moonjob.codec.json -- exact JSON for the text edges (the CLI, the "json" codec,
-- the Redis queue).
--
-- Loaded on both sides of the channel: in the parent (moonjob.cli,
-- moonjob.pool, moonjob.redis.*, moonjob.codec.resultline) and in the child
-- (moonjob.child.runner, .batch and .encode), and by processors as
-- moonjob.json. Its C half, core/json_scan.c (the UTF-8 check and the
-- scanner below), is called through the FFI: in the child program's own
-- symbols, elsewhere in core.so (moonjob.codec.json_c finds it). Where
-- neither is found (a plain luajit without moonjob's build) the same work
-- is done in Lua, slower: moonjob.codec.utf8's check and
-- moonjob.codec.json_lua's decoder.
--
-- Debian's lua-cjson 2.1.0 prints numbers with at most 14 significant digits,
-- which silently changes users' data (2^53 comes out as 9.007199254741e+15).
-- encode() here writes every number exactly: integers up to 2^53 in full, any
-- other double with the shortest of %.15g/%.16g/%.17g that reads back equal.
--
-- decode() never changes a number silently. Integers written without fraction
-- or exponent are exact up to 64 bits: within ±2^53 they are Lua numbers,
-- beyond they are LuaJIT's 64-bit integer cdata (int64_t, or uint64_t above
-- 2^63-1), which encode() writes back digit for digit; further out they are an
-- error. Other numbers are doubles, as JSON parsers commonly read them; one
-- beyond a double's range (1e400), or too small for one and not zero (1e-400),
-- is an error, as are NaN and Infinity (not JSON).
--
-- decode() is one C pass, then cjson, then, rarely, a Lua walk. The scan
-- (core/json_scan.c) checks the UTF-8 and finds what cjson would change: an
-- integer beyond ±2^53, a number beyond a double's range (an error, with its
-- position), an empty array (which must come back as a table marked with
-- json.array_mt, written back as `[]`, not `{}`), a number token outside
-- JSON's grammar (`1.`: an error). Most texts hold none, and cjson decodes
-- them as they are. When each such token is a member of the top object
-- under a key without escapes ({"id":1700000001875161649,...}: records with
-- ids, the commonest case), cjson decodes the text as it is too, and the
-- scan's "fixups" set those members by key (decode_fixed). Otherwise cjson
-- decodes a copy where each such token is a marker, a string beginning with
-- byte 0xFF (never in UTF-8 text, so never in a string of the text), and a
-- walk over the result turns the markers back into 64-bit integer cdata and
-- marked empty tables, stopping once it found them all. An error found in
-- the copy is reported from cjson reading the text itself, so that its
-- position is the text's.
--
-- encode() writes object keys sorted by their bytes, as `jq -S` (for UTF-8,
-- code point order); a number key by its text. The same value is the same
-- text in every run, whatever order its keys were made in.
--
-- Text is UTF-8 both ways (RFC 8259): decode() refuses a text that is not
-- (an invalid byte, an overlong form, a surrogate, past U+10FFFF), and
-- encode() a string that is not, so that what moonjob writes is always valid
-- JSON; bytes that are not text go as base64 or hex. Both nest at most
-- MAX_DEPTH (1000) arrays and objects, and say so in the same words
-- (json.too_deep).
--
-- Caveats: JSON null decodes to cjson.null (a lightuserdata) inside arrays and
-- objects, and encodes back as null. NaN and infinities cannot be written.
-- A table is an array when its keys are exactly 1..n; an empty table is `{}`
-- unless it carries json.array_mt.
local cjson = require "cjson"
local buffer = require "string.buffer"
local ffi = require "ffi"

-- Kept at load: in a child, a processor may remove or replace the globals
-- (`pcall = nil`, `math = nil`), and the next job must still run.
local error, getmetatable, ipairs, next, pairs, pcall, require, setmetatable, tonumber, tostring, type =
  error, getmetatable, ipairs, next, pairs, pcall, require, setmetatable, tonumber, tostring, type
local floor, huge, sort = math.floor, math.huge, table.sort

local M = {}
M.null = cjson.null
M.array_mt = { __name = "moonjob.json.array" }
M.MAX_DEPTH = 1000

-- The one wording of a nesting limit, here and for string.buffer's
-- (moonjob.pool, moonjob.child.encode).
function M.too_deep(limit)
  return ("nested deeper than %d levels"):format(limit)
end
local TOO_DEEP = M.too_deep(M.MAX_DEPTH)

local decode_safe = cjson.new()
decode_safe.decode_max_depth(M.MAX_DEPTH)
decode_safe.decode_invalid_numbers(false) -- NaN, Infinity, hex: not JSON

-- The C half, if found, and the UTF-8 check (the C half's, else Lua's).
local json_c = require "moonjob.codec.json_c"
local C = json_c.lib
M.c_from = json_c.from -- where the C half was found, or nil (the specs check it)
local utf8_error_at = require("moonjob.codec.utf8").error_at
local find, byte, sub = string.find, string.byte, string.sub

-------------------------------------------------------------- encoding ---

local escapes = {
  ['"'] = '\\"', ["\\"] = "\\\\", ["\b"] = "\\b", ["\f"] = "\\f",
  ["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t",
}
for byte = 0, 31 do
  local c = string.char(byte)
  escapes[c] = escapes[c] or ("\\u%04x"):format(byte)
end
escapes["\127"] = "\\u007f"

local function number_text(n)
  if n ~= n or n == huge or n == -huge then
    error("cannot write " .. tostring(n) .. " in JSON", 0)
  end
  if n == floor(n) and n >= -2^53 and n <= 2^53 then
    return ("%.0f"):format(n)
  end
  for _, fmt in ipairs({ "%.15g", "%.16g" }) do
    local s = fmt:format(n)
    if tonumber(s) == n then return s end
  end
  return ("%.17g"):format(n)
end
M.number_text = number_text

-- The length of t when its keys are exactly 1..n, else nil. A table whose
-- first key is not a number is an object at once, with no loop: a loop here
-- for every object would keep encode's own trace from compiling.
local function array_length(t)
  local first = next(t)
  if first ~= nil and type(first) ~= "number" then return nil end
  local n = 0
  for k in pairs(t) do
    if type(k) ~= "number" or k < 1 or k ~= floor(k) then return nil end
    n = n + 1
  end
  for i = 1, n do if t[i] == nil then return nil end end
  return n
end

local write_value

local function write_string(out, v)
  local bad = utf8_error_at(v)
  if bad then
    error(("cannot write a string that is not UTF-8 (byte %d) in JSON; send bytes as base64 or hex")
      :format(bad), 0)
  end
  if find(v, '[%c"\\]') then v = v:gsub('[%c"\\]', escapes) end
  out:put('"', v, '"')
end

-- Object keys are written sorted by their bytes, as `jq -S` writes them (for
-- UTF-8 that is code point order), so that the same value is the same text
-- in every run. Each depth has a list of keys it reuses (no table per
-- object); a list is emptied as its keys are written, and all of them when
-- encode fails half way. Short lists are sorted here (a loop LuaJIT
-- compiles), longer ones by table.sort.
local keys_at = {}

local function sort_keys(keys, n)
  if n > 12 then return sort(keys) end
  for i = 2, n do
    local k, j = keys[i], i - 1
    while j > 0 and keys[j] > k do
      keys[j + 1] = keys[j]
      j = j - 1
    end
    keys[j + 1] = k
  end
end

-- The keys of object t, sorted, in the list of depth `depth`, and how many;
-- nil when one is a number (see write_numbered_object).
local function sorted_keys(t, depth)
  local keys = keys_at[depth]
  if not keys then
    keys = {}
    keys_at[depth] = keys
  end
  local n = 0
  for k in next, t do
    local kt = type(k)
    if kt ~= "string" then
      for i = n, 1, -1 do keys[i] = nil end
      if kt == "number" then return nil end
      error("cannot write a " .. kt .. " key in JSON", 0)
    end
    n = n + 1
    keys[n] = k
  end
  if n > 1 then sort_keys(keys, n) end
  return keys, n
end

-- An object with a number key ({ [10] = "a", b = 1 }): keys sorted by their
-- text ("10" before "9"), a number before a string of the same text.
local function key_order(a, b)
  if a[1] ~= b[1] then return a[1] < b[1] end
  return type(a[2]) == "number" and type(b[2]) ~= "number"
end

local function write_numbered_object(out, t, depth)
  local entries = {}
  for k in next, t do
    local kt = type(k)
    if kt ~= "string" and kt ~= "number" then error("cannot write a " .. kt .. " key in JSON", 0) end
    entries[#entries + 1] = { kt == "number" and number_text(k) or k, k }
  end
  sort(entries, key_order)
  out:put("{")
  for i, entry in ipairs(entries) do
    if i > 1 then out:put(",") end
    write_string(out, entry[1])
    out:put(":")
    write_value(out, t[entry[2]], depth + 1)
  end
  out:put("}")
end

local function write_table(out, t, depth) -- depth: the tables around t
  if depth >= M.MAX_DEPTH then error("cannot write JSON " .. TOO_DEEP, 0) end
  local n = array_length(t)
  if n and (n > 0 or getmetatable(t) == M.array_mt) then
    out:put("[")
    for i = 1, n do
      if i > 1 then out:put(",") end
      write_value(out, t[i], depth + 1)
    end
    return out:put("]")
  end
  local keys, count = sorted_keys(t, depth)
  if not keys then return write_numbered_object(out, t, depth) end
  out:put("{")
  for i = 1, count do
    local k = keys[i]
    keys[i] = nil
    if i > 1 then out:put(",") end
    write_string(out, k)
    out:put(":")
    write_value(out, t[k], depth + 1)
  end
  out:put("}")
end

write_value = function(out, v, depth)
  local t = type(v)
  if t == "string" then
    write_string(out, v)
  elseif t == "number" then
    out:put(number_text(v))
  elseif t == "boolean" then
    out:put(v and "true" or "false")
  elseif t == "table" then
    write_table(out, v, depth)
  elseif t == "cdata" and (ffi.istype("int64_t", v) or ffi.istype("uint64_t", v)) then
    out:put((tostring(v):gsub("U?LL$", ""))) -- every digit: 12345678901234567890ULL
  elseif v == nil or v == cjson.null then
    out:put("null")
  else
    error("cannot write a " .. t .. " in JSON", 0)
  end
end

-- json.encode(value) -> text | nil, message
local encoded = buffer.new() -- reused, unless encode runs inside itself
local encoding = false

-- encode called from a metamethod that encode itself runs (an __index read
-- for an array's hole): its own buffer and key lists, the outer ones intact.
local function encode_inside(value)
  local outer_keys = keys_at
  keys_at = {}
  local out = buffer.new()
  local ok, err = pcall(write_value, out, value, 0)
  keys_at = outer_keys
  if not ok then return nil, err end
  return out:tostring()
end

function M.encode(value)
  if encoding then return encode_inside(value) end
  encoding = true
  local out = encoded:reset()
  local ok, err = pcall(write_value, out, value, 0)
  encoding = false
  if not ok then keys_at = {} end -- (lists left half full)
  local text = ok and out:tostring()
  if #out > 1024 * 1024 then out:free() else out:reset() end -- no big buffer kept for ever
  if not ok then return nil, err end
  return text
end

-------------------------------------------------------------- decoding ---

-- cjson's message, in our words.
local function cjson_message(err)
  return (tostring(err):gsub("^Expected", "expected")
    :gsub("^Found too many nested data structures %(%d+%)", TOO_DEEP))
end

-- Why a text with a NUL byte at `at` is not JSON (JSON has none outside
-- strings, where it is written \u0000). cjson stops reading at a NUL, taking
-- `{"a":1}\0junk` for `{"a":1}`: what it reads before it says whether the
-- NUL is trailing data, breaks the value, or comes after an error of its own.
local function nul_message(text, at)
  local ok, err = pcall(decode_safe.decode, sub(text, 1, at - 1))
  if ok then return ("trailing data at character %d: a NUL byte after the JSON value"):format(at) end
  if find(tostring(err), "T_END", 1, true) then
    return ("unexpected NUL byte at character %d"):format(at)
  end
  return cjson_message(err)
end

-- Shared with the Lua decoder (moonjob.codec.json_lua): the same cjson
-- settings and the same words.
M.cjson_decode, M.cjson_message, M.nul_message = decode_safe.decode, cjson_message, nul_message

-- The Lua decoder (moonjob.codec.json_lua: the UTF-8 check in Lua, then
-- cjson or a parser in Lua), loaded the first time it is needed: always
-- without the C half, rarely with it.
local lua_decode
local function lua_only_decode(text)
  lua_decode = lua_decode or require("moonjob.codec.json_lua").decode
  return lua_decode(text)
end

------------------------------------------------- decoding with the C half ---

-- core/json_scan.c's statuses (core/json_scan.h).
local PLAIN, REWRITTEN, ROOM, BAD_UTF8, BAD_NUMBER, FIXUPS, NUL = 0, 1, 2, 3, 7, 8, 9
local NUMBER_ERRORS = {
  [4] = "is an integer beyond 64 bits; write it as a string",
  [5] = "is beyond the range of a double (about 1.8e308)",
  [6] = "is too small for a double (it would read as 0)",
}
local MARKER, INT64, EMPTY_ARRAY = 255, byte("i"), byte("[")

local scan = C and ffi.new("moonjob_json_scan_t")
local rewritten = buffer.new() -- reused: decode never runs inside itself

-- A marker's value: "\255[" an empty array, "\255i" and "\255u" then digits
-- an int64_t or uint64_t.
local function marker_value(s)
  local kind = byte(s, 2)
  if kind == EMPTY_ARRAY then return setmetatable({}, M.array_mt) end
  if kind == INT64 then return C.moonjob_json_int64(s) end
  return C.moonjob_json_uint64(s)
end

-- Turns the markers in table t back into values; returns how many of `left`
-- it did not find. Stops as soon as all are found.
local function restore(t, left)
  for k, v in next, t do
    if type(v) == "string" then
      if byte(v) == MARKER then
        t[k] = marker_value(v)
        left = left - 1
        if left == 0 then return 0 end
      end
    elseif type(v) == "table" then
      left = restore(v, left)
      if left == 0 then return 0 end
    end
  end
  return left
end

-- Why text is not JSON, in cjson's words: for errors found in the copy, whose
-- positions are not the text's, or in a text the scanner took for wrong.
local function why_not_json(text, otherwise)
  local ok, err = pcall(decode_safe.decode, text)
  if ok then return otherwise end
  return cjson_message(err)
end

-- The rewritten copy decoded, its markers turned back into values.
local function decode_copy(text, copy, markers)
  local ok, value = pcall(decode_safe.decode, copy)
  if not ok then return nil, why_not_json(text, cjson_message(value)) end
  if type(value) == "string" and byte(value) == MARKER and markers == 1 then
    return marker_value(value) -- (the whole text was one)
  end
  local left = type(value) == "table" and restore(value, markers) or markers
  if left > 0 then
    -- A marker where the text had an object's key (not JSON: cjson says
    -- why), or a repeated key took its place (JSON: the value stands).
    local message = why_not_json(text, nil)
    if message then return nil, message end
  end
  return value
end

-- Sets the scan's fixup k in value, the text's top object (decoded by
-- cjson): its member under that key becomes the 64-bit integer of the token
-- the scan found, or, for `[]`, is marked as an array. False when the member
-- is not the double or the empty table cjson makes of such a token: the scan
-- misread the text, and the Lua decoder decides.
local function fix_member(text, value, k)
  local r = scan
  local from = r.key_at[k]
  local key, kind = sub(text, from + 1, from + r.key_length[k]), r.kind[k]
  local v = value[key]
  if kind == EMPTY_ARRAY then
    if type(v) ~= "table" or next(v) ~= nil then return false end
    setmetatable(v, M.array_mt)
  elseif type(v) ~= "number" then
    return false
  elseif kind == INT64 then
    value[key] = C.moonjob_json_int64_at(text, r.value_at[k])
  else
    value[key] = C.moonjob_json_uint64_at(text, r.value_at[k])
  end
  return true
end

-- The text decoded by cjson as it is, then the scan's fixups set: the
-- members of its top object whose values are big integers or `[]`, found by
-- their keys (most texts with big integers hold them so: ids). No copy to
-- decode, no walk.
local function decode_fixed(text)
  local ok, value = pcall(decode_safe.decode, text)
  if not ok then return nil, cjson_message(value) end
  -- (the first outside the loop: a loop run once per call keeps LuaJIT
  -- from compiling this function, and one fixup is the common case)
  local fixed = type(value) == "table" and fix_member(text, value, 0)
  for k = 1, scan.fixups - 1 do fixed = fixed and fix_member(text, value, k) end
  if not fixed then return lua_only_decode(text) end
  return value
end

local function c_decode(text)
  local len = #text
  local out = rewritten:reset()
  local room = len + 64 -- (a few markers' worth)
  local status = C.moonjob_json_scan(text, len, out:reserve(room), room, M.MAX_DEPTH, scan)
  if status == ROOM then -- (it says how much it needs)
    room = scan.written
    status = C.moonjob_json_scan(text, len, out:reserve(room), room, M.MAX_DEPTH, scan)
  end
  local copy = status == REWRITTEN and out:commit(scan.written):tostring()
  if room > 1024 * 1024 then out:free() end -- no big buffer kept for ever
  if status == FIXUPS then return decode_fixed(text) end
  if status == PLAIN then
    local ok, value = pcall(decode_safe.decode, text)
    if ok then return value end
    return nil, cjson_message(value)
  end
  if copy then return decode_copy(text, copy, scan.markers) end
  local at = scan.at
  if status == BAD_UTF8 then return nil, ("invalid UTF-8 at byte %d (JSON text is UTF-8)"):format(at) end
  if status == BAD_NUMBER then return nil, why_not_json(text, ("invalid number at character %d"):format(at)) end
  if status == NUL then return nil, nul_message(text, at) end
  local number = text:sub(at, at + scan.length - 1)
  return nil, ("number %s at character %d %s"):format(number, at, NUMBER_ERRORS[status])
end

local function top_level(value, err)
  if value == cjson.null then return nil end
  return value, err
end

-- json.decode(text) -> value | nil, message
function M.decode(text)
  if C then return top_level(c_decode(text)) end
  return top_level(lua_only_decode(text))
end

return M
