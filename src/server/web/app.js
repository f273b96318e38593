// pagekv serve's page: a chat over /v1/chat/completions (streamed), and the
// paged KV cache drawn live from GET /v1/kv. Plain JavaScript, no libraries;
// conversations and settings stay in this browser's localStorage.
'use strict';

const $ = (id) => document.getElementById(id);
const POLL_MS = 500; // the cache view is refreshed twice a second
const STORE = 'pagekv.chats.v1', SETTINGS = 'pagekv.settings.v1';
const FIELDS = ['system', 'temperature', 'top_p', 'top_k', 'min_p', 'max_tokens', 'seed', 'api_key'];

let chats = []; // [{id, title, messages: [{role, content, reasoning?, stats?, state?}]}]
let current = null;
let running = null; // {ctl: AbortController} while an answer streams
let modelId = 'pagekv';

// ------------------------------------------------------------- storage

function load() {
  try { chats = JSON.parse(localStorage.getItem(STORE) || '[]'); } catch (e) { chats = []; }
  if (!Array.isArray(chats)) chats = [];
  let st = {};
  try { st = JSON.parse(localStorage.getItem(SETTINGS) || '{}') || {}; } catch (e) { st = {}; }
  for (const f of FIELDS) if (typeof st[f] === 'string') $(f).value = st[f];
  if (typeof st.ignore_eos === 'boolean') $('ignore_eos').checked = st.ignore_eos;
  current = chats.length ? chats[0].id : null;
}

function save() {
  try { localStorage.setItem(STORE, JSON.stringify(chats)); } catch (e) { /* full: the page still works */ }
}

function saveSettings() {
  const st = { ignore_eos: $('ignore_eos').checked };
  for (const f of FIELDS) st[f] = $(f).value;
  try { localStorage.setItem(SETTINGS, JSON.stringify(st)); } catch (e) { /* ignore */ }
}

function headers(json) {
  const h = {};
  if (json) h['Content-Type'] = 'application/json';
  const key = $('api_key').value.trim();
  if (key) h.Authorization = 'Bearer ' + key;
  return h;
}

// ---------------------------------------------------------------- chat

function chat() { return chats.find((c) => c.id === current) || null; }

function newChat() {
  const c = { id: Date.now().toString(36) + Math.random().toString(36).slice(2, 6), title: 'New chat', messages: [] };
  chats.unshift(c);
  current = c.id;
  save();
  renderConvs();
  renderMessages();
  $('prompt').focus();
}

function renderConvs() {
  const ul = $('convs');
  ul.textContent = '';
  for (const c of chats) {
    const li = document.createElement('li');
    if (c.id === current) li.className = 'current';
    const open = document.createElement('button');
    open.type = 'button';
    open.className = 'open';
    open.textContent = c.title;
    open.title = c.title;
    if (c.id === current) open.setAttribute('aria-current', 'true');
    open.onclick = () => { if (running) return; current = c.id; renderConvs(); renderMessages(); };
    const del = document.createElement('button');
    del.type = 'button';
    del.className = 'plain';
    del.textContent = '×';
    del.setAttribute('aria-label', 'Delete conversation ' + c.title);
    del.onclick = () => {
      if (running && c.id === current) return;
      chats = chats.filter((x) => x !== c);
      if (current === c.id) current = chats.length ? chats[0].id : null;
      save(); renderConvs(); renderMessages();
    };
    li.append(open, del);
    ul.append(li);
  }
}

function statsText(s) {
  if (!s) return '';
  const parts = [`${s.tokens} tokens`];
  if (s.tps) parts.push(`${s.tps.toFixed(1)} tok/s`);
  if (s.ttft != null) parts.push(`first token ${Math.round(s.ttft)} ms`);
  if (s.prompt != null) parts.push(`prompt ${s.prompt} tokens (${s.cached} cached)`);
  if (s.finish) parts.push(s.finish);
  return parts.join(' · ');
}

function messageEl(m) {
  const d = document.createElement('div');
  d.className = 'msg ' + m.role + (m.state === 'error' ? ' error' : '');
  d.dataset.role = m.role;
  d.dataset.state = m.state || 'done';
  if (m.reasoning) {
    const r = document.createElement('div');
    r.className = 'reasoning';
    r.textContent = m.reasoning;
    d.append(r);
  }
  const t = document.createElement('div');
  t.className = 'text';
  t.textContent = m.content;
  d.append(t);
  if (m.role === 'assistant') {
    const s = document.createElement('div');
    s.className = 'stats';
    s.textContent = statsText(m.stats) + (m.state === 'stopped' ? ' · stopped' : '');
    d.append(s);
  }
  return d;
}

function renderMessages() {
  const box = $('messages');
  box.textContent = '';
  const c = chat();
  if (!c) return;
  for (const m of c.messages) box.append(messageEl(m));
  box.scrollTop = box.scrollHeight;
}

function num(id, parse) {
  const v = $(id).value.trim();
  if (v === '') return undefined;
  const x = parse(v);
  return Number.isFinite(x) ? x : undefined;
}

function requestBody(c) {
  const msgs = [];
  const sys = $('system').value;
  if (sys.trim()) msgs.push({ role: 'system', content: sys });
  for (const m of c.messages) if (m.state !== 'error') msgs.push({ role: m.role, content: m.content });
  const b = { model: modelId, messages: msgs, stream: true, stream_options: { include_usage: true } };
  const put = (k, v) => { if (v !== undefined) b[k] = v; };
  put('temperature', num('temperature', parseFloat));
  put('top_p', num('top_p', parseFloat));
  put('top_k', num('top_k', (v) => parseInt(v, 10)));
  put('min_p', num('min_p', parseFloat));
  put('max_tokens', num('max_tokens', (v) => parseInt(v, 10)));
  put('seed', num('seed', (v) => parseInt(v, 10)));
  if ($('ignore_eos').checked) b.ignore_eos = true;
  return b;
}

function setRunning(on) {
  $('send').disabled = on;
  $('stop').disabled = !on;
}

async function send() {
  if (running) return;
  const text = $('prompt').value;
  if (!text.trim()) return;
  if (!chat()) newChat();
  const c = chat();
  if (!c.messages.length) c.title = text.trim().slice(0, 40);
  c.messages.push({ role: 'user', content: text });
  const body = requestBody(c);
  const m = { role: 'assistant', content: '', state: 'streaming', stats: { tokens: 0 } };
  c.messages.push(m);
  $('prompt').value = '';
  save(); renderConvs(); renderMessages();
  const el = $('messages').lastElementChild;
  const ctl = new AbortController();
  running = { ctl };
  setRunning(true);
  const t0 = performance.now();
  let tFirst = null, tLast = null, chunks = 0;
  let cur = el; // the message's element, replaced at each update
  const show = () => {
    const n = messageEl(m);
    const box = $('messages');
    const atEnd = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
    cur.replaceWith(n);
    cur = n;
    if (atEnd) box.scrollTop = box.scrollHeight;
  };
  try {
    const r = await fetch('/v1/chat/completions', {
      method: 'POST', headers: headers(true), body: JSON.stringify(body), signal: ctl.signal,
    });
    if (!r.ok) {
      let msg = `HTTP ${r.status}`;
      try { const j = await r.json(); msg += ': ' + (j.error && j.error.message || ''); } catch (e) { /* not JSON */ }
      throw new Error(msg);
    }
    const rd = r.body.getReader();
    const dec = new TextDecoder();
    let buf = '';
    for (;;) {
      const { value, done } = await rd.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let at;
      while ((at = buf.indexOf('\n\n')) >= 0) {
        const ev = buf.slice(0, at);
        buf = buf.slice(at + 2);
        for (const line of ev.split('\n')) {
          if (!line.startsWith('data: ')) continue;
          const data = line.slice(6);
          if (data === '[DONE]') continue;
          const j = JSON.parse(data);
          if (j.error) throw new Error(j.error.message || 'error');
          const ch = j.choices && j.choices[0];
          if (ch && ch.delta) {
            const d = ch.delta;
            if (d.content || d.reasoning_content) {
              const now = performance.now();
              if (tFirst === null) tFirst = now;
              tLast = now;
              chunks++;
            }
            if (d.content) m.content += d.content;
            if (d.reasoning_content) m.reasoning = (m.reasoning || '') + d.reasoning_content;
            if (d.tool_calls) m.content += JSON.stringify(d.tool_calls);
          }
          if (ch && ch.finish_reason) m.stats.finish = ch.finish_reason;
          if (j.usage) {
            m.stats.tokens = j.usage.completion_tokens;
            m.stats.prompt = j.usage.prompt_tokens;
            const det = j.usage.prompt_tokens_details;
            m.stats.cached = det && det.cached_tokens != null ? det.cached_tokens : 0;
          } else {
            m.stats.tokens = Math.max(m.stats.tokens, chunks);
          }
        }
        if (tFirst !== null) {
          m.stats.ttft = tFirst - t0;
          if (tLast > tFirst && m.stats.tokens > 1) m.stats.tps = (m.stats.tokens - 1) * 1000 / (tLast - tFirst);
        }
        show();
      }
    }
    m.state = 'done';
  } catch (e) {
    if (ctl.signal.aborted) {
      m.state = 'stopped';
    } else {
      m.state = 'error';
      m.content = (m.content ? m.content + '\n' : '') + String(e.message || e);
    }
  }
  if (tFirst !== null && tLast > tFirst && m.stats.tokens > 1)
    m.stats.tps = (m.stats.tokens - 1) * 1000 / (tLast - tFirst);
  running = null;
  setRunning(false);
  $('sr-status').textContent = m.state === 'done' ? 'Answer complete: ' + statsText(m.stats)
    : m.state === 'stopped' ? 'Answer stopped' : 'Error: ' + m.content;
  save();
  show();
  $('messages').scrollTop = $('messages').scrollHeight;
  $('prompt').focus();
}

function stop() {
  if (running) running.ctl.abort();
}

// ------------------------------------------------------- the cache view

let kv = null;     // the last /v1/kv answer
let holders = {};  // tier name -> Map(page -> [{seq, index}])
const sel = {};    // tier name -> selected page (keyboard)
const GRIDS = [
  { tier: 'device', canvas: 'grid-device' },
  { tier: 'window', canvas: 'grid-window', title: 'win-title' },
  { tier: 'host', canvas: 'grid-host' },
  { tier: 'window-host', canvas: 'grid-whost', title: 'whost-title' },
];

function ownerName(s) {
  if (!s) return '?';
  const o = s.owner;
  if (!o) return `seq ${s.seq}`;
  if (o.kind === 'context') return o.id + (o.generating ? ' (generating)' : '');
  return (o.id || 'request') + (o.sample ? ` #${o.sample}` : '');
}

// A sequence keeps its id while it lives; consecutive ids get hues far apart.
function colour(s, dark) {
  const hue = s ? (s.seq * 137.508 + 205) % 360 : 0;
  return `hsl(${hue.toFixed(0)} 62% ${dark ? 36 : 50}%)`;
}

function runsEach(runs, fn) {
  let i = 0;
  for (const [first, count] of runs) {
    for (let k = 0; k < count; k++, i++) fn(first < 0 ? -1 : first + k, i);
  }
}

function indexHolders(j) {
  const h = { device: new Map(), window: new Map(), host: new Map(), 'window-host': new Map() };
  for (const s of j.sequences) {
    const add = (tier, runs) => runsEach(runs, (p, i) => {
      if (p < 0) return;
      const m = h[tier];
      if (!m.has(p)) m.set(p, []);
      m.get(p).push({ seq: s, index: i });
    });
    add(s.tier === 'host' ? 'host' : 'device', s.pages);
    if (s.window_pages) add(s.tier === 'host' ? 'window-host' : 'window', s.window_pages);
  }
  return h;
}

function pageText(tier, p) {
  const t = kv && kv.tiers.find((x) => x.name === tier);
  if (!t || p < 0 || p >= t.pages) return '';
  const ps = kv.page_size;
  const f = t.flags[p];
  const hs = holders[tier].get(p) || [];
  const refs = t.refs ? t.refs[p] : hs.length;
  const what = f === '.' ? 'free' : f === 'c' ? 'cached (prefix index, unreferenced)' :
    f === 'p' ? 'in the prefix index' : '';
  let s = `${tier} page ${p} · refcount ${refs}` + (what ? ' · ' + what : '');
  for (const x of hs) {
    const a = x.index * ps, b = Math.min((x.index + 1) * ps, x.seq.n_tokens) - 1;
    s += `\n${ownerName(x.seq)} (seq ${x.seq.seq}): tokens ${a}–${b}`;
  }
  return s;
}

// Cell pitch in CSS pixels: smaller cells for large pools, so a grid stays
// under about 3000 px tall (a canvas has a size limit); below 8 px the cells
// have no refcount digits, only the colour.
function pitch(w, pages) {
  const base = window.innerWidth < 600 ? 12 : 15;
  return Math.max(2, Math.min(base, Math.floor(Math.sqrt(w * 3000 / Math.max(1, pages)))));
}

function drawGrid(g) {
  const cv = $(g.canvas);
  const t = kv.tiers.find((x) => x.name === g.tier);
  cv.hidden = !t;
  if (g.title) $(g.title).hidden = !t;
  if (!t) return;
  const w = Math.max(60, cv.clientWidth || cv.parentElement.clientWidth - 24);
  const P = pitch(w, t.pages), C = P > 4 ? P - 1 : P;
  const cols = Math.max(1, Math.floor(w / P));
  const rows = Math.max(1, Math.ceil(t.pages / cols));
  const dpr = window.devicePixelRatio || 1;
  cv.style.height = rows * P + 'px';
  cv.width = Math.round(w * dpr);
  cv.height = Math.round(rows * P * dpr);
  cv.dataset.cols = cols;
  cv.dataset.pitch = P;
  cv.dataset.pages = t.pages;
  const x = cv.getContext('2d');
  x.setTransform(dpr, 0, 0, dpr, 0, 0);
  x.clearRect(0, 0, w, rows * P);
  x.font = `bold ${P < 14 ? 8 : 10}px sans-serif`;
  x.textAlign = 'center';
  x.textBaseline = 'middle';
  const hm = holders[g.tier];
  for (let p = 0; p < t.pages; p++) {
    const cx = (p % cols) * P, cy = Math.floor(p / cols) * P;
    const f = t.flags[p];
    const hs = hm.get(p);
    const refs = t.refs ? t.refs[p] : hs ? hs.length : 0;
    if (f === '.') {
      x.fillStyle = '#eef0f3';
    } else if (!hs || !hs.length) {
      x.fillStyle = f === 'c' ? '#9aa3ad' : '#6b7480';
    } else {
      x.fillStyle = colour(hs[0].seq, refs > 1);
    }
    x.fillRect(cx, cy, C, C);
    if (refs > 1 && P >= 8) {
      x.strokeStyle = '#111';
      x.lineWidth = 2;
      x.strokeRect(cx + 1, cy + 1, C - 2, C - 2);
      x.fillStyle = '#fff';
      x.fillText(refs > 9 ? '+' : String(refs), cx + C / 2, cy + C / 2 + 0.5);
    }
    if (refs > 1 && P < 8) { // too small for a digit: a dark dot
      x.fillStyle = '#111';
      x.fillRect(cx + C / 2 - 1, cy + C / 2 - 1, Math.max(1, C / 3), Math.max(1, C / 3));
    }
    if (f === 'p' && P >= 8) { // held and in the prefix index: a white corner
      x.fillStyle = '#fff';
      x.beginPath();
      x.moveTo(cx + C, cy + C - 5); x.lineTo(cx + C, cy + C); x.lineTo(cx + C - 5, cy + C);
      x.fill();
    }
  }
  const s = sel[g.tier];
  if (s != null && s < t.pages && document.activeElement === cv) {
    x.strokeStyle = '#f0a500';
    x.lineWidth = 2;
    x.strokeRect((s % cols) * P - 1, Math.floor(s / cols) * P - 1, C + 2, C + 2);
  }
}

function renderTree(j) {
  const ul = $('ctx-tree');
  ul.textContent = '';
  const byId = new Map(j.contexts.map((c) => [c.id, c]));
  const kids = new Map();
  const roots = [];
  for (const c of j.contexts) {
    if (c.parent && byId.has(c.parent)) {
      if (!kids.has(c.parent)) kids.set(c.parent, []);
      kids.get(c.parent).push(c);
    } else {
      roots.push(c);
    }
  }
  const seqOf = new Map(j.sequences.map((s) => [s.seq, s]));
  const node = (c) => {
    const li = document.createElement('li');
    const s = seqOf.get(c.seq);
    const dot = document.createElement('span');
    dot.className = 'dot';
    dot.style.background = s ? colour(s, false) : '#999';
    const pages = s ? s.pages.reduce((a, r) => a + r[1], 0) : 0;
    let shared = 0;
    if (s && s.tier === 'device') {
      const t = j.tiers.find((x) => x.name === 'device');
      runsEach(s.pages, (p) => { if (p >= 0 && t.refs[p] > 1) shared++; });
    }
    const label = document.createElement('span');
    label.textContent = `${c.id} · ${c.n_tokens} tokens · ${pages} pages` + (shared ? ` (${shared} shared)` : '') +
      (c.swapped ? ' · swapped to host' : '') + (c.busy ? ' · busy' : '') +
      (c.parent && !byId.has(c.parent) ? ` · forked from ${c.parent} (deleted)` : '');
    li.dataset.ctx = c.id;
    li.append(dot, label);
    const ch = kids.get(c.id);
    if (ch) {
      const sub = document.createElement('ul');
      for (const k of ch) sub.append(node(k));
      li.append(sub);
    }
    return li;
  };
  for (const r of roots) ul.append(node(r));
  if (!roots.length) {
    const li = document.createElement('li');
    li.className = 'muted';
    li.textContent = 'none (POST /v1/contexts creates one; /v1/contexts/ID/fork forks it)';
    ul.append(li);
  }
  const sl = $('seq-list');
  sl.textContent = '';
  for (const s of j.sequences) {
    const li = document.createElement('li');
    const dot = document.createElement('span');
    dot.className = 'dot';
    dot.style.background = colour(s, false);
    const n = s.pages.reduce((a, r) => a + r[1], 0);
    li.append(dot, document.createTextNode(`seq ${s.seq} · ${ownerName(s)} · ${s.n_tokens} tokens · ${n} ${s.tier} pages`));
    sl.append(li);
  }
}

// the disk tier (serve --kv-disk) is a directory of page files: a count, not a grid
function diskText(j) {
  const t = j.tiers.find((x) => x.name === 'disk');
  if (!t) return '';
  const mib = (n) => (n / 1048576).toFixed(1);
  return ` · disk: ${t.files} pages in ${mib(t.bytes)} of ${mib(t.bytes_max)} MiB, ${t.hit_pages} loaded back` +
    (t.enabled ? '' : ' (off after a write error)');
}

// the remote tier (serve --kv-remote) is a Redis shared by replicas: counts only
function remoteText(j) {
  const t = j.tiers.find((x) => x.name === 'remote');
  if (!t) return '';
  return ` · Redis: ${t.hit_pages} pages loaded, ${t.written_pages} published` +
    (t.rejected_values ? `, ${t.rejected_values} rejected` : '') + (t.enabled ? '' : ' (not reachable: retrying)');
}

function render() {
  if (!kv) return;
  holders = indexHolders(kv);
  const d = kv.tiers.find((x) => x.name === 'device'), h = kv.tiers.find((x) => x.name === 'host');
  let shared = 0, prefix = 0;
  for (let p = 0; p < d.pages; p++) {
    if (d.refs[p] > 1) shared++;
    if (d.flags[p] === 'p') prefix++;
  }
  $('kv-summary').textContent =
    `device: ${d.used} of ${d.pages} pages held (${shared} shared, ${prefix} in the prefix index), ` +
    `${d.cached} cached, ${d.free} free · host: ${h.used} of ${h.pages} · ` +
    `${kv.sequences.length} sequences · page ${kv.page_size} tokens` + diskText(kv) + remoteText(kv);
  $('kv-summary').dataset.shared = shared;
  for (const g of GRIDS) drawGrid(g);
  renderTree(kv);
}

let polling = false;
async function poll() {
  if (polling) return;
  polling = true;
  try {
    const r = await fetch('/v1/kv', { headers: headers(false), cache: 'no-store' });
    if (r.ok) {
      kv = await r.json();
      render();
      $('kv-live').textContent = 'live · ' + new Date().toLocaleTimeString();
      $('conn').textContent = '';
    } else {
      $('kv-live').textContent = `/v1/kv: HTTP ${r.status}` + (r.status === 401 ? ' (set the API key)' : '');
    }
  } catch (e) {
    $('conn').textContent = 'server unreachable';
  }
  polling = false;
}

// hover and keyboard over the grids
const tip = $('tip');
function cellAt(cv, ev) {
  const r = cv.getBoundingClientRect();
  const P = +cv.dataset.pitch, cols = +cv.dataset.cols;
  const cx = Math.floor((ev.clientX - r.left) / P), cy = Math.floor((ev.clientY - r.top) / P);
  if (cx < 0 || cx >= cols || cy < 0) return -1;
  const p = cy * cols + cx;
  return p < +cv.dataset.pages ? p : -1;
}

for (const g of GRIDS) {
  const cv = $(g.canvas);
  cv.addEventListener('mousemove', (ev) => {
    const p = cellAt(cv, ev);
    const s = p >= 0 ? pageText(g.tier, p) : '';
    if (!s) { tip.hidden = true; return; }
    tip.textContent = s;
    tip.hidden = false;
    const x = Math.min(ev.clientX + 14, window.innerWidth - tip.offsetWidth - 4);
    tip.style.left = Math.max(4, x) + 'px';
    tip.style.top = (ev.clientY + 16) + 'px';
    $('kv-info').textContent = s;
  });
  cv.addEventListener('mouseleave', () => { tip.hidden = true; });
  cv.addEventListener('focus', () => { if (sel[g.tier] == null) sel[g.tier] = 0; keySel(g); });
  cv.addEventListener('blur', () => kv && drawGrid(g));
  cv.addEventListener('keydown', (ev) => {
    const t = kv && kv.tiers.find((x) => x.name === g.tier);
    if (!t) return;
    const cols = +cv.dataset.cols;
    let p = sel[g.tier] || 0;
    const k = ev.key;
    if (k === 'ArrowRight') p++;
    else if (k === 'ArrowLeft') p--;
    else if (k === 'ArrowDown') p += cols;
    else if (k === 'ArrowUp') p -= cols;
    else if (k === 'Home') p = 0;
    else if (k === 'End') p = t.pages - 1;
    else return;
    ev.preventDefault();
    sel[g.tier] = Math.max(0, Math.min(t.pages - 1, p));
    keySel(g);
  });
}

function keySel(g) {
  if (!kv) return;
  $('kv-info').textContent = pageText(g.tier, sel[g.tier]);
  drawGrid(g);
}

// ---------------------------------------------------------------- start

async function start() {
  load();
  if (window.matchMedia('(max-width: 900px)').matches) $('settings').open = false; // a phone: the chat first
  if (!chats.length) newChat();
  renderConvs();
  renderMessages();
  for (const f of FIELDS) $(f).addEventListener('change', saveSettings);
  $('ignore_eos').addEventListener('change', saveSettings);
  $('new-chat').onclick = () => { if (!running) newChat(); };
  $('composer').addEventListener('submit', (ev) => { ev.preventDefault(); send(); });
  $('stop').onclick = stop;
  $('prompt').addEventListener('keydown', (ev) => {
    if (ev.key === 'Enter' && !ev.shiftKey && !ev.isComposing) { ev.preventDefault(); send(); }
  });
  document.addEventListener('keydown', (ev) => { if (ev.key === 'Escape' && running) { ev.preventDefault(); stop(); } });
  window.addEventListener('resize', () => render());
  try {
    const r = await fetch('/v1/models', { headers: headers(false) });
    if (r.ok) {
      const j = await r.json();
      if (j.data && j.data[0]) {
        modelId = j.data[0].id;
        const m = j.data[0].meta || {};
        $('model').textContent = `${modelId} · ${m.arch || ''} · ${m.n_layer || '?'} layers · context ${m.n_ctx || '?'}`;
      }
    } else {
      $('model').textContent = `/v1/models: HTTP ${r.status}`;
    }
  } catch (e) {
    $('model').textContent = 'server unreachable';
  }
  poll();
  setInterval(poll, POLL_MS);
  $('prompt').focus();
}

start();
