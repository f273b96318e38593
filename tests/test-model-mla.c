// labels: model timeout=300
/* deepseek2's multi-head latent attention (MLA) against a plain double-precision
 * reference written here in the non-absorbed form: per head K = [k_b_h^T c, k_pe]
 * and V = v_b_h c over the cached latent c and rotated k_pe, which checks the
 * absorbed kernel path (queries through attn_k_b, V read from the latent row, the
 * outputs through attn_v_b) independently. Both query layouts (V2-Lite's attn_q and
 * V3's attn_q_a/attn_q_b), YaRN with DeepSeek's log multiplier (the reference with
 * the plain 1/sqrt(d) scale must be far off, so the match is the mscale's), dense
 * layers and a leading dense layer before a MoE layer with its shared expert, routed
 * as DeepSeek-V2 (softmax, scaled weights) and as V3 (sigmoid, exp_probs_b, expert
 * groups, normalised and scaled weights), every position of a prompt, single steps
 * and a context shift (the latent part moves unchanged, k_pe turns back), f32
 * weights and KV: nmse <= 1e-9.
 * Then the KV operations on the latent cache (f16 and q8_0 pages, on the device and
 * on the host; multi-common.h's mc_kv_ops): fork == replay, swap round trip,
 * save/load bitwise, truncate and decode again == the original; the
 * cache holds no V pages and a token costs (kv_lora + rope) values per layer; a
 * cache file of a model with another latent width is refused; Vulkan against the
 * CPU where a Vulkan device exists. An older file (attn_kv_b, per-head K/V sizes,
 * head_count_kv the heads), made from a new one, gives the same logits bitwise
 * (attn_kv_b split at load). Bad files (kv_lora_rank 0, rope dims not below
 * key_length_mla, key_length not kv_lora + rope, attn_k_b of another shape, attn_q_a
 * without q_lora_rank, a second KV head, a new file without attn_k_b, neither
 * key_length_mla nor attn_kv_b) are refused naming the key or tensor. */
#include <math.h>

#include "model/gguf.h"
#include "ref-gguf.h"
#include "multi-common.h"
#include "ref-model.h"

enum { NV = MV, E = 64, H = 4, D = 64, P = D / 2, N = D - P, RL = 64, VD = D, FF = 96, NL = 2 };

static pkv_mkmodel_params mla_params(int q_lora, int kv_lora, pkv_type t) {
    pkv_mkmodel_params p = pkv_mkmodel_default_params();
    p.arch = "deepseek2";
    p.type = t;
    p.n_layer = NL;
    p.n_embd = E;
    p.n_head = H;
    p.head_dim = D;
    p.n_ff = FF;
    p.n_vocab = NV;
    p.n_ctx = 256;
    p.q_lora_rank = q_lora;
    p.kv_lora_rank = kv_lora;
    return p;
}

/* ------------------------------------------------------ the reference */

typedef struct {
    double *an, *qa, *qan, *q, *kva, *kvn, *kb, *vb, *o, *fn, *g, *u, *d;
    /* a mixture (layers after the leading dense one): router [X][E], experts [X][FF][E]
     * and [X][E][FF], the selection bias [X] (V3) or NULL, the shared expert in g, u, d */
    double *router, *eg, *eu, *ed, *bias;
} mref_layer;

/* The routing keys of a MoE file */
typedef struct {
    int X, K, gating, G, GU;
    double scale;
    bool norm;
} mref_moe;

typedef struct {
    int lq, n, cap;
    double eps, base, fscale, beta_fast, beta_slow, kq_scale;
    int orig;
    double *tok, *onorm, *out;
    mref_layer ly[NL];
    mref_moe moe; /* X 0: dense */
    double *c, *kpe; /* [NL][cap][RL], [NL][cap][P]: the cache as the reference keeps it */
    int32_t *pos;    /* [cap] */
} mref;

static double *tensor(const pkv_gguf *g, const char *name, int64_t want) {
    int64_t n = 0;
    double *t = ref_gguf_tensor((void *)g, name, &n);
    if (t && n != want) TH_FAIL("%s: %lld values, expected %lld", name, (long long)n, (long long)want);
    return t;
}

/* plain: the scale 1/sqrt(D) without YaRN's mscale (the contrast) */
static mref *mref_create(const pkv_gguf *g, int lq, bool plain) {
    mref *r = calloc(1, sizeof *r);
    r->lq = lq;
    r->cap = 64;
    float f = 0;
    r->eps = !pkv_gguf_get_f32(g, "deepseek2.attention.layer_norm_rms_epsilon", &f) ? f : 0;
    r->base = !pkv_gguf_get_f32(g, "deepseek2.rope.freq_base", &f) ? f : 0;
    r->fscale = !pkv_gguf_get_f32(g, "deepseek2.rope.scaling.factor", &f) ? 1.0 / f : 0;
    uint32_t orig = 0;
    CHECK_OK(pkv_gguf_get_u32(g, "deepseek2.rope.scaling.original_context_length", &orig));
    r->orig = (int)orig;
    r->beta_fast = 32;
    r->beta_slow = 1;
    float log_mul = 0;
    CHECK_OK(pkv_gguf_get_f32(g, "deepseek2.rope.scaling.yarn_log_multiplier", &log_mul));
    /* DeepSeek's rule (llama.cpp): RoPE's magnitude is 1 with a log multiplier; the
     * scores are scaled by (1 + 0.1 m ln factor)^2 / sqrt(D), m = multiplier / 0.1 */
    const double m = log_mul / 0.1, lnf = log(1.0 / r->fscale), ms = 1.0 + 0.1 * m * lnf;
    r->kq_scale = (plain ? 1.0 : ms * ms) / sqrt((double)D);
    uint32_t u = 0;
    if (!pkv_gguf_get_u32(g, "deepseek2.expert_count", &u)) { /* the routing keys mkmodel writes */
        mref_moe *mo = &r->moe;
        mo->X = (int)u;
        CHECK_OK(pkv_gguf_get_u32(g, "deepseek2.expert_used_count", &u));
        mo->K = (int)u;
        CHECK_OK(pkv_gguf_get_u32(g, "deepseek2.expert_gating_func", &u));
        mo->gating = (int)u;
        mo->G = !pkv_gguf_get_u32(g, "deepseek2.expert_group_count", &u) ? (int)u : 0;
        mo->GU = !pkv_gguf_get_u32(g, "deepseek2.expert_group_used_count", &u) ? (int)u : 0;
        CHECK_OK(pkv_gguf_get_f32(g, "deepseek2.expert_weights_scale", &f));
        mo->scale = f;
        CHECK_OK(pkv_gguf_get_bool(g, "deepseek2.expert_weights_norm", &mo->norm));
    }
    r->tok = tensor(g, "token_embd.weight", (int64_t)NV * E);
    r->onorm = tensor(g, "output_norm.weight", E);
    r->out = tensor(g, "output.weight", (int64_t)NV * E);
    for (int l = 0; l < NL; l++) {
        mref_layer *L = &r->ly[l];
        char k[64];
#define T(field, suffix, n) (snprintf(k, sizeof k, "blk.%d.%s", l, suffix), L->field = tensor(g, k, n))
        T(an, "attn_norm.weight", E);
        if (lq) {
            T(qa, "attn_q_a.weight", (int64_t)lq * E);
            T(qan, "attn_q_a_norm.weight", lq);
            T(q, "attn_q_b.weight", (int64_t)H * D * lq);
        } else {
            T(q, "attn_q.weight", (int64_t)H * D * E);
        }
        T(kva, "attn_kv_a_mqa.weight", (int64_t)(RL + P) * E);
        T(kvn, "attn_kv_a_norm.weight", RL);
        T(kb, "attn_k_b.weight", (int64_t)H * RL * N);
        T(vb, "attn_v_b.weight", (int64_t)H * VD * RL);
        T(o, "attn_output.weight", (int64_t)E * H * VD);
        T(fn, "ffn_norm.weight", E);
        T(g, "ffn_gate.weight", (int64_t)FF * E);
        T(u, "ffn_up.weight", (int64_t)FF * E);
        if (l == 0 || !r->moe.X) {
            T(g, "ffn_gate.weight", (int64_t)FF * E);
            T(u, "ffn_up.weight", (int64_t)FF * E);
            T(d, "ffn_down.weight", (int64_t)E * FF);
            continue;
        }
        const int64_t X = r->moe.X;
        T(router, "ffn_gate_inp.weight", X * E);
        T(eg, "ffn_gate_exps.weight", X * FF * E);
        T(eu, "ffn_up_exps.weight", X * FF * E);
        T(ed, "ffn_down_exps.weight", X * E * FF);
        if (r->moe.gating == 2) T(bias, "exp_probs_b.bias", X);
        T(g, "ffn_gate_shexp.weight", (int64_t)FF * E);
        T(u, "ffn_up_shexp.weight", (int64_t)FF * E);
        T(d, "ffn_down_shexp.weight", (int64_t)E * FF);
#undef T
    }
    r->c = calloc((size_t)NL * r->cap * RL, sizeof(double));
    r->kpe = calloc((size_t)NL * r->cap * P, sizeof(double));
    r->pos = calloc((size_t)r->cap, sizeof(int32_t));
    return r;
}

static void mref_free(mref *r) {
    if (!r) return;
    free(r->tok);
    free(r->onorm);
    free(r->out);
    for (int l = 0; l < NL; l++) {
        double **w = &r->ly[l].an;
        for (size_t i = 0; i < sizeof r->ly[l] / sizeof(double *); i++) free(w[i]);
    }
    free(r->c);
    free(r->kpe);
    free(r->pos);
    free(r);
}

static void mref_rope(const mref *r, double *x, int n_heads, double pos) {
    ref_rope_yarn(x, n_heads, P, pos, r->base, r->fscale, r->orig, r->beta_fast, r->beta_slow, false, 1.0);
}

/* One layer's attention for the token at cache index t (position pos), into y [E]. */
static void mref_attention(mref *r, int l, const double *xn, int t, double *y) {
    const mref_layer *L = &r->ly[l];
    double q[H * D], qa[256], kv[RL + P], o[H * VD];
    if (r->lq) {
        ref_matvec(L->qa, xn, NULL, r->lq, E, qa);
        ref_rms_norm(qa, L->qan, r->lq, r->eps, qa);
        ref_matvec(L->q, qa, NULL, H * D, r->lq, q);
    } else {
        ref_matvec(L->q, xn, NULL, H * D, E, q);
    }
    ref_matvec(L->kva, xn, NULL, RL + P, E, kv);
    double *c = r->c + ((size_t)l * r->cap + t) * RL, *kpe = r->kpe + ((size_t)l * r->cap + t) * P;
    ref_rms_norm(kv, L->kvn, RL, r->eps, c);
    memcpy(kpe, kv + RL, P * sizeof(double));
    mref_rope(r, kpe, 1, r->pos[t]);
    double score[64];
    for (int h = 0; h < H; h++) {
        double *qh = q + h * D;
        mref_rope(r, qh + N, 1, r->pos[t]);
        const double *kb = L->kb + (size_t)h * RL * N, *vb = L->vb + (size_t)h * VD * RL;
        double mx = -INFINITY, sum = 0;
        for (int s = 0; s <= t; s++) { /* K_h(s) = [kb_h^T c_s, kpe_s] */
            const double *cs = r->c + ((size_t)l * r->cap + s) * RL, *ps = r->kpe + ((size_t)l * r->cap + s) * P;
            double dot = 0;
            for (int n = 0; n < N; n++) {
                double kn = 0;
                for (int i = 0; i < RL; i++) kn += kb[(size_t)i * N + n] * cs[i];
                dot += qh[n] * kn;
            }
            for (int i = 0; i < P; i++) dot += qh[N + i] * ps[i];
            score[s] = dot * r->kq_scale;
            mx = fmax(mx, score[s]);
        }
        for (int s = 0; s <= t; s++) sum += exp(score[s] - mx);
        double *oh = o + h * VD;
        for (int j = 0; j < VD; j++) oh[j] = 0;
        for (int s = 0; s <= t; s++) { /* V_h(s) = vb_h c_s */
            const double *cs = r->c + ((size_t)l * r->cap + s) * RL, w = exp(score[s] - mx) / sum;
            for (int j = 0; j < VD; j++) {
                double v = 0;
                for (int i = 0; i < RL; i++) v += vb[(size_t)j * RL + i] * cs[i];
                oh[j] += w * v;
            }
        }
    }
    ref_matvec(L->o, o, NULL, E, H * VD, y);
}

/* llama.cpp's routing of deepseek2 written out: probs p = softmax or sigmoid of the
 * router's logits; the choice on p + bias (V3) among the best GU groups (a group's
 * score the sum of its best two), the K best; weights p of those, normalised where
 * asked, times the scale; y = their experts' sum plus the shared expert's. */
static void mref_moe_ffn(const mref *r, const mref_layer *L, const double *xn, double *y) {
    const mref_moe *mo = &r->moe;
    double p[64], s[64], g[FF], u[FF], ye[E], mx = -INFINITY, sum = 0;
    ref_matvec(L->router, xn, NULL, mo->X, E, p);
    for (int e = 0; e < mo->X; e++) mx = fmax(mx, p[e]);
    for (int e = 0; e < mo->X; e++) sum += exp(p[e] - mx);
    for (int e = 0; e < mo->X; e++) {
        p[e] = mo->gating == 2 ? 1.0 / (1.0 + exp(-p[e])) : exp(p[e] - mx) / sum;
        s[e] = p[e] + (L->bias ? L->bias[e] : 0);
    }
    if (mo->G > 1) { /* keep the GU best groups */
        const int per = mo->X / mo->G;
        double gs[16];
        bool keep[16] = {false};
        for (int q = 0; q < mo->G; q++) {
            double a = -INFINITY, b = -INFINITY;
            for (int e = q * per; e < (q + 1) * per; e++)
                if (s[e] > a) b = a, a = s[e];
                else if (s[e] > b) b = s[e];
            gs[q] = a + b;
        }
        for (int k = 0; k < mo->GU; k++) {
            int best = -1;
            for (int q = 0; q < mo->G; q++)
                if (!keep[q] && (best < 0 || gs[q] > gs[best])) best = q;
            keep[best] = true;
        }
        for (int e = 0; e < mo->X; e++)
            if (!keep[e / per]) s[e] = -INFINITY;
    }
    int sel[8];
    double w[8], wsum = 0;
    for (int k = 0; k < mo->K; k++) {
        int best = -1;
        for (int e = 0; e < mo->X; e++) {
            bool taken = false;
            for (int j = 0; j < k; j++) taken |= sel[j] == e;
            if (!taken && (best < 0 || s[e] > s[best])) best = e;
        }
        sel[k] = best;
        w[k] = p[best];
        wsum += w[k];
    }
    ref_ffn(L->g, L->u, L->d, E, FF, false, xn, g, u, y); /* the shared expert */
    for (int k = 0; k < mo->K; k++) {
        const size_t e = (size_t)sel[k];
        const double wk = (mo->norm ? w[k] / wsum : w[k]) * (mo->scale != 0 ? mo->scale : 1.0);
        ref_ffn(L->eg + e * FF * E, L->eu + e * FF * E, L->ed + e * E * FF, E, FF, false, xn, g, u, ye);
        for (int i = 0; i < E; i++) y[i] += wk * ye[i];
    }
}

/* Append token id at position pos; logits [NV]. */
static void mref_step(mref *r, int32_t id, int32_t pos, double *logits) {
    double x[E], xn[E], y[E], g[FF], u[FF];
    const int t = r->n++;
    r->pos[t] = pos;
    for (int i = 0; i < E; i++) x[i] = r->tok[(size_t)id * E + i];
    for (int l = 0; l < NL; l++) {
        ref_rms_norm(x, r->ly[l].an, E, r->eps, xn);
        mref_attention(r, l, xn, t, y);
        for (int i = 0; i < E; i++) x[i] += y[i];
        ref_rms_norm(x, r->ly[l].fn, E, r->eps, xn);
        if (l > 0 && r->moe.X) mref_moe_ffn(r, &r->ly[l], xn, y);
        else ref_ffn(r->ly[l].g, r->ly[l].u, r->ly[l].d, E, FF, false, xn, g, u, y);
        for (int i = 0; i < E; i++) x[i] += y[i];
    }
    ref_rms_norm(x, r->onorm, E, r->eps, xn);
    ref_matvec(r->out, xn, NULL, NV, E, logits);
}

/* Drop cache entries [a, b): later entries move down, their positions and k_pe turn
 * back by b - a; the latents move unchanged. */
static void mref_remove(mref *r, int a, int b) {
    const int d = b - a;
    for (int t = b; t < r->n; t++) {
        r->pos[t - d] = r->pos[t] - d;
        for (int l = 0; l < NL; l++) {
            memcpy(r->c + ((size_t)l * r->cap + t - d) * RL, r->c + ((size_t)l * r->cap + t) * RL, RL * sizeof(double));
            double *kp = r->kpe + ((size_t)l * r->cap + t - d) * P;
            memcpy(kp, r->kpe + ((size_t)l * r->cap + t) * P, P * sizeof(double));
            mref_rope(r, kp, 1, -d);
        }
    }
    r->n -= d;
}

/* ------------------------------------------------ forward against it */

/* np prompt tokens, 4 single steps, a shift removing [10, 13), one more step; every
 * position against the reference and the contrast. */
static void test_reference(int q_lora, int n_expert) {
    pkv_mkmodel_params p = mla_params(q_lora, RL, PKV_TYPE_F32);
    p.n_expert = n_expert;
    p.n_expert_used = n_expert ? 2 : 0;
    void *img;
    size_t size;
    REQUIRE_VOID(pkv_mkmodel_memory(&p, &img, &size) == PKV_OK);
    pkv_gguf *g = pkv_gguf_open_memory(img, size, "mla");
    pkv_model *m = pkv_model_load_memory(img, size, "mla", pkv_model_default_params());
    pkv_cache_params cp = pkv_cache_default_params();
    cp.kv_type = PKV_TYPE_F32;
    cp.page_size = 5;
    cp.n_ctx = 64;
    pkv_kv_cache *c = m ? pkv_model_cache_create(m, cp) : NULL;
    pkv_context *ctx = c ? pkv_context_create(m, c, 0) : NULL;
    mref *r = g ? mref_create(g, q_lora, false) : NULL, *rp = g ? mref_create(g, q_lora, true) : NULL;
    if (!ctx || !r || !rp) {
        TH_FAIL("setup: %s", pkv_errmsg());
        goto done;
    }
    enum { NP = 20, NT = NP + 5 };
    int32_t toks[NT];
    for (int i = 0; i < NT; i++) toks[i] = (i * 97 + 13) % NV;
    static float got[NT * NV];
    static double want[NT * NV], plain[NT * NV];
    CHECK_OK(pkv_context_decode_all(ctx, toks, NP, got));
    for (int i = 0; i < 4; i++) {
        CHECK_OK(pkv_context_decode(ctx, &toks[NP + i], 1));
        memcpy(got + (size_t)(NP + i) * NV, pkv_context_logits(ctx), NV * sizeof(float));
    }
    for (int i = 0; i < NP + 4; i++) {
        mref_step(r, toks[i], i, want + (size_t)i * NV);
        mref_step(rp, toks[i], i, plain + (size_t)i * NV);
    }
    CHECK_OK(pkv_context_shift(ctx, 10, 3));
    CHECK_OK(pkv_context_decode(ctx, &toks[NP + 4], 1));
    memcpy(got + (size_t)(NP + 4) * NV, pkv_context_logits(ctx), NV * sizeof(float));
    mref_remove(r, 10, 13);
    mref_remove(rp, 10, 13);
    mref_step(r, toks[NP + 4], NP + 4 - 3, want + (size_t)(NP + 4) * NV);
    mref_step(rp, toks[NP + 4], NP + 4 - 3, plain + (size_t)(NP + 4) * NV);
    double worst = 0, other = 1e30;
    for (int t = 0; t < NT; t++) {
        worst = fmax(worst, ref_nmse(got + (size_t)t * NV, want + (size_t)t * NV, NV));
        if (t > 0) other = fmin(other, ref_nmse(got + (size_t)t * NV, plain + (size_t)t * NV, NV));
    }
    fprintf(stderr, "deepseek2 %s%s: %d positions and a shift: nmse %.2e; against the plain 1/sqrt(d) scale >= %.2e\n",
            q_lora ? "q_lora_rank 32" : "lite (attn_q)", !n_expert ? "" : q_lora ? ", V3 experts" : ", V2 experts", NT,
            worst, other);
    if (!(worst <= 1e-9)) TH_FAIL("nmse %g > 1e-9", worst);
    if (!(other > 1e-6)) TH_FAIL("the plain scale is as close (%g): the case does not test YaRN's mscale", other);
    th_checks += 2;
done:
    mref_free(r);
    mref_free(rp);
    pkv_context_free(ctx);
    pkv_kv_cache_free(c);
    pkv_model_free(m);
    pkv_gguf_close(g);
    pkv_mkmodel_free_memory(img);
}

/* ------------------------------------------------ KV operations */

/* The layout: no V pages; K rows of kv_lora + rope values of kv type t. */
static void check_layout(pkv_kv_cache *c, pkv_type t, int page_size) {
    for (int l = 0; l < NL; l++) {
        pkv_kv_layer_info li;
        CHECK_OK(pkv_kv_layout_layer(pkv_kv_cache_layout(c), l, &li));
        CHECK(li.v_in_k);
        CHECK_INT(li.rope_off, RL);
        CHECK_INT(li.n_kv_heads, 1);
        CHECK_INT(li.head_dim_k, RL + P);
        CHECK_INT(li.head_dim_v, RL);
        CHECK_INT(li.v_page_bytes, 0);
        CHECK_INT(li.k_page_bytes, (size_t)page_size * pkv_type_row_bytes(t, RL + P));
        pkv_kv_shard_info sh;
        CHECK_OK(pkv_kv_shard(c, l, 0, &sh));
        CHECK(sh.v == NULL && sh.v_page_bytes == 0);
    }
}

/* The operations of multi-common.h's mc_kv_ops on one device, the cache on it and on
 * the host (fork + swap round trip, truncate and decode again, replay: logits
 * bitwise; save/load), the model in mc_img; then a model of another latent width
 * refuses a saved file. */
static void test_kv_ops(pkv_type t) {
    mc_kv_k = mc_kv_v = t;
    pkv_model *single = mc_load("cpu", NULL, false);
    pkv_kv_cache *sc = single ? mc_cache(single) : NULL;
    REQUIRE_VOID(sc);
    check_layout(sc, t, 8);
    mc_kv_ops("cpu", false, single, sc, true);
    mc_kv_ops("cpu", true, single, sc, true);
    const char *path = th_tmp("mla.kv");
    pkv_context *a = pkv_context_create(single, sc, 0);
    int32_t prompt[9];
    for (int i = 0; i < 9; i++) prompt[i] = (i * 17 + 3) % NV;
    CHECK(a && pkv_context_decode(a, prompt, 9) == PKV_OK && pkv_context_save(a, path) == PKV_OK);
    pkv_mkmodel_params p2 = mla_params(0, 2 * RL, PKV_TYPE_F16);
    void *img2;
    size_t size2;
    REQUIRE_VOID(pkv_mkmodel_memory(&p2, &img2, &size2) == PKV_OK);
    pkv_model *m2 = pkv_model_load_memory(img2, size2, "mla-wide", pkv_model_default_params());
    pkv_kv_cache *c2 = m2 ? mc_cache(m2) : NULL;
    CHECK(c2 != NULL);
    if (c2) {
        pkv_context *l2 = pkv_context_load(m2, c2, path, 0);
        CHECK(l2 == NULL);
        CHECK_MSG("layer 0 has head sizes K 96, V 64 in the file, K 160, V 128 in the cache");
        pkv_context_free(l2);
    }
    unlink(path);
    pkv_kv_cache_free(c2);
    pkv_model_free(m2);
    pkv_mkmodel_free_memory(img2);
    pkv_context_free(a);
    pkv_kv_cache_free(sc);
    pkv_model_free(single);
}

/* A prompt of 9 tokens (i * mul + add) % NV, then 3 more one at a time: the logits of
 * the last 4 positions into lg [4][NV]. */
static void decode4(pkv_context *x, int mul, int add, float *lg) {
    int32_t toks[12];
    for (int i = 0; i < 12; i++) toks[i] = (i * mul + add) % NV;
    CHECK_OK(pkv_context_decode(x, toks, 9));
    for (int i = 0; i < 4; i++) {
        memcpy(lg + (size_t)i * NV, pkv_context_logits(x), NV * 4);
        if (i < 3) CHECK_OK(pkv_context_decode(x, &toks[9 + i], 1));
    }
}

/* Vulkan against the CPU: the same model and prompt, logits within 1e-5 (f16 KV). */
static void test_vulkan(const void *img, size_t size) {
    pkv_device *probe = pkv_device_open("vulkan:0", pkv_device_default_params());
    if (!probe) {
        fprintf(stderr, "no Vulkan device: Vulkan against CPU skipped\n");
        return;
    }
    pkv_device_close(probe);
    float lg[2][4 * NV];
    for (int k = 0; k < 2; k++) {
        pkv_model_params mp = pkv_model_default_params();
        mp.device = k ? "vulkan:0" : "cpu";
        pkv_model *m = pkv_model_load_memory(img, size, "mla", mp);
        pkv_kv_cache *c = m ? mc_cache(m) : NULL;
        pkv_context *x = c ? pkv_context_create(m, c, 0) : NULL;
        REQUIRE_VOID(x);
        decode4(x, 29, 1, lg[k]);
        pkv_context_free(x);
        pkv_kv_cache_free(c);
        pkv_model_free(m);
    }
    double e = th_nmse(lg[0], lg[1], 4 * NV);
    fprintf(stderr, "deepseek2 vulkan:0 against cpu: nmse %.2e\n", e);
    if (!(e < 1e-5)) TH_FAIL("vulkan against cpu: nmse %g", e);
    th_checks++;
}

/* ------------------------------------------------ bad files */

static void refused(const pkv_gguf *g, const char *key, int64_t set, const char *drop, const char *rename, const char *as,
                    const char *expect) {
    size_t size = 0;
    void *img = ref_gguf_variant(g, key, set, drop, rename, as, &size);
    REQUIRE_VOID(img);
    pkv_model *m = pkv_model_load_memory(img, size, "bad", pkv_model_default_params());
    CHECK(m == NULL);
    if (!strstr(pkv_errmsg(), expect)) TH_FAIL("errmsg \"%s\" lacks \"%s\"", pkv_errmsg(), expect);
    th_checks++;
    pkv_model_free(m);
    pkv_free(img);
}

/* The older layout of an f32 deepseek2 image: attn_kv_b [H][N + V][R] (each head's
 * nope rows, k_b's transpose, then its value rows, v_b) in place of attn_k_b and
 * attn_v_b; key_length / value_length the query and value heads, head_count_kv the
 * heads, no key_length_mla / value_length_mla. */
static void *legacy_image(const pkv_gguf *g, size_t *size) {
    pkv_gguf_writer *w = pkv_gguf_writer_create();
    bool ok = w != NULL;
    static const struct { const char *key; uint32_t v; } set[] = {
        {"deepseek2.attention.key_length", D}, {"deepseek2.attention.value_length", VD},
        {"deepseek2.attention.head_count_kv", H}, {"deepseek2.attention.key_length_mla", 0},
        {"deepseek2.attention.value_length_mla", 0}};
    for (int64_t i = 0; ok && i < pkv_gguf_n_kv(g); i++) {
        const char *k = pkv_gguf_kv_key(g, i);
        int j = 0;
        while (j < 5 && strcmp(k, set[j].key)) j++;
        ok = j == 5 ? !pkv_gguf_writer_copy_kv(w, g, i) : set[j].v == 0 || !pkv_gguf_writer_add_u32(w, k, set[j].v);
    }
    static float kv[NL][H * (N + VD) * RL];
    for (int64_t i = 0; ok && i < pkv_gguf_n_tensors(g); i++) {
        const pkv_gguf_tensor *t = pkv_gguf_tensor_at(g, i);
        int l = 0;
        if (strstr(t->name, "attn_k_b") || strstr(t->name, "attn_v_b")) continue;
        ok = !pkv_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, t->n_bytes);
        if (!strstr(t->name, "attn_output") || sscanf(t->name, "blk.%d.", &l) != 1) continue;
        char nk[64], nv[64];
        snprintf(nk, sizeof nk, "blk.%d.attn_k_b.weight", l);
        snprintf(nv, sizeof nv, "blk.%d.attn_v_b.weight", l);
        const float *kb = pkv_gguf_find_tensor(g, nk)->data, *vb = pkv_gguf_find_tensor(g, nv)->data;
        for (int h = 0; h < H; h++)
            for (int r = 0; r < RL; r++) {
                for (int n = 0; n < N; n++) kv[l][((size_t)h * (N + VD) + n) * RL + r] = kb[((size_t)h * RL + r) * N + n];
                for (int j = 0; j < VD; j++)
                    kv[l][((size_t)h * (N + VD) + N + j) * RL + r] = vb[((size_t)h * VD + j) * RL + r];
            }
        snprintf(nk, sizeof nk, "blk.%d.attn_kv_b.weight", l);
        const int64_t ne[2] = {RL, H * (N + VD)};
        ok = !pkv_gguf_writer_add_tensor(w, nk, PKV_TYPE_F32, 2, ne, kv[l], sizeof kv[l]);
    }
    void *img = NULL;
    if (ok && pkv_gguf_writer_write_memory(w, &img, size)) img = NULL;
    pkv_gguf_writer_free(w);
    return img;
}

/* An older file (attn_kv_b) runs as the file converted now: the same latent cache
 * and the same logits. */
static void test_legacy(void) {
    pkv_mkmodel_params p = mla_params(32, RL, PKV_TYPE_F32);
    void *img;
    size_t size = 0, lsize = 0;
    REQUIRE_VOID(pkv_mkmodel_memory(&p, &img, &size) == PKV_OK);
    pkv_gguf *g = pkv_gguf_open_memory(img, size, "mla");
    void *limg = g ? legacy_image(g, &lsize) : NULL;
    REQUIRE_VOID(limg);
    static float lg[2][4 * NV];
    for (int k = 0; k < 2; k++) {
        pkv_model *m = k ? pkv_model_load_memory(limg, lsize, "mla-kv_b", pkv_model_default_params())
                         : pkv_model_load_memory(img, size, "mla", pkv_model_default_params());
        pkv_kv_cache *c = m ? mc_cache(m) : NULL;
        pkv_context *x = c ? pkv_context_create(m, c, 0) : NULL;
        if (!x) TH_FAIL("%s: %s", k ? "older layout" : "layout", pkv_errmsg());
        if (x) check_layout(c, PKV_TYPE_F16, 8);
        if (x) decode4(x, 41, 5, lg[k]);
        pkv_context_free(x);
        pkv_kv_cache_free(c);
        pkv_model_free(m);
    }
    double e = th_nmse(lg[0], lg[1], 4 * NV);
    fprintf(stderr, "deepseek2 with attn_kv_b against attn_k_b/attn_v_b: nmse %.2e\n", e);
    if (!(e < 1e-12)) TH_FAIL("older layout: nmse %g", e);
    th_checks++;
    pkv_free(limg);
    pkv_gguf_close(g);
    pkv_mkmodel_free_memory(img);
}

static void test_bad(void) {
    pkv_mkmodel_params p = mla_params(0, RL, PKV_TYPE_F16);
    void *img;
    size_t size;
    REQUIRE_VOID(pkv_mkmodel_memory(&p, &img, &size) == PKV_OK);
    pkv_gguf *g = pkv_gguf_open_memory(img, size, "mla");
    REQUIRE_VOID(g);
    refused(g, "deepseek2.attention.kv_lora_rank", 0, NULL, NULL, NULL, "'deepseek2.attention.kv_lora_rank' is 0");
    refused(g, "deepseek2.attention.key_length_mla", P, NULL, NULL, NULL,
            "'deepseek2.rope.dimension_count' 32 must be less than the query head's 32 dims");
    refused(g, "deepseek2.attention.key_length", RL + P + 2, NULL, NULL, NULL,
            "'deepseek2.attention.key_length' 98 and 'value_length' 64 must be kv_lora_rank + rope dims = 96");
    refused(g, "deepseek2.attention.key_length_mla", -1, NULL, NULL, NULL, "no 'deepseek2.attention.key_length_mla'");
    refused(g, "deepseek2.attention.head_count_kv", 2, NULL, NULL, NULL, "layer 0 has 2 KV heads");
    refused(g, "deepseek2.leading_dense_block_count", 1, NULL, NULL, NULL,
            "the others are mixtures of experts, but the file has no 'deepseek2.expert_count'");
    refused(g, NULL, 0, "blk.0.attn_q.weight", NULL, NULL, "tensor 'blk.0.attn_q.weight' not found");
    /* attn_k_b and attn_v_b swapped: [RL, VD, H] where [N, RL, H] belongs */
    refused(g, NULL, 0, NULL, "blk.1.attn_k_b.weight", "blk.1.attn_v_b.weight",
            "tensor 'blk.1.attn_k_b.weight' must have shape [32, 64, 4]");
    refused(g, NULL, 0, "blk.0.attn_k_b.weight", "blk.0.attn_v_b.weight", "blk.0.attn_kv_b.weight",
            "no attn_k_b.weight (a file with key_length_mla has attn_k_b and attn_v_b)");
    pkv_gguf_close(g);
    pkv_mkmodel_free_memory(img);
    /* V3's layout told it has no q_lora_rank */
    p = mla_params(32, RL, PKV_TYPE_F16);
    REQUIRE_VOID(pkv_mkmodel_memory(&p, &img, &size) == PKV_OK);
    g = pkv_gguf_open_memory(img, size, "mla-v3");
    REQUIRE_VOID(g);
    refused(g, "deepseek2.attention.q_lora_rank", 0, NULL, NULL, NULL, "tensor 'blk.0.attn_q.weight' not found");
    pkv_gguf_close(g);
    pkv_mkmodel_free_memory(img);
}

int main(void) {
    int64_t live0 = pkv_alloc_live();
    test_reference(0, 0);
    test_reference(32, 0);
    test_reference(0, 8);  /* a dense layer, then a MoE layer routed as V2 */
    test_reference(32, 8); /* as V3: sigmoid, exp_probs_b, 2 of 4 groups, normalised */
    for (int k = 0; k < 2; k++) {
        pkv_mkmodel_params p = mla_params(k ? 32 : 0, RL, PKV_TYPE_F16);
        pkv_mkmodel_free_memory(mc_img);
        mc_img = NULL;
        REQUIRE(pkv_mkmodel_memory(&p, &mc_img, &mc_size) == PKV_OK);
        test_kv_ops(PKV_TYPE_F16);
        test_kv_ops(PKV_TYPE_Q8_0); /* rows of 96: 3 blocks, V the first 2 */
        mc_kv_k = mc_kv_v = PKV_TYPE_F16;
        if (k) test_vulkan(mc_img, mc_size);
    }
    pkv_mkmodel_free_memory(mc_img);
    mc_img = NULL;
    test_legacy();
    test_bad();
    CHECK_INT(pkv_alloc_live(), live0);
    return th_done();
}
