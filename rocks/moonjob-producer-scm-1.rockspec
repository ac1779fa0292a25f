rockspec_format = "3.0"
package = "moonjob-producer"
version = "scm-1"
-- The pure-Lua producer alone (moonjob.producer): no C, no FFI, for
-- OpenResty and Lua 5.1 to 5.4, installed with `luarocks make
-- rocks/moonjob-producer-scm-1.rockspec` from the checkout's top (docs/guide/producer.md;
-- in its own folder: `luarocks make` with no argument, the whole rock,
-- must find one rockspec at the top).
-- Only its modules and the Redis library's parts it loads into Redis; the
-- whole moonjob rock (moonjob-scm-1.rockspec) holds them too, so a tree
-- needs one of the two. The install spec (spec/install_spec.lua) checks that
-- this list is whole: moonjob.producer loads from a tree of it alone.
source = {
  url = "git+file://.",
}
description = {
  summary = "Add jobs to moonjob's Redis queues from OpenResty or plain Lua",
  detailed = [[
moonjob.producer wraps the Redis client an application already has
(nginx.redis / resty.redis in OpenResty, redis-lua, or any object with a
call method; or opens one from host and port) and adds jobs, bulks and
flows to moonjob's queues, reads their state, waits for results and
declares schedules. The workers are moonjob's (the moonjob rock).
]],
  license = "MIT", -- LICENSE
}
dependencies = {
  "lua >= 5.1, < 5.5",
}
-- Type "none" with an install list: "builtin" would copy the whole lua/
-- folder (LuaRocks 3 installs a lua/ folder's contents whatever the list).
build = {
  type = "none",
  install = { lua = {
    ["moonjob.producer"] = "lua/moonjob/producer.lua",
    ["moonjob.producer.clients"] = "lua/moonjob/producer/clients.lua",
    ["moonjob.producer.codec"] = "lua/moonjob/producer/codec.lua",
    ["moonjob.producer.link"] = "lua/moonjob/producer/link.lua",
    ["moonjob.producer.resp"] = "lua/moonjob/producer/resp.lua",
    ["moonjob.codec.children"] = "lua/moonjob/codec/children.lua",
    ["moonjob.errors"] = "lua/moonjob/errors.lua",
    ["moonjob.backoff"] = "lua/moonjob/backoff.lua",
    ["moonjob.redis.add"] = "lua/moonjob/redis/add.lua",
    ["moonjob.redis.fcall"] = "lua/moonjob/redis/fcall.lua",
    ["moonjob.redis.flow"] = "lua/moonjob/redis/flow.lua",
    ["moonjob.redis.library"] = "lua/moonjob/redis/library.lua",
    ["moonjob.redis.names"] = "lua/moonjob/redis/names.lua",
    ["moonjob.redis.queue_calls"] = "lua/moonjob/redis/queue_calls.lua",
    ["moonjob.redis.schedules"] = "lua/moonjob/redis/schedules.lua",
    ["moonjob.redis.setup"] = "lua/moonjob/redis/setup.lua",
    ["moonjob.tz"] = "lua/moonjob/tz.lua",
    -- the library's parts, read (not required) by moonjob.redis.library
    ["moonjob.redis.functions.base"] = "lua/moonjob/redis/functions/base.lua",
    ["moonjob.redis.functions.metrics"] = "lua/moonjob/redis/functions/metrics.lua",
    ["moonjob.redis.functions.states"] = "lua/moonjob/redis/functions/states.lua",
    ["moonjob.redis.functions.cron"] = "lua/moonjob/redis/functions/cron.lua",
    ["moonjob.redis.functions.add"] = "lua/moonjob/redis/functions/add.lua",
    ["moonjob.redis.functions.bulk"] = "lua/moonjob/redis/functions/bulk.lua",
    ["moonjob.redis.functions.schedules"] = "lua/moonjob/redis/functions/schedules.lua",
    ["moonjob.redis.functions.limits"] = "lua/moonjob/redis/functions/limits.lua",
    ["moonjob.redis.functions.groups"] = "lua/moonjob/redis/functions/groups.lua",
    ["moonjob.redis.functions.workers"] = "lua/moonjob/redis/functions/workers.lua",
    ["moonjob.redis.functions.fetch"] = "lua/moonjob/redis/functions/fetch.lua",
    ["moonjob.redis.functions.runs"] = "lua/moonjob/redis/functions/runs.lua",
    ["moonjob.redis.functions.views"] = "lua/moonjob/redis/functions/views.lua",
    ["moonjob.redis.functions.operate"] = "lua/moonjob/redis/functions/operate.lua",
    ["moonjob.redis.functions.flows"] = "lua/moonjob/redis/functions/flows.lua",
    ["moonjob.redis.functions.register"] = "lua/moonjob/redis/functions/register.lua",
  } },
}
