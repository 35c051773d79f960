// Rasters: raw samples from /api/pixels or /api/filter?format=raw, their statistics, the
// window/level lookup table, and their rendering into offscreen canvases.

import { clamp } from './util.js';
import { state } from './state.js';

const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

/** Parse a raw-pixel response (headers X-Width, X-Height, X-Channels, X-Bits). */
export function parseRaster(res, bytes) {
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
export function toValue(map, raw) {
  return (map.inverted ? map.offset - raw : raw - map.offset) * (map.scale || 1);
}

/** Raw value below which fraction p of the samples lie. */
export function rawPercentile(r, p) {
  const target = p * r.count;
  let acc = 0;
  for (let v = 0; v < r.hist.length; v++) {
    acc += r.hist[v];
    if (acc >= target && acc > 0) return v;
  }
  return r.rawMax;
}

/** The window that maps display values lo..hi onto the whole grey range. */
export function windowFromRange(lo, hi) {
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
export function renderImages() {
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
