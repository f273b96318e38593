// labels: unit
/* The double-precision reference forward pass (tests/ref-model.h) on tiny random
 * models, checked against facts derivable by hand: RoPE values, identity at position
 * 0, relative-position invariance; the first token's attention is V passed through;
 * zero query weights give uniform causal attention; zero attention weights leave the
 * FFN path alone; GQA equals MHA with duplicated KV heads; one token at a time equals
 * all at once; causality; reset; tied output; the qwen3 Q/K norm removes the scale of
 * Wq and Wk; context shift and truncate against fresh evaluation; bad inputs.
 * qwen3moe runs every test above that is per arch, its FFN written out independently
 * (softmax router, top-k by a stable sort, normalized weights); and the MoE block
 * against the dense path: one expert used of two gives bitwise one dense FFN (which
 * one follows the router; a tie picks expert 0), two identical experts used of two
 * give the dense FFN; every expert is reached; bad MoE hparams and tensors.
 * gemma2 runs the per-arch tests too (the helpers write out its embedding scale, post
 * norms, GELU, attention scale, both softcaps and sliding window), with a window short
 * enough to cut; and: a window at least the sequence's length is bitwise no window, a
 * shorter one changes exactly the positions past it; a window of 1 makes a sliding
 * layer attend to its own position only (bitwise the token alone), and the layers that
 * slide follow swa_pattern (2, 3, 6, 1); huge softcaps equal none, a tiny attention
 * softcap equals uniform attention, the final softcap bounds every logit; with the
 * layers silenced the logits are the embedding times sqrt(n_embd); tied output; bad
 * gemma2 hparams and tensors, and gemma2 fields refused on other architectures.
 * YaRN's rotation against numbers worked out by hand (its ramp over the correction
 * range, its magnitude factor; factor 1 is plain RoPE, turns compose), and gpt-oss's
 * forward pass written out for three tokens (biases, sinks, a window, YaRN, the FFN
 * norm's name, softmax over the top-2 biased router logits, clamped SwiGLU experts
 * with the clamps taken); missing gpt-oss tensors and bad hparams are refused.
 * gemma4's forward pass written out for five layers and four tokens (per-layer head
 * sizes and KV heads, one turning pair of four on the full layers, V = K and V's
 * norm, sharing layers reading their owners' KV, per-layer embeddings, the output
 * scale, the soft-cap); its shift turns only that pair; missing gemma4 tensors, KV
 * owners of the wrong kinds and gemma4 fields on another architecture are refused. */
#include "ref-model.h"
#include "testhelp.h"

/* ------------------------------------------------------ tensor store */

enum { TS_MAX = 128 };
typedef struct tstore {
    int n;
    char name[TS_MAX][64];
    double *data[TS_MAX];
    int64_t size[TS_MAX];
} tstore;

static double *ts_find(tstore *ts, const char *name) {
    for (int i = 0; i < ts->n; i++)
        if (strcmp(ts->name[i], name) == 0) return ts->data[i];
    return NULL;
}

static int64_t ts_size(tstore *ts, const char *name) {
    for (int i = 0; i < ts->n; i++)
        if (strcmp(ts->name[i], name) == 0) return ts->size[i];
    return -1;
}

/* The ref_get_tensor callback: a malloc'd copy. */
static double *ts_get(void *user, const char *name, int64_t *n) {
    tstore *ts = user;
    double *d = ts_find(ts, name);
    if (!d) return NULL;
    *n = ts_size(ts, name);
    double *c = malloc((size_t)*n * sizeof(double));
    memcpy(c, d, (size_t)*n * sizeof(double));
    return c;
}

/* Adds a tensor of n values uniform in [center - scale, center + scale). */
static double *ts_add(tstore *ts, const char *name, int64_t n, double center, double scale, uint64_t *rs) {
    int i = ts->n++;
    snprintf(ts->name[i], sizeof ts->name[i], "%s", name);
    ts->size[i] = n;
    ts->data[i] = malloc((size_t)n * sizeof(double));
    for (int64_t j = 0; j < n; j++) ts->data[i][j] = center + scale * th_randf(rs);
    return ts->data[i];
}

static void ts_remove(tstore *ts, const char *name) {
    for (int i = 0; i < ts->n; i++)
        if (strcmp(ts->name[i], name) == 0) {
            free(ts->data[i]);
            ts->n--;
            memmove(ts->name[i], ts->name[i + 1], (size_t)(ts->n - i) * sizeof ts->name[0]);
            memmove(&ts->data[i], &ts->data[i + 1], (size_t)(ts->n - i) * sizeof ts->data[0]);
            memmove(&ts->size[i], &ts->size[i + 1], (size_t)(ts->n - i) * sizeof ts->size[0]);
            return;
        }
}

static void ts_free(tstore *ts) {
    for (int i = 0; i < ts->n; i++) free(ts->data[i]);
    ts->n = 0;
}

static double *tsf(tstore *ts, const char *fmt, int il) {
    char nm[64];
    snprintf(nm, sizeof nm, fmt, il);
    return ts_find(ts, nm);
}

static bool is_moe(const char *arch) { return strcmp(arch, "qwen3moe") == 0; }
static bool is_gemma2(const char *arch) { return strcmp(arch, "gemma2") == 0; }

/* gemma2: a scale other than 1/sqrt(head_dim), softcaps that bite (scores and logits
 * reach about them), a window shorter than the tests' sequences; layer 0 slides. */
static ref_hparams tiny_hp(const char *arch) {
    ref_hparams hp = {.arch = arch, .n_layer = 2, .n_embd = 16, .n_head = 4, .n_head_kv = 2, .head_dim = 8,
                      .n_ff = 24, .n_vocab = 32, .rms_eps = 1e-6, .rope_base = 10000.0,
                      .rope_neox = strcmp(arch, "llama") != 0};
    if (is_moe(arch)) hp.n_expert = 4, hp.n_expert_used = 2, hp.n_ff_exp = 12;
    if (is_gemma2(arch)) hp.attn_scale = 0.3, hp.attn_softcap = 2, hp.final_softcap = 3, hp.sliding_window = 3;
    return hp;
}

/* Random weights for every tensor the arch has (qwen2: biases; qwen3, qwen3moe: Q/K
 * norms; qwen3moe: router and experts instead of the dense FFN; gemma2: post norms). */
static void make_model(tstore *ts, const ref_hparams *hp, uint64_t seed, bool with_output) {
    uint64_t rs = seed;
    const int64_t E = hp->n_embd, Q = (int64_t)hp->n_head * hp->head_dim, KV = (int64_t)hp->n_head_kv * hp->head_dim,
                  F = hp->n_ff, V = hp->n_vocab;
    ts->n = 0;
    ts_add(ts, "token_embd.weight", V * E, 0, 1, &rs);
    ts_add(ts, "output_norm.weight", E, 1, 0.2, &rs);
    if (with_output) ts_add(ts, "output.weight", V * E, 0, 0.5, &rs);
    for (int il = 0; il < hp->n_layer; il++) {
        char nm[64];
#define ADD(suffix, n, c, s) (snprintf(nm, sizeof nm, "blk.%d." suffix, il), ts_add(ts, nm, n, c, s, &rs))
        ADD("attn_norm.weight", E, 1, 0.2);
        ADD("attn_q.weight", Q * E, 0, 0.5);
        ADD("attn_k.weight", KV * E, 0, 0.5);
        ADD("attn_v.weight", KV * E, 0, 0.5);
        if (strcmp(hp->arch, "qwen2") == 0) {
            ADD("attn_q.bias", Q, 0, 0.3);
            ADD("attn_k.bias", KV, 0, 0.3);
            ADD("attn_v.bias", KV, 0, 0.3);
        }
        if (strcmp(hp->arch, "qwen3") == 0 || is_moe(hp->arch)) {
            ADD("attn_q_norm.weight", hp->head_dim, 1, 0.3);
            ADD("attn_k_norm.weight", hp->head_dim, 1, 0.3);
        }
        ADD("attn_output.weight", E * Q, 0, 0.3);
        ADD("ffn_norm.weight", E, 1, 0.2);
        if (is_gemma2(hp->arch)) {
            ADD("post_attention_norm.weight", E, 1, 0.2);
            ADD("post_ffw_norm.weight", E, 1, 0.2);
        }
        if (is_moe(hp->arch)) {
            const int64_t X = hp->n_expert, FX = hp->n_ff_exp;
            ADD("ffn_gate_inp.weight", X * E, 0, 1.0);
            ADD("ffn_gate_exps.weight", X * FX * E, 0, 0.5);
            ADD("ffn_up_exps.weight", X * FX * E, 0, 0.5);
            ADD("ffn_down_exps.weight", X * E * FX, 0, 0.3);
        } else {
            ADD("ffn_gate.weight", F * E, 0, 0.5);
            ADD("ffn_up.weight", F * E, 0, 0.5);
            ADD("ffn_down.weight", E * F, 0, 0.3);
        }
#undef ADD
    }
}

static double max_diff(const double *a, const double *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs(a[i] - b[i]));
    return m;
}

/* Independent little helpers for the inline computations. */
static void t_norm(const double *x, const double *w, int n, double eps, double *y) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    for (int i = 0; i < n; i++) y[i] = x[i] / sqrt(ss / n + eps) * w[i];
}
static void t_mv(const double *W, const double *x, int rows, int cols, double *y) {
    for (int r = 0; r < rows; r++) {
        y[r] = 0;
        for (int c = 0; c < cols; c++) y[r] += W[r * cols + c] * x[c];
    }
}
/* d = down · (act(gate · h) * up · h), F rows; act silu, or gelu's tanh form */
static void t_glu(const double *gate, const double *up, const double *down, int E, int F, bool gelu,
                  const double *h, double *d) {
    double g[64], u[64];
    t_mv(gate, h, F, E, g);
    t_mv(up, h, F, E, u);
    for (int i = 0; i < F; i++)
        g[i] = (gelu ? 0.5 * g[i] * (1 + tanh(sqrt(2 / acos(-1.0)) * (g[i] + 0.044715 * pow(g[i], 3))))
                     : g[i] / (1 + exp(-g[i]))) *
               u[i];
    t_mv(down, g, E, F, d);
}
/* x = the token's embedding row, times sqrt(n_embd) for gemma2 */
static void t_embd(tstore *ts, const ref_hparams *hp, int32_t tok, double *x) {
    const double *e = ts_find(ts, "token_embd.weight") + tok * hp->n_embd;
    for (int i = 0; i < hp->n_embd; i++) x[i] = is_gemma2(hp->arch) ? e[i] * sqrt((double)hp->n_embd) : e[i];
}
/* the attention score of the dot product q·k: scaled, then softcapped (gemma2) */
static double t_score(const ref_hparams *hp, double qk) {
    double s = qk * (hp->attn_scale > 0 ? hp->attn_scale : 1 / sqrt((double)hp->head_dim));
    return hp->attn_softcap > 0 ? hp->attn_softcap * tanh(s / hp->attn_softcap) : s;
}
/* the first position the query at p sees in layer il: p - W + 1 in a sliding layer */
static int t_first_visible(const ref_hparams *hp, int il, int p) {
    const int W = hp->sliding_window, P = hp->swa_pattern ? hp->swa_pattern : 2;
    return W > 0 && il % P != P - 1 && p - W + 1 > 0 ? p - W + 1 : 0;
}
static unsigned t_moe_seen; /* bit e: t_moe selected expert e at least once */
/* d = the qwen3moe FFN of h: experts sorted by router probability (an insertion sort,
 * stable, so on a tie the lower index comes first), the first n_expert_used taken,
 * their probabilities divided by their sum. */
static void t_moe(tstore *ts, const ref_hparams *hp, int il, const double *h, double *d) {
    const int E = hp->n_embd, FX = hp->n_ff_exp, X = hp->n_expert;
    double logit[16], p[16], z = 0, mx = -1e300, sum = 0;
    int order[16];
    t_mv(tsf(ts, "blk.%d.ffn_gate_inp.weight", il), h, X, E, logit);
    for (int e = 0; e < X; e++) mx = fmax(mx, logit[e]);
    for (int e = 0; e < X; e++) z += p[e] = exp(logit[e] - mx);
    for (int e = 0; e < X; e++) p[e] /= z;
    for (int e = 0; e < X; e++) {
        int j = e;
        for (; j > 0 && p[order[j - 1]] < p[e]; j--) order[j] = order[j - 1];
        order[j] = e;
    }
    for (int k = 0; k < hp->n_expert_used; k++) sum += p[order[k]];
    for (int i = 0; i < E; i++) d[i] = 0;
    for (int k = 0; k < hp->n_expert_used; k++) {
        const int e = order[k];
        double y[64];
        t_moe_seen |= 1u << e;
        t_glu(tsf(ts, "blk.%d.ffn_gate_exps.weight", il) + e * FX * E,
              tsf(ts, "blk.%d.ffn_up_exps.weight", il) + e * FX * E,
              tsf(ts, "blk.%d.ffn_down_exps.weight", il) + e * E * FX, E, FX, false, h, y);
        for (int i = 0; i < E; i++) d[i] += p[e] / sum * y[i];
    }
}
static void t_ffn(tstore *ts, const ref_hparams *hp, int il, double *x) { /* x += ffn(x) */
    double h[64], d[64];
    t_norm(x, tsf(ts, "blk.%d.ffn_norm.weight", il), hp->n_embd, hp->rms_eps, h);
    if (is_moe(hp->arch))
        t_moe(ts, hp, il, h, d);
    else
        t_glu(tsf(ts, "blk.%d.ffn_gate.weight", il), tsf(ts, "blk.%d.ffn_up.weight", il),
              tsf(ts, "blk.%d.ffn_down.weight", il), hp->n_embd, hp->n_ff, is_gemma2(hp->arch), h, d);
    double *pn = tsf(ts, "blk.%d.post_ffw_norm.weight", il);
    if (pn) t_norm(d, pn, hp->n_embd, hp->rms_eps, d);
    for (int i = 0; i < hp->n_embd; i++) x[i] += d[i];
}
static void t_out(tstore *ts, const ref_hparams *hp, const double *x, double *logits) {
    double h[64];
    t_norm(x, ts_find(ts, "output_norm.weight"), hp->n_embd, hp->rms_eps, h);
    double *out = ts_find(ts, "output.weight");
    t_mv(out ? out : ts_find(ts, "token_embd.weight"), h, hp->n_vocab, hp->n_embd, logits);
    const double c = hp->final_softcap;
    for (int i = 0; c > 0 && i < hp->n_vocab; i++) logits[i] = c * tanh(logits[i] / c);
}
/* v = Wv norm(x) + bv for layer il */
static void t_v(tstore *ts, const ref_hparams *hp, int il, const double *x, double *v) {
    double h[64];
    t_norm(x, tsf(ts, "blk.%d.attn_norm.weight", il), hp->n_embd, hp->rms_eps, h);
    int KV = hp->n_head_kv * hp->head_dim;
    t_mv(tsf(ts, "blk.%d.attn_v.weight", il), h, KV, hp->n_embd, v);
    double *bv = tsf(ts, "blk.%d.attn_v.bias", il);
    for (int i = 0; bv && i < KV; i++) v[i] += bv[i];
}
/* x += Wo · att, normed by the post-attention norm where there is one (gemma2) */
static void t_add_attn(tstore *ts, const ref_hparams *hp, int il, const double *att, double *x) {
    double o[64];
    t_mv(tsf(ts, "blk.%d.attn_output.weight", il), att, hp->n_embd, hp->n_head * hp->head_dim, o);
    double *pn = tsf(ts, "blk.%d.post_attention_norm.weight", il);
    if (pn) t_norm(o, pn, hp->n_embd, hp->rms_eps, o);
    for (int i = 0; i < hp->n_embd; i++) x[i] += o[i];
}
/* x += the attention output of each query head hq reading vhead[hq / group] */
static void t_attn_out(tstore *ts, const ref_hparams *hp, int il, const double *vheads, double *x) {
    double att[128];
    int D = hp->head_dim, group = hp->n_head / hp->n_head_kv;
    for (int hq = 0; hq < hp->n_head; hq++)
        for (int d = 0; d < D; d++) att[hq * D + d] = vheads[(hq / group) * D + d];
    t_add_attn(ts, hp, il, att, x);
}

enum { N_ARCHS = 5 };
static const char *ARCHS[N_ARCHS] = {"llama", "qwen2", "qwen3", "qwen3moe", "gemma2"};

/* ------------------------------------------------------------- tests */

static void test_rope(void) {
    uint64_t rs = 3;
    double x[16], y[16], z[16];
    for (int i = 0; i < 16; i++) x[i] = th_randf(&rs);
    for (int neox = 0; neox < 2; neox++) {
        memcpy(y, x, sizeof x);
        ref_rope(y, 2, 8, 0, 10000, neox);
        CHECK_MEM(y, x, sizeof x); /* position 0 is the identity, exactly */
        /* rotating to a and back to -a is the identity; the norm is kept */
        ref_rope(y, 2, 8, 37, 10000, neox);
        double n0 = 0, n1 = 0;
        for (int i = 0; i < 16; i++) n0 += x[i] * x[i], n1 += y[i] * y[i];
        CHECK_NEAR(n1, n0, 1e-12);
        CHECK(max_diff(x, y, 16) > 0.1);
        ref_rope(y, 2, 8, -37, 10000, neox);
        CHECK(max_diff(x, y, 16) < 1e-12);
        /* q·k depends only on the distance of the positions */
        double q[8], k[8], q2[8], k2[8];
        memcpy(q, x, sizeof q), memcpy(k, x + 8, sizeof k), memcpy(q2, q, sizeof q), memcpy(k2, k, sizeof k);
        ref_rope(q, 1, 8, 9, 500, neox), ref_rope(k, 1, 8, 4, 500, neox);
        ref_rope(q2, 1, 8, 1009, 500, neox), ref_rope(k2, 1, 8, 1004, 500, neox);
        double d1 = 0, d2 = 0;
        for (int i = 0; i < 8; i++) d1 += q[i] * k[i], d2 += q2[i] * k2[i];
        CHECK_NEAR(d1, d2, 1e-10);
    }
    /* by hand: head_dim 4, base 10000, position 1: pair 0 turns by 1 rad, pair 1 by
     * 10000^(-1/2) = 0.01 rad */
    double v[4] = {1, 2, 3, 4}, c1 = cos(1), s1 = sin(1), c2 = cos(0.01), s2 = sin(0.01);
    ref_rope(v, 1, 4, 1, 10000, false); /* normal: pairs (0,1), (2,3) */
    double want[4] = {c1 - 2 * s1, s1 + 2 * c1, 3 * c2 - 4 * s2, 3 * s2 + 4 * c2};
    CHECK(max_diff(v, want, 4) < 1e-15);
    double w[4] = {1, 2, 3, 4};
    ref_rope(w, 1, 4, 1, 10000, true); /* neox: pairs (0,2), (1,3) */
    double wantn[4] = {c1 - 3 * s1, 2 * c2 - 4 * s2, s1 + 3 * c1, 2 * s2 + 4 * c2};
    CHECK(max_diff(w, wantn, 4) < 1e-15);
    /* neox = normal on the interleaved vector */
    for (int i = 0; i < 4; i++) y[2 * i] = x[i], y[2 * i + 1] = x[i + 4];
    memcpy(z, x, 8 * sizeof(double));
    ref_rope(y, 1, 8, 5, 10000, false);
    ref_rope(z, 1, 8, 5, 10000, true);
    for (int i = 0; i < 4; i++) {
        CHECK_NEAR(y[2 * i], z[i], 0);
        CHECK_NEAR(y[2 * i + 1], z[i + 4], 0);
    }
}

/* At the first position the softmax has one entry: every query head returns V of its
 * KV head, whatever Q, K, their norms and RoPE. */
static void test_first_token(const char *arch) {
    ref_hparams hp = tiny_hp(arch);
    tstore ts;
    make_model(&ts, &hp, 11, true);
    ref_model *m = ref_model_create(&hp, ts_get, &ts);
    REQUIRE_VOID(m);
    for (int32_t tok = 0; tok < hp.n_vocab; tok += 7) {
        double got[32], want[32], x[16], v[16];
        ref_model_reset(m);
        CHECK_INT(ref_model_eval(m, &tok, 1, got, NULL), 0);
        t_embd(&ts, &hp, tok, x);
        for (int il = 0; il < hp.n_layer; il++) {
            t_v(&ts, &hp, il, x, v);
            t_attn_out(&ts, &hp, il, v, x);
            t_ffn(&ts, &hp, il, x);
        }
        t_out(&ts, &hp, x, want);
        double d = max_diff(got, want, 32);
        th_checks++;
        if (d > 1e-10) TH_FAIL("%s: first token %d: max diff %g", arch, (int)tok, d);
    }
    ref_model_free(m);
    ts_free(&ts);
}

/* Two tokens through one layer, written out: Q/K/V with biases, the per-head Q/K norm
 * before RoPE, RoPE at positions 0 and 1, scores scaled by 1/sqrt(head_dim) (gemma2:
 * its scale and softcap), a softmax over the two positions, GQA head mapping, output
 * projection, FFN. */
static void test_second_token(const char *arch) {
    ref_hparams hp = tiny_hp(arch);
    hp.n_layer = 1;
    tstore ts;
    make_model(&ts, &hp, 24, true);
    ref_model *m = ref_model_create(&hp, ts_get, &ts);
    REQUIRE_VOID(m);
    const int E = hp.n_embd, D = hp.head_dim, NQ = hp.n_head * D, NKV = hp.n_head_kv * D;
    const int group = hp.n_head / hp.n_head_kv;
    int32_t toks[2] = {9, 26};
    double q[2][32], k[2][16], v[2][16], x[2][16];
    for (int p = 0; p < 2; p++) {
        double h[16];
        t_embd(&ts, &hp, toks[p], x[p]);
        t_norm(x[p], tsf(&ts, "blk.%d.attn_norm.weight", 0), E, hp.rms_eps, h);
        t_mv(tsf(&ts, "blk.%d.attn_q.weight", 0), h, NQ, E, q[p]);
        t_mv(tsf(&ts, "blk.%d.attn_k.weight", 0), h, NKV, E, k[p]);
        t_mv(tsf(&ts, "blk.%d.attn_v.weight", 0), h, NKV, E, v[p]);
        double *bq = tsf(&ts, "blk.%d.attn_q.bias", 0), *bk = tsf(&ts, "blk.%d.attn_k.bias", 0),
               *bv = tsf(&ts, "blk.%d.attn_v.bias", 0);
        for (int i = 0; bq && i < NQ; i++) q[p][i] += bq[i];
        for (int i = 0; bk && i < NKV; i++) k[p][i] += bk[i], v[p][i] += bv[i];
        double *qn = tsf(&ts, "blk.%d.attn_q_norm.weight", 0), *kn = tsf(&ts, "blk.%d.attn_k_norm.weight", 0);
        for (int hd = 0; qn && hd < hp.n_head; hd++) t_norm(q[p] + hd * D, qn, D, hp.rms_eps, q[p] + hd * D);
        for (int hd = 0; kn && hd < hp.n_head_kv; hd++) t_norm(k[p] + hd * D, kn, D, hp.rms_eps, k[p] + hd * D);
        ref_rope(q[p], hp.n_head, D, p, hp.rope_base, hp.rope_neox);
        ref_rope(k[p], hp.n_head_kv, D, p, hp.rope_base, hp.rope_neox);
    }
    double att[32], want[32], got[2 * 32];
    for (int hq = 0; hq < hp.n_head; hq++) {
        int hk = hq / group;
        double s[2];
        for (int t = 0; t < 2; t++) {
            s[t] = 0;
            for (int d = 0; d < D; d++) s[t] += q[1][hq * D + d] * k[t][hk * D + d];
            s[t] = t_score(&hp, s[t]);
        }
        double p0 = 1.0 / (1.0 + exp(s[1] - s[0])); /* softmax of two */
        for (int d = 0; d < D; d++) att[hq * D + d] = p0 * v[0][hk * D + d] + (1 - p0) * v[1][hk * D + d];
    }
    t_add_attn(&ts, &hp, 0, att, x[1]);
    t_ffn(&ts, &hp, 0, x[1]);
    t_out(&ts, &hp, x[1], want);
    CHECK_INT(ref_model_eval(m, toks, 2, NULL, got), 0);
    double d = max_diff(got + 32, want, 32);
    th_checks++;
    if (d > 1e-10) TH_FAIL("%s: second token: max diff %g", arch, d);
    ref_model_free(m);
    ts_free(&ts);
}

/* With Wq = 0 (and no Q bias) every score is 0 (softcapped too): position p attends
 * uniformly to positions 0..p, or to its window. One layer, so V of each token depends
 * only on the token. */
static void test_uniform_attention(const char *arch) {
    ref_hparams hp = tiny_hp(arch);
    hp.n_layer = 1;
    tstore ts;
    make_model(&ts, &hp, 12, true);
    memset(tsf(&ts, "blk.%d.attn_q.weight", 0), 0, (size_t)ts_size(&ts, "blk.0.attn_q.weight") * sizeof(double));
    double *bq = tsf(&ts, "blk.%d.attn_q.bias", 0);
    if (bq) memset(bq, 0, (size_t)(hp.n_head * hp.head_dim) * sizeof(double));
    ref_model *m = ref_model_create(&hp, ts_get, &ts);
    REQUIRE_VOID(m);
    int32_t toks[6] = {3, 17, 3, 30, 0, 9};
    double all[6 * 32];
    CHECK_INT(ref_model_eval(m, toks, 6, NULL, all), 0);
    double v[6][16];
    int KV = hp.n_head_kv * hp.head_dim;
    for (int p = 0; p < 6; p++) {
        double x[16], mean[16] = {0}, want[32];
        t_embd(&ts, &hp, toks[p], x);
        t_v(&ts, &hp, 0, x, v[p]);
        const int p0 = t_first_visible(&hp, 0, p);
        for (int t = p0; t <= p; t++)
            for (int i = 0; i < KV; i++) mean[i] += v[t][i] / (p - p0 + 1);
        t_attn_out(&ts, &hp, 0, mean, x);
        t_ffn(&ts, &hp, 0, x);
        t_out(&ts, &hp, x, want);
        double d = max_diff(all + p * 32, want, 32);
        th_checks++;
        if (d > 1e-10) TH_FAIL("%s: uniform attention at %d: max diff %g", arch, p, d);
    }
    ref_model_free(m);
    ts_free(&ts);
}

/* All attention weights zero: the attention adds nothing, and every position's logits
 * are the FFN-only computation of its own token. */
static void test_attention_zero(const char *arch) {
    ref_hparams hp = tiny_hp(arch);
    tstore ts;
    make_model(&ts, &hp, 13, true);
    for (int il = 0; il < hp.n_layer; il++) {
        const char *names[] = {"blk.%d.attn_q.weight", "blk.%d.attn_k.weight", "blk.%d.attn_v.weight",
                               "blk.%d.attn_output.weight", "blk.%d.attn_q.bias", "blk.%d.attn_k.bias",
                               "blk.%d.attn_v.bias"};
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
            char nm[64];
            snprintf(nm, sizeof nm, names[i], il);
            double *d = ts_find(&ts, nm);
            if (d) memset(d, 0, (size_t)ts_size(&ts, nm) * sizeof(double));
        }
    }
    ref_model *m = ref_model_create(&hp, ts_get, &ts);
    REQUIRE_VOID(m);
    int32_t toks[5] = {1, 2, 31, 2, 8};
    double all[5 * 32];
    CHECK_INT(ref_model_eval(m, toks, 5, NULL, all), 0);
    for (int p = 0; p < 5; p++) {
        double x[16], want[32];
        t_embd(&ts, &hp, toks[p], x);
        for (int il = 0; il < hp.n_layer; il++) t_ffn(&ts, &hp, il, x);
        t_out(&ts, &hp, x, want);
        double d = max_diff(all + p * 32, want, 32);
        th_checks++;
        if (d > 1e-10) TH_FAIL("%s: FFN only at %d: max diff %g", arch, p, d);
    }
    /* the same token at positions 1 and 3 gives the same logits */
    CHECK(max_diff(all + 1 * 32, all + 3 * 32, 32) < 1e-12);
    ref_model_free(m);
    ts_free(&ts);
}

/* GQA (2 KV heads for 4 query heads) equals MHA whose KV head j is a copy of GQA's
 * KV head j / 2. */
static void test_gqa(const char *arch) {
    ref_hparams hg = tiny_hp(arch), hm = hg;
    hm.n_head_kv = hm.n_head;
    tstore tg, tm;
    make_model(&tg, &hg, 14, true);
    make_model(&tm, &hm, 14, true);
    const int D = hg.head_dim, E = hg.n_embd, group = hg.n_head / hg.n_head_kv;
    for (int il = 0; il < hg.n_layer; il++) {
        /* copy everything, then expand K and V */
        const char *same[] = {"blk.%d.attn_norm.weight", "blk.%d.attn_q.weight", "blk.%d.attn_q.bias",
                              "blk.%d.attn_q_norm.weight", "blk.%d.attn_k_norm.weight",
                              "blk.%d.attn_output.weight", "blk.%d.ffn_norm.weight", "blk.%d.ffn_gate.weight",
                              "blk.%d.post_attention_norm.weight", "blk.%d.post_ffw_norm.weight",
                              "blk.%d.ffn_up.weight", "blk.%d.ffn_down.weight", "blk.%d.ffn_gate_inp.weight",
                              "blk.%d.ffn_gate_exps.weight", "blk.%d.ffn_up_exps.weight",
                              "blk.%d.ffn_down_exps.weight"};
        for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
            char nm[64];
            snprintf(nm, sizeof nm, same[i], il);
            if (ts_find(&tg, nm)) memcpy(ts_find(&tm, nm), ts_find(&tg, nm), (size_t)ts_size(&tg, nm) * sizeof(double));
        }
        const char *kv[] = {"blk.%d.attn_k.weight", "blk.%d.attn_v.weight", "blk.%d.attn_k.bias", "blk.%d.attn_v.bias"};
        for (int i = 0; i < 4; i++) {
            double *src = tsf(&tg, kv[i], il), *dst = tsf(&tm, kv[i], il);
            if (!src) continue;
            int cols = i < 2 ? E : 1;
            for (int h = 0; h < hm.n_head_kv; h++)
                memcpy(dst + (size_t)h * D * cols, src + (size_t)(h / group) * D * cols, (size_t)D * cols * sizeof(double));
        }
    }
    memcpy(ts_find(&tm, "token_embd.weight"), ts_find(&tg, "token_embd.weight"), (size_t)(hg.n_vocab * E) * sizeof(double));
    memcpy(ts_find(&tm, "output_norm.weight"), ts_find(&tg, "output_norm.weight"), (size_t)E * sizeof(double));
    memcpy(ts_find(&tm, "output.weight"), ts_find(&tg, "output.weight"), (size_t)(hg.n_vocab * E) * sizeof(double));
    ref_model *mg = ref_model_create(&hg, ts_get, &tg), *mm = ref_model_create(&hm, ts_get, &tm);
    REQUIRE_VOID(mg && mm);
    int32_t toks[7] = {5, 9, 9, 30, 1, 0, 22};
    double ag[7 * 32], am[7 * 32];
    CHECK_INT(ref_model_eval(mg, toks, 7, NULL, ag), 0);
    CHECK_INT(ref_model_eval(mm, toks, 7, NULL, am), 0);
    double d = max_diff(ag, am, 7 * 32);
    th_checks++;
    if (d > 1e-12) TH_FAIL("%s: GQA vs MHA with duplicated KV: max diff %g", arch, d);
    /* and a grouping other than h / group (e.g. h % n_head_kv) would differ: heads
     * really differ */
    CHECK(max_diff(tsf(&tg, "blk.%d.attn_v.weight", 0), tsf(&tg, "blk.%d.attn_v.weight", 0) + D * E, (size_t)D * E) > 0.1);
    ref_model_free(mg);
    ref_model_free(mm);
    ts_free(&tg);
    ts_free(&tm);
}

/* One token at a time, in chunks, or all at once: bitwise the same logits. Also
 * causality, reset and the logits_last/logits_all agreement. */
static void test_incremental(const char *arch) {
    ref_hparams hp = tiny_hp(arch);
    tstore ts;
    make_model(&ts, &hp, 15, true);
    ref_model *m = ref_model_create(&hp, ts_get, &ts);
    REQUIRE_VOID(m);
    enum { N = 9, V = 32 };
    int32_t toks[N] = {4, 8, 15, 16, 23, 31, 0, 4, 4};
    double all[N * V], one[N * V], last[V], chunk[N * V];
    CHECK_INT(ref_model_eval(m, toks, N, last, all), 0);
    CHECK_INT(ref_model_n_past(m), N);
    CHECK_MEM(last, all + (N - 1) * V, sizeof last);
    ref_model_reset(m);
    CHECK_INT(ref_model_n_past(m), 0);
    for (int i = 0; i < N; i++) CHECK_INT(ref_model_eval(m, toks + i, 1, one + i * V, NULL), 0);
    CHECK_MEM(one, all, sizeof all);
    ref_model_reset(m);
    CHECK_INT(ref_model_eval(m, toks, 4, NULL, chunk), 0);
    CHECK_INT(ref_model_eval(m, toks + 4, N - 4, NULL, chunk + 4 * V), 0);
    CHECK_MEM(chunk, all, sizeof all);
    /* the logits differ between positions (the test is not vacuous) */
    CHECK(max_diff(all + 7 * V, all + 8 * V, V) > 1e-3);
    /* causality: changing the last token changes only the last row */
    int32_t alt[N];
    memcpy(alt, toks, sizeof alt);
    alt[N - 1] = 19;
    double all2[N * V];
    ref_model_reset(m);
    CHECK_INT(ref_model_eval(m, alt, N, NULL, all2), 0);
    CHECK_MEM(all2, all, (N - 1) * V * sizeof(double));
    CHECK(max_diff(all2 + (N - 1) * V, all + (N - 1) * V, V) > 1e-3);
    ref_model_free(m);
    ts_free(&ts);
}

/* RoPE acts through the model: flipping neox changes nothing at position 0 and
 * changes later positions. */
static void test_rope_in_model(void) {
    ref_hparams hp = tiny_hp("llama"), hn = hp;
    hn.rope_neox = true;
    tstore ts;
    make_model(&ts, &hp, 16, true);
    ref_model *a = ref_model_create(&hp, ts_get, &ts), *b = ref_model_create(&hn, ts_get, &ts);
    REQUIRE_VOID(a && b);
    int32_t toks[4] = {2, 7, 1, 8};
    double la[4 * 32], lb[4 * 32];
    CHECK_INT(ref_model_eval(a, toks, 4, NULL, la), 0);
    CHECK_INT(ref_model_eval(b, toks, 4, NULL, lb), 0);
    CHECK_MEM(la, lb, 32 * sizeof(double));
    CHECK(max_diff(la + 32, lb + 32, 3 * 32) > 1e-4);
    ref_model_free(a);
    ref_model_free(b);
    ts_free(&ts);
}

static void test_tied_output(const char *arch) {
    ref_hparams hp = tiny_hp(arch);
    tstore ta, tb;
    make_model(&ta, &hp, 17, false);
    make_model(&tb, &hp, 17, false);
    uint64_t rs = 1;
    double *o = ts_add(&tb, "output.weight", (int64_t)hp.n_vocab * hp.n_embd, 0, 1, &rs);
    memcpy(o, ts_find(&tb, "token_embd.weight"), (size_t)(hp.n_vocab * hp.n_embd) * sizeof(double));
    ref_model *a = ref_model_create(&hp, ts_get, &ta), *b = ref_model_create(&hp, ts_get, &tb);
    REQUIRE_VOID(a && b);
    int32_t toks[3] = {6, 2, 6};
    double la[3 * 32], lb[3 * 32];
    CHECK_INT(ref_model_eval(a, toks, 3, NULL, la), 0);
    CHECK_INT(ref_model_eval(b, toks, 3, NULL, lb), 0);
    CHECK_MEM(la, lb, sizeof la);
    ref_model_free(a);
    ref_model_free(b);
    ts_free(&ta);
    ts_free(&tb);
}

/* qwen3 normalizes each head of Q and K before RoPE, so scaling Wq or Wk changes
 * nothing (up to eps); in llama it sharpens the attention. */
static void test_qk_norm(void) {
    for (int a = 0; a < 2; a++) {
        const char *arch = a ? "qwen3" : "llama";
        ref_hparams hp = tiny_hp(arch);
        hp.rms_eps = 1e-12;
        for (int which = 0; which < 2; which++) {
            tstore ts;
            make_model(&ts, &hp, 18, true);
            ref_model *m0 = ref_model_create(&hp, ts_get, &ts);
            const char *w = which ? "blk.%d.attn_k.weight" : "blk.%d.attn_q.weight";
            for (int il = 0; il < hp.n_layer; il++) {
                double *d = tsf(&ts, w, il);
                int64_t n = (int64_t)(which ? hp.n_head_kv : hp.n_head) * hp.head_dim * hp.n_embd;
                for (int64_t i = 0; i < n; i++) d[i] *= 3;
            }
            ref_model *m1 = ref_model_create(&hp, ts_get, &ts);
            REQUIRE_VOID(m0 && m1);
            int32_t toks[5] = {1, 12, 3, 1, 20};
            double l0[5 * 32], l1[5 * 32];
            CHECK_INT(ref_model_eval(m0, toks, 5, NULL, l0), 0);
            CHECK_INT(ref_model_eval(m1, toks, 5, NULL, l1), 0);
            double d = max_diff(l0 + 32, l1 + 32, 4 * 32);
            th_checks++;
            if (a ? d > 1e-9 : d < 1e-4) TH_FAIL("%s: scaling %s by 3: max diff %g", arch, w, d);
            /* the norm weights themselves do matter */
            if (a) {
                double *qn = tsf(&ts, which ? "blk.%d.attn_k_norm.weight" : "blk.%d.attn_q_norm.weight", 0);
                for (int i = 0; i < hp.head_dim; i++) qn[i] *= 1.5 + 0.1 * i;
                ref_model *m2 = ref_model_create(&hp, ts_get, &ts);
                REQUIRE_VOID(m2);
                double l2[5 * 32];
                CHECK_INT(ref_model_eval(m2, toks, 5, NULL, l2), 0);
                CHECK(max_diff(l2 + 32, l1 + 32, 4 * 32) > 1e-4);
                ref_model_free(m2);
            }
            ref_model_free(m0);
            ref_model_free(m1);
            ts_free(&ts);
        }
    }
}

/* With one layer, a token's K and V depend only on the token and its position, so
 * after a context shift the cache equals a fresh evaluation of the kept tokens. */
static void test_shift_truncate(const char *arch) {
    ref_hparams hp = tiny_hp(arch);
    hp.n_layer = 1;
    tstore ts;
    make_model(&ts, &hp, 19, true);
    ref_model *m = ref_model_create(&hp, ts_get, &ts), *f = ref_model_create(&hp, ts_get, &ts);
    REQUIRE_VOID(m && f);
    const int KV = hp.n_head_kv * hp.head_dim;
    int32_t toks[6] = {10, 11, 12, 13, 14, 15}, next = 7;
    double got[32], want[32];
    struct {
        int p0, p1;
        int32_t kept[6];
        int n_kept;
    } cases[] = {{0, 2, {12, 13, 14, 15}, 4}, {2, 3, {10, 11, 13, 14, 15}, 5}, {1, 5, {10, 15}, 2},
                 {4, 6, {10, 11, 12, 13}, 4}, {3, 3, {10, 11, 12, 13, 14, 15}, 6}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ref_model_reset(m);
        ref_model_reset(f);
        CHECK_INT(ref_model_eval(m, toks, 6, NULL, NULL), 0);
        CHECK_INT(ref_model_remove(m, cases[c].p0, cases[c].p1), 0);
        CHECK_INT(ref_model_n_past(m), cases[c].n_kept);
        CHECK_INT(ref_model_eval(f, cases[c].kept, cases[c].n_kept, NULL, NULL), 0);
        double dk = 0, dv = 0;
        for (int p = 0; p < cases[c].n_kept; p++) {
            dk = fmax(dk, max_diff(ref_model_k(m, 0, p), ref_model_k(f, 0, p), (size_t)KV));
            dv = fmax(dv, max_diff(ref_model_v(m, 0, p), ref_model_v(f, 0, p), (size_t)KV));
        }
        CHECK_INT(ref_model_eval(m, &next, 1, got, NULL), 0);
        CHECK_INT(ref_model_eval(f, &next, 1, want, NULL), 0);
        double dl = max_diff(got, want, 32);
        th_checks++;
        if (dk > 1e-12 || dv > 0 || dl > 1e-10)
            TH_FAIL("%s: remove [%d, %d): K diff %g, V diff %g, logits diff %g", arch, cases[c].p0, cases[c].p1,
                    dk, dv, dl);
    }
    /* fork: a copy of the cache continues exactly like the original */
    ref_model_reset(m);
    ref_model_reset(f);
    CHECK_INT(ref_model_eval(m, toks, 5, NULL, NULL), 0);
    CHECK_INT(ref_model_eval(f, toks, 2, NULL, NULL), 0); /* overwritten by the copy */
    CHECK_INT(ref_model_copy_cache(f, m), 0);
    CHECK_INT(ref_model_n_past(f), 5);
    CHECK_INT(ref_model_eval(m, &next, 1, got, NULL), 0);
    CHECK_INT(ref_model_eval(f, &next, 1, want, NULL), 0);
    CHECK_MEM(got, want, sizeof got);
    CHECK_INT(ref_model_remove(m, 2, 1), -1);
    CHECK_INT(ref_model_remove(m, 0, 100), -1);
    /* truncate (any depth) equals a fresh evaluation of the prefix */
    hp.n_layer = 2;
    tstore t2;
    make_model(&t2, &hp, 20, true);
    ref_model *a = ref_model_create(&hp, ts_get, &t2), *b = ref_model_create(&hp, ts_get, &t2);
    REQUIRE_VOID(a && b);
    CHECK_INT(ref_model_eval(a, toks, 6, NULL, NULL), 0);
    CHECK_INT(ref_model_truncate(a, 3), 0);
    CHECK_INT(ref_model_truncate(a, 4), -1);
    CHECK_INT(ref_model_eval(a, &next, 1, got, NULL), 0);
    int32_t pre[4] = {10, 11, 12, 7};
    CHECK_INT(ref_model_eval(b, pre, 4, want, NULL), 0);
    CHECK_MEM(got, want, sizeof got);
    ref_model_free(a);
    ref_model_free(b);
    ref_model_free(m);
    ref_model_free(f);
    ts_free(&ts);
    ts_free(&t2);
}

static void test_errors(void) {
    tstore ts;
    ref_hparams hp = tiny_hp("qwen2");
    make_model(&ts, &hp, 21, true);
    ref_model *m = ref_model_create(&hp, ts_get, &ts);
    REQUIRE_VOID(m);
    int32_t bad[2] = {3, 32};
    double l[32];
    CHECK_INT(ref_model_eval(m, bad, 2, l, NULL), -1);
    CHECK_INT(ref_model_n_past(m), 0); /* unchanged: the first token was not evaluated */
    bad[1] = -1;
    CHECK_INT(ref_model_eval(m, bad, 2, l, NULL), -1);
    CHECK_INT(ref_model_eval(m, bad, 0, l, NULL), -1);
    ref_model_free(m);
    /* qwen2 needs its biases; llama does not */
    ts_remove(&ts, "blk.1.attn_k.bias");
    CHECK(ref_model_create(&hp, ts_get, &ts) == NULL);
    ref_hparams hl = tiny_hp("llama");
    tstore tl;
    make_model(&tl, &hl, 22, true);
    m = ref_model_create(&hl, ts_get, &tl);
    CHECK(m != NULL);
    ref_model_free(m);
    /* a missing or mis-sized tensor */
    tl.size[3] -= 1; /* some tensor one element short */
    CHECK(ref_model_create(&hl, ts_get, &tl) == NULL);
    tl.size[3] += 1;
    ts_remove(&tl, "blk.1.ffn_up.weight");
    CHECK(ref_model_create(&hl, ts_get, &tl) == NULL);
    /* qwen3 needs its Q/K norms */
    ref_hparams h3 = tiny_hp("qwen3");
    tstore t3;
    make_model(&t3, &h3, 23, true);
    ts_remove(&t3, "blk.0.attn_q_norm.weight");
    CHECK(ref_model_create(&h3, ts_get, &t3) == NULL);
    /* bad hparams */
    ref_hparams hb = tiny_hp("llama");
    hb.n_head_kv = 3;
    CHECK(ref_model_create(&hb, ts_get, &tl) == NULL);
    hb = tiny_hp("gpt2");
    CHECK(ref_model_create(&hb, ts_get, &tl) == NULL);
    ts_free(&ts);
    ts_free(&tl);
    ts_free(&t3);
}

/* ------------------------------------------------------------- MoE */

/* gate, up, down: the experts' and the dense FFN's (expert and dense matrices have
 * the same shapes, [n_ff_exp][n_embd] or [n_embd][n_ff_exp]) */
static const char *EXPS[3] = {"blk.%d.ffn_gate_exps.weight", "blk.%d.ffn_up_exps.weight",
                              "blk.%d.ffn_down_exps.weight"};
static const char *DENSE_FFN[3] = {"blk.%d.ffn_gate.weight", "blk.%d.ffn_up.weight", "blk.%d.ffn_down.weight"};

/* dst = src's qwen3moe model as a dense qwen3 model whose FFN is expert e's matrices
 * (the same attention, norms, embeddings). */
static void dense_from_expert(tstore *dst, tstore *src, const ref_hparams *hp, int e) {
    const int64_t E = hp->n_embd, FX = hp->n_ff_exp;
    uint64_t rs = 0;
    dst->n = 0;
    for (int i = 0; i < src->n; i++) {
        if (strstr(src->name[i], "_exps.") || strstr(src->name[i], "gate_inp.")) continue;
        memcpy(ts_add(dst, src->name[i], src->size[i], 0, 0, &rs), src->data[i], (size_t)src->size[i] * sizeof(double));
    }
    for (int il = 0; il < hp->n_layer; il++) {
        for (int t = 0; t < 3; t++) {
            char nm[64];
            snprintf(nm, sizeof nm, DENSE_FFN[t], il);
            memcpy(ts_add(dst, nm, FX * E, 0, 0, &rs), tsf(src, EXPS[t], il) + e * FX * E,
                   (size_t)(FX * E) * sizeof(double));
        }
    }
}

static ref_hparams dense_hp(const ref_hparams *moe) {
    ref_hparams hd = *moe;
    hd.arch = "qwen3";
    hd.n_ff = moe->n_ff_exp;
    hd.n_expert = hd.n_expert_used = hd.n_ff_exp = 0;
    return hd;
}

/* Two experts, one used: its weight is exactly p / p = 1, so each position's logits
 * are bitwise those of the dense model of the expert the router picked. One layer,
 * so the FFN input does not depend on earlier choices. With a zero router the two
 * tie and expert 0 is taken. */
static void test_moe_one_of_two(void) {
    ref_hparams hp = tiny_hp("qwen3moe");
    hp.n_layer = 1, hp.n_expert = 2, hp.n_expert_used = 1;
    ref_hparams hd = dense_hp(&hp);
    tstore tm, ta, tb;
    make_model(&tm, &hp, 31, true);
    dense_from_expert(&ta, &tm, &hp, 0);
    dense_from_expert(&tb, &tm, &hp, 1);
    ref_model *m = ref_model_create(&hp, ts_get, &tm), *a = ref_model_create(&hd, ts_get, &ta),
              *b = ref_model_create(&hd, ts_get, &tb);
    REQUIRE_VOID(m && a && b);
    enum { N = 16, V = 32 };
    int32_t toks[N];
    for (int i = 0; i < N; i++) toks[i] = (i * 7 + 3) % V;
    double lm[N * V], la[N * V], lb[N * V];
    CHECK_INT(ref_model_eval(m, toks, N, NULL, lm), 0);
    CHECK_INT(ref_model_eval(a, toks, N, NULL, la), 0);
    CHECK_INT(ref_model_eval(b, toks, N, NULL, lb), 0);
    int n_a = 0, n_b = 0;
    for (int p = 0; p < N; p++) {
        CHECK(max_diff(la + p * V, lb + p * V, V) > 1e-3); /* the experts differ */
        bool is_a = memcmp(lm + p * V, la + p * V, V * sizeof(double)) == 0;
        bool is_b = memcmp(lm + p * V, lb + p * V, V * sizeof(double)) == 0;
        n_a += is_a, n_b += is_b;
        th_checks++;
        if (!is_a && !is_b)
            TH_FAIL("one of two experts at %d: max diff %g to expert 0, %g to expert 1", p,
                    max_diff(lm + p * V, la + p * V, V), max_diff(lm + p * V, lb + p * V, V));
    }
    th_checks++;
    if (n_a == 0 || n_b == 0) TH_FAIL("one of two experts: expert 0 %d times, expert 1 %d times", n_a, n_b);
    ref_model_free(m);
    /* a tie: expert 0, at every position */
    memset(tsf(&tm, "blk.%d.ffn_gate_inp.weight", 0), 0, (size_t)(hp.n_expert * hp.n_embd) * sizeof(double));
    m = ref_model_create(&hp, ts_get, &tm);
    REQUIRE_VOID(m);
    CHECK_INT(ref_model_eval(m, toks, N, NULL, lm), 0);
    CHECK_MEM(lm, la, sizeof lm);
    ref_model_free(m);
    ref_model_free(a);
    ref_model_free(b);
    ts_free(&tm);
    ts_free(&ta);
    ts_free(&tb);
}

/* Two identical experts: whatever the router says, the normalized weights sum to 1
 * and the MoE is the dense FFN (to rounding when both are used, bitwise when one). */
static void test_moe_identical(void) {
    for (int used = 1; used <= 2; used++) {
        ref_hparams hp = tiny_hp("qwen3moe");
        hp.n_expert = 2, hp.n_expert_used = used;
        ref_hparams hd = dense_hp(&hp);
        tstore tm, td;
        make_model(&tm, &hp, 32, true);
        const int64_t n = (int64_t)hp.n_ff_exp * hp.n_embd;
        for (int il = 0; il < hp.n_layer; il++) /* expert 1 = expert 0 */
            for (int t = 0; t < 3; t++)
                memcpy(tsf(&tm, EXPS[t], il) + n, tsf(&tm, EXPS[t], il), (size_t)n * sizeof(double));
        dense_from_expert(&td, &tm, &hp, 1);
        ref_model *m = ref_model_create(&hp, ts_get, &tm), *d = ref_model_create(&hd, ts_get, &td);
        REQUIRE_VOID(m && d);
        enum { N = 8, V = 32 };
        int32_t toks[N] = {5, 1, 30, 5, 12, 0, 19, 7};
        double lm[N * V], ld[N * V];
        CHECK_INT(ref_model_eval(m, toks, N, NULL, lm), 0);
        CHECK_INT(ref_model_eval(d, toks, N, NULL, ld), 0);
        double diff = max_diff(lm, ld, N * V);
        th_checks++;
        if (diff > (used == 1 ? 0 : 1e-12)) TH_FAIL("%d of 2 identical experts: max diff %g", used, diff);
        ref_model_free(m);
        ref_model_free(d);
        ts_free(&tm);
        ts_free(&td);
    }
}

/* 1 to 4 experts used of 4, the attention silenced (Wo = 0) so that each position is
 * the FFN chain of its own token: the model against t_moe; the router spreads the
 * tokens over every expert. */
static void test_moe_used(void) {
    for (int used = 1; used <= 4; used++) {
        ref_hparams hp = tiny_hp("qwen3moe");
        hp.n_expert_used = used;
        tstore ts;
        make_model(&ts, &hp, 33, true);
        for (int il = 0; il < hp.n_layer; il++)
            memset(tsf(&ts, "blk.%d.attn_output.weight", il), 0,
                   (size_t)hp.n_embd * hp.n_head * hp.head_dim * sizeof(double));
        ref_model *m = ref_model_create(&hp, ts_get, &ts);
        REQUIRE_VOID(m);
        enum { V = 32 };
        int32_t toks[V];
        for (int i = 0; i < V; i++) toks[i] = i;
        double all[V * V];
        CHECK_INT(ref_model_eval(m, toks, V, NULL, all), 0);
        t_moe_seen = 0;
        for (int p = 0; p < V; p++) {
            double x[16], want[32];
            memcpy(x, ts_find(&ts, "token_embd.weight") + toks[p] * hp.n_embd, sizeof x);
            for (int il = 0; il < hp.n_layer; il++) t_ffn(&ts, &hp, il, x);
            t_out(&ts, &hp, x, want);
            double d = max_diff(all + p * V, want, V);
            th_checks++;
            if (d > 1e-10) TH_FAIL("%d of 4 experts at %d: max diff %g", used, p, d);
        }
        CHECK_INT(t_moe_seen, 0xf);
        ref_model_free(m);
        ts_free(&ts);
    }
}

static void test_moe_errors(void) {
    ref_hparams hp = tiny_hp("qwen3moe");
    tstore ts;
    make_model(&ts, &hp, 34, true);
    ref_model *m = ref_model_create(&hp, ts_get, &ts);
    CHECK(m != NULL);
    ref_model_free(m);
    /* n_ff is not used by qwen3moe */
    ref_hparams h0 = hp;
    h0.n_ff = 0;
    m = ref_model_create(&h0, ts_get, &ts);
    CHECK(m != NULL);
    ref_model_free(m);
    /* bad MoE hparams, or ones the tensors do not match (n_ff_exp 13, n_expert 3);
     * then MoE fields on a dense arch */
    int bad[][3] = {{0, 0, 12}, {4, 0, 12}, {4, 5, 12}, {4, 2, 0}, {4, 2, 13}, {3, 2, 12}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ref_hparams hb = hp;
        hb.n_expert = bad[i][0], hb.n_expert_used = bad[i][1], hb.n_ff_exp = bad[i][2];
        m = ref_model_create(&hb, ts_get, &ts);
        th_checks++;
        if (m) TH_FAIL("accepted n_expert %d n_expert_used %d n_ff_exp %d", bad[i][0], bad[i][1], bad[i][2]);
        ref_model_free(m);
    }
    ref_hparams hq = tiny_hp("qwen3");
    tstore t3;
    make_model(&t3, &hq, 35, true);
    hq.n_expert = 4, hq.n_expert_used = 2, hq.n_ff_exp = 12;
    CHECK(ref_model_create(&hq, ts_get, &t3) == NULL);
    /* a dense model's tensors are not a MoE's */
    CHECK(ref_model_create(&hp, ts_get, &t3) == NULL);
    /* a mis-sized expert tensor, a missing router, missing Q/K norms */
    for (int i = 0; i < ts.n; i++)
        if (strcmp(ts.name[i], "blk.1.ffn_down_exps.weight") == 0) ts.size[i] -= hp.n_embd;
    CHECK(ref_model_create(&hp, ts_get, &ts) == NULL);
    ts_free(&ts);
    make_model(&ts, &hp, 34, true);
    ts_remove(&ts, "blk.0.ffn_gate_inp.weight");
    CHECK(ref_model_create(&hp, ts_get, &ts) == NULL);
    ts_free(&ts);
    make_model(&ts, &hp, 34, true);
    ts_remove(&ts, "blk.1.attn_k_norm.weight");
    CHECK(ref_model_create(&hp, ts_get, &ts) == NULL);
    ts_free(&ts);
    ts_free(&t3);
}

/* ------------------------------------------------------------- gemma2 */

/* Logits [n][n_vocab] of toks through a fresh model of hp over ts. */
static bool eval_all(const ref_hparams *hp, tstore *ts, const int32_t *toks, int n, double *all) {
    ref_model *m = ref_model_create(hp, ts_get, ts);
    bool ok = m && ref_model_eval(m, toks, n, NULL, all) == 0;
    ref_model_free(m);
    th_checks++;
    if (!ok) TH_FAIL("%s: evaluation failed", hp->arch);
    return ok;
}

/* A window at least as long as the sequence is no window, bitwise; a shorter one keeps
 * the positions before it bitwise and changes the later ones. */
static void test_gemma2_window(void) {
    ref_hparams hp = tiny_hp("gemma2");
    tstore ts;
    make_model(&ts, &hp, 41, false);
    enum { N = 9, V = 32 };
    int32_t toks[N] = {3, 14, 15, 9, 26, 5, 3, 5, 8};
    double none[N * V], got[N * V];
    hp.sliding_window = 0;
    REQUIRE_VOID(eval_all(&hp, &ts, toks, N, none));
    int ws[] = {N, N + 1, 1000};
    for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) {
        hp.sliding_window = ws[i];
        REQUIRE_VOID(eval_all(&hp, &ts, toks, N, got));
        th_checks++;
        if (memcmp(got, none, sizeof got) != 0)
            TH_FAIL("window %d over %d tokens: max diff %g to no window", ws[i], N, max_diff(got, none, N * V));
    }
    for (int w = 1; w < N; w++) {
        hp.sliding_window = w;
        REQUIRE_VOID(eval_all(&hp, &ts, toks, N, got));
        CHECK_MEM(got, none, (size_t)w * V * sizeof(double)); /* positions < w see everything */
        for (int p = w; p < N; p++) {
            double d = max_diff(got + p * V, none + p * V, V);
            th_checks++;
            if (d < 1e-6) TH_FAIL("window %d at %d: the same as no window (max diff %g)", w, p, d);
        }
    }
    ts_free(&ts);
}

/* A window of 1: a sliding layer attends to its own position only, and one softmax
 * entry gives its V whatever Q and K are. swa_pattern 6 on 2 layers slides both, so
 * each position's logits are bitwise those of its token evaluated alone. */
static void test_gemma2_window_one(void) {
    ref_hparams hp = tiny_hp("gemma2");
    hp.sliding_window = 1, hp.swa_pattern = 6;
    tstore ts;
    make_model(&ts, &hp, 42, false);
    enum { N = 7, V = 32 };
    int32_t toks[N] = {1, 20, 7, 7, 31, 0, 12};
    double all[N * V], alone[V];
    REQUIRE_VOID(eval_all(&hp, &ts, toks, N, all));
    for (int p = 0; p < N; p++) {
        REQUIRE_VOID(eval_all(&hp, &ts, &toks[p], 1, alone));
        th_checks++;
        if (memcmp(all + p * V, alone, sizeof alone) != 0)
            TH_FAIL("window 1 at %d: max diff %g to the token alone", p, max_diff(all + p * V, alone, V));
    }
    CHECK_MEM(all + 2 * V, all + 3 * V, V * sizeof(double)); /* the same token at 2 and 3 */
    ts_free(&ts);
}

/* Which layers slide: with a window of 1, scaling a sliding layer's Wq by 3 changes
 * nothing (bitwise) and a full layer's changes every position past the first. */
static void test_gemma2_swa_pattern(void) {
    struct {
        int pattern;
        bool slides[4]; /* layers 0..3 */
    } cases[] = {{0, {1, 0, 1, 0}}, {2, {1, 0, 1, 0}}, {3, {1, 1, 0, 1}}, {6, {1, 1, 1, 1}}, {1, {0, 0, 0, 0}}};
    enum { N = 5, V = 32 };
    int32_t toks[N] = {2, 9, 30, 4, 17};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ref_hparams hp = tiny_hp("gemma2");
        hp.n_layer = 4, hp.sliding_window = 1, hp.swa_pattern = cases[c].pattern;
        tstore ts;
        make_model(&ts, &hp, 43, false);
        double base[N * V], got[N * V];
        REQUIRE_VOID(eval_all(&hp, &ts, toks, N, base));
        for (int il = 0; il < hp.n_layer; il++) {
            const bool slides = cases[c].slides[il];
            CHECK_INT(ref_layer_is_swa(&hp, il), slides);
            double *wq = tsf(&ts, "blk.%d.attn_q.weight", il);
            const int64_t n = ts_size(&ts, "blk.0.attn_q.weight");
            for (int64_t i = 0; i < n; i++) wq[i] *= 3;
            REQUIRE_VOID(eval_all(&hp, &ts, toks, N, got));
            for (int64_t i = 0; i < n; i++) wq[i] /= 3;
            CHECK_MEM(got, base, V * sizeof(double)); /* position 0 has one key anyway */
            for (int p = 1; p < N; p++) {
                double d = max_diff(got + p * V, base + p * V, V);
                th_checks++;
                if (slides ? d != 0 : d < 1e-6)
                    TH_FAIL("swa_pattern %d layer %d (%s) at %d: Wq * 3 changes logits by %g", cases[c].pattern,
                            il, slides ? "sliding" : "full", p, d);
            }
        }
        ts_free(&ts);
    }
}

/* Softcaps: huge ones are none (c tanh(s/c) = s - s^3/(3c^2) + ...); a tiny attention
 * softcap squashes every score to about 0, which is uniform attention (Wq = 0); the
 * final softcap is c tanh(l/c) of the uncapped logits, within (-c, c). */
static void test_gemma2_softcap(void) {
    ref_hparams hp = tiny_hp("gemma2");
    tstore ts;
    make_model(&ts, &hp, 44, false);
    enum { N = 8, V = 32 };
    int32_t toks[N] = {6, 1, 28, 6, 19, 0, 3, 22};
    double none[N * V], got[N * V], capped[N * V];
    ref_hparams h0 = hp;
    h0.attn_softcap = h0.final_softcap = 0;
    REQUIRE_VOID(eval_all(&h0, &ts, toks, N, none));
    REQUIRE_VOID(eval_all(&hp, &ts, toks, N, capped));
    CHECK(max_diff(capped, none, N * V) > 1e-2); /* tiny_hp's caps bite */
    ref_hparams hh = hp;
    hh.attn_softcap = hh.final_softcap = 1e9;
    REQUIRE_VOID(eval_all(&hh, &ts, toks, N, got));
    double d = max_diff(got, none, N * V);
    th_checks++;
    if (d > 1e-12) TH_FAIL("softcaps 1e9: max diff %g to none", d);
    /* only the attention's capped, huge: the final cap of the uncapped logits */
    hh = h0;
    hh.attn_softcap = 1e9, hh.final_softcap = 0.5;
    REQUIRE_VOID(eval_all(&hh, &ts, toks, N, got));
    double lmax = 0, gmax = 0, dc = 0;
    for (int i = 0; i < N * V; i++) {
        lmax = fmax(lmax, fabs(none[i]));
        gmax = fmax(gmax, fabs(got[i]));
        dc = fmax(dc, fabs(got[i] - 0.5 * tanh(none[i] / 0.5)));
    }
    th_checks++;
    if (!(gmax <= 0.5) || lmax < 1.5 || dc > 1e-12)
        TH_FAIL("final softcap 0.5: max |logit| %g (uncapped %g), max diff to 0.5 tanh(l / 0.5) %g", gmax, lmax,
                dc);
    /* every logit of the tiny_hp model is within its cap 3 */
    gmax = 0;
    for (int i = 0; i < N * V; i++) gmax = fmax(gmax, fabs(capped[i]));
    CHECK(gmax <= hp.final_softcap && gmax > 1);
    /* a tiny attention softcap: scores within 1e-9 of 0, so uniform attention */
    hh = hp;
    hh.attn_softcap = 1e-9;
    REQUIRE_VOID(eval_all(&hh, &ts, toks, N, got));
    for (int il = 0; il < hp.n_layer; il++)
        memset(tsf(&ts, "blk.%d.attn_q.weight", il), 0, (size_t)ts_size(&ts, "blk.0.attn_q.weight") * sizeof(double));
    REQUIRE_VOID(eval_all(&hp, &ts, toks, N, capped));
    d = max_diff(got, capped, N * V);
    th_checks++;
    if (d > 1e-7) TH_FAIL("attention softcap 1e-9: max diff %g to Wq = 0", d);
    ts_free(&ts);
}

/* The embedding scale: with Wo and W_down zero the post norms give exact zeros and x
 * stays the scaled embedding; a norm epsilon of 1 keeps the final RMS norm from
 * hiding the scale. */
static void test_gemma2_embd_scale(void) {
    ref_hparams hp = tiny_hp("gemma2");
    hp.rms_eps = 1;
    tstore ts;
    make_model(&ts, &hp, 45, false);
    for (int il = 0; il < hp.n_layer; il++) {
        const char *zero[] = {"blk.%d.attn_output.weight", "blk.%d.ffn_down.weight"};
        for (int i = 0; i < 2; i++) {
            char nm[64];
            snprintf(nm, sizeof nm, zero[i], il);
            memset(ts_find(&ts, nm), 0, (size_t)ts_size(&ts, nm) * sizeof(double));
        }
    }
    enum { N = 4, V = 32, E = 16 };
    int32_t toks[N] = {0, 13, 31, 13};
    double all[N * V];
    REQUIRE_VOID(eval_all(&hp, &ts, toks, N, all));
    for (int p = 0; p < N; p++) {
        double x[E], want[V], unscaled[V];
        const double *e = ts_find(&ts, "token_embd.weight") + toks[p] * E;
        for (int i = 0; i < E; i++) x[i] = e[i] * 4; /* sqrt(16) */
        t_out(&ts, &hp, x, want);
        t_out(&ts, &hp, e, unscaled);
        double d = max_diff(all + p * V, want, V);
        th_checks++;
        if (d > 1e-12) TH_FAIL("embedding scale at %d: max diff %g", p, d);
        CHECK(max_diff(all + p * V, unscaled, V) > 1e-3);
    }
    ts_free(&ts);
}

static void test_gemma2_errors(void) {
    ref_hparams hp = tiny_hp("gemma2");
    tstore ts;
    make_model(&ts, &hp, 46, false);
    ref_model *m = ref_model_create(&hp, ts_get, &ts);
    CHECK(m != NULL);
    CHECK(m && m->hp.swa_pattern == 2 && m->hp.attn_scale == 0.3); /* resolved */
    ref_model_free(m);
    /* biases and Q/K norms are not gemma2's: present, they are not read */
    enum { N = 4, V = 32 };
    int32_t toks[N] = {8, 2, 25, 2};
    double base[N * V], got[N * V];
    REQUIRE_VOID(eval_all(&hp, &ts, toks, N, base));
    uint64_t rs = 5;
    ts_add(&ts, "blk.0.attn_q.bias", hp.n_head * hp.head_dim, 0, 1, &rs);
    ts_add(&ts, "blk.1.attn_v.bias", hp.n_head_kv * hp.head_dim, 0, 1, &rs);
    ts_add(&ts, "blk.0.attn_k_norm.weight", hp.head_dim, 3, 1, &rs);
    REQUIRE_VOID(eval_all(&hp, &ts, toks, N, got));
    CHECK_MEM(got, base, sizeof got);
    ref_hparams hd = hp;
    hd.attn_scale = 0;
    m = ref_model_create(&hd, ts_get, &ts);
    CHECK(m && m->hp.attn_scale == 1 / sqrt(8.0));
    ref_model_free(m);
    /* bad values: negative, NaN, infinite; normal RoPE */
    for (int i = 0; i < 9; i++) {
        ref_hparams hb = hp;
        switch (i) {
        case 0: hb.attn_scale = -1; break;
        case 1: hb.attn_softcap = -1; break;
        case 2: hb.final_softcap = -0.5; break;
        case 3: hb.sliding_window = -1; break;
        case 4: hb.swa_pattern = -2; break;
        case 5: hb.attn_softcap = NAN; break;
        case 6: hb.final_softcap = INFINITY; break;
        case 7: hb.attn_scale = NAN; break;
        default: hb.rope_neox = false; break;
        }
        m = ref_model_create(&hb, ts_get, &ts);
        th_checks++;
        if (m) TH_FAIL("gemma2: accepted bad hparams (case %d)", i);
        ref_model_free(m);
    }
    /* the post norms are required and sized [n_embd] */
    ts_remove(&ts, "blk.1.post_ffw_norm.weight");
    CHECK(ref_model_create(&hp, ts_get, &ts) == NULL);
    ts_free(&ts);
    make_model(&ts, &hp, 46, false);
    ts_remove(&ts, "blk.0.post_attention_norm.weight");
    CHECK(ref_model_create(&hp, ts_get, &ts) == NULL);
    ts_free(&ts);
    make_model(&ts, &hp, 46, false);
    for (int i = 0; i < ts.n; i++)
        if (strcmp(ts.name[i], "blk.0.post_ffw_norm.weight") == 0) ts.size[i]--;
    CHECK(ref_model_create(&hp, ts_get, &ts) == NULL);
    ts_free(&ts);
    /* the gemma2 fields on another arch, one at a time */
    ref_hparams hl = tiny_hp("llama");
    tstore tl;
    make_model(&tl, &hl, 47, true);
    for (int i = 0; i < 5; i++) {
        ref_hparams hb = hl;
        switch (i) {
        case 0: hb.attn_scale = 0.3; break;
        case 1: hb.attn_softcap = 50; break;
        case 2: hb.final_softcap = 30; break;
        case 3: hb.sliding_window = 4; break;
        default: hb.swa_pattern = 2; break;
        }
        m = ref_model_create(&hb, ts_get, &tl);
        th_checks++;
        if (m) TH_FAIL("llama: accepted gemma2 hparams (case %d)", i);
        ref_model_free(m);
    }
    /* a llama model's tensors lack the post norms */
    ref_hparams hg = hl;
    hg.arch = "gemma2", hg.rope_neox = true;
    CHECK(ref_model_create(&hg, ts_get, &tl) == NULL);
    ts_free(&tl);
}

/* ------------------------------------------------------------------ gpt-oss */

/* YaRN by hand: heads of 8, base 1e4, original context 64, betas 32 and 1, factor 4.
 * d(32) = 8 ln(64 / (2 pi 32)) / (2 ln 1e4) = -0.50, so lo = 0; d(1) = 8 ln(64 / (2 pi))
 * / (2 ln 1e4) = 1.008, so hi = 2: pair 0 turns unscaled, pair 1 by half the mix
 * (0.25 * 0.5 + 0.5 = 0.625), pairs 2 and 3 scaled by 0.25; cos and sin times mscale.
 * Factor 1 is plain RoPE; with mscale 1 turns compose and keep the norm. */
static void test_yarn_rope(void) {
    const double base = 1e4, f[4] = {1.0, 0.625, 0.25, 0.25}, pos = 5, ms = 1.25;
    for (int neox = 0; neox < 2; neox++) {
        double x[8], want[8], y[8], z[8];
        for (int i = 0; i < 8; i++) x[i] = want[i] = 0.1 * (i + 1) * (i % 3 ? 1 : -1);
        for (int i = 0; i < 4; i++) {
            const double th = pos * pow(base, -2.0 * i / 8) * f[i];
            const int a = neox ? i : 2 * i, b = neox ? i + 4 : 2 * i + 1;
            want[a] = ms * (x[a] * cos(th) - x[b] * sin(th));
            want[b] = ms * (x[a] * sin(th) + x[b] * cos(th));
        }
        memcpy(y, x, sizeof x);
        ref_rope_yarn(y, 1, 8, pos, base, 0.25, 64, 32, 1, neox, ms);
        CHECK(max_diff(y, want, 8) < 1e-14);
        memcpy(y, x, sizeof x); /* factor 1: the mix changes nothing */
        memcpy(z, x, sizeof x);
        ref_rope_yarn(y, 1, 8, pos, base, 1.0, 64, 32, 1, neox, 1.0);
        ref_rope(z, 1, 8, pos, base, neox);
        CHECK(max_diff(y, z, 8) < 1e-14);
        memcpy(y, x, sizeof x); /* 3 then 4 == 7, and back by -7 is the start */
        memcpy(z, x, sizeof x);
        ref_rope_yarn(y, 1, 8, 3, base, 0.25, 64, 32, 1, neox, 1.0);
        ref_rope_yarn(y, 1, 8, 4, base, 0.25, 64, 32, 1, neox, 1.0);
        ref_rope_yarn(z, 1, 8, 7, base, 0.25, 64, 32, 1, neox, 1.0);
        CHECK(max_diff(y, z, 8) < 1e-14);
        ref_rope_yarn(z, 1, 8, -7, base, 0.25, 64, 32, 1, neox, 1.0);
        CHECK(max_diff(z, x, 8) < 1e-14);
    }
}

static ref_hparams oss_hp(void) {
    ref_hparams hp = {.arch = "gpt-oss", .n_layer = 1, .n_embd = 16, .n_head = 4, .n_head_kv = 2, .head_dim = 8,
                      .n_vocab = 32, .rms_eps = 1e-5, .rope_base = 10000.0, .rope_neox = true, .n_expert = 4,
                      .n_expert_used = 2, .n_ff_exp = 12, .sliding_window = 2, .rope_freq_scale = 0.25,
                      .yarn_orig_ctx = 64};
    return hp;
}

/* gpt-oss's tensors; gate and up experts large enough that the clamps at 7 bite. */
static void make_oss(tstore *ts, const ref_hparams *hp, uint64_t seed) {
    uint64_t rs = seed;
    const int64_t E = hp->n_embd, Q = (int64_t)hp->n_head * hp->head_dim, KV = (int64_t)hp->n_head_kv * hp->head_dim,
                  X = hp->n_expert, F = hp->n_ff_exp;
    ts->n = 0;
    ts_add(ts, "token_embd.weight", hp->n_vocab * E, 0, 1, &rs);
    ts_add(ts, "output_norm.weight", E, 1, 0.2, &rs);
    ts_add(ts, "output.weight", hp->n_vocab * E, 0, 0.5, &rs);
    for (int il = 0; il < hp->n_layer; il++) {
        char nm[64];
#define ADD(suffix, n, c, s) (snprintf(nm, sizeof nm, "blk.%d." suffix, il), ts_add(ts, nm, n, c, s, &rs))
        ADD("attn_norm.weight", E, 1, 0.2);
        ADD("attn_q.weight", Q * E, 0, 0.5);
        ADD("attn_k.weight", KV * E, 0, 0.5);
        ADD("attn_v.weight", KV * E, 0, 0.5);
        ADD("attn_q.bias", Q, 0, 0.3);
        ADD("attn_k.bias", KV, 0, 0.3);
        ADD("attn_v.bias", KV, 0, 0.3);
        ADD("attn_output.weight", E * Q, 0, 0.3);
        ADD("attn_output.bias", E, 0, 0.3);
        ADD("attn_sinks.weight", hp->n_head, 0.5, 1.5);
        ADD("post_attention_norm.weight", E, 1, 0.2);
        ADD("ffn_gate_inp.weight", X * E, 0, 1.0);
        ADD("ffn_gate_inp.bias", X, 0, 0.5);
        ADD("ffn_gate_exps.weight", X * F * E, 0, 2.0);
        ADD("ffn_up_exps.weight", X * F * E, 0, 2.0);
        ADD("ffn_down_exps.weight", X * E * F, 0, 0.3);
        ADD("ffn_gate_exps.bias", X * F, 0, 0.5);
        ADD("ffn_up_exps.bias", X * F, 0, 0.5);
        ADD("ffn_down_exps.bias", X * E, 0, 0.3);
#undef ADD
    }
}

/* gpt-oss's forward pass written out for a one-layer model and three tokens (the
 * window of 2 cuts the third's view), against ref_model_eval: biases, sinks (a softmax
 * with one more logit of value zero), YaRN (ref_rope_yarn, checked by hand above,
 * with its magnitude on q and k), post_attention_norm as the FFN norm, top 2 of the
 * biased router logits with a softmax over those 2, and the clamped SwiGLU experts. */
static void test_oss_by_hand(void) {
    ref_hparams hp = oss_hp();
    tstore ts;
    make_oss(&ts, &hp, 91);
    ref_model *m = ref_model_create(&hp, ts_get, &ts);
    REQUIRE_VOID(m);
    enum { E = 16, D = 8, KV = 16, F = 12, V = 32, NT = 3 };
    const int32_t toks[NT] = {5, 17, 2};
    double want[NT][V], got[NT][V], kc[NT][KV], vc[NT][KV];
    int clamped = 0;
    const double ms = 1 + 0.1 * log(4.0);
    for (int t = 0; t < NT; t++) {
        double x[E], h[E], q[32], k[KV], v[KV], att[32], o[E];
        memcpy(x, ts_find(&ts, "token_embd.weight") + toks[t] * E, sizeof x);
        t_norm(x, tsf(&ts, "blk.%d.attn_norm.weight", 0), E, hp.rms_eps, h);
        t_mv(tsf(&ts, "blk.%d.attn_q.weight", 0), h, 32, E, q);
        t_mv(tsf(&ts, "blk.%d.attn_k.weight", 0), h, KV, E, k);
        t_mv(tsf(&ts, "blk.%d.attn_v.weight", 0), h, KV, E, v);
        for (int i = 0; i < 32; i++) q[i] += tsf(&ts, "blk.%d.attn_q.bias", 0)[i];
        for (int i = 0; i < KV; i++) k[i] += tsf(&ts, "blk.%d.attn_k.bias", 0)[i], v[i] += tsf(&ts, "blk.%d.attn_v.bias", 0)[i];
        ref_rope_yarn(q, 4, D, t, 1e4, 0.25, 64, 32, 1, true, ms);
        ref_rope_yarn(k, 2, D, t, 1e4, 0.25, 64, 32, 1, true, ms);
        memcpy(kc[t], k, sizeof k);
        memcpy(vc[t], v, sizeof v);
        const int t0 = t >= 2 ? t - 1 : 0; /* a window of 2: this token and the one before */
        for (int hq = 0; hq < 4; hq++) {
            const int hk = hq / 2;
            double sc[NT], z = exp(tsf(&ts, "blk.%d.attn_sinks.weight", 0)[hq]); /* the sink's e^sink */
            for (int j = t0; j <= t; j++) {
                double d = 0;
                for (int i = 0; i < D; i++) d += q[hq * D + i] * kc[j][hk * D + i];
                sc[j] = exp(d / sqrt((double)D));
                z += sc[j];
            }
            for (int i = 0; i < D; i++) {
                att[hq * D + i] = 0;
                for (int j = t0; j <= t; j++) att[hq * D + i] += sc[j] / z * vc[j][hk * D + i];
            }
        }
        t_mv(tsf(&ts, "blk.%d.attn_output.weight", 0), att, E, 32, o);
        for (int i = 0; i < E; i++) x[i] += o[i] + tsf(&ts, "blk.%d.attn_output.bias", 0)[i];
        t_norm(x, tsf(&ts, "blk.%d.post_attention_norm.weight", 0), E, hp.rms_eps, h);
        double lg[4];
        t_mv(tsf(&ts, "blk.%d.ffn_gate_inp.weight", 0), h, 4, E, lg);
        int order[4] = {0, 1, 2, 3};
        for (int e = 0; e < 4; e++) lg[e] += tsf(&ts, "blk.%d.ffn_gate_inp.bias", 0)[e];
        for (int a = 1; a < 4; a++) /* stable insertion sort by logit, largest first */
            for (int b = a; b > 0 && lg[order[b]] > lg[order[b - 1]]; b--) {
                int tmp = order[b];
                order[b] = order[b - 1];
                order[b - 1] = tmp;
            }
        const double w0 = 1 / (1 + exp(lg[order[1]] - lg[order[0]])), wt[2] = {w0, 1 - w0};
        for (int c = 0; c < 2; c++) {
            const int e = order[c];
            double g[F], u[F], d[E];
            t_mv(tsf(&ts, "blk.%d.ffn_gate_exps.weight", 0) + e * F * E, h, F, E, g);
            t_mv(tsf(&ts, "blk.%d.ffn_up_exps.weight", 0) + e * F * E, h, F, E, u);
            for (int i = 0; i < F; i++) {
                double gg = g[i] + tsf(&ts, "blk.%d.ffn_gate_exps.bias", 0)[e * F + i];
                double uu = u[i] + tsf(&ts, "blk.%d.ffn_up_exps.bias", 0)[e * F + i];
                clamped += (gg > 7) + (fabs(uu) > 7);
                gg = fmin(gg, 7), uu = fmax(-7, fmin(uu, 7));
                g[i] = gg / (1 + exp(-1.702 * gg)) * (uu + 1);
            }
            t_mv(tsf(&ts, "blk.%d.ffn_down_exps.weight", 0) + e * E * F, g, E, F, d);
            for (int i = 0; i < E; i++) x[i] += wt[c] * (d[i] + tsf(&ts, "blk.%d.ffn_down_exps.bias", 0)[e * E + i]);
        }
        t_out(&ts, &hp, x, want[t]);
    }
    CHECK_INT(ref_model_eval(m, toks, NT, NULL, &got[0][0]), 0);
    CHECK(max_diff(&want[0][0], &got[0][0], (size_t)NT * V) < 1e-11);
    CHECK(clamped > 0); /* the clamps were taken */
    ref_model_free(m);
    ts_free(&ts);
}

/* gpt-oss needs its sinks, biases and post_attention_norm, a window, no gemma scales. */
static void test_oss_errors(void) {
    ref_hparams hp = oss_hp();
    static const char *need[] = {"blk.0.attn_sinks.weight", "blk.0.attn_output.bias", "blk.0.attn_q.bias",
                                 "blk.0.post_attention_norm.weight", "blk.0.ffn_gate_inp.bias",
                                 "blk.0.ffn_down_exps.bias"};
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++) {
        tstore ts;
        make_oss(&ts, &hp, 92);
        ts_remove(&ts, need[i]);
        ref_model *m = ref_model_create(&hp, ts_get, &ts);
        th_checks++;
        if (m) TH_FAIL("gpt-oss: loaded without %s", need[i]);
        ref_model_free(m);
        ts_free(&ts);
    }
    tstore ts;
    make_oss(&ts, &hp, 93);
    for (int i = 0; i < 3; i++) {
        ref_hparams hb = hp;
        if (i == 0) hb.sliding_window = 0;
        if (i == 1) hb.attn_softcap = 30;
        if (i == 2) hb.yarn_orig_ctx = -1;
        ref_model *m = ref_model_create(&hb, ts_get, &ts);
        th_checks++;
        if (m) TH_FAIL("gpt-oss: accepted bad hparams (case %d)", i);
        ref_model_free(m);
    }
    ts_free(&ts);
}

/* ------------------------------------------------------------- gemma4 */

/* Five layers: full, sliding, full with KV of their own; a sliding and a full layer
 * reusing layers 1's and 2's; sliding heads of 4 (two KV heads), full heads of 8
 * (one KV head) of which one pair of four turns; the sharing layers' FFN twice as
 * wide; per-layer embeddings of 4; a window of 2. */
static const unsigned char G4_SWA[5] = {0, 1, 0, 1, 0};
static const int G4_KV[5] = {1, 2, 1, 2, 1}, G4_FF[5] = {12, 12, 12, 24, 24};

static ref_hparams g4_hp(void) {
    ref_hparams hp = {.arch = "gemma4", .n_layer = 5, .n_embd = 16, .n_head = 2, .n_head_kv = 2, .head_dim = 8,
                      .n_ff = 12, .n_vocab = 32, .rms_eps = 1e-6, .rope_base = 1e6, .rope_neox = true,
                      .final_softcap = 3, .sliding_window = 2, .rope_base_swa = 1e4, .swa_layers = G4_SWA,
                      .head_dim_swa = 4, .layer_n_head_kv = G4_KV, .layer_n_ff = G4_FF, .rope_pairs_full = 1,
                      .n_shared_kv = 2, .n_embd_per_layer = 4};
    return hp;
}

/* gemma4's tensors: the full layers (0, 2) without attn_v (V = K), the sharing layers
 * (3, 4) without K, V and the K norm. */
static void make_g4(tstore *ts, uint64_t seed) {
    uint64_t rs = seed;
    enum { E = 16, V = 32, P = 4, NL = 5 };
    ts->n = 0;
    ts_add(ts, "token_embd.weight", V * E, 0, 1, &rs);
    ts_add(ts, "output_norm.weight", E, 1, 0.2, &rs);
    ts_add(ts, "per_layer_token_embd.weight", V * NL * P, 0, 1, &rs);
    ts_add(ts, "per_layer_model_proj.weight", NL * P * E, 0, 0.5, &rs);
    ts_add(ts, "per_layer_proj_norm.weight", P, 1, 0.2, &rs);
    for (int il = 0; il < NL; il++) {
        const int D = G4_SWA[il] ? 4 : 8, Q = 2 * D, KV = G4_KV[il] * D, F = G4_FF[il];
        char nm[64];
#define ADD(suffix, n, c, s) (snprintf(nm, sizeof nm, "blk.%d." suffix, il), ts_add(ts, nm, n, c, s, &rs))
        ADD("attn_norm.weight", E, 1, 0.2);
        ADD("attn_q.weight", Q * E, 0, 0.5);
        if (il < 3) {
            ADD("attn_k.weight", KV * E, 0, 0.5);
            if (G4_SWA[il]) ADD("attn_v.weight", KV * E, 0, 0.5);
            ADD("attn_k_norm.weight", D, 1, 0.2);
        }
        ADD("attn_q_norm.weight", D, 1, 0.2);
        ADD("attn_output.weight", E * Q, 0, 0.3);
        ADD("post_attention_norm.weight", E, 1, 0.2);
        ADD("ffn_norm.weight", E, 1, 0.2);
        ADD("ffn_gate.weight", F * E, 0, 0.5);
        ADD("ffn_up.weight", F * E, 0, 0.5);
        ADD("ffn_down.weight", E * F, 0, 0.3);
        ADD("post_ffw_norm.weight", E, 1, 0.2);
        ADD("layer_output_scale.weight", 1, 1, 0.5);
        ADD("inp_gate.weight", P * E, 0, 0.5);
        ADD("proj.weight", E * P, 0, 0.5);
        ADD("post_norm.weight", E, 1, 0.2);
#undef ADD
    }
}

static double t_gelu(double x) { return 0.5 * x * (1 + tanh(sqrt(2 / acos(-1.0)) * (x + 0.044715 * x * x * x))); }

/* neox RoPE of one head of d, pairs (i, i + d/2) for i < pairs, angle pos * base^(-2i/d) */
static void t_rope(double *h, int d, int pairs, double pos, double base) {
    for (int i = 0; i < pairs; i++) {
        const double th = pos * pow(base, -2.0 * i / d), c = cos(th), s = sin(th), a = h[i], b = h[i + d / 2];
        h[i] = a * c - b * s;
        h[i + d / 2] = a * s + b * c;
    }
}

/* gemma4's forward pass written out for five layers and four tokens against
 * ref_model_eval: the embedding times sqrt(16) and the per-layer inputs from it; the
 * full layers' single turning pair (of four), V = K there and V's weightless norm; a
 * score of q·k; the sharing layers reading layers 1's and 2's K and V; the window of
 * 2 on the sliding layers; the per-layer embedding after the FFN, the output scale,
 * the final soft-cap. */
static void test_g4_by_hand(void) {
    ref_hparams hp = g4_hp();
    tstore ts;
    make_g4(&ts, 95);
    ref_model *m = ref_model_create(&hp, ts_get, &ts);
    REQUIRE_VOID(m);
    enum { E = 16, V = 32, P = 4, NL = 5, NT = 4 };
    const int32_t toks[NT] = {5, 17, 2, 30};
    double want[NT][V], got[NT][V];
    static double kc[NL][NT][16], vc[NL][NT][16];
    for (int t = 0; t < NT; t++) {
        double x[E], h[E], ple[NL * P];
        for (int i = 0; i < E; i++) x[i] = ts_find(&ts, "token_embd.weight")[toks[t] * E + i] * 4.0;
        t_mv(ts_find(&ts, "per_layer_model_proj.weight"), x, NL * P, E, ple);
        for (int l = 0; l < NL; l++) {
            double pr[P];
            for (int i = 0; i < P; i++) pr[i] = ple[l * P + i] / 4.0; /* 1 / sqrt(n_embd) */
            t_norm(pr, ts_find(&ts, "per_layer_proj_norm.weight"), P, hp.rms_eps, pr);
            for (int i = 0; i < P; i++)
                ple[l * P + i] = (pr[i] + ts_find(&ts, "per_layer_token_embd.weight")[toks[t] * NL * P + l * P + i] * 2.0) /
                                 sqrt(2.0);
        }
        for (int il = 0; il < NL; il++) {
            const bool swa = G4_SWA[il];
            const int D = swa ? 4 : 8, nkv = G4_KV[il], src = il < 3 ? il : swa ? 1 : 2, F = G4_FF[il];
            const double base = swa ? 1e4 : 1e6;
            const int pairs = swa ? D / 2 : 1;
            double q[16], k[16], v[16], att[16], o[E], d[E];
            t_norm(x, tsf(&ts, "blk.%d.attn_norm.weight", il), E, hp.rms_eps, h);
            t_mv(tsf(&ts, "blk.%d.attn_q.weight", il), h, 2 * D, E, q);
            for (int hd = 0; hd < 2; hd++) {
                t_norm(q + hd * D, tsf(&ts, "blk.%d.attn_q_norm.weight", il), D, hp.rms_eps, q + hd * D);
                t_rope(q + hd * D, D, pairs, t, base);
            }
            if (il == src) { /* K and V of its own */
                t_mv(tsf(&ts, "blk.%d.attn_k.weight", il), h, nkv * D, E, k);
                if (swa) t_mv(tsf(&ts, "blk.%d.attn_v.weight", il), h, nkv * D, E, v);
                else memcpy(v, k, sizeof v);
                double ones[8] = {1, 1, 1, 1, 1, 1, 1, 1};
                for (int hd = 0; hd < nkv; hd++) {
                    t_norm(k + hd * D, tsf(&ts, "blk.%d.attn_k_norm.weight", il), D, hp.rms_eps, k + hd * D);
                    t_rope(k + hd * D, D, pairs, t, base);
                    t_norm(v + hd * D, ones, D, hp.rms_eps, v + hd * D);
                }
                memcpy(kc[il][t], k, sizeof k);
                memcpy(vc[il][t], v, sizeof v);
            }
            const int t0 = swa && t >= 2 ? t - 1 : 0;
            for (int hq = 0; hq < 2; hq++) {
                const int hk = hq / (2 / nkv);
                double sc[NT], z = 0, mx = -INFINITY;
                for (int j = t0; j <= t; j++) {
                    sc[j] = 0;
                    for (int i = 0; i < D; i++) sc[j] += q[hq * D + i] * kc[src][j][hk * D + i];
                    mx = fmax(mx, sc[j]);
                }
                for (int j = t0; j <= t; j++) z += (sc[j] = exp(sc[j] - mx));
                for (int i = 0; i < D; i++) {
                    att[hq * D + i] = 0;
                    for (int j = t0; j <= t; j++) att[hq * D + i] += sc[j] / z * vc[src][j][hk * D + i];
                }
            }
            t_mv(tsf(&ts, "blk.%d.attn_output.weight", il), att, E, 2 * D, o);
            t_norm(o, tsf(&ts, "blk.%d.post_attention_norm.weight", il), E, hp.rms_eps, o);
            for (int i = 0; i < E; i++) x[i] += o[i];
            t_norm(x, tsf(&ts, "blk.%d.ffn_norm.weight", il), E, hp.rms_eps, h);
            t_glu(tsf(&ts, "blk.%d.ffn_gate.weight", il), tsf(&ts, "blk.%d.ffn_up.weight", il),
                  tsf(&ts, "blk.%d.ffn_down.weight", il), E, F, true, h, d);
            t_norm(d, tsf(&ts, "blk.%d.post_ffw_norm.weight", il), E, hp.rms_eps, d);
            for (int i = 0; i < E; i++) x[i] += d[i];
            double g[P];
            t_mv(tsf(&ts, "blk.%d.inp_gate.weight", il), x, P, E, g);
            for (int i = 0; i < P; i++) g[i] = t_gelu(g[i]) * ple[il * P + i];
            t_mv(tsf(&ts, "blk.%d.proj.weight", il), g, E, P, d);
            t_norm(d, tsf(&ts, "blk.%d.post_norm.weight", il), E, hp.rms_eps, d);
            const double sc = tsf(&ts, "blk.%d.layer_output_scale.weight", il)[0];
            for (int i = 0; i < E; i++) x[i] = (x[i] + d[i]) * sc;
        }
        t_out(&ts, &hp, x, want[t]);
    }
    CHECK_INT(ref_model_eval(m, toks, NT, NULL, &got[0][0]), 0);
    CHECK(max_diff(&want[0][0], &got[0][0], (size_t)NT * V) < 1e-11);
    /* the sharing layers expose their owners' cache */
    CHECK(ref_model_k(m, 3, 1) == ref_model_k(m, 1, 1) && ref_model_v(m, 4, 2) == ref_model_v(m, 2, 2));
    /* the cache holds the K written out above (pairs 1..3 of a full layer unturned) */
    const double *k3 = ref_model_k(m, 0, 3);
    CHECK(k3 && max_diff(k3, kc[0][3], 8) < 1e-12);
    /* a shift re-turns only that pair: K of position 3 moved to 2 equals K computed at 2 */
    double at2[8];
    memcpy(at2, kc[0][3], sizeof at2);
    t_rope(at2, 8, 1, -1, 1e6);
    CHECK_INT(ref_model_remove(m, 1, 2), 0);
    CHECK(max_diff(ref_model_k(m, 0, 2), at2, 8) < 1e-12);
    CHECK(at2[1] == kc[0][3][1] && at2[5] == kc[0][3][5]); /* pair 1 did not move */
    ref_model_free(m);
    ts_free(&ts);
}

/* gemma4 needs its per-layer pattern and window, KV owners of the right kinds, its
 * per-layer tensors; its fields are refused elsewhere. */
static void test_g4_errors(void) {
    ref_hparams hp = g4_hp();
    static const char *need[] = {"blk.0.attn_k.weight", "blk.2.attn_k_norm.weight", "blk.3.attn_q_norm.weight",
                                 "per_layer_token_embd.weight", "blk.4.inp_gate.weight", "blk.1.post_norm.weight"};
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++) {
        tstore ts;
        make_g4(&ts, 96);
        ts_remove(&ts, need[i]);
        ref_model *m = ref_model_create(&hp, ts_get, &ts);
        th_checks++;
        if (m) TH_FAIL("gemma4: loaded without %s", need[i]);
        ref_model_free(m);
        ts_free(&ts);
    }
    tstore ts;
    make_g4(&ts, 97);
    static const unsigned char bad_swa[5] = {0, 0, 1, 1, 0}; /* layer 2 (the last full owner) slides */
    for (int i = 0; i < 5; i++) {
        ref_hparams hb = hp;
        if (i == 0) hb.swa_layers = NULL;
        if (i == 1) hb.sliding_window = 0;
        if (i == 2) hb.n_shared_kv = 4;
        if (i == 3) hb.swa_layers = bad_swa;
        if (i == 4) hb.attn_softcap = 50;
        ref_model *m = ref_model_create(&hb, ts_get, &ts);
        th_checks++;
        if (m) TH_FAIL("gemma4: accepted bad hparams (case %d)", i);
        ref_model_free(m);
    }
    ts_free(&ts);
    ref_hparams hl = tiny_hp("llama");
    hl.n_embd_per_layer = 4; /* a gemma4 field elsewhere */
    make_model(&ts, &hl, 98, true);
    ref_model *m = ref_model_create(&hl, ts_get, &ts);
    th_checks++;
    if (m) TH_FAIL("llama: accepted gemma4 hparams");
    ref_model_free(m);
    ts_free(&ts);
}

int main(void) {
    test_rope();
    for (int a = 0; a < N_ARCHS; a++) {
        test_first_token(ARCHS[a]);
        test_second_token(ARCHS[a]);
        test_uniform_attention(ARCHS[a]);
        test_attention_zero(ARCHS[a]);
        test_gqa(ARCHS[a]);
        test_incremental(ARCHS[a]);
        test_shift_truncate(ARCHS[a]);
    }
    test_rope_in_model();
    test_tied_output("qwen2");
    test_tied_output("gemma2"); /* the embedding's scale stays off the output */
    test_qk_norm();
    test_errors();
    test_moe_one_of_two();
    test_moe_identical();
    test_moe_used();
    test_moe_errors();
    test_gemma2_window();
    test_gemma2_window_one();
    test_gemma2_swa_pattern();
    test_gemma2_softcap();
    test_gemma2_embd_scale();
    test_gemma2_errors();
    test_yarn_rope();
    test_oss_by_hand();
    test_oss_errors();
    test_g4_by_hand();
    test_g4_errors();
    return th_done();
}
