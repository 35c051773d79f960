// The block store's tiled viewer: a master and four block servers (`dpss local`), a generated
// image loaded over them, `serve --dpss-master`, and /dpss.html in Chromium — tiles drawn at
// the fitting level, zooming in loads the finer level and sends the servers a new list, and the
// colours on the canvas are the image's.

import assert from 'node:assert/strict';
import { spawn, execFile } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import readline from 'node:readline';
import { promisify } from 'node:util';
import { after, before, test } from 'node:test';
import { launchBrowser, newPage, screenshot } from './lib/browser.mjs';
import { repoRoot, startServer } from './lib/server.mjs';

const bin = path.resolve(repoRoot, process.env.BLOBSTREAM_BIN || 'target/debug/blobstream');
let store;
let dir;
let server;
let browser;

/** `dpss local` on free ports; resolves to the master's address. */
async function startStore() {
  dir = await mkdtemp(path.join(tmpdir(), 'blobstream-dpss-'));
  const child = spawn(bin, ['dpss', 'local', '--servers', '4', '--dir', dir, '--master', '127.0.0.1:0', '--first-port', '0'], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  store = child;
  const lines = readline.createInterface({ input: child.stdout });
  return new Promise((resolve, reject) => {
    let master = null;
    let servers = 0;
    lines.on('line', (line) => {
      const m = /master \(and name server\) on (\S+)/.exec(line);
      if (m) master = m[1];
      if (/block server server\d+ on/.test(line)) servers++;
      if (master && servers === 4) resolve(master);
    });
    child.on('exit', (code) => reject(new Error(`dpss local exited (${code})`)));
  });
}

before(async () => {
  const master = await startStore();
  // Servers report to the master once a second: load retries until all four are known.
  let out;
  for (let i = 0; i < 50; i++) {
    out = await promisify(execFile)(bin, ['dpss', 'status', '--master', master, '--json']);
    if (JSON.parse(out.stdout).servers.filter((s) => s.up).length === 4) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  await promisify(execFile)(bin, ['-q', 'dpss', 'load', '--synthetic', '6000x4000', '--dataset', 'card', '--master', master]);
  server = await startServer({ args: ['--dpss-master', master] });
  browser = await launchBrowser();
});

after(async () => {
  await browser?.close();
  await server?.stop();
  store?.kill();
  if (dir) await rm(dir, { recursive: true, force: true });
});

async function settle(page) {
  // Every tile asked for has arrived (or failed) and the last viewport was posted.
  await page.waitForFunction(() => {
    const s = window.dpssViewer.stats();
    return s.pending === 0 && s.viewsOwed === 0 && s.views > 0;
  });
}

test('the viewer draws the image from the block store and zooms into finer levels', async () => {
  const page = await newPage(browser, server.url);
  await page.goto('/dpss.html?dataset=card');
  await page.waitForFunction(() => window.dpssViewer?.ready);
  await settle(page);
  const first = await page.evaluate(() => window.dpssViewer.stats());
  assert.equal(first.failed, 0);
  assert.ok(first.loaded > 0, 'tiles were drawn');
  assert.ok(first.firstTileMs > 0 && first.fullViewMs >= first.firstTileMs);
  // 6000 px into about 1366 px: level 2 (a quarter) is the coarsest not blurrier than the screen.
  assert.equal(first.level, 2);
  // The test card's colours: red grows with x, green with y (255 · x / width, 255 · y / height);
  // sample away from the grid lines drawn every 1024 pixels.
  const pixel = async (x, y) =>
    page.evaluate(([x, y]) => {
      const [sx, sy] = window.dpssViewer.toScreen(x, y);
      const c = document.getElementById('canvas').getContext('2d');
      return [...c.getImageData(Math.round(sx), Math.round(sy), 1, 1).data];
    }, [x, y]);
  for (const [x, y] of [[1500, 600], [2600, 1500], [4600, 3500]]) {
    const [r, g] = await pixel(x, y);
    const want = [(255 * x) / 6000, (255 * y) / 4000];
    assert.ok(Math.abs(r - want[0]) <= 10 && Math.abs(g - want[1]) <= 10, `(${x}, ${y}) is ${r},${g}, want about ${want}`);
  }
  await screenshot(page, 'dpss-fit');
  // Zoom in four steps at the centre: a finer level, a new list, more tiles.
  for (let i = 0; i < 4; i++) await page.evaluate(() => window.dpssViewer.zoomAt(1.25));
  await settle(page);
  const zoomed = await page.evaluate(() => window.dpssViewer.stats());
  assert.ok(zoomed.level < first.level, `level ${zoomed.level} after zooming in`);
  assert.ok(zoomed.views > first.views, 'the new viewport was sent');
  assert.ok(zoomed.loaded > first.loaded);
  assert.equal(zoomed.failed, 0);
  assert.deepEqual(page.pageErrors, []);
  await screenshot(page, 'dpss-zoomed');
});

test('a viewport posted while the last one is still in flight is settled exactly once', { timeout: 120_000 }, async () => {
  const page = await newPage(browser, server.url);
  // Hold every viewport post until the test lets it through, so two are in flight at once.
  const held = [];
  let arrived = null;
  await page.route('**/api/dpss/view/**', (route) => {
    held.push(route);
    arrived?.();
  });
  const posts = async (n) => {
    while (held.length < n) await new Promise((r) => { arrived = r; });
  };
  await page.goto('/dpss.html?dataset=card');
  await page.waitForFunction(() => window.dpssViewer?.ready);
  await posts(1);
  await held[0].continue();
  await page.waitForFunction(() => window.dpssViewer.stats().views === 1);
  // Two more posts, the later one leaving while the earlier is still held.
  await page.evaluate(() => window.dpssViewer.zoomAt(1.25));
  await posts(2);
  await page.evaluate(() => window.dpssViewer.zoomAt(1.25));
  await posts(3);
  assert.equal((await page.evaluate(() => window.dpssViewer.stats())).viewsOwed, 2);
  await held[1].continue();
  await held[2].continue();
  await page.waitForFunction(() => window.dpssViewer.stats().views === 3);
  assert.equal((await page.evaluate(() => window.dpssViewer.stats())).viewsOwed, 0);
  await settle(page);
  assert.deepEqual(page.pageErrors, []);
});

test('the data set list and a missing data set', async () => {
  const page = await newPage(browser, server.url);
  await page.goto('/dpss.html');
  await page.waitForFunction(() => window.dpssViewer?.ready);
  assert.match(await page.textContent('#sets'), /card — 6000 × 4000, 6 levels/);
  await page.goto('/dpss.html?dataset=nope');
  await page.waitForFunction(() => window.dpssViewer?.ready);
  assert.match(await page.textContent('#error'), /nope/);
});
