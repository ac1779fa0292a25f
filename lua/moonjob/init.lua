-- moonjob -- run Lua processor files in a pool of sandboxed LuaJIT children.
--
--   local moonjob = require "moonjob"
--   local pool = assert(moonjob.pool("examples/square.lua", { size = 2 }))
--   print(pool:run({ x = 7 }))   --> 49
--
-- This module is the public entry point; the pieces live in moonjob.pool
-- (policy; its concerns in moonjob.pool.*), moonjob.worker (one child),
-- moonjob.job, moonjob.errors and moonjob.core (the C mechanism: loop,
-- processes, frames).
local Pool = require "moonjob.pool"
local Router = require "moonjob.router"
local errors = require "moonjob.errors"

local M = {
  _VERSION = "moonjob scm",
  errors = errors,
}

-- moonjob.pool(processor_file [, opts]) -> pool | nil, err
-- moonjob.pool({ name = processor_file, ... } [, opts]) -> router | nil, err:
-- one pool per name; add(data, { name = ... }) routes.
function M.pool(processor, opts)
  if type(processor) == "table" then return Router.new(processor, opts) end
  return Pool.new(processor, opts)
end

-- moonjob.queue(redis_url, name [, opts]) -> queue | nil, err: add jobs to a
-- durable queue on Redis that worker pools on any host run (moonjob.redis.queue).
function M.queue(url, name, opts)
  return require("moonjob.redis.queue").new(url, name, opts)
end

return M
