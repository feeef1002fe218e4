// brisk's dashboard: polls GET /v1/dashboard every two seconds and renders
// it. Plain JavaScript, no dependencies. Everything shown comes from the
// API and goes into the page as text (textContent, attributes), never as
// markup: function names and error messages are the users'.
'use strict';

(function () {
  const POLL_MS = 2000;
  const HISTORY = 90; // sparkline points: three minutes
  const TOKEN_KEY = 'brisk.dashboard.token';
  const SVG = 'http://www.w3.org/2000/svg';
  const API = new URL('../v1/dashboard', location.href).toString();

  const $ = (id) => document.getElementById(id);
  let timer = 0;
  let memoryToken = ''; // when sessionStorage is unavailable
  const series = { calls: [], cold: [] }; // client-side history for the sparklines
  let updates = 0;

  // ------------------------------------------------------------ token

  function readToken() {
    try {
      return sessionStorage.getItem(TOKEN_KEY) || memoryToken;
    } catch (e) {
      return memoryToken;
    }
  }

  function saveToken(t) {
    memoryToken = t;
    try {
      if (t) sessionStorage.setItem(TOKEN_KEY, t);
      else sessionStorage.removeItem(TOKEN_KEY);
    } catch (e) { /* memoryToken serves */ }
  }

  // A token in the fragment (#token=...) is taken and the fragment removed
  // from the address bar, so that it does not stay in the history.
  function takeFragmentToken() {
    const frag = location.hash.replace(/^#/, '');
    if (!frag) return;
    for (const part of frag.split('&')) {
      const eq = part.indexOf('=');
      if (eq > 0 && part.slice(0, eq) === 'token') {
        try {
          saveToken(decodeURIComponent(part.slice(eq + 1)).trim());
        } catch (e) { /* malformed: ignored */ }
      }
    }
    window.history.replaceState(null, '', location.pathname + location.search);
  }

  function showTokenForm(message) {
    $('token-message').textContent = message;
    $('token-panel').hidden = false;
    $('dashboard').hidden = true;
    $('forget-token').hidden = true;
    document.body.dataset.state = 'token';
    setStatus('auth', 'token needed');
    $('token-input').focus();
  }

  function onTokenSubmit(ev) {
    ev.preventDefault();
    const t = $('token-input').value.trim();
    if (!t) return;
    $('token-input').value = '';
    saveToken(t);
    $('token-panel').hidden = true;
    poll();
  }

  function forgetToken() {
    saveToken('');
    clearTimeout(timer);
    showTokenForm('Token forgotten. Enter one to open the dashboard again.');
  }

  // ------------------------------------------------------------ polling

  function setStatus(state, text) {
    const s = $('status');
    s.dataset.state = state;
    s.textContent = text;
  }

  async function poll() {
    clearTimeout(timer);
    const token = readToken();
    const headers = { Accept: 'application/json' };
    if (token) headers.Authorization = 'Bearer ' + token;
    try {
      const resp = await fetch(API, { headers, cache: 'no-store', credentials: 'omit' });
      if (resp.status === 401 || resp.status === 403) {
        let why = '';
        try { why = (await resp.json()).error || ''; } catch (e) { /* not JSON */ }
        if (resp.status === 401) {
          saveToken('');
          showTokenForm(token ? 'The control plane refused this token: ' + why : 'This cluster needs an API token with the deploy or admin scope.');
        } else {
          showTokenForm('This token may not read the cluster status (it needs the deploy or admin scope, not bound to a namespace): ' + why);
        }
        return; // polling resumes once a token is given
      }
      if (!resp.ok) throw new Error('GET /v1/dashboard: HTTP ' + resp.status);
      const data = await resp.json();
      render(data);
      $('token-panel').hidden = true;
      $('dashboard').hidden = false;
      $('forget-token').hidden = !token;
      updates++;
      document.body.dataset.state = 'live';
      document.body.dataset.updates = String(updates);
      setStatus('ok', 'live');
      $('updated').textContent = 'updated ' + new Date(data.time).toLocaleTimeString();
    } catch (e) {
      setStatus('error', 'cannot reach the control plane: ' + e.message);
      document.body.dataset.state = updates > 0 ? 'stale' : 'error';
    }
    timer = setTimeout(poll, POLL_MS);
  }

  // ------------------------------------------------------------ formatting

  function rate(x) {
    if (!x) return '0';
    if (x < 0.01) return '<0.01';
    if (x < 10) return x.toFixed(2);
    if (x < 100) return x.toFixed(1);
    return Math.round(x).toLocaleString('en');
  }

  function seconds(s, count) {
    if (!count) return '–';
    if (s < 0.001) return (s * 1000).toFixed(2) + ' ms';
    if (s < 0.1) return (s * 1000).toFixed(1) + ' ms';
    if (s < 1) return Math.round(s * 1000) + ' ms';
    return s.toFixed(2) + ' s';
  }

  function count(n) { return Number(n || 0).toLocaleString('en'); }

  function cores(milli) { return (milli / 1000).toFixed(milli % 1000 ? 1 : 0); }

  function mib(m) { return m >= 1024 ? (m / 1024).toFixed(1) + ' GiB' : m + ' MiB'; }

  function ago(iso, now) {
    const d = Math.max(0, (now - new Date(iso)) / 1000);
    if (d < 60) return Math.round(d) + ' s ago';
    if (d < 3600) return Math.round(d / 60) + ' min ago';
    if (d < 86400) return Math.round(d / 3600) + ' h ago';
    return new Date(iso).toLocaleString();
  }

  // ------------------------------------------------------------ DOM helpers

  // el makes an element: attrs become attributes (data-* included), and
  // children strings become text nodes.
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v !== undefined && v !== null && v !== false) e.setAttribute(k, String(v));
    }
    for (const c of children) {
      if (c === undefined || c === null) continue;
      e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }

  function svg(tag, attrs) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
    return e;
  }

  function tile(id, value, raw, detail, state) {
    const t = $(id);
    const v = t.querySelector('.value');
    v.textContent = value;
    v.dataset.value = String(raw);
    t.querySelector('.detail').textContent = detail || '';
    if (state) t.dataset.state = state; else delete t.dataset.state;
  }

  // ------------------------------------------------------------ rendering

  function render(d) {
    const s = d.summary;
    const now = new Date(d.time);
    $('control-plane').textContent = d.control_plane ? 'control plane ' + d.control_plane : '';
    $('window').textContent = Math.round(d.window_seconds) + ' s';

    const sb = d.sandboxes;
    const win = Math.round(d.window_seconds) + ' s';
    tile('tile-nodes', s.nodes_connected + ' / ' + s.nodes, s.nodes_connected, 'connected · ' + count(s.data_planes) + ' data plane' + (s.data_planes === 1 ? '' : 's'),
      s.nodes_connected < s.nodes ? 'warn' : '');
    tile('tile-functions', count(s.functions), s.functions, 'deployed');
    tile('tile-sandboxes-ready', count(sb.ready), sb.ready, 'sandboxes · ' + count(sb.tombstoned) + ' terminating');
    tile('tile-sandboxes-pending', count(sb.assumed + sb.pending), sb.assumed + sb.pending, count(sb.assumed) + ' placed · ' + count(sb.pending) + ' creating');
    tile('tile-failing', count(s.functions_failing), s.functions_failing, 'functions · ' + count(s.sandbox_failures) + ' sandbox failures in ' + win,
      s.functions_failing > 0 ? 'bad' : (s.sandbox_failures > 0 ? 'warn' : ''));
    tile('tile-calls', rate(s.calls_per_second), s.calls_per_second, count(s.calls_total) + ' calls in all');
    tile('tile-cold', rate(s.cold_starts_per_second), s.cold_starts_per_second, count(s.cold_starts_total) + ' sandboxes placed in all');
    tile('tile-p50', seconds(s.latency.p50_seconds, s.latency.count), s.latency.p50_seconds, 'latency · p90 ' + seconds(s.latency.p90_seconds, s.latency.count));
    tile('tile-p99', seconds(s.latency.p99_seconds, s.latency.count), s.latency.p99_seconds, 'latency · ' + count(s.latency.count) + ' calls in ' + win);

    push(series.calls, s.calls_per_second);
    push(series.cold, s.cold_starts_per_second);
    spark($('spark-calls'), series.calls, $('calls-max'));
    spark($('spark-cold'), series.cold, $('cold-max'));
    sandboxStates(sb);
    nodes(d.nodes, now);
    functions(d.functions, s.functions);
    triggers(d.triggers || [], s.triggers || 0, now);
    failures(d.failures, now);
  }

  function push(list, v) {
    list.push(Number(v) || 0);
    if (list.length > HISTORY) list.shift();
  }

  // spark draws a sparkline of values (one per poll, oldest first) across
  // the width, scaled to their max: the span grows to HISTORY polls, then
  // slides.
  function spark(node, values, label) {
    const w = 300, h = 60, pad = 2;
    const max = Math.max(...values, 0);
    const top = max > 0 ? max : 1;
    const step = values.length > 1 ? w / (values.length - 1) : 0;
    const pts = values.map((v, i) => [values.length > 1 ? i * step : w, h - pad - (v / top) * (h - 2 * pad)]);
    node.replaceChildren();
    node.append(svg('line', { x1: 0, y1: h - pad, x2: w, y2: h - pad, class: 'axis' }));
    if (pts.length > 0) {
      const line = pts.map((p) => p[0].toFixed(1) + ',' + p[1].toFixed(1)).join(' ');
      const area = 'M' + pts[0][0].toFixed(1) + ',' + (h - pad) + ' L' + line.replace(/ /g, ' L') + ' L' + pts[pts.length - 1][0].toFixed(1) + ',' + (h - pad) + ' Z';
      node.append(svg('path', { d: area, class: 'area' }));
      node.append(svg('polyline', { points: line, class: 'line' }));
    }
    node.dataset.points = String(values.length);
    node.dataset.last = String(values.length ? values[values.length - 1] : 0);
    label.textContent = 'max ' + rate(max) + ' · last ' + Math.round(values.length * POLL_MS / 1000) + ' s';
  }

  const STATES = [
    ['ready', 'ready'],
    ['assumed', 'placed'],
    ['pending', 'creating'],
    ['tombstoned', 'terminating'],
  ];

  function sandboxStates(sb) {
    const bar = $('sandbox-bar');
    const total = STATES.reduce((n, [k]) => n + (sb[k] || 0), 0);
    bar.replaceChildren();
    let x = 0;
    for (const [k] of STATES) {
      const n = sb[k] || 0;
      if (!n) continue;
      const w = (n / total) * 300;
      bar.append(svg('rect', { x: x.toFixed(2), y: 0, width: w.toFixed(2), height: 24, class: 'state-' + k }));
      x += w;
    }
    if (!total) bar.append(svg('rect', { x: 0, y: 0, width: 300, height: 24, class: 'state-none' }));
    $('sandbox-states').replaceChildren(...STATES.map(([k, label]) =>
      el('li', { 'data-state': k, 'data-count': sb[k] || 0 }, el('span', { class: 'swatch state-' + k }), label + ' ', el('b', {}, count(sb[k])))));
  }

  function sandboxText(c) {
    const parts = [c.ready + ' ready'];
    if (c.assumed + c.pending) parts.push(c.assumed + c.pending + ' starting');
    if (c.tombstoned) parts.push(c.tombstoned + ' terminating');
    return parts.join(', ');
  }

  function meter(used, cap, text) {
    return el('span', { class: 'res' }, el('meter', { min: 0, max: cap || 1, value: Math.min(used, cap || used), high: (cap || 1) * 0.85 }), ' ' + text);
  }

  function nodes(list, now) {
    const body = $('nodes-table').tBodies[0];
    if (!list.length) {
      body.replaceChildren(el('tr', {}, el('td', { colspan: 7, class: 'muted' }, 'No worker node has registered.')));
      return;
    }
    body.replaceChildren(...list.map((n) => el('tr', { 'data-node': n.name, 'data-state': n.state },
      el('td', { class: 'name', title: n.address }, n.name),
      el('td', {}, el('span', { class: 'badge node-' + n.state }, n.state)),
      el('td', {}, n.runtime || '–'),
      el('td', {}, sandboxText(n.sandboxes)),
      el('td', {}, n.capacity.cpu_milli ? meter(n.requested.cpu_milli, n.capacity.cpu_milli, cores(n.requested.cpu_milli) + ' / ' + cores(n.capacity.cpu_milli) + ' cores') : '–'),
      el('td', {}, n.capacity.memory_mb ? meter(n.requested.memory_mb, n.capacity.memory_mb, mib(n.requested.memory_mb) + ' / ' + mib(n.capacity.memory_mb)) : '–'),
      el('td', {}, n.heartbeat_age_ms < 0 ? '–' : (n.heartbeat_age_ms / 1000).toFixed(1) + ' s ago'))));
  }

  function functions(list, total) {
    const body = $('functions-table').tBodies[0];
    $('functions-count').textContent = list.length < total ? '(the ' + list.length + ' of ' + total + ' worth a look: failing and busiest)' : '';
    if (!list.length) {
      body.replaceChildren(el('tr', {}, el('td', { colspan: 8, class: 'muted' }, 'No function is deployed.')));
      return;
    }
    body.replaceChildren(...list.map((f) => el('tr', {
      'data-function': f.name, 'data-condition': f.condition || '', 'data-calls': f.calls, class: f.condition ? 'has-condition' : '',
    },
    el('td', { class: 'name', title: 'revision ' + f.revision }, f.name, f.namespace && f.namespace !== 'default' ? el('span', { class: 'ns' }, f.namespace) : null),
    el('td', { class: 'num' }, f.ready + ' / ' + f.desired),
    el('td', { class: 'num' }, f.pending || ''),
    el('td', { class: 'num calls' }, rate(f.calls_per_second)),
    el('td', { class: 'num' }, rate(f.cold_starts_per_second)),
    el('td', { class: 'num' }, seconds(f.latency.p50_seconds, f.latency.count)),
    el('td', { class: 'num' }, seconds(f.latency.p99_seconds, f.latency.count)),
    el('td', { class: 'condition' }, f.condition ? el('span', { class: 'badge cond-' + f.condition }, f.condition) : el('span', { class: 'ok' }, 'ok'),
      f.message ? el('span', { class: 'message' }, f.message) : null))));
  }

  function triggers(list, total, now) {
    $('no-triggers').hidden = list.length > 0;
    $('triggers-table').hidden = list.length === 0;
    $('triggers-count').textContent = total > list.length ? '(' + list.length + ' of ' + total + ')' : '';
    $('triggers-table').querySelector('tbody').replaceChildren(...list.map((t) => el('tr', {
      'data-trigger': t.namespace + '/' + t.name, 'data-state': t.status.state, class: t.status.state === 'failing' ? 'has-condition' : '',
    },
    el('td', { class: 'name' }, t.name, t.namespace && t.namespace !== 'default' ? el('span', { class: 'ns' }, t.namespace) : null),
    el('td', {}, t.function),
    el('td', {}, t.cron ? 'cron ' + t.cron.schedule + (t.cron.time_zone ? ' (' + t.cron.time_zone + ')' : '') : 'nats ' + t.nats.subject + (t.nats.url ? ' at ' + t.nats.url : '')),
    el('td', { class: 'condition' }, el('span', { class: t.status.state === 'failing' ? 'badge cond-function-failing' : (t.status.state === 'paused' ? 'muted' : 'ok') }, t.status.state),
      t.status.last_error ? el('span', { class: 'message' }, t.status.last_error) : null),
    el('td', { class: 'num' }, String(t.status.fired)),
    el('td', { class: 'num' }, String(t.status.failed)),
    el('td', {}, t.status.next ? el('time', { datetime: t.status.next, title: new Date(t.status.next).toLocaleString() }, new Date(t.status.next).toLocaleTimeString()) : '–'))));
  }

  function failures(list, now) {
    $('no-failures').hidden = list.length > 0;
    $('failures').replaceChildren(...list.map((f) => el('li', { 'data-kind': f.kind, 'data-function': f.function },
      el('time', { datetime: f.time, title: new Date(f.time).toLocaleString() }, ago(f.time, now)),
      el('span', { class: 'badge cond-' + f.kind }, f.kind),
      el('b', { class: 'fn' }, f.function),
      f.node ? el('span', { class: 'muted' }, 'on ' + f.node) : null,
      el('span', { class: 'reason' }, f.reason))));
  }

  // ------------------------------------------------------------ start

  document.addEventListener('DOMContentLoaded', () => {
    $('token-form').addEventListener('submit', onTokenSubmit);
    $('forget-token').addEventListener('click', forgetToken);
    takeFragmentToken();
    poll();
  });
}());
