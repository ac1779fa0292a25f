// spec/browser/dashboard.js -- drives Debian's chromium (headless, through
// puppeteer-core, which downloads no browser) through a running moonjob
// dashboard, as a person would. spec/browser/dashboard_spec.lua sets up the
// queue and runs it:
//
//   node spec/browser/dashboard.js URL QUEUE FAILED_ID ERROR_CODE [PAGED_QUEUE TOTAL]
//   node spec/browser/dashboard.js --token URL TOKEN QUEUE
//   node spec/browser/dashboard.js --groups URL QUEUE
//   node spec/browser/dashboard.js --unreachable URL SECRET...
//   node spec/browser/dashboard.js --flow URL QUEUE
//   node spec/browser/dashboard.js --workers URL QUEUE PID JOB FAILED_QUEUE
//   node spec/browser/dashboard.js --chart URL QUEUE
//   node spec/browser/dashboard.js --limits URL QUEUE OTHER [TOKEN]
//
// URL is the dashboard's address; QUEUE has one worker process, and its job
// FAILED_ID failed with ERROR_CODE but passes when run again; PAGED_QUEUE
// holds TOTAL waiting jobs (over 1,000), paged through. With --token,
// the dashboard has TOKEN: the page without it says EAUTH; opened once with
// ?token=TOKEN it shows QUEUE, and still does after a reload without it
// (the tab keeps it); and it asks the server nothing while its tab is
// hidden. With --groups, QUEUE has each group's cap at 1 and rate at 5 per
// 2 s, group A at its cap, group B held back by ERATELIMIT and group C
// ready (spec/support/held_groups.lua, cap_and_hold): the queue's page must
// show the group limits in its limits note and a "Held-back groups" card
// with A and B, each with why. With --unreachable, the dashboard's Redis
// is down: the queues page and a queue's page must say "Redis is
// unreachable" in the banner, and no SECRET (the Redis URL's user, host,
// port...) anywhere in the page, its text or its markup. With --flow,
// QUEUE holds a flow's parent "page" waiting for its children: img1
// (completed) and img2 (failed EBAD) on the queue {QUEUE}/images, txt
// waiting on QUEUE: its tab counts it, its page lists the children, and a
// child's link opens it on its own queue, linked back to its parent. With
// --chart, QUEUE ended 10,000 jobs or more in a minute of the last hour:
// the chart's tick labels have 5 digits, and no two of its labels' boxes
// (the axis titles too) meet. With --workers, QUEUE has one `moonjob
// worker` (process PID) running job JOB, and FAILED_QUEUE two failed jobs
// and no worker: the Workers page must list the worker with its pid and
// JOB; FAILED_QUEUE's Failed tab counts 2, and after "Retry all failed"
// counts 0 above "No failed jobs", the jobs that ever failed said apart.
// With --limits, QUEUE has no limits: the Limits dialog sets a rate of 50
// per 2 s and a concurrency of 7 (the spec reads them back from Redis),
// then the queue OTHER is removed from its page (the first confirmation
// dismissed: it stays; then confirmed: gone from the queues page). POSTs
// without the X-Moonjob-Token header (and, given TOKEN, with a wrong one)
// are refused and change nothing.
// Environment:
//   MOONJOB_ADD_JOB       a shell command that adds one job to QUEUE and
//                         prints its id (the job added while paused)
//   MOONJOB_SCREENSHOTS   a directory: the three pages saved there as PNG
//                         (dashboard-queues.png, -queue.png, -job.png;
//                         with --groups: dashboard-groups.png; --chart:
//                         dashboard-chart.png)
//   CHROMIUM              the browser (default /usr/bin/chromium)
//
// Prints "ok: ..." for each expectation met; at the first one not met,
// "FAILED: ..." with what the page showed, and exits 1. The whole run is
// bounded (RUN_LIMIT_MS), so it never hangs a test run.
"use strict";

const { execSync } = require("child_process");
const path = require("path");
const puppeteer = require("puppeteer-core");

const WAIT_MS = 20000; // for anything the page should show: only catches hangs
const RUN_LIMIT_MS = 150000;
const PAUSED_WATCH_MS = 3000; // how long a job added while paused must stay waiting

const tokenMode = process.argv[2] === "--token";
const groupsMode = process.argv[2] === "--groups";
const unreachableMode = process.argv[2] === "--unreachable";
const flowMode = process.argv[2] === "--flow";
const workersMode = process.argv[2] === "--workers";
const chartMode = process.argv[2] === "--chart";
const limitsMode = process.argv[2] === "--limits";
const [otherQueue, limitsToken] = limitsMode ? process.argv.slice(5) : [];
const secrets = unreachableMode ? process.argv.slice(4) : [];
const [url, queue, failedId, errorCode] = tokenMode ? [process.argv[3], process.argv[5], "-", "-"]
  : groupsMode || flowMode || workersMode || chartMode || limitsMode ? [process.argv[3], process.argv[4], "-", "-"]
  : unreachableMode ? [process.argv[3], "orders", "-", "-"] : process.argv.slice(2);
const token = tokenMode ? process.argv[4] : "";
const [pagedQueue, pagedTotal] = tokenMode || workersMode || limitsMode ? [] : [process.argv[6], Number(process.argv[7])];
const [workerPid, runningJob, failedQueue] = workersMode ? process.argv.slice(5, 8) : [];
if (!url || !queue || !failedId || !errorCode || (tokenMode && !token)) {
  console.error("usage: node spec/browser/dashboard.js URL QUEUE FAILED_ID ERROR_CODE\n" +
    "       node spec/browser/dashboard.js --token URL TOKEN QUEUE\n" +
    "       node spec/browser/dashboard.js --groups URL QUEUE\n" +
    "       node spec/browser/dashboard.js --unreachable URL SECRET...\n" +
    "       node spec/browser/dashboard.js --flow URL QUEUE\n" +
    "       node spec/browser/dashboard.js --workers URL QUEUE PID JOB FAILED_QUEUE\n" +
    "       node spec/browser/dashboard.js --chart URL QUEUE\n" +
    "       node spec/browser/dashboard.js --limits URL QUEUE OTHER [TOKEN]");
  process.exit(2);
}

const ok = (what) => console.log("ok: " + what);
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const css = (s) => JSON.stringify(String(s)); // a value inside [attr=...]

// What the page shows now, for a failure's message.
async function pageSummary(page) {
  try {
    return await page.evaluate(() => {
      const banner = document.getElementById("banner");
      const main = document.getElementById("main");
      const said = banner && !banner.hidden ? "banner: " + banner.textContent.trim() + "; " : "";
      return `${said}at ${location.hash || "#/"}: ` + (main ? main.innerText.replace(/\s+/g, " ").slice(0, 600) : "");
    });
  } catch (e) {
    return "(the page cannot be read: " + e.message + ")";
  }
}

// Waits until the element of selector exists and its text fits: { is: text },
// { has: text } or {} (any). (No eval in the page: its CSP forbids it.)
async function expectText(page, selector, fit, what) {
  try {
    await page.waitForFunction((sel, want) => {
      const el = document.querySelector(sel);
      const text = el && el.textContent.trim();
      return el !== null && (want.is === undefined || text === want.is) &&
        (want.has === undefined || text.includes(want.has));
    }, { timeout: WAIT_MS, polling: 100 }, selector, fit);
  } catch (e) {
    throw new Error(`expected ${what} (${selector}) within ${WAIT_MS / 1000} s; ${await pageSummary(page)}`);
  }
  ok(what);
}

const expectShown = (page, selector, what) => expectText(page, selector, {}, what);

async function textOf(page, selector) {
  return page.$eval(selector, (el) => el.textContent.trim());
}

async function click(page, selector, what) {
  let el = null;
  try {
    el = await page.waitForSelector(selector, { timeout: WAIT_MS });
  } catch (e) { /* said below */ }
  if (!el) throw new Error(`expected a ${what} to click (${selector}); ${await pageSummary(page)}`);
  try {
    await el.click();
  } catch (e) { // redrawn by a poll between finding and clicking: the new one
    await page.click(selector);
  }
}

async function screenshot(page, name) {
  const dir = process.env.MOONJOB_SCREENSHOTS;
  if (!dir) return;
  await sleep(300); // the last answer drawn
  await page.screenshot({ path: path.join(dir, name) });
  ok("saved " + name);
}

// The queues page: the queue, its failed job counted.
async function seeQueues(page) {
  await page.goto(url, { waitUntil: "load" });
  const row = `[data-test="queue-row"][data-queue=${css(queue)}]`;
  await expectShown(page, row, `the queue ${queue} listed on /`);
  await expectShown(page, `${row} [data-test="sparkline"]`, "its throughput sparkline");
  await screenshot(page, "dashboard-queues.png");
  await click(page, `${row} [data-test="queue-link"]`, "link to the queue");
  await expectShown(page, '[data-test="chart"]', "the queue's chart of the last hour");
}

// The failed tab: the failed job with its error code; its name as text, not HTML.
async function seeFailed(page) {
  await click(page, '[data-test="state-tab-failed"]', "failed tab");
  const row = `[data-test="job-row"][data-id=${css(failedId)}]`;
  await expectText(page, `${row} [data-test="error-code"]`, { is: errorCode },
    `the failed job ${failedId} with its error code ${errorCode}`);
  const markup = await page.evaluate(() => ({
    tags: document.querySelectorAll("main b, main img, main script").length,
    text: document.getElementById("main").textContent,
  }));
  if (markup.tags !== 0 || !markup.text.includes("<b>")) {
    throw new Error("a job's name was taken as HTML: the page must show it as text");
  }
  ok("a job's name with markup shown as text");
  await screenshot(page, "dashboard-queue.png");
  await click(page, `${row} [data-test="job-link"]`, "link to the failed job");
}

// The job: its error and traceback; Retry; it completes.
async function retryJob(page) {
  await expectText(page, '[data-test="job-state"]', { is: "failed" }, "the job page says failed");
  await expectText(page, '[data-test="job-error"] [data-test="error-code"]', { is: errorCode },
    "the job's error code");
  await expectText(page, '[data-test="traceback"]', { has: "dashboard_gate.lua" }, "the error's traceback");
  await expectText(page, '[data-test="job-log"]', { has: "declined" }, "the job's log lines");
  await screenshot(page, "dashboard-job.png");
  await click(page, '[data-test="retry"]', "Retry button");
  await expectText(page, '[data-test="job-state"]', { is: "completed" }, "the retried job completed");
  await expectText(page, '[data-test="job-result"]', { has: "charged" }, "its result");
  const banner = await page.$eval("#banner", (el) => (el.hidden ? "" : el.textContent.trim()));
  if (banner) throw new Error("the error banner shows after a retry that worked: " + banner);
}

// Paging through the waiting jobs of a queue of more than a thousand.
async function paging(page) {
  const fmt = (n) => n.toLocaleString("en-US");
  await page.goto(`${url}#/queue/${encodeURIComponent(pagedQueue)}?state=waiting`, { waitUntil: "load" });
  await expectText(page, '[data-test="state-tab-waiting"] .count', { is: fmt(pagedTotal) },
    `the waiting tab counting ${fmt(pagedTotal)} jobs`);
  await expectText(page, '[data-test="page-info"]', { is: `1–20 of ${fmt(pagedTotal)}` }, "the first page of 20");
  const rows = await page.$$eval('[data-test="job-row"]', (r) => r.length);
  if (rows !== 20) throw new Error(`expected 20 jobs on a page, saw ${rows}`);
  await click(page, 'a[data-test="page-next"]', "Next link");
  await expectText(page, '[data-test="page-info"]', { is: `21–40 of ${fmt(pagedTotal)}` }, "the second page");
  await click(page, 'a[data-test="page-prev"]', "Prev link");
  await expectText(page, '[data-test="page-info"]', { is: `1–20 of ${fmt(pagedTotal)}` }, "back on the first page");
  if (await page.$('a[data-test="page-prev"]')) throw new Error("the first page offers a Prev link");
}

// Pause: the queue says so on both pages, a job added stays waiting; Resume runs it.
async function pauseAndResume(page) {
  await page.goto(`${url}#/queue/${encodeURIComponent(queue)}`, { waitUntil: "load" });
  await expectText(page, '[data-test="queue-status"]', { is: "running" }, "the queue marked running");
  await click(page, '[data-test="pause"]', "Pause button");
  await expectText(page, '[data-test="queue-status"]', { is: "paused" }, "the queue marked paused");
  await expectShown(page, '[data-test="resume"]', "a Resume button in place of Pause");
  await page.goto(url, { waitUntil: "load" });
  await expectShown(page, `[data-test="queue-row"][data-queue=${css(queue)}] [data-test="paused-badge"]`,
    "the queue marked paused on /");
  const id = execSync(process.env.MOONJOB_ADD_JOB, { encoding: "utf8" }).trim();
  if (!id) throw new Error("MOONJOB_ADD_JOB printed no job id");
  await page.goto(`${url}#/queue/${encodeURIComponent(queue)}/job/${encodeURIComponent(id)}`, { waitUntil: "load" });
  await expectText(page, '[data-test="job-state"]', { is: "waiting" }, `the job ${id} added while paused waiting`);
  await sleep(PAUSED_WATCH_MS);
  const state = await textOf(page, '[data-test="job-state"]');
  if (state !== "waiting") throw new Error(`a worker ran job ${id} while the queue was paused (it is ${state})`);
  ok(`the job stayed waiting for ${PAUSED_WATCH_MS / 1000} s: the workers stopped`);
  await click(page, '[data-test="crumb-queue"]', "link back to the queue");
  await click(page, '[data-test="resume"]', "Resume button");
  await expectText(page, '[data-test="queue-status"]', { is: "running" }, "the queue marked running again");
  await page.goto(`${url}#/queue/${encodeURIComponent(queue)}/job/${encodeURIComponent(id)}`, { waitUntil: "load" });
  await expectText(page, '[data-test="job-state"]', { is: "completed" }, "the job ran after Resume");
}

// The token: refused without it, kept by the tab once given.
async function tokenChecks(page) {
  await page.goto(url, { waitUntil: "load" });
  await expectText(page, '[data-test="error-banner"]', { has: "EAUTH" }, "EAUTH in the banner without the token");
  await page.goto(`${url}?token=${encodeURIComponent(token)}`, { waitUntil: "load" });
  await expectShown(page, `[data-test="queue-row"][data-queue=${css(queue)}]`, "the queue listed with ?token=");
  await page.goto(`${url}#/queue/${encodeURIComponent(queue)}`, { waitUntil: "load" });
  await expectShown(page, '[data-test="chart"]', "the queue's page after a reload without ?token=");
  await click(page, '[data-test="pause"]', "Pause button");
  await expectText(page, '[data-test="queue-status"]', { is: "paused" }, "an action with the kept token");
  await click(page, '[data-test="resume"]', "Resume button");
  await expectText(page, '[data-test="queue-status"]', { is: "running" }, "the queue running again");
}

// Polling: the page asks again while visible, not while its tab is hidden,
// and at once when it is shown again.
async function pollingChecks(browser, page) {
  let asked = 0;
  page.on("request", (r) => { if (r.url().includes("/api/")) asked += 1; });
  const askedAgain = async (what) => {
    const deadline = Date.now() + WAIT_MS;
    const before = asked;
    while (asked === before && Date.now() < deadline) await sleep(50);
    if (asked === before) throw new Error(`expected the page to ask the server again ${what}`);
    ok(`the page asked again ${what}`);
  };
  await askedAgain("while visible");
  const other = await browser.newPage();
  await other.bringToFront();
  await sleep(300); // a request already sent may still end
  if (!(await page.evaluate(() => document.hidden))) throw new Error("the first tab is not hidden behind another");
  asked = 0;
  await sleep(PAUSED_WATCH_MS + 2000);
  if (asked !== 0) throw new Error(`the page asked the server ${asked} times while its tab was hidden`);
  ok("no requests while the tab was hidden");
  await page.bringToFront();
  await askedAgain("once shown");
  await other.close();
}

// --groups: the group limits and the held-back groups, each with why.
async function seeGroups(page) {
  await page.goto(`${url}#/queue/${encodeURIComponent(queue)}`, { waitUntil: "load" });
  await expectText(page, '[data-test="limits"]', { has: "each group at most 5 jobs per 2 s, 1 at once" },
    "the group limits in the limits note");
  await expectText(page, '[data-test="held-groups-count"]', { is: "2 of 3 groups with waiting jobs" },
    "the held-back groups counted");
  await expectText(page, '[data-test="group-row"][data-group="B"] [data-test="group-why"]',
    { is: "held by ERATELIMIT" }, "group B held by ERATELIMIT");
  await expectText(page, '[data-test="group-row"][data-group="A"] [data-test="group-why"]',
    { is: "at its cap" }, "group A at its cap");
  const order = await page.$$eval('[data-test="group-row"]', (rows) => rows.map((r) => r.dataset.group));
  if (order.join(",") !== "A,B") throw new Error(`expected the rows of A then B, saw ${order.join(",")}`);
  ok("held-back groups in Redis's order, the ready one not listed");
  await screenshot(page, "dashboard-groups.png");
}

// --unreachable: the banner says Redis is unreachable, and the page holds
// nothing of the Redis URL (secrets), in its text or its markup.
async function seeUnreachable(page) {
  if (secrets.length === 0) throw new Error("--unreachable needs the secrets the page must not show");
  for (const [where, target] of [["the queues page", url], ["a queue's page", `${url}#/queue/${queue}`]]) {
    await page.goto(target, { waitUntil: "load" });
    await expectText(page, '[data-test="error-banner"]', { has: "Redis is unreachable" },
      `Redis is unreachable, in the banner of ${where}`);
    const shown = await page.evaluate(() => document.body.innerText + "\n" + document.documentElement.outerHTML);
    for (const secret of secrets) {
      if (shown.includes(secret)) throw new Error(`${where} shows "${secret}" of the Redis URL`);
    }
    ok(`nothing of the Redis URL on ${where}`);
  }
}

// --flow: the parent counted and listed on its tab, its children on its
// page, a child on another queue opened from there, its parent linked back.
async function seeFlow(page) {
  const images = `{${queue}}/images`;
  await page.goto(`${url}#/queue/${encodeURIComponent(queue)}`, { waitUntil: "load" });
  await expectText(page, '[data-test="state-tab-waiting-children"]', { is: "Waiting children 1" },
    "the Waiting children tab with its count");
  await click(page, '[data-test="state-tab-waiting-children"]', "Waiting children tab");
  await click(page, '[data-test="job-row"][data-id="page"] [data-test="job-link"]', "link to the parent");
  await expectText(page, '[data-test="job-state"]', { is: "waiting-children" }, "the parent waiting for children");
  await expectText(page, '[data-test="children-count"]', { is: "2 of 3 ended" }, "its children counted");
  const child = (id, test) => `[data-test="child-row"][data-id="${id}"] [data-test="${test}"]`;
  await expectText(page, child("img1", "child-state"), { is: "completed" }, "img1 completed");
  await expectText(page, child("img1", "child-queue"), { is: images }, `img1 on the queue ${images}`);
  await expectText(page, child("img2", "error-code"), { is: "EBAD" }, "img2 failed EBAD");
  await expectText(page, child("txt", "child-state"), { is: "waiting" }, "txt waiting");
  await screenshot(page, "dashboard-flow.png");
  await click(page, child("img1", "child-link"), "link to the child img1");
  await expectText(page, '[data-test="crumb-queue"]', { is: images }, `the child's page on the queue ${images}`);
  await expectText(page, '[data-test="job-state"]', { is: "completed" }, "the child's state");
  await expectText(page, '[data-test="parent-link"]', { is: `page in ${queue} (waiting-children)` }, "its parent linked");
  await click(page, '[data-test="parent-link"]', "link to the parent");
  await expectShown(page, '[data-test="job-children"]', "back on the parent's page");
}

// --workers: the worker listed with its pid and running job; a Failed tab's
// count follows its list after a retry of all.
async function seeWorkers(page) {
  await page.goto(url, { waitUntil: "load" });
  await click(page, '[data-test="workers-link"]', "Workers link");
  const row = `[data-test="worker-row"][data-queue=${css(queue)}]`;
  await expectText(page, row, { has: `pid ${workerPid}` }, `the worker of ${queue} listed with its pid`);
  await expectText(page, `${row} [data-test="worker-jobs"]`, { has: runningJob }, `its running job ${runningJob}`);
  await expectText(page, `${row} [data-test="worker-running"]`, { is: "1" }, "one job running");
  if (await page.$(`${row} [data-test="worker-lapsed"]`)) throw new Error("a live worker shown lapsed");
  ok("a live worker not shown lapsed");
  await screenshot(page, "dashboard-workers.png");
  await page.goto(`${url}#/queue/${encodeURIComponent(failedQueue)}?state=failed`, { waitUntil: "load" });
  await expectText(page, '[data-test="state-tab-failed"]', { is: "Failed 2" }, "the Failed tab counting 2");
  await click(page, '[data-test="retry-all"]', "Retry all failed button");
  await expectText(page, '[data-test="state-tab-failed"]', { is: "Failed 0" }, "the Failed tab counting 0 after the retry");
  await expectShown(page, '[data-test="no-jobs"]', "no failed jobs listed");
  await expectText(page, '[data-test="ever-counts"]', { has: "2 failed" }, "the jobs that ever failed said apart");
}

// --chart: QUEUE ran 10,000 jobs or more in a minute: the chart's tick
// labels have 5 digits and more, and no label's box meets another's (the
// axis titles, turned on their side, included), each inside the chart.
async function seeChart(page) {
  await page.goto(`${url}#/queue/${encodeURIComponent(queue)}`, { waitUntil: "load" });
  try {
    await page.waitForFunction(() => [...document.querySelectorAll('[data-test="chart"] .tick')]
      .some((t) => /^\d{2,3}([,.\u202f\u00a0]\d{3})+$/.test(t.textContent)), { timeout: WAIT_MS, polling: 100 });
  } catch (e) {
    throw new Error(`expected a 5-digit tick label on the chart; ${await pageSummary(page)}`);
  }
  ok("5-digit tick labels on the chart");
  const boxes = (await page.$$eval('[data-test="chart"] text', (texts) => texts.map((t) => {
    const r = t.getBoundingClientRect();
    return { text: t.textContent, title: t.classList.contains("axis-title"), left: r.left, right: r.right,
      top: r.top, bottom: r.bottom };
  }))).sort((a, b) => b.title - a.title); // (the axis titles first: the overlap users saw)
  const frame = await page.$eval('[data-test="chart"]', (svg) => {
    const r = svg.getBoundingClientRect();
    return { left: r.left, right: r.right, top: r.top, bottom: r.bottom };
  });
  const meet = (a, b) => a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
  for (let i = 0; i < boxes.length; i++) {
    const a = boxes[i];
    if (a.left < frame.left || a.right > frame.right || a.top < frame.top || a.bottom > frame.bottom) {
      throw new Error(`the label "${a.text}" reaches out of the chart: ${JSON.stringify(a)} in ${JSON.stringify(frame)}`);
    }
    for (let j = i + 1; j < boxes.length; j++) {
      if (meet(a, boxes[j])) {
        throw new Error(`the labels "${a.text}" and "${boxes[j].text}" overlap: ${JSON.stringify(a)} ${JSON.stringify(boxes[j])}`);
      }
    }
  }
  const titles = boxes.filter((b) => b.title).length;
  if (titles !== 3) throw new Error(`expected 3 axis titles, saw ${titles}`);
  ok(`no two of the chart's ${boxes.length} labels overlap, the axis titles included`);
  await screenshot(page, "dashboard-chart.png");
}


// --limits: POSTs that must be refused (status, code) and change nothing.
async function refusedPosts(page) {
  const post = (path, headers) => page.evaluate(async (p, hs) => {
    const r = await fetch(p, { method: "POST", headers: Object.assign({ "Content-Type": "application/json" }, hs),
      body: JSON.stringify({ rate: { max: 1, per: 60 }, force: true }) });
    return r.status;
  }, path, headers);
  const q = (name, what) => `/api/queues/${encodeURIComponent(name)}/${what}${limitsToken ? "?token=" + limitsToken : ""}`;
  for (const [path, what] of [[q(queue, "limits"), "limits"], [q(otherQueue, "obliterate"), "obliterate"]]) {
    const status = await post(path, {});
    if (status !== 403) throw new Error(`a ${what} POST without X-Moonjob-Token answered ${status}, not 403`);
    ok(`the ${what} POST without the token header refused (403)`);
    if (limitsToken) {
      const wrong = await post(path, { "X-Moonjob-Token": "not-" + limitsToken });
      if (wrong !== 401) throw new Error(`a ${what} POST with a wrong token answered ${wrong}, not 401`);
      ok(`the ${what} POST with a wrong token refused (401)`);
    }
  }
}

// --limits: the Limits dialog sets a rate and a concurrency; Remove queue
// asks first, then removes OTHER.
async function changeLimitsAndRemove(page) {
  const start = limitsToken ? `${url}?token=${encodeURIComponent(limitsToken)}` : url;
  await page.goto(start, { waitUntil: "load" });
  await refusedPosts(page);
  await page.goto(`${url}#/queue/${encodeURIComponent(queue)}`, { waitUntil: "load" });
  await expectShown(page, '[data-test="chart"]', "the queue's page");
  if (await page.$('[data-test="limits"]')) throw new Error("the queue shows limits before any was set");
  await click(page, '[data-test="edit-limits"]', "Limits button");
  await expectShown(page, '[data-test="limits-dialog"][open]', "the limits dialog open");
  for (const [field, value] of [["limit-rate-max", "50"], ["limit-rate-per", "2"], ["limit-concurrency", "7"]]) {
    await page.type(`[data-test="${field}"]`, value);
  }
  await click(page, '[data-test="limits-save"]', "Save button");
  await expectText(page, '[data-test="limits"]', { has: "at most 50 jobs per 2 s" }, "the rate set in the limits note");
  await expectText(page, '[data-test="limits"]', { has: "at most 7 at once" }, "the concurrency set");
  if (await page.$('[data-test="limits-dialog"][open]')) throw new Error("the limits dialog stayed open after Save");
  await screenshot(page, "dashboard-limits.png");
  const other = `[data-test="queue-row"][data-queue=${css(otherQueue)}]`;
  await page.goto(`${url}#/queue/${encodeURIComponent(otherQueue)}`, { waitUntil: "load" });
  await expectShown(page, '[data-test="chart"]', `the page of ${otherQueue}`);
  dialogAnswer = false; // the first confirmation declined: nothing removed
  await click(page, '[data-test="obliterate"]', "Remove queue button");
  await sleep(500);
  dialogAnswer = true;
  if (!asked.some((m) => m.includes(`Remove queue ${otherQueue}`))) throw new Error("Remove queue asked nothing first");
  await page.goto(url, { waitUntil: "load" });
  await expectShown(page, other, `${otherQueue} still listed after the confirmation was declined`);
  await page.goto(`${url}#/queue/${encodeURIComponent(otherQueue)}`, { waitUntil: "load" });
  await click(page, '[data-test="obliterate"]', "Remove queue button");
  await expectShown(page, `[data-test="queue-row"][data-queue=${css(queue)}]`, "back on the queues page");
  try {
    await page.waitForFunction((sel) => document.querySelector(sel) === null, { timeout: WAIT_MS, polling: 100 }, other);
  } catch (e) {
    throw new Error(`${otherQueue} still listed after Remove queue; ${await pageSummary(page)}`);
  }
  ok(`${otherQueue} removed: gone from the queues page`);
}

let dialogAnswer = true; // what the page's confirm() dialogs are answered
const asked = []; // what they said

async function main() {
  const browser = await puppeteer.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run", "--lang=en-US"],
    defaultViewport: { width: 1280, height: 800 },
  });
  const problems = [];
  try {
    const page = await browser.newPage();
    page.on("pageerror", (e) => problems.push("script error: " + e.message));
    page.on("console", (m) => { // a refused request is the banner's to say, not a script's error
      if (m.type() === "error" && !m.text().startsWith("Failed to load resource")) problems.push("console: " + m.text());
    });
    page.on("dialog", (d) => { asked.push(d.message()); return dialogAnswer ? d.accept() : d.dismiss(); });
    if (limitsMode) {
      await changeLimitsAndRemove(page);
    } else if (unreachableMode) {
      await seeUnreachable(page);
    } else if (workersMode) {
      await seeWorkers(page);
    } else if (flowMode) {
      await seeFlow(page);
    } else if (chartMode) {
      await seeChart(page);
    } else if (groupsMode) {
      await seeGroups(page);
    } else if (tokenMode) {
      await tokenChecks(page);
      await pollingChecks(browser, page);
    } else {
      await seeQueues(page);
      await seeFailed(page);
      await retryJob(page);
      if (pagedQueue) await paging(page);
      await pauseAndResume(page);
    }
    if (problems.length) throw new Error("the page reported errors: " + problems.join("; "));
    ok("no script errors");
  } finally {
    await browser.close();
  }
}

const limit = setTimeout(() => {
  console.log(`FAILED: the run took more than ${RUN_LIMIT_MS / 1000} s`);
  process.exit(1);
}, RUN_LIMIT_MS);

main().then(() => {
  clearTimeout(limit);
  console.log("PASSED: the dashboard in chromium");
}, (e) => {
  console.log("FAILED: " + (e && e.message ? e.message : e));
  process.exit(1);
});
