/* Shared by the fuzz harnesses (fuzz/fuzz-*.c) and the seed writer (fuzz/seeds.c):
 * the fixed model and cache the sequence-file harness loads into, so the seeds
 * it is given match its geometry, and a small failure helper.
 *
 * A harness reports a broken property with FUZZ_CHECK: it prints the condition
 * and aborts, which libFuzzer saves as a crash like any sanitizer report. */
#ifndef PKV_FUZZ_COMMON_H
#define PKV_FUZZ_COMMON_H

#include "pagekv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_CHECK(cond)                                                                         \
    do {                                                                                         \
        if (!(cond)) {                                                                           \
            fprintf(stderr, "%s:%d: FUZZ_CHECK failed: %s (last message: %s)\n", __FILE__,      \
                    __LINE__, #cond, pkv_errmsg());                                              \
            abort();                                                                             \
        }                                                                                        \
    } while (0)

/* The sequence-file harness's model: 2 layers of 2 KV heads of 8 (f32 weights, a
 * 300-token vocabulary), small enough to decode thousands of times a second. */
static inline pkv_mkmodel_params fuzz_kv_model_params(void) {
    pkv_mkmodel_params p = pkv_mkmodel_default_params();
    p.arch = "qwen3";
    p.type = PKV_TYPE_F32;
    p.n_layer = 2;
    p.n_embd = 32;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.head_dim = 8;
    p.n_ff = 64;
    p.n_vocab = 300;
    p.n_ctx = 256;
    p.seed = 7;
    return p;
}

/* The model with sliding-window layers for window-pool files (format version 2):
 * gemma2, window 4 on its even layers. */
static inline pkv_mkmodel_params fuzz_kv_window_model_params(void) {
    pkv_mkmodel_params p = fuzz_kv_model_params();
    p.arch = "gemma2";
    p.sliding_window = 4;
    return p;
}

/* Its cache: pages of 4 tokens, 2 x 16 pages (f16 KV). */
static inline pkv_cache_params fuzz_kv_cache_params(void) {
    pkv_cache_params p = pkv_cache_default_params();
    p.n_ctx = 64;
    p.n_seq_max = 2;
    p.page_size = 4;
    p.kv_type = PKV_TYPE_F16;
    return p;
}

static inline pkv_model_params fuzz_model_params(void) {
    pkv_model_params p = pkv_model_default_params();
    p.n_threads = 1;
    return p;
}

#endif
