-- moonjob.cli.output without a run: result lines in input order with
-- --keep-order, the joblog left to stdout's writer, and what a failed write
-- does. stdout is a stand-in that keeps what it is given.
local output = require "moonjob.cli.output"

-- An output writing to a stand-in; `fails` makes its writes fail.
local function new_output(keep_order, log, fails)
  local out = { written = {} }
  function out.pending() return 0 end
  function out.write(_, text)
    if fails then return nil, "EPIPE: broken pipe" end
    out.written[#out.written + 1] = text
    return true
  end
  local told = {}
  local self = output.new(keep_order, log, {
    joblog_failed = function(e) told[#told + 1] = "joblog: " .. e end,
    closed = function() told[#told + 1] = "closed" end,
  }, out)
  return self, out.written, told
end

-- A joblog stand-in: a regular file (it does not show on a terminal) whose
-- records are kept, or that fails with `fails`.
local function new_joblog(fails)
  local log = { file = io.tmpfile(), records = {} }
  function log.record(_, text)
    if fails then return nil, fails end
    log.records[#log.records + 1] = text
    return true
  end
  return log
end

describe("moonjob.cli.output", function()
  it("without --keep-order, writes results as they come", function()
    local self, written = new_output(false)
    self:emit(2, "b\n")
    self:emit(1, "a\n")
    assert.same({ "b\n", "a\n" }, written)
  end)

  it("with --keep-order, keeps a result pending until every earlier line was written", function()
    local self, written = new_output(true)
    self:emit(3, "c\n")
    self:emit(4, "d\ne\n", 2) -- lines 4 and 5
    assert.same({}, written)
    local bytes, lines = self:pending_results()
    assert.equal(3, lines) -- line 3, and 4 and 5
    assert.is_true(bytes >= #"c\nd\ne\n")
    self:emit(1, "")
    self:emit(2, "b\n")
    assert.same({ "b\n", "c\n", "d\ne\n" }, written)
    assert.same({ 0, 0 }, { self:pending_results() })
    self:emit(6, "f\n")
    assert.same({ "b\n", "c\n", "d\ne\n", "f\n" }, written)
  end)

  it("refuses a line written twice", function()
    local self = new_output(true)
    self:emit(2, "b\n")
    assert.has_error(function() self:emit(2, "b\n") end)
  end)

  it("flushes its pending results in line order, past the lines missing", function()
    local self, written = new_output(true)
    self:emit(5, "e\n")
    self:emit(3, "c\n")
    self:flush_pending()
    assert.same({ "c\n", "e\n" }, written)
    assert.same({ 0, 0 }, { self:pending_results() })
  end)

  it("leaves the joblog to the writer: it records nothing itself", function()
    local log = new_joblog()
    local self, written = new_output(false, log)
    self:emit(1, "a\n")
    self:emit(2, "b\n")
    assert.same({}, log.records)
    assert.same({ "a\n", "b\n" }, written)
  end)

  it("stops writing once the writer could not record in the joblog, and tells the run", function()
    local self, written, told = new_output(false, new_joblog())
    self:emit(1, "a\n")
    self.out.record_error = function() return "ENOSPC: no space left on device" end
    assert.equal(0, self:poll())
    self:emit(2, "b\n")
    assert.same({ "a\n" }, written)
    assert.same({ "joblog: ENOSPC: no space left on device" }, told)
    assert.is_true(self.joblog_failed)
  end)

  it("keeps the write error of a reader gone, tells the run once, and writes no more", function()
    local self, _, told = new_output(false, nil, true)
    self:emit(1, "a\n")
    self:emit(2, "b\n")
    assert.equal("EPIPE: broken pipe", self.write_error)
    assert.same({ "closed" }, told)
  end)

  it("tags what a job of one line printed with its line, and what a child printed between jobs with its pid", function()
    local self = new_output(false)
    local said = {}
    self.display = { write_stderr = function(text) said[#said + 1] = text end }
    local job = { line = 7 }
    self:echo("hello", job, 42)
    self:echo("idle", nil, 42)
    assert.same({ "[line 7] hello\n", "[child 42] idle\n" }, said)
  end)

  it("writes what a batch's child tagged as it is, and tags the lines it could not", function()
    local self = new_output(false)
    local said = {}
    self.display = { write_stderr = function(text) said[#said + 1] = text end }
    local job = { line = 10, count = 5, child = { batch_started = function() return 2 end } }
    self:echo_lines("[line 10] a\n[line 11] b\n", job)
    assert.same({ "[line 10] a\n[line 11] b\n" }, said) -- one write
    said = {}
    self:echo_lines("[line 11] c\nfrom a command\n[line 11] d\n[lin\n", job)
    assert.same({ "[line 11] c\n", "[line 11] from a command\n", "[line 11] d\n", "[line 11] [lin\n" }, said)
  end)

  it("keeps what a batch printed until it ended, then tags it with the last line it ran", function()
    local self = new_output(false)
    local said = {}
    self.display = { write_stderr = function(text) said[#said + 1] = text end }
    local job = { line = 10, count = 5, state = "failed", batch_state = { started = 3 } }
    self:echo("x", job)
    assert.same({}, said)
    self:echo_to_tag(job)
    assert.same({ "[line 12] x\n" }, said)
  end)
end)
