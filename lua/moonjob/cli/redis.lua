-- moonjob.cli.redis -- the command line's durable-queue commands:
--
--   moonjob worker PROCESSOR --redis URL --queue NAME [-j N] [--lease S] [--grace S]
--   moonjob add --redis URL --queue NAME [INPUT] [--attempts N] [--backoff SPEC] ...
--   moonjob status --redis URL --queue NAME [--watch]
--
-- moonjob.cli parses the options (one table for every command) and calls
-- these. A worker runs until SIGTERM, SIGINT or SIGHUP, then stops fetching,
-- gives back the jobs it holds but has not started, lets running jobs finish
-- within --grace seconds (default 30; then they are stopped and given back),
-- and exits 0. Its lines on stderr say when Redis goes down and comes back,
-- every `redis` event of the pool (refusals, a processor that cannot load,
-- jobs fenced or lost), and at the end what it did.
local core = require "moonjob.core"
local json = require "moonjob.codec.json"
local loop = require "moonjob.loop"
local moonjob = require "moonjob"
local Queue = require "moonjob.redis.producer"
local client = require "moonjob.redis.client"
local stops = require "moonjob.cli.stops"

local M = {}
local EXIT_OK, EXIT_FAILED, EXIT_USAGE = stops.EXIT_OK, stops.EXIT_FAILED, stops.EXIT_USAGE

local function say(...)
  io.stderr:write("moonjob: ", ...)
  io.stderr:write("\n")
end

-- --redis and --queue, checked before anything connects.
function M.check_target(o, usage_error)
  if not o.redis then return usage_error("--redis URL (or MOONJOB_REDIS) is needed: redis://host:6379/0") end
  local t, err = client.parse(o.redis)
  if not t then return usage_error(err) end
  if not o.queue then return usage_error("--queue NAME is needed") end
  local ok, why = Queue.check_name(o.queue)
  if not ok then return usage_error(why) end
end

-- Runs the loop until a stop signal; returns its number.
local function until_signal()
  core.hold_stop_signals()
  local ok = pcall(loop.wait_until, function() return false end)
  return not ok and loop.signal or nil
end

function M.worker(processor, o, pool_options)
  local opts = pool_options(o)
  opts.redis, opts.queue, opts.lease, opts.echo = o.redis, o.queue, o.lease, true
  opts.keep, opts.keep_age, opts.prefetch = o.keep, o.keep_age, o.prefetch
  local ok, pool, err = pcall(moonjob.pool, processor, opts)
  if not ok or not pool then
    say((tostring(ok and err or pool):gsub("^[^:]*:%d+: ", ""))) -- the message only, not gsub's count
    return EXIT_USAGE
  end
  local display = client.display(assert(client.parse(o.redis)))
  pool:on("redis", function(kind, why)
    if kind == "up" then say("connected to ", display, ", queue ", o.queue)
    elseif kind == "down" then say("Redis unreachable (", tostring(why), "); running jobs go on, fetching resumes when it is back")
    else say(tostring(why)) end -- stale, error, broken, mended, fenced, lost: each says what and why
  end)
  local size = pool.size -- without -j: one per CPU
  say(("worker %s: %d %s on queue %s"):format(processor, size, size == 1 and "child" or "children", o.queue))
  local signum = until_signal()
  say(("stopping (%s): no more fetching; running jobs have %g s to finish"):format(
    signum == 15 and "SIGTERM" or signum == 1 and "SIGHUP" or "SIGINT", o.grace or 30))
  local stopped = pcall(pool.close, pool, { timeout = o.grace or 30 })
  for _ = 1, 3 do -- another signal: no more grace; running jobs are stopped and given back
    if stopped then break end
    say("stopping now: running jobs are stopped and given back to the queue")
    stopped = pcall(pool.close, pool, { force = true })
  end
  local s = pool:stats()
  local r = s.redis or {}
  say(("stopped: %d completed, %d failed here; %d stopped unreported (%d fenced, %d lost)"):format(
    s.completed, s.failed, (r.fenced or 0) + (r.lost or 0), r.fenced or 0, r.lost or 0))
  return EXIT_OK
end

local function add_options(o)
  return { attempts = o.attempts, backoff = o.backoff, timeout = o.timeout,
    kill_after = o.kill_after, priority = o.priority, delay = o.delay }
end

-- moonjob add: one job per NDJSON line, sent with up to WINDOW calls in
-- flight; prints each job's id in input order.
function M.add(input_path, o)
  local WINDOW = 256
  local input = io.stdin
  if input_path and input_path ~= "-" then
    local err
    input, err = io.open(input_path, "rb")
    if not input then say("cannot read ", input_path, ": ", err) return EXIT_USAGE end
  end
  local q, err = moonjob.queue(o.redis, o.queue)
  if not q then say(tostring(err)) return EXIT_FAILED end
  local opts = add_options(o)
  local inflight, failed, line_no, next_print = 0, 0, 0, 1
  local ids = {}
  local function flush()
    while ids[next_print] ~= nil do
      if ids[next_print] ~= false then io.stdout:write(ids[next_print], "\n") end
      ids[next_print] = nil
      next_print = next_print + 1
    end
  end
  for line in input:lines() do
    line_no = line_no + 1
    local n = line_no
    if line:match("^%s*$") then
      ids[n] = false
    else
      local _, perr = json.decode(line) -- nil, message for a line that is not JSON
      if perr then
        say(("line %d is not JSON (%s); skipped"):format(n, tostring(perr)))
        failed, ids[n] = failed + 1, false
      elseif #line > q.max_payload then
        say(("line %d takes %d bytes, more than max_payload (%d); skipped"):format(n, #line, q.max_payload))
        failed, ids[n] = failed + 1, false
      else
        inflight = inflight + 1
        q.client:call(Queue.add_args(q.prefix, line, opts, false), function(reply, cerr)
          inflight = inflight - 1
          if reply then ids[n] = reply[1]
          else
            say(("line %d: %s"):format(n, tostring(cerr)))
            failed, ids[n] = failed + 1, false
          end
        end)
        if inflight >= WINDOW then loop.wait_until(function() return inflight < WINDOW / 2 end) end
      end
    end
    flush()
  end
  loop.wait_until(function() return inflight == 0 end)
  flush()
  if input ~= io.stdin then input:close() end
  q:close()
  return failed == 0 and EXIT_OK or EXIT_FAILED
end

local function counts_line(c)
  return ("waiting %d, delayed %d, active %d, completed %d, failed %d"):format(
    c.waiting, c.delayed, c.active, c.completed, c.failed)
end

function M.status(o)
  local q, err = moonjob.queue(o.redis, o.queue)
  if not q then say(tostring(err)) return EXIT_FAILED end
  repeat
    local c, cerr = q:counts()
    if not c then say(tostring(cerr)) q:close() return EXIT_FAILED end
    io.stdout:write(counts_line(c), "\n")
    io.stdout:flush()
    if o.watch then
      local fired = false
      local t = core.timer(function() fired = true end)
      t:start(1000)
      core.hold_stop_signals()
      local ok = pcall(loop.wait_until, function() return fired end)
      t:close()
      if not ok then break end
    end
  until not o.watch
  q:close()
  return EXIT_OK
end

return M
