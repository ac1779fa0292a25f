-- moonjob.producer.codec -- the JSON a pure-Lua producer writes jobs' data
-- and reads their results with: the one the app gives (opts.json: a table
-- with encode and decode, as cjson, dkjson or moonjob.codec.json are), else
-- cjson when it is found (OpenResty has it; Debian: lua-cjson), else
-- moonjob's exact codec (moonjob.codec.json: LuaJIT only).
--
-- cjson is used through an instance of its own (cjson.new(): the app's
-- settings are left alone) that writes numbers with 16 significant digits
-- where the build takes it (OpenResty's), else 14 (lua-cjson 2.1.0's most):
-- a number it would write with fewer digits than it has (integers beyond
-- 2^53, or 10^14 with 14 digits; doubles with more digits than that) is
-- refused, never sent rounded. moonjob's codec keeps every digit and 64-bit
-- integers (docs/guide/producer.md says when to pick it).
--
-- A codec here: { name, encode(v) -> text | nil, err (never raises),
-- decode(text) -> value (raises on bad JSON), null }.
local M = {}

local function wrap(c, name)
  local encode = c.encode
  return { name = name, null = c.null, decode = c.decode,
    encode = function(v)
      local ok, text, err = pcall(encode, v)
      if not ok then return nil, (tostring(text):gsub("^[^\n]-:%d+: ", "")) end
      if type(text) ~= "string" then return nil, tostring(err or "the JSON encoder gave no text") end
      return text
    end }
end

-- The first number in v (a table walked to cjson's own depth bound) that
-- cjson, writing `digits` significant digits, would not write exactly.
local function inexact(v, digits, depth)
  if type(v) == "number" then
    if v == v and v > -math.huge and v < math.huge and tonumber(("%." .. digits .. "g"):format(v)) ~= v then
      return v
    end
  elseif type(v) == "table" and depth < 1000 then
    for k, x in pairs(v) do
      local bad = inexact(k, digits, depth + 1) or inexact(x, digits, depth + 1)
      if bad then return bad end
    end
  end
end

local function cjson_codec()
  local found, cjson = pcall(require, "cjson")
  if not found or type(cjson) ~= "table" then return nil end
  local own = type(cjson.new) == "function" and cjson.new()
  local digits = 14 -- (lua-cjson 2.1.0 refuses more than 14)
  if own and pcall(own.encode_number_precision, 16) then digits = 16 end
  local codec = wrap(own or cjson, "cjson")
  local encode = codec.encode
  codec.encode = function(v)
    local bad = inexact(v, digits, 0)
    if bad then
      return nil, ("the number %.17g would lose digits in cjson (it writes %d): send it as a string, or give"
        .. " option json = require \"moonjob.codec.json\""):format(bad, digits)
    end
    return encode(v)
  end
  return codec
end

local function exact_codec()
  local found, json = pcall(require, "moonjob.codec.json")
  return found and wrap(json, "moonjob.codec.json") or nil
end

local default -- found once per Lua VM

-- choose(given) -> codec | nil, why
function M.choose(given)
  if given ~= nil then
    if type(given) ~= "table" or type(given.encode) ~= "function" or type(given.decode) ~= "function" then
      return nil, "option 'json' must be a table with encode and decode functions (cjson, dkjson, moonjob.codec.json)"
    end
    return wrap(given, "given")
  end
  default = default or cjson_codec() or exact_codec()
  if not default then return nil, "no JSON module found: install lua-cjson, or give option 'json'" end
  return default
end

return M
