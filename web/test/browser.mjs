// Drive the demo page in headless Chromium (Debian's, through playwright-core): ask each question
// given on the command line, wait for the answer, and print what the page shows as JSON.
// Usage: node web/test/browser.mjs <page-url> <question>...
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
  for (const question of questions) {
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
    });
  }
  const recent = await page.$$eval("#recent tbody tr", (rows) => rows.map((r) => r.dataset.tier));
  console.log(JSON.stringify({ results, recent, errors }));
} finally {
  await browser.close();
}
