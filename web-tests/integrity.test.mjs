// Browser test: a blob found corrupt on disk is shown as corrupt — its tile has no preview and
// says so, opening it says why and offers no download — and the thumbnail the page had before
// the rot is not served again.

import assert from 'node:assert/strict';
import { open, readdir, readFile } from 'node:fs/promises';
import path from 'node:path';
import { test } from 'node:test';
import { openApp, openFolder, openImage, screenshot, useApp } from './lib/browser.mjs';

let server;
let page;
useApp((app) => ({ server, page } = app), { onDisk: true });

/** The file under the data directory holding exactly `bytes`. */
async function fileHolding(dataDir, bytes) {
  const root = path.join(dataDir, 'blobs');
  for (const shard of await readdir(root)) {
    for (const name of await readdir(path.join(root, shard))) {
      const file = path.join(root, shard, name);
      if (Buffer.compare(await readFile(file), bytes) === 0) return file;
    }
  }
  assert.fail('no file in the data directory holds the uploaded image');
}

test('integrity: a rotted image is shown as corrupt, never from what was cached', { timeout: 120_000 }, async () => {
  await openApp(page, server.url);
  // A noisy PNG, large enough (> 64 KiB) to be kept in a file of its own.
  const status = await page.evaluate(async () => {
    const c = document.createElement('canvas');
    c.width = c.height = 256;
    const ctx = c.getContext('2d');
    const img = ctx.createImageData(256, 256);
    let x = 12345;
    for (let i = 0; i < img.data.length; i++) {
      x = (x * 1103515245 + 12345) >>> 0;
      img.data[i] = i % 4 === 3 ? 255 : x >>> 24;
    }
    ctx.putImageData(img, 0, 0);
    const png = await new Promise((r) => c.toBlob(r, 'image/png'));
    const res = await fetch('/blobs/rot/noise.png', { method: 'PUT', body: png, headers: { 'Content-Type': 'image/png' } });
    return res.status;
  });
  assert.equal(status, 201);
  const original = Buffer.from(await (await fetch(new URL('blobs/rot/noise.png', server.url))).arrayBuffer());
  assert.ok(original.length > 64 << 10, `${original.length} bytes`);

  await openApp(page, server.url); // a listing that has the new folder
  await openFolder(page, 'rot/');
  const tile = '#listing .tile[data-key="rot/noise.png"]';
  await page.waitForFunction((t) => document.querySelector(`${t} img.thumb`)?.naturalWidth > 0, tile);
  await openImage(page, 'rot/noise.png');

  // One byte flips on disk; a download finds it and the server marks the blob corrupt.
  const file = await fileHolding(server.dataDir, original);
  const fh = await open(file, 'r+');
  await fh.write(Buffer.from([original[original.length >> 1] ^ 0x08]), 0, 1, original.length >> 1);
  await fh.close();
  const res = await fetch(new URL('blobs/rot/noise.png', server.url));
  assert.equal(res.status, 500);
  assert.match(await res.text(), /corrupt/);

  // The listing again: the tile says corrupt and asks for no thumbnail.
  await openApp(page, server.url);
  await openFolder(page, 'rot/');
  await page.waitForSelector(`${tile}.corrupt`);
  assert.equal(await page.locator(`${tile} img`).count(), 0, 'no preview of a corrupt blob');
  assert.match(await page.textContent(`${tile} .size`), /corrupt/);
  assert.match(await page.getAttribute(tile, 'title'), /CORRUPT: /);

  // Opening it says why, and offers nothing to download.
  await page.locator(tile).click();
  await page.waitForSelector('#view[data-state="error"]');
  assert.match(await page.textContent('#view-message-text'), /noise\.png is corrupt on the server: .*Restore it from a copy, or delete it/);
  assert.match(await page.textContent('#error-message'), /rot\/noise\.png is corrupt/);
  assert.equal(await page.isVisible('#download-link'), false);
  assert.match(await page.textContent('#meta-body'), /Corrupt/);
  assert.equal(await page.locator('#meta-body a').count(), 0, 'no download link in the metadata');
  await screenshot(page, 'corrupt-blob');

  // The thumbnail made before the rot is not served after the mark.
  const thumb = await fetch(new URL('api/thumbnail/rot/noise.png?size=128', server.url));
  assert.equal(thumb.status, 500);
  assert.match(await thumb.text(), /corrupt/);
  assert.deepEqual(page.pageErrors, [], "uncaught errors in the page");
});
