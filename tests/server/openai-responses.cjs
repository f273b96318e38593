// The official OpenAI Node client's Responses API (client.responses.*, openai 5.x
// and 6.x) against `pagekv serve`: a response whole and streamed (the stream's
// deltas and final response against the whole one), a function tool called
// (tool_choice required: constrained, so random weights still call validly),
// whole and streamed, and its output sent back through previous_response_id
// (continued from the stored conversation: cached_tokens covers the whole
// conversation so far), a second call and result in the same loop, retrieve and
// delete, and the SDK's errors for a response not found.
// usage: PKV_NODE_DIR=<dir with node_modules> node openai-responses.cjs PORT
'use strict';
const { createRequire } = require('module');
const path = require('path');
const req = createRequire(path.join(process.env.PKV_NODE_DIR || __dirname, 'x.js'));
const OpenAI = req('openai');

const port = process.argv[2];
const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'test-key', maxRetries: 0, timeout: 60000 });
let failures = 0, checks = 0;
function check(cond, what) {
  checks++;
  if (!cond) { failures++; console.error('FAIL:', what); }
}

// Every event of a streamed response; the final response and the text deltas.
async function streamed(params) {
  const events = [];
  for await (const ev of await client.responses.create({ ...params, stream: true })) events.push(ev);
  let text = '', args = '', final = null;
  for (const ev of events) {
    if (ev.type === 'response.output_text.delta') text += ev.delta;
    if (ev.type === 'response.function_call_arguments.delta') args += ev.delta;
    if (ev.type === 'response.completed' || ev.type === 'response.incomplete') final = ev.response;
  }
  return { events, text, args, final };
}

const tools = [{ type: 'function', name: 'get_weather', description: 'the weather in a city', strict: true,
                 parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 8 } },
                               required: ['city'], additionalProperties: false } }];

async function main() {
  // a response, whole
  const base = { model: 'tiny', input: 'hello there', instructions: 'be brief', max_output_tokens: 8, temperature: 0 };
  const r = await client.responses.create(base);
  check(r.object === 'response' && /^resp_/.test(r.id), 'object and id: ' + r.object + ' ' + r.id);
  check(typeof r.output_text === 'string' && r.output_text.length > 0, 'output_text (the SDK sums the message parts): ' + r.output_text);
  check(r.output[0].type === 'message' && r.output[0].content[0].type === 'output_text', 'message item');
  check(r.usage.total_tokens === r.usage.input_tokens + r.usage.output_tokens && r.usage.output_tokens <= 8, 'usage');
  check(r.instructions === 'be brief' && r.store === true, 'echoed fields');
  // streamed: the same answer, the events in order
  const s = await streamed(base);
  check(s.events[0].type === 'response.created' && s.events[1].type === 'response.in_progress', 'first events: ' +
        s.events.slice(0, 2).map(e => e.type));
  check(s.events.every((e, i) => e.sequence_number === i), 'sequence numbers 0..n-1');
  check(s.text === r.output_text, `stream text '${s.text}' vs whole '${r.output_text}'`);
  check(s.final && s.final.status === r.status && s.final.usage.output_tokens === r.usage.output_tokens &&
        JSON.stringify(s.final.output[0].content) === JSON.stringify(r.output[0].content), 'final streamed response');
  // a function tool, whole and streamed
  const call = { model: 'tiny', input: 'weather in Paris?', tools, tool_choice: 'required', max_output_tokens: 200,
                 temperature: 0 };
  const c = await client.responses.create(call);
  const fc = c.output.find(o => o.type === 'function_call');
  check(fc && fc.name === 'get_weather' && /^call_/.test(fc.call_id), 'function_call item: ' + JSON.stringify(c.output));
  let args = null;
  try { args = JSON.parse(fc.arguments); } catch (e) { }
  // (maxLength counts code points, String.length UTF-16 units)
  check(args && typeof args.city === 'string' && [...args.city].length <= 8, 'arguments follow the schema: ' + (fc && fc.arguments));
  const cs = await streamed(call);
  check(cs.args === fc.arguments, `streamed arguments '${cs.args}' vs '${fc.arguments}'`);
  check(cs.events.some(e => e.type === 'response.function_call_arguments.done' && e.arguments === fc.arguments),
        'function_call_arguments.done');
  // its result through previous_response_id: continued from the stored conversation
  const f = await client.responses.create({ model: 'tiny', previous_response_id: c.id, tools, max_output_tokens: 8,
    temperature: 0, input: [{ type: 'function_call_output', call_id: fc.call_id, output: '{"sky":"sunny"}' }] });
  check(f.previous_response_id === c.id, 'previous_response_id echoed');
  // the whole conversation so far is cached: the call as the model wrote it, even
  // where the template renders it otherwise (docs/server.md, "Stored responses")
  check(f.usage.input_tokens_details.cached_tokens >= c.usage.input_tokens + c.usage.output_tokens,
        `cached ${f.usage.input_tokens_details.cached_tokens} of the previous ${c.usage.input_tokens} + ` +
        `${c.usage.output_tokens}`);
  // and streamed, continuing the continued one
  // (an agent loop sends its tools with every turn: a template that renders them,
  // as Qwen3's, would otherwise render another system turn, and the turns are recut)
  const f2 = await streamed({ model: 'tiny', previous_response_id: f.id, input: 'thanks', tools, max_output_tokens: 4,
                              temperature: 0 });
  check(f2.final && f2.final.usage.input_tokens_details.cached_tokens >= f.usage.input_tokens + f.usage.output_tokens,
        'streamed follow-up cached: ' + JSON.stringify(f2.final && f2.final.usage));
  // a second round of the loop: a forced call again, its result, continued each time
  const g = await client.responses.create({ model: 'tiny', previous_response_id: f2.final.id, input: 'and in Rome?',
                                            tools, tool_choice: 'required', max_output_tokens: 200, temperature: 0 });
  const gc = g.output.find(o => o.type === 'function_call');
  check(gc && gc.name === 'get_weather', 'second call: ' + JSON.stringify(g.output));
  check(g.usage.input_tokens_details.cached_tokens >= f2.final.usage.input_tokens + f2.final.usage.output_tokens,
        'second call cached: ' + JSON.stringify(g.usage));
  if (gc) {
    const h = await client.responses.create({ model: 'tiny', previous_response_id: g.id, tools, max_output_tokens: 8,
      temperature: 0, input: [{ type: 'function_call_output', call_id: gc.call_id, output: '{"sky":"rain"}' }] });
    check(h.usage.input_tokens_details.cached_tokens >= g.usage.input_tokens + g.usage.output_tokens,
          'second result cached: ' + JSON.stringify(h.usage));
  }
  // retrieve, delete, and the errors
  const got = await client.responses.retrieve(c.id);
  check(got.id === c.id && got.output[0].call_id === fc.call_id, 'retrieve');
  await client.responses.delete(c.id);
  try {
    await client.responses.retrieve(c.id);
    check(false, 'deleted response retrieved');
  } catch (e) {
    check(e.status === 404, 'retrieve after delete: ' + e.status);
  }
  try {
    await client.responses.create({ model: 'tiny', input: 'x', previous_response_id: c.id });
    check(false, 'deleted previous_response_id accepted');
  } catch (e) {
    check(e.status === 400 && e.param === 'previous_response_id' && e.code === 'previous_response_not_found',
          `previous response not found: ${e.status} ${e.param} ${e.code} ${e.message}`);
  }
  try {
    await client.responses.create({ model: 'tiny', input: [{ type: 'item_reference', id: 'x' }] });
    check(false, 'item_reference accepted');
  } catch (e) {
    check(e.status === 400 && e.param === 'input[0].type', `unsupported item: ${e.status} ${e.param}`);
  }
  console.error(`openai responses: ${checks - failures}/${checks} checks passed`);
  process.exit(failures ? 1 : 0);
}
main().catch(e => { console.error('FAIL: exception', e); process.exit(1); });
