// Browser test: the CT phantom opens on the canvas with its stored window (W 400 / L 40);
// right-drag and Shift+drag change window/level and the pixels, presets set the window, the
// wheel zooms and a double-click fits again, the pixel readout follows the cursor.

import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  assertNoErrors,
  canvasBox,
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

const readout = () => page.textContent('#wl-readout');
const zoomPercent = async () => Number((await page.textContent('#zoom-readout')).replace('%', ''));

test('view: CT phantom with window/level, presets, zoom', { timeout: 120_000 }, async () => {
  await openApp(page, server.url);
  await openFolder(page, 'samples/');
  await openImage(page, 'samples/ct-phantom.dcm');

  assert.match(await readout(), /^W 400 \/ L 40\b/);
  const firstImageMs = await page.evaluate(() => window.blobstream.firstImageMs);
  assert.ok(typeof firstImageMs === 'number' && firstImageMs > 0, `firstImageMs ${firstImageMs}`);
  assert.ok(await page.locator('.preset[data-preset="lung"]').isVisible());
  assert.ok(await page.locator('.preset[data-preset="default"]').isVisible());
  assert.ok(await page.locator('.preset[data-preset="full"]').isVisible());
  assert.ok(await page.locator('.preset[data-preset="auto"]').isVisible());
  assert.match(await page.textContent('#meta-table'), /PHANTOM/);
  assert.match(await page.textContent('#meta-table'), /BS-0001/);
  await snap(page, 'stored');
  await screenshot(page, 'view-ct');

  // Something is drawn: the phantom is not one flat colour.
  const spread = await page.evaluate(() => {
    const c = document.querySelector('#canvas');
    const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
    let lo = 255;
    let hi = 0;
    for (let i = 0; i < d.length; i += 4 * 97) {
      lo = Math.min(lo, d[i]);
      hi = Math.max(hi, d[i]);
    }
    return hi - lo;
  });
  assert.ok(spread > 50, `canvas looks flat (grey spread ${spread})`);

  // Pixel value under the cursor.
  const box = await canvasBox(page);
  await page.mouse.move(box.cx, box.cy);
  await page.waitForFunction(() => /^\d+, \d+: -?\d/.test(document.querySelector('#pixel-readout').textContent));

  // Right-drag: window (horizontal) and level (vertical).
  await page.mouse.down({ button: 'right' });
  await page.mouse.move(box.cx + 150, box.cy + 80, { steps: 6 });
  await page.mouse.up({ button: 'right' });
  await page.waitForFunction(() => !/^W 400 \/ L 40\b/.test(document.querySelector('#wl-readout').textContent));
  const dragged = await readout();
  assert.match(dragged, /^W \d+ \/ L -?\d+/);
  const [, w1, l1] = /^W (\d+) \/ L (-?\d+)/.exec(dragged).map(Number);
  assert.ok(w1 > 400, `width should grow when dragging right: ${dragged}`);
  assert.ok(l1 !== 40, `level should change when dragging down: ${dragged}`);
  await snap(page, 'dragged');
  const d1 = await snapDiff(page, 'stored', 'dragged');
  assert.ok(d1.changed > 0.01, `right-drag did not change the canvas: ${JSON.stringify(d1)}`);

  // The context menu stays away, and the view did not pan (right-drag is not a pan).
  // Shift + left-drag also windows.
  await page.keyboard.down('Shift');
  await page.mouse.move(box.cx, box.cy);
  await page.mouse.down();
  await page.mouse.move(box.cx - 100, box.cy - 40, { steps: 5 });
  await page.mouse.up();
  await page.keyboard.up('Shift');
  await page.waitForFunction((prev) => document.querySelector('#wl-readout').textContent !== prev, dragged);

  // Presets.
  await page.locator('.preset[data-preset="lung"]').click();
  assert.match(await readout(), /^W 1500 \/ L -600\b/);
  await snap(page, 'lung');
  assert.ok((await snapDiff(page, 'stored', 'lung')).changed > 0.01, 'lung preset did not change the canvas');
  await page.locator('.preset[data-preset="brain"]').click();
  assert.match(await readout(), /^W 80 \/ L 40\b/);
  await page.locator('.preset[data-preset="default"]').click();
  assert.match(await readout(), /^W 400 \/ L 40\b/);
  await snap(page, 'default');
  const back = await snapDiff(page, 'stored', 'default');
  assert.ok(back.mean < 0.5, `default preset should redraw the stored window: ${JSON.stringify(back)}`);

  // A 120-pixel drag to the left narrows the window in proportion, never to nothing.
  await page.mouse.move(box.cx, box.cy);
  await page.mouse.down({ button: 'right' });
  await page.mouse.move(box.cx - 120, box.cy, { steps: 4 });
  await page.mouse.up({ button: 'right' });
  await page.waitForFunction(() => !/^W 400 \/ L 40\b/.test(document.querySelector('#wl-readout').textContent));
  const [, w2] = /^W (\d+)/.exec(await readout()).map(Number);
  assert.ok(w2 > 150 && w2 < 300, `a 120 px drag took the width from 400 to ${w2}`);
  await page.locator('.preset[data-preset="default"]').click();

  // Wheel zoom about the cursor, left-drag pan, double-click fits again.
  const fitZoom = await zoomPercent();
  await page.mouse.move(box.cx, box.cy);
  await page.mouse.wheel(0, -400);
  await page.waitForFunction((z) => Number(document.querySelector('#zoom-readout').textContent.replace('%', '')) > z, fitZoom);
  const zoomed = await zoomPercent();
  assert.ok(zoomed > fitZoom, `zoom ${zoomed}% should exceed ${fitZoom}%`);
  const pan0 = await page.evaluate(() => window.blobstream.view().panX);
  await page.mouse.down();
  await page.mouse.move(box.cx + 60, box.cy, { steps: 3 });
  await page.mouse.up();
  const pan1 = await page.evaluate(() => window.blobstream.view().panX);
  assert.ok(Math.abs(pan1 - pan0 - 60) < 1, `pan moved ${pan1 - pan0} px, expected 60`);
  await nextFrame(page);
  await screenshot(page, 'view-ct-zoomed');
  await page.mouse.dblclick(box.cx, box.cy);
  await page.waitForFunction((z) => Number(document.querySelector('#zoom-readout').textContent.replace('%', '')) === z, fitZoom);

  // A 16-bit PNG opens too, with the auto preset.
  await openImage(page, 'samples/xray-16bit.png');
  assert.ok(await page.locator('.preset[data-preset="auto"]').isVisible());
  assert.equal(await page.locator('.preset[data-preset="lung"]').count(), 0, 'CT presets on a non-CT image');
  await page.locator('.preset[data-preset="auto"]').click();
  assert.match(await readout(), /^W \d+ \/ L -?\d+/);
  await nextFrame(page);
  await screenshot(page, 'view-xray');
  await assertNoErrors(page);
});
