#!/usr/bin/env node
// Side-by-side measurement against llama.cpp's CPU backend on the same GGUF file,
// with llama.cpp's prebuilt libraries: the script behind the 2026-11-23 table in
// docs/BENCHMARKS.md, and a check that needs no compiler. For new comparisons use
// tools/bench-llamacpp.sh (docs/BENCHMARKS.md, "Against llama.cpp"), which builds
// llama.cpp from node-llama-cpp's source and runs llama-bench and llama-batched-bench.
// Not part of pagekv's build or tests and installed by nothing here: the npm
// registry carries prebuilt llama.cpp CPU libraries in node-llama-cpp's platform
// package (the same ggml CPU variants llama.cpp ships, including one for Sapphire
// Rapids with AMX). To run:
//
//   mkdir /tmp/nlc && cd /tmp/nlc && echo '{"type":"module"}' > package.json
//   npm install node-llama-cpp@3.22.1 --ignore-scripts
//   cp /path/to/pagekv/tools/llamacpp-side-by-side.mjs . && node llamacpp-side-by-side.mjs M.gguf 512 64 2
//
// It prefills N prompt tokens (ids spread over the vocabulary, one batch of up to
// 512), then decodes D tokens greedily, twice (a fresh context each round), and
// prints one JSON line per round: prefill and decode tokens/s as pagekv's
// `bench model` reports them (wall time of the whole prompt; wall time of the
// decoded tokens). NLC_LOG=debug shows llama.cpp's log (which CPU variant it
// loaded, which tensors went to its AMX buffer).
// usage: node llamacpp-side-by-side.mjs MODEL.gguf [N_PROMPT=512] [N_DECODE=64] [THREADS=2]
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

const [modelPath, nPrompt = "512", nDecode = "64", threads = "2"] = process.argv.slice(2);
if (!modelPath) {
  console.error("usage: node llamacpp-side-by-side.mjs MODEL.gguf [N_PROMPT] [N_DECODE] [THREADS]");
  process.exit(2);
}
const llama = await getLlama({
  gpu: false,
  build: "never",
  logLevel: process.env.NLC_LOG === "debug" ? LlamaLogLevel.debug : LlamaLogLevel.warn,
});
const model = await llama.loadModel({modelPath, gpuLayers: 0});
const vocab = model.tokens.length ?? 32000;
for (let round = 0; round < 2; round++) {
  const ctx = await model.createContext({contextSize: Number(nPrompt) + Number(nDecode) + 16, batchSize: 512,
                                         threads: Number(threads)});
  const seq = ctx.getSequence();
  const toks = Array.from({length: Number(nPrompt)}, (_, i) => 100 + (i * 7919) % Math.max(1, vocab - 200));
  const t0 = performance.now();
  await seq.evaluateWithoutGeneratingNewTokens(toks);
  const t1 = performance.now();
  let n = 0;
  const t2 = performance.now();
  for await (const tok of seq.evaluate([toks[0]], {temperature: 0})) {
    void tok;
    if (++n >= Number(nDecode)) break;
  }
  const t3 = performance.now();
  console.log(JSON.stringify({engine: "llama.cpp (node-llama-cpp 3.22.1)", model: modelPath, round,
                              threads: Number(threads), prefill_tokens: Number(nPrompt),
                              prefill_tok_s: +(Number(nPrompt) / ((t1 - t0) / 1000)).toFixed(2),
                              decode_tokens: n, decode_tok_s: +(n / ((t3 - t2) / 1000)).toFixed(2)}));
  await ctx.dispose();
}
