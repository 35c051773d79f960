// Browse: the folder listing (folders, tiles with thumbnails, "Load more"), its breadcrumbs,
// the selection, navigation kept in the URL hash, opening a tile and deleting a blob.

import { basename, doFetch, encodeKey, errorFromResponse, fmtBytes, getJSON, h } from './util.js';
import { bs, el, state } from './state.js';
import { clearError, fail, setStatus } from './status.js';
import { runSearch } from './search.js';
import { closeImage, openImage, showCorrupt, showNonImage } from './image.js';

const IMAGE_EXTENSIONS = /\.(png|jpe?g|tiff?|gif|pgm|ppm|pnm|pbm|dcm|dicom)$/i;

export function setHash(path) {
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
  // Marked corrupt (a reader or the scrubber found bytes that do not match): no preview, said
  // on the tile, and opening it says why instead of fetching what the server will refuse.
  const corrupt = info.corrupt;
  const tile = h('div', {
    class: corrupt ? 'tile corrupt' : 'tile',
    'data-key': info.key,
    tabindex: 0,
    role: 'button',
    title: [info.key, corrupt && `CORRUPT: ${corrupt}`, fmtBytes(info.size), info.content_type, dims, modality].filter(Boolean).join('\n'),
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
  if (corrupt) {
    tile.append(h('div', { class: 'file-icon', 'aria-hidden': 'true', text: 'corrupt' }));
  } else if (info.is_image) {
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
    h('div', { class: 'size', text: [corrupt ? 'corrupt' : modality, fmtBytes(info.size)].filter(Boolean).join(' · ') }),
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

export function tileFor(key) {
  for (const t of el.listing.querySelectorAll('.tile')) if (t.dataset.key === key) return t;
  return null;
}

export function selectKey(key) {
  state.selectedKey = key;
  markSelected(key ? tileFor(key) : null);
}

export function renderListing(folders, items, { append = false, fullKeys = false, more = null } = {}) {
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
export async function navigate(prefix, { keepError = false } = {}) {
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
    // After an error the caller keeps (an upload's), this one is said after it.
    fail(`Could not list ${prefix || 'the store'}`, e, { add: keepError });
  } finally {
    if (seq === state.listSeq && !bs.ready) bs.ready = true;
  }
}

export function refreshListing() {
  if (state.mode === 'search') return runSearch({ keepError: true });
  return navigate(state.prefix, { keepError: true });
}

function activateTile(info) {
  selectKey(info.key);
  if (state.img?.key === info.key && el.view.dataset.state === 'ready') return;
  if (info.corrupt) showCorrupt(info);
  else if (info.is_image || IMAGE_EXTENSIONS.test(info.key)) openImage(info.key);
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
