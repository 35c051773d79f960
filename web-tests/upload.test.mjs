// Browser test: upload a PNG through the file picker and another by dropping it on the page;
// both show progress, appear as tiles with thumbnails and are in the store; then delete one.

import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';
import {
  assertNoErrors,
  openApp,
  openFolder,
  openImage,
  screenshot,
  useApp,
} from './lib/browser.mjs';

let server;
let page;
let dir;
useApp((app) => ({ server, page } = app));

before(async () => {
  dir = await mkdtemp(path.join(tmpdir(), 'blobstream-upload-'));
});

after(async () => {
  if (dir) await rm(dir, { recursive: true, force: true });
});

const thumbLoaded = (key) =>
  page.waitForFunction((k) => {
    const img = document.querySelector(`.tile[data-key="${k}"] img.thumb`);
    return img && img.complete && img.naturalWidth > 0;
  }, key);

test('upload: file picker and drag-and-drop', { timeout: 120_000 }, async () => {
  const sample = await fetch(new URL('blobs/samples/test-card.png', server.url));
  assert.equal(sample.status, 200);
  const bytes = Buffer.from(await sample.arrayBuffer());
  const file = path.join(dir, 'picked card.png');
  await writeFile(file, bytes);

  await openApp(page, server.url);

  // File picker, into the store root. The name has a space: keys are percent-encoded.
  await page.setInputFiles('#file-input', file);
  const tile = page.locator('#listing .tile[data-key="picked card.png"]');
  await tile.waitFor();
  await thumbLoaded('picked card.png');
  const prog = await page.evaluate(() => window.blobstream.lastProgress);
  assert.ok(prog && prog.done && prog.loaded === bytes.length, `progress: ${JSON.stringify(prog)}`);
  assert.match(prog.label, /Uploaded 1 file/);
  assert.match(await page.textContent('#status'), /Uploaded picked card\.png/);
  // The new tile is marked as new, not as selected: nothing is open in the viewer.
  assert.ok(await tile.evaluate((t) => t.classList.contains('fresh') && !t.classList.contains('selected')));
  await screenshot(page, 'upload-picked');
  const stored = await fetch(new URL('blobs/picked%20card.png', server.url));
  assert.equal(stored.status, 200);
  assert.equal(Buffer.compare(Buffer.from(await stored.arrayBuffer()), bytes), 0, 'stored bytes differ');

  // Drag and drop into samples/.
  await openFolder(page, 'samples/');
  const dt = await page.evaluateHandle(async () => {
    const blob = await (await fetch('/blobs/samples/test-card.png')).blob();
    const t = new DataTransfer();
    t.items.add(new File([blob], 'dropped.png', { type: 'image/png' }));
    return t;
  });
  await page.dispatchEvent('#canvas', 'dragenter', { dataTransfer: dt });
  await page.locator('#drop-overlay').waitFor({ state: 'visible' });
  assert.match(await page.textContent('#drop-overlay'), /samples\//);
  await screenshot(page, 'upload-drop-overlay');
  await page.dispatchEvent('#canvas', 'drop', { dataTransfer: dt });
  assert.ok(await page.locator('#drop-overlay').isHidden());
  await page.locator('#listing .tile[data-key="samples/dropped.png"]').waitFor();
  await thumbLoaded('samples/dropped.png');
  assert.match(await page.textContent('#status'), /Uploaded samples\/dropped\.png/);
  assert.equal(await page.locator('#listing .tile').count(), 4);
  await screenshot(page, 'upload-dropped');

  // From search results too, a name already taken is asked about before it is replaced
  // (the results are no listing of the folder: the server is asked); declined, nothing moves.
  const etag = async () => (await fetch(new URL('blobs/samples/test-card.png', server.url), { method: 'HEAD' })).headers.get('etag');
  const before = await etag();
  await page.fill('#search-q', 'card');
  await page.click('#search-submit');
  await page.locator('#results-bar').waitFor({ state: 'visible' });
  const other = await page.evaluateHandle(() => {
    const t = new DataTransfer();
    t.items.add(new File([new Uint8Array([1, 2, 3])], 'test-card.png', { type: 'image/png' }));
    return t;
  });
  const asked = page.waitForEvent('dialog');
  await page.dispatchEvent('#canvas', 'drop', { dataTransfer: other });
  const dialog = await asked;
  assert.match(dialog.message(), /Replace samples\/test-card\.png/);
  await dialog.dismiss();
  assert.equal(await etag(), before, 'declined: the stored card is unchanged');
  await page.click('#clear-search');
  await page.locator('#results-bar').waitFor({ state: 'hidden' });

  // The uploaded image opens, and can be deleted (after confirming).
  await openImage(page, 'samples/dropped.png');
  page.once('dialog', (d) => d.accept());
  await page.locator('.tile.selected[data-key="samples/dropped.png"] .delete-btn').click();
  await page.locator('#listing .tile[data-key="samples/dropped.png"]').waitFor({ state: 'detached' });
  assert.match(await page.textContent('#status'), /Deleted samples\/dropped\.png/);
  assert.equal(await page.getAttribute('#view', 'data-state'), 'empty');
  const gone = await fetch(new URL('blobs/samples/dropped.png', server.url));
  assert.equal(gone.status, 404);
  await assertNoErrors(page);

  // The server unreachable as an upload goes: the upload's failure stays readable, and the
  // listing's that follows is said after it, not instead.
  await page.route('**/blobs/**', (r) => r.abort());
  await page.route('**/api/list?**', (r) => r.abort());
  const lost = await page.evaluateHandle(() => {
    const t = new DataTransfer();
    t.items.add(new File([new Uint8Array([9, 9, 9])], 'lost.png', { type: 'image/png' }));
    return t;
  });
  await page.dispatchEvent('#canvas', 'drop', { dataTransfer: lost });
  await page.waitForFunction(() => /then: Could not list/.test(document.querySelector('#error-message').textContent));
  assert.match(await page.textContent('#error-message'), /^Upload failed: lost\.png/);
  await page.unrouteAll();
});
