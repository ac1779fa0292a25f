-- examples/luv_host.lua -- moonjob driven by a luv event loop (as in Luvit).
--
--   LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="build/?.so;;" luajit examples/luv_host.lua
--
-- luv (Debian: lua-luv) runs the program; moonjob's own loop never blocks
-- it. The host watches moonjob.fd() for reading and calls moonjob.step() when
-- it is readable and when moonjob.timeout() milliseconds have passed (its
-- timers: job timeouts, delays, retries), re-reading the timeout after each
-- step (examples/luv_driver.lua). A luv timer prints a tick every 100 ms
-- meanwhile.
local uv = require "luv"
local moonjob = require "moonjob"

local stop_driving = dofile("examples/luv_driver.lua")(uv) -- (run from the checkout's root)
local pool = assert(moonjob.pool("examples/square.lua", { size = 2, echo = false }))

local ticks = uv.new_timer()
ticks:start(100, 100, function() print("tick") end)

local left, x_of = 10, {}
pool:on("completed", function(job, result)
  print(("job %d: %d squared is %d (%.1f ms)"):format(job.id, x_of[job], result, job.ms))
  left = left - 1
  if left == 0 then
    -- not inside a moonjob callback: close() waits there, and cannot run
    -- moonjob's loop from inside it; a zero timer runs it from luv instead
    local later = uv.new_timer()
    later:start(0, 0, function()
      later:close()
      ticks:close()
      pool:close()     -- a blocking call: it runs moonjob's loop, luv waits meanwhile
      stop_driving()   -- nothing left on luv's loop: uv.run() returns
    end)
  end
end)

for x = 1, 10 do
  x_of[pool:add({ x = x }, { delay = x * 0.05 })] = x -- delays: moonjob's timers, through timeout()
end

uv.run()
print("done")
