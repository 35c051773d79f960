// Upload: the file picker and dropping files anywhere on the page, into the current folder.

import { encodeKey, fmtBytes } from './util.js';
import { el, state } from './state.js';
import { clearError, progress, putBlob, setStatus, showError } from './status.js';
import { navigate, tileFor } from './browse.js';

async function uploadFiles(fileList) {
  let files = [...fileList];
  if (!files.length) return;
  clearError();
  const prefix = state.prefix;
  // PUT replaces silently: ask first for names already taken — the folder's listing knows
  // them; shown search results do not, so the server is asked.
  let clash;
  if (state.mode === 'folder') {
    clash = files.filter((f) => state.items.has(prefix + f.name));
  } else {
    const head = (f) => fetch(`/blobs/${encodeKey(prefix + f.name)}`, { method: 'HEAD' }).then((r) => r.ok, () => false);
    const taken = await Promise.all(files.map(head));
    clash = files.filter((_, i) => taken[i]);
  }
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
  // On the Studies tab, the worklist shows what the upload added (the listing, hidden, is
  // already fresh for when the Files tab comes back).
  if (!el.worklist.hidden) state.worklist.reload();
  const fresh = lastKey && tileFor(lastKey);
  if (fresh) {
    fresh.classList.add('fresh');
    fresh.scrollIntoView({ block: 'nearest' });
  }
}

export function setupUpload() {
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
