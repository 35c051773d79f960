// What the user is told while work runs: the status line, the error banner and the progress
// bar, with the transfers that drive the bar (fetchBytes downloads with fetch streams, putBlob
// uploads with XMLHttpRequest for upload progress).

import { ApiError, clamp, doFetch, encodeKey, errorFromBody, errorFromResponse, fmtBytes } from './util.js';
import { bs, el } from './state.js';

/** Fetch a body while showing download progress (Content-Length when the server sends it). */
export async function fetchBytes(url, init, label) {
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
export function putBlob(key, body, label) {
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

export const progress = {
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

/** Show `message` in the error banner; with `add`, after what the banner already shows (an
 * upload's failure stays readable when the listing that follows fails too). */
export function showError(message, { add = false } = {}) {
  if (add && !el.error.hidden && el.errorMessage.textContent) message = `${el.errorMessage.textContent} — then: ${message}`;
  bs.lastError = message;
  el.errorMessage.textContent = message;
  el.error.title = message;
  el.error.hidden = false;
  console.warn('blobstream:', message);
}

export function clearError() {
  el.error.hidden = true;
}

let statusTimer = null;
export function setStatus(message) {
  clearTimeout(statusTimer);
  el.status.textContent = message;
  statusTimer = setTimeout(() => {
    if (el.status.textContent === message) el.status.textContent = '';
  }, 15000);
}

/** Report a failure: ignore aborted requests, show the rest in the error banner. */
export function fail(context, e, opts = {}) {
  if (e?.name === 'AbortError') return;
  const msg = e instanceof Error ? e.message : String(e);
  showError(context ? `${context}: ${msg}` : msg, opts);
}
