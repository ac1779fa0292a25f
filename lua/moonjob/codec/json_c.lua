-- moonjob.codec.json_c -- the JSON codec's C half (core/json_scan.c: the
-- UTF-8 check and the scanner), found through the FFI, or nil.
--
-- In the child program its own symbols (ffi.C: it is linked -rdynamic);
-- in any other program those of core.so, found on package.cpath and opened
-- with ffi.load, which runs no luaopen (no event loop, nothing changed in the
-- process). Without either (a plain luajit without moonjob's build)
-- moonjob.codec.utf8 and moonjob.codec.json do the same work in Lua.
--
-- Caveat: the declarations below are a contract with core/json_scan.h:
-- change both together.
local ffi = require "ffi"

local package, pcall = package, pcall -- (kept at load, as the codec's other parts keep theirs)

if not pcall(ffi.typeof, "moonjob_json_scan_t") then -- (once per state: the module may load again)
  ffi.cdef [[
typedef struct moonjob_json_scan_s {
  int32_t status; uint32_t markers; double at; double length; double written;
  uint32_t fixups; uint32_t key_at[8]; uint32_t key_length[8]; uint32_t value_at[8]; uint8_t kind[8];
} moonjob_json_scan_t;
size_t moonjob_utf8_error_at(const char *text, size_t len);
int moonjob_json_scan(const char *text, size_t len, char *out, size_t room, int max_depth,
                      moonjob_json_scan_t *r);
int64_t moonjob_json_int64(const char *marker);
uint64_t moonjob_json_uint64(const char *marker);
int64_t moonjob_json_int64_at(const char *text, size_t at);
uint64_t moonjob_json_uint64_at(const char *text, size_t at);
]]
end

local function has_scanner(lib)
  return pcall(function() return lib.moonjob_json_scan, lib.moonjob_json_uint64_at end)
end

-- { lib = the FFI library, from = where it was found ("the program" or
-- "core.so": the specs check it) }, both nil when it is not there (a table
-- all the same: require would load a module that returned false again).
local function find()
  if has_scanner(ffi.C) then return { lib = ffi.C, from = "the program" } end
  local path = package.searchpath and package.searchpath("moonjob.core", package.cpath)
  local ok, lib = false, nil
  if path then ok, lib = pcall(ffi.load, path) end
  if ok and has_scanner(lib) then return { lib = lib, from = "core.so" } end
  return {}
end

return find()
