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

/* The cache of recurrent-state files (format version 3), made without a model on
 * `dev`: an attention layer (2 KV heads of 8, f16), a recurrent layer (2 heads x 6
 * floats of state) and another attention layer; pages of 4 tokens, 32 pages, 8
 * state slots. */
static inline pkv_kv_params fuzz_kv_state_params(pkv_device *dev) {
    static pkv_kv_layer_desc L[3];
    memset(L, 0, sizeof L);
    L[0].n_kv_heads = L[2].n_kv_heads = 2;
    L[0].head_dim_k = L[0].head_dim_v = L[2].head_dim_k = L[2].head_dim_v = 8;
    L[0].dtype_k = L[0].dtype_v = L[2].dtype_k = L[2].dtype_v = PKV_TYPE_F16;
    L[1].n_kv_heads = 2;
    L[1].state_per_head = 6;
    pkv_kv_params p = pkv_kv_default_params();
    p.n_layers = 3;
    p.layers = L;
    p.device = dev;
    p.page_size = 4;
    p.n_pages = 32;
    p.host_pages = 32;
    p.state_slots = 8;
    p.state_ckpt_max = 2;
    return p;
}

static inline pkv_model_params fuzz_model_params(void) {
    pkv_model_params p = pkv_model_default_params();
    p.n_threads = 1;
    return p;
}

#endif
