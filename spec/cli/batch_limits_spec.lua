-- moonjob run keeps its batches of lines under --timeout and --attempts
-- (moonjob.child.batch, core/child/interrupt.c, moonjob.pool.deadlines,
-- moonjob.cli.batch_jobs): each line has its own deadline and its own
-- attempts, exactly as when it ran as a job of its own. The inputs are a few
-- hundred tiny lines, so that batches form; the processor's own record
-- (spec/fixtures/line_limits.lua: "line N <job id> <attempt>" per run) tells
-- that they did (many lines share a job id) and how often each line ran.
local h = require "helpers"
local json = require "moonjob.codec.json"

local MOONJOB = h.LUAJIT .. " scripts/moonjob "
local FIXTURE = "spec/fixtures/line_limits.lua"
local N = 400

-- An input of n lines, line i's data { log, n = i } with extra[i]'s fields.
local function write_input(n, log, extra)
  local lines = {}
  for i = 1, n do
    local data = { log = log, n = i }
    for k, v in pairs(extra[i] or {}) do data[k] = v end
    lines[i] = assert(json.encode(data))
  end
  return h.write_file(os.tmpname(), table.concat(lines, "\n") .. "\n")
end

-- The result lines decoded, by line; a line printed twice fails the test.
local function read_output(out, by_line)
  by_line = by_line or {}
  for text in out:gmatch("[^\n]+") do
    local v = assert(json.decode(text), text)
    assert.is_nil(by_line[v.line], "line " .. tostring(v.line) .. " printed twice")
    by_line[v.line] = v
  end
  return by_line
end

-- The processor's record: per line, its runs ({ id, attempt } each, in
-- order), how many distinct lines each job id ran, and the cleanups
-- ("line N reason").
local function read_runs(log)
  local runs, per_id, cleanups, seen = {}, {}, {}, {}
  for text in io.lines(log) do
    local name, reason = text:match("^cleanup (line %d+) (%S+)$")
    if name then
      cleanups[#cleanups + 1] = name .. " " .. reason
    else
      local line, id, attempt, at = text:match("^line (%d+) (%S+) (%d+) ([%d.]+)$")
      line = assert(tonumber(line), text)
      runs[line] = runs[line] or {}
      table.insert(runs[line], { id = id, attempt = tonumber(attempt), at = tonumber(at) })
      if not seen[id .. " " .. line] then
        seen[id .. " " .. line] = true
        per_id[id] = (per_id[id] or 0) + 1
      end
    end
  end
  return runs, per_id, cleanups
end

-- Asserts that at least one of `lines` first ran in a batch: its job id ran
-- other lines. (One of several: a line can legitimately run alone, when the
-- children start slowly and the first lines go one per job, or when an idle
-- child takes back all but the first line of a batch; the specs put their
-- special lines far apart so that batching itself is what they show.)
local function assert_some_in_batch(runs, per_id, lines)
  local alone = {}
  for _, line in ipairs(lines) do
    local first = assert(runs[line], "line " .. line .. " never ran")[1]
    if per_id[first.id] > 1 then return end
    alone[#alone + 1] = ("%d (job %s)"):format(line, first.id)
  end
  assert.is_true(false, "no batch formed: lines " .. table.concat(alone, ", ") .. " each ran alone")
end

-- Asserts that every line but those of `special` completed once, with
-- "attempts":1, and ran once.
local function assert_others_once(by_line, runs, special)
  for i = 1, N do
    if not special[i] then
      local v = by_line[i]
      assert.equal("completed", v and v.status, "line " .. i)
      assert.equal(i, v.result)
      assert.equal(1, v.attempts, "attempts of line " .. i)
      assert.equal(1, #runs[i], "runs of line " .. i)
    end
  end
end

local function run(args, input)
  return h.sh(MOONJOB .. "run " .. args .. " " .. FIXTURE .. " " .. input)
end

describe("moonjob run: batches under --timeout and --attempts #slow", function()
  local log, input

  before_each(function() log = os.tmpname() end)
  after_each(function()
    os.remove(log)
    if input then os.remove(input) end
  end)

  it("fails a line past --timeout with ETIMEDOUT alone; the lines of its batch complete", function()
    input = write_input(N, log, { [200] = { spin = "lua" }, [330] = { spin = "lua" } })
    local out, err, status = run("-j 2 --timeout 0.5 --kill-after 20", input)
    assert.equal(1, status, err)
    local by_line = read_output(out)
    for _, i in ipairs({ 200, 330 }) do
      local v = by_line[i]
      assert.equal("failed", v.status, "line " .. i)
      assert.same({ code = "ETIMEDOUT", message = "the job ran past its timeout (0.5 s)", reason = "timeout" },
        v.error) -- soft: not killed
      assert.equal(1, v.attempts)
    end
    local runs, per_id, cleanups = read_runs(log)
    assert_some_in_batch(runs, per_id, { 200, 330 })
    table.sort(cleanups)
    assert.same({ "line 200 timeout", "line 330 timeout" }, cleanups)
    assert_others_once(by_line, runs, { [200] = true, [330] = true })
  end)

  it("kills a line stuck in C or in a compiled loop after --kill-after; only it fails", function()
    input = write_input(N, log, { [250] = { spin = "c" }, [300] = { spin = "jit" } })
    local out, err, status = run("-j 2 --timeout 0.5 --kill-after 0.5", input)
    assert.equal(1, status, err)
    local by_line = read_output(out)
    local runs, per_id = read_runs(log)
    for _, i in ipairs({ 250, 300 }) do
      local v = by_line[i]
      assert.equal("failed", v.status, "line " .. i)
      assert.same({ code = "ETIMEDOUT", killed = true, reason = "timeout", message =
        "the job ran past its timeout (0.5 s); the child was killed after kill_after (0.5 s)" }, v.error)
      assert.equal(1, v.attempts)
      assert.equal(1, #runs[i], "runs of line " .. i)
    end
    assert_some_in_batch(runs, per_id, { 250, 300 })
    assert_others_once(by_line, runs, { [250] = true, [300] = true })
  end)

  it("times each line from its own start: a batch longer than timeout + kill-after is not killed", function()
    -- Eight slow lines in a row, one child: wherever the input's blocks are
    -- cut, one batch holds at least four of them, 1.6 s or more in all,
    -- past the 1 s of timeout + kill-after, while no line runs past 0.7 s.
    local slow = {}
    for i = 250, 257 do slow[i] = { sleep = 0.4 } end
    input = write_input(N, log, slow)
    local out, err, status = run("-j 1 --timeout 0.7 --kill-after 0.3", input)
    assert.equal(0, status, err)
    local by_line = read_output(out)
    local runs, per_id = read_runs(log)
    local in_batch = {} -- slow lines per batch job
    for i = 250, 257 do
      local id = runs[i][1].id
      in_batch[id] = (in_batch[id] or 0) + 1
    end
    local most = 0
    for _, n in pairs(in_batch) do most = math.max(most, n) end
    assert.is_true(most >= 3, ("at most %d slow lines shared a batch"):format(most))
    assert_others_once(by_line, runs, {})
  end)

  it("runs a failed line again alone, its attempts going on, the others once", function()
    local mark = os.tmpname()
    os.remove(mark)
    finally(function() os.remove(mark) end)
    input = write_input(N, log, { [220] = { fail_until = 3 }, [250] = { fail_until = 99 },
      [300] = { final = true }, [350] = { exit_once = mark } })
    local out, err, status = run("-j 2 --attempts 3", input)
    assert.equal(1, status, err)
    local by_line = read_output(out)
    local runs, per_id = read_runs(log)
    assert.same({ line = 220, status = "completed", result = 220, attempts = 3, ms = by_line[220].ms },
      by_line[220])
    assert.same({ 1, 2, 3 }, { runs[220][1].attempt, runs[220][2].attempt, runs[220][3].attempt })
    assert.equal("failed", by_line[250].status)
    assert.same({ code = "EFLAKY", message = "attempt 3 failed" }, by_line[250].error)
    assert.equal(3, by_line[250].attempts)
    assert.equal(3, #runs[250])
    assert.equal("failed", by_line[300].status) -- retry = false: never again
    assert.equal(1, by_line[300].attempts)
    assert.equal(1, #runs[300])
    assert.equal("completed", by_line[350].status) -- its child died: it ran again alone
    assert.equal(2, by_line[350].attempts)
    assert.equal(2, #runs[350])
    assert_some_in_batch(runs, per_id, { 220, 250, 300, 350 })
    for _, i in ipairs({ 220, 250, 300, 350 }) do
      for k = 2, #runs[i] do assert.equal(1, per_id[runs[i][k].id], "line " .. i .. " ran again alone") end
    end
    assert_others_once(by_line, runs, { [220] = true, [250] = true, [300] = true, [350] = true })
  end)

  it("keeps -k's order, a line run again holding the lines after it", function()
    local attempts = { [220] = 3, [221] = 2, [330] = 3 }
    input = write_input(N, log, { [220] = { fail_until = 3 }, [221] = { fail_until = 2 }, [330] = { fail_until = 3 } })
    local out, err, status = run("-j 2 -k --attempts 3 --backoff fixed:0.2", input)
    assert.equal(0, status, err)
    local i = 0
    for text in out:gmatch("[^\n]+") do
      i = i + 1
      local v = assert(json.decode(text))
      assert.equal(i, v.line)
      assert.equal(attempts[i] or 1, v.attempts, "attempts of line " .. i)
    end
    assert.equal(N, i)
    local runs, per_id = read_runs(log)
    assert_some_in_batch(runs, per_id, { 220, 330 })
    for _, line in ipairs({ 220, 330 }) do
      for k = 2, 3 do -- each attempt waited its backoff after the one before (a lower bound: never flaky)
        local waited = runs[line][k].at - runs[line][k - 1].at
        assert.is_true(waited >= 0.19, ("attempt %d of line %d began %.3f s after attempt %d")
          :format(k, line, waited, k - 1))
      end
    end
  end)

  it("--halt counts a line as failed only once its last attempt failed", function()
    input = write_input(N, log, { [220] = { fail_until = 3 }, [330] = { fail_until = 3 } })
    local out, err, status = run("-j 2 --halt now,fail=1 --attempts 3", input)
    assert.equal(0, status, err) -- lines 220 and 330 failed twice, and completed
    local by_line = read_output(out)
    local runs, per_id = read_runs(log)
    assert_some_in_batch(runs, per_id, { 220, 330 })
    assert.equal(3, by_line[220].attempts)
    assert.equal(3, by_line[330].attempts)
    assert_others_once(by_line, runs, { [220] = true, [330] = true })
    os.remove(input)
    os.remove(log)
    input = write_input(N, log, { [220] = { fail_until = 99 } })
    out, err, status = run("-j 2 --halt now,fail=1 --attempts 3", input)
    assert.equal(3, status, err) -- stopped by --halt now, after line 220's third attempt
    by_line = read_output(out)
    assert.equal(3, by_line[220].attempts)
    assert.equal(3, #read_runs(log)[220])
  end)

  it("--joblog and --resume after a SIGKILL mid-run: every line's result once in all", function()
    local mark, joblog, dir = os.tmpname(), os.tmpname(), h.tmpdir()
    os.remove(mark)
    finally(function() os.remove(mark); os.remove(joblog); os.execute("rm -rf " .. dir) end)
    local n = 3000
    local extra = { [2500] = { mark = mark, sleep = 30 } }
    for i = 50, n, 97 do extra[i] = { fail_until = 2 } end
    input = (function() local saved = N; N = n; local f = write_input(n, log, extra); N = saved; return f end)()
    local args = ("run -j 2 --timeout 60 --attempts 2 --joblog %s %s %s"):format(joblog, FIXTURE, input)
    local pid = tonumber(h.first_line(("(%s %s >%s/out 2>%s/err & echo $!) 2>/dev/null")
      :format(MOONJOB, args, dir, dir)))
    finally(function() os.execute("kill -KILL " .. pid .. " 2>/dev/null") end)
    h.wait_for(function() return io.open(mark) ~= nil end, 30)
    h.sleep(0.3)
    os.execute("kill -KILL " .. pid)
    h.wait_for(function() return not h.running(pid) end, 10)
    local f = assert(io.open(dir .. "/out"))
    local printed = read_output((f:read("*a"):gsub("[^\n]*$", ""))) -- (a line cut short is not printed)
    f:close()
    local logged = {}
    for text in io.lines(joblog) do
      local line = tonumber(text:match('^{"line":(%d+)'))
      if line then logged[line] = true end
    end
    for i = 1, n do
      assert.equal(printed[i] ~= nil, logged[i] == true, "line " .. i .. ": printed and recorded differ")
    end
    assert.is_nil(logged[2500])
    -- (mark stays: line 2500 runs again below without its sleep)
    local first_runs, per_id = read_runs(log)
    assert_some_in_batch(first_runs, per_id, { 1000, 1500, 2000 })
    local out, err, status = h.sh(MOONJOB .. "run -j 2 --timeout 60 --attempts 2 --resume --joblog "
      .. joblog .. " " .. FIXTURE .. " " .. input)
    assert.equal(0, status, err)
    local second = read_output(out)
    local all_runs = read_runs(log)
    for i = 1, n do
      assert.is_true((printed[i] ~= nil) ~= (second[i] ~= nil), "line " .. i .. " printed once in all")
      local v = printed[i] or second[i]
      assert.equal("completed", v.status, "line " .. i)
      assert.equal(extra[i] and extra[i].fail_until and 2 or 1, v.attempts, "attempts of line " .. i)
      if printed[i] then -- recorded: it never ran again
        assert.equal(#first_runs[i], #all_runs[i], "line " .. i .. " ran again after it was recorded")
      end
    end
  end)
end)
