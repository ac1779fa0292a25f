-- `moonjob run` with its input typed on a terminal (a real pseudo-terminal,
-- spec/support/terminal.lua): it says once on stderr that it reads the
-- terminal and how to end it, draws no progress line over what is typed,
-- runs each line typed, and ends at Ctrl-D with its summary.
local terminal = require "terminal"

local WARNING = "moonjob: reading input from the terminal, one line per job; end it with Ctrl-D"

describe("moonjob run reading a terminal #slow", function()
  it("says so once, draws no progress line over what is typed, and ends at Ctrl-D", function()
    local transcript, status = terminal.run({
      argv = terminal.moonjob("run", "-j", "1", "spec/fixtures/pause_ms.lua"),
      tty = { 0, 1, 2 },
      steps = {
        { wait = "Ctrl-D\r\n", send = "30\n" },
        { wait = '"line":1,"status":"completed"', send = "40\n" },
        { wait = '"line":2,"status":"completed"[^\n]*\n', send = "\4" },
      },
      timeout = 30,
    })
    assert.equal(0, status, transcript)
    assert.truthy(transcript:find(WARNING, 1, true), transcript)
    assert.equal(1, select(2, transcript:gsub("reading input from the terminal", "")), "not said once")
    local typed_end = assert(transcript:find('"line":2,"status":"completed"[^\n]*\n'))
    assert.is_nil(transcript:sub(1, typed_end):find("\27[K", 1, true), "a progress line was drawn: " .. transcript)
    assert.matches("moonjob: 2 lines: 2 completed, 0 failed", transcript:sub(typed_end))
  end)

  it("says nothing of a terminal when the input is a file, while stderr is one", function()
    local input = os.tmpname()
    local f = assert(io.open(input, "w"))
    f:write("1\n2\n")
    f:close()
    local transcript, status = terminal.run({
      argv = terminal.moonjob("run", "-j", "1", "spec/fixtures/pause_ms.lua", input), tty = { 2 } })
    os.remove(input)
    assert.equal(0, status)
    assert.is_nil(transcript:find("reading input from the terminal", 1, true))
    assert.matches("moonjob: 2 lines: 2 completed", transcript)
  end)
end)
