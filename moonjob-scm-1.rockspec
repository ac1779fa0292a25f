rockspec_format = "3.0"
package = "moonjob"
version = "scm-1"
-- Built from a checkout with `luarocks make` (or `luarocks build` with no
-- argument), which never fetches: source.url is not used then. LuaRocks 3.8
-- resolves a relative url in its own temporary directory, so no url written
-- here can name a checkout wherever it is; `make rock` packs a source rock of
-- the checkout with a copy of this file whose url is its absolute path.
source = {
  url = "git+file://.",
}
description = {
  summary = "Run Lua processor files in a pool of sandboxed LuaJIT child processes",
  detailed = [[
A C core (libuv) owns the event loop, a pool of child processes and their
channels; each child embeds LuaJIT and runs a processor file written in Lua.
Comes with a Lua API (moonjob.pool) and a command, `moonjob run`.
]],
  license = "MIT", -- LICENSE
}
supported_platforms = { "linux" }
dependencies = {
  "lua == 5.1",
  "lua-cjson",
}
external_dependencies = {
  LIBUV = { header = "uv.h", library = "uv" },
  LUAJIT = { header = "luajit-2.1/luajit.h", library = "luajit-5.1" },
  HIREDIS = { header = "hiredis/read.h", library = "hiredis" },
  OPENSSL = { header = "openssl/ssl.h", library = "ssl" },
  HTTP_PARSER = { header = "http_parser.h", library = "http_parser" },
}
-- The Makefile builds into build-luarocks/, never into the build/ of `make`,
-- and rebuilds when the flags change (it records them in build-luarocks/flags).
-- The same flags go to `make install`, which builds first.
build = {
  type = "make",
  variables = {
    CFLAGS = "$(CFLAGS)",
    LIBFLAG = "$(LIBFLAG)",
    LUA_INCDIR = "/usr/include/luajit-2.1",
    BUILD = "build-luarocks",
  },
  install_variables = {
    PREFIX = "$(PREFIX)",
    BINDIR = "$(BINDIR)",
    LIBDIR = "$(LIBDIR)",
    LUADIR = "$(LUADIR)",
  },
}
-- `luarocks test [-- BUSTED ARGS]`: the suite with busted from PATH (Debian's
-- lua-busted, or a rock), configured by .busted (LuaJIT, build/). A command,
-- not type "busted", which requires busted installed as a rock: offline,
-- Debian's is invisible to LuaRocks and the test would try to download one.
test = {
  type = "command",
  command = "make all spec-host && busted",
}
