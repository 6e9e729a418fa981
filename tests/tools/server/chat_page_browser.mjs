// The chat page of a running `sluice serve` in a real headless browser (Debian's chromium,
// driven by playwright-core): load the page, send a message, wait for the streamed reply to
// finish, print it as JSON on stdout. Environment: BASE_URL, MESSAGE, CHROMIUM (the browser).
import { chromium } from "playwright-core";

// Timeouts of 120 s, not playwright's 30: a loaded 2-core CI machine.
const browser = await chromium.launch({
  timeout: 120000,
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
try {
  const page = await browser.newPage();
  page.setDefaultTimeout(120000);
  await page.goto(process.env.BASE_URL + "/", { waitUntil: "load" });
  await page.fill("#input", process.env.MESSAGE);
  await page.press("#input", "Enter");
  const reply = page.locator(".msg.assistant, .msg.error").last();
  await page.waitForFunction(() => {
    const r = [...document.querySelectorAll(".msg.assistant, .msg.error")].pop();
    return r && r.dataset.state && r.dataset.state !== "streaming";
  }, null, { timeout: 120000 });
  const out = {
    state: await reply.getAttribute("data-state"),
    text: await reply.textContent(),
    tokens_per_second: await page.locator("#tps").textContent(),
  };
  console.log(JSON.stringify(out));
} finally {
  await browser.close();
}
