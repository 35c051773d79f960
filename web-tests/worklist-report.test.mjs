// Browser test: a study made of nothing but a structured report (no pixels at all), stored
// through STOW-RS, is in the worklist with its patient, 0 images and 1 instance; its series is
// listed as having nothing viewable and cannot be opened in the viewer, but its instance can
// be downloaded as the file stored and the report read as text (WADO-RS rendered: its title,
// patient and findings). A study holding a PDF report (Encapsulated PDF) offers the PDF
// itself, opened from WADO-RS rendered as application/pdf, byte for byte.

import assert from 'node:assert/strict';
import { test } from 'node:test';
import { assertNoErrors, openApp, useApp } from './lib/browser.mjs';
import { element, part10, sequence } from './lib/dicom.mjs';

/** A UL value. */
const ul = (n) => { const b = Buffer.alloc(4); b.writeUInt32LE(n); return b; };

let server;
let page;
useApp((app) => ({ server, page } = app));

/**
 * A Part 10 instance with no pixel data: SOP class `sop`, the given UIDs, date, modality,
 * description and patient, and `more` elements after them (tags past 0020,000E).
 */
function instance({ sop, study, series, instance, date, modality, description, patient, id, more = [] }) {
  return part10({ sop, instance, elements: [
    element(0x0008, 0x0016, 'UI', sop),
    element(0x0008, 0x0018, 'UI', instance),
    element(0x0008, 0x0020, 'DA', date),
    element(0x0008, 0x0060, 'CS', modality),
    element(0x0008, 0x1030, 'LO', description),
    element(0x0010, 0x0010, 'PN', patient),
    element(0x0010, 0x0020, 'LO', id),
    element(0x0020, 0x000d, 'UI', study),
    element(0x0020, 0x000e, 'UI', series),
    ...more,
  ] });
}

/** A code item: value, scheme DCM, meaning. */
const code = (value, meaning) => Buffer.concat([
  element(0x0008, 0x0100, 'SH', value),
  element(0x0008, 0x0102, 'SH', 'DCM'),
  element(0x0008, 0x0104, 'LO', meaning),
]);

/** An SR content item: relationship CONTAINS, its value type, concept name and `more`. */
const item = (type, name, more) => Buffer.concat([
  element(0x0040, 0xa010, 'CS', 'CONTAINS'),
  element(0x0040, 0xa040, 'CS', type),
  sequence(0x0040, 0xa043, [code('1', name)]),
  ...more,
]);

/** A Basic Text SR: an imaging report with a finding in words and a measurement. */
const report = (uids) => instance({
  ...uids, sop: '1.2.840.10008.5.1.4.1.1.88.11', date: '20251126', modality: 'SR',
  description: 'REPORT ONLY', patient: 'REPORT^RUTH', id: 'RPT-0001',
  more: [
    element(0x0040, 0xa040, 'CS', 'CONTAINER'),
    sequence(0x0040, 0xa043, [code('18748-4', 'Imaging Report')]),
    sequence(0x0040, 0xa730, [
      item('TEXT', 'Findings', [element(0x0040, 0xa160, 'UT', 'No acute intracranial abnormality.')]),
      item('NUM', 'Diameter', [sequence(0x0040, 0xa300, [Buffer.concat([
        sequence(0x0040, 0x08ea, [code('mm', 'millimeter')]),
        element(0x0040, 0xa30a, 'DS', '12.5'),
      ])])]),
    ]),
  ],
});

/** The PDF of the report study: an odd length, so the element is padded and cut back. */
const PDF = Buffer.from('%PDF-1.4\n1 0 obj << /Type /Catalog >> endobj\ntrailer << /Root 1 0 R >>\n%%EOF\n', 'latin1');

/** An Encapsulated PDF carrying `PDF`. */
const pdfReport = (uids) => instance({
  ...uids, sop: '1.2.840.10008.5.1.4.1.1.104.1', date: '20251127', modality: 'DOC',
  description: 'PDF REPORT', patient: 'PAPER^PAULA', id: 'PDF-0001',
  more: [
    element(0x0042, 0x0011, 'OB', PDF),
    element(0x0042, 0x0012, 'LO', 'application/pdf'),
    element(0x0042, 0x0015, 'UL', ul(PDF.length)),
  ],
});

/** Fetch `href` in the page: its status, content type and bytes (base64). */
function fetched(href) {
  return page.evaluate(async (u) => {
    const r = await fetch(u);
    const b = new Uint8Array(await r.arrayBuffer());
    let bin = '';
    for (const x of b) bin += String.fromCharCode(x);
    return { status: r.status, type: r.headers.get('content-type'), b64: btoa(bin) };
  }, href);
}

test('worklist: a study of only a report is listed, its series not opened', { timeout: 120_000 }, async () => {
  assert.equal(PDF.length % 2, 1);
  const boundary = 'report-boundary';
  const file = report({ study: '2.25.1001', series: '2.25.1001.1', instance: '2.25.1001.1.1' });
  const pdf = pdfReport({ study: '2.25.1002', series: '2.25.1002.1', instance: '2.25.1002.1.1' });
  const part = (f) => [Buffer.from(`--${boundary}\r\nContent-Type: application/dicom\r\n\r\n`), f, Buffer.from('\r\n')];
  const body = Buffer.concat([...part(file), ...part(pdf), Buffer.from(`--${boundary}--\r\n`)]);
  const stored = await fetch(`${server.url}dicomweb/studies`, {
    method: 'POST',
    headers: { 'content-type': `multipart/related; type="application/dicom"; boundary=${boundary}` },
    body,
  });
  assert.equal(stored.status, 200, await stored.text());

  await openApp(page, server.url);
  await page.click('#tab-studies');
  await page.waitForFunction(() => document.querySelector('#worklist').dataset.state === 'ready');
  await page.waitForFunction(() => document.querySelectorAll('#worklist-table tr.study').length === 3);
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
  // Its one instance: downloaded as stored, not opened (a report with no document in it).
  const docs = page.locator('#worklist-table .series-docs');
  await docs.locator('a.download').first().waitFor();
  assert.equal(await docs.locator('a.document').count(), 0);
  const dl = await fetched(await docs.locator('a.download').getAttribute('href'));
  assert.equal(dl.status, 200);
  assert.equal(dl.type, 'application/dicom');
  assert.ok(Buffer.from(dl.b64, 'base64').equals(file), 'the download is the file stored');
  // ...and read as text in a new tab.
  const read = docs.locator('a.report');
  assert.equal(await read.getAttribute('target'), '_blank');
  const text = await fetched(await read.getAttribute('href'));
  assert.equal(text.status, 200);
  assert.equal(text.type, 'text/plain; charset=utf-8');
  const lines = Buffer.from(text.b64, 'base64').toString('utf8').split('\n');
  assert.equal(lines[0], 'Imaging Report');
  assert.ok(lines.includes('Patient: REPORT^RUTH'), lines.join('\n'));
  assert.ok(lines.includes('Findings: No acute intracranial abnormality.'), lines.join('\n'));
  assert.ok(lines.includes('Diameter: 12.5 mm'), lines.join('\n'));

  // The PDF report: opened as itself, byte for byte.
  const paper = page.locator('#worklist-table tr.study', { hasText: 'PDF-0001' });
  await paper.click();
  const open = page.locator('#worklist-table .series-docs a.document');
  await open.waitFor();
  assert.equal(await open.getAttribute('target'), '_blank');
  const got = await fetched(await open.getAttribute('href'));
  assert.equal(got.status, 200);
  assert.equal(got.type, 'application/pdf');
  assert.ok(Buffer.from(got.b64, 'base64').equals(PDF), 'the PDF is the one stored, its padding cut');
  // Asked as an image, the document says what it is instead.
  const asImage = await page.evaluate(async (u) => {
    const r = await fetch(u, { headers: { Accept: 'image/png' } });
    return { status: r.status, text: await r.text() };
  }, await open.getAttribute('href'));
  assert.equal(asImage.status, 406);
  assert.match(asImage.text, /application\/pdf/);
  await assertNoErrors(page);
});
