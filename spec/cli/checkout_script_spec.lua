-- scripts/moonjob run from a built checkout, from another directory, with
-- LUA_PATH and LUA_CPATH unset: it finds the checkout's lua/ and build/ by
-- its own real path (through a symbolic link too); a checkout not built
-- says so in one line. (The installed layouts: spec/install_spec.lua.)
--
-- Caveat: under `make sanitize` the build in use is not build/: the
-- checkout is then one made of links (its lua/ and the sanitizer's build as
-- build/), run with the sanitizer's runtime preloaded.
local h = require "helpers"

local ROOT = os.getenv("PWD")
local PRELOAD = os.getenv("MOONJOB_PRELOAD")

-- The script of a built checkout: this one's, or under `make sanitize` one
-- in `dir` whose lua/ and build/ are links to this one's and its build.
local function built_script(dir)
  if h.BUILD == "build" then return ROOT .. "/scripts/moonjob" end
  os.execute(("mkdir -p '%s/co/scripts' && ln -s '%s/lua' '%s/co/lua' && ln -s '%s/%s' '%s/co/build'"
    .. " && cp '%s/scripts/moonjob' '%s/co/scripts/'"):format(dir, ROOT, dir, ROOT, h.BUILD, dir, ROOT, dir))
  return dir .. "/co/scripts/moonjob"
end

-- Runs `command` from directory `dir` with LUA_PATH and LUA_CPATH unset.
local function bare(dir, command)
  return h.sh(("cd '%s' && env -u LUA_PATH -u LUA_CPATH -u LUA_INIT %s %s"):format(dir,
    PRELOAD and ("LD_PRELOAD=" .. PRELOAD) or "", command))
end

describe("scripts/moonjob from a checkout #slow", function()
  local dir
  before_each(function() dir = h.tmpdir() end)
  after_each(function() os.execute("rm -rf " .. dir) end)

  it("prints its help from another directory", function()
    local out, err, status = bare(dir, built_script(dir) .. " --help")
    assert.equal("", err)
    assert.equal(0, status)
    assert.matches("^usage: moonjob run PROCESSOR", out)
  end)

  it("runs a processor, from another directory and through a symbolic link", function()
    h.write_file(dir .. "/square.lua", "return function(job) return job.data * job.data end\n")
    h.write_file(dir .. "/in.ndjson", "3\n4\n")
    local script = built_script(dir)
    os.execute(("ln -s '%s' '%s/moonjob'"):format(script, dir))
    for _, command in ipairs({ script, "./moonjob" }) do
      local out, err, status = bare(dir, command .. " run -k -j 2 --no-progress square.lua in.ndjson")
      assert.equal("", err)
      assert.equal(0, status)
      assert.matches('^{"line":1,"status":"completed","result":9,.-\n{"line":2,"status":"completed","result":16,', out)
    end
  end)

  it("says in one line that a checkout is not built", function()
    os.execute(("mkdir -p '%s/co/scripts' && cp -r '%s/lua' '%s/co/' && cp '%s' '%s/co/scripts/'")
      :format(dir, ROOT, dir, ROOT .. "/scripts/moonjob", dir))
    local out, err, status = bare(dir, dir .. "/co/scripts/moonjob --help")
    assert.equal(2, status)
    assert.equal("", out)
    assert.equal(("moonjob: this checkout is not built (%s/co/build/moonjob/core.so is missing): run make in %s/co\n")
      :format(dir, dir), err)
  end)
end)
