// Drives spoold's web console in a real headless Chromium (Playwright):
// sign-in refused without the right key, the queue list, a failure queue
// filtered by status, one dead letter's attempts, a redrive of a selection
// (with its confirmation), the live tail, a delete of everything matching a
// filter, pause and resume. Prints what it saw as one JSON
// object; tests/process/console.rs checks it and the server's state.
//
//   SPOOLD_URL, SPOOLD_API_KEY   the server and a key it accepts
//   CHROMIUM, SCREENSHOTS        see browser.mjs
import { openConsole, showQueue } from "./browser.mjs";

const url = process.env.SPOOLD_URL;
const key = process.env.SPOOLD_API_KEY;
const out = {};
const { browser, page, shot, dialogs } = await openConsole(out);
try {
  // Without a key: the sign-in form; a wrong key is refused.
  await page.goto(`${url}/ui`);
  await page.waitForSelector("form.login");
  out.loginShown = true;
  await page.fill("input[name=key]", "not-the-key");
  await page.click("form.login button[type=submit]");
  await page.waitForSelector("form.login .error:not([hidden])");
  out.wrongKeyMessage = await page.textContent("form.login .error");
  await shot("sign-in");

  // The right key: the queues.
  await page.fill("input[name=key]", key);
  await page.click("form.login button[type=submit]");
  await page.waitForSelector("tr[data-queue='hooks.failed']");
  out.queues = await page.$$eval("tr[data-queue]", (rs) => rs.map((r) => r.dataset.queue));
  out.keyInUrl = page.url().includes(key);
  await shot("queues");

  // The failure queue, filtered by last status 500.
  await page.click("tr[data-queue='hooks.failed'] a");
  await page.waitForSelector("form.filters");
  await page.fill("input[name=status]", "500");
  await page.click("form.filters button[type=submit]");
  await page.waitForFunction(() => {
    const rows = [...document.querySelectorAll("tbody tr[data-id]")];
    return rows.length > 0 && rows.every((r) => r.children[6]?.textContent === "500");
  });
  out.filtered = await page.$$eval("tbody tr[data-id]", (rs) => rs.map((r) => r.dataset.id));

  // One dead letter: its attempts and what the destination answered.
  await page.click(`tbody tr[data-id='${out.filtered[0]}']`);
  await page.waitForSelector(`.detail[data-message='${out.filtered[0]}']`);
  out.detail = await page.textContent(".detail");
  await shot("dead-letter");

  // Redrive a selection of two, confirmed.
  const pick = out.filtered.slice(0, 2);
  for (const id of pick) await page.check(`input[type=checkbox][data-id='${id}']`);
  await page.click("button[data-action='redrive-selected']");
  await page.waitForFunction(() => document.getElementById("status").textContent.startsWith("moved"));
  out.redriven = pick;
  out.dialogs = [...dialogs];
  out.status = await page.textContent("#status");
  await page.waitForFunction((gone) => !document.querySelector(`tbody tr[data-id='${gone}']`), pick[0]);
  out.left = await page.$$eval("tbody tr[data-id]", (rs) => rs.map((r) => r.dataset.id));
  await shot("after-redrive");

  // The live tail shows the newest messages.
  await page.goto(`${url}/ui#/tail/hooks.failed`);
  await page.waitForSelector("#tail-lines tbody tr[data-id]");
  out.tailed = await page.$$eval("#tail-lines tbody tr[data-id]", (rs) => rs.map((r) => r.dataset.id));
  await shot("tail");

  // Delete everything matching a filter (the 404), confirmed with its count.
  await showQueue(page, url, "hooks.failed");
  await page.waitForSelector("form.filters");
  await page.fill("input[name=status]", "");
  await page.selectOption("select[name=reason]", "permanent_status");
  await page.click("form.filters button[type=submit]");
  await page.waitForFunction(() => {
    const rows = [...document.querySelectorAll("tbody tr[data-id]")];
    return rows.length > 0 && rows.every((r) => r.children[5]?.textContent === "permanent_status");
  });
  out.permanent = await page.$$eval("tbody tr[data-id]", (rs) => rs.map((r) => r.dataset.id));
  const before = dialogs.length;
  await page.click("button[data-action='purge-all']");
  await page.waitForFunction(() => document.getElementById("status").textContent.startsWith("deleted"));
  out.deleteDialog = dialogs[before];
  out.deleteStatus = await page.textContent("#status");

  // Pause and resume the push queue from the list.
  await page.goto(`${url}/ui#/`);
  await page.waitForSelector("tr[data-queue='hooks'] button");
  // The row's state pill, told by its text: an unsigned queue also shows
  // an "unsigned" pill of the warning class, so a class alone does not
  // say the pause landed.
  const pill = (text) => page.waitForFunction((t) => {
    const pills = [...document.querySelectorAll("tr[data-queue='hooks'] .pill")].map((p) => p.textContent);
    return pills.includes(t) && pills[0] === t;
  }, text);
  await page.click("tr[data-queue='hooks'] button");
  await pill("paused");
  out.pausedPill = await page.textContent("tr[data-queue='hooks'] .pill");
  await page.click("tr[data-queue='hooks'] button");
  await pill("running");
  out.resumedPill = await page.textContent("tr[data-queue='hooks'] .pill");
} catch (e) {
  // What the page showed when a wait ran out: its text and what it saw.
  const text = await page.evaluate(() => document.body.innerText).catch(() => "");
  console.error(`the page said:\n${text}\nseen so far: ${JSON.stringify(out)}`);
  throw e;
} finally {
  await browser.close();
}
console.log(JSON.stringify(out));
