// Browser test: the page loads at laptop size without scrolling, lists the seeded `samples`
// folder, and opening it shows the three sample tiles with loaded thumbnails.

import assert from 'node:assert/strict';
import { test } from 'node:test';
import { assertNoErrors, openApp, openFolder, screenshot, useApp } from './lib/browser.mjs';

const SAMPLES = ['samples/ct-phantom.dcm', 'samples/test-card.png', 'samples/xray-16bit.png'];

let server;
let page;
useApp((app) => ({ server, page } = app));

test('browse: samples folder, three tiles with thumbnails, breadcrumbs', { timeout: 120_000 }, async () => {
  await openApp(page, server.url);

  // One screen at 1366x768: the page itself never scrolls.
  const overflow = await page.evaluate(() => ({
    h: document.documentElement.scrollHeight - window.innerHeight,
    w: document.documentElement.scrollWidth - window.innerWidth,
  }));
  assert.ok(overflow.h <= 0 && overflow.w <= 0, `page scrolls: ${JSON.stringify(overflow)}`);
  assert.match(await page.textContent('#title'), /blobstream/);
  assert.equal(await page.evaluate(() => document.compatMode), 'CSS1Compat', 'page in quirks mode');

  const folder = page.locator('#listing .folder[data-prefix="samples/"]');
  await folder.waitFor();
  assert.match(await folder.textContent(), /samples/);
  assert.match(await page.textContent('#crumbs'), /store/);
  await screenshot(page, 'browse-root');

  await openFolder(page, 'samples/');
  const tiles = page.locator('#listing .tile');
  await page.waitForFunction(() => document.querySelectorAll('#listing .tile').length >= 3);
  assert.equal(await tiles.count(), 3);
  const keys = await tiles.evaluateAll((ts) => ts.map((t) => t.dataset.key).sort());
  assert.deepEqual(keys, SAMPLES);
  for (const key of SAMPLES) {
    const name = key.split('/').pop();
    assert.match(await page.locator(`.tile[data-key="${key}"] .name`).textContent(), new RegExp(name.replace('.', '\\.')));
    assert.ok(await page.locator(`.tile[data-key="${key}"]`).isVisible(), `${key} not visible`);
    const src = await page.getAttribute(`.tile[data-key="${key}"] img.thumb`, 'src');
    assert.equal(src, `/api/thumbnail/${key}?size=128`);
  }
  await page.waitForFunction(
    (keys) =>
      keys.every((k) => {
        const img = document.querySelector(`.tile[data-key="${k}"] img.thumb`);
        return img && img.complete && img.naturalWidth > 0;
      }),
    SAMPLES,
  );

  const crumbs = await page.locator('#crumbs a').allTextContents();
  assert.deepEqual(crumbs, ['store', 'samples']);
  assert.equal(await page.getAttribute('#crumbs [aria-current]', 'data-prefix'), 'samples/');
  await screenshot(page, 'browse-samples');

  // Back to the root through the breadcrumbs.
  await page.locator('#crumbs a[data-prefix=""]').click();
  await folder.waitFor();
  assert.deepEqual(await page.locator('#crumbs a').allTextContents(), ['store']);

  // A folder that happens to be named series: a link into it opens its image, not the
  // series viewer (whose links name a UID: digits and dots).
  const card = await (await fetch(new URL('blobs/samples/test-card.png', server.url))).arrayBuffer();
  const put = await fetch(new URL('blobs/series/a.png', server.url), { method: 'PUT', body: card, headers: { 'Content-Type': 'image/png' } });
  assert.equal(put.status, 201);
  await page.goto(`${server.url.replace(/\/$/, '')}/#/series/a.png`);
  await page.waitForSelector('#view[data-state="ready"]');
  assert.equal(await page.textContent('#view-key'), 'series/a.png');
  await assertNoErrors(page);
});
