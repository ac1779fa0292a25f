-- moonjob.redis.setup -- what moonjob.redis.client runs on a new connection
-- before its first call, its commands in order:
--   * AUTH and SELECT, as the URL says (every connection);
--   * then, on the connection that makes calls:
--     - the eviction policy: a server that may evict any key when full
--       (maxmemory-policy allkeys-*) would lose jobs without a word, so it is
--       refused (CONFIG GET, else INFO memory; when the user may run
--       neither, the check is skipped); in the same round trip, whether
--       it is a node of a Redis Cluster, refused for a plain URL (a queue
--       on another shard would answer MOVED: redis+cluster:// follows it);
--     - the function library (moonjob.redis.library), the server's for every
--       program of every moonjob version: ours is loaded when none is, or
--       when the loaded one is older (its moonjob_version) or ours in another
--       text (FUNCTION LIST ... WITHCODE, compared byte for byte). A newer one
--       is never replaced: it is used when it still serves this version's
--       calls (`moonjob_version 0 oldest`), else the program is refused and
--       told to upgrade. Reading and loading are guarded (LIBRARY_GUARD) so
--       that two programs connecting at once do not undo each other's load.
--       When loading is denied (NOPERM: an ACL user of one tenant), a copy
--       loaded by an admin is used if it is ours (or, when FUNCTION LIST is
--       denied too, if moonjob_version says our version) or a newer one that
--       serves ours; anything else is refused with the command an admin runs;
--     - a primary: moonjob_writable is refused with READONLY, MASTERDOWN or
--       LOADING when the server is not a writable primary now (NOREPLICAS
--       passes behind Sentinel, where ROLE said master).
-- done(nil) once set up, else done(why, kind): kind "state" (the server's
-- state: a replica, loading; try again later), "refused" (a person must act:
-- a password, an ACL, the server's configuration) or "connection".
local library = require "moonjob.redis.library"

local M = {}

-- The server refuses for its state (not a primary now): the reason to tell,
-- the same text whichever call met it (so that it is said once), or nil.
local STATE_REASONS = {
  READONLY = "the server is a read-only replica (READONLY): reconnecting until the URL names a primary"
    .. " again (point the URL at the new primary, make this server one, or name the sentinels:"
    .. " redis+sentinel://)",
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

-- The server's maxmemory-policy (false when this user may not read it) and
-- whether it is a node of a Redis Cluster, in the same round trip: cb(policy,
-- nil, cluster) or cb(nil, err) for a lost connection.
local function read_policy(conn, cb)
  command(conn, { "CONFIG", "GET", "maxmemory-policy", "cluster-enabled" }, function(v, err, kind)
    if kind == "connection" then return cb(nil, err) end
    if type(v) == "table" then
      local got = {}
      for i = 1, #v - 1, 2 do got[v[i]] = v[i + 1] end
      local policy = got["maxmemory-policy"]
      if type(policy) == "string" then return cb(policy, nil, got["cluster-enabled"] == "yes") end
    end
    command(conn, { "INFO", "memory", "cluster" }, function(info, ierr, ikind)
      if ikind == "connection" then return cb(nil, ierr) end
      info = type(info) == "string" and info or ""
      cb(info:match("maxmemory_policy:([%w%-]+)") or false, nil, info:find("cluster_enabled:1", 1, true) ~= nil)
    end)
  end)
end

-- A node of a Redis Cluster named by a plain URL: its first call on a key of
-- another shard would answer MOVED, which this client does not follow.
local function cluster_refusal(target)
  local host = target.host and (target.host:find(":", 1, true) and "[" .. target.host .. "]" or target.host)
  local address = host and (host .. ":" .. tostring(target.port)) or "the server"
  return ("%s is a Redis Cluster node: use %s://%s/ (a queue lives on its slot's shard)")
    :format(address, target.tls and "rediss+cluster" or "redis+cluster", host and address or "HOST:PORT")
end

-- target.cluster_node: a node's connection made by moonjob.redis.cluster's
-- client (a node of a cluster, as it should be).
local function check_policy(conn, next, target)
  read_policy(conn, function(policy, err, cluster)
    if err then return next(err, "connection") end
    if policy and policy:match("^allkeys%-") then
      return next(("the server's maxmemory-policy is %s: when memory is full it evicts any key, queue keys"
        .. " too, and jobs vanish without a word; moonjob refuses it. Set noeviction (CONFIG SET"
        .. " maxmemory-policy noeviction, and in redis.conf) or give queues a server of their own")
        :format(policy), "refused")
    end
    if cluster and not target.cluster_node then return next(cluster_refusal(target), "refused") end
    next()
  end)
end

-- The library is the server's, shared by every program of every moonjob
-- version that connects. LIBRARY_GUARD: the key (in database 0 whatever the
-- URL's database) that every moonjob from version 7 on WATCHes before it
-- reads what is loaded, and increments in the transaction that loads its
-- own: a load by another program in between aborts that transaction, and
-- the program reads again (docs/REDIS.md, "Versions on one server").
M.LIBRARY_GUARD = "mj:library"
local LOAD_TRIES = 5

-- The whole number a version text begins with ("7", "7-dev"), or nil.
local function version_number(v)
  return type(v) == "string" and tonumber(v:match("^%d+")) or nil
end

-- Sends each of list's commands in order; cb(got) once all answered, got[i]
-- = { value, err, kind } of list[i].
local function pipeline(conn, list, cb)
  local got, left = {}, #list
  local function answer(i, v, err, kind)
    got[i] = { v, err, kind }
    left = left - 1
    if left == 0 then cb(got) end
  end
  for i, args in ipairs(list) do
    local ok, err = conn:command(args, function(v, e, k) answer(i, v, e, k) end)
    if not ok then answer(i, nil, err, "connection") end
  end
end

-- The first answer of got that ends the set-up (the connection lost, the
-- server not a primary now), as refusal() tells it, or nil.
local function fatal(got)
  for _, r in ipairs(got) do
    if r[3] == "connection" or (r[2] and M.state_refusal(r[2])) then return refusal(r[2], r[3]) end
  end
end

-- WATCHes the guard: cb(true), cb(false) when this user may not (an ACL
-- without WATCH, SELECT or the key: its loads are not guarded), or cb(nil,
-- err, kind).
local function watch_guard(conn, db, cb)
  local list = db == 0 and { { "WATCH", M.LIBRARY_GUARD } }
    or { { "SELECT", 0 }, { "WATCH", M.LIBRARY_GUARD }, { "SELECT", db } }
  pipeline(conn, list, function(got)
    local err, kind = fatal(got)
    if err then return cb(nil, err, kind) end
    for _, r in ipairs(got) do
      if r[2] then
        if db ~= 0 and got[3][2] then return cb(nil, refusal(got[3][2], got[3][3])) end -- (not back in db)
        command(conn, { "UNWATCH" }, function() end)
        return cb(false)
      end
    end
    cb(true)
  end)
end

-- Reads the loaded library's version (FCALL_RO moonjob_version 0) into
-- found, and when it is newer than ours the oldest version it serves; cb(found)
-- or cb(nil, err, kind).
local function read_version(conn, found, cb)
  command(conn, { "FCALL_RO", "moonjob_version", 0 }, function(v, err, kind)
    if err then
      if kind ~= "connection" and M.function_missing(err) then return cb(found) end -- no such function
      return cb(nil, refusal(err, kind))
    end
    found.exists, found.version = true, v
    if (version_number(v) or 0) <= version_number(library.version()) then return cb(found) end
    command(conn, { "FCALL_RO", "moonjob_version", 0, "oldest" }, function(o, oerr, okind)
      if oerr then return cb(nil, refusal(oerr, okind)) end
      found.oldest = o
      cb(found)
    end)
  end)
end

-- What the server holds: cb(found) with found.exists, .same (our text, byte
-- for byte), .listed (this user may list functions), .version, .oldest; or
-- cb(nil, err, kind).
local function loaded_library(conn, cb)
  command(conn, { "FUNCTION", "LIST", "LIBRARYNAME", "moonjob", "WITHCODE" }, function(v, err, kind)
    local found = { exists = false, listed = not err }
    if err then
      if kind == "connection" or M.state_refusal(err) then return cb(nil, refusal(err, kind)) end
      return read_version(conn, found, cb) -- this user may not list functions
    end
    for _, lib in ipairs(type(v) == "table" and v or {}) do
      local fields = {}
      for i = 1, #lib - 1, 2 do fields[lib[i]] = lib[i + 1] end
      if fields.library_name == "moonjob" then
        found.exists, found.same = true, fields.library_code == library.text()
      end
    end
    if not found.exists or found.same then return cb(found) end
    read_version(conn, found, cb)
  end)
end

-- What to do with what the server holds: "use" it, "load" ours (none is
-- loaded), "replace" it with ours (an older version, or ours in another
-- text), or "refuse" (a newer version that no longer serves ours).
local function decide(found)
  if found.same then return "use" end
  if not found.exists then return "load" end
  local theirs, ours = version_number(found.version), version_number(library.version())
  if theirs and theirs > ours then
    return (version_number(found.oldest) or math.huge) <= ours and "use" or "refuse"
  end
  -- (FUNCTION LIST denied: the version is what can be compared)
  if not found.listed and found.version == library.version() then return "use" end
  return "replace"
end

local function newer_refusal(found)
  return ("the Redis server has moonjob library version %s, newer than this moonjob's %s, and it no longer"
    .. " serves this version's calls (it serves moonjob %s and later): upgrade moonjob on this host. A newer"
    .. " library is never replaced by an older one (docs/REDIS.md, \"Versions on one server\")")
    :format(found.version, library.version(), tostring(found.oldest or found.version)), "refused"
end

local ADMIN_HINT = "an admin loads it once: moonjob library | redis-cli -x FUNCTION LOAD REPLACE"
  .. " (docs/REDIS.md, \"A tenant limited to its own queues\")"

-- Loading was denied (NOPERM: a tenant's ACL) and the loaded library, if
-- any, will not do: the refusal, with what an admin runs.
local function denied(found, load_err)
  local what, ours = "is not loaded", library.version()
  if found.version == ours then
    what = ("is version %s in another text than this moonjob's"):format(ours)
  elseif found.exists then
    what = ("is version %s, not this moonjob's %s"):format(tostring(found.version or "unknown"), ours)
  end
  return ("the moonjob function library in Redis %s and this user may not load it (%s); %s")
    :format(what, load_err:match("^%S+") or load_err, ADMIN_HINT), "refused"
end

-- Whether a guarded load's own bookkeeping (the guard's INCR, a SELECT
-- around it) was refused as it was queued (an ACL that may read the guard
-- but not write it): the transaction was discarded (EXECABORT, the WATCH
-- with it) and the load goes again without the guard.
local function guard_refused(got)
  for i = 3, #got - 1 do
    local err = got[i][2]
    if err and got[i][3] ~= "connection" and not M.state_refusal(err) then return true end
  end
  return false
end

-- Loads ours: FUNCTION LOAD when none is loaded (it fails if another program
-- loaded one meanwhile), REPLACE otherwise; guarded, in a transaction that
-- increments the guard (aborted if another program loaded meanwhile).
-- cb(nil) loaded, cb(err, kind), or cb(nil, nil, true): read again.
local load
function load(conn, db, found, guarded, cb)
  local args = found.exists and { "FUNCTION", "LOAD", "REPLACE", library.text() }
    or { "FUNCTION", "LOAD", library.text() }
  local list = { args }
  if guarded then
    list = { { "MULTI" }, args }
    if db ~= 0 then list[#list + 1] = { "SELECT", 0 } end
    list[#list + 1] = { "INCR", M.LIBRARY_GUARD }
    if db ~= 0 then list[#list + 1] = { "SELECT", db } end
    list[#list + 1] = { "EXEC" }
  end
  pipeline(conn, list, function(got)
    local loaded = got[guarded and 2 or 1]
    if guarded and guard_refused(got) then return load(conn, db, found, false, cb) end
    local err, kind = fatal(got)
    if not err then err, kind = loaded[2], loaded[3] end -- (refused as it was queued: NOPERM)
    if not err and guarded and not got[1][2] then
      local exec = got[#got]
      if exec[2] then err, kind = exec[2], exec[3]
      elseif exec[1] == nil then return cb(nil, nil, true) -- aborted: another program loaded meanwhile
      elseif type(exec[1][1]) == "table" then err, kind = exec[1][1].err, "reply" end
    end
    if err and kind ~= "connection" and err:find("already exists", 1, true) then return cb(nil, nil, true) end
    cb(err, kind)
  end)
end

-- The library on the server: ours loaded when none is, or an older one; a
-- newer one kept (used when it serves this version, else refused). Reads
-- again (up to LOAD_TRIES times) when another program loaded meanwhile.
local function settle_library(conn, db, next, tries)
  watch_guard(conn, db, function(guarded, werr, wkind)
    if guarded == nil then return next(werr, wkind) end
    loaded_library(conn, function(found, err, kind)
      if not found then -- (a lost connection may be closed already: nothing to unwatch)
        if guarded and kind ~= "connection" then command(conn, { "UNWATCH" }, function() end) end
        return next(err, kind)
      end
      local what = decide(found)
      if what == "use" or what == "refuse" then
        if guarded then command(conn, { "UNWATCH" }, function() end) end
        if what == "use" then return next() end
        return next(newer_refusal(found))
      end
      load(conn, db, found, guarded, function(lerr, lkind, again)
        if again and tries < LOAD_TRIES then return settle_library(conn, db, next, tries + 1) end
        if again then return next("the moonjob library kept changing while this program loaded it", "state") end
        if not lerr then return next() end
        if lkind ~= "connection" and lerr:match("^NOPERM") then return next(denied(found, lerr)) end
        next(refusal(library.explain(lerr), lkind)) -- (a line of the text named by its part)
      end)
    end)
  end)
end

-- ensure_library(conn, target, next): the library on the server, as
-- settle_library says; next(nil) or next(why, kind).
function M.ensure_library(conn, target, next)
  settle_library(conn, target.db, next, 1)
end

-- sentinels: a sentinel-guided connection, whose ROLE said master: there a
-- NOREPLICAS (too few replicas in touch for min-replicas-to-write, for
-- now) is a primary's answer, and the connection is used (its writes are
-- refused meanwhile: moonjob.redis.sentinel).
local function check_primary(conn, next, sentinels)
  command(conn, { "FCALL", "moonjob_writable", 0 }, function(_, err, kind)
    if err and sentinels and kind == "reply" and err:match("^NOREPLICAS") then return next() end
    if err then return next(refusal(err, kind)) end
    next()
  end)
end

-- M.run(conn, target, calls, done): sets a new connection up (calls: the
-- connection that makes calls, not a subscription's).
function M.run(conn, target, calls, done)
  local steps = auth_steps(target)
  if target.sentinels then -- a primary the sentinels named: ROLE checked too
    steps, done = require("moonjob.redis.sentinel").set_up(steps, done)
  end
  if calls then
    steps[#steps + 1] = function(c, next) check_policy(c, next, target) end
    steps[#steps + 1] = function(c, next) M.ensure_library(c, target, next) end
    steps[#steps + 1] = function(c, next) check_primary(c, next, target.sentinels) end
  end
  chain(conn, steps, done)
end

return M
