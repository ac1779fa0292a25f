// spec/browser/groups.js -- drives Debian's chromium (headless, through
// puppeteer-core) to a queue's page of a running moonjob dashboard and
// checks what it shows of the queue's groups. spec/browser/dashboard_spec.lua
// sets up the queue (spec/support/held_groups.lua, cap_and_hold) and runs it:
//
//   node spec/browser/groups.js URL QUEUE
//
// QUEUE has each group's cap at 1 and rate at 5 per 2 s, group A at its cap
// and group B held back by ERATELIMIT, and group C ready. The page must show
// the group limits in its limits note and a "Held-back groups" card with A
// and B, each with why. Environment: CHROMIUM, the browser (default
// /usr/bin/chromium); MOONJOB_SCREENSHOTS, a directory: the page saved there
// as dashboard-groups.png.
//
// Prints "ok: ..." for each expectation met; at the first one not met,
// "FAILED: ..." with what the page showed, and exits 1. The whole run is
// bounded (RUN_LIMIT_MS), so it never hangs a test run.
"use strict";

const path = require("path");
const puppeteer = require("puppeteer-core");

const WAIT_MS = 20000; // for anything the page should show: only catches hangs
const RUN_LIMIT_MS = 90000;

const [url, queue] = process.argv.slice(2);
if (!url || !queue) {
  console.error("usage: node spec/browser/groups.js URL QUEUE");
  process.exit(2);
}

const ok = (what) => console.log("ok: " + what);

// Waits until the element of selector exists and its text fits { is } or
// { has }; else throws with what the page's main part shows.
async function expectText(page, selector, fit, what) {
  try {
    await page.waitForFunction((sel, want) => {
      const el = document.querySelector(sel);
      const text = el && el.textContent.trim();
      return el !== null && (want.is === undefined || text === want.is) &&
        (want.has === undefined || text.includes(want.has));
    }, { timeout: WAIT_MS, polling: 100 }, selector, fit);
  } catch (e) {
    const shown = await page.evaluate(() =>
      document.getElementById("main").innerText.replace(/\s+/g, " ").slice(0, 600))
      .catch(() => "(the page cannot be read)");
    throw new Error(`expected ${what} (${selector}) within ${WAIT_MS / 1000} s; the page shows: ${shown}`);
  }
  ok(what);
}

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
  if (process.env.MOONJOB_SCREENSHOTS) {
    await page.screenshot({ path: path.join(process.env.MOONJOB_SCREENSHOTS, "dashboard-groups.png"), fullPage: true });
    ok("saved dashboard-groups.png");
  }
}

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
    page.on("console", (m) => { if (m.type() === "error") problems.push("console: " + m.text()); });
    await seeGroups(page);
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
  console.log("PASSED: the groups in chromium");
}, (e) => {
  console.log("FAILED: " + (e && e.message ? e.message : e));
  process.exit(1);
});
