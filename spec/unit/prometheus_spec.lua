-- moonjob.prometheus: the text exposition format written exactly (escapes,
-- numbers, cumulative histograms, families once) and bad input refused.
-- (promtool's own check of this text: spec/pool/metrics_spec.lua.)
local prometheus = require "moonjob.prometheus"

local function counter(samples)
  return { name = "jobs_total", help = "Jobs.", type = "counter", samples = samples }
end

describe("moonjob.prometheus.render", function()
  it("writes HELP, TYPE and one line per sample, labels sorted by name", function()
    local text = prometheus.render({
      counter({ { labels = { queue = "a", host = "h" }, value = 3 }, { value = 0 } }),
      { name = "up", help = "Up.", type = "gauge", samples = { { value = 1 } } },
    })
    assert.equal(table.concat({
      "# HELP jobs_total Jobs.",
      "# TYPE jobs_total counter",
      'jobs_total{host="h",queue="a"} 3',
      "jobs_total 0",
      "# HELP up Up.",
      "# TYPE up gauge",
      "up 1", "" }, "\n"), text)
  end)

  it("escapes backslash, double quote and newline in label values, backslash and newline in HELP", function()
    local text = prometheus.render({
      { name = "x", help = 'a \\ b\nc "d"', type = "gauge",
        samples = { { labels = { q = 'back\\slash "quoted"\nnext' }, value = 1 } } } })
    assert.equal(table.concat({
      '# HELP x a \\\\ b\\nc "d"',
      "# TYPE x gauge",
      'x{q="back\\\\slash \\"quoted\\"\\nnext"} 1', "" }, "\n"), text)
  end)

  it("writes numbers as promtool reads them", function()
    local f = prometheus.format_number
    assert.equal("3", f(3))
    assert.equal("-2", f(-2))
    assert.equal("9007199254740992", f(2 ^ 53)) -- whole: no exponent
    assert.equal("0.1", f(0.1))
    assert.equal("0.005", f(0.005))
    assert.equal("1.5e-07", f(1.5e-7))
    assert.equal(1e300, tonumber(f(1e300)))
    assert.equal(1 / 3, tonumber(f(1 / 3)), "reads back as the same double")
    assert.equal("+Inf", f(math.huge))
    assert.equal("-Inf", f(-math.huge))
    assert.equal("NaN", f(0 / 0))
  end)

  it("writes a histogram's buckets cumulative, with +Inf, _sum and _count", function()
    local text = prometheus.render({ { name = "run_seconds", help = "Run time.", type = "histogram",
      samples = { prometheus.histogram({ pool = "p" }, { 0.1, 1 }, { 4, 2, 1 }, 2.5) } } })
    assert.equal(table.concat({
      "# HELP run_seconds Run time.",
      "# TYPE run_seconds histogram",
      'run_seconds_bucket{pool="p",le="0.1"} 4',
      'run_seconds_bucket{pool="p",le="1"} 6',
      'run_seconds_bucket{pool="p",le="+Inf"} 7',
      'run_seconds_sum{pool="p"} 2.5',
      'run_seconds_count{pool="p"} 7', "" }, "\n"), text)
  end)

  it("writes a family given several times once, its samples together in order", function()
    local text = prometheus.render({
      counter({ { labels = { pool = "a" }, value = 1 } }),
      { name = "up", help = "Up.", type = "gauge", samples = { { value = 1 } } },
      counter({ { labels = { pool = "b" }, value = 2 } }),
    })
    local _, helps = text:gsub("# HELP jobs_total", "")
    assert.equal(1, helps)
    assert.matches('jobs_total{pool="a"} 1\njobs_total{pool="b"} 2\n# HELP up', text)
  end)

  it("writes a family without samples as its HELP and TYPE alone", function()
    assert.equal("# HELP jobs_total Jobs.\n# TYPE jobs_total counter\n", prometheus.render({ counter({}) }))
    assert.equal("", prometheus.render({}))
  end)
end)

describe("moonjob.prometheus.render refuses", function()
  local function refuses(pattern, families)
    local ok, err = pcall(prometheus.render, families)
    assert.is_false(ok)
    assert.matches(pattern, err, 1, true)
  end

  it("metric names outside [a-zA-Z_:][a-zA-Z0-9_:]*", function()
    for _, name in ipairs({ "1jobs", "jobs-done", "jobs done", "", "é" }) do
      refuses("metric '" .. name .. "': the name must match [a-zA-Z_:][a-zA-Z0-9_:]*",
        { { name = name, help = "x", type = "gauge", samples = {} } })
    end
    refuses("metric 'nil': the name must match", { { help = "x", type = "gauge", samples = {} } })
  end)

  it("label names that are invalid or reserved (__)", function()
    refuses("metric 'jobs_total': label name 'a-b' must match [a-zA-Z_][a-zA-Z0-9_]*",
      { counter({ { labels = { ["a-b"] = "x" }, value = 1 } }) })
    refuses("metric 'jobs_total': label name 'a:b' must match",
      { counter({ { labels = { ["a:b"] = "x" }, value = 1 } }) })
    refuses("metric 'jobs_total': label name '__name__': names starting with __ are reserved",
      { counter({ { labels = { __name__ = "x" }, value = 1 } }) })
    refuses("metric 'jobs_total': label 'q' must be a string or a number, not table",
      { counter({ { labels = { q = {} }, value = 1 } }) })
  end)

  it("values that are not numbers", function()
    refuses("metric 'jobs_total': a sample's value must be a number, not string",
      { counter({ { value = "3" } }) })
    refuses("metric 'jobs_total': a sample's value must be a number, not nil", { counter({ {} }) })
  end)

  it("counters not named _total, other types named so, unknown types, no help", function()
    refuses("metric 'jobs': a counter's name must end in _total",
      { { name = "jobs", help = "x", type = "counter", samples = {} } })
    refuses("metric 'up_total': only a counter's name may end in _total",
      { { name = "up_total", help = "x", type = "gauge", samples = {} } })
    refuses("metric 'up': type must be \"counter\", \"gauge\", \"histogram\" or \"untyped\", not summary",
      { { name = "up", help = "x", type = "summary", samples = {} } })
    refuses("metric 'up': help must be a non-empty string", { { name = "up", type = "gauge", samples = {} } })
  end)

  it("the same labels twice in a family, and a family given twice with another type", function()
    refuses('metric \'jobs_total\': the same labels twice: {pool="a"}', {
      counter({ { labels = { pool = "a" }, value = 1 } }), counter({ { labels = { pool = "a" }, value = 2 } }) })
    refuses("metric 'jobs_total': given twice with a different type or help", {
      counter({}), { name = "jobs_total", help = "Other.", type = "counter", samples = {} } })
  end)

  it("histograms with bounds not increasing, counts of the wrong length, an le label", function()
    local function hist(sample) return { { name = "h", help = "x", type = "histogram", samples = { sample } } } end
    refuses("metric 'h': bucket bounds must be finite and increasing",
      hist(prometheus.histogram(nil, { 1, 0.5 }, { 0, 0, 0 }, 0)))
    refuses("metric 'h': bucket bounds must be finite and increasing",
      hist(prometheus.histogram(nil, { 1, math.huge }, { 0, 0, 0 }, 0)))
    refuses("metric 'h': 2 bounds need 3 counts (the last: above the last bound), not 2",
      hist(prometheus.histogram(nil, { 1, 2 }, { 0, 0 }, 0)))
    refuses("metric 'h': a histogram's labels cannot include le",
      hist(prometheus.histogram({ le = "1" }, { 1 }, { 0, 0 }, 0)))
    refuses("metric 'h': a histogram's sum must be a number, not nil",
      hist(prometheus.histogram(nil, { 1 }, { 0, 0 })))
  end)

  it("anything but a list of families", function()
    refuses("moonjob.prometheus.render: expects a list of metric families", "text")
    refuses("each metric family must be a table", { "x" })
  end)
end)
