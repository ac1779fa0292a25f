-- `moonjob add` from a slow pipe (`tail -f log | moonjob add`): a line is
-- sent, and its id printed, soon after it arrives, while the writer still
-- holds the pipe open; not only when a batch is full or the input ends.
local h = require "helpers"
local rq = require "redis_queue"

rq.describe(function()
  describe("moonjob add from a slow pipe", function()
    it("sends each line soon after it arrives, while the pipe stays open, and prints its id", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      local dir = h.tmpdir()
      local fifo, ids, err = dir .. "/in", dir .. "/ids", dir .. "/err"
      assert(os.execute("mkfifo " .. fifo) == 0)
      local pid = assert(tonumber(h.first_line(("%s scripts/moonjob add --queue %s --redis %s <%s >%s 2>%s & echo $!")
        :format(h.LUAJIT, name, rq.server().url, fifo, ids, err))))
      rq.close_after({ close = function() os.execute(("kill -KILL %d 2>/dev/null"):format(pid)) end })
      local writer = assert(io.open(fifo, "w")) -- (opens once the command's shell opened its end)
      writer:write('{"n":1}\n')
      writer:flush()
      assert.is_true(rq.wait_for(function() return q:counts().waiting == 1 end), "the line was not sent")
      assert.is_true(rq.wait_for(function() return #rq.read_lines(ids) == 1 end), "its id was not printed")
      writer:write('{"n":2}\n{"n":3}\n')
      writer:flush()
      assert.is_true(rq.wait_for(function() return q:counts().waiting == 3 end), "the lines were not sent")
      assert.is_true(h.running(pid), "moonjob add ended while its input was open")
      writer:close()
      assert.is_true(rq.wait_for(function() return not h.running(pid) end), "moonjob add did not end")
      local printed = rq.read_lines(ids)
      assert.equal(3, #printed)
      for i, id in ipairs(printed) do assert.same({ n = i }, assert(q:job(id)).data) end
      assert.equal("", table.concat(rq.read_lines(err), "\n"))
      os.execute("rm -rf " .. dir)
    end)

    it("on SIGTERM while the pipe stays open adds what it read, prints its ids, says so and exits 143", function()
      local name = rq.new_queue()
      local q = rq.new_producer(name)
      local dir = h.tmpdir()
      local fifo, ids, err, rc = dir .. "/in", dir .. "/ids", dir .. "/err", dir .. "/rc"
      assert(os.execute("mkfifo " .. fifo) == 0)
      local shell = assert(tonumber(h.first_line(("(%s scripts/moonjob add --queue %s --redis %s <%s >%s 2>%s; "
        .. "echo $? >%s) & echo $!"):format(h.LUAJIT, name, rq.server().url, fifo, ids, err, rc))))
      rq.close_after({ close = function() os.execute(("kill -KILL %d 2>/dev/null"):format(shell)) end })
      local writer = assert(io.open(fifo, "w"))
      writer:write('{"n":1}\n{"n":2}\n')
      writer:flush()
      assert.is_true(rq.wait_for(function() return #rq.read_lines(ids) == 2 end), "the ids were not printed")
      local pid = assert(tonumber(h.first_line("ps -o pid= --ppid " .. shell)), "no moonjob add under the shell")
      assert(os.execute("kill -TERM " .. pid) == 0)
      assert.is_true(rq.wait_for(function() return #rq.read_lines(rc) == 1 end), "moonjob add did not end")
      writer:close()
      assert.equal("143", rq.read_lines(rc)[1])
      assert.equal(2, q:counts().waiting)
      assert.equal(2, #rq.read_lines(ids))
      assert.same({ "moonjob: interrupted by SIGTERM: the input after line 2 was not read; the lines before it "
        .. "were sent (their ids are printed)" }, rq.read_lines(err))
      os.execute("rm -rf " .. dir)
    end)
  end)
end)
