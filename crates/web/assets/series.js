// Studies and series: the Files/Studies tabs with the worklist (worklist.js), and the series or
// frame stack shown in the viewer (stack.js): its slider, stepping through slices, cine play.

import { Stack } from './stack.js';
import { setupWorklist } from './worklist.js';
import { doFetch, encodeKey, errorFromResponse, fmtDate, fmtPersonName, getJSON, h } from './util.js';
import { el, state } from './state.js';
import { clearError, fail } from './status.js';
import { navigate } from './browse.js';
import { searchParams } from './search.js';
import { openImage } from './image.js';

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
export async function loadSlice(entry, signal) {
  const meta = await getJSON(`/api/meta/${encodeKey(entry.key)}`, { signal });
  const res = await doFetch(`/api/pixels/${encodeKey(entry.key)}?frame=${entry.frame}`, { signal });
  if (!res.ok) throw await errorFromResponse(res);
  const bytes = new Uint8Array(await res.arrayBuffer());
  return { meta, res, bytes };
}

/** One slice (or frame) of a stack through the filter `steps`, run on the server. */
export async function loadFiltered(entry, steps, signal) {
  const res = await doFetch('/api/filter', {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ key: entry.key, frame: entry.frame, steps, format: 'raw' }),
    signal,
  });
  if (!res.ok) throw await errorFromResponse(res);
  return { res, bytes: new Uint8Array(await res.arrayBuffer()) };
}

/** A stack of `entries` that fetches and filters ahead (see stack.js). */
export function newStack(entries, info) {
  return new Stack(entries, info, loadSlice, { filter: loadFiltered });
}

export function stackInfo() {
  const st = state.stack;
  if (!st) return null;
  return { kind: st.info.kind, index: st.index, length: st.length, cached: st.cachedCount(), filtered: st.filteredCount(), playing: !!state.cine, key: st.entries[st.index].key, frame: st.entries[st.index].frame, chain: (st.chain || []).map((c) => c.filter) };
}

export function closeStack() {
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
export function setStack(stack) {
  state.stack = stack;
  el.stackSlider.max = String(stack.length);
  el.stackSlider.value = '1';
  el.stackReadout.textContent = `${stack.info.kind === 'frames' ? 'frame' : 'slice'} 1 / ${stack.length}`;
  el.stackBar.hidden = stack.length < 2;
}

/** Show slice `i` of the open stack (the window stays as the user set it, unless `fresh`). */
export function showSlice(i, { fresh = false } = {}) {
  const st = state.stack;
  if (!st) return;
  const first = fresh || !state.img;
  const at = st.go(i);
  el.stackSlider.value = String(at + 1);
  el.stackReadout.textContent = `${st.info.kind === 'frames' ? 'frame' : 'slice'} ${at + 1} / ${st.length}`;
  const e = st.entries[at];
  openImage(e.key, { frame: e.frame, keepWindow: !first, slice: st.get(at) });
}

export function stepSlice(d) {
  if (state.stack) showSlice(state.stack.index + d);
}

function stopCine() {
  if (state.cine) clearInterval(state.cine);
  state.cine = null;
  el.stackPlay.setAttribute('aria-pressed', 'false');
  el.stackPlay.innerHTML = '&#9654;';
}

export function toggleCine() {
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

export async function openSeries(uid, label) {
  clearError();
  const seq = ++state.seriesSeq;
  try {
    const v = await getJSON(`/api/series/${encodeURIComponent(uid)}/instances`);
    if (seq !== state.seriesSeq) return; // another series was asked for meanwhile
    const entries = [];
    for (const inst of v.instances) {
      for (let f = 0; f < Math.max(1, inst.frames); f++) entries.push({ key: inst.key, frame: f });
    }
    openStack(newStack(entries, { kind: 'series', uid, label }));
  } catch (e) {
    fail(`Could not open the series ${label}`, e);
  }
}

export function setupStacks() {
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
