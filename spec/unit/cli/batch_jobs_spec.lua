-- moonjob.cli.batch_jobs without a pool: what a batch job that ended ran,
-- as its result lines, the positions they cover and their counts.
local batch_jobs = require "moonjob.cli.batch_jobs"
local errors = require("moonjob").errors
local lines = require "moonjob.codec.resultline"

describe("moonjob.cli.batch_jobs.outcome()", function()
  local DONE_10 = lines.completed(10, "1", 1, 0)
  local FAILED_11 = lines.failed(11, errors.new("EBAD", "bad"), 1, 0)
  local DONE_12 = lines.completed(12, "3", 1, 0)

  it("reads a completed batch's DONE header and result lines", function()
    local job = { state = "completed", line = 10, count = 3, text = "1\n2\n3",
      result_bytes = "3 2 1\n" .. DONE_10 .. FAILED_11 .. DONE_12 }
    assert.same({ DONE_10 .. FAILED_11 .. DONE_12, 3, 2, 1 }, { batch_jobs.outcome(job) })
  end)

  it("fails every line that is not blank of a batch that never ran, with its error", function()
    local e = errors.new("ELOAD", "no processor")
    local job = { state = "failed", error = e, attempts = 0, line = 20, count = 3, text = "1\n \n3" }
    local text, covered, ok_n, failed_n = batch_jobs.outcome(job)
    assert.equal(lines.failed(20, e, 1, 0) .. lines.failed(22, e, 1, 0), text)
    assert.same({ 3, 0, 2 }, { covered, ok_n, failed_n })
  end)

  it("keeps what a batch whose child died finished, fails the line it was in, and covers no more", function()
    local e = errors.new("ECRASH", "the child died")
    local job = { state = "failed", error = e, attempts = 1, line = 10, count = 5, text = "1\n2\n3\n4\n5",
      batch_state = { text = DONE_10 .. FAILED_11, kept = 2, started = 3, line_ms = 7 } }
    local text, covered, ok_n, failed_n = batch_jobs.outcome(job)
    assert.equal(DONE_10 .. FAILED_11 .. lines.failed(12, e, 1, 7), text)
    assert.same({ 3, 1, 2 }, { covered, ok_n, failed_n })
  end)

  it("fails a completed batch whose result is not a batch's with EPROTO", function()
    local job = { state = "completed", line = 1, count = 1, text = "1", attempts = 1, result_bytes = "42" }
    local text, covered, _, failed_n = batch_jobs.outcome(job)
    assert.matches('"code":"EPROTO"', text)
    assert.same({ 1, 1 }, { covered, failed_n })
  end)
end)
