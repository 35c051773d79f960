// The client's shared state: the `state` object the views read and change, the `el` table of
// the page's elements, and the test hooks `bs` (window.blobstream).
//
// Values the views share are properties of these objects (an imported binding cannot be
// assigned). This module imports no view, so any module may use them at its top level.

import { $ } from './util.js';

export const bs = {
  ready: false, // the first folder listing has been rendered
  firstImageMs: null, // performance.now() when the first image was drawn
  lastError: null, // text of the last error shown in #error
  lastProgress: null, // {label, loaded, total, done} of the last upload or download
  frames: 0, // canvas redraws so far
  // Set by app.js, as this module imports no view: view() is viewInfo() of viewer.js, stack()
  // stackInfo() of series.js (the open series or frame stack: position, length, cached slices).
  view: null,
  stack: null,
};
window.blobstream = bs;

export const el = {
  status: $('#status'),
  progress: $('#progress'),
  progressBar: $('#progress-bar'),
  progressLabel: $('#progress-label'),
  error: $('#error'),
  errorMessage: $('#error-message'),
  errorClose: $('#error-close'),
  uploadButton: $('#upload-button'),
  fileInput: $('#file-input'),
  crumbs: $('#crumbs'),
  searchForm: $('#search-form'),
  searchQ: $('#search-q'),
  searchModality: $('#search-modality'),
  searchPatient: $('#search-patient'),
  searchFrom: $('#search-date-from'),
  searchTo: $('#search-date-to'),
  resultsBar: $('#results-bar'),
  resultsHeading: $('#results-heading'),
  clearSearch: $('#clear-search'),
  listing: $('#listing'),
  worklist: $('#worklist'),
  tabFiles: $('#tab-files'),
  tabStudies: $('#tab-studies'),
  stackBar: $('#stack-bar'),
  stackPlay: $('#stack-play'),
  stackSlider: $('#stack-slider'),
  stackReadout: $('#stack-readout'),
  overlay: $('#overlay'),
  overlayTl: $('#overlay-tl'),
  overlayBr: $('#overlay-br'),
  view: $('#view'),
  presets: $('#presets'),
  fitButton: $('#fit-button'),
  zoomReadout: $('#zoom-readout'),
  canvasWrap: $('#canvas-wrap'),
  canvas: $('#canvas'),
  viewMessageText: $('#view-message-text'),
  downloadLink: $('#download-link'),
  compareBar: $('#compare-bar'),
  compareSlider: $('#compare-slider'),
  wlReadout: $('#wl-readout'),
  pixelReadout: $('#pixel-readout'),
  viewKey: $('#view-key'),
  filterPanel: $('#filter-panel'),
  filterSelect: $('#filter-select'),
  filterSummary: $('#filter-summary'),
  filterParams: $('#filter-params'),
  applyFilter: $('#apply-filter'),
  resetFilter: $('#reset-filter'),
  filterChain: $('#filter-chain'),
  filterTime: $('#filter-time'),
  compare: $('#compare'),
  saveName: $('#save-name'),
  saveResult: $('#save-result'),
  saveWhat: $('#save-what'),
  metaBody: $('#meta-body'),
  dropOverlay: $('#drop-overlay'),
  dropTarget: $('#drop-target'),
};

export const state = {
  prefix: '', // current folder: empty or ending with '/'
  mode: 'folder', // 'folder' or 'search'
  items: new Map(), // key -> BlobInfo of the tiles shown
  selectedKey: null,
  listSeq: 0,
  filters: [],
  img: null, // the open image, see openImage
  loadSeq: 0,
  loadAbort: null,
  wl: { c: 0, w: 1 },
  activePreset: null,
  presets: [],
  zoom: 1,
  panX: 0,
  panY: 0,
  fitted: true,
  drag: null,
  drawPending: false,
  lutDirty: false, // the window changed: re-render the rasters before drawing
  saveNameAuto: true,
  filterSeq: 0,
  // The running /api/filter request of a single image, aborted when another supersedes it.
  filterAbort: null,
  stack: null, // the Stack being shown (a series or a multi-frame image), see stack.js
  seriesSeq: 0,
  cine: null, // interval timer while the stack plays
  worklist: null,
};
