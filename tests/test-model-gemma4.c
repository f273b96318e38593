// labels: model unit
/* gemma4 beyond the forward pass (test-model-ref checks that against the double
 * reference, compare-llama against llama.cpp):
 *  - KV shared between layers: the cache of mkmodel's six-layer model has the four
 *    layers that own KV, with their own head sizes and KV heads; its KV bytes per
 *    token are those four layers', against all six for the same shape without
 *    sharing (the numbers docs/model.md gives);
 *  - every KV operation on it, with f16 and q8_0 pages: fork == replay bitwise; swap
 *    out and in, save and load: the continuation bitwise the original's; truncate
 *    back into released window pages, then decode: within 1e-9 (f16: 1e-5) of a
 *    fresh context fed the same tokens; context shift inside the window: within
 *    1e-9 of the double reference's shift (f32 pages);
 *  - the final soft-cap: 30 when final_logit_softcapping is absent (bitwise the
 *    file's 30), off at 0;
 *  - bad input refused naming the key, tensor or layers: the sliding pattern of the
 *    wrong length or missing, shared_kv_layers not below the layer count, leaving
 *    fewer than two layers with KV, or leaving a last pair that is not sliding then
 *    full; a sharing layer whose KV heads differ from its owner's; per-layer
 *    embedding sizes that disagree with the tensors; missing per-layer tensors;
 *    head sizes; rope_freqs missing or not proportional; a router (ffn_gate_inp)
 *    without an expert count; the draft key pagekv.shared_kv_layers beside the
 *    model's own sharing;
 *  - the MoE layout (26B-A4B): its keys and tensors required, ffn_down_exps.scale
 *    optional; merged ffn_gate_up_exps give bitwise the logits of separate ones. */
#include <math.h>

#include "base/base.h"
#include "base/quant.h"
#include "model/gguf.h"
#include "model/model-impl.h"
#include "ref-gguf.h"
#include "ref-model.h"
#include "testhelp.h"

/* ------------------------------------------------------------ variants */

/* An edit of a GGUF image: a key dropped (no value), set to a u32, a bool array of
 * n_bool entries (the file's first ones, then 1), or an i32 array; a tensor dropped;
 * entry 1 of an f32 tensor set; a tensor added (a copy of token_embd's first bytes
 * under another name and shape). */
typedef struct edit {
    const char *key;
    int64_t u32;           /* >= 0: set the key to this u32 */
    int n_bool;            /* > 0: the key as a bool array of n_bool */
    const int32_t *i32;    /* the key as an i32 array of n_i32 */
    int n_i32;
    const char *drop;      /* tensor left out */
    const char *poke;      /* f32 tensor whose entry 1 becomes poke_value */
    float poke_value;
    const char *add;       /* tensor added, f32 [add_ne0][add_ne1] */
    int64_t add_ne0, add_ne1;
} edit;

static void *variant(const pkv_gguf *g, const edit *e, size_t *size) {
    pkv_gguf_writer *w = pkv_gguf_writer_create();
    if (!w) return NULL;
    bool ok = true, done = false;
    for (int64_t i = 0; ok && i < pkv_gguf_n_kv(g); i++) {
        const char *key = pkv_gguf_kv_key(g, i);
        if (!e->key || strcmp(key, e->key)) {
            ok = !pkv_gguf_writer_copy_kv(w, g, i);
            continue;
        }
        done = true;
        if (e->u32 >= 0) ok = !pkv_gguf_writer_add_u32(w, key, (uint32_t)e->u32);
        if (e->n_bool > 0) {
            uint8_t b[64];
            pkv_gguf_array a;
            ok = !pkv_gguf_get_arr(g, key, PKV_GGUF_TYPE_COUNT, &a);
            for (int k = 0; ok && k < e->n_bool; k++) b[k] = k < (int)a.count ? (uint8_t)pkv_gguf_arr_int(&a, (uint64_t)k) : 1;
            ok = ok && !pkv_gguf_writer_add_arr(w, key, PKV_GGUF_BOOL, b, (uint64_t)e->n_bool);
        }
        if (e->i32) ok = !pkv_gguf_writer_add_arr(w, key, PKV_GGUF_INT32, e->i32, (uint64_t)e->n_i32);
    }
    if (ok && e->key && !done && e->i32) ok = !pkv_gguf_writer_add_arr(w, e->key, PKV_GGUF_INT32, e->i32, (uint64_t)e->n_i32);
    float *poked = NULL;
    for (int64_t i = 0; ok && i < pkv_gguf_n_tensors(g); i++) {
        const pkv_gguf_tensor *t = pkv_gguf_tensor_at(g, i);
        if (e->drop && !strcmp(t->name, e->drop)) continue;
        const void *data = t->data;
        if (e->poke && !strcmp(t->name, e->poke)) {
            poked = malloc(t->n_bytes);
            ok = poked != NULL;
            if (ok) {
                memcpy(poked, t->data, t->n_bytes);
                poked[1] = e->poke_value;
            }
            data = poked;
        }
        ok = ok && !pkv_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, data, t->n_bytes);
    }
    if (ok && e->add) {
        size_t n = (size_t)(e->add_ne0 * e->add_ne1);
        float *z = calloc(n, sizeof *z);
        int64_t ne[2] = {e->add_ne0, e->add_ne1};
        ok = z && !pkv_gguf_writer_add_tensor(w, e->add, PKV_TYPE_F32, 2, ne, z, n * 4);
        free(z);
    }
    void *img = NULL;
    if (ok && pkv_gguf_writer_write_memory(w, &img, size)) img = NULL;
    free(poked);
    pkv_gguf_writer_free(w);
    return img;
}

/* mkmodel's gemma4: 6 layers (full, sliding, sliding, full own KV; sliding, full share
 * it), 8 heads; KV heads 4 (sliding, head size 32) and 2 (full, head size 64);
 * per-layer embeddings of 16; window 8. */
static pkv_mkmodel_params g4_params(pkv_type t, int n_shared_kv) {
    pkv_mkmodel_params p = pkv_mkmodel_default_params();
    p.arch = "gemma4";
    p.type = t;
    p.n_embd = 64;
    p.n_ff = 96;
    p.n_vocab = 320;
    p.n_shared_kv = n_shared_kv;
    p.swa_layers = "fssfsf";
    p.seed = 7;
    return p;
}

static pkv_model *load(const void *img, size_t size, const char *label) {
    pkv_model_params mp = pkv_model_default_params();
    mp.n_threads = 2;
    return pkv_model_load_memory(img, size, label, mp);
}

/* ------------------------------------------------------------- layout */

static double kv_bytes_per_token(const pkv_kv_cache *c) {
    const pkv_kv_layout *l = pkv_kv_cache_layout(c);
    double b = 0;
    for (int il = 0; il < pkv_kv_layout_n_layers(l); il++) {
        pkv_kv_layer_info li;
        if (pkv_kv_layout_layer(l, il, &li) == PKV_OK) b += (double)li.k_page_bytes + (double)li.v_page_bytes;
    }
    return b / pkv_kv_layout_page_size(l);
}

static void test_layout(void) {
    void *img = NULL, *img0 = NULL;
    size_t size = 0, size0 = 0;
    pkv_mkmodel_params p = g4_params(PKV_TYPE_F16, 0), p0 = g4_params(PKV_TYPE_F16, -1);
    REQUIRE_VOID(!pkv_mkmodel_memory(&p, &img, &size) && !pkv_mkmodel_memory(&p0, &img0, &size0));
    pkv_model *m = load(img, size, "gemma4"), *m0 = load(img0, size0, "gemma4 unshared");
    REQUIRE_VOID(m && m0);
    pkv_model_info info;
    CHECK_OK(pkv_model_get_info(m, &info));
    CHECK_INT(info.n_layer, 6);
    CHECK_INT(info.n_kv_layers, 4);
    CHECK(!info.shared_kv); /* that flag is for drafts over another model's cache */
    pkv_cache_params cp = pkv_cache_default_params();
    cp.n_ctx = 128;
    pkv_kv_cache *c = pkv_model_cache_create(m, cp), *c0 = pkv_model_cache_create(m0, cp);
    REQUIRE_VOID(c && c0);
    const pkv_kv_layout *l = pkv_kv_cache_layout(c);
    CHECK_INT(pkv_kv_layout_n_layers(l), 4);
    CHECK_INT(pkv_kv_layout_n_layers(pkv_kv_cache_layout(c0)), 6);
    static const struct { int heads, dim, window; } want[4] = {{2, 64, 0}, {4, 32, 8}, {4, 32, 8}, {2, 64, 0}};
    for (int il = 0; il < 4; il++) {
        pkv_kv_layer_info li;
        CHECK_OK(pkv_kv_layout_layer(l, il, &li));
        CHECK_INT(li.n_kv_heads, want[il].heads);
        CHECK_INT(li.head_dim_k, want[il].dim);
        CHECK_INT(li.head_dim_v, want[il].dim);
        CHECK_INT(li.window, want[il].window);
    }
    /* f16: every layer here holds 2 x 64 or 4 x 32 K and V halves per token, 512 bytes */
    CHECK_NEAR(kv_bytes_per_token(c), 4 * 512.0, 0);
    CHECK_NEAR(kv_bytes_per_token(c0), 6 * 512.0, 0);
    fprintf(stderr, "gemma4 test shape, f16 KV: %.0f bytes per token with the sharing, %.0f without\n",
                kv_bytes_per_token(c), kv_bytes_per_token(c0));
    /* a cache of the unshared model does not fit the shared one */
    CHECK(pkv_context_create(m, c0, 0) == NULL);
    CHECK(strstr(pkv_errmsg(), "the cache has 6 layers") != NULL);
    pkv_kv_cache_free(c);
    pkv_kv_cache_free(c0);
    pkv_model_free(m);
    pkv_model_free(m0);
    pkv_mkmodel_free_memory(img);
    pkv_mkmodel_free_memory(img0);
}

/* ------------------------------------------------------- KV operations */

enum { NP = 30, V = 320 };

static int32_t tok(int i) { return (int32_t)((i * 97 + 13) % V); }

static double nmse(const float *a, const float *b, int n) {
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return num / den;
}

static pkv_context *decoded(pkv_model *m, pkv_kv_cache *c, int from, int n, int chunk) {
    pkv_context *x = pkv_context_create(m, c, 0);
    int32_t t[64];
    for (int i = 0; x && i < n; i += chunk) {
        int k = n - i < chunk ? n - i : chunk;
        for (int j = 0; j < k; j++) t[j] = tok(from + i + j);
        if (pkv_context_decode(x, t, k)) {
            TH_FAIL("decode: %s", pkv_errmsg());
            pkv_context_free(x);
            return NULL;
        }
    }
    return x;
}

static bool same(const float *a, const float *b) { return a && b && !memcmp(a, b, V * sizeof(float)); }

static void test_kv_ops(pkv_type kv) {
    void *img = NULL;
    size_t size = 0;
    pkv_mkmodel_params p = g4_params(PKV_TYPE_F32, 0);
    REQUIRE_VOID(!pkv_mkmodel_memory(&p, &img, &size));
    pkv_model *m = load(img, size, "gemma4");
    REQUIRE_VOID(m);
    pkv_cache_params cp = pkv_cache_default_params();
    cp.n_ctx = 128;
    cp.page_size = 3; /* does not divide the window of 8 */
    cp.kv_type = kv;
    pkv_kv_cache *c = pkv_model_cache_create(m, cp);
    REQUIRE_VOID(c);
    const double tol = kv == PKV_TYPE_F32 ? 1e-9 : kv == PKV_TYPE_F16 ? 1e-5 : 1e-3;
    const char *kn = pkv_type_name(kv);
    /* fork == replay: a 30-token prompt (past the window), a fork, each branch its own token */
    pkv_context *a = decoded(m, c, 0, NP, 10), *b = a ? pkv_context_fork(a) : NULL;
    REQUIRE_VOID(a && b);
    int32_t ta = tok(100), tb = tok(101);
    CHECK_OK(pkv_context_decode(a, &ta, 1));
    CHECK_OK(pkv_context_decode(b, &tb, 1));
    pkv_context *ra = decoded(m, c, 0, NP, 10), *rb = decoded(m, c, 0, NP, 10);
    REQUIRE_VOID(ra && rb);
    CHECK_OK(pkv_context_decode(ra, &ta, 1));
    CHECK_OK(pkv_context_decode(rb, &tb, 1));
    if (!same(pkv_context_logits(a), pkv_context_logits(ra)) || !same(pkv_context_logits(b), pkv_context_logits(rb)))
        TH_FAIL("kv %s: a fork's continuation differs from the replay's", kn);
    th_checks++;
    /* swap out and in; save and load: the next token bitwise as without */
    int32_t tn = tok(102);
    CHECK_OK(pkv_context_swap_out(b));
    CHECK_OK(pkv_context_swap_in(b));
    CHECK_OK(pkv_context_decode(b, &tn, 1));
    CHECK_OK(pkv_context_decode(rb, &tn, 1));
    if (!same(pkv_context_logits(b), pkv_context_logits(rb))) TH_FAIL("kv %s: the continuation after a swap differs", kn);
    char path[512];
    snprintf(path, sizeof path, "%s/gemma4-%s.kv", getenv("PKV_TEST_TMP") ? getenv("PKV_TEST_TMP") : "/tmp", kn);
    CHECK_OK(pkv_context_save(b, path));
    pkv_context *lb = pkv_context_load(m, c, path, 0);
    REQUIRE_VOID(lb);
    CHECK_INT(pkv_context_n_tokens(lb), NP + 2);
    int32_t tl = tok(103);
    CHECK_OK(pkv_context_decode(lb, &tl, 1));
    CHECK_OK(pkv_context_decode(rb, &tl, 1));
    if (!same(pkv_context_logits(lb), pkv_context_logits(rb))) TH_FAIL("kv %s: the continuation after a load differs", kn);
    th_checks += 2;
    remove(path);
    /* truncate back past the window's released pages (its KV recomputed), then decode */
    CHECK_OK(pkv_context_truncate(a, 12));
    int32_t t12[2] = {tok(200), tok(201)};
    CHECK_OK(pkv_context_decode(a, t12, 2));
    pkv_context *f = decoded(m, c, 0, 12, 12);
    REQUIRE_VOID(f);
    CHECK_OK(pkv_context_decode(f, t12, 2));
    double e = nmse(pkv_context_logits(a), pkv_context_logits(f), V);
    if (!(e < tol)) TH_FAIL("kv %s: truncate + decode vs fresh: nmse %g", kn, e);
    th_checks++;
    pkv_context_free(a);
    pkv_context_free(b);
    pkv_context_free(ra);
    pkv_context_free(rb);
    pkv_context_free(lb);
    pkv_context_free(f);
    pkv_kv_stats ks;
    pkv_kv_stats_get(c, &ks);
    CHECK_INT(ks.pages_used, 0); /* every context freed: nothing held */
    pkv_kv_cache_free(c);
    pkv_model_free(m);
    pkv_mkmodel_free_memory(img);
}

/* Context shift inside the window against the double reference's (its re-rotation
 * of each layer's K: the full layers' first pairs only, the sliding layers' whole heads). */
static void test_shift(void) {
    void *img = NULL;
    size_t size = 0;
    pkv_mkmodel_params p = g4_params(PKV_TYPE_F32, 0);
    REQUIRE_VOID(!pkv_mkmodel_memory(&p, &img, &size));
    pkv_model *m = load(img, size, "gemma4");
    pkv_gguf *g = pkv_gguf_open_memory(img, size, "gemma4");
    REQUIRE_VOID(m && g);
    static const unsigned char swa[6] = {0, 1, 1, 0, 1, 0};
    static const int kvh[6] = {2, 4, 4, 2, 4, 2}, ff[6] = {96, 96, 96, 96, 192, 192};
    ref_hparams hp = {.arch = "gemma4", .n_layer = 6, .n_embd = 64, .n_head = 8, .n_head_kv = 4, .head_dim = 64, .n_ff = 96,
                      .n_vocab = V, .rms_eps = 1e-6, .rope_base = 1e6, .rope_neox = true, .final_softcap = 30,
                      .sliding_window = 8, .rope_base_swa = 1e4, .swa_layers = swa, .head_dim_swa = 32,
                      .layer_n_head_kv = kvh, .layer_n_ff = ff, .rope_pairs_full = 8, .n_shared_kv = 2,
                      .n_embd_per_layer = 16};
    ref_model *r = ref_model_create(&hp, ref_gguf_tensor, g);
    REQUIRE_VOID(r);
    pkv_cache_params cp = pkv_cache_default_params();
    cp.n_ctx = 128;
    cp.page_size = 4;
    cp.kv_type = PKV_TYPE_F32;
    pkv_kv_cache *c = pkv_model_cache_create(m, cp);
    pkv_context *a = c ? decoded(m, c, 0, NP, NP) : NULL;
    REQUIRE_VOID(a);
    int32_t t[NP + 1];
    for (int i = 0; i < NP; i++) t[i] = tok(i);
    t[NP] = tok(300);
    CHECK_INT(ref_model_eval(r, t, NP, NULL, NULL), 0);
    /* drop positions 25 and 26: the three after them move back two, inside every window */
    CHECK_OK(pkv_context_shift(a, 25, 2));
    CHECK_INT(ref_model_remove(r, 25, 27), 0);
    CHECK_OK(pkv_context_decode(a, &t[NP], 1));
    double want[V];
    float wf[V];
    CHECK_INT(ref_model_eval(r, &t[NP], 1, want, NULL), 0);
    for (int k = 0; k < V; k++) wf[k] = (float)want[k];
    double e = nmse(pkv_context_logits(a), wf, V);
    fprintf(stderr, "gemma4 shift vs reference: nmse %.2e\n", e);
    if (!(e < 1e-9)) TH_FAIL("shift: nmse %g against the reference", e);
    th_checks++;
    pkv_context_free(a);
    pkv_kv_cache_free(c);
    ref_model_free(r);
    pkv_gguf_close(g);
    pkv_model_free(m);
    pkv_mkmodel_free_memory(img);
}

/* ---------------------------------------------------- final soft-cap */

static void test_softcap(void) {
    void *img = NULL;
    size_t size = 0;
    pkv_mkmodel_params p = g4_params(PKV_TYPE_F32, 0);
    REQUIRE_VOID(!pkv_mkmodel_memory(&p, &img, &size));
    pkv_gguf *g = pkv_gguf_open_memory(img, size, "gemma4");
    REQUIRE_VOID(g);
    size_t s1 = 0, s2 = 0;
    edit absent = {.key = "gemma4.final_logit_softcapping", .u32 = -1};
    void *v1 = variant(g, &absent, &s1);
    REQUIRE_VOID(v1);
    /* 0 = off: as a float key, the file's type */
    pkv_gguf_writer *w = pkv_gguf_writer_create();
    for (int64_t i = 0; w && i < pkv_gguf_n_kv(g); i++)
        if (strcmp(pkv_gguf_kv_key(g, i), "gemma4.final_logit_softcapping")) pkv_gguf_writer_copy_kv(w, g, i);
    pkv_gguf_writer_add_f32(w, "gemma4.final_logit_softcapping", 0.0f);
    for (int64_t i = 0; w && i < pkv_gguf_n_tensors(g); i++) {
        const pkv_gguf_tensor *t = pkv_gguf_tensor_at(g, i);
        pkv_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, t->n_bytes);
    }
    void *v2 = NULL;
    if (w) pkv_gguf_writer_write_memory(w, &v2, &s2);
    pkv_gguf_writer_free(w);
    REQUIRE_VOID(v2);
    pkv_model *m = load(img, size, "cap 30"), *m1 = load(v1, s1, "cap absent"), *m2 = load(v2, s2, "cap 0");
    REQUIRE_VOID(m && m1 && m2);
    CHECK_NEAR(m->hp.softcap.final, 30, 0);
    CHECK_NEAR(m1->hp.softcap.final, 30, 0);
    CHECK_NEAR(m2->hp.softcap.final, 0, 0);
    pkv_cache_params cp = pkv_cache_default_params();
    cp.n_ctx = 64;
    pkv_model *ms[3] = {m, m1, m2};
    float lg[3][V];
    for (int k = 0; k < 3; k++) {
        pkv_kv_cache *c = pkv_model_cache_create(ms[k], cp);
        pkv_context *x = c ? decoded(ms[k], c, 0, 12, 12) : NULL;
        if (x) memcpy(lg[k], pkv_context_logits(x), sizeof lg[k]);
        CHECK(x != NULL);
        pkv_context_free(x);
        pkv_kv_cache_free(c);
    }
    CHECK(!memcmp(lg[0], lg[1], sizeof lg[0])); /* absent = 30 */
    double mx0 = 0, mx2 = 0;
    int beyond = 0;
    for (int k = 0; k < V; k++) {
        mx0 = fmax(mx0, fabs(lg[0][k]));
        mx2 = fmax(mx2, fabs(lg[2][k]));
        beyond += fabs(lg[2][k]) >= 30;
        if (fabs(lg[0][k] - 30 * tanh(lg[2][k] / 30)) > 1e-4 * (1 + fabs(lg[0][k])))
            TH_FAIL("logit %d: capped %g, uncapped %g", k, (double)lg[0][k], (double)lg[2][k]);
    }
    th_checks++;
    CHECK(mx0 < 30);
    fprintf(stderr, "gemma4 soft-cap: |logit| max %.2f capped, %.2f uncapped (%d beyond 30)\n", mx0, mx2, beyond);
    pkv_model_free(m);
    pkv_model_free(m1);
    pkv_model_free(m2);
    pkv_free(v1);
    pkv_free(v2);
    pkv_gguf_close(g);
    pkv_mkmodel_free_memory(img);
}

/* ----------------------------------------------------------- bad input */

static void test_bad_input(void) {
    void *img = NULL;
    size_t size = 0;
    pkv_mkmodel_params p = g4_params(PKV_TYPE_F32, 0);
    REQUIRE_VOID(!pkv_mkmodel_memory(&p, &img, &size));
    pkv_gguf *g = pkv_gguf_open_memory(img, size, "g4");
    REQUIRE_VOID(g);
    pkv_model *ok = load(img, size, "g4");
    CHECK(ok != NULL);
    pkv_model_free(ok);
    static const int32_t kv_heads[6] = {2, 4, 4, 2, 2, 2}, draft_map[6] = {0, 1, 2, 3, 2, 3};
    const struct {
        edit e;
        const char *want;
    } cases[] = {
        {{.key = "gemma4.attention.sliding_window_pattern", .u32 = -1, .n_bool = 5},
         "key 'gemma4.attention.sliding_window_pattern' must hold one bool per layer (6), found 5"},
        {{.key = "gemma4.attention.sliding_window_pattern", .u32 = -1, .n_bool = 7},
         "key 'gemma4.attention.sliding_window_pattern' must hold one bool per layer (6), found 7"},
        {{.key = "gemma4.attention.sliding_window_pattern", .u32 = -1},
         "key 'gemma4.attention.sliding_window_pattern' not found"},
        {{.key = "gemma4.attention.shared_kv_layers", .u32 = 6},
         "'gemma4.attention.shared_kv_layers' 6 must be below 'gemma4.block_count' 6"},
        {{.key = "gemma4.attention.shared_kv_layers", .u32 = 5},
         "'gemma4.attention.shared_kv_layers' 5 of 6 layers leaves 1 with KV of their own"},
        {{.key = "gemma4.attention.shared_kv_layers", .u32 = 3},
         "the last two layers with KV of their own (layers 1 and 2) must be a sliding and a full layer"},
        {{.key = "gemma4.attention.head_count_kv", .u32 = -1, .i32 = kv_heads, .n_i32 = 6},
         "layer 4 reads the KV of layer 2, but has 2 KV heads of 32/32 where layer 2 has 4 of 32/32"},
        {{.key = "gemma4.embedding_length_per_layer_input", .u32 = 8},
         "tensor 'per_layer_token_embd.weight' has shape [96, 320, 1, 1], expected [48, 320]"},
        {{.key = "gemma4.embedding_length_per_layer_input", .u32 = -1},
         "key 'gemma4.embedding_length_per_layer_input' not found"},
        {{.key = "gemma4.attention.key_length_swa", .u32 = -1}, "key 'gemma4.attention.key_length_swa' not found"},
        {{.key = "gemma4.attention.value_length_swa", .u32 = 16}, "'key_length_swa' 32 == 'value_length_swa' 16"},
        {{.key = "gemma4.rope.dimension_count_swa", .u32 = 64},
         "'gemma4.rope.dimension_count_swa' 64 must be even and at most 'gemma4.attention.key_length_swa' 32"},
        {{.key = "gemma4.attention.sliding_window", .u32 = -1}, "key 'gemma4.attention.sliding_window' not found"},
        {{.u32 = -1, .drop = "rope_freqs.weight"}, "tensor 'rope_freqs.weight' not found"},
        {{.u32 = -1, .poke = "rope_freqs.weight", .poke_value = 2.0f},
         "tensor 'rope_freqs.weight' entry 1 is 2: only proportional RoPE is supported"},
        {{.u32 = -1, .drop = "per_layer_model_proj.weight"}, "tensor 'per_layer_model_proj.weight' not found"},
        {{.u32 = -1, .drop = "per_layer_token_embd.weight"}, "tensor 'per_layer_token_embd.weight' not found"},
        {{.u32 = -1, .drop = "blk.2.inp_gate.weight"}, "tensor 'blk.2.inp_gate.weight' not found"},
        {{.u32 = -1, .drop = "blk.5.post_norm.weight"}, "tensor 'blk.5.post_norm.weight' not found"},
        {{.u32 = -1, .drop = "blk.1.attn_k.weight"}, "tensor 'blk.1.attn_k.weight' not found"},
        {{.u32 = -1, .drop = "blk.3.attn_k_norm.weight"}, "tensor 'blk.3.attn_k_norm.weight' not found"},
        {{.u32 = -1, .add = "blk.0.ffn_gate_inp.weight", .add_ne0 = 64, .add_ne1 = 4},
         "tensor 'blk.0.ffn_gate_inp.weight' makes layer 0 a mixture of experts, but key 'gemma4.expert_count' is absent"},
        {{.key = "pagekv.shared_kv_layers", .u32 = -1, .i32 = draft_map, .n_i32 = 6},
         "key 'pagekv.shared_kv_layers' (a draft's map into a target's cache) and 'gemma4.attention.shared_kv_layers'"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        size_t vs = 0;
        void *v = variant(g, &cases[k].e, &vs);
        if (!v) {
            TH_FAIL("case %zu: could not write the variant", k);
            continue;
        }
        pkv_model *bad = load(v, vs, "bad gemma4");
        if (bad) TH_FAIL("case %zu (%s): loaded", k, cases[k].want);
        else if (!strstr(pkv_errmsg(), cases[k].want)) TH_FAIL("case %zu: message '%s' lacks '%s'", k, pkv_errmsg(), cases[k].want);
        th_checks++;
        pkv_model_free(bad);
        pkv_free(v);
    }
    /* mkmodel refuses what the loader would */
    pkv_mkmodel_params q = g4_params(PKV_TYPE_F32, 0);
    void *x = NULL;
    size_t xs = 0;
    q.swa_layers = "fssf";
    CHECK(pkv_mkmodel_memory(&q, &x, &xs) == PKV_ERR_INVALID);
    CHECK(strstr(pkv_errmsg(), "the last two of which (0, 1) must be sliding and full") != NULL);
    q.swa_layers = "fsssfs";
    CHECK(pkv_mkmodel_memory(&q, &x, &xs) == PKV_ERR_INVALID);
    q.swa_layers = "fss";
    q.n_layer = 6;
    CHECK(pkv_mkmodel_memory(&q, &x, &xs) == PKV_ERR_INVALID);
    CHECK(strstr(pkv_errmsg(), "the sliding pattern 'fss' has 3 layers, the model 6") != NULL);
    pkv_gguf_close(g);
    pkv_mkmodel_free_memory(img);
}

/* ------------------------------------------------------ mixture of experts */

/* The MoE layout (the 26B-A4B checkpoint's): its tensors required, an expert count
 * required where a layer has a router; gate and up experts merged into one
 * ffn_gate_up_exps (each expert's gate rows, then its up rows) give bitwise the
 * logits of the separate tensors. */
static void test_moe(void) {
    void *img = NULL;
    size_t size = 0;
    pkv_mkmodel_params p = g4_params(PKV_TYPE_F32, 0);
    p.n_expert = 4;
    p.n_expert_used = 2;
    REQUIRE_VOID(!pkv_mkmodel_memory(&p, &img, &size));
    pkv_gguf *g = pkv_gguf_open_memory(img, size, "g4 moe");
    pkv_model *m = load(img, size, "g4 moe");
    REQUIRE_VOID(g && m);
    pkv_model_info info;
    CHECK_OK(pkv_model_get_info(m, &info));
    CHECK_INT(info.n_expert, 4);
    CHECK_INT(info.n_expert_used, 2);
    /* the merged form: a copy with ffn_gate_exps and ffn_up_exps replaced by ffn_gate_up_exps */
    pkv_gguf_writer *w = pkv_gguf_writer_create();
    for (int64_t i = 0; w && i < pkv_gguf_n_kv(g); i++) pkv_gguf_writer_copy_kv(w, g, i);
    const int64_t E = 64, Fe = 48, X = 4;
    float *gu = malloc((size_t)(E * 2 * Fe * X) * sizeof *gu);
    for (int64_t i = 0; w && gu && i < pkv_gguf_n_tensors(g); i++) {
        const pkv_gguf_tensor *t = pkv_gguf_tensor_at(g, i);
        const char *dot = strstr(t->name, ".ffn_gate_exps.weight");
        if (strstr(t->name, ".ffn_up_exps.weight")) continue;
        if (!dot) {
            pkv_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, t->n_bytes);
            continue;
        }
        char up[96], gname[96];
        snprintf(up, sizeof up, "%.*s.ffn_up_exps.weight", (int)(dot - t->name), t->name);
        snprintf(gname, sizeof gname, "%.*s.ffn_gate_up_exps.weight", (int)(dot - t->name), t->name);
        const pkv_gguf_tensor *tu = pkv_gguf_find_tensor(g, up);
        CHECK(tu && t->ne[1] == Fe && t->type == PKV_TYPE_F32);
        for (int64_t e = 0; tu && e < X; e++) {
            memcpy(gu + (e * 2 * Fe) * E, (const float *)t->data + e * Fe * E, (size_t)(Fe * E) * 4);
            memcpy(gu + (e * 2 * Fe + Fe) * E, (const float *)tu->data + e * Fe * E, (size_t)(Fe * E) * 4);
        }
        int64_t ne[3] = {E, 2 * Fe, X};
        pkv_gguf_writer_add_tensor(w, gname, PKV_TYPE_F32, 3, ne, gu, (size_t)(E * 2 * Fe * X) * 4);
    }
    void *mi = NULL;
    size_t ms = 0;
    if (w) pkv_gguf_writer_write_memory(w, &mi, &ms);
    pkv_gguf_writer_free(w);
    free(gu);
    pkv_model *mm = mi ? load(mi, ms, "g4 moe merged") : NULL;
    CHECK(mm != NULL);
    if (mm) {
        pkv_cache_params cp = pkv_cache_default_params();
        cp.n_ctx = 64;
        float lg[2][V];
        pkv_model *ms2[2] = {m, mm};
        for (int k = 0; k < 2; k++) {
            pkv_kv_cache *c = pkv_model_cache_create(ms2[k], cp);
            pkv_context *x = c ? decoded(ms2[k], c, 0, 20, 7) : NULL;
            CHECK(x != NULL);
            if (x) memcpy(lg[k], pkv_context_logits(x), sizeof lg[k]);
            pkv_context_free(x);
            pkv_kv_cache_free(c);
        }
        CHECK(!memcmp(lg[0], lg[1], sizeof lg[0]));
    }
    pkv_model_free(mm);
    pkv_free(mi);
    const struct {
        edit e;
        const char *want;
    } cases[] = {
        {{.key = "gemma4.expert_count", .u32 = -1},
         "tensor 'blk.0.ffn_gate_inp.weight' makes layer 0 a mixture of experts, but key 'gemma4.expert_count' is absent"},
        {{.key = "gemma4.expert_used_count", .u32 = 5}, "key 'gemma4.expert_used_count' is 5, expected a value in [1, 4]"},
        {{.key = "gemma4.expert_feed_forward_length", .u32 = -1}, "key 'gemma4.expert_feed_forward_length' not found"},
        {{.key = "gemma4.expert_feed_forward_length", .u32 = 40},
         "tensor 'blk.0.ffn_gate_exps.weight' must have shape [64, 40, 4]"},
        {{.u32 = -1, .drop = "blk.2.ffn_gate_inp.scale"}, "tensor 'blk.2.ffn_gate_inp.scale' not found"},
        {{.u32 = -1, .drop = "blk.1.pre_ffw_norm_2.weight"}, "tensor 'blk.1.pre_ffw_norm_2.weight' not found"},
        {{.u32 = -1, .drop = "blk.5.post_ffw_norm_2.weight"}, "tensor 'blk.5.post_ffw_norm_2.weight' not found"},
        {{.u32 = -1, .drop = "blk.3.ffn_down_exps.weight"}, "tensor 'blk.3.ffn_down_exps.weight' not found"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        size_t vs = 0;
        void *v = variant(g, &cases[k].e, &vs);
        pkv_model *bad = v ? load(v, vs, "bad gemma4 moe") : NULL;
        if (!v) TH_FAIL("moe case %zu: could not write the variant", k);
        else if (bad) TH_FAIL("moe case %zu (%s): loaded", k, cases[k].want);
        else if (!strstr(pkv_errmsg(), cases[k].want)) TH_FAIL("moe case %zu: message '%s' lacks '%s'", k, pkv_errmsg(), cases[k].want);
        th_checks++;
        pkv_model_free(bad);
        pkv_free(v);
    }
    /* without ffn_down_exps.scale (optional, as in llama.cpp): loads */
    size_t vs = 0;
    edit noscale = {.u32 = -1, .drop = "blk.0.ffn_down_exps.scale"};
    void *v = variant(g, &noscale, &vs);
    pkv_model *ns = v ? load(v, vs, "no expert scale") : NULL;
    CHECK(ns != NULL);
    pkv_model_free(ns);
    pkv_free(v);
    pkv_model_free(m);
    pkv_gguf_close(g);
    pkv_mkmodel_free_memory(img);
}

int main(void) {
    test_layout();
    test_kv_ops(PKV_TYPE_F32);
    test_kv_ops(PKV_TYPE_F16);
    test_kv_ops(PKV_TYPE_Q8_0);
    test_shift();
    test_softcap();
    test_bad_input();
    test_moe();
    return th_done();
}
