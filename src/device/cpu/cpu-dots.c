/* The generic (plain C) row dot products; correct on every CPU. Sums use eight
 * float lanes so the compiler can vectorize them with whatever the baseline ISA
 * offers. */
#include "device/cpu/cpu-dots.h"

#include "base/quant.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

/* f16 -> f32 through a table: the bit-twiddling conversion is too slow for
 * inner loops on CPUs without F16C. */
static float g_f16_table[65536];
static pthread_once_t g_f16_once = PTHREAD_ONCE_INIT;
static void f16_table_init(void) {
    for (uint32_t i = 0; i < 65536; i++) g_f16_table[i] = pkv_f16_to_f32((uint16_t)i);
}
static const float *f16_table(void) {
    pthread_once(&g_f16_once, f16_table_init);
    return g_f16_table;
}

void pkv_cpu_q8s(const pkv_q8a *x, pkv_q8s *s, int64_t nsb) {
    for (int64_t i = 0; i < nsb; i++, x += 8, s++)
        for (int k = 0; k < 8; k++) {
            s->d[k] = x[k].d;
            s->ds[k] = x[k].ds;
            s->s[2 * k] = x[k].s[0];
            s->s[2 * k + 1] = x[k].s[1];
            memcpy(s->qs + 32 * k, x[k].qs, 32);
        }
}

void pkv_cpu_quantize_q8a(const float *x, pkv_q8a *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++) {
        const float *xb = x + 32 * b;
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(xb[j]));
        const float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
        y[b].d = d;
        int sum[2] = {0, 0};
        for (int j = 0; j < 32; j++) {
            long q = lrintf(xb[j] * id);
            q = q > 127 ? 127 : q < -127 ? -127 : q;
            y[b].qs[j] = (int8_t)q;
            sum[j / 16] += (int)q;
        }
        y[b].s[0] = (int16_t)sum[0];
        y[b].s[1] = (int16_t)sum[1];
        y[b].ds = d * (float)(sum[0] + sum[1]);
    }
}

static float g_f32(const float *w, const float *x, int64_t n) {
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += w[i + l] * x[i + l];
    float s = 0;
    for (; i < n; i++) s += w[i] * x[i];
    for (int l = 0; l < 8; l++) s += acc[l];
    return s;
}

static float g_f16(const uint16_t *w, const float *x, int64_t n) {
    const float *t = f16_table();
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += t[w[i + l]] * x[i + l];
    float s = 0;
    for (; i < n; i++) s += t[w[i]] * x[i];
    for (int l = 0; l < 8; l++) s += acc[l];
    return s;
}

static float bf(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static float g_bf16(const uint16_t *w, const float *x, int64_t n) {
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += bf(w[i + l]) * x[i + l];
    float s = 0;
    for (; i < n; i++) s += bf(w[i]) * x[i];
    for (int l = 0; l < 8; l++) s += acc[l];
    return s;
}

static float rd_f16(const uint8_t *p) { return pkv_f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }

static float g1_q8_0(const uint8_t *w, const pkv_q8a *x, int64_t nb) {
    float s = 0;
    for (int64_t b = 0; b < nb; b++, w += 34) {
        int sum = 0;
        for (int j = 0; j < 32; j++) sum += (int8_t)w[2 + j] * x[b].qs[j];
        s += (float)sum * (rd_f16(w) * x[b].d);
    }
    return s;
}

static float g1_q4_0(const uint8_t *w, const pkv_q8a *x, int64_t nb) {
    float s = 0;
    for (int64_t b = 0; b < nb; b++, w += 18) {
        int sum = 0; /* sum of q*x with q unsigned; the -8 offset comes from the block sums */
        for (int j = 0; j < 16; j++) sum += (w[2 + j] & 15) * x[b].qs[j] + (w[2 + j] >> 4) * x[b].qs[j + 16];
        sum -= 8 * (x[b].s[0] + x[b].s[1]);
        s += (float)sum * (rd_f16(w) * x[b].d);
    }
    return s;
}

/* mxfp4: the block's dot in integers (the doubled E2M1 values times the 8-bit
 * activations, exact), scaled once by 2^(e - 128) * dx. */
static float g1_mxfp4(const uint8_t *w, const pkv_q8a *x, int64_t nb) {
    float s = 0;
    for (int64_t b = 0; b < nb; b++, w += 17) {
        int sum = 0;
        for (int j = 0; j < 16; j++)
            sum += pkv_mxfp4_kvalues[w[1 + j] & 15] * x[b].qs[j] + pkv_mxfp4_kvalues[w[1 + j] >> 4] * x[b].qs[j + 16];
        s += (float)sum * (pkv_e8m0_half(w[0]) * x[b].d);
    }
    return s;
}

/* The 6-bit scale and min of sub-block j of a q4_k/q5_k super-block. */
static void scale_min(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 15) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

void pkv_cpu_repack_q4_k(const uint8_t *w, size_t rb, int64_t nb, pkv_q4kr *dst) {
    for (int64_t b = 0; b < nb; b++, dst++)
        for (int i = 0; i < PKV_Q4KR_ROWS; i++) {
            const uint8_t *blk = w + (size_t)i * rb + (size_t)b * 144;
            dst->d[i] = rd_f16(blk);
            dst->dmin[i] = rd_f16(blk + 2);
            for (int k = 0; k < 8; k++) {
                int sc, m;
                scale_min(k, blk + 4, &sc, &m);
                dst->sc[k][i] = (uint8_t)sc;
                dst->m[k][i] = (uint8_t)m;
            }
            for (int g = 0; g < 4; g++)
                for (int c = 0; c < 8; c++) memcpy(&dst->qs[g][c][4 * i], blk + 16 + 32 * g + 4 * c, 4);
        }
}

/* q4_k / q5_k: sub-block j (32 elements) lines up with activation block j:
 * sum over it of (d*sc*q - dmin*m) * x = dx * (d*sc*sum(q*qx) - dmin*m*sum(qx)). */
static float g_kmin(const uint8_t *w, const pkv_q8a *x, int64_t nb, bool five) {
    float s = 0;
    for (int64_t b = 0; b < nb; b++, w += five ? 176 : 144, x += 8) {
        const float d = rd_f16(w), dmin = rd_f16(w + 2);
        const uint8_t *qh = w + 16, *qs = five ? w + 48 : w + 16;
        for (int j = 0; j < 8; j++) {
            int sc, m, sum = 0;
            scale_min(j, w + 4, &sc, &m);
            const uint8_t *q = qs + 32 * (j / 2);
            const int shift = 4 * (j & 1), hi = five ? 1 : 0; /* branch-free inner loop */
            for (int l = 0; l < 32; l++) {
                const int v = ((q[l] >> shift) & 15) + ((((qh[l] >> j) & 1) * hi) << 4);
                sum += v * x[j].qs[l];
            }
            s += x[j].d * (d * (float)sc * (float)sum - dmin * (float)m * (float)(x[j].s[0] + x[j].s[1]));
        }
    }
    return s;
}

static float g1_q4_k(const uint8_t *w, const pkv_q8a *x, int64_t nb) { return g_kmin(w, x, nb, false); }
static float g1_q5_k(const uint8_t *w, const pkv_q8a *x, int64_t nb) { return g_kmin(w, x, nb, true); }

/* q6_k: activation block 4h + k holds the elements of quarter k of half h; its
 * two 16-element halves have scales sc[8h + 2k] and sc[8h + 2k + 1]. */
static float g1_q6_k(const uint8_t *w, const pkv_q8a *x, int64_t nb) {
    float s = 0;
    for (int64_t b = 0; b < nb; b++, w += 210, x += 8) {
        const float d = rd_f16(w + 208);
        const int8_t *sc = (const int8_t *)(w + 192);
        for (int h = 0; h < 2; h++)
            for (int k = 0; k < 4; k++) {
                const uint8_t *ql = w + 64 * h + 32 * (k & 1), *qh = w + 128 + 32 * h;
                const pkv_q8a *xb = &x[4 * h + k];
                const int lshift = k < 2 ? 0 : 4, hshift = 2 * k; /* branch-free inner loops */
                int sum0 = 0, sum1 = 0;
                for (int l = 0; l < 16; l++)
                    sum0 += (((ql[l] >> lshift) & 15) | ((qh[l] >> hshift) & 3) << 4) * xb->qs[l];
                for (int l = 16; l < 32; l++)
                    sum1 += (((ql[l] >> lshift) & 15) | ((qh[l] >> hshift) & 3) << 4) * xb->qs[l];
                const int s0 = sc[8 * h + 2 * k], s1 = sc[8 * h + 2 * k + 1];
                const int isum = s0 * (sum0 - 32 * xb->s[0]) + s1 * (sum1 - 32 * xb->s[1]);
                s += d * xb->d * (float)isum;
            }
    }
    return s;
}

/* The types with an integer form (quant.h, pkv_qblock): each block decoded once
 * per call and row group, then per 32 elements (one activation block) and row
 * sum over each 16 of (d*q + m) * dx*qx = dx * (d * sum(q*qx) + m * sum(qx)). */
static void g_dec(pkv_type t, const uint8_t *w, const pkv_q8a *x, int64_t xs, int64_t nb, int nx, float *out) {
    const pkv_qblock_fn dec = pkv_qblock_decoder(t);
    const bool has_min = pkv_qblock_has_min(t);
    const size_t bb = pkv_type_block_bytes(t);
    const int nsub = (int)pkv_type_block_elems(t) / 32;
    float acc[PKV_QDOT_NX] = {0};
    pkv_qblock o;
    for (int64_t b = 0; b < nb; b++) {
        dec(w + (size_t)b * bb, &o);
        for (int j = 0; j < nsub; j++) {
            const int8_t *q = o.q + 32 * j;
            for (int r = 0; r < nx; r++) {
                const pkv_q8a *xb = x + r * xs + b * nsub + j;
                int s0 = 0, s1 = 0;
                for (int l = 0; l < 16; l++) {
                    s0 += q[l] * xb->qs[l];
                    s1 += q[l + 16] * xb->qs[l + 16];
                }
                float v = o.d[2 * j] * (float)s0 + o.d[2 * j + 1] * (float)s1;
                if (has_min) v += o.m[2 * j] * (float)xb->s[0] + o.m[2 * j + 1] * (float)xb->s[1];
                acc[r] += xb->d * v;
            }
        }
    }
    for (int r = 0; r < nx; r++) out[r] = acc[r];
}

#define DEC(n, T)                                                                                   \
    static void gd_##n(const uint8_t *w, const pkv_q8a *x, int64_t xs, int64_t nb, int nx, float *out) { \
        g_dec(T, w, x, xs, nb, nx, out);                                                            \
    }
DEC(q4_1, PKV_TYPE_Q4_1)
DEC(q5_0, PKV_TYPE_Q5_0)
DEC(q5_1, PKV_TYPE_Q5_1)
DEC(q2_k, PKV_TYPE_Q2_K)
DEC(q3_k, PKV_TYPE_Q3_K)
DEC(iq2_xxs, PKV_TYPE_IQ2_XXS)
DEC(iq2_xs, PKV_TYPE_IQ2_XS)
DEC(iq2_s, PKV_TYPE_IQ2_S)
DEC(iq3_xxs, PKV_TYPE_IQ3_XXS)
DEC(iq3_s, PKV_TYPE_IQ3_S)
DEC(iq1_s, PKV_TYPE_IQ1_S)
DEC(iq1_m, PKV_TYPE_IQ1_M)
DEC(iq4_nl, PKV_TYPE_IQ4_NL)
DEC(iq4_xs, PKV_TYPE_IQ4_XS)
DEC(tq1_0, PKV_TYPE_TQ1_0)
DEC(tq2_0, PKV_TYPE_TQ2_0)
#undef DEC

#define MULTI(n)                                                                               \
    static void g_##n(const uint8_t *w, const pkv_q8a *x, int64_t xs, int64_t nb, int nx, float *out) { \
        for (int r = 0; r < nx; r++) out[r] = g1_##n(w, x + r * xs, nb);                             \
    }
MULTI(q8_0)
MULTI(q4_0)
MULTI(q4_k)
MULTI(q5_k)
MULTI(q6_k)
MULTI(mxfp4)
#undef MULTI

static void g_f32x(const float *w, const float *x, int64_t xs, int64_t n, int nx, float *out) {
    for (int r = 0; r < nx; r++) out[r] = g_f32(w, x + r * xs, n);
}
static void g_f16x(const uint16_t *w, const float *x, int64_t xs, int64_t n, int nx, float *out) {
    for (int r = 0; r < nx; r++) out[r] = g_f16(w, x + r * xs, n);
}
static void g_bf16x(const uint16_t *w, const float *x, int64_t xs, int64_t n, int nx, float *out) {
    for (int r = 0; r < nx; r++) out[r] = g_bf16(w, x + r * xs, n);
}

/* The scan's rows one at a time, the sum over n in order. */
static void g_scan(float *S, int nr, int ds, float decay, const float *dx, const float *B, const float *C, float *o) {
    for (int r = 0; r < nr; r++) {
        float *row = S + (size_t)r * ds, acc = 0.0f;
        for (int n = 0; n < ds; n++) {
            const float sv = row[n] * decay + dx[r] * B[n];
            row[n] = sv;
            acc += sv * C[n];
        }
        o[r] = acc;
    }
}

const pkv_cpu_dots pkv_cpu_dots_generic = {
    .name = "generic",
    .f32x = g_f32x,
    .f16x = g_f16x,
    .bf16x = g_bf16x,
    .q8_0 = g_q8_0,
    .q4_0 = g_q4_0,
    .q4_k = g_q4_k,
    .q5_k = g_q5_k,
    .q6_k = g_q6_k,
    .mxfp4 = g_mxfp4,
    .more = {[PKV_TYPE_Q4_1] = gd_q4_1,       [PKV_TYPE_Q5_0] = gd_q5_0,       [PKV_TYPE_Q5_1] = gd_q5_1,
             [PKV_TYPE_Q2_K] = gd_q2_k,       [PKV_TYPE_Q3_K] = gd_q3_k,       [PKV_TYPE_IQ2_XXS] = gd_iq2_xxs,
             [PKV_TYPE_IQ2_XS] = gd_iq2_xs,   [PKV_TYPE_IQ2_S] = gd_iq2_s,     [PKV_TYPE_IQ3_XXS] = gd_iq3_xxs,
             [PKV_TYPE_IQ3_S] = gd_iq3_s,     [PKV_TYPE_IQ1_S] = gd_iq1_s,     [PKV_TYPE_IQ1_M] = gd_iq1_m,
             [PKV_TYPE_IQ4_NL] = gd_iq4_nl,   [PKV_TYPE_IQ4_XS] = gd_iq4_xs,   [PKV_TYPE_TQ1_0] = gd_tq1_0,
             [PKV_TYPE_TQ2_0] = gd_tq2_0},
    .slow = PKV_QDOT_MORE_TYPES,
    .q8a = pkv_cpu_quantize_q8a,
    .scan = g_scan,
};
