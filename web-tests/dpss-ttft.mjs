// Time to first tile and to a full viewport for `blobstream bench dpss`: the block-store viewer.
//
// Usage: node web-tests/dpss-ttft.mjs URL
//
// Opens URL (a /dpss.html?dataset=NAME page) once in headless Chromium (Debian's, through
// playwright-core) in a fresh context (no cache, no cookies), waits until the viewer has drawn
// every visible tile of its first level, and prints {"first_tile_ms", "full_view_ms"}:
// performance.now() (milliseconds since navigation start) when the first tile and the last
// visible tile were drawn. Exits 1 with the reason on stderr when that takes over 60 s or the
// page reports an error.

import { chromium } from 'playwright-core';

const TIMEOUT_MS = 60_000;

async function main() {
  const [url] = process.argv.slice(2);
  if (!url) throw new Error('usage: node web-tests/dpss-ttft.mjs URL');
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'],
  });
  try {
    const context = await browser.newContext({ viewport: { width: 1366, height: 768 }, deviceScaleFactor: 1 });
    const page = await context.newPage();
    const pageErrors = [];
    page.on('pageerror', (e) => pageErrors.push(e.message));
    await page.goto(url, { timeout: TIMEOUT_MS });
    try {
      await page.waitForFunction(() => window.dpssViewer?.stats().fullViewMs != null, null, { timeout: TIMEOUT_MS });
    } catch (e) {
      const why = pageErrors.length ? `; page errors: ${pageErrors.join('; ')}` : '';
      throw new Error(`the viewport was not drawn within ${TIMEOUT_MS / 1000} s${why}`);
    }
    const s = await page.evaluate(() => window.dpssViewer.stats());
    console.log(JSON.stringify({ first_tile_ms: s.firstTileMs, full_view_ms: s.fullViewMs, loaded: s.loaded }));
  } finally {
    await browser.close();
  }
}

main().catch((e) => {
  console.error(e.message);
  process.exit(1);
});
