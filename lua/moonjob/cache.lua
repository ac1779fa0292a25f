-- moonjob.cache -- completed results kept for a while: a TTL and an LRU bound.
--
-- get and set are O(1): a hash from key to node, and a doubly linked list
-- from most to least recently used. An entry past its expiry is dropped when
-- looked up; past `max` entries, the least recently used one goes. Times are
-- the caller's clock (moonjob.pool: loop.now(), milliseconds): set() takes an
-- entry's expiry, get() the time now.
local Cache = {}
Cache.__index = Cache

function Cache.new(max)
  local head = {}
  head.prev, head.next = head, head -- sentinel: head.next is the most recent
  return setmetatable({ max = max, n = 0, nodes = {}, head = head }, Cache)
end

local function unlink(node)
  node.prev.next, node.next.prev = node.next, node.prev
end

local function link_first(head, node)
  node.prev, node.next = head, head.next
  head.next.prev = node
  head.next = node
end

function Cache:delete(key)
  local node = self.nodes[key]
  if not node then return end
  unlink(node)
  self.nodes[key] = nil
  self.n = self.n - 1
end

-- cache:get(key, now) -> value | nil
function Cache:get(key, now)
  local node = self.nodes[key]
  if not node then return nil end
  if node.expires <= now then
    self:delete(key)
    return nil
  end
  unlink(node)
  link_first(self.head, node)
  return node.value
end

-- cache:set(key, value, expires)
function Cache:set(key, value, expires)
  self:delete(key)
  local node = { key = key, value = value, expires = expires }
  self.nodes[key] = node
  link_first(self.head, node)
  self.n = self.n + 1
  if self.n > self.max then self:delete(self.head.prev.key) end
end

return Cache
