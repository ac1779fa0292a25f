-- moonjob.redis.setup -- what moonjob.redis.client runs on a new connection
-- before its first call, one command at a time:
--   * AUTH and SELECT, as the URL says (every connection);
--   * then, on the connection that makes calls:
--     - the eviction policy: a server that may evict any key when full
--       (maxmemory-policy allkeys-*) would lose jobs without a word, so it is
--       refused (CONFIG GET, else INFO memory; when the user may run
--       neither, the check is skipped);
--     - the function library (moonjob.redis.library): loaded only when the
--       server's copy differs from ours (FUNCTION LIST ... WITHCODE, compared
--       byte for byte). When
--       loading is denied (NOPERM: an ACL user of one tenant), a copy loaded
--       by an admin is used if it is ours (or, when FUNCTION LIST is denied
--       too, if moonjob_version says our version); anything else is refused
--       with the command an admin runs;
--     - a primary: moonjob_writable is refused with READONLY, MASTERDOWN or
--       LOADING when the server is not a writable primary now.
-- done(nil) once set up, else done(why, kind): kind "state" (the server's
-- state: a replica, loading; try again later), "refused" (a person must act:
-- a password, an ACL, the server's configuration) or "connection".
local library = require "moonjob.redis.library"

local M = {}

-- The server refuses for its state (not a primary now): the reason to tell,
-- the same text whichever call met it (so that it is said once), or nil.
local STATE_REASONS = {
  READONLY = "the server is a read-only replica (READONLY): reconnecting until the URL names a primary"
    .. " again (no Sentinel: point the URL at the new primary, or make this server one)",
  MASTERDOWN = "the server is a replica cut off from its primary (MASTERDOWN): reconnecting until"
    .. " the URL names a primary again",
  LOADING = "the server is loading its data (LOADING): reconnecting until it is ready",
}

function M.state_refusal(err)
  local code = type(err) == "string" and err:match("^(%u+)")
  return code and STATE_REASONS[code]
end

-- "Function not found" (FUNCTION FLUSH, or a restart that lost the library).
function M.function_missing(err)
  return type(err) == "string" and err:find("Function not found", 1, true) ~= nil
end

local function command(conn, args, cb)
  local ok, err = conn:command(args, cb)
  if not ok then cb(nil, err, "connection") end
end

-- A refusal as done() tells it: its kind, with a hint where one helps.
local function refusal(err, kind)
  if kind == "connection" then return err, "connection" end
  local state = M.state_refusal(err)
  if state then return state, "state" end
  if err:find("WRONGPASS") or err:find("NOAUTH") or err:find("invalid password") then
    err = err .. " (check the user and password in the URL)"
  end
  return err, "refused"
end

-- Runs steps (functions of (conn, next)) in order; next(err, kind) stops.
local function chain(conn, steps, done)
  local i = 0
  local function step(err, kind)
    if err then return done(err, kind) end
    i = i + 1
    if i > #steps then return done(nil) end
    steps[i](conn, step)
  end
  step()
end

local function auth_steps(target)
  local steps = {}
  if target.password then
    local args = target.user and { "AUTH", target.user, target.password } or { "AUTH", target.password }
    steps[#steps + 1] = function(conn, next)
      command(conn, args, function(_, err, kind) if err then return next(refusal(err, kind)) end next() end)
    end
  end
  if target.db ~= 0 then
    steps[#steps + 1] = function(conn, next)
      command(conn, { "SELECT", target.db }, function(_, err, kind)
        if err then return next(refusal(err, kind)) end
        next()
      end)
    end
  end
  return steps
end

-- The server's maxmemory-policy, or false when this user may not read it.
local function read_policy(conn, cb)
  command(conn, { "CONFIG", "GET", "maxmemory-policy" }, function(v, err, kind)
    if kind == "connection" then return cb(nil, err) end
    if type(v) == "table" and type(v[2]) == "string" then return cb(v[2]) end
    command(conn, { "INFO", "memory" }, function(info, ierr, ikind)
      if ikind == "connection" then return cb(nil, ierr) end
      cb(type(info) == "string" and info:match("maxmemory_policy:([%w%-]+)") or false)
    end)
  end)
end

local function check_policy(conn, next)
  read_policy(conn, function(policy, err)
    if err then return next(err, "connection") end
    if policy and policy:match("^allkeys%-") then
      return next(("the server's maxmemory-policy is %s: when memory is full it evicts any key, queue keys"
        .. " too, and jobs vanish without a word; moonjob refuses it. Set noeviction (CONFIG SET"
        .. " maxmemory-policy noeviction, and in redis.conf) or give queues a server of their own")
        :format(policy), "refused")
    end
    next()
  end)
end

-- What FUNCTION LIST says of the moonjob library: "same", "different",
-- "missing", or "unknown" (this user may not list functions).
local function loaded_library(conn, cb)
  command(conn, { "FUNCTION", "LIST", "LIBRARYNAME", "moonjob", "WITHCODE" }, function(v, err, kind)
    if err then
      if kind == "connection" or M.state_refusal(err) then return cb(nil, refusal(err, kind)) end
      return cb("unknown")
    end
    local ours = library.text()
    for _, lib in ipairs(type(v) == "table" and v or {}) do
      local fields = {}
      for i = 1, #lib - 1, 2 do fields[lib[i]] = lib[i + 1] end
      if fields.library_name == "moonjob" then
        return cb(fields.library_code == ours and "same" or "different")
      end
    end
    cb("missing")
  end)
end

local ADMIN_HINT = "an admin loads it once: moonjob library | redis-cli -x FUNCTION LOAD REPLACE"
  .. " (docs/REDIS.md, \"A tenant limited to its own queues\")"

-- Loading was denied: the loaded copy will do only if it is ours.
local function denied(conn, found, load_err, next)
  local version = library.version()
  local function refuse(what)
    next(("the moonjob function library in Redis %s and this user may not load it (%s); %s")
      :format(what, load_err:match("^%S+") or load_err, ADMIN_HINT), "refused")
  end
  if found == "missing" then return refuse("is not loaded") end
  if found == "different" then return refuse("is not this moonjob's version " .. tostring(version)) end
  -- FUNCTION LIST was denied too: the version is what can be compared
  command(conn, { "FCALL_RO", "moonjob_version", 0 }, function(v, err, kind)
    if kind == "connection" then return next(err, "connection") end
    if err and M.state_refusal(err) then return next(refusal(err, kind)) end
    if v ~= nil and v == version then return next() end
    refuse(err and "is not loaded" or ("is version " .. tostring(v) .. ", not this moonjob's " .. tostring(version)))
  end)
end

-- The library at our version on the server, loaded only when it is not.
function M.ensure_library(conn, next)
  loaded_library(conn, function(found, err, kind)
    if not found then return next(err, kind) end
    if found == "same" then return next() end
    command(conn, { "FUNCTION", "LOAD", "REPLACE", library.text() }, function(_, lerr, lkind)
      if not lerr then return next() end
      if lkind ~= "connection" and lerr:match("^NOPERM") then return denied(conn, found, lerr, next) end
      next(refusal(library.explain(lerr), lkind)) -- (a line of the text named by its part)
    end)
  end)
end

local function check_primary(conn, next)
  command(conn, { "FCALL", "moonjob_writable", 0 }, function(_, err, kind)
    if err then return next(refusal(err, kind)) end
    next()
  end)
end

-- M.run(conn, target, calls, done): sets a new connection up (calls: the
-- connection that makes calls, not a subscription's).
function M.run(conn, target, calls, done)
  local steps = auth_steps(target)
  if calls then
    steps[#steps + 1] = check_policy
    steps[#steps + 1] = M.ensure_library
    steps[#steps + 1] = check_primary
  end
  chain(conn, steps, done)
end

return M
