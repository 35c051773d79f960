// Series viewer timing for `blobstream bench dicomweb`: how soon the first slice of a series is
// drawn, and how soon every slice is fetched ahead into the viewer's cache.
//
// Usage: node web-tests/series-timing.mjs URL SERIES_UID [RUNS]
//
// Loads URL + "#series/" + SERIES_UID (the client opens a linked series at once) in headless
// Chromium (Debian's, through playwright-core) RUNS + 1 times, each in a fresh browser context;
// the first load is a warm-up. Prints one JSON line per load and at the end
// {"first_slice_ms": median, "all_cached_ms": median, "slices": n}, in milliseconds since
// navigation start. Exits 1 with the reason on stderr on a page error or after 120 s.

import { chromium } from 'playwright-core';

const TIMEOUT_MS = 120_000;

function median(xs) {
  const s = [...xs].sort((a, b) => a - b);
  const n = s.length;
  return n % 2 === 1 ? s[(n - 1) / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

async function openOnce(browser, target) {
  const context = await browser.newContext({ viewport: { width: 1366, height: 768 }, deviceScaleFactor: 1 });
  try {
    const page = await context.newPage();
    const errors = [];
    page.on('pageerror', (e) => errors.push(e.message));
    await page.goto(target, { timeout: TIMEOUT_MS });
    await page.waitForFunction(() => window.blobstream?.firstImageMs != null && window.blobstream.stack(), null, { timeout: TIMEOUT_MS });
    const first = await page.evaluate(() => window.blobstream.firstImageMs);
    await page.waitForFunction(() => {
      const s = window.blobstream.stack();
      if (s && s.cached === s.length && window.__allCached == null) window.__allCached = performance.now();
      return window.__allCached != null;
    }, null, { timeout: TIMEOUT_MS, polling: 10 });
    const all = await page.evaluate(() => window.__allCached);
    const slices = await page.evaluate(() => window.blobstream.stack().length);
    if (errors.length) throw new Error(`page errors: ${errors.join('; ')}`);
    return { first, all, slices };
  } finally {
    await context.close();
  }
}

const [url, uid, runsArg] = process.argv.slice(2);
if (!url || !uid) {
  console.error('usage: node web-tests/series-timing.mjs URL SERIES_UID [RUNS]');
  process.exit(2);
}
const runs = Number(runsArg || 3);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'],
});
try {
  const firsts = [];
  const alls = [];
  let slices = 0;
  for (let rep = 0; rep <= runs; rep++) {
    const r = await openOnce(browser, `${url.replace(/\/$/, '')}/#series/${uid}`);
    console.log(JSON.stringify({ rep, warmup: rep === 0, first_slice_ms: r.first, all_cached_ms: r.all }));
    if (rep > 0) {
      firsts.push(r.first);
      alls.push(r.all);
    }
    slices = r.slices;
  }
  console.log(JSON.stringify({ first_slice_ms: median(firsts), all_cached_ms: median(alls), slices }));
} catch (e) {
  console.error(e?.message || String(e));
  process.exitCode = 1;
} finally {
  await browser.close();
}
