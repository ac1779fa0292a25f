-- moonjob.cli.stops without a run: --halt's rule judged from counts, the
-- stops it makes, and the exit status a run's end turns into.
local loop = require "moonjob.loop"
local stops = require "moonjob.cli.stops"
local stderr_of = require("cli").stderr_of

describe("moonjob.cli.stops", function()
  describe("halt_reached()", function()
    -- { rule, lines finished, lines failed, reached? }, one case a row
    local count, percent = { when = "now", count = 2 }, { when = "soon", percent = 50 }
    local cases = {
      ["holds once a count of lines failed, never without --halt or a failure"] = {
        { nil, 10, 10, false }, { count, 10, 0, false }, { count, 10, 1, false }, { count, 2, 2, true } },
      ["judges a percentage from the third finished line on"] = {
        { percent, 2, 2, false }, { percent, 3, 2, true }, { percent, 5, 2, false }, { percent, 4, 2, true } },
    }
    for name, rows in pairs(cases) do
      it(name, function()
        for i, row in ipairs(rows) do
          assert.equal(row[4], stops.halt_reached(row[1], row[2], row[3]), "row " .. i)
        end
      end)
    end
  end)

  describe("halted()", function()
    it("now: exit 3, records what completed, says the rule and the count", function()
      local stop = stops.halted({ when = "now", count = 1 }, 1)
      assert.same({ status = 3, record = "completed",
        message = "halted (--halt now,fail=1): 1 line failed; running jobs were killed" }, stop)
    end)

    it("soon: exit 4, records what ran, waits for it", function()
      local stop = stops.halted({ when = "soon", percent = 20 }, 3)
      assert.same({ status = 4, record = "ran", soon = true,
        message = "halted (--halt soon,fail=20%): 3 lines failed; running jobs finished, no more were started" },
        stop)
    end)
  end)

  describe("stopped_by()", function()
    it("turns an interrupted wait into 128 + the signal, and any other error into exit 1", function()
      local saved = loop.signal
      loop.signal = 15
      local by_signal = stops.stopped_by("interrupted by a signal")
      loop.signal = saved
      assert.same({ status = 143, record = "completed",
        message = "interrupted by SIGTERM; running jobs were killed" }, by_signal)
      assert.same({ status = 1, message = "boom" }, stops.stopped_by("boom"))
    end)
  end)

  describe("outcome()", function()
    it("is the jobs' status when nothing stopped the run", function()
      assert.same({ 0, "" }, { stderr_of(function() return stops.outcome(nil, 0, 0) end) })
      assert.same({ 1, "" }, { stderr_of(function() return stops.outcome(nil, 2, 0) end) })
    end)

    it("is the stop's status, saying its message", function()
      local status, said = stderr_of(function()
        return stops.outcome(stops.joblog_failed("log", "ENOSPC"), 0, 0)
      end)
      assert.equal(2, status)
      assert.matches("^moonjob: writing the joblog 'log' failed: ENOSPC; the run stopped", said)
    end)

    it("ends a closed output quietly with the jobs' status, and says any other write error", function()
      assert.same({ 1, "" }, { stderr_of(function()
        return stops.outcome(stops.closed_output(), 1, 0, nil, "EPIPE: broken pipe")
      end) })
      local status, said = stderr_of(function()
        return stops.outcome(stops.closed_output(), 0, 0, nil, "EIO: i/o error")
      end)
      assert.equal(2, status)
      assert.matches("^moonjob: an I/O error on the device that standard output writes to %(EIO: i/o error%)", said)
    end)

    it("never ends silently on results never written, nor on a read error", function()
      local status, said = stderr_of(function() return stops.outcome(nil, 0, 3) end)
      assert.equal(1, status)
      assert.matches("^moonjob: internal error: 3 results were never written", said)
      assert.same({ 2, "moonjob: reading the input failed: EIO\n" },
        { stderr_of(function() return stops.outcome(nil, 0, 0, "EIO") end) })
    end)
  end)
end)
