// labels: unit kernels vulkan
/* The recurrent-layer kernels of Qwen3.5's gated delta-net layers (device.h):
 * ssm_conv, delta_net, l2_norm, unary.
 *   1. The reference (cpu/ref.c) and the CPU device against naive double-precision
 *      implementations written here from the math (the state kept as the matrix
 *      llama.cpp stores, M = S^T, the conv from the concatenated input), on random
 *      inputs: several sequences of different lengths in scrambled slots, tiled and
 *      grouped head mappings, d_k != d_v, strided q/k/v.
 *   2. On the CPU, bitwise: a sequence's tokens in one call equal the same tokens
 *      cut into chunks over several calls (the state carried in its slot), mixed
 *      with other sequences in a different order each call; and 1 thread equals 3.
 *   3. The delta-net mixer chained from these kernels (gate and beta, conv + SiLU,
 *      q/k L2 norm, delta rule, gated RMS norm) against a naive chain.
 *   4. Guards: bad slots give zero rows and leave the pool alone, bad ranges write
 *      nothing; bad shapes are refused with a message naming the problem.
 *   5. vulkan:0 against the CPU (tolerance), and its own chunking bitwise.
 * Exit 77 (skipped) when everything on the CPU passed but no Vulkan device opens. */
#include "recurrent-testlib.h"

#include "base/base.h"
#include "device/cpu/ref.h"
#include "device/device.h"

static uint64_t g_rng = 77;

static void fill(float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = th_randf(&g_rng) * scale;
}

static pkv_tref T(pkv_buffer *b, size_t off) { return pkv_tref_make(b, off); }

/* ----------------------------------------------------------- naive math */

/* conv over one sequence: u = [state rows; x rows] ((K-1) + n rows of C), the
 * output row i = sum_j w[c][j] u[i + j][c] (silu), the new state = u's last K-1 rows.
 * state: [K-1][C] in/out (double). */
static void naive_conv(const float *x, int64_t n, int64_t C, const float *w, int K, bool silu, double *state,
                       double *y) {
    double *u = malloc(sizeof(double) * (size_t)((K - 1 + n) * C));
    for (int64_t r = 0; r < K - 1; r++)
        for (int64_t c = 0; c < C; c++) u[r * C + c] = state[r * C + c];
    for (int64_t r = 0; r < n; r++)
        for (int64_t c = 0; c < C; c++) u[(K - 1 + r) * C + c] = x[r * C + c];
    for (int64_t i = 0; i < n; i++)
        for (int64_t c = 0; c < C; c++) {
            double acc = 0;
            for (int j = 0; j < K; j++) acc += (double)w[c * K + j] * u[(i + j) * C + c];
            y[i * C + c] = silu ? acc / (1 + exp(-acc)) : acc;
        }
    for (int64_t r = 0; r < K - 1; r++)
        for (int64_t c = 0; c < C; c++) state[r * C + c] = u[(n + r) * C + c];
    free(u);
}

/* The q/k head each v head reads: tiled (GGUF order) or grouped (HF order), built
 * by enumeration rather than by the kernels' formulas. */
static void head_map(int hk, int hv, bool grouped, int *map) {
    const int r = hv / hk;
    if (grouped) {
        for (int g = 0; g < hk; g++)
            for (int m = 0; m < r; m++) map[g * r + m] = g;
    } else {
        for (int m = 0; m < r; m++)
            for (int g = 0; g < hk; g++) map[m * hk + g] = g;
    }
}

/* One token of the gated delta rule for one head with M = S^T ([dv][dk], llama.cpp's
 * layout): M *= e^g; pred = M k; M += beta (v - pred) k^T; o = scale M q. */
static void naive_delta_token(double *M, int dk, int dv, const float *q, const float *k, const float *v, double g,
                              double beta, double scale, double *o) {
    const double a = exp(g);
    for (int j = 0; j < dv * dk; j++) M[j] *= a;
    for (int j = 0; j < dv; j++) {
        double pred = 0;
        for (int i = 0; i < dk; i++) pred += M[j * dk + i] * k[i];
        const double d = beta * (v[j] - pred);
        for (int i = 0; i < dk; i++) M[j * dk + i] += d * k[i];
    }
    for (int j = 0; j < dv; j++) {
        double acc = 0;
        for (int i = 0; i < dk; i++) acc += M[j * dk + i] * q[i];
        o[j] = scale * acc;
    }
}

static double naive_nmse_d(const double *ref, const float *got, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        const double e = ref[i] - (double)got[i];
        num += e * e;
        den += ref[i] * ref[i];
    }
    return den > 0 ? num / den : num;
}

/* ------------------------------------------------------------ a problem */

#define MAX_SEQ 4
typedef struct {
    int hk, hv, dk, dv, K;
    bool grouped;
    int n_seq, cnt[MAX_SEQ];
    /* derived */
    int64_t n;               /* tokens */
    int64_t kd, vd, C;       /* key_dim, value_dim, conv channels (= row floats) */
    int n_slots, slot_of[MAX_SEQ];
    size_t conv_slot, conv_stride, dn_slot, dn_stride; /* floats */
    int64_t start[MAX_SEQ];  /* first token row of each sequence in the full batch */
    /* host data, full batch in sequence order */
    float *row;        /* [n][C]: q | k | v, the "conv output" rows (q, k L2-normalized) */
    float *x;          /* [n][C]: the conv input (projection outputs) */
    float *w;          /* [C][K] */
    float *g, *beta;   /* [n][hv] */
    float *conv_pool;  /* initial conv state pool */
    float *dn_pool;    /* initial delta-net state pool */
} problem;

static void problem_free(problem *p) {
    free(p->row);
    free(p->x);
    free(p->w);
    free(p->g);
    free(p->beta);
    free(p->conv_pool);
    free(p->dn_pool);
}

static void l2_rows(float *x, size_t rows, int d) {
    for (size_t r = 0; r < rows; r++) {
        double ss = 0;
        for (int i = 0; i < d; i++) ss += (double)x[r * d + i] * x[r * d + i];
        for (int i = 0; i < d; i++) x[r * d + i] = (float)(x[r * d + i] / sqrt(ss + 1e-6));
    }
}

static void problem_make(problem *p) {
    p->kd = (int64_t)p->hk * p->dk;
    p->vd = (int64_t)p->hv * p->dv;
    p->C = 2 * p->kd + p->vd;
    p->n = 0;
    for (int s = 0; s < p->n_seq; s++) {
        p->start[s] = p->n;
        p->n += p->cnt[s];
    }
    p->n_slots = p->n_seq + 2;
    /* slots in a scrambled order, the pool's first slot unused */
    for (int s = 0; s < p->n_seq; s++) p->slot_of[s] = p->n_slots - 1 - s;
    p->conv_slot = (size_t)(p->K - 1) * (size_t)p->C;
    p->conv_stride = p->conv_slot + 5;
    p->dn_slot = (size_t)p->hv * p->dk * p->dv;
    p->dn_stride = p->dn_slot + 3;
    const size_t cp = (size_t)(p->n_slots - 1) * p->conv_stride + p->conv_slot;
    const size_t dp = (size_t)(p->n_slots - 1) * p->dn_stride + p->dn_slot;
    p->row = malloc(sizeof(float) * (size_t)(p->n * p->C));
    p->x = malloc(sizeof(float) * (size_t)(p->n * p->C));
    p->w = malloc(sizeof(float) * (size_t)(p->C * p->K));
    p->g = malloc(sizeof(float) * (size_t)(p->n * p->hv));
    p->beta = malloc(sizeof(float) * (size_t)(p->n * p->hv));
    p->conv_pool = malloc(sizeof(float) * cp);
    p->dn_pool = malloc(sizeof(float) * dp);
    fill(p->row, (size_t)(p->n * p->C), 1.0f);
    for (int64_t t = 0; t < p->n; t++) l2_rows(p->row + t * p->C, 2 * (size_t)p->hk, p->dk);
    fill(p->x, (size_t)(p->n * p->C), 2.0f);
    fill(p->w, (size_t)(p->C * p->K), 1.0f);
    for (int64_t i = 0; i < p->n * p->hv; i++) {
        p->g[i] = -0.6f * (th_randf(&g_rng) + 1.0f);
        p->beta[i] = 0.5f * (th_randf(&g_rng) + 1.0f) + 0.01f;
    }
    fill(p->conv_pool, cp, 1.5f);
    fill(p->dn_pool, dp, 0.3f);
}

static size_t conv_pool_floats(const problem *p) { return (size_t)(p->n_slots - 1) * p->conv_stride + p->conv_slot; }
static size_t dn_pool_floats(const problem *p) { return (size_t)(p->n_slots - 1) * p->dn_stride + p->dn_slot; }

/* The naive answers for the whole problem: conv outputs y [n][C], delta outputs
 * o [n][vd], and the final pools (as floats, laid out like the kernels'). */
typedef struct {
    double *y, *o;
    double *conv_pool, *dn_pool;
} answer;

static void answer_free(answer *a) {
    free(a->y);
    free(a->o);
    free(a->conv_pool);
    free(a->dn_pool);
}

static void naive_all(const problem *p, bool silu, answer *ans) {
    const size_t cp = conv_pool_floats(p), dp = dn_pool_floats(p);
    ans->y = malloc(sizeof(double) * (size_t)(p->n * p->C));
    ans->o = malloc(sizeof(double) * (size_t)(p->n * p->vd));
    ans->conv_pool = malloc(sizeof(double) * cp);
    ans->dn_pool = malloc(sizeof(double) * dp);
    for (size_t i = 0; i < cp; i++) ans->conv_pool[i] = p->conv_pool[i];
    for (size_t i = 0; i < dp; i++) ans->dn_pool[i] = p->dn_pool[i];
    int map[64];
    head_map(p->hk, p->hv, p->grouped, map);
    double *M = malloc(sizeof(double) * (size_t)p->dk * p->dv), *o = malloc(sizeof(double) * (size_t)p->dv);
    for (int s = 0; s < p->n_seq; s++) {
        const int64_t t0 = p->start[s];
        naive_conv(p->x + t0 * p->C, p->cnt[s], p->C, p->w, p->K, silu,
                   ans->conv_pool + (size_t)p->slot_of[s] * p->conv_stride, ans->y + t0 * p->C);
        double *S = ans->dn_pool + (size_t)p->slot_of[s] * p->dn_stride;
        for (int h = 0; h < p->hv; h++) {
            double *Sh = S + (size_t)h * p->dk * p->dv; /* pagekv: [dk][dv] */
            for (int i = 0; i < p->dk; i++)
                for (int j = 0; j < p->dv; j++) M[j * p->dk + i] = Sh[i * p->dv + j];
            for (int64_t t = t0; t < t0 + p->cnt[s]; t++) {
                const float *r = p->row + t * p->C;
                naive_delta_token(M, p->dk, p->dv, r + map[h] * p->dk, r + p->kd + map[h] * p->dk,
                                  r + 2 * p->kd + h * p->dv, p->g[t * p->hv + h], p->beta[t * p->hv + h],
                                  1.0 / sqrt((double)p->dk), o);
                for (int j = 0; j < p->dv; j++) ans->o[(t * p->hv + h) * p->dv + j] = o[j];
            }
            for (int i = 0; i < p->dk; i++)
                for (int j = 0; j < p->dv; j++) Sh[i * p->dv + j] = M[j * p->dk + i];
        }
    }
    free(M);
    free(o);
}

/* ------------------------------------------------------- running kernels */

/* A piece of a sequence: tokens [t0, t1) of sequence s (relative to its start). */
typedef struct {
    int s;
    int64_t t0, t1;
} piece;

/* Device results of a problem. */
typedef struct {
    float *y, *o, *conv_pool, *dn_pool;
} result;

static void result_free(result *r) {
    free(r->y);
    free(r->o);
    free(r->conv_pool);
    free(r->dn_pool);
}

/* Run ssm_conv and delta_net on dev as a series of calls; call c holds the pieces
 * calls[c][0 .. n_pieces[c]). Inputs of a call are gathered into packed batches in
 * piece order, outputs scattered back to the problem's rows. */
static bool run_calls(pkv_device *dev, const problem *p, bool silu, piece (*calls)[MAX_SEQ], const int *n_pieces,
                      int n_calls, result *res) {
    const size_t cp = conv_pool_floats(p), dp = dn_pool_floats(p);
    res->y = calloc((size_t)(p->n * p->C), sizeof(float));
    res->o = calloc((size_t)(p->n * p->vd), sizeof(float));
    res->conv_pool = malloc(sizeof(float) * cp);
    res->dn_pool = malloc(sizeof(float) * dp);
    pkv_buffer *bcp = up(dev, p->conv_pool, cp * 4), *bdp = up(dev, p->dn_pool, dp * 4);
    pkv_buffer *bw = up(dev, p->w, (size_t)(p->C * p->K) * 4);
    bool ok = bcp && bdp && bw;
    for (int c = 0; ok && c < n_calls; c++) {
        int64_t n = 0;
        int32_t meta[2 * MAX_SEQ + 1];
        meta[0] = 0;
        for (int i = 0; i < n_pieces[c]; i++) {
            n += calls[c][i].t1 - calls[c][i].t0;
            meta[i + 1] = (int32_t)n;
            meta[n_pieces[c] + 1 + i] = p->slot_of[calls[c][i].s];
        }
        const int ns = n_pieces[c];
        float *x = malloc(sizeof(float) * (size_t)(n * p->C)), *row = malloc(sizeof(float) * (size_t)(n * p->C));
        float *g = malloc(sizeof(float) * (size_t)(n * p->hv)), *b = malloc(sizeof(float) * (size_t)(n * p->hv));
        float *y = malloc(sizeof(float) * (size_t)(n * p->C)), *o = malloc(sizeof(float) * (size_t)(n * p->vd));
        int64_t r = 0;
        for (int i = 0; i < ns; i++)
            for (int64_t t = calls[c][i].t0; t < calls[c][i].t1; t++, r++) {
                const int64_t src = p->start[calls[c][i].s] + t;
                memcpy(x + r * p->C, p->x + src * p->C, sizeof(float) * (size_t)p->C);
                memcpy(row + r * p->C, p->row + src * p->C, sizeof(float) * (size_t)p->C);
                memcpy(g + r * p->hv, p->g + src * p->hv, sizeof(float) * (size_t)p->hv);
                memcpy(b + r * p->hv, p->beta + src * p->hv, sizeof(float) * (size_t)p->hv);
            }
        pkv_buffer *bx = up(dev, x, (size_t)(n * p->C) * 4), *by = up(dev, NULL, (size_t)(n * p->C) * 4);
        pkv_buffer *brow = up(dev, row, (size_t)(n * p->C) * 4), *bg = up(dev, g, (size_t)(n * p->hv) * 4);
        pkv_buffer *bb = up(dev, b, (size_t)(n * p->hv) * 4), *bo = up(dev, NULL, (size_t)(n * p->vd) * 4);
        pkv_buffer *bm = up(dev, meta, (size_t)(2 * ns + 1) * 4);
        ok = bx && by && brow && bg && bb && bo && bm;
        if (ok) {
            pkv_k_ssm_conv_args ca = {.x = T(bx, 0), .w = T(bw, 0), .y = T(by, 0), .state = T(bcp, 0),
                                      .state_stride = p->conv_stride * 4, .n_slots = p->n_slots, .meta = T(bm, 0),
                                      .n_tok = n, .channels = p->C, .n_seq = ns, .d_conv = p->K, .silu = silu};
            pkv_k_delta_net_args da = {.q = T(brow, 0), .k = T(brow, (size_t)p->kd * 4), .v = T(brow, (size_t)p->kd * 8),
                                       .q_stride = (size_t)p->C * 4, .k_stride = (size_t)p->C * 4,
                                       .v_stride = (size_t)p->C * 4, .g = T(bg, 0), .beta = T(bb, 0), .out = T(bo, 0),
                                       .state = T(bdp, 0), .state_stride = p->dn_stride * 4, .n_slots = p->n_slots,
                                       .meta = T(bm, 0), .n_tok = n, .n_seq = ns, .n_k_heads = p->hk,
                                       .n_v_heads = p->hv, .d_k = p->dk, .d_v = p->dv, .grouped = p->grouped};
            pkv_status s1 = pkv_k_ssm_conv(dev, &ca), s2 = pkv_k_delta_net(dev, &da);
            if (s1 || s2) TH_FAIL("kernels on %s: %s", pkv_device_name(dev), pkv_errmsg());
            ok = !s1 && !s2 && down(by, y, (size_t)(n * p->C) * 4) && down(bo, o, (size_t)(n * p->vd) * 4);
        }
        r = 0;
        for (int i = 0; ok && i < ns; i++)
            for (int64_t t = calls[c][i].t0; t < calls[c][i].t1; t++, r++) {
                const int64_t dst = p->start[calls[c][i].s] + t;
                memcpy(res->y + dst * p->C, y + r * p->C, sizeof(float) * (size_t)p->C);
                memcpy(res->o + dst * p->vd, o + r * p->vd, sizeof(float) * (size_t)p->vd);
            }
        pkv_buffer_free(bx);
        pkv_buffer_free(by);
        pkv_buffer_free(brow);
        pkv_buffer_free(bg);
        pkv_buffer_free(bb);
        pkv_buffer_free(bo);
        pkv_buffer_free(bm);
        free(x);
        free(row);
        free(g);
        free(b);
        free(y);
        free(o);
    }
    ok = ok && down(bcp, res->conv_pool, cp * 4) && down(bdp, res->dn_pool, dp * 4);
    pkv_buffer_free(bcp);
    pkv_buffer_free(bdp);
    pkv_buffer_free(bw);
    if (!ok) TH_FAIL("run on %s failed: %s", pkv_device_name(dev), pkv_errmsg());
    return ok;
}

/* Every sequence whole, in one call. */
static bool run_whole(pkv_device *dev, const problem *p, bool silu, result *res) {
    piece calls[1][MAX_SEQ];
    int np[1] = {p->n_seq};
    for (int s = 0; s < p->n_seq; s++) calls[0][s] = (piece){s, 0, p->cnt[s]};
    return run_calls(dev, p, silu, calls, np, 1, res);
}

/* Every sequence cut into chunks of 1, 2, 3, 1, 2, 3, ... tokens; call c holds
 * chunk c of every sequence that still has one, in reversed order on odd calls. */
static bool run_chunked(pkv_device *dev, const problem *p, bool silu, result *res) {
    piece calls[64][MAX_SEQ];
    int np[64] = {0}, n_calls = 0;
    int64_t pos[MAX_SEQ] = {0};
    for (int c = 0; c < 64; c++) {
        const int64_t len = 1 + c % 3;
        for (int k = 0; k < p->n_seq; k++) {
            const int s = c & 1 ? p->n_seq - 1 - k : k;
            if (pos[s] >= p->cnt[s]) continue;
            const int64_t t1 = PKV_MIN(pos[s] + len, (int64_t)p->cnt[s]);
            calls[c][np[c]++] = (piece){s, pos[s], t1};
            pos[s] = t1;
        }
        if (np[c]) n_calls = c + 1;
    }
    return run_calls(dev, p, silu, calls, np, n_calls, res);
}

/* ------------------------------------------------------------- the cases */

/* Fixed shapes first (Qwen3.5's d_k = d_v = 128 among them), then random ones. */
#define CASE(hk_, hv_, dk_, dv_, K_, grouped_, n_seq_, ...)                                                    \
    { .hk = hk_, .hv = hv_, .dk = dk_, .dv = dv_, .K = K_, .grouped = grouped_, .n_seq = n_seq_, .cnt = {__VA_ARGS__} }
static const problem fixed_cases[] = {
    CASE(1, 1, 16, 16, 4, false, 2, 1, 5),      CASE(2, 4, 32, 16, 4, false, 3, 7, 1, 12),
    CASE(2, 4, 32, 16, 4, true, 3, 7, 1, 12),   CASE(2, 6, 24, 40, 5, true, 4, 3, 9, 4, 1),
    CASE(4, 4, 16, 32, 2, false, 2, 2, 6),      CASE(1, 2, 128, 128, 4, false, 2, 5, 3),
};
#define N_RANDOM 16
#define N_CASES ((int)PKV_ARRAY_LEN(fixed_cases) + N_RANDOM)

/* Case i: a fixed one, or a random shape drawn from a generator seeded by i. */
static problem get_case(int i) {
    if (i < (int)PKV_ARRAY_LEN(fixed_cases)) return fixed_cases[i];
    uint64_t r = 1000 + (uint64_t)i;
    problem p = {0};
    p.hk = 1 + (int)(th_rand(&r) % 3);
    p.hv = p.hk * (1 + (int)(th_rand(&r) % 3));
    p.dk = 4 + (int)(th_rand(&r) % 61);
    p.dv = 4 + (int)(th_rand(&r) % 61);
    p.K = 2 + (int)(th_rand(&r) % 5);
    p.grouped = th_rand(&r) % 2;
    p.n_seq = 1 + (int)(th_rand(&r) % MAX_SEQ);
    for (int s = 0; s < p.n_seq; s++) p.cnt[s] = 1 + (int)(th_rand(&r) % 10);
    return p;
}

static double fnmse(const float *ref, const float *got, size_t n) { return th_nmse(ref, got, n); }

/* Reference and CPU device against the naive math; chunked == whole, bitwise. */
static void test_cpu(pkv_device *cpu, pkv_device *cpu3) {
    for (int ci = 0; ci < N_CASES; ci++) {
        problem p = get_case(ci);
        problem_make(&p);
        const bool silu = ci % 2 == 0;
        answer want;
        naive_all(&p, silu, &want);

        /* the reference, whole problem */
        {
            const size_t cp = conv_pool_floats(&p), dp = dn_pool_floats(&p);
            float *y = malloc(sizeof(float) * (size_t)(p.n * p.C)), *o = malloc(sizeof(float) * (size_t)(p.n * p.vd));
            float *cpool = malloc(cp * 4), *dpool = malloc(dp * 4);
            memcpy(cpool, p.conv_pool, cp * 4);
            memcpy(dpool, p.dn_pool, dp * 4);
            int32_t meta[2 * MAX_SEQ + 1];
            meta[0] = 0;
            for (int s = 0; s < p.n_seq; s++) {
                meta[s + 1] = (int32_t)(p.start[s] + p.cnt[s]);
                meta[p.n_seq + 1 + s] = p.slot_of[s];
            }
            pkv_k_ssm_conv_args ca = {.state_stride = p.conv_stride * 4, .n_slots = p.n_slots, .n_tok = p.n,
                                      .channels = p.C, .n_seq = p.n_seq, .d_conv = p.K, .silu = silu};
            pkv_k_delta_net_args da = {.q_stride = (size_t)p.C * 4, .k_stride = (size_t)p.C * 4, .v_stride = (size_t)p.C * 4,
                                       .state_stride = p.dn_stride * 4, .n_slots = p.n_slots, .n_tok = p.n,
                                       .n_seq = p.n_seq, .n_k_heads = p.hk, .n_v_heads = p.hv, .d_k = p.dk, .d_v = p.dv,
                                       .grouped = p.grouped};
            pkv_ref_ssm_conv(&ca, p.x, p.w, y, cpool, meta);
            pkv_ref_delta_net(&da, p.row, p.row + p.kd, p.row + 2 * p.kd, p.g, p.beta, o, dpool, meta);
            const double e1 = naive_nmse_d(want.y, y, (size_t)(p.n * p.C)), e2 = naive_nmse_d(want.o, o, (size_t)(p.n * p.vd));
            const double e3 = naive_nmse_d(want.conv_pool, cpool, cp), e4 = naive_nmse_d(want.dn_pool, dpool, dp);
            if (!(e1 < 1e-13 && e2 < 1e-11 && e3 < 1e-13 && e4 < 1e-11))
                TH_FAIL("case %d: reference vs naive: conv %.3g, out %.3g, conv state %.3g, delta state %.3g", ci, e1,
                        e2, e3, e4);
            th_checks++;
            free(y);
            free(o);
            free(cpool);
            free(dpool);
        }

        /* the CPU device: whole, chunked, and on 3 threads */
        result whole, chunked, three;
        if (run_whole(cpu, &p, silu, &whole)) {
            const double e1 = naive_nmse_d(want.y, whole.y, (size_t)(p.n * p.C));
            const double e2 = naive_nmse_d(want.o, whole.o, (size_t)(p.n * p.vd));
            const double e3 = naive_nmse_d(want.conv_pool, whole.conv_pool, conv_pool_floats(&p));
            const double e4 = naive_nmse_d(want.dn_pool, whole.dn_pool, dn_pool_floats(&p));
            if (!(e1 < 1e-12 && e2 < 1e-10 && e3 < 1e-12 && e4 < 1e-10))
                TH_FAIL("case %d: cpu vs naive: conv %.3g, out %.3g, conv state %.3g, delta state %.3g", ci, e1, e2, e3,
                        e4);
            th_checks++;
            if (run_chunked(cpu, &p, silu, &chunked)) {
                CHECK(bits_equal(whole.y, chunked.y, (size_t)(p.n * p.C)));
                CHECK(bits_equal(whole.o, chunked.o, (size_t)(p.n * p.vd)));
                CHECK(bits_equal(whole.conv_pool, chunked.conv_pool, conv_pool_floats(&p)));
                CHECK(bits_equal(whole.dn_pool, chunked.dn_pool, dn_pool_floats(&p)));
                result_free(&chunked);
            }
            if (run_whole(cpu3, &p, silu, &three)) {
                CHECK(bits_equal(whole.o, three.o, (size_t)(p.n * p.vd)));
                CHECK(bits_equal(whole.dn_pool, three.dn_pool, dn_pool_floats(&p)));
                result_free(&three);
            }
            result_free(&whole);
        }
        answer_free(&want);
        problem_free(&p);
    }
}

/* ---------------------------------------------------- the mixer, chained */

/* Qwen3.5's linear-attention mixer after the projections, from the kernels:
 *   beta = sigmoid(b); g = softplus(a + dt_bias) * ssm_a
 *   conv + silu over [q|k|v]; l2 norm of the 2 hk q/k heads; delta rule;
 *   y = rms_norm(o_h; norm_w) * silu(z_h)
 * against the same chain computed naively in double. */
static void mixer_device(pkv_device *dev, const problem *p, const float *a_raw, const float *b_raw, const float *dt,
                         const float *ssm_a, const float *z, const float *norm_w, float eps, float *y_out) {
    const int64_t n = p->n;
    int32_t meta[2 * MAX_SEQ + 1];
    meta[0] = 0;
    for (int s = 0; s < p->n_seq; s++) {
        meta[s + 1] = (int32_t)(p->start[s] + p->cnt[s]);
        meta[p->n_seq + 1 + s] = p->slot_of[s];
    }
    pkv_buffer *bx = up(dev, p->x, (size_t)(n * p->C) * 4), *bw = up(dev, p->w, (size_t)(p->C * p->K) * 4);
    pkv_buffer *bcp = up(dev, p->conv_pool, conv_pool_floats(p) * 4), *bdp = up(dev, p->dn_pool, dn_pool_floats(p) * 4);
    pkv_buffer *ba = up(dev, a_raw, (size_t)(n * p->hv) * 4), *bb = up(dev, b_raw, (size_t)(n * p->hv) * 4);
    pkv_buffer *bdt = up(dev, dt, (size_t)p->hv * 4), *bsa = up(dev, ssm_a, (size_t)p->hv * 4);
    pkv_buffer *bz = up(dev, z, (size_t)(n * p->vd) * 4), *bnw = up(dev, norm_w, (size_t)p->dv * 4);
    pkv_buffer *bo = up(dev, NULL, (size_t)(n * p->vd) * 4), *bm = up(dev, meta, (size_t)(2 * p->n_seq + 1) * 4);
    if (!(bx && bw && bcp && bdp && ba && bb && bdt && bsa && bz && bnw && bo && bm)) {
        TH_FAIL("mixer buffers on %s: %s", pkv_device_name(dev), pkv_errmsg());
    } else {
        const size_t rs = (size_t)p->C * 4;
        pkv_k_unary_args gate = {.x = T(ba, 0), .y = T(ba, 0), .n = n * p->hv, .op = PKV_UNARY_SOFTPLUS,
                                 .bias = T(bdt, 0), .bias_len = p->hv, .mul = T(bsa, 0), .mul_len = p->hv};
        pkv_k_unary_args bet = {.x = T(bb, 0), .y = T(bb, 0), .n = n * p->hv, .op = PKV_UNARY_SIGMOID};
        pkv_k_ssm_conv_args conv = {.x = T(bx, 0), .w = T(bw, 0), .y = T(bx, 0), .state = T(bcp, 0),
                                    .state_stride = p->conv_stride * 4, .n_slots = p->n_slots, .meta = T(bm, 0),
                                    .n_tok = n, .channels = p->C, .n_seq = p->n_seq, .d_conv = p->K, .silu = true};
        pkv_k_l2_norm_args l2 = {.x = T(bx, 0), .y = T(bx, 0), .n = n, .n_heads = 2 * p->hk, .head_dim = p->dk,
                                 .x_stride = rs, .y_stride = rs, .eps = eps};
        pkv_k_delta_net_args dn = {.q = T(bx, 0), .k = T(bx, (size_t)p->kd * 4), .v = T(bx, (size_t)p->kd * 8),
                                   .q_stride = rs, .k_stride = rs, .v_stride = rs, .g = T(ba, 0), .beta = T(bb, 0),
                                   .out = T(bo, 0), .state = T(bdp, 0), .state_stride = p->dn_stride * 4,
                                   .n_slots = p->n_slots, .meta = T(bm, 0), .n_tok = n, .n_seq = p->n_seq,
                                   .n_k_heads = p->hk, .n_v_heads = p->hv, .d_k = p->dk, .d_v = p->dv,
                                   .grouped = p->grouped};
        pkv_k_rms_norm_args rn = {T(bo, 0), T(bnw, 0), T(bo, 0), n * p->hv, p->dv, eps};
        pkv_k_swiglu_args sg = {.g = T(bz, 0), .u = T(bo, 0), .y = T(bz, 0), .n = n * p->vd}; /* y may alias g */
        CHECK_OK(pkv_k_unary(dev, &gate));
        CHECK_OK(pkv_k_unary(dev, &bet));
        CHECK_OK(pkv_k_ssm_conv(dev, &conv));
        CHECK_OK(pkv_k_l2_norm(dev, &l2));
        CHECK_OK(pkv_k_delta_net(dev, &dn));
        CHECK_OK(pkv_k_rms_norm(dev, &rn));
        CHECK_OK(pkv_k_swiglu(dev, &sg));
        CHECK(down(bz, y_out, (size_t)(n * p->vd) * 4));
    }
    pkv_buffer *all[] = {bx, bw, bcp, bdp, ba, bb, bdt, bsa, bz, bnw, bo, bm};
    for (size_t i = 0; i < PKV_ARRAY_LEN(all); i++) pkv_buffer_free(all[i]);
}

static void mixer_naive(const problem *p, const float *a_raw, const float *b_raw, const float *dt, const float *ssm_a,
                        const float *z, const float *norm_w, double eps, double *y_out) {
    const int64_t n = p->n, C = p->C;
    double *cstate = malloc(sizeof(double) * p->conv_slot), *conv = malloc(sizeof(double) * (size_t)(n * C));
    float *act = malloc(sizeof(float) * (size_t)(n * C));
    for (int s = 0; s < p->n_seq; s++) {
        const float *cs = p->conv_pool + (size_t)p->slot_of[s] * p->conv_stride;
        for (size_t i = 0; i < p->conv_slot; i++) cstate[i] = cs[i];
        naive_conv(p->x + p->start[s] * C, p->cnt[s], C, p->w, p->K, true, cstate, conv + p->start[s] * C);
    }
    /* q/k l2 norm in double, then the delta rule from those values */
    for (int64_t t = 0; t < n; t++) {
        for (int h = 0; h < 2 * p->hk; h++) {
            const double *r = conv + t * C + (int64_t)h * p->dk;
            double ss = 0;
            for (int i = 0; i < p->dk; i++) ss += r[i] * r[i];
            for (int i = 0; i < p->dk; i++) act[t * C + h * p->dk + i] = (float)(r[i] / sqrt(ss + eps));
        }
        for (int64_t i = 2 * p->kd; i < C; i++) act[t * C + i] = (float)conv[t * C + i];
    }
    int map[64];
    head_map(p->hk, p->hv, p->grouped, map);
    double *M = malloc(sizeof(double) * (size_t)p->dk * p->dv), *o = malloc(sizeof(double) * (size_t)p->dv);
    for (int s = 0; s < p->n_seq; s++) {
        const float *S = p->dn_pool + (size_t)p->slot_of[s] * p->dn_stride;
        for (int h = 0; h < p->hv; h++) {
            for (int i = 0; i < p->dk; i++)
                for (int j = 0; j < p->dv; j++) M[j * p->dk + i] = S[((size_t)h * p->dk + i) * p->dv + j];
            for (int64_t t = p->start[s]; t < p->start[s] + p->cnt[s]; t++) {
                const float *r = act + t * C;
                const double av = a_raw[t * p->hv + h] + (double)dt[h];
                const double g = (av > 20 ? av : log1p(exp(av))) * ssm_a[h];
                const double beta = 1 / (1 + exp(-(double)b_raw[t * p->hv + h]));
                naive_delta_token(M, p->dk, p->dv, r + map[h] * p->dk, r + p->kd + map[h] * p->dk,
                                  r + 2 * p->kd + h * p->dv, g, beta, 1.0 / sqrt((double)p->dk), o);
                double ss = 0;
                for (int j = 0; j < p->dv; j++) ss += o[j] * o[j];
                const double inv = 1 / sqrt(ss / p->dv + eps);
                for (int j = 0; j < p->dv; j++) {
                    const double zz = z[(t * p->hv + h) * p->dv + j];
                    y_out[(t * p->hv + h) * p->dv + j] = o[j] * inv * norm_w[j] * (zz / (1 + exp(-zz)));
                }
            }
        }
    }
    free(cstate);
    free(conv);
    free(act);
    free(M);
    free(o);
}

static void test_mixer(pkv_device *dev, double tol) {
    problem p = get_case(3); /* grouped heads, d_k != d_v, four sequences */
    problem_make(&p);
    const int64_t n = p.n;
    float *a = malloc(sizeof(float) * (size_t)(n * p.hv)), *b = malloc(sizeof(float) * (size_t)(n * p.hv));
    float *dt = malloc(sizeof(float) * (size_t)p.hv), *sa = malloc(sizeof(float) * (size_t)p.hv);
    float *z = malloc(sizeof(float) * (size_t)(n * p.vd)), *nw = malloc(sizeof(float) * (size_t)p.dv);
    float *got = malloc(sizeof(float) * (size_t)(n * p.vd));
    double *want = malloc(sizeof(double) * (size_t)(n * p.vd));
    fill(a, (size_t)(n * p.hv), 3.0f);
    fill(b, (size_t)(n * p.hv), 3.0f);
    fill(dt, (size_t)p.hv, 1.0f);
    for (int h = 0; h < p.hv; h++) sa[h] = -expf(th_randf(&g_rng)); /* -exp(A_log) */
    fill(z, (size_t)(n * p.vd), 3.0f);
    for (int j = 0; j < p.dv; j++) nw[j] = 1.0f + 0.3f * th_randf(&g_rng);
    mixer_naive(&p, a, b, dt, sa, z, nw, 1e-6, want);
    mixer_device(dev, &p, a, b, dt, sa, z, nw, 1e-6f, got);
    const double e = naive_nmse_d(want, got, (size_t)(n * p.vd));
    fprintf(stderr, "  mixer chain on %s: nmse %.3g (tolerance %g)\n", pkv_device_name(dev), e, tol);
    if (!(e < tol)) TH_FAIL("mixer chain on %s: nmse %.3g > %g", pkv_device_name(dev), e, tol);
    th_checks++;
    free(a);
    free(b);
    free(dt);
    free(sa);
    free(z);
    free(nw);
    free(got);
    free(want);
    problem_free(&p);
}

/* --------------------------------------------------------------- guards */

static void test_guards(pkv_device *dev) {
    problem p = get_case(1);
    problem_make(&p);
    /* sequence 0 valid, sequence 1 with a slot past the pool, sequence 2 with a
     * range past n_tok (not run at all) */
    const int64_t n = p.n;
    int32_t meta[7] = {0, 7, 8, (int32_t)n + 5, p.slot_of[0], p.n_slots + 1, p.slot_of[2]};
    const size_t cp = conv_pool_floats(&p), dp = dn_pool_floats(&p);
    /* outputs start as 42 so that zeros and untouched rows both show */
    float *sentinel = malloc(sizeof(float) * (size_t)(n * p.C));
    for (int64_t i = 0; i < n * p.C; i++) sentinel[i] = 42.0f;
    pkv_buffer *brow = up(dev, p.row, (size_t)(n * p.C) * 4), *bx = up(dev, p.x, (size_t)(n * p.C) * 4);
    pkv_buffer *bw = up(dev, p.w, (size_t)(p.C * p.K) * 4), *bg = up(dev, p.g, (size_t)(n * p.hv) * 4);
    pkv_buffer *bb = up(dev, p.beta, (size_t)(n * p.hv) * 4), *bo = up(dev, sentinel, (size_t)(n * p.vd) * 4);
    pkv_buffer *bcp = up(dev, p.conv_pool, cp * 4), *bdp = up(dev, p.dn_pool, dp * 4), *bm = up(dev, meta, sizeof meta);
    pkv_buffer *by = up(dev, sentinel, (size_t)(n * p.C) * 4);
    float *o = malloc(sizeof(float) * (size_t)(n * p.vd)), *y = malloc(sizeof(float) * (size_t)(n * p.C));
    float *cpool = malloc(cp * 4), *dpool = malloc(dp * 4);
    const size_t rs = (size_t)p.C * 4;
    pkv_k_delta_net_args da = {.q = T(brow, 0), .k = T(brow, (size_t)p.kd * 4), .v = T(brow, (size_t)p.kd * 8),
                               .q_stride = rs, .k_stride = rs, .v_stride = rs, .g = T(bg, 0), .beta = T(bb, 0),
                               .out = T(bo, 0), .state = T(bdp, 0), .state_stride = p.dn_stride * 4,
                               .n_slots = p.n_slots, .meta = T(bm, 0), .n_tok = n, .n_seq = 3, .n_k_heads = p.hk,
                               .n_v_heads = p.hv, .d_k = p.dk, .d_v = p.dv};
    pkv_k_ssm_conv_args ca = {.x = T(bx, 0), .w = T(bw, 0), .y = T(by, 0), .state = T(bcp, 0),
                              .state_stride = p.conv_stride * 4, .n_slots = p.n_slots, .meta = T(bm, 0), .n_tok = n,
                              .channels = p.C, .n_seq = 3, .d_conv = p.K};
    CHECK_OK(pkv_k_delta_net(dev, &da));
    CHECK_OK(pkv_k_ssm_conv(dev, &ca));
    if (down(bo, o, (size_t)(n * p.vd) * 4) && down(by, y, (size_t)(n * p.C) * 4) && down(bcp, cpool, cp * 4) &&
        down(bdp, dpool, dp * 4)) {
        bool zeros = true, untouched = true;
        for (int64_t i = 7 * p.vd; i < 8 * p.vd; i++) zeros &= o[i] == 0.0f;
        for (int64_t i = 7 * p.C; i < 8 * p.C; i++) zeros &= y[i] == 0.0f;
        for (int64_t i = 8 * p.vd; i < n * p.vd; i++) untouched &= o[i] == 42.0f;
        for (int64_t i = 8 * p.C; i < n * p.C; i++) untouched &= y[i] == 42.0f;
        CHECK(zeros);     /* the bad slot's token */
        CHECK(untouched); /* the bad range's tokens */
        /* only sequence 0's slot changed */
        for (int sl = 0; sl < p.n_slots; sl++) {
            const bool same_c = bits_equal(cpool + (size_t)sl * p.conv_stride, p.conv_pool + (size_t)sl * p.conv_stride,
                                           p.conv_slot);
            const bool same_d = bits_equal(dpool + (size_t)sl * p.dn_stride, p.dn_pool + (size_t)sl * p.dn_stride, p.dn_slot);
            CHECK(same_c == (sl != p.slot_of[0]));
            CHECK(same_d == (sl != p.slot_of[0]));
        }
    } else {
        TH_FAIL("guards: read back: %s", pkv_errmsg());
    }

    /* shapes the dispatcher refuses, each with a message naming the problem */
    pkv_k_delta_net_args bad = da;
    bad.n_v_heads = 5;
    CHECK_STATUS(pkv_k_delta_net(dev, &bad), PKV_ERR_INVALID);
    CHECK_MSG("not a multiple of n_k_heads");
    bad = da;
    bad.q_stride = 8;
    CHECK_STATUS(pkv_k_delta_net(dev, &bad), PKV_ERR_INVALID);
    CHECK_MSG("q stride 8");
    bad = da;
    bad.state_stride = p.dn_slot * 4 - 4;
    CHECK_STATUS(pkv_k_delta_net(dev, &bad), PKV_ERR_INVALID);
    CHECK_MSG("state stride");
    bad = da;
    bad.n_slots = p.n_slots + 1;
    CHECK_STATUS(pkv_k_delta_net(dev, &bad), PKV_ERR_INVALID);
    CHECK_MSG("argument state needs");
    pkv_k_ssm_conv_args badc = ca;
    badc.d_conv = 1;
    CHECK_STATUS(pkv_k_ssm_conv(dev, &badc), PKV_ERR_INVALID);
    CHECK_MSG("d_conv 1 must be in [2, 16]");
    badc = ca;
    badc.n_seq = 0;
    CHECK_STATUS(pkv_k_ssm_conv(dev, &badc), PKV_ERR_INVALID);
    CHECK_MSG("n_seq 0");
    pkv_k_l2_norm_args l2 = {.x = T(bx, 0), .y = T(bx, 0), .n = n, .n_heads = 2, .head_dim = 8, .x_stride = 6};
    CHECK_STATUS(pkv_k_l2_norm(dev, &l2), PKV_ERR_INVALID);
    CHECK_MSG("x stride 6");
    pkv_k_unary_args un = {.x = T(bx, 0), .y = T(bx, 0), .n = 10, .op = PKV_UNARY_SIGMOID, .bias = T(bw, 0), .bias_len = 3};
    CHECK_STATUS(pkv_k_unary(dev, &un), PKV_ERR_INVALID);
    CHECK_MSG("bias_len 3");

    pkv_buffer *all[] = {brow, bx, bw, bg, bb, bo, bcp, bdp, bm, by};
    for (size_t i = 0; i < PKV_ARRAY_LEN(all); i++) pkv_buffer_free(all[i]);
    free(sentinel);
    free(o);
    free(y);
    free(cpool);
    free(dpool);
    problem_free(&p);
}

/* ------------------------------------------------------ vulkan vs the cpu */

static void test_device_vs_cpu(pkv_device *dev, pkv_device *cpu) {
    for (int ci = 0; ci < N_CASES; ci++) {
        problem p = get_case(ci);
        problem_make(&p);
        const bool silu = ci % 2 == 1;
        result rc, rd, rdc;
        if (run_whole(cpu, &p, silu, &rc)) {
            if (run_whole(dev, &p, silu, &rd)) {
                const double e1 = fnmse(rc.y, rd.y, (size_t)(p.n * p.C)), e2 = fnmse(rc.o, rd.o, (size_t)(p.n * p.vd));
                const double e3 = fnmse(rc.conv_pool, rd.conv_pool, conv_pool_floats(&p));
                const double e4 = fnmse(rc.dn_pool, rd.dn_pool, dn_pool_floats(&p));
                if (!(e1 < 1e-12 && e2 < 1e-10 && e3 < 1e-12 && e4 < 1e-10))
                    TH_FAIL("case %d: %s vs cpu: conv %.3g, out %.3g, conv state %.3g, delta state %.3g", ci,
                            pkv_device_name(dev), e1, e2, e3, e4);
                th_checks++;
                if (run_chunked(dev, &p, silu, &rdc)) {
                    CHECK(bits_equal(rd.y, rdc.y, (size_t)(p.n * p.C)));
                    CHECK(bits_equal(rd.o, rdc.o, (size_t)(p.n * p.vd)));
                    CHECK(bits_equal(rd.dn_pool, rdc.dn_pool, dn_pool_floats(&p)));
                    result_free(&rdc);
                }
                result_free(&rd);
            }
            result_free(&rc);
        }
        problem_free(&p);
    }
}

int main(void) {
    pkv_device *cpu = pkv_device_open("cpu", pkv_device_default_params());
    pkv_device_params dp3 = pkv_device_default_params();
    dp3.n_threads = 3;
    pkv_device *cpu3 = pkv_device_open("cpu", dp3);
    REQUIRE(cpu && cpu3);
    test_cpu(cpu, cpu3);
    test_mixer(cpu, 1e-10);
    test_guards(cpu);

    pkv_device *vk = pkv_device_open("vulkan:0", pkv_device_default_params());
    if (!vk) {
        char msg[512];
        snprintf(msg, sizeof msg, "no Vulkan device (vulkan:0: %s); the CPU parts passed", pkv_errmsg());
        pkv_device_close(cpu);
        pkv_device_close(cpu3);
        return th_failures ? th_done() : th_skip(msg);
    }
    fprintf(stderr, "vulkan:0 = %s\n", pkv_device_get_caps(vk)->description);
    test_device_vs_cpu(vk, cpu);
    test_mixer(vk, 1e-10);
    test_guards(vk);
    pkv_device_close(vk);
    pkv_device_close(cpu);
    pkv_device_close(cpu3);
    return th_done();
}
