// labels: model
/* lfm2 (Liquid LFM2 / LFM2.5) against a plain double-precision reference written
 * here from llama.cpp's src/models/lfm2.cpp: a random-weight file from
 * `mkmodel --arch lfm2` (f32 weights and KV; 6 layers, layers 2 and 5 attention
 * with Q/K norms, the others gated short convolutions of 3 taps, whose state is the
 * last 2 inputs B*u of every channel), the final norm token_embd_norm. A prompt at
 * once and single steps, every position, on pages of 3 and of 16 tokens; the
 * reference with the conv's taps reversed (and with C and u traded) must be far
 * off, so the match is the conv's. The same split over cpu,cpu:1 (channel blocks
 * and KV heads) and on vulkan:0 where it opens. Bad files (l_cache 0 or above
 * PKV_SSM_CONV_MAX, a per-layer head_count_kv array of the wrong length, a missing
 * shortconv tensor or final norm, a sliding window) are refused naming the key or
 * tensor; a saved sequence continues bitwise in its own model and is refused by
 * one whose conv state has another shape. lfm2moe, made from the file with every
 * expert equal to the layer's FFN, gives its logits. */
#include <math.h>
#include <unistd.h>

#include "base/base.h"
#include "device/device.h"
#include "model/gguf.h"
#include "ref-gguf.h"
#include "ref-model.h"
#include "testhelp.h"

enum { V = 300, E = 64, NH = 4, NKV = 2, HD = 16, F = 96, NL = 6, MAXP = 64, LC = 3 };

static pkv_mkmodel_params params(void) {
    pkv_mkmodel_params p = pkv_mkmodel_default_params();
    p.arch = "lfm2";
    p.type = PKV_TYPE_F32;
    p.n_layer = NL;
    p.n_embd = E;
    p.n_head = NH;
    p.n_head_kv = NKV;
    p.n_ff = F;
    p.n_vocab = V;
    p.seed = 11;
    return p;
}

/* ------------------------------------------------------------- the reference */

typedef struct {
    const pkv_gguf *g;
    double eps, base;
    bool attends[NL];
    bool reversed, swap_cu;                 /* contrasts: the taps reversed; C and u traded */
    double bx[NL][MAXP][E];                 /* a conv layer's inputs B*u of every position */
    double k[NL][MAXP][NKV * HD], v[NL][MAXP][NKV * HD];
} lfm_ref;

static double *T_(const lfm_ref *r, int l, const char *suffix) { return ref_gguf_blk(r->g, l, suffix); }

static void mv(const lfm_ref *r, int l, const char *w, const double *x, int rows, int cols, double *y) {
    ref_gguf_mv(r->g, l, w, NULL, x, rows, cols, y);
}

static void norm_by(const lfm_ref *r, int l, const char *w, const double *x, int n, double *y) {
    ref_gguf_norm(r->g, l, w, x, n, r->eps, y);
}

/* x += the short conv of layer l at position pos:
 * B, C, u = in_proj·h; bx = B*u; conv over the last LC bx; y = C*conv; out_proj·y */
static void short_conv(lfm_ref *r, int l, int pos, double *x) {
    double h[E], bcu[3 * E], y[E], o[E];
    norm_by(r, l, "attn_norm.weight", x, E, h);
    mv(r, l, "shortconv.in_proj.weight", h, 3 * E, E, bcu);
    const double *B = bcu, *C = r->swap_cu ? bcu + 2 * E : bcu + E, *u = r->swap_cu ? bcu + E : bcu + 2 * E;
    for (int i = 0; i < E; i++) r->bx[l][pos][i] = B[i] * u[i];
    double *w = T_(r, l, "shortconv.conv.weight"); /* [E][LC], tap LC - 1 the token itself */
    for (int i = 0; i < E; i++) {
        double s = 0;
        for (int j = 0; j < LC; j++) {
            const int t = pos - (LC - 1) + j;
            if (t >= 0) s += w[i * LC + (r->reversed ? LC - 1 - j : j)] * r->bx[l][t][i];
        }
        y[i] = C[i] * s;
    }
    free(w);
    mv(r, l, "shortconv.out_proj.weight", y, E, E, o);
    for (int i = 0; i < E; i++) x[i] += o[i];
}

/* x += attention of layer l at position pos (Q/K norms, neox RoPE over the head) */
static void attention(lfm_ref *r, int l, int pos, double *x) {
    double h[E], q[NH * HD], att[NH * HD], o[E];
    norm_by(r, l, "attn_norm.weight", x, E, h);
    mv(r, l, "attn_q.weight", h, NH * HD, E, q);
    mv(r, l, "attn_k.weight", h, NKV * HD, E, r->k[l][pos]);
    mv(r, l, "attn_v.weight", h, NKV * HD, E, r->v[l][pos]);
    double *qn = T_(r, l, "attn_q_norm.weight"), *kn = T_(r, l, "attn_k_norm.weight");
    for (int hd = 0; hd < NH; hd++) ref_rms_norm(q + hd * HD, qn, HD, r->eps, q + hd * HD);
    for (int hd = 0; hd < NKV; hd++) ref_rms_norm(r->k[l][pos] + hd * HD, kn, HD, r->eps, r->k[l][pos] + hd * HD);
    ref_rope(q, NH, HD, pos, r->base, true);
    ref_rope(r->k[l][pos], NKV, HD, pos, r->base, true);
    free(qn);
    free(kn);
    ref_attend(q, r->k[l][0], r->v[l][0], NKV * HD, pos + 1, NH, NKV, HD, 1.0 / sqrt((double)HD), att);
    mv(r, l, "attn_output.weight", att, E, NH * HD, o);
    for (int i = 0; i < E; i++) x[i] += o[i];
}

static void ffn(const lfm_ref *r, int l, double *x) {
    double h[E], g[F], u[F], y[E];
    norm_by(r, l, "ffn_norm.weight", x, E, h);
    double *G = T_(r, l, "ffn_gate.weight"), *U = T_(r, l, "ffn_up.weight"), *D = T_(r, l, "ffn_down.weight");
    ref_ffn(G, U, D, E, F, false, h, g, u, y);
    free(G), free(U), free(D);
    for (int i = 0; i < E; i++) x[i] += y[i];
}

/* logits of token tok at position pos: the layers, token_embd_norm, output */
static void step(lfm_ref *r, int32_t tok, int pos, double *logits) {
    int64_t n = 0;
    double x[E], hn[E];
    double *te = ref_gguf_tensor((void *)r->g, "token_embd.weight", &n);
    memcpy(x, te + (size_t)tok * E, E * sizeof *x);
    free(te);
    for (int l = 0; l < NL; l++) {
        if (r->attends[l]) attention(r, l, pos, x);
        else short_conv(r, l, pos, x);
        ffn(r, l, x);
    }
    double *nw = ref_gguf_tensor((void *)r->g, "token_embd_norm.weight", &n), *out = ref_gguf_tensor((void *)r->g, "output.weight", &n);
    if (!out) out = ref_gguf_tensor((void *)r->g, "token_embd.weight", &n);
    ref_rms_norm(x, nw, E, r->eps, hn);
    ref_matvec(out, hn, NULL, V, E, logits);
    free(nw);
    free(out);
}

static lfm_ref *ref_new(const pkv_gguf *g) {
    lfm_ref *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->g = g;
    float eps = 0, base = 0;
    uint32_t lc = 0;
    pkv_gguf_array a;
    CHECK_OK(pkv_gguf_get_f32(g, "lfm2.attention.layer_norm_rms_epsilon", &eps));
    CHECK_OK(pkv_gguf_get_f32(g, "lfm2.rope.freq_base", &base));
    CHECK_OK(pkv_gguf_get_u32(g, "lfm2.shortconv.l_cache", &lc));
    CHECK_INT((int)lc, LC);
    /* llama.cpp's rule: a layer of 0 KV heads is a convolution */
    CHECK_OK(pkv_gguf_get_arr(g, "lfm2.attention.head_count_kv", PKV_GGUF_TYPE_COUNT, &a));
    CHECK_INT((int)a.count, NL);
    for (int l = 0; l < NL && l < (int)a.count; l++) r->attends[l] = pkv_gguf_arr_int(&a, (uint64_t)l) != 0;
    r->eps = eps, r->base = base;
    return r;
}

/* ------------------------------------------------------------- the tests */

/* A prompt decoded at once and 4 single steps on dev with pages of page_size,
 * every position against the reference; the contrasts must be far off. */
static void test_forward(const void *img, size_t size, const char *dev, int page_size, double tol) {
    pkv_gguf *g = pkv_gguf_open_memory(img, size, "lfm2");
    pkv_model_params mp = pkv_model_default_params();
    if (strchr(dev, ',')) mp.devices = dev; /* split: channel blocks, KV heads, FFN rows */
    else mp.device = dev;
    pkv_model *m = pkv_model_load_memory(img, size, "lfm2", mp);
    pkv_cache_params cp = pkv_cache_default_params();
    cp.kv_type = PKV_TYPE_F32;
    cp.page_size = page_size;
    cp.n_ctx = MAXP;
    pkv_kv_cache *c = m ? pkv_model_cache_create(m, cp) : NULL;
    pkv_context *ctx = c ? pkv_context_create(m, c, 0) : NULL;
    lfm_ref *r = g ? ref_new(g) : NULL, *rr = g ? ref_new(g) : NULL, *rs = g ? ref_new(g) : NULL;
    enum { NP = 13, NT = NP + 4 };
    float *got = malloc((size_t)NT * V * sizeof *got);
    if (!ctx || !r || !rr || !rs || !got) {
        TH_FAIL("setup on %s: %s", dev, pkv_errmsg());
        goto done;
    }
    pkv_model_info mi;
    pkv_model_get_info(m, &mi);
    CHECK_INT(mi.n_recurrent, 4);
    pkv_kv_stats ks;
    pkv_kv_stats_get(c, &ks);
    /* a sequence's state: LC - 1 inputs of E floats in each of the 4 conv layers */
    if (!strchr(dev, ',')) CHECK_INT((int64_t)ks.state_slot_bytes, 4 * (LC - 1) * E * 4);
    rr->reversed = true;
    rs->swap_cu = true;
    int32_t toks[NT];
    for (int i = 0; i < NT; i++) toks[i] = (i * 97 + 13) % V;
    CHECK_OK(pkv_context_decode_all(ctx, toks, NP, got));
    for (int i = NP; i < NT; i++) {
        CHECK_OK(pkv_context_decode(ctx, &toks[i], 1));
        memcpy(got + (size_t)i * V, pkv_context_logits(ctx), V * sizeof(float));
    }
    double worst = 0, far_r = 0, far_s = 0, want[V], other[V];
    for (int t = 0; t < NT; t++) {
        step(r, toks[t], t, want);
        worst = fmax(worst, ref_nmse(got + (size_t)t * V, want, V));
        step(rr, toks[t], t, other);
        far_r += ref_nmse(got + (size_t)t * V, other, V) / NT;
        step(rs, toks[t], t, other);
        far_s += ref_nmse(got + (size_t)t * V, other, V) / NT;
    }
    fprintf(stderr, "lfm2 on %s, pages of %d: %d positions, nmse %.2e (tol %.0e); taps reversed %.2e, C and u traded %.2e\n",
            dev, page_size, NT, worst, tol, far_r, far_s);
    if (!(worst < tol)) TH_FAIL("%s pages of %d: nmse %g against the reference", dev, page_size, worst);
    if (!(far_r > 1e-4 && far_s > 1e-4)) TH_FAIL("the contrasts are as close (%g, %g): the case does not test them", far_r, far_s);
    th_checks += 2;
done:
    free(got);
    free(r);
    free(rr);
    free(rs);
    pkv_context_free(ctx);
    pkv_kv_cache_free(c);
    pkv_model_free(m);
    pkv_gguf_close(g);
}

/* A copy of image g with key `key` replaced by an i32 array of n entries (the
 * first n of kv, 0 past NL) (pkv_free it). */
static void *with_kv_array(const pkv_gguf *g, const char *key, int n, size_t *size) {
    int32_t kv[NL + 2];
    for (int l = 0; l < n; l++) kv[l] = l < NL && l % 3 == 2 ? NKV : 0;
    pkv_gguf_writer *w = pkv_gguf_writer_create();
    bool ok = w != NULL;
    for (int64_t i = 0; ok && i < pkv_gguf_n_kv(g); i++)
        ok = !strcmp(pkv_gguf_kv_key(g, i), key) ? !pkv_gguf_writer_add_arr(w, key, PKV_GGUF_INT32, kv, (uint64_t)n)
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

/* Bad files, each refused naming what is wrong. */
static void test_bad(const void *img, size_t size) {
    pkv_gguf *g = pkv_gguf_open_memory(img, size, "lfm2");
    REQUIRE_VOID(g);
    const struct {
        const char *key;
        int64_t set;
        const char *drop;
        int kv_len; /* > 0: head_count_kv as an array of this many entries */
        const char *expect;
    } cases[] = {
        {"lfm2.shortconv.l_cache", 0, NULL, 0, "key 'lfm2.shortconv.l_cache' is 0"},
        {"lfm2.shortconv.l_cache", 1, NULL, 0, "key 'lfm2.shortconv.l_cache' is 1"},
        {"lfm2.shortconv.l_cache", PKV_SSM_CONV_MAX + 1, NULL, 0, "'lfm2.shortconv.l_cache' is 17"},
        {"lfm2.shortconv.l_cache", -1, NULL, 0, "lfm2.shortconv.l_cache"},
        {"lfm2.attention.sliding_window", 4, NULL, 0, "'lfm2.attention.sliding_window' 4"},
        {NULL, -1, NULL, NL - 1, "'lfm2.attention.head_count_kv' has 5 entries, expected one per layer (6)"},
        {NULL, -1, NULL, NL + 1, "'lfm2.attention.head_count_kv' has 7 entries"},
        {NULL, -1, "blk.0.shortconv.in_proj.weight", 0, "blk.0.shortconv.in_proj.weight"},
        {NULL, -1, "blk.1.shortconv.conv.weight", 0, "blk.1.shortconv.conv.weight"},
        {NULL, -1, "blk.3.shortconv.out_proj.weight", 0, "blk.3.shortconv.out_proj.weight"},
        {NULL, -1, "blk.2.attn_k_norm.weight", 0, "blk.2.attn_k_norm.weight"},
        {NULL, -1, "token_embd_norm.weight", 0, "token_embd_norm.weight"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        size_t vs = 0;
        void *v = cases[k].kv_len ? with_kv_array(g, "lfm2.attention.head_count_kv", cases[k].kv_len, &vs)
                  : cases[k].key && pkv_gguf_find_key(g, cases[k].key) < 0
                      ? NULL
                      : ref_gguf_variant(g, cases[k].key, cases[k].set, cases[k].drop, NULL, NULL, &vs);
        if (!v && cases[k].key && pkv_gguf_find_key(g, cases[k].key) < 0) { /* a key the file lacks: added */
            pkv_gguf_writer *w = pkv_gguf_writer_create();
            for (int64_t i = 0; w && i < pkv_gguf_n_kv(g); i++) pkv_gguf_writer_copy_kv(w, g, i);
            if (w) pkv_gguf_writer_add_u32(w, cases[k].key, (uint32_t)cases[k].set);
            for (int64_t i = 0; w && i < pkv_gguf_n_tensors(g); i++) {
                const pkv_gguf_tensor *t = pkv_gguf_tensor_at(g, i);
                pkv_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, t->n_bytes);
            }
            if (w && pkv_gguf_writer_write_memory(w, &v, &vs)) v = NULL;
            pkv_gguf_writer_free(w);
        }
        if (!v) {
            TH_FAIL("case %zu: no variant", k);
            continue;
        }
        pkv_model *bad = pkv_model_load_memory(v, vs, "bad lfm2", pkv_model_default_params());
        if (bad) TH_FAIL("case %zu (%s): loaded", k, cases[k].expect);
        else if (!strstr(pkv_errmsg(), cases[k].expect))
            TH_FAIL("case %zu: message '%s' does not name %s", k, pkv_errmsg(), cases[k].expect);
        else th_checks++;
        pkv_model_free(bad);
        pkv_free(v);
    }
    pkv_gguf_close(g);
}

/* A saved sequence loads back into its own model (and continues bitwise); into
 * an lfm2 model whose conv state has another shape (8 channel blocks of 8, not 4 of
 * 16) it is refused. */
static void test_save_other(const void *img, size_t size) {
    pkv_mkmodel_params p2 = params();
    p2.n_head = 8;
    p2.n_head_kv = 2;
    p2.head_dim = 8;
    void *img2 = NULL;
    size_t size2 = 0;
    pkv_model *m = pkv_model_load_memory(img, size, "lfm2", pkv_model_default_params());
    pkv_model *m2 = pkv_mkmodel_memory(&p2, &img2, &size2) ? NULL
                                                          : pkv_model_load_memory(img2, size2, "lfm2 b", pkv_model_default_params());
    pkv_cache_params cp = pkv_cache_default_params();
    cp.n_ctx = MAXP;
    pkv_kv_cache *c = m ? pkv_model_cache_create(m, cp) : NULL, *c2 = m2 ? pkv_model_cache_create(m2, cp) : NULL;
    pkv_context *ctx = c ? pkv_context_create(m, c, 0) : NULL;
    const int32_t toks[6] = {3, 1, 4, 1, 5, 9}, next = 2;
    const char *path = th_tmp("lfm2.pkvseq");
    REQUIRE_VOID(ctx && c2 && pkv_context_decode(ctx, toks, 6) == PKV_OK && pkv_context_save(ctx, path) == PKV_OK);
    pkv_context *back = pkv_context_load(m2, c2, path, 0);
    CHECK(back == NULL);
    fprintf(stderr, "lfm2 sequence into another state shape: %s\n", pkv_errmsg());
    CHECK_MSG("recurrent layer 0 has a state of 4 heads x 32 floats in the file, 8 x 16 in the cache");
    pkv_context *same = pkv_context_load(m, c, path, 0);
    CHECK(same != NULL);
    if (same) {
        static float a[V], b[V];
        CHECK_OK(pkv_context_decode(ctx, &next, 1));
        memcpy(a, pkv_context_logits(ctx), sizeof a);
        CHECK_OK(pkv_context_decode(same, &next, 1));
        memcpy(b, pkv_context_logits(same), sizeof b);
        CHECK_MEM(a, b, sizeof a);
    }
    pkv_context_free(same);
    pkv_context_free(back);
    pkv_context_free(ctx);
    pkv_kv_cache_free(c);
    pkv_kv_cache_free(c2);
    pkv_model_free(m);
    pkv_model_free(m2);
    pkv_mkmodel_free_memory(img2);
    unlink(path);
}

/* lfm2moe from an lfm2 file g (pkv_free it): layer 0 stays dense, every later
 * layer's FFN becomes 3 equal experts (each the layer's FFN) of which 2 are used,
 * with a random router and exp_probs_b; the weights are normalised, so each layer
 * gives the dense FFN's output. drop: that tensor or key left out. */
static void *moe_of(const pkv_gguf *g, const char *drop, size_t *size) {
    enum { X = 3 };
    pkv_gguf_writer *w = pkv_gguf_writer_create();
    bool ok = w != NULL;
    for (int64_t i = 0; ok && i < pkv_gguf_n_kv(g); i++) {
        const char *key = pkv_gguf_kv_key(g, i);
        char as[128];
        snprintf(as, sizeof as, "lfm2moe.%s", key + 5);
        if (!strcmp(key, "general.architecture")) ok = !pkv_gguf_writer_add_str(w, key, "lfm2moe");
        else ok = !pkv_gguf_writer_copy_kv_as(w, g, i, strncmp(key, "lfm2.", 5) ? key : as);
    }
    ok = ok && !pkv_gguf_writer_add_u32(w, "lfm2moe.expert_count", X) &&
         !pkv_gguf_writer_add_u32(w, "lfm2moe.expert_used_count", 2) &&
         !pkv_gguf_writer_add_u32(w, "lfm2moe.expert_feed_forward_length", F) &&
         !pkv_gguf_writer_add_u32(w, "lfm2moe.leading_dense_block_count", 1) &&
         (drop && !strcmp(drop, "lfm2moe.expert_gating_func") ? true
                                                              : !pkv_gguf_writer_add_u32(w, "lfm2moe.expert_gating_func", 2));
    uint64_t rs = 5;
    for (int64_t i = 0; ok && i < pkv_gguf_n_tensors(g); i++) {
        const pkv_gguf_tensor *t = pkv_gguf_tensor_at(g, i);
        const char *ffn = strstr(t->name, ".ffn_");
        if (!ffn || !strncmp(t->name, "blk.0.", 6) || strstr(t->name, "ffn_norm")) {
            ok = !pkv_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, t->n_bytes);
            continue;
        }
        const size_t n = (size_t)t->n_elements;
        float *xs = pkv_malloc(X * n * sizeof(float));
        if (!(ok = xs != NULL)) break;
        for (size_t k = 0; k < X * n; k++) xs[k] = ((const float *)t->data)[k % n];
        char nm[96], base[64];
        snprintf(base, sizeof base, "%.*s", (int)(ffn - t->name), t->name); /* blk.N */
        snprintf(nm, sizeof nm, "%s.%.*s_exps.weight", base, (int)(strstr(ffn, ".weight") - ffn - 1), ffn + 1);
        int64_t ne3[3] = {t->ne[0], t->ne[1], X};
        ok = !pkv_gguf_writer_add_tensor(w, nm, t->type, 3, ne3, xs, X * t->n_bytes);
        if (ok && strstr(ffn, "_down")) { /* this layer's router and selection bias */
            const int64_t ner[2] = {E, X};
            for (int64_t k = 0; k < X * E; k++) xs[k] = th_randf(&rs);
            snprintf(nm, sizeof nm, "%s.ffn_gate_inp.weight", base);
            ok = !pkv_gguf_writer_add_tensor(w, nm, PKV_TYPE_F32, 2, ner, xs, (size_t)(X * E) * 4);
            snprintf(nm, sizeof nm, "%s.exp_probs_b.bias", base);
            if (ok && !(drop && !strcmp(nm, drop)))
                ok = !pkv_gguf_writer_add_tensor(w, nm, PKV_TYPE_F32, 1, ner + 1, xs, X * 4);
        }
        pkv_free(xs);
    }
    void *img = NULL;
    if (ok && pkv_gguf_writer_write_memory(w, &img, size)) img = NULL;
    pkv_gguf_writer_free(w);
    return img;
}

/* lfm2moe gives lfm2's logits where every expert is the dense FFN (f32: the
 * weighted sum of equal outputs; nmse 1e-10), on cpu and split over cpu,cpu:1;
 * without exp_probs_b or expert_gating_func it is refused naming them. */
static void test_moe(const void *img, size_t size) {
    pkv_gguf *g = pkv_gguf_open_memory(img, size, "lfm2");
    size_t ms = 0;
    void *mimg = g ? moe_of(g, NULL, &ms) : NULL;
    REQUIRE_VOID(mimg);
    static const char *const devs[] = {"cpu", "cpu,cpu:1"};
    for (int d = 0; d < 2; d++) {
        enum { NT = 12 };
        static float a[NT * V], b[NT * V];
        int32_t toks[NT];
        for (int i = 0; i < NT; i++) toks[i] = (i * 53 + 7) % V;
        bool ok = true;
        for (int k = 0; k < 2 && ok; k++) {
            pkv_model_params mp = pkv_model_default_params();
            if (d) mp.devices = devs[d];
            pkv_model *m = k ? pkv_model_load_memory(mimg, ms, "lfm2moe", mp) : pkv_model_load_memory(img, size, "lfm2", mp);
            pkv_cache_params cp = pkv_cache_default_params();
            cp.kv_type = PKV_TYPE_F32;
            cp.n_ctx = MAXP;
            pkv_kv_cache *c = m ? pkv_model_cache_create(m, cp) : NULL;
            pkv_context *ctx = c ? pkv_context_create(m, c, 0) : NULL;
            ok = ctx && pkv_context_decode_all(ctx, toks, NT, k ? b : a) == PKV_OK;
            if (!ok) TH_FAIL("lfm2%s on %s: %s", k ? "moe" : "", devs[d], pkv_errmsg());
            if (ok && k) {
                pkv_model_info mi;
                pkv_model_get_info(m, &mi);
                CHECK_INT(mi.n_expert, 3);
            }
            pkv_context_free(ctx);
            pkv_kv_cache_free(c);
            pkv_model_free(m);
        }
        if (!ok) continue;
        double e = th_nmse(a, b, NT * V);
        fprintf(stderr, "lfm2moe (equal experts) vs lfm2 on %s: nmse %.2e (tol 1e-10)\n", devs[d], e);
        if (!(e <= 1e-10)) TH_FAIL("lfm2moe on %s: nmse %g against lfm2", devs[d], e);
        th_checks++;
    }
    static const char *const drops[] = {"blk.3.exp_probs_b.bias", "lfm2moe.expert_gating_func"};
    for (int k = 0; k < 2; k++) {
        size_t vs = 0;
        void *v = moe_of(g, drops[k], &vs);
        pkv_model *bad = v ? pkv_model_load_memory(v, vs, "bad lfm2moe", pkv_model_default_params()) : NULL;
        CHECK(v && !bad);
        if (!strstr(pkv_errmsg(), drops[k])) TH_FAIL("lfm2moe without %s: message '%s'", drops[k], pkv_errmsg());
        pkv_model_free(bad);
        pkv_free(v);
    }
    pkv_free(mimg);
    pkv_gguf_close(g);
}

int main(void) {
    pkv_mkmodel_params p = params();
    void *img = NULL;
    size_t size = 0;
    REQUIRE(pkv_mkmodel_memory(&p, &img, &size) == PKV_OK);
    test_forward(img, size, "cpu", 3, 1e-9);
    test_forward(img, size, "cpu", 16, 1e-9);
    test_bad(img, size);
    test_save_other(img, size);
    test_moe(img, size);
    /* split over two CPU devices: two channel blocks and one KV head each */
    test_forward(img, size, "cpu,cpu:1", 3, 1e-9);
    pkv_device *vk = pkv_device_open("vulkan:0", pkv_device_default_params());
    if (vk) {
        pkv_device_close(vk);
        test_forward(img, size, "vulkan:0", 3, 1e-9);
        test_forward(img, size, "vulkan:0", 16, 1e-9);
    } else {
        printf("note: no vulkan:0 here; the Vulkan cases not run\n");
    }
    pkv_mkmodel_free_memory(img);
    return th_done();
}
