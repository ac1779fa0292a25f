local h = require "helpers"

-- Each install goes to a fresh temporary tree, used from a directory that is
-- not the source tree, so nothing can come from the checkout by accident.

local SQUARE = [[return function(job) return job.data.x * job.data.x end]]

describe("installing", function()
  local src = h.first_line("pwd")

  it("with luarocks make into a tree gives a working module, core, child and command", function()
    local dir = h.tmpdir()
    h.write_file(dir .. "/config.lua", 'rocks_provided = { ["lua-cjson"] = "2.1.0-1" }\n')
    h.write_file(dir .. "/square.lua", SQUARE)
    local _, err, status = h.sh(("cd %s && LUAROCKS_CONFIG=%s/config.lua luarocks --lua-version=5.1 "
      .. "--tree=%s/tree make moonjob-scm-1.rockspec"):format(src, dir, dir))
    assert.equal(0, status, err)
    local paths = ('cd %s && eval "$(luarocks --lua-version=5.1 --tree=%s/tree path)" && '):format(dir, dir)
    local out, err2, status2 = h.sh(paths .. "tree/bin/moonjob run square.lua", '{"x":12}\n')
    assert.equal(0, status2, err2)
    assert.matches('"result":144', out)
    local out3, err3, status3 = h.sh(paths .. [[luajit -e '
      local pool = assert(require("moonjob").pool("square.lua", { size = 1 }))
      print(pool:run({ x = 5 }))
      pool:close()']])
    assert.equal(0, status3, err3)
    assert.equal("25\n", out3)
    os.execute("rm -rf " .. dir)
  end)

  it("with make install PREFIX=... gives a command that finds its own modules", function()
    local dir = h.tmpdir()
    h.write_file(dir .. "/square.lua", SQUARE)
    local _, err, status = h.sh(("cd %s && make install PREFIX=%s/prefix"):format(src, dir))
    assert.equal(0, status, err)
    local out, err2, status2 = h.sh(("cd %s && prefix/bin/moonjob run square.lua"):format(dir),
      '{"x":3}\n')
    assert.equal(0, status2, err2)
    assert.matches('"result":9', out)
    os.execute("rm -rf " .. dir)
  end)
end)
