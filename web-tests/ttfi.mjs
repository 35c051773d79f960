//! Time to first image for `blobstream bench http`: when the browser client first draws an image.
//
// Usage: node web-tests/ttfi.mjs URL KEY [RUNS]
//
// Loads URL + "#/" + KEY (the client opens a linked image at once) in headless Chromium (Debian's, through
// playwright-core) RUNS + 1 times, each in a fresh browser context (no cache, no cookies); the
// first load is a warm-up. For each load it waits until the page sets
// window.blobstream.firstImageMs (performance.now(), i.e. milliseconds since navigation start,
// when the image is first drawn on the canvas) and prints one JSON line
// {"rep", "warmup", "first_image_ms"}; at the end it prints
// {"first_image_ms": median, "runs": [ms of each load after the warm-up]}.
// Exits 1 with the reason on stderr when the image does not appear within 60 s or the page
// reports an error.

import { chromium } from 'playwright-core';

const TIMEOUT_MS = 60_000;

function median(xs) {
  const s = [...xs].sort((a, b) => a - b);
  const n = s.length;
  return n % 2 === 1 ? s[(n - 1) / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

async function openOnce(browser, target, key) {
  const context = await browser.newContext({ viewport: { width: 1366, height: 768 }, deviceScaleFactor: 1 });
  try {
    const page = await context.newPage();
    const pageErrors = [];
    page.on('pageerror', (e) => pageErrors.push(e.message));
    await page.goto(target, { timeout: TIMEOUT_MS });
    try {
      // Done when the image is drawn, or as soon as the viewer says it failed.
      await page.waitForFunction(
        () => (window.blobstream && window.blobstream.firstImageMs != null) || document.querySelector('#view')?.dataset.state === 'error',
        null,
        { timeout: TIMEOUT_MS },
      );
    } catch (e) {
      const why = pageErrors.length ? `; page errors: ${pageErrors.join('; ')}` : '';
      throw new Error(`${key} was not drawn within ${TIMEOUT_MS / 1000} s${why}`);
    }
    const r = await page.evaluate(() => ({
      ms: window.blobstream?.firstImageMs ?? null,
      error: window.blobstream?.lastError ?? null,
      state: document.querySelector('#view')?.dataset.state ?? null,
    }));
    if (r.ms == null) {
      throw new Error(`opening ${key} failed: ${r.error || `viewer state ${r.state}`}`);
    }
    return r.ms;
  } finally {
    await context.close();
  }
}

async function main() {
  const [url, key, runsArg = '5'] = process.argv.slice(2);
  const runs = Number.parseInt(runsArg, 10);
  if (!url || !key || !(runs >= 1)) {
    throw new Error('usage: node web-tests/ttfi.mjs URL KEY [RUNS]');
  }
  const target = `${url}#/${key.split("/").map(encodeURIComponent).join("/")}`;
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'],
  });
  try {
    const times = [];
    for (let rep = 0; rep <= runs; rep++) {
      const ms = await openOnce(browser, target, key);
      console.log(JSON.stringify({ rep, warmup: rep === 0, first_image_ms: ms }));
      if (rep > 0) times.push(ms);
    }
    console.log(JSON.stringify({ first_image_ms: median(times), runs: times }));
  } finally {
    await browser.close();
  }
}

main().catch((e) => {
  console.error(`ttfi: ${e instanceof Error ? e.message : String(e)}`);
  process.exit(1);
});
