// labels: model
/* granitehybrid (IBM Granite 4.0-H) and nemotron_h (Nemotron-H / Nano 2) against a
 * plain double-precision reference written here from llama.cpp's
 * src/models/granite-hybrid.cpp, nemotron-h.cpp and mamba-base.cpp
 * (build_mamba2_layer): random-weight files from `mkmodel --arch granitehybrid` and
 * `--arch nemotron_h` (f32 weights and KV): Mamba-2 layers (conv with bias, SiLU, the
 * selective scan with grouped B/C, dt bias and softplus, the D skip, y * silu(z), the
 * grouped RMS norm), NoPE attention layers, granitehybrid's SwiGLU FFNs and Granite's
 * embedding, attention, residual and logit multipliers, nemotron_h's squared-ReLU MLP
 * layers. A prompt decoded at once and single steps, every position, at pages of 5
 * and of 16 tokens; the reference without the D skip must be far off. KV operations
 * (truncate, fork, swap, save/load) against a replay, bitwise. Split over cpu and
 * cpu:1 (by SSM groups), over three CPU devices (2 groups: the Mamba-2 layers whole on
 * the first) and on vulkan:0 where it opens, the same tolerance. Bad files
 * (inconsistent SSM sizes, a conv kernel of 0 or above the maximum, per-layer arrays
 * of the wrong length, missing ssm_* and MLP tensors, no norm epsilon) are refused
 * naming the key or tensor. */
#include <math.h>

#include "base/base.h"
#include "model/gguf.h"
#include "ref-gguf.h"
#include "ref-model.h"
#include "testhelp.h"

enum { V = 300, E = 64, NH = 4, NKV = 2, HD = 16, F = 96, NL = 4, NLMAX = 6, MAXP = 64 };
enum { P = 16, H = 2 * E / P, G = 2, N = 24, DC = 4, DI = H * P, C = DI + 2 * G * N };

/* granitehybrid: 4 layers (Mamba-2, attention, Mamba-2, Mamba-2), each with its FFN;
 * nemotron_h: 6 layers (Mamba-2, MLP, attention, twice) */
static bool is_nemo(const char *arch) { return !strcmp(arch, "nemotron_h"); }

static pkv_mkmodel_params params(const char *arch) {
    pkv_mkmodel_params p = pkv_mkmodel_default_params();
    p.arch = arch;
    p.type = PKV_TYPE_F32;
    p.n_layer = is_nemo(arch) ? NLMAX : NL;
    p.n_embd = E;
    p.n_head = NH;
    p.n_head_kv = NKV;
    p.head_dim = HD;
    p.n_ff = F;
    p.n_vocab = V;
    p.ssm_head_dim = P;
    p.ssm_state = N; /* not the head size: the two are apart in every real file */
    p.ssm_v_heads = H;
    p.ssm_k_heads = G;
    p.seed = 5;
    return p;
}

/* ------------------------------------------------------------- the reference */

typedef struct {
    const pkv_gguf *g;
    bool nemo;                    /* nemotron_h: one block a layer, no multipliers */
    int nl;
    double eps, es, as, rs, ls;
    bool no_d;                    /* the contrast: no D skip */
    double k[NLMAX][MAXP][NKV * HD], v[NLMAX][MAXP][NKV * HD];
    double conv[NLMAX][DC - 1][C]; /* the last DC - 1 conv inputs, oldest first */
    double ssm[NLMAX][H][P][N];    /* S_h[i][n] */
} gr_ref;

/* Layer l's kind: 'M' Mamba-2, '*' attention, '-' MLP (mkmodel's patterns) */
static char kind_of(const gr_ref *r, int l) { return r->nemo ? "M-*"[l % 3] : l % 4 == 1 ? '*' : 'M'; }

static double *T_(const gr_ref *r, int l, const char *suffix) { return ref_gguf_blk(r->g, l, suffix); }

static void mv(const gr_ref *r, int l, const char *w, const double *x, int rows, int cols, double *y) {
    ref_gguf_mv(r->g, l, w, NULL, x, rows, cols, y);
}

static void norm_by(const gr_ref *r, int l, const char *w, const double *x, int n, double *y) {
    ref_gguf_norm(r->g, l, w, x, n, r->eps, y);
}

static double softplus(double x) { return x > 20 ? x : log1p(exp(x)); }

/* the block's output o into x, times the residual multiplier */
static void residual(const gr_ref *r, double *x, const double *o) {
    for (int i = 0; i < E; i++) x[i] += r->rs * o[i];
}

/* x += Mamba-2 of layer l */
static void mamba2(gr_ref *r, int l, double *x) {
    double h[E], zxbcdt[2 * DI + 2 * G * N + H], u[C], y[DI], o[E];
    norm_by(r, l, "attn_norm.weight", x, E, h);
    mv(r, l, "ssm_in.weight", h, 2 * DI + 2 * G * N + H, E, zxbcdt);
    const double *z = zxbcdt, *xbc = zxbcdt + DI, *dt = zxbcdt + DI + C;
    double *cw = T_(r, l, "ssm_conv1d.weight"), *cb = T_(r, l, "ssm_conv1d.bias");
    for (int c = 0; c < C; c++) {
        double a = cb[c];
        for (int j = 0; j < DC - 1; j++) a += cw[c * DC + j] * r->conv[l][j][c];
        a += cw[c * DC + DC - 1] * xbc[c];
        u[c] = ref_silu(a);
    }
    for (int j = 0; j + 1 < DC - 1; j++) memcpy(r->conv[l][j], r->conv[l][j + 1], sizeof r->conv[l][j]);
    memcpy(r->conv[l][DC - 2], xbc, sizeof r->conv[l][DC - 2]);
    double *dtb = T_(r, l, "ssm_dt.bias"), *A = T_(r, l, "ssm_a"), *D = T_(r, l, "ssm_d");
    for (int hd = 0; hd < H; hd++) {
        const int gi = hd / (H / G);
        const double *xs = u + hd * P, *B = u + DI + gi * N, *Cc = u + DI + G * N + gi * N;
        const double d = softplus(dt[hd] + dtb[hd]), a = exp(d * A[hd]);
        for (int i = 0; i < P; i++) {
            double acc = 0;
            for (int n = 0; n < N; n++) {
                r->ssm[l][hd][i][n] = r->ssm[l][hd][i][n] * a + d * xs[i] * B[n];
                acc += r->ssm[l][hd][i][n] * Cc[n];
            }
            y[hd * P + i] = (acc + (r->no_d ? 0.0 : D[hd]) * xs[i]) * ref_silu(z[hd * P + i]);
        }
    }
    double *nw = T_(r, l, "ssm_norm.weight");
    for (int gi = 0; gi < G; gi++) ref_rms_norm(y + gi * (DI / G), nw + gi * (DI / G), DI / G, r->eps, y + gi * (DI / G));
    mv(r, l, "ssm_out.weight", y, E, DI, o);
    residual(r, x, o);
    free(cw), free(cb), free(dtb), free(A), free(D), free(nw);
}

/* x += attention of layer l at position pos (no RoPE; scores times attention.scale) */
static void attention(gr_ref *r, int l, int pos, double *x) {
    double h[E], q[NH * HD], att[NH * HD], o[E];
    norm_by(r, l, "attn_norm.weight", x, E, h);
    mv(r, l, "attn_q.weight", h, NH * HD, E, q);
    mv(r, l, "attn_k.weight", h, NKV * HD, E, r->k[l][pos]);
    mv(r, l, "attn_v.weight", h, NKV * HD, E, r->v[l][pos]);
    ref_attend(q, r->k[l][0], r->v[l][0], NKV * HD, pos + 1, NH, NKV, HD, r->as, att);
    mv(r, l, "attn_output.weight", att, E, NH * HD, o);
    residual(r, x, o);
}

/* One token at position pos: its logits */
static void ref_step(gr_ref *r, int32_t tok, int pos, double *logits) {
    double x[E], h[E], o[E], gs[F], us[F];
    double *emb = T_(r, -1, "token_embd.weight");
    for (int i = 0; i < E; i++) x[i] = emb[(size_t)tok * E + i] * r->es;
    free(emb);
    for (int l = 0; l < r->nl; l++) {
        if (kind_of(r, l) == '*') attention(r, l, pos, x);
        else if (kind_of(r, l) == 'M') mamba2(r, l, x);
        if (kind_of(r, l) == '-') { /* nemotron_h's MLP: down(relu(up·h)^2) */
            norm_by(r, l, "attn_norm.weight", x, E, h);
            mv(r, l, "ffn_up.weight", h, F, E, us);
            for (int i = 0; i < F; i++) us[i] = us[i] > 0 ? us[i] * us[i] : 0;
            mv(r, l, "ffn_down.weight", us, E, F, o);
            residual(r, x, o);
        }
        if (r->nemo) continue;
        double *gw = T_(r, l, "ffn_gate.weight"), *uw = T_(r, l, "ffn_up.weight"), *dw = T_(r, l, "ffn_down.weight");
        norm_by(r, l, "ffn_norm.weight", x, E, h);
        ref_ffn(gw, uw, dw, E, F, false, h, gs, us, o);
        residual(r, x, o);
        free(gw), free(uw), free(dw);
    }
    norm_by(r, -1, "output_norm.weight", x, E, h);
    double *ow = T_(r, -1, "output.weight");
    ref_matvec(ow, h, NULL, V, E, logits);
    for (int i = 0; i < V; i++) logits[i] /= r->ls;
    free(ow);
}

static gr_ref *ref_new(const pkv_gguf *g, const char *arch, bool no_d) {
    gr_ref *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->g = g, r->nemo = is_nemo(arch), r->nl = r->nemo ? NLMAX : NL, r->no_d = no_d;
    float eps = 0, es = 1, as = 1.0f / sqrtf((float)HD), rs = 1, ls = 1;
    char k[128];
    snprintf(k, sizeof k, "%s.attention.layer_norm_rms_epsilon", arch);
    CHECK_OK(pkv_gguf_get_f32(g, k, &eps));
    if (!r->nemo) {
        CHECK_OK(pkv_gguf_get_f32(g, "granitehybrid.embedding_scale", &es));
        CHECK_OK(pkv_gguf_get_f32(g, "granitehybrid.attention.scale", &as));
        CHECK_OK(pkv_gguf_get_f32(g, "granitehybrid.residual_scale", &rs));
        CHECK_OK(pkv_gguf_get_f32(g, "granitehybrid.logit_scale", &ls));
    }
    r->eps = eps, r->es = es, r->as = as, r->rs = rs, r->ls = ls;
    return r;
}

/* ------------------------------------------------------------- the tests */

/* A prompt decoded at once and 4 single steps, every position against the
 * reference, on dev with pages of page_size; the reference without the D skip must
 * be far off. */
static void test_forward(const char *arch, const char *dev, int page_size, double tol) {
    pkv_mkmodel_params p = params(arch);
    void *img = NULL;
    size_t size = 0;
    REQUIRE_VOID(pkv_mkmodel_memory(&p, &img, &size) == PKV_OK);
    pkv_gguf *g = pkv_gguf_open_memory(img, size, "granitehybrid");
    pkv_model_params mp = pkv_model_default_params();
    if (strchr(dev, ',')) mp.devices = dev;
    else mp.device = dev;
    pkv_model *m = g ? pkv_model_load_memory(img, size, "granitehybrid", mp) : NULL;
    pkv_cache_params cp = pkv_cache_default_params();
    cp.kv_type = PKV_TYPE_F32;
    cp.page_size = page_size;
    cp.n_ctx = MAXP;
    pkv_kv_cache *c = m ? pkv_model_cache_create(m, cp) : NULL;
    pkv_context *ctx = c ? pkv_context_create(m, c, 0) : NULL;
    gr_ref *r = ctx ? ref_new(g, arch, false) : NULL, *rb = r ? ref_new(g, arch, true) : NULL;
    enum { NP = 12, NT = NP + 4 };
    float *got = malloc((size_t)NT * V * sizeof *got);
    if (!rb || !got) {
        TH_FAIL("setup on %s: %s", dev, pkv_errmsg());
        goto done;
    }
    pkv_model_info mi;
    CHECK_OK(pkv_model_get_info(m, &mi));
    CHECK_INT(mi.n_recurrent, is_nemo(arch) ? 2 : 3);
    int32_t toks[NT];
    for (int i = 0; i < NT; i++) toks[i] = (i * 97 + 13) % V;
    double want[V], other[V];
    CHECK_OK(pkv_context_decode_all(ctx, toks, NP, got));
    for (int i = NP; i < NT; i++) {
        CHECK_OK(pkv_context_decode(ctx, &toks[i], 1));
        memcpy(got + (size_t)i * V, pkv_context_logits(ctx), V * sizeof(float));
    }
    double worst = 0, far = 0;
    for (int t = 0; t < NT; t++) {
        ref_step(r, toks[t], t, want);
        ref_step(rb, toks[t], t, other);
        worst = fmax(worst, ref_nmse(got + (size_t)t * V, want, V));
        far += ref_nmse(got + (size_t)t * V, other, V) / NT;
    }
    fprintf(stderr, "%s on %s, pages of %d: %d positions, nmse %.2e (tol %.0e); without the D skip %.2e on average\n",
            arch, dev, page_size, NT, worst, tol, far);
    if (!(worst < tol)) TH_FAIL("%s on %s: nmse %g against the reference", arch, dev, worst);
    if (!(far > 1e-4)) TH_FAIL("%s: the reference without the D skip is as close (%g)", arch, far);
    th_checks += 2;
done:
    free(got);
    free(r);
    free(rb);
    pkv_context_free(ctx);
    pkv_kv_cache_free(c);
    pkv_model_free(m);
    pkv_gguf_close(g);
    pkv_mkmodel_free_memory(img);
}

/* Logits after tokens t[0..n) on a fresh context of m and c (cold replay). */
static bool replay(pkv_model *m, pkv_kv_cache *c, const int32_t *t, int n, float *lg) {
    pkv_context *x = pkv_context_create(m, c, 0);
    bool ok = x && pkv_context_decode(x, t, n) == PKV_OK;
    if (ok) memcpy(lg, pkv_context_logits(x), V * sizeof(float));
    pkv_context_free(x);
    return ok;
}

static void same(const float *a, const float *b, const char *what) {
    if (memcmp(a, b, V * sizeof(float))) TH_FAIL("%s: logits differ from the replay's", what);
    else th_checks++;
}

/* KV operations on the Mamba-2 state against a replay, bitwise (q8_0 weights, pages
 * of 4): truncate into the middle of a prefill and of single steps (the state from
 * a checkpoint, then recomputed), fork (the child's state a copy, the parent's
 * untouched), swap out and in, save and load; a saved sequence of a model with
 * another state shape (4 groups) is refused on load. */
static void test_kv_ops(const char *arch) {
    pkv_mkmodel_params p = params(arch);
    p.type = PKV_TYPE_Q8_0;
    p.n_embd = 128, p.ssm_v_heads = 16;
    void *img = NULL, *img4 = NULL;
    size_t size = 0, size4 = 0;
    REQUIRE_VOID(pkv_mkmodel_memory(&p, &img, &size) == PKV_OK);
    p.ssm_k_heads = 4;
    REQUIRE_VOID(pkv_mkmodel_memory(&p, &img4, &size4) == PKV_OK);
    pkv_model *m = pkv_model_load_memory(img, size, "granite", pkv_model_default_params());
    pkv_model *m4 = pkv_model_load_memory(img4, size4, "granite4", pkv_model_default_params());
    pkv_cache_params cp = pkv_cache_default_params();
    cp.page_size = 4;
    cp.n_ctx = MAXP;
    cp.n_seq_max = 4;
    pkv_kv_cache *c = m ? pkv_model_cache_create(m, cp) : NULL, *c4 = m4 ? pkv_model_cache_create(m4, cp) : NULL;
    pkv_context *ctx = c ? pkv_context_create(m, c, 0) : NULL;
    REQUIRE_VOID(ctx && c4);
    int32_t t[40];
    for (int i = 0; i < 40; i++) t[i] = (i * 53 + 11) % V;
    static float want[V], got[V];
    /* a prefill of 18, then 6 single steps; truncate to 13 and to 21, each recomputed on */
    CHECK_OK(pkv_context_decode(ctx, t, 18));
    for (int i = 18; i < 24; i++) CHECK_OK(pkv_context_decode(ctx, &t[i], 1));
    static const int keeps[] = {21, 13};
    for (int k = 0; k < 2; k++) {
        CHECK_OK(pkv_context_truncate(ctx, keeps[k]));
        CHECK_OK(pkv_context_decode(ctx, &t[keeps[k]], 3));
        memcpy(got, pkv_context_logits(ctx), sizeof got);
        if (replay(m, c, t, keeps[k] + 3, want)) same(got, want, keeps[k] == 21 ? "truncate to 21" : "truncate to 13");
    }
    /* at 16: fork, both go on with other tokens */
    pkv_context *child = pkv_context_fork(ctx);
    CHECK(child != NULL);
    if (child) {
        int32_t u[19];
        memcpy(u, t, 16 * sizeof *u);
        u[16] = 7, u[17] = 8, u[18] = 9;
        CHECK_OK(pkv_context_decode(child, &u[16], 3));
        memcpy(got, pkv_context_logits(child), sizeof got);
        if (replay(m, c, u, 19, want)) same(got, want, "fork (child)");
        CHECK_OK(pkv_context_decode(ctx, &t[16], 2));
        memcpy(got, pkv_context_logits(ctx), sizeof got);
        if (replay(m, c, t, 18, want)) same(got, want, "fork (parent)");
        pkv_context_free(child);
    }
    /* swap out and in, then save and load: the next step as the replay's */
    CHECK_OK(pkv_context_swap_out(ctx));
    CHECK_OK(pkv_context_swap_in(ctx));
    CHECK_OK(pkv_context_decode(ctx, &t[18], 1));
    memcpy(got, pkv_context_logits(ctx), sizeof got);
    if (replay(m, c, t, 19, want)) same(got, want, "swap out and in");
    const char *path = th_tmp("granite.pkvseq");
    CHECK_OK(pkv_context_save(ctx, path));
    pkv_context_free(ctx);
    ctx = pkv_context_load(m, c, path, 0);
    CHECK(ctx != NULL);
    if (ctx) {
        CHECK_OK(pkv_context_decode(ctx, &t[19], 1));
        memcpy(got, pkv_context_logits(ctx), sizeof got);
        if (replay(m, c, t, 20, want)) same(got, want, "save and load");
    }
    pkv_context *other = pkv_context_load(m4, c4, path, 0);
    CHECK(other == NULL);
    pkv_context_free(other);
    unlink(path);
    pkv_context_free(ctx);
    pkv_kv_cache_free(c);
    pkv_kv_cache_free(c4);
    pkv_model_free(m);
    pkv_model_free(m4);
    pkv_mkmodel_free_memory(img);
    pkv_mkmodel_free_memory(img4);
}

/* A copy of g (pkv_free it) with the u32 array key set to n entries of value v. */
static void *with_array(const pkv_gguf *g, const char *key, int n, int32_t v, size_t *size) {
    pkv_gguf_writer *w = pkv_gguf_writer_create();
    bool ok = w != NULL;
    int32_t a[16];
    for (int i = 0; i < n && i < 16; i++) a[i] = i % 4 == 1 ? v : 0;
    for (int64_t i = 0; ok && i < pkv_gguf_n_kv(g); i++)
        ok = !strcmp(pkv_gguf_kv_key(g, i), key) ? !pkv_gguf_writer_add_arr(w, key, PKV_GGUF_INT32, a, (uint64_t)n)
                                                  : !pkv_gguf_writer_copy_kv(w, g, i);
    for (int64_t i = 0; ok && i < pkv_gguf_n_tensors(g); i++) {
        const pkv_gguf_tensor *t = pkv_gguf_tensor_at(g, i);
        ok = !pkv_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, t->n_bytes);
    }
    void *img = NULL;
    if (ok && pkv_gguf_writer_write_memory(w, &img, size)) img = NULL;
    pkv_gguf_writer_free(w);
    return img;
}

/* nemotron_h's own: a missing MLP tensor, a feed_forward_length array one short; its
 * norm epsilon from attention.layer_norm_epsilon without the RMS key, refused
 * naming that key without both. */
static void test_bad_nemotron(void) {
    pkv_mkmodel_params p = params("nemotron_h");
    void *img = NULL, *v1 = NULL;
    size_t size = 0, s1 = 0;
    REQUIRE_VOID(pkv_mkmodel_memory(&p, &img, &size) == PKV_OK);
    pkv_gguf *g = pkv_gguf_open_memory(img, size, "nemotron_h");
    REQUIRE_VOID(g);
    void *v = ref_gguf_variant(g, NULL, -1, "blk.1.ffn_up.weight", NULL, NULL, &s1);
    pkv_model *bad = v ? pkv_model_load_memory(v, s1, "bad nemotron_h", pkv_model_default_params()) : NULL;
    CHECK(v && !bad);
    CHECK_MSG("tensor 'blk.1.ffn_up.weight' not found");
    pkv_free(v);
    v = with_array(g, "nemotron_h.feed_forward_length", NLMAX - 1, F, &s1);
    bad = v ? pkv_model_load_memory(v, s1, "bad nemotron_h", pkv_model_default_params()) : NULL;
    CHECK(v && !bad);
    CHECK_MSG("key 'nemotron_h.feed_forward_length' has 5 entries, expected one per layer (6)");
    pkv_free(v);
    v1 = ref_gguf_variant(g, "nemotron_h.attention.layer_norm_rms_epsilon", -1, NULL, NULL, NULL, &s1);
    pkv_model *ok = v1 ? pkv_model_load_memory(v1, s1, "nemotron_h", pkv_model_default_params()) : NULL;
    CHECK(ok != NULL);
    pkv_model_free(ok);
    pkv_gguf *g1 = v1 ? pkv_gguf_open_memory(v1, s1, "nemotron_h") : NULL;
    size_t s2 = 0;
    v = g1 ? ref_gguf_variant(g1, "nemotron_h.attention.layer_norm_epsilon", -1, NULL, NULL, NULL, &s2) : NULL;
    bad = v ? pkv_model_load_memory(v, s2, "bad nemotron_h", pkv_model_default_params()) : NULL;
    CHECK(v && !bad);
    CHECK_MSG("nemotron_h.attention.layer_norm_epsilon");
    pkv_free(v);
    pkv_gguf_close(g1);
    pkv_free(v1);
    pkv_gguf_close(g);
    pkv_mkmodel_free_memory(img);
}

/* Bad files, each refused naming what is wrong. */
static void test_bad(void) {
    pkv_mkmodel_params p = params("granitehybrid");
    void *img;
    size_t size;
    REQUIRE_VOID(pkv_mkmodel_memory(&p, &img, &size) == PKV_OK);
    pkv_gguf *g = pkv_gguf_open_memory(img, size, "granitehybrid");
    REQUIRE_VOID(g);
    const struct {
        const char *key;
        int64_t set;
        const char *drop;
        const char *expect;
    } cases[] = {
        {"granitehybrid.ssm.inner_size", 100, NULL, "'granitehybrid.ssm.inner_size' 100 is not a multiple of the 8 heads"},
        {"granitehybrid.ssm.group_count", 3, NULL, "'granitehybrid.ssm.group_count' 3 does not divide the 8 heads"},
        {"granitehybrid.ssm.conv_kernel", 0, NULL, "key 'granitehybrid.ssm.conv_kernel' is 0"},
        {"granitehybrid.ssm.conv_kernel", 17, NULL, "key 'granitehybrid.ssm.conv_kernel' is 17"},
        {"granitehybrid.ssm.state_size", -1, NULL, "key 'granitehybrid.ssm.state_size' not found"},
        {"granitehybrid.ssm.time_step_rank", -1, NULL, "key 'granitehybrid.ssm.time_step_rank' not found"},
        {"granitehybrid.ssm.inner_size", 2 * DI, NULL, "tensor 'blk.0.ssm_in.weight' has shape"},
        {NULL, -1, "blk.0.ssm_in.weight", "tensor 'blk.0.ssm_in.weight' not found"},
        {NULL, -1, "blk.2.ssm_conv1d.weight", "tensor 'blk.2.ssm_conv1d.weight' not found"},
        {NULL, -1, "blk.0.ssm_dt.bias", "tensor 'blk.0.ssm_dt.bias' not found"},
        {NULL, -1, "blk.3.ssm_a", "tensor 'blk.3.ssm_a' not found"},
        {NULL, -1, "blk.0.ssm_d", "tensor 'blk.0.ssm_d' not found"},
        {NULL, -1, "blk.0.ssm_norm.weight", "tensor 'blk.0.ssm_norm.weight' not found"},
        {NULL, -1, "blk.0.ssm_out.weight", "tensor 'blk.0.ssm_out.weight' not found"},
        {NULL, -1, "blk.1.attn_k.weight", "tensor 'blk.1.attn_k.weight' not found"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        size_t vs = 0;
        void *v = ref_gguf_variant(g, cases[k].key, cases[k].set, cases[k].drop, NULL, NULL, &vs);
        pkv_model *bad = v ? pkv_model_load_memory(v, vs, "bad granitehybrid", pkv_model_default_params()) : NULL;
        if (!v) TH_FAIL("case %zu: no variant", k);
        else if (bad) TH_FAIL("case %zu (%s): loaded", k, cases[k].expect);
        else if (!strstr(pkv_errmsg(), cases[k].expect))
            TH_FAIL("case %zu: message '%s' lacks '%s'", k, pkv_errmsg(), cases[k].expect);
        else th_checks++;
        pkv_model_free(bad);
        pkv_free(v);
    }
    /* the layer-kind array: one entry short, and no Mamba-2 layer at all */
    const struct {
        int n;
        int32_t v;
        const char *expect;
    } arrs[] = {
        {NL - 1, NKV, "key 'granitehybrid.attention.head_count_kv' has 3 entries, expected one per layer (4)"},
        {NL + 1, NKV, "key 'granitehybrid.attention.head_count_kv' has 5 entries, expected one per layer (4)"},
    };
    for (size_t k = 0; k < sizeof arrs / sizeof arrs[0]; k++) {
        size_t vs = 0;
        void *v = with_array(g, "granitehybrid.attention.head_count_kv", arrs[k].n, arrs[k].v, &vs);
        pkv_model *bad = v ? pkv_model_load_memory(v, vs, "bad granitehybrid", pkv_model_default_params()) : NULL;
        CHECK(v && !bad);
        if (!strstr(pkv_errmsg(), arrs[k].expect)) TH_FAIL("array case %zu: message '%s'", k, pkv_errmsg());
        else th_checks++;
        pkv_model_free(bad);
        pkv_free(v);
    }
    pkv_gguf_close(g);
    pkv_mkmodel_free_memory(img);
    test_bad_nemotron();
}

int main(void) {
    static const char *const archs[] = {"granitehybrid", "nemotron_h"};
    pkv_device *vd = pkv_device_open("vulkan:0", pkv_device_default_params());
    const bool vk = vd != NULL;
    pkv_device_close(vd);
    for (int a = 0; a < 2; a++) {
        test_forward(archs[a], "cpu", 5, 1e-9);
        test_forward(archs[a], "cpu", 16, 1e-9);
        test_kv_ops(archs[a]);
        test_forward(archs[a], "cpu,cpu:1", 5, 1e-9);
        test_forward(archs[a], "cpu,cpu:1,cpu:2", 5, 1e-9); /* 2 groups, 3 devices: Mamba-2 on the first */
        if (vk) test_forward(archs[a], "vulkan:0", 5, 1e-9);
    }
    test_bad();
    if (!vk) printf("note: no vulkan:0 here; the Vulkan cases not run\n");
    return th_done();
}
