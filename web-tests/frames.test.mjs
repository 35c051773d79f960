// Browser test: a multi-frame DICOM image opened on its own becomes a stack of its frames —
// every frame decoded and drawn (not just the first), stepped with the keys and the slider,
// played as a loop (cine), with "frame n / m" over the image.

import assert from 'node:assert/strict';
import { test } from 'node:test';
import { assertNoErrors, nextFrame, openApp, openFolder, openImage, screenshot, snap, snapDiff, useApp } from './lib/browser.mjs';
import { element, part10, us } from './lib/dicom.mjs';

let server;
let page;
useApp((app) => ({ server, page } = app));

const FRAMES = 6;
const SIDE = 64;

/**
 * A multi-frame 8-bit MONOCHROME2 DICOM file: frame f is a bright square at a place of its
 * own on a dark field, so every frame draws differently.
 */
function multiFrameDicom() {
  const pixels = Buffer.alloc(FRAMES * SIDE * SIDE, 20);
  for (let f = 0; f < FRAMES; f++) {
    for (let y = 4; y < 20; y++) {
      for (let x = 0; x < 16; x++) pixels[f * SIDE * SIDE + y * SIDE + 4 + f * 8 + x] = 240;
    }
  }
  const sop = '1.2.840.10008.5.1.4.1.1.7.2'; // Multi-frame Grayscale Byte SC
  const uid = '1.2.826.0.1.3680043.10.543.7';
  return part10({ sop, instance: `${uid}.3`, elements: [
    element(0x0008, 0x0016, 'UI', sop),
    element(0x0008, 0x0018, 'UI', `${uid}.3`),
    element(0x0008, 0x0060, 'CS', 'OT'),
    element(0x0010, 0x0010, 'PN', 'CINE^TEST'),
    element(0x0010, 0x0020, 'LO', 'BS-CINE'),
    element(0x0018, 0x1063, 'DS', '40'), // Frame Time, ms
    element(0x0020, 0x000d, 'UI', `${uid}.1`),
    element(0x0020, 0x000e, 'UI', `${uid}.2`),
    element(0x0028, 0x0002, 'US', us(1)),
    element(0x0028, 0x0004, 'CS', 'MONOCHROME2'),
    element(0x0028, 0x0008, 'IS', String(FRAMES)),
    element(0x0028, 0x0009, 'AT', Buffer.from([0x18, 0x00, 0x63, 0x10])), // Frame Increment Pointer: Frame Time
    element(0x0028, 0x0010, 'US', us(SIDE)),
    element(0x0028, 0x0011, 'US', us(SIDE)),
    element(0x0028, 0x0100, 'US', us(8)),
    element(0x0028, 0x0101, 'US', us(8)),
    element(0x0028, 0x0102, 'US', us(7)),
    element(0x0028, 0x0103, 'US', us(0)),
    element(0x7fe0, 0x0010, 'OB', pixels),
  ] });
}

const stack = () => page.evaluate(() => window.blobstream.stack());
// Frame i is the one loaded and drawn (not only the one the stack points at).
const shown = async (i) => {
  await page.waitForFunction((i) => {
    const s = window.blobstream.stack();
    return s && s.index === i && window.blobstream.view().frame === i &&
      document.querySelector('#view').dataset.state === 'ready';
  }, i);
  await nextFrame(page);
};

test('frames: a multi-frame image is a stack of every frame, with cine', { timeout: 120_000 }, async () => {
  const put = await fetch(new URL('blobs/cine/loop.dcm', server.url), { method: 'PUT', body: multiFrameDicom() });
  assert.equal(put.status, 201, await put.text());
  // The server decodes every frame: the last one has its own square.
  const last = await fetch(new URL(`api/pixels/cine/loop.dcm?frame=${FRAMES - 1}`, server.url));
  assert.equal(last.status, 200);
  assert.equal(last.headers.get('x-frames'), String(FRAMES));
  const beyond = await fetch(new URL(`api/pixels/cine/loop.dcm?frame=${FRAMES}`, server.url));
  assert.ok(beyond.status >= 400 && beyond.status < 500, `frame ${FRAMES} of ${FRAMES}: ${beyond.status}`);

  await openApp(page, server.url);
  await openFolder(page, 'cine/');
  await openImage(page, 'cine/loop.dcm');
  await shown(0);
  let s = await stack();
  assert.equal(s.kind, 'frames');
  assert.equal(s.length, FRAMES);
  assert.match(await page.textContent('#stack-readout'), new RegExp(`frame 1 / ${FRAMES}`));
  await snap(page, 'frame-1');

  // Every frame draws, each differently from the one before.
  for (let f = 1; f < FRAMES; f++) {
    await page.keyboard.press('ArrowDown');
    await shown(f);
    assert.match(await page.textContent('#stack-readout'), new RegExp(`frame ${f + 1} / ${FRAMES}`));
    s = await stack();
    assert.equal(s.frame, f);
    await snap(page, `frame-${f + 1}`);
    const d = await snapDiff(page, `frame-${f}`, `frame-${f + 1}`);
    assert.ok(d.changed > 0.001, `frame ${f + 1} draws like frame ${f}: ${JSON.stringify(d)}`);
  }
  await screenshot(page, 'frames-last');
  // The slider goes back; cine plays the frames as a loop and stops on a click.
  await page.locator('#stack-slider').fill('2');
  await shown(1);
  await page.click('#stack-play');
  await page.waitForFunction(() => window.blobstream.stack().playing && window.blobstream.stack().index !== 1);
  await page.waitForFunction(() => window.blobstream.stack().index === 0, null, { timeout: 30_000 });
  await page.click('#stack-play');
  s = await stack();
  assert.equal(s.playing, false);
  assert.equal(s.cached, FRAMES, 'every frame cached');
  await assertNoErrors(page);
});
