-- moonjob.errors -- the error values that jobs fail with.
--
-- An error is a plain table { code = "E...", message = "...", traceback = ...,
-- plus fields that fit the code } with a metatable whose __tostring gives
-- "CODE: message". Plain tables cross the channel (moonjob.child.encode
-- makes them) and come back from Redis; the parent puts the metatable back
-- on arrival (errors.wrap).
local M = {}

-- Kept at load: in a child, a processor may remove or replace the globals
-- (`pcall = nil`), and the errors of its next jobs must still be made.
local error, io, pairs, pcall, setmetatable, tostring, xpcall =
  error, io, pairs, pcall, setmetatable, tostring, xpcall
local getinfo = debug.getinfo

local Error = {}
Error.__index = Error
Error.__tostring = function(e) return tostring(e.code) .. ": " .. tostring(e.message) end

-- errors.new(code, message [, fields]) -> error table
function M.new(code, message, fields)
  local err = {}
  if fields then for k, v in pairs(fields) do err[k] = v end end
  err.code, err.message = code, message
  return setmetatable(err, Error)
end

-- errors.wrap(t) -> t with the error metatable; a missing code becomes
-- EPROCESSOR, a missing message "(no message)", any other message a string
function M.wrap(t)
  t.code = t.code or "EPROCESSOR"
  t.message = t.message ~= nil and tostring(t.message) or "(no message)"
  return setmetatable(t, Error)
end

-- The start of the EINPUT message of a line that is not JSON: written by
-- the child (moonjob.child.encode), counted by `moonjob run` in result
-- lines to say once that --raw takes plain text (moonjob.cli.run).
M.NOT_JSON = "input is not valid JSON: "

---------------------------------------------------------- interrupted ---

-- What a blocking call (wait, run, map, drain, close) raises when a stop
-- signal interrupts it: { code = "EINTERRUPTED", message, signal }, whose
-- tostring is the message alone, "interrupted (Ctrl-C); ...", so that code
-- testing tostring(err):find("^interrupted") keeps working.
--
-- In the LuaJIT REPL it prints as that one line. LuaJIT's REPL (luajit.c)
-- turns any error, a table with __tostring included, into its message plus a
-- stack traceback, except an error whose __tostring gives no string: that one
-- it prints not at all. So when __tostring is called by the REPL's own
-- message handler (a C function called for a raise by `error`, with the
-- REPL's line, the main chunk of "=stdin", at the bottom of the stack, or no
-- main chunk at all when the line tail-called the blocking call, as
-- `= pool:run(x)` does, and no pcall in between), it writes the line to
-- stderr itself and gives nil. Caveat: a script whose main chunk tail-calls
-- a blocking call (`return pool:run(x)`) prints the one line too.
-- Everywhere else (tostring, print, string.format, busted) it gives the message.
local Interrupted = {}

local SIGNAL_NAMES = { [1] = "SIGHUP", [2] = "Ctrl-C", [15] = "SIGTERM" }

-- True when the caller of __tostring (stack level 3 from here) is the
-- message handler of luajit.c's REPL (see above).
local function called_by_repl_handler()
  local handler, raiser = getinfo(3, "Sf"), getinfo(4, "f")
  if not (handler and raiser) or handler.what ~= "C" or raiser.func ~= error then return false end
  local level = 5
  while true do
    local info = getinfo(level, "Sf")
    if not info then return false end
    if info.func == pcall or info.func == xpcall then return false end
    if info.what == "main" then
      return info.source == "=stdin" and getinfo(level + 2, "S") == nil
    end
    if info.what == "C" and getinfo(level + 1, "S") == nil then
      return true -- the bottom, the main chunk gone: the REPL's "= pool:run(...)" is a tail call
    end
    level = level + 1
  end
end

function Interrupted.__tostring(e)
  if called_by_repl_handler() then
    io.stderr:write(e.message, "\n")
    return nil
  end
  return e.message
end

-- errors.interrupted(signum) -> the error of a blocking call stopped by
-- signal signum (2: Ctrl-C).
function M.interrupted(signum)
  local message = ("interrupted (%s); jobs keep running and the pool stays usable")
    :format(SIGNAL_NAMES[signum] or ("signal " .. tostring(signum)))
  return setmetatable({ code = "EINTERRUPTED", message = message, signal = signum }, Interrupted)
end

return M
