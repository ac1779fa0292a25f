-- pool:metrics() and moonjob.metrics(): real jobs (completed, failed,
-- retried, timed out, canceled), the text's values read back, and the text
-- checked by Debian's promtool, which must also refuse a broken text.
local h = require "helpers"
local moonjob = require "moonjob"
local core = require "moonjob.core"
local loop = require "moonjob.loop"
local Metrics = require "moonjob.pool.metrics"
local prom = require "prometheus_text"
local prometheus = require "moonjob.prometheus"

-- Runs the mix of jobs the spec counts on: 5 ok, 2 of 30 ms, 1 failing,
-- 1 failing once then completing (a retry), 1 crashing its child, 1 past
-- its timeout, 1 canceled. The pool runs without the JIT: its spinning jobs
-- stop at their interruption, not at a kill.
local function run_mix(pool)
  local jobs = {}
  for _ = 1, 5 do jobs[#jobs + 1] = pool:add({ how = "ok" }) end
  for _ = 1, 2 do jobs[#jobs + 1] = pool:add({ how = "sleep", ms = 30 }) end
  jobs[#jobs + 1] = pool:add({ how = "fail" })
  jobs[#jobs + 1] = pool:add({ how = "flaky", succeed_at = 2 }, { attempts = 3, backoff = { type = "fixed", delay = 0.01 } })
  local crashed = pool:add({ how = "exit" })
  local timed_out = pool:add({ how = "spin" }, { timeout = 0.2 })
  local canceled = pool:add({ how = "spin" })
  h.wait_started(canceled)
  canceled:cancel("enough")
  pool:drain()
  assert.equal("ETIMEDOUT", timed_out.error.code)
  assert.equal("ECANCELED", canceled.error.code)
  assert.equal("ECRASH", crashed.error.code)
  assert.equal(2, jobs[9].attempts)
end

describe("pool:metrics()", function()
  after_each(h.cleanup)

  it("counts the jobs a pool ran, its children and their run times", function()
    local pool = h.pool("metrics_mix.lua", { size = 2, name = "metrics_counted", jit = false })
    run_mix(pool)
    local text = pool:metrics()
    local m = prom.parse(text)
    local function v(name) return prom.value(m, "moonjob_" .. name, { pool = "metrics_counted" }) end
    assert.equal(8, v("jobs_completed_total"))
    assert.equal(4, v("jobs_failed_total")) -- failing, crashed, timed out, canceled
    assert.equal(1, v("jobs_retried_total"))
    assert.equal(1, v("jobs_timed_out_total"))
    assert.equal(1, v("jobs_canceled_total"))
    assert.equal(0, v("jobs_waiting"))
    assert.equal(0, v("jobs_active"))
    assert.equal(2, v("pool_size"))
    assert.equal(2, v("pool_children"))
    assert.equal(0, v("pool_children_busy"))
    assert.equal(3, v("pool_children_spawned_total"))
    assert.equal(1, v("pool_children_restarts_total"))
    assert.equal(1, v("pool_children_crashed_total"))
    assert.equal(0, v("pool_children_killed_total"))
    assert.is_true(v("pool_children_resident_bytes") > 0, "the children's statm read")
    assert.is_true(prom.value(m, "moonjob_process_resident_bytes") > 0)
    assert.is_number(prom.value(m, "moonjob_event_loop_lag_seconds"))
    -- every job that ran ended once in the histogram (the retried one: its last attempt)
    assert.equal(12, v("job_duration_seconds_count"))
    local function bucket(le)
      return prom.value(m, "moonjob_job_duration_seconds_bucket", { pool = "metrics_counted", le = le })
    end
    assert.equal(12, bucket("+Inf"))
    assert.is_true(bucket("0.02468") <= 12 - 3, "the 30 ms jobs and the 200 ms one are above 24.68 ms")
    assert.is_true(bucket("0.0987") <= 12 - 1, "the timed out one ran 200 ms")
    local last = 0
    for _, le in ipairs(Metrics.DURATION_BOUNDS) do
      local n = bucket(prometheus.format_number(le))
      assert.is_true(n >= last, "cumulative at le=" .. le)
      last = n
    end
    assert.is_true(v("job_duration_seconds_sum") >= 0.2 + 2 * 0.03)
  end)

  it("passes promtool check metrics with no lint problem", function()
    local pool = h.pool("metrics_mix.lua", { size = 2, jit = false })
    run_mix(pool)
    local status, out = prom.promtool_check(pool:metrics())
    assert.equal("", out)
    assert.equal(0, status)
    status, out = prom.promtool_check(moonjob.metrics())
    assert.equal("", out)
    assert.equal(0, status)
  end)

  it("makes promtool fail on a broken text, so the check is real", function()
    local pool = h.pool("echo.lua", { size = 1, name = "metrics_broken" })
    pool:run("x")
    local text = pool:metrics()
    -- a counter without _total: a lint problem
    local status, out = prom.promtool_check((text:gsub("jobs_completed_total", "jobs_completed")))
    assert.is_not.equal(0, status)
    assert.matches("counter metrics should have \"_total\" suffix", out)
    -- a label value with its quote unescaped: not the format
    status, out = prom.promtool_check((text:gsub('pool="metrics_broken"', 'pool="metrics_bro"ken"')))
    assert.is_not.equal(0, status)
    assert.matches("parsing error", out)
  end)

  it("labels the pool by its processor's name, or its name option", function()
    -- (names no other spec's pools have: a pool left open elsewhere would take them)
    local by_file = h.pool("metrics_mix.lua", { size = 1 })
    local named = h.pool("echo.lua", { size = 1, name = "metrics_mail" })
    local twin = h.pool("metrics_mix.lua", { size = 1 })
    by_file:run({ how = "ok" })
    local function completed(pool, label)
      return prom.value(prom.parse(pool:metrics()), "moonjob_jobs_completed_total", { pool = label })
    end
    assert.equal(1, completed(by_file, "metrics_mix"))
    assert.equal(0, completed(named, "metrics_mail"))
    -- another open pool of the same name: told apart
    assert.equal(0, completed(twin, "metrics_mix#2"))
  end)

  it("names a router's pools as routed", function()
    local router = assert(moonjob.pool({ metrics_a = h.fixture("echo.lua"), metrics_b = h.fixture("echo.lua") },
      { size = 1, echo = false }))
    router:run("x", { name = "metrics_b" })
    local m = prom.parse(moonjob.metrics())
    router:close()
    assert.equal(0, prom.value(m, "moonjob_jobs_completed_total", { pool = "metrics_a" }))
    assert.equal(1, prom.value(m, "moonjob_jobs_completed_total", { pool = "metrics_b" }))
  end)

  it("raises on a name option that is not a string", function()
    assert.has_error(function() moonjob.pool(h.fixture("echo.lua"), { name = 3 }) end,
      "moonjob.pool: option 'name' must be a string, not a number")
  end)
end)

describe("moonjob.metrics()", function()
  after_each(h.cleanup)

  it("renders every open pool in one text, each metric once, and drops closed pools", function()
    local a = h.pool("echo.lua", { size = 1, name = "metrics_first" })
    local b = h.pool("metrics_mix.lua", { size = 1, name = "metrics_second" })
    a:run("x")
    b:run({ how = "fail" })
    local m = prom.parse(moonjob.metrics()) -- raises on a HELP or TYPE line twice
    assert.equal(1, prom.value(m, "moonjob_jobs_completed_total", { pool = "metrics_first" }))
    assert.equal(1, prom.value(m, "moonjob_jobs_failed_total", { pool = "metrics_second" }))
    assert.equal(1, prom.value(m, "moonjob_job_duration_seconds_count", { pool = "metrics_second" }))
    assert.equal("counter", m.type.moonjob_jobs_completed_total)
    assert.equal("histogram", m.type.moonjob_job_duration_seconds)
    b:close()
    m = prom.parse(moonjob.metrics())
    assert.is_nil(prom.value(m, "moonjob_jobs_failed_total", { pool = "metrics_second" }))
    assert.equal(0, prom.value(m, "moonjob_jobs_failed_total", { pool = "metrics_first" }))
  end)
end)

describe("Metrics.all_families()", function()
  after_each(h.cleanup)

  it("lets a program render the pools' metrics and its own in one text", function()
    local pool = h.pool("echo.lua", { size = 1, name = "metrics_own" })
    pool:run("x")
    local families = Metrics.all_families()
    families[#families + 1] = { name = "app_requests_total", help = "Requests served.", type = "counter",
      samples = { { labels = { path = "/metrics" }, value = 7 } } }
    local text = prometheus.render(families)
    local m = prom.parse(text)
    assert.equal(7, prom.value(m, "app_requests_total", { path = "/metrics" }))
    assert.equal(1, prom.value(m, "moonjob_jobs_completed_total", { pool = "metrics_own" }))
    local status, out = prom.promtool_check(text)
    assert.equal("", out)
    assert.equal(0, status)
  end)
end)

describe("the event loop's lag", function()
  after_each(h.cleanup)

  it("is seen after the loop was blocked on purpose", function()
    local pool = h.pool("echo.lua", { size = 1 })
    -- blocked for longer than the sampler's interval: one tick falls inside
    -- the block, whatever its phase, and fires at least 200 ms late
    local block_ms = Metrics.LAG_INTERVAL_MS + 200
    local blocked = false
    local blocker = core.timer(function()
      local t0 = loop.now()
      while loop.now() - t0 < block_ms do end
      blocked = true
    end)
    blocker:start(10)
    h.wait_for(function() return blocked end)
    blocker:close()
    h.sleep(0.05) -- the late tick fires on the next turn
    local m = prom.parse(pool:metrics())
    local lag, max = prom.value(m, "moonjob_event_loop_lag_seconds"), prom.value(m, "moonjob_event_loop_lag_max_seconds")
    assert.is_true(lag >= 0.1, "lag " .. lag)
    assert.is_true(max >= lag, "max " .. max)
    assert.is_true(max < 60, "max " .. max) -- a hang only
  end)

  it("is seen while the loop is not run, as how overdue the sampler is", function()
    local pool = h.pool("echo.lua", { size = 1 })
    pool:run("x")
    local t0 = loop.now() -- the loop not run, for longer than the sampler's interval
    while loop.now() - t0 < Metrics.LAG_INTERVAL_MS + 200 do end
    local m = prom.parse(pool:metrics())
    local lag = prom.value(m, "moonjob_event_loop_lag_seconds")
    assert.is_true(lag >= 0.1, "lag " .. lag)
    assert.is_true(prom.value(m, "moonjob_event_loop_lag_max_seconds") >= lag)
  end)

  it("never keeps a program alive, and stops with the last pool", function()
    local out, err, status = h.sh(h.LUAJIT .. [[ -e '
      local moonjob = require "moonjob"
      local sampling = require("moonjob.pool.metrics").sampling
      print(sampling())
      local pool = assert(moonjob.pool("spec/fixtures/echo.lua", { size = 1, echo = false }))
      local other = assert(moonjob.pool("spec/fixtures/echo.lua", { size = 1, echo = false }))
      pool:run("x")
      assert(pool:metrics():find("moonjob_event_loop_lag_seconds", 1, true))
      pool:close()
      print(sampling())
      other:close()
      print(sampling(), moonjob.step(), moonjob.timeout())
      local left = assert(moonjob.pool("spec/fixtures/echo.lua", { size = 1, echo = false }))
      left:run("y")
      print(sampling())']])
    assert.equal(0, status, err)
    assert.equal("false\ntrue\nfalse\tfalse\tnil\ntrue\n", out) -- and it ended, a pool left open
  end)
end)

describe("moonjob.prometheus's text", function()
  it("passes promtool with escaped labels and help, special numbers and a histogram", function()
    local text = prometheus.render({
      { name = "moonjob_odd", help = "Odd \\ values\nhere.", type = "gauge", samples = {
        { labels = { queue = 'a\\b "c"\nd' }, value = 0 / 0 },
        { labels = { queue = "inf" }, value = math.huge },
        { labels = { queue = "tiny" }, value = 1.5e-7 },
        { labels = { queue = "big" }, value = 2 ^ 60 } } },
      { name = "moonjob_wait_seconds", help = "A histogram.", type = "histogram",
        samples = { prometheus.histogram({ queue = "x" }, { 0.5, 1 }, { 1, 0, 2 }, 3.25) } },
    })
    local status, out = prom.promtool_check(text)
    assert.equal("", out)
    assert.equal(0, status)
    local m = prom.parse(text)
    assert.equal(math.huge, prom.value(m, "moonjob_odd", { queue = "inf" }))
    local nan = prom.value(m, "moonjob_odd", { queue = 'a\\b "c"\nd' })
    assert.is_true(nan ~= nan, "the escaped label read back")
  end)
end)
