-- moonjob.cli.stops -- why `moonjob run` stops early, and its exit status.
--
-- A stop is a table: { status = exit status, message = what stderr says,
-- record = which jobs that end meanwhile are still recorded ("completed",
-- "ran" or nil: none), soon = --halt soon (the run waits for what runs),
-- internal = moonjob's own error, closed_output = the reader went (| head) }.
-- The run keeps the first stop it meets (run.lua); this file only builds
-- them, judges --halt's rule from counts, and turns the end of a run into its
-- exit status, saying why on stderr.
--
-- Exit status: 0 when every job completed, 1 when any failed, 2 for usage,
-- set-up or I/O errors that stop the run, 3 and 4 for --halt now and soon,
-- 128 + N on signal N.
--
-- Caveat: a --halt percentage is judged from the third finished line on, so
-- fail=50% does not stop on the first line failing.
local loop = require "moonjob.loop"

local M = {}

M.EXIT_OK, M.EXIT_FAILED, M.EXIT_USAGE, M.EXIT_HALTED_NOW, M.EXIT_HALTED_SOON = 0, 1, 2, 3, 4
M.HALTED = "halted" -- the reason of the jobs --halt soon cancels (none a child started)

local SIGNAL_NAMES = { [1] = "SIGHUP", [2] = "SIGINT", [15] = "SIGTERM" }

-- Says `message` on stderr with a hint, and returns the usage status.
function M.usage_error(message)
  io.stderr:write("moonjob: ", message, "\n", "Try 'moonjob --help'.\n")
  return M.EXIT_USAGE
end

-- Says `message` on stderr, without the hint: a set-up error (a processor
-- that cannot load, an input that cannot be opened), not a wrong command line.
function M.setup_error(message)
  io.stderr:write("moonjob: ", message, "\n")
  return M.EXIT_USAGE
end

local EPIPE = 32 -- Linux's errno for a pipe with no reader left

-- Whether a failed write's error (io's message and errno, or "EPIPE: ...")
-- says that the reader went away (| head): the output is not wanted any more.
function M.reader_gone(err, errno)
  return errno == EPIPE or tostring(err):find("^EPIPE") ~= nil or tostring(err) == "Broken pipe"
end

-- Writes a listing's text to stdout and flushes it: the exit status. A
-- reader gone (| head) is a quiet 0 (what it read was wanted); any other
-- failure is said, status 1.
function M.print(...)
  local ok, err, errno = io.stdout:write(...)
  if ok then ok, err, errno = io.stdout:flush() end
  if ok or M.reader_gone(err, errno) then return M.EXIT_OK end
  io.stderr:write("moonjob: writing to standard output failed: ", tostring(err), "\n")
  return M.EXIT_FAILED
end

-- Whether --halt's condition `h` holds after `failed_n` of `finished_n`
-- lines failed: a count, or a percentage judged from the third finished line on.
function M.halt_reached(h, finished_n, failed_n)
  if not h or failed_n == 0 then return false end
  if h.count then return failed_n >= h.count end
  return finished_n >= 3 and failed_n * 100 >= h.percent * finished_n
end

-- The stop that --halt `h` makes once `failed_n` lines failed.
function M.halted(h, failed_n)
  local rule = ("--halt %s,fail=%s"):format(h.when, h.count and h.count or h.percent .. "%")
  local lines_failed = ("%d %s failed"):format(failed_n, failed_n == 1 and "line" or "lines")
  if h.when == "now" then
    return { status = M.EXIT_HALTED_NOW, record = "completed",
      message = ("halted (%s): %s; running jobs were killed"):format(rule, lines_failed) }
  end
  return { status = M.EXIT_HALTED_SOON, record = "ran", soon = true,
    message = ("halted (%s): %s; running jobs finished, no more were started"):format(rule, lines_failed) }
end

-- Why the run stops when a wait raised: a stop signal (exit 128 + N), or an
-- error of moonjob's own (exit 1, its message).
function M.stopped_by(why)
  why = tostring(why)
  local signum = why:find("^interrupted") and loop.signal
  if not signum then return { status = M.EXIT_FAILED, message = why } end
  return { status = 128 + signum, record = "completed",
    message = ("interrupted by %s; running jobs were killed"):format(SIGNAL_NAMES[signum] or signum) }
end

-- The joblog `path` could not be written (error `e`).
function M.joblog_failed(path, e)
  return { status = M.EXIT_USAGE, message = ("writing the joblog '%s' failed: %s; the run stopped "
    .. "(--resume goes on from its last record: the lines printed since run again)")
    :format(path, tostring(e)) }
end

-- What failed writes to stdout mean, by error name.
local OUTPUT_ERRORS = {
  ENOSPC = "no space left on the device that standard output writes to",
  EDQUOT = "the disk quota of the file standard output writes to is used up",
  EFBIG = "the file standard output writes to is too large",
  EBADF = "standard output is closed",
  EIO = "an I/O error on the device that standard output writes to",
}

-- The message for write error `e` ("ENOSPC: no space left on device").
function M.output_error_message(e)
  e = tostring(e)
  local known = OUTPUT_ERRORS[e:match("^(E%u+)")]
  return ("%s (%s); the run stopped: what was not printed is not in the joblog, and --resume runs it")
    :format(known or "writing to standard output failed", e)
end

-- Writing stdout failed with `e`: a reader gone (EPIPE: | head) ends the run
-- quietly; any other error stops it, saying what it was.
function M.output_failed(e)
  if tostring(e):find("^EPIPE") then return M.closed_output() end
  return { status = M.EXIT_USAGE, message = M.output_error_message(e) }
end

-- The processor fails to load (ELOAD before any job completed): "ELOAD: ...",
-- as a syntax error reads.
function M.cannot_load(err)
  return { status = M.EXIT_USAGE, message = tostring(err) }
end

-- A listener of the run raised `e` on the job of `line`.
function M.internal_error(line, e)
  return { status = M.EXIT_FAILED, internal = true,
    message = ("internal error on line %s: %s (please report it)"):format(tostring(line), tostring(e)) }
end

-- Under --joblog `path`, the reader went away before every result was
-- delivered: the log records a run cut short, so the stop is said.
function M.undelivered(path)
  return { status = M.EXIT_USAGE, message = ("standard output's reader went away (EPIPE) before every result "
    .. "was delivered; the run stopped: the joblog '%s' records the lines printed, and --resume runs the rest")
    :format(path) }
end

-- Nobody reads the output any more: the run ends quietly.
function M.closed_output()
  return { closed_output = true }
end

-- The exit status of a run that ended, saying why on stderr when it is not
-- the jobs' own outcome. A closed output (| head) ends quietly, with the
-- status of the jobs that finished. `unwritten`: the lines whose results
-- --keep-order still holds (a gap in the output).
function M.outcome(stop, failed, unwritten, read_error, write_error)
  local jobs_status = failed == 0 and M.EXIT_OK or M.EXIT_FAILED
  if stop and stop.message then io.stderr:write("moonjob: ", stop.message, "\n") end
  if stop and stop.status then return stop.status end
  if write_error and not write_error:find("^EPIPE") then
    io.stderr:write("moonjob: ", M.output_error_message(write_error), "\n")
    return M.EXIT_USAGE
  end
  if stop then return jobs_status end -- the output closed
  if unwritten > 0 then -- a gap in --keep-order's output: never silent
    io.stderr:write(("moonjob: internal error: %d results were never written (a line before them "
      .. "is missing); they are neither printed nor in the joblog\n"):format(unwritten))
    return M.EXIT_FAILED
  end
  if read_error then
    io.stderr:write("moonjob: reading the input failed: ", read_error, "\n")
    return M.EXIT_USAGE
  end
  return jobs_status
end

return M
