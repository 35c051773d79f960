// blobstream browser client: the behaviour of index.html (served at "/app.js").
//
// Talks to the HTTP API of docs/http-api.md: lists and searches the store, opens images as raw
// samples (/api/pixels) and applies window/level in the browser with a lookup table, runs
// filter chains on the server (/api/filter) with before/after comparison, uploads with PUT
// (XMLHttpRequest, for upload progress) and downloads with fetch streams (download progress).
//
// The client is native ES modules, one for each part of the page; this one imports them and
// starts them (keys, the URL hash, the session):
//   util.js     DOM, formatting and JSON-fetch helpers (no page state)
//   state.js    the shared `state`, the page's elements `el`, the test hooks `bs`
//   status.js   status line, error banner, progress bar; transfers with progress
//   browse.js   folder listing, tiles, breadcrumbs, navigation, delete
//   search.js   the search form and its results
//   series.js   Files/Studies tabs (worklist.js), series and frame stacks, cine (stack.js)
//   upload.js   file picker, drag and drop
//   raster.js   raw samples: parsing, statistics, lookup tables, rendering
//   viewer.js   the canvas: drawing, zoom/pan, window/level, presets, readouts, overlay
//   image.js    opening and closing images, the metadata panel
//   filters.js  the filter panel: chains, timing, compare, save
//
// Test hooks: window.blobstream = {ready, firstImageMs, lastError, lastProgress, ...};
// #view[data-state] is empty|loading|ready|error; #filter-panel[data-state] is
// idle|running|done|error.

import { dirname, doFetch, errorFromResponse, getJSON, isTyping } from './util.js';
import { bs, el, state } from './state.js';
import { clearError, showError } from './status.js';
import { navigate, selectKey } from './browse.js';
import { setupSearch } from './search.js';
import { openSeries, setupStacks, showSlice, stackInfo, stepSlice, toggleCine } from './series.js';
import { setupUpload } from './upload.js';
import {
  cssSize,
  draw,
  fit,
  setupCanvas,
  setWindow,
  updateWlReadout,
  updateZoomReadout,
  viewInfo,
  zoomAbout,
} from './viewer.js';
import { openImage } from './image.js';
import { loadFilters, setupFilterPanel, updateFilterButtons } from './filters.js';

// The test hooks that read the viewer and the open stack (state.js imports no view).
bs.view = () => viewInfo();
bs.stack = () => stackInfo();
// The filtered result's picture as the viewer shows it (window applied, one pixel a sample).
bs.resultPicture = () => {
  const r = state.img?.filt;
  return r?.canvas ? r.ctx.getImageData(0, 0, r.w, r.h) : null;
};

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
  setupSearch();
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
  const series = seriesOf(path);
  if (series) {
    openSeries(series, series);
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

/** The Series Instance UID a `series/UID` link names (a UID is digits and dots), or null:
 * `series/…` with anything else is a blob path in a folder that happens to be named series. */
function seriesOf(path) {
  return /^series\/([0-9]+(\.[0-9]+)*)$/.exec(path)?.[1] ?? null;
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
  const uid = seriesOf(path);
  if (uid) {
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
