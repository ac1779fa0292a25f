-- moonjob.codec.children -- a flow's parent's children as Redis gives them
-- (moonjob_children, moonjob_job, a parent's fetch row): rows of queue, id,
-- state, value (JSON text: a result or an error) -> tables { id, queue,
-- state, result | error }, in the rows' order.
--
-- Loaded on both sides: the producer reads q:children and q:job with it,
-- and a child decodes its parent job's job.children with it (the worker
-- passes the rows on as text: its loop never parses the children's
-- results). Errors come as plain tables; the producer wraps them.
local type = type -- (kept at load: in a child, a processor may remove the globals)

local M = {}

-- rows decoded with json (a codec: decode(text) -> value); hide_ignored:
-- a child whose failure its on_fail ignores keeps its place, without its
-- error (what a processor sees).
function M.decode(rows, json, hide_ignored)
  local out = {}
  for i = 1, #rows, 4 do
    local child = { queue = rows[i], id = rows[i + 1], state = rows[i + 2] }
    local value = rows[i + 3]
    if value ~= "" and child.state == "completed" then
      child.result = json.decode(value)
    elseif value ~= "" and not (hide_ignored and child.state == "ignored") then
      local e = json.decode(value)
      child.error = type(e) == "table" and e or { code = "EREMOTE", message = value }
    end
    out[#out + 1] = child
  end
  return out
end

return M
