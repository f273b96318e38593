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
 * A file of format version 2 (bytes 8..11) goes to a second model and cache with
 * sliding-window layers (a gemma2 whose window pool releases pages), whose files
 * carry the window layers' token range; version 3 to a cache with a recurrent
 * layer (fuzz_kv_state_params, no model: bit 1 loads with pkv_kv_seq_load, bit 2
 * appends the busy sequence directly), whose files carry the live state; every
 * other input to the first.
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

static pkv_model *g_model, *g_model_w;
static pkv_kv_cache *g_cache, *g_cache_w, *g_cache_s;
static pkv_device *g_dev;

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
    mp = fuzz_kv_window_model_params();
    if (g_cache && !pkv_mkmodel_memory(&mp, &img, &n)) {
        g_model_w = pkv_model_load_memory(img, n, "fuzz-kv-window-model", fuzz_model_params());
        pkv_mkmodel_free_memory(img);
    }
    g_cache_w = g_model_w ? pkv_model_cache_create(g_model_w, fuzz_kv_cache_params()) : NULL;
    pkv_device_params dp = pkv_device_default_params();
    dp.n_threads = 1;
    g_dev = pkv_device_open("cpu", dp);
    g_cache_s = g_dev ? pkv_kv_cache_create(fuzz_kv_state_params(g_dev)) : NULL;
    if (!g_cache || !g_cache_w || !g_cache_s) {
        fprintf(stderr, "fuzz-kvfile: model/cache: %s\n", pkv_errmsg());
        abort();
    }
    /* Warm each cache up: arrays a cache grows once and keeps (its sequence table,
     * block-table scratch) must not count as leaks of the first input that fails. */
    const int32_t toks[5] = {1, 2, 3, 4, 5};
    pkv_model *models[2] = {g_model, g_model_w};
    pkv_kv_cache *caches[2] = {g_cache, g_cache_w};
    for (int i = 0; i < 2; i++) {
        pkv_context *ctx = pkv_context_create(models[i], caches[i], 0);
        FUZZ_CHECK(ctx && pkv_context_decode(ctx, toks, 5) == PKV_OK);
        pkv_context_free(ctx);
        FUZZ_CHECK(pkv_kv_clear(caches[i]) == PKV_OK);
    }
    int32_t s = -1, rows[5];
    pkv_kv_block_table bt;
    FUZZ_CHECK(pkv_kv_seq_create(g_cache_s, 0, &s) == PKV_OK && pkv_kv_append(g_cache_s, s, 5, toks, NULL, rows) == PKV_OK);
    FUZZ_CHECK(pkv_kv_block_table_get(g_cache_s, 1, &s, true, &bt) == PKV_OK);
    FUZZ_CHECK(pkv_kv_seq_free(g_cache_s, s) == PKV_OK && pkv_kv_clear(g_cache_s) == PKV_OK);
    return 0;
}

static uint64_t rd64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* Where a file's parts are, for the cache it goes to (the format is in
 * src/kv/kv-file.c): tokens at `tok`, payload from `hb`. Version 2 (window
 * layers) has w_first, w_len after exact_until; version 3 (recurrent layers)
 * those and state_len. False when the header is short. */
typedef struct file_parts {
    size_t tok, hb;
    uint64_t n, w_first, w_len, state_len;
} file_parts;

static bool parts_of(const pkv_kv_cache *c, const uint8_t *f, size_t size, file_parts *o) {
    pkv_kv_stats st;
    pkv_kv_stats_get(c, &st);
    const bool win = st.window_pages > 0, state = st.state_slots > 0;
    size_t h0 = 8 + 16 + 8 + (size_t)pkv_kv_layout_n_layers(pkv_kv_cache_layout(c)) * 16;
    o->tok = h0 + 24 + (state ? 24 : win ? 16 : 0);
    if (size < o->tok + 8) return false;
    o->n = rd64(f + h0);
    o->w_first = win || state ? rd64(f + h0 + 24) : 0;
    o->w_len = win || state ? rd64(f + h0 + 32) : o->n;
    o->state_len = state ? rd64(f + h0 + 40) : o->n;
    if (o->n > size / 8) return false;
    o->hb = o->tok + (size_t)o->n * 8;
    return true;
}

/* Rewrite the trailing checksum as the loader computes it, when the size fits the
 * token counts in the header. */
static void fix_checksum(const pkv_kv_cache *c, uint8_t *f, size_t size) {
    const pkv_kv_layout *l = pkv_kv_cache_layout(c);
    int nl = pkv_kv_layout_n_layers(l);
    file_parts fp;
    if (!parts_of(c, f, size, &fp) || fp.w_first > fp.w_len || fp.w_len > fp.n) return;
    size_t want = fp.hb + 8;
    size_t sec[2 * 64];
    bool one[64]; /* a recurrent layer: one section (its state), not K and V */
    if (nl > 64) return;
    for (int il = 0; il < nl; il++) {
        pkv_kv_layer_info li;
        if (pkv_kv_layout_layer(l, il, &li)) return;
        one[il] = li.state_per_head > 0;
        if (one[il]) {
            sec[2 * il] = (size_t)li.n_kv_heads * (size_t)li.state_per_head * 4;
            sec[2 * il + 1] = 0;
            want += sec[2 * il];
            continue;
        }
        size_t nt = li.window > 0 ? (size_t)(fp.w_len - fp.w_first) : (size_t)fp.n;
        /* a token's row: each head's elements (or blocks of 32 for quantized pages) */
        sec[2 * il] = nt * (size_t)li.n_kv_heads * pkv_type_row_bytes(li.dtype_k, (size_t)li.head_dim_k);
        sec[2 * il + 1] = nt * (size_t)li.n_kv_heads * pkv_type_row_bytes(li.dtype_v, (size_t)li.head_dim_v);
        want += sec[2 * il] + sec[2 * il + 1];
    }
    if (want != size) return;
    uint64_t h = pkv_hash64(f, fp.hb, 0);
    size_t off = fp.hb;
    for (int i = 0; i < 2 * nl; i++) {
        if (one[i / 2] && i % 2) continue;
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
    if (strict) FUZZ_CHECK(a->window_free == b->window_free && a->window_cached == b->window_cached);
    FUZZ_CHECK(a->state_free == b->state_free && a->state_checkpoints == b->state_checkpoints);
    FUZZ_CHECK(a->window_free + a->window_cached == b->window_free + b->window_cached);
    FUZZ_CHECK(a->window_used == b->window_used);
}

/* The loaded sequence holds the file's tokens and positions; a window cache's
 * window layers hold what the file says (w_len tokens), or the whole sequence
 * after a context load (which decodes the last token again, recomputing them). */
static void check_content(pkv_kv_cache *c, int32_t seq, const uint8_t *f, size_t size, bool decoded) {
    file_parts fp;
    FUZZ_CHECK(parts_of(c, f, size, &fp));
    int64_t len = pkv_kv_seq_len(c, seq);
    FUZZ_CHECK(len >= 0 && (uint64_t)len == fp.n);
    int64_t wl = pkv_kv_seq_window_len(c, seq);
    FUZZ_CHECK(decoded ? wl == len : (uint64_t)wl == fp.w_len);
    FUZZ_CHECK((uint64_t)pkv_kv_seq_state_len(c, seq) == fp.state_len);
    if (len == 0) return;
    int32_t *tok = malloc((size_t)len * 4), *pos = malloc((size_t)len * 4);
    FUZZ_CHECK(tok && pos);
    FUZZ_CHECK(pkv_kv_seq_tokens(c, seq, 0, len, tok, pos) == PKV_OK);
    const uint8_t *ft = f + fp.tok, *fpos = ft + fp.n * 4;
    FUZZ_CHECK(memcmp(tok, ft, (size_t)len * 4) == 0);
    FUZZ_CHECK(memcmp(pos, fpos, (size_t)len * 4) == 0);
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
    uint32_t version = 0;
    if (fsize >= 12) memcpy(&version, f + 8, 4);
    pkv_model *model = version == 2 ? g_model_w : version == 3 ? NULL : g_model;
    pkv_kv_cache *cache = version == 2 ? g_cache_w : version == 3 ? g_cache_s : g_cache;
    if (flags & 1) fix_checksum(cache, f, fsize);

    pkv_context *busy = NULL;
    int32_t busy_seq = -1; /* the busy sequence of the cache without a model */
    if ((flags & 4) && !model) {
        int32_t rows[5];
        const int32_t toks[5] = {1, 2, 3, 4, 5};
        FUZZ_CHECK(pkv_kv_seq_create(cache, 0, &busy_seq) == PKV_OK &&
                   pkv_kv_append(cache, busy_seq, 5, toks, NULL, rows) == PKV_OK);
    } else if (flags & 4) {
        busy = pkv_context_create(model, cache, 0);
        const int32_t toks[5] = {1, 2, 3, 4, 5};
        FUZZ_CHECK(busy && pkv_context_decode(busy, toks, 5) == PKV_OK);
    }
    pkv_kv_stats before, after;
    pkv_kv_stats_get(cache, &before);
    int64_t live0 = pkv_alloc_live();
    if (flags & 8) pkv_alloc_fail_at((uint64_t)(flags >> 4) + 1);

    if ((flags & 2) && model) {
        pkv_context *ctx = pkv_context_load_memory(model, cache, "fuzz-input", f, fsize, 0);
        pkv_alloc_fail_at(0);
        if (ctx) {
            /* the last token was truncated and decoded again: the file's tokens */
            check_content(cache, pkv_context_seq(ctx), f, fsize, true);
            FUZZ_CHECK(pkv_context_logits(ctx) != NULL || pkv_context_n_tokens(ctx) == 0);
            pkv_context_free(ctx);
        } else {
            pkv_kv_stats_get(cache, &after);
            stats_equal(&before, &after, false);
            FUZZ_CHECK(pkv_alloc_live() == live0);
        }
    } else {
        int32_t seq = -1;
        pkv_status st = pkv_kv_seq_load_memory(cache, "fuzz-input", f, fsize, 0, &seq);
        pkv_alloc_fail_at(0);
        if (st == PKV_OK) {
            check_content(cache, seq, f, fsize, false);
            FUZZ_CHECK(pkv_kv_seq_free(cache, seq) == PKV_OK);
        } else {
            FUZZ_CHECK(seq == -1);
            pkv_kv_stats_get(cache, &after);
            stats_equal(&before, &after, true);
            FUZZ_CHECK(pkv_alloc_live() == live0);
        }
    }
    pkv_context_free(busy);
    if (busy_seq >= 0) FUZZ_CHECK(pkv_kv_seq_free(cache, busy_seq) == PKV_OK);
    FUZZ_CHECK(pkv_kv_clear(cache) == PKV_OK);
    free(f);
    return 0;
}
