/* Fuzz harness: KV sequence files (pkv_kv_seq_load and pkv_context_load).
 *
 * Input: one flags byte, then the file image.
 *   bit 0  recompute the file's checksum before loading (when its size matches the
 *          header's token count), so mutations of tokens, positions, the
 *          fingerprint and the payload get past the checksum to the loader
 *   bit 1  load through pkv_context_load (which also re-decodes the last token)
 *          instead of pkv_kv_seq_load
 *   bit 2  keep a resident sequence of 5 tokens while loading (pages in use)
 *   bit 3  fail the n-th allocation of the load, n = the flags' high nibble + 1
 * Both loaders take paths; the harness uses their in-memory forms
 * (pkv_kv_seq_load_memory, pkv_context_load_memory), which the file loaders call.
 *
 * Checked: no crash, leak or undefined behaviour; a failed load changes nothing
 * (pool counts and live sequences as before; see stats_equal for the one
 * difference after a failed context load); a successful one holds exactly the
 * file's tokens and positions. The model and cache are made once
 * (fuzz_kv_model_params, fuzz_kv_cache_params) and reset after every input.
 * FUZZ_VERBOSE=1 in the environment prints the pool counts compared (for
 * reproducing a report). */
#include "fuzz-common.h"

#include "base/base.h"
#include "engine/engine.h"
#include "kv/kv-file.h"

#include <stdint.h>

static pkv_model *g_model;
static pkv_kv_cache *g_cache;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    pkv_log_set(NULL, NULL, PKV_LOG_NONE); /* bad input is expected: no log lines */
    pkv_mkmodel_params mp = fuzz_kv_model_params();
    void *img = NULL;
    size_t n = 0;
    if (pkv_mkmodel_memory(&mp, &img, &n)) {
        fprintf(stderr, "fuzz-kvfile: mkmodel: %s\n", pkv_errmsg());
        abort();
    }
    g_model = pkv_model_load_memory(img, n, "fuzz-kv-model", fuzz_model_params());
    pkv_mkmodel_free_memory(img);
    g_cache = g_model ? pkv_model_cache_create(g_model, fuzz_kv_cache_params()) : NULL;
    if (!g_cache) {
        fprintf(stderr, "fuzz-kvfile: model/cache: %s\n", pkv_errmsg());
        abort();
    }
    return 0;
}

static uint64_t rd64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* Rewrite the trailing checksum as the loader computes it, when the size fits the
 * token count in the header (the format is in src/kv/kv-file.c). */
static void fix_checksum(uint8_t *f, size_t size) {
    const pkv_kv_layout *l = pkv_kv_cache_layout(g_cache);
    int nl = pkv_kv_layout_n_layers(l);
    size_t h0 = 8 + 16 + 8 + (size_t)nl * 16;
    if (size < h0 + 24 + 8) return;
    uint64_t n = rd64(f + h0);
    if (n > size / 8) return;
    size_t hb = h0 + 24 + (size_t)n * 8, want = hb + 8;
    size_t sec[2 * 64];
    if (nl > 64) return;
    for (int il = 0; il < nl; il++) {
        pkv_kv_layer_info li;
        if (pkv_kv_layout_layer(l, il, &li)) return;
        /* a token's row: each head's elements (or blocks of 32 for quantized pages) */
        sec[2 * il] = (size_t)n * (size_t)li.n_kv_heads * pkv_type_row_bytes(li.dtype_k, (size_t)li.head_dim_k);
        sec[2 * il + 1] = (size_t)n * (size_t)li.n_kv_heads * pkv_type_row_bytes(li.dtype_v, (size_t)li.head_dim_v);
        want += sec[2 * il] + sec[2 * il + 1];
    }
    if (want != size) return;
    uint64_t h = pkv_hash64(f, hb, 0);
    size_t off = hb;
    for (int i = 0; i < 2 * nl; i++) {
        h = pkv_hash64(f + off, sec[i], h);
        off += sec[i];
    }
    memcpy(f + off, &h, 8);
}

/* strict: pkv_kv_seq_load changes nothing on error. A failed pkv_context_load
 * (the decode of the last token failed) frees the loaded sequence like any
 * context, and its full pages stay cached for prefix reuse as after any free:
 * free + cached pages are then unchanged, not each count. */
static void stats_equal(const pkv_kv_stats *a, const pkv_kv_stats *b, bool strict) {
    if (getenv("FUZZ_VERBOSE"))
        fprintf(stderr, "free %lld/%lld cached %lld/%lld used %lld/%lld seqs %d/%d\n", (long long)a->pages_free,
                (long long)b->pages_free, (long long)a->pages_cached, (long long)b->pages_cached,
                (long long)a->pages_used, (long long)b->pages_used, a->n_seqs, b->n_seqs);
    if (strict) {
        FUZZ_CHECK(a->pages_free == b->pages_free);
        FUZZ_CHECK(a->pages_cached == b->pages_cached);
    }
    FUZZ_CHECK(a->pages_free + a->pages_cached == b->pages_free + b->pages_cached);
    FUZZ_CHECK(a->pages_used == b->pages_used);
    FUZZ_CHECK(a->n_seqs == b->n_seqs);
}

/* The loaded sequence holds the file's tokens and positions. */
static void check_content(int32_t seq, const uint8_t *f, size_t size) {
    const pkv_kv_layout *l = pkv_kv_cache_layout(g_cache);
    size_t h0 = 8 + 16 + 8 + (size_t)pkv_kv_layout_n_layers(l) * 16;
    FUZZ_CHECK(size >= h0 + 24);
    uint64_t n = rd64(f + h0);
    int64_t len = pkv_kv_seq_len(g_cache, seq);
    FUZZ_CHECK(len >= 0 && (uint64_t)len == n);
    if (len == 0) return;
    int32_t *tok = malloc((size_t)len * 4), *pos = malloc((size_t)len * 4);
    FUZZ_CHECK(tok && pos);
    FUZZ_CHECK(pkv_kv_seq_tokens(g_cache, seq, 0, len, tok, pos) == PKV_OK);
    const uint8_t *ft = f + h0 + 24, *fp = ft + n * 4;
    FUZZ_CHECK(memcmp(tok, ft, (size_t)len * 4) == 0);
    FUZZ_CHECK(memcmp(pos, fp, (size_t)len * 4) == 0);
    free(tok);
    free(pos);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t flags = data[0];
    size_t fsize = size - 1;
    uint8_t *f = malloc(fsize ? fsize : 1);
    FUZZ_CHECK(f);
    memcpy(f, data + 1, fsize);
    if (flags & 1) fix_checksum(f, fsize);

    pkv_context *busy = NULL;
    if (flags & 4) {
        busy = pkv_context_create(g_model, g_cache, 0);
        const int32_t toks[5] = {1, 2, 3, 4, 5};
        FUZZ_CHECK(busy && pkv_context_decode(busy, toks, 5) == PKV_OK);
    }
    pkv_kv_stats before, after;
    pkv_kv_stats_get(g_cache, &before);
    int64_t live0 = pkv_alloc_live();
    if (flags & 8) pkv_alloc_fail_at((uint64_t)(flags >> 4) + 1);

    if (flags & 2) {
        pkv_context *ctx = pkv_context_load_memory(g_model, g_cache, "fuzz-input", f, fsize, 0);
        pkv_alloc_fail_at(0);
        if (ctx) {
            /* the last token was truncated and decoded again: the file's tokens */
            check_content(pkv_context_seq(ctx), f, fsize);
            FUZZ_CHECK(pkv_context_logits(ctx) != NULL || pkv_context_n_tokens(ctx) == 0);
            pkv_context_free(ctx);
        } else {
            pkv_kv_stats_get(g_cache, &after);
            stats_equal(&before, &after, false);
            FUZZ_CHECK(pkv_alloc_live() == live0);
        }
    } else {
        int32_t seq = -1;
        pkv_status st = pkv_kv_seq_load_memory(g_cache, "fuzz-input", f, fsize, 0, &seq);
        pkv_alloc_fail_at(0);
        if (st == PKV_OK) {
            check_content(seq, f, fsize);
            FUZZ_CHECK(pkv_kv_seq_free(g_cache, seq) == PKV_OK);
        } else {
            FUZZ_CHECK(seq == -1);
            pkv_kv_stats_get(g_cache, &after);
            stats_equal(&before, &after, true);
            FUZZ_CHECK(pkv_alloc_live() == live0);
        }
    }
    pkv_context_free(busy);
    FUZZ_CHECK(pkv_kv_clear(g_cache) == PKV_OK);
    free(f);
    return 0;
}
