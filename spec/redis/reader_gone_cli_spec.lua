-- The listing commands when their reader goes away (`| head`): each exits 0
-- and says nothing, as `moonjob run` without --joblog does. Their output is
-- a view that can be asked for again; the reader read what it wanted.
-- Only the outputs larger than a pipe's buffer (jobs, a big job, library)
-- meet the broken pipe for sure: the short ones (queues, status, schedule
-- list, --help) are guards, which passed before the rule too.
local h = require "helpers"
local rq = require "redis_queue"

-- Runs `args` (a moonjob command line on this file's server) with stdout
-- into `head -c 1`, which goes away after its first byte. -> exit status,
-- stderr.
local function into_head(args)
  local status_file, err_file = os.tmpname(), os.tmpname()
  os.execute(("{ %s scripts/moonjob %s --redis %s 2>%s; echo $? >%s; } | head -c 1 >/dev/null")
    :format(h.LUAJIT, args, rq.server().url, err_file, status_file))
  local status = tonumber((assert(io.open(status_file)):read("*a")))
  local err = assert(io.open(err_file)):read("*a")
  os.remove(status_file); os.remove(err_file)
  return status, err
end

rq.describe(function()
  describe("a listing whose reader goes away", function()
    it("exits 0 quietly: jobs, job, queues, status, schedule list, library, --help", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      local big = ("x"):rep(400) -- a page of them is more than a pipe holds
      for i = 1, 400 do assert(q:add({ n = i, pad = big }, { id = "j" .. i })) end
      assert(q:add({ pad = ("y"):rep(200000) }, { id = "huge" }))
      assert(q:schedule("every-minute", { every = 60 }))
      for _, args in ipairs({ "jobs --queue " .. name .. " --limit 1000", "job --queue " .. name .. " huge",
        "queues", "status --queue " .. name, "schedule list --queue " .. name, "library", "--help",
        "worker --help" }) do
        local status, err = into_head(args)
        assert.equal("", err, args)
        assert.equal(0, status, args)
      end
    end)
  end)
end)
