// The worklist: DICOM studies (GET /api/studies) in a sortable, paged table, as radiologists
// expect; a click on a study lists its series (GET /api/studies/{uid}/series), a click on a
// series opens it in the series viewer.

const COLUMNS = [
  ['patient', 'Patient'],
  ['id', 'Patient ID'],
  ['date', 'Study date'],
  ['modality', 'Modality'],
  ['description', 'Description'],
  ['accession', 'Accession'],
  ['series', 'Series'],
  ['images', 'Images'],
  // The metadata given at upload (`blobstream put --meta K=V`): shown, searched by the search
  // box's free text, not sortable.
  ['notes', 'Upload metadata', false],
];

const PAGE = 25;
// Most documents of one series the worklist offers.
const DOCUMENTS = 50;

/**
 * @param {object} deps app helpers: h, getJSON, fmtDate, fmtPersonName, criteria() (the search
 *   form as query parameters), openSeries(uid, label), fail(context, e)
 */
export function setupWorklist(root, deps) {
  const { h, getJSON, fmtDate, fmtPersonName } = deps;
  const st = { sort: 'date', order: 'desc', offset: 0, total: 0, seq: 0, open: null };
  const table = h('table', { id: 'worklist-table' });
  const thead = h('thead');
  const tbody = h('tbody');
  const pager = h('div', { class: 'pager' });
  table.append(thead, tbody);
  root.replaceChildren(table, pager);

  function header() {
    const row = h('tr');
    for (const [col, label, sortable = true] of COLUMNS) {
      if (!sortable) {
        row.append(h('th', { scope: 'col', 'data-col': col }, label));
        continue;
      }
      const sorted = st.sort === col;
      const th = h('th', { scope: 'col', 'data-col': col, 'aria-sort': sorted ? (st.order === 'asc' ? 'ascending' : 'descending') : 'none' });
      const b = h('button', { type: 'button', title: `Sort by ${label.toLowerCase()}` }, label, sorted ? (st.order === 'asc' ? ' ▲' : ' ▼') : '');
      b.addEventListener('click', () => {
        if (st.sort === col) st.order = st.order === 'asc' ? 'desc' : 'asc';
        else {
          st.sort = col;
          st.order = col === 'date' || col === 'series' || col === 'images' ? 'desc' : 'asc';
        }
        st.offset = 0;
        load();
      });
      th.append(b);
      row.append(th);
    }
    thead.replaceChildren(row);
  }

  function studyRow(s) {
    const tr = h('tr', { class: 'study', 'data-study': s.study_uid, tabindex: '0' });
    const cells = [
      fmtPersonName(s.patient_name),
      s.patient_id,
      fmtDate(s.study_date),
      s.modalities.join(', '),
      s.study_description,
      s.accession_number,
      String(s.series),
      String(s.images),
    ];
    for (const c of cells) tr.append(h('td', {}, c || ''));
    const notes = Object.entries(s.user_metadata || {}).map(([k, v]) => `${k}: ${v}`).join('; ');
    tr.append(h('td', { class: 'notes', title: notes }, notes));
    const toggle = () => toggleSeries(tr, s);
    tr.addEventListener('click', toggle);
    tr.addEventListener('keydown', (e) => {
      if (e.key === 'Enter') toggle();
    });
    return tr;
  }

  async function toggleSeries(tr, s) {
    const next = tr.nextElementSibling;
    if (next?.classList.contains('series-list')) {
      next.remove();
      tr.setAttribute('aria-expanded', 'false');
      return;
    }
    tr.setAttribute('aria-expanded', 'true');
    const holder = h('td', { colspan: String(COLUMNS.length) }, 'Loading series…');
    const row = h('tr', { class: 'series-list' }, holder);
    tr.after(row);
    try {
      const v = await getJSON(`/api/studies/${encodeURIComponent(s.study_uid)}/series`);
      const list = h('ul');
      for (const se of v.series) {
        const label = [se.series_number && `#${se.series_number}`, se.modality, se.series_description].filter(Boolean).join(' ');
        const plural = (n, what) => `${n} ${what}${n === 1 ? '' : 's'}`;
        // A series of reports or documents only (nothing the viewer can draw) is listed, not opened.
        const count = se.images ? plural(se.images, 'image') : `${plural(se.instances, 'instance')}, none viewable`;
        const b = h('button', { type: 'button', class: 'series', 'data-series': se.series_uid }, `${label || se.series_uid} — ${count}`);
        b.disabled = !se.images;
        b.addEventListener('click', (e) => {
          e.stopPropagation();
          deps.openSeries(se.series_uid, `${fmtPersonName(s.patient_name)} · ${label}`);
        });
        const li = h('li', {}, b);
        list.append(li);
        if (!se.images) documents(li, s.study_uid, se.series_uid);
      }
      holder.replaceChildren(list);
    } catch (e) {
      holder.textContent = `Could not list the series: ${e?.message || e}`;
    }
  }

  // The instances of a series the viewer cannot draw (reports, PDFs): each can be downloaded
  // as its DICOM file (WADO-URI), and a structured report or an encapsulated document opened
  // in a new tab (WADO-RS rendered: the report as text, a PDF as itself).
  async function documents(li, study, series) {
    const span = h('span', { class: 'series-docs' }, ' Loading documents…');
    li.append(span);
    try {
      const base = `/dicomweb/studies/${encodeURIComponent(study)}/series/${encodeURIComponent(series)}`;
      const found = await getJSON(`${base}/instances?limit=${DOCUMENTS}`, { headers: { Accept: 'application/dicom+json' } });
      const value = (o, tag) => o?.[tag]?.Value?.[0] ?? '';
      const links = [];
      for (const o of found) {
        const sop = value(o, '00080018');
        const uri = new URLSearchParams({ requestType: 'WADO', studyUID: study, seriesUID: series, objectUID: sop, contentType: 'application/dicom' });
        const sopClass = String(value(o, '00080016'));
        const kind = sopClass.startsWith('1.2.840.10008.5.1.4.1.1.104.') ? 'document'
          : sopClass.startsWith('1.2.840.10008.5.1.4.1.1.88.') ? 'report' : null;
        if (kind) {
          const open = h('a', { class: kind, href: `${base}/instances/${encodeURIComponent(sop)}/rendered`, target: '_blank', rel: 'noopener' }, `Open ${kind}`);
          open.addEventListener('click', (e) => e.stopPropagation());
          links.push(open);
        }
        const dl = h('a', { class: 'download', href: `/dicomweb/wado?${uri}`, download: `${sop}.dcm` }, 'Download .dcm');
        dl.addEventListener('click', (e) => e.stopPropagation());
        links.push(dl);
      }
      span.replaceChildren(...links.flatMap((a) => [' ', a]));
    } catch (e) {
      span.textContent = ` Could not list the documents: ${e?.message || e}`;
    }
  }

  async function load() {
    const seq = ++st.seq;
    header();
    const p = deps.criteria();
    p.set('sort', st.sort);
    p.set('order', st.order);
    p.set('offset', String(st.offset));
    p.set('limit', String(PAGE));
    root.dataset.state = 'loading';
    try {
      const v = await getJSON(`/api/studies?${p}`);
      if (seq !== st.seq) return;
      st.total = v.total;
      tbody.replaceChildren(...v.studies.map(studyRow));
      if (!v.studies.length) tbody.append(h('tr', { class: 'empty' }, h('td', { colspan: String(COLUMNS.length) }, 'No studies match.')));
      const from = v.total ? st.offset + 1 : 0;
      const to = st.offset + v.studies.length;
      const prev = h('button', { type: 'button', id: 'worklist-prev' }, '‹ Previous');
      const next = h('button', { type: 'button', id: 'worklist-next' }, 'Next ›');
      prev.disabled = st.offset === 0;
      next.disabled = to >= v.total;
      prev.addEventListener('click', () => {
        st.offset = Math.max(0, st.offset - PAGE);
        load();
      });
      next.addEventListener('click', () => {
        st.offset += PAGE;
        load();
      });
      pager.replaceChildren(prev, h('span', { id: 'worklist-range' }, `${from}–${to} of ${v.total} studies`), next);
      root.dataset.state = 'ready';
    } catch (e) {
      if (seq !== st.seq) return;
      root.dataset.state = 'error';
      deps.fail('Could not load the worklist', e);
    }
  }

  return {
    reload() {
      st.offset = 0;
      return load();
    },
  };
}
