// What both console scripts share: Debian's Chromium driven by
// playwright-core, one page that accepts every dialog (keeping its text),
// records page errors in `out`, and takes screenshots when SCREENSHOTS
// names a directory.
//
//   CHROMIUM      the browser (default /usr/bin/chromium)
//   SCREENSHOTS   a directory for PNGs (optional)
import { createRequire } from "node:module";

// require() (unlike import) looks in NODE_PATH, where .ci/run installs it.
const { chromium } = createRequire(import.meta.url)("playwright-core");

export async function openConsole(out) {
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    args: ["--no-sandbox"],
  });
  const page = await browser.newPage({ viewport: { width: 1280, height: 860 } });
  const shots = process.env.SCREENSHOTS;
  const shot = async (name) => {
    if (shots) await page.screenshot({ path: `${shots}/${name}.png`, fullPage: true });
  };
  const dialogs = [];
  page.on("dialog", async (d) => {
    dialogs.push(d.message());
    await d.accept();
  });
  page.on("pageerror", (e) => { out.pageErrors = [...(out.pageErrors || []), String(e)]; });
  return { browser, page, shot, dialogs };
}

// Goes to a queue's page and waits until it shows that queue: the hash
// changes at once, while the previous page's rows stay until the new
// page's answers arrive (a selector could match those).
export async function showQueue(page, url, queue) {
  await page.goto(`${url}/ui#/queue/${encodeURIComponent(queue)}`);
  await page.waitForFunction((q) => document.querySelector("#main h1")?.textContent === q, queue);
}
