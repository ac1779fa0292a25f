-- The progress line's redraws (moonjob.cli.progress), with stderr captured:
-- drawn again at the end of the turn that erased it, after stdout took what
-- it was given; not while stdout still holds bytes, nor while the input is
-- typed on a terminal; its text made anew at most every 100 ms.
local progress = require "moonjob.cli.progress"
local cli = require "cli"

local ERASE = "\r\27[K"

-- A display over fixed counts; `o` says what stdout holds after a flush
-- (o.pending) and whether the line is hidden (o.hidden). Returns the display
-- and how many flushes it asked for.
local function new_display(o)
  local flushes = { n = 0 }
  local state = { completed = 3, failed = 0, skipped = 0, read = 3, bytes = 6, input_ended = false }
  local display = progress.new(function() return state end, {
    stdout_may_show = true,
    flush_output = function() flushes.n = flushes.n + 1 return o.pending or 0 end,
    hidden = function() return o.hidden end,
  })
  return display, flushes, state
end

describe("the progress line's redraws", function()
  it("is drawn again, after stdout's bytes went out, at the end of the turn that erased it", function()
    local o = {}
    local display, flushes
    local _, said = cli.stderr_of(function()
      display, flushes = new_display(o)
      display.refresh() -- the first draw
      display.before_stdout() -- results of this turn: erased
      display.refresh() -- the turn's end: drawn again at once, not 100 ms later
      display.close(false)
    end)
    local text = assert(said:match("^\r\27%[K(3 lines  [^\r]*)"), said)
    assert.equal(ERASE .. text .. ERASE .. ERASE .. text .. ERASE, said) -- drawn, erased, drawn, closed
    assert.equal(2, flushes.n)
  end)

  it("is not drawn while stdout still holds bytes, nor drawn twice within 100 ms", function()
    local o = { pending = 10 }
    local _, said = cli.stderr_of(function()
      local display = new_display(o)
      display.refresh()
      o.pending = 0
      display.refresh()
      display.refresh() -- shown, and its text not due: nothing
      display.close(false)
    end)
    assert.equal(2, select(2, said:gsub("\r\27%[K", ""))) -- one draw, one erase at the close
  end)

  it("is not drawn while the input is typed on a terminal", function()
    local o = { hidden = true }
    local _, said = cli.stderr_of(function()
      local display = new_display(o)
      display.refresh()
      display.close(true)
    end)
    assert.matches("^moonjob: 3 lines: 3 completed", said)
  end)
end)
