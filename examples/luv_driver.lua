-- examples/luv_driver.lua -- drives moonjob from a luv event loop (as in
-- Luvit): one poll handle on moonjob.fd(), one timer for moonjob.timeout().
--
--   local stop_driving = dofile("examples/luv_driver.lua")(require "luv")
--
-- moonjob.step() runs when the descriptor is readable and when moonjob's own
-- timers are due (job timeouts, delays, retries: they make no descriptor
-- readable); the timeout is read again after each step. Returns a function
-- that stops driving (then nothing of moonjob's keeps luv's loop running).
-- examples/luv_host.lua is a whole program built on it; spec/embed/embed_spec.lua
-- runs this very file.
local moonjob = require "moonjob"

return function(uv)
  local poll, timer = uv.new_poll(moonjob.fd()), uv.new_timer()
  local function step()
    moonjob.step()
    local ms = moonjob.timeout()
    if ms then timer:start(ms, 0, step) else timer:stop() end
  end
  poll:start("r", step)
  step()
  return function()
    poll:close()
    timer:close()
  end
end
