-- spec/support/counting.lua -- small measures the failure specs share.
--
--   counting.lines_in(path)     -> how many lines a file has (0 when missing):
--                                 processors append one per load or run
--   counting.seconds_since(t0)  -> seconds since core.hrtime() was t0
--   counting.most_in_window(times, width) -> the most of times (ms) within
--                                 any closed window of width ms, and where
--                                 that window starts (times sorted in place)
--   counting.most_at_once(spans) -> the most spans ({ start, finish }) that
--                                 run at one time
local core = require "moonjob.core"

local M = {}

function M.lines_in(path)
  local f = io.open(path)
  if not f then return 0 end
  local n = 0
  for _ in f:lines() do n = n + 1 end
  f:close()
  return n
end

function M.seconds_since(t0)
  return (core.hrtime() - t0) / 1e9
end

function M.most_in_window(times, width)
  table.sort(times)
  local most, at, j = 0, nil, 1
  for i = 1, #times do
    while times[i] - times[j] > width do j = j + 1 end
    if i - j + 1 > most then most, at = i - j + 1, times[j] end
  end
  return most, at
end

function M.most_at_once(spans)
  local most = 0
  for _, a in ipairs(spans) do
    local n = 0
    for _, b in ipairs(spans) do if b.start <= a.start and b.finish > a.start then n = n + 1 end end
    most = math.max(most, n)
  end
  return most
end

return M
