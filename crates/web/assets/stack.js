// A stack of slices shown one at a time: the images of a series in slice order, or the
// frames of a multi-frame image (cine). Keeps the position, and fetches ahead in the same
// priority order as the parallel block store: the visible slice first, then its neighbours
// outwards, a few at a time, into a cache bounded in bytes. With a filter chain on the stack
// (filters apply to the whole series), the nearest slices are also filtered ahead on the
// server, two at a time; a new chain drops the old results and aborts their requests.

/** Slices `i ± 1, i ± 2, …` in the order to fetch them (nearest first, forward first). */
export function prefetchOrder(i, n) {
  const out = [];
  for (let d = 1; d < n; d++) {
    if (i + d < n) out.push(i + d);
    if (i - d >= 0) out.push(i - d);
  }
  return out;
}

export class Stack {
  /**
   * @param {{key: string, frame: number}[]} entries slices in display order
   * @param {object} info what the stack is: {kind: 'series'|'frames', uid?, key?, label}
   * @param {(entry, signal) => Promise<object>} load fetches one slice (meta, pixels)
   * @param {{budget?: number, parallel?: number, filter?: (entry, steps, signal) => Promise<object>, filterAhead?: number}} opts
   *   cache size in bytes, fetches at once; how to run a chain on one slice, and on how many
   *   neighbours ahead of the user
   */
  constructor(entries, info, load, opts = {}) {
    this.entries = entries;
    this.info = info;
    this.index = 0;
    this.load = load;
    this.budget = opts.budget ?? 512 * 1024 * 1024;
    this.parallel = opts.parallel ?? 3;
    this.cache = new Map(); // entry id -> {promise, bytes}
    this.used = 0;
    this.abort = new AbortController();
    this.slices = { inflight: 0, pump: null }; // fetch-ahead of slices (see `ahead`)
    this.generation = 0;
    this.filterLoad = opts.filter ?? null;
    this.filterAhead = opts.filterAhead ?? 4;
    this.chain = [];
    this.filtered = new Map(); // entry id -> {promise, done}: the slice through `chain`
    this.filters = { inflight: 0, pump: null }; // and of the chain's results
    this.chainAbort = new AbortController();
  }

  /** Filter every slice with `steps` from now on (`[]`: none): results and requests of the
   * previous chain are dropped. */
  setChain(steps) {
    this.chainAbort.abort();
    this.chainAbort = new AbortController();
    this.filtered.clear();
    this.chain = steps;
    this.prefetch();
  }

  /** Slice `i` through the stack's chain ({res, bytes} of /api/filter), run once per chain. */
  getFiltered(i) {
    const id = this.id(i);
    let f = this.filtered.get(id);
    if (!f) {
      f = { done: false, promise: null };
      const entry = f;
      f.promise = this.filterLoad(this.entries[i], this.chain, this.chainAbort.signal).then(
        (v) => {
          entry.done = true;
          return v;
        },
        (e) => {
          if (this.filtered.get(id) === entry) this.filtered.delete(id);
          throw e;
        },
      );
      this.filtered.set(id, f);
    }
    return f.promise;
  }

  /** Slices whose filtered result has arrived. */
  filteredCount() {
    let n = 0;
    for (const f of this.filtered.values()) if (f.done) n++;
    return n;
  }

  get length() {
    return this.entries.length;
  }

  id(i) {
    const e = this.entries[i];
    return `${e.key}#${e.frame}`;
  }

  /** The slice at `i`, from the cache or fetched now (and kept). */
  get(i) {
    const id = this.id(i);
    let c = this.cache.get(id);
    if (!c) {
      c = { bytes: 0, promise: null };
      c.promise = this.load(this.entries[i], this.abort.signal).then(
        (v) => {
          c.bytes = v.bytes?.length || 0;
          this.used += c.bytes;
          return v;
        },
        (e) => {
          this.cache.delete(id);
          throw e;
        },
      );
      this.cache.set(id, c);
    }
    return c.promise;
  }

  /** Slices cached and complete. */
  cachedCount() {
    let n = 0;
    for (const c of this.cache.values()) if (c.bytes > 0) n++;
    return n;
  }

  /** Move to slice `i` (clamped); returns the new index. Restarts the fetch-ahead from it. */
  go(i) {
    this.index = Math.max(0, Math.min(this.entries.length - 1, i));
    this.evict();
    this.evictFiltered();
    this.prefetch();
    return this.index;
  }

  /** Over the budget, drop the cached slices furthest from the current one. */
  evict() {
    if (this.used <= this.budget) return;
    const far = [...this.cache.entries()]
      .filter(([, c]) => c.bytes > 0)
      .map(([id, c]) => ({ id, c, d: Math.abs(this.entries.findIndex((e) => `${e.key}#${e.frame}` === id) - this.index) }))
      .sort((a, b) => b.d - a.d);
    for (const { id, c, d } of far) {
      if (this.used <= this.budget * 0.9 || d <= 2) break;
      this.cache.delete(id);
      this.used -= c.bytes;
    }
  }

  /** Keep filtered results only near the current slice (they are recomputed if needed). */
  evictFiltered() {
    for (const id of [...this.filtered.keys()]) {
      const i = this.entries.findIndex((e) => `${e.key}#${e.frame}` === id);
      if (Math.abs(i - this.index) > this.filterAhead) this.filtered.delete(id);
    }
  }

  /** Fetch the neighbours of the current slice, nearest first, while the budget lasts. */
  prefetch() {
    this.generation++;
    const order = prefetchOrder(this.index, this.entries.length);
    // Eviction makes room as the user moves on.
    // (Each lane takes its own copy of the order: it shifts what it has started off it.)
    this.ahead(this.slices, [...order], this.parallel, this.cache, (i) => this.get(i), () => this.used < this.budget);
    // The chain's results for the nearest slices, fewer at a time (filtering is the server's
    // CPU): the visible slice's own request is made by the viewer.
    this.filters.pump = null;
    if (!this.chain.length || !this.filterLoad) return;
    this.ahead(this.filters, order.slice(0, this.filterAhead), 2, this.filtered, (i) => this.getFiltered(i));
  }

  /**
   * Run `fetch(i)` for the slices of `order` not in `have`, nearest first, at most `limit` at a
   * time while `room()`. `lane` counts them and holds the pump of the current generation: a
   * fetch of an older one that finishes calls it, so a move never leaves the lane stalled.
   */
  ahead(lane, order, limit, have, fetch, room = () => true) {
    const gen = this.generation;
    const next = () => {
      if (gen !== this.generation || this.abort.signal.aborted) return;
      while (lane.inflight < limit && order.length && room()) {
        const i = order.shift();
        if (have.has(this.id(i))) continue;
        lane.inflight++;
        fetch(i)
          .catch(() => {})
          .finally(() => {
            lane.inflight--;
            lane.pump?.();
          });
      }
    };
    lane.pump = next;
    next();
  }

  close() {
    this.chainAbort.abort();
    this.filtered.clear();
    this.abort.abort();
    this.cache.clear();
    this.used = 0;
  }
}
