// The official OpenAI Node client (tests/package.json pins it) against pagekv
// serve's /v1/embeddings: the client asks for base64 unless told otherwise and
// decodes it itself, so its default answer must equal encoding_format "float"
// exactly; a batch equals the inputs alone; usage counts the tokens.
// usage: PKV_NODE_DIR=<dir with node_modules> node openai-embeddings.cjs PORT
'use strict';
const { createRequire } = require('module');
const path = require('path');
const req = createRequire(path.join(process.env.PKV_NODE_DIR || __dirname, 'x.js'));
const OpenAI = req('openai');

const port = process.argv[2];
const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'none', maxRetries: 0, timeout: 60000 });
let failures = 0, checks = 0;
function check(cond, what) {
  checks++;
  if (!cond) { failures++; console.error('FAIL:', what); }
}
const same = (a, b) => a.length === b.length && a.length > 0 && a.every((x, i) => x === b[i]);

async function main() {
  const input = ['hello world', 'the quick brown fox jumps over the lazy dog'];
  const dflt = await client.embeddings.create({ model: 'm', input });
  const flt = await client.embeddings.create({ model: 'm', input, encoding_format: 'float' });
  check(dflt.data.length === 2 && flt.data.length === 2, 'two embeddings');
  for (let i = 0; i < 2; i++) {
    check(Array.isArray(dflt.data[i].embedding) && dflt.data[i].embedding.length === 128, `default ${i}: 128 numbers`);
    check(same(dflt.data[i].embedding, flt.data[i].embedding), `default (base64) ${i} equals float`);
    const one = await client.embeddings.create({ model: 'm', input: input[i], encoding_format: 'float' });
    check(same(one.data[0].embedding, flt.data[i].embedding), `input ${i} alone equals the batch`);
    const n = Math.hypot(...flt.data[i].embedding);
    check(Math.abs(n - 1) < 1e-5, `input ${i} normalised (${n})`);
  }
  check(flt.usage.prompt_tokens > 4 && flt.usage.total_tokens === flt.usage.prompt_tokens, 'usage');
  let err = null;
  try { await client.embeddings.create({ model: 'm', input: 'x', dimensions: 3 }); } catch (e) { err = e; }
  check(err && err.status === 400 && /dimensions/.test(err.message), 'dimensions 3 refused naming it');
  console.log(`openai-embeddings: ${checks} checks, ${failures} failures`);
  process.exit(failures ? 1 : 0);
}
main().catch((e) => { console.error(e); process.exit(1); });
