-- spec/child/processor_dir_spec.lua -- a processor finds its own directory without
-- debug.getinfo: `local dir = ...` at its top level, job.dir in a job.
--
-- Each case runs a program of its own from another working directory (a
-- fresh one under /tmp), with this tree's modules on absolute paths, so that
-- a path relative to the working directory would find nothing.
local h = require "helpers"

local REPO = os.getenv("PWD")
local FIXTURE = REPO .. "/spec/fixtures/beside/reads_beside.lua"

-- h.LUAJIT with its module paths made absolute (the command runs elsewhere).
local function luajit_anywhere()
  return (h.LUAJIT:gsub('LUA_PATH="lua/', 'LUA_PATH="' .. REPO .. '/lua/')
    :gsub(';lua/%?/init%.lua', ';' .. REPO .. '/lua/?/init.lua')
    :gsub('LUA_CPATH="([^/])', 'LUA_CPATH="' .. REPO .. '/%1'))
end

-- Runs a Lua program from directory `cwd`; returns its stdout, stderr, status.
local function run_in(cwd, program)
  local file = h.write_file(cwd .. "/program.lua", program)
  return h.sh(("cd %s && %s %s"):format(cwd, luajit_anywhere(), file))
end

-- A program that runs one job of `processor` (a path as given to moonjob.pool)
-- with data "apple.txt" and prints the result's fields, one per line.
local function one_job(processor)
  return ([[
local moonjob = require "moonjob"
local pool = assert(moonjob.pool(%q, { size = 1, echo = false }))
local result, err = pool:run("apple.txt")
pool:close()
if not result then io.stderr:write(tostring(err), "\n") os.exit(1) end
for _, k in ipairs({ "greeting", "word", "dir", "file", "job_dir", "neighbour" }) do print(k .. "=" .. result[k]) end
]]):format(processor)
end

describe("a processor's own directory", function()
  local cwd
  before_each(function() cwd = h.tmpdir() end)
  after_each(function() os.execute("rm -rf " .. cwd) end)

  it("is `...` at its top level and job.dir in a job, absolute, from any working directory", function()
    local out, err, status = run_in(cwd, one_job(FIXTURE))
    assert.equal(0, status, err)
    local dir = REPO .. "/spec/fixtures/beside"
    assert.equal(table.concat({
      "greeting=hello from beside\n", "word=apple\n", "dir=" .. dir, "file=" .. FIXTURE, "job_dir=" .. dir,
      "neighbour=the module beside", "",
    }, "\n"), out)
  end)

  it("is absolute when the processor's path is relative to the working directory", function()
    local relative = ("%s/spec/fixtures/beside/reads_beside.lua"):format(REPO:gsub("^/", ("../"):rep(10)))
    local out, err, status = run_in(cwd, one_job(relative))
    assert.equal(0, status, err)
    assert.matches("\ndir=" .. REPO:gsub("%p", "%%%0") .. "/spec/fixtures/beside\n", out)
    assert.matches("\nfile=" .. relative:gsub("%p", "%%%0") .. "\n", out) -- the path as given
  end)

  it("is the real file's directory when the processor is reached through a symbolic link", function()
    assert.equal(0, os.execute(("ln -s %s %s/link.lua"):format(FIXTURE, cwd)))
    local out, err, status = run_in(cwd, one_job("link.lua"))
    assert.equal(0, status, err)
    assert.matches("^greeting=hello from beside\n\nword=apple\n\ndir=" .. REPO:gsub("%p", "%%%0"), out)
    assert.matches("\nneighbour=the module beside\n$", out) -- require finds the modules beside the real file
  end)

  it("is job.dir for each line of a batch of the command line", function()
    h.write_file(cwd .. "/input.ndjson", ('"apple.txt"\n'):rep(50))
    local out, err, status = h.sh(("cd %s && %s %s/scripts/moonjob run -j 1 %s input.ndjson")
      :format(cwd, luajit_anywhere(), REPO, FIXTURE))
    assert.equal(0, status, err)
    local n = 0
    for line in out:gmatch("[^\n]+") do
      n = n + 1
      assert.matches('"word":"apple\\n"', line, 1, true)
    end
    assert.equal(50, n)
  end)
end)
