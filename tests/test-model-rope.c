// labels: model kv
/* The architectures that differ from llama by their RoPE, each against the
 * double-precision reference (tests/ref-model.h) on random-weight files from
 * mkmodel, f32 weights and KV, every position of a prompt, single steps and a
 * context shift, and each also against the reference without its feature, which
 * must be far off, so the match is the feature's:
 *
 * SmolLM3 (smollm3): no RoPE on every fourth layer; the cache keeps those layers'
 * K unrotated and a shift does not turn it.
 *
 * Ministral 3 (mistral3): YaRN whose magnitude follows
 * rope.scaling.yarn_log_multiplier, and Llama 4's attention temperature tuning of
 * the queries past each multiple of the original context.
 *
 * Phi-3's LongRoPE (Phi-3-128k, Phi-3.5, Phi-4-mini) against the double-precision
 * reference (tests/ref-model.h) on a random-weight file from `mkmodel --longrope`:
 * a cache of at most the original context per sequence turns Q and K with
 * rope_factors_short, a longer one with rope_factors_long (llama.cpp's rule), both
 * with rope.scaling.attn_factor on cos and sin; a context shift re-rotates cached K
 * with the cache's factors; the two caches' fingerprints differ. Each case also
 * checks that the reference with the other set is far off, so the match is the
 * factors'. Bad files (one set missing, a wrong length or type, a factor that is not
 * finite and > 0, factors on another architecture) and bad cache factors are
 * refused naming the tensor, key or value. */
#include <math.h>

#include "base/quant.h"
#include "model/forward.h"
#include "model/gguf.h"
#include "ref-gguf.h"
#include "ref-model.h"
#include "testhelp.h"

enum { V = 300, ORIG = 32, HD = 16 };

/* Every model here: f32, width 64, 4 heads over 2 KV heads of HD, FFN 96, V tokens */
static pkv_mkmodel_params small_params(const char *arch, int n_layer) {
    pkv_mkmodel_params p = pkv_mkmodel_default_params();
    p.arch = arch;
    p.type = PKV_TYPE_F32;
    p.n_layer = n_layer;
    p.n_embd = 64;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.head_dim = HD;
    p.n_ff = 96;
    p.n_vocab = V;
    return p;
}

/* ... and its reference's shape (arch as ref-model.h knows it) */
static ref_hparams small_ref(const char *arch, int n_layer, double rms_eps, double rope_base) {
    ref_hparams hp;
    memset(&hp, 0, sizeof hp);
    hp.arch = arch;
    hp.n_layer = n_layer;
    hp.n_embd = 64;
    hp.n_head = 4;
    hp.n_head_kv = 2;
    hp.head_dim = HD;
    hp.n_ff = 96;
    hp.n_vocab = V;
    hp.rms_eps = rms_eps;
    hp.rope_base = rope_base;
    return hp;
}

static pkv_mkmodel_params phi3_params(void) {
    pkv_mkmodel_params p = small_params("phi3", 2);
    p.n_ctx = 256;
    p.rope_orig_ctx = ORIG;
    return p;
}

/* One cache of n_ctx tokens a sequence: np prompt tokens and 4 steps, then (shift)
 * a context shift of 3 tokens at 10 and one more step, every position against the
 * reference with the factor set it should use (long: the long ones) and, for
 * contrast, with the other. Returns the cache's fingerprint. */
static uint64_t run(const void *img, size_t size, int n_ctx, int np, bool long_set, bool shift) {
    pkv_gguf *g = pkv_gguf_open_memory(img, size, "longrope");
    pkv_model *m = pkv_model_load_memory(img, size, "longrope", pkv_model_default_params());
    if (!g || !m) {
        TH_FAIL("load: %s", pkv_errmsg());
        pkv_model_free(m);
        pkv_gguf_close(g);
        return 0;
    }
    double ff[2][HD / 2];
    int64_t n = 0;
    for (int k = 0; k < 2; k++) {
        double *t = ref_gguf_tensor(g, k ? "rope_factors_long.weight" : "rope_factors_short.weight", &n);
        CHECK(t && n == HD / 2);
        for (int i = 0; t && i < HD / 2; i++) ff[k][i] = t[i];
        free(t);
    }
    float attn = 0;
    CHECK_OK(pkv_gguf_get_f32(g, "phi3.rope.scaling.attn_factor", &attn));
    /* mkmodel writes the converter's sqrt(1 + ln(ctx / orig) / ln(orig)) */
    CHECK_NEAR(attn, sqrt(1 + log(256.0 / ORIG) / log((double)ORIG)), 1e-6);
    ref_hparams hp = small_ref("phi3", 2, 1e-5, 1e4);
    hp.rope_neox = true;
    hp.rope_attn_factor = attn;
    ref_model *r[2];
    for (int k = 0; k < 2; k++) {
        hp.rope_factors = ff[long_set ? k == 0 : k == 1]; /* r[0]: the set this cache must use */
        r[k] = ref_model_create(&hp, ref_gguf_tensor, g);
    }
    pkv_cache_params cp = pkv_cache_default_params();
    cp.kv_type = PKV_TYPE_F32;
    cp.page_size = 5;
    cp.n_ctx = n_ctx;
    pkv_kv_cache *c = pkv_model_cache_create(m, cp);
    pkv_context *ctx = c ? pkv_context_create(m, c, 0) : NULL;
    uint64_t fp = 0;
    if (!r[0] || !r[1] || !ctx) {
        TH_FAIL("setup: %s", pkv_errmsg());
        goto done;
    }
    int nf = 0;
    const float *cf = pkv_kv_layout_rope_factors(pkv_kv_cache_layout(c), &nf);
    CHECK_INT(nf, HD / 2);
    for (int i = 0; cf && i < nf; i++) CHECK_NEAR(cf[i], ff[long_set][i], 0);
    fp = pkv_kv_layout_fingerprint(pkv_kv_cache_layout(c));
    const int NT = np + 5;
    int32_t toks[64];
    for (int i = 0; i < NT; i++) toks[i] = (i * 97 + 13) % V;
    float *got = malloc((size_t)NT * V * sizeof *got);
    double *want[2] = {malloc((size_t)NT * V * sizeof(double)), malloc((size_t)NT * V * sizeof(double))};
    CHECK_OK(pkv_context_decode_all(ctx, toks, np, got));
    for (int i = 0; i < 4; i++) {
        CHECK_OK(pkv_context_decode(ctx, &toks[np + i], 1));
        memcpy(got + (size_t)(np + i) * V, pkv_context_logits(ctx), V * sizeof(float));
    }
    for (int k = 0; k < 2; k++) CHECK_INT(ref_model_eval(r[k], toks, np + 4, NULL, want[k]), 0);
    if (shift) { /* drop positions 10..12: the later K turns back by 3 */
        CHECK_OK(pkv_context_shift(ctx, 10, 3));
        CHECK_OK(pkv_context_decode(ctx, &toks[np + 4], 1));
        memcpy(got + (size_t)(np + 4) * V, pkv_context_logits(ctx), V * sizeof(float));
        for (int k = 0; k < 2; k++) {
            CHECK_INT(ref_model_remove(r[k], 10, 13), 0);
            CHECK_INT(ref_model_eval(r[k], &toks[np + 4], 1, want[k] + (size_t)(np + 4) * V, NULL), 0);
        }
    }
    double worst = 0, other = 1e30;
    for (int t = 0; t < np + 4 + shift; t++) {
        worst = fmax(worst, ref_nmse(got + (size_t)t * V, want[0] + (size_t)t * V, V));
        if (t >= 4) other = fmin(other, ref_nmse(got + (size_t)t * V, want[1] + (size_t)t * V, V));
    }
    fprintf(stderr, "longrope n_ctx %d (%s factors), %d tokens%s: nmse %.2e; against the other set >= %.2e\n", n_ctx,
            long_set ? "long" : "short", np + 4, shift ? " and a shift" : "", worst, other);
    if (!(worst <= 1e-9)) TH_FAIL("n_ctx %d: nmse %g > 1e-9", n_ctx, worst);
    if (!(other > 1e-4)) TH_FAIL("n_ctx %d: the other factor set is as close (%g): the case does not tell them apart", n_ctx, other);
    th_checks += 2;
    free(got);
    free(want[0]);
    free(want[1]);
done:
    pkv_context_free(ctx);
    pkv_kv_cache_free(c);
    ref_model_free(r[0]);
    ref_model_free(r[1]);
    pkv_model_free(m);
    pkv_gguf_close(g);
    return fp;
}

static void test_forward(void) {
    pkv_mkmodel_params p = phi3_params();
    void *img;
    size_t size;
    REQUIRE_VOID(pkv_mkmodel_memory(&p, &img, &size) == PKV_OK);
    uint64_t fs = run(img, size, ORIG, 24, false, false);    /* within the original context: short */
    uint64_t fl = run(img, size, 4 * ORIG, 48, true, false); /* beyond it: long, positions past 32 */
    run(img, size, 4 * ORIG, 40, true, true);
    run(img, size, ORIG, 24, false, true);
    CHECK(fs != 0 && fl != 0 && fs != fl); /* K turned with other factors is other data */
    pkv_mkmodel_free_memory(img);
}

/* The image with the bytes after the tensor's name changed: n_dims (u32), ne[0]
 * (u64), type (u32) for a 1-D tensor; or a factor's value. */
typedef struct {
    const char *name;   /* a tensor, or NULL */
    const char *rename; /* its new name (same length), or NULL */
    int64_t ne0;        /* > 0: the new ne[0] */
    int type;           /* > 0: the new ggml type */
    int entry;          /* >= 0: factor entry set to value */
    float value;
    const char *expect;
} bad_case;

static void test_bad_files(void) {
    static const bad_case cases[] = {
        {"rope_factors_short.weight", "rope_factors_shorX.weight", 0, 0, -1, 0,
         "tensor 'rope_factors_long.weight' is present and 'rope_factors_short.weight' is not"},
        {"rope_factors_long.weight", "rope_factors_lonX.weight", 0, 0, -1, 0,
         "tensor 'rope_factors_short.weight' is present and 'rope_factors_long.weight' is not"},
        {"rope_factors_long.weight", NULL, 7, 0, -1, 0,
         "tensor 'rope_factors_long.weight' has shape [7, 1, 1, 1], expected [8] (rope.dimension_count 16 / 2)"},
        {"rope_factors_short.weight", NULL, 0, 1, -1, 0, "tensor 'rope_factors_short.weight' has type f16, expected f32"},
        {"rope_factors_short.weight", NULL, 0, 0, 3, 0.0f,
         "tensor 'rope_factors_short.weight' entry 3 is 0, expected a finite factor > 0"},
        {"rope_factors_long.weight", NULL, 0, 0, 7, -2.0f,
         "tensor 'rope_factors_long.weight' entry 7 is -2, expected a finite factor > 0"},
        {"rope_factors_long.weight", NULL, 0, 0, 0, INFINITY,
         "tensor 'rope_factors_long.weight' entry 0 is inf, expected a finite factor > 0"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const bad_case *bc = &cases[k];
        pkv_mkmodel_params p = phi3_params();
        void *img;
        size_t size;
        REQUIRE_VOID(pkv_mkmodel_memory(&p, &img, &size) == PKV_OK);
        uint8_t *b = img, *hit = NULL;
        const size_t n = strlen(bc->name);
        for (size_t i = 0; !hit && i + n <= size; i++)
            if (!memcmp(b + i, bc->name, n)) hit = b + i;
        CHECK(hit != NULL);
        if (hit && bc->rename) memcpy(hit, bc->rename, n);
        if (hit && bc->ne0 > 0) memcpy(hit + n + 4, &bc->ne0, 8);
        if (hit && bc->type > 0) memcpy(hit + n + 12, &bc->type, 4);
        if (hit && bc->entry >= 0) {
            pkv_gguf *g = pkv_gguf_open_memory(img, size, "patch");
            const pkv_gguf_tensor *t = g ? pkv_gguf_find_tensor(g, bc->name) : NULL;
            CHECK(t != NULL);
            if (t) memcpy(b + ((const uint8_t *)t->data - b) + 4 * bc->entry, &bc->value, 4);
            pkv_gguf_close(g);
        }
        pkv_model *m = hit ? pkv_model_load_memory(img, size, "bad longrope", pkv_model_default_params()) : NULL;
        CHECK(m == NULL);
        if (hit && !strstr(pkv_errmsg(), bc->expect)) TH_FAIL("case %zu: message '%s' lacks '%s'", k, pkv_errmsg(), bc->expect);
        pkv_model_free(m);
        pkv_mkmodel_free_memory(img);
    }
}

/* Factors on an architecture that does not read them, and mkmodel's option there */
static void test_other_arch(void) {
    pkv_gguf_writer *w = pkv_gguf_writer_create();
    REQUIRE_VOID(w);
    CHECK_OK(pkv_gguf_writer_add_str(w, "general.architecture", "llama"));
    CHECK_OK(pkv_gguf_writer_add_u32(w, "llama.block_count", 1));
    CHECK_OK(pkv_gguf_writer_add_u32(w, "llama.embedding_length", 64));
    CHECK_OK(pkv_gguf_writer_add_u32(w, "llama.attention.head_count", 4));
    CHECK_OK(pkv_gguf_writer_add_u32(w, "llama.feed_forward_length", 96));
    float f[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    int64_t ne[1] = {8};
    CHECK_OK(pkv_gguf_writer_add_tensor(w, "rope_factors_long.weight", PKV_TYPE_F32, 1, ne, f, sizeof f));
    void *data = NULL;
    size_t n = 0;
    CHECK_OK(pkv_gguf_writer_write_memory(w, &data, &n));
    pkv_gguf *g = data ? pkv_gguf_open_memory(data, n, "llama-lr") : NULL;
    pkv_hparams hp;
    int *nh = NULL, *nkv = NULL, *nff = NULL;
    CHECK(g != NULL);
    CHECK_STATUS(g ? pkv_hparams_read(g, &hp, &nh, &nkv, &nff) : PKV_ERR_UNSUPPORTED, PKV_ERR_UNSUPPORTED);
    CHECK_MSG("(LongRoPE) are not read by architecture 'llama'");
    pkv_gguf_close(g);
    pkv_free(data);
    pkv_gguf_writer_free(w);

    pkv_mkmodel_params p = pkv_mkmodel_default_params();
    p.rope_orig_ctx = 64;
    void *img = NULL;
    size_t size;
    CHECK_STATUS(pkv_mkmodel_memory(&p, &img, &size), PKV_ERR_INVALID);
    CHECK_MSG("LongRoPE factors (rope_orig_ctx) are for phi3, not llama");
    pkv_mkmodel_free_memory(img);
}

/* A cache given factors that are not finite and > 0, or whose count does not fit a
 * layer's rotation, is refused naming them; the model's forward pass refuses a
 * cache with other factors than its own. */
static void test_bad_cache(void) {
    pkv_device *dev = pkv_device_open("cpu", pkv_device_default_params());
    REQUIRE_VOID(dev);
    pkv_kv_layer_desc L = {.n_kv_heads = 2, .head_dim_k = HD, .head_dim_v = HD, .dtype_k = PKV_TYPE_F32,
                           .dtype_v = PKV_TYPE_F32};
    pkv_kv_params kp = pkv_kv_default_params();
    kp.n_layers = 1;
    kp.layers = &L;
    kp.device = dev;
    kp.n_pages = 4;
    float ff[HD / 2];
    for (int i = 0; i < HD / 2; i++) ff[i] = 1.5f;
    ff[5] = NAN;
    kp.rope_factors = ff;
    pkv_kv_cache *c = pkv_kv_cache_create(kp);
    CHECK(c == NULL);
    CHECK_MSG("KV layout: rope_factors[5] is nan, must be finite and > 0");
    ff[5] = 2.0f;
    L.rope_n_rot = HD / 2;
    c = pkv_kv_cache_create(kp);
    CHECK(c == NULL);
    CHECK_MSG("KV layout layer 0: rope_n_rot 8 differs from the 16 dims of rope_factors");
    pkv_kv_cache_free(c);

    /* the model's own layout with factors of its own: the forward pass refuses it */
    pkv_mkmodel_params p = phi3_params();
    void *img;
    size_t size;
    REQUIRE_VOID(pkv_mkmodel_memory(&p, &img, &size) == PKV_OK);
    pkv_model *m = pkv_model_load_memory(img, size, "longrope", pkv_model_default_params());
    REQUIRE_VOID(m);
    pkv_kv_layer_desc ML[2];
    pkv_kv_shard_desc MS[2];
    for (int set = 0; set < 3; set++) { /* none, factors of no set of the model's, and the short ones */
        pkv_kv_params mp = pkv_model_kv_params(m, ML, MS);
        mp.n_pages = 8;
        mp.rope_factors = set == 0 ? NULL : set == 1 ? ff : pkv_model_rope_factors(m, ORIG);
        pkv_kv_cache *mc = pkv_kv_cache_create(mp);
        pkv_context *ctx = mc ? pkv_context_create(m, mc, 0) : NULL;
        REQUIRE_VOID(ctx);
        int32_t t[3] = {5, 6, 7};
        if (set < 2) {
            CHECK_STATUS(pkv_context_decode(ctx, t, 3), PKV_ERR_INVALID);
            CHECK_MSG(set ? "the cache's K is rotated with other factors" : "the cache's K is rotated with none");
            CHECK_INT(pkv_context_n_tokens(ctx), 0); /* nothing changed */
        } else {
            CHECK_OK(pkv_context_decode(ctx, t, 3));
        }
        pkv_context_free(ctx);
        pkv_kv_cache_free(mc);
    }
    pkv_device_close(dev);
    pkv_model_free(m);
    pkv_mkmodel_free_memory(img);
}

/* ------------------------------------------------------------- smollm3 */

/* Logits of every position of np prompt tokens and 4 steps, then a shift of 3
 * tokens at 10 and one step (the last row), on a cache of page size 5. */
static bool decode_rows(pkv_model *m, pkv_type kv, int np, int32_t *toks, float *got) {
    pkv_cache_params cp = pkv_cache_default_params();
    cp.kv_type = kv;
    cp.page_size = 5;
    cp.n_ctx = 128;
    pkv_kv_cache *c = pkv_model_cache_create(m, cp);
    pkv_context *ctx = c ? pkv_context_create(m, c, cp.n_ctx) : NULL; /* past the training context (mistral3's 16) */
    bool ok = ctx && pkv_context_decode_all(ctx, toks, np, got) == PKV_OK;
    for (int i = 0; ok && i < 4; i++) {
        ok = pkv_context_decode(ctx, &toks[np + i], 1) == PKV_OK;
        if (ok) memcpy(got + (size_t)(np + i) * V, pkv_context_logits(ctx), V * sizeof(float));
    }
    ok = ok && pkv_context_shift(ctx, 10, 3) == PKV_OK && pkv_context_decode(ctx, &toks[np + 4], 1) == PKV_OK;
    if (ok) memcpy(got + (size_t)(np + 4) * V, pkv_context_logits(ctx), V * sizeof(float));
    if (!ok) TH_FAIL("decode: %s", pkv_errmsg());
    pkv_context_free(ctx);
    pkv_kv_cache_free(c);
    return ok;
}

/* The reference's rows for decode_rows' steps: worst NMSE against got. */
static double against_ref(const ref_hparams *hp, const pkv_gguf *g, int np, const int32_t *toks, const float *got) {
    ref_model *r = ref_model_create(hp, ref_gguf_tensor, (void *)g);
    double *want = malloc((size_t)(np + 5) * V * sizeof *want), worst = -1;
    if (r && want && ref_model_eval(r, toks, np + 4, NULL, want) == 0 && ref_model_remove(r, 10, 13) == 0 &&
        ref_model_eval(r, &toks[np + 4], 1, want + (size_t)(np + 4) * V, NULL) == 0) {
        worst = 0;
        for (int t = 0; t < np + 5; t++) worst = fmax(worst, ref_nmse(got + (size_t)t * V, want + (size_t)t * V, V));
    }
    free(want);
    ref_model_free(r);
    return worst;
}

static void test_smollm3(void) {
    pkv_mkmodel_params p = small_params("smollm3", 8); /* layers 3 and 7 without RoPE */
    void *img;
    size_t size;
    REQUIRE_VOID(pkv_mkmodel_memory(&p, &img, &size) == PKV_OK);
    pkv_gguf *g = pkv_gguf_open_memory(img, size, "smollm3");
    pkv_model *m = pkv_model_load_memory(img, size, "smollm3", pkv_model_default_params());
    REQUIRE_VOID(g && m);
    for (int il = 0; il < 8; il++) CHECK_INT(m->layers[il].nope, il == 3 || il == 7);
    enum { NP = 30 };
    int32_t toks[NP + 5];
    for (int i = 0; i < NP + 5; i++) toks[i] = (i * 97 + 13) % V;
    float *got = malloc((size_t)(NP + 5) * V * sizeof *got);
    ref_hparams hp = small_ref("llama", 8, 1e-6, 5e6);
    hp.nope_step = 4;
    if (got && decode_rows(m, PKV_TYPE_F32, NP, toks, got)) {
        const double e = against_ref(&hp, g, NP, toks, got);
        hp.nope_step = 0;
        const double other = against_ref(&hp, g, NP, toks, got);
        fprintf(stderr, "smollm3 (8 layers, 2 NoPE), %d tokens and a shift: nmse %.2e; RoPE on every layer %.2e\n",
                NP + 4, e, other);
        if (!(e >= 0 && e <= 1e-9)) TH_FAIL("smollm3: nmse %g > 1e-9", e);
        if (!(other > 1e-4)) TH_FAIL("smollm3: RoPE on every layer is as close (%g)", other);
        th_checks += 2;
    }
    /* the NoPE layers are part of the cache's geometry */
    pkv_kv_layer_desc L[8];
    pkv_kv_shard_desc S[8];
    pkv_kv_params kp = pkv_model_kv_params(m, L, S);
    kp.n_pages = 8;
    CHECK(L[3].rope_none && L[7].rope_none && !L[0].rope_none);
    pkv_kv_cache *c1 = pkv_kv_cache_create(kp);
    L[3].rope_none = L[7].rope_none = false;
    pkv_kv_cache *c2 = pkv_kv_cache_create(kp);
    CHECK(c1 && c2 &&
          pkv_kv_layout_fingerprint(pkv_kv_cache_layout(c1)) != pkv_kv_layout_fingerprint(pkv_kv_cache_layout(c2)));
    pkv_kv_cache_free(c1);
    pkv_kv_cache_free(c2);
    free(got);
    pkv_model_free(m);
    pkv_gguf_close(g);
    pkv_mkmodel_free_memory(img);
}

/* ------------------------------------------------------------ mistral3 */

static void test_mistral3(void) {
    pkv_mkmodel_params p = small_params("mistral3", 2);
    p.n_ctx = 16; /* mkmodel's YaRN original context min(256, n_ctx): the temperature steps at 16, 32 */
    void *img;
    size_t size;
    REQUIRE_VOID(pkv_mkmodel_memory(&p, &img, &size) == PKV_OK);
    pkv_gguf *g = pkv_gguf_open_memory(img, size, "mistral3");
    pkv_model *m = pkv_model_load_memory(img, size, "mistral3", pkv_model_default_params());
    REQUIRE_VOID(g && m);
    CHECK_NEAR(m->hp.attn_temp.scale, 0.1, 1e-7);
    CHECK_INT(m->hp.attn_temp.floor_len, 16);
    enum { NP = 40 };
    int32_t toks[NP + 5];
    for (int i = 0; i < NP + 5; i++) toks[i] = (i * 97 + 13) % V;
    float *got = malloc((size_t)(NP + 5) * V * sizeof *got);
    ref_hparams hp = small_ref("llama", 2, 1e-5, 1e6);
    hp.rope_freq_scale = 1.0 / 16; /* YaRN by 16 */
    hp.yarn_orig_ctx = 16;
    hp.yarn_mscale = 1.0; /* log multiplier 1: mscale(16, 1) / mscale(16, 1) */
    hp.attn_temp_scale = 0.1;
    hp.attn_temp_floor = 16;
    if (got && decode_rows(m, PKV_TYPE_F32, NP, toks, got)) {
        const double e = against_ref(&hp, g, NP, toks, got);
        hp.attn_temp_scale = 0;
        const double no_temp = against_ref(&hp, g, NP, toks, got);
        hp.attn_temp_scale = 0.1;
        hp.yarn_mscale = 0; /* YaRN's own magnitude 1 + 0.1 ln 16, as without the multiplier */
        const double no_mul = against_ref(&hp, g, NP, toks, got);
        fprintf(stderr, "mistral3 (YaRN 16 over 16, temperature 0.1), %d tokens and a shift: nmse %.2e; without the "
                        "temperature %.2e, without the log multiplier %.2e\n", NP + 4, e, no_temp, no_mul);
        if (!(e >= 0 && e <= 1e-9)) TH_FAIL("mistral3: nmse %g > 1e-9", e);
        if (!(no_temp > 1e-4 && no_mul > 1e-4)) TH_FAIL("mistral3: a reference without a feature is as close");
        th_checks += 2;
    }
    free(got);
    pkv_model_free(m);
    pkv_gguf_close(g);
    pkv_mkmodel_free_memory(img);
}

/* mistral3's keys refused naming them and their values; the log multiplier
 * elsewhere */
static void test_mistral3_bad(void) {
    static const struct {
        const char *arch;
        int n_rot;
        float log_mul, temp;
        const char *tensor, *expect;
    } cases[] = {
        {"mistral3", 8, 1, 0.1f, NULL, "'mistral3.rope.dimension_count' 8 differs from the head size 16"},
        {"mistral3", 16, 1, NAN, NULL, "key 'mistral3.attention.temperature_scale' is nan, must be finite"},
        {"mistral3", 16, -10, 0.1f, NULL, "gives YaRN a magnitude divisor of -1.77"},
        {"mistral3", 16, 1, 0.1f, "blk.0.attn_output.bias", "tensor 'blk.0.attn_output.bias' (mistral3's optional"},
        {"llama", 16, 1, 0, NULL, "key 'llama.rope.scaling.yarn_log_multiplier' (1, YaRN's magnitude multiplier) is not "
                                  "supported for 'llama'"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const char *a = cases[k].arch;
        char key[96];
        pkv_gguf_writer *w = pkv_gguf_writer_create();
        REQUIRE_VOID(w);
#define KEY(suffix) (snprintf(key, sizeof key, "%s.%s", a, suffix), key)
        CHECK_OK(pkv_gguf_writer_add_str(w, "general.architecture", a));
        CHECK_OK(pkv_gguf_writer_add_u32(w, KEY("block_count"), 1));
        CHECK_OK(pkv_gguf_writer_add_u32(w, KEY("embedding_length"), 64));
        CHECK_OK(pkv_gguf_writer_add_u32(w, KEY("attention.head_count"), 4));
        CHECK_OK(pkv_gguf_writer_add_u32(w, KEY("feed_forward_length"), 96));
        CHECK_OK(pkv_gguf_writer_add_u32(w, KEY("rope.dimension_count"), (uint32_t)cases[k].n_rot));
        CHECK_OK(pkv_gguf_writer_add_str(w, KEY("rope.scaling.type"), "yarn"));
        CHECK_OK(pkv_gguf_writer_add_f32(w, KEY("rope.scaling.factor"), 16));
        CHECK_OK(pkv_gguf_writer_add_f32(w, KEY("rope.scaling.yarn_log_multiplier"), cases[k].log_mul));
        if (cases[k].temp != 0) CHECK_OK(pkv_gguf_writer_add_f32(w, KEY("attention.temperature_scale"), cases[k].temp));
#undef KEY
        float bias[64] = {0};
        int64_t ne[1] = {64};
        if (cases[k].tensor) CHECK_OK(pkv_gguf_writer_add_tensor(w, cases[k].tensor, PKV_TYPE_F32, 1, ne, bias, sizeof bias));
        void *data = NULL;
        size_t n = 0;
        CHECK_OK(pkv_gguf_writer_write_memory(w, &data, &n));
        pkv_gguf *g = data ? pkv_gguf_open_memory(data, n, "m3") : NULL;
        pkv_hparams hp;
        int *nh = NULL, *nkv = NULL, *nff = NULL;
        CHECK(g != NULL);
        CHECK(g && pkv_hparams_read(g, &hp, &nh, &nkv, &nff) != PKV_OK);
        if (g && !strstr(pkv_errmsg(), cases[k].expect)) TH_FAIL("case %zu: '%s' lacks '%s'", k, pkv_errmsg(), cases[k].expect);
        pkv_gguf_close(g);
        pkv_free(data);
        pkv_gguf_writer_free(w);
    }
}

int main(void) {
    test_mistral3();
    test_mistral3_bad();
    test_smollm3();
    test_forward();
    test_bad_files();
    test_other_arch();
    test_bad_cache();
    return th_done();
}
