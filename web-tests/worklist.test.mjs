// Browser test: the Studies tab lists the seeded CT study (two series, 17 images) in a
// sortable worklist; a series opens in the series viewer, which scrolls slice by slice with the
// wheel, the keys and the slider, keeps the window the user set, fetches the neighbours ahead
// until every slice is cached, shows patient and slice n of m over the image, plays the
// slices as a loop (cine) and keeps a filter chain from slice to slice; metadata given at
// upload is shown and searched.

import assert from 'node:assert/strict';
import { test } from 'node:test';
import { assertNoErrors, canvasBox, openApp, screenshot, snap, snapDiff, useApp } from './lib/browser.mjs';

let server;
let page;
useApp((app) => ({ server, page } = app));

const stack = () => page.evaluate(() => window.blobstream.stack());
const shown = (i) => page.waitForFunction((i) => {
  const s = window.blobstream.stack();
  return s && s.index === i && document.querySelector('#view').dataset.state === 'ready' &&
    document.querySelector('#view-key').textContent.includes(s.key);
}, i);

test('worklist: studies, series, slice scrolling, prefetch, cine', { timeout: 180_000 }, async () => {
  await openApp(page, server.url);
  await page.click('#tab-studies');
  await page.waitForFunction(() => document.querySelector('#worklist').dataset.state === 'ready');
  const rows = page.locator('#worklist-table tr.study');
  assert.equal(await rows.count(), 1);
  const row = await rows.first().textContent();
  assert.match(row, /PHANTOM/);
  assert.match(row, /BS-0001/);
  assert.match(row, /CT/);
  assert.match(row, /SYNTHETIC HEAD PHANTOM/);
  const cells = await rows.first().locator('td').allTextContents();
  assert.deepEqual(cells.slice(-3), ['2', '17', ''], 'two series, 17 images, no upload metadata');
  assert.match(await page.textContent('#worklist-range'), /1–1 of 1 studies/);

  // Sorting: a click on a header sorts by it and says so.
  await page.click('#worklist-table th[data-col="patient"] button');
  await page.waitForFunction(() => document.querySelector('#worklist-table th[data-col="patient"]').getAttribute('aria-sort') === 'ascending');
  await page.waitForFunction(() => document.querySelector('#worklist').dataset.state === 'ready');
  // The search form filters the worklist too.
  await page.fill('#search-patient', 'nobody');
  await page.click('#search-submit');
  await page.waitForFunction(() => /No studies match/.test(document.querySelector('#worklist').textContent));
  await page.fill('#search-patient', 'phantom');
  await page.click('#search-submit');
  await page.waitForFunction(() => document.querySelectorAll('#worklist-table tr.study').length === 1);

  // The study's series; the 16-slice one opens in the series viewer.
  await page.locator('#worklist-table tr.study').first().click();
  const series = page.locator('#worklist-table button.series');
  await page.waitForFunction(() => document.querySelectorAll('#worklist-table button.series').length === 2);
  const labels = await series.allTextContents();
  assert.ok(labels.some((l) => /16 images/.test(l)), labels.join(' | '));
  await series.filter({ hasText: '16 images' }).click();
  await shown(0);
  let s = await stack();
  assert.equal(s.length, 16);
  assert.equal(s.key, 'samples/ct-series/slice-01.dcm');
  assert.match(await page.textContent('#stack-readout'), /slice 1 \/ 16/);
  assert.match(await page.textContent('#overlay-tl'), /PHANTOM/);
  assert.match(await page.textContent('#overlay-br'), /Im 1 \/ 16/);
  await screenshot(page, 'series-first');

  // Every slice ends up cached by fetching ahead, without the user scrolling.
  await page.waitForFunction(() => window.blobstream.stack().cached === 16, null, { timeout: 60_000 });

  // Window set by the user stays while scrolling.
  await page.click('.preset[data-preset="lung"]');
  const wl = await page.textContent('#wl-readout');
  assert.match(wl, /^W 1500 \/ L -600/);
  await snap(page, 'slice1');

  // Wheel: next slice; keys: next, End, Home; the slider.
  const box = await canvasBox(page);
  await page.mouse.move(box.cx, box.cy);
  await page.mouse.wheel(0, 120);
  await shown(1);
  assert.equal(await page.textContent('#wl-readout'), wl, 'the window stays');
  // A trackpad's small deltas add up: ten of 4 px (a small flick) move no slice, so the key
  // that follows moves to the next one.
  for (let i = 0; i < 10; i++) await page.mouse.wheel(0, 4);
  await page.keyboard.press('ArrowDown');
  await shown(2);
  await page.keyboard.press('End');
  await shown(15);
  assert.equal((await stack()).key, 'samples/ct-series/slice-16.dcm');
  await page.keyboard.press('Home');
  await shown(0);
  await page.locator('#stack-slider').fill('8');
  await shown(7);
  await snap(page, 'slice8');
  assert.match(await page.textContent('#overlay-br'), /Im 8 \/ 16/);
  // Slices differ: the phantom is smaller near the top of the head.
  const d = await snapDiff(page, 'slice1', 'slice8');
  assert.ok(d.changed > 0.01, `slices 1 and 8 look the same (${JSON.stringify(d)})`);
  await screenshot(page, 'series-slice8');

  // Cine: plays and stops.
  await page.click('#stack-play');
  await page.waitForFunction(() => window.blobstream.stack().index !== 7 && window.blobstream.stack().playing);
  await page.click('#stack-play');
  s = await stack();
  assert.equal(s.playing, false);

  // Filters apply to the whole series: a slice scrolled to comes through the same chain.
  await page.waitForFunction(() => document.querySelectorAll('#filter-select option').length > 0);
  await page.selectOption('#filter-select', 'invert');
  await page.click('#apply-filter');
  const filteredDone = () => page.waitForFunction(() =>
    window.blobstream.view().filtered && document.querySelector('#filter-panel').dataset.state === 'done');
  await filteredDone();
  // The nearest slices are filtered ahead: stepping to one shows its result without asking
  // the server again.
  const filterPosts = [];
  page.on('request', (r) => {
    if (r.method() === 'POST' && new URL(r.url()).pathname === '/api/filter') filterPosts.push(JSON.parse(r.postData()).key);
  });
  await page.waitForFunction(() => window.blobstream.stack().filtered >= 5, null, { timeout: 60_000 });
  const before = filterPosts.length;
  const at = (await stack()).index;
  const next = at + 1 < 16 ? at + 1 : at - 1;
  await page.locator('#stack-slider').fill(String(next + 1));
  await shown(next);
  await filteredDone();
  const nextKey = `samples/ct-series/slice-${String(next + 1).padStart(2, '0')}.dcm`;
  assert.equal((await page.evaluate(() => window.blobstream.view())).key, nextKey);
  assert.ok(!filterPosts.slice(before).includes(nextKey), `the neighbour came filtered from the cache (${filterPosts.slice(before)})`);
  await page.locator('#stack-slider').fill('4');
  await shown(3);
  await filteredDone();
  assert.equal((await page.evaluate(() => window.blobstream.view())).key, 'samples/ct-series/slice-04.dcm');
  assert.deepEqual(await page.locator('#filter-chain li').allTextContents().then((t) => t.map((x) => x.split(' — ')[0])), ['invert']);
  assert.deepEqual((await stack()).chain, ['invert'], 'the chain belongs to the series');
  await page.click('#reset-filter');
  assert.deepEqual((await stack()).chain, [], 'reset clears the series chain');
  await page.locator('#stack-slider').fill('5');
  await shown(4);
  await page.waitForFunction(() => window.blobstream.view().key === 'samples/ct-series/slice-05.dcm' &&
    document.querySelector('#filter-panel').dataset.state !== 'running');
  assert.equal((await page.evaluate(() => window.blobstream.view())).filtered, false, 'a reset chain stays reset');

  // The instances endpoint gives slice order from the image position, not the name.
  const v = await page.evaluate(async () => {
    const st = await (await fetch('/api/studies')).json();
    const uid = st.studies[0].study_uid;
    const se = await (await fetch(`/api/studies/${uid}/series`)).json();
    const big = se.series.find((x) => x.images === 16);
    return (await (await fetch(`/api/series/${big.series_uid}/instances`)).json()).instances.map((i) => i.key);
  });
  assert.equal(v.length, 16);
  assert.deepEqual(v, [...v].sort());

  // Metadata given at upload (as `blobstream put --meta` gives it) is shown in the worklist
  // and found by the free-text search. The copy sorts first, so it speaks for its study.
  const put = await page.evaluate(async () => {
    const bytes = await (await fetch('/blobs/samples/ct-series/slice-01.dcm')).arrayBuffer();
    const r = await fetch('/blobs/a-ward/copy.dcm', {
      method: 'PUT',
      headers: { 'X-Blobstream-Meta-Referral': 'Ward 7 follow-up' },
      body: bytes,
    });
    return r.status;
  });
  assert.equal(put, 201);
  await page.click('#tab-studies');
  await page.fill('#search-patient', '');
  await page.fill('#search-q', 'ward 7');
  await page.click('#search-submit');
  await page.waitForFunction(() => /referral: Ward 7 follow-up/.test(document.querySelector('#worklist-table td.notes')?.textContent || ''));
  assert.equal(await page.locator('#worklist-table tr.study').count(), 1);
  await page.fill('#search-q', 'ward 8');
  await page.click('#search-submit');
  await page.waitForFunction(() => /No studies match/.test(document.querySelector('#worklist').textContent));

  // A study uploaded while the Studies tab is open shows up in it without leaving the tab:
  // a copy of a slice with the study UID changed (same length, so the file stays valid).
  await page.fill('#search-q', '');
  await page.click('#search-submit');
  await page.waitForFunction(() => document.querySelectorAll('#worklist-table tr.study').length === 1);
  const { uid, bytes } = await page.evaluate(async () => {
    const st = await (await fetch('/api/studies')).json();
    const b = new Uint8Array(await (await fetch('/blobs/samples/ct-series/slice-01.dcm')).arrayBuffer());
    return { uid: st.studies[0].study_uid, bytes: [...b] };
  });
  const file = Buffer.from(bytes);
  const other = uid.slice(0, -1) + (uid.endsWith('9') ? '8' : '9');
  let replaced = 0;
  for (let at = file.indexOf(uid); at >= 0; at = file.indexOf(uid, at + 1)) {
    const next = file[at + uid.length];
    if (next === 0x2e || (next >= 0x30 && next <= 0x39)) continue; // a longer UID it begins
    file.write(other, at, 'latin1');
    replaced++;
  }
  assert.ok(replaced >= 1, 'the study UID is in the file');
  await page.setInputFiles('#file-input', { name: 'other-study.dcm', mimeType: 'application/dicom', buffer: file });
  await page.waitForFunction(() => document.querySelectorAll('#worklist-table tr.study').length === 2);
  assert.match(await page.textContent('#worklist-range'), /1–2 of 2 studies/);
  assert.equal(await page.locator('#worklist').isVisible(), true, 'the Studies tab stays open');
  await assertNoErrors(page);
});
