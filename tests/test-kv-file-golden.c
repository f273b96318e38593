// labels: unit kv
/* Saved sequence files do not change: for each kind of cache (full-attention
 * layers only, quantized pages, sliding-window layers with released pages,
 * recurrent layers with state parts, window and recurrent layers together,
 * media chunks, a shifted fork) a sequence is built the same way, every device
 * array filled with the same bytes, and saved; the file's size and pkv_hash64
 * must equal those of the file the code before save/load moved behind the
 * memory kinds wrote (the table below, printed with PKV_GOLDEN_PRINT=1). The
 * file then loads into a fresh cache of the same layout and saves again byte
 * for byte the same, so a file written before the change loads after it.
 * Devices: cpu and cpu:1 (heads split). */
#include "kv-testlib.h"

enum { PS = 4 };

typedef struct golden {
    const char *name;
    size_t size;
    uint64_t hash;
} golden;

/* Written by main at 7d2f6ee (before save/load went behind the memory kinds). */
static const golden k_golden[] = {
    {"full", 2784, 0xbfd78aff2fd66401ull},
    {"quant", 1932, 0xc2ed2c04d15bbc6cull},
    {"window", 4048, 0x379818842a13cc62ull},
    {"state", 2692, 0xa96966a53b7c05d2ull},
    {"window-state", 2532, 0x880cae5fa4354a7dull},
    {"media", 2856, 0xaec92d755ae0b62eull},
};

/* Bytes of every array (K, V, state slots) of every layer and shard: small
 * values, so every f32/f16/block scale read from them is finite. */
static void fill(pkv_kv_cache *c, int n_layers) {
    for (int il = 0; il < n_layers; il++) {
        pkv_kv_layer_info li;
        pkv_kv_layout_layer(pkv_kv_cache_layout(c), il, &li);
        for (int ish = 0; ish < li.n_shards; ish++) {
            pkv_kv_shard_info si;
            REQUIRE_VOID(pkv_kv_shard(c, il, ish, &si) == PKV_OK);
            struct {
                pkv_buffer *b;
                size_t off, n;
            } arr[3] = {{si.k, si.k_off, (size_t)si.n_pages * si.k_page_bytes},
                        {si.v, si.v_off, (size_t)si.n_pages * si.v_page_bytes},
                        {si.state, si.state_off, (size_t)si.n_state_slots * si.state_slot_bytes}};
            for (int a = 0; a < 3; a++) {
                if (!arr[a].b || !arr[a].n) continue;
                uint8_t *buf = malloc(arr[a].n);
                REQUIRE_VOID(buf);
                for (size_t i = 0; i < arr[a].n; i++)
                    buf[i] = (uint8_t)((i * 31 + (size_t)il * 7 + (size_t)ish * 3 + (size_t)a) & 0x3f);
                CHECK_OK(pkv_buffer_write(arr[a].b, arr[a].off, buf, arr[a].n));
                free(buf);
            }
        }
    }
}

/* n tokens one step at a time (so window pages are released as in decoding). */
static void append(pkv_kv_cache *c, int32_t seq, int n, int32_t first_tok, const int32_t *toks) {
    for (int t = 0; t < n; t++) {
        int32_t one = 1, tok = toks ? toks[t] : first_tok + t * 7, pos = (int32_t)pkv_kv_seq_len(c, seq);
        int32_t row, wrow;
        CHECK_OK(pkv_kv_append_batch_w(c, 1, &seq, &one, &tok, &pos, &row, &wrow));
    }
}

static int64_t file_bytes(const char *path, uint8_t **out) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    *out = malloc(n > 0 ? (size_t)n : 1);
    size_t got = fread(*out, 1, (size_t)n, f);
    fclose(f);
    return (int64_t)got;
}

/* Save seq of c, compare with the golden entry; load into a fresh cache of p and
 * save again: the same bytes. */
static void check_case(const char *name, pkv_kv_cache *c, int32_t seq, pkv_kv_params p) {
    char file[64], again[64];
    snprintf(file, sizeof file, "golden-%s.pkv", name);
    snprintf(again, sizeof again, "golden-%s-again.pkv", name);
    const char *path = th_tmp(file);
    CHECK_OK(pkv_kv_seq_save(c, seq, path));
    uint8_t *a = NULL, *b = NULL;
    int64_t na = file_bytes(path, &a);
    REQUIRE_VOID(na > 0);
    uint64_t h = pkv_hash64(a, (size_t)na, 0);
    if (getenv("PKV_GOLDEN_PRINT"))
        printf("    {\"%s\", %lld, 0x%016llxull},\n", name, (long long)na, (unsigned long long)h);
    const golden *g = NULL;
    for (size_t i = 0; i < sizeof k_golden / sizeof k_golden[0]; i++)
        if (!strcmp(k_golden[i].name, name)) g = &k_golden[i];
    REQUIRE_VOID(g);
    if (g->size != (size_t)na || g->hash != h)
        TH_FAIL("%s: saved %lld bytes, hash %016llx; the format's file has %zu bytes, hash %016llx", name,
                (long long)na, (unsigned long long)h, g->size, (unsigned long long)g->hash);
    pkv_kv_cache *c2 = pkv_kv_cache_create(p);
    REQUIRE_VOID(c2);
    int32_t l = -1;
    CHECK_OK(pkv_kv_seq_load(c2, path, 0, &l));
    const char *path2 = th_tmp(again);
    CHECK_OK(pkv_kv_seq_save(c2, l, path2));
    int64_t nb = file_bytes(path2, &b);
    CHECK_INT(nb, na);
    if (nb == na) CHECK_MEM(a, b, (size_t)na);
    free(a);
    free(b);
    if (!getenv("PKV_GOLDEN_PRINT")) { /* printing keeps the files to compare */
        remove(path);
        remove(path2);
    }
    pkv_kv_cache_free(c2);
}

static pkv_kv_params params(kt_env *e, int64_t n_pages) {
    pkv_kv_params p = kt_params(e, PS, n_pages, n_pages);
    return p;
}

/* Full-attention layers: a fork with its own tokens after a shared prefix, then
 * shifted (exact_until set). */
static void case_full(kt_env *e) {
    kt_layout_sharded(e);
    pkv_kv_params p = params(e, 32);
    pkv_kv_cache *c = pkv_kv_cache_create(p);
    REQUIRE_VOID(c);
    int32_t s, ch;
    CHECK_OK(pkv_kv_seq_create(c, 0x1234, &s));
    append(c, s, 11, 5, NULL);
    CHECK_OK(pkv_kv_fork(c, s, &ch));
    append(c, ch, 6, 900, NULL);
    fill(c, e->n_layers);
    CHECK_OK(pkv_kv_shift(c, ch, 2, 3, -3));
    check_case("full", c, ch, p);
    pkv_kv_cache_free(c);
}

/* q8_0 K / q4_0 V and an f16 layer. */
static void case_quant(kt_env *e) {
    kt_layout_sharded(e);
    e->layers[0].head_dim_k = e->layers[0].head_dim_v = 32;
    e->layers[0].dtype_k = PKV_TYPE_Q8_0;
    e->layers[0].dtype_v = PKV_TYPE_Q4_0;
    pkv_kv_params p = params(e, 32);
    pkv_kv_cache *c = pkv_kv_cache_create(p);
    REQUIRE_VOID(c);
    int32_t s;
    CHECK_OK(pkv_kv_seq_create(c, 77, &s));
    append(c, s, 9, 3, NULL);
    fill(c, e->n_layers);
    check_case("quant", c, s, p);
    pkv_kv_cache_free(c);
}

/* Layer 1 a sliding-window layer of 4 tokens: 23 tokens leave released pages. */
static void case_window(kt_env *e) {
    kt_layout_sharded(e);
    e->layers[1].window = 4;
    pkv_kv_params p = params(e, 32);
    pkv_kv_cache *c = pkv_kv_cache_create(p);
    REQUIRE_VOID(c);
    int32_t s;
    CHECK_OK(pkv_kv_seq_create(c, 99, &s));
    append(c, s, 23, 11, NULL);
    fill(c, e->n_layers);
    CHECK(pkv_kv_seq_window_len(c, s) == 23);
    check_case("window", c, s, p);
    pkv_kv_cache_free(c);
}

/* A recurrent layer of 3 heads x 5 floats in parts {2, 3} (split over the
 * devices), beside the attention layers; with_window: layer 1 a window layer. */
static void case_state(kt_env *e, bool with_window) {
    kt_layout_sharded(e);
    if (with_window) e->layers[1].window = 4;
    static pkv_kv_shard_desc rs[2];
    rs[0] = (pkv_kv_shard_desc){e->cpu1, NULL, 0, 2};
    rs[1] = (pkv_kv_shard_desc){e->cpu, NULL, 2, 1};
    e->layers[2] = (pkv_kv_layer_desc){.n_kv_heads = 3, .state_per_head = 5, .n_shards = 2, .shards = rs,
                                       .state_n_parts = 2, .state_part = {2, 3}};
    e->n_layers = 3;
    pkv_kv_params p = params(e, 32);
    p.n_layers = 3;
    p.state_slots = 8;
    pkv_kv_cache *c = pkv_kv_cache_create(p);
    REQUIRE_VOID(c);
    int32_t s;
    CHECK_OK(pkv_kv_seq_create(c, 5, &s));
    append(c, s, 13, 2, NULL);
    fill(c, e->n_layers);
    check_case(with_window ? "window-state" : "state", c, s, p);
    pkv_kv_cache_free(c);
}

/* Two media chunks between text tokens: the media trailer. */
static void case_media(kt_env *e) {
    kt_layout_sharded(e);
    pkv_kv_params p = params(e, 32);
    pkv_kv_cache *c = pkv_kv_cache_create(p);
    REQUIRE_VOID(c);
    int32_t s, toks[14];
    pkv_kv_media m[2] = {{0xabcdef0123ull, 2, 4, 0}, {0x5555aaaa7777ull, 8, 3, PKV_MEDIA_NON_CAUSAL}};
    for (int t = 0; t < 14; t++) toks[t] = 40 + t;
    for (int i = 0; i < 2; i++)
        for (int r = 0; r < m[i].n_rows; r++) toks[m[i].start + r] = pkv_media_token(m[i].key, r);
    CHECK_OK(pkv_kv_seq_create(c, 1, &s));
    append(c, s, 14, 0, toks);
    for (int i = 0; i < 2; i++) CHECK_OK(pkv_kv_media_add(c, s, &m[i]));
    fill(c, e->n_layers);
    check_case("media", c, s, p);
    pkv_kv_cache_free(c);
}

int main(void) {
    kt_env e;
    if (!kt_open(&e)) return th_skip("cannot open cpu and cpu:1");
    case_full(&e);
    case_quant(&e);
    case_window(&e);
    case_state(&e, false);
    case_state(&e, true);
    case_media(&e);
    kt_close(&e);
    return th_done();
}
