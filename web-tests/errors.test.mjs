// Browser test: failures are shown as readable messages from the server's JSON errors, in a
// dismissible banner, and the page keeps working afterwards.

import assert from 'node:assert/strict';
import { test } from 'node:test';
import { openApp, openFolder, openImage, screenshot, useApp } from './lib/browser.mjs';

let server;
let page;
useApp((app) => ({ server, page } = app));

function assertReadable(message) {
  assert.ok(message && message.trim().length > 10, `error message too short: ${JSON.stringify(message)}`);
  assert.doesNotMatch(message, /\[object |undefined|^\s*\{/, `unreadable error message: ${message}`);
}

test('errors: a corrupt image and a bad filter parameter', { timeout: 120_000 }, async () => {
  await openApp(page, server.url);
  const status = await page.evaluate(async () => {
    const garbage = new Uint8Array(4096);
    for (let i = 0; i < garbage.length; i++) garbage[i] = (i * 7919 + 13) % 251;
    const res = await fetch('/blobs/samples/bad.png', { method: 'PUT', body: garbage, headers: { 'Content-Type': 'image/png' } });
    return res.status;
  });
  assert.equal(status, 201);

  await openFolder(page, 'samples/');
  await page.locator('#listing .tile[data-key="samples/bad.png"]').click();
  await page.waitForSelector('#view[data-state="error"]');
  const banner = page.locator('#error');
  await banner.waitFor({ state: 'visible' });
  assert.equal(await banner.getAttribute('role'), 'alert');
  const message = await page.textContent('#error-message');
  assertReadable(message);
  assert.match(message, /bad\.png/);
  assert.equal(await page.evaluate(() => window.blobstream.lastError), message);
  assert.match(await page.textContent('#view-message-text'), /Could not open bad\.png/);
  await screenshot(page, 'error-corrupt-image');

  // Dismiss, and the page still works: another image opens.
  await page.click('#error-close');
  await banner.waitFor({ state: 'hidden' });
  await openImage(page, 'samples/ct-phantom.dcm');

  // A filter parameter out of range comes back as the server's message.
  await page.selectOption('#filter-select', 'blur');
  await page.fill('#filter-params input[name="size"]', '999');
  await page.click('#apply-filter');
  await page.waitForSelector('#filter-panel[data-state="error"]');
  await banner.waitFor({ state: 'visible' });
  const filterMessage = await page.textContent('#error-message');
  assertReadable(filterMessage);
  assert.match(filterMessage, /blur/);
  assert.equal(await page.getAttribute('#view', 'data-state'), 'ready', 'the image stays on screen');
  await screenshot(page, 'error-filter-param');

  // An image that fails to open after one that opened: nothing of the first stays beside the
  // second's name — not its patient (overlay, metadata), its filters, its save name, its link.
  await page.click('#error-close');
  await page.selectOption('#filter-select', 'invert');
  await page.click('#apply-filter');
  await page.waitForSelector('#filter-panel[data-state="done"]');
  assert.equal(await page.isVisible('#overlay'), true, 'the CT shows its overlay');
  await page.locator('#listing .tile[data-key="samples/bad.png"]').click();
  await page.waitForSelector('#view[data-state="error"]');
  assert.equal(await page.isVisible('#overlay'), false, 'no overlay of the CT');
  assert.equal((await page.textContent('#meta-body')).trim(), '', 'no metadata of the CT');
  assert.doesNotMatch(await page.inputValue('#save-name'), /ct-phantom/);
  assert.equal(await page.getAttribute('#filter-panel', 'data-state'), 'idle');
  assert.match(await page.evaluate(() => location.hash), /bad\.png/);

  // A missing blob: the server's not_found message.
  const res = await fetch(new URL('api/meta/samples/missing.png', server.url));
  assert.equal(res.status, 404);
  const body = await res.json();
  assert.equal(body.error.code, 'not_found');
  assert.deepEqual(page.pageErrors, [], 'uncaught errors in the page');
});
