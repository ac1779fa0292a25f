-- bench/big.lua -- large payloads: given a number n, returns an n-byte string
-- (made once per child, varied bytes); given a string, returns its length. So
-- the bench moves big frames both ways.
local made = {}
local function varied(n)
  local block = {}
  for i = 1, 65521 do block[i] = string.char(32 + (i * 7919) % 95) end -- a prime-length block
  block = table.concat(block)
  return string.rep(block, math.ceil(n / #block)):sub(1, n)
end
return function(job)
  local d = job.data
  if type(d) == "number" then
    made[d] = made[d] or varied(d)
    return made[d]
  end
  return #d
end
