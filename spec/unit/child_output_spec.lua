-- moonjob.pool.child_output without a child process: a batch's output chunks
-- passed on in whole lines, a line cut across chunks joined, the rest ended
-- at the job's end, the stderr tail kept, and a flood dropped past
-- max_log_bytes per line; other output cut into lines. What reaches the pool
-- goes through its sink (sink:lines, sink:output).
local Output = require "moonjob.pool.child_output"

-- The output of a stand-in child whose stand-in pool keeps what its sink is
-- given: whole lines in `got`, lines as { stream, line } in `lines`.
local function new_output(max_log_bytes)
  local got, lines = {}, {}
  local sink = {}
  function sink.lines(_, _, _, text) got[#got + 1] = text end
  function sink.output(_, _, _, stream, line) lines[#lines + 1] = { stream, line } end
  local pool = { max_log_bytes = max_log_bytes or 1000, tagged_output = true, sink = sink }
  return Output.new({ pool = pool }), got, lines
end

describe("moonjob.pool.child_output", function()
  it("passes whole lines on at once, and joins a line cut across chunks", function()
    local out, got = new_output()
    local job = { line_count = 2 }
    out:chunk("stdout", "[line 1] a\n[line 1] b\n", job)
    out:chunk("stdout", "[line 2] c", job)
    out:chunk("stdout", "d\n[line 2] e", job)
    assert.same({ "[line 1] a\n[line 1] b\n", "[line 2] cd\n" }, got)
    out:flush(job) -- the job ends: its last line is its own
    assert.same("[line 2] e\n", got[3])
  end)

  it("cuts a job of one line's output into lines (the parent tags them)", function()
    local out, got, lines = new_output()
    out:chunk("stdout", "a\nb", { line = 3 })
    out:flush({ line = 3 })
    assert.same({}, got)
    assert.same({ { "stdout", "a" }, { "stdout", "b" } }, lines)
  end)

  it("cuts a batch's output into lines when the pool's owner does not take it whole", function()
    local out, got, lines = new_output()
    out.pool.tagged_output = false
    out:chunk("stdout", "[line 1] a\n", { line_count = 2 })
    assert.same({}, got)
    assert.same({ { "stdout", "[line 1] a" } }, lines)
  end)

  it("keeps the last stderr lines in its tail, to explain a crash", function()
    local out = new_output()
    out.tail[1] = "before"
    out:chunk("stderr", "1\n2\n3\n4\n5\n6\n7", { line_count = 1 })
    assert.same({ "2", "3", "4", "5", "6" }, out.tail)
  end)

  it("drops output past max_log_bytes times the batch's lines, and says so once", function()
    local out, got = new_output(10)
    local job = { line_count = 2 }
    out:chunk("stderr", ("x"):rep(15) .. "\n", job)
    out:chunk("stderr", ("y"):rep(15) .. "\n", job)
    out:chunk("stderr", "z\n", job)
    assert.equal(2, #got)
    assert.matches("^%[moonjob: output past 20 bytes %(max_log_bytes, 10, for each of its 2 lines%) is dropped%]\n$", got[2])
    out:job_ended(job)
    assert.equal(34 - 20, job.dropped_log_bytes) -- (what it wrote past the bound)
  end)

  it("passes a line without its newline on, cut, once it reaches max_log_bytes", function()
    local out, got = new_output(16)
    local job = { line_count = 100 }
    out:chunk("stdout", "[line 1] ", job)
    out:chunk("stdout", "abcd", job)
    assert.same({}, got) -- kept: its newline may come
    out:chunk("stdout", "efghij", job) -- 19 bytes, no newline: not kept any more
    assert.same({ "[line 1] abcdefghij\n" }, got)
    assert.is_nil(out.partial.stdout)
    out:chunk("stdout", "klm\n[line 2] n", job)
    assert.same("klm\n", got[2])
    out:chunk("stdout", ("o"):rep(20), job)
    assert.same("[line 2] n" .. ("o"):rep(20) .. "\n", got[3])
  end)
end)
