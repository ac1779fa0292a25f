-- spec/support/netns.lua -- hosts for the chaos specs (make chaos, as root):
-- network namespaces on a bridge the spec creates, deleted afterwards.
--
--   local hosts = netns.new("mjpause", "10.231.78", 2)  -- bridge mjpause0, hosts mjpause1..2
--   hosts:setup()      -- 10.231.78.1 on the bridge; host i at 10.231.78.(10 + i)
--   hosts:exec(i)      -- "ip netns exec mjpause<i>", to put before a command
--   hosts:teardown()   -- every namespace and the bridge deleted, whatever is left
--
-- Each host is a veth pair: one end on the bridge (PREFIX .. "v" .. i, which a
-- spec may set down to cut that host off), the other in the namespace.
local M = {}
local Hosts = {}
Hosts.__index = Hosts

local function run(cmd)
  return os.execute(cmd .. " >/dev/null 2>&1") == 0
end

local function must(cmd)
  assert(run(cmd), "failed: " .. cmd)
end

-- prefix: of the names (at most 8 characters: interface names are short);
-- net: the first three numbers of a /24 used by nothing else.
function M.new(prefix, net, count)
  return setmetatable({ prefix = prefix, net = net, count = count, bridge = prefix .. "0" }, Hosts)
end

function Hosts:namespace(i) return self.prefix .. i end
function Hosts:link(i) return self.prefix .. "v" .. i end -- the bridge's end of host i
function Hosts:exec(i) return "ip netns exec " .. self:namespace(i) end

function Hosts:teardown()
  for i = 1, self.count do run("ip netns del " .. self:namespace(i)) end
  run("ip link del " .. self.bridge)
end

function Hosts:setup()
  self:teardown()
  must(("ip link add %s type bridge"):format(self.bridge))
  must(("ip addr add %s.1/24 dev %s"):format(self.net, self.bridge))
  must(("ip link set %s up"):format(self.bridge))
  for i = 1, self.count do
    local ns, host_end, ns_end = self:namespace(i), self:link(i), self.prefix .. "p" .. i
    must("ip netns add " .. ns)
    must(("ip link add %s type veth peer name %s"):format(host_end, ns_end))
    must(("ip link set %s netns %s"):format(ns_end, ns))
    must(("ip link set %s master %s up"):format(host_end, self.bridge))
    must(("%s ip addr add %s.%d/24 dev %s"):format(self:exec(i), self.net, 10 + i, ns_end))
    must(("%s ip link set %s up"):format(self:exec(i), ns_end))
    must(("%s ip link set lo up"):format(self:exec(i)))
  end
end

return M
