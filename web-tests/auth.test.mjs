// Browser test: a server started with --auth-token-file. The page asks for the token (a wrong
// one is refused with a message), then browses and shows thumbnails through the session cookie,
// which holds a session id (not the token) that logging out ends on the server.

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

  // The cookie is an HttpOnly session id, not the token.
  const cookies = await page.context().cookies();
  const session = cookies.find((c) => c.name === 'blobstream_session');
  assert.ok(session, JSON.stringify(cookies));
  assert.equal(session.httpOnly, true);
  assert.equal(session.sameSite, 'Strict');
  assert.ok(!session.value.includes('browser-s3cret'), session.value);
  assert.ok(!cookies.some((c) => c.value.includes('browser-s3cret')), JSON.stringify(cookies));
  const withCookie = () => fetch(`${server.url}api/list`, { headers: { cookie: `blobstream_session=${session.value}` } });
  assert.equal((await withCookie()).status, 200);

  // Logging out ends the session on the server: the page's cookie is gone, and a copy of it
  // no longer works.
  const status = await page.evaluate(async () => (await fetch('/api/session', { method: 'DELETE' })).status);
  assert.equal(status, 204);
  assert.ok(!(await page.context().cookies()).some((c) => c.name === 'blobstream_session'));
  assert.equal((await withCookie()).status, 401);
  const s = await page.evaluate(async () => (await fetch('/api/session')).json());
  assert.deepEqual(s, { auth_required: true, authenticated: false });
  await page.close();
});
