-- moonjob.pool.child_output -- one child's stdout and stderr, as its pool
-- gets them.
--
-- A part of the child (moonjob.pool.child), child.output. Every chunk the
-- child wrote reaches its pool through the child sink (moonjob.pool.sink),
-- one of two ways:
--
--   * Lines, the default: chunks are cut into lines, each given to
--     sink:output(child, job, stream, line) (job: the child's head,
--     nil while it loads and between jobs). Output past max_log_bytes for
--     one job is dropped (and counted: job.dropped_log_bytes), said once: a
--     flood costs the parent a length check per chunk, never memory.
--   * Whole lines, for a batch of lines (moonjob run) whose pool's owner
--     takes them (pool.tagged_output, set by moonjob.pool.lines). The child
--     writes each output line of a line as "[line N] text" itself
--     (core/child/output.c), and holds them to write many at once, so that
--     printing on every line costs next to nothing. The parent must not cut
--     that text into lines and tag them one by one (that cost is what it
--     saves): each chunk goes to sink:lines(child, job, text) as it
--     is, cut after its last newline (the rest waits for the next chunk, or
--     the job's end, up to max_log_bytes: a longer line without its newline
--     is passed on cut there), so that lines of two children never mix.
--     Output past max_log_bytes times the batch's lines is dropped: what
--     bounds a flood stays per line, about.
--
-- Owns: the partial last line of each stream, the last STDERR_TAIL lines of
-- stderr (output.tail, which explains a crash: read by the child), the bytes
-- of the head job's output so far and whether some were dropped.
-- Exposes: Output.new(child), output:chunk(stream, chunk, job),
-- output:flush(job), output:job_ended(job), output:reset_budget(),
-- output.tail.
-- Calls: the sink's output and lines (pool.sink); reads the
-- pool's max_log_bytes and tagged_output.
local M = {}

local Output = {}
Output.__index = Output

local STDERR_TAIL = 5 -- lines of stderr kept to explain a crash

local byte, sub = string.byte, string.sub

-- The output of `child` (a moonjob.pool.child; its pool is child.pool).
function M.new(child)
  return setmetatable({ child = child, pool = child.pool, partial = {}, tail = {},
    log_bytes = 0, truncated = false }, Output)
end

-- Keeps stderr line `line` among the last STDERR_TAIL (output.tail).
function Output:keep_stderr_line(line)
  local tail = self.tail
  tail[#tail + 1] = line
  if #tail > STDERR_TAIL then table.remove(tail, 1) end
end

-- Whether `job`'s output goes on in whole lines: a batch whose pool's owner
-- takes them.
local function whole_lines(self, job)
  return job ~= nil and job.line_count ~= nil and self.pool.tagged_output == true
end

-------------------------------------------------------------- lines ---

function Output:emit_line(stream, line, job)
  if stream == "stderr" then self:keep_stderr_line(line) end
  self.pool.sink:output(self.child, job, stream, line)
end

-- Output past max_log_bytes for one job is dropped (and counted), said once.
function Output:over_budget(chunk, job)
  local limit = self.pool.max_log_bytes
  self.log_bytes = self.log_bytes + #chunk
  if self.log_bytes <= limit then return false end
  if not self.truncated then
    self.truncated = true
    self:emit_line("stderr", ("[moonjob: output past max_log_bytes (%d) is dropped]"):format(limit), job)
  end
  return true
end

-- Cuts `chunk` of stream `stream` into lines for `job`.
function Output:cut_lines(stream, chunk, job)
  if self:over_budget(chunk, job) then
    self.partial[stream] = nil
    return
  end
  local rest = self.partial[stream]
  if rest then chunk, self.partial[stream] = rest .. chunk, nil end
  local start = 1
  while true do
    local nl = chunk:find("\n", start, true)
    if not nl then break end
    self:emit_line(stream, chunk:sub(start, nl - 1), job)
    start = nl + 1
  end
  if start <= #chunk then self.partial[stream] = chunk:sub(start) end
end

-------------------------------------------------------- whole lines ---

-- Where the last newline of `text` is, or nil.
local function last_newline(text)
  local n = #text
  if byte(text, n) == 10 then return n end
  for i = n - 1, 1, -1 do
    if byte(text, i) == 10 then return i end
  end
end

function Output:pass(text, job)
  self.pool.sink:lines(self.child, job, text)
end

-- Keeps the last lines of `text` (n: its last newline) in the stderr tail.
function Output:keep_tail(text, n)
  local lines, stop = {}, n
  for i = n - 1, 0, -1 do
    if i == 0 or byte(text, i) == 10 then
      table.insert(lines, 1, sub(text, i + 1, stop - 1))
      stop = i
      if #lines == STDERR_TAIL then break end
    end
  end
  for _, line in ipairs(lines) do self:keep_stderr_line(line) end
end

-- A line still without its newline waits for the next chunk, up to
-- max_log_bytes: a longer one is passed on cut there (ended with a newline,
-- its rest a line of its own), as keeping it would cost memory and copying
-- without bound (a line printing megabytes with no newline).
function Output:keep_partial(stream, text, job)
  if #text < self.pool.max_log_bytes then
    self.partial[stream] = text
    return
  end
  self.partial[stream] = nil
  self:pass(text .. "\n", job)
end

-- A chunk of batch `job`'s output, passed on in whole lines.
function Output:pass_lines(stream, chunk, job)
  local pool = self.pool
  local limit = pool.max_log_bytes * job.line_count
  self.log_bytes = self.log_bytes + #chunk
  if self.log_bytes > limit then
    self.partial[stream] = nil
    if not self.truncated then
      self.truncated = true
      local said = "[moonjob: output past %d bytes (max_log_bytes, %d, for each of its %d lines) is dropped]\n"
      self:pass(said:format(limit, pool.max_log_bytes, job.line_count), job)
    end
    return
  end
  local nl, rest = last_newline(chunk), self.partial[stream]
  if not nl then return self:keep_partial(stream, rest and rest .. chunk or chunk, job) end
  if rest then chunk, nl, self.partial[stream] = rest .. chunk, nl + #rest, nil end
  if stream == "stderr" then self:keep_tail(chunk, nl) end
  if nl == #chunk then return self:pass(chunk, job) end
  self:pass(sub(chunk, 1, nl), job)
  self:keep_partial(stream, sub(chunk, nl + 1), job)
end

----------------------------------------------------------- the child ---

-- A chunk the child wrote on `stream` ("stdout" or "stderr") while `job`
-- was its head (nil: none).
function Output:chunk(stream, chunk, job)
  if whole_lines(self, job) then return self:pass_lines(stream, chunk, job) end
  self:cut_lines(stream, chunk, job)
end

-- Lines still without a newline belong to `job`, which is ending (nil: no
-- job's, the child loaded or is gone between jobs).
function Output:flush(job)
  local partial = self.partial
  if partial.stdout == nil and partial.stderr == nil then return end
  local whole = whole_lines(self, job)
  for _, stream in ipairs({ "stdout", "stderr" }) do
    local rest = partial[stream]
    if rest then
      partial[stream] = nil
      if whole then self:pass(rest .. "\n", job) else self:emit_line(stream, rest, job) end
    end
  end
end

-- The head job `job` (nil: none) ends: its last lines are flushed, what was
-- dropped of its output counted (a batch of lines may write max_log_bytes a
-- line), and the next job's budget starts.
function Output:job_ended(job)
  self:flush(job)
  if job and self.truncated then
    job.dropped_log_bytes = self.log_bytes - self.pool.max_log_bytes * (job.line_count or 1)
  end
  self.log_bytes, self.truncated = 0, false -- (reset_budget's, without a call: this runs for every job)
end

-- The budget starts over (the child is ready: what it printed while it
-- loaded does not count).
function Output:reset_budget()
  self.log_bytes, self.truncated = 0, false
end

return M
