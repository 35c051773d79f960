// Opening an image: its metadata and pixels (or a stack slice's), its first window, a
// multi-frame image turned into a frame stack; closing it; and the metadata panel.

import { basename, encodeKey, fmtBytes, fmtDate, fmtNumber, fmtPersonName, getJSON, h } from './util.js';
import { bs, el, state } from './state.js';
import { clearError, fetchBytes, showError } from './status.js';
import { parseRaster, toValue, windowFromRange } from './raster.js';
import { setHash } from './browse.js';
import { closeStack, newStack, setStack } from './series.js';
import {
  buildPresets,
  draw,
  ensureCanvasSize,
  fit,
  renderOverlay,
  setViewState,
  setWindow,
  updateWlReadout,
  updateZoomReadout,
} from './viewer.js';
import { resetFilterUi, runChain, setSaveNameDefault, updateFilterButtons } from './filters.js';

export function closeImage() {
  closeStack();
  el.overlay.hidden = true;
  state.loadAbort?.abort();
  state.loadSeq++;
  state.filterSeq++;
  state.filterAbort?.abort(); // its filtering is of no use now
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

export function showNonImage(info) {
  closeImage();
  el.viewKey.textContent = info.key;
  setViewState('empty', `${basename(info.key)} is not an image (${info.content_type || 'unknown type'}, ${fmtBytes(info.size)}).`);
  el.downloadLink.href = `/blobs/${encodeKey(info.key)}`;
  el.downloadLink.setAttribute('download', basename(info.key));
  el.downloadLink.textContent = `Download ${basename(info.key)}`;
  el.downloadLink.hidden = false;
  renderMeta(info, null, null);
}

/** A blob marked corrupt: why, and what to do, with no download link and no pixels. */
export function showCorrupt(info) {
  closeImage();
  el.viewKey.textContent = info.key;
  setHash(info.key);
  setViewState('error', `${basename(info.key)} is corrupt on the server: ${info.corrupt}. Restore it from a copy, or delete it.`);
  showError(`${info.key} is corrupt on the server: ${info.corrupt}`);
  renderMeta(info, null, null);
}

/**
 * Show `key` (frame `opts.frame` of a multi-frame image). Within a stack (`opts.slice`, the
 * slice's pending load) the window, zoom and pan stay as the user left them.
 */
export async function openImage(key, opts = {}) {
  const inStack = !!opts.slice;
  if (!inStack) closeStack();
  state.loadAbort?.abort();
  const abort = new AbortController();
  state.loadAbort = abort;
  const seq = ++state.loadSeq;
  state.filterSeq++;
  state.filterAbort?.abort(); // its filtering is of no use now
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
    const carry = inStack && state.stack?.chain?.length ? state.stack.chain : null;
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
    // A carried chain draws its result when it arrives (the unfiltered slice shows meanwhile).
    if (carry) await runChain(state.img, carry);
    if (seq !== state.loadSeq) return;
    if (!state.img.filt) draw(); // no chain, or it failed (the filter panel says why)
    // A multi-frame image opened on its own becomes a stack of its frames (cine).
    const frames = Number(res.headers.get('X-Frames')) || 1;
    if (!inStack && frames > 1) {
      const entries = Array.from({ length: frames }, (_, f) => ({ key, frame: f }));
      const stack = newStack(entries, { kind: 'frames', key, label: basename(key) });
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
    // Nothing of the image shown before stays beside this one's name: not its patient and
    // study (overlay, metadata), its window, its filters or save name, nor its link.
    resetFilterUi();
    state.img = null;
    el.overlay.hidden = true;
    el.metaBody.replaceChildren();
    el.pixelReadout.textContent = '';
    if (state.saveNameAuto) el.saveName.value = '';
    buildPresets();
    updateWlReadout();
    updateZoomReadout();
    updateFilterButtons();
    draw();
    if (!inStack) setHash(key);
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
  // A corrupt blob's download would only fail: its key is shown as text.
  row('Key', blob.corrupt ? blob.key : h('a', { href: `/blobs/${encodeKey(blob.key)}`, download: basename(blob.key), title: 'Download the original', text: blob.key }));
  row('Size', Number.isFinite(blob.size) ? `${fmtBytes(blob.size)} (${blob.size} bytes)` : '');
  row('Type', blob.content_type);
  row('Corrupt', blob.corrupt);
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
