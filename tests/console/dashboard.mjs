// The console's dashboard and operator actions in headless Chromium: the
// rate charts (all queues and one), failure queues nested under theirs,
// settings edited as fields (a PATCH), "retry now" on a message waiting
// for its next try, "delete" on a delayed one, a dead letter's detail
// beside the list with times in UTC and its redrive button, the filter
// box over the queue list, the cluster
// page, the favicon, and the same pages on a phone's screen. Prints what
// it saw as one JSON object; tests/process/console.rs checks it and the server.
//
//   SPOOLD_URL, SPOOLD_API_KEY   the server and a key it accepts
//   CHROMIUM, SCREENSHOTS        see browser.mjs
import { openConsole, showQueue } from "./browser.mjs";

const url = process.env.SPOOLD_URL;
const key = process.env.SPOOLD_API_KEY;
const out = {};
const { browser, page, shot, dialogs } = await openConsole(out);
const statusStartsWith = (text) =>
  page.waitForFunction((t) => document.getElementById("status").textContent.includes(t), text);
try {
  await page.goto(`${url}/ui`);
  await page.fill("input[name=key]", key);
  await page.click("form.login button[type=submit]");

  // The dashboard: four lines, counts in the legend once a second passed
  // (the page refreshes itself every 5 s).
  await page.waitForSelector("svg.chart");
  out.lines = await page.$$eval("svg.chart polyline", (ls) => ls.map((l) => l.dataset.series));
  await page.waitForFunction(
    () => Number(document.querySelector("ul.legend li[data-series=enqueued]")?.dataset.total) > 0,
    null, { timeout: 20000 });
  out.legend = await page.$$eval("ul.legend li", (ls) => Object.fromEntries(ls.map((l) => [l.dataset.series, Number(l.dataset.total)])));
  out.order = await page.$$eval("tr[data-queue]", (rs) => rs.map((r) => [r.dataset.queue, r.classList.contains("nested")]));
  out.secretPill = await page.$$eval("tr[data-queue='hooks'] .pill",
    (ps) => ps.map((p) => p.textContent).find((t) => t.includes("secrets sign")) ?? null);
  await page.click("button[data-range=minutes]");
  await page.waitForSelector("svg.chart[data-range=minutes]");
  out.favicon = await page.evaluate(async () => {
    const href = document.querySelector("link[rel=icon]").href;
    const r = await fetch(href);
    return `${r.status} ${r.headers.get("content-type")}`;
  });
  await page.click("button[data-range=seconds]");
  await shot("dashboard");

  // The filter box: the list under a name prefix, then all of it again.
  await page.fill("form.filter input[name=prefix]", "jo");
  await page.click("form.filter button[type=submit]");
  await page.waitForFunction(() => !document.querySelector("tr[data-queue='hooks']"));
  out.filtered = await page.$$eval("tr[data-queue]", (rs) => rs.map((r) => r.dataset.queue));
  await page.fill("form.filter input[name=prefix]", "");
  await page.click("form.filter button[type=submit]");
  await page.waitForSelector("tr[data-queue='hooks']");

  // A push queue: its destination, its chart, its settings as fields.
  await showQueue(page, url, "hooks");
  await page.waitForSelector("p.destination");
  out.destination = await page.textContent("p.destination");
  out.queueChart = await page.$$eval("svg.chart polyline", (ls) => ls.length);
  await page.fill("form.settings-fields input[name=maxRetries]", "3");
  await page.fill("form.settings-fields input[name=concurrency]", "2");
  await page.click("form.settings-fields button[type=submit]");
  await statusStartsWith("settings changed");
  await page.waitForSelector("form.settings-fields input[name=concurrency][value='2']");

  // Its message waits an hour for the next try: retry it now.
  await page.waitForSelector("tr[data-id] button[data-action=retry-now]");
  out.retryRow = await page.$eval("tr[data-id]:has(button[data-action=retry-now])", (r) => r.dataset.id);
  await shot("queue");
  await page.click("tr[data-id] button[data-action=retry-now]");
  await statusStartsWith("visible now");

  // A pull queue: a delayed message deleted from its row.
  await showQueue(page, url, "jobs");
  await page.waitForSelector("tr[data-id] button[data-action=delete-one]");
  out.deleted = await page.$eval("tr[data-id]:has(button[data-action=delete-one])", (r) => r.dataset.id);
  await page.click(`tr[data-id='${out.deleted}'] button[data-action=delete-one]`);
  await statusStartsWith("deleted");

  // A dead letter: its detail beside the list, in UTC, redriven from there.
  await showQueue(page, url, "jobs.failed");
  await page.waitForSelector("tbody tr[data-id]");
  const dead = await page.$eval("tbody tr[data-id]", (r) => r.dataset.id);
  await page.click(`tbody tr[data-id='${dead}']`);
  await page.waitForSelector(`.detail[data-message='${dead}']`);
  out.beside = await page.evaluate(() => {
    const list = document.querySelector(".split .list").getBoundingClientRect();
    const detail = document.querySelector(".split .detail").getBoundingClientRect();
    return detail.left >= list.right && detail.top < list.bottom;
  });
  out.detailText = await page.textContent(".detail");
  await shot("dead-letter-detail");
  await page.click(".detail button[data-action=redrive-one]");
  await statusStartsWith("moved back");
  out.redriven = dead;

  // The cluster page of a single node.
  await page.goto(`${url}/ui#/cluster`);
  await page.waitForSelector("#single-node");
  out.cluster = await page.textContent("#single-node");

  // A phone: nothing hidden, the page no wider than the screen (tables
  // scroll in their box), a detail over the list.
  await page.setViewportSize({ width: 390, height: 844 });
  await page.goto(`${url}/ui#/`);
  await page.waitForSelector("tr[data-queue]");
  out.phone = await page.evaluate(() => ({
    pageWidth: document.documentElement.scrollWidth,
    hiddenCells: [...document.querySelectorAll("th, td")].filter((c) => getComputedStyle(c).display === "none").length,
    columns: document.querySelectorAll("main table thead th").length,
  }));
  await shot("phone-dashboard");
  await showQueue(page, url, "jobs");
  await page.waitForSelector("tbody tr[data-id]");
  await page.click("tbody tr[data-id]");
  await page.waitForSelector(".detail");
  out.phoneDetail = await page.evaluate(() => getComputedStyle(document.getElementById("detail")).position);
  await shot("phone-detail");
  out.dialogs = [...dialogs];
} finally {
  await browser.close();
}
console.log(JSON.stringify(out));
