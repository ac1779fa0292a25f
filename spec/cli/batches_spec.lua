-- moonjob run hands tiny lines to its children in batches (moonjob.cli,
-- moonjob.child.batch, core/frame.h). Users must not be able to tell, except by speed:
-- these specs run inputs long enough for batches to form, and check through
-- the processor's own record of its runs (spec/fixtures/batch_lines.lua:
-- "line N <job id>" per run) that every line ran once, that batches really
-- formed (many lines share a job id), and what each line's output says.
local h = require "helpers"
local json = require "moonjob.codec.json"
local batches = require "moonjob.cli.batches"

local MOONJOB = h.LUAJIT .. " scripts/moonjob "
local FIXTURE = "spec/fixtures/batch_lines.lua"

-- Writes an input of n lines; extra(i) may add fields to line i's data or
-- return a whole line of text instead.
local function write_input(n, log, extra)
  local lines = {}
  for i = 1, n do
    local fields = extra and extra(i)
    if type(fields) == "string" then
      lines[i] = fields
    else
      local data = { log = log, n = i }
      for k, v in pairs(fields or {}) do data[k] = v end
      lines[i] = assert(json.encode(data))
    end
  end
  return h.write_file(os.tmpname(), table.concat(lines, "\n") .. "\n")
end

-- The output lines decoded, keyed by line, in the order printed.
local function read_output(out)
  local by_line, order = {}, {}
  for text in out:gmatch("[^\n]+") do
    local v = assert(json.decode(text))
    assert.is_nil(by_line[v.line], "line " .. tostring(v.line) .. " printed twice")
    by_line[v.line] = v
    order[#order + 1] = v.line
  end
  return by_line, order
end

-- The processor's record: runs per line, the job id of each line's last run,
-- and how many job ids there were.
local function read_runs(log)
  local runs, ids, distinct, count = {}, {}, {}, 0
  for text in io.lines(log) do
    local line, id = text:match("^line (%d+) (%S+)$")
    line = assert(tonumber(line), text)
    runs[line] = (runs[line] or 0) + 1
    ids[line] = id
    if not distinct[id] then distinct[id], count = true, count + 1 end
  end
  return runs, ids, count
end

-- Asserts that the processor ran every line 1..n once; returns how many
-- jobs ran them.
local function assert_ran_once(log, n)
  local runs, _, jobs = read_runs(log)
  for i = 1, n do assert.equal(1, runs[i], "runs of line " .. i) end
  return jobs
end

local function run(args, input)
  return h.sh(MOONJOB .. "run " .. args .. " " .. FIXTURE .. " " .. input)
end

-- The files of a run whose line 3001 (of 3100) sleeps 30 s once it created
-- `mark` (not again once mark exists): mark, joblog, a directory, the input.
-- They go when the spec ends.
local function slow_line_run(log)
  local mark, joblog, dir = os.tmpname(), os.tmpname(), h.tmpdir()
  os.remove(mark)
  finally(function()
    os.remove(mark); os.remove(joblog); os.execute("rm -rf " .. dir)
  end)
  return mark, joblog, dir, write_input(3100, log, function(i)
    if i == 3001 then return { mark = mark, sleep = 30 } end
  end)
end

-- Starts `moonjob ARGS` in the background (stdout and stderr in dir/out and
-- dir/err), waits until the file `mark` exists (a slow line started) and
-- `settle` seconds more, sends it SIGINT (with SIGINT at its default, as from
-- a terminal) and returns its exit status.
local function interrupted_run(args, mark, dir, settle)
  local pid = tonumber(h.first_line(("(env --default-signal=INT %s %s >%s/out 2>%s/err & echo $!; "
    .. "wait $!; echo $? >%s/status.tmp; mv %s/status.tmp %s/status) 2>/dev/null &")
    :format(MOONJOB, args, dir, dir, dir, dir, dir)))
  finally(function() os.execute("kill -KILL " .. pid .. " 2>/dev/null") end) -- should a wait fail
  h.wait_for(function() return io.open(mark) ~= nil end, 20)
  if settle > 0 then h.sleep(settle) end
  os.execute("kill -INT " .. pid)
  h.wait_for(function() return io.open(dir .. "/status") ~= nil end, 20)
  local f = assert(io.open(dir .. "/status"))
  local status = tonumber(f:read("*a"))
  f:close()
  return status
end

describe("moonjob run: batches of lines #slow", function()
  local log, input

  before_each(function() log = os.tmpname() end)
  after_each(function()
    os.remove(log)
    if input then os.remove(input) end
  end)

  it("runs 20,000 tiny lines in batches, each line once, with its exact result", function()
    input = write_input(20000, log)
    local out, err, status = run("-j 2", input)
    assert.equal(0, status, err)
    local by_line = read_output(out)
    for i = 1, 20000 do
      assert.equal("completed", by_line[i] and by_line[i].status, "line " .. i)
      assert.equal(i, by_line[i].result)
    end
    local jobs = assert_ran_once(log, 20000)
    assert.is_true(jobs < 2000, ("20,000 lines ran in %d jobs: no batches formed"):format(jobs))
  end)

  it("keeps the results of a dying child's batch, fails only its line, runs the rest once", function()
    local dies = { [2500] = true, [4000] = true, [5500] = true }
    input = write_input(7000, log, function(i) return dies[i] and { exit = true } or nil end)
    local out, err, status = run("-j 2", input)
    assert.equal(1, status, err)
    local by_line = read_output(out)
    for i = 1, 7000 do
      local v = assert(by_line[i], "line " .. i .. " printed")
      if dies[i] then
        assert.equal("failed", v.status)
        assert.equal("ECRASH", v.error.code)
      else
        assert.equal("completed", v.status, "line " .. i)
        assert.equal(i, v.result)
      end
    end
    local runs, ids = read_runs(log)
    for i = 1, 7000 do assert.equal(1, runs[i], "runs of line " .. i) end
    local inside = 0 -- lines that died inside a batch, after lines of the same job
    for i in pairs(dies) do
      if ids[i - 1] == ids[i] then inside = inside + 1 end
    end
    assert.is_true(inside > 0, "no child died inside a batch")
  end)

  it("hands the lines behind a slow line to an idle child", function()
    local slow = 3001
    input = write_input(3100, log, function(i) return i == slow and { sleep = 1.5 } or nil end)
    local out, err, status = run("-j 2", input)
    assert.equal(0, status, err)
    local by_line, order = read_output(out)
    for i = 1, 3100 do assert.equal(i, by_line[i].result) end
    local slow_at
    for at, line in ipairs(order) do if line == slow then slow_at = at end end
    for at, line in ipairs(order) do
      if line > slow then
        assert.is_true(at < slow_at, ("line %d waited for the slow line %d"):format(line, slow))
      end
    end
    local jobs = assert_ran_once(log, 3100)
    assert.is_true(jobs < 310, ("3,100 lines ran in %d jobs: no batches formed"):format(jobs))
  end)

  it("prints what a batch finished while a slow line of it still runs", function()
    local out = os.tmpname()
    local waits = { [1501] = true, [2201] = true, [3001] = true } -- each waits for its previous line's output
    input = write_input(3100, log, function(i)
      if waits[i] then return { wait_for = out, text = ('"line":%d,'):format(i - 1) } end
    end)
    local _, err, status = h.sh(MOONJOB .. "run -j 1 " .. FIXTURE .. " " .. input .. " >" .. out)
    local f = assert(io.open(out))
    local by_line = read_output(f:read("*a"))
    f:close()
    os.remove(out)
    assert.equal(0, status, err)
    local runs, ids = read_runs(log)
    local inside = 0 -- waiting lines whose previous line ran in the same batch
    for i in pairs(waits) do
      assert.equal(i, by_line[i].result)
      assert.equal(1, runs[i])
      if ids[i - 1] == ids[i] then inside = inside + 1 end
    end
    assert.is_true(inside > 0, "no waiting line ran after a line of its own batch")
  end)

  it("records on SIGINT what running batches finished; --resume runs every other line once", function()
    local mark, joblog, dir
    mark, joblog, dir, input = slow_line_run(log)
    -- one child: no line after the slow one runs
    local status = interrupted_run(("run -j 1 --joblog %s %s %s"):format(joblog, FIXTURE, input), mark, dir, 0)
    assert.equal(130, status)
    local recorded = 0
    for text in io.lines(joblog) do
      if text:find('"status":"completed"', 1, true) then recorded = recorded + 1 end
    end
    assert.equal(3000, recorded) -- every line before the slow one, those of its own batch included
    local _, err, status = run("-j 2 --resume --joblog " .. joblog, input)
    assert.equal(0, status, err)
    local runs = read_runs(log)
    for i = 1, 3100 do assert.equal(i == 3001 and 2 or 1, runs[i], "runs of line " .. i) end
  end)

  it("killed by SIGKILL mid-batch, takes its children's process groups down with it", function()
    local mark, _, dir
    mark, _, dir, input = slow_line_run(log)
    local pid = tonumber(h.first_line(("(%s run -j 2 %s %s >%s/out 2>%s/err & echo $!) 2>/dev/null")
      :format(MOONJOB, FIXTURE, input, dir, dir)))
    local children = {}
    finally(function()
      os.execute("kill -KILL " .. pid .. " 2>/dev/null")
      for _, child in ipairs(children) do os.execute("kill -KILL -" .. child .. " 2>/dev/null") end
    end)
    h.wait_for(function() return io.open(mark) ~= nil end, 20) -- the slow line sleeps in its child
    for child in io.popen("ps -o pid= --ppid " .. pid):lines() do children[#children + 1] = tonumber(child) end
    assert.equal(2, #children)
    local sleeping = 0
    for _, child in ipairs(children) do sleeping = sleeping + #h.group_members(child) - 1 end
    assert.is_true(sleeping > 0, "the slow line's sleep runs in its child's group")
    os.execute("kill -KILL " .. pid)
    for _, child in ipairs(children) do
      assert.same({}, h.wait_group_gone(child), "a process of child " .. child .. " outlived the CLI")
    end
  end)

  it("with --keep-order, a stop signal leaves the joblog holding exactly what was printed", function()
    local mark, joblog, dir
    mark, joblog, dir, input = slow_line_run(log)
    -- meanwhile the other child runs the lines after the slow one: they wait for it to be printed
    assert.equal(130, interrupted_run(("run -j 2 -k --joblog %s %s %s"):format(joblog, FIXTURE, input),
      mark, dir, 0.5))
    local f = assert(io.open(dir .. "/out"))
    local first = read_output(f:read("*a"))
    f:close()
    local logged = {}
    for text in io.lines(joblog) do logged[tonumber(text:match('^{"line":(%d+)'))] = true end
    for i = 1, 3100 do
      assert.equal(first[i] ~= nil, logged[i] == true, "line " .. i .. ": printed and recorded differ")
    end
    assert.is_nil(first[3001])
    local out, err, status = run("-j 2 -k --resume --joblog " .. joblog, input)
    assert.equal(0, status, err)
    local second = read_output(out)
    for i = 1, 3100 do
      assert.is_true((first[i] ~= nil) ~= (second[i] ~= nil), "line " .. i .. " printed once in all")
    end
  end)

  it("gives a line of a batch a job with the fields of a job of its own", function()
    input = h.write_file(os.tmpname(), table.concat((function()
      local t = {}
      for i = 1, 3000 do t[i] = tostring(i) end
      return t
    end)(), "\n") .. "\n")
    for _, args in ipairs({ "", "--timeout 100" }) do -- batches, then one job per line
      local out, err, status = h.sh(MOONJOB .. "run spec/fixtures/returns_job.lua " .. input .. " " .. args)
      assert.equal(0, status, err)
      local by_line = read_output(out)
      local ids = {}
      for i = 1, 3000 do
        local job = by_line[i].result
        local keys = {}
        for k in pairs(job) do keys[#keys + 1] = k end
        table.sort(keys)
        assert.same({ "attempt", "data", "id", "name", "number" }, keys, args .. " line " .. i)
        assert.equal("line " .. i, job.name)
        assert.equal(i, job.data)
        assert.equal(1, job.attempt)
        ids[job.id] = true
      end
      local distinct = 0
      for _ in pairs(ids) do distinct = distinct + 1 end
      if args == "" then assert.is_true(distinct < 3000, "no line ran in a batch") end
    end
  end)

  it("skips blank lines, fails bad JSON and raised errors line by line inside a batch", function()
    local raises = { [2001] = true, [2501] = true, [3001] = true, [4001] = true, [5001] = true }
    input = write_input(6000, log, function(i)
      if i % 7 == 0 then return "   " end
      if i == 1000 then return "not json" end
      if raises[i] then return { raise = true } end
    end)
    local out, err, status = run("-j 2", input)
    assert.equal(1, status, err)
    local by_line = read_output(out)
    for i = 1, 6000 do
      local v = by_line[i]
      if i % 7 == 0 then
        assert.is_nil(v, "blank line " .. i .. " printed")
      elseif i == 1000 then
        assert.equal("EINPUT", v.error.code)
        assert.matches("^input is not valid JSON", v.error.message)
      elseif raises[i] then
        assert.same({ code = "EBADLINE", message = "line refused" }, v.error)
      else
        assert.equal(i, v.result, "line " .. i)
      end
    end
    local runs, ids, jobs = read_runs(log)
    assert.is_nil(runs[7])
    local went_on = 0 -- raising lines after which their batch went on
    for i in pairs(raises) do
      assert.equal(1, runs[i])
      local after = i + 1
      while after % 7 == 0 do after = after + 1 end
      if ids[after] == ids[i] then went_on = went_on + 1 end
    end
    assert.is_true(went_on > 0, "no batch went on after a line raised")
    assert.is_true(jobs < 600, ("6,000 lines ran in %d jobs: no batches formed"):format(jobs))
  end)

  it("resumes from a joblog: the recorded lines never run, the others once each", function()
    input = write_input(5000, log)
    local joblog = os.tmpname()
    local f = assert(io.open(joblog, "w"))
    for i = 1, 5000, 2 do
      f:write(('{"line":%d,"status":"completed","result":%d,"attempts":1,"ms":0}\n'):format(i, i))
    end
    f:close()
    local out, err, status = run("-j 2 --keep-order --resume --joblog " .. joblog, input)
    assert.equal(0, status, err)
    assert.equal("", err) -- (under the sanitizers: no report of a child, which would also cut its batches)
    local by_line, order = read_output(out)
    for i = 1, 5000 do
      if i % 2 == 1 then assert.is_nil(by_line[i], "resumed line " .. i .. " printed")
      else assert.equal(i, by_line[i].result) end
    end
    for k = 2, #order do assert.is_true(order[k - 1] < order[k], "out of order") end
    local runs, _, jobs = read_runs(log)
    for i = 1, 5000 do assert.equal(i % 2 == 0 and 1 or nil, runs[i], "runs of line " .. i) end
    assert.is_true(jobs < 500, ("2,500 lines ran in %d jobs: no batches formed"):format(jobs))
    local completed = 0
    for text in io.lines(joblog) do
      if text:find('"status":"completed"', 1, true) then completed = completed + 1 end
    end
    assert.equal(5000, completed)
    os.remove(joblog)
  end)
end)

describe("a batch of lines in a pool (pool:add's internal `lines` option)", function()
  after_each(function() h.cleanup() end)

  -- Adds the NDJSON lines `lines` (a list) to `pool` as one batch whose first
  -- line is numbered `first`; returns the job.
  local function add_batch(pool, first, lines)
    return pool:add(table.concat(lines, "\n"), { lines = { first, #lines } })
  end

  -- `n` copies of line `text`.
  local function copies(n, text)
    local lines = {}
    for i = 1, n do lines[i] = text end
    return lines
  end

  it("fails the line that fills the heap with ENOMEM, starts none after it, and ends the child", function()
    local pool = h.pool("memory_bomb.lua", { size = 1, codec = "json", memory_limit = 32 * 1024 * 1024 })
    local exits = 0
    pool:on("exit", function() exits = exits + 1 end)
    local job = add_batch(pool, 10, { '"first"', '"tables"', '"third"' })
    local run, completed, failed, body = batches.parse_done(assert(job:wait()))
    assert.same({ 2, 1, 1 }, { run, completed, failed })
    local first, second = body:match("^([^\n]*)\n([^\n]*)\n$")
    assert.matches('^{"line":10,"status":"completed","result":"ok",', first)
    assert.matches('^{"line":11,"status":"failed","error":{"code":"ENOMEM","message":"the job needed more '
      .. 'than memory_limit %(33554432 bytes%)"}', second)
    h.wait_for(function() return exits == 1 end, 10) -- the child ends
    assert.equal('"ok"', pool:run('"again"')) -- a fresh child takes the next job
    pool:close()
  end)

  it("runs on after a line that printed: the child tags each output line with its line", function()
    local pool = h.pool("prints_lines.lua", { size = 1, codec = "json", max_log_bytes = 1000 })
    local job = add_batch(pool, 1, copies(20, '{"pad":10}'))
    local run, completed = batches.parse_done(assert(job:wait()))
    assert.same({ 20, 20 }, { run, completed })
    assert.equal(20, #job.logs)
    for i = 1, 20 do assert.equal(("[line %d] %s line %d"):format(i, ("x"):rep(10), i), job.logs[i]) end
    assert.is_nil(job.dropped_log_bytes)
    -- without an owner taking its lines whole, a batch's output is held to max_log_bytes, as a job's
    job = add_batch(pool, 21, copies(2, '{"pad":1500}'))
    run = batches.parse_done(assert(job:wait()))
    assert.equal(2, run)
    assert.is_true(job.dropped_log_bytes > 0)
    pool:close()
  end)

  it("may carry more than max_payload in its DONE: each line's result is held to it, not the batch's", function()
    local pool = h.pool("big_parts.lua", { size = 1, codec = "json", max_payload = 2000 })
    local lines = {}
    for i = 1, 20 do lines[i] = ('{"unit":"x","n":%d}'):format(1500 + i) end -- 1.5 KB results
    local run, completed, failed, body = batches.parse_done(assert(add_batch(pool, 1, lines):wait()))
    assert.same({ 20, 20, 0 }, { run, completed, failed })
    local n = 0
    for line in body:gmatch("[^\n]+") do
      n = n + 1
      assert.equal(1500 + n, #line:match('"text":"(x*)"'))
    end
    assert.equal(20, n)
    local text = assert(add_batch(pool, 21, { '{"unit":"y","n":3000}', '{"unit":"z","n":1}' }):wait())
    assert.matches('^2 1 1\n{"line":21,"status":"failed","error":{"code":"EPAYLOAD","message":"the result is '
      .. '%d+ bytes, more than max_payload %(2000%)', text) -- a line's own result is still held to it
    pool:close()
  end)
end)
