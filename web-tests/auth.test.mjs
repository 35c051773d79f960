// Browser test: a server started with --auth-token-file. The page asks for the token (a wrong
// one is refused with a message), then browses and shows thumbnails through the session cookie.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, test } from 'node:test';
import { newPage, openFolder, screenshot, useApp } from './lib/browser.mjs';

const tokenDir = fs.mkdtempSync(path.join(os.tmpdir(), 'bs-auth-'));
const tokenFile = path.join(tokenDir, 'token');
fs.writeFileSync(tokenFile, 'browser-s3cret\n');

let server;
let browser;
useApp((app) => ({ server, browser } = app), {
  args: () => ['--auth-token-file', tokenFile],
  withPage: false,
});

after(() => fs.rmSync(tokenDir, { recursive: true, force: true }));

test('auth: the page asks for the token and then works', async () => {
  // Without the token the API refuses.
  const denied = await fetch(`${server.url}api/list`);
  assert.equal(denied.status, 401);

  const page = await newPage(browser, server.url);
  const answers = ['wrong-token', 'browser-s3cret'];
  const seen = [];
  page.on('dialog', async (d) => {
    seen.push(`${d.type()}: ${d.message()}`);
    if (d.type() === 'prompt') await d.accept(answers.shift());
    else await d.accept();
  });
  await page.goto(server.url);
  await page.waitForFunction(() => window.blobstream?.ready === true);
  assert.ok(seen[0].startsWith('prompt: This blobstream server requires its access token'), seen.join(' | '));
  assert.ok(seen.some((s) => s.startsWith('alert:') && /token|authentication/i.test(s)), seen.join(' | '));
  assert.equal(seen.filter((s) => s.startsWith('prompt')).length, 2);

  await openFolder(page, 'samples/');
  const tiles = page.locator('#listing .tile');
  assert.equal(await tiles.count(), 3);
  await page.waitForFunction(() =>
    [...document.querySelectorAll('#listing img.thumb')].every((i) => i.complete && i.naturalWidth > 0),
  );
  await screenshot(page, 'auth-logged-in');
  assert.equal(await page.locator('#error').isVisible(), false);
  await page.close();
});
