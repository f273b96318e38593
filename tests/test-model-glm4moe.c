// labels: model
/* glm4moe (GLM-4.5/4.6/4.7) against a plain double-precision reference written
 * here from llama.cpp's src/models/glm4-moe.cpp: a random-weight file from
 * `mkmodel --arch glm4moe` (f32 weights and KV) with a dense first layer, mixture
 * layers with and without Q/K norms, Q/K/V biases, half of each head rotated (neox),
 * sigmoid routing with the exp_probs_b selection bias, normalized weights times
 * expert_weights_scale and a shared expert; again with 2 expert groups of which 1
 * is used (expert_group_count, _used_count), which llama.cpp matches too. Every
 * position of a prompt and single steps; the reference with the routing bias
 * dropped (with groups: the groups) must be far off, so the match is theirs. Its
 * MTP head (the nextn layer after the trunk, fed the
 * trunk's hidden states) against the reference of that layer. Bad files (the
 * dense count past the trunk, one Q/K norm without the other, a missing routing
 * bias or shared expert, M-RoPE sections, K and V heads of different sizes) are
 * refused naming the key or tensor. The forward and the MTP head again split
 * over cpu and cpu:1 (heads, FFN rows, whole experts) and on vulkan:0 where it
 * opens (the same tolerance; measured 7e-13). */
#include <math.h>

#include "base/base.h"
#include "engine/engine.h"
#include "model/gguf.h"
#include "ref-gguf.h"
#include "ref-model.h"
#include "testhelp.h"

enum { V = 300, E = 64, NH = 4, NKV = 2, HD = 16, NROT = 8, F = 32, X = 4, K = 2, MAXP = 64 };

static pkv_mkmodel_params params(int n_layer, int n_mtp) {
    pkv_mkmodel_params p = pkv_mkmodel_default_params();
    p.arch = "glm4moe";
    p.type = PKV_TYPE_F32;
    p.n_layer = n_layer;
    p.n_embd = E;
    p.n_head = NH;
    p.n_head_kv = NKV;
    p.head_dim = HD;
    p.n_ff = F;
    p.n_expert = X;
    p.n_expert_used = K;
    p.n_vocab = V;
    p.n_mtp = n_mtp;
    p.seed = 7;
    return p;
}

/* ------------------------------------------------------------- the reference */

typedef struct {
    const pkv_gguf *g;
    int n_dense, n_group, n_group_used;
    double scale, eps, base;
    bool use_bias;             /* the routing bias (false: the contrast) */
    double k[8][MAXP][NKV * HD], v[8][MAXP][NKV * HD]; /* per file layer */
} glm_ref;

static double *T_(const glm_ref *r, int l, const char *suffix) { return ref_gguf_blk(r->g, l, suffix); }

/* y = W·x (+ b) with the file's tensors of layer l (b may be absent) */
static void mv(const glm_ref *r, int l, const char *w, const char *b, const double *x, int rows, int cols, double *y) {
    ref_gguf_mv(r->g, l, w, b, x, rows, cols, y);
}

static void norm_by(const glm_ref *r, int l, const char *w, const double *x, int n, double *y) {
    ref_gguf_norm(r->g, l, w, x, n, r->eps, y);
}

/* x += attention of layer l at position pos (its own K/V rows) */
static void attention(glm_ref *r, int l, int pos, double *x) {
    double h[E], q[NH * HD], att[NH * HD], o[E];
    norm_by(r, l, "attn_norm.weight", x, E, h);
    mv(r, l, "attn_q.weight", "attn_q.bias", h, NH * HD, E, q);
    mv(r, l, "attn_k.weight", "attn_k.bias", h, NKV * HD, E, r->k[l][pos]);
    mv(r, l, "attn_v.weight", "attn_v.bias", h, NKV * HD, E, r->v[l][pos]);
    double *qn = T_(r, l, "attn_q_norm.weight"), *kn = T_(r, l, "attn_k_norm.weight");
    for (int hd = 0; hd < NH; hd++) {
        if (qn) ref_rms_norm(q + hd * HD, qn, HD, r->eps, q + hd * HD);
        ref_rope(q + hd * HD, 1, NROT, pos, r->base, true); /* the first NROT dims, neox */
    }
    for (int hd = 0; hd < NKV; hd++) {
        if (kn) ref_rms_norm(r->k[l][pos] + hd * HD, kn, HD, r->eps, r->k[l][pos] + hd * HD);
        ref_rope(r->k[l][pos] + hd * HD, 1, NROT, pos, r->base, true);
    }
    free(qn);
    free(kn);
    ref_attend(q, r->k[l][0], r->v[l][0], NKV * HD, pos + 1, NH, NKV, HD, 1.0 / sqrt((double)HD), att);
    mv(r, l, "attn_output.weight", NULL, att, E, NH * HD, o);
    for (int i = 0; i < E; i++) x[i] += o[i];
}

/* x += the FFN of layer l: dense, or the experts llama.cpp's build_moe_ffn picks
 * (sigmoid, selection on probs + bias, weights normalized and scaled) plus the
 * shared expert */
/* The index of the largest of v[0..n) not in taken[0..nt) (ties: the lower). */
static int best_of(const double *v, int n, const int *taken, int nt) {
    int best = -1;
    for (int e = 0; e < n; e++) {
        bool t = false;
        for (int j = 0; j < nt; j++) t |= taken[j] == e;
        if (!t && (best < 0 || v[e] > v[best])) best = e;
    }
    return best;
}

/* llama.cpp's build_moe_ffn routing: p = sigmoid(router·h); choose on p + bias,
 * with n_group > 1 only among the experts of the n_group_used groups whose two
 * best choice scores sum highest; weights p[chosen] / their sum * scale. */
static void route(const glm_ref *r, int l, const double *h, int *chosen, double *w) {
    double lg[X], p[X], sel[X], wsum = 0;
    double *bias = T_(r, l, "exp_probs_b.bias");
    mv(r, l, "ffn_gate_inp.weight", NULL, h, X, E, lg);
    for (int e = 0; e < X; e++) {
        p[e] = 1.0 / (1.0 + exp(-lg[e]));
        sel[e] = p[e] + (r->use_bias && bias ? bias[e] : 0);
    }
    free(bias);
    if (r->n_group > 1) {
        const int per = X / r->n_group;
        double gs[X];
        int keep[X];
        for (int gi = 0; gi < r->n_group; gi++) {
            int two[2];
            two[0] = best_of(sel + gi * per, per, NULL, 0);
            two[1] = best_of(sel + gi * per, per, two, 1);
            gs[gi] = sel[gi * per + two[0]] + sel[gi * per + two[1]];
        }
        for (int j = 0; j < r->n_group_used; j++) keep[j] = best_of(gs, r->n_group, keep, j);
        for (int e = 0; e < X; e++) {
            bool kept = false;
            for (int j = 0; j < r->n_group_used; j++) kept |= keep[j] == e / per;
            if (!kept) sel[e] = -INFINITY;
        }
    }
    for (int k = 0; k < K; k++) {
        chosen[k] = best_of(sel, X, chosen, k);
        wsum += w[k] = p[chosen[k]];
    }
    for (int k = 0; k < K; k++) w[k] = w[k] / fmax(wsum, 6.103515625e-5) * r->scale;
}

/* x += the FFN of layer l: dense, or the routed experts plus the shared expert */
static void ffn(const glm_ref *r, int l, double *x) {
    double h[E], g[F], u[F], y[E], out[E] = {0};
    norm_by(r, l, "post_attention_norm.weight", x, E, h);
    if (l < r->n_dense) {
        double *G = T_(r, l, "ffn_gate.weight"), *U = T_(r, l, "ffn_up.weight"), *D = T_(r, l, "ffn_down.weight");
        ref_ffn(G, U, D, E, F, false, h, g, u, out);
        free(G), free(U), free(D);
    } else {
        int chosen[K];
        double w[K];
        route(r, l, h, chosen, w);
        double *G = T_(r, l, "ffn_gate_exps.weight"), *U = T_(r, l, "ffn_up_exps.weight"),
               *D = T_(r, l, "ffn_down_exps.weight");
        for (int k = 0; k < K; k++) {
            const int e = chosen[k];
            ref_ffn(G + (size_t)e * F * E, U + (size_t)e * F * E, D + (size_t)e * E * F, E, F, false, h, g, u, y);
            for (int i = 0; i < E; i++) out[i] += w[k] * y[i];
        }
        free(G), free(U), free(D);
        G = T_(r, l, "ffn_gate_shexp.weight"), U = T_(r, l, "ffn_up_shexp.weight"), D = T_(r, l, "ffn_down_shexp.weight");
        ref_ffn(G, U, D, E, F, false, h, g, u, y);
        for (int i = 0; i < E; i++) out[i] += y[i];
        free(G), free(U), free(D);
    }
    for (int i = 0; i < E; i++) x[i] += out[i];
}

static void embed(const glm_ref *r, int32_t tok, double *x) {
    int64_t n = 0;
    double *te = ref_gguf_tensor((void *)r->g, "token_embd.weight", &n);
    memcpy(x, te + (size_t)tok * E, E * sizeof *x);
    free(te);
}

/* logits = output · rmsnorm(x) with the final norm `norm` (the trunk's output_norm,
 * or the MTP layer's shared_head_norm); hn gets the normed row */
static void head(const glm_ref *r, const char *norm, const double *x, double *hn, double *logits) {
    int64_t n = 0;
    double *nw = ref_gguf_tensor((void *)r->g, norm, &n), *out = ref_gguf_tensor((void *)r->g, "output.weight", &n);
    if (!out) out = ref_gguf_tensor((void *)r->g, "token_embd.weight", &n);
    ref_rms_norm(x, nw, E, r->eps, hn);
    ref_matvec(out, hn, NULL, V, E, logits);
    free(nw);
    free(out);
}

/* The trunk (layers 0..n_layer-1) at position pos: logits and the final normed
 * hidden state. */
static void trunk_step(glm_ref *r, int n_layer, int32_t tok, int pos, double *hn, double *logits) {
    double x[E];
    embed(r, tok, x);
    for (int l = 0; l < n_layer; l++) {
        attention(r, l, pos, x);
        ffn(r, l, x);
    }
    head(r, "output_norm.weight", x, hn, logits);
}

/* The MTP layer (file layer l) at position pos, fed h, the trunk's normed hidden
 * state at pos - 1: x = eh_proj [enorm(embed); hnorm(h)], the layer, shared_head_norm. */
static void mtp_step(glm_ref *r, int l, int32_t tok, const double *h, int pos, double *hn, double *logits) {
    double cat[2 * E], x[E];
    embed(r, tok, cat);
    norm_by(r, l, "nextn.enorm.weight", cat, E, cat);
    norm_by(r, l, "nextn.hnorm.weight", h, E, cat + E);
    mv(r, l, "nextn.eh_proj.weight", NULL, cat, E, 2 * E, x);
    attention(r, l, pos, x);
    ffn(r, l, x);
    char nn[64];
    snprintf(nn, sizeof nn, "blk.%d.nextn.shared_head_norm.weight", l);
    head(r, nn, x, hn, logits);
}

static glm_ref *ref_new(const pkv_gguf *g, bool use_bias) {
    glm_ref *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->g = g;
    r->use_bias = use_bias;
    uint32_t nd = 0, ng = 0, ngu = 0;
    float sc = 0, eps = 0, base = 0;
    CHECK_OK(pkv_gguf_get_u32(g, "glm4moe.leading_dense_block_count", &nd));
    CHECK_OK(pkv_gguf_get_f32(g, "glm4moe.expert_weights_scale", &sc));
    CHECK_OK(pkv_gguf_get_f32(g, "glm4moe.attention.layer_norm_rms_epsilon", &eps));
    CHECK_OK(pkv_gguf_get_f32(g, "glm4moe.rope.freq_base", &base));
    if (pkv_gguf_find_key(g, "glm4moe.expert_group_count") >= 0) {
        CHECK_OK(pkv_gguf_get_u32(g, "glm4moe.expert_group_count", &ng));
        CHECK_OK(pkv_gguf_get_u32(g, "glm4moe.expert_group_used_count", &ngu));
    }
    r->n_dense = (int)nd, r->n_group = (int)ng, r->n_group_used = (int)ngu, r->scale = sc, r->eps = eps, r->base = base;
    return r;
}

/* ------------------------------------------------------------- the tests */

/* A file (or the variant of it the caller made), its model on dev (its MTP head
 * where mtp), an f32 cache of pages of 5 and a context. */
typedef struct {
    void *img;
    size_t size;
    pkv_gguf *g;
    pkv_model *m;
    pkv_kv_cache *c;
    pkv_context *ctx;
} glm_run;

static bool run_open(glm_run *u, void *img, size_t size, bool mtp, const char *dev) {
    memset(u, 0, sizeof *u);
    u->img = img, u->size = size;
    u->g = img ? pkv_gguf_open_memory(img, size, "glm4moe") : NULL;
    pkv_model_params mp = pkv_model_default_params();
    if (strchr(dev, ',')) mp.devices = dev; /* split: heads, FFN rows and whole experts */
    else mp.device = dev;
    mp.mtp = mtp;
    u->m = img ? pkv_model_load_memory(img, size, mtp ? "glm4moe mtp" : "glm4moe", mp) : NULL;
    pkv_cache_params cp = pkv_cache_default_params();
    cp.kv_type = PKV_TYPE_F32;
    cp.page_size = 5;
    cp.n_ctx = MAXP;
    u->c = u->m ? pkv_model_cache_create(u->m, cp) : NULL;
    u->ctx = u->c ? pkv_context_create(u->m, u->c, 0) : NULL;
    if (!u->g || !u->ctx) TH_FAIL("setup on %s: %s", dev, pkv_errmsg());
    return u->g && u->ctx;
}

static void run_close(glm_run *u) {
    pkv_context_free(u->ctx);
    pkv_kv_cache_free(u->c);
    pkv_model_free(u->m);
    pkv_gguf_close(u->g);
    pkv_free(u->img);
}

/* A copy of the GGUF image g (pkv_free it) with keys g lacks: 2 expert groups of
 * which 1 is used (groups), an M-RoPE rope.dimension_sections (sections). */
static void *with_keys(const pkv_gguf *g, bool groups, bool sections, size_t *size) {
    static const int32_t sec[4] = {4, 2, 2, 0};
    pkv_gguf_writer *w = pkv_gguf_writer_create();
    bool ok = w != NULL;
    for (int64_t i = 0; ok && i < pkv_gguf_n_kv(g); i++) ok = !pkv_gguf_writer_copy_kv(w, g, i);
    if (ok && groups)
        ok = !pkv_gguf_writer_add_u32(w, "glm4moe.expert_group_count", 2) &&
             !pkv_gguf_writer_add_u32(w, "glm4moe.expert_group_used_count", 1);
    if (ok && sections) ok = !pkv_gguf_writer_add_arr(w, "glm4moe.rope.dimension_sections", PKV_GGUF_INT32, sec, 4);
    for (int64_t i = 0; ok && i < pkv_gguf_n_tensors(g); i++) {
        const pkv_gguf_tensor *t = pkv_gguf_tensor_at(g, i);
        ok = !pkv_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, t->n_bytes);
    }
    void *img = NULL;
    if (ok && pkv_gguf_writer_write_memory(w, &img, size)) img = NULL;
    pkv_gguf_writer_free(w);
    return img;
}

/* A file of n_layer trunk layers and one MTP layer (pkv_free it); with groups, 2
 * expert groups of which 1 is used. */
static void *make_file(int n_layer, bool groups, size_t *size) {
    pkv_mkmodel_params p = params(n_layer, 1);
    void *img, *copy = NULL;
    if (pkv_mkmodel_memory(&p, &img, size)) return NULL;
    pkv_gguf *g = pkv_gguf_open_memory(img, *size, "glm4moe");
    if (g) copy = with_keys(g, groups, false, size);
    pkv_gguf_close(g);
    pkv_mkmodel_free_memory(img);
    return copy;
}

/* A prompt decoded at once and 4 single steps, every position against the
 * reference; the reference without the routing bias (with groups: without the
 * groups) must be far off. */
static void test_forward(const char *dev, bool groups, double tol) {
    glm_run u;
    size_t size = 0;
    void *img = make_file(3, groups, &size);
    glm_ref *r = NULL, *rb = NULL;
    /* the contrast: the reference without the routing bias, or (groups) without the groups */
    if (!run_open(&u, img, size, false, dev) || !(r = ref_new(u.g, true)) || !(rb = ref_new(u.g, groups))) goto done;
    if (groups) rb->n_group = 0;
    pkv_model_info mi;
    pkv_model_get_info(u.m, &mi);
    CHECK_INT(mi.n_layer, 3);
    CHECK_INT(mi.n_expert, X);
    CHECK_INT(r->n_group, groups ? 2 : 0);
    enum { NP = 12, NT = NP + 4 };
    int32_t toks[NT];
    for (int i = 0; i < NT; i++) toks[i] = (i * 97 + 13) % V;
    float *got = malloc((size_t)NT * V * sizeof *got);
    double want[V], other[V], hn[E];
    if (!got) goto done;
    CHECK_OK(pkv_context_decode_all(u.ctx, toks, NP, got));
    for (int i = NP; i < NT; i++) {
        CHECK_OK(pkv_context_decode(u.ctx, &toks[i], 1));
        memcpy(got + (size_t)i * V, pkv_context_logits(u.ctx), V * sizeof(float));
    }
    double worst = 0, far = 0; /* far: the mean over the positions */
    for (int t = 0; t < NT; t++) {
        trunk_step(r, 3, toks[t], t, hn, want);
        trunk_step(rb, 3, toks[t], t, hn, other);
        worst = fmax(worst, ref_nmse(got + (size_t)t * V, want, V));
        far += ref_nmse(got + (size_t)t * V, other, V) / NT;
    }
    const char *what = groups ? "the groups" : "the routing bias";
    fprintf(stderr, "glm4moe on %s%s: %d positions, nmse %.2e (tol %.0e); without %s %.2e on average\n", dev,
            groups ? ", 2 expert groups, 1 used" : "", NT, worst, tol, what, far);
    if (!(worst < tol)) TH_FAIL("%s: nmse %g against the reference", dev, worst);
    if (!(far > 1e-5)) TH_FAIL("the reference without %s is as close (%g): the case does not test them", what, far);
    th_checks += 2;
    free(got);
done:
    free(r);
    free(rb);
    run_close(&u);
}

/* The MTP head (pkv_model_params.mtp) against the reference of the nextn layer,
 * fed the trunk's hidden states of the previous positions. */
static void test_mtp_head(const char *dev, double tol) {
    glm_run u;
    size_t size = 0;
    void *img = make_file(2, false, &size);
    glm_ref *r = NULL;
    if (!run_open(&u, img, size, true, dev) || !(r = ref_new(u.g, true))) goto done;
    pkv_model_info mi;
    pkv_model_get_info(u.m, &mi);
    CHECK(mi.mtp);
    enum { NT = 10 };
    int32_t toks[NT];
    for (int i = 0; i < NT; i++) toks[i] = (i * 31 + 5) % V;
    double hprev[NT][E], lg[V], hn[E];
    float hin[NT][E], hout[E];
    for (int t = 0; t < NT; t++) { /* the trunk's normed hidden state of each position */
        trunk_step(r, 2, toks[t], t, hprev[t], lg);
        for (int i = 0; i < E; i++) hin[t][i] = (float)hprev[t][i];
    }
    double worst = 0;
    /* the head's position t: token t + 1 with the trunk's state at t */
    for (int t = 0; t + 1 < NT; t++) {
        CHECK_OK(pkv_context_decode_mtp(u.ctx, &toks[t + 1], 1, hin[t], hout));
        mtp_step(r, 2, toks[t + 1], hprev[t], t, hn, lg);
        worst = fmax(worst, ref_nmse(pkv_context_logits(u.ctx), lg, V));
        worst = fmax(worst, ref_nmse(hout, hn, E));
    }
    fprintf(stderr, "glm4moe MTP head on %s: %d positions, nmse %.2e (tol %.0e)\n", dev, NT - 1, worst, tol);
    if (!(worst < tol)) TH_FAIL("%s: MTP head: nmse %g against the reference", dev, worst);
    th_checks++;
done:
    free(r);
    run_close(&u);
}

/* Bad files, each refused naming what is wrong. */
static void test_bad(void) {
    pkv_mkmodel_params p = params(3, 1);
    void *img;
    size_t size;
    REQUIRE_VOID(pkv_mkmodel_memory(&p, &img, &size) == PKV_OK);
    pkv_gguf *g = pkv_gguf_open_memory(img, size, "glm4moe");
    REQUIRE_VOID(g);
    const struct {
        const char *key;
        int64_t set;
        const char *drop;
        bool mtp, sections; /* sections: the M-RoPE key added (with_keys) */
        const char *expect;
    } cases[] = {
        {"glm4moe.leading_dense_block_count", 4, NULL, false, false, "leading_dense_block_count"},
        {"glm4moe.expert_used_count", 5, NULL, false, false, "expert_used_count"},
        {"glm4moe.attention.value_length", 8, NULL, false, false, "value_length"},
        {NULL, -1, "blk.1.attn_k_norm.weight", false, false, "blk.1.attn_k_norm.weight"},
        {NULL, -1, "blk.2.exp_probs_b.bias", false, false, "blk.2.exp_probs_b.bias"},
        {NULL, -1, "blk.1.ffn_up_shexp.weight", false, false, "blk.1.ffn_up_shexp.weight"},
        {NULL, -1, "blk.0.ffn_gate.weight", false, false, "blk.0.ffn_gate.weight"},
        {NULL, -1, "blk.3.nextn.eh_proj.weight", true, false, "blk.3.nextn.eh_proj.weight"},
        {NULL, -1, NULL, false, true, "rope.dimension_sections"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        size_t vs = 0;
        void *v = cases[k].sections ? with_keys(g, false, true, &vs)
                                    : ref_gguf_variant(g, cases[k].key, cases[k].set, cases[k].drop, NULL, NULL, &vs);
        if (!v) {
            TH_FAIL("case %zu: no variant", k);
            continue;
        }
        pkv_model_params mp = pkv_model_default_params();
        mp.mtp = cases[k].mtp;
        pkv_model *bad = pkv_model_load_memory(v, vs, "bad glm4moe", mp);
        if (bad) TH_FAIL("case %zu (%s): loaded", k, cases[k].expect);
        else if (!strstr(pkv_errmsg(), cases[k].expect))
            TH_FAIL("case %zu: message '%s' does not name %s", k, pkv_errmsg(), cases[k].expect);
        else th_checks++;
        pkv_model_free(bad);
        pkv_free(v);
    }
    /* expert groups the routing cannot use (hparams.c): refused naming the keys */
    size_t gsz = 0;
    void *gimg = make_file(3, true, &gsz); /* 2 groups of 2 experts, 1 used */
    pkv_gguf *gg = gimg ? pkv_gguf_open_memory(gimg, gsz, "glm4moe groups") : NULL;
    REQUIRE_VOID(gg);
    const struct {
        const char *key;
        int64_t set;
        const char *expect;
    } gcases[] = {
        {"glm4moe.expert_group_count", 3, "'glm4moe.expert_group_count' 3 does not divide the 4 experts"},
        {"glm4moe.expert_group_count", 4, "leaves 1 expert per group"},
        {"glm4moe.expert_group_used_count", 3, "'glm4moe.expert_group_used_count' 3 must be in [1, 2]"},
        {"glm4moe.expert_used_count", 3, "hold fewer than the 3 of 'glm4moe.expert_used_count'"},
    };
    for (size_t k = 0; k < sizeof gcases / sizeof gcases[0]; k++) {
        size_t vs = 0;
        void *v = ref_gguf_variant(gg, gcases[k].key, gcases[k].set, NULL, NULL, NULL, &vs);
        pkv_model *bad = v ? pkv_model_load_memory(v, vs, "bad groups", pkv_model_default_params()) : NULL;
        CHECK(v && !bad);
        if (!strstr(pkv_errmsg(), gcases[k].expect)) TH_FAIL("groups case %zu: message '%s'", k, pkv_errmsg());
        pkv_model_free(bad);
        pkv_free(v);
    }
    pkv_gguf_close(gg);
    pkv_free(gimg);
    /* no MTP layers: the head is refused naming the key */
    pkv_mkmodel_params p0 = params(2, -1);
    void *img0;
    size_t size0;
    REQUIRE_VOID(pkv_mkmodel_memory(&p0, &img0, &size0) == PKV_OK);
    pkv_model_params mp = pkv_model_default_params();
    mp.mtp = true;
    pkv_model *m0 = pkv_model_load_memory(img0, size0, "glm4moe trunk", mp);
    CHECK(m0 == NULL && strstr(pkv_errmsg(), "nextn_predict_layers"));
    pkv_model_free(m0);
    pkv_mkmodel_free_memory(img0);
    pkv_gguf_close(g);
    pkv_mkmodel_free_memory(img);
}

int main(void) {
    test_forward("cpu", false, 1e-9);
    test_forward("cpu", true, 1e-9);
    test_mtp_head("cpu", 1e-9);
    test_bad();
    /* split over two CPU devices (expert parallelism for the mixtures) */
    test_forward("cpu,cpu:1", false, 1e-9);
    test_forward("cpu,cpu:1", true, 1e-9);
    test_mtp_head("cpu,cpu:1", 1e-9);
    /* the same on vulkan:0 (f32 math in another order) */
    pkv_device *vk = pkv_device_open("vulkan:0", pkv_device_default_params());
    if (vk) {
        pkv_device_close(vk);
        test_forward("vulkan:0", false, 1e-9);
        test_forward("vulkan:0", true, 1e-9);
        test_mtp_head("vulkan:0", 1e-9);
    } else {
        printf("note: no vulkan:0 here; the Vulkan cases not run\n");
    }
    return th_done();
}
