-- moonjob.tagged_output without a child: a batch's output chunks passed on in
-- whole lines, a line cut across chunks joined, the rest ended at the job's
-- end, the stderr tail kept, and a flood dropped past max_log_bytes per line.
local tagged = require "moonjob.tagged_output"
local Worker = require "moonjob.worker"

-- A stand-in worker (the worker's own methods, no child) whose pool's owner
-- keeps what it is given.
local function new_worker(max_log_bytes)
  local got = {}
  local w = setmetatable({ partial = {}, tail = {}, log_bytes = 0,
    pool = { max_log_bytes = max_log_bytes or 1000, on_lines_output = function(text) got[#got + 1] = text end } },
    Worker)
  return w, got
end

describe("moonjob.tagged_output", function()
  it("passes whole lines on at once, and joins a line cut across chunks", function()
    local w, got = new_worker()
    local job = { line_count = 2 }
    assert.is_true(tagged.passes(w, job))
    assert.is_false(tagged.passes(w, { line = 3 })) -- a job of one line: cut and tagged by the parent
    tagged.chunk(w, "stdout", "[line 1] a\n[line 1] b\n", job)
    tagged.chunk(w, "stdout", "[line 2] c", job)
    tagged.chunk(w, "stdout", "d\n[line 2] e", job)
    assert.same({ "[line 1] a\n[line 1] b\n", "[line 2] cd\n" }, got)
    tagged.flush(w, job) -- the job ends: its last line is its own
    assert.same("[line 2] e\n", got[3])
  end)

  it("keeps the last stderr lines in the worker's tail, to explain a crash", function()
    local w = new_worker()
    w.tail[1] = "before"
    tagged.chunk(w, "stderr", "1\n2\n3\n4\n5\n6\n7", { line_count = 1 })
    assert.same({ "2", "3", "4", "5", "6" }, w.tail)
  end)

  it("drops output past max_log_bytes times the batch's lines, and says so once", function()
    local w, got = new_worker(10)
    local job = { line_count = 2 }
    tagged.chunk(w, "stderr", ("x"):rep(15) .. "\n", job)
    tagged.chunk(w, "stderr", ("y"):rep(15) .. "\n", job)
    tagged.chunk(w, "stderr", "z\n", job)
    assert.equal(2, #got)
    assert.matches("^%[moonjob: output past 20 bytes %(max_log_bytes, 10, for each of its 2 lines%) is dropped%]\n$", got[2])
  end)

  it("passes a line without its newline on, cut, once it reaches max_log_bytes", function()
    local w, got = new_worker(16)
    local job = { line_count = 100 }
    tagged.chunk(w, "stdout", "[line 1] ", job)
    tagged.chunk(w, "stdout", "abcd", job)
    assert.same({}, got) -- held: its newline may come
    tagged.chunk(w, "stdout", "efghij", job) -- 19 bytes, no newline: not held any more
    assert.same({ "[line 1] abcdefghij\n" }, got)
    assert.is_nil(w.partial.stdout)
    tagged.chunk(w, "stdout", "klm\n[line 2] n", job)
    assert.same("klm\n", got[2])
    tagged.chunk(w, "stdout", ("o"):rep(20), job)
    assert.same("[line 2] n" .. ("o"):rep(20) .. "\n", got[3])
  end)
end)
