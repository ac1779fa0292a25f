-- The local pool at its edges: output a processor prints while it loads,
-- a load failure that passes, a forced close, a close after a failed start,
-- and an internal error while a child's report is handled.
local core = require "moonjob.core"
local h = require "helpers"
local counting = require "counting"

local lines_in, seconds_since = counting.lines_in, counting.seconds_since

describe("a load failure that passes", function()
  after_each(h.cleanup)

  -- A processor whose init() fails on its first load only (a flag file says
  -- it ran once), counting its loads.
  local function flaky_processor(dir)
    return h.write_file(dir .. "/processor.lua", ([[
local loads = io.open(%q, "a") loads:write("x\n") loads:close()
local flag = %q
return {
  init = function()
    local f = io.open(flag)
    if f then f:close() return end
    io.open(flag, "w"):close()
    error("the database is not up yet")
  end,
  process = function(job) return job.data end,
}
]]):format(dir .. "/loads", dir .. "/flag"))
  end

  it("does not fail a job added after it: the job gets a fresh child", function()
    local dir = h.tmpdir()
    local pool = assert(require("moonjob").pool(flaky_processor(dir), { size = 1, echo = false }))
    local _, err = pool:run(1)
    assert.equal("ELOAD", err.code)
    assert.matches("the database is not up yet", err.message)
    local result, later = pool:run(2) -- attempts = 1: it must not fail on the old error
    assert.is_nil(later)
    assert.equal(2, result)
    pool:close()
    os.execute("rm -rf " .. dir)
  end)

  it("still fails 50 jobs added after a failure together, on one more load, when the file stays broken", function()
    local dir = h.tmpdir()
    local loads = dir .. "/loads"
    local file = h.write_file(dir .. "/processor.lua",
      ("local f = io.open(%q, 'a') f:write('x\\n') f:close()\nerror('still broken')\n"):format(loads))
    local pool = assert(require("moonjob").pool(file, { size = 2, echo = false }))
    local _, err = pool:run(0)
    assert.equal("ELOAD", err.code)
    local t0 = core.hrtime()
    local jobs = {}
    for i = 1, 50 do jobs[i] = pool:add(i) end
    pool:drain()
    assert.is_true(seconds_since(t0) < 10, "hung")
    for i = 1, 50 do
      local _, e = jobs[i]:wait()
      assert.equal("ELOAD", e.code)
      assert.equal(1, jobs[i].attempts)
    end
    assert.is_true(lines_in(loads) <= 10, lines_in(loads) .. " loads")
    pool:close()
    os.execute("rm -rf " .. dir)
  end)
end)

describe("close({ force = true })", function()
  after_each(h.cleanup)

  it("fails an active job with ECLOSED and killed = true, even one its child had not read yet", function()
    -- the job is active as soon as the pool gave it to its child; a close
    -- an instant later used to take it back, without killed
    for round = 1, 12 do
      local pool = h.pool("slow.lua", { size = 1 })
      local job = pool:add({ ms = 3000 })
      h.wait_for(function() return job.state == "active" end)
      pool:close({ force = true })
      local _, err = job:wait()
      assert.equal("ECLOSED", err.code)
      assert.is_true(err.killed, "round " .. round .. ": " .. err.message)
      assert.equal(1, job.attempts)
    end
  end)

  it("ends the jobs queued behind a running one as never run", function()
    local pool = h.pool("slow.lua", { size = 1 })
    local first = pool:add({ ms = 3000 })
    h.wait_started(first)
    local behind = pool:add({ ms = 1 })
    pool:close({ force = true })
    local _, err = first:wait()
    assert.is_true(err.killed)
    local _, queued = behind:wait()
    assert.equal("ECLOSED", queued.code)
    assert.is_nil(queued.killed)
    assert.equal(0, behind.attempts)
  end)
end)

describe("output printed while the processor loads", function()
  after_each(h.cleanup)

  -- A processor printing `n` lines at its top level and one in init(), then
  -- one line per job.
  local function loud_loader(dir, n)
    return h.write_file(dir .. "/processor.lua", ([[
for i = 1, %d do print("loading " .. i) end
io.stderr:write("loaded, no newline")
return {
  init = function() print("init ran") end,
  process = function(job) print("job " .. job.data) return job.data end,
}
]]):format(n))
  end

  for _, n in ipairs({ 1, 3000 }) do
    it("belongs to no job: not in job.logs nor `log` events, echoed with the child's pid (" .. n .. " lines)", function()
      local dir = h.tmpdir()
      local echoed, logged = {}, {}
      local pool = assert(require("moonjob").pool(loud_loader(dir, n), { size = 1,
        echo = function(line, job, pid) echoed[#echoed + 1] = { line = line, job = job, pid = pid } end }))
      pool:on("log", function(job, line) logged[#logged + 1] = line end)
      local first = pool:add(1)
      local second = pool:add(2)
      assert.equal(1, first:wait())
      assert.equal(2, second:wait())
      assert.same({ "job 1" }, first.logs)
      assert.same({ "job 2" }, second.logs)
      assert.same({ "job 1", "job 2" }, logged)
      local loading = 0
      for _, e in ipairs(echoed) do
        if e.job == nil then
          loading = loading + 1
          assert.equal(pool:stats().workers[1].pid, e.pid)
        else
          assert.matches("^job %d$", e.line)
        end
      end
      assert.equal(n + 2, loading) -- its lines, init's, and the one without a newline
      pool:close()
      os.execute("rm -rf " .. dir)
    end)
  end
end)

describe("an error raised while the pool handles a child's report", function()
  after_each(h.cleanup)

  -- Makes pool.endings[name] raise once, for `job` only.
  local function raise_once(pool, name, job)
    local endings = pool.endings
    local original = endings[name]
    endings[name] = function(self, j, ...)
      if j == job and not job.raised then
        job.raised = true
        error("injected failure in " .. name)
      end
      return original(self, j, ...)
    end
  end

  it("ends the job it was about with EINTERNAL, reports it once, and the pool goes on", function()
    local pool = h.pool("identity.lua", { size = 1 })
    local reports = {}
    pool:on("error", function(message, event) reports[#reports + 1] = { message = message, event = event } end)
    assert.equal(0, pool:run(0))
    local job = pool:add(1)
    raise_once(pool, "finish", job) -- as its DONE is handled
    h.wait_for(function() return job:is_finished() end, 5)
    local _, err = job:wait()
    assert.equal("EINTERNAL", err.code)
    assert.matches("injected failure in finish", err.message)
    assert.equal(1, #reports)
    assert.equal("internal", reports[1].event)
    assert.matches("injected failure in finish", reports[1].message)
    for i = 2, 5 do assert.equal(i, pool:run(i)) end
    assert.equal(0, pool.nactive)
  end)

  -- The child had already started the job sent behind (it runs the next
  -- as soon as it sent the first one's DONE): that job is no fault's and
  -- runs again on a fresh child, its attempt not counted.
  it("fails the job it was about, and the next job its child had started runs on a fresh child", function()
    local dir = h.tmpdir()
    local pool = h.pool("gated.lua", { size = 1, pipeline = 2 })
    local reports = 0
    pool:on("error", function() reports = reports + 1 end)
    pool.dispatch.budget_ms = 1e6 -- (white box) it sends the next job behind a head however long it runs
    for _ = 1, 3 do assert(pool:run({})) end -- short jobs: it pipelines
    local first = pool:add({ wait = dir .. "/go" })
    local second = pool:add({ mark = dir .. "/second", wait = dir .. "/release" })
    raise_once(pool, "finish", first) -- as its DONE is handled
    h.wait_started(first)
    local child = first.child
    h.wait_for(function() return #child.sent == 2 end) -- the second sent behind it
    local first_pid = child.pid
    -- without running the loop: the child ends the first job and starts the
    -- second before the parent reads the first one's DONE
    h.write_file(dir .. "/go", "")
    for _ = 1, 500 do
      if h.exists(dir .. "/second") then break end
      os.execute("sleep 0.01")
    end
    assert.truthy(h.exists(dir .. "/second"), "the child did not start the second job")
    local _, err = first:wait()
    -- its child is killed by now: the second job, held there by the file, runs
    -- again on a fresh child, which finds it
    h.write_file(dir .. "/release", "")
    assert.equal("EINTERNAL", err and err.code)
    local pid, err2 = second:wait()
    os.execute("rm -rf " .. dir)
    assert.is_nil(err2, err2 and tostring(err2))
    assert.is_number(pid)
    assert.not_equal(first_pid, pid)
    assert.equal(1, second.attempts) -- (its run on the killed child not counted)
    assert.equal(2, pool:stats().spawned)
    assert.equal(1, reports)
  end)

  it("ends the jobs a child's exit was ending, and close() still returns", function()
    local pool = h.pool("exits.lua", { size = 1 })
    local reports = 0
    pool:on("error", function() reports = reports + 1 end)
    local job = pool:add({ exit = 3 })
    raise_once(pool, "fail", job) -- as its child's exit is handled
    h.wait_for(function() return job:is_finished() end, 5)
    local _, err = job:wait()
    assert.equal("EINTERNAL", err.code)
    assert.equal(1, reports)
    assert.equal(7, pool:run({ value = 7 }))
    pool:close()
    assert.equal(0, pool.children:count_all())
  end)
end)

describe("close() after a start_timeout failure", function()
  after_each(h.cleanup)

  -- A processor that records its pid as it starts, then takes `ms` to load
  -- (some rounds: about start_timeout, so that READY and the deadline race).
  local function slow_loader(dir, ms)
    return h.write_file(dir .. "/processor.lua", ([[
local ffi = require "ffi"
ffi.cdef "int getpid(void); int usleep(unsigned int);"
local f = io.open(%q, "a") f:write(ffi.C.getpid(), "\n") f:close()
ffi.C.usleep(%d * 1000)
return function(job) return job.data end
]]):format(dir .. "/pids", ms))
  end

  it("returns only once every child it started is gone, round after round", function()
    local dir = h.tmpdir()
    for round = 1, 12 do
      local file = slow_loader(dir, round % 2 == 0 and 5000 or 100)
      local pool = assert(require("moonjob").pool(file, { size = 2, start_timeout = 0.05 + round % 3 * 0.05,
        echo = false }))
      local pids = {}
      local function note() for _, child in ipairs(pool.children:array()) do if child.pid then pids[child.pid] = true end end end
      local watch = core.timer(note)
      watch:start(1, 1)
      if round % 4 == 1 then os.execute("sleep 0.2") end -- the parent late: deadlines and READY at once
      local jobs = {}
      for i = 1, 3 do jobs[i] = pool:add(i, { attempts = 2 }) end
      h.wait_for(function() return jobs[1]:is_finished() end)
      h.sleep(round % 4 * 0.04) -- close at various points of the probes
      note()
      watch:close()
      pool:close()
      for line in io.lines(dir .. "/pids") do pids[tonumber(line)] = true end
      for pid in pairs(pids) do
        assert.is_false(h.unreaped(pid), "round " .. round .. ": child " .. pid .. " outlived close()")
      end
      os.remove(dir .. "/pids")
    end
    os.execute("rm -rf " .. dir)
  end)
end)

describe("start_timeout", function()
  after_each(h.cleanup)

  it("does not kill children that got ready in time while the parent did not run", function()
    -- the parent is blocked past start_timeout (a busy machine, a REPL at its
    -- prompt): when the loop runs again the deadline has passed, but READY
    -- is already waiting in the channel
    local pool = h.pool("identity.lua", { size = 2, start_timeout = 0.1 })
    -- both started (spawns run on libuv's thread pool, which a spec before
    -- may keep busy a while): from here each is ready within milliseconds,
    -- a few hundred under the sanitizers on a loaded machine
    h.wait_for(function()
      local children = pool.children:array()
      return #children == 2 and children[1].pid ~= nil and children[2].pid ~= nil
    end)
    os.execute(h.SANITIZED and "sleep 1.5" or "sleep 0.6")
    local result, err = pool:run(7)
    assert.is_nil(err)
    assert.equal(7, result)
    assert.equal(2, pool:stats().spawned)
  end)
end)

describe("an echo function that raises", function()
  after_each(h.cleanup)

  it("is reported like a listener's error, and the job still ends as it should", function()
    local reports = {}
    local pool = h.pool("noisy.lua", { size = 1, echo = function() error("echo broke") end })
    pool:on("error", function(message, event) reports[#reports + 1] = event .. ": " .. message end)
    local job = pool:add({ n = 4 })
    h.wait_for(function() return job:is_finished() end, 5)
    assert.equal(4, job:wait())
    assert.is_true(#reports >= 1)
    for _, r in ipairs(reports) do assert.matches("^echo: .*echo broke", r) end
    assert.equal(5, pool:run({ n = 5 }))
  end)
end)
