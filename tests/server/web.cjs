// The web page of pagekv serve (GET /) in a real browser: Debian's chromium,
// headless, driven by playwright-core (pinned in tests/package.json), run by
// tests/test-server-web.c:
//   node tests/server/web.cjs PORT OUTDIR CHROMIUM
// It chats through the page (the streamed answer equal to the same request
// sent alone, temperature 0; tokens/s and cached tokens shown), forks a context
// through the contexts API and finds the shared pages in the cache view (hover
// and keyboard: refcount 2, both contexts, their token range; the cell drawn
// with the shared border), stops a generation with Escape (the server frees its
// pages), checks the tab order and the phone width, and keeps the conversation
// across a reload. Screenshots go to OUTDIR. Exit 0 when every check passed.
'use strict';
const fs = require('fs');
const os = require('os');
const path = require('path');
const { chromium } = require(path.join(process.env.PKV_NODE_DIR, 'node_modules', 'playwright-core'));

const port = +process.argv[2];
const outDir = process.argv[3];
const exe = process.argv[4] || '/usr/bin/chromium';
const base = `http://127.0.0.1:${port}`;
let failures = 0, checks = 0;

function check(cond, what, detail) {
  checks++;
  if (cond) return;
  failures++;
  console.error(`FAIL: ${what}` + (detail !== undefined ? `: ${JSON.stringify(detail)}` : ''));
}

async function api(method, p, body) {
  const r = await fetch(base + p, {
    method, headers: method === 'POST' ? { 'Content-Type': 'application/json' } : {}, // every JSON POST says so
    body: body ? JSON.stringify(body) : undefined,
  });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch (e) { /* metrics are text */ }
  return { status: r.status, json, text };
}

async function until(fn, ms, what) {
  const t0 = Date.now();
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() - t0 > ms) { check(false, `timed out: ${what}`); return null; }
    await new Promise((r) => setTimeout(r, 100));
  }
}

function seqOf(kv, ctx) {
  return kv.sequences.find((s) => s.owner && s.owner.kind === 'context' && s.owner.id === ctx);
}

function expand(runs) {
  const out = [];
  for (const [f, n] of runs) for (let k = 0; k < n; k++) out.push(f < 0 ? -1 : f + k);
  return out;
}

async function main() {
  fs.mkdirSync(outDir, { recursive: true });
  const udd = fs.mkdtempSync(path.join(os.tmpdir(), 'pkv-chromium-'));
  const ctx = await chromium.launchPersistentContext(udd, {
    executablePath: exe,
    headless: true,
    viewport: { width: 1280, height: 800 },
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  try {
    await run(ctx);
  } finally {
    await ctx.close();
    fs.rmSync(udd, { recursive: true, force: true });
  }
}

async function run(bctx) {
  const page = bctx.pages()[0] || await bctx.newPage();
  page.setDefaultTimeout(20000);
  const errors = [];
  page.on('pageerror', (e) => errors.push(e.message));
  page.on('console', (m) => { if (m.type() === 'error') errors.push(m.text()); });

  // --- load: the page and the cache view come up
  const resp = await page.goto(base + '/');
  check(resp.status() === 200, 'GET / is 200', resp.status());
  check((resp.headers()['content-security-policy'] || '').includes("default-src 'none'"), 'the page has a CSP');
  check(await page.title() === 'pagekv', 'title');
  await page.waitForFunction(() => document.getElementById('kv-summary').textContent.startsWith('device:'));
  const models = (await api('GET', '/v1/models')).json;
  await page.waitForFunction((id) => document.getElementById('model').textContent.startsWith(id), models.data[0].id);

  // --- chat: settings, Enter sends, the answer streams in
  await page.fill('#system', 'You are terse.');
  await page.fill('#temperature', '0');
  await page.fill('#max_tokens', '32');
  await page.evaluate(() => {
    window.__partial = 0;
    new MutationObserver(() => {
      const m = document.querySelector('#messages .msg.assistant:last-child');
      const t = m && m.querySelector('.text');
      if (m && m.dataset.state === 'streaming' && t.textContent.length > 0) window.__partial++;
    }).observe(document.getElementById('messages'), { childList: true, subtree: true, characterData: true });
  });
  const q1 = 'Tell me a story about a cat.';
  await page.focus('#prompt');
  await page.keyboard.type(q1);
  await page.keyboard.press('Enter');
  const done1 = page.locator('#messages .msg.assistant').nth(0);
  await page.waitForSelector('#messages .msg.assistant[data-state="done"]');
  const text1 = await done1.locator('.text').textContent();
  const partial = await page.evaluate(() => window.__partial);
  check(partial >= 1, 'the answer was shown while it streamed', partial);
  const alone = await api('POST', '/v1/chat/completions', {
    messages: [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: q1 }],
    temperature: 0, max_tokens: 32, top_p: 0.95, top_k: 40, min_p: 0.05,
  });
  check(alone.status === 200, 'the same request through the API', alone.status);
  const ref = alone.json.choices[0].message.content || '';
  check(text1 === ref, 'the streamed answer equals the same request sent alone (temperature 0)', { page: text1, api: ref });
  check(text1.length > 0, 'the answer is not empty');
  const stats1 = await done1.locator('.stats').textContent();
  const m1 = stats1.match(/^(\d+) tokens · ([\d.]+) tok\/s · first token \d+ ms · prompt (\d+) tokens \((\d+) cached\)/);
  check(m1 && +m1[1] === alone.json.usage.completion_tokens, 'tokens and tok/s shown', stats1);
  check(m1 && +m1[3] === alone.json.usage.prompt_tokens, 'prompt tokens shown', stats1);

  // a second turn: its prompt starts with the first, so the prefix cache serves part of it
  await page.fill('#max_tokens', '8');
  await page.fill('#prompt', 'And then?');
  await page.click('#send');
  await page.waitForSelector('#messages .msg.assistant:nth-child(4)[data-state="done"]');
  const stats2 = await page.locator('#messages .msg.assistant').nth(1).locator('.stats').textContent();
  const m2 = stats2.match(/\((\d+) cached\)/);
  check(m2 && +m2[1] >= 16, 'the second answer shows cached prompt tokens', stats2);

  // --- fork a context through the API: its pages shared in the view
  const c1 = await api('POST', '/v1/contexts', { prompt: 'In a land far away there lived a king who had three ' +
    'daughters, and the youngest was so beautiful that the sun itself was astonished whenever it shone on her face.' });
  check(c1.status === 200, 'create ctx', c1.json);
  const c2 = await api('POST', `/v1/contexts/${c1.json.id}/fork`);
  check(c2.status === 200, 'fork', c2.json);
  const ap = await api('POST', `/v1/contexts/${c2.json.id}/append`, { text: ' One day a frog came to the well.' });
  check(ap.status === 200, 'append to the fork', ap.json);
  const id1 = c1.json.id, id2 = c2.json.id;
  await page.waitForSelector(`#ctx-tree li[data-ctx="${id1}"] li[data-ctx="${id2}"]`);
  const kv = (await api('GET', '/v1/kv')).json;
  const dev = kv.tiers.find((t) => t.name === 'device');
  const p1 = expand(seqOf(kv, id1).pages), p2 = expand(seqOf(kv, id2).pages);
  const shared = p1.filter((p, i) => p2[i] === p);
  check(shared.length >= 2 && shared.every((p) => dev.refs[p] === 2), 'the fork shares its full pages (refcount 2)',
    { p1, p2 });
  const own = p2.filter((p) => dev.refs[p] === 1);
  check(own.length >= 1, 'the fork has pages of its own after the append', p2);
  // the view has drawn this snapshot once the tree shows the fork; hover the first shared page
  const grid = page.locator('#grid-device');
  const g = await grid.evaluate((cv) => ({ cols: +cv.dataset.cols, pitch: +cv.dataset.pitch }));
  const box = await grid.boundingBox();
  const cell = (p) => ({ x: box.x + (p % g.cols) * g.pitch + g.pitch / 2, y: box.y + Math.floor(p / g.cols) * g.pitch + g.pitch / 2 });
  const s0 = shared[0], idx0 = p1.indexOf(s0);
  await page.mouse.move(cell(s0).x, cell(s0).y);
  await page.waitForSelector('#tip:not([hidden])');
  const tip = await page.textContent('#tip');
  const range = `tokens ${idx0 * kv.page_size}–${(idx0 + 1) * kv.page_size - 1}`;
  check(tip.startsWith(`device page ${s0} · refcount 2`), 'hover: the page and its refcount', tip);
  check(tip.includes(`${id1} (seq `) && tip.includes(`${id2} (seq `), 'hover: both contexts hold it', tip);
  check(tip.split(range).length === 3, `hover: each holds ${range}`, tip);
  // the shared cell is drawn with its dark border; a page of the fork's own is not
  const px = await grid.evaluate((cv, a) => {
    const d = window.devicePixelRatio || 1, P = +cv.dataset.pitch, cols = +cv.dataset.cols, x = cv.getContext('2d');
    const at = (p, dx, dy) => Array.from(x.getImageData(Math.floor(((p % cols) * P + dx) * d),
      Math.floor((Math.floor(p / cols) * P + dy) * d), 1, 1).data);
    return { shared: at(a.s, 1.5, 1.5), own: at(a.o, 1.5, 1.5) };
  }, { s: s0, o: own[0] });
  check(px.shared[0] < 60 && px.shared[1] < 60 && px.shared[2] < 60, 'the shared cell has the dark border', px);
  check(px.own[0] + px.own[1] + px.own[2] > 150, 'a page held once has none', px);
  await page.mouse.move(1, 1);

  // --- keyboard: the tab order and the grid
  await page.focus('#prompt');
  await page.keyboard.press('Tab');
  check(await page.evaluate(() => document.activeElement.id) === 'send', 'Tab from the message goes to Send');
  await page.keyboard.press('Tab'); // Stop is disabled: skipped
  check(await page.evaluate(() => document.activeElement.id) === 'grid-device', 'then to the device pool');
  await page.keyboard.press('Home');
  for (let i = 0; i < s0; i++) await page.keyboard.press('ArrowRight');
  const info = await page.textContent('#kv-info');
  check(info.startsWith(`device page ${s0} · refcount 2`) && info.includes(id2), 'arrow keys select the page', info);

  await page.screenshot({ path: path.join(outDir, 'web-desktop.png') });

  // --- phone width: one column, nothing wider than the screen
  await page.setViewportSize({ width: 375, height: 812 });
  await page.waitForTimeout(800);
  const sw = await page.evaluate(() => document.documentElement.scrollWidth);
  check(sw <= 375, 'no horizontal scrolling at 375 px', sw);
  const cols = await page.evaluate(() => getComputedStyle(document.querySelector('.layout')).gridTemplateColumns);
  check(cols.split(' ').length === 1, 'one column at 375 px', cols);
  await page.screenshot({ path: path.join(outDir, 'web-phone.png'), fullPage: true });
  await page.setViewportSize({ width: 1280, height: 800 });

  // --- stop: a long generation, Escape
  await page.fill('#max_tokens', '3000');
  await page.check('#ignore_eos');
  await page.fill('#temperature', '0.8');
  await page.focus('#prompt');
  await page.keyboard.type('Go on for a long time.');
  await page.keyboard.press('Enter');
  await page.waitForFunction(() => {
    const m = document.querySelector('#messages .msg.assistant:last-child');
    return m && m.dataset.state === 'streaming' && m.querySelector('.text').textContent.length > 0;
  });
  const running = await until(async () => {
    const j = (await api('GET', '/v1/kv')).json;
    return j.sequences.find((s) => s.owner && s.owner.kind === 'request');
  }, 5000, 'the running request in /v1/kv');
  check(running && /^chatcmpl-/.test(running.owner.id), 'the request owns a sequence', running);
  check(await page.isDisabled('#send') && !(await page.isDisabled('#stop')), 'Send off and Stop on while it runs');
  await page.keyboard.press('Escape');
  await page.waitForSelector('#messages .msg.assistant:last-child[data-state="stopped"]');
  const last = page.locator('#messages .msg.assistant').last();
  const len1 = (await last.locator('.text').textContent()).length;
  await page.waitForTimeout(1000);
  const len2 = (await last.locator('.text').textContent()).length;
  check(len1 === len2 && len1 > 0, 'the answer stops growing', { len1, len2 });
  check(!(await page.isDisabled('#send')) && await page.isDisabled('#stop'), 'Send back on after Stop');
  const freed = await until(async () => {
    const j = (await api('GET', '/v1/kv')).json;
    return !j.sequences.some((s) => s.owner && s.owner.kind === 'request');
  }, 5000, 'the stopped request gives its pages back');
  check(!!freed, 'the stopped request holds no sequence');
  const met = (await api('GET', '/metrics')).text;
  const disc = +((met.match(/^pagekv_client_disconnects_total (\d+)/m) || [])[1] || 0);
  check(disc >= 1, 'the server counted the stop as a client going away', disc);
  const gen = +((met.match(/^pagekv_generation_tokens_total (\d+)/m) || [])[1] || 0);
  check(gen < 3000 + 64, 'the stopped generation did not run to max_tokens', gen);

  // --- the conversation is kept in localStorage
  await page.reload();
  await page.waitForSelector('#messages .msg.assistant');
  const kept = await page.evaluate(() => ({
    n: document.querySelectorAll('#messages .msg').length,
    first: document.querySelector('#messages .msg.assistant .text').textContent,
    title: document.querySelector('#convs li.current button.open').textContent,
    last: document.querySelector('#messages .msg.assistant:last-child').dataset.state,
  }));
  check(kept.n === 6 && kept.first === text1 && kept.title === q1 && kept.last === 'stopped',
    'the conversation is there after a reload', kept);
  check(await page.inputValue('#system') === 'You are terse.', 'the settings are kept');
  check(errors.length === 0, 'no page errors', errors);
}

main().then(() => {
  console.log(`web: ${checks - failures} of ${checks} checks passed`);
  process.exit(failures ? 1 : 0);
}, (e) => {
  console.error('web: ' + (e && e.stack || e));
  process.exit(1);
});
