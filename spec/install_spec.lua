-- spec/install_spec.lua -- installing moonjob as the README's "Installing"
-- section says: make install into a prefix, LuaRocks into a tree (make, a
-- source rock from `make rock`, `luarocks test`), and the LICENSE.
--
-- Everything runs on a copy of the working tree in a temporary directory
-- (the files git knows, tracked or not, without ignored ones such as build/),
-- so the checkout's build directories are never touched, and offline:
-- LuaRocks gets --deps-mode=none or a rocks_provided config, never a server.
-- Commands run with a clean environment (PATH only, HOME in the temporary
-- directory, so the README's $HOME lines run as they are written). The copy
-- is built four times (about 10 s in all on two cores). Needs git.
local h = require "helpers"

local SQUARE = "return function(job) return job.data.x * job.data.x end\n"
local LUAROCKS = "luarocks --lua-version=5.1 "

-- A shell command line: `script` run by sh -e in `dir`, with only PATH,
-- HOME=home and the given variables in its environment.
local function clean(home, dir, script, vars)
  local path = home .. "/script.sh"
  h.write_file(path, script)
  return ("cd '%s' && env -i PATH=\"$PATH\" HOME='%s' %s sh -e '%s'"):format(dir, home, vars or "", path)
end

-- The n-th (default first) ```sh block under `heading` in the README's
-- "## Installing", as the reader copies it (without its list indentation).
local function readme_block(heading, n)
  local f = assert(io.open("README.md"))
  local text = f:read("*a")
  f:close()
  local section = assert(text:match("\n## Installing\n(.-)\n## "), "README has no Installing section")
  local after = assert((section .. "\n###"):match("\n" .. heading:gsub("%p", "%%%0") .. "\n(.-)\n###"), heading)
  local i = 0
  for indent, body in after:gmatch("\n( *)```sh\n(.-\n) *```") do
    i = i + 1
    if i == (n or 1) then return (("\n" .. body):gsub("\n" .. indent, "\n"):sub(2)) end
  end
  error("no sh block " .. (n or 1) .. " under " .. heading)
end

-- The gcc switches recorded in a binary by -frecord-gcc-switches.
local function recorded_switches(file)
  local f = assert(io.open(file, "rb"))
  local bytes = f:read("*a")
  f:close()
  local found = {}
  for switch in bytes:gmatch("%-falign%-functions=%d+") do found[switch] = true end
  return found
end

describe("installing #slow", function()
  local work, src

  setup(function()
    work = h.tmpdir()
    src = work .. "/src"
    local copy = ("mkdir %s && git ls-files -z -co --exclude-standard"
      .. " | tar --null -T - --ignore-failed-read -cf - 2>/dev/null | tar -xf - -C %s"
      .. " && cd %s && git init -q && git add -A"
      .. " && git -c user.name=spec -c user.email=spec@localhost commit -qm copy"):format(src, src, src)
    local _, err, status = h.sh(copy)
    assert(status == 0, err)
    h.write_file(work .. "/square.lua", SQUARE)
  end)

  teardown(function()
    if work then os.execute("rm -rf '" .. work .. "'") end
  end)

  it("with make install: the README's LUA_PATH and LUA_CPATH give require 'moonjob', "
    .. "the command works through a symlink, and make uninstall removes it all", function()
    local home = work .. "/make"
    assert(os.execute("mkdir -p " .. home .. "/bin") == 0)
    local block = readme_block("### With make")
    local api = [[luajit -e '
      local pool = assert(require("moonjob").pool(os.getenv("HOME") .. "/../square.lua", { size = 1 }))
      print(package.searchpath("moonjob.core", package.cpath), pool:run({ x = 5 }))
      pool:close()']]
    local out, err, status = h.sh(clean(home, src, block .. api .. "\n"))
    assert.equal(0, status, err)
    local tail = "\nmoonjob scm\n" .. home .. "/.local/lib/lua/5.1/moonjob/core.so\t25\n"
    assert.equal(tail, out:sub(-#tail)) -- after make install's own output

    -- A relative symlink in another directory, run from a third one, with no paths set.
    assert(os.execute(("ln -s ../.local/bin/moonjob %s/bin/moonjob"):format(home)) == 0)
    local out2, err2, status2 = h.sh(clean(home, work, home .. "/bin/moonjob run square.lua\n"), '{"x":12}\n')
    assert.equal(0, status2, err2)
    assert.matches('"result":144', out2)
    -- the Redis library, assembled from the parts installed beside the modules
    local lib, lib_err = h.sh(clean(home, work, home .. "/bin/moonjob library\n"))
    assert.equal(require("moonjob.redis.library").text(), lib, lib_err)

    local _, err3, status3 = h.sh(clean(home, src, "make uninstall PREFIX=$HOME/.local\n"))
    assert.equal(0, status3, err3)
    local out4 = h.sh(("find %s/.local -type f"):format(home))
    assert.equal("", out4)
  end)

  it("with luarocks make, as the README shows: both routes give a bin/moonjob that works "
    .. "without luarocks path, and luarocks path gives require 'moonjob'", function()
    local home = work .. "/rocks"
    assert(os.execute("mkdir -p " .. home) == 0)
    local block = readme_block("### With LuaRocks")
    local tree = home .. "/.moonjob"
    local first = block:match("^([^\n]*%-%-deps%-mode=none)\n")
    assert.truthy(first, "the README's first LuaRocks line is not a --deps-mode=none install")

    -- The --deps-mode=none tree alone: its wrapper sets no paths.
    local _, err, status = h.sh(clean(home, src, first .. "\n"))
    assert.equal(0, status, err)
    local out1, err1, status1 = h.sh(clean(home, work, tree .. "/bin/moonjob run square.lua\n"), '{"x":7}\n')
    assert.equal(0, status1, err1)
    assert.matches('"result":49', out1)
    local line = h.sh(clean(home, work, tree .. "/bin/moonjob library --line 2\n"))
    assert.matches("/share/lua/5%.1/moonjob/redis/functions/base%.lua:1\n$", line)

    -- The whole block (the rocks_provided route too), then the API with luarocks path.
    local api = [[luajit -e '
      local pool = assert(require("moonjob").pool(os.getenv("HOME") .. "/../square.lua", { size = 1 }))
      print(pool:run({ x = 6 })) pool:close()']]
    local out2, err2, status2 = h.sh(clean(home, src, block .. api .. "\n"))
    assert.equal(0, status2, err2)
    assert.equal("\nmoonjob scm\n36\n", out2:sub(-#"\nmoonjob scm\n36\n")) -- after luarocks' output
  end)

  it("with luarocks make after builds with other flags: rebuilt with its own flags", function()
    -- build/ of the copy holds make's build (the test above); build-luarocks/ is built here
    -- with one set of flags, then with another: each install must carry its own.
    local home = work .. "/flags"
    assert(os.execute("mkdir -p " .. home) == 0)
    local _, err0, status0 = h.sh(clean(home, src, "make all\n"))
    assert.equal(0, status0, err0)
    local lib = home .. "/tree/lib/lua/5.1/moonjob/"
    for _, align in ipairs({ "32", "64" }) do
      local config = ("%s/align%s.lua"):format(home, align)
      h.write_file(config, ('variables = { CFLAGS = "-O2 -fPIC -frecord-gcc-switches -falign-functions=%s" }\n')
        :format(align))
      local _, err, status = h.sh(clean(home, src, LUAROCKS .. "--tree=$HOME/tree make --deps-mode=none\n",
        "LUAROCKS_CONFIG=" .. config))
      assert.equal(0, status, err)
      for _, file in ipairs({ "core.so", "moonjob-child" }) do
        assert.same({ ["-falign-functions=" .. align] = true }, recorded_switches(lib .. file), file)
      end
    end
    assert.same({}, recorded_switches(src .. "/build/moonjob/core.so")) -- make's build/ untouched
  end)

  it("with luarocks make of rocks/moonjob-producer-scm-1.rockspec: the pure-Lua producer alone, whole, "
    .. "loaded by Lua 5.4 from that tree", function()
    local home = work .. "/producer"
    local tree = home .. "/tree"
    assert(os.execute("mkdir -p " .. home) == 0)
    local _, err, status = h.sh(clean(home, src, LUAROCKS .. "make rocks/moonjob-producer-scm-1.rockspec --tree "
      .. tree .. " --deps-mode=none\n"))
    assert.equal(0, status, err)
    assert.is_nil(io.open(tree .. "/share/lua/5.1/moonjob/init.lua"), "moonjob's C side was installed too")
    assert.is_nil(io.open(tree .. "/share/lua/5.1/moonjob/redis/client.lua"), "moonjob's C side was installed too")
    -- (in `work`, where no lua/ folder is: every module comes from the tree)
    local script = ([[lua5.4 -e "package.path = '%s/share/lua/5.1/?.lua;' .. package.path
      local producer = require 'moonjob.producer'
      print(#require('moonjob.redis.library').text() > 100000, package.searchpath('moonjob.producer', package.path))"
    ]]):format(tree)
    local out, err2, status2 = h.sh(clean(home, work, script))
    assert.equal(0, status2, err2)
    assert.equal("true\t" .. tree .. "/share/lua/5.1/moonjob/producer.lua\n", out)
  end)

  it("with make rock: a source rock of the checkout that luarocks builds offline", function()
    local home = work .. "/rock"
    assert(os.execute("mkdir -p " .. home) == 0)
    local block = readme_block("### With LuaRocks", 2)
    assert.matches("^make rock\n", block)
    local _, err, status = h.sh(clean(home, src, block))
    assert.equal(0, status, err)
    local rockspec = assert(io.open(src .. "/build-rock/moonjob-scm-1.rockspec")):read("*a")
    assert.truthy(rockspec:find('url = "git+file://' .. src .. '",', 1, true))
    local out, err2, status2 = h.sh(clean(home, work, "$HOME/.moonjob/bin/moonjob run square.lua\n"),
      '{"x":9}\n')
    assert.equal(0, status2, err2)
    assert.matches('"result":81', out)
  end)

  it("with luarocks test: busted runs offline, under LuaJIT, on the checkout's build", function()
    local home = work .. "/test"
    assert(os.execute("mkdir -p " .. home .. "/probe") == 0)
    -- Not named *_spec: `make test` must not pick it up from here.
    h.write_file(home .. "/probe/probe_check.lua", [[
      describe("luarocks test", function()
        it("runs under LuaJIT with build/ on the cpath", function()
          assert.truthy(jit)
          assert.equal("build/moonjob/core.so", package.searchpath("moonjob.core", package.cpath))
          assert.truthy(require("moonjob.core"))
        end)
      end)]])
    local out, err, status = h.sh(clean(home, src, LUAROCKS .. "test -- --pattern=_check $HOME/probe\n"))
    assert.equal(0, status, out .. err)
    assert.matches("1 success / 0 failures / 0 errors", out)
  end)

  it("under the MIT license the rockspec names", function()
    local env = {}
    assert(setfenv(assert(loadfile("moonjob-scm-1.rockspec")), env))()
    assert.equal("MIT", env.description.license)
    local f = assert(io.open("LICENSE"))
    local license = f:read("*a")
    f:close()
    assert.matches("^MIT License\n\nCopyright %(c%) 2026 the moonjob authors\n", license)
    assert.truthy(license:find("Permission is hereby granted, free of charge", 1, true))
    assert.truthy(license:find('THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND', 1, true))
  end)
end)
