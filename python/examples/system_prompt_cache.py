"""Save a long system prompt's KV cache once, then reload it instead of
recomputing it: the cost of a conversation's start becomes a file read.

    python3 system_prompt_cache.py [MODEL.gguf] [--file prompt.pkv] [--save-only | --load-only]

The first run (or --save-only) decodes the system prompt and writes its cache
with Context.save; a later run (--load-only, in another process if you like)
loads it into a new cache with Cache.load and goes on with a user turn. With a
chat template (any GGUF model that has one) the prompt is the template's
rendering of the system message; without one (the built-in model) plain text.
It checks its own result: the user turn's logits after loading equal those of a
context that computed everything from scratch, bit for bit.
"""
import argparse
import os
import tempfile
import time

import pagekv

SYSTEM = " ".join("Rule %d: answer briefly, cite the source, and never invent a number." % i for i in range(30))
USER = "What is the capital of France?"


def prompt_tokens(model):
    """(system tokens, system + user tokens); the first is a prefix of the second."""
    if model.chat_template:
        sys_only = model.tokenize_chat([{"role": "system", "content": SYSTEM}], add_generation_prompt=False)
        full = model.tokenize_chat([{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}])
        if full[:len(sys_only)] == sys_only:
            return sys_only, full
    sys_only = model.tokenize(SYSTEM)
    return sys_only, sys_only + model.tokenize(" " + USER, add_special=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?")
    ap.add_argument("--file", default=os.path.join(tempfile.gettempdir(), "pagekv-system-prompt.pkv"))
    ap.add_argument("--save-only", action="store_true")
    ap.add_argument("--load-only", action="store_true")
    a = ap.parse_args()

    with (pagekv.Model(a.model) if a.model else pagekv.Model.builtin()) as model:
        sys_toks, full = prompt_tokens(model)
        n_ctx = len(full) + 64
        if not a.load_only:
            with model.cache(n_ctx=n_ctx) as cache, cache.context(n_ctx) as ctx:
                t0 = time.perf_counter()
                ctx.decode(sys_toks)
                t1 = time.perf_counter()
                ctx.save(a.file)
                print("system prompt: %d tokens computed in %.3f s, saved to %s (%d bytes)"
                      % (len(sys_toks), t1 - t0, a.file, os.path.getsize(a.file)))
        if a.save_only:
            return
        with model.cache(n_ctx=n_ctx) as cache:  # a new cache, as a new process would have
            t0 = time.perf_counter()
            ctx = cache.load(a.file, n_ctx)
            t1 = time.perf_counter()
            assert ctx.tokens == sys_toks, "the file holds another prompt: run with --save-only first"
            ctx.decode(full[len(sys_toks):])
            print("loaded %d tokens in %.3f s, then computed the user turn's %d"
                  % (len(sys_toks), t1 - t0, len(full) - len(sys_toks)))
            answer = list(ctx.fork().generate(16, temp=0))
            print("answer: %r" % model.detokenize(answer))
            with cache.context(n_ctx) as scratch:
                scratch.decode(full)
                assert scratch.logits().tobytes() == ctx.logits().tobytes()
            print("ok: the loaded cache gives the logits of a from-scratch run")


if __name__ == "__main__":
    main()
