// Search: the search form (whose criteria also filter the Studies tab), its results shown in
// the listing, and clearing back to the folder.

import { getJSON } from './util.js';
import { el, state } from './state.js';
import { clearError, fail } from './status.js';
import { navigate, renderListing } from './browse.js';

export function searchParams() {
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

export async function runSearch({ keepError = false } = {}) {
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

export function setupSearch() {
  el.searchForm.addEventListener('submit', (e) => {
    e.preventDefault();
    runSearch();
  });
  el.clearSearch.addEventListener('click', clearSearch);
}
