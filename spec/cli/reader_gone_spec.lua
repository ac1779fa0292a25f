-- `moonjob run` when the reader of its results goes away (`| head`): it
-- stops quietly with the lines' status, as GNU parallel does; under
-- --joblog, where the log is the run's record, a reader gone before every
-- result was delivered is said on stderr and exits 2 (--resume runs the rest).
local h = require "helpers"
local cli = require "cli"

local MOONJOB = cli.MOONJOB

-- Runs moonjob with `args` over `input`, its stdout into `reader`. -> exit
-- status, stderr.
local function piped(args, input, reader)
  local status_file, err_file = os.tmpname(), os.tmpname()
  os.execute(("{ %s %s <%s 2>%s; echo $? >%s; } | %s >/dev/null")
    :format(MOONJOB, args, input, err_file, status_file, reader))
  local status = tonumber((assert(io.open(status_file)):read("*a")))
  local err = assert(io.open(err_file)):read("*a")
  os.remove(status_file); os.remove(err_file)
  return status, err
end

describe("moonjob run when its reader goes away", function()
  local input, log
  before_each(function()
    input = h.write_file(os.tmpname(), cli.numbers(50000)) -- results: far more than a pipe holds
    log = os.tmpname()
    os.remove(log)
  end)
  after_each(function() os.remove(input); os.remove(log) end)

  it("stops quietly with the status of the lines that finished", function()
    local status, err = piped("run -j 2 --no-progress spec/fixtures/echo.lua", input, "head -c 1")
    assert.equal("", err)
    assert.equal(0, status)
  end)

  it("under --joblog says that results were not delivered and exits 2", function()
    local status, err = piped("run -j 2 --no-progress --joblog " .. log .. " spec/fixtures/echo.lua", input, "head -c 1")
    assert.equal(2, status, err)
    assert.matches("^moonjob: standard output's reader went away %(EPIPE%) before every result was delivered; "
      .. "the run stopped: the joblog '.-' records the lines printed, and %-%-resume runs the rest\n$", err)
    local recorded = select(2, (cli.read(log) or ""):gsub("\n", ""))
    assert.is_true(recorded < 50000, recorded .. " lines recorded")
  end)

  it("under --joblog exits 0 when every result was delivered", function()
    local small = h.write_file(os.tmpname(), cli.numbers(3))
    local status, err = piped("run --no-progress --joblog " .. log .. " spec/fixtures/echo.lua", small, "cat")
    os.remove(small)
    assert.equal("", err)
    assert.equal(0, status)
    assert.equal(3, select(2, cli.read(log):gsub("\n", "")))
  end)
end)
