-- moonjob -- run Lua processor files in a pool of sandboxed LuaJIT children.
--
--   local moonjob = require "moonjob"
--   local pool = assert(moonjob.pool("examples/square.lua", { size = 2 }))
--   print(pool:run({ x = 7 }))   --> 49
--
-- This module is the public entry point; the pieces live in moonjob.pool
-- (policy; its concerns in moonjob.pool.*, moonjob.pool.child the parent's
-- side of one child), moonjob.job, moonjob.errors, moonjob.loop and moonjob.core
-- (the C mechanism: loop, processes, frames). moonjob.child.* runs inside
-- the child program only, moonjob.codec.* on both sides of the channel;
-- moonjob.cli is the `moonjob` command and moonjob.redis.* the Redis queue.
local Pool = require "moonjob.pool"
local Router = require "moonjob.router"
local errors = require "moonjob.errors"
local loop = require "moonjob.loop"

local M = {
  _VERSION = "moonjob scm",
  errors = errors, -- errors.new(code, message [, fields]): errors that print as "CODE: message"
}

-- moonjob.pool(processor_file [, opts]) -> pool | nil, err
-- moonjob.pool({ name = processor_file, ... } [, opts]) -> router | nil, err:
-- one pool per name; add(data, { name = ... }) routes.
function M.pool(processor, opts)
  if type(processor) == "table" then return Router.new(processor, opts) end
  return Pool.new(processor, opts)
end

-- moonjob.queue(redis_url, name [, opts]) -> queue | nil, err: add jobs to a
-- durable queue on Redis that worker pools on any host run (moonjob.redis.producer).
function M.queue(url, name, opts)
  return require("moonjob.redis.producer").new(url, name, opts)
end

-- moonjob.queues(redis_url [, opts]) -> { { name, waiting, ..., paused }, ... } | nil, err:
-- the queues on a server, with their counts (moonjob.redis.producer).
function M.queues(url, opts)
  return require("moonjob.redis.producer").queues(url, opts)
end

-- moonjob.metrics() -> every open pool's metrics, and the process's, in
-- Prometheus' text format, each metric once (moonjob.pool.metrics).
M.metrics = require("moonjob.pool.metrics").all_text

-- Inside another event loop (luv, cqueues, ...): watch moonjob.fd() for
-- reading; call moonjob.step() when it is readable and when
-- moonjob.timeout() milliseconds have passed (nil: no timer), then read
-- moonjob.timeout() again. step() never waits; it returns false once moonjob
-- has nothing left to watch. See moonjob.loop.
M.fd, M.step, M.timeout = loop.fd, loop.step, loop.timeout

-- moonjob.now() -> milliseconds on moonjob's monotonic clock (an arbitrary
-- origin), the clock of job.started.
M.now = loop.now

return M
