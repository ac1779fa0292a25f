-- scripts/moonjob run from a built checkout, from another directory, with
-- LUA_PATH and LUA_CPATH unset: it finds the checkout's lua/ and build/ by
-- its own real path (through a symbolic link too); a checkout not built
-- says so in one line. (The installed layouts: spec/install_spec.lua.)
local h = require "helpers"

local ROOT = os.getenv("PWD")
local SCRIPT = ROOT .. "/scripts/moonjob"

-- Runs `command` from directory `dir` with LUA_PATH and LUA_CPATH unset.
local function bare(dir, command)
  return h.sh(("cd '%s' && env -u LUA_PATH -u LUA_CPATH -u LUA_INIT %s"):format(dir, command))
end

describe("scripts/moonjob from a checkout #slow", function()
  local dir
  before_each(function() dir = h.tmpdir() end)
  after_each(function() os.execute("rm -rf " .. dir) end)

  it("prints its help from another directory", function()
    assert.truthy(io.open(ROOT .. "/build/moonjob/core.so"), "build the checkout first (make)")
    local out, err, status = bare(dir, SCRIPT .. " --help")
    assert.equal("", err)
    assert.equal(0, status)
    assert.matches("^usage: moonjob run PROCESSOR", out)
  end)

  it("runs a processor, from another directory and through a symbolic link", function()
    h.write_file(dir .. "/square.lua", "return function(job) return job.data * job.data end\n")
    h.write_file(dir .. "/in.ndjson", "3\n4\n")
    os.execute(("ln -s '%s' '%s/moonjob'"):format(SCRIPT, dir))
    for _, command in ipairs({ SCRIPT, "./moonjob" }) do
      local out, err, status = bare(dir, command .. " run -k -j 2 --no-progress square.lua in.ndjson")
      assert.equal("", err)
      assert.equal(0, status)
      assert.matches('^{"line":1,"status":"completed","result":9,.-\n{"line":2,"status":"completed","result":16,', out)
    end
  end)

  it("says in one line that a checkout is not built", function()
    os.execute(("mkdir -p '%s/co/scripts' && cp -r '%s/lua' '%s/co/' && cp '%s' '%s/co/scripts/'")
      :format(dir, ROOT, dir, SCRIPT, dir))
    local out, err, status = bare(dir, dir .. "/co/scripts/moonjob --help")
    assert.equal(2, status)
    assert.equal("", out)
    assert.equal(("moonjob: this checkout is not built (%s/co/build/moonjob/core.so is missing): run make in %s/co\n")
      :format(dir, dir), err)
  end)
end)
