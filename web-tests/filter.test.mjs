// Browser test: blur the test card on the server, see the step time and the changed pixels,
// compare before/after with the split slider, and save the result as a new PNG in the store;
// save a CT result as its 16-bit values or as the 8-bit picture shown.

import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  assertNoErrors,
  nextFrame,
  openApp,
  openFolder,
  openImage,
  screenshot,
  snap,
  snapDiff,
  useApp,
} from './lib/browser.mjs';

let server;
let page;
useApp((app) => ({ server, page } = app));

test('filter: blur, timing, compare, save', { timeout: 180_000 }, async () => {
  await openApp(page, server.url);
  await openFolder(page, 'samples/');
  await openImage(page, 'samples/test-card.png');
  await page.waitForFunction(() => document.querySelectorAll('#filter-select option').length > 0);
  await snap(page, 'original');

  await page.selectOption('#filter-select', 'blur');
  const size = page.locator('#filter-params input[name="size"]');
  await size.waitFor();
  assert.equal(await size.getAttribute('type'), 'number');
  assert.equal(await size.getAttribute('placeholder'), '3');
  await size.fill('5');
  assert.equal(await page.getAttribute('#filter-panel', 'data-state'), 'idle');
  await page.click('#apply-filter');
  await page.waitForSelector('#filter-panel[data-state="done"], #filter-panel[data-state="error"]');
  assert.equal(await page.getAttribute('#filter-panel', 'data-state'), 'done', await page.textContent('#error'));

  const time = await page.textContent('#filter-time');
  assert.match(time, /blur \d+(\.\d+)? ms/);
  assert.match(time, /total \d+(\.\d+)? ms/);
  assert.deepEqual(await page.locator('#filter-chain li').allTextContents().then((t) => t.map((s) => s.split(' — ')[0])), ['blur size=5']);
  await snap(page, 'blurred');
  const changed = await snapDiff(page, 'original', 'blurred');
  assert.ok(changed.changed > 0.02, `blur did not change the canvas: ${JSON.stringify(changed)}`);
  await screenshot(page, 'filter-blur');

  // Before/after: original left of the split, the blurred result right of it.
  assert.ok(await page.locator('#compare-slider').isHidden());
  await page.check('#compare');
  await page.locator('#compare-slider').waitFor({ state: 'visible' });
  await snap(page, 'compare');
  const split = await page.evaluate(() => window.blobstream.view().splitX);
  assert.ok(split > 0, `no split position: ${split}`);
  const left = await snapDiff(page, 'original', 'compare', { x1: split - 8, y0: 30 });
  const right = await snapDiff(page, 'blurred', 'compare', { x0: split + 8, y0: 30 });
  assert.ok(left.mean < 1, `left of the split is not the original: ${JSON.stringify(left)}`);
  assert.ok(right.mean < 1, `right of the split is not the result: ${JSON.stringify(right)}`);
  const leftVsBlur = await snapDiff(page, 'blurred', 'compare', { x1: split - 8, y0: 30 });
  assert.ok(leftVsBlur.changed > 0.01, 'left of the split looks blurred');
  await page.locator('#compare-slider').fill('25');
  await page.waitForFunction((s) => window.blobstream.view().splitX < s, split);
  await nextFrame(page);
  await screenshot(page, 'filter-compare');

  // Save the result as a PNG next to the original.
  await page.fill('#save-name', 'samples/test-card-blur.png');
  await page.click('#save-result');
  await page.waitForFunction(() => /Saved samples\/test-card-blur\.png/.test(document.querySelector('#status').textContent) || !document.querySelector('#error').hidden);
  assert.match(await page.textContent('#status'), /Saved samples\/test-card-blur\.png/, await page.textContent('#error'));
  const tile = page.locator('#listing .tile[data-key="samples/test-card-blur.png"]');
  await tile.waitFor();
  await page.waitForFunction(() => {
    const img = document.querySelector('.tile[data-key="samples/test-card-blur.png"] img.thumb');
    return img && img.complete && img.naturalWidth > 0;
  });
  await screenshot(page, 'filter-saved');

  const res = await fetch(new URL('blobs/samples/test-card-blur.png', server.url));
  assert.equal(res.status, 200);
  const bytes = new Uint8Array(await res.arrayBuffer());
  assert.deepEqual([...bytes.subarray(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a], 'not a PNG');

  // Reset goes back to the original.
  await page.click('#reset-filter');
  assert.equal(await page.locator('#filter-chain li').count(), 0);
  assert.ok(await page.locator('#compare').isDisabled());
  await snap(page, 'reset');
  assert.ok((await snapDiff(page, 'original', 'reset')).mean < 0.5, 'reset did not show the original');

  // A chain of two steps reports both times.
  await page.selectOption('#filter-select', 'sharpen');
  await page.click('#apply-filter');
  await page.waitForSelector('#filter-panel[data-state="done"]');
  await page.selectOption('#filter-select', 'blur');
  await page.click('#apply-filter');
  await page.waitForFunction(() => document.querySelectorAll('#filter-chain li').length === 2 && document.querySelector('#filter-panel').dataset.state === 'done');
  assert.match(await page.textContent('#filter-time'), /sharpen \d+(\.\d+)? ms.*blur \d+(\.\d+)? ms/);
  // The progress label says the work is done once it is.
  await page.waitForFunction(() => window.blobstream.lastProgress?.done);
  assert.match(await page.evaluate(() => window.blobstream.lastProgress.label), /^Filtered /);

  // On CT, a filter that makes grey levels (edge) shows no Hounsfield units; the original
  // does. Nor does invert, whose result keeps the scale (and the window) but not the meaning.
  for (const filter of ['edge', 'invert']) {
    await openImage(page, 'samples/test-card.png');
    await openImage(page, 'samples/ct-phantom.dcm');
    assert.match(await page.textContent('#wl-readout'), / HU$/);
    await page.selectOption('#filter-select', filter);
    await page.click('#apply-filter');
    await page.waitForSelector('#filter-panel[data-state="done"]');
    await page.waitForFunction(() => !/HU/.test(document.querySelector('#wl-readout').textContent));
    // Edge's grey levels show on their own scale: the readout says the window is the original's.
    if (filter === 'edge') assert.match(await page.textContent('#wl-readout'), /result on its own scale/);
  }
  // The metadata panel shows clinical tags, not how the decoder stored the pixels.
  const metaText = await page.textContent('#meta-table');
  assert.match(metaText, /Patient/);
  assert.doesNotMatch(metaText, /Pixel offset|Frames decoded|pixel scale/i);
  await assertNoErrors(page);
});

test('filter: save a CT result as values or as shown', { timeout: 120_000 }, async () => {
  await openApp(page, server.url);
  await openFolder(page, 'samples/');
  await openImage(page, 'samples/ct-phantom.dcm');
  await page.selectOption('#filter-select', 'blur');
  await page.click('#apply-filter');
  await page.waitForSelector('#filter-panel[data-state="done"]');
  await page.click('.preset[data-preset="lung"]');
  await nextFrame(page);
  const save = async (name, what) => {
    await page.fill('#save-name', name);
    await page.selectOption('#save-what', what);
    await page.click('#save-result');
    await page.waitForFunction((n) => document.querySelector('#status').textContent.includes(`Saved ${n}`) || !document.querySelector('#error').hidden, name);
    assert.match(await page.textContent('#status'), new RegExp(`Saved ${name}`), await page.textContent('#error'));
    return Buffer.from(await (await fetch(new URL(`blobs/${name}`, server.url))).arrayBuffer());
  };
  // Values: the 16-bit samples (PNG bit depth, byte 24 of the file, is 16).
  const values = await save('samples/ct-blur-values.png', 'values');
  assert.equal(values[24], 16, 'the values are saved at full depth');
  // As shown: an 8-bit picture whose every pixel is the one on screen (the lung window).
  const shown = await save('samples/ct-blur-shown.png', 'shown');
  assert.equal(shown[24], 8, 'the picture is 8-bit');
  const mismatched = await page.evaluate(async (bytes) => {
    const want = window.blobstream.resultPicture();
    const bitmap = await createImageBitmap(new Blob([new Uint8Array(bytes)], { type: 'image/png' }));
    const c = new OffscreenCanvas(bitmap.width, bitmap.height);
    const ctx = c.getContext('2d');
    ctx.drawImage(bitmap, 0, 0);
    const got = ctx.getImageData(0, 0, c.width, c.height);
    if (got.width !== want.width || got.height !== want.height) return -1;
    let n = 0;
    for (let i = 0; i < got.data.length; i++) if (got.data[i] !== want.data[i]) n++;
    return n;
  }, [...shown]);
  assert.equal(mismatched, 0, 'the saved picture differs from the one shown');
  // A picture cannot be saved as TIFF: said, nothing stored.
  await page.fill('#save-name', 'samples/ct-blur-shown.tif');
  await page.click('#save-result');
  await page.waitForFunction(() => !document.querySelector('#error').hidden);
  assert.match(await page.textContent('#error'), /As shown" saves a PNG or JPEG/);
  assert.equal((await fetch(new URL('blobs/samples/ct-blur-shown.tif', server.url))).status, 404);
  // A name whose extension says no format it is saved in is refused, nothing stored.
  await page.selectOption('#save-what', 'values');
  await page.fill('#save-name', 'samples/ct-blur.bmp');
  await page.click('#save-result');
  await page.waitForFunction(() => /name the result/.test(document.querySelector('#error').textContent));
  assert.match(await page.textContent('#error'), /name the result \.png, \.jpg/);
  assert.equal((await fetch(new URL('blobs/samples/ct-blur.bmp', server.url))).status, 404);
  // GIF is saved as GIF.
  const gif = await save('samples/ct-blur.gif', 'values');
  assert.equal(gif.subarray(0, 4).toString(), 'GIF8');
});
