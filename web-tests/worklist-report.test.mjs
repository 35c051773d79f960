// Browser test: a study made of nothing but a structured report (no pixels at all), stored
// through STOW-RS, is in the worklist with its patient, 0 images and 1 instance; its series is
// listed as having nothing viewable and cannot be opened in the viewer.

import assert from 'node:assert/strict';
import { test } from 'node:test';
import { assertNoErrors, openApp, useApp } from './lib/browser.mjs';
import { element, part10 } from './lib/dicom.mjs';

let server;
let page;
useApp((app) => ({ server, page } = app));

/** A Part 10 Basic Text SR with the given UIDs and patient, and no pixel data. */
function report({ study, series, instance }) {
  const sop = '1.2.840.10008.5.1.4.1.1.88.11';
  return part10({ sop, instance, elements: [
    element(0x0008, 0x0016, 'UI', sop),
    element(0x0008, 0x0018, 'UI', instance),
    element(0x0008, 0x0020, 'DA', '20251126'),
    element(0x0008, 0x0060, 'CS', 'SR'),
    element(0x0008, 0x1030, 'LO', 'REPORT ONLY'),
    element(0x0010, 0x0010, 'PN', 'REPORT^RUTH'),
    element(0x0010, 0x0020, 'LO', 'RPT-0001'),
    element(0x0020, 0x000d, 'UI', study),
    element(0x0020, 0x000e, 'UI', series),
  ] });
}

test('worklist: a study of only a report is listed, its series not opened', { timeout: 120_000 }, async () => {
  const boundary = 'report-boundary';
  const file = report({ study: '2.25.1001', series: '2.25.1001.1', instance: '2.25.1001.1.1' });
  const body = Buffer.concat([
    Buffer.from(`--${boundary}\r\nContent-Type: application/dicom\r\n\r\n`),
    file,
    Buffer.from(`\r\n--${boundary}--\r\n`),
  ]);
  const stored = await fetch(`${server.url}dicomweb/studies`, {
    method: 'POST',
    headers: { 'content-type': `multipart/related; type="application/dicom"; boundary=${boundary}` },
    body,
  });
  assert.equal(stored.status, 200, await stored.text());

  await openApp(page, server.url);
  await page.click('#tab-studies');
  await page.waitForFunction(() => document.querySelector('#worklist').dataset.state === 'ready');
  await page.waitForFunction(() => document.querySelectorAll('#worklist-table tr.study').length === 2);
  const row = page.locator('#worklist-table tr.study', { hasText: 'RPT-0001' });
  const cells = await row.locator('td').allTextContents();
  assert.match(cells.join(' | '), /REPORT ONLY/);
  assert.match(cells.join(' | '), /SR/);
  assert.deepEqual(cells.slice(-3), ['1', '0', ''], 'one series, no image, no upload metadata');

  await row.click();
  const series = page.locator('#worklist-table button.series');
  await series.first().waitFor();
  assert.equal(await series.count(), 1);
  assert.match(await series.first().textContent(), /1 instance, none viewable/);
  assert.equal(await series.first().isDisabled(), true);
  await assertNoErrors(page);
});
