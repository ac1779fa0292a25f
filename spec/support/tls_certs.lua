-- spec/support/tls_certs.lua -- certificates for the TLS specs, made with
-- the openssl command in a fresh temporary directory:
--
--   local certs = tls_certs.make()
--   certs.ca, certs.server_cert, certs.server_key   -- a CA and a server certificate it
--                                                   -- signed (SAN 127.0.0.1 and localhost)
--   certs.client_cert, certs.client_key             -- a client certificate the CA signed
--   certs.other_ca                                  -- a CA that signed none of them
--   certs:remove()
--
-- EC keys (P-256): made in milliseconds, where RSA keys take a while.
local helpers = require "helpers"

local M = {}
local Certs = {}
Certs.__index = Certs

local function run(dir, command)
  local out, err, status = helpers.sh(("cd %s && %s"):format(dir, command))
  assert(status == 0, ("openssl failed (%s): %s%s"):format(command, out, err))
end

local KEY = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"

-- A self-signed CA: NAME.crt, NAME.key.
local function ca(dir, name, cn)
  run(dir, ("openssl req -x509 %s -keyout %s.key -out %s.crt -days 2 -subj '/CN=%s'"
    .. " -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign")
    :format(KEY, name, name, cn))
end

-- A certificate the CA `ca` signed: NAME.crt, NAME.key, with extensions `ext`.
local function leaf(dir, name, cn, ext)
  helpers.write_file(dir .. "/" .. name .. ".ext", ext .. "\n")
  run(dir, ("openssl req %s -keyout %s.key -out %s.csr -subj '/CN=%s'"):format(KEY, name, name, cn))
  run(dir, ("openssl x509 -req -in %s.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out %s.crt -days 2"
    .. " -extfile %s.ext"):format(name, name, name))
end

function M.make()
  local dir = helpers.tmpdir()
  ca(dir, "ca", "moonjob spec CA")
  ca(dir, "other_ca", "an unrelated CA")
  leaf(dir, "server", "moonjob spec server",
    "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth")
  leaf(dir, "client", "moonjob spec client", "extendedKeyUsage=clientAuth")
  return setmetatable({
    dir = dir,
    ca = dir .. "/ca.crt", other_ca = dir .. "/other_ca.crt",
    server_cert = dir .. "/server.crt", server_key = dir .. "/server.key",
    client_cert = dir .. "/client.crt", client_key = dir .. "/client.key",
  }, Certs)
end

function Certs:remove()
  os.execute("rm -rf " .. self.dir)
end

return M
