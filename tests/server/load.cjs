// Load and faults against `pagekv serve` (run by tests/test-server-load.c).
// Bounded traffic to 127.0.0.1 only. Checks content, never timing:
//  - 64 concurrent streaming clients (prompts sharing prefixes): all complete,
//    every chunk is JSON, each greedy text equals the same request sent alone;
//  - afterwards /metrics shows the KV pages in use back at the baseline;
//  - 20 clients disconnect mid-stream: their requests are cancelled (counted)
//    and their pages return;
//  - slowloris: silent half-sent requests are closed after --timeout while
//    /health and completions keep being served; trickling ones do not stall others;
//  - bodies over the limit (with and without Content-Length) get 413, a header
//    block over the limit gets 431;
//  - 500 malformed requests all get a 4xx with an OpenAI error object, never a
//    5xx or a dropped connection; /health still answers.
// usage: node load.cjs PORT TIMEOUT_S
'use strict';
const net = require('net');

const port = Number(process.argv[2]);
const timeoutS = Number(process.argv[3] || 2);
const base = `http://127.0.0.1:${port}`;
let failures = 0, checks = 0;
function check(cond, what) {
  checks++;
  if (!cond) { failures++; console.error('FAIL:', what); }
}
const sleep = ms => new Promise(r => setTimeout(r, ms));

// fetch, tried once more when a pooled keep-alive socket turns out closed before
// any answer came back: the server closes connections idle for --timeout (2 s
// here, for the slowloris part) and node's fetch keeps idle sockets 4 s, so on a
// loaded machine a request can be written to a socket whose FIN is on its way
// (seen under the sanitizer build: "other side closed"). The server never saw
// that request. Not used where a dropped connection is what the check is about.
async function fetchPooled(url, opts) {
  try {
    return await fetch(url, opts);
  } catch (e) {
    if (!(e && e.cause && e.cause.code === 'UND_ERR_SOCKET')) throw e;
    return await fetch(url, opts);
  }
}

async function metrics() {
  const t = await (await fetchPooled(base + '/metrics')).text();
  const m = {};
  for (const line of t.split('\n')) {
    const x = /^(pagekv_[a-z_]+) ([0-9.e+-]+)$/.exec(line);
    if (x) m[x[1]] = Number(x[2]);
  }
  return m;
}

async function complete(body) {
  const r = await fetchPooled(base + '/v1/completions', { method: 'POST', headers: { 'Content-Type': 'application/json' },
                                                          body: JSON.stringify(body) });
  const j = await r.json();
  return { status: r.status, j };
}

// A streaming completion; returns the concatenated text, finish reason and whether
// the stream was well formed (every event JSON, then [DONE]).
async function stream(body, abortAfterChunks) {
  const ctl = new AbortController();
  const r = await fetchPooled(base + '/v1/completions', { method: 'POST', headers: { 'Content-Type': 'application/json' },
                                                          body: JSON.stringify({ ...body, stream: true }), signal: ctl.signal });
  if (r.status !== 200) return { status: r.status };
  const reader = r.body.getReader();
  const dec = new TextDecoder();
  let buf = '', text = '', finish = null, done = false, ok = true, chunks = 0;
  try {
    for (;;) {
      const { value, done: end } = await reader.read();
      if (end) break;
      buf += dec.decode(value, { stream: true });
      let k;
      while ((k = buf.indexOf('\n\n')) >= 0) {
        const ev = buf.slice(0, k);
        buf = buf.slice(k + 2);
        if (!ev.startsWith('data: ')) { ok = false; continue; }
        const data = ev.slice(6);
        if (data === '[DONE]') { done = true; continue; }
        try {
          const j = JSON.parse(data);
          for (const c of j.choices) {
            text += c.text || '';
            if (c.finish_reason) finish = c.finish_reason;
          }
        } catch (e) { ok = false; }
        chunks++;
        if (abortAfterChunks && chunks >= abortAfterChunks) { ctl.abort(); return { status: 200, aborted: true }; }
      }
    }
  } catch (e) {
    if (!abortAfterChunks) ok = false;
  }
  return { status: 200, text, finish, ok: ok && done && buf === '' };
}

// Raw TCP: send bytes, collect the reply until the server closes or `ms` pass.
function raw(bytes, ms) {
  return new Promise(resolve => {
    const s = net.connect(port, '127.0.0.1');
    let out = '';
    const timer = setTimeout(() => { s.destroy(); resolve({ out, closed: false }); }, ms);
    s.on('data', d => { out += d.toString('latin1'); });
    s.on('error', () => {});
    s.on('close', () => { clearTimeout(timer); resolve({ out, closed: true }); });
    s.on('connect', () => s.write(bytes));
  });
}
const statusOf = out => { const m = /^HTTP\/1\.[01] (\d{3})/.exec(out); return m ? Number(m[1]) : 0; };

async function loadTest() {
  const m0 = await metrics();
  const prefixes = ['you are a helpful assistant that answers briefly. ', 'translate the following words into french: ',
                    'write a short poem about the sea and the sky. ', ''];
  const reqs = [];
  for (let i = 0; i < 64; i++)
    reqs.push({ prompt: prefixes[i % 4] + `question number ${i} is about ${['cats', 'dogs', 'birds', 'fish'][i % 4]}`,
                max_tokens: 12 + (i % 5), temperature: 0 });
  const results = await Promise.all(reqs.map(r => stream(r)));
  let allOk = true;
  results.forEach((res, i) => { if (!(res.status === 200 && res.ok)) { allOk = false; console.error('stream', i, res); } });
  check(allOk, '64 concurrent streams complete, well formed');
  // the same requests alone, one at a time, not streamed
  let equal = 0;
  for (let i = 0; i < 64; i++) {
    const a = await complete(reqs[i]);
    if (a.status === 200 && a.j.choices[0].text === results[i].text && a.j.choices[0].finish_reason === results[i].finish) equal++;
    else console.error(`request ${i}: alone ${JSON.stringify(a.j.choices && a.j.choices[0])} vs in load ${JSON.stringify(results[i])}`);
  }
  check(equal === 64, `each result equals the request alone (${equal}/64)`);
  const m1 = await metrics();
  check(m1.pagekv_kv_pages_used === m0.pagekv_kv_pages_used, `pages used back at baseline (${m0.pagekv_kv_pages_used} -> ${m1.pagekv_kv_pages_used})`);
  check(m1.pagekv_requests_running === 0 && m1.pagekv_requests_waiting === 0, 'nothing running or waiting');
  check(m1.pagekv_prefix_cache_hit_tokens_total > m0.pagekv_prefix_cache_hit_tokens_total, 'shared prefixes hit the prefix cache');
  return m0;
}

async function disconnects(m0) {
  const before = (await metrics()).pagekv_client_disconnects_total;
  // long enough (ignore_eos, most of the context) that no stream can end before
  // its client is gone
  const body = { prompt: 'an endless story begins', max_tokens: 4000, temperature: 1, seed: 1, ignore_eos: true };
  const rs = await Promise.all(Array.from({ length: 20 }, (_, i) => stream({ ...body, seed: i }, 2)));
  check(rs.every(r => r.aborted), '20 streams aborted by their clients');
  let m;
  for (let i = 0; i < 100; i++) { // the server notices at its next write
    m = await metrics();
    if (m.pagekv_requests_running === 0 && m.pagekv_kv_pages_used === m0.pagekv_kv_pages_used) break;
    await sleep(100);
  }
  check(m.pagekv_requests_running === 0, 'disconnected requests stopped');
  check(m.pagekv_kv_pages_used === m0.pagekv_kv_pages_used, `their pages returned (${m.pagekv_kv_pages_used} vs ${m0.pagekv_kv_pages_used})`);
  check(m.pagekv_client_disconnects_total >= before + 20, `disconnects counted (${before} -> ${m.pagekv_client_disconnects_total})`);
}

async function slowloris() {
  // silent half-sent requests: closed after the idle timeout
  const silent = Array.from({ length: 20 }, () => raw('POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le', (timeoutS + 8) * 1000));
  // trickling ones: a header byte every 300 ms
  const trickle = Array.from({ length: 5 }, () => new Promise(resolve => {
    const s = net.connect(port, '127.0.0.1');
    s.on('error', () => {});
    let n = 0;
    const iv = setInterval(() => { s.write('X'); if (++n > 10) { clearInterval(iv); s.destroy(); resolve(); } }, 300);
    s.on('connect', () => s.write('GET /health HTTP/1.1\r\nX-Slow: '));
    s.on('close', () => { clearInterval(iv); resolve(); });
  }));
  await sleep(300);
  // others are served meanwhile
  const h = await fetch(base + '/health');
  check(h.status === 200, '/health answers during slowloris');
  const c = await complete({ prompt: 'hello', max_tokens: 4, temperature: 0 });
  check(c.status === 200 && c.j.choices.length === 1, 'a completion is served during slowloris');
  const res = await Promise.all(silent);
  check(res.every(r => r.closed), `silent partial requests closed by the server (${res.filter(r => r.closed).length}/20)`);
  await Promise.all(trickle);
}

async function limits() {
  // Content-Length over the limit: refused before the body is read (the client
  // sends only the start of it and waits for the answer)
  const r1 = await raw('POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n' +
                       'Content-Length: 2097152\r\n\r\n{"prompt": "xxxx', 20000);
  check(statusOf(r1.out) === 413 && /max-body/.test(r1.out), 'body over --max-body with Content-Length: 413 (' + statusOf(r1.out) + ')');
  // chunked, no Content-Length: the server counts as it reads
  const chunked = 'POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n' +
    Array.from({ length: 40 }, () => '8000\r\n' + 'y'.repeat(0x8000) + '\r\n').join('') + '0\r\n\r\n';
  const r2 = await raw(chunked, 20000);
  check(statusOf(r2.out) === 413, 'chunked body over the limit: 413 (' + statusOf(r2.out) + ')');
  const r3 = await raw('GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ' + 'h'.repeat(200000) + '\r\n\r\n', 20000);
  check(statusOf(r3.out) === 431 || (statusOf(r3.out) === 0 && r3.closed), 'header block over the limit: 431 (' + statusOf(r3.out) + ')');
}

function malformed(i) {
  const valid = JSON.stringify({ prompt: 'hello there', max_tokens: 4, temperature: 0, stop: ['x'], n: 1 });
  const kinds = [
    () => valid.slice(0, 1 + (i * 7) % (valid.length - 2)),                      // truncated JSON
    () => Buffer.from(Array.from({ length: 1 + i % 200 }, (_, k) => (i * 31 + k * 17) % 256)), // random bytes
    () => '['.repeat(5000 + i) + ']'.repeat(5000 + i),                             // deep nesting
    () => JSON.stringify({ prompt: 'a', max_tokens: [1e300, -5, 'x', {}, null, 1.5, 2 ** 40][i % 7] ?? -1 }),
    () => JSON.stringify({ prompt: 'a', temperature: ['hot', -1, 1e308, [], {}, true][i % 6] }),
    () => JSON.stringify({ prompt: [[[1, 2]], -1, 1e20, 'x', true, [1, 99999]][i % 6] }),
    () => '{"prompt": "' + '\\ud800' + '"}',                                        // lone surrogate escape
    () => Buffer.concat([Buffer.from('{"prompt": "'), Buffer.from([0xc3, 0x28, 0xa0, 0xa1, 0xf0, 0x28]), Buffer.from('"}')]),
    () => '{"prompt": 1' + '0'.repeat(400) + '}',                                   // huge integer
    () => JSON.stringify({ messages: [{ role: ['user', 5, null][i % 3], content: [{}, 7, [1]][i % 3] }] }),
    () => JSON.stringify({ prompt: 'a', stop: [[1], 5, {}, Array(40).fill('s')][i % 4] }),
    () => JSON.stringify({ prompt: 'a', n: [0, -1, 1000, 'two'][i % 4] }),
    () => '',
    () => 'null',
    () => JSON.stringify({ prompt: 'a', logprobs: [99, -1, 'yes'][i % 3] }),
  ];
  const k = i % kinds.length;
  const syntax = [0, 1, 2, 6, 7, 8, 12, 13].includes(k); // not a JSON object at all: any endpoint
  const path = k === 9 ? '/v1/chat/completions'
    : syntax ? ['/v1/completions', '/tokenize', '/v1/contexts', '/v1/chat/completions'][(i >> 4) % 4]
    : ['/v1/completions', '/tokenize'][(i >> 4) % 2];
  return { path, body: kinds[k]() };
}

async function malformedTest() {
  let ok = 0, bad = [];
  for (let start = 0; start < 500; start += 10) {
    await Promise.all(Array.from({ length: 10 }, async (_, j) => {
      const i = start + j;
      const { path, body } = malformed(i);
      try {
        const r = await fetch(base + path, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body });
        const t = await r.text();
        let j2 = null;
        try { j2 = JSON.parse(t); } catch (e) { /* checked below */ }
        if (r.status >= 400 && r.status < 500 && j2 && j2.error && typeof j2.error.message === 'string') ok++;
        else if (r.status === 200 && path === '/tokenize') ok++; // a valid string can tokenize
        else bad.push(`${i} ${path} -> ${r.status} ${t.slice(0, 120)}`);
      } catch (e) {
        bad.push(`${i} ${path} -> ${e.message}`);
      }
    }));
  }
  if (bad.length) console.error(bad.slice(0, 10).join('\n'));
  check(ok === 500, `500 malformed requests answered with a 4xx error object (${ok}/500)`);
  const h = await fetch(base + '/health');
  check(h.status === 200, '/health still answers');
}

async function main() {
  const m0 = await loadTest();
  await disconnects(m0);
  await slowloris();
  await limits();
  await malformedTest();
  const m = await metrics();
  check(m.pagekv_kv_pages_used === m0.pagekv_kv_pages_used, 'pages used at baseline at the end');
  console.error(`load: ${checks - failures}/${checks} checks passed`);
  process.exit(failures ? 1 : 0);
}
main().catch(e => { console.error('FAIL: exception', e); process.exit(1); });
