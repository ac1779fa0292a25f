-- Durable queues on Redis: a `moonjob worker` whose processor cannot load
-- at start (its database not reachable yet) recovers once the cause is
-- fixed, and says why on stderr once; the worker command's own lines.
local core = require "moonjob.core"
local helpers = require "helpers"
local rf = require "redis_workers"

-- A processor whose init() fails while `marker` exists.
local function processor_failing_while(marker)
  return helpers.write_file(helpers.tmpdir() .. "/waits_for_db.lua", ([[
local marker = %q
return {
  init = function()
    local f = io.open(marker)
    if f then f:close(); error("the database is not reachable yet") end
  end,
  process = function(job) return { id = job.id } end,
}
]]):format(marker))
end

local function count(text, pattern)
  return select(2, text:gsub(pattern, ""))
end

describe("a Redis worker whose processor cannot load yet #slow", function()
  after_each(rf.close_all)

  it("fetches nothing, says why once, and runs every job soon after the cause is fixed", function()
    local server = rf.server()
    local marker = helpers.write_file(os.tmpname(), "down\n")
    local processor = processor_failing_while(marker)
    local q = rf.producer(server, "db")
    local pid, log = rf.worker(server, "db", "-j 2 --lease 5", processor)
    helpers.wait_for(function() return rf.read(log):find("connected to") end, 20)
    local jobs = {}
    for i = 1, 20 do jobs[i] = assert(q:add({ n = i })) end
    helpers.sleep(1.5)
    local c = q:counts()
    assert.equal(0, c.completed + c.failed) -- no job failed for a load error it never met
    os.remove(marker)
    helpers.wait_for(function() return q:counts().completed == 20 end, 15)
    for i = 1, 20 do assert(jobs[i]:wait(5)) end
    rf.stop_worker(pid, "TERM")
    local text = rf.read(log)
    assert.equal(1, count(text, "the processor cannot load"), text)
    assert.matches("the database is not reachable yet", text)
    assert.matches("loads again", text)
  end)
end)

describe("moonjob worker's lines #slow", function()
  after_each(rf.close_all)

  it("says how many children it runs without -j: one per CPU", function()
    local server = rf.server()
    local pid, log = rf.worker(server, "cpus", "")
    helpers.wait_for(function() return rf.read(log):find("connected to") end, 20)
    rf.stop_worker(pid, "TERM")
    local n = core.cpu_count()
    assert.matches(("worker %s: %d %s on queue cpus"):format(rf.PROCESSOR:gsub("%p", "%%%0"), n,
      n == 1 and "child" or "children"), rf.read(log))
  end)

  it("says why it cannot start, with nothing after the message", function()
    local server = rf.server()
    local missing = helpers.tmpdir() .. "/missing.lua"
    local pid, log = rf.worker(server, "x", "", missing)
    helpers.wait_for(function() return not helpers.running(pid) end, 20)
    local text = rf.read(log)
    assert.matches("missing%.lua", text)
    for line in text:gmatch("[^\n]+") do
      assert.not_matches("%d$", line) -- a count printed after the message
    end
  end)
end)
