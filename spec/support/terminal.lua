-- terminal -- runs a command with some of its standard descriptors on a real
-- pseudo-terminal (spec/support/pty_run.py, Python's pty module), for the
-- specs of what `moonjob` shows a user at a terminal: what the terminal
-- received, what a pipe on stdout carried, and the exit status.
--
-- Caveat: the command runs from the current directory (the worktree's root,
-- as every spec), with the environment of the spec run.
local h = require "helpers"
local json = require "moonjob.codec.json"

local M = {}

local RUNNER = "spec/support/pty_run.py"

-- terminal.run{ argv = {...}, tty = {0, 2}, stdin = FILE, stdout = "pipe" |
-- FILE, steps = { { wait = REGEX, send = TEXT }, ... }, timeout = S }
-- -> transcript (what the terminal showed), exit status, what the pipe on
-- stdout carried (stdout = "pipe").
function M.run(o)
  local dir = h.tmpdir()
  local spec = { argv = o.argv, tty = o.tty or { 0, 1, 2 }, stdin = o.stdin, stdout = o.stdout,
    stderr = o.stderr, steps = o.steps or {}, timeout = o.timeout or 60,
    transcript = dir .. "/transcript", stdout_file = dir .. "/stdout" }
  local encoded = assert(json.encode(spec))
  local out, err = h.sh("python3 " .. RUNNER .. " '" .. encoded:gsub("'", "'\\''") .. "'")
  local status = tonumber(out:match("(%-?%d+)%s*$"))
  assert(status, "pty_run.py failed: " .. out .. err)
  local function slurp(path)
    local f = io.open(path, "rb")
    if not f then return "" end
    local s = f:read("*a")
    f:close()
    return s
  end
  local transcript, piped = slurp(spec.transcript), slurp(spec.stdout_file)
  os.execute("rm -rf " .. dir)
  return transcript, status, piped
end

-- The argv of the `moonjob` command of this tree (its modules and build),
-- followed by the words of `...`.
function M.moonjob(...)
  local argv = { "env", "LUA_PATH=lua/?.lua;lua/?/init.lua;;",
    "LUA_CPATH=" .. (h.BUILD or "build") .. "/?.so;;", "luajit", "scripts/moonjob" }
  local preload = os.getenv("MOONJOB_PRELOAD") -- make sanitize: its runtime first (as helpers.LUAJIT)
  if preload then table.insert(argv, 2, "LD_PRELOAD=" .. preload) end
  for _, word in ipairs({ ... }) do argv[#argv + 1] = word end
  return argv
end

-- The progress lines drawn in `transcript` ("\r" ESC[K then the text), in
-- order: the texts that start with a digit (a count of lines).
function M.draws(transcript)
  local found = {}
  for text in transcript:gmatch("\r\27%[K([^\r\n\27]*)") do
    if text:find("^%d") then found[#found + 1] = text end
  end
  return found
end

return M
