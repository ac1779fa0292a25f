-- bench/datasets/gen.lua -- writes the two datasets of bench/datasets.lua,
-- deterministically (the same bytes on every run and machine):
--   records.ndjson  RECORDS lines of about 485 bytes: a 19-digit integer id,
--                   a user, an ISO timestamp and about 400 bytes of words
--   tiny.ndjson     TINY lines {"i":N,"s":"abc","f":0.5}
--   events.ndjson   EVENTS web-log events of about 350 bytes: ip, time,
--                   method, path with a query, status, bytes, referrer,
--                   user agent, request id, host, languages, ms
-- Usage: luajit bench/datasets/gen.lua DIR [RECORDS] [TINY] [EVENTS]
--
-- The pseudo-random numbers are a 32-bit xorshift of its own rather than
-- math.random, whose sequence differs between LuaJIT builds.
local bit = require "bit"

local dir = assert(arg[1], "usage: gen.lua DIR [RECORDS] [TINY] [EVENTS]")
local records, tiny = tonumber(arg[2]) or 100000, tonumber(arg[3]) or 200000
local events = tonumber(arg[4]) or 100000

local state = 2463534242
local function random(lo, hi) -- an integer in [lo, hi]
  state = bit.bxor(state, bit.lshift(state, 13))
  state = bit.bxor(state, bit.rshift(state, 17))
  state = bit.bxor(state, bit.lshift(state, 5))
  local u = state % 4294967296 -- (bit ops give a signed 32-bit number)
  return lo + u % (hi - lo + 1)
end

local WORDS = {}
for w in ([[lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor
  incididunt ut labore et dolore magna aliqua enim ad minim veniam quis nostrud exercitation
  ullamco laboris nisi aliquip ex ea commodo consequat]]):gmatch("%S+") do
  WORDS[#WORDS + 1] = w
end

local function text()
  local t, len = {}, 0
  while len < 400 do
    local w = WORDS[random(1, #WORDS)]
    t[#t + 1], len = w, len + #w + 1
  end
  return table.concat(t, " ")
end

local out = assert(io.open(dir .. "/records.ndjson", "w"))
for i = 1, records do
  out:write(('{"id":%d%09d,"user":"user%d","ts":"2026-%02d-%02dT%02d:%02d:%02dZ","text":"%s"}\n'):format(
    1700000000 + i, random(0, 999999999), random(1, 5000), random(1, 12), random(1, 28),
    random(0, 23), random(0, 59), random(0, 59), text()))
end
out:close()

out = assert(io.open(dir .. "/tiny.ndjson", "w"))
for i = 1, tiny do out:write(('{"i":%d,"s":"abc","f":0.5}\n'):format(i)) end
out:close()

-- The events: what a web server's access log holds, one JSON object a line.
local METHODS = { "GET", "GET", "GET", "GET", "POST", "POST", "PUT", "DELETE", "HEAD" }
local SECTIONS = { "api", "static", "shop", "blog", "account", "search" }
local PAGES = { "index", "items", "item", "cart", "checkout", "login", "profile", "feed", "image.png",
  "app.js", "style.css" }
local STATUSES = { 200, 200, 200, 200, 200, 201, 204, 301, 304, 400, 403, 404, 404, 500, 503 }
local REFERRERS = { "-", "https://www.example.com/", "https://search.example.org/?q=lorem+ipsum",
  "https://news.example.net/story/12345", "https://shop.example.com/cart" }
local AGENTS = {
  "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0.0.0 Safari/537.36",
  "Mozilla/5.0 (Windows NT 10.0; Win64; x64; rv:121.0) Gecko/20100101 Firefox/121.0",
  "Mozilla/5.0 (iPhone; CPU iPhone OS 17_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Mobile/15E148",
  "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)",
  "curl/8.4.0",
  "python-requests/2.31.0",
}
local HOSTS = { "www.example.com", "shop.example.com", "api.example.com", "static.example-cdn.net" }
local LANGS = { "en-US,en;q=0.9", "de-DE,de;q=0.9,en;q=0.8", "fr-FR,fr;q=0.9,en-US;q=0.8,en;q=0.7", "*" }

out = assert(io.open(dir .. "/events.ndjson", "w"))
for _ = 1, events do
  local path = ("/%s/%s/%d"):format(SECTIONS[random(1, #SECTIONS)], PAGES[random(1, #PAGES)], random(1, 99999))
  if random(0, 2) == 0 then path = path .. ("?page=%d&sort=%s"):format(random(1, 50), WORDS[random(1, #WORDS)]) end
  out:write(('{"ip":"%d.%d.%d.%d","time":"2026-%02d-%02dT%02d:%02d:%02d.%03dZ","method":"%s","path":"%s",'
    .. '"status":%d,"bytes":%d,"referrer":"%s","agent":"%s","request_id":"%08x%08x","host":"%s","lang":"%s","ms":%d.%d}\n'):format(
    random(1, 223), random(0, 255), random(0, 255), random(1, 254),
    random(1, 12), random(1, 28), random(0, 23), random(0, 59), random(0, 59), random(0, 999),
    METHODS[random(1, #METHODS)], path, STATUSES[random(1, #STATUSES)], random(0, 250000),
    REFERRERS[random(1, #REFERRERS)], AGENTS[random(1, #AGENTS)], random(0, 2^31), random(0, 2^31),
    HOSTS[random(1, #HOSTS)], LANGS[random(1, #LANGS)], random(0, 2000), random(0, 9)))
end
out:close()
