// Open a release report (`edgeqa release show --html`) in headless Chromium (Debian's, through
// playwright-core) and print what it shows as JSON: the charts drawn, page errors, any request
// that left the file (there must be none: the page is self-contained), the visible text.
// Usage: node web/test/report.mjs <report.html>
import { pathToFileURL } from "node:url";

import { chromium } from "playwright-core";

const [file] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
try {
  const page = await browser.newPage();
  const errors = [];
  const external = [];
  page.on("pageerror", (error) => errors.push(String(error)));
  page.on("request", (request) => {
    if (!request.url().startsWith("file:") && !request.url().startsWith("data:")) {
      external.push(request.url());
    }
  });
  await page.route(/^https?:/, (route) => route.abort());
  await page.goto(pathToFileURL(file).href);
  await page.waitForSelector(".js-plotly-plot .main-svg", { timeout: 30000 });
  const charts = await page.$$eval(".js-plotly-plot", (plots) => plots.map((p) => ({
    id: p.id,
    svgs: p.querySelectorAll("svg.main-svg").length,
    traces: p.querySelectorAll(".trace").length,
    title: p.querySelector(".gtitle")?.textContent ?? "",
  })));
  const text = await page.evaluate(() => document.body.innerText);
  console.log(JSON.stringify({ charts, errors, external, text }));
} finally {
  await browser.close();
}
