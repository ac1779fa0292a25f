-- bench/spin.lua -- a JIT-compiled loop that never returns: only the hard kill ends it.
return function()
  local x = 0
  while true do x = x + 1 end
end
