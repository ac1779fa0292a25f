local moonjob = require "moonjob"
local h = require "helpers"

describe("processor files", function()
  after_each(h.cleanup)

  describe("the function form", function()
    it("sees job.id, job.name, job.data and job.attempt", function()
      local pool = h.pool("echo.lua", { size = 1 })
      local job = pool:add({ x = 1 }, { name = "first" })
      local result = job:wait()
      assert.same({ data = { x = 1 }, id = job.id, name = "first", attempt = 1 }, result)
    end)
  end)

  describe("the table form", function()
    it("runs init once per child, before its first job", function()
      local pool = h.pool("table_form.lua", { size = 1 })
      local a = pool:run(1)
      local b = pool:run(2)
      assert.equal(1, a.inits)
      assert.equal(1, b.inits)
      assert.equal(a.pid, b.pid)
    end)

    it("fails the job with ELOAD when init raises", function()
      local pool = h.pool("init_error.lua", { size = 1 })
      local _, err = pool:run(1)
      assert.equal("ELOAD", err.code)
      assert.matches("^init%(%) failed: .*init_error.lua:2: init exploded$", err.message)
    end)
  end)

  describe("a processor that removes every global", function()
    -- the runner keeps its own references from before the processor loaded:
    -- the jobs after it run in the same child, their endings as before
    local function after_clearing(opts)
      local pool = h.pool("clears_globals.lua", opts)
      local json = opts.codec == "json" and require "moonjob.codec.json"
      local function put(v) return json and assert(json.encode(v)) or v end
      local function got(v, ...) if json and v then return (json.decode(v)), ... end return v, ... end
      local progress = {}
      pool:on("progress", function(_, value) progress[#progress + 1] = value end)
      assert.same({ "cleared" }, { got(pool:run(put("clear"))) })
      assert.same({ { list = { 1, 2 }, x = "y" } }, { got(pool:run(put({ list = { 1, 2 }, x = "y" }))) })
      local logged = pool:add(put("log"))
      assert.same({ "logged" }, { got(logged:wait()) })
      assert.same({ "logged 1 true" }, logged.logs)
      assert.same({ { n = 1 } }, progress)
      local _, err = pool:run(put("fail"))
      assert.equal("EMINE", err and err.code)
      assert.equal("my own error", err.message)
      assert.equal(3, err.n)
      local spun = pool:add(put("spin"), { timeout = 0.2 })
      _, err = spun:wait()
      assert.equal("ETIMEDOUT", err and err.code, err and err.message)
      assert.same({ "cleaned up after timeout" }, spun.logs)
      assert.equal("still here", got(pool:run(put("still here"))))
      assert.equal(1, pool:stats().spawned)
      return pool
    end

    -- every module a child runs per job, kept in its locals: its functions
    -- read no global (the runner hides batch and encode from package.loaded)
    local CHILD_MODULES = { "moonjob.child.runner", "moonjob.child.batch", "moonjob.child.encode",
      "moonjob.codec.json", "moonjob.codec.json_c", "moonjob.codec.json_lua", "moonjob.codec.utf8",
      "moonjob.codec.resultline", "moonjob.codec.children", "moonjob.errors", "moonjob.json" }

    it("is met by modules whose functions read no global, only locals kept at load", function()
      local read = {}
      for _, name in ipairs(CHILD_MODULES) do
        local path = "lua/" .. name:gsub("%.", "/") .. ".lua"
        local listing = io.popen(h.LUAJIT .. " -bl " .. path)
        local in_main = false
        for line in listing:lines() do
          local where = line:match("^%-%- BYTECODE %-%- (%S+)")
          if where then in_main = where:find(":0%-%d+$") ~= nil end
          local global = line:match('GGET .*; "(.-)"$')
          if global and not in_main then read[#read + 1] = path .. ": " .. global end
        end
        assert.is_true(listing:close())
      end
      assert.same({}, read)
      local pool = h.pool("clears_globals.lua", { size = 1 })
      local known = {}
      for _, name in ipairs(CHILD_MODULES) do known[name] = true end
      for _, name in ipairs(assert(pool:run("modules"))) do
        assert.is_true(known[name], name .. " is loaded in the child: add it to CHILD_MODULES")
      end
    end)

    it("leaves its child running jobs, codec lua", function()
      after_clearing({ size = 1, jit = false })
    end)

    it("leaves its child running jobs, codec json", function()
      local pool = after_clearing({ size = 1, jit = false, codec = "json" })
      -- (the codec's rarer ways: a copy with markers, 64-bit integers)
      local text = '{"a":[[]],"b":[12345678901234567890,-9007199254740993],"c":1e400}'
      local _, err = pool:run(text)
      assert.equal("EINPUT", err and err.code)
      text = '{"a":[[]],"b":[12345678901234567890,-9007199254740993]}'
      assert.equal(text, pool:run(text))
    end)

    it("leaves its child running the lines of moonjob run, batch after batch", function()
      local lines = { '"clear"' }
      for i = 2, 600 do lines[i] = tostring(i) end
      lines[300] = '"fail"'
      local out, err, status = h.sh(h.LUAJIT .. " scripts/moonjob run -j 1 spec/fixtures/clears_globals.lua",
        table.concat(lines, "\n") .. "\n")
      assert.equal(1, status, err) -- (one line failed)
      local n = 0
      for line in out:gmatch("[^\n]+") do
        n = n + 1
        if line:find('^{"line":300,') then
          assert.matches('"status":"failed","error":{"code":"EMINE","message":"my own error","n":3}', line, 1, true)
        else
          assert.matches('"status":"completed"', line)
        end
      end
      assert.equal(600, n)
    end)
  end)

  describe("failures", function()
    it("error('msg') fails with EPROCESSOR and a traceback naming the file and line", function()
      local pool = h.pool("fails.lua", { size = 1 })
      local _, err = pool:run({ how = "string" })
      assert.equal("EPROCESSOR", err.code)
      assert.equal("spec/fixtures/fails.lua:5: boom", err.message)
      assert.matches("stack traceback:", err.traceback)
      assert.matches("spec/fixtures/fails.lua:5:", err.traceback)
      assert.equal("EPROCESSOR: spec/fixtures/fails.lua:5: boom", tostring(err))
    end)

    it("error({ message, code }) keeps the code, the message and the other fields", function()
      local pool = h.pool("fails.lua", { size = 1 })
      local _, err = pool:run({ how = "table" })
      assert.equal("EBADINPUT: bad input", tostring(err))
      assert.equal("x", err.field)
      assert.matches("fails.lua:7", err.traceback)
    end)

    it("reuses the child after a job failed by a Lua error", function()
      local pool = h.pool("pid.lua", { size = 1 })
      local fails = h.pool("fails.lua", { size = 1 })
      local first = pool:run(1)
      assert.is_nil(fails:run({ how = "string" }))
      assert.equal(first, pool:run(2))
      assert.equal(1, fails:stats().spawned)
      assert.equal("ok", fails:run({ how = "none" }))
      assert.equal(1, fails:stats().spawned)
    end)

    it("fails with ELOAD when the file raises while the child runs it", function()
      local pool = h.pool("load_error.lua", { size = 1 })
      local _, err = pool:run(1)
      assert.equal("ELOAD", err.code)
      assert.equal("spec/fixtures/load_error.lua:2: cannot start: missing configuration", err.message)
    end)

    it("fails with ELOAD when the file returns neither a function nor a table", function()
      local pool = h.pool("returns_number.lua", { size = 1 })
      local _, err = pool:run(1)
      assert.equal("ELOAD: spec/fixtures/returns_number.lua must return a function(job) or a table "
        .. "{ process = function(job) ... end }, not a number", tostring(err))
    end)

    it("fails one waiting job per failed load, never all of them, and starts one child at a time", function()
      local pool = h.pool("load_error.lua", { size = 2 })
      local jobs = {}
      for i = 1, 4 do jobs[i] = pool:add(i) end
      for i = 1, 4 do
        local _, err = jobs[i]:wait()
        assert.equal("ELOAD", err.code)
      end
      h.wait_for(function() return pool:stats().children == 0 end)
      -- two children at first (size), then one per waiting job: no storm
      assert.is_true(pool:stats().spawned <= 4)
    end)

    it("fails with EPAYLOAD when the result cannot be serialised", function()
      local pool = h.pool("fails.lua", { size = 1 })
      local _, err = pool:run({ how = "function_result" })
      assert.equal("EPAYLOAD", err.code)
      assert.matches("the result cannot be encoded", err.message)
    end)

    it("fails with EPAYLOAD when the result is larger than max_payload, and the pool carries on", function()
      local pool = h.pool("fails.lua", { size = 1, max_payload = 10000 })
      local _, err = pool:run({ how = "big_result", size = 20000 })
      assert.equal("EPAYLOAD", err.code)
      assert.matches("more than max_payload %(10000%)", err.message)
      assert.equal(string.rep("x", 100), pool:run({ how = "big_result", size = 100 }))
    end)

    it("raises in the processor when job:progress() is given more than max_payload", function()
      local pool = h.pool("oversize.lua", { size = 1, max_payload = 1000 })
      local _, err = pool:run({ how = "progress", size = 2000 })
      assert.equal("EPROCESSOR", err.code)
      assert.matches("oversize.lua:%d+: job:progress%(%): the value is %d+ bytes, more than "
        .. "max_payload %(1000%)", err.message)
    end)

    it("fails the job with EPAYLOAD when a child sends an oversized frame, and replaces the child", function()
      local pool = h.pool("oversize.lua", { size = 1, max_payload = 1000 })
      local _, err = pool:run({ how = "raw", size = 100000 })
      assert.equal("EPAYLOAD", err.code)
      assert.matches("more than max_payload %(1000%)", err.message)
      assert.equal("fine", pool:run({ how = "none" }))
      assert.equal(2, pool:stats().spawned)
    end)
  end)

  describe("its environment", function()
    it("can require modules next to the file, and cjson", function()
      local pool = h.pool("uses_neighbour.lua", { size = 1 })
      assert.same({ helper = 42, json = "[1,2]" }, pool:run(21))
    end)
  end)
end)
