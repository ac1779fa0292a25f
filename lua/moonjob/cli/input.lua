-- moonjob.cli.input -- `moonjob run`'s input: NDJSON read as a stream, and
-- paused while enough is in flight, so a file of millions of lines runs in
-- bounded memory.
--
-- The input pauses at a high mark and resumes at a low one, on four counts:
-- the result bytes stdout has not taken yet (a slow reader: the output's
-- back-pressure), lines in flight (room for a few batches per child), bytes
-- of batches in flight, and, with --keep-order, the memory of the pending
-- results (they wait for an earlier line still running), counting those the
-- lines in flight will bring at the recent bytes per result line (the
-- largest lately: a jump in sizes counts at once): a slow early line pauses
-- the input at this bound rather than keep every later result pending. Each
-- child keeps a line in flight whatever the size of results. The lines a batch hands back while
-- past this bound are parked by moonjob.cli.batch_jobs (keep_order_full).
--
-- The input also sizes the batches it cuts (core.input's input:batch):
-- batches are as long as BATCH_BUDGET_MS of recent lines (1 line each until
-- lines are known to be short; also under --timeout and --attempts, but a
-- batch whose line ran to its deadline does not size them: see
-- moonjob.cli.batch_jobs). What lines print does not shorten batches (the
-- child tags it with its line: core/child/output.c).
--
-- Input is NDJSON unless --raw: then each line's text is its job's data (the
-- children get the pool's raw option). Without --raw, the first line that is
-- not blank is checked in the parent (first_line_problem): input that is not
-- JSON from its first line on (file names, words) stops the run before any
-- line runs, saying to use --raw, rather than failing every line. A later
-- line that is not JSON fails alone with EINPUT (the run says so once at its
-- end, moonjob.cli.run). Blank lines (empty, or only whitespace) run as
-- nothing, with or without --raw.
--
-- Input read from a terminal (INPUT is a terminal, or none is given and
-- stdin is one) is said once on stderr, and no progress line is drawn over
-- what is typed (from_terminal, read by the run's display).
--
-- Caveat: every path that frees room (a line written, handed back, skipped)
-- must call resume_if_room(), or a paused input stays paused; the run's main
-- wait calls it too, as a safety net. The counts in flight change only
-- through read, sent, dropped, batch_ended and written.
local core = require "moonjob.core"

local M = {}

local BATCH_BUDGET_MS = 4 -- a batch of lines runs about this long in its child
local BATCH_LINES_MAX = 4096 -- and holds at most this many lines
local PENDING_BYTES_PER_CHILD = 8 * 1024 * 1024 -- --keep-order: pending results, per child
local BYTES_PER_CHILD = 4 * 1024 * 1024 -- batches in flight (blocks are at most 1 MiB: core/parent/stdio.c)
local OUTPUT_HIGH, OUTPUT_LOW = 4 * 1024 * 1024, 1024 * 1024 -- result bytes stdout has not taken yet
local CHECK_WHOLE_MAX = 1024 * 1024 -- a longer first line is checked by its first character only
local JSON_START = "^[%[{\"%-%dtfn]" -- how a JSON value begins

local Input = {}
Input.__index = Input

-- The input's descriptor: stdin for nil or "-", else file `path` opened; or
-- nil and a message (stdin was closed when the program started: reading it
-- would read nothing, silently).
function M.open(path)
  if path == nil or path == "-" then
    if core.closed_at_start(0) then
      return nil, "standard input is closed" .. (path and " (INPUT is -)" or " and no INPUT file was given")
        .. ": name the file (moonjob run PROCESSOR INPUT) or give the lines on stdin"
    end
    return 0
  end
  local fd, err = core.open(path)
  if not fd then -- "EACCES: permission denied": the reason, as for the processor and the joblog
    return nil, ("cannot open input '%s': %s"):format(path, (err:gsub("^E%u+: ", "")))
  end
  return fd
end

-- The bytes left to read in the input when it is a regular file (named, or
-- redirected to stdin), else nil (a pipe, a terminal).
function M.size(path)
  local stdin = path == nil or path == "-"
  local f = stdin and io.stdin or io.open(path, "rb")
  if not f then return nil end
  local at = f:seek("cur")
  local size = at and f:seek("end")
  if at then f:seek("set", at) end -- (the input reads the descriptor itself: its offset must stay)
  if not stdin then f:close() end
  return size and size - at
end

-- The bounds for `pool_size` children, options `o` (keep_order, timeout,
-- attempts); `output` is asked for its pending results
-- (output:pending_results()), what stdout has not taken (output:backlog())
-- and whether it failed (output.write_error).
function M.new(o, pool_size, output)
  local bytes_high, pending_high = pool_size * BYTES_PER_CHILD, pool_size * PENDING_BYTES_PER_CHILD
  local self = setmetatable({
    handle = nil, -- core.input, once started
    pool_size = pool_size, keep_order = o.keep_order, output = output,
    inflight = 0, inflight_bytes = 0, -- lines added and not written; bytes of batches in flight
    paused = false, -- by back-pressure (pause_if_full)
    ended = false, -- no more lines are taken: read to its end, halted, or closed
    line_no = 0, bytes_read = 0, -- the last line read, and the bytes read (the progress line)
    at_end = false, read_error = nil, -- read to its end, or failed reading (read_error)
    high = nil, low = nil, bytes_high = bytes_high, bytes_low = bytes_high / 4,
    pending_high = pending_high, pending_low = pending_high / 4,
    result_line_bytes = 0, -- recent bytes per result line: up at once, down slowly
    batch_lines = 1, line_ms = nil,
    one_line_each = o.rate ~= nil, -- --rate counts lines: each runs as a job of its own
    checked = o.raw, -- the first line that is not blank was checked (or --raw: none is)
    from_terminal = false, -- read from a terminal: no progress line until it ends
  }, Input)
  self:set_bounds()
  return self
end

-- Starts reading descriptor `fd`: on_line(text, len, count) for each line
-- or batch of `count` lines (text nil: a line longer than max_line).
function Input:start(fd, max_line, on_line)
  self.from_terminal = core.isatty(fd)
  if self.from_terminal then
    io.stderr:write("moonjob: reading input from the terminal, one line per job; end it with Ctrl-D\n")
  end
  self.handle = core.input(fd, max_line, on_line, function(e)
    self.ended, self.read_error, self.at_end = true, e, true
  end)
  self.handle:resume()
end

-- A short, printable view of line `text` for a message.
local function quoted(text)
  local shown = text:sub(1, 40):gsub("[%c\128-\255\"\\]", function(c) return ("\\x%02x"):format(c:byte()) end)
  return '"' .. shown .. (#text > 40 and '..."' or '"')
end

-- Why the first line that is not blank, of the `count` lines `text` from
-- line `first` on, shows that the input is not NDJSON (a message for the
-- user), or nil. Until a line that is not blank was seen, each read is
-- asked; then (and always with --raw) none is. A line's UTF-8, its numbers
-- and its depth are the child's to judge (they fail that line alone).
function Input:first_line_problem(first, text, count)
  if self.checked or text == nil then -- (nil: a line longer than max_payload, which fails alone)
    self.checked = self.checked or text == nil
    return nil
  end
  local line_no, at = first, 1
  for _ = 1, count do
    local nl = text:find("\n", at, true) or #text + 1
    local line = text:sub(at, nl - 1)
    if line:find("%S") then
      self.checked = true
      local start = line:match("^%s*()")
      local err = not line:find(JSON_START, start) and "it does not begin as a JSON value does"
      if not err and #line <= CHECK_WHOLE_MAX then
        local _, why = require("moonjob.codec.json").decode(line)
        if why and not (why:find("^number ") or why:find("^nested deeper") or why:find("^invalid UTF%-8")) then
          err = why
        end
      end
      if not err then return nil end
      return ("line %d is not JSON (%s: %s): moonjob run reads NDJSON, one JSON value per line; "
        .. "for plain-text lines (file names, words) use --raw, which passes each line as a string "
        .. "in job.data"):format(line_no, quoted(line), err)
    end
    line_no, at = line_no + 1, nl + 1
  end
end

-- `count` lines of `len` bytes were read: returns the first one's number.
function Input:read(count, len)
  local first = self.line_no + 1
  self.line_no = self.line_no + count
  self.bytes_read = self.bytes_read + len + 1
  return first
end

-- `lines` lines went to the pool, as one job of `bytes` bytes of batch
-- text (0 for a line on its own).
function Input:sent(lines, bytes)
  self.inflight, self.inflight_bytes = self.inflight + lines, self.inflight_bytes + bytes
end

-- `lines` lines left the count in flight with no result written: handed
-- back (they are sent again) or forgotten in a stop.
function Input:dropped(lines)
  self.inflight = self.inflight - lines
end

-- A batch of `bytes` bytes of text ended.
function Input:batch_ended(bytes)
  self.inflight_bytes = self.inflight_bytes - bytes
end

-- No more lines are taken (--halt soon); what is in flight goes on.
function Input:take_no_more()
  self.ended = true
end

-- Lines in flight before input pauses (high) and resumes (low): room for
-- a few batches per child.
function Input:set_bounds()
  self.high = math.max(self.pool_size * 64, self.pool_size * self.batch_lines * 3)
  self.low = math.floor(self.high / 4)
end

-- Whether the results pending for --keep-order, with those the lines in
-- flight will bring (about), are at least `bound` bytes. Each child may
-- have a line in flight whatever the size of results, unless the results
-- already pending are past the bound; until a result's size is known, a few.
function Input:results_past(bound)
  if not self.keep_order then return false end
  local inflight, size = self.inflight, self.pool_size
  if self.result_line_bytes == 0 then return inflight >= size * 4 end
  local bytes = self.output:pending_results()
  return bytes >= bound or (inflight >= size and bytes + inflight * self.result_line_bytes >= bound)
end

-- With --keep-order, whether the pending results (and those the lines in
-- flight will bring) are past the bound (`low`: past its low mark).
function Input:keep_order_full(low)
  return self:results_past(low and self.pending_low + 1 or self.pending_high)
end

function Input:pause_if_full()
  if self.paused or self.ended then return end
  if self.inflight >= self.high or self.inflight_bytes >= self.bytes_high or self:results_past(self.pending_high)
      or self.output:backlog() >= OUTPUT_HIGH then
    self.paused = true
    self.handle:pause()
  end
end

-- Called wherever lines in flight or pending results may have gone down.
function Input:resume_if_room()
  if not self.paused or self.ended or self.output.write_error then return end
  if self.inflight <= self.low and self.inflight_bytes <= self.bytes_low
      and not self:results_past(self.pending_low + 1) and self.output:backlog() <= OUTPUT_LOW then
    self.paused = false
    self.handle:resume()
  end
end

-- The results `text` of `count` lines were written (or are pending): they
-- leave the count in flight, and tell the bytes per result line. The estimate
-- follows a rise at once, so that a jump in result sizes pauses the input
-- (-k) before more lines go out than the bound holds; it falls slowly.
function Input:written(text, count)
  self.inflight = self.inflight - count
  if count > 0 and text ~= "" then
    local per_line = #text / count
    local estimate = self.result_line_bytes
    self.result_line_bytes = per_line >= estimate and per_line or estimate * 0.95 + per_line * 0.05
  end
end

-- Stops reading, leaving `paused` as it is (--halt, a closed output): the
-- run takes no line once it stops, and its main wait ends.
function Input:stop_reading()
  self.handle:pause()
end

-- No more resuming, and the input is closed.
function Input:close()
  self.ended = true
  self.handle:close()
end

-- Batches are as long as BATCH_BUDGET_MS of recent lines: the run time of
-- `n` lines was `ms`.
function Input:lines_took(ms, n)
  if n < 1 or self.ended or self.one_line_each then return end -- ended: the input is read (or closed)
  local per_line = math.max(ms / n, 1e-4)
  local line_ms = self.line_ms and self.line_ms * 0.8 + per_line * 0.2 or per_line
  self.line_ms = line_ms
  local want = math.max(1, math.min(BATCH_LINES_MAX, math.floor(BATCH_BUDGET_MS / line_ms)))
  if want ~= self.batch_lines then
    self.batch_lines = want
    self.handle:batch(want)
    self:set_bounds()
  end
end

return M
