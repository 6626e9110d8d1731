// The customer portal in headless Chromium, at desktop and phone sizes:
// opened from tenant A's link, it lists A's endpoints, adds one (its
// secret shown once), sends it a test event, waits for its delivery in
// the log and resends it, shows the event catalogue, and says so when a
// link has expired or was altered. Prints what it saw as one JSON object;
// tests/process/console.rs checks it, the sink and the API.
//
//   PORTAL_LINK     tenant A's link
//   EXPIRED_LINK    a link past its end
//   ALTERED_LINK    a link whose token was changed
//   SINK_URL        where the new endpoint points
//   CHROMIUM, SCREENSHOTS   see browser.mjs
import { openConsole } from "./browser.mjs";

const out = { texts: [] };
const { browser, page, shot } = await openConsole(out);
const keep = async () => out.texts.push(await page.evaluate(() => document.body.innerText));
const statusHas = (text) =>
  page.waitForFunction((t) => document.getElementById("status").textContent.includes(t), text);
try {
  await page.goto(process.env.PORTAL_LINK);
  await page.waitForSelector("main h1");
  await page.waitForFunction(() => document.querySelector("main h1").textContent === "Endpoints");
  out.hashAfter = await page.evaluate(() => location.hash);
  out.tenant = await page.textContent("#tenant");
  out.listed = await page.$$eval("tr[data-endpoint]", (rs) => rs.map((r) => r.dataset.endpoint));
  await keep();
  await shot("portal-endpoints");

  // Add an endpoint for invoice.paid: its secret is shown once.
  await page.fill("#add-endpoint input[name=url]", `${process.env.SINK_URL}/hook-a`);
  await page.check("#add-endpoint input[name=type][value='invoice.paid']");
  await page.click("#add-endpoint button[type=submit]");
  await page.waitForSelector("[data-secret]");
  out.secret = await page.textContent("[data-secret]");
  out.added = await page.evaluate(() => decodeURIComponent(location.hash.split("/")[2]));

  // A test event, delivered (the log shows it), then resent.
  await page.selectOption("#send-test select[name=type]", "invoice.paid");
  await page.click("#send-test button[type=submit]");
  await statusHas("test event");
  for (let i = 0; i < 40; i += 1) {
    await page.evaluate(() => window.dispatchEvent(new HashChangeEvent("hashchange")));
    const done = await page.waitForSelector("tr[data-state=delivered]", { timeout: 500 }).catch(() => null);
    if (done) break;
  }
  await page.waitForSelector("tr[data-state=delivered] button[data-action=resend]");
  await page.click("tr[data-state=delivered] button[data-action=resend]");
  await statusHas("sent again as");
  out.resent = await page.textContent("#status");
  await page.click("tr[data-state=delivered]");
  await page.waitForSelector("#attempts table");
  out.attempt = await page.textContent("#attempts tbody tr td:nth-child(2)");
  await keep();
  await shot("portal-endpoint");

  // Pause and resume from the page.
  await page.click("button[data-action=pause]");
  await statusHas("paused");
  await page.waitForSelector("button[data-action=resume]");
  await page.click("button[data-action=resume]");
  await page.waitForSelector("button[data-action=pause]");

  // The catalogue, with its example.
  await page.goto(`${new URL(process.env.PORTAL_LINK).origin}/portal/#/event-types`);
  await page.waitForSelector("section[data-type='invoice.paid'] pre");
  out.example = await page.textContent("section[data-type='invoice.paid'] pre");
  await keep();
  await shot("portal-event-types");

  // A phone: the same pages, nothing wider than the screen.
  await page.setViewportSize({ width: 390, height: 844 });
  await page.goto(`${new URL(process.env.PORTAL_LINK).origin}/portal/#/`);
  await page.waitForSelector("tr[data-endpoint]");
  out.phoneFits = await page.evaluate(() => document.documentElement.scrollWidth <= window.innerWidth + 1);
  await shot("portal-phone");
  await page.goto(`${new URL(process.env.PORTAL_LINK).origin}/portal/#/endpoint/${encodeURIComponent(out.added)}`);
  await page.waitForSelector("tr[data-state=delivered]");
  out.phoneEndpointFits = await page.evaluate(() => document.documentElement.scrollWidth <= window.innerWidth + 1);
  await keep();
  await shot("portal-phone-endpoint");

  // Links past their end, or altered: the page says so.
  for (const [name, link] of [["expired", process.env.EXPIRED_LINK], ["altered", process.env.ALTERED_LINK]]) {
    const fresh = await browser.newPage();
    await fresh.goto(link);
    await fresh.waitForSelector("#expired");
    out[name] = await fresh.textContent("#expired h1");
    await fresh.close();
  }
} catch (e) {
  out.error = String(e && e.stack ? e.stack : e);
  out.page = await page.evaluate(() => document.body.innerText).catch(() => null);
} finally {
  await browser.close();
}
console.log(JSON.stringify(out));
