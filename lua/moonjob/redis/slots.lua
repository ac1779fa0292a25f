-- moonjob.redis.slots -- where a key lives in a Redis Cluster: its hash slot
-- (CRC16 of the key, or of its hash tag, modulo 16384, as the Redis Cluster
-- specification says) and the key a command is routed by.
--
--   slots.crc16("123456789")          -- 0x31C3 (XMODEM: polynomial 0x1021, start 0)
--   slots.key_slot("mj:{images}:wait") -- the slot of "images"
--   slots.command_key(args)           -- the key args is routed by, or nil: keyless
--
-- A hash tag is the text between the first "{" and the first "}" after it,
-- when that text is not empty; keys with one tag share a slot (moonjob's
-- queue prefixes, moonjob.redis.names.prefix, are built on it). A channel
-- of sharded pub/sub is hashed as a key is.
local bit = require "bit"

local M = {}

M.COUNT = 16384

local band, bxor, lshift, rshift = bit.band, bit.bxor, bit.lshift, bit.rshift

-- The table of the polynomial 0x1021's remainders, one per byte value.
local TABLE = {}
for byte = 0, 255 do
  local crc = lshift(byte, 8)
  for _ = 1, 8 do
    if band(crc, 0x8000) ~= 0 then crc = bxor(lshift(crc, 1), 0x1021) else crc = lshift(crc, 1) end
    crc = band(crc, 0xFFFF)
  end
  TABLE[byte] = crc
end

-- slots.crc16(text) -> 0 .. 0xFFFF (CRC-16/XMODEM).
function M.crc16(text)
  local crc = 0
  for i = 1, #text do
    crc = band(bxor(lshift(crc, 8), TABLE[bxor(rshift(crc, 8), text:byte(i))]), 0xFFFF)
  end
  return crc
end

-- The part of key that is hashed: its hash tag, or the whole key.
function M.hashed(key)
  local open = key:find("{", 1, true)
  if open then
    local close = key:find("}", open + 1, true)
    if close and close > open + 1 then return key:sub(open + 1, close - 1) end
  end
  return key
end

-- slots.key_slot(key) -> 0 .. 16383.
function M.key_slot(key)
  return M.crc16(M.hashed(tostring(key))) % M.COUNT
end

-- Commands that name no key: sent to a node the caller names (or any).
local KEYLESS = {}
for word in ([[PING INFO CLUSTER FUNCTION SCAN CONFIG DBSIZE ECHO TIME FLUSHALL FLUSHDB AUTH HELLO SELECT
  CLIENT COMMAND MULTI EXEC DISCARD UNWATCH ASKING READONLY READWRITE ROLE LASTSAVE SAVE BGSAVE
  BGREWRITEAOF SLOWLOG LATENCY DEBUG SCRIPT ACL PUBLISH PUBSUB WAIT SHUTDOWN RANDOMKEY KEYS SWAPDB
  MONITOR QUIT RESET LOLWUT MODULE FAILOVER REPLICAOF SLAVEOF SYNC PSYNC]]):gmatch("%S+") do
  KEYLESS[word] = true
end

-- Scripts: FCALL NAME NUMKEYS KEY... ARG...; routed by the first key.
local SCRIPTS = { FCALL = true, FCALL_RO = true, EVAL = true, EVALSHA = true, EVAL_RO = true, EVALSHA_RO = true }

-- Commands whose key is their third word (a subcommand first).
local SECOND = { OBJECT = true, MEMORY = true, XINFO = true }

-- Whether args runs a script (a function or EVAL): its keys beyond the
-- declared ones are not known to the cluster.
function M.is_script(args)
  return SCRIPTS[tostring(args[1]):upper()] == true
end

-- slots.command_key(args) -> the key args is routed by, or nil when it
-- names none (a keyless command, FCALL with no keys).
function M.command_key(args)
  local name = tostring(args[1]):upper()
  if KEYLESS[name] then return nil end
  if SCRIPTS[name] then
    local n = tonumber(args[3])
    if n and n > 0 then return args[4] end
    return nil
  end
  if SECOND[name] then return args[3] end
  return args[2]
end

-- slots.command_slot(args) -> the slot args is routed by, or nil (keyless).
function M.command_slot(args)
  local key = M.command_key(args)
  return key ~= nil and M.key_slot(key) or nil
end

-- The keys an FCALL declares (args[4 .. 3 + NUMKEYS]), or {}.
function M.script_keys(args)
  local keys, n = {}, SCRIPTS[tostring(args[1]):upper()] and tonumber(args[3]) or 0
  for i = 1, n do keys[i] = args[3 + i] end
  return keys
end

return M
