// Helpers every view uses that need no page state: building DOM nodes, formatting keys, sizes,
// times, dates and names, and fetching JSON with the server's errors made readable.

export const $ = (sel) => document.querySelector(sel);

/** A key or prefix in a URL path: each segment percent-encoded, joined with '/'. */
export function encodeKey(key) {
  return key.split('/').map(encodeURIComponent).join('/');
}

export function h(tag, attrs = {}, ...children) {
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

export function basename(key) {
  const i = key.lastIndexOf('/', key.length - 2);
  return key.slice(i + 1);
}

export function dirname(key) {
  const i = key.lastIndexOf('/');
  return i < 0 ? '' : key.slice(0, i + 1);
}

export function fmtBytes(n) {
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

export function fmtMs(ms) {
  if (!Number.isFinite(ms)) return '? ms';
  return `${ms < 10 ? ms.toFixed(2) : ms.toFixed(1)} ms`;
}

export function fmtNumber(v) {
  if (!Number.isFinite(v)) return String(v);
  if (Number.isInteger(v)) return String(v);
  return String(Math.round(v * 100) / 100);
}

export function fmtDate(s) {
  return /^\d{8}$/.test(s) ? `${s.slice(0, 4)}-${s.slice(4, 6)}-${s.slice(6, 8)}` : s;
}

export function fmtPersonName(s) {
  // DICOM PN: family^given^middle^prefix^suffix
  const parts = String(s).split('^').filter(Boolean);
  return parts.length > 1 ? `${parts[0]}, ${parts.slice(1).join(' ')}` : String(s);
}

export function clamp(v, lo, hi) {
  return Math.min(hi, Math.max(lo, v));
}

export function isTyping(e) {
  const t = e.target;
  return t instanceof HTMLElement && (t.isContentEditable || /^(INPUT|SELECT|TEXTAREA)$/.test(t.tagName));
}

// ---------------------------------------------------------------------------------------------
// Errors and fetching

export class ApiError extends Error {
  constructor(message, status = 0, code = '') {
    super(message);
    this.status = status;
    this.code = code;
  }
}

/** The error of a failed response: the server's JSON `error.message`, else the status. */
export function errorFromBody(status, statusText, text) {
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

export async function errorFromResponse(res) {
  let text = '';
  try {
    text = await res.text();
  } catch {
    /* body unreadable: fall back to the status */
  }
  return errorFromBody(res.status, res.statusText, text);
}

export async function doFetch(url, init) {
  try {
    return await fetch(url, init);
  } catch (e) {
    if (e?.name === 'AbortError') throw e;
    throw new ApiError(`cannot reach the server (${e?.message || e})`, 0, 'network');
  }
}

export async function getJSON(url, init) {
  const res = await doFetch(url, init);
  if (!res.ok) throw await errorFromResponse(res);
  return res.json();
}
