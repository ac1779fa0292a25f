-- moonjob.cli.joblog -- `moonjob run --joblog FILE [--resume]`: the file
-- that records each finished line's result line, as on stdout and in the
-- same order. Stdout's writer (core.output, made by moonjob.cli.output)
-- writes the records, from a duplicate of this file's descriptor, right
-- after stdout took each line: the joblog holds only lines printed.
--
-- Every record is unbuffered: the joblog is the record --resume trusts. Only
-- records ended by a newline count: a write cut short (a full disk, a crash)
-- leaves a last record without one, which --resume ignores and which is cut
-- off, with a note on stderr, when the joblog is next opened (the next
-- record would be glued to it). A last line that is not a record (the file
-- was not only a joblog) is left, and ended with a newline.
--
-- Caveat: a joblog that cannot seek (a pipe, a terminal) is never read back:
-- it is only appended to.
local ffi = require "ffi"

local M = {}

ffi.cdef [[
int truncate(const char *path, int64_t length);
char *strerror(int errnum);
int fileno(void *stream);
]]

local RECORD_START = '{"line":'

local Joblog = {}
Joblog.__index = Joblog

-- io.open's message without the path it starts with: "No such file or directory".
local function reason(err, path)
  err = tostring(err)
  if err:sub(1, #path + 2) == path .. ": " then return err:sub(#path + 3) end
  return err
end

-- Reads a joblog: the line numbers it records as completed (for --resume),
-- and the length of its whole records.
function M.read(path)
  local done, whole, offset = {}, 0, 0
  local f = io.open(path, "rb")
  if not f then return done, 0 end
  while true do
    local text = f:read("*L") -- the line with its newline, if it has one
    if not text then break end
    offset = offset + #text
    if text:sub(-1) ~= "\n" then break end
    whole = offset
    local line, status = text:match('^{"line":(%d+),"status":"(%a+)"')
    if line and status == "completed" then done[tonumber(line)] = true end
  end
  f:close()
  return done, whole
end

-- --resume: the set of lines joblog `path` records as completed (they are
-- skipped), and the last of them (0 when none).
function M.resumed(path)
  local done = M.read(path)
  local last = 0
  for line in pairs(done) do last = math.max(last, line) end
  return done, last
end

-- What a joblog ends with after its last newline: "" when it ends whole (or
-- cannot be read back: a pipe, a terminal), else that last line's first bytes
-- and the offset where it starts.
local function tail(path, size)
  local f = size and size > 0 and io.open(path, "rb")
  if not f then return "" end
  f:seek("set", size - 1)
  local last = f:read(1)
  f:close()
  if last == "\n" then return "" end
  local _, whole = M.read(path)
  f = assert(io.open(path, "rb"))
  f:seek("set", whole)
  local start = f:read(8) or ""
  f:close()
  return start, whole
end

-- Opens joblog `path` for appending, its last record cut short cut off
-- first: a Joblog, or nil and a message.
function M.open(path)
  local f, err = io.open(path, "a")
  if not f then return nil, ("cannot open joblog '%s': %s"):format(path, reason(err, path)) end
  local start, whole = tail(path, f:seek("end")) -- no size for what cannot seek
  if start ~= "" and RECORD_START:sub(1, #start) == start:sub(1, #RECORD_START) then -- a record's start, maybe cut inside it
    f:close()
    if ffi.C.truncate(path, whole) ~= 0 then
      return nil, ("cannot cut the unfinished last record of joblog '%s': %s"):format(path,
        ffi.string(ffi.C.strerror(ffi.errno())))
    end
    io.stderr:write(("moonjob: joblog '%s' ended in a record cut short (a full disk or a crash); "
      .. "it was dropped, and its line runs again with --resume\n"):format(path))
    f, err = io.open(path, "a")
    if not f then return nil, ("cannot open joblog '%s': %s"):format(path, reason(err, path)) end
  elseif start ~= "" then
    f:write("\n")
  end
  f:setvbuf("no")
  return setmetatable({ path = path, file = f }, Joblog)
end

-- Appends result lines `text` (whole records): true, or nil and the error.
-- (A run records through stdout's writer instead: Joblog:fd.)
function Joblog:record(text)
  return self.file:write(text)
end

-- The joblog's descriptor (stdout's writer appends the records through it).
function Joblog:fd()
  return ffi.C.fileno(self.file)
end

function Joblog:close()
  self.file:close()
end

return M
