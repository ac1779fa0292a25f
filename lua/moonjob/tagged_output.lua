-- moonjob.tagged_output -- a batch of lines' output, in the parent: passed on
-- in whole lines, as the child tagged it.
--
-- In a batch of lines (moonjob run), the child writes each output line of
-- a line as "[line N] text" itself (core/child/output.c), and holds them to
-- write many at once, so that printing on every line costs next to nothing.
-- The parent must not cut that text into lines and tag them one by one (that
-- cost is what it saves): while a worker's head job is a batch and the pool's
-- owner set pool.on_lines_output, each chunk read from the child's stdout or
-- stderr goes to it as it is, cut after its last newline (the rest waits for
-- the next chunk, or the job's end, up to max_log_bytes: a longer line
-- without its newline is passed on cut there), so that lines of two children
-- never mix.
--
--   pool.on_lines_output(text, job)
--       `text` is whole lines (each ending in "\n") batch `job`'s child
--       wrote; lines the child tagged begin with "[line N] ", others (a
--       command's output, a write(2)) are for the owner to tag. Called
--       protected, as the pool's echo is: an error is reported (the `error`
--       listeners, or stderr) and the pool carries on.
--
-- Output past max_log_bytes times the batch's lines is dropped, as a job's
-- past max_log_bytes is (moonjob.worker): what bounds a flood stays per line,
-- about.
local M = {}

local byte, sub = string.byte, string.sub

-- Where the last newline of `text` is, or nil.
local function last_newline(text)
  local n = #text
  if byte(text, n) == 10 then return n end
  for i = n - 1, 1, -1 do
    if byte(text, i) == 10 then return i end
  end
end

local traceback = debug.traceback

-- Gives `text` to the pool's owner, protected.
local function pass(pool, text, job)
  local ok, err = xpcall(pool.on_lines_output, traceback, text, job)
  if not ok then pool.events:report("echo", err) end
end

local TAIL = 5 -- at most the lines a worker keeps (moonjob.worker's STDERR_TAIL)

-- Keeps the last lines of `text` (n: its last newline) in the worker's
-- stderr tail, which explains a crash (worker:keep_stderr_line).
local function keep_tail(w, text, n)
  local lines, stop = {}, n
  for i = n - 1, 0, -1 do
    if i == 0 or byte(text, i) == 10 then
      table.insert(lines, 1, sub(text, i + 1, stop - 1))
      stop = i
      if #lines == TAIL then break end
    end
  end
  for _, line in ipairs(lines) do w:keep_stderr_line(line) end
end

-- A line still without its newline waits for the next chunk, up to
-- max_log_bytes: a longer one is passed on cut there (ended with a newline,
-- its rest a line of its own), as holding it would cost memory and copying
-- without bound (a line printing megabytes with no newline).
local function hold_partial(w, stream, text, job)
  if #text < w.pool.max_log_bytes then
    w.partial[stream] = text
    return
  end
  w.partial[stream] = nil
  pass(w.pool, text .. "\n", job)
end

-- Whether worker `w` passes its output on whole (its head job is a batch and
-- the owner takes it).
function M.passes(w, job)
  return job ~= nil and job.line_count ~= nil and w.pool.on_lines_output ~= nil
end

-- A chunk of batch `job`'s output read from stream `stream` of worker `w`.
function M.chunk(w, stream, chunk, job)
  local pool = w.pool
  local limit = pool.max_log_bytes * job.line_count
  w.log_bytes = w.log_bytes + #chunk
  if w.log_bytes > limit then
    w.partial[stream] = nil
    if not w.truncated then
      w.truncated = true
      pass(pool, ("[moonjob: output past %d bytes (max_log_bytes, %d, for each of its %d lines) is dropped]\n")
        :format(limit, pool.max_log_bytes, job.line_count), job)
    end
    return
  end
  local nl, rest = last_newline(chunk), w.partial[stream]
  if not nl then return hold_partial(w, stream, rest and rest .. chunk or chunk, job) end
  if rest then chunk, nl, w.partial[stream] = rest .. chunk, nl + #rest, nil end
  if stream == "stderr" then keep_tail(w, chunk, nl) end
  if nl == #chunk then return pass(pool, chunk, job) end
  pass(pool, sub(chunk, 1, nl), job)
  hold_partial(w, stream, sub(chunk, nl + 1), job)
end

-- The job ends: a line still without its newline (the child died in it, or
-- a command wrote it) is its own.
function M.flush(w, job)
  for _, stream in ipairs({ "stdout", "stderr" }) do
    local rest = w.partial[stream]
    if rest then
      w.partial[stream] = nil
      pass(w.pool, rest .. "\n", job)
    end
  end
end

return M
