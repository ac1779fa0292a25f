-- What `moonjob run` shows on a terminal: run under a pseudo-terminal
-- (script(1)), its transcript played on a tiny terminal (carriage return,
-- erase to the end of the line, newline) to see the screen a user is left
-- with: result lines and processor lines whole, never glued to the progress
-- line, and a one-line summary at the end.
local h = require "helpers"
local json = require "moonjob.codec.json"
local cli = require "cli"

local MOONJOB, HABITS = cli.MOONJOB, cli.HABITS
local PROGRESS = "%d+/~?[%d,]+ lines  %d+%%  [%d.,]+/s" -- done/total lines, percent, rate

-- Runs shell command `command` under a pseudo-terminal; returns what the
-- terminal received and the command's exit status.
local function on_terminal(command)
  local out, _, status = h.sh("script -qec " .. ("%q"):format(command) .. " /dev/null")
  return out, status
end

-- The screen after `transcript`: a list of its lines. "\r" moves to the
-- start of the line, ESC [ K erases from there to its end, "\n" ends it.
local function screen(transcript)
  local lines, current, column = {}, {}, 1
  local i = 1
  while i <= #transcript do
    local c = transcript:sub(i, i)
    if transcript:sub(i, i + 2) == "\27[K" then
      for k = column, #current do current[k] = nil end
      i = i + 3
    else
      if c == "\r" then column = 1
      elseif c == "\n" then
        lines[#lines + 1] = table.concat(current)
        current, column = {}, 1
      else
        current[column] = c
        column = column + 1
      end
      i = i + 1
    end
  end
  if #current > 0 then lines[#lines + 1] = table.concat(current) end
  return lines
end

-- An input file of `n` lines that each take `sleep` seconds; the third fails,
-- every fourth prints.
local function slow_input(n, sleep)
  local t = {}
  for i = 1, n do
    t[i] = json.encode({ sleep = sleep, fail = i == 3 and "EBAD" or nil,
      print = i % 4 == 0 and ("hello from " .. i) or nil })
  end
  return h.write_file(os.tmpname(), table.concat(t, "\n") .. "\n")
end

local SUMMARY = "^moonjob: 10 lines: 9 completed, 1 failed in [%d.]+ s %([%d.,]+ lines/s%)$"

describe("moonjob run on a terminal #slow", function()
  local input
  before_each(function() input = slow_input(10, 0.15) end)
  after_each(function() os.remove(input) end)

  it("draws progress on stderr, erased before every result and processor line, and ends with a summary", function()
    local transcript, status = on_terminal(MOONJOB .. "run -j 2 " .. HABITS .. " " .. input)
    assert.equal(1, status)
    assert.matches(PROGRESS, transcript) -- drawn at least once
    local lines = screen(transcript)
    local results, printed = 0, 0
    for n, line in ipairs(lines) do
      if n == #lines then
        assert.matches(SUMMARY, line)
      elseif line:match("^%[line (%d+)%] hello from %1$") then
        printed = printed + 1
      else
        local v = json.decode(line)
        assert.is_table(v, "a screen line is neither a result nor a processor line: " .. line)
        results = results + 1
      end
    end
    assert.equal(10, results)
    assert.equal(2, printed)
  end)

  it("with stdout elsewhere, shows the total, percent, rate and ETA of a file, and leaves stdout clean", function()
    local out = os.tmpname()
    local transcript = on_terminal(MOONJOB .. "run -j 2 " .. HABITS .. " " .. input .. " >" .. out)
    local f = assert(io.open(out, "rb"))
    local written = f:read("*a")
    f:close()
    os.remove(out)
    assert.is_nil(written:find("\27", 1, true))
    assert.equal(10, select(2, written:gsub("\n", "")))
    assert.matches("%d+/~?10 lines  %d+%%  [%d.,]+/s  ETA %d+:%d%d", transcript)
    local lines = screen(transcript)
    assert.matches(SUMMARY, lines[#lines])
  end)

  it("from a stream still open, shows the count and the rate, with no total nor ETA", function()
    local transcript = on_terminal("(cat " .. input .. "; sleep 1.5) | " .. MOONJOB .. "run -j 2 " .. HABITS
      .. " >/dev/null")
    local draws = {}
    for text in transcript:gmatch("\r\27%[K([^\r\n]*)") do
      if text:find("^%d") then draws[#draws + 1] = text end
    end
    assert.is_true(#draws > 0, transcript)
    assert.matches("^%d+ lines?  [%d.,]+/s", draws[1]) -- no total, no ETA: the input has not ended
    assert.is_nil(draws[1]:find("ETA", 1, true))
    local lines = screen(transcript)
    assert.matches(SUMMARY, lines[#lines])
  end)

  it("erases it before joblog lines that go to the terminal too (--joblog /dev/stderr)", function()
    local transcript = on_terminal(MOONJOB .. "run -j 2 --joblog /dev/stderr " .. HABITS .. " " .. input .. " >/dev/null")
    assert.matches(PROGRESS, transcript) -- drawn at least once
    local lines, records = screen(transcript), 0
    for n, line in ipairs(lines) do
      if n == #lines then assert.matches(SUMMARY, line)
      elseif not line:match("^%[line (%d+)%] hello from %1$") then
        assert.is_table(json.decode(line), "a screen line is neither a joblog record nor a processor line: " .. line)
        records = records + 1
      end
    end
    assert.equal(10, records)
  end)

  it("shows nothing of it with --no-progress", function()
    local transcript = on_terminal(MOONJOB .. "run --no-progress -j 2 " .. HABITS .. " " .. input .. " >/dev/null")
    assert.is_nil(transcript:find("\27[K", 1, true))
    assert.is_nil(transcript:find("moonjob: 10 lines", 1, true))
  end)
end)

describe("moonjob run off a terminal #slow", function()
  it("shows no progress nor summary, unless --progress asks for them", function()
    local input = slow_input(10, 0.05)
    local _, err = h.sh(MOONJOB .. "run -j 2 " .. HABITS .. " " .. input .. " >/dev/null")
    assert.equal("", (err:gsub("%[line %d+%] hello from %d+\n", "")))
    _, err = h.sh(MOONJOB .. "run --progress -j 2 " .. HABITS .. " " .. input .. " >/dev/null")
    os.remove(input)
    local lines = screen(err)
    assert.matches(SUMMARY, lines[#lines])
  end)
end)
