// Drives the console's webhook pages in headless Chromium (Playwright):
// publish an event from the queue list, search a queue's messages by event
// type, tenant and a JSON path, then the delivery history of an endpoint:
// filtered by tenant, one delivery with its attempts, and resent; and the
// delivery log of an endpoint whose deliveries failed, redriven by time. Prints
// what it saw as one JSON object; tests/process/console.rs checks it and, over
// the API, what the destination received.
//
//   SPOOLD_URL, SPOOLD_API_KEY   the server and a key it accepts
//   CHROMIUM, SCREENSHOTS        see browser.mjs
import { openConsole, showQueue } from "./browser.mjs";

const url = process.env.SPOOLD_URL;
const key = process.env.SPOOLD_API_KEY;
const out = {};
const { browser, page, shot, dialogs } = await openConsole(out);
const ids = (page) => page.$$eval("tbody tr[data-id]", (rs) => rs.map((r) => r.dataset.id));
// Waits until the listing shows `n` messages.
const rowsWhere = (page, n, timeout = 30000) =>
  page.waitForFunction((n) => document.querySelectorAll("tbody tr[data-id]").length === n, n, { timeout });
try {
  await page.goto(`${url}/ui`);
  await page.waitForSelector("form.login");
  await page.fill("input[name=key]", key);
  await page.click("form.login button[type=submit]");
  await page.waitForSelector("tr[data-queue='audit']");
  out.subscriptions = await page.$$eval("tr[data-queue]", (rs) =>
    Object.fromEntries(rs.map((r) => [r.dataset.queue, r.querySelector("td.events").textContent])));

  // Publish an event from the list.
  await page.click("details.events summary");
  await page.fill("form.send-event input[name=type]", "invoice.paid");
  await page.fill("form.send-event input[name=tenant]", "cus_1");
  await page.fill("form.send-event textarea[name=payload]", '{"amount": 42, "customer": {"id": 1}}');
  await page.click("form.send-event button[type=submit]");
  await page.waitForFunction(() => document.getElementById("status").textContent.startsWith("event "));
  out.published = await page.textContent("#status");
  await shot("events-publish");

  // Search the pull queue that takes every event.
  await showQueue(page, url, "audit");
  await page.waitForSelector("form.filters input[name=type]");
  out.all = await ids(page);
  await page.fill("form.filters input[name=type]", "order.created");
  await page.click("form.filters button[type=submit]");
  await rowsWhere(page, 2);
  out.byType = await ids(page);
  out.byTypeEvents = await page.$$eval("tbody tr[data-id]", (rs) => rs.map((r) => r.children[4].textContent));
  await page.fill("form.filters input[name=type]", "");
  await page.fill("form.filters input[name=match]", "$.amount=42");
  await page.click("form.filters button[type=submit]");
  await rowsWhere(page, 1);
  out.byPath = await ids(page);
  out.scannedNote = await page.textContent("#scanned");
  await shot("events-search");

  // The endpoint's delivery history, by tenant; one delivery; resend it.
  await showQueue(page, url, "cus-1");
  await page.waitForSelector("#crumbs a[href='#/history/cus-1']");
  await page.click("#crumbs a[href='#/history/cus-1']");
  await page.waitForSelector("form.filters input[name=tenant]");
  await page.waitForSelector("tbody tr[data-id]");
  out.history = await ids(page);
  await page.fill("form.filters input[name=tenant]", "cus_1");
  // The event published above may still be on its way: search again
  // until both deliveries to cus_1 are in the history.
  for (let tries = 0; ; tries++) {
    await page.click("form.filters button[type=submit]");
    try {
      await rowsWhere(page, 2, 1000);
      break;
    } catch (e) {
      if (tries > 20) throw e;
    }
  }
  out.historyTenant = await ids(page);
  const pick = out.historyTenant[0];
  await page.click(`tbody tr[data-id='${pick}']`);
  await page.waitForSelector(`.detail[data-message='${pick}']`);
  out.historyDetail = await page.textContent(".detail");
  await shot("events-history");
  await page.click("button[data-action='resend']");
  await page.waitForFunction(() => document.getElementById("status").textContent.startsWith("resent as "));
  out.resendDialog = dialogs.at(-1);
  out.resent = (await page.textContent("#status")).slice("resent as ".length);
  out.resentFrom = pick;

  // The delivery log of an endpoint whose deliveries failed: both in
  // it, failed; then redriven from it by time.
  await page.goto(`${url}/ui#/deliveries/dead`);
  for (let tries = 0; ; tries++) {
    await page.waitForSelector("form#redrive-since");
    const states = await page.$$eval("tbody tr[data-id]", (rs) => rs.map((r) => r.dataset.state));
    if ((states.length === 2 && states.every((s) => s === "failed")) || tries > 50) {
      out.deadStates = states;
      break;
    }
    await page.waitForTimeout(200);
    await page.click("form.filters button[type=submit]");
  }
  await shot("events-deliveries");
  await page.fill("form#redrive-since input[name=since]", "2000-01-01T00:00");
  await page.click("form#redrive-since button[type=submit]");
  await page.waitForFunction(() => document.getElementById("status").textContent.startsWith("moved "));
  out.redriven = await page.textContent("#status");
  out.redriveDialog = dialogs.at(-1);
} finally {
  await browser.close();
}
console.log(JSON.stringify(out));
