-- moonjob.cli.workers -- `moonjob workers [--queue Q] [--json]`: the workers
-- serving a queue (without --queue: every registered queue's), as their
-- heartbeats last said (q:workers, moonjob.redis.heartbeat). NDJSON off a
-- terminal (each q:workers row with its queue), a table on one:
--
--   QUEUE   WORKER               HOST  PID   CHILDREN  RUNNING  STARTED               SEEN
--   images  web1:4242:9f3a0c1d   web1  4242  4         2        2026-11-29T16:02:11Z  0.1 s ago  img-7 (3.2 s), img-9 (0.4 s)
--   images  web2:977:03be41aa    web2  977   4         0        2026-11-29T15:40:02Z  12 s ago, lapsed
--
-- A worker stopped cleanly is gone from the list at once; one gone without
-- a word (kill -9, a host lost) shows as lapsed once it missed 3 beats, and
-- is dropped after 30 (docs/guide/redis.md, "Workers").
local producer = require "moonjob.redis.producer"
local operate = require "moonjob.cli.operate"
local stops = require "moonjob.cli.stops"

local M = {}

local JOBS_SHOWN = 5 -- running jobs named in a table's row

-- "0.1 s ago", "12 s ago, lapsed", then the jobs it runs and for how long.
local function seen_text(w)
  local text = ("%s s ago%s"):format(w.ago < 10 and ("%.1f"):format(w.ago) or ("%d"):format(w.ago),
    w.lapsed and ", lapsed" or "")
  local jobs = {}
  for i = 1, math.min(JOBS_SHOWN, #w.jobs) do
    local j = w.jobs[i]
    jobs[i] = ("%s (%.1f s)"):format(tostring(j.id), math.max(0, w.seen - j.since) / 1000 + w.ago)
  end
  if #w.jobs > JOBS_SHOWN then jobs[#jobs + 1] = ("and %d more"):format(#w.jobs - JOBS_SHOWN) end
  if #jobs > 0 then text = text .. "  " .. table.concat(jobs, ", ") end
  return text
end

function M.run(o)
  local list, err = producer.workers(o.redis, o.queue)
  if not list then operate.say(tostring(err)) return stops.EXIT_FAILED end
  local out = operate.new_out(o)
  for _, w in ipairs(list) do
    if out.table then
      out:object({ queue = w.queue, worker = w.id, host = w.host, pid = w.pid, children = w.children,
        running = w.running, started = operate.when(w.started), seen = seen_text(w) })
    else
      out:object(w)
    end
  end
  if out.table and #list == 0 then
    operate.say(o.queue and ("no worker on queue " .. o.queue) or "no worker on this server's queues")
  end
  return out:flush({ "queue", "worker", "host", "pid", "children", "running", "started", "seen" })
    and stops.EXIT_OK or stops.EXIT_FAILED
end

return M
