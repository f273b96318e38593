// The Responses API (POST /v1/responses) through three SDKs with zod 4 schemas,
// against `pagekv serve` (tests/test-server-sdk-responses.c starts it): the
// official `openai` client (responses.parse with zodTextFormat; a
// zodResponsesFunction tool with tool_choice required, whole and streamed), the
// Vercel AI SDK's Responses provider (@ai-sdk/openai's createOpenAI().responses():
// generateObject, streamObject, generateText and streamText with a required zod
// tool) and LangChain JS (@langchain/openai's ChatOpenAI with useResponsesApi:
// withStructuredOutput by json_schema, streamed and not, and by function calling;
// bindTools with a named tool_choice, streamed and not). The zod corpus
// is sdk-schema.cjs's (sdk-zod.cjs): integers, strings with formats and patterns,
// tuples, records, enums, nullables, nested objects. Each request body is captured
// as it leaves, every output is validated by ajv (+ ajv-formats) against the
// schema the SDK sent, and the SDK's own parse (zod) must succeed.
// usage: PKV_NODE_DIR=<dir with node_modules> node sdk-responses.cjs PORT
'use strict';
const { req, check, summary, spyFetch, lastBody, validate, person, Weather, MAX, ask } = require('./sdk-zod.cjs');
const OpenAI = req('openai');
const { zodTextFormat, zodResponsesFunction } = req('openai/helpers/zod');
const ai = req('ai');
const { createOpenAI } = req('@ai-sdk/openai');
const { ChatOpenAI } = req('@langchain/openai');

const port = process.argv[2];
const baseURL = `http://127.0.0.1:${port}/v1`;
const debug = !!process.env.PKV_SDK_DEBUG;

// the schema of the one function tool a Responses body carries, checked by name
function sentTool(body, name) {
  const t = body && body.tools && body.tools.find(x => x.type === 'function' && x.name === name);
  check(t && t.parameters, `${name} sent as a Responses function tool: ${JSON.stringify(body && body.tools).slice(0, 300)}`);
  return t && t.parameters;
}

async function openaiSdk() {
  const client = new OpenAI({ baseURL, apiKey: 'test-key', maxRetries: 0, timeout: 120000, fetch: spyFetch });
  for (const seed of [1, 2]) {
    const r = await client.responses.parse({ model: 'tiny', input: ask, seed, temperature: 1, max_output_tokens: MAX,
                                             text: { format: zodTextFormat(person(true), 'person') } });
    check(r.status === 'completed', `openai responses.parse status ${r.status}`);
    check(r.output_parsed && typeof r.output_parsed === 'object', 'openai responses.parse: zod parsed ' + r.output_text);
    const body = lastBody();
    check(body.text.format.type === 'json_schema' && body.text.format.name === 'person', 'openai sent text.format');
    validate(`openai text.format seed ${seed}`, body.text.format.schema, JSON.parse(r.output_text));
  }
  // a zod function tool, tool_choice required, whole and streamed
  for (const stream of [false, true]) {
    const tool = zodResponsesFunction({ name: 'get_weather', parameters: Weather });
    const p = { model: 'tiny', input: 'Weather in Paris?', seed: 3, temperature: 1, max_output_tokens: MAX,
                tools: [tool], tool_choice: 'required' };
    const r = stream ? await client.responses.stream(p).finalResponse() : await client.responses.parse(p);
    const call = r.output.find(o => o.type === 'function_call');
    check(call && call.name === 'get_weather' && /^call_/.test(call.call_id),
          `openai function_call (stream ${stream}): ${JSON.stringify(r.output)}`);
    if (!call) continue;
    // openai 6.30's finalResponse() parses tool calls only when text.format is a zod
    // one, so the stream's arguments go through the tool's own zod parser
    if (!stream) check(call.parsed_arguments && typeof call.parsed_arguments === 'object', 'openai parsed_arguments');
    let parsed = null;
    try { parsed = tool.$parseRaw(call.arguments); } catch (e) { }
    check(parsed && typeof parsed.days === 'number', `openai zod parse of the arguments (stream ${stream}): ${call.arguments}`);
    validate(`openai tool (stream ${stream})`, sentTool(lastBody(), 'get_weather'), JSON.parse(call.arguments));
  }
}

async function aiSdk() {
  // OpenAI's Responses API has no seed, so the provider drops it; the fetch adds
  // pagekv's seed extension to keep the run reproducible
  let seed = 0;
  const seeded = (url, init) => spyFetch(url, { ...init, body: JSON.stringify({ ...JSON.parse(init.body), seed }) });
  const model = createOpenAI({ baseURL, apiKey: 'test-key', fetch: seeded }).responses('tiny');
  for (seed of [4, 5]) {
    const r = await ai.generateObject({ model, schema: person(false), prompt: ask, temperature: 1,
                                        maxOutputTokens: MAX, maxRetries: 0 });
    check(r.object && typeof r.object === 'object', 'ai generateObject: zod parsed');
    check(r.finishReason === 'stop', 'ai generateObject finish ' + r.finishReason);
    const body = lastBody();
    const fm = body.text && body.text.format;
    check(fm && fm.type === 'json_schema', 'ai sent text.format json_schema: ' + JSON.stringify(body.text));
    if (fm) validate(`ai generateObject seed ${seed}`, fm.schema, r.object);
  }
  // streamed: streamObject's promises settle once its stream is read
  seed = 6;
  const so = ai.streamObject({ model, schema: person(false), prompt: ask, temperature: 1, maxOutputTokens: MAX,
                               maxRetries: 0 });
  for await (const _ of so.partialObjectStream);
  const obj = await so.object;
  check(obj && typeof obj === 'object' && lastBody().stream === true, 'ai streamObject: zod parsed, streamed');
  if (obj) validate('ai streamObject', lastBody().text.format.schema, obj);
  for (const stream of [false, true]) {
    seed = 7;
    const p = { model, prompt: 'Weather in Paris?', temperature: 1, maxOutputTokens: MAX, maxRetries: 0,
                toolChoice: 'required',
                tools: { get_weather: ai.tool({ description: 'Weather in a city', inputSchema: Weather }) } };
    let calls;
    if (stream) {
      const st = ai.streamText(p);
      for await (const _ of st.fullStream);
      calls = await st.toolCalls;
    } else {
      calls = (await ai.generateText(p)).toolCalls;
    }
    const call = calls && calls[0];
    check(call && call.toolName === 'get_weather' && !call.invalid, `ai tool call (stream ${stream}): ${JSON.stringify(calls)}`);
    check(lastBody().tool_choice === 'required' && !!lastBody().stream === stream,
          'ai sent tool_choice required: ' + JSON.stringify(lastBody().tool_choice));
    if (call) validate(`ai tool (stream ${stream})`, sentTool(lastBody(), 'get_weather'), call.input);
  }
}

async function langchain() {
  const llm = (streaming = false) => new ChatOpenAI({ model: 'tiny', apiKey: 'test-key', temperature: 1, maxTokens: MAX,
    maxRetries: 0, streaming, useResponsesApi: true, configuration: { baseURL, fetch: spyFetch },
    modelKwargs: { seed: 8 } });
  for (const [method, streaming] of [['jsonSchema', false], ['functionCalling', false], ['jsonSchema', true]]) {
    const out = await llm(streaming).withStructuredOutput(person(false), { name: 'person', method }).invoke(ask);
    check(out && typeof out === 'object', `langchain ${method}: zod parsed`);
    const body = lastBody();
    check(Array.isArray(body.input) && !!body.stream === streaming,
          `langchain ${method} used /v1/responses (stream ${streaming}): ${JSON.stringify(body).slice(0, 200)}`);
    const schema = method === 'jsonSchema' ? body.text && body.text.format && body.text.format.schema
                                           : sentTool(body, 'person');
    check(schema && (method === 'jsonSchema' || body.tool_choice), `langchain ${method} sent: ${JSON.stringify(body).slice(0, 300)}`);
    if (schema) validate(`langchain ${method}`, schema, out);
  }
  // a tool named: @langchain/openai 1.3 drops a string tool_choice ("required",
  // "auto") on its Responses path and sends only a named one
  for (const streaming of [false, true]) {
    const bound = llm(streaming).bindTools([{ name: 'get_weather', description: 'Weather in a city', schema: Weather }],
                                           { tool_choice: 'get_weather' });
    let m;
    if (streaming) for await (const ch of await bound.stream('Weather in Paris?')) m = m ? m.concat(ch) : ch;
    else m = await bound.invoke('Weather in Paris?');
    const call = m && m.tool_calls && m.tool_calls[0];
    check(call && call.name === 'get_weather', `langchain bindTools call (stream ${streaming}): ${JSON.stringify(m && m.tool_calls)}`);
    const tc = lastBody().tool_choice;
    check(tc && tc.type === 'function' && tc.name === 'get_weather' && !!lastBody().stream === streaming,
          'langchain sent tool_choice: ' + JSON.stringify(tc));
    if (call) {
      check(Weather.safeParse(call.args).success, 'langchain tool args parse with zod: ' + JSON.stringify(call.args));
      validate(`langchain bindTools (stream ${streaming})`, sentTool(lastBody(), 'get_weather'), call.args);
    }
  }
}

async function main() {
  const t0 = Date.now();
  for (const [name, f] of [['openai', openaiSdk], ['ai', aiSdk], ['langchain', langchain]]) {
    try { await f(); } catch (e) { check(false, `${name}: exception ${e.stack || e}`); }
    console.error(`${name}: done at ${((Date.now() - t0) / 1000).toFixed(1)} s`);
    if (debug) console.error(JSON.stringify(lastBody()).slice(0, 2000));
  }
  process.exit(summary('sdk responses'));
}
main().catch(e => { console.error('FAIL: exception', e); process.exit(1); });
