-- moonjob.redis.flow -- what a flow's add sends: a tree of jobs checked
-- whole and turned into moonjob_add_flow's arguments (the library's
-- functions/flows.lua). q:add_flow (moonjob.redis.producer) and the pure-Lua
-- producer (moonjob.producer) build their call here.
--
--   { data = ..., queue = "{shop}/pages", <q:add's options>,
--     children_deadline = s, on_fail = "fail" | "continue" | "ignore",
--     children = { tree, ... } }
--
-- A node's queue is its parent's when not given (the root's: the queue the
-- call is made on); every queue of a flow shares the root's hash tag
-- (moonjob.redis.names.tag). A bad tree is an error returned (EINPUT,
-- EPAYLOAD) that names the node ("root.children[2]"), never a raise: a tree
-- is data, often built at run time. Nothing of it is written then.
--
-- Pure Lua, as moonjob.redis.add: JSON through a codec given (opts.codec,
-- children's codec), moonjob's exact one when none is.
local add = require "moonjob.redis.add"
local children = require "moonjob.codec.children"
local errors = require "moonjob.errors"
local names = require "moonjob.redis.names"

local M = {}

M.NODES_MAX, M.DEPTH_MAX = 1000, 32 -- the library's bounds (functions/flows.lua)

local FLOW_FIELDS = { data = true, queue = true, on_fail = true, children_deadline = true, children = true }
local NOT_IN_FLOWS = { max_queue = "a flow is added whole or not at all", debounce = "a flow's jobs are new" }
local ON_FAIL = { fail = true, continue = true, ignore = true }

local function refuse(path, why)
  return nil, errors.new("EINPUT", ("queue:add_flow(): %s: %s"):format(path, why))
end

-- A node's add options (the fields that are not the flow's own) -> opts,
-- or nil and the refusal.
local function add_options(node, path)
  local opts = {}
  for k, v in pairs(node) do
    if NOT_IN_FLOWS[k] then return refuse(path, ("option '%s' is not for flows (%s)"):format(k, NOT_IN_FLOWS[k])) end
    if not FLOW_FIELDS[k] then opts[k] = v end
  end
  return opts
end

local function check_fields(node, path, is_root)
  if type(node) ~= "table" then return refuse(path, "a job of a flow must be a table { data = ..., children = {...} }") end
  if node.on_fail ~= nil and (is_root or not ON_FAIL[node.on_fail]) then
    return refuse(path, is_root and "the root has no parent: on_fail is for children"
      or "on_fail must be \"fail\" (the default), \"continue\" or \"ignore\"")
  end
  local kids = node.children
  if kids ~= nil and (type(kids) ~= "table" or next(kids) ~= nil and #kids == 0) then
    return refuse(path, "children must be a list of jobs")
  end
  if node.expire ~= nil and kids and #kids > 0 then
    return refuse(path, "expire is for a job without children (a parent's would count its children's time):"
      .. " bound them with children_deadline")
  end
  local d = node.children_deadline
  if d ~= nil and (type(d) ~= "number" or not (d > 0 and d <= names.SECONDS_MAX) or not (kids and #kids > 0)) then
    return refuse(path, "children_deadline must be a number of seconds, more than 0, on a job with children")
  end
  return true
end

-- The tree walked parents first: each node with its path, queue and
-- parent's place. -> nodes, or nil and the refusal.
local function walk(tree, root_queue)
  local nodes, tag = {}, names.tag(root_queue)
  local function visit(node, path, parent, queue, depth)
    local ok, err = check_fields(node, path, parent == 0)
    if not ok then return nil, err end
    if depth > M.DEPTH_MAX then return refuse(path, "a flow is at most " .. M.DEPTH_MAX .. " jobs deep") end
    if #nodes >= M.NODES_MAX then return refuse(path, "a flow holds at most " .. M.NODES_MAX .. " jobs") end
    queue = node.queue == nil and queue or node.queue
    local named, why = names.check_name(queue)
    if not named then return refuse(path, "queue: " .. why) end
    if names.tag(queue) ~= tag then
      return refuse(path, ("queue '%s' is outside the flow's hash tag {%s}: only queues named {%s}NAME (or %s)"
        .. " share its Redis slot"):format(queue, tag, tag, tag))
    end
    nodes[#nodes + 1] = { node = node, path = path, parent = parent, queue = queue }
    local me = #nodes
    for i, child in ipairs(node.children or {}) do
      local _, e = visit(child, path .. ".children[" .. i .. "]", me, queue, depth + 1)
      if e then return nil, e end
    end
    return true
  end
  local _, err = visit(tree, "root", 0, root_queue, 1)
  if err then return nil, err end
  return nodes
end

-- One node's 18 arguments (functions/flows.lua's order) from q:add's.
local function node_args(n, a, queue_at)
  local deadline = n.node.children_deadline
  return { queue_at[n.queue], n.parent, n.node.on_fail or "",
    deadline and ("%.0f"):format(math.max(1, deadline * 1000)) or "",
    a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[16], a[17], a[19], a[22] }
end

-- flow.args(tree, root_queue, opts) -> the FCALL's arguments, the nodes
-- ({ path, queue, node }, in the call's order) | nil, err. opts:
-- max_payload (bytes of a job's JSON), nonce (a function: a new nonce per
-- job, or nil: Redis makes them), codec (the JSON of data and backoffs:
-- encode(v) -> text | nil, err; default moonjob's exact one).
function M.args(tree, root_queue, opts)
  opts = opts or {}
  local nodes, err = walk(tree, root_queue)
  if not nodes then return nil, err end
  local codec = opts.codec
  local function encode(data) return add.encode(data, opts.max_payload or 1024 * 1024, codec) end
  local keys, queue_at, body = {}, {}, {}
  for _, n in ipairs(nodes) do
    if not queue_at[n.queue] then
      keys[#keys + 1] = names.prefix(n.queue)
      queue_at[n.queue] = #keys
    end
    local text, e = encode(n.node.data)
    if not text then return nil, errors.new(e.code or "EPAYLOAD", n.path .. ": " .. tostring(e.message or e)) end
    local opts_of, refused = add_options(n.node, n.path)
    if not opts_of then return nil, refused end
    local ok, a = pcall(add.args, keys[queue_at[n.queue]], text, opts_of, true, opts.nonce and opts.nonce() or "",
      nil, codec)
    if not ok then return refuse(n.path, (tostring(a):gsub("^.-queue:add%(%): ", ""))) end
    for _, v in ipairs(node_args(n, a, queue_at)) do body[#body + 1] = v end
  end
  local call = { "FCALL", "moonjob_add_flow", #keys }
  for _, k in ipairs(keys) do call[#call + 1] = k end
  call[#call + 1] = #nodes
  for _, v in ipairs(body) do call[#call + 1] = v end
  return call, nodes
end

-- flow.handles(nodes, reply, queue_of, new_job) -> the root's job handle:
-- moonjob_add_flow's reply (each node's id and nonce, in node order) as a
-- tree of handles, new_job(queue, { id, state, joined, nonce }) each, on
-- queue_of(name) for each queue named (once); each handle's .children are its
-- children's handles in the tree's order; the root with children is
-- "waiting-children" (the others' states are not known here: nil).
function M.handles(nodes, reply, queue_of, new_job)
  local jobs, queues = {}, {}
  for i, n in ipairs(nodes) do
    queues[n.queue] = queues[n.queue] or queue_of(n.queue)
    local job = new_job(queues[n.queue], { reply[2 * i - 1], "", 0, reply[2 * i] })
    job.state = i == 1 and #(n.node.children or {}) > 0 and "waiting-children" or nil
    job.children = {}
    jobs[i] = job
    if n.parent > 0 then table.insert(jobs[n.parent].children, job) end
  end
  return jobs[1]
end

-- A parent's children as moonjob_children (and moonjob_job) give them:
-- rows of queue, id, state, value -> { { id, queue, state, result | error
-- }, ... } (moonjob.codec.children), values read with codec (default:
-- moonjob's exact JSON), errors as error objects.
function M.children(rows, codec)
  local out = children.decode(rows, codec or require("moonjob.codec.json"))
  for _, child in ipairs(out) do
    if child.error then errors.wrap(child.error) end
  end
  return out
end

return M
