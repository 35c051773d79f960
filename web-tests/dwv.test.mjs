// Browser test: a third-party DICOMweb viewer, DWV (DICOM Web Viewer, npm `dwv`), loads the
// seeded 16-slice CT series from blobstream over WADO-RS in headless Chromium and shows it with
// the right geometry and values. DWV's page is served by the test on blobstream's origin (no
// CORS involved); its dependencies (Konva, JSZip, magic-wand-tool) come from web-tests'
// node_modules, installed by scripts/browser-setup.sh.

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { test } from 'node:test';
import { screenshot, useApp } from './lib/browser.mjs';

let server;
let page;
useApp((app) => ({ server, page } = app));

const modules = path.join(path.dirname(fileURLToPath(import.meta.url)), 'node_modules');

// The viewer's page: the dependencies DWV imports by bare name are classic scripts setting
// globals, handed to it as modules through an import map.
const PAGE = `<!doctype html>
<meta charset="utf-8">
<title>DWV on blobstream</title>
<script src="/dwv-test/konva.min.js"></script>
<script src="/dwv-test/jszip.min.js"></script>
<script src="/dwv-test/magic-wand.js"></script>
<script type="importmap">
{ "imports": {
  "konva": "/dwv-test/shim/Konva.js",
  "jszip": "/dwv-test/shim/JSZip.js",
  "magic-wand-tool": "/dwv-test/shim/MagicWand.js"
} }
</script>
<div id="layerGroup0" style="width: 512px; height: 512px"></div>
<script type="module">
import { App, AppOptions, ViewConfig } from '/dwv-test/dwv.min.js';
const app = new App();
app.init(new AppOptions({ '*': [new ViewConfig('layerGroup0')] }));
window.dwvTest = { app, loaded: null, errors: [] };
app.addEventListener('load', (e) => { window.dwvTest.loaded = e.dataid; });
app.addEventListener('error', (e) => { window.dwvTest.errors.push(String(e.error?.message || e.error || e)); });
window.dwvLoad = (url) => app.loadURLs([url], {
  requestHeaders: [{ name: 'Accept', value: 'multipart/related; type="application/dicom"' }],
});
</script>`;

const FILES = {
  'dwv.min.js': 'dwv/dist/dwv.min.js',
  'konva.min.js': 'konva/konva.min.js',
  'jszip.min.js': 'jszip/dist/jszip.min.js',
  'magic-wand.js': 'magic-wand-tool/dist/magic-wand.js',
};

async function serveViewer() {
  await page.route('**/dwv-test/**', (route) => {
    const name = new URL(route.request().url()).pathname.replace(/^.*\/dwv-test\//, '');
    const js = 'text/javascript; charset=utf-8';
    if (name === 'index.html') return route.fulfill({ contentType: 'text/html; charset=utf-8', body: PAGE });
    const shim = /^shim\/(\w+)\.js$/.exec(name);
    if (shim) return route.fulfill({ contentType: js, body: `export default window.${shim[1]};` });
    if (FILES[name]) return route.fulfill({ contentType: js, body: readFileSync(path.join(modules, FILES[name])) });
    return route.fulfill({ status: 404, body: '' });
  });
}

test('DWV, a DICOMweb viewer, shows a series retrieved with WADO-RS', { timeout: 120_000 }, async () => {
  await serveViewer();
  await page.goto(new URL('/dwv-test/index.html', server.url).href);
  await page.waitForFunction(() => window.dwvTest && window.dwvLoad);

  // The 16-slice series of the seeded CT study, found with QIDO-RS.
  const { study, series } = await page.evaluate(async () => {
    const studies = await (await fetch('/dicomweb/studies', { headers: { Accept: 'application/dicom+json' } })).json();
    const study = studies[0]['0020000D'].Value[0];
    const list = await (await fetch(`/dicomweb/studies/${study}/series`)).json();
    const big = list.find((s) => s['00201209'].Value[0] === 16);
    return { study, series: big['0020000E'].Value[0] };
  });
  await page.evaluate((url) => window.dwvLoad(url), `/dicomweb/studies/${study}/series/${series}`);
  await page.waitForFunction(() => window.dwvTest.loaded !== null || window.dwvTest.errors.length > 0);
  const errors = await page.evaluate(() => window.dwvTest.errors);
  assert.deepEqual(errors, [], 'DWV reported errors');

  const seen = await page.evaluate(() => {
    const { app, loaded } = window.dwvTest;
    const image = app.getData(loaded).image;
    const size = image.getGeometry().getSize();
    const meta = app.getData(loaded).meta;
    return {
      size: [size.get(0), size.get(1), size.get(2)],
      centre: image.getRescaledValue(64, 64, 0),
      corner: image.getRescaledValue(2, 2, 0),
      patient: meta['00100010']?.value?.[0] ?? null,
    };
  });
  assert.deepEqual(seen.size, [128, 128, 16], 'a 128×128 series of 16 slices');
  // The phantom: soft tissue (tens of HU) in the middle, air (about −1000 HU) in the corner.
  assert.ok(seen.centre > -200 && seen.centre < 200, `centre ${seen.centre} HU`);
  assert.ok(seen.corner < -900, `corner ${seen.corner} HU`);
  assert.equal(seen.patient, 'PHANTOM^CT');
  // Drawn: the viewer's canvas holds more than one grey level.
  const levels = await page.evaluate(() => {
    const c = document.querySelector('#layerGroup0 canvas');
    const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
    const seen = new Set();
    for (let i = 0; i < d.length; i += 4 * 97) seen.add(d[i]);
    return seen.size;
  });
  assert.ok(levels > 2, `the canvas shows ${levels} grey level(s)`);
  await screenshot(page, 'dwv-series');
  assert.deepEqual(page.pageErrors, [], 'uncaught errors on the page');
});
