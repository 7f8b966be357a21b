// delaybridge dashboard.
//
// When it opens it reads the daemon's samples of the last minutes (GET
// /v1/history); then every 2 s it reads /metrics (Prometheus text) and GET
// /v1/stats, keeps the last 5 minutes of counter samples in memory to compute
// rates and fire lateness quantiles, and draws the charts as inline SVG. It
// lists dead messages with retry (to another sink or destination when one
// died for its own), delete and delete all, the sinks with pause and resume,
// parked messages page by page with filters, the recurring schedules, and
// shows a message (with reschedule, fire now and cancel) or a group (with
// cancel). Above the cards it shows the warnings of GET /v1/stats: a Redis
// that keeps nothing on disk (redis_persistence), shards that did not
// answer (warning). Every call is a
// route of the admin API (GET /openapi.json).
//
// Times are shown in one format: the API's (RFC 3339, UTC, milliseconds),
// with how far from now they are.
//
// Everything that comes from the server (IDs, reasons, JSON) is written with
// textContent or as an attribute value: nothing here builds HTML from strings.
// IDs and reasons are shown through shown(), which writes control characters
// and bidirectional overrides as \uXXXX, so that one ID cannot look like
// another. The admin token is given in a dialog or in the link to the page
// (/#token=<token>, taken out of the address bar at once), kept in
// sessionStorage and sent only as a bearer header; every request is
// same-origin, and one with a body is JSON.
(() => {
  'use strict';

  const POLL_MS = 2000;
  const WINDOW_MS = 5 * 60 * 1000; // the most the charts show
  const SPAN = 5; // samples (10 s) behind the cards' rates and the lateness quantiles
  const DEAD_LIMIT = 100;
  const DEAD_EVERY = 5; // ticks between re-reads of the dead list when its count is unchanged
  const TOKEN_KEY = 'delaybridge.adminToken';
  const SLOW_EVERY = 5; // ticks between re-reads of the listings (the current page, recurring, group)
  const RECURRING_LIMIT = 50;
  const RECURRING_PAGES = 10; // pages of the recurring listing per refresh (each examines at most 10 x its limit)
  const SVG_NS = 'http://www.w3.org/2000/svg';
  const DUE_BUCKETS = [
    ['overdue', 'Overdue'],
    ['minute', 'Next minute'],
    ['hour', 'Next hour'],
    ['day', 'Next day'],
    ['later', 'Later'],
  ];

  const $ = (id) => document.getElementById(id);
  const nf = new Intl.NumberFormat('en-US');

  // ---- DOM helpers ----

  // el creates an element; children are nodes or strings (appended as text).
  function el(tag, className, ...children) {
    const e = document.createElement(tag);
    if (className) e.className = className;
    e.append(...children);
    return e;
  }

  function svgEl(tag, attrs, text) {
    const e = document.createElementNS(SVG_NS, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function button(label, className, onClick) {
    const b = el('button', className, label);
    b.type = 'button';
    b.addEventListener('click', onClick);
    return b;
  }

  // keepRows shows items as the rows (from build) of a table body. A row
  // whose item is unchanged (the same JSON) stays the same element, so a
  // click under way, a form the user has open and what is typed in it
  // survive the list being drawn again; rows gone are removed and new ones
  // inserted in place.
  function keepRows(body, items, build) {
    const old = new Map();
    for (const tr of [...body.children]) {
      if (tr.rowKey !== undefined && !old.has(tr.rowKey)) old.set(tr.rowKey, tr);
      else tr.remove();
    }
    const rows = items.map((it) => {
      const key = JSON.stringify(it);
      const tr = old.get(key) || build(it);
      old.delete(key);
      tr.rowKey = key;
      return tr;
    });
    for (const tr of old.values()) tr.remove();
    rows.forEach((tr, i) => {
      if (body.children[i] !== tr) body.insertBefore(tr, body.children[i] || null);
    });
  }

  // armedIn reports whether a button under the element of that id waits for
  // its second click (armConfirm): a list re-rendered then would lose it.
  function armedIn(id) {
    return $(id).querySelector('button.armed') !== null;
  }

  // armConfirm makes a button ask for a second click within 4 s before it
  // runs action (for destructive actions, without a modal dialog).
  function armConfirm(b, confirmLabel, action) {
    let timer = 0;
    let label = '';
    const disarm = () => {
      clearTimeout(timer);
      if (b.classList.contains('armed')) {
        b.classList.remove('armed');
        b.textContent = label;
      }
    };
    b.addEventListener('click', async () => {
      if (!b.classList.contains('armed')) {
        label = b.textContent;
        b.classList.add('armed');
        b.textContent = confirmLabel;
        timer = setTimeout(disarm, 4000);
        return;
      }
      disarm();
      b.disabled = true;
      try {
        await action();
      } finally {
        b.disabled = false;
      }
    });
    return b;
  }

  let toastTimer = 0;
  function toast(message, isError) {
    const t = $('toast');
    t.textContent = message;
    t.classList.toggle('toast-error', Boolean(isError));
    t.hidden = false;
    clearTimeout(toastTimer);
    toastTimer = setTimeout(() => { t.hidden = true; }, 5000);
  }

  function setConn(kind, text) {
    const c = $('conn');
    c.className = 'pill pill-' + kind;
    c.textContent = text;
  }

  // ---- formatting ----

  // shown returns s for display: C0 and C1 controls, DEL and the
  // bidirectional embeddings, overrides and isolates (the characters the
  // server refuses in IDs), and the invisible default-ignorable code
  // points (zero-width spaces and joiners, the byte-order mark...)
  // written as \uXXXX, as the server writes them (envelope.IsHidden).
  const DECEPTIVE = /[\u0000-\u001f\u007f-\u009f\u202a-\u202e\u2066-\u2069\p{Cf}\p{Default_Ignorable_Code_Point}]/gu;
  const escapeChar = (c) => Array.from({ length: c.length }, (_, i) => '\\u' + c.charCodeAt(i).toString(16).padStart(4, '0')).join('');
  const shown = (s) => String(s).replace(DECEPTIVE, escapeChar);
  // shownJSON is JSON.stringify with the characters IDs refuse escaped
  // (C0 controls are already escaped inside strings, and its line breaks
  // stay); the invisible ones stay as they are in a message's content,
  // where emoji and scripts such as Persian join with them.
  const JSON_DECEPTIVE = /[\u007f-\u009f\u202a-\u202e\u2066-\u2069]/g;
  const shownJSON = (v) => JSON.stringify(v, null, 2).replace(JSON_DECEPTIVE, escapeChar);

  const fmtInt = (n) => nf.format(n || 0);

  function fmtRate(v) {
    if (v == null || !isFinite(v)) return '–';
    if (v === 0) return '0';
    return v < 10 ? v.toFixed(1) : nf.format(Math.round(v));
  }

  function fmtDuration(s) {
    s = Math.round(s);
    if (s < 60) return s + ' s';
    if (s < 3600) return Math.floor(s / 60) + 'm ' + (s % 60) + 's';
    if (s < 86400) return Math.floor(s / 3600) + 'h ' + Math.floor((s % 3600) / 60) + 'm';
    return Math.floor(s / 86400) + 'd ' + Math.floor((s % 86400) / 3600) + 'h';
  }

  function fmtSeconds(s) {
    if (s == null || !isFinite(s)) return '–';
    if (s === 0) return '0';
    if (s < 0.01) return parseFloat((s * 1000).toFixed(1)) + ' ms';
    if (s < 1) return Math.round(s * 1000) + ' ms';
    if (s < 60) return s.toFixed(s < 10 ? 2 : 1) + ' s';
    return fmtDuration(s);
  }

  // fmtMs is a lateness (given in seconds, as the metrics have it) in the
  // one unit the page shows lateness in, milliseconds, which the labels
  // name: the number alone.
  function fmtMs(s) {
    if (s == null || !isFinite(s)) return '–';
    const v = s * 1000;
    if (v === 0) return '0';
    if (v < 1) return v.toFixed(2);
    if (v < 10) return v.toFixed(1);
    return nf.format(Math.round(v));
  }

  // fmtTime is a time in the one format the page shows times in: the
  // API's, RFC 3339 in UTC with milliseconds.
  const fmtTime = (ms) => new Date(ms).toISOString();

  // A percentage width that stays visible (3 px) for a non-zero value.
  function barWidth(n, max) {
    return n > 0 ? `max(3px, ${(100 * n) / max}%)` : '0';
  }

  // ---- the API ----

  class HttpError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  function storedToken() {
    try {
      return sessionStorage.getItem(TOKEN_KEY) || '';
    } catch {
      return '';
    }
  }

  // An ID as one path segment: dots are encoded too, so that "." and ".."
  // are not resolved as path segments.
  const idPath = (id) => encodeURIComponent(id).replace(/\./g, '%2E');

  async function errorText(res) {
    try {
      const body = await res.json();
      if (body && typeof body.error === 'string') return body.error;
    } catch {
      // not JSON: fall through
    }
    return `HTTP ${res.status}`;
  }

  // api calls the /v1/ API (path relative to the page) and returns the
  // decoded JSON, null for 204. A 401 locks the page until a token is given.
  // Requests stay on this origin (the server refuses state-changing ones
  // from others), and a body, when given, is sent as application/json.
  async function api(method, path, body) {
    const headers = { Accept: 'application/json' };
    const token = storedToken();
    if (token) headers.Authorization = 'Bearer ' + token;
    const init = { method, headers, cache: 'no-store', credentials: 'omit', mode: 'same-origin' };
    if (body !== undefined) {
      headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    const res = await fetch(path, init);
    if (res.status === 401) {
      const reason = await errorText(res);
      // A request sent with a token that was replaced meanwhile (a link
      // with another one, the dialog) says nothing of the new one.
      if (storedToken() === token) lock(token ? 'The token was rejected: ' + reason : '');
      throw new HttpError(401, reason);
    }
    if (!res.ok) throw new HttpError(res.status, await errorText(res));
    return res.status === 204 ? null : res.json();
  }

  // ---- the token ----

  let locked = false;

  function lock(error) {
    try {
      sessionStorage.removeItem(TOKEN_KEY);
    } catch {
      // storage blocked: nothing stored either
    }
    locked = true;
    $('forget-token').hidden = true;
    setConn('warn', 'token required');
    const err = $('token-error');
    err.textContent = error;
    err.hidden = !error;
    const dialog = $('token-dialog');
    if (dialog.hidden) {
      dialog.hidden = false;
      $('token-input').value = '';
    }
    $('token-input').focus();
  }

  // useToken keeps the token for the tab's session and unlocks the page;
  // false when the browser keeps nothing for it (the dialog says so).
  function useToken(value) {
    try {
      sessionStorage.setItem(TOKEN_KEY, value);
    } catch {
      const err = $('token-error');
      err.textContent = 'This browser does not allow sessionStorage for this page, so the token cannot be kept.';
      err.hidden = false;
      return false;
    }
    $('token-input').value = '';
    $('token-dialog').hidden = true;
    $('forget-token').hidden = false;
    locked = false;
    return true;
  }

  $('token-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const value = $('token-input').value.trim();
    if (value && useToken(value)) refreshNow(true);
  });

  // tokenFromLink takes the token from a link to the page, /#token=<token>
  // (what `delaybridge dev` prints): a URL's fragment is never sent to the
  // server. It keeps the token as the dialog does and removes it from the
  // address bar and the tab's history (history.replaceState), so that it is
  // neither bookmarked nor shown. It returns whether the link had a token.
  function tokenFromLink() {
    const parts = location.hash.replace(/^#/, '').split('&').filter((p) => p !== '');
    const i = parts.findIndex((p) => p.startsWith('token='));
    if (i < 0) return false;
    let value = '';
    try {
      value = decodeURIComponent(parts[i].slice('token='.length)).trim();
    } catch {
      // not URL-encoded properly: taken as it is
      value = parts[i].slice('token='.length).trim();
    }
    parts.splice(i, 1);
    const rest = parts.length ? '#' + parts.join('&') : '';
    history.replaceState(history.state, '', location.pathname + location.search + rest);
    return value !== '' && useToken(value);
  }

  // A link with another token opened in this tab changes only the fragment.
  window.addEventListener('hashchange', () => {
    if (tokenFromLink()) refreshNow(true);
  });

  $('forget-token').addEventListener('click', () => lock(''));

  // ---- metrics: samples, rates, lateness ----

  // parseMetrics sums what the dashboard needs over all label values.
  function parseMetrics(text) {
    const s = { t: Date.now(), ingest: 0, fired: 0, byBound: new Map(), latSum: 0, latCount: 0 };
    for (const line of text.split('\n')) {
      if (line === '' || line[0] === '#') continue;
      const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/.exec(line);
      if (!m) continue;
      const v = Number(m[3]);
      if (!isFinite(v)) continue;
      switch (m[1]) {
        case 'delaybridge_ingest_messages_total':
          s.ingest += v;
          break;
        case 'delaybridge_sink_published_total':
          s.fired += v;
          break;
        case 'delaybridge_fire_lateness_seconds_bucket': {
          const le = /(?:^|,)le="([^"]*)"/.exec(m[2] || '');
          if (le) {
            const bound = le[1] === '+Inf' ? Infinity : Number(le[1]);
            s.byBound.set(bound, (s.byBound.get(bound) || 0) + v);
          }
          break;
        }
        case 'delaybridge_fire_lateness_seconds_sum':
          s.latSum += v;
          break;
        case 'delaybridge_fire_lateness_seconds_count':
          s.latCount += v;
          break;
      }
    }
    s.bounds = [...s.byBound.keys()].sort((a, b) => a - b);
    s.cum = s.bounds.map((b) => s.byBound.get(b));
    return s;
  }

  // histDelta returns the cumulative bucket counts observed between two
  // samples, or null after a restart of the daemon (a counter went down).
  function histDelta(a, b) {
    if (a.bounds.length === 0) return b.cum;
    if (a.bounds.length !== b.bounds.length) return null;
    const d = b.cum.map((c, i) => c - a.cum[i]);
    return d.some((x) => x < 0) ? null : d;
  }

  // quantile estimates the q-quantile from cumulative bucket counts as
  // Prometheus' histogram_quantile does: linearly within the bucket.
  function quantile(q, bounds, cum) {
    const total = cum.length ? cum[cum.length - 1] : 0;
    if (!(total > 0)) return null;
    const rank = q * total;
    const i = cum.findIndex((c) => c >= rank);
    if (bounds[i] === Infinity) return i > 0 ? bounds[i - 1] : null;
    const lo = i === 0 ? 0 : bounds[i - 1];
    const below = i === 0 ? 0 : cum[i - 1];
    const inBucket = cum[i] - below;
    return inBucket > 0 ? lo + ((bounds[i] - lo) * (rank - below)) / inBucket : bounds[i];
  }

  const samples = []; // the last SPAN+1 metric samples
  const points = []; // chart points {t, ingest, fired, p50, p99} of the last WINDOW_MS; null values are gaps

  // addSample adds a sample to the charts (drawn unless draw is false).
  function addSample(s, draw = true) {
    const prev = samples[samples.length - 1];
    samples.push(s);
    if (samples.length > SPAN + 1) samples.shift();
    if (prev) {
      if (s.t - prev.t > 3 * POLL_MS) {
        points.push({ t: prev.t + 1, ingest: null, fired: null, p50: null, p99: null }); // break the lines
      }
      const dt = (s.t - prev.t) / 1000;
      const rate = (a, b) => (b >= a && dt > 0 ? (b - a) / dt : null); // null: the daemon restarted
      const base = samples[0];
      const d = histDelta(base, s);
      points.push({
        t: s.t,
        ingest: rate(prev.ingest, s.ingest),
        fired: rate(prev.fired, s.fired),
        p50: d && quantile(0.5, s.bounds, d),
        p99: d && quantile(0.99, s.bounds, d),
      });
    }
    while (points.length && points[0].t < s.t - WINDOW_MS) points.shift();
    if (draw) {
      renderRates();
      drawCharts();
    }
  }

  function renderRates() {
    const base = samples[0];
    const last = samples[samples.length - 1];
    if (!base || base === last) return;
    const dt = (last.t - base.t) / 1000;
    const rate = (a, b) => (b >= a ? (b - a) / dt : null);
    $('rate-ingest').textContent = fmtRate(rate(base.ingest, last.ingest));
    $('rate-fired').textContent = fmtRate(rate(base.fired, last.fired));
    const d = histDelta(base, last);
    const n = last.latCount - base.latCount;
    if (d && n > 0) {
      $('lateness-p99').textContent = fmtMs(quantile(0.99, last.bounds, d));
      $('lateness-sub').textContent = `p50 ${fmtMs(quantile(0.5, last.bounds, d))} ms, last 10 s`;
      $('lateness-sub').title = `mean ${fmtMs((last.latSum - base.latSum) / n)} ms over ${fmtInt(n)} messages`;
    } else {
      $('lateness-p99').textContent = '–';
      $('lateness-sub').textContent = 'nothing fired in the last 10 s';
      $('lateness-sub').title = '';
    }
  }

  async function loadMetrics() {
    const res = await fetch('metrics', { cache: 'no-store', credentials: 'omit', mode: 'same-origin' });
    if (!res.ok) throw new HttpError(res.status, `/metrics answered ${await errorText(res)}`);
    addSample(parseMetrics(await res.text()));
  }

  // historySample is a sample of GET /v1/history as parseMetrics makes
  // one, on this page's clock (skew: the page's time minus the daemon's).
  function historySample(h, skew) {
    const l = h.lateness;
    return {
      t: Date.parse(h.at) + skew, ingest: h.ingested, fired: h.fired, latSum: l.sum, latCount: l.count,
      bounds: [...l.bounds, Infinity], cum: [...l.cumulative, l.count],
    };
  }

  let historyRead = false; // the daemon's samples were read (or cannot be)

  // loadHistory fills the charts with the minutes the daemon saw before the
  // page opened, once; the page's own samples follow them.
  async function loadHistory() {
    let h;
    try {
      h = await api('GET', 'v1/history');
    } catch (e) {
      if (e.status === 401) return; // asked again once the token is given
      historyRead = true; // an older daemon: the page's own samples only
      return;
    }
    historyRead = true;
    const skew = Date.now() - Date.parse(h.now);
    for (const s of h.samples || []) addSample(historySample(s, skew), false);
    renderRates();
    drawCharts();
  }

  // ---- charts ----

  // niceStep rounds a raw tick step up to 1, 2, 2.5 or 5 times a power of ten.
  function niceStep(raw) {
    const p = 10 ** Math.floor(Math.log10(raw));
    const f = raw / p;
    return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 2.5 ? 2.5 : f <= 5 ? 5 : 10) * p;
  }

  // timeAxis returns the span the charts show, from 1 minute while the page
  // has few samples up to WINDOW_MS, and the step between its labels.
  function timeAxis(now) {
    const have = points.length ? now - points[0].t : 0;
    const span = Math.min(WINDOW_MS, Math.max(60000, Math.ceil(have / 60000) * 60000));
    return { span, step: span <= 60000 ? 15000 : span <= 120000 ? 30000 : 60000 };
  }

  function fmtAgoTick(ms) {
    if (ms === 0) return 'now';
    return ms % 60000 === 0 ? `−${ms / 60000} min` : `−${ms / 1000} s`;
  }

  // lineChart draws series ({key, cls}) of points into svg, with a y axis
  // from 0.
  function lineChart(svg, series, opts) {
    const w = svg.clientWidth;
    const h = svg.clientHeight;
    if (!w || !h) return;
    svg.setAttribute('viewBox', `0 0 ${w} ${h}`);
    const pad = { l: 54, r: 12, t: 10, b: 24 };
    const now = points.length ? points[points.length - 1].t : Date.now();
    const axis = timeAxis(now);
    const x0 = now - axis.span;
    const X = (t) => pad.l + ((t - x0) / axis.span) * (w - pad.l - pad.r);

    let vmax = 0;
    let drawn = 0;
    for (const p of points) {
      let any = false;
      for (const s of series) {
        if (p[s.key] != null) {
          vmax = Math.max(vmax, p[s.key]);
          any = true;
        }
      }
      if (any) drawn++;
    }
    const ymax = Math.max(vmax, opts.minTop);
    const step = niceStep(ymax / 4);
    const ticks = Math.max(2, Math.ceil(ymax / step));
    const top = step * ticks;
    const Y = (v) => pad.t + (1 - v / top) * (h - pad.t - pad.b);

    const nodes = [];
    for (let i = 0; i <= ticks; i++) {
      const y = Y(step * i);
      nodes.push(svgEl('line', { class: 'grid', x1: pad.l, x2: w - pad.r, y1: y, y2: y }));
      nodes.push(svgEl('text', { class: 'axis-label', x: pad.l - 8, y: y + 4, 'text-anchor': 'end' }, opts.fmt(step * i)));
    }
    for (let ago = axis.span; ago >= 0; ago -= axis.step) {
      const anchor = ago === axis.span ? 'start' : ago === 0 ? 'end' : 'middle';
      nodes.push(svgEl('text', { class: 'axis-label', x: X(now - ago), y: h - 6, 'text-anchor': anchor }, fmtAgoTick(ago)));
    }
    for (const s of series) {
      // Consecutive non-null points form one segment; a null breaks the line.
      const segments = [];
      let seg = [];
      for (const p of points) {
        if (p[s.key] == null) {
          if (seg.length) segments.push(seg);
          seg = [];
        } else {
          seg.push([X(p.t), Y(p[s.key])]);
        }
      }
      if (seg.length) segments.push(seg);
      for (const sg of segments) {
        const line = sg.map(([x, y], i) => `${i ? 'L' : 'M'}${x.toFixed(1)},${y.toFixed(1)}`).join('');
        if (sg.length > 1) {
          const base = Y(0).toFixed(1);
          const area = `${line}L${sg[sg.length - 1][0].toFixed(1)},${base}L${sg[0][0].toFixed(1)},${base}Z`;
          nodes.push(svgEl('path', { class: `area ${s.cls}`, d: area }));
        }
        nodes.push(svgEl('path', { class: `line ${s.cls}`, d: sg.length > 1 ? line : `${line}l0.1,0` }));
      }
    }
    if (drawn < 2) {
      nodes.push(svgEl('text', { class: 'empty-label', x: (pad.l + w - pad.r) / 2, y: h / 2, 'text-anchor': 'middle' },
        opts.empty));
    }
    svg.dataset.points = String(drawn);
    svg.dataset.from = points.length ? fmtTime(points[0].t) : '';
    svg.replaceChildren(...nodes);
  }

  function drawCharts() {
    lineChart($('chart-rates'),
      [{ key: 'ingest', cls: 's-ingest' }, { key: 'fired', cls: 's-fired' }],
      { minTop: 4, fmt: fmtRate, empty: 'collecting samples…' });
    lineChart($('chart-lateness'),
      [{ key: 'p50', cls: 's-p50' }, { key: 'p99', cls: 's-p99' }],
      { minTop: 0.01, fmt: fmtMs, empty: 'no messages fired yet' });
  }

  // ---- stats: cards, due-time histogram, shards ----

  function buildDueIn() {
    $('due-in').replaceChildren(...DUE_BUCKETS.map(([key, label]) => {
      const count = el('span', 'hbar-count', '–');
      count.id = 'due-' + key;
      const fill = el('div', 'hbar-fill');
      fill.id = 'due-fill-' + key;
      return el('div', 'hbar hbar-' + key, el('span', 'hbar-label', label), el('div', 'hbar-track', fill), count);
    }));
  }

  function renderDueIn(dueIn) {
    if (!dueIn) {
      $('due-in').replaceChildren(el('p', 'empty', 'This server does not report due times (no due_in in /v1/stats).'));
      return;
    }
    const max = Math.max(1, ...DUE_BUCKETS.map(([k]) => dueIn[k] || 0));
    for (const [key] of DUE_BUCKETS) {
      const n = dueIn[key] || 0;
      $('due-' + key).textContent = fmtInt(n);
      $('due-fill-' + key).style.width = barWidth(n, max);
    }
  }

  function shardCell(i) {
    const fill = el('div', 'shard-fill');
    const due = el('div', 'shard-due');
    const cell = el('div', 'shard', el('span', 'shard-id', String(i)), el('div', 'shard-track', fill, due),
      el('span', 'shard-parked', '0'));
    cell.dataset.shard = String(i);
    return cell;
  }

  function renderShards(shards) {
    const box = $('shards');
    const same = box.childElementCount === shards.length &&
      shards.every((s, i) => box.children[i].dataset.shard === String(s.shard));
    if (!same) box.replaceChildren(...shards.map((s) => shardCell(s.shard)));
    const max = Math.max(1, ...shards.map((s) => s.parked));
    shards.forEach((s, i) => {
      const cell = box.children[i];
      cell.title = `shard ${s.shard}: ${fmtInt(s.parked)} parked, ${fmtInt(s.due)} due, ${fmtInt(s.dead)} dead`;
      cell.querySelector('.shard-fill').style.width = barWidth(s.parked, max);
      cell.querySelector('.shard-due').style.width = barWidth(s.due, max);
      cell.querySelector('.shard-parked').textContent = fmtInt(s.parked);
    });
    if (shards.length) {
      const counts = shards.map((s) => s.parked);
      $('shards-note').textContent =
        `${shards.length} shards · ${fmtInt(Math.min(...counts))}–${fmtInt(Math.max(...counts))} each · amber: due`;
    }
  }

  function renderStats(st) {
    $('stat-parked').textContent = fmtInt(st.parked);
    $('stat-due').textContent = fmtInt(st.due);
    $('stat-dead').textContent = fmtInt(st.dead);
    $('stat-dead').closest('.card').classList.toggle('has-dead', st.dead > 0);
    $('stat-oldest').textContent = st.oldest_due_age_seconds > 0 ? fmtSeconds(st.oldest_due_age_seconds) : 'none';
    renderDueIn(st.due_in);
    renderShards(st.shards || []);
    $('due-note').textContent = st.held > 0 ? `${fmtInt(st.held)} held for paused or down sinks` : 'by due time';
    renderWarnings(st);
  }

  // renderWarnings shows above the cards the warning of a Redis that keeps
  // nothing on disk (every parked message is lost when it restarts) and
  // that of counts leaving out shards that did not answer.
  function renderWarnings(st) {
    const p = st.redis_persistence;
    const warning = [p && p.warning ? 'Redis: ' + shown(p.warning) : '', st.warning ? shown(st.warning) : '']
      .filter((w) => w !== '').join(' · ');
    const banner = $('redis-warning');
    if (banner.textContent !== warning) banner.textContent = warning;
    banner.hidden = warning === '';
  }

  // ---- sinks ----

  const sinkRows = new Map(); // name -> row of #sinks-rows

  function sinkRow(name) {
    const status = el('span', 'badge');
    const pause = el('button', 'btn pause', 'Pause');
    pause.type = 'button';
    pause.addEventListener('click', () => setPaused(name, pause.dataset.action === 'pause', pause));
    const tr = el('tr', '', el('td', 'id', shown(name)), el('td', '', status), el('td', 'num due'), el('td', 'num rate'),
      el('td', 'num max-rate'), el('td', 'actions', pause));
    tr.dataset.sink = name;
    return tr;
  }

  function renderSinks(list) {
    $('sinks-empty').hidden = list.length > 0;
    $('sinks-table').hidden = list.length === 0;
    const names = list.map((v) => v.name);
    for (const name of [...sinkRows.keys()]) {
      if (!names.includes(name)) sinkRows.delete(name);
    }
    const rows = list.map((v) => {
      let tr = sinkRows.get(v.name);
      if (!tr) {
        tr = sinkRow(v.name);
        sinkRows.set(v.name, tr);
      }
      const badge = tr.querySelector('.badge');
      badge.className = 'badge badge-' + v.status;
      badge.textContent = v.status;
      badge.title = v.error ? shown(v.error) : '';
      tr.dataset.status = v.status;
      tr.querySelector('.due').textContent = fmtInt(v.due);
      tr.querySelector('.rate').textContent = v.rate == null ? '–' : fmtRate(v.rate);
      tr.querySelector('.max-rate').textContent = v.max_rate > 0 ? fmtInt(v.max_rate) : '–';
      const b = tr.querySelector('button.pause');
      if (!b.disabled) {
        b.dataset.action = v.paused ? 'resume' : 'pause';
        b.textContent = v.paused ? 'Resume' : 'Pause';
      }
      return tr;
    });
    const body = $('sinks-rows');
    if (rows.some((tr, i) => body.children[i] !== tr) || body.children.length !== rows.length) body.replaceChildren(...rows);
  }

  async function loadSinks() {
    let list;
    try {
      list = await api('GET', 'v1/sinks');
    } catch (e) {
      if (e.status === 404) {
        renderSinks([]);
        return;
      }
      throw e;
    }
    renderSinks(list);
  }

  async function setPaused(name, paused, btn) {
    btn.disabled = true;
    try {
      await api('POST', `v1/sinks/${idPath(name)}/${paused ? 'pause' : 'resume'}`);
      toast(paused
        ? `Paused ${shown(name)} for every instance: its due messages are held.`
        : `Resumed ${shown(name)}: its held messages fire by priority, then in due order.`);
    } catch (e) {
      if (e.status !== 401) toast(`${paused ? 'Pause' : 'Resume'} of ${shown(name)} failed: ${e.message}`, true);
    } finally {
      btn.disabled = false;
      refreshNow(true);
    }
  }

  // ---- message tables (browse, group) ----

  // idLink is a button showing a message ID that opens the message.
  function idLink(id) {
    const b = el('button', 'link', shown(id));
    b.type = 'button';
    b.title = 'Show this message';
    b.addEventListener('click', () => lookup(id, true));
    return b;
  }

  function groupLink(key) {
    if (!key) return '';
    const b = el('button', 'link', shown(key));
    b.type = 'button';
    b.title = 'Show this group';
    b.addEventListener('click', () => showGroup(key, true));
    return b;
  }

  function stateBadge(m) {
    const label = m.held ? 'held' : m.state;
    const b = el('span', 'badge badge-' + (m.held ? 'held' : m.state), label);
    if (m.held) b.title = 'due, waiting for its sink (paused or down)';
    return b;
  }

  function dueCell(m) {
    const at = m.state === 'dead' ? m.dead_at : m.next_attempt_at || m.due_at;
    const td = el('td', 'when', at ? fromNow(at) : '–');
    td.title = m.state === 'dead' ? `died ${m.dead_at}, was due ${m.due_at}` : `due ${m.due_at}` + (m.next_attempt_at ? `, next attempt ${m.next_attempt_at}` : '');
    td.dataset.at = at || '';
    return td;
  }

  function scheduleText(m) {
    const r = m.recurrence;
    return r ? shown(`#${r.occurrence} ${r.schedule}`) : '';
  }

  function messageRow(m, withGroup) {
    const cells = [el('td', 'id', idLink(m.id)), el('td', '', stateBadge(m)), dueCell(m),
      el('td', 'route', m.sink ? shown(`${m.sink} → ${m.destination}`) : '–')];
    if (withGroup) cells.push(el('td', 'group', groupLink(m.group)));
    cells.push(el('td', 'schedule', scheduleText(m)), el('td', 'num priority', String(m.priority || 0)),
      el('td', 'num', String(m.attempts)));
    const tr = el('tr', '', ...cells);
    tr.dataset.id = m.id;
    tr.dataset.state = m.held ? 'held' : m.state;
    return tr;
  }

  // ---- browse ----

  const browse = { query: null, cursor: '', next: null, pageNo: 1 };

  function browseFilters() {
    const q = new URLSearchParams();
    const set = (k, id) => {
      const v = $(id).value.trim();
      if (v !== '') q.set(k, v);
    };
    set('state', 'f-state');
    set('sink', 'f-sink');
    set('destination', 'f-destination');
    set('ingest', 'f-ingest');
    set('group', 'f-group');
    set('due_after', 'f-due-after');
    set('due_before', 'f-due-before');
    if ($('f-recurring').checked) q.set('recurring', 'true');
    q.set('limit', $('f-limit').value);
    return q;
  }

  async function loadBrowse() {
    if (browse.query == null) return;
    // The query as it is now: a page asked for before the filters or the
    // page changed is not shown over the newer one.
    const current = () => {
      if (browse.query == null) return null;
      const q = new URLSearchParams(browse.query);
      if (browse.cursor) q.set('cursor', browse.cursor);
      return q.toString();
    };
    const query = current();
    let page;
    try {
      page = await api('GET', 'v1/messages?' + query);
    } catch (e) {
      if (current() !== query) return;
      if (e.status === 400) {
        $('browse-note').textContent = e.message;
        $('browse-note').classList.add('error');
        return;
      }
      throw e;
    }
    if (current() !== query) return;
    $('browse-note').classList.remove('error');
    browse.next = page.next_cursor;
    const limit = Number(browse.query.get('limit'));
    keepRows($('browse-rows'), page.messages, (m) => messageRow(m, true));
    $('browse-empty').hidden = page.messages.length > 0;
    $('browse-next').disabled = !browse.next;
    $('browse-first').disabled = !browse.cursor;
    $('browse-page').textContent = `page ${browse.pageNo}` + (page.messages.length < limit && browse.next
      ? ` · ${fmtInt(page.examined)} examined; more may follow`
      : '');
    $('browse-note').textContent = browse.query.get('state') === 'dead' ? 'by time of death' : 'in the order they fire';
  }

  $('browse-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    browse.query = browseFilters();
    browse.cursor = '';
    browse.pageNo = 1;
    loadBrowse().catch((e) => toast(`Listing failed: ${e.message}`, true));
  });

  $('browse-next').addEventListener('click', () => {
    if (!browse.next) return;
    browse.cursor = browse.next;
    browse.pageNo++;
    loadBrowse().catch((e) => toast(`Listing failed: ${e.message}`, true));
  });

  $('browse-first').addEventListener('click', () => {
    browse.cursor = '';
    browse.pageNo = 1;
    loadBrowse().catch((e) => toast(`Listing failed: ${e.message}`, true));
  });

  // ---- recurring schedules ----

  // loadRecurring lists the recurring series that fire first. The filter
  // examines a bounded number of parked messages per page, so it follows
  // the cursor for at most RECURRING_PAGES pages and says when it stopped
  // before the end.
  async function loadRecurring() {
    const found = [];
    let cursor = null;
    let examined = 0;
    for (let i = 0; i < RECURRING_PAGES && found.length < RECURRING_LIMIT; i++) {
      const q = new URLSearchParams({ recurring: 'true', limit: String(RECURRING_LIMIT - found.length) });
      if (cursor) q.set('cursor', cursor);
      const page = await api('GET', 'v1/messages?' + q);
      found.push(...page.messages);
      examined += page.examined;
      cursor = page.next_cursor;
      if (!cursor) break;
    }
    $('recurring-empty').hidden = found.length > 0;
    $('recurring-table').hidden = found.length === 0;
    $('recurring-empty').textContent = cursor
      ? `No recurring schedule among the first ${fmtInt(examined)} parked messages to fire.`
      : 'No recurring schedule is parked.';
    $('recurring-note').textContent = !cursor ? (found.length ? `${found.length} series` : '')
      : found.length >= RECURRING_LIMIT ? `the first ${RECURRING_LIMIT} to fire`
        : `${found.length} series among the first ${fmtInt(examined)} parked messages to fire; more may follow`;
    if (armedIn('recurring-rows')) return; // an end of series waits for its second click
    keepRows($('recurring-rows'), found, (m) => {
      const r = m.recurrence || {};
      const next = el('td', 'when', fromNow(r.next_at || m.due_at));
      next.title = r.next_at || m.due_at;
      next.dataset.at = r.next_at || m.due_at;
      const then = el('td', 'when', r.following_at ? r.following_at : 'last occurrence');
      const cancel = el('button', 'btn btn-danger cancel', 'End series');
      cancel.type = 'button';
      armConfirm(cancel, 'Confirm', () => cancelMessage(m.id, 'Ended the series'));
      const tr = el('tr', '', el('td', 'id', idLink(m.id)), el('td', 'schedule', shown(r.schedule || '')),
        el('td', 'num', String(r.occurrence || '')), next, then,
        el('td', 'route', shown(`${m.sink} → ${m.destination}`)), el('td', 'actions', cancel));
      tr.dataset.id = m.id;
      return tr;
    });
  }

  async function cancelMessage(id, what) {
    try {
      await api('DELETE', `v1/messages/${idPath(id)}`);
      toast(`${what} ${shown(id)}.`);
      if (id === lookupId) {
        lookupId = null;
        showLookup(id, 'gone', 'cancelled', 'Cancelled: the message will not be published.', null);
      }
      refreshNow(true);
    } catch (e) {
      if (e.status !== 401) toast(`Cancel of ${shown(id)} failed: ${e.message}`, true);
    }
  }

  // ---- group ----

  let groupKey = null; // the group shown and refreshed

  async function loadGroup() {
    const key = groupKey;
    if (key == null) return;
    $('group-result').hidden = false;
    $('group-title').textContent = shown(key);
    try {
      const g = await api('GET', `v1/groups/${idPath(key)}?limit=100`);
      if (key !== groupKey) return;
      $('group-count').textContent = `${fmtInt(g.count)} messages` + (g.next_cursor ? ', the first 100 to fire listed' : '');
      $('group-message').textContent = '';
      $('group-cancel').hidden = false;
      keepRows($('group-rows'), g.messages, (m) => messageRow(m, false));
    } catch (e) {
      if (key !== groupKey || e.status === 401) return;
      $('group-count').textContent = '';
      $('group-cancel').hidden = true;
      $('group-rows').replaceChildren();
      $('group-message').textContent = e.message;
    }
  }

  function showGroup(key, scroll) {
    groupKey = key;
    $('group-key').value = key;
    if (scroll) $('group-panel').scrollIntoView({ behavior: 'smooth', block: 'start' });
    return loadGroup();
  }

  $('group-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const key = $('group-key').value;
    if (key.trim() !== '') showGroup(key, false);
  });

  armConfirm($('group-cancel'), 'Confirm cancel', async () => {
    const key = groupKey;
    try {
      const r = await api('DELETE', `v1/groups/${idPath(key)}`);
      toast(`Cancelled ${fmtInt(r.cancelled)} messages of group ${shown(key)}.`);
    } catch (e) {
      if (e.status !== 401) toast(`Cancel of group ${shown(key)} failed: ${e.message}`, true);
    }
    refreshNow(true);
  });

  let deadCount = -1; // the dead count the dead list was last read at
  let deadSig = ''; // what the rendered list shows, to leave it alone when unchanged

  async function loadStats(tickNo) {
    const st = await api('GET', 'v1/stats');
    renderStats(st);
    if (st.dead !== deadCount || tickNo % DEAD_EVERY === 0) await loadDead(st.dead);
  }

  // ---- dead messages ----

  async function loadDead(total) {
    const list = await api('GET', `v1/dead?limit=${DEAD_LIMIT}`);
    deadCount = total;
    $('dead-note').textContent = list.length < total
      ? `newest ${fmtInt(list.length)} of ${fmtInt(total)}`
      : total > 0 ? `${fmtInt(total)} in total` : '';
    $('dead-empty').hidden = list.length > 0;
    $('dead-table').hidden = list.length === 0;
    const sig = JSON.stringify(list.map((d) => [d.id, d.reason, d.dead_at, d.attempts]));
    // A delete waiting for its second click keeps its row: a new list
    // would drop the armed button under the user's pointer.
    if (sig !== deadSig && !armedIn('dead-rows')) {
      deadSig = sig;
      keepRows($('dead-rows'), list, deadRow);
    }
  }

  function deadRow(d) {
    const id = el('button', 'link', shown(d.id));
    id.type = 'button';
    id.title = 'Look up this message';
    id.addEventListener('click', () => lookup(d.id, true));
    const reason = shown(d.decode_error ? `${d.reason} (the stored message cannot be read: ${d.decode_error})` : d.reason);
    const when = el('td', 'when', fromNow(d.dead_at));
    when.title = d.dead_at;
    when.dataset.at = d.dead_at;
    const route = el('td', 'route', d.sink ? shown(`${d.sink} → ${d.destination}`) : '–');
    if (d.ingest) route.title = `from ingest ${d.ingest}`;
    const retry = button('Retry', 'btn retry', () => retryDead(d.id, retry, tr));
    const del = el('button', 'btn btn-danger delete', 'Delete');
    del.type = 'button';
    armConfirm(del, 'Confirm delete', () => deleteDead(d.id));
    // A message that died for its sink or destination is retried only with
    // one given: the form appears when the retry is refused (409).
    const sink = el('input', 'retry-sink');
    sink.placeholder = 'sink (as it was)';
    const dest = el('input', 'retry-destination');
    dest.placeholder = 'destination';
    for (const i of [sink, dest]) {
      i.type = 'text';
      i.spellcheck = false;
    }
    const to = el('form', 'retry-to', sink, dest, el('button', 'btn retry-with', 'Retry with these'));
    to.hidden = true;
    to.addEventListener('submit', (ev) => {
      ev.preventDefault();
      const body = {};
      if (sink.value.trim()) body.sink = sink.value.trim();
      if (dest.value.trim()) body.destination = dest.value.trim();
      retryDead(d.id, to.querySelector('button'), tr, body);
    });
    const tr = el('tr', '', el('td', 'id', id), el('td', 'reason', reason), when, route,
      el('td', 'num', String(d.attempts)), el('td', 'actions', retry, del, to));
    tr.dataset.id = d.id;
    return tr;
  }

  function refreshAgo() {
    for (const td of document.querySelectorAll('#dead-rows td.when, #browse-rows td.when, #group-rows td.when, #recurring-rows td.when')) {
      if (td.dataset.at) td.textContent = fromNow(td.dataset.at);
    }
  }

  // retryDead retries a dead message, to the sink and destination of body
  // when given; a refusal for its sink or destination (409) opens the row's
  // form to give them.
  async function retryDead(id, btn, tr, body) {
    btn.disabled = true;
    try {
      await api('POST', `v1/dead/${idPath(id)}/retry`, body);
      tr.remove();
      toast(`Retried ${shown(id)}: scheduled again, due now.`);
      lookup(id, false);
      refreshNow(true);
    } catch (e) {
      if (e.status === 409 || e.status === 400) tr.querySelector('form.retry-to').hidden = false;
      if (e.status !== 401) toast(`Retry of ${shown(id)} refused: ${e.message}`, true);
      btn.disabled = false;
    }
  }

  armConfirm($('dead-purge'), 'Confirm: delete all', async () => {
    try {
      const r = await api('DELETE', 'v1/dead');
      toast(`Deleted ${fmtInt(r.deleted)} dead messages.`);
    } catch (e) {
      if (e.status !== 401) toast(`Delete of the dead messages failed: ${e.message}`, true);
    }
    refreshNow(true);
  });

  async function deleteDead(id) {
    try {
      await api('DELETE', `v1/dead/${idPath(id)}`);
      toast(`Deleted dead message ${shown(id)}.`);
      refreshNow(true);
    } catch (e) {
      if (e.status !== 401) toast(`Delete of ${shown(id)} failed: ${e.message}`, true);
    }
  }

  // ---- lookup ----

  let lookupId = null; // the ID shown and refreshed on every tick; null when none (or gone)
  let shownId = null; // the ID in the lookup panel, for its cancel button
  let lookupContent = false; // whether the lookup asks for the key, headers and body (?body=true)
  let lookupView = null; // the message shown, for reschedule's if_due_at

  // facts lists what a message's view says beyond its state: its group (a
  // link to it), held, its schedule.
  function renderFacts(view) {
    const dl = $('lookup-facts');
    const items = [];
    const add = (term, ...value) => items.push(el('dt', '', term), el('dd', '', ...value));
    if (view && view.due_at) add('Due', `${view.due_at} (${fromNow(view.due_at)})`);
    if (view && view.held) add('Held', 'its sink is paused or down: it fires when the sink takes messages again');
    if (view && view.group) add('Group', groupLink(view.group));
    const r = view && view.recurrence;
    if (r) {
      add('Schedule', shown(r.schedule));
      add('Occurrence', `#${r.occurrence} parked, fires ${r.next_at}` + (r.following_at ? `; then ${r.following_at}` : '; the last one'));
    }
    dl.replaceChildren(...items);
    dl.hidden = items.length === 0;
  }

  function showLookup(id, state, label, message, view) {
    lookupView = view;
    $('lookup-result').hidden = false;
    const badge = $('lookup-state');
    badge.className = 'badge badge-' + state;
    badge.textContent = label;
    shownId = id;
    $('lookup-title').textContent = shown(id);
    $('lookup-message').textContent = message;
    $('lookup-message').hidden = !message;
    // JSON.stringify keeps bidi overrides raw: escape them as the API does
    // (still JSON, and it decodes to the same strings).
    $('lookup-json').textContent = view ? shownJSON(view) : '';
    $('lookup-json').hidden = !view;
    const cancel = $('lookup-cancel');
    cancel.hidden = !view;
    const scheduled = Boolean(view) && (state === 'scheduled' || state === 'held');
    $('lookup-fire').hidden = !scheduled;
    $('reschedule-form').hidden = !scheduled;
    renderFacts(view);
    if (!cancel.classList.contains('armed')) cancel.textContent = state === 'dead' ? 'Delete message' : 'Cancel message';
    const content = $('lookup-content');
    content.hidden = !view;
    content.textContent = lookupContent ? 'Hide key, headers and body' : 'Show key, headers and body';
  }

  // fromNow says how far an RFC 3339 time is from now: "in 3m 20s", "2 s ago".
  function fromNow(iso) {
    const ms = Date.parse(iso) - Date.now();
    if (!isFinite(ms)) return '';
    if (Math.abs(ms) < 1000) return 'now';
    return ms >= 0 ? `in ${fmtDuration(ms / 1000)}` : `${fmtDuration(-ms / 1000)} ago`;
  }

  function describe(v) {
    switch (v.state) {
      case 'scheduled':
        return v.next_attempt_at
          ? `Scheduled; next attempt ${fromNow(v.next_attempt_at)}, at ${v.next_attempt_at} (due ${v.due_at}).`
          : `Scheduled, due ${fromNow(v.due_at)}, at ${v.due_at}.`;
      case 'held':
        return `Held: its sink is paused or down; it fires at ${v.next_attempt_at || v.due_at} once the sink takes messages again, or at once when that time has passed.`;
      case 'inflight':
        return `Being published; retried at ${v.next_attempt_at} if the sink does not confirm.`;
      case 'dead':
        return `Dead since ${v.dead_at}: ${shown(v.reason)}`;
    }
    return '';
  }

  async function refreshLookup() {
    const id = lookupId;
    if (id == null) return;
    const content = lookupContent;
    try {
      const v = await api('GET', `v1/messages/${idPath(id)}` + (content ? '?body=true' : ''));
      if (id === lookupId) showLookup(id, v.state, v.held ? 'held' : v.state, describe(v), v);
    } catch (e) {
      if (id !== lookupId || e.status === 401) return;
      if (e.status === 403 && content) {
        // The server serves content only with a token: say so, show the rest.
        lookupContent = false;
        toast(e.message, true);
        return refreshLookup();
      }
      if (e.status === 404) {
        lookupId = null; // gone for good: delivered, cancelled or never parked
        showLookup(id, 'gone', 'not found', e.message, null);
      } else {
        showLookup(id, 'gone', 'error', e.message, null);
      }
    }
  }

  function lookup(id, scroll) {
    if (id !== lookupId) lookupContent = false;
    lookupId = id;
    $('lookup-id').value = id;
    if (scroll) $('lookup-panel').scrollIntoView({ behavior: 'smooth', block: 'start' });
    return refreshLookup();
  }

  $('lookup-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const id = $('lookup-id').value;
    if (id.trim() !== '') lookup(id, false);
  });

  $('lookup-content').addEventListener('click', () => {
    lookupContent = !lookupContent;
    refreshLookup();
  });

  $('lookup-fire').addEventListener('click', async () => {
    const id = shownId;
    const b = $('lookup-fire');
    b.disabled = true;
    try {
      await api('POST', `v1/messages/${idPath(id)}/fire`);
      toast(`Fired ${shown(id)}: due now.`);
    } catch (e) {
      if (e.status !== 401) toast(`Fire of ${shown(id)} failed: ${e.message}`, true);
    } finally {
      b.disabled = false;
      refreshNow(true);
    }
  });

  // A delay is milliseconds or a Go duration (90s, 1h30m); anything else is
  // taken as a time for deliver_at.
  const DELAY = /^(\d+|(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+)$/;

  $('reschedule-form').addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const id = shownId;
    const when = $('reschedule-when').value.trim();
    if (when === '' || !lookupView) return;
    const body = DELAY.test(when) ? { delay: when } : { deliver_at: when };
    body.if_due_at = lookupView.due_at; // refused if the message changed since it was shown
    try {
      const r = await api('PATCH', `v1/messages/${idPath(id)}`, body);
      $('reschedule-when').value = '';
      toast(r.now ? `Rescheduled ${shown(id)}: due now.` : `Rescheduled ${shown(id)} to ${r.due_at}.`);
    } catch (e) {
      if (e.status !== 401) toast(`Reschedule of ${shown(id)} failed: ${e.message}`, true);
    }
    refreshNow(true);
  });

  armConfirm($('lookup-cancel'), 'Confirm', async () => {
    const id = shownId;
    try {
      await api('DELETE', `v1/messages/${idPath(id)}`);
      lookupId = null;
      showLookup(id, 'gone', 'cancelled', 'Cancelled: the message will not be published.', null);
      toast(`Cancelled ${shown(id)}.`);
      refreshNow(true);
    } catch (e) {
      if (e.status !== 401) toast(`Cancel of ${shown(id)} failed: ${e.message}`, true);
    }
  });

  // ---- polling ----

  let tickNo = 0;
  let timer = 0;
  let busy = false;
  let again = false;

  async function tick() {
    clearTimeout(timer);
    if (busy) {
      again = true;
      return;
    }
    busy = true;
    tickNo++;
    try {
      if (!historyRead && !locked) await loadHistory();
      const jobs = historyRead ? [loadMetrics()] : [];
      if (!locked) jobs.push(loadStats(tickNo), loadSinks());
      if (!locked && lookupId != null) jobs.push(refreshLookup());
      if (!locked && (slowNow || tickNo % SLOW_EVERY === 1)) {
        jobs.push(loadBrowse(), loadRecurring(), loadGroup());
        slowNow = false;
      } else if (!locked && browse.cursor === '') {
        jobs.push(loadBrowse()); // the first page moves as messages fire
      }
      const results = await Promise.allSettled(jobs);
      refreshAgo();
      const failed = results.find((r) => r.status === 'rejected' && r.reason.status !== 401);
      if (failed) {
        setConn('bad', 'error');
        $('updated').textContent = failed.reason.message;
      } else if (!locked) {
        setConn('ok', 'live');
        $('updated').textContent = 'updated ' + fmtTime(Date.now());
      }
    } finally {
      busy = false;
      timer = setTimeout(tick, again ? 0 : POLL_MS);
      again = false;
    }
  }

  let slowNow = false; // the next tick re-reads the listings too

  // refreshNow polls at once; with listings, the listings too (after an
  // action that changed them).
  function refreshNow(listings) {
    if (listings) slowNow = true;
    tick();
  }

  buildDueIn();
  browse.query = browseFilters();
  tokenFromLink();
  $('forget-token').hidden = !storedToken();
  let resizeTimer = 0;
  window.addEventListener('resize', () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(drawCharts, 100);
  });
  tick();
})();
