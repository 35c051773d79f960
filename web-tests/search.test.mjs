// Browser test: metadata search by modality, free text, patient and study date; results show
// as tiles with a count, and the search can be cleared back to the folder.

import assert from 'node:assert/strict';
import { test } from 'node:test';
import { assertNoErrors, openApp, openImage, screenshot, useApp } from './lib/browser.mjs';

let server;
let page;
useApp((app) => ({ server, page } = app));

/** Clear any previous search, fill the form, submit, and return the heading and tile keys. */
async function search(fields) {
  if (await page.locator('#clear-search').isVisible()) {
    await page.click('#clear-search');
    await page.locator('#results-bar').waitFor({ state: 'hidden' });
  }
  for (const [sel, value] of Object.entries(fields)) {
    if (sel === '#search-modality') await page.selectOption(sel, value);
    else await page.fill(sel, value);
  }
  await page.click('#search-submit');
  await page.locator('#results-bar').waitFor({ state: 'visible' });
  const heading = await page.textContent('#results-heading');
  const keys = await page.locator('#listing .tile').evaluateAll((ts) => ts.map((t) => t.dataset.key));
  return { heading, keys };
}

// The seeded CT images: the phantom and the 16 slices of the sample series, in name order.
const CT = ['samples/ct-phantom.dcm', ...Array.from({ length: 16 }, (_, i) => `samples/ct-series/slice-${String(i + 1).padStart(2, '0')}.dcm`)];

test('search: modality, free text, patient, dates', { timeout: 120_000 }, async () => {
  await openApp(page, server.url);

  let r = await search({ '#search-modality': 'CT' });
  assert.equal(r.heading, '17 results');
  assert.deepEqual(r.keys, CT);
  await screenshot(page, 'search-ct');

  r = await search({ '#search-q': 'nothing-matches-this' });
  assert.equal(r.heading, '0 results');
  assert.deepEqual(r.keys, []);
  await screenshot(page, 'search-none');

  r = await search({ '#search-patient': 'PHANTOM' });
  assert.deepEqual(r.keys, CT);

  r = await search({ '#search-date-from': '2026-01-01', '#search-date-to': '2026-01-01' });
  assert.deepEqual(r.keys, CT);
  r = await search({ '#search-date-from': '2026-01-02' });
  assert.deepEqual(r.keys, []);

  r = await search({ '#search-q': 'test-card' });
  assert.ok(r.keys.includes('samples/test-card.png'), `free text: ${r.keys}`);

  // A result opens in the viewer; clearing the search shows the folder again.
  r = await search({ '#search-q': 'slice-07' });
  assert.deepEqual(r.keys, ['samples/ct-series/slice-07.dcm']);
  r = await search({ '#search-patient': 'BS-0001' });
  assert.deepEqual(r.keys, CT);
  await openImage(page, 'samples/ct-phantom.dcm');
  await page.click('#clear-search');
  await page.locator('#listing .folder[data-prefix="samples/"]').waitFor();
  assert.ok(await page.locator('#results-bar').isHidden());
  assert.equal(await page.inputValue('#search-patient'), '');
  await assertNoErrors(page);
});
