-- moonjob.cli.progress -- what `moonjob run` shows on a terminal while it runs:
-- a progress line on stderr, and a one-line summary at the end.
--
--   1,679/~20,000 lines  8%  841/s  ETA 0:24  3 failed
--   moonjob: 20,000 lines: 19,997 completed, 3 failed in 23.8 s (841 lines/s)
--
-- The line's text is made anew at most 10 times a second (on a timer of
-- the loop, and at the end of each loop turn of the run when due), and the
-- line is drawn again after anything else was written: it is erased ("\r",
-- then erase to the end of the line) before anything else is written to
-- stderr, and before any write to stdout when stdout is not a regular file (a
-- terminal, or a pipe whose reader may print there). At the end of the loop
-- turn that wrote results, what stdout was given is written out at once
-- (output:flush), and the line is redrawn right after, so that it stays on
-- the screen while results stream, instead of showing only between two
-- bursts. When stdout has not taken everything (a full pipe, a terminal
-- paused with Ctrl-S), the line waits for it: it never sits in the middle of
-- a result line. Caveat: a reader on a pipe prints when it likes; its lines
-- can still meet a redraw.
--
-- While the input is read from a terminal (the user types the lines), no
-- line is drawn: it would glue itself to what is typed. It appears once the
-- input ends (Ctrl-D).
--
-- With INPUT a file, the total is estimated from its size and
-- the bytes per line read so far (shown with "~") until the input is read
-- to its end, and the percentage and ETA follow it; from a stream, only the
-- count and the rate.
--
-- Caveat: a line wider than the terminal wraps, and erasing then clears only
-- its last row; the line is kept short (about 60 columns) for that reason.
local core = require "moonjob.core"
local loop = require "moonjob.loop"

local M = {}

local ERASE = "\r\27[K"
local REFRESH_MS = 100

-- 1234567 -> "1,234,567"
local function grouped(n)
  local text = ("%d"):format(math.floor(n))
  local lead = (#text - 1) % 3 + 1 -- digits before the first comma
  return text:sub(1, lead) .. (text:sub(lead + 1):gsub("%d%d%d", ",%0"))
end

-- seconds -> "0:24", "12:05", "3:12:05"
local function clock(s)
  s = math.floor(s + 0.5)
  local h, m = math.floor(s / 3600), math.floor(s / 60) % 60
  if h > 0 then return ("%d:%02d:%02d"):format(h, m, s % 60) end
  return ("%d:%02d"):format(m, s % 60)
end

local function lines_text(n)
  return grouped(n) .. (n == 1 and " line" or " lines")
end

local function rate_text(n)
  if n >= 100 then return grouped(n) end
  return ("%.1f"):format(n)
end

-- What the progress line says. s: lines completed, failed and skipped
-- (blank, or --resume), lines read, bytes read, whether the input is read to
-- its end, the input's size (nil: a stream), seconds since the start.
function M.describe(s)
  local done = s.completed + s.failed + s.skipped
  local rate = s.elapsed > 0 and done / s.elapsed or 0
  local parts = {}
  local total, estimated = nil, false
  if s.input_ended then
    total = s.read
  elseif s.size and s.read > 0 and s.bytes > 0 then
    total, estimated = math.max(s.read, s.size * s.read / s.bytes), true
  end
  if total and total > 0 then
    parts[1] = ("%s/%s%s lines"):format(grouped(done), estimated and "~" or "", grouped(total))
    local fraction = math.min(1, done / total)
    parts[2] = ("%d%%"):format(math.floor(fraction * 100))
    parts[3] = rate_text(rate) .. "/s"
    if fraction > 0 and fraction < 1 then parts[4] = "ETA " .. clock(s.elapsed * (1 - fraction) / fraction) end
  else
    parts[1] = lines_text(done)
    parts[2] = rate_text(rate) .. "/s"
  end
  if s.failed > 0 then parts[#parts + 1] = grouped(s.failed) .. " failed" end
  return table.concat(parts, "  ")
end

-- The summary at the end: completed, failed (and skipped), wall time, rate.
function M.summary(s)
  local done = s.completed + s.failed + s.skipped
  local rate = s.elapsed > 0 and done / s.elapsed or 0
  local skipped = s.skipped > 0 and (", %s skipped"):format(grouped(s.skipped)) or ""
  return ("moonjob: %s: %s completed, %s failed%s in %.1f s (%s lines/s)"):format(
    lines_text(done), grouped(s.completed), grouped(s.failed), skipped, s.elapsed, rate_text(rate))
end

-- progress.new(state, opts) -> display.
-- state() -> the table M.describe reads (elapsed is filled in here).
-- opts.stdout_may_show: stdout is not a regular file, or the joblog is not
-- (what is written there may show on the terminal); opts.flush_output()
-- writes out what stdout was given and returns the bytes it has not taken
-- yet; opts.hidden() -> true while the line must not be drawn (the input is
-- read from a terminal).
function M.new(state, opts)
  local started = loop.now()
  local stdout_may_show, flush_output = opts.stdout_may_show, opts.flush_output
  local hidden = opts.hidden or function() return false end
  local shown = false -- the line is on the screen
  local text, made_at = nil, -math.huge -- its text, and when it was made
  local display = {}

  local function snapshot()
    local s = state()
    s.elapsed = (loop.now() - started) / 1000
    return s
  end

  -- Erases the line if it is on the terminal.
  function display.erase()
    if shown then
      io.stderr:write(ERASE)
      shown = false
    end
  end

  -- Writes text to stderr, the line erased first (redrawn at the turn's end).
  function display.write_stderr(text_out)
    display.erase()
    io.stderr:write(text_out)
  end

  -- Called before each write to stdout.
  function display.before_stdout()
    if stdout_may_show then display.erase() end
  end

  -- Draws the line again when it was erased, or when its text is due (every
  -- REFRESH_MS): called at the end of each loop turn of the run, and by the
  -- timer. Results given to stdout go out first.
  function display.refresh()
    if hidden() then return end
    local now = loop.now()
    local due = now - made_at >= REFRESH_MS
    if shown and not due then return end
    if stdout_may_show and flush_output() > 0 then return end -- (drawn once stdout took them)
    if due then text, made_at = M.describe(snapshot()), now end
    io.stderr:write(ERASE, text)
    shown = true
  end

  local timer = core.timer(function() display.refresh() end)
  timer:start(REFRESH_MS, REFRESH_MS)
  timer:unref()

  -- Stops the display; with `summary`, writes the summary line.
  function display.close(summary)
    timer:close()
    display.erase()
    if summary then io.stderr:write(M.summary(snapshot()), "\n") end
  end

  return display
end

return M
