-- moonjob.cli.joblog without a run: what --resume reads back from a joblog,
-- and how a joblog is opened after a write cut short.
local h = require "helpers"
local joblog = require "moonjob.cli.joblog"
local cli = require "cli"

local read, stderr_of = cli.read, cli.stderr_of

local DONE_1 = '{"line":1,"status":"completed","result":1,"attempts":1,"ms":0}\n'
local FAILED_2 = '{"line":2,"status":"failed","error":{"code":"E","message":"x"},"attempts":1,"ms":0}\n'
local DONE_3 = '{"line":3,"status":"completed","result":3,"attempts":1,"ms":0}\n'
local CUT_4 = '{"line":4,"status":"comp'

describe("moonjob.cli.joblog", function()
  local dir
  before_each(function() dir = h.tmpdir() end)
  after_each(function() os.execute("rm -rf " .. dir) end)

  describe("read() and resumed()", function()
    it("count only completed lines of whole records, and say where those end", function()
      local path = h.write_file(dir .. "/log", DONE_1 .. FAILED_2 .. DONE_3 .. CUT_4)
      local done, whole = joblog.read(path)
      assert.same({ [1] = true, [3] = true }, done)
      assert.equal(#(DONE_1 .. FAILED_2 .. DONE_3), whole)
      local resumed, last = joblog.resumed(path)
      assert.same(done, resumed)
      assert.equal(3, last)
    end)

    it("read a missing joblog as empty", function()
      assert.same({ {}, 0 }, { joblog.read(dir .. "/none") })
      assert.same({ {}, 0 }, { joblog.resumed(dir .. "/none") })
    end)
  end)

  describe("open()", function()
    it("cuts off a last record cut short, then appends whole records", function()
      local path = h.write_file(dir .. "/log", DONE_1 .. CUT_4)
      local log, said = stderr_of(function() return joblog.open(path) end)
      assert.matches("ended in a record cut short", said)
      assert.truthy(log:record(DONE_3))
      log:close()
      assert.equal(DONE_1 .. DONE_3, read(path))
    end)

    it("ends a last line that is not a record with a newline, and keeps it", function()
      local path = h.write_file(dir .. "/log", "a note")
      local log = joblog.open(path)
      log:record(DONE_1)
      log:close()
      assert.equal("a note\n" .. DONE_1, read(path))
    end)

    it("says why it cannot open a joblog, without repeating the path", function()
      local path = dir .. "/no/log"
      assert.same({ nil, ("cannot open joblog '%s': No such file or directory"):format(path) },
        { joblog.open(path) })
    end)
  end)
end)
