-- The progress line stays on the screen while results stream (a real
-- pseudo-terminal, spec/support/terminal.lua): with results on the same
-- terminal it is drawn again after each burst of result lines, not only
-- now and then between two bursts; with results to a pipe, the pipe gets
-- none of its bytes while stderr shows it drawn again and again.
local terminal = require "terminal"

local LINES = 300 -- of 5 ms each, one child: about 1.5 s of steady results

local function input_file()
  local path = os.tmpname()
  local f = assert(io.open(path, "w"))
  for _ = 1, LINES do f:write("5\n") end
  f:close()
  return path
end

-- What `transcript` shows, in order: "R" for a result line, "D" for a
-- progress line drawn.
local function sequence(transcript)
  local seq, pos = {}, 1
  while true do
    local rs, re = transcript:find('{"line":%d+[^\n]*\n', pos)
    local ds, de = transcript:find("\r\27%[K%d[^\r\n\27]*", pos)
    if not rs and not ds then return seq end
    if rs and (not ds or rs < ds) then seq[#seq + 1], pos = "R", re + 1
    else seq[#seq + 1], pos = "D", de + 1 end
  end
end

describe("the progress line while results stream #slow", function()
  local input
  before_each(function() input = input_file() end)
  after_each(function() os.remove(input) end)

  it("is drawn again after the result lines that went to its terminal", function()
    local transcript, status = terminal.run({
      argv = terminal.moonjob("run", "-j", "1", "spec/fixtures/pause_ms.lua", input), tty = { 0, 1, 2 } })
    assert.equal(0, status)
    local seq = sequence(transcript)
    local results, redrawn = 0, 0
    for i, kind in ipairs(seq) do
      if kind == "R" then
        results = results + 1
        if seq[i + 1] == "D" then redrawn = redrawn + 1 end
      end
    end
    assert.equal(LINES, results)
    -- each result line comes in a loop turn of its own (one child, 5 ms a
    -- line): the line is back after nearly every one (not after 1 in 20)
    assert.is_true(redrawn >= LINES * 0.8, ("drawn again after %d of %d result lines"):format(redrawn, results))
  end)

  it("leaves a pipe on stdout clean while stderr shows it again and again", function()
    local transcript, status, piped = terminal.run({
      argv = terminal.moonjob("run", "-j", "1", "spec/fixtures/pause_ms.lua", input),
      tty = { 0, 2 }, stdout = "pipe" })
    assert.equal(0, status)
    assert.is_nil(piped:find("\27", 1, true))
    assert.is_nil(piped:find("lines", 1, true))
    assert.equal(LINES, select(2, piped:gsub('{"line":%d+,"status":"completed"[^\n]*\n', "")))
    local draws = terminal.draws(transcript)
    -- drawn again after the results of nearly every loop turn (one a line here), not 10 times a second
    assert.is_true(#draws >= LINES / 2, "drawn " .. #draws .. " times")
    assert.matches("\r\27%[Kmoonjob: " .. LINES .. " lines: " .. LINES .. " completed[^\n]*\n$", transcript)
  end)
end)
