-- moonjob.core driven directly, under GC pressure: every object must stay
-- alive while libuv holds it, every argument is checked before it reaches C.
local ffi = require "ffi"
local core = require "moonjob.core"
local h = require "helpers"

ffi.cdef [[
  int open(const char *path, int flags, int mode);
  int close(int fd);
  int fcntl(int fd, int cmd, ...);
]]
local O_WRONLY, O_CREAT, O_TRUNC = 1, 64, 512

local function run_until(pred, seconds)
  local t0 = core.hrtime()
  while not pred() do
    assert((core.hrtime() - t0) / 1e9 < (seconds or 10), "timed out")
    core.run("nowait")
  end
end

local F_GETFD = 1
local function fd_open(fd)
  return ffi.C.fcntl(fd, F_GETFD) ~= -1
end

local function file_size(path)
  local f = assert(io.open(path, "rb"))
  local n = f:seek("end")
  f:close()
  return n
end

describe("moonjob.core", function()
  local dir
  before_each(function()
    dir = h.tmpdir()
    collectgarbage("setpause", 0) -- a collection at every step
  end)
  after_each(function()
    collectgarbage("setpause", 200)
    os.execute("rm -rf " .. dir)
  end)

  describe("output", function()
    it("writes everything it was given even when collected while writing", function()
      local path = dir .. "/out"
      local fd = ffi.C.open(path, O_WRONLY + O_CREAT + O_TRUNC, 420)
      assert.is_true(fd > 2)
      local chunk = string.rep("0123456789abcdef", 4096) -- 64 KiB
      do
        local out = core.output(fd)
        for _ = 1, 80 do assert(out:write(chunk)) end
      end
      collectgarbage()
      collectgarbage()
      run_until(function() return file_size(path) == 80 * #chunk end)
      ffi.C.close(fd)
      assert.equal(80 * #chunk, file_size(path))
    end)
  end)

  describe("input", function()
    local function lines_file(n)
      local t = {}
      for i = 1, n do t[i] = "line " .. i end
      return h.write_file(dir .. "/in", table.concat(t, "\n") .. "\n")
    end

    it("can be closed from inside its own on_line callback", function()
      local fd = assert(core.open(lines_file(1000)))
      local got, ended = {}, false
      local input
      input = core.input(fd, 1024, function(line)
        got[#got + 1] = line
        collectgarbage()
        if #got == 2 then input:close() end
      end, function() ended = true end)
      input:resume()
      run_until(function() return not fd_open(fd) end)
      assert.same({ "line 1", "line 2" }, got)
      assert.is_false(ended)
    end)

    -- A pipe holding `n` lines, its writing end closed: read as a stream.
    local function lines_pipe(n)
      local ffi = require "ffi"
      pcall(ffi.cdef, "int pipe(int fds[2]); long write(int fd, const void *b, size_t n); int close(int fd);")
      local fds = ffi.new("int[2]")
      assert(ffi.C.pipe(fds) == 0)
      local t = {}
      for i = 1, n do t[i] = "line " .. i .. "\n" end
      local text = table.concat(t)
      assert(ffi.C.write(fds[1], text, #text) == #text)
      ffi.C.close(fds[1])
      return fds[0]
    end

    for _, source in ipairs({ "file", "pipe" }) do
      it("can be paused and resumed from inside its own on_line callback (" .. source .. ")", function()
        local fd = source == "file" and assert(core.open(lines_file(200))) or lines_pipe(200)
        local got, ended = {}, false
        local input
        input = core.input(fd, 1024, function(line)
          got[#got + 1] = line
          if #got % 7 == 0 then input:pause(); input:resume() end
          if #got % 11 == 0 then input:pause(); core.timer(function() input:resume() end):start(0) end
        end, function() ended = true end)
        input:resume()
        run_until(function() return ended end)
        assert.equal(200, #got)
        for i = 1, 200 do assert.equal("line " .. i, got[i]) end
        input:close()
      end)
    end

    it("closed from on_line while resume() delivers gives its descriptor back", function()
      local path = lines_file(5)
      local before = h.open_fds()
      for _ = 1, 50 do
        local fd = assert(core.open(path))
        local input, first = nil, true
        input = core.input(fd, 1024, function()
          if first then first = false; input:pause(); return end -- the rest stays buffered
          input:close()
        end, function() end)
        input:resume()
        run_until(function() return not first end)
        input:resume() -- delivers the buffered lines now: the callback closes the input
        assert.is_false(fd_open(fd))
      end
      collectgarbage()
      assert.same(before, h.open_fds())
    end)

    it("delivers outside core.run even when the module was first required in a dead coroutine", function()
      local path = lines_file(5)
      local script = h.write_file(dir .. "/coroutine.lua", ([[
        local core
        local co = coroutine.create(function() core = require "moonjob.core" end)
        assert(coroutine.resume(co))
        co = nil
        local input, got = nil, {}
        input = core.input(assert(core.open(%q)), 100, function(line)
          got[#got + 1] = line
          if #got == 1 then input:pause() end
        end, function() end)
        input:resume()
        while #got == 0 do core.run("once") end
        for _ = 1, 5 do collectgarbage() end
        local junk = {}
        for i = 1, 100000 do junk[i] = { i, tostring(i) } end
        input:resume() -- the buffered lines, delivered outside core.run
        print(table.concat(got, ","))]]):format(path))
      local out, err, status = h.sh(h.LUAJIT .. " " .. script)
      assert.equal(0, status, err)
      assert.equal("line 1,line 2,line 3,line 4,line 5\n", out)
    end)

    it("closes the descriptor it was given once closed", function()
      local fd = assert(core.open(lines_file(3)))
      local done = false
      local input = core.input(fd, 1024, function() end, function() done = true end)
      input:resume()
      run_until(function() return done end)
      assert.is_true(fd_open(fd))
      input:close()
      input = nil
      collectgarbage()
      run_until(function() return not fd_open(fd) end)
    end)

    it("refuses a max_line it cannot hold", function()
      assert.has_error(function() core.input(0, 2 ^ 40, print, print) end)
      assert.has_error(function() core.input(0, 0 / 0, print, print) end)
    end)
  end)

  describe("spawn", function()
    local function spawn(args, env)
      local out, exited = {}, false
      local p = assert(core.spawn({ file = "/bin/sh", args = args, env = env,
        on_event = function(kind, a)
          if kind == "stdout" then out[#out + 1] = a end
          if kind == "exit" then exited = true end
        end }))
      return p, out, function() return exited end
    end

    it("passes arguments and environment intact under GC pressure", function()
      for i = 1, 20 do
        local _, out, exited = spawn({ "-c", 'echo "$1 $2 $MOONJOB_X"', "sh", "arg" .. i, ("y"):rep(i) },
          { "MOONJOB_X=x" .. i })
        collectgarbage()
        run_until(exited)
        assert.equal(("arg%d %s x%d\n"):format(i, ("y"):rep(i), i), table.concat(out))
      end
    end)

    it("checks args and env, naming what is wrong", function()
      local cb = function() end
      assert.has_error(function() core.spawn({ file = "/bin/sh", args = "abc", on_event = cb }) end,
        "core.spawn: 'args' must be a list of strings, not a string")
      assert.has_error(function() core.spawn({ file = "/bin/sh", args = { "-c", 5 }, on_event = cb }) end,
        "core.spawn: args[2] must be a string, not a number")
      assert.has_error(function() core.spawn({ file = "/bin/sh", env = { true }, on_event = cb }) end,
        "core.spawn: env[1] must be a string, not a boolean")
      assert.has_error(function() core.spawn({ file = 42, on_event = cb }) end,
        "core.spawn: 'file' must be a string")
    end)

    it("refuses a max_frame that does not fit a frame header's length", function()
      assert.has_error(function()
        core.spawn({ file = "/bin/sh", max_frame = 2 ^ 32, on_event = function() end })
      end)
    end)
  end)

  describe("the child program", function()
    it("refuses limits that are not whole numbers before anything runs", function()
      for _, bad in ipairs({ "nan", "inf", "-1", "1e9", "12abc", "" }) do
        local _, err, status = h.sh(("%s --memory-limit '%s' 3>/dev/null"):format(core.child_path(), bad))
        assert.equal(2, status, bad)
        assert.matches("^usage: moonjob%-child", err)
      end
    end)
  end)

  describe("timer", function()
    it("refuses negative, NaN and huge times", function()
      local t = core.timer(function() end)
      assert.has_error(function() t:start(-1) end)
      assert.has_error(function() t:start(0 / 0) end)
      assert.has_error(function() t:start(math.huge) end)
      assert.has_error(function() t:start(1, -5) end)
      t:close()
    end)

    it("keeps a running timer alive when its only reference is dropped", function()
      local fired = false
      do
        local t = core.timer(function() fired = true end)
        t:start(20)
      end
      collectgarbage()
      collectgarbage()
      run_until(function() return fired end)
    end)
  end)
end)
