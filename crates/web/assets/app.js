// blobstream browser client: the behaviour of index.html (served at "/app.js").
//
// Talks to the HTTP API of docs/http-api.md: lists and searches the store, opens images as raw
// samples (/api/pixels) and applies window/level in the browser with a lookup table, runs
// filter chains on the server (/api/filter) with before/after comparison, uploads with PUT
// (XMLHttpRequest, for upload progress) and downloads with fetch streams (download progress).
//
// Test hooks: window.blobstream = {ready, firstImageMs, lastError, lastProgress, ...};
// #view[data-state] is empty|loading|ready|error; #filter-panel[data-state] is
// idle|running|done|error.

import { Stack } from './stack.js';
import { setupWorklist } from './worklist.js';

const bs = {
  ready: false, // the first folder listing has been rendered
  firstImageMs: null, // performance.now() when the first image was drawn
  lastError: null, // text of the last error shown in #error
  lastProgress: null, // {label, loaded, total, done} of the last upload or download
  frames: 0, // canvas redraws so far
  view: () => viewInfo(),
  stack: () => stackInfo(), // the open series or frame stack: position, length, cached slices
};
window.blobstream = bs;

const $ = (sel) => document.querySelector(sel);

const el = {
  status: $('#status'),
  progress: $('#progress'),
  progressBar: $('#progress-bar'),
  progressLabel: $('#progress-label'),
  error: $('#error'),
  errorMessage: $('#error-message'),
  errorClose: $('#error-close'),
  uploadButton: $('#upload-button'),
  fileInput: $('#file-input'),
  crumbs: $('#crumbs'),
  searchForm: $('#search-form'),
  searchQ: $('#search-q'),
  searchModality: $('#search-modality'),
  searchPatient: $('#search-patient'),
  searchFrom: $('#search-date-from'),
  searchTo: $('#search-date-to'),
  resultsBar: $('#results-bar'),
  resultsHeading: $('#results-heading'),
  clearSearch: $('#clear-search'),
  listing: $('#listing'),
  worklist: $('#worklist'),
  tabFiles: $('#tab-files'),
  tabStudies: $('#tab-studies'),
  stackBar: $('#stack-bar'),
  stackPlay: $('#stack-play'),
  stackSlider: $('#stack-slider'),
  stackReadout: $('#stack-readout'),
  overlay: $('#overlay'),
  overlayTl: $('#overlay-tl'),
  overlayBr: $('#overlay-br'),
  view: $('#view'),
  presets: $('#presets'),
  fitButton: $('#fit-button'),
  zoomReadout: $('#zoom-readout'),
  canvasWrap: $('#canvas-wrap'),
  canvas: $('#canvas'),
  viewMessageText: $('#view-message-text'),
  downloadLink: $('#download-link'),
  compareBar: $('#compare-bar'),
  compareSlider: $('#compare-slider'),
  wlReadout: $('#wl-readout'),
  pixelReadout: $('#pixel-readout'),
  viewKey: $('#view-key'),
  filterPanel: $('#filter-panel'),
  filterSelect: $('#filter-select'),
  filterSummary: $('#filter-summary'),
  filterParams: $('#filter-params'),
  applyFilter: $('#apply-filter'),
  resetFilter: $('#reset-filter'),
  filterChain: $('#filter-chain'),
  filterTime: $('#filter-time'),
  compare: $('#compare'),
  saveName: $('#save-name'),
  saveResult: $('#save-result'),
  metaBody: $('#meta-body'),
  dropOverlay: $('#drop-overlay'),
  dropTarget: $('#drop-target'),
};

const ctx = el.canvas.getContext('2d');
const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;
const IMAGE_EXTENSIONS = /\.(png|jpe?g|tiff?|gif|pgm|ppm|pnm|pbm|dcm|dicom)$/i;
// Filters whose output is grey levels rather than the input's values (for CT: not HU), so the
// result is shown on its own full scale instead of through the current window.
const GREY_LEVEL_FILTERS = new Set(['window', 'edge', 'emboss']);
const CT_PRESETS = [
  { id: 'brain', label: 'Brain', w: 80, c: 40 },
  { id: 'soft-tissue', label: 'Soft tissue', w: 400, c: 40 },
  { id: 'lung', label: 'Lung', w: 1500, c: -600 },
  { id: 'bone', label: 'Bone', w: 2000, c: 300 },
];

const state = {
  prefix: '', // current folder: empty or ending with '/'
  mode: 'folder', // 'folder' or 'search'
  items: new Map(), // key -> BlobInfo of the tiles shown
  selectedKey: null,
  listSeq: 0,
  filters: [],
  img: null, // the open image, see openImage
  loadSeq: 0,
  loadAbort: null,
  wl: { c: 0, w: 1 },
  activePreset: null,
  presets: [],
  zoom: 1,
  panX: 0,
  panY: 0,
  fitted: true,
  drag: null,
  drawPending: false,
  lutDirty: false, // the window changed: re-render the rasters before drawing
  saveNameAuto: true,
  filterSeq: 0,
  stack: null, // the Stack being shown (a series or a multi-frame image), see stack.js
  seriesSeq: 0,
  cine: null, // interval timer while the stack plays
  worklist: null,
};

// ---------------------------------------------------------------------------------------------
// Small helpers

/** A key or prefix in a URL path: each segment percent-encoded, joined with '/'. */
function encodeKey(key) {
  return key.split('/').map(encodeURIComponent).join('/');
}

function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === 'class') node.className = v;
    else if (k === 'text') node.textContent = v;
    else if (k.startsWith('on')) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children) if (c !== null && c !== undefined) node.append(c);
  return node;
}

function basename(key) {
  const i = key.lastIndexOf('/', key.length - 2);
  return key.slice(i + 1);
}

function dirname(key) {
  const i = key.lastIndexOf('/');
  return i < 0 ? '' : key.slice(0, i + 1);
}

function fmtBytes(n) {
  if (!Number.isFinite(n)) return '';
  if (n < 1024) return `${n} B`;
  const units = ['KiB', 'MiB', 'GiB', 'TiB'];
  let v = n;
  let u = -1;
  do {
    v /= 1024;
    u++;
  } while (v >= 1024 && u < units.length - 1);
  return `${v < 10 ? v.toFixed(1) : Math.round(v)} ${units[u]}`;
}

function fmtMs(ms) {
  if (!Number.isFinite(ms)) return '? ms';
  return `${ms < 10 ? ms.toFixed(2) : ms.toFixed(1)} ms`;
}

function fmtNumber(v) {
  if (!Number.isFinite(v)) return String(v);
  if (Number.isInteger(v)) return String(v);
  return String(Math.round(v * 100) / 100);
}

function fmtDate(s) {
  return /^\d{8}$/.test(s) ? `${s.slice(0, 4)}-${s.slice(4, 6)}-${s.slice(6, 8)}` : s;
}

function fmtPersonName(s) {
  // DICOM PN: family^given^middle^prefix^suffix
  const parts = String(s).split('^').filter(Boolean);
  return parts.length > 1 ? `${parts[0]}, ${parts.slice(1).join(' ')}` : String(s);
}

function clamp(v, lo, hi) {
  return Math.min(hi, Math.max(lo, v));
}

function isTyping(e) {
  const t = e.target;
  return t instanceof HTMLElement && (t.isContentEditable || /^(INPUT|SELECT|TEXTAREA)$/.test(t.tagName));
}

// ---------------------------------------------------------------------------------------------
// Status, errors and progress

class ApiError extends Error {
  constructor(message, status = 0, code = '') {
    super(message);
    this.status = status;
    this.code = code;
  }
}

/** The error of a failed response: the server's JSON `error.message`, else the status. */
function errorFromBody(status, statusText, text) {
  let message = '';
  let code = '';
  try {
    const j = JSON.parse(text);
    message = j?.error?.message ?? '';
    code = j?.error?.code ?? '';
  } catch {
    message = (text || '').trim().slice(0, 300);
  }
  if (!message) message = `${status} ${statusText || 'error'}`.trim();
  return new ApiError(message, status, code);
}

async function errorFromResponse(res) {
  let text = '';
  try {
    text = await res.text();
  } catch {
    /* body unreadable: fall back to the status */
  }
  return errorFromBody(res.status, res.statusText, text);
}

async function doFetch(url, init) {
  try {
    return await fetch(url, init);
  } catch (e) {
    if (e?.name === 'AbortError') throw e;
    throw new ApiError(`cannot reach the server (${e?.message || e})`, 0, 'network');
  }
}

async function getJSON(url, init) {
  const res = await doFetch(url, init);
  if (!res.ok) throw await errorFromResponse(res);
  return res.json();
}

/** Fetch a body while showing download progress (Content-Length when the server sends it). */
async function fetchBytes(url, init, label) {
  const res = await doFetch(url, init);
  if (!res.ok) throw await errorFromResponse(res);
  const total = Number(res.headers.get('Content-Length')) || 0;
  const chunks = [];
  let loaded = 0;
  progress.show(label, 0, total);
  try {
    if (res.body && res.body.getReader) {
      const reader = res.body.getReader();
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        chunks.push(value);
        loaded += value.length;
        progress.show(label, loaded, total);
      }
    } else {
      const buf = new Uint8Array(await res.arrayBuffer());
      chunks.push(buf);
      loaded = buf.length;
    }
  } catch (e) {
    // Cancelled (another image was opened) or the connection broke: no stale progress bar.
    progress.fail();
    if (e?.name === 'AbortError') throw e;
    throw new ApiError(`download of ${label.replace(/^\w+ /, '')} broke off after ${fmtBytes(loaded)} (${e?.message || e})`, 0, 'network');
  }
  const bytes = new Uint8Array(loaded);
  let at = 0;
  for (const c of chunks) {
    bytes.set(c, at);
    at += c.length;
  }
  progress.done(`${label}: ${fmtBytes(loaded)}`, loaded);
  return { res, bytes };
}

/** PUT a body to /blobs/{key} with XMLHttpRequest so the upload reports progress. */
function putBlob(key, body, label) {
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open('PUT', `/blobs/${encodeKey(key)}`);
    const size = body.size ?? 0;
    progress.show(label, 0, size);
    xhr.upload.onprogress = (e) => progress.show(label, e.loaded, e.lengthComputable ? e.total : size);
    xhr.onload = () => {
      if (xhr.status >= 200 && xhr.status < 300) {
        progress.done(`${label}: ${fmtBytes(size)} sent`, size);
        let info = null;
        try {
          info = JSON.parse(xhr.responseText);
        } catch {
          /* a 2xx without JSON is still a success */
        }
        resolve(info);
      } else {
        progress.fail();
        reject(errorFromBody(xhr.status, xhr.statusText, xhr.responseText));
      }
    };
    xhr.onerror = () => {
      progress.fail();
      reject(new ApiError(`network error while uploading ${key}`, 0, 'network'));
    };
    xhr.onabort = () => {
      progress.fail();
      reject(new ApiError(`upload of ${key} aborted`, 0, 'aborted'));
    };
    xhr.send(body);
  });
}

/** "Downloading x" → "Downloaded x" (and Filtering, Uploading, Saving). */
function pastTense(label) {
  const past = { Downloading: 'Downloaded', Filtering: 'Filtered', Uploading: 'Uploaded', Saving: 'Saved' };
  return label.replace(/^(Downloading|Filtering|Uploading|Saving)\b/, (w) => past[w]);
}

const progress = {
  timer: null,
  log: [],
  record(p) {
    bs.lastProgress = p;
  },
  show(label, loaded, total) {
    clearTimeout(this.timer);
    el.progress.hidden = false;
    if (total > 0) {
      el.progressBar.max = 1;
      el.progressBar.value = clamp(loaded / total, 0, 1);
    } else {
      el.progressBar.removeAttribute('value'); // indeterminate
    }
    const pct = total > 0 ? ` (${Math.round(clamp(loaded / total, 0, 1) * 100)}%)` : '';
    const of = total > 0 ? ` of ${fmtBytes(total)}` : '';
    el.progressLabel.textContent = `${label}: ${fmtBytes(loaded)}${of}${pct}`;
    this.record({ label, loaded, total, done: false });
  },
  done(label, bytes) {
    clearTimeout(this.timer);
    // Finished work is told in the past tense ("Downloaded", not "Downloading"), and the bar
    // goes away soon after.
    label = pastTense(label);
    el.progress.hidden = false;
    el.progressBar.max = 1;
    el.progressBar.value = 1;
    el.progressLabel.textContent = label;
    this.record({ label, loaded: bytes, total: bytes, done: true });
    this.timer = setTimeout(() => {
      el.progress.hidden = true;
    }, 1500);
  },
  fail() {
    clearTimeout(this.timer);
    el.progress.hidden = true;
    if (bs.lastProgress) bs.lastProgress = { ...bs.lastProgress, done: true, failed: true };
  },
};

function showError(message) {
  bs.lastError = message;
  el.errorMessage.textContent = message;
  el.error.title = message;
  el.error.hidden = false;
  console.warn('blobstream:', message);
}

function clearError() {
  el.error.hidden = true;
}

let statusTimer = null;
function setStatus(message) {
  clearTimeout(statusTimer);
  el.status.textContent = message;
  statusTimer = setTimeout(() => {
    if (el.status.textContent === message) el.status.textContent = '';
  }, 15000);
}

/** Report a failure: ignore aborted requests, show the rest in the error banner. */
function fail(context, e) {
  if (e?.name === 'AbortError') return;
  const msg = e instanceof Error ? e.message : String(e);
  showError(context ? `${context}: ${msg}` : msg);
}

// ---------------------------------------------------------------------------------------------
// Browse: breadcrumbs, listing, search, delete

function setHash(path) {
  const want = path ? `#/${encodeKey(path)}` : '';
  if (location.hash !== want) history.replaceState(null, '', want || location.pathname);
}

function renderCrumbs() {
  const parts = state.prefix.split('/').filter(Boolean);
  const nodes = [];
  const crumb = (label, prefix, current) =>
    h('a', {
      href: `#/${encodeKey(prefix)}`,
      'data-prefix': prefix,
      'aria-current': current ? 'page' : null,
      text: label,
      onclick: (e) => {
        e.preventDefault();
        navigate(prefix);
      },
    });
  nodes.push(crumb('store', '', parts.length === 0));
  let acc = '';
  parts.forEach((p, i) => {
    acc += `${p}/`;
    nodes.push(h('span', { class: 'sep', text: '/' }));
    nodes.push(crumb(p, acc, i === parts.length - 1));
  });
  el.crumbs.replaceChildren(...nodes);
}

function folderEntry(f) {
  const name = f.name || basename(f.prefix).replace(/\/$/, '');
  return h('div', {
    class: 'folder',
    'data-prefix': f.prefix,
    tabindex: 0,
    role: 'button',
    title: f.prefix,
    text: name,
    onclick: () => navigate(f.prefix),
    onkeydown: (e) => {
      if (e.key === 'Enter' || e.key === ' ') {
        e.preventDefault();
        navigate(f.prefix);
      }
    },
  });
}

function fileIcon(key) {
  const m = /\.([A-Za-z0-9]{1,5})$/.exec(key);
  return h('div', { class: 'file-icon', 'aria-hidden': 'true', text: m ? m[1] : 'file' });
}

function tileEntry(info, fullKey) {
  const name = fullKey ? info.key : basename(info.key);
  const modality = info.image?.modality;
  const dims = info.image?.width ? `${info.image.width}×${info.image.height}` : '';
  const tile = h('div', {
    class: 'tile',
    'data-key': info.key,
    tabindex: 0,
    role: 'button',
    title: [info.key, fmtBytes(info.size), info.content_type, dims, modality].filter(Boolean).join('\n'),
    onclick: () => activateTile(info),
    onkeydown: (e) => {
      if (e.target !== tile) return;
      if (e.key === 'Enter' || e.key === ' ') {
        e.preventDefault();
        activateTile(info);
      } else if (e.key === 'Delete') {
        e.preventDefault();
        deleteBlob(info.key);
      }
    },
  });
  if (info.is_image) {
    const img = h('img', {
      class: 'thumb',
      loading: 'lazy',
      alt: '',
      draggable: 'false',
      src: `/api/thumbnail/${encodeKey(info.key)}?size=128`,
    });
    img.addEventListener('error', () => {
      const icon = fileIcon(info.key);
      icon.title = 'no preview';
      img.replaceWith(icon);
    });
    tile.append(img);
  } else {
    tile.append(fileIcon(info.key));
  }
  tile.append(
    h('div', { class: 'name', text: name }),
    h('div', { class: 'size', text: [modality, fmtBytes(info.size)].filter(Boolean).join(' · ') }),
  );
  if (info.key === state.selectedKey) markSelected(tile);
  return tile;
}

function markSelected(tile) {
  for (const t of el.listing.querySelectorAll('.tile.selected')) {
    t.classList.remove('selected');
    t.querySelector('.delete-btn')?.remove();
  }
  if (!tile) return;
  tile.classList.add('selected');
  const key = tile.dataset.key;
  tile.append(
    h('button', {
      type: 'button',
      class: 'delete-btn',
      title: `Delete ${key}`,
      'aria-label': `Delete ${key}`,
      text: '×',
      onclick: (e) => {
        e.stopPropagation();
        deleteBlob(key);
      },
    }),
  );
}

function tileFor(key) {
  for (const t of el.listing.querySelectorAll('.tile')) if (t.dataset.key === key) return t;
  return null;
}

function selectKey(key) {
  state.selectedKey = key;
  markSelected(key ? tileFor(key) : null);
}

function renderListing(folders, items, { append = false, fullKeys = false, more = null } = {}) {
  if (!append) {
    el.listing.replaceChildren();
    state.items.clear();
  }
  el.listing.querySelector('.more-button')?.remove();
  const nodes = [];
  for (const f of folders) nodes.push(folderEntry(f));
  for (const info of items) {
    state.items.set(info.key, info);
    nodes.push(tileEntry(info, fullKeys));
  }
  if (more) nodes.push(h('button', { type: 'button', class: 'more-button', text: 'Load more…', onclick: more }));
  el.listing.append(...nodes);
  if (!el.listing.querySelector('.folder, .tile')) {
    el.listing.append(h('div', { class: 'empty', text: state.mode === 'search' ? 'Nothing matches.' : 'This folder is empty. Drop files here to upload.' }));
  }
}

function listUrl(prefix, after) {
  const p = new URLSearchParams({ prefix, limit: '500' });
  if (after) p.set('after', after);
  return `/api/list?${p}`;
}

/** Show one folder level (prefix '' is the root). */
async function navigate(prefix, { keepError = false } = {}) {
  if (!keepError) clearError();
  const seq = ++state.listSeq;
  try {
    const data = await getJSON(listUrl(prefix));
    if (seq !== state.listSeq) return;
    state.prefix = typeof data.prefix === 'string' ? data.prefix : prefix;
    state.mode = 'folder';
    el.resultsBar.hidden = true;
    renderCrumbs();
    const more = (after) =>
      after
        ? async () => {
            try {
              const next = await getJSON(listUrl(state.prefix, after));
              if (seq !== state.listSeq) return;
              renderListing(next.folders || [], next.items || [], { append: true, more: more(next.next_after) });
            } catch (e) {
              fail('Listing failed', e);
            }
          }
        : null;
    renderListing(data.folders || [], data.items || [], { more: more(data.next_after) });
    if (!state.img) setHash(state.prefix);
  } catch (e) {
    if (seq !== state.listSeq) return;
    fail(`Could not list ${prefix || 'the store'}`, e);
  } finally {
    if (seq === state.listSeq && !bs.ready) bs.ready = true;
  }
}

function refreshListing() {
  if (state.mode === 'search') return runSearch({ keepError: true });
  return navigate(state.prefix, { keepError: true });
}

function searchParams() {
  const p = new URLSearchParams();
  const q = el.searchQ.value.trim();
  const patient = el.searchPatient.value.trim();
  const modality = el.searchModality.value;
  const from = el.searchFrom.value.replaceAll('-', '');
  const to = el.searchTo.value.replaceAll('-', '');
  if (q) p.set('q', q);
  if (modality) p.set('modality', modality);
  if (patient) p.set('patient', patient);
  if (from) p.set('date_from', from);
  if (to) p.set('date_to', to);
  return p;
}

async function runSearch({ keepError = false } = {}) {
  if (!keepError) clearError();
  if (!el.worklist.hidden) {
    state.worklist.reload();
    return;
  }
  const seq = ++state.listSeq;
  const p = searchParams();
  try {
    const data = await getJSON(`/api/search?${p}`);
    if (seq !== state.listSeq) return;
    const results = data.results || [];
    state.mode = 'search';
    const n = results.length;
    el.resultsHeading.textContent = `${n} result${n === 1 ? '' : 's'}`;
    el.resultsBar.hidden = false;
    renderListing([], results, { fullKeys: true });
  } catch (e) {
    if (seq !== state.listSeq) return;
    fail('Search failed', e);
  }
}

function clearSearch() {
  el.searchForm.reset();
  el.resultsBar.hidden = true;
  if (!el.worklist.hidden) state.worklist.reload();
  else navigate(state.prefix);
}

// ---------------------------------------------------------------------------------------------
// Studies and series

function showTab(studies) {
  el.tabFiles.setAttribute('aria-selected', String(!studies));
  el.tabStudies.setAttribute('aria-selected', String(studies));
  el.listing.hidden = studies;
  el.crumbs.hidden = studies;
  el.resultsBar.hidden = true;
  el.worklist.hidden = !studies;
  if (studies) state.worklist.reload();
  else navigate(state.prefix);
}

/** One slice (or frame) of a stack: its metadata and pixels, without a progress bar. */
async function loadSlice(entry, signal) {
  const meta = await getJSON(`/api/meta/${encodeKey(entry.key)}`, { signal });
  const res = await doFetch(`/api/pixels/${encodeKey(entry.key)}?frame=${entry.frame}`, { signal });
  if (!res.ok) throw await errorFromResponse(res);
  const bytes = new Uint8Array(await res.arrayBuffer());
  return { meta, res, bytes };
}

function stackInfo() {
  const st = state.stack;
  if (!st) return null;
  return { kind: st.info.kind, index: st.index, length: st.length, cached: st.cachedCount(), playing: !!state.cine, key: st.entries[st.index].key, frame: st.entries[st.index].frame };
}

function closeStack() {
  stopCine();
  state.stack?.close();
  state.stack = null;
  el.stackBar.hidden = true;
}

/** Show `stack` from its first slice. */
function openStack(stack) {
  closeStack();
  setStack(stack);
  showSlice(0, { fresh: true });
}

/** Make `stack` the open one, its bar at the first slice. */
function setStack(stack) {
  state.stack = stack;
  el.stackSlider.max = String(stack.length);
  el.stackSlider.value = '1';
  el.stackReadout.textContent = `${stack.info.kind === 'frames' ? 'frame' : 'slice'} 1 / ${stack.length}`;
  el.stackBar.hidden = stack.length < 2;
}

/** Show slice `i` of the open stack (the window stays as the user set it, unless `fresh`). */
function showSlice(i, { fresh = false } = {}) {
  const st = state.stack;
  if (!st) return;
  const first = fresh || !state.img;
  const at = st.go(i);
  el.stackSlider.value = String(at + 1);
  el.stackReadout.textContent = `${st.info.kind === 'frames' ? 'frame' : 'slice'} ${at + 1} / ${st.length}`;
  const e = st.entries[at];
  openImage(e.key, { frame: e.frame, keepWindow: !first, slice: st.get(at) });
}

function stepSlice(d) {
  if (state.stack) showSlice(state.stack.index + d);
}

function stopCine() {
  if (state.cine) clearInterval(state.cine);
  state.cine = null;
  el.stackPlay.setAttribute('aria-pressed', 'false');
  el.stackPlay.innerHTML = '&#9654;';
}

function toggleCine() {
  if (state.cine) return stopCine();
  if (!state.stack) return;
  el.stackPlay.setAttribute('aria-pressed', 'true');
  el.stackPlay.innerHTML = '&#10073;&#10073;';
  state.cine = setInterval(() => {
    const st = state.stack;
    if (!st) return stopCine();
    // The next slice only once this one is on screen: an uncached series plays as fast as it
    // arrives instead of never drawing.
    const e = st.entries[st.index];
    if (state.img?.key !== e.key || state.img?.frame !== e.frame || el.view.dataset.state !== 'ready') return;
    showSlice((st.index + 1) % st.length);
  }, 100);
}

async function openSeries(uid, label) {
  clearError();
  const seq = ++state.seriesSeq;
  try {
    const v = await getJSON(`/api/series/${encodeURIComponent(uid)}/instances`);
    if (seq !== state.seriesSeq) return; // another series was asked for meanwhile
    const entries = [];
    for (const inst of v.instances) {
      for (let f = 0; f < Math.max(1, inst.frames); f++) entries.push({ key: inst.key, frame: f });
    }
    openStack(new Stack(entries, { kind: 'series', uid, label }, loadSlice));
  } catch (e) {
    fail(`Could not open the series ${label}`, e);
  }
}

function setupStacks() {
  el.tabFiles.addEventListener('click', () => showTab(false));
  el.tabStudies.addEventListener('click', () => showTab(true));
  state.worklist = setupWorklist(el.worklist, {
    h,
    getJSON,
    fmtDate,
    fmtPersonName,
    criteria: searchParams,
    openSeries,
    fail,
  });
  el.stackSlider.addEventListener('input', () => showSlice(Number(el.stackSlider.value) - 1));
  el.stackPlay.addEventListener('click', toggleCine);
}

/** The on-image overlay: patient and study top left; slice, window top right. */
function renderOverlay() {
  const img = state.img;
  if (!img) {
    el.overlay.hidden = true;
    return;
  }
  const m = img.meta.image || {};
  const st = state.stack;
  const tl = [fmtPersonName(m.patient_name || ''), m.patient_id, [fmtDate(m.study_date || ''), m.modality].filter(Boolean).join(' '), m.series_description].filter(Boolean);
  const br = [];
  if (st) br.push(`${st.info.kind === 'frames' ? 'Frame' : 'Im'} ${st.index + 1} / ${st.length}`);
  if (m.slice_location !== undefined) br.push(`Loc ${fmtNumber(m.slice_location)} mm`);
  if (img.orig.ch === 1) br.push(el.wlReadout.textContent);
  el.overlayTl.textContent = tl.join('\n');
  el.overlayBr.textContent = br.join('\n');
  el.overlay.hidden = tl.length === 0 && br.length === 0;
}

function activateTile(info) {
  selectKey(info.key);
  if (state.img?.key === info.key && el.view.dataset.state === 'ready') return;
  if (info.is_image || IMAGE_EXTENSIONS.test(info.key)) openImage(info.key);
  else showNonImage(info);
}

async function deleteBlob(key) {
  if (!confirm(`Delete ${key}?\nThis cannot be undone.`)) return;
  clearError();
  try {
    const res = await doFetch(`/blobs/${encodeKey(key)}`, { method: 'DELETE' });
    if (!res.ok) throw await errorFromResponse(res);
    setStatus(`Deleted ${key}`);
    if (state.selectedKey === key) state.selectedKey = null;
    if (state.img?.key === key || el.viewKey.textContent === key) closeImage();
    await refreshListing();
  } catch (e) {
    fail(`Could not delete ${key}`, e);
  }
}

// ---------------------------------------------------------------------------------------------
// Upload: file picker and drop anywhere

async function uploadFiles(fileList) {
  let files = [...fileList];
  if (!files.length) return;
  clearError();
  const prefix = state.prefix;
  // PUT replaces silently: ask first for names the folder already has.
  const clash = state.mode === 'folder' ? files.filter((f) => state.items.has(prefix + f.name)) : [];
  if (clash.length && !confirm(`Replace ${clash.map((f) => prefix + f.name).join(', ')}?`)) {
    files = files.filter((f) => !clash.includes(f));
    if (!files.length) return;
  }
  let stored = 0;
  let lastKey = null;
  let bytes = 0;
  const failures = [];
  for (const [i, file] of files.entries()) {
    const key = prefix + file.name;
    const label = `Uploading ${file.name}${files.length > 1 ? ` (${i + 1}/${files.length})` : ''}`;
    try {
      await putBlob(key, file, label);
      stored++;
      bytes += file.size;
      lastKey = key;
    } catch (e) {
      failures.push(`${file.name}: ${e?.message || e}`);
    }
  }
  if (failures.length) {
    const head = failures.length === 1 ? 'Upload failed' : `${failures.length} uploads failed`;
    const ok = stored ? ` (${stored} stored)` : '';
    showError(`${head}${ok}: ${failures.join('; ')}`);
  }
  if (stored) {
    const what = stored === 1 ? lastKey : `${stored} files into ${prefix || 'the store root'}`;
    setStatus(`Uploaded ${what}`);
    progress.done(`Uploaded ${stored} file${stored === 1 ? '' : 's'}, ${fmtBytes(bytes)}`, bytes);
  }
  // Show the folder the files went to (leaving search results, if any). The selection stays
  // with the image the viewer shows; the new tile is only marked as new.
  state.selectedKey = state.img?.key ?? null;
  await navigate(prefix, { keepError: true });
  const fresh = lastKey && tileFor(lastKey);
  if (fresh) {
    fresh.classList.add('fresh');
    fresh.scrollIntoView({ block: 'nearest' });
  }
}

function setupUpload() {
  el.uploadButton.addEventListener('click', () => el.fileInput.click());
  el.fileInput.addEventListener('change', async () => {
    const files = [...el.fileInput.files];
    el.fileInput.value = '';
    await uploadFiles(files);
  });

  let depth = 0;
  const hasFiles = (e) => !!e.dataTransfer && [...e.dataTransfer.types].includes('Files');
  const hide = () => {
    depth = 0;
    el.dropOverlay.hidden = true;
  };
  window.addEventListener('dragenter', (e) => {
    if (!hasFiles(e)) return;
    e.preventDefault();
    depth++;
    el.dropTarget.textContent = state.prefix || 'the store root';
    el.dropOverlay.hidden = false;
  });
  window.addEventListener('dragover', (e) => {
    if (!hasFiles(e)) return;
    e.preventDefault();
    e.dataTransfer.dropEffect = 'copy';
    el.dropOverlay.hidden = false;
  });
  window.addEventListener('dragleave', (e) => {
    if (!hasFiles(e)) return;
    depth = Math.max(0, depth - 1);
    if (depth === 0) el.dropOverlay.hidden = true;
  });
  window.addEventListener('drop', (e) => {
    const files = e.dataTransfer?.files;
    hide();
    if (!files || !files.length) return;
    e.preventDefault();
    uploadFiles(files);
  });
  window.addEventListener('blur', hide);
}

// ---------------------------------------------------------------------------------------------
// Rasters: raw samples from /api/pixels or /api/filter?format=raw, and their rendering

/** Parse a raw-pixel response (headers X-Width, X-Height, X-Channels, X-Bits). */
function parseRaster(res, bytes) {
  const w = Number(res.headers.get('X-Width'));
  const hgt = Number(res.headers.get('X-Height'));
  const ch = Number(res.headers.get('X-Channels'));
  const bits = Number(res.headers.get('X-Bits'));
  if (!(w > 0 && hgt > 0) || ![1, 2, 3, 4].includes(ch) || (bits !== 8 && bits !== 16)) {
    throw new Error(`the server sent pixels without a usable shape (X-Width ${w}, X-Height ${hgt}, X-Channels ${ch}, X-Bits ${bits})`);
  }
  const samples = w * hgt * ch;
  const need = samples * (bits / 8);
  if (bytes.length < need) throw new Error(`pixel data cut short: ${bytes.length} of ${need} bytes`);
  let data;
  if (bits === 8) {
    data = bytes.subarray(0, samples);
  } else if (LITTLE_ENDIAN && bytes.byteOffset % 2 === 0) {
    data = new Uint16Array(bytes.buffer, bytes.byteOffset, samples);
  } else {
    data = new Uint16Array(samples);
    const dv = new DataView(bytes.buffer, bytes.byteOffset, need);
    for (let i = 0; i < samples; i++) data[i] = dv.getUint16(i * 2, true);
  }
  const r = { w, h: hgt, ch, bits, data, map: { offset: 0, inverted: false, scale: 1 }, canvas: null, imageData: null };
  computeStats(r);
  return r;
}

/** Min, max and histogram of the colour samples (alpha left out). */
function computeStats(r) {
  const hist = new Uint32Array(1 << r.bits);
  const d = r.data;
  const colours = r.ch === 2 || r.ch === 4 ? r.ch - 1 : r.ch;
  if (colours === r.ch) {
    for (let i = 0; i < d.length; i++) hist[d[i]]++;
  } else {
    for (let i = 0; i < d.length; i += r.ch) for (let c = 0; c < colours; c++) hist[d[i + c]]++;
  }
  let min = -1;
  let max = -1;
  for (let v = 0; v < hist.length; v++) {
    if (hist[v]) {
      if (min < 0) min = v;
      max = v;
    }
  }
  r.hist = hist;
  r.count = (d.length / r.ch) * colours;
  r.rawMin = Math.max(0, min);
  r.rawMax = Math.max(0, max);
}

/** The display value (e.g. HU) of a raw sample. */
function toValue(map, raw) {
  return (map.inverted ? map.offset - raw : raw - map.offset) * (map.scale || 1);
}

/** Raw value below which fraction p of the samples lie. */
function rawPercentile(r, p) {
  const target = p * r.count;
  let acc = 0;
  for (let v = 0; v < r.hist.length; v++) {
    acc += r.hist[v];
    if (acc >= target && acc > 0) return v;
  }
  return r.rawMax;
}

/** The window that maps display values lo..hi onto the whole grey range. */
function windowFromRange(lo, hi) {
  const a = Math.min(lo, hi);
  const b = Math.max(lo, hi);
  return { c: (a + b + 1) / 2, w: Math.max(1, b - a + 1) };
}

/**
 * Lookup table raw sample -> 0..255: the display value ((raw - offset) × scale, or
 * (offset - raw) × scale when inverted), then DICOM VOI LINEAR (PS3.3 C.11.2.1.2.1) for centre c and width w; inverted
 * (MONOCHROME1) data is shown with low values white, as the server's thumbnails do.
 */
function buildLut(bits, map, c, w) {
  const n = 1 << bits;
  const lut = new Uint8Array(n);
  // The standard's formula counts in steps of 1; values spread over 16 bits with a scale
  // (32-bit or float data) count in steps of that scale.
  const step = Math.abs(map.scale || 1);
  const ww = Math.max(step, Number.isFinite(w) ? w : step);
  const cc = c - step / 2;
  const lo = cc - (ww - step) / 2;
  const hi = cc + (ww - step) / 2;
  const scale = ww > step ? 255 / (ww - step) : 0;
  for (let r = 0; r < n; r++) {
    const x = toValue(map, r);
    let y;
    if (x <= lo) y = 0;
    else if (x > hi) y = 255;
    else y = clamp(Math.round((x - cc) * scale + 127.5), 0, 255);
    lut[r] = map.inverted ? 255 - y : y;
  }
  return lut;
}

/** Write r's samples through lut into its offscreen canvas. */
function renderRaster(r, lut) {
  if (!r.canvas) {
    r.canvas = document.createElement('canvas');
    r.canvas.width = r.w;
    r.canvas.height = r.h;
    r.ctx = r.canvas.getContext('2d');
    r.imageData = r.ctx.createImageData(r.w, r.h);
    r.u32 = LITTLE_ENDIAN ? new Uint32Array(r.imageData.data.buffer) : null;
  }
  const d = r.data;
  const n = r.w * r.h;
  const alphaShift = r.bits === 16 ? 8 : 0;
  if (r.u32) {
    const out = r.u32;
    if (r.ch === 1) {
      for (let i = 0; i < n; i++) {
        const v = lut[d[i]];
        out[i] = 0xff000000 | (v << 16) | (v << 8) | v;
      }
    } else if (r.ch === 2) {
      for (let i = 0, j = 0; i < n; i++, j += 2) {
        const v = lut[d[j]];
        out[i] = ((d[j + 1] >> alphaShift) << 24) | (v << 16) | (v << 8) | v;
      }
    } else if (r.ch === 3) {
      for (let i = 0, j = 0; i < n; i++, j += 3) {
        out[i] = 0xff000000 | (lut[d[j + 2]] << 16) | (lut[d[j + 1]] << 8) | lut[d[j]];
      }
    } else {
      for (let i = 0, j = 0; i < n; i++, j += 4) {
        out[i] = ((d[j + 3] >> alphaShift) << 24) | (lut[d[j + 2]] << 16) | (lut[d[j + 1]] << 8) | lut[d[j]];
      }
    }
  } else {
    const out = r.imageData.data;
    for (let i = 0, o = 0, j = 0; i < n; i++, o += 4, j += r.ch) {
      if (r.ch <= 2) {
        out[o] = out[o + 1] = out[o + 2] = lut[d[j]];
        out[o + 3] = r.ch === 2 ? d[j + 1] >> alphaShift : 255;
      } else {
        out[o] = lut[d[j]];
        out[o + 1] = lut[d[j + 1]];
        out[o + 2] = lut[d[j + 2]];
        out[o + 3] = r.ch === 4 ? d[j + 3] >> alphaShift : 255;
      }
    }
  }
  r.ctx.putImageData(r.imageData, 0, 0);
}

/** Re-render the open image (and the filtered result) for the current window. */
function renderImages() {
  state.lutDirty = false;
  const img = state.img;
  if (!img) return;
  const lut = buildLut(img.orig.bits, img.orig.map, state.wl.c, state.wl.w);
  renderRaster(img.orig, lut);
  const f = img.filt;
  if (f) {
    if (f.ownWindow) {
      renderRaster(f, buildLut(f.bits, f.map, f.ownWindow.c, f.ownWindow.w));
    } else {
      renderRaster(f, f.bits === img.orig.bits ? lut : buildLut(f.bits, f.map, state.wl.c, state.wl.w));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Viewer: canvas, zoom/pan, window/level, presets, readouts

function cssSize() {
  return { w: el.canvasWrap.clientWidth, h: el.canvasWrap.clientHeight };
}

function ensureCanvasSize() {
  const { w, h: hh } = cssSize();
  const dpr = window.devicePixelRatio || 1;
  const bw = Math.max(1, Math.round(w * dpr));
  const bh = Math.max(1, Math.round(hh * dpr));
  if (el.canvas.width !== bw || el.canvas.height !== bh) {
    el.canvas.width = bw;
    el.canvas.height = bh;
    return true;
  }
  return false;
}

function setViewState(s, message = '') {
  el.view.dataset.state = s;
  if (message) el.viewMessageText.textContent = message;
}

function fitZoom() {
  const img = state.img;
  if (!img) return 1;
  const { w, h: hh } = cssSize();
  if (w < 2 || hh < 2) return 1;
  const pad = 8;
  return Math.max(1e-3, Math.min((w - pad) / img.orig.w, (hh - pad) / img.orig.h));
}

function fit() {
  const img = state.img;
  if (!img) return;
  const { w, h: hh } = cssSize();
  state.zoom = fitZoom();
  state.panX = (w - img.orig.w * state.zoom) / 2;
  state.panY = (hh - img.orig.h * state.zoom) / 2;
  state.fitted = true;
  updateZoomReadout();
  requestDraw();
}

function zoomAbout(px, py, factor) {
  const nz = clamp(state.zoom * factor, Math.min(0.02, fitZoom()), 64);
  const ix = (px - state.panX) / state.zoom;
  const iy = (py - state.panY) / state.zoom;
  state.zoom = nz;
  state.panX = px - ix * nz;
  state.panY = py - iy * nz;
  state.fitted = false;
  updateZoomReadout();
  requestDraw();
}

function updateZoomReadout() {
  el.zoomReadout.textContent = state.img ? `${Math.round(state.zoom * 100)}%` : '–';
}

function unit() {
  // A filter that makes grey levels (window, edge, emboss) leaves Hounsfield units behind.
  if (state.img?.filt?.ownWindow) return '';
  const u = state.img?.display?.unit;
  return u ? ` ${u}` : '';
}

function updateWlReadout() {
  if (!state.img) {
    el.wlReadout.textContent = '–';
    return;
  }
  const w = Math.round(state.wl.w);
  const c = Math.round(state.wl.c) + 0; // + 0 turns -0 into 0
  el.wlReadout.textContent = `W ${w} / L ${c}${unit()}`;
  renderOverlay();
}

function setWindow(c, w, presetId = null) {
  state.wl = { c, w: Math.max(1, w) };
  state.activePreset = presetId;
  for (const b of el.presets.querySelectorAll('.preset')) b.classList.toggle('active', b.dataset.preset === presetId);
  updateWlReadout();
  state.lutDirty = true;
  requestDraw();
}

/** Geometry (in image coordinates of the original) where raster r is drawn. */
function rasterRect(r) {
  const o = state.img.orig;
  if (r === o || (r.w === o.w && r.h === o.h)) return { x: 0, y: 0, w: o.w, h: o.h };
  const s = Math.min(o.w / r.w, o.h / r.h);
  return { x: (o.w - r.w * s) / 2, y: (o.h - r.h * s) / 2, w: r.w * s, h: r.h * s };
}

/** Screen x (CSS pixels) of the before/after split, or null when not comparing. */
function splitX() {
  const img = state.img;
  if (!img?.filt || !el.compare.checked) return null;
  const { w } = cssSize();
  const x0 = clamp(state.panX, 0, w);
  const x1 = clamp(state.panX + img.orig.w * state.zoom, 0, w);
  return x0 + ((x1 - x0) * Number(el.compareSlider.value)) / 100;
}

function viewInfo() {
  return {
    zoom: state.zoom,
    panX: state.panX,
    panY: state.panY,
    wl: { ...state.wl },
    splitX: splitX(),
    key: state.img?.key ?? null,
    filtered: !!state.img?.filt,
  };
}

function requestDraw() {
  if (state.drawPending) return;
  state.drawPending = true;
  requestAnimationFrame(draw);
}

function draw() {
  state.drawPending = false;
  ensureCanvasSize();
  const dpr = el.canvas.width / Math.max(1, cssSize().w);
  ctx.setTransform(1, 0, 0, 1, 0, 0);
  ctx.fillStyle = '#000';
  ctx.fillRect(0, 0, el.canvas.width, el.canvas.height);
  bs.frames++;
  const img = state.img;
  if (!img) return;
  if (state.lutDirty) renderImages();
  const z = state.zoom;
  const drawRaster = (r) => {
    const rect = rasterRect(r);
    ctx.setTransform(dpr * z, 0, 0, dpr * z, dpr * state.panX, dpr * state.panY);
    const smooth = (z * rect.w) / r.w < 1;
    ctx.imageSmoothingEnabled = smooth;
    if (smooth) ctx.imageSmoothingQuality = 'high';
    ctx.drawImage(r.canvas, rect.x, rect.y, rect.w, rect.h);
  };
  const sx = splitX();
  if (sx !== null) {
    const H = el.canvas.height;
    ctx.save();
    ctx.beginPath();
    ctx.rect(0, 0, sx * dpr, H);
    ctx.clip();
    drawRaster(img.orig);
    ctx.restore();
    ctx.save();
    ctx.beginPath();
    ctx.rect(sx * dpr, 0, el.canvas.width - sx * dpr, H);
    ctx.clip();
    drawRaster(img.filt);
    ctx.restore();
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.strokeStyle = '#ffd54a';
    ctx.lineWidth = 2;
    ctx.beginPath();
    ctx.moveTo(sx, 0);
    ctx.lineTo(sx, H / dpr);
    ctx.stroke();
    ctx.font = '12px system-ui, sans-serif';
    ctx.fillStyle = '#ffd54a';
    ctx.textBaseline = 'top';
    ctx.textAlign = 'right';
    ctx.fillText('before', sx - 6, 6);
    ctx.textAlign = 'left';
    ctx.fillText('after', sx + 6, 6);
  } else {
    drawRaster(img.filt || img.orig);
  }
  ctx.setTransform(1, 0, 0, 1, 0, 0);
}

/** The raster and sample under a canvas point, for the pixel readout. */
function sampleAt(px, py) {
  const img = state.img;
  if (!img) return null;
  const sx = splitX();
  const r = img.filt && (sx === null || px >= sx) ? img.filt : img.orig;
  const rect = rasterRect(r);
  const ox = (px - state.panX) / state.zoom;
  const oy = (py - state.panY) / state.zoom;
  const x = Math.floor(((ox - rect.x) / rect.w) * r.w);
  const y = Math.floor(((oy - rect.y) / rect.h) * r.h);
  if (x < 0 || y < 0 || x >= r.w || y >= r.h) return null;
  const i = (y * r.w + x) * r.ch;
  const colours = r.ch === 2 || r.ch === 4 ? r.ch - 1 : r.ch;
  const values = [];
  for (let c = 0; c < colours; c++) values.push(toValue(r.map, r.data[i + c]));
  return { x, y, values, filtered: r !== img.orig, grey: !!r.ownWindow };
}

function updatePixelReadout(px, py) {
  const s = sampleAt(px, py);
  if (!s) {
    el.pixelReadout.textContent = '';
    return;
  }
  const v = s.values.map(fmtNumber).join(' ');
  el.pixelReadout.textContent = `${s.x}, ${s.y}: ${v}${s.values.length === 1 && !s.grey ? unit() : ''}${s.filtered ? ' (filtered)' : ''}`;
}

function canvasPoint(e) {
  const r = el.canvas.getBoundingClientRect();
  return { x: e.clientX - r.left, y: e.clientY - r.top };
}

/** Display units moved per screen pixel of a window/level drag. */
function wlSensitivity() {
  const img = state.img;
  const d = img.display || {};
  let range = Number(d.max) - Number(d.min);
  if (!Number.isFinite(range) || range <= 0) range = img.orig.rawMax - img.orig.rawMin;
  if (!Number.isFinite(range) || range <= 0) range = (1 << img.orig.bits) - 1;
  return Math.max(range / 512, Math.abs(img.orig.map?.scale || 1) / 8);
}

function setupCanvas() {
  const c = el.canvas;
  c.addEventListener('contextmenu', (e) => e.preventDefault());
  c.addEventListener('pointerdown', (e) => {
    if (!state.img) return;
    let mode = null;
    if (e.button === 2 || (e.button === 0 && e.shiftKey)) mode = 'wl';
    else if (e.button === 0) mode = 'pan';
    if (!mode) return;
    e.preventDefault();
    c.setPointerCapture(e.pointerId);
    state.drag = { mode, id: e.pointerId, x: e.clientX, y: e.clientY, panX: state.panX, panY: state.panY, c: state.wl.c, w: state.wl.w, k: wlSensitivity() };
    c.classList.add(mode === 'pan' ? 'panning' : 'windowing');
  });
  c.addEventListener('pointermove', (e) => {
    const p = canvasPoint(e);
    const d = state.drag;
    if (d && d.id === e.pointerId) {
      const dx = e.clientX - d.x;
      const dy = e.clientY - d.y;
      if (d.mode === 'pan') {
        state.panX = d.panX + dx;
        state.panY = d.panY + dy;
        state.fitted = false;
        requestDraw();
      } else {
        // Right: wider window, by a factor (×2 per 140 px), so no drag collapses it; down:
        // higher level, in steps proportional to the window (a quarter width per 64 px) and
        // never finer than the image's value range allows.
        const w = clamp(d.w * Math.exp(dx / 200), d.k, d.k * 4096);
        setWindow(d.c + dy * Math.max(d.w / 256, d.k / 4), w);
      }
    }
    updatePixelReadout(p.x, p.y);
  });
  const end = (e) => {
    if (state.drag && state.drag.id === e.pointerId) {
      state.drag = null;
      c.classList.remove('panning', 'windowing');
    }
  };
  c.addEventListener('pointerup', end);
  c.addEventListener('pointercancel', end);
  c.addEventListener('pointerleave', () => {
    if (!state.drag) el.pixelReadout.textContent = '';
  });
  c.addEventListener(
    'wheel',
    (e) => {
      if (!state.img) return;
      e.preventDefault();
      if (state.stack && state.stack.length > 1 && !e.ctrlKey && !e.metaKey) {
        // Within a series or frame stack the wheel scrolls slices, as radiologists expect.
        if (e.deltaY !== 0) stepSlice(e.deltaY > 0 ? 1 : -1);
        return;
      }
      const p = canvasPoint(e);
      const perLine = e.deltaMode === 1 ? 40 : e.deltaMode === 2 ? 400 : 1;
      zoomAbout(p.x, p.y, Math.exp(-e.deltaY * perLine * 0.0015));
    },
    { passive: false },
  );
  c.addEventListener('dblclick', (e) => {
    e.preventDefault();
    fit();
  });
  el.fitButton.addEventListener('click', fit);
  el.compare.addEventListener('change', () => {
    el.compareBar.hidden = !(el.compare.checked && state.img?.filt);
    requestDraw();
  });
  el.compareSlider.addEventListener('input', requestDraw);

  new ResizeObserver(() => {
    if (ensureCanvasSize() && state.img && state.fitted) fit();
    else requestDraw();
  }).observe(el.canvasWrap);
}

function buildPresets() {
  const img = state.img;
  const list = [];
  if (!img) {
    state.presets = list;
    el.presets.replaceChildren();
    return;
  }
  const d = img.display || {};
  const o = img.orig;
  const gray = o.ch <= 2;
  if (gray && String(img.meta?.image?.modality || '').toUpperCase() === 'CT') list.push(...CT_PRESETS);
  if (Number.isFinite(d.center) && Number.isFinite(d.width)) {
    list.push({ id: 'default', label: 'Default', c: d.center, w: d.width });
  }
  let lo = Number(d.min);
  let hi = Number(d.max);
  if (!Number.isFinite(lo) || !Number.isFinite(hi)) {
    lo = toValue(o.map, o.rawMin);
    hi = toValue(o.map, o.rawMax);
  }
  list.push({ id: 'full', label: 'Full', ...windowFromRange(lo, hi) });
  if (o.bits === 16) {
    const a = toValue(o.map, rawPercentile(o, 0.01));
    const b = toValue(o.map, rawPercentile(o, 0.99));
    list.push({ id: 'auto', label: 'Auto 1–99%', ...windowFromRange(a, b) });
  }
  state.presets = list;
  el.presets.replaceChildren(
    ...list.map((p, i) =>
      h('button', {
        type: 'button',
        class: 'preset',
        'data-preset': p.id,
        title: `W ${Math.round(p.w)} / L ${Math.round(p.c)}${unit()} (key ${i + 1})`,
        text: p.label,
        onclick: () => setWindow(p.c, p.w, p.id),
      }),
    ),
  );
}

// ---------------------------------------------------------------------------------------------
// Opening images

function closeImage() {
  closeStack();
  el.overlay.hidden = true;
  state.loadAbort?.abort();
  state.loadSeq++;
  state.filterSeq++;
  state.img = null;
  buildPresets();
  resetFilterUi();
  el.viewKey.textContent = '';
  el.pixelReadout.textContent = '';
  el.downloadLink.hidden = true;
  el.metaBody.replaceChildren();
  updateWlReadout();
  updateZoomReadout();
  updateFilterButtons();
  setViewState('empty', 'Pick an image on the left, or drop files here to upload.');
  draw();
}

function showNonImage(info) {
  closeImage();
  el.viewKey.textContent = info.key;
  setViewState('empty', `${basename(info.key)} is not an image (${info.content_type || 'unknown type'}, ${fmtBytes(info.size)}).`);
  el.downloadLink.href = `/blobs/${encodeKey(info.key)}`;
  el.downloadLink.setAttribute('download', basename(info.key));
  el.downloadLink.textContent = `Download ${basename(info.key)}`;
  el.downloadLink.hidden = false;
  renderMeta(info, null, null);
}

/**
 * Show `key` (frame `opts.frame` of a multi-frame image). Within a stack (`opts.slice`, the
 * slice's pending load) the window, zoom and pan stay as the user left them.
 */
async function openImage(key, opts = {}) {
  const inStack = !!opts.slice;
  if (!inStack) closeStack();
  state.loadAbort?.abort();
  const abort = new AbortController();
  state.loadAbort = abort;
  const seq = ++state.loadSeq;
  state.filterSeq++;
  clearError();
  el.downloadLink.hidden = true;
  el.viewKey.textContent = opts.frame ? `${key} [frame ${opts.frame + 1}]` : key;
  if (!inStack || !state.img) setViewState('loading', `Loading ${basename(key)}…`);
  try {
    let meta, res, bytes;
    if (inStack) {
      ({ meta, res, bytes } = await opts.slice);
    } else {
      meta = await getJSON(`/api/meta/${encodeKey(key)}`, { signal: abort.signal });
      if (seq !== state.loadSeq) return;
      ({ res, bytes } = await fetchBytes(`/api/pixels/${encodeKey(key)}`, { signal: abort.signal }, `Downloading ${basename(key)}`));
    }
    if (seq !== state.loadSeq) return;
    const orig = parseRaster(res, bytes);
    const display = meta.display || {};
    orig.map = { offset: Number(display.offset) || 0, inverted: !!display.inverted, scale: Number(display.scale) || 1 };
    const keep = inStack && opts.keepWindow && state.img && state.img.orig.ch === orig.ch;
    // Filters apply to the whole series: the next slice goes through the same chain.
    const carry = inStack && state.img?.chain.length ? state.img.chain : null;
    state.img = { key, frame: opts.frame || 0, meta, display, orig, filt: null, chain: [] };
    resetFilterUi();
    buildPresets();
    if (keep) {
      state.lutDirty = true;
      setWindow(state.wl.c, state.wl.w, state.activePreset);
    } else {
      let wl;
      if (Number.isFinite(display.center) && Number.isFinite(display.width)) wl = { c: display.center, w: display.width };
      else wl = windowFromRange(toValue(orig.map, orig.rawMin), toValue(orig.map, orig.rawMax));
      state.wl = { c: wl.c, w: Math.max(1, wl.w) };
      state.activePreset = null;
      setWindow(state.wl.c, state.wl.w, state.presets.some((p) => p.id === 'default') ? 'default' : null);
    }
    ensureCanvasSize();
    if (!keep || state.fitted) fit();
    // A carried chain draws its own result; the unfiltered slice is not flashed first.
    if (carry) await runChain(state.img, carry);
    if (seq !== state.loadSeq) return;
    if (!state.img.filt) draw(); // no chain, or it failed (the filter panel says why)
    // A multi-frame image opened on its own becomes a stack of its frames (cine).
    const frames = Number(res.headers.get('X-Frames')) || 1;
    if (!inStack && frames > 1) {
      const entries = Array.from({ length: frames }, (_, f) => ({ key, frame: f }));
      const stack = new Stack(entries, { kind: 'frames', key, label: basename(key) }, loadSlice);
      stack.cache.set(stack.id(0), { bytes: bytes.length, promise: Promise.resolve({ meta, res, bytes }) });
      setStack(stack);
      stack.go(0);
    }
    renderOverlay();
    setViewState('ready');
    if (bs.firstImageMs === null) bs.firstImageMs = performance.now();
    renderMeta(meta.blob || state.items.get(key) || { key }, meta.image, display);
    setSaveNameDefault();
    updateFilterButtons();
    // Within a series the link names the series, not the slice.
    setHash(state.stack?.info.kind === 'series' ? `series/${state.stack.info.uid}` : key);
  } catch (e) {
    if (e?.name === 'AbortError' || seq !== state.loadSeq) return;
    state.img = null;
    buildPresets();
    updateWlReadout();
    updateZoomReadout();
    updateFilterButtons();
    draw();
    const msg = e instanceof Error ? e.message : String(e);
    setViewState('error', `Could not open ${basename(key)}: ${msg}`);
    showError(`Could not open ${key}: ${msg}`);
  }
}

const META_FIELDS = [
  ['modality', 'Modality'],
  ['patient_name', 'Patient', fmtPersonName],
  ['patient_id', 'Patient ID'],
  ['study_date', 'Study date', fmtDate],
  ['study_description', 'Study'],
  ['accession_number', 'Accession'],
  ['body_part_examined', 'Body part'],
  ['series_number', 'Series no.'],
  ['series_description', 'Series'],
  ['acquisition_date', 'Acquired', fmtDate],
  ['acquisition_time', 'Acq. time'],
  ['instance_number', 'Instance'],
  ['slice_location', 'Slice location'],
  ['bits_stored', 'Bits stored'],
  ['signed', 'Signed'],
  ['photometric_interpretation', 'Photometric'],
  ['window_center', 'Window centre'],
  ['window_width', 'Window width'],
  ['rescale_slope', 'Rescale slope'],
  ['rescale_intercept', 'Rescale intercept'],
  ['number_of_frames', 'Frames'],
  ['transfer_syntax_name', 'Transfer syntax'],
  ['format', 'Format'],
];

/** How the decoder stored the pixels: not clinical, kept out of the metadata panel. */
const INTERNAL_FIELDS = new Set(['frames_decoded', 'pixel_offset', 'pixel_inverted', 'pixel_scale', 'transfer_syntax_uid', 'pixel_kind']);

function renderMeta(blob, image, display) {
  const rows = [];
  const row = (k, v) => {
    if (v === undefined || v === null || v === '') return;
    rows.push(h('tr', {}, h('th', { scope: 'row', text: k }), v instanceof Node ? h('td', {}, v) : h('td', { text: String(v) })));
  };
  row('Key', h('a', { href: `/blobs/${encodeKey(blob.key)}`, download: basename(blob.key), title: 'Download the original', text: blob.key }));
  row('Size', Number.isFinite(blob.size) ? `${fmtBytes(blob.size)} (${blob.size} bytes)` : '');
  row('Type', blob.content_type);
  if (Number.isFinite(blob.created_ms)) row('Stored', new Date(blob.created_ms).toLocaleString());
  if (image) {
    row('Dimensions', image.width ? `${image.width} × ${image.height}` : '');
    const shown = new Set(['width', 'height']);
    for (const [k, label, f] of META_FIELDS) {
      shown.add(k);
      if (image[k] !== undefined && image[k] !== null) row(label, f ? f(image[k]) : image[k]);
    }
    for (const [k, v] of Object.entries(image)) {
      if (shown.has(k) || INTERNAL_FIELDS.has(k) || v === null || typeof v === 'object') continue;
      row(k.replaceAll('_', ' '), v);
    }
  }
  if (display && Number.isFinite(display.min) && Number.isFinite(display.max)) {
    row('Value range', `${fmtNumber(display.min)} … ${fmtNumber(display.max)}${display.unit ? ` ${display.unit}` : ''}`);
  }
  row('Digest', blob.digest);
  el.metaBody.replaceChildren(...rows);
}

// ---------------------------------------------------------------------------------------------
// Filters: chain, timing, compare, save

async function loadFilters() {
  try {
    const data = await getJSON('/api/filters');
    state.filters = data.filters || [];
    el.filterSelect.replaceChildren(
      ...state.filters.map((f) => h('option', { value: f.name, title: f.summary || '', text: f.kind && f.kind !== 'builtin' ? `${f.name} (${f.kind})` : f.name })),
    );
    const blur = state.filters.find((f) => f.name === 'blur');
    if (blur) el.filterSelect.value = 'blur';
    renderFilterParams();
  } catch (e) {
    fail('Could not load the filter list', e);
  }
}

function selectedFilter() {
  return state.filters.find((f) => f.name === el.filterSelect.value) || null;
}

function renderFilterParams() {
  const f = selectedFilter();
  el.filterSummary.textContent = f?.summary || '';
  if (!f) {
    el.filterParams.replaceChildren();
    return;
  }
  el.filterParams.replaceChildren(
    ...(f.params || []).map((p) => {
      const numeric = typeof p.min === 'number' && typeof p.max === 'number';
      const def = p.default === undefined || p.default === null ? '' : String(p.default);
      const attrs = { name: p.name, placeholder: def, title: p.help || '', 'aria-label': p.name };
      if (numeric) {
        const ints = [p.min, p.max, Number(def || 0)].every((v) => Number.isInteger(v));
        Object.assign(attrs, { type: 'number', min: p.min, max: p.max, step: ints ? 1 : 'any', inputmode: 'decimal' });
      } else {
        attrs.type = 'text';
      }
      const input = h('input', attrs);
      input.addEventListener('keydown', (e) => {
        if (e.key === 'Enter') {
          e.preventDefault();
          applyFilter();
        }
      });
      return h('label', { title: p.help || '' }, h('span', { text: p.name }), input);
    }),
  );
}

function setFilterState(s) {
  el.filterPanel.dataset.state = s;
  updateFilterButtons();
}

function updateFilterButtons() {
  const running = el.filterPanel.dataset.state === 'running';
  const img = state.img;
  el.applyFilter.disabled = !img || running || !selectedFilter();
  el.resetFilter.disabled = !img || running || !img.chain.length;
  el.saveResult.disabled = !img || running || !img.chain.length;
  el.compare.disabled = !img?.filt;
  el.compareBar.hidden = !(el.compare.checked && img?.filt);
}

function stepText(s) {
  const p = Object.entries(s.params || {}).map(([k, v]) => `${k}=${v}`);
  return p.length ? `${s.filter} ${p.join(' ')}` : s.filter;
}

/** X-Filter-Steps: `blur=1.25,sharpen=3.5` -> [{name, ms}]. */
function parseStepTimes(header) {
  if (!header) return [];
  return header
    .split(',')
    .map((part) => {
      const i = part.lastIndexOf('=');
      return i < 0 ? null : { name: part.slice(0, i).trim(), ms: parseFloat(part.slice(i + 1)) };
    })
    .filter(Boolean);
}

function renderChain(times = []) {
  const chain = state.img?.chain || [];
  el.filterChain.replaceChildren(
    ...chain.map((s, i) => h('li', {}, stepText(s), times[i] ? h('span', { class: 'ms', text: ` — ${fmtMs(times[i].ms)}` }) : null)),
  );
}

function resetFilterUi() {
  state.filterSeq++;
  if (state.img) {
    state.img.chain = [];
    state.img.filt = null;
  }
  el.compare.checked = false;
  el.compareBar.hidden = true;
  el.filterTime.textContent = '';
  renderChain();
  setFilterState('idle');
}

function readParams() {
  const params = {};
  for (const input of el.filterParams.querySelectorAll('input')) {
    const v = input.value.trim();
    if (input.type === 'number' && input.validity.badInput) throw new Error(`${input.name}: not a number`);
    if (v !== '') params[input.name] = v;
  }
  return params;
}

async function applyFilter() {
  const img = state.img;
  const f = selectedFilter();
  if (!img || !f || el.filterPanel.dataset.state === 'running') return;
  clearError();
  let step;
  try {
    step = { filter: f.name, params: readParams() };
  } catch (e) {
    fail(f.name, e);
    return;
  }
  await runChain(img, [...img.chain, step]);
}

/**
 * Show `img` through the filter `steps` (the whole chain, from its original pixels). Within a
 * series the chain follows the viewer from slice to slice (see `openImage`).
 */
async function runChain(img, steps) {
  const seq = ++state.filterSeq;
  setFilterState('running');
  el.filterTime.textContent = `Running ${steps.map((s) => s.filter).join(' → ')}…`;
  try {
    const { res, bytes } = await fetchBytes(
      '/api/filter',
      { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ key: img.key, frame: img.frame, steps, format: 'raw' }) },
      `Filtering ${basename(img.key)}`,
    );
    if (seq !== state.filterSeq || state.img !== img) return;
    const r = parseRaster(res, bytes);
    if (r.bits === img.orig.bits && !steps.some((s) => GREY_LEVEL_FILTERS.has(s.filter))) {
      r.map = img.orig.map; // same units as the original: same window
    } else {
      // The result holds grey levels, not the original's values: show it on its own full scale.
      r.map = { offset: 0, inverted: false, scale: 1 };
      r.ownWindow = windowFromRange(0, (1 << r.bits) - 1);
    }
    img.filt = r;
    img.chain = steps;
    const times = parseStepTimes(res.headers.get('X-Filter-Steps'));
    const total = parseFloat(res.headers.get('X-Filter-Ms'));
    el.filterTime.textContent =
      (times.length ? times.map((t) => `${t.name} ${fmtMs(t.ms)}`).join(' · ') : '') +
      (Number.isFinite(total) ? `${times.length ? ' — ' : ''}total ${fmtMs(total)}` : '');
    renderChain(times);
    renderImages();
    updateWlReadout(); // a grey-level result is no longer in the original's units
    setFilterState('done');
    draw();
    setSaveNameDefault();
  } catch (e) {
    if (seq !== state.filterSeq) return;
    el.filterTime.textContent = '';
    setFilterState('error');
    fail('Filter failed', e);
  }
}

function setSaveNameDefault() {
  const img = state.img;
  if (!img || !state.saveNameAuto) return;
  const base = basename(img.key).replace(/\.[^.]*$/, '');
  const suffix = img.chain.length ? img.chain.map((s) => s.filter).join('-') : 'filtered';
  el.saveName.value = `${dirname(img.key)}${base}-${suffix}.png`;
}

function formatFor(name) {
  const ext = (/\.([^./]+)$/.exec(name)?.[1] || '').toLowerCase();
  if (ext === 'tif' || ext === 'tiff') return { format: 'tiff', type: 'image/tiff' };
  if (ext === 'jpg' || ext === 'jpeg') return { format: 'jpeg', type: 'image/jpeg' };
  if (ext === 'pgm' || ext === 'ppm' || ext === 'pnm') return { format: 'pgm', type: 'image/x-portable-anymap' };
  return { format: 'png', type: 'image/png' };
}

async function saveResult() {
  const img = state.img;
  if (!img || !img.chain.length || el.filterPanel.dataset.state === 'running') return;
  const name = el.saveName.value.trim().replace(/^\/+/, '');
  if (!name || name.endsWith('/') || name.split('/').some((s) => s === '' || s === '.' || s === '..')) {
    showError(`"${el.saveName.value}" is not a usable name: use folder/name.png`);
    el.saveName.focus();
    return;
  }
  if (state.items.has(name) && !confirm(`Replace ${name}?`)) return;
  clearError();
  const { format, type } = formatFor(name);
  const seq = ++state.filterSeq;
  setFilterState('running');
  try {
    const { bytes } = await fetchBytes(
      '/api/filter',
      { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ key: img.key, frame: img.frame, steps: img.chain, format }) },
      `Encoding ${format.toUpperCase()}`,
    );
    await putBlob(name, new Blob([bytes], { type }), `Uploading ${basename(name)}`);
    if (seq === state.filterSeq) setFilterState('done');
    setStatus(`Saved ${name}`);
    state.selectedKey = name;
    await refreshListing();
    tileFor(name)?.scrollIntoView({ block: 'nearest' });
  } catch (e) {
    if (seq === state.filterSeq) setFilterState('error');
    fail(`Could not save ${name}`, e);
  }
}

function setupFilterPanel() {
  el.filterSelect.addEventListener('change', () => {
    renderFilterParams();
    updateFilterButtons();
  });
  el.applyFilter.addEventListener('click', applyFilter);
  el.resetFilter.addEventListener('click', () => {
    resetFilterUi();
    setSaveNameDefault();
    updateWlReadout(); // back in the original's units
    draw();
  });
  el.saveResult.addEventListener('click', saveResult);
  el.saveName.addEventListener('input', () => {
    state.saveNameAuto = el.saveName.value.trim() === '';
  });
  el.saveName.addEventListener('keydown', (e) => {
    if (e.key === 'Enter') {
      e.preventDefault();
      saveResult();
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Start

function setupKeys() {
  window.addEventListener('keydown', (e) => {
    if (e.key === 'Escape') {
      clearError();
      el.dropOverlay.hidden = true;
      return;
    }
    if (isTyping(e) || e.ctrlKey || e.metaKey || e.altKey) return;
    if (!state.img) return;
    // Keys on a focused form control (the slider steps itself) keep their own meaning, and so
    // does Space on a focused button or link (it presses it).
    const target = e.target instanceof Element ? e.target : null;
    if (target?.closest('input, select, textarea')) return;
    if (e.key === ' ' && target?.closest('button, a, [role="tab"]')) return;
    const stackKeys = { ArrowDown: 1, ArrowRight: 1, PageDown: 10, ArrowUp: -1, ArrowLeft: -1, PageUp: -10 };
    if (state.stack && e.key in stackKeys) {
      e.preventDefault();
      stepSlice(stackKeys[e.key]);
    } else if (state.stack && (e.key === 'Home' || e.key === 'End')) {
      e.preventDefault();
      showSlice(e.key === 'Home' ? 0 : state.stack.length - 1);
    } else if (state.stack && e.key === ' ') {
      e.preventDefault();
      toggleCine();
    } else if (e.key === 'f' || e.key === '0') {
      fit();
    } else if (/^[1-9]$/.test(e.key)) {
      const p = state.presets[Number(e.key) - 1];
      if (p) setWindow(p.c, p.w, p.id);
    } else if (e.key === '+' || e.key === '=' || e.key === '-') {
      const { w, h: hh } = cssSize();
      zoomAbout(w / 2, hh / 2, e.key === '-' ? 1 / 1.25 : 1.25);
    }
  });
}

function start() {
  el.errorClose.addEventListener('click', clearError);
  el.searchForm.addEventListener('submit', (e) => {
    e.preventDefault();
    runSearch();
  });
  el.clearSearch.addEventListener('click', clearSearch);
  setupUpload();
  setupCanvas();
  setupFilterPanel();
  setupKeys();
  setupStacks();
  updateWlReadout();
  updateZoomReadout();
  updateFilterButtons();
  draw();

  // #/folder/ opens a folder, #/folder/name an image in it (kept up to date with replaceState).
  let path = '';
  try {
    path = decodeURIComponent(location.hash.replace(/^#\/?/, ''));
  } catch {
    path = '';
  }
  loadFilters();
  // #series/UID opens a series in the series viewer (a link to share, or a benchmark's).
  if (path.startsWith('series/')) {
    openSeries(path.slice('series/'.length), path.slice('series/'.length));
    navigate('');
    return;
  }
  const prefix = path.endsWith('/') || !path ? path : dirname(path);
  const image = path && !path.endsWith('/') ? path : '';
  // A linked image loads at once, in parallel with its folder's listing.
  if (image) {
    state.selectedKey = image;
    openImage(image);
  }
  navigate(prefix).then(() => {
    if (image) selectKey(image);
  });
}

/** With `--auth-token-file` on the server, ask for the token once and keep it in an
 * HttpOnly session cookie (so thumbnails and downloads authenticate too). */
async function ensureSession() {
  let s;
  try {
    s = await getJSON('/api/session');
  } catch {
    return; // the server will say what is wrong on the first real request
  }
  while (s.auth_required && !s.authenticated) {
    const token = window.prompt('This blobstream server requires its access token:');
    if (token === null) {
      showError('Not logged in: the server requires an access token (reload to try again).');
      return;
    }
    const res = await doFetch('/api/session', {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ token: token.trim() }),
    });
    if (res.ok) s = { auth_required: true, authenticated: true };
    else window.alert((await errorFromResponse(res)).message);
  }
}

// A link pasted or edited in the address bar opens what it names.
window.addEventListener('hashchange', () => {
  let path = '';
  try {
    path = decodeURIComponent(location.hash.replace(/^#\/?/, ''));
  } catch {
    return;
  }
  if (path.startsWith('series/')) {
    const uid = path.slice('series/'.length);
    if (state.stack?.info.uid !== uid) openSeries(uid, uid);
  } else if (path.endsWith('/') || !path) {
    if (path !== state.prefix) navigate(path);
  } else if (path !== state.img?.key) {
    state.selectedKey = path;
    openImage(path);
    if (dirname(path) !== state.prefix) navigate(dirname(path)).then(() => selectKey(path));
  }
});

ensureSession()
  .catch((e) => showError(`Could not log in: ${e?.message || e}`))
  .finally(start);
