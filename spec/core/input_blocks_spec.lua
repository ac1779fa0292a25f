-- core.input's blocks of lines (input:batch(n), what `moonjob run` sends as
-- one batch): from a regular file every block but the last holds n lines,
-- whatever the boundaries of the reads underneath; a block is never cut at
-- the end of what one read brought.
local core = require "moonjob.core"
local h = require "helpers"

local function run_until(pred)
  local t0 = core.hrtime()
  while not pred() do
    assert((core.hrtime() - t0) / 1e9 < 20, "timed out")
    core.run("nowait")
  end
end

-- `n` lines of lengths that vary, so that reads end inside lines and blocks.
local function lines_of(n)
  local t = {}
  for i = 1, n do t[i] = ('{"i":%d,"pad":"%s"}'):format(i, ("x"):rep((i * 37) % 300)) end
  return t
end

-- Reads file `path` in blocks of `batch` lines: the blocks' texts and counts.
-- With `pause_every`, the input is paused inside every such callback and
-- resumed on the next loop turn.
local function read_blocks(path, batch, pause_every)
  local blocks, counts, ended = {}, {}, false
  local input
  input = core.input(assert(core.open(path)), 1024 * 1024, function(text, _, count)
    blocks[#blocks + 1], counts[#counts + 1] = text, count
    if pause_every and #blocks % pause_every == 0 then
      input:pause()
      core.timer(function() if not ended then input:resume() end end):start(0) -- (none once closed)
    end
  end, function() ended = true end)
  input:batch(batch)
  input:resume()
  run_until(function() return ended end)
  input:close()
  return blocks, counts
end

describe("core.input's blocks of lines from a regular file", function()
  local dir
  before_each(function() dir = h.tmpdir() end)
  after_each(function() os.execute("rm -rf " .. dir) end)

  for _, pause_every in ipairs({ false, 3 }) do
    it("are all as long as asked but the last" .. (pause_every and ", paused and resumed" or ""), function()
      local lines = lines_of(20000) -- about 3.3 MB: many reads, ending anywhere
      local path = h.write_file(dir .. "/in", table.concat(lines, "\n") .. "\n")
      local blocks, counts = read_blocks(path, 97, pause_every)
      for i = 1, #counts - 1 do
        if counts[i] ~= 97 then error(("block %d holds %d lines, not 97"):format(i, counts[i])) end
      end
      assert.equal(20000 % 97, counts[#counts])
      assert.equal(table.concat(lines, "\n"), table.concat(blocks, "\n"))
    end)
  end

  it("keep every line whole when the batch shrinks while a block waits for the end", function()
    -- Blocks of 400: two go, the last 200 lines wait for the read that finds
    -- the end; meanwhile the batch becomes 50, and each block then pauses the
    -- input: the end must not come (nor glue the lines left) before they do.
    local lines = lines_of(1000)
    local path = h.write_file(dir .. "/in", table.concat(lines, "\n") .. "\n")
    local blocks, counts, ended = {}, {}, false
    local input
    input = core.input(assert(core.open(path)), 1024 * 1024, function(text, _, count)
      blocks[#blocks + 1], counts[#counts + 1] = text, count
      if #blocks == 2 then core.timer(function() input:batch(50) end):start(0) end
      if #blocks > 2 then
        input:pause()
        core.timer(function() if not ended then input:resume() end end):start(1)
      end
    end, function() ended = true end)
    input:batch(400)
    input:resume()
    run_until(function() return ended end)
    input:close()
    for i, text in ipairs(blocks) do
      assert.equal(counts[i], select(2, text:gsub("\n", "")) + 1, "block " .. i .. "'s count")
    end
    assert.equal(table.concat(lines, "\n"), table.concat(blocks, "\n"))
    assert.same({ 400, 400, 50, 50, 50, 50 }, counts)
  end)

  it("end with the last line even when it has no newline", function()
    local lines = lines_of(1000)
    local path = h.write_file(dir .. "/in", table.concat(lines, "\n"))
    local blocks, counts = read_blocks(path, 300)
    assert.same({ 300, 300, 300, 99, 1 }, counts) -- (the line with no newline comes on its own)
    assert.equal(table.concat(lines, "\n"), table.concat(blocks, "\n"))
  end)
end)
