// The official Anthropic Node client (tests/package.json pins it) against
// `pagekv serve`'s /v1/messages: a greedy answer, the same answer streamed
// through messages.stream() (its accumulated finalMessage equals the whole one),
// stop_sequences, a forced tool call (tool_choice any: constrained, so random
// weights still call validly) whose input is valid for input_schema, the
// tool_result round trip, countTokens, and an error the client raises with
// Anthropic's shape.
// usage: PKV_NODE_DIR=<dir with node_modules> node anthropic-client.cjs PORT
'use strict';
const { createRequire } = require('module');
const path = require('path');
const req = createRequire(path.join(process.env.PKV_NODE_DIR || __dirname, 'x.js'));
const sdk = req('@anthropic-ai/sdk');
const Anthropic = sdk.default || sdk.Anthropic || sdk;

const port = process.argv[2];
const client = new Anthropic({ baseURL: `http://127.0.0.1:${port}`, apiKey: 'test-key', maxRetries: 0, timeout: 60000 });
let failures = 0, checks = 0;
function check(cond, what) {
  checks++;
  if (!cond) { failures++; console.error('FAIL:', what); }
}
const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);
const strip = (m) => m.content.map((b) => (b.type === 'tool_use' ? { ...b, id: undefined } : b));

const tools = [{
  name: 'get_weather', description: 'Weather of a city',
  input_schema: { type: 'object', properties: { city: { type: 'string', maxLength: 20 }, unit: { enum: ['C', 'F'] } },
                  required: ['city', 'unit'], additionalProperties: false },
}];

async function main() {
  const base = { model: 'tiny', max_tokens: 16, temperature: 0, messages: [{ role: 'user', content: 'Tell me about Paris.' }] };
  const m = await client.messages.create(base);
  check(m.type === 'message' && m.role === 'assistant' && m.id.startsWith('msg_'), `message object ${JSON.stringify(m)}`);
  check(['end_turn', 'max_tokens'].includes(m.stop_reason), `stop_reason ${m.stop_reason}`);
  check(m.usage.output_tokens > 0 && m.usage.input_tokens + (m.usage.cache_read_input_tokens || 0) > 0, 'usage');
  // streamed: the events the client accumulates give the same message
  const st = client.messages.stream(base);
  let deltas = '';
  st.on('text', (t) => { deltas += t; });
  const fm = await st.finalMessage();
  check(same(strip(fm), strip(m)) && fm.stop_reason === m.stop_reason, `stream ${JSON.stringify(fm.content)} != ${JSON.stringify(m.content)}`);
  const text = m.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
  check(deltas === text, `text deltas '${deltas}' != '${text}'`);
  // stop_sequences: cut at the first match of two ASCII bytes of the text
  let at = -1;
  for (let i = Math.floor(text.length / 2); i + 1 < text.length; i++)
    if (/^[!-~]{2}$/.test(text.slice(i, i + 2))) { at = i; break; }
  if (at >= 0) {
    const seq = text.slice(at, at + 2);
    const s = await client.messages.create({ ...base, stop_sequences: [seq] });
    const got = s.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
    check(s.stop_reason === 'stop_sequence' && s.stop_sequence === seq && got === text.slice(0, text.indexOf(seq)),
          `stop_sequences ${seq}: ${JSON.stringify(s)}`);
  }
  // a forced tool call, then its result
  const q = { model: 'tiny', max_tokens: 200, temperature: 0, tools, tool_choice: { type: 'any' },
              messages: [{ role: 'user', content: 'Weather in Paris?' }] };
  const t = await client.messages.create(q);
  const tu = t.content.find((b) => b.type === 'tool_use');
  check(t.stop_reason === 'tool_use' && tu && tu.name === 'get_weather' && tu.id.startsWith('toolu_'), `tool_use ${JSON.stringify(t)}`);
  if (tu) {
    const inp = tu.input;
    check(typeof inp === 'object' && Object.keys(inp).length === 2 && typeof inp.city === 'string' &&
          [...inp.city].length <= 20 && ['C', 'F'].includes(inp.unit), `input ${JSON.stringify(inp)}`);
    const ts = await client.messages.stream(q).finalMessage();
    check(same(strip(ts), strip(t)), `streamed tool_use ${JSON.stringify(ts.content)}`);
    const r = await client.messages.create({
      model: 'tiny', max_tokens: 8, temperature: 0, tools,
      messages: [...q.messages, { role: 'assistant', content: t.content },
                 { role: 'user', content: [{ type: 'tool_result', tool_use_id: tu.id, content: '18 C, sunny' }] }] });
    check(r.type === 'message' && r.content.every((b) => b.type === 'text' || b.type === 'tool_use'), 'tool_result turn');
  }
  const n = await client.messages.countTokens({ model: 'tiny', messages: base.messages });
  check(n.input_tokens === m.usage.input_tokens + (m.usage.cache_read_input_tokens || 0), `countTokens ${n.input_tokens}`);
  // an error: the client's BadRequestError with Anthropic's error object
  try {
    await client.messages.create({ ...base, temperature: 3 });
    check(false, 'temperature 3 was accepted');
  } catch (e) {
    check(e instanceof Anthropic.BadRequestError && e.status === 400 && e.error && e.error.type === 'error' &&
          e.error.error.type === 'invalid_request_error' && /temperature/.test(e.error.error.message), `error ${e}`);
  }
  console.log(`${checks - failures}/${checks} checks passed`);
  process.exit(failures ? 1 : 0);
}

main().catch((e) => { console.error('FAIL:', e); process.exit(1); });
