#!/usr/bin/env node
// A tree-of-thought client for pagekv serve's contexts API (docs/server.md).
// It prefills a question once, then branches: every node is forked 2 ways (O(1):
// the fork shares every KV page, copy-on-write), each branch appends its own
// hint and samples a short "thought" with its own seed, 3 levels deep: 8 leaves,
// and no prompt text is ever sent or computed twice.
// Each leaf is checked against a replay: a fresh context fed the root prompt
// and then the same appends and generations along the leaf's path, without any
// fork, must end with exactly the same token ids.
// usage: node tools/tree-of-thought.cjs [--host 127.0.0.1] [--port 8080] [--key KEY] [--check]
'use strict';
const args = process.argv.slice(2);
const opt = (name, def) => { const i = args.indexOf(name); return i >= 0 ? args[i + 1] : def; };
const base = `http://${opt('--host', '127.0.0.1')}:${opt('--port', '8080')}`;
const key = opt('--key', process.env.PKV_API_KEY || '');
const check = args.includes('--check');
const DEPTH = 3, WIDTH = 2, THOUGHT_TOKENS = 8;

async function call(method, path, body) {
  const headers = { 'Content-Type': 'application/json' };
  if (key) headers.Authorization = `Bearer ${key}`;
  const r = await fetch(base + path, { method, headers, body: body ? JSON.stringify(body) : undefined });
  const j = await r.json();
  if (r.status !== 200) throw new Error(`${method} ${path}: ${r.status} ${JSON.stringify(j)}`);
  return j;
}
const create = prompt => call('POST', '/v1/contexts', { prompt });
const fork = id => call('POST', `/v1/contexts/${id}/fork`);
const append = (id, text) => call('POST', `/v1/contexts/${id}/append`, { text });
const think = (id, seed) => call('POST', `/v1/contexts/${id}/generate`,
                                  { max_tokens: THOUGHT_TOKENS, temperature: 0.8, top_p: 0.95, seed });
const tokens = async id => (await call('GET', `/v1/contexts/${id}`)).tokens;
const drop = id => call('DELETE', `/v1/contexts/${id}`);

const question = 'Question: how many legs do three spiders and two cats have? Let us think step by step.';

async function main() {
  const root = await create(question);
  const leaves = [], made = [root.id];
  async function expand(id, depth, path) {
    if (depth === DEPTH) { leaves.push({ id, path }); return; }
    for (let b = 0; b < WIDTH; b++) {
      const child = (await fork(id)).id;
      made.push(child);
      const hint = ` Idea ${depth}.${b}:`;
      const seed = 100 * depth + b;
      await append(child, hint);
      const g = await think(child, seed);
      console.log(`${'  '.repeat(depth)}[${child}]${hint}${g.text.replace(/\s+/g, ' ')}`);
      await expand(child, depth + 1, [...path, { hint, seed }]);
    }
  }
  console.log(question);
  await expand(root.id, 0, []);
  const info = await call('GET', `/v1/contexts/${leaves[0].id}`);
  console.log(`${leaves.length} leaves; a leaf holds ${info.n_tokens} tokens in ${info.pages} pages, ` +
              `${info.shared_pages} of them shared with other contexts`);
  let bad = 0;
  for (const leaf of leaves) { // replay without forks
    const r = (await create(question)).id;
    for (const step of leaf.path) {
      await append(r, step.hint);
      await think(r, step.seed);
    }
    const [a, b] = [await tokens(leaf.id), await tokens(r)];
    const same = a.length === b.length && a.every((t, i) => t === b[i]);
    if (!same) { bad++; console.error(`leaf ${leaf.id}: differs from its replay`); }
    await drop(r);
  }
  for (const id of made) await drop(id);
  console.log(bad ? `${bad} of ${leaves.length} leaves differ from their replay` :
                    `every leaf equals its replay (${leaves.length} leaves, token ids identical)`);
  process.exit(check && bad ? 1 : 0);
}
main().catch(e => { console.error('tree-of-thought:', e.message); process.exit(1); });
