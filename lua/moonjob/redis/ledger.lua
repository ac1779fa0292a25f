-- moonjob.redis.ledger -- a producer's adds, each named, so that one whose
-- reply was lost is sent again and answered once: q:add and `moonjob add`
-- send their moonjob_add calls through send() below.
--
-- Each call of a queue object carries a name (moonjob_add's SHEET and CALL:
-- the object's random name with a sheet number, and the call's number in
-- it), and Redis remembers the reply it gave each named call.
-- A call whose reply was lost after it was sent (Redis stalled past the
-- connection's reply deadline, the link dropped) may or may not have run:
-- it is sent again, under its name, once a connection is back, until a reply
-- comes or `resolve` ms from its first send passed. Redis answers it from
-- what it remembered if the first send ran, and adds the job if it did not;
-- should the first send run after that (it still sat in the closed
-- connection's socket, at either end: Redis runs what a client sent before
-- it hung up), it finds the reply and adds nothing. Redis runs one call at a
-- time, so the two never run together. Past `resolve` the call is
-- "unknown", as a lost reply was before names existed.
--
-- Memory: a sheet is one hash in Redis of at most SHEET_CALLS calls, made
-- within SHEET_MS; Redis keeps it names.ADDED_KEEP_MS (10 minutes) from its
-- first call, so each call's reply stays at least 9 minutes, against a
-- resolve of at most 5. Once every call of a closed sheet got its reply at
-- its first send, no copy of them can reach Redis any more: a later call asks
-- Redis to delete it (FORGET). A sheet with a lost reply is left to expire,
-- as are a closed producer's last sheets.
local core = require "moonjob.core"
local loop = require "moonjob.loop"

local M = {}
local Ledger = {}
Ledger.__index = Ledger

local SHEET_CALLS = 127 -- with Redis's marker field, 128: a hash Redis keeps as one compact listpack
local SHEET_MS = 60000 -- a sheet takes calls for a minute at most
local TRANSIENT_RETRY_MS = 500 -- a lost call refused for now (OOM, BUSY) is sent again after this

-- A ledger for a queue object; producer: its random name.
function M.new(producer)
  return setmetatable({ producer = producer, sheet = 0, count = 0, opened = 0, open = {}, lost = {}, forget = {} }, Ledger)
end

-- Sheet b is done with once it is closed and every call of it settled.
function Ledger:_done(b)
  if (self.open[b] or 0) > 0 or b == self.sheet then return end
  if not self.lost[b] then self.forget[#self.forget + 1] = self.producer .. "." .. b end
  self.open[b], self.lost[b] = nil, nil
end

-- Writes the name of a new call (SHEET, CALL, FORGET) into args at `at`
-- (moonjob_add_bulk's: 5), or appends it to moonjob_add's arguments, which
-- must end at GROUP. -> the call's sheet.
function Ledger:stamp(args, at)
  local now = loop.now()
  if self.count >= SHEET_CALLS or (self.count > 0 and now - self.opened >= SHEET_MS) then
    self.sheet, self.count = self.sheet + 1, 0
    self:_done(self.sheet - 1)
  end
  if self.count == 0 then self.opened = now end
  self.count = self.count + 1
  local b = self.sheet
  self.open[b] = (self.open[b] or 0) + 1
  at = at or #args + 1
  args[at] = self.producer .. "." .. b
  args[at + 1] = tostring(self.count)
  args[at + 2] = table.remove(self.forget, 1) or ""
  return b
end

-- A call of sheet b got its answer (or is given up); lost: a reply of it was lost.
function Ledger:settled(b, lost)
  if lost then self.lost[b] = true end
  self.open[b] = self.open[b] - 1
  self:_done(b)
end

local function later(ms, fn)
  local t
  t = core.timer(function() t:close(); fn() end)
  t:start(ms)
end

-- send(c, ledger, args, resolve_ms, cb): moonjob_add's args (ending at
-- GROUP), or moonjob_add_bulk's, sent on client c under a new name; cb(reply) or cb(nil, err, kind,
-- unknown), as client:call's, with unknown true when the call was sent but
-- no reply came within resolve_ms of its first send (it may have run).
function M.send(c, ledger, args, resolve_ms, cb)
  local b = ledger:stamp(args, args[2] == "moonjob_add_bulk" and 5 or nil)
  local deadline, lost = loop.now() + resolve_ms, false
  local function try()
    c:call(args, function(reply, err, kind, sent)
      if kind == "connection" and sent then lost = true end
      local again = lost and not c.closed and loop.now() < deadline
      -- (a lost call refused for now may have run: only its name can tell)
      if again and kind == "connection" then return try() end
      if again and kind == "transient" then return later(TRANSIENT_RETRY_MS, try) end
      ledger:settled(b, lost)
      cb(reply, err, kind, lost and kind ~= "reply" and reply == nil or nil)
    end)
  end
  try()
end

return M
