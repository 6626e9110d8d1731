// The console's cluster page on a replicated spool's primary, in headless
// Chromium: this replica and its term, each member with its role, match
// index, lag and last contact, and snapshot catch-up. Prints what it saw
// as one JSON object (tests/process/console.rs checks it).
//
//   SPOOLD_URL       the primary's API (no key: a loopback cluster)
//   CHROMIUM, SCREENSHOTS   see browser.mjs
import { openConsole } from "./browser.mjs";

const url = process.env.SPOOLD_URL;
const out = {};
const { browser, page, shot } = await openConsole(out);
try {
  await page.goto(`${url}/ui#/cluster`);
  await page.waitForFunction(() => document.querySelectorAll("tr[data-node]").length === 3);
  out.members = await page.$$eval("tr[data-node]", (rs) => rs.map((r) => [...r.children].map((c) => c.textContent)));
  out.facts = await page.$$eval("table.facts tr", (rs) => Object.fromEntries(rs.map((r) => [r.children[0].textContent, r.children[1].textContent])));
  await shot("cluster");
} finally {
  await browser.close();
}
console.log(JSON.stringify(out));
