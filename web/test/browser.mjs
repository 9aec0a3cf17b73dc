// Drive the demo page in headless Chromium (Debian's, through playwright-core): ask each question
// given on the command line, wait for the answer, and print what the page shows as JSON (with
// how wide the page lays out against the viewport: long text must wrap, never widen the page).
// The argument @wait prints {"waiting": n} and waits for a line on stdin, then reloads the page
// (the same browser: its localStorage is kept), so a test can change the world in between.
// Usage: node web/test/browser.mjs <page-url> <question | @wait>...
import { createInterface } from "node:readline";
import { chromium } from "playwright-core";

const [url, ...questions] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
const results = [];
try {
  const page = await browser.newPage();
  const errors = [];
  page.on("pageerror", (error) => errors.push(String(error)));
  await page.goto(url);
  await page.waitForSelector("body[data-state=ready]", { timeout: 30000 });
  const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();
  for (const question of questions) {
    if (question === "@wait") {
      console.log(JSON.stringify({ waiting: results.length }));
      await lines.next();
      await page.reload();
      await page.waitForSelector("body[data-state=ready]", { timeout: 30000 });
      continue;
    }
    await page.evaluate(() => { document.body.dataset.state = "asking"; });
    await page.fill("#question", question);
    await page.click("#submit");
    await page.waitForSelector("body[data-state=done]", { timeout: 120000 });
    results.push({
      question,
      tier: await page.getAttribute("#tier", "data-tier"),
      label: await page.textContent("#tier"),
      answer: await page.textContent("#answer"),
      latency: await page.textContent("#latency"),
      error: await page.textContent("#error"),
      pointer: await page.getAttribute("#pointer", "data-problem"),
      ...await page.evaluate(() => ({
        scrollWidth: document.documentElement.scrollWidth, innerWidth: window.innerWidth })),
    });
  }
  const recent = await page.$$eval("#recent tbody tr", (rows) => rows.map((r) => r.dataset.tier));
  console.log(JSON.stringify({ results, recent, errors }));
} finally {
  await browser.close();
  process.stdin.destroy();
}
