-- spec/embed/repl_spec.lua -- what a user of the LuaJIT REPL sees: Ctrl-C during a
-- blocking call, `make repl` with and without rlwrap, job.ms of a job that
-- ended while the REPL sat at its prompt, and how pools and routers print.
--
-- Terminal behaviour runs a real `luajit` under a pseudo-terminal (`script`,
-- from util-linux): what the spec writes is typed, \003 is the terminal's
-- Ctrl-C (the pty's line discipline turns it into SIGINT for the REPL), and
-- what the terminal shows is read from script's output file.
local h = require "helpers"
local moonjob = require "moonjob"

local REPO = os.getenv("PWD")

------------------------------------------------------------- a terminal ---

-- A shell script run under a pseudo-terminal of 80x24 (rlwrap refuses a
-- terminal without a width). Returns a session: send(text), wait_for(pattern)
-- -> the output so far, output(), close().
local function terminal(script_text)
  local dir = h.tmpdir()
  h.write_file(dir .. "/run.sh", "stty cols 80 rows 24\n" .. script_text .. "\n")
  local out, pidfile = dir .. "/out", dir .. "/pid"
  local input = assert(io.popen(("echo $$ > %s; exec timeout -s KILL 60 script -q -c 'sh %s/run.sh' /dev/null > %s 2>&1")
    :format(pidfile, dir, out), "w"))
  local session = { dir = dir }

  function session.output()
    local f = io.open(out, "rb")
    local text = f and f:read("*a") or ""
    if f then f:close() end
    return text
  end

  function session.send(text)
    input:write(text)
    input:flush()
  end

  -- Waits (at most 20 s) until the output matches pattern after byte `from`.
  function session.wait_for(pattern, from)
    for _ = 1, 400 do
      local text = session.output()
      if text:find(pattern, from or 1) then return text end
      os.execute("sleep 0.05")
    end
    error(("the terminal never showed %q; it shows:\n%s"):format(pattern, session.output()))
  end

  -- Ends the session: script (through timeout, by its pid) if it still runs.
  function session.close()
    local pid = h.first_line("cat " .. pidfile)
    if pid and h.running(pid) then os.execute("kill -TERM " .. pid) end
    input:close()
    os.execute("rm -rf " .. dir)
  end

  return session
end

-- The command that starts luajit on this tree's modules (and build).
local function luajit_command()
  return "cd " .. REPO .. " && exec " .. h.LUAJIT
end

describe("the LuaJIT REPL #slow", function()
  local session
  after_each(function()
    if session then session.close() end
    session = nil
    h.cleanup()
  end)

  describe("Ctrl-C during a blocking call", function()
    it("prints one line, no stack traceback, and the pool stays usable", function()
      session = terminal(luajit_command())
      session.send('moonjob = require "moonjob"\n')
      session.send('pool = assert(moonjob.pool("spec/fixtures/slow.lua", { size = 1, echo = false }))\n')
      -- the marker is joined at run time: the echo of the typed line does not match it
      session.send('io.write("BLOCK", "ING\\n") io.flush() x = pool:run({ ms = 3000 })\n')
      local shown = session.wait_for("BLOCKING\r?\n")
      local from = select(2, shown:find("BLOCKING\r?\n")) + 1
      os.execute("sleep 0.3") -- well inside pool:run
      session.send("\003")
      shown = session.wait_for("\n> ", from)
      local said = shown:sub(from, shown:find("\n> ", from)):gsub("%^C", "")
      assert.equal("interrupted (Ctrl-C); jobs keep running and the pool stays usable", said:match("^(.-)\r?\n$"))
      -- the README's form, `= pool:run(...)`: a tail call, the line's chunk is off the stack
      session.send('io.write("AGA", "IN\\n") io.flush() return pool:run({ ms = 3000 })\n')
      shown = session.wait_for("AGAIN\r?\n", from)
      from = select(2, shown:find("AGAIN\r?\n", from)) + 1
      os.execute("sleep 0.3")
      session.send("\003")
      shown = session.wait_for("\n> ", from)
      said = shown:sub(from, shown:find("\n> ", from)):gsub("%^C", "")
      assert.equal("interrupted (Ctrl-C); jobs keep running and the pool stays usable", said:match("^(.-)\r?\n$"))
      session.send('print("AFT" .. "ER", pool:run({ ms = 10 }).ms) pool:close() os.exit(0)\n')
      shown = session.wait_for("AFTER\t10")
      assert.is_nil(shown:find("stack traceback", 1, true), shown)
      assert.is_nil(shown:find("error object", 1, true), shown)
    end)

    it("raises an error whose tostring starts with 'interrupted' and which says the signal", function()
      local pool = h.pool("fails.lua", { size = 1 })
      local job = pool:add({ how = "signal_parent", parent = require("moonjob.core").getpid() })
      local ok, err = pcall(job.wait, job)
      assert.is_false(ok)
      assert.equal("table", type(err))
      assert.equal("interrupted (Ctrl-C); jobs keep running and the pool stays usable", tostring(err))
      assert.equal("EINTERRUPTED", err.code)
      assert.equal(2, err.signal)
      assert.equal("after signal", job:wait())
    end)
  end)

  describe("make repl", function()
    -- `make repl` under a terminal, with HOME (rlwrap's history) in the
    -- session's directory; what the REPL's parent is, and the hint.
    local function make_repl(path)
      session = terminal(("cd %s && exec env -u MAKEFLAGS -u MAKELEVEL -u MFLAGS HOME=$(dirname $0) PATH=%s "
        .. "/usr/bin/make -s repl"):format(REPO, path))
      session.send('ffi = require "ffi" ffi.cdef "int getppid(void);" '
        .. 'print("PAR" .. "ENT=" .. io.open("/proc/" .. ffi.C.getppid() .. "/comm"):read("*l"), '
        .. 'require("moonjob")._VERSION)\n')
      local shown = session.wait_for("PARENT=%S+\t")
      session.send("os.exit(0)\n")
      return shown:match("PARENT=(%S+)\tmoonjob scm"), shown
    end

    local HINT = "make repl: no line editing or history without rlwrap; to get them: apt-get install rlwrap"

    it("runs the REPL under rlwrap when rlwrap is on PATH", function()
      local parent, shown = make_repl(os.getenv("PATH"))
      assert.equal("rlwrap", parent, shown)
      assert.is_nil(shown:find(HINT, 1, true), shown)
    end)

    it("says how to get rlwrap when it is not on PATH, and starts the REPL all the same", function()
      local bin = h.tmpdir()
      -- every program of /usr/bin but rlwrap (/bin is /usr/bin on Debian 12)
      assert.equal(0, os.execute(("ln -s /usr/bin/* %s/ && rm %s/rlwrap"):format(bin, bin)))
      local parent, shown = make_repl(bin .. ":/usr/sbin:/sbin")
      os.execute("rm -rf " .. bin)
      assert.equal("make", parent, shown) -- luajit itself, started by make's shell (exec)
      assert.truthy(shown:find(HINT, 1, true), shown)
    end)
  end)
end)

describe("job.ms #slow", function()
  after_each(h.cleanup)

  it("is the run time the child measured, not the time the parent left its loop idle", function()
    local pool = h.pool("slow.lua", { size = 1 })
    pool:run({ ms = 1 }) -- the child is ready: the next job starts at once
    local job = pool:add({ ms = 50 })
    os.execute("sleep 1") -- the REPL at its prompt: the loop does not run, the job ends meanwhile
    job:wait()
    assert.is_true(job.ms >= 45 and job.ms < 900, "job.ms " .. job.ms)
    local stats = pool:stats()
    assert.is_true(stats.run_p99 >= 45 and stats.run_p99 < 900, "run p99 " .. stats.run_p99)
  end)

  it("comes with job.started, a time on moonjob.now()'s clock", function()
    local pool = h.pool("slow.lua", { size = 1 })
    local before = moonjob.now()
    local job = pool:add({ ms = 20 })
    job:wait()
    assert.is_true(job.started >= before and job.started <= moonjob.now())
    assert.is_true(job.ms <= moonjob.now() - job.started)
  end)

  it("of a failed job is the child's measure too", function()
    local pool = h.pool("fails.lua", { size = 1 })
    pool:run({ how = "none" })
    local job = pool:add({ how = "string" })
    os.execute("sleep 1")
    local _, err = job:wait()
    assert.equal("EPROCESSOR", err.code)
    assert.is_true(job.ms >= 0 and job.ms < 900, "job.ms " .. job.ms)
  end)

  it("of a job whose child died is the parent's measure from its start", function()
    local pool = h.pool("fails.lua", { size = 1 })
    pool:run({ how = "none" })
    local job = pool:add({ how = "exit1" })
    local _, err = job:wait()
    assert.equal("ECRASH", err.code)
    assert.is_number(job.ms)
  end)
end)

describe("printing in the REPL #slow", function()
  after_each(h.cleanup)

  it("a pool says 1 child, 2 children", function()
    local one = h.pool("echo.lua", { size = 1 })
    local two = h.pool("echo.lua", { size = 2 })
    assert.equal("<moonjob.pool spec/fixtures/echo.lua: 1 child, 0 waiting, 0 active>", tostring(one))
    assert.equal("<moonjob.pool spec/fixtures/echo.lua: 2 children, 0 waiting, 0 active>", tostring(two))
  end)

  it("a router's stats print one line per name, as each pool's stats do", function()
    local router = assert(moonjob.pool({ b = "spec/fixtures/echo.lua", a = "spec/fixtures/echo.lua" },
      { size = 1, echo = false }))
    router:run("x", { name = "a" })
    local stats = router:stats()
    local a, b = tostring(stats.a), tostring(stats.b)
    assert.matches("^waiting 0, active 0, completed 1, failed 0, children 1/1,", a)
    assert.matches("^waiting 0, active 0, completed 0, failed 0, children 1/1,", b)
    assert.equal("a: " .. a .. "\nb: " .. b, tostring(stats))
    router:close()
  end)
end)
