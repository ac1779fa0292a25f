// moonjob dashboard: the page's script, served by `moonjob dashboard`.
//
// One page, plain JavaScript, no build step and nothing from the network.
// Hash routes:
//   #/                                every queue: counts, a 30-minute sparkline
//   #/queue/NAME?state=S&offset=N     a queue: the last hour's chart, tabs per
//                                     state, a page of jobs, queue actions
//   #/queue/NAME/job/ID               one job: data, result or error, log, actions;
//                                     a flow's: its parent, its children (linked)
//   #/workers                         every queue's workers, as their heartbeats say
//                                     (read-only; lapsed ones marked)
// NAME and ID are percent-encoded (encodeURIComponent) in routes and API
// paths: a queue "{shop}/images" is %7Bshop%7D%2Fimages, one path segment.
// It asks the JSON API (lua/moonjob/dashboard/api.lua) again every 2 s while
// the tab is visible, and redraws only when an answer changed.
//
// Caveats: job data, results, errors and names are untrusted, so text goes
// into the page only as text nodes (textContent, append of strings), never
// through innerHTML. Every request carries the X-Moonjob-Token header: the
// page's ?token=, kept in sessionStorage; the server wants the header on
// every action even when it has no token. Times are the server's clock, shown
// in the browser's time zone.
"use strict";

const POLL_MS = 2000;
const PAGE_SIZE = 20;
const STATES = ["waiting", "delayed", "active", "completed", "failed", "waiting-children"];
const ENDED = ["completed", "failed", "ignored"]; // a flow's child's states once it ended
const SVG_NS = "http://www.w3.org/2000/svg";
const NUMBER = new Intl.NumberFormat();

// ---------------------------------------------------------------- requests

const TOKEN = (() => {
  const given = new URLSearchParams(location.search).get("token");
  if (given !== null) sessionStorage.setItem("moonjob-token", given);
  return sessionStorage.getItem("moonjob-token") || "";
})();

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

// api("GET", "queues") -> the decoded answer; throws ApiError with the
// server's {"error":{"code","message"}} on any other status than 2xx.
async function api(method, path, body) {
  const init = { method, cache: "no-store", headers: { "X-Moonjob-Token": TOKEN } };
  if (method === "POST") {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body || {});
  }
  let response;
  try {
    response = await fetch("/api/" + path, init);
  } catch (e) {
    throw new ApiError(0, "ENETWORK", "the dashboard does not answer: is `moonjob dashboard` still running?");
  }
  let answer = null;
  try { answer = await response.json(); } catch (e) { /* not JSON: said below */ }
  if (!response.ok) {
    const err = (answer && answer.error) || {};
    throw new ApiError(response.status, err.code || "HTTP " + response.status,
      err.message || response.statusText || "the request failed");
  }
  return answer;
}

const enc = encodeURIComponent;
const queuePath = (name) => "queues/" + enc(name);
const jobPath = (name, id) => queuePath(name) + "/jobs/" + enc(id);

// ------------------------------------------------------------ the banner

// An error stays until dismissed, or, when a poll said it, until a poll works;
// a notice (origin "info": what an action did) for a few seconds.
function showError(err, origin) {
  const banner = document.getElementById("banner");
  document.getElementById("banner-text").textContent =
    (err.code ? err.code + ": " : "") + (err.message || String(err));
  banner.dataset.origin = origin;
  banner.hidden = false;
  if (origin === "info") setTimeout(() => clearError("info"), 6000);
}

function clearError(origin) {
  const banner = document.getElementById("banner");
  if (!origin || banner.dataset.origin === origin) banner.hidden = true;
}

// ------------------------------------------------------------ formatting

const num = (n) => (n == null ? "–" : NUMBER.format(n));
const localTime = (ms) => (ms ? new Date(ms).toLocaleString() : "–");
const clock = (ms) => new Date(ms).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });

function duration(ms) {
  if (ms == null) return "–";
  if (ms < 1000) return NUMBER.format(Math.round(ms * 10) / 10) + " ms";
  if (ms < 60000) return (ms / 1000).toFixed(2) + " s";
  return Math.floor(ms / 60000) + " min " + Math.round((ms % 60000) / 1000) + " s";
}

// A percentile of a metrics row (p: "p50", "p99"): its estimate (the
// middle of a bucket, within 4.5%), or, in the first or last bucket, the
// bound it is below or above ("≤ 1 ms", "> 17 min").
function percentile(row, p) {
  const ms = row[p + "_ms"], bound = row[p + "_bound"];
  if (bound === "below") return "≤ " + duration(ms);
  if (bound === "above") return "> " + (ms >= 60000 ? Math.floor(ms / 60000) + " min" : duration(ms));
  return duration(ms);
}

// A value (or the server's cut text of it) as one short line.
function preview(value, cutText, max = 100) {
  let text = cutText != null ? cutText : value === undefined ? "" : value;
  if (typeof text !== "string") text = JSON.stringify(text);
  return text.length > max ? text.slice(0, max) + "…" : text;
}

const pretty = (value) => (typeof value === "string" ? value : JSON.stringify(value, null, 2));

// ------------------------------------------------------------ DOM helpers

// h("a", { href, class, test, onclick }, child...) -> element. Strings become
// text nodes; props "text" sets textContent, "test" data-test.
function h(tag, props, ...kids) {
  return fill(document.createElement(tag), props, kids);
}

function s(tag, props, ...kids) {
  return fill(document.createElementNS(SVG_NS, tag), props, kids);
}

function fill(node, props, kids) {
  for (const [key, value] of Object.entries(props || {})) {
    if (value == null || value === false) continue;
    if (key === "text") node.textContent = value;
    else if (key === "test") node.dataset.test = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key === "className" ? "class" : key, value === true ? "" : String(value));
  }
  for (const kid of kids.flat(Infinity)) {
    if (kid != null && kid !== false) node.append(kid);
  }
  return node;
}

const badge = (text, kind, test) => h("span", { class: "badge badge-" + kind, test }, text);

// A button that posts an action, disabled while it runs; then() gets the answer.
function actionButton(label, test, kind, run, then) {
  const button = h("button", { type: "button", class: "btn btn-" + kind, test }, label);
  button.addEventListener("click", async () => {
    button.disabled = true;
    try {
      const answer = await run();
      if (answer === undefined) return; // not confirmed
      clearError("action");
      if (then) then(answer);
    } catch (e) {
      showError(e, "action");
    } finally {
      button.disabled = false;
      refresh();
    }
  });
  return button;
}

// ------------------------------------------------------------ routes

const link = {
  queues: () => "#/",
  queue: (name, state, offset) =>
    "#/queue/" + enc(name) + (state ? "?state=" + state + (offset ? "&offset=" + offset : "") : ""),
  job: (name, id) => "#/queue/" + enc(name) + "/job/" + enc(id),
  workers: () => "#/workers",
};

function parseRoute() {
  const [path, query] = (location.hash.replace(/^#/, "") || "/").split("?");
  const params = new URLSearchParams(query || "");
  let parts;
  try {
    parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  } catch (e) {
    return { page: "missing" };
  }
  if (parts.length === 0) return { page: "queues" };
  if (parts[0] === "workers" && parts.length === 1) return { page: "workers" };
  if (parts[0] === "queue" && parts.length === 2) {
    const state = STATES.includes(params.get("state")) ? params.get("state") : "waiting";
    const offset = Math.max(0, parseInt(params.get("offset"), 10) || 0);
    return { page: "queue", name: parts[1], state, offset };
  }
  if (parts[0] === "queue" && parts.length === 4 && parts[2] === "job") {
    return { page: "job", name: parts[1], id: parts[3] };
  }
  return { page: "missing" };
}

function crumbs(route) {
  const items = [h("a", { href: link.queues() }, "Queues")];
  if (route.page === "workers") items.push(h("span", {}, "workers"));
  if (route.name) items.push(h("a", { href: link.queue(route.name), test: "crumb-queue" }, route.name));
  if (route.id) items.push(h("span", {}, "job " + route.id));
  const nav = document.getElementById("crumbs");
  nav.replaceChildren(...items.flatMap((item, i) => (i ? [h("span", { class: "sep" }, "/"), item] : [item])));
}

// ------------------------------------------------------------ charts (SVG)

// The smallest of 1, 2, 5 times a power of ten that is at least v.
function niceMax(v) {
  if (!(v > 0)) return 1;
  const power = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 5, 10]) if (m * power >= v) return m * power;
  return 10 * power;
}

function sparkline(values) {
  const w = 120, hgt = 28, top = Math.max(1, ...values);
  const x = (i) => (i * w) / Math.max(1, values.length - 1);
  const y = (v) => hgt - 2 - (v / top) * (hgt - 4);
  const line = values.map((v, i) => x(i).toFixed(1) + "," + y(v).toFixed(1)).join(" ");
  const total = values.reduce((a, b) => a + b, 0);
  return s("svg", { class: "spark", viewBox: `0 0 ${w} ${hgt}`, width: w, height: hgt, role: "img",
    "aria-label": num(total) + " completed in the last 30 minutes", test: "sparkline" },
    s("title", { text: num(total) + " completed in the last 30 minutes (per minute, oldest first)" }),
    s("polygon", { class: "spark-area", points: `0,${hgt} ${line} ${w},${hgt}` }),
    s("polyline", { class: "spark-line", points: line }));
}

// A line through the points whose value is not null (gaps break it), with
// a dot on each, so that a lone minute shows too.
function gapLine(kind, values, x, y) {
  const group = s("g", { class: "line-" + kind });
  let d = "", pen = false;
  values.forEach((v, i) => {
    if (v == null) { pen = false; return; }
    d += (pen ? "L" : "M") + x(i).toFixed(1) + "," + y(v).toFixed(1);
    pen = true;
    group.append(s("circle", { cx: x(i).toFixed(1), cy: y(v).toFixed(1), r: 2.5 }));
  });
  group.prepend(s("path", { d }));
  return group;
}

// How wide a chart label is drawn (.tick: 11 units of the page's font), so
// that the axes make room for their widest label: measured, not guessed.
let measureCtx = null;
function labelWidth(text) {
  if (!measureCtx) {
    measureCtx = document.createElement("canvas").getContext("2d");
    measureCtx.font = "11px " + getComputedStyle(document.body).fontFamily;
  }
  return Math.ceil(measureCtx.measureText(text).width * 1.05) + 1; // (a margin for the font's hinting)
}

// The last hour per minute: completed and failed as stacked bars (left
// axis, jobs), p50 and p99 run time as lines (right axis, ms). Each side's
// margin is its title's band (the title turned on its side: 12 units
// across, 4 from the edge), a gap and its widest tick label, so that no
// label meets another however many digits they have.
function hourChart(minutes) {
  const W = 860, H = 240, T = 14, B = 40, TITLE = 16, GAP = 6;
  const jobsTop = niceMax(Math.max(0, ...minutes.map((m) => (m.completed || 0) + (m.failed || 0))));
  const msTop = niceMax(Math.max(0, ...minutes.map((m) => m.p99_ms || m.p50_ms || 0)));
  const fractions = [0, 0.5, 1];
  const jobTicks = fractions.map((f) => num(jobsTop * f)), msTicks = fractions.map((f) => duration(msTop * f));
  const L = Math.max(56, TITLE + 2 * GAP + Math.max(...jobTicks.map(labelWidth)));
  const R = Math.max(64, TITLE + 2 * GAP + Math.max(...msTicks.map(labelWidth)));
  const iw = W - L - R, ih = H - T - B, n = Math.max(1, minutes.length), step = iw / n;
  const yJobs = (v) => T + ih - (v / jobsTop) * ih;
  const yMs = (v) => T + ih - (v / msTop) * ih;
  const xMid = (i) => L + step * (i + 0.5);
  const svg = s("svg", { class: "chart", viewBox: `0 0 ${W} ${H}`, role: "img", test: "chart",
    "aria-label": "the last hour per minute: completed and failed jobs, p50 and p99 run time" });
  fractions.forEach((f, k) => {
    const y = T + ih - f * ih;
    svg.append(s("line", { class: "grid", x1: L, x2: L + iw, y1: y, y2: y }),
      s("text", { class: "tick", x: L - GAP, y: y + 4, "text-anchor": "end", text: jobTicks[k] }),
      s("text", { class: "tick tick-ms", x: L + iw + GAP, y: y + 4, text: msTicks[k] }));
  });
  minutes.forEach((m, i) => {
    const done = m.completed || 0, failed = m.failed || 0, x = L + step * i + 1, w = Math.max(1, step - 2);
    const tip = `${clock(m.at)}: ${num(done)} completed, ${num(failed)} failed` +
      (m.p50_ms != null ? `, p50 ${percentile(m, "p50")}, p99 ${percentile(m, "p99")}` : "");
    svg.append(s("g", { class: "minute" }, s("title", { text: tip }),
      s("rect", { class: "hit", x: L + step * i, y: T, width: step, height: ih }),
      s("rect", { class: "bar-completed", x, y: yJobs(done), width: w, height: yJobs(0) - yJobs(done) }),
      s("rect", { class: "bar-failed", x, y: yJobs(done + failed), width: w, height: yJobs(done) - yJobs(done + failed) })));
    if (i % 10 === 0 || i === minutes.length - 1) { // (kept within the plot: clear of the side ticks below)
      const half = labelWidth(clock(m.at)) / 2, x = Math.min(Math.max(xMid(i), L + half), L + iw - half);
      svg.append(s("text", { class: "tick", x, y: T + ih + 16, "text-anchor": "middle", text: clock(m.at) }));
    }
  });
  // (a title turned -90 reaches from its baseline 9 units left and 3 right; one turned 90, the other way)
  const left = 4 + 9, right = W - 4 - 9, mid = T + ih / 2;
  svg.append(gapLine("p50", minutes.map((m) => m.p50_ms), xMid, yMs),
    gapLine("p99", minutes.map((m) => m.p99_ms), xMid, yMs),
    s("line", { class: "axis", x1: L, x2: L + iw, y1: T + ih, y2: T + ih }),
    s("text", { class: "axis-title", x: left, y: mid, transform: `rotate(-90 ${left} ${mid})`,
      "text-anchor": "middle", text: "jobs per minute" }),
    s("text", { class: "axis-title", x: right, y: mid, transform: `rotate(90 ${right} ${mid})`,
      "text-anchor": "middle", text: "run time" }),
    s("text", { class: "axis-title", x: L + iw / 2, y: H - 4, "text-anchor": "middle", text: "time (per minute)" }));
  return svg;
}

function legend() {
  const key = (kind, label) => h("span", { class: "key" }, h("i", { class: "swatch swatch-" + kind }), label);
  return h("div", { class: "legend" }, key("completed", "completed"), key("failed", "failed"),
    key("p50", "p50 run time"), key("p99", "p99 run time"));
}

// ------------------------------------------------------------ #/ the queues

const queuesPage = {
  load: () => api("GET", "queues"),
  render(route, data) {
    const queues = data.queues || [];
    const body = queues.map((q) =>
      h("tr", { test: "queue-row", "data-queue": q.name },
        h("td", {}, h("a", { href: link.queue(q.name), class: "queue-name", test: "queue-link" }, q.name),
          q.paused ? badge("paused", "paused", "paused-badge") : null,
          q.error ? h("div", { class: "err small", test: "queue-error" }, // its counts could not be read
            `${q.error.code || "ERROR"}: ${q.error.message || ""}`) : null),
        h("td", { class: "n" }, num(q.waiting), q.waiting_children ? h("a", { class: "muted small",
          href: link.queue(q.name, "waiting-children"), test: "waiting-children-count" },
          ` (${num(q.waiting_children)} waiting for children)`) : null),
        h("td", { class: "n" }, num(q.delayed)),
        h("td", { class: "n" }, num(q.active), runningHeld(q)),
        h("td", { class: "n" }, num(q.completed)),
        h("td", { class: "n" + (q.failed ? " bad" : "") },
          q.failed ? h("a", { href: link.queue(q.name, "failed") }, num(q.failed)) : num(q.failed)),
        h("td", { class: "spark-cell" }, sparkline(q.spark || []))));
    const sum = (key) => queues.reduce((a, q) => a + (q[key] || 0), 0);
    return h("section", {},
      h("div", { class: "title" }, h("h1", {}, "Queues"),
        h("span", { class: "muted", test: "queues-summary" }, `${num(queues.length)} on this server · ` +
          `${num(sum("waiting"))} waiting · ${num(sum("active"))} active · ${num(sum("failed"))} failed`)),
      queues.length === 0
        ? h("p", { class: "empty" }, "No queue on this Redis server yet: add a job (moonjob add) and its queue shows here.")
        : h("table", { class: "data", test: "queues" },
          h("thead", {}, h("tr", {}, ["Queue", "Waiting", "Delayed", "Active", "Completed", "Failed", "Last 30 min"]
            .map((t, i) => h("th", { class: i && i < 6 ? "n" : null }, t)))),
          h("tbody", {}, body)));
  },
};

// ------------------------------------------------------------ #/queue/NAME

const DETAIL = {
  waiting: { time: "Created", at: (j) => j.created },
  delayed: { time: "Runs at", at: (j) => j.run_at },
  active: { time: "Started", at: (j) => j.started || j.created },
  completed: { time: "Finished", at: (j) => j.finished },
  failed: { time: "Failed at", at: (j) => j.finished },
  "waiting-children": { time: "Created", at: (j) => j.created },
};

// A state's name on a tab: "Waiting children".
const stateLabel = (state) => state[0].toUpperCase() + state.slice(1).replace("-", " ");
// Its count in a queue's counts (the API's names have "_").
const stateCount = (counts, state) => counts[state.replace("-", "_")];

// Of the active jobs: how many a worker's child runs, how many are held
// (fetched, not yet handed to a child), and those of a lapsed worker
// (recovered when their lease ends); nothing while none is active.
function runningHeld(c) {
  if (!c.active) return null;
  const lapsed = c.lapsed ? `, ${num(c.lapsed)} of a lapsed worker` : "";
  return h("span", { class: "muted small", test: "running-held" },
    ` (${num(c.running != null ? c.running : c.active - c.held)} running, ${num(c.held)} held${lapsed})`);
}

// The last column: the error, the result, or the data.
function jobSummary(job) {
  if (job.error) {
    return h("span", { class: "err" }, h("code", { class: "code", test: "error-code" }, job.error.code || "ERROR"),
      " ", preview(job.error.message || ""));
  }
  if (job.error_preview != null) return h("span", { class: "err" }, preview(job.error_preview));
  if (job.state === "completed") return h("code", { class: "preview" }, preview(job.result, job.result_preview));
  if (job.state === "active") {
    return h("span", {}, job.running ? badge("running", "running") : badge("held", "held"),
      job.progress != null ? " progress " + preview(job.progress, job.progress_preview, 40) : "");
  }
  return h("code", { class: "preview" }, preview(job.data, job.data_preview));
}

function jobTable(route, jobs) {
  const detail = DETAIL[route.state];
  const rows = jobs.map((job) =>
    h("tr", { test: "job-row", "data-id": job.id },
      h("td", {}, h("a", { href: link.job(route.name, job.id), class: "job-id", test: "job-link" }, job.id)),
      h("td", {}, job.name || ""),
      h("td", { class: "n" }, num(job.attempts) + (job.max_attempts ? " / " + num(job.max_attempts) : "")),
      h("td", {}, localTime(detail.at(job))),
      h("td", { class: "n" }, duration(job.ms)),
      h("td", { class: "summary" }, jobSummary(job))));
  return h("table", { class: "data jobs", test: "jobs" },
    h("thead", {}, h("tr", {}, ["ID", "Name", "Attempts", detail.time, "Run time",
      route.state === "failed" ? "Error" : route.state === "completed" ? "Result" : route.state === "active" ? "Running" : "Data"]
      .map((t) => h("th", { class: t === "Attempts" || t === "Run time" ? "n" : null }, t)))),
    h("tbody", {}, rows));
}

// The queue's limits and its groups', kept in Redis (q:set_rate,
// q:set_concurrency, q:set_group_rate, q:set_group_concurrency); nothing
// when it has none.
function limitsNote(limits) {
  if (!limits) return null;
  const parts = [];
  if (limits.rate) parts.push(`at most ${num(limits.rate.max)} jobs per ${limits.rate.per} s (${num(limits.started)} now)`);
  if (limits.concurrency) parts.push(`at most ${num(limits.concurrency)} at once`);
  const each = [];
  if (limits.group_rate) each.push(`${num(limits.group_rate.max)} jobs per ${limits.group_rate.per} s`);
  if (limits.group_concurrency) each.push(`${num(limits.group_concurrency)} at once`);
  if (each.length) parts.push("each group at most " + each.join(", "));
  if (limits.held_back > 0) parts.push(`held back ${limits.held_back.toFixed(1)} s after ERATELIMIT`);
  return parts.length ? h("p", { class: "note", test: "limits" }, "Limits: " + parts.join(" · ")) : null;
}

function zone(minutes) {
  if (!minutes) return "UTC";
  const m = Math.abs(minutes);
  return (minutes < 0 ? "-" : "+") + String(Math.floor(m / 60)).padStart(2, "0") + ":" + String(m % 60).padStart(2, "0");
}

function schedulesCard(schedules) {
  if (!schedules || !schedules.total) return null;
  const rows = schedules.list.map((sc) => h("tr", { test: "schedule-row", "data-id": sc.id },
    h("td", {}, sc.id),
    h("td", {}, sc.cron ? h("code", {}, sc.cron) : `every ${sc.every} s`, sc.cron ? " " + zone(sc.tz_offset) : ""),
    h("td", {}, sc.ended ? badge("ended", "paused") : localTime(sc.next)),
    h("td", {}, localTime(sc.last)),
    h("td", { class: "n" }, num(sc.runs) + (sc.limit ? " / " + num(sc.limit) : "")),
    h("td", { class: "summary" }, sc.note || "")));
  return h("div", { class: "card" },
    h("div", { class: "card-head" }, h("h2", {}, "Schedules"),
      h("span", { class: "muted" }, schedules.total > schedules.list.length
        ? `the first ${num(schedules.list.length)} of ${num(schedules.total)}` : num(schedules.total))),
    h("table", { class: "data", test: "schedules" },
      h("thead", {}, h("tr", {}, ["ID", "When", "Next", "Last", "Runs", "Note"]
        .map((t) => h("th", { class: t === "Runs" ? "n" : null }, t)))),
      h("tbody", {}, rows)));
}

// Why a group with waiting jobs takes none now (q:groups' states).
const HELD_WHY = { held: "held by ERATELIMIT", at_cap: "at its cap", rate: "rate window full" };

// The groups held back (the first 50 the API gives); nothing when none is.
function groupsCard(groups) {
  if (!groups || !groups.held_back) return null;
  const rows = groups.held.map((g) => h("tr", { test: "group-row", "data-group": g.group },
    h("td", {}, g.group),
    h("td", { test: "group-why" }, HELD_WHY[g.state] || g.state),
    h("td", { class: "n" }, g.state === "at_cap" ? "–" : g.seconds.toFixed(1) + " s"),
    h("td", { class: "n" }, num(g.waiting)),
    h("td", { class: "n" }, num(g.active))));
  const shown = groups.held_back > groups.held.length ? ` · the first ${num(groups.held.length)} shown` : "";
  return h("div", { class: "card", test: "held-groups" },
    h("div", { class: "card-head" }, h("h2", {}, "Held-back groups"),
      h("span", { class: "muted", test: "held-groups-count" },
        `${num(groups.held_back)} of ${num(groups.held_back + groups.ready)} groups with waiting jobs${shown}`)),
    h("table", { class: "data", test: "groups" },
      h("thead", {}, h("tr", {}, ["Group", "Why", "Time left", "Waiting", "Active"]
        .map((t, i) => h("th", { class: i >= 2 ? "n" : null }, t)))),
      h("tbody", {}, rows)));
}

function pager(route, total) {
  const first = route.offset + 1, last = Math.min(route.offset + PAGE_SIZE, total);
  const info = total === 0 ? "none" : `${num(first)}–${num(last)} of ${num(total)}`;
  const go = (offset, label, test, enabled) => enabled
    ? h("a", { class: "btn btn-plain", href: link.queue(route.name, route.state, offset), test }, label)
    : h("span", { class: "btn btn-plain disabled", test }, label);
  return h("div", { class: "pager" },
    go(Math.max(0, route.offset - PAGE_SIZE), "‹ Prev", "page-prev", route.offset > 0),
    h("span", { class: "page-info", test: "page-info" }, info),
    go(route.offset + PAGE_SIZE, "Next ›", "page-next", route.offset + PAGE_SIZE < total));
}

// ------------------------------------------------------------ limits, removal

// The limits dialog (index.html, outside <main>: polls do not redraw it)
// for queue `name`, filled with its limits now; Save posts all four (an
// empty field lifts that limit).
const limitFields = {
  rate: ["limit-rate-max", "limit-rate-per"], concurrency: ["limit-concurrency"],
  group_rate: ["limit-group-rate-max", "limit-group-rate-per"], group_concurrency: ["limit-group-concurrency"],
};
let limitsQueue = null;

function openLimits(name, limits) {
  limitsQueue = name;
  const set = (id, v) => { document.getElementById(id).value = v == null ? "" : String(v); };
  for (const [kind, ids] of Object.entries(limitFields)) {
    const v = (limits || {})[kind];
    if (ids.length === 2) { set(ids[0], v && v.max); set(ids[1], v && v.per); } else set(ids[0], v);
  }
  document.getElementById("limits-queue").textContent = name;
  document.getElementById("limits-dialog").showModal();
}

// The dialog's fields as the API's body; throws an ApiError for a rate
// with only one of its two numbers.
function limitsBody() {
  const read = (id) => document.getElementById(id).value.trim();
  const body = {};
  for (const [kind, ids] of Object.entries(limitFields)) {
    const v = ids.map(read);
    if (ids.length === 1) { body[kind] = v[0] === "" ? null : Number(v[0]); continue; }
    if ((v[0] === "") !== (v[1] === "")) {
      throw new ApiError(0, "EINPUT", `${kind.replace("_", " ")}: give both numbers (jobs, and seconds), or neither`);
    }
    body[kind] = v[0] === "" ? null : { max: Number(v[0]), per: Number(v[1]) };
  }
  return body;
}

async function saveLimits() {
  const save = document.getElementById("limits-save");
  save.disabled = true;
  try {
    await api("POST", queuePath(limitsQueue) + "/limits", limitsBody());
    document.getElementById("limits-dialog").close();
    clearError("action");
    showError({ message: `limits of ${limitsQueue} saved` }, "info");
  } catch (e) {
    showError(e, "action");
  } finally {
    save.disabled = false;
    refresh();
  }
}

document.getElementById("limits-save").addEventListener("click", saveLimits);
document.getElementById("limits-cancel").addEventListener("click", () => document.getElementById("limits-dialog").close());

// Remove queue: confirmed first; while jobs run (EBUSY) asked again, and
// then forced. Back to the queues once it is gone.
async function obliterate(name) {
  if (!confirm(`Remove queue ${name} and every job in it, for good? It cannot be brought back.`)) return undefined;
  const post = (force) => api("POST", queuePath(name) + "/obliterate", { force });
  let answer;
  try {
    answer = await post(false);
  } catch (e) {
    if (e.code !== "EBUSY") throw e;
    if (!confirm(`${e.message}.\nRemove ${name} anyway? Its workers stop the running jobs.`)) return undefined;
    answer = await post(true);
  }
  location.hash = link.queues();
  return answer;
}

function queueActions(name, counts, limits) {
  const post = (what, body) => () => api("POST", queuePath(name) + "/" + what, body);
  const told = (verb) => (answer) => answer.count != null && showError({ message: `${verb} ${num(answer.count)} jobs` }, "info");
  return h("div", { class: "actions" },
    h("button", { type: "button", class: "btn btn-plain", test: "edit-limits", onclick: () => openLimits(name, limits) },
      "Limits…"),
    counts.paused
      ? actionButton("Resume", "resume", "primary", post("resume"))
      : actionButton("Pause", "pause", "plain", post("pause")),
    actionButton("Retry all failed", "retry-all", "plain", post("retry-all", { state: "failed" }), told("retried")),
    actionButton("Clean completed > 1 h", "clean", "danger", () =>
      confirm(`Remove the completed jobs of ${name} that finished more than an hour ago?`)
        ? post("clean", { state: "completed", older_than: 3600 })() : undefined, told("removed")),
    actionButton("Remove queue", "obliterate", "danger", () => obliterate(name),
      (answer) => showError({ message: `queue ${name} removed, with ${num(answer.count)} jobs` }, "info")));
}

const queuePage = {
  async load(route) {
    const [overview, page] = await Promise.all([
      api("GET", queuePath(route.name)),
      api("GET", `${queuePath(route.name)}/jobs?state=${route.state}&offset=${route.offset}&limit=${PAGE_SIZE}`)
        .catch((e) => {
          if (e.code !== "ERANGE" || route.offset === 0) throw e;
          location.replace(link.queue(route.name, route.state)); // the page emptied: back to the first
          return { total: 0, jobs: [] };
        }),
    ]);
    return { overview, page };
  },
  render(route, { overview, page }) {
    const c = overview.counts, total = overview.metrics.total || {};
    const tabs = STATES.map((state) => h("a", {
      href: link.queue(route.name, state), test: "state-tab-" + state,
      class: "tab" + (state === route.state ? " current" : "") + (state === "failed" && c.failed ? " tab-bad" : ""),
    }, stateLabel(state), " ", h("span", { class: "count" }, num(stateCount(c, state))),
      state === "active" ? runningHeld(c) : null));
    return h("section", {},
      h("div", { class: "title" },
        h("h1", {}, overview.name),
        c.paused ? badge("paused", "paused", "queue-status") : badge("running", "ok", "queue-status"),
        queueActions(route.name, c, overview.limits)),
      c.missing ? h("p", { class: "note" }, `${num(c.missing)} jobs are gone from Redis (evicted or deleted by hand).`) : null,
      limitsNote(overview.limits),
      c.completed_ever != null ? h("p", { class: "muted small", test: "ever-counts" },
        `ever: ${num(c.completed_ever)} completed · ${num(c.failed_ever)} failed (the tabs count the jobs kept now)` +
        ` · ${num(c.workers)} live worker${c.workers === 1 ? "" : "s"}`) : null,
      h("div", { class: "card" },
        h("div", { class: "card-head" }, h("h2", {}, "Last hour"),
          h("span", { class: "muted" }, `${num(total.completed || 0)} completed · ${num(total.failed || 0)} failed` +
            (total.p50_ms != null ? ` · p50 ${percentile(total, "p50")} · p99 ${percentile(total, "p99")}` : ""))),
        hourChart(overview.metrics.minutes || []), legend()),
      groupsCard(overview.groups),
      schedulesCard(overview.schedules),
      h("nav", { class: "tabs", test: "state-tabs" }, tabs),
      page.jobs.length ? jobTable(route, page.jobs) : h("p", { class: "empty", test: "no-jobs" }, `No ${route.state} jobs.`),
      pager(route, page.total));
  },
};

// ------------------------------------------------------------ #/queue/NAME/job/ID

// What removing the job does besides: a flow's parent cancels its pending
// children; a child its parent waits for is removed with cascade (the
// parent counts it as canceled: by default it fails).
function removeNote(job) {
  const pending = (job.children || []).filter((c) => !ENDED.includes(c.state)).length;
  if (job.state === "waiting-children" && pending) return ` Its ${num(pending)} pending children are canceled.`;
  if (job.parent && job.parent.state === "waiting-children" && !ENDED.includes(job.state)) {
    return ` Its parent ${job.parent.id} waits for it: it counts it as canceled (by default it then fails).`;
  }
  return "";
}

function jobActions(route, job) {
  const post = (what, body) => () => api("POST", jobPath(route.name, job.id) + "/" + what, body);
  const buttons = [];
  if (job.state === "failed" || job.state === "completed") buttons.push(actionButton("Retry", "retry", "primary", post("retry")));
  if (job.state === "delayed") buttons.push(actionButton("Promote", "promote", "primary", post("promote")));
  if (["waiting", "delayed", "active", "waiting-children"].includes(job.state) && !job.cancel) {
    buttons.push(actionButton("Cancel", "cancel", "plain", post("cancel")));
  }
  if (job.state !== "active") {
    const note = removeNote(job);
    buttons.push(actionButton("Remove", "remove", "danger",
      () => (confirm(`Remove job ${job.id}?${note} It cannot be brought back.`)
        ? post("remove", job.parent ? { cascade: true } : undefined)() : undefined),
      () => { location.hash = link.queue(route.name, job.state); }));
  }
  return h("div", { class: "actions" }, buttons);
}

function facts(pairs) {
  return h("dl", { class: "facts" }, pairs.filter(([, v]) => v != null && v !== "")
    .map(([label, value, test]) => [h("dt", {}, label), h("dd", { test }, value)]));
}

function progressView(progress) {
  if (progress == null) return null;
  if (typeof progress === "number" && progress >= 0 && progress <= 100) {
    return h("span", { class: "progress" }, h("progress", { max: 100, value: progress }), ` ${num(progress)} %`);
  }
  return h("code", {}, preview(progress, null, 200));
}

function errorSection(error) {
  const rest = Object.entries(error).filter(([k]) => !["code", "message", "traceback"].includes(k));
  return h("section", { class: "card card-error", test: "job-error" },
    h("h2", {}, "Error"),
    h("p", {}, h("code", { class: "code", test: "error-code" }, error.code || "ERROR"), " ",
      h("span", { test: "error-message" }, error.message || "")),
    rest.length ? facts(rest.map(([k, v]) => [k, typeof v === "string" ? v : JSON.stringify(v)])) : null,
    error.traceback ? h("pre", { class: "traceback", test: "traceback" }, String(error.traceback)) : null);
}

// A flow's child's end in short: its error, its result, or nothing yet.
function childOutcome(child) {
  if (child.error) {
    return h("span", { class: "err" }, h("code", { class: "code", test: "error-code" }, child.error.code || "ERROR"),
      " ", preview(child.error.message || ""));
  }
  return child.result !== undefined ? h("code", { class: "preview" }, preview(child.result)) : "";
}

// A flow's parent's children, in the flow's order, each linked to its page
// (a child on another queue of the tag: that queue's); a child's own
// children are on its page.
function childrenCard(children) {
  if (!children || !children.length) return null;
  const ended = children.filter((c) => ENDED.includes(c.state)).length;
  const rows = children.map((c) => h("tr", { test: "child-row", "data-id": c.id, "data-queue": c.queue },
    h("td", {}, h("a", { href: link.job(c.queue, c.id), class: "job-id", test: "child-link" }, c.id)),
    h("td", {}, h("a", { href: link.queue(c.queue), test: "child-queue" }, c.queue)),
    h("td", {}, badge(c.state, c.state, "child-state")),
    h("td", { class: "summary" }, childOutcome(c))));
  return h("section", { class: "card", test: "job-children" },
    h("div", { class: "card-head" }, h("h2", {}, "Children"),
      h("span", { class: "muted", test: "children-count" }, `${num(ended)} of ${num(children.length)} ended`)),
    h("table", { class: "data", test: "children" },
      h("thead", {}, h("tr", {}, ["ID", "Queue", "State", "Result or error"].map((t) => h("th", {}, t)))),
      h("tbody", {}, rows)));
}

// A flow's child's parent: linked, with its queue when another, and its state.
function parentLink(route, parent) {
  if (!parent) return null;
  return h("a", { href: link.job(parent.queue, parent.id), test: "parent-link" }, parent.id,
    parent.queue !== route.name ? " in " + parent.queue : "", parent.state ? ` (${parent.state})` : "");
}

const jobPage = {
  load: (route) => api("GET", jobPath(route.name, route.id)),
  render(route, job) {
    const state = job.running ? "running" : job.state;
    const log = job.log || [];
    return h("section", {},
      h("div", { class: "title" }, h("h1", {}, "Job ", h("span", { class: "job-id" }, job.id)),
        badge(state, job.state, "job-state"), jobActions(route, job)),
      h("div", { class: "card" }, facts([
        ["Queue", h("a", { href: link.queue(route.name, job.state) }, route.name)],
        ["Parent", parentLink(route, job.parent), "parent"],
        ["Name", job.name],
        ["State", state + (job.cancel ? " (cancel asked: " + job.cancel + ")" : "")],
        ["Attempts", num(job.attempts) + " of " + num(job.max_attempts), "attempts"],
        ["Priority", job.priority ? num(job.priority) : null],
        ["Created", localTime(job.created)],
        ["Runs at", job.state === "delayed" ? localTime(job.run_at) : null],
        ["Started", job.started ? localTime(job.started) : null],
        ["Finished", job.finished ? localTime(job.finished) : null],
        ["Run time", job.ms != null ? duration(job.ms) : null, "run-time"],
        ["Worker", job.worker, "worker"],
        ["Progress", progressView(job.progress), "progress"],
      ])),
      job.error ? errorSection(job.error) : null,
      childrenCard(job.children),
      job.result !== undefined || job.result_preview != null ? h("section", { class: "card" }, h("h2", {}, "Result"),
        h("pre", { test: "job-result" }, job.result !== undefined ? pretty(job.result) : job.result_preview)) : null,
      h("section", { class: "card" }, h("h2", {}, "Data"),
        h("pre", { test: "job-data" }, job.data !== undefined ? pretty(job.data) : job.data_preview || "")),
      h("section", { class: "card" }, h("h2", {}, `Log (${num(log.length)} lines)`),
        log.length ? h("ol", { class: "log", test: "job-log" }, log.map((line) => h("li", {}, String(line))))
          : h("p", { class: "muted" }, "Nothing logged (job:log() in the processor).")));
  },
};

const missingPage = {
  load: async () => ({}),
  render: () => h("section", {}, h("h1", {}, "No such page"), h("p", {}, h("a", { href: "#/" }, "See the queues"))),
};

// ------------------------------------------------------------ #/workers

// "0.4 s ago", "12 s ago"
const ago = (s) => (s < 10 ? s.toFixed(1) : String(Math.round(s))) + " s ago";

// The jobs a worker runs: "id (3.2 s)", each linked to its job, the first 5.
function workerJobs(w) {
  const shown = w.jobs.slice(0, 5).map((j, i) => [i ? ", " : "", h("a", { href: link.job(w.queue, j.id) }, j.id),
    h("span", { class: "muted" }, ` (${duration(Math.max(0, w.seen - j.since) + w.ago * 1000)})`)]).flat();
  if (w.jobs.length > 5) shown.push(h("span", { class: "muted" }, ` and ${num(w.jobs.length - 5)} more`));
  return shown;
}

const workersPage = {
  load: () => api("GET", "workers"),
  render(route, data) {
    const workers = data.workers || [];
    const live = workers.filter((w) => !w.lapsed).length;
    const rows = workers.map((w) => h("tr", { test: "worker-row", "data-worker": w.id, "data-queue": w.queue },
      h("td", {}, h("a", { href: link.queue(w.queue) }, w.queue)),
      h("td", {}, h("code", {}, w.id)),
      h("td", {}, `${w.host || "?"} · pid ${w.pid}`),
      h("td", { class: "n", test: "worker-children" }, num(w.children)),
      h("td", { class: "n", test: "worker-running" }, num(w.running)),
      h("td", { test: "worker-jobs" }, ...workerJobs(w)),
      h("td", {}, localTime(w.started)),
      h("td", { test: "worker-seen" }, ago(w.ago), w.lapsed ? [" ", badge("lapsed", "failed", "worker-lapsed")] : null)));
    return h("section", {},
      h("div", { class: "title" }, h("h1", {}, "Workers"),
        h("span", { class: "muted", test: "workers-summary" }, `${num(live)} live · ${num(workers.length - live)} lapsed`)),
      workers.length === 0
        ? h("p", { class: "empty", test: "no-workers" }, "No worker has a heartbeat on this server's queues (moonjob worker starts one).")
        : h("table", { class: "data", test: "workers" },
          h("thead", {}, h("tr", {}, ["Queue", "Worker", "Host", "Children", "Running", "Jobs running", "Started", "Last seen"]
            .map((t, i) => h("th", { class: i === 3 || i === 4 ? "n" : null }, t)))),
          h("tbody", {}, rows)),
      h("p", { class: "muted small" }, "A worker that stops cleanly leaves the list; one gone without a word is " +
        "marked lapsed after 3 missed heartbeats and dropped after 30."));
  },
};

const PAGES = { queues: queuesPage, queue: queuePage, job: jobPage, workers: workersPage, missing: missingPage };

// ------------------------------------------------------------ polling

let generation = 0; // bumped on each route change: an older answer is dropped
let timer = null;
let shown = null; // the JSON text of what is drawn, to skip redrawing the same

function schedule() {
  clearTimeout(timer);
  timer = document.hidden ? null : setTimeout(refresh, POLL_MS);
}

async function refresh() {
  clearTimeout(timer);
  const mine = generation, route = parseRoute(), page = PAGES[route.page];
  try {
    const data = await page.load(route);
    if (mine !== generation) return;
    const text = JSON.stringify(data);
    if (text !== shown) {
      shown = text;
      document.getElementById("main").replaceChildren(page.render(route, data));
    }
    clearError("poll");
    document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (e) {
    if (mine !== generation) return;
    showError(e, "poll");
    if (shown === null) { // nothing of this route drawn yet: say why not
      document.getElementById("main").replaceChildren(h("p", { class: "empty", test: "page-error" },
        "This page cannot be shown: " + e.message));
    }
  }
  schedule();
}

function routeChanged() {
  generation += 1;
  shown = null;
  const route = parseRoute();
  crumbs(route);
  document.getElementById("main").replaceChildren(h("p", { class: "muted" }, "Loading…"));
  document.title = route.id ? `job ${route.id} · ${route.name} · moonjob` : route.name ? `${route.name} · moonjob`
    : route.page === "workers" ? "workers · moonjob" : "moonjob";
  refresh();
}

document.getElementById("banner-close").addEventListener("click", () => clearError());
document.addEventListener("visibilitychange", () => (document.hidden ? clearTimeout(timer) : refresh()));
window.addEventListener("hashchange", routeChanged);
routeChanged();
