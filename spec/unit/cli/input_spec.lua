-- moonjob.cli.input without a run: when the input pauses and resumes (lines
-- and bytes in flight, results pending for --keep-order), and how long its
-- batches grow. The core input is a stand-in that counts the calls.
local input = require "moonjob.cli.input"

local MIB = 1024 * 1024

-- An input of `size` children with options `o`, its stand-in handle, and an
-- output whose pending results are `pending.bytes`.
local function new_input(o, size, pending)
  pending = pending or { bytes = 0 }
  local output = { pending_results = function() return pending.bytes, 0 end,
    backlog = function() return pending.backlog or 0 end }
  local handle = { calls = {} }
  for _, name in ipairs({ "pause", "resume", "batch" }) do
    handle[name] = function(_, n) handle.calls[#handle.calls + 1] = n and name .. " " .. n or name end
  end
  local self = input.new(o, size, output)
  self.handle = handle
  return self, handle.calls, output
end

describe("moonjob.cli.input", function()
  it("pauses at 64 lines in flight per child and resumes at a quarter of that", function()
    local self, calls = new_input({}, 2)
    self.inflight = 127
    self:pause_if_full()
    assert.same({}, calls)
    self.inflight = 128
    self:pause_if_full()
    self:pause_if_full()
    assert.same({ "pause" }, calls)
    self.inflight = 33
    self:resume_if_room()
    assert.same({ "pause" }, calls)
    self.inflight = 32
    self:resume_if_room()
    assert.same({ "pause", "resume" }, calls)
  end)

  it("pauses at 4 MiB of batches in flight per child", function()
    local self, calls = new_input({}, 1)
    self.inflight_bytes = 4 * MIB
    self:pause_if_full()
    assert.same({ "pause" }, calls)
  end)

  it("stays paused once its reader went, or once it ended", function()
    local self, calls, output = new_input({}, 1)
    self.inflight = 64
    self:pause_if_full()
    self.inflight = 0
    output.write_error = "EPIPE"
    self:resume_if_room()
    output.write_error = nil
    self.ended = true
    self:resume_if_room()
    assert.same({ "pause" }, calls)
  end)

  it("with --keep-order, pauses on the pending results and those the lines in flight will bring", function()
    local pending = { bytes = 0 }
    local self, calls = new_input({ keep_order = true }, 1, pending)
    self.inflight = 4 -- no result size known yet: a few lines per child
    self:pause_if_full()
    assert.same({ "pause" }, calls)
    self.paused, self.inflight = false, 0
    self:written(("x"):rep(1000), 1) -- 1000 bytes per result line
    self.inflight = 2
    pending.bytes = 8 * MIB - 1500
    self:pause_if_full()
    assert.same({ "pause", "pause" }, calls)
  end)

  it("with --keep-order, counts a jump in result sizes at once for the lines in flight", function()
    local pending = { bytes = 0 }
    local self, calls = new_input({ keep_order = true }, 2, pending) -- 16 MiB pending at most
    for _ = 1, 100 do self:written(("x"):rep(100), 1) end -- 100 bytes per result line
    self.inflight = 100
    self:written(("x"):rep(400 * 1024), 1) -- then 400 KiB: the 99 in flight may bring as much
    pending.bytes = 400 * 1024
    self:pause_if_full()
    assert.same({ "pause" }, calls)
  end)

  it("pauses while stdout has 4 MiB it has not taken, and resumes at 1 MiB", function()
    local pending = { bytes = 0, backlog = 4 * MIB }
    local self, calls = new_input({}, 1, pending)
    self:pause_if_full()
    assert.same({ "pause" }, calls)
    pending.backlog = MIB + 1
    self:resume_if_room()
    assert.same({ "pause" }, calls)
    pending.backlog = MIB
    self:resume_if_room()
    assert.same({ "pause", "resume" }, calls)
  end)

  it("without --keep-order, ignores the size of results", function()
    local self, calls = new_input({}, 1, { bytes = 100 * MIB })
    self.inflight = 10
    self:pause_if_full()
    assert.same({}, calls)
  end)

  it("grows batches to about 4 ms of lines, and its bounds with them", function()
    local self, calls = new_input({}, 2)
    self:lines_took(1, 100) -- 0.01 ms a line: 400 lines
    assert.same({ "batch 400" }, calls)
    assert.equal(2400, self.high)
    assert.equal(600, self.low)
  end)

  it("sizes batches with --timeout or --attempts as without them", function()
    local base, plain = new_input({}, 1)
    base:lines_took(1, 100)
    assert.is_true(#plain > 0)
    for _, o in ipairs({ { timeout = 5 }, { attempts = 3 } }) do
      local self, calls = new_input(o, 1)
      self:lines_took(1, 100)
      assert.same(plain, calls)
    end
  end)
end)
