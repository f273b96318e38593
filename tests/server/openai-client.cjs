// The official OpenAI Node client (tests/package.json pins it) against
// `pagekv serve`: chat and completions, streamed and not, n=2, seeds, stop
// strings, logprobs, usage, errors; a tool-call round trip (tool_choice
// required: constrained, so random weights still call validly) and json_schema
// output validated by ajv, streamed and not. Every check compares content: the stream
// against the non-streamed answer, n=2 against two requests with seeds s, s+1,
// a stop string against the text without it.
// usage: PKV_NODE_DIR=<dir with node_modules> node openai-client.cjs PORT
'use strict';
const { createRequire } = require('module');
const path = require('path');
const req = createRequire(path.join(process.env.PKV_NODE_DIR || __dirname, 'x.js'));
const OpenAI = req('openai');
const Ajv = req('ajv');

const port = process.argv[2];
const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'test-key', maxRetries: 0, timeout: 60000 });
let failures = 0, checks = 0;
function check(cond, what) {
  checks++;
  if (!cond) { failures++; console.error('FAIL:', what); }
}

async function streamText(params, chat) {
  const s = chat ? await client.chat.completions.create({ ...params, stream: true })
                 : await client.completions.create({ ...params, stream: true });
  const text = [], finish = [];
  let usage = null;
  for await (const chunk of s) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      text[c.index] = (text[c.index] || '') + ((chat ? c.delta.content : c.text) || '');
      if (c.finish_reason) finish[c.index] = c.finish_reason;
    }
  }
  return { text, finish, usage };
}

async function main() {
  const models = await client.models.list();
  check(models.data.length === 1 && models.data[0].id === 'tiny', 'models.list: ' + JSON.stringify(models.data));

  // chat: stream == non-stream (greedy), usage consistent
  const msgs = [{ role: 'system', content: 'you are terse' }, { role: 'user', content: 'name three colors' }];
  const a = await client.chat.completions.create({ model: 'tiny', messages: msgs, max_tokens: 20, temperature: 0 });
  check(a.object === 'chat.completion' && a.choices[0].message.role === 'assistant', 'chat object');
  const as = await streamText({ model: 'tiny', messages: msgs, max_tokens: 20, temperature: 0,
                                stream_options: { include_usage: true } }, true);
  check(as.text[0] === a.choices[0].message.content, `chat stream ${JSON.stringify(as.text[0])} vs ${JSON.stringify(a.choices[0].message.content)}`);
  check(as.finish[0] === a.choices[0].finish_reason, 'chat finish reason');
  check(as.usage && as.usage.completion_tokens === a.usage.completion_tokens &&
        as.usage.prompt_tokens === a.usage.prompt_tokens, 'chat stream usage');
  check(a.usage.total_tokens === a.usage.prompt_tokens + a.usage.completion_tokens, 'usage total');

  // completions: stream == non-stream
  const c = await client.completions.create({ model: 'tiny', prompt: 'the little dog', max_tokens: 24, temperature: 0 });
  const cs = await streamText({ model: 'tiny', prompt: 'the little dog', max_tokens: 24, temperature: 0 }, false);
  check(cs.text[0] === c.choices[0].text, 'completion stream == non-stream');
  check(c.choices[0].finish_reason === 'length' ? c.usage.completion_tokens === 24 : c.choices[0].finish_reason === 'stop',
        'completion finish reason');

  // n = 2 with a seed == two requests with seeds s and s+1 (sampled, not greedy)
  const p = { model: 'tiny', messages: [{ role: 'user', content: 'a story about a cat' }], max_tokens: 16,
              temperature: 1.0, top_p: 0.9 };
  const n2 = await client.chat.completions.create({ ...p, n: 2, seed: 7 });
  const s7 = await client.chat.completions.create({ ...p, seed: 7 });
  const s8 = await client.chat.completions.create({ ...p, seed: 8 });
  check(n2.choices.length === 2, 'n=2 gives two choices');
  check(n2.choices[0].message.content === s7.choices[0].message.content, 'n=2 choice 0 == seed 7');
  check(n2.choices[1].message.content === s8.choices[0].message.content, 'n=2 choice 1 == seed 8');
  const n2s = await streamText({ ...p, n: 2, seed: 7 }, true);
  check(n2s.text[0] === n2.choices[0].message.content && n2s.text[1] === n2.choices[1].message.content,
        'n=2 streamed == not streamed');

  // stop strings: the text ends right before the first occurrence
  const full = c.choices[0].text;
  let stop = '';
  for (let i = 2; i + 3 <= full.length && !stop; i++)
    if (/^[ -~]{3}$/.test(full.slice(i, i + 3))) stop = full.slice(i, i + 3); // printable ASCII, mid-text
  if (stop) {
    const cut = full.indexOf(stop);
    const st = await client.completions.create({ model: 'tiny', prompt: 'the little dog', max_tokens: 24, temperature: 0,
                                                 stop: ['never-there', stop] });
    check(st.choices[0].text === full.slice(0, cut), `stop: ${JSON.stringify(st.choices[0].text)} vs ${JSON.stringify(full.slice(0, cut))}`);
    check(st.choices[0].finish_reason === 'stop', 'stop finish reason');
    const sts = await streamText({ model: 'tiny', prompt: 'the little dog', max_tokens: 24, temperature: 0, stop }, false);
    check(sts.text[0] === full.slice(0, cut), 'stop streamed');
  } else {
    console.error('note: the stop-string check found no clean 3-byte slice');
  }

  // logprobs: one entry per generated token, greedy = the most likely one
  const lp = await client.chat.completions.create({ ...p, temperature: 0, logprobs: true, top_logprobs: 2 });
  const content = lp.choices[0].logprobs.content;
  check(content.length === lp.usage.completion_tokens, 'one logprob per token');
  check(content.every(e => e.logprob <= 0 && e.top_logprobs.length === 2 && Math.abs(e.top_logprobs[0].logprob - e.logprob) < 1e-6),
        'greedy tokens are the top-1 alternatives');
  const clp = await client.completions.create({ model: 'tiny', prompt: 'the little dog', max_tokens: 8, temperature: 0, logprobs: 1 });
  check(clp.choices[0].logprobs.tokens.length === clp.usage.completion_tokens &&
        clp.choices[0].logprobs.token_logprobs.every(x => x <= 0), 'completion logprobs: one per token');

  // errors surface as the client's typed errors
  try {
    await client.completions.create({ model: 'tiny', prompt: 'x', temperature: 9 });
    check(false, 'temperature 9 accepted');
  } catch (e) {
    check(e.status === 400 && /temperature/.test(e.message), 'bad temperature: ' + e.message);
  }
  const bad = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'wrong', maxRetries: 0 });
  try {
    await bad.models.list();
    check(false, 'wrong key accepted');
  } catch (e) {
    check(e.status === 401, 'wrong key: ' + e.status);
  }

  // tools: a forced call (constrained to the tool's schema), its result sent back, an answer
  const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 12 }, unit: { enum: ['C', 'F'] } },
                  required: ['city', 'unit'] } } }];
  const ajv = new Ajv();
  const argsOk = ajv.compile(tools[0].function.parameters);
  for (const stream of [false, true]) {
    const ask = [{ role: 'user', content: 'Weather in Paris?' }];
    const tp = { model: 'tiny', messages: ask, tools, tool_choice: 'required', max_tokens: 300, seed: 4 };
    let call, finish;
    if (!stream) {
      const r = await client.chat.completions.create(tp);
      call = r.choices[0].message.tool_calls && r.choices[0].message.tool_calls[0];
      finish = r.choices[0].finish_reason;
      check(r.choices[0].message.content === null, 'tool call: content null');
    } else {
      // the client's own accumulation of OpenAI's tool_call deltas
      const s = client.chat.completions.stream({ ...tp, stream: true });
      const done = await s.finalChatCompletion();
      call = done.choices[0].message.tool_calls && done.choices[0].message.tool_calls[0];
      finish = done.choices[0].finish_reason;
    }
    check(call && call.type === 'function' && call.function.name === 'get_weather' && /^call_/.test(call.id),
          `tool call (stream ${stream}): ${JSON.stringify(call)}`);
    check(finish === 'tool_calls', `finish_reason tool_calls (stream ${stream}): ${finish}`);
    let args = null;
    try { args = JSON.parse(call.function.arguments); } catch (e) { check(false, 'arguments are JSON: ' + call.function.arguments); }
    check(args && argsOk(args), `arguments valid: ${call && call.function.arguments} ${JSON.stringify(argsOk.errors)}`);
    const back = [...ask, { role: 'assistant', content: null, tool_calls: [call] },
                  { role: 'tool', tool_call_id: call.id, content: JSON.stringify({ temperature: 18, unit: 'C' }) }];
    const ans = stream ? await streamText({ model: 'tiny', messages: back, tools, max_tokens: 12, seed: 1 }, true)
                       : await client.chat.completions.create({ model: 'tiny', messages: back, tools, max_tokens: 12, seed: 1 });
    const text = stream ? ans.text[0] : ans.choices[0].message.content;
    check(typeof text === 'string', `answer after the tool result (stream ${stream}): ${JSON.stringify(text)}`);
  }
  // a named function; an unknown one is a 400
  const named = await client.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: 'x' }], tools,
    tool_choice: { type: 'function', function: { name: 'get_weather' } }, max_tokens: 300, seed: 5 });
  check(named.choices[0].message.tool_calls[0].function.name === 'get_weather', 'named tool_choice');
  try {
    await client.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: 'x' }], tools,
      tool_choice: { type: 'function', function: { name: 'nope' } } });
    check(false, 'unknown function accepted');
  } catch (e) {
    check(e.status === 400 && /nope/.test(e.message), 'unknown function: ' + e.message);
  }

  // response_format json_schema: the output parses and ajv validates it, streamed and not
  const schema = { type: 'object', properties: { name: { type: 'string', maxLength: 10 }, age: { type: 'integer' },
    tags: { type: 'array', items: { enum: ['a', 'b'] }, maxItems: 3 }, ok: { type: 'boolean' } },
    required: ['name', 'age', 'ok'], additionalProperties: false };
  const valid = ajv.compile(schema);
  for (const seed of [1, 2, 3]) {
    const rp = { model: 'tiny', messages: [{ role: 'user', content: 'a person' }], max_tokens: 400, seed,
                 response_format: { type: 'json_schema', json_schema: { name: 'person', strict: true, schema } } };
    const r = await client.chat.completions.create(rp);
    const rs = await streamText(rp, true);
    for (const [what, text] of [['whole', r.choices[0].message.content], ['streamed', rs.text[0]]]) {
      let v;
      try { v = JSON.parse(text); } catch (e) { check(false, `json_schema ${what} output is JSON: ${text}`); continue; }
      check(valid(v), `json_schema ${what} output valid: ${text} ${JSON.stringify(valid.errors)}`);
    }
  }
  try {
    await client.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: 'x' }],
      response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'string', pattern: '^(?=a)' } } } });
    check(false, 'lookahead pattern accepted');
  } catch (e) {
    check(e.status === 400 && /\/pattern/.test(e.message) && /lookahead/.test(e.message), 'unsupported pattern: ' + e.message);
  }
  // reasoning: a second server runs Qwen3's own template (argv[3]); a grammar (llama.cpp's
  // field, passed through by the client) makes the random model write a <think> block, which
  // comes back as reasoning_content, apart from content, whole and streamed
  if (process.argv[3]) {
    const q = new OpenAI({ baseURL: `http://127.0.0.1:${process.argv[3]}/v1`, apiKey: 'test-key', maxRetries: 0, timeout: 60000 });
    const rq = { model: 'tiny', messages: [{ role: 'user', content: 'hi' }], max_tokens: 60,
                 grammar: 'root ::= "<think>\\nplan\\n</think>\\n\\nhello"' };
    const r = await q.chat.completions.create(rq);
    check(r.choices[0].message.reasoning_content === 'plan\n' && r.choices[0].message.content === 'hello',
          'reasoning whole: ' + JSON.stringify(r.choices[0].message));
    let reasoning = '', content = '';
    for await (const chunk of await q.chat.completions.create({ ...rq, stream: true }))
      for (const c of chunk.choices) {
        reasoning += c.delta.reasoning_content || '';
        content += c.delta.content || '';
      }
    check(reasoning === 'plan\n' && content === 'hello', `reasoning streamed: '${reasoning}' / '${content}'`);
  }
  console.error(`openai client: ${checks - failures}/${checks} checks passed`);
  process.exit(failures ? 1 : 0);
}
main().catch(e => { console.error('FAIL: exception', e); process.exit(1); });
