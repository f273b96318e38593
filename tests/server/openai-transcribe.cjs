// The official OpenAI Node client's audio.transcriptions.create against
// `pagekv serve --mmproj` (tests/test-server-transcribe.c starts the server and
// computes the reference texts with the C API alone):
//   - a 16 kHz WAV and a 44.1 kHz stereo WAV, language en, temperature 0: the
//     text equals the reference byte for byte (response_format json), and
//     response_format text gives the same text and a newline (16 kHz file);
//   - usage: input tokens = text tokens + audio rows, audio rows > 0;
//   - bad uploads: a PNG as the file (400, the decoder's message), a file over
//     --max-media-bytes (413), response_format srt (400), language 'english' (400),
//     no file (400).
// usage: PKV_NODE_DIR=<dir with node_modules> node openai-transcribe.cjs PORT WAV16 REF16 WAV44 REF44 PNG BIG
'use strict';
const { createRequire } = require('module');
const fs = require('fs');
const path = require('path');
const req = createRequire(path.join(process.env.PKV_NODE_DIR || __dirname, 'x.js'));
const OpenAI = req('openai');
const { toFile } = OpenAI;

const [port, wav16, ref16, wav44, ref44, png, big] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'test-key', maxRetries: 0, timeout: 120000 });
let failures = 0, checks = 0;
function check(cond, what) {
  checks++;
  if (!cond) { failures++; console.error('FAIL:', what); }
}

async function file(p, name, type) {
  return toFile(fs.readFileSync(p), name, { type });
}

async function expectError(params, status, text, what) {
  try {
    await client.audio.transcriptions.create(params);
    check(false, `${what}: no error`);
  } catch (e) {
    check(e instanceof OpenAI.APIError && e.status === status, `${what}: status ${e.status}, want ${status} (${e.message})`);
    check(String(e.message).includes(text), `${what}: message '${e.message}' lacks '${text}'`);
  }
}

async function main() {
  for (const [wav, ref] of [[wav16, ref16], [wav44, ref44]]) {
    const want = fs.readFileSync(ref, 'utf8').trim();
    const r = await client.audio.transcriptions.create({
      file: await file(wav, path.basename(wav), 'audio/wav'), model: 'voxtral', language: 'en', temperature: 0,
      response_format: 'json' });
    check(r.text === want, `${path.basename(wav)}: json text ${JSON.stringify(r.text)} != reference ${JSON.stringify(want)}`);
    check(r.usage && r.usage.type === 'tokens' && r.usage.input_token_details.audio_tokens > 0 &&
          r.usage.input_tokens === r.usage.input_token_details.text_tokens + r.usage.input_token_details.audio_tokens &&
          r.usage.total_tokens === r.usage.input_tokens + r.usage.output_tokens,
          `${path.basename(wav)}: usage ${JSON.stringify(r.usage)}`);
    if (wav !== wav16) continue; // (each request encodes its audio again: one text-format request is enough)
    const t = await client.audio.transcriptions.create({
      file: await file(wav, 'a.wav', 'audio/wav'), model: 'voxtral', language: 'en', response_format: 'text' });
    check(t === want + '\n', `${path.basename(wav)}: text format ${JSON.stringify(t)} != ${JSON.stringify(want + '\n')}`);
  }
  await expectError({ file: await file(png, 'a.png', 'image/png'), model: 'voxtral' }, 400, 'not a WAV, FLAC or Ogg file',
                    'a PNG uploaded as audio');
  await expectError({ file: await file(big, 'big.wav', 'audio/wav'), model: 'voxtral' }, 413, '--max-media-bytes',
                    'a file over --max-media-bytes');
  await expectError({ file: await file(wav16, 'a.wav', 'audio/wav'), model: 'voxtral', response_format: 'srt' }, 400,
                    "response_format 'srt' is not supported", 'response_format srt');
  await expectError({ file: await file(wav16, 'a.wav', 'audio/wav'), model: 'voxtral', language: 'english' }, 400,
                    'ISO-639-1', 'a bad language');
  await expectError({ model: 'voxtral' }, 400, "no 'file' field", 'no file');
  console.error(`openai-transcribe: ${checks - failures} of ${checks} checks passed`);
  process.exit(failures ? 1 : 0);
}

main().catch((e) => { console.error('FAIL:', e); process.exit(1); });
