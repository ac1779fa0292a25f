-- What the lines of a batch print (moonjob run): the child tags each output
-- line with the line that wrote it (core/child/output.c), so printing or
-- logging does not end a batch and what users see on stderr is
-- "[line N] text" for each output line, N its own line, whatever wrote it
-- (print, io.write without a newline, io.stderr, job:log, a command). The
-- processor (spec/fixtures/batch_output.lua) records each run with its job
-- id, which tells that batches formed (many lines share a job).
local h = require "helpers"
local cli = require "cli"

local MOONJOB, by_line, input_file, read = cli.MOONJOB, cli.by_line, cli.input_file, cli.read
local FIXTURE = "spec/fixtures/batch_output.lua"

-- The stderr lines of a run as a count of each "[line N] text" (N, text).
local function tagged_lines(err)
  local seen, order = {}, {}
  for text in err:gmatch("[^\n]*\n") do
    local line, said = text:match("^%[line (%d+)%] (.*)\n$")
    assert(line, "an output line without its tag: " .. text)
    local key = line .. " " .. said
    seen[key] = (seen[key] or 0) + 1
    order[#order + 1] = { tonumber(line), said }
  end
  return seen, order
end

-- How many jobs ran the lines recorded in `record` ("line N <job id>" each
-- run), and checks that each of lines 1..n ran once.
local function jobs_of(record, n)
  local ran, ids, jobs = {}, {}, 0
  for line, id in read(record):gmatch("line (%d+) (%S+)\n") do
    line = tonumber(line)
    assert.is_nil(ran[line], "line " .. line .. " ran twice")
    ran[line] = true
    if not ids[id] then ids[id], jobs = true, jobs + 1 end
  end
  for i = 1, n do assert.is_true(ran[i], "line " .. i .. " did not run") end
  return jobs
end

-- moonjob run -j 2 over the lines of `list` (their data): the results by
-- line, how many, stderr and the exit status.
local function run_list(list)
  local input = input_file(list)
  local out, err, status = h.sh(MOONJOB .. "run -j 2 " .. FIXTURE .. " " .. input)
  os.remove(input)
  local results, count = by_line(out)
  return results, count, err, status
end

describe("moonjob run, what the lines of a batch print #slow", function()
  after_each(function() h.cleanup() end)

  it("is tagged by each output line's own line, whatever wrote it, and batches go on", function()
    local record, n = os.tmpname(), 700
    local list, want = {}, {}
    local function expect(line, text) want[line .. " " .. text] = (want[line .. " " .. text] or 0) + 1 end
    for i = 1, n do
      local d, kind = { n = i, record = record }, i % 8
      if kind == 1 then d.print = "p" .. i; expect(i, d.print)
      elseif kind == 2 then d.log = "l" .. i; expect(i, d.log)
      elseif kind == 3 then d.err = "e" .. i; expect(i, d.err)
      elseif kind == 4 then d.partial = "w" .. i; expect(i, d.partial) -- ended with its line
      elseif kind == 5 then d.two = "d" .. i; expect(i, d.two); expect(i, d.two)
      elseif kind == 6 then d.partial = "s" .. i; expect(i, d.partial) -- and the next line prints
      elseif kind == 7 then d.print = "t" .. i; expect(i, d.print)
      elseif i % 80 == 0 then d.exec = "x" .. i end -- a command's output: tagged by the parent
      list[i] = d
    end
    local results, count, err, status = run_list(list)
    assert.equal(0, status, err)
    assert.equal(n, count)
    for i = 1, n do assert.equal("completed", results[i].status) end
    local seen, order = tagged_lines(err)
    for _, said in ipairs(order) do -- a command's line: tagged with its line or one after (the parent's view)
      local from = said[2]:match("^x(%d+)$")
      if from then
        assert.is_true(said[1] >= tonumber(from), "command output of line " .. from .. " tagged " .. said[1])
        assert.equal(1, seen[said[1] .. " " .. said[2]])
        seen[said[1] .. " " .. said[2]] = nil
        want["x" .. from] = true
      end
    end
    for i = 80, n, 80 do assert.is_true(want["x" .. i], "the command's output of line " .. i) want["x" .. i] = nil end
    assert.same(want, seen)
    assert.is_true(jobs_of(record, n) < n / 4, "batches ended when lines printed")
    os.remove(record)
  end)

  it("keeps its batches when every line prints", function()
    local record, n = os.tmpname(), 3000
    local list = {}
    for i = 1, n do list[i] = { n = i, record = record, print = "p" .. i } end
    local results, count, err, status = run_list(list)
    assert.equal(0, status, err)
    assert.equal(n, count)
    for i = 1, n do assert.equal(i, results[i].result) end
    local seen = tagged_lines(err)
    for i = 1, n do assert.equal(1, seen[i .. " p" .. i], "line " .. i .. "'s output") end
    assert.is_true(jobs_of(record, n) < n / 10, "batches ended when lines printed")
    os.remove(record)
  end)

  -- Runs a batch whose line `killed` prints "k<line>" and is killed as
  -- `how` says: the output of each line is there once, with its tag.
  local function killed_in_line(how)
    local record, n, killed = os.tmpname(), 1500, 1200
    local list = {}
    for i = 1, n do list[i] = { n = i, record = record, print = "p" .. i } end
    list[killed] = { n = killed, record = record, [how] = "k" .. killed }
    local results, count, err = run_list(list)
    assert.equal(n, count)
    assert.equal("failed", results[killed].status)
    assert.equal("ECRASH", results[killed].error.code)
    local seen = tagged_lines(err:gsub("[^\n]*moonjob[^\n]*\n", "")) -- its crash may be told
    for i = 1, n do
      if i == killed then assert.equal(1, seen[i .. " k" .. i], "the killed line's output")
      else assert.equal(1, seen[i .. " p" .. i], "line " .. i .. "'s output") end
    end
    assert.is_true(jobs_of(record, n) < n / 4, "batches ended when lines printed")
    os.remove(record)
  end

  it("keeps the tag of what a line printed before a command it ran killed its child", function()
    killed_in_line("kill")
  end)

  it("writes what a line printed while it runs on, so that it outlives its child killed in it", function()
    killed_in_line("spin_kill")
  end)
end)
