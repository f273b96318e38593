/* 64-bit ARM row dot products: three tables, chosen at run time (cpu-kernels.c):
 *   neon     ARMv8.0 Advanced SIMD, on every aarch64 CPU: byte dots by widening
 *            multiplies (SMULL/SMLAL2) and pairwise adds (SADALP);
 *   dotprod  the same with SDOT (ARMv8.2 FEAT_DotProd, HWCAP_ASIMDDP);
 *   i8mm     dotprod plus SMMLA (ARMv8.6 FEAT_I8MM, HWCAP2_I8MM) for two weight
 *            rows against two activation rows at a time (pkv_cpu_dots.pair).
 * The dotprod and i8mm functions are compiled with target attributes, so the
 * library itself stays ARMv8.0 and runs on any aarch64 CPU. (GCC 12's arm_neon.h
 * declares SDOT and SMMLA for armv8.2-a plus the extension, so the attributes
 * name armv8.2-a too: every CPU with SDOT is ARMv8.2 or later.)
 *
 * The quantized dots are written once (cpu-neon-body.h) over a per-type block
 * decoder (below): each 32-element unit of a weight row becomes 32 signed bytes
 * and a float scale (per unit, or per 16 for the types whose scales are per 16),
 * and an offset where the type has one. The byte dot of a unit with its
 * activation block is summed to exact int32 totals before any float operation,
 * so the three paths, whatever instructions form the totals, give the same bits;
 * a row's float operations depend only on its own unit count, never on nx, the
 * pairing of rows or the thread split (batch invariance). */
#include "device/cpu/cpu-dots.h"

#include "base/quant.h"

#ifdef PKV_CPU_ARM
#include <arm_neon.h>
#include <math.h>
#include <string.h>

#define AI __attribute__((always_inline)) static inline

/* ------------------------------------------------------------ float rows */

AI float32x4_t ld_f16(const uint16_t *p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }
AI float32x4_t ld_bf16(const uint16_t *p) { return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16)); }

/* kind 0 f32, 1 f16, 2 bf16: four weights from element i */
AI float32x4_t ldw(const void *w, int kind, int64_t i) {
    if (kind == 0) return vld1q_f32((const float *)w + i);
    if (kind == 1) return ld_f16((const uint16_t *)w + i);
    return ld_bf16((const uint16_t *)w + i);
}

AI float w_at(const void *w, int kind, int64_t i) {
    if (kind == 0) return ((const float *)w)[i];
    if (kind == 1) return pkv_f16_to_f32(((const uint16_t *)w)[i]);
    const uint32_t u = (uint32_t)((const uint16_t *)w)[i] << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The matmul's register tile (cpu-dots.h, f32t): NW weight rows x NX x rows, one
 * 4-lane accumulator per pair; lane l sums the products of elements 4k + l in k
 * order (FMA), then the lanes are added (FADDP, a fixed order) and the tail
 * elements in order with fmaf. A pair gets exactly these operations in every
 * tile shape. 4 x 4 uses 16 accumulators of the 32 registers. */
AI void ftile(const void *w, int kind, int64_t ws, const float *x, int64_t xs, int64_t n, const int NW, const int NX,
              float *y, int64_t ys) {
    float32x4_t a[16];
    for (int k = 0; k < NW * NX; k++) a[k] = vdupq_n_f32(0);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        float32x4_t wv[4];
        for (int q = 0; q < NW; q++) wv[q] = ldw(w, kind, q * ws + i);
        for (int r = 0; r < NX; r++) {
            const float32x4_t xv = vld1q_f32(x + r * xs + i);
            for (int q = 0; q < NW; q++) a[r * NW + q] = vfmaq_f32(a[r * NW + q], wv[q], xv);
        }
    }
    for (int r = 0; r < NX; r++)
        for (int q = 0; q < NW; q++) {
            float s = vaddvq_f32(a[r * NW + q]);
            for (int64_t k = i; k < n; k++) s = fmaf(w_at(w, kind, q * ws + k), x[r * xs + k], s);
            y[r * ys + q] = s;
        }
}

#define TILE_FN(name, WT, kind)                                                                                       \
    static void name(const WT *w, int64_t ws, int nw, const float *x, int64_t xs, int nx, int64_t n, float *y,       \
                     int64_t ys) {                                                                                   \
        if (nw == 4 && nx == 4)                                                                                      \
            ftile(w, kind, ws, x, xs, n, 4, 4, y, ys);                                                               \
        else if (nw == 4)                                                                                            \
            for (int r = 0; r < nx; r++) ftile(w, kind, ws, x + r * xs, xs, n, 4, 1, y + r * ys, ys);                \
        else if (nx == 4)                                                                                            \
            for (int q = 0; q < nw; q++) ftile(w + q * ws, kind, ws, x, xs, n, 1, 4, y + q, ys);                     \
        else                                                                                                         \
            for (int q = 0; q < nw; q++)                                                                             \
                for (int r = 0; r < nx; r++) ftile(w + q * ws, kind, ws, x + r * xs, xs, n, 1, 1, y + r * ys + q, ys); \
    }
TILE_FN(n_f32t, float, 0)
TILE_FN(n_f16t, uint16_t, 1)
TILE_FN(n_bf16t, uint16_t, 2)
#undef TILE_FN

/* One weight row against nx x rows (out[r]): the tile with one weight row. */
static void n_f32x(const float *w, const float *x, int64_t xs, int64_t n, int nx, float *out) {
    n_f32t(w, 0, 1, x, xs, nx, n, out, 1);
}
static void n_f16x(const uint16_t *w, const float *x, int64_t xs, int64_t n, int nx, float *out) {
    n_f16t(w, 0, 1, x, xs, nx, n, out, 1);
}
static void n_bf16x(const uint16_t *w, const float *x, int64_t xs, int64_t n, int nx, float *out) {
    n_bf16t(w, 0, 1, x, xs, nx, n, out, 1);
}

/* Mamba-2's scan (cpu-dots.h, scan), NR rows at a time sharing the loads of B and C:
 * lane l of a row's accumulator sums the elements 4k + l in k order, then FADDP,
 * then the tail elements in order with fmaf; a row gets these operations for every NR. */
AI void scan_rows(float *S, int ds, float decay, const float *dx, const float *B, const float *C, const int NR,
                  float *o) {
    float32x4_t acc[4], dxv[4];
    for (int r = 0; r < NR; r++) {
        acc[r] = vdupq_n_f32(0);
        dxv[r] = vdupq_n_f32(dx[r]);
    }
    int n = 0;
    for (; n + 4 <= ds; n += 4) {
        const float32x4_t b = vld1q_f32(B + n), c = vld1q_f32(C + n);
        for (int r = 0; r < NR; r++) {
            float *p = S + (size_t)r * ds + n;
            const float32x4_t sv = vfmaq_n_f32(vmulq_f32(dxv[r], b), vld1q_f32(p), decay);
            vst1q_f32(p, sv);
            acc[r] = vfmaq_f32(acc[r], sv, c);
        }
    }
    for (int r = 0; r < NR; r++) {
        float *row = S + (size_t)r * ds, sum = vaddvq_f32(acc[r]);
        for (int k = n; k < ds; k++) {
            row[k] = fmaf(row[k], decay, dx[r] * B[k]);
            sum = fmaf(row[k], C[k], sum);
        }
        o[r] = sum;
    }
}

static void n_scan(float *S, int nr, int ds, float decay, const float *dx, const float *B, const float *C, float *o) {
    int r = 0;
    for (; r + 4 <= nr; r += 4) scan_rows(S + (size_t)r * ds, ds, decay, dx + r, B, C, 4, o + r);
    for (; r < nr; r++) scan_rows(S + (size_t)r * ds, ds, decay, dx + r, B, C, 1, o + r);
}

/* f16 <-> f32 rows: FCVTL is exact; FCVTN rounds to nearest even (the default
 * FPCR mode) and keeps a NaN's top payload bits, quieted, as pkv_f32_to_f16. */
static void n_f16row(const uint16_t *src, float *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(dst + i, ld_f16(src + i));
    for (; i < n; i++) dst[i] = pkv_f16_to_f32(src[i]);
}
static void n_f32f16row(const float *src, uint16_t *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1_u16(dst + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(src + i))));
    for (; i < n; i++) dst[i] = pkv_f32_to_f16(src[i]);
}

/* pkv_cpu_quantize_q8a with the same float operations: amax (FMAXNM ignores NaN
 * as fmaxf does), d = amax/127, id = 1/d, q = x*id rounded to nearest even
 * (FCVTNS, as lrintf), clamped to [-127, 127]. */
static void n_q8a(const float *x, pkv_q8a *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, x += 32) {
        float32x4_t v[8];
        for (int k = 0; k < 8; k++) v[k] = vld1q_f32(x + 4 * k);
        float32x4_t m = vabsq_f32(v[0]);
        for (int k = 1; k < 8; k++) m = vmaxnmq_f32(m, vabsq_f32(v[k]));
        const float amax = vmaxnmvq_f32(m), d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
        int32x4_t q[8];
        for (int k = 0; k < 8; k++)
            q[k] = vmaxq_s32(vminq_s32(vcvtnq_s32_f32(vmulq_n_f32(v[k], id)), vdupq_n_s32(127)), vdupq_n_s32(-127));
        const int s0 = vaddvq_s32(vaddq_s32(vaddq_s32(q[0], q[1]), vaddq_s32(q[2], q[3])));
        const int s1 = vaddvq_s32(vaddq_s32(vaddq_s32(q[4], q[5]), vaddq_s32(q[6], q[7])));
        y[b].d = d;
        y[b].s[0] = (int16_t)s0;
        y[b].s[1] = (int16_t)s1;
        y[b].ds = d * (float)(s0 + s1);
        for (int h = 0; h < 2; h++) {
            const int16x8_t lo = vcombine_s16(vmovn_s32(q[4 * h]), vmovn_s32(q[4 * h + 1]));
            const int16x8_t hi = vcombine_s16(vmovn_s32(q[4 * h + 2]), vmovn_s32(q[4 * h + 3]));
            vst1q_s8(y[b].qs + 16 * h, vcombine_s8(vmovn_s16(lo), vmovn_s16(hi)));
        }
    }
}

/* ------------------------------------------------- quantized weight blocks */

/* The weight types of the quantized dots (cpu-neon-body.h). */
enum {
    K_Q8_0, K_Q4_0, K_Q5_0, K_Q4_1, K_Q5_1, K_MXFP4, K_IQ4_NL, /* 32-element blocks */
    K_Q4_K, K_Q5_K, K_IQ4_XS, K_IQ3_S,                           /* 256, a scale per 32 */
    K_Q6_K, K_Q3_K, K_Q2_K,                                      /* 256, a scale per 16 */
    K_DEC                                                        /* pkv_qblock decoding */
};

/* Units (32 elements) per block, and block bytes (K_DEC: the state's). */
AI int k_nsub(int K) { return K <= K_IQ4_NL ? 1 : 8; }
AI size_t k_bytes(int K) {
    static const uint8_t b32[] = {34, 18, 22, 20, 24, 17, 18};
    static const uint8_t b256[] = {144, 176, 136, 110, 210, 110, 84};
    return K <= K_IQ4_NL ? b32[K] : K < K_DEC ? b256[K - K_Q4_K] : 0;
}
/* Scales per 16 elements (lanes are half-units) rather than per 32. */
AI bool k_halves(int K) { return K >= K_Q6_K; }
/* Offsets: 1 one per unit (times the activation block's d * sum), 2 one per 16. */
AI int k_mins(int K) {
    return K == K_Q4_1 || K == K_Q5_1 || K == K_Q4_K || K == K_Q5_K ? 1 : K == K_Q2_K ? 2 : 0;
}

/* A group of units, one per float lane (4 units; 2 units = 4 halves for
 * k_halves types), as signed bytes with their scales and offsets. Lanes past
 * the row's last unit have zero scales and are never dotted. */
typedef struct {
    int8x16_t q[4][2]; /* [unit][elements 0-15, 16-31] */
    float32x4_t ws;    /* scale per lane */
    float32x4_t wm;    /* offset per lane (k_mins) */
} nq_group;

/* Per-row decoding state that outlives a group: the decoded block (K_DEC). */
typedef struct {
    pkv_qblock_fn dec; /* K_DEC: the type's decoder and block bytes */
    size_t bb;
    pkv_qblock o;
} nq_state;

/* An f16 scale (FCVT: exact, as pkv_f16_to_f32) */
AI float half_at(const uint8_t *p) {
    __fp16 h;
    memcpy(&h, p, 2);
    return (float)h;
}

/* 32 bits as 32 byte masks (0xff where the bit is set): lo for bits 0-15. */
AI void bits32(const uint8_t *p, uint8x16_t *lo, uint8x16_t *hi) {
    static const uint8_t sel_lo[16] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1};
    static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    uint32_t v;
    memcpy(&v, p, 4);
    const uint8x16_t b = vreinterpretq_u8_u32(vdupq_n_u32(v)), m = vld1q_u8(bit), s = vld1q_u8(sel_lo);
    *lo = vtstq_u8(vqtbl1q_u8(b, s), m);
    *hi = vtstq_u8(vqtbl1q_u8(b, vaddq_u8(s, vdupq_n_u8(2))), m);
}

AI float32x4_t f4(float a, float b, float c, float d) {
    const float v[4] = {a, b, c, d};
    return vld1q_f32(v);
}

/* The 6-bit scales and mins of a q4_k/q5_k block (12 bytes at p), units j0..j0+3
 * (j0 0 or 4), as floats: the same bytes as cpu-dots.c's scale_min. */
AI void kmin_scales(const uint8_t *p, int j0, float32x4_t *sc, float32x4_t *mn) {
    uint32_t u[3];
    memcpy(u, p, 12);
    uint32_t s, m;
    if (j0 == 0) {
        s = u[0] & 0x3f3f3f3fu;
        m = u[1] & 0x3f3f3f3fu;
    } else {
        s = (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4);
        m = ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4);
    }
    *sc = vcvtq_f32_u32(vmovl_u16(vget_low_u16(vmovl_u8(vreinterpret_u8_u32(vdup_n_u32(s))))));
    *mn = vcvtq_f32_u32(vmovl_u16(vget_low_u16(vmovl_u8(vreinterpret_u8_u32(vdup_n_u32(m))))));
}

/* Decode units u0 .. u0 + nu - 1 (nu <= 4, or <= 2 for k_halves; one block for
 * the 256-element types) of the weight row w. Groups come in order, so K_DEC
 * decodes a block when its first unit comes. */
AI void nq_decode(int K, const uint8_t *w, int64_t u0, int nu, nq_group *g, nq_state *st) {
    const uint8x16_t m4 = vdupq_n_u8(15);
    for (int k = 0; k < 4; k++) g->q[k][0] = g->q[k][1] = vdupq_n_s8(0); /* dead stores but in a short group */
    g->wm = vdupq_n_f32(0);
    if (k_nsub(K) == 1) {
        float32x4_t ws = vdupq_n_f32(0), wm = ws;
        for (int k = 0; k < 4; k++) { /* k a constant once unrolled: a lane number */
            if (k >= nu) break;
            float d, mm = 0;
            const uint8_t *p = w + (size_t)(u0 + k) * k_bytes(K);
            int8x16_t L, H;
            if (K == K_Q8_0) {
                d = half_at(p);
                L = vld1q_s8((const int8_t *)p + 2);
                H = vld1q_s8((const int8_t *)p + 18);
            } else if (K == K_Q4_0 || K == K_Q4_1) {
                const uint8_t *qs = p + (K == K_Q4_0 ? 2 : 4);
                const uint8x16_t raw = vld1q_u8(qs);
                L = vreinterpretq_s8_u8(vandq_u8(raw, m4));
                H = vreinterpretq_s8_u8(vshrq_n_u8(raw, 4));
                if (K == K_Q4_0) {
                    L = vsubq_s8(L, vdupq_n_s8(8));
                    H = vsubq_s8(H, vdupq_n_s8(8));
                }
                d = half_at(p);
                if (K == K_Q4_1) mm = half_at(p + 2);
            } else if (K == K_Q5_0 || K == K_Q5_1) {
                const uint8_t *qh = p + (K == K_Q5_0 ? 2 : 4);
                const uint8x16_t raw = vld1q_u8(qh + 4), b4 = vdupq_n_u8(16);
                uint8x16_t hl, hh;
                bits32(qh, &hl, &hh);
                L = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(raw, m4), vandq_u8(hl, b4)));
                H = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(raw, 4), vandq_u8(hh, b4)));
                if (K == K_Q5_0) {
                    L = vsubq_s8(L, vdupq_n_s8(16));
                    H = vsubq_s8(H, vdupq_n_s8(16));
                }
                d = half_at(p);
                if (K == K_Q5_1) mm = half_at(p + 2);
            } else { /* mxfp4, iq4_nl: the nibbles through a table of 16 signed levels */
                const int8x16_t tbl = vld1q_s8(K == K_MXFP4 ? pkv_mxfp4_kvalues : pkv_iq4nl_values);
                const uint8x16_t raw = vld1q_u8(p + (K == K_MXFP4 ? 1 : 2));
                L = vqtbl1q_s8(tbl, vandq_u8(raw, m4));
                H = vqtbl1q_s8(tbl, vshrq_n_u8(raw, 4));
                d = K == K_MXFP4 ? pkv_e8m0_half(p[0]) : half_at(p);
            }
            g->q[k][0] = L;
            g->q[k][1] = H;
            ws = vsetq_lane_f32(d, ws, k);
            wm = vsetq_lane_f32(mm, wm, k);
        }
        g->ws = ws;
        g->wm = wm;
        return;
    }
    const int64_t b = u0 / 8;
    const int j0 = (int)(u0 % 8);
    const uint8_t *p = w + (size_t)b * (K == K_DEC ? st->bb : k_bytes(K));
    if (K == K_Q4_K || K == K_Q5_K) {
        const float d = half_at(p), dmin = half_at(p + 2);
        float32x4_t sc, mn;
        kmin_scales(p + 4, j0, &sc, &mn);
        g->ws = vmulq_n_f32(sc, d);
        g->wm = vnegq_f32(vmulq_n_f32(mn, dmin));
        const uint8_t *qs = K == K_Q5_K ? p + 48 : p + 16;
        uint8x16_t hl = vdupq_n_u8(0), hh = hl;
        if (K == K_Q5_K) { /* bit j of qh[l] is the fifth bit of element l of unit j */
            hl = vshlq_u8(vld1q_u8(p + 16), vdupq_n_s8((int8_t)-j0));
            hh = vshlq_u8(vld1q_u8(p + 32), vdupq_n_s8((int8_t)-j0));
        }
        for (int k = 0; k < nu; k++) {
            const uint8_t *q = qs + 32 * ((j0 + k) / 2);
            uint8x16_t L = vld1q_u8(q), H = vld1q_u8(q + 16);
            if (k & 1) {
                L = vshrq_n_u8(L, 4);
                H = vshrq_n_u8(H, 4);
            } else {
                L = vandq_u8(L, m4);
                H = vandq_u8(H, m4);
            }
            if (K == K_Q5_K) {
                const uint8x16_t one = vdupq_n_u8(1);
                L = vorrq_u8(L, vshlq_n_u8(vandq_u8(hl, one), 4));
                H = vorrq_u8(H, vshlq_n_u8(vandq_u8(hh, one), 4));
                hl = vshrq_n_u8(hl, 1);
                hh = vshrq_n_u8(hh, 1);
            }
            g->q[k][0] = vreinterpretq_s8_u8(L);
            g->q[k][1] = vreinterpretq_s8_u8(H);
        }
        return;
    }
    if (K == K_IQ4_XS) {
        const float d = half_at(p);
        const unsigned sh = (unsigned)(p[2] | p[3] << 8);
        const int8x16_t tbl = vld1q_s8(pkv_iq4nl_values);
        float dl[4] = {0, 0, 0, 0};
        for (int k = 0; k < nu; k++) {
            const int ib = j0 + k;
            const int ls = (int)(((p[4 + ib / 2] >> (4 * (ib % 2))) & 15) | ((sh >> (2 * ib)) & 3) << 4);
            dl[k] = d * (float)(ls - 32);
            const uint8x16_t raw = vld1q_u8(p + 8 + 16 * ib);
            g->q[k][0] = vqtbl1q_s8(tbl, vandq_u8(raw, m4));
            g->q[k][1] = vqtbl1q_s8(tbl, vshrq_n_u8(raw, 4));
        }
        g->ws = vld1q_f32(dl);
        return;
    }
    if (K == K_IQ3_S) {
        /* eight 9-bit grid indices per unit, each 4 unsigned magnitudes; 32 sign bits */
        const float d = half_at(p);
        const uint32_t *grid = pkv_iq_tables_get()->iq3s;
        float db[4] = {0, 0, 0, 0};
        for (int k = 0; k < nu; k++) {
            const int ib = j0 + k;
            uint32_t mag[8];
            for (int l = 0; l < 8; l++) mag[l] = grid[p[2 + 8 * ib + l] | ((p[66 + ib] >> l) & 1) << 8];
            uint8x16_t sl, sh;
            bits32(p + 74 + 4 * ib, &sl, &sh);
            const int8x16_t L = vreinterpretq_s8_u32(vld1q_u32(mag)), H = vreinterpretq_s8_u32(vld1q_u32(mag + 4));
            /* (q ^ m) - m negates where the mask m is -1 */
            g->q[k][0] = vsubq_s8(veorq_s8(L, vreinterpretq_s8_u8(sl)), vreinterpretq_s8_u8(sl));
            g->q[k][1] = vsubq_s8(veorq_s8(H, vreinterpretq_s8_u8(sh)), vreinterpretq_s8_u8(sh));
            db[k] = d * (float)(1 + 2 * ((p[106 + ib / 2] >> (4 * (ib % 2))) & 15));
        }
        g->ws = vld1q_f32(db);
        return;
    }
    /* scales per 16: lanes 2k and 2k + 1 are the halves of unit k (nu <= 2) */
    if (K == K_Q6_K) {
        const float d = half_at(p + 208);
        const int8_t *sc = (const int8_t *)(p + 192) + 2 * j0;
        g->ws = vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(vmovl_s8(vld1_s8(sc))))), d);
        if (nu < 2) g->ws = vsetq_lane_f32(0, vsetq_lane_f32(0, g->ws, 2), 3);
        const uint8x16_t m2 = vdupq_n_u8(3);
        for (int k = 0; k < nu; k++) {
            const int j = j0 + k, h = j / 4, kk = j % 4;
            const uint8_t *ql = p + 64 * h + 32 * (kk & 1), *qh = p + 128 + 32 * h;
            const int8x16_t ls = vdupq_n_s8((int8_t)(kk < 2 ? 0 : -4)), hs = vdupq_n_s8((int8_t)(-2 * kk));
            for (int e = 0; e < 2; e++) {
                const uint8x16_t lo = vandq_u8(vshlq_u8(vld1q_u8(ql + 16 * e), ls), m4);
                const uint8x16_t hi = vandq_u8(vshlq_u8(vld1q_u8(qh + 16 * e), hs), m2);
                g->q[k][e] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(lo, vshlq_n_u8(hi, 4))), vdupq_n_s8(32));
            }
        }
        return;
    }
    if (K == K_Q3_K || K == K_Q2_K) {
        const uint8_t *qs = p + (K == K_Q3_K ? 32 : 16);
        const uint8x16_t m2 = vdupq_n_u8(3), one = vdupq_n_u8(1);
        float s[4] = {0, 0, 0, 0}, mn[4] = {0, 0, 0, 0};
        for (int k = 0; k < nu; k++) {
            const int j = j0 + k, h = j / 4, kk = j % 4;
            const int8x16_t sh = vdupq_n_s8((int8_t)(-2 * kk));
            for (int e = 0; e < 2; e++) {
                uint8x16_t q = vandq_u8(vshlq_u8(vld1q_u8(qs + 32 * h + 16 * e), sh), m2);
                if (K == K_Q3_K) { /* the high bit set means +0, clear -4 */
                    const uint8x16_t hi = vandq_u8(vshlq_u8(vld1q_u8(p + 16 * e), vdupq_n_s8((int8_t)-j)), one);
                    q = vorrq_u8(q, vshlq_n_u8(hi, 2));
                    g->q[k][e] = vsubq_s8(vreinterpretq_s8_u8(q), vdupq_n_s8(4));
                } else {
                    g->q[k][e] = vreinterpretq_s8_u8(q);
                }
            }
            for (int e = 0; e < 2; e++) {
                const int gi = 2 * j + e;
                if (K == K_Q3_K) {
                    const uint8_t *sc = p + 96;
                    const int v = ((sc[gi % 8] >> (4 * (gi / 8))) & 15) | ((sc[8 + gi % 4] >> (2 * (gi / 4))) & 3) << 4;
                    s[2 * k + e] = (float)(v - 32);
                } else {
                    s[2 * k + e] = (float)(p[gi] & 15);
                    mn[2 * k + e] = (float)(p[gi] >> 4);
                }
            }
        }
        const float d = half_at(p + (K == K_Q3_K ? 108 : 80));
        g->ws = vmulq_n_f32(vld1q_f32(s), d);
        if (K == K_Q2_K) g->wm = vnegq_f32(vmulq_n_f32(vld1q_f32(mn), half_at(p + 82)));
        return;
    }
    /* K_DEC: the block decoded to its integer form in plain C, once */
    if (j0 == 0) st->dec(p, &st->o);
    for (int k = 0; k < nu; k++) {
        g->q[k][0] = vld1q_s8(st->o.q + 32 * (j0 + k));
        g->q[k][1] = vld1q_s8(st->o.q + 32 * (j0 + k) + 16);
    }
    g->ws = vld1q_f32(st->o.d + 2 * j0);
    if (nu < 2) g->ws = vsetq_lane_f32(0, vsetq_lane_f32(0, g->ws, 2), 3);
}

/* The activation side of a group for one row: d per lane, and the offsets'
 * partner (d * sum of the unit, or of the half, k_mins). */
AI void nq_xside(int K, const pkv_q8a *x, int nu, float32x4_t *dx, float32x4_t *ds) {
    *ds = *dx = vdupq_n_f32(0);
    if (!k_halves(K)) {
        for (int k = 0; k < 4; k++) {
            if (k >= nu) break;
            *dx = vld1q_lane_f32(&x[k].d, *dx, k);
            if (k_mins(K)) *ds = vld1q_lane_f32(&x[k].ds, *ds, k);
        }
        return;
    }
    const float d0 = x[0].d, d1 = nu > 1 ? x[1].d : 0;
    *dx = f4(d0, d0, d1, d1);
    if (k_mins(K) == 2) {
        const float32x4_t s = f4((float)x[0].s[0], (float)x[0].s[1], nu > 1 ? (float)x[1].s[0] : 0,
                                 nu > 1 ? (float)x[1].s[1] : 0);
        *ds = vmulq_f32(s, *dx);
    }
}

/* int32 lanes t (exact unit or half totals) of one (weight row, activation row)
 * group into the row's accumulators. */
AI void nq_accum(int K, const nq_group *g, float32x4_t dx, float32x4_t ds, int32x4_t t, float32x4_t *acc,
                 float32x4_t *cor) {
    *acc = vfmaq_f32(*acc, vcvtq_f32_s32(t), vmulq_f32(g->ws, dx));
    if (k_mins(K)) *cor = vfmaq_f32(*cor, g->wm, ds);
}

AI int nq_per_group(int K) { return k_halves(K) ? 2 : 4; }

/* A row's dot from its accumulators. */
AI float nq_out(int K, float32x4_t acc, float32x4_t cor) {
    return k_mins(K) ? vaddvq_f32(acc) + vaddvq_f32(cor) : vaddvq_f32(acc);
}

#undef QN_T
#define QN_T static
#define QN_NAME(n) neon_##n
#define QN_DOT 0
#include "device/cpu/cpu-neon-body.h"
#undef QN_DOT
#undef QN_NAME
#undef QN_T

#define QN_T __attribute__((target("arch=armv8.2-a+dotprod"))) static
#define QN_NAME(n) dp_##n
#define QN_DOT 1
#include "device/cpu/cpu-neon-body.h"
#undef QN_DOT
#undef QN_NAME
#undef QN_T

#define QN_T __attribute__((target("arch=armv8.2-a+dotprod+i8mm"))) static
#define QN_NAME(n) mm_##n
#define QN_DOT 2
#include "device/cpu/cpu-neon-body.h"
#undef QN_DOT
#undef QN_NAME
#undef QN_T

#define QN_MORE(p)                                                                                             \
    {[PKV_TYPE_Q4_1] = p##_q4_1,       [PKV_TYPE_Q5_0] = p##_q5_0,       [PKV_TYPE_Q5_1] = p##_q5_1,              \
     [PKV_TYPE_Q2_K] = p##_q2_k,       [PKV_TYPE_Q3_K] = p##_q3_k,       [PKV_TYPE_IQ2_XXS] = p##_iq2_xxs,        \
     [PKV_TYPE_IQ2_XS] = p##_iq2_xs,   [PKV_TYPE_IQ2_S] = p##_iq2_s,     [PKV_TYPE_IQ3_XXS] = p##_iq3_xxs,        \
     [PKV_TYPE_IQ3_S] = p##_iq3_s,     [PKV_TYPE_IQ1_S] = p##_iq1_s,     [PKV_TYPE_IQ1_M] = p##_iq1_m,            \
     [PKV_TYPE_IQ4_NL] = p##_iq4_nl,   [PKV_TYPE_IQ4_XS] = p##_iq4_xs,   [PKV_TYPE_TQ1_0] = p##_tq1_0,            \
     [PKV_TYPE_TQ2_0] = p##_tq2_0}
#define QN_PAIRS(p)                                                                                            \
    {[PKV_TYPE_Q8_0] = p##_q8_0,       [PKV_TYPE_Q4_0] = p##_q4_0,       [PKV_TYPE_Q4_K] = p##_q4_k,              \
     [PKV_TYPE_Q5_K] = p##_q5_k,       [PKV_TYPE_Q6_K] = p##_q6_k,       [PKV_TYPE_MXFP4] = p##_mxfp4,            \
     [PKV_TYPE_Q4_1] = p##_q4_1,       [PKV_TYPE_Q5_0] = p##_q5_0,       [PKV_TYPE_Q5_1] = p##_q5_1,              \
     [PKV_TYPE_Q2_K] = p##_q2_k,       [PKV_TYPE_Q3_K] = p##_q3_k,       [PKV_TYPE_IQ2_XXS] = p##_iq2_xxs,        \
     [PKV_TYPE_IQ2_XS] = p##_iq2_xs,   [PKV_TYPE_IQ2_S] = p##_iq2_s,     [PKV_TYPE_IQ3_XXS] = p##_iq3_xxs,        \
     [PKV_TYPE_IQ3_S] = p##_iq3_s,     [PKV_TYPE_IQ1_S] = p##_iq1_s,     [PKV_TYPE_IQ1_M] = p##_iq1_m,            \
     [PKV_TYPE_IQ4_NL] = p##_iq4_nl,   [PKV_TYPE_IQ4_XS] = p##_iq4_xs,   [PKV_TYPE_TQ1_0] = p##_tq1_0,            \
     [PKV_TYPE_TQ2_0] = p##_tq2_0}

/* Only the types of the block decoder's fallback are slow: the decode is plain C. */
#define N_SLOW                                                                                                 \
    (PKV_QDOT_BIT(PKV_TYPE_IQ2_XXS) | PKV_QDOT_BIT(PKV_TYPE_IQ2_XS) | PKV_QDOT_BIT(PKV_TYPE_IQ2_S) |              \
     PKV_QDOT_BIT(PKV_TYPE_IQ3_XXS) | PKV_QDOT_BIT(PKV_TYPE_IQ1_S) | PKV_QDOT_BIT(PKV_TYPE_IQ1_M) |               \
     PKV_QDOT_BIT(PKV_TYPE_TQ1_0) | PKV_QDOT_BIT(PKV_TYPE_TQ2_0))

#define N_TABLE(pfx, nm)                                                                                        \
    .name = nm, .f32x = n_f32x, .f16x = n_f16x, .bf16x = n_bf16x, .f32t = n_f32t, .f16t = n_f16t,              \
    .bf16t = n_bf16t, .f16row = n_f16row, .f32f16row = n_f32f16row, .q8_0 = pfx##_q8_0, .q4_0 = pfx##_q4_0,      \
    .q4_k = pfx##_q4_k, .q5_k = pfx##_q5_k, .q6_k = pfx##_q6_k, .mxfp4 = pfx##_mxfp4, .more = QN_MORE(pfx),      \
    .slow = N_SLOW, .q8a = n_q8a, .scan = n_scan

const pkv_cpu_dots pkv_cpu_dots_neon = {N_TABLE(neon, "neon")};
const pkv_cpu_dots pkv_cpu_dots_dotprod = {N_TABLE(dp, "dotprod")};
const pkv_cpu_dots pkv_cpu_dots_i8mm = {N_TABLE(dp, "i8mm"), .pair = QN_PAIRS(mm)};
#endif
