-- moonjob.router -- several named processors, each with a pool of its own.
--
--   local r = moonjob.pool({ resize = "p/resize.lua", mail = "p/mail.lua" }, opts)
--   r:add(data, { name = "mail" })
--
-- Every pool shares the one loop; their children are separate, so long
-- CPU-bound jobs on one name never hold up short jobs on another (short and
-- long tasks routed apart). opts apply to every pool; opts.pools[name]
-- overrides them for one (for example a bigger size for I/O-bound work).
-- add with an unknown name returns nil and ENOPROCESSOR.
local errors = require "moonjob.errors"
local loop = require "moonjob.loop"
local Pool = require "moonjob.pool"

local Router = {}
Router.__index = Router

local function merged(base, extra)
  local t = {}
  for k, v in pairs(base) do if k ~= "pools" then t[k] = v end end
  for k, v in pairs(extra or {}) do t[k] = v end
  return t
end

-- Router.new({ name = file, ... }, opts) -> router | nil, err
function Router.new(files, opts)
  opts = opts or {}
  if opts.pools ~= nil and type(opts.pools) ~= "table" then
    error("moonjob.pool: option 'pools' must be a table of per-name options", 3)
  end
  local self = setmetatable({ pools = {}, names = {} }, Router)
  for name, file in pairs(files) do
    if type(name) ~= "string" or type(file) ~= "string" then
      error("moonjob.pool: a table of processors maps names to file paths", 3)
    end
    -- each pool is named as routed (its metrics' label), unless opts.pools[name] says otherwise
    local pool, err = Pool.new(file, merged(merged(opts, { name = name }), opts.pools and opts.pools[name]))
    if not pool then
      self:close({ force = true })
      err.message = name .. ": " .. err.message
      return nil, err
    end
    self.pools[name] = pool
    self.names[#self.names + 1] = name
  end
  table.sort(self.names)
  return self
end

-- router:pool(name) -> the pool for that name, or nil
function Router:pool(name)
  return self.pools[name]
end

function Router:_route(opts)
  local name = opts and opts.name
  local pool = name ~= nil and self.pools[name]
  if pool then return pool end
  return nil, errors.new("ENOPROCESSOR", ("no processor named %s; known: %s")
    :format(name == nil and "(no name given)" or ("'" .. tostring(name) .. "'"),
      table.concat(self.names, ", ")))
end

-- router:add(data, { name = ..., ... }) -> job | nil, err
function Router:add(data, opts)
  local pool, err = self:_route(opts)
  if not pool then return nil, err end
  return pool:add(data, opts)
end

function Router:run(data, opts)
  local pool, err = self:_route(opts)
  if not pool then return nil, err end
  return pool:run(data, opts)
end

function Router:map(items, opts)
  local pool, err = self:_route(opts)
  if not pool then return nil, err end
  return pool:map(items, opts)
end

-- router:on(event, fn): the listener is added to every pool.
function Router:on(event, fn)
  for _, name in ipairs(self.names) do self.pools[name]:on(event, fn) end
  return self
end

function Router:drain()
  loop.wait_until(function()
    for _, pool in pairs(self.pools) do if not pool:is_idle() then return false end end
    return true
  end)
end

-- Router stats print one line per name, in name order: "name: <the pool's
-- stats line>".
local function format_stats(all)
  local names = {}
  for name in pairs(all) do names[#names + 1] = name end
  table.sort(names)
  for i, name in ipairs(names) do names[i] = name .. ": " .. tostring(all[name]) end
  return table.concat(names, "\n")
end

-- router:stats() -> { [name] = pool stats }, printing one line per name
function Router:stats()
  local all = {}
  for name, pool in pairs(self.pools) do all[name] = pool:stats() end
  return setmetatable(all, { __tostring = format_stats })
end

function Router:cancel_all(reason)
  local n = 0
  for _, pool in pairs(self.pools) do n = n + pool:cancel_all(reason) end
  return n
end

function Router:close(opts)
  for _, pool in pairs(self.pools) do pool:close(opts) end
  return true
end

function Router:__tostring()
  return ("<moonjob.router %s>"):format(table.concat(self.names, ", "))
end

return Router
