// Filters: the filter panel, chains run on the server (/api/filter) with their timing, shown
// before/after in the viewer, and saving the result as a new blob.

import { basename, dirname, fmtMs, getJSON, h } from './util.js';
import { el, state } from './state.js';
import { clearError, fail, fetchBytes, putBlob, setStatus, showError } from './status.js';
import { parseRaster, renderImages, windowFromRange } from './raster.js';
import { refreshListing, tileFor } from './browse.js';
import { draw, updateWlReadout } from './viewer.js';

export async function loadFilters() {
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

export function updateFilterButtons() {
  const running = el.filterPanel.dataset.state === 'running';
  const img = state.img;
  el.applyFilter.disabled = !img || running || !selectedFilter();
  el.resetFilter.disabled = !img || running || !img.chain.length;
  el.saveResult.disabled = !img || running || !img.chain.length;
  el.saveWhat.disabled = el.saveResult.disabled;
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

export function resetFilterUi() {
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
  const steps = [...img.chain, step];
  // Within a series the chain belongs to the series: every slice shown goes through it, even
  // one whose own filtering is still running or failed (see `openImage`).
  if (state.stack) state.stack.setChain(steps);
  await runChain(img, steps);
}

/**
 * Show `img` through the filter `steps` (the whole chain, from its original pixels). Within a
 * series the chain follows the viewer from slice to slice (see `openImage`).
 */
export async function runChain(img, steps) {
  const seq = ++state.filterSeq;
  // A request this one supersedes is not worth finishing (a slice in a stack keeps its own:
  // the stack caches it for when the user comes back).
  state.filterAbort?.abort();
  state.filterAbort = null;
  setFilterState('running');
  el.filterTime.textContent = `Running ${steps.map((s) => s.filter).join(' → ')}…`;
  const st = state.stack;
  const at = st?.entries[st.index];
  const fromStack = st?.filterLoad && st.chain === steps && at?.key === img.key && at?.frame === img.frame;
  try {
    let got;
    if (fromStack) {
      got = await st.getFiltered(st.index); // perhaps filtered ahead already
    } else {
      const abort = new AbortController();
      state.filterAbort = abort;
      got = await fetchBytes(
        '/api/filter',
        { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ key: img.key, frame: img.frame, steps, format: 'raw' }), signal: abort.signal },
        `Filtering ${basename(img.key)}`,
      );
    }
    const { res, bytes } = got;
    if (seq !== state.filterSeq || state.img !== img) return;
    const r = parseRaster(res, bytes);
    // What the server says the result's samples are: the original's values (blur, zoom), its
    // scale without its meaning (invert: no longer HU), or grey levels for display (window,
    // edge, emboss, and any chain or kernel that makes them).
    const output = res.headers.get('X-Filter-Output') || 'values';
    if (r.bits === img.orig.bits && output !== 'grey-levels') {
      r.map = img.orig.map; // same scale as the original: same window
      r.unitless = output === 'scale';
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
    if (seq !== state.filterSeq || e?.name === 'AbortError') return;
    el.filterTime.textContent = '';
    setFilterState('error');
    fail('Filter failed', e);
  }
}

export function setSaveNameDefault() {
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
  if (ext === 'gif') return { format: 'gif', type: 'image/gif' };
  if (ext === 'png') return { format: 'png', type: 'image/png' };
  // Any other name would hold bytes its extension does not say.
  return null;
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
  const chosen = formatFor(name);
  if (!chosen) {
    showError(`"${name}": name the result .png, .jpg, .tif, .gif or .pgm (the format it is saved in)`);
    el.saveName.focus();
    return;
  }
  if (state.items.has(name) && !confirm(`Replace ${name}?`)) return;
  clearError();
  const { format, type } = chosen;
  // As shown: the result's picture through the window on screen (its raster's own canvas,
  // one pixel per sample), which only PNG and JPEG hold here.
  const shown = el.saveWhat.value === 'shown';
  if (shown && format !== 'png' && format !== 'jpeg') {
    showError(`"As shown" saves a PNG or JPEG picture: name it .png or .jpg (or save the values as ${format.toUpperCase()})`);
    el.saveName.focus();
    return;
  }
  const seq = ++state.filterSeq;
  setFilterState('running');
  try {
    let blob;
    if (shown) {
      const canvas = img.filt?.canvas;
      if (!canvas) throw new Error('the result is not on screen yet');
      blob = await new Promise((resolve, reject) =>
        canvas.toBlob((b) => (b ? resolve(b) : reject(new Error('the browser could not encode the picture'))), type, 0.95),
      );
    } else {
      const { bytes } = await fetchBytes(
        '/api/filter',
        { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ key: img.key, frame: img.frame, steps: img.chain, format }) },
        `Encoding ${format.toUpperCase()}`,
      );
      blob = new Blob([bytes], { type });
    }
    await putBlob(name, blob, `Uploading ${basename(name)}`);
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

export function setupFilterPanel() {
  el.filterSelect.addEventListener('change', () => {
    renderFilterParams();
    updateFilterButtons();
  });
  el.applyFilter.addEventListener('click', applyFilter);
  el.resetFilter.addEventListener('click', () => {
    if (state.stack) state.stack.setChain([]);
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
