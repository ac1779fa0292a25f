-- The pool's hooks for the command line's batches of lines (cut, kept:
-- pool.lines:set_hooks, moonjob.pool.lines) are called as a listener is: an
-- error in one is reported to the `error` listeners and the pool carries on.
local h = require "helpers"

describe("the pool's batch hook #slow", function()
  after_each(function() h.cleanup() end)

  -- Adds the NDJSON lines `lines` to `pool` as one batch from line `first`.
  local function add_batch(pool, first, lines)
    return pool:add(table.concat(lines, "\n"), { lines = { first, #lines } })
  end

  it("reports an error raised in the cut or kept hook, and the batches still end", function()
    local pool = h.pool("slow_line.lua", { size = 2, codec = "json" })
    local reported = {}
    pool:on("error", function(message, event) reported[event] = tostring(message) end)
    pool.lines:set_hooks{ cut = function() error("the cut hook broke") end,
      kept = function() error("the kept hook broke") end }
    -- an idle child cuts the lines behind the slow first one
    local cut = add_batch(pool, 1, { '{"sleep":0.3}', "2", "3", "4" })
    assert.is_string(cut:wait())
    assert.matches("the cut hook broke", reported.on_lines_cut)
    -- the sweep publishes the lines finished before the slow one
    local kept = add_batch(pool, 11, { "11", "12", '{"sleep":0.3}' })
    assert.is_string(kept:wait())
    assert.matches("the kept hook broke", reported.on_lines_kept)
    assert.is_not_nil(pool:run("5")) -- and the pool goes on
    pool:close()
  end)
end)
