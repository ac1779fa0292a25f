-- moonjob.producer.codec -- the JSON a pure-Lua producer writes jobs' data
-- and reads their results with: the one the app gives (opts.json: a table
-- with encode and decode, as cjson, dkjson or moonjob.codec.json are), else
-- cjson when it is found (OpenResty has it; Debian: lua-cjson), else
-- moonjob's exact codec (moonjob.codec.json: LuaJIT only).
--
-- cjson is used through an instance of its own (cjson.new(): the app's
-- settings are left alone) that writes numbers with 16 significant digits
-- where the build takes it (OpenResty's), else 14 (lua-cjson 2.1.0's most):
-- integers beyond 2^53 (or 10^14 with 14 digits), and doubles with more
-- digits than that, lose their last digits. moonjob's codec keeps every
-- digit and 64-bit integers (docs/guide/producer.md says when to pick it).
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

local function cjson_codec()
  local found, cjson = pcall(require, "cjson")
  if not found or type(cjson) ~= "table" then return nil end
  local own = type(cjson.new) == "function" and cjson.new()
  if own then pcall(own.encode_number_precision, 16) end -- (lua-cjson 2.1.0 refuses more than 14)
  return wrap(own or cjson, "cjson")
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
