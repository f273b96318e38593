/* Quantizers for the types of quant-int.c (q4_1 .. tq2_0): plain nearest
 * rounding, one scale per block or sub-block from its largest magnitude (or its
 * range, for the types with offsets), then the nearest code per element, or for
 * the grid types the nearest grid entry per group of 8 (or 4) values. They make
 * valid blocks close to the input for test models (mkmodel) and the conformance
 * suite; they do not search scales or weigh errors by importance as llama.cpp's
 * quantizers do, so a file they write is less accurate than llama-quantize's of
 * the same type. Block layouts: quant-int.c. */
#include "base/quant.h"

#include "base/base.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

static int nearest(float f) { return (int)lrintf(f); }
static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }
/* Store f as f16 and return the value a reader will see. */
static float wr_f16(uint8_t *p, float f) {
    const uint16_t h = pkv_f32_to_f16(f);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
    return pkv_f16_to_f32(h);
}
static void wr16(uint8_t *p, unsigned v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static void wr32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static float amax_of(const float *x, int n) {
    float a = 0;
    for (int i = 0; i < n; i++) a = fmaxf(a, fabsf(x[i]));
    return a;
}
/* The element of largest magnitude, with its sign. */
static float signed_max(const float *x, int n) {
    float a = 0, m = 0;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > a) {
            a = fabsf(x[i]);
            m = x[i];
        }
    return m;
}

/* ------------------------------------------------------- 32-element types */

/* q4_1 / q5_1: x ~ d*q + m over the block's range, q in [0, qmax]. */
static void q_min32(const float *x, uint8_t *b, int qmax, bool five) {
    float lo = x[0], hi = x[0];
    for (int j = 1; j < 32; j++) {
        lo = fminf(lo, x[j]);
        hi = fmaxf(hi, x[j]);
    }
    memset(b, 0, five ? 24 : 20);
    const float d = wr_f16(b, (hi - lo) / (float)qmax), m = wr_f16(b + 2, lo);
    uint8_t *qs = b + (five ? 8 : 4);
    uint32_t qh = 0;
    for (int j = 0; j < 32; j++) {
        const int q = d > 0 ? clampi(nearest((x[j] - m) / d), 0, qmax) : 0;
        qs[j % 16] |= (uint8_t)((q & 15) << (j < 16 ? 0 : 4));
        if (q > 15) qh |= 1u << j;
    }
    if (five) wr32(b + 4, qh);
}

static void q_q5_0(const float *x, uint8_t *b) {
    memset(b, 0, 22);
    const float d = wr_f16(b, signed_max(x, 32) / -16.0f);
    uint32_t qh = 0;
    for (int j = 0; j < 32; j++) {
        const int q = d != 0 ? clampi(nearest(x[j] / d) + 16, 0, 31) : 16;
        b[6 + j % 16] |= (uint8_t)((q & 15) << (j < 16 ? 0 : 4));
        if (q > 15) qh |= 1u << j;
    }
    wr32(b + 2, qh);
}

/* The index of the iq4_nl level nearest to v. */
static int iq4_code(float v) {
    int best = 0;
    float be = INFINITY;
    for (int i = 0; i < 16; i++) {
        const float e = fabsf(v - (float)pkv_iq4nl_values[i]);
        if (e < be) {
            be = e;
            best = i;
        }
    }
    return best;
}

/* 32 elements as iq4_nl nibbles (element j < 16 low nibble of qs[j]) at scale d. */
static void iq4_nibbles(const float *x, float d, uint8_t *qs) {
    for (int j = 0; j < 16; j++) {
        const int c0 = iq4_code(d != 0 ? x[j] / d : 0), c1 = iq4_code(d != 0 ? x[j + 16] / d : 0);
        qs[j] = (uint8_t)(c0 | c1 << 4);
    }
}

static void q_iq4_nl(const float *x, uint8_t *b) {
    const float d = wr_f16(b, signed_max(x, 32) / -127.0f);
    iq4_nibbles(x, d, b + 2);
}

/* ---------------------------------------------------------------- k-quants */

static void q_q2_k(const float *x, uint8_t *b) {
    float scale[16], mn[16], max_scale = 0, max_min = 0;
    for (int g = 0; g < 16; g++) {
        float lo = 0, hi = x[16 * g];
        for (int l = 0; l < 16; l++) {
            lo = fminf(lo, x[16 * g + l]);
            hi = fmaxf(hi, x[16 * g + l]);
        }
        scale[g] = (hi - lo) / 3.0f;
        mn[g] = -lo;
        max_scale = fmaxf(max_scale, scale[g]);
        max_min = fmaxf(max_min, mn[g]);
    }
    memset(b, 0, 84);
    const float d = wr_f16(b + 80, max_scale / 15.0f), dmin = wr_f16(b + 82, max_min / 15.0f);
    for (int g = 0; g < 16; g++) {
        const int ls = d > 0 ? clampi(nearest(scale[g] / d), 0, 15) : 0;
        const int lm = dmin > 0 ? clampi(nearest(mn[g] / dmin), 0, 15) : 0;
        b[g] = (uint8_t)(ls | lm << 4);
        const float ds = d * (float)ls, dm = dmin * (float)lm;
        for (int l = 0; l < 16; l++) {
            const int e = 16 * g + l, h = e / 128, j = (e / 32) % 4, i = e % 32;
            const int q = ds > 0 ? clampi(nearest((x[e] + dm) / ds), 0, 3) : 0;
            b[16 + 32 * h + i] |= (uint8_t)(q << (2 * j));
        }
    }
}

static void q_q3_k(const float *x, uint8_t *b) {
    float scale[16], ext = 0;
    for (int g = 0; g < 16; g++) {
        scale[g] = signed_max(x + 16 * g, 16) / -4.0f; /* the extreme element maps to q = -4 */
        if (fabsf(scale[g]) > fabsf(ext)) ext = scale[g];
    }
    memset(b, 0, 110);
    const float d = wr_f16(b + 108, ext / -32.0f);
    uint8_t *hm = b, *qs = b + 32, *sc = b + 96;
    for (int g = 0; g < 16; g++) {
        const int ls = d != 0 ? clampi(nearest(scale[g] / d), -32, 31) : 0;
        const int s6 = ls + 32;
        sc[g % 8] |= (uint8_t)((s6 & 15) << (4 * (g / 8)));
        sc[8 + g % 4] |= (uint8_t)((s6 >> 4) << (2 * (g / 4)));
        const float dl = d * (float)ls;
        for (int l = 0; l < 16; l++) {
            const int e = 16 * g + l, h = e / 128, j = (e / 32) % 4, i = e % 32;
            const int u = (dl != 0 ? clampi(nearest(x[e] / dl), -4, 3) : 0) + 4;
            qs[32 * h + i] |= (uint8_t)((u & 3) << (2 * j));
            if (u & 4) hm[i] |= (uint8_t)(1 << (4 * h + j));
        }
    }
}

static void q_iq4_xs(const float *x, uint8_t *b) {
    float scale[8], ext = 0;
    for (int ib = 0; ib < 8; ib++) {
        scale[ib] = signed_max(x + 32 * ib, 32) / -127.0f;
        if (fabsf(scale[ib]) > fabsf(ext)) ext = scale[ib];
    }
    memset(b, 0, 136);
    const float d = wr_f16(b, ext / -32.0f);
    unsigned sh = 0;
    for (int ib = 0; ib < 8; ib++) {
        const int ls = (d != 0 ? clampi(nearest(scale[ib] / d), -32, 31) : 0) + 32;
        b[4 + ib / 2] |= (uint8_t)((ls & 15) << (4 * (ib % 2)));
        sh |= (unsigned)(ls >> 4) << (2 * ib);
        iq4_nibbles(x + 32 * ib, d * (float)(ls - 32), b + 8 + 16 * ib);
    }
    wr16(b + 2, sh);
}

/* ------------------------------------------------------------------ ternary */

static int trit_of(float x, float id) { return clampi(nearest(x * id), -1, 1) + 1; }

/* A byte holding the base-3 digits v[0..n) (v[0] most significant, then scaled
 * to 5 digits) as the fixed-point fraction the decoder reads back. */
static uint8_t trits_byte(const int *v, int n) {
    unsigned q = 0;
    for (int i = 0; i < n; i++) q = q * 3 + (unsigned)v[i];
    for (int i = n; i < 5; i++) q *= 3;
    return (uint8_t)((q * 256 + 242) / 243);
}

static void q_tq1_0(const float *x, uint8_t *b) {
    const float d = wr_f16(b + 52, amax_of(x, 256)), id = d > 0 ? 1.0f / d : 0.0f;
    int v[5];
    for (int m = 0; m < 32; m++) {
        for (int n = 0; n < 5; n++) v[n] = trit_of(x[32 * n + m], id);
        b[m] = trits_byte(v, 5);
    }
    for (int m = 0; m < 16; m++) {
        for (int n = 0; n < 5; n++) v[n] = trit_of(x[160 + 16 * n + m], id);
        b[32 + m] = trits_byte(v, 5);
    }
    for (int j = 0; j < 4; j++) {
        for (int n = 0; n < 4; n++) v[n] = trit_of(x[240 + 4 * n + j], id);
        b[48 + j] = trits_byte(v, 4);
    }
}

static void q_tq2_0(const float *x, uint8_t *b) {
    memset(b, 0, 64);
    const float d = wr_f16(b + 64, amax_of(x, 256)), id = d > 0 ? 1.0f / d : 0.0f;
    for (int e = 0; e < 256; e++) {
        const int h = e / 128, l = (e / 32) % 4, m = e % 32;
        b[32 * h + m] |= (uint8_t)(trit_of(x[e], id) << (2 * l));
    }
}

/* --------------------------------------------------------------- grid search */

/* A grid (quant.h, pkv_iq_tables) for the search: entry i has k values (8 or 4),
 * value j being vals[code_j]; near maps every code (k fields of `bits` bits, each
 * a value index) to the entry nearest to that point: the point itself when it is
 * on the grid, else the entry at the least squared distance (found once, by
 * trying every entry). */
typedef struct {
    int n, k, bits, nvals;
    float vals[8];
    uint16_t *codes;
    int16_t *near;
} grid;

enum { G_IQ2XXS, G_IQ2XS, G_IQ2S, G_IQ3XXS, G_IQ3S, G_IQ1S, G_COUNT };
static grid g_grids[G_COUNT];
static uint16_t g_codes[256 + 512 + 1024 + 256 + 512 + 2048];
static int16_t g_near8[4][65536], g_near4[2][4096];
static pthread_once_t g_grid_once[G_COUNT] = {PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT,
                                              PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT};

static float grid_dist(const grid *g, unsigned a, unsigned b) {
    const unsigned mask = (1u << g->bits) - 1;
    float e2 = 0;
    for (int j = 0; j < g->k; j++) {
        const float e = g->vals[(a >> (g->bits * j)) & mask] - g->vals[(b >> (g->bits * j)) & mask];
        e2 += e * e;
    }
    return e2;
}

static void grid_init(int which) {
    const pkv_iq_tables *t = pkv_iq_tables_get();
    static const float v2[3] = {8, 25, 43}, v1[3] = {-1, 0, 1};
    static const float v3xxs[8] = {4, 12, 20, 28, 36, 44, 52, 62}, v3s[8] = {1, 3, 5, 7, 9, 11, 13, 15};
    static const struct {
        int n, k, nvals, codes_at, near8; /* near8: index into g_near8, else -1 - index into g_near4 */
        const float *vals;
    } spec[G_COUNT] = {
        {256, 8, 3, 0, 0, v2},     {512, 8, 3, 256, 1, v2},     {1024, 8, 3, 768, 2, v2},
        {256, 4, 8, 1792, -1, v3xxs}, {512, 4, 8, 2048, -2, v3s}, {2048, 8, 3, 2560, 3, v1},
    };
    grid *g = &g_grids[which];
    g->n = spec[which].n;
    g->k = spec[which].k;
    g->bits = g->k == 8 ? 2 : 3;
    g->nvals = spec[which].nvals;
    memcpy(g->vals, spec[which].vals, (size_t)g->nvals * sizeof(float));
    g->codes = g_codes + spec[which].codes_at;
    g->near = spec[which].near8 >= 0 ? g_near8[spec[which].near8] : g_near4[-1 - spec[which].near8];
    const uint64_t *e8 = which == G_IQ2XXS ? t->iq2xxs : which == G_IQ2XS ? t->iq2xs : which == G_IQ2S ? t->iq2s : t->iq1s;
    const uint32_t *e4 = which == G_IQ3XXS ? t->iq3xxs : t->iq3s;
    const unsigned ncodes = 1u << (g->k * g->bits), mask = (1u << g->bits) - 1;
    memset(g->near, 0xff, ncodes * sizeof(int16_t));
    for (int i = 0; i < g->n; i++) {
        unsigned c = 0;
        for (int j = 0; j < g->k; j++) {
            const int v = g->k == 8 ? (int)(int8_t)(e8[i] >> (8 * j)) : (int)((e4[i] >> (8 * j)) & 0xff);
            int vi = 0;
            while (vi < g->nvals - 1 && g->vals[vi] != (float)v) vi++;
            c |= (unsigned)vi << (g->bits * j);
        }
        g->codes[i] = (uint16_t)c;
        g->near[c] = (int16_t)i;
    }
    for (unsigned c = 0; c < ncodes; c++) {
        bool valid = true;
        for (int j = 0; j < g->k; j++) valid = valid && (int)((c >> (g->bits * j)) & mask) < g->nvals;
        if (!valid || g->near[c] >= 0) continue;
        float be = INFINITY;
        for (int i = 0; i < g->n; i++) {
            const float e = grid_dist(g, c, g->codes[i]);
            if (e < be) {
                be = e;
                g->near[c] = (int16_t)i;
            }
        }
    }
}

static void init_iq2xxs(void) { grid_init(G_IQ2XXS); }
static void init_iq2xs(void) { grid_init(G_IQ2XS); }
static void init_iq2s(void) { grid_init(G_IQ2S); }
static void init_iq3xxs(void) { grid_init(G_IQ3XXS); }
static void init_iq3s(void) { grid_init(G_IQ3S); }
static void init_iq1s(void) { grid_init(G_IQ1S); }

static const grid *grid_get(int which) {
    static void (*const init[G_COUNT])(void) = {init_iq2xxs, init_iq2xs, init_iq2s, init_iq3xxs, init_iq3s, init_iq1s};
    pthread_once(&g_grid_once[which], init[which]);
    return &g_grids[which];
}

static float grid_err(const grid *g, int i, const float *t) {
    const unsigned e = g->codes[i], mask = (1u << g->bits) - 1;
    float e2 = 0;
    for (int j = 0; j < g->k; j++) {
        const float d = t[j] - g->vals[(e >> (g->bits * j)) & mask];
        e2 += d * d;
    }
    return e2;
}

/* The entry for targets t[0..k): each value rounded to its nearest level gives a
 * point, and moving one value to its second-nearest level k more; of the
 * nearest entries of these points (the point itself when it is on the grid) the
 * one closest to t. Exact when the first point is on the grid; otherwise close,
 * not always the least-squares entry. *err gets its squared error. */
static int grid_nearest(const grid *g, const float *t, float *err) {
    unsigned c = 0;
    int second[8];
    for (int j = 0; j < g->k; j++) {
        int b1 = 0, b2 = -1;
        for (int v = 1; v < g->nvals; v++) {
            const float e = fabsf(t[j] - g->vals[v]);
            if (e < fabsf(t[j] - g->vals[b1])) {
                b2 = b1;
                b1 = v;
            } else if (b2 < 0 || e < fabsf(t[j] - g->vals[b2])) {
                b2 = v;
            }
        }
        c |= (unsigned)b1 << (g->bits * j);
        second[j] = b2;
    }
    int best = g->near[c];
    float be = grid_err(g, best, t);
    const unsigned mask = (1u << g->bits) - 1;
    for (int j = 0; j < g->k && be > 0; j++) {
        const unsigned cj = (c & ~(mask << (g->bits * j))) | (unsigned)second[j] << (g->bits * j);
        const int i = g->near[cj];
        const float e = grid_err(g, i, t);
        if (e < be) {
            be = e;
            best = i;
        }
    }
    if (err) *err = be;
    return best;
}

/* Signs of 8 values (bit j: x[j] < 0) and the magnitudes to match, t = x / db
 * with the sign taken out. With `even`, the count of negatives must be even (the
 * eighth sign is implied): the smallest magnitude then gets the wrong sign, and
 * its target becomes -|x| / db. */
static unsigned signs8(const float *x, float db, bool even, float *t) {
    unsigned s = 0;
    for (int j = 0; j < 8; j++)
        if (x[j] < 0) s |= 1u << j;
    if (even && (__builtin_popcount(s) & 1)) {
        int jm = 0;
        for (int j = 1; j < 8; j++)
            if (fabsf(x[j]) < fabsf(x[jm])) jm = j;
        s ^= 1u << jm;
    }
    for (int j = 0; j < 8; j++) t[j] = db > 0 ? (s >> j & 1 ? -x[j] : x[j]) / db : 0;
    return s;
}

/* iq2_xxs / iq3_xxs: one 4-bit scale per 32, db = d * (0.5 + ls) * unit. */
static int xxs_scale(float db_want, float d, float unit) {
    return d > 0 ? clampi(nearest(db_want / (d * unit) - 0.5f), 0, 15) : 0;
}

static void q_iq2_xxs(const float *x, uint8_t *b) {
    const grid *g = grid_get(G_IQ2XXS);
    float want[8], top = 0;
    for (int ib = 0; ib < 8; ib++) top = fmaxf(top, want[ib] = amax_of(x + 32 * ib, 32) / 43.0f);
    const float d = wr_f16(b, top / (15.5f * 0.25f));
    float t[8];
    for (int ib = 0; ib < 8; ib++) {
        const int ls = xxs_scale(want[ib], d, 0.25f);
        const float db = d * (0.5f + (float)ls) * 0.25f;
        uint32_t s32 = (uint32_t)ls << 28;
        for (int l = 0; l < 4; l++) {
            const unsigned s = signs8(x + 32 * ib + 8 * l, db, true, t);
            b[2 + 8 * ib + l] = (uint8_t)grid_nearest(g, t, NULL);
            s32 |= (s & 127u) << (7 * l);
        }
        wr32(b + 2 + 8 * ib + 4, s32);
    }
}

/* iq2_xs / iq2_s: a 4-bit scale per 16, db = d * (0.5 + ls) / 4. */
static void q_iq2_xs_s(const float *x, uint8_t *b, bool s_type) {
    const grid *g = grid_get(s_type ? G_IQ2S : G_IQ2XS);
    float want[16], top = 0;
    for (int h = 0; h < 16; h++) top = fmaxf(top, want[h] = amax_of(x + 16 * h, 16) / 43.0f);
    memset(b, 0, s_type ? 82 : 74);
    const float d = wr_f16(b, top / (15.5f * 0.25f));
    float t[8];
    for (int ib = 0; ib < 8; ib++) {
        int ls[2];
        for (int k = 0; k < 2; k++) ls[k] = xxs_scale(want[2 * ib + k], d, 0.25f);
        b[s_type ? 74 + ib : 66 + ib] = (uint8_t)(ls[0] | ls[1] << 4);
        for (int l = 0; l < 4; l++) {
            const float db = d * (0.5f + (float)ls[l / 2]) * 0.25f;
            const unsigned s = signs8(x + 32 * ib + 8 * l, db, !s_type, t);
            const unsigned idx = (unsigned)grid_nearest(g, t, NULL);
            if (s_type) {
                b[2 + 4 * ib + l] = (uint8_t)idx;
                b[34 + 4 * ib + l] = (uint8_t)s;
                b[66 + ib] |= (uint8_t)((idx >> 8) << (2 * l));
            } else {
                wr16(b + 2 + 2 * (4 * ib + l), idx | (s & 127u) << 9);
            }
        }
    }
}

static void q_iq3_xxs(const float *x, uint8_t *b) {
    const grid *g = grid_get(G_IQ3XXS);
    float want[8], top = 0;
    for (int ib = 0; ib < 8; ib++) top = fmaxf(top, want[ib] = amax_of(x + 32 * ib, 32) / 62.0f);
    const float d = wr_f16(b, top / (15.5f * 0.5f));
    float t[8];
    for (int ib = 0; ib < 8; ib++) {
        const int ls = xxs_scale(want[ib], d, 0.5f);
        const float db = d * (0.5f + (float)ls) * 0.5f;
        uint32_t s32 = (uint32_t)ls << 28;
        for (int l = 0; l < 4; l++) {
            const unsigned s = signs8(x + 32 * ib + 8 * l, db, true, t);
            b[2 + 8 * ib + 2 * l] = (uint8_t)grid_nearest(g, t, NULL);
            b[2 + 8 * ib + 2 * l + 1] = (uint8_t)grid_nearest(g, t + 4, NULL);
            s32 |= (s & 127u) << (7 * l);
        }
        wr32(b + 66 + 4 * ib, s32);
    }
}

static void q_iq3_s(const float *x, uint8_t *b) {
    const grid *g = grid_get(G_IQ3S);
    float want[8], top = 0;
    for (int ib = 0; ib < 8; ib++) top = fmaxf(top, want[ib] = amax_of(x + 32 * ib, 32) / 15.0f);
    memset(b, 0, 110);
    const float d = wr_f16(b, top / 31.0f);
    float t[8];
    for (int ib = 0; ib < 8; ib++) {
        const int sc = d > 0 ? clampi(nearest((want[ib] / d - 1.0f) * 0.5f), 0, 15) : 0;
        b[106 + ib / 2] |= (uint8_t)(sc << (4 * (ib % 2)));
        const float db = d * (float)(1 + 2 * sc);
        for (int l = 0; l < 4; l++) {
            b[74 + 4 * ib + l] = (uint8_t)signs8(x + 32 * ib + 8 * l, db, false, t);
            for (int k = 0; k < 2; k++) {
                const unsigned idx = (unsigned)grid_nearest(g, t + 4 * k, NULL);
                b[2 + 8 * ib + 2 * l + k] = (uint8_t)idx;
                b[66 + ib] |= (uint8_t)((idx >> 8) << (2 * l + k));
            }
        }
    }
}

/* iq1: 8 values x ~ dl * (v + delta), v on the grid, delta = +-1/8; returns the
 * entry and the squared error for the given delta. */
static int iq1_group(const grid *g, const float *x, float dl, float delta, float *err) {
    float t[8];
    for (int j = 0; j < 8; j++) t[j] = dl > 0 ? x[j] / dl - delta : 0;
    return grid_nearest(g, t, err);
}

static void q_iq1_s(const float *x, uint8_t *b) {
    const grid *g = grid_get(G_IQ1S);
    float want[8], top = 0;
    for (int ib = 0; ib < 8; ib++) top = fmaxf(top, want[ib] = amax_of(x + 32 * ib, 32) / 1.125f);
    const float d = wr_f16(b, top / 15.0f);
    for (int ib = 0; ib < 8; ib++) {
        const int s = d > 0 ? clampi(nearest((want[ib] / d - 1.0f) * 0.5f), 0, 7) : 0;
        const float dl = d * (float)(2 * s + 1);
        int idx[2][4];
        float err[2] = {0, 0};
        for (int neg = 0; neg < 2; neg++)
            for (int l = 0; l < 4; l++) {
                float e;
                idx[neg][l] = iq1_group(g, x + 32 * ib + 8 * l, dl, neg ? -0.125f : 0.125f, &e);
                err[neg] += e;
            }
        const int neg = err[1] < err[0];
        unsigned h = (unsigned)s << 12 | (unsigned)neg << 15;
        for (int l = 0; l < 4; l++) {
            b[2 + 4 * ib + l] = (uint8_t)idx[neg][l];
            h |= (unsigned)(idx[neg][l] >> 8) << (3 * l);
        }
        wr16(b + 34 + 2 * ib, h);
    }
}

static void q_iq1_m(const float *x, uint8_t *b) {
    const grid *g = grid_get(G_IQ1S);
    float want[16], top = 0;
    for (int h = 0; h < 16; h++) top = fmaxf(top, want[h] = amax_of(x + 16 * h, 16) / 1.125f);
    memset(b, 0, 56);
    const uint16_t dh = pkv_f32_to_f16(top / 15.0f);
    const float d = pkv_f16_to_f32(dh);
    unsigned sc[4] = {0, 0, 0, 0};
    for (int h = 0; h < 16; h++) {
        const int s = d > 0 ? clampi(nearest((want[h] / d - 1.0f) * 0.5f), 0, 7) : 0;
        const int ib = h / 2;
        sc[ib / 2] |= (unsigned)s << (6 * (ib % 2) + 3 * (h % 2));
        const float dl = d * (float)(2 * s + 1);
        for (int k = 0; k < 2; k++) { /* the two groups of 8 of this 16 */
            const int l = 2 * (h % 2) + k;
            float e0, e1;
            const int i0 = iq1_group(g, x + 16 * h + 8 * k, dl, 0.125f, &e0);
            const int i1 = iq1_group(g, x + 16 * h + 8 * k, dl, -0.125f, &e1);
            const int neg = e1 < e0, idx = neg ? i1 : i0;
            b[4 * ib + l] = (uint8_t)idx;
            b[32 + 2 * ib + l / 2] |= (uint8_t)(((unsigned)(idx >> 8) | (unsigned)neg << 3) << (4 * (l % 2)));
        }
    }
    for (int i = 0; i < 4; i++) wr16(b + 48 + 2 * i, sc[i] | (unsigned)((dh >> (4 * i)) & 15) << 12);
}

bool pkv_quantize_block_int(pkv_type t, const float *x, uint8_t *b) {
    switch (t) {
    case PKV_TYPE_Q4_1: q_min32(x, b, 15, false); return true;
    case PKV_TYPE_Q5_0: q_q5_0(x, b); return true;
    case PKV_TYPE_Q5_1: q_min32(x, b, 31, true); return true;
    case PKV_TYPE_Q2_K: q_q2_k(x, b); return true;
    case PKV_TYPE_Q3_K: q_q3_k(x, b); return true;
    case PKV_TYPE_IQ2_XXS: q_iq2_xxs(x, b); return true;
    case PKV_TYPE_IQ2_XS: q_iq2_xs_s(x, b, false); return true;
    case PKV_TYPE_IQ2_S: q_iq2_xs_s(x, b, true); return true;
    case PKV_TYPE_IQ3_XXS: q_iq3_xxs(x, b); return true;
    case PKV_TYPE_IQ3_S: q_iq3_s(x, b); return true;
    case PKV_TYPE_IQ1_S: q_iq1_s(x, b); return true;
    case PKV_TYPE_IQ1_M: q_iq1_m(x, b); return true;
    case PKV_TYPE_IQ4_NL: q_iq4_nl(x, b); return true;
    case PKV_TYPE_IQ4_XS: q_iq4_xs(x, b); return true;
    case PKV_TYPE_TQ1_0: q_tq1_0(x, b); return true;
    case PKV_TYPE_TQ2_0: q_tq2_0(x, b); return true;
    default: return false;
    }
}
