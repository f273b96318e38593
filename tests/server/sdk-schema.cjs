// Structured output and forced tool calls through three SDKs against `pagekv serve`
// (tests/test-server-sdk-schema.c starts it): the official `openai` client with zod 4
// (zodResponseFormat, zodFunction), the Vercel AI SDK (`ai` with
// @ai-sdk/openai-compatible: generateObject, generateText with a required tool) and
// LangChain JS (@langchain/openai: withStructuredOutput, by json_schema and by
// function calling). The schemas use what zod writes for common types: integers
// (.int(), .positive()), strings with .email() .uuid() .url() .datetime() .regex(),
// tuples, records, enums, optionals, nullables, nested objects. Each request body is
// captured on its way out, and every output is validated by ajv (+ ajv-formats)
// against the schema the SDK actually sent, and parsed by the SDK itself (zod).
// The model has random weights: the text is gibberish, but it must be schema-valid.
// usage: PKV_NODE_DIR=<dir with node_modules> node sdk-schema.cjs PORT
'use strict';
const { req, check, summary, spyFetch, lastBody, validate, person, Weather, MAX, ask } = require('./sdk-zod.cjs');
const OpenAI = req('openai');
const { zodResponseFormat, zodFunction } = req('openai/helpers/zod');
const ai = req('ai');
const { createOpenAICompatible } = req('@ai-sdk/openai-compatible');
const { ChatOpenAI } = req('@langchain/openai');

const port = process.argv[2];
const baseURL = `http://127.0.0.1:${port}/v1`;

async function openaiSdk() {
  const client = new OpenAI({ baseURL, apiKey: 'test-key', maxRetries: 0, timeout: 120000, fetch: spyFetch });
  for (const seed of [1, 2]) {
    const r = await client.chat.completions.parse({ model: 'tiny', messages: [{ role: 'user', content: ask }], seed,
      temperature: 1, max_tokens: MAX, response_format: zodResponseFormat(person(true), 'person') });
    const m = r.choices[0].message;
    check(r.choices[0].finish_reason === 'stop', `openai parse finish ${r.choices[0].finish_reason}`);
    if (process.env.PKV_SDK_DEBUG) console.error('openai completion_tokens', r.usage.completion_tokens);
    check(m.parsed && typeof m.parsed === 'object', 'openai parse: zod parsed ' + m.content);
    validate(`openai response_format seed ${seed}`, lastBody().response_format.json_schema.schema, JSON.parse(m.content));
  }
  // forced tool call with a zod function, streamed and not
  for (const stream of [false, true]) {
    const p = { model: 'tiny', messages: [{ role: 'user', content: 'Weather in Paris?' }], seed: 3, temperature: 1,
                max_tokens: MAX, tools: [zodFunction({ name: 'get_weather', parameters: Weather })], tool_choice: 'required' };
    let msg;
    if (stream) msg = (await client.chat.completions.stream({ ...p, stream: true }).finalChatCompletion()).choices[0].message;
    else msg = (await client.chat.completions.parse(p)).choices[0].message;
    const call = msg.tool_calls && msg.tool_calls[0];
    check(call && call.function.name === 'get_weather', `openai tool call (stream ${stream}): ${JSON.stringify(msg)}`);
    if (!call) continue;
    if (!stream) check(call.function.parsed_arguments && typeof call.function.parsed_arguments === 'object', 'openai zod parsed arguments');
    validate(`openai tool (stream ${stream})`, lastBody().tools[0].function.parameters, JSON.parse(call.function.arguments));
  }
}

async function aiSdk() {
  const provider = createOpenAICompatible({ name: 'pagekv', baseURL, apiKey: 'test-key', fetch: spyFetch,
                                            supportsStructuredOutputs: true });
  const model = provider.chatModel('tiny');
  for (const seed of [4, 5]) {
    const r = await ai.generateObject({ model, schema: person(false), prompt: ask, seed, temperature: 1,
                                        maxOutputTokens: MAX, maxRetries: 0 });
    check(r.object && typeof r.object === 'object', 'ai generateObject: zod parsed');
    check(r.finishReason === 'stop', 'ai generateObject finish ' + r.finishReason);
    if (process.env.PKV_SDK_DEBUG) console.error('ai completion_tokens', r.usage.outputTokens);
    const body = lastBody();
    check(body.response_format && body.response_format.type === 'json_schema', 'ai sent json_schema: ' + JSON.stringify(body.response_format));
    validate(`ai generateObject seed ${seed}`, body.response_format.json_schema.schema, r.object);
  }
  const r = await ai.generateText({ model, prompt: 'Weather in Paris?', seed: 6, temperature: 1, maxOutputTokens: MAX,
    maxRetries: 0, toolChoice: 'required',
    tools: { get_weather: ai.tool({ description: 'Weather in a city', inputSchema: Weather }) } });
  const call = r.toolCalls && r.toolCalls[0];
  check(call && call.toolName === 'get_weather' && !call.invalid, 'ai tool call: ' + JSON.stringify(r.toolCalls));
  if (call) validate('ai tool', lastBody().tools[0].function.parameters, call.input);
}

async function langchain() {
  for (const method of ['jsonSchema', 'functionCalling']) {
    const llm = new ChatOpenAI({ model: 'tiny', apiKey: 'test-key', temperature: 1, maxTokens: MAX, maxRetries: 0,
                                 configuration: { baseURL, fetch: spyFetch }, modelKwargs: { seed: 7 } });
    const out = await llm.withStructuredOutput(person(false), { name: 'person', method }).invoke(ask);
    check(out && typeof out === 'object', `langchain ${method}: zod parsed`);
    const body = lastBody();
    const schema = method === 'jsonSchema' ? body.response_format && body.response_format.json_schema.schema
                                           : body.tools && body.tools[0].function.parameters;
    check(schema && (method === 'jsonSchema' || body.tool_choice), `langchain ${method} sent: ${JSON.stringify(body).slice(0, 300)}`);
    if (schema) validate(`langchain ${method}`, schema, out);
  }
}

async function main() {
  const t0 = Date.now();
  for (const [name, f] of [['openai', openaiSdk], ['ai', aiSdk], ['langchain', langchain]]) {
    try { await f(); } catch (e) { check(false, `${name}: exception ${e.stack || e}`); }
    console.error(`${name}: done at ${((Date.now() - t0) / 1000).toFixed(1)} s`);
  }
  process.exit(summary('sdk schema'));
}
main().catch(e => { console.error('FAIL: exception', e); process.exit(1); });
