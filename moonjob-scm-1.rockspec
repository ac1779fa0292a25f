rockspec_format = "3.0"
package = "moonjob"
version = "scm-1"
source = {
  url = "git+file:///moonjob",
}
description = {
  summary = "Run Lua processor files in a pool of sandboxed LuaJIT child processes",
  detailed = [[
A C core (libuv) owns the event loop, a pool of child processes and their
channels; each child embeds LuaJIT and runs a processor file written in Lua.
Comes with a Lua API (moonjob.pool) and a command, `moonjob run`.
]],
  license = "MIT",
}
supported_platforms = { "linux" }
dependencies = {
  "lua == 5.1",
  "lua-cjson",
}
external_dependencies = {
  LIBUV = { header = "uv.h", library = "uv" },
  LUAJIT = { header = "luajit-2.1/luajit.h", library = "luajit-5.1" },
  HIREDIS = { header = "hiredis/async.h", library = "hiredis" },
}
build = {
  type = "make",
  build_variables = {
    CFLAGS = "$(CFLAGS)",
    LIBFLAG = "$(LIBFLAG)",
    LUA_INCDIR = "/usr/include/luajit-2.1",
  },
  install_variables = {
    PREFIX = "$(PREFIX)",
    BINDIR = "$(BINDIR)",
    LIBDIR = "$(LIBDIR)",
    LUADIR = "$(LUADIR)",
  },
}
test = {
  type = "busted",
}
