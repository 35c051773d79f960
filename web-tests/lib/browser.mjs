// Browser side of the tests: Debian's headless Chromium through playwright-core at the size
// of a laptop screen, plus helpers that wait on the page's own state (window.blobstream,
// data-state attributes) instead of sleeping, compare canvas pixels and save screenshots to
// web-tests/screenshots/.

import assert from 'node:assert/strict';
import { mkdirSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before } from 'node:test';
import { chromium } from 'playwright-core';
import { startServer } from './server.mjs';

export const screenshotDir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', 'screenshots');

export const VIEWPORT = { width: 1366, height: 768 };

export async function launchBrowser() {
  return chromium.launch({
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'],
  });
}

/** A new page at 1366x768 that records uncaught page errors in page.pageErrors. */
export async function newPage(browser, baseURL) {
  const context = await browser.newContext({ viewport: VIEWPORT, baseURL, deviceScaleFactor: 1 });
  const page = await context.newPage();
  page.pageErrors = [];
  page.on('pageerror', (e) => page.pageErrors.push(e.message));
  page.setDefaultTimeout(30_000);
  return page;
}

export async function screenshot(page, name) {
  mkdirSync(screenshotDir, { recursive: true });
  await page.screenshot({ path: path.join(screenshotDir, `${name}.png`) });
}

/** Load the client and wait for its first listing. */
export async function openApp(page, url) {
  await page.goto(url);
  await page.waitForFunction(() => window.blobstream?.ready === true);
}

/** Click a folder in the listing and wait until the breadcrumbs show it. */
export async function openFolder(page, prefix) {
  await page.locator(`#listing .folder[data-prefix="${prefix}"]`).click();
  await page.waitForFunction(
    (p) => document.querySelector('#crumbs [aria-current]')?.dataset.prefix === p && document.querySelector('#listing .tile, #listing .folder, #listing .empty'),
    prefix,
  );
}

/** Click a tile and wait until the viewer shows that image (data-state ready). */
export async function openImage(page, key) {
  await page.locator(`#listing .tile[data-key="${key}"]`).click();
  await page.waitForFunction(
    (k) => {
      const s = document.querySelector('#view').dataset.state;
      return (s === 'ready' && window.blobstream.view().key === k) || s === 'error';
    },
    key,
  );
  const state = await page.getAttribute('#view', 'data-state');
  if (state !== 'ready') {
    const err = await page.textContent('#error');
    assert.fail(`opening ${key} failed: ${err}`);
  }
}

/** Wait until the page has drawn at least one more frame. */
export async function nextFrame(page) {
  await page.evaluate(() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r))));
}

/** Keep a copy of the canvas pixels in the page under a name. */
export async function snap(page, name) {
  await nextFrame(page);
  await page.evaluate((n) => {
    const c = document.querySelector('#canvas');
    window.__snaps = window.__snaps || {};
    window.__snaps[n] = { w: c.width, h: c.height, data: c.getContext('2d').getImageData(0, 0, c.width, c.height).data };
  }, name);
}

/**
 * Compare two snapshots over a region given in canvas CSS pixels ({x0, x1, y0, y1}, default the
 * whole canvas): {mean} absolute difference per channel and the {changed} fraction of pixels
 * that differ by more than 2 in some channel.
 */
export async function snapDiff(page, a, b, region = {}) {
  return page.evaluate(
    ({ a, b, region }) => {
      const A = window.__snaps[a];
      const B = window.__snaps[b];
      if (A.w !== B.w || A.h !== B.h) return { mean: 255, changed: 1, pixels: 0 };
      const c = document.querySelector('#canvas');
      const scale = A.w / c.clientWidth;
      const x0 = Math.max(0, Math.floor((region.x0 ?? 0) * scale));
      const x1 = Math.min(A.w, Math.ceil((region.x1 ?? Infinity) * scale));
      const y0 = Math.max(0, Math.floor((region.y0 ?? 0) * scale));
      const y1 = Math.min(A.h, Math.ceil((region.y1 ?? Infinity) * scale));
      let sum = 0;
      let changed = 0;
      let pixels = 0;
      for (let y = y0; y < y1; y++) {
        for (let x = x0; x < x1; x++) {
          const i = (y * A.w + x) * 4;
          let m = 0;
          for (let k = 0; k < 3; k++) {
            const d = Math.abs(A.data[i + k] - B.data[i + k]);
            sum += d;
            if (d > m) m = d;
          }
          if (m > 2) changed++;
          pixels++;
        }
      }
      return { mean: pixels ? sum / (pixels * 3) : 0, changed: pixels ? changed / pixels : 0, pixels };
    },
    { a, b, region },
  );
}

/** The CSS-pixel box of the canvas, and its centre. */
export async function canvasBox(page) {
  const box = await page.locator('#canvas').boundingBox();
  return { ...box, cx: box.x + box.width / 2, cy: box.y + box.height / 2 };
}

/** Assert the page shows no error banner and threw no uncaught errors. */
export async function assertNoErrors(page) {
  const hidden = await page.locator('#error').isHidden();
  assert.ok(hidden, `unexpected error banner: ${await page.textContent('#error')}`);
  assert.deepEqual(page.pageErrors, [], 'uncaught errors in the page');
}

/**
 * For a test file: before its tests start a `blobstream serve`, a browser and (unless
 * `withPage` is false) one page, and hand them to `set({ server, browser, page })`; after
 * them close the browser and stop the server. `args()` gives extra `serve` arguments; `onDisk`
 * keeps the blobs in a data directory (`server.dataDir`) instead of memory.
 */
export function useApp(set, { args = () => [], withPage = true, onDisk = false } = {}) {
  const app = {};
  before(async () => {
    app.server = await startServer({ args: args(), onDisk });
    app.browser = await launchBrowser();
    if (withPage) app.page = await newPage(app.browser, app.server.url);
    set(app);
  });
  after(async () => {
    await app.browser?.close();
    await app.server?.stop();
  });
}
