/* Q8_0 and Q4_K matmuls on Intel AMX (the "amx" CPU path, cpu-amx.h).
 *
 * The tile multiply takes 16 weight rows x one 32-element block (tile A) and
 * 16 activation rows of the same block (tile B, laid out once per call in AMX's
 * 4-byte-interleaved form) and gives the 16 x 16 exact int32 block dots P.
 * q8_0: TDPBSSD, tile A read in place from the GGUF rows (32 quant bytes per
 * row, the row stride as tile stride). q4_k: TDPBUSD on the 4-bit quants
 * unpacked to bytes once per group of 16 rows (sub-block of 32 = block). Each
 * output pair (weight row m, activation row n) then gets, block after block in
 * order (the formula, also in the comment before tail_dot),
 *     acc = fma((float)P, dx * ws, acc)        ws: the block's weight scale
 *     acc = fma(wm, ds, acc)        q4_k only; wm = -(dmin * min), ds = dx * sum(x)
 * and y = acc: no reduction at the end. The same formula serves weight rows
 * that do not fill a group of 16 (scalar tail_dot), a single activation row
 * (other kernels, same operations per element) and activation rows that do not
 * fill a group (their B columns are zero and their results dropped), so a row's
 * result does not depend on the batch, the thread count or where a task's rows
 * start (I5-style determinism, as the other CPU paths; test-cpu-kernels).
 *
 * Linux lends the tile registers only after arch_prctl(ARCH_REQ_XCOMP_PERM,
 * XFEATURE_XTILEDATA); pkv_cpu_amx_available asks once per process. */
#include "device/cpu/cpu-amx.h"

#include "base/base.h"

#include <math.h>
#include <stdint.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(PKV_CPU_X86) && defined(__linux__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef PF_HINT
#define PF_HINT _MM_HINT_T0
#endif
#define AMX_T __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

static bool g_amx;
static pthread_once_t g_amx_once = PTHREAD_ONCE_INIT;

static void amx_probe(void) {
    unsigned a, b, c, d;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
    const bool tile = (d >> 24) & 1, int8 = (d >> 25) & 1;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(1), "c"(0));
    const bool osxsave = (c >> 27) & 1;
    if (!tile || !int8 || !osxsave) return;
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
        !__builtin_cpu_supports("avx512vl") || !__builtin_cpu_supports("avx512vnni"))
        return; /* the few-row kernels use vpdpbusd (every AMX CPU has it; a VM could hide it) */
    /* ARCH_REQ_XCOMP_PERM (0x1023) for XFEATURE_XTILEDATA (18) */
    g_amx = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
}

bool pkv_cpu_amx_available(void) {
    pthread_once(&g_amx_once, amx_probe);
    return g_amx;
}

/* The tile configuration (palette 1): tiles 0, 1 = P (16 rows x 16 int32),
 * 2, 3 = A (16 weight rows x 32 bytes), 4, 5 = B (8 rows x 64 bytes: 4 bytes of
 * each of 16 activation rows); two of each so that the tile unit computes the
 * next block while the vector units scale the last one. */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_cfg;

/* cols: activation rows in B and P (16 or 1); depth: elements per block (32,
 * or 16 for q6_k, whose scales change every 16). */
AMX_T static void cfg_load(int cols, int depth) {
    amx_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 2; t++) { /* two of each: block b in tiles 0/2/4, block b+1 in 1/3/5 */
        cfg.colsb[0 + t] = (uint16_t)(4 * cols), cfg.rows[0 + t] = 16;
        cfg.colsb[2 + t] = (uint16_t)depth, cfg.rows[2 + t] = 16;
        cfg.colsb[4 + t] = (uint16_t)(4 * cols), cfg.rows[4 + t] = (uint8_t)(depth / 4);
    }
    _tile_loadconfig(&cfg);
}

void pkv_amx_x_layout(const pkv_q8a *x, int64_t n, int64_t nb, pkv_amx_xb *out) {
    const int64_t groups = (n + 15) / 16;
    for (int64_t g = 0; g < groups; g++)
        for (int64_t b = 0; b < nb; b++) {
            pkv_amx_xb *o = out + g * nb + b;
            memset(o, 0, sizeof *o);
            for (int k = 0; k < 16 && g * 16 + k < n; k++) {
                const pkv_q8a *xb = x + (g * 16 + k) * nb + b;
                o->d[k] = xb->d;
                o->ds[k] = xb->ds;
                o->s32[0][k] = 32 * (int32_t)xb->s[0];
                o->s32[1][k] = 32 * (int32_t)xb->s[1];
                for (int q = 0; q < 8; q++) memcpy(o->q + q * 64 + k * 4, xb->qs + q * 4, 4);
            }
        }
}

/* ------------------------------------------------------------ the formula */

/* Per output element and block (q8_0) or sub-block (q4_k) b, in order:
 *     acc = fma((float)P[b], dx[b] * ws[b], acc)           ws: the weight scale
 *     acc = fma(wm[b], ds[b], acc)           (q4_k only)   wm: -(dmin * min)
 * with P the exact int32 dot of the block's weight quants (q4_k: 0..15) and
 * activation quants, ds the activation block's d * (sum of its quants). */
enum { K_Q8_0, K_Q4_K, K_Q6_K };

static void scale_min(int j, const uint8_t *q, int *sc, int *m) { /* q4_k's 6-bit pairs (quant.c) */
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 15) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* One weight row against one activation row, scalar (rows that do not fill a
 * group of 16; the scales converted by the instruction the groups use). */
AMX_T static float tail_dot(int kind, const uint8_t *w, const pkv_q8a *x, int64_t nb) {
    float acc = 0.0f;
    if (kind == K_Q8_0) {
        for (int64_t b = 0; b < nb; b++, w += 34) {
            int32_t p = 0;
            const int8_t *qw = (const int8_t *)(w + 2);
            for (int k = 0; k < 32; k++) p += (int32_t)qw[k] * (int32_t)x[b].qs[k];
            uint16_t h;
            memcpy(&h, w, 2);
            acc = fmaf((float)p, x[b].d * _cvtsh_ss(h), acc);
        }
        return acc;
    }
    if (kind == K_Q6_K) {
        for (int64_t b = 0; b < nb; b++) /* block b: quarter k of half h of super-block b / 8 */
            for (int e = 0; e < 2; e++) { /* its two 16-element halves */
                const uint8_t *sb = w + (b / 8) * 210;
                const int h = (int)(b % 8) / 4, k = (int)(b % 4);
                const uint8_t *ql = sb + 64 * h + 32 * (k & 1), *qh = sb + 128 + 32 * h;
                uint16_t hd;
                memcpy(&hd, sb + 208, 2);
                const int sc = ((const int8_t *)(sb + 192))[8 * h + 2 * k + e];
                int32_t p = 0;
                for (int l = 16 * e; l < 16 * e + 16; l++)
                    p += (int32_t)(((ql[l] >> (4 * (k >> 1))) & 15) | ((qh[l] >> (2 * k)) & 3) << 4) * (int32_t)x[b].qs[l];
                p -= 32 * (int32_t)x[b].s[e];
                acc = fmaf((float)p, x[b].d * (_cvtsh_ss(hd) * (float)sc), acc);
            }
        return acc;
    }
    for (int64_t b = 0; b < nb; b++) { /* sub-block b of super-block b / 8 */
        const uint8_t *sb = w + (b / 8) * 144;
        uint16_t h, hm;
        memcpy(&h, sb, 2);
        memcpy(&hm, sb + 2, 2);
        const int j = (int)(b % 8);
        int sc, mn;
        scale_min(j, sb + 4, &sc, &mn);
        const uint8_t *q = sb + 16 + 32 * (j / 2);
        int32_t p = 0;
        for (int k = 0; k < 32; k++) p += (int32_t)((j & 1) ? q[k] >> 4 : q[k] & 15) * (int32_t)x[b].qs[k];
        acc = fmaf((float)p, x[b].d * (_cvtsh_ss(h) * (float)sc), acc);
        acc = fmaf(-(_cvtsh_ss(hm) * (float)mn), x[b].ds, acc);
    }
    return acc;
}

/* A group of 16 weight rows made ready for the tiles: tile A of block b at
 * a + b * astep (row stride as), scales ws[b*16 + m], and for q4_k the min
 * terms wm[b*16 + m]. */
typedef struct amx_w {
    const uint8_t *a;
    size_t as, astep;
    const float *ws, *wm;
    const uint8_t *raw; /* q4_k: the rows themselves (rb apart), for group16_one_q4_k */
    size_t rb;
} amx_w;

/* The byte offsets of 16 rows rb apart, for gathers (rb < 2^31 / 16, checked
 * by pkv_amx_rows). */
AMX_T static inline __m512i row_offsets(size_t rb) {
    return _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                              _mm512_set1_epi32((int)rb));
}

/* Prefetch the part of the next group's 16 rows (rows rb bytes apart) that
 * corresponds to blocks [b, b + 2) of nb: the weights come from DRAM once per
 * call, and 16 rows read at once are 16 streams. */
AMX_T static inline void prefetch_rows(const uint8_t *next, size_t rb, int64_t b, int64_t nb) {
    const size_t o0 = (size_t)b * rb / (size_t)nb, o1 = PKV_MIN(rb, (size_t)(b + 2) * rb / (size_t)nb + 64);
    for (int m = 0; m < 16; m++)
        for (size_t o = o0 & ~(size_t)63; o < o1; o += 64) _mm_prefetch((const char *)next + (size_t)m * rb + o, PF_HINT);
}

/* The tiles of block blk into P tile tp: q8_0 signed x signed, q4_k unsigned
 * weights x signed activations. */
#define AMX_DOT(kind, tp, ta, tb, blk)                                                                             \
    do {                                                                                                           \
        _tile_zero(tp);                                                                                            \
        _tile_loadd(ta, W->a + (size_t)(blk) * W->astep, (long)W->as);                                            \
        _tile_loadd(tb, xg[blk].q, 64);                                                                            \
        if ((kind) == K_Q8_0)                                                                                      \
            _tile_dpbssd(tp, ta, tb);                                                                              \
        else                                                                                                       \
            _tile_dpbusd(tp, ta, tb);                                                                              \
    } while (0)

__attribute__((always_inline)) AMX_T static inline void scale16(const int kind, __m512 *acc, const int32_t (*p)[16],
                                                                 const pkv_amx_xb *xb, const float *ws, const float *wm) {
    const __m512 dx = _mm512_loadu_ps(xb->d);
#pragma GCC unroll 16
    for (int m = 0; m < 16; m++)
        acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(p[m])), _mm512_mul_ps(dx, _mm512_set1_ps(ws[m])),
                                 acc[m]);
    if (kind == K_Q4_K) {
        const __m512 ds = _mm512_loadu_ps(xb->ds);
#pragma GCC unroll 16
        for (int m = 0; m < 16; m++) acc[m] = _mm512_fmadd_ps(_mm512_set1_ps(wm[m]), ds, acc[m]);
    }
}

/* 16 weight rows against one group of 16 activation rows (lanes: activation
 * rows). Blocks go through the tiles in pairs (even block: tiles 0/2/4, odd:
 * 1/3/5), the dot of the next block issued before the scaling of the current
 * one; the scaling runs block after block in order. */
__attribute__((always_inline)) AMX_T static inline void group16(const int kind, const amx_w *W, int64_t nb,
                                                                 const pkv_amx_xb *xg, int nx, float *y, int64_t ys,
                                                                 const pkv_amx_xb *next, const uint8_t *wnext) {
    __m512 acc[16]; /* in registers: every loop over m is unrolled */
#pragma GCC unroll 16
    for (int m = 0; m < 16; m++) acc[m] = _mm512_setzero_ps();
    int32_t p0[16][16] __attribute__((aligned(64))), p1[16][16] __attribute__((aligned(64)));
    AMX_DOT(kind, 0, 2, 4, 0);
    for (int64_t b = 0; b < nb; b += 2) {
        if (b + 1 < nb) AMX_DOT(kind, 1, 3, 5, b + 1);
        if (next) /* the next group's tiles B, two blocks ahead of their use */
            for (int k = 0; k < (int)(2 * sizeof *next); k += 64) _mm_prefetch((const char *)(next + b) + k, _MM_HINT_T0);
        if (wnext) prefetch_rows(wnext, W->rb, b, nb);
        _tile_stored(0, p0, 64);
        if (b + 2 < nb) AMX_DOT(kind, 0, 2, 4, b + 2);
        scale16(kind, acc, (const int32_t(*)[16])p0, xg + b, W->ws + b * 16, W->wm ? W->wm + b * 16 : NULL);
        if (b + 1 < nb) {
            _tile_stored(1, p1, 64);
            scale16(kind, acc, (const int32_t(*)[16])p1, xg + b + 1, W->ws + (b + 1) * 16,
                    W->wm ? W->wm + (b + 1) * 16 : NULL);
        }
    }
    float t[16][16] __attribute__((aligned(64)));
#pragma GCC unroll 16
    for (int m = 0; m < 16; m++) _mm512_store_ps(t[m], acc[m]);
    for (int n = 0; n < nx; n++)
        for (int m = 0; m < 16; m++) y[n * ys + m] = t[m][n];
}

/* q8_0, one activation row (decode): tiles of one column, so P is 16 int32 of
 * 16 weight rows and the lanes run over the weight rows. Per element the same
 * operations as group16. (Gathers as in the q4_k one below measured slower
 * here: 8 per 32-element block instead of per 64.) */
AMX_T static void group16_one_q8_0(const amx_w *W, int64_t nb, const pkv_amx_xb *xg, float *y, const uint8_t *next) {
    __m512 acc = _mm512_setzero_ps();
    int32_t p[2][16] __attribute__((aligned(64)));
    AMX_DOT(K_Q8_0, 0, 2, 4, 0);
    for (int64_t b = 0; b < nb; b += 2) {
        if (b + 1 < nb) AMX_DOT(K_Q8_0, 1, 3, 5, b + 1);
        if (next) /* the next group's rows, as far along as this pair: 16 rows are 16 streams */
            for (int m = 0; m < 16; m++) {
                _mm_prefetch((const char *)next + (size_t)m * W->rb + (size_t)b * 34, PF_HINT);
                _mm_prefetch((const char *)next + (size_t)m * W->rb + (size_t)b * 34 + 64, PF_HINT);
            }
        _tile_stored(0, p[0], 4);
        if (b + 2 < nb) AMX_DOT(K_Q8_0, 0, 2, 4, b + 2);
        if (b + 1 < nb) _tile_stored(1, p[1], 4);
        for (int h = 0; h < 2 && b + h < nb; h++) {
            const int64_t k = b + h;
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(p[h])),
                                  _mm512_mul_ps(_mm512_set1_ps(xg[k].d[0]), _mm512_loadu_ps(W->ws + k * 16)), acc);
        }
    }
    _mm512_storeu_ps(y, acc);
}

/* q4_k, up to AMX_FEW activation rows (decode, small batches), without the
 * tiles: one round trip through the tile unit per sub-block pair costs more
 * than the work, and 16-column tiles would be mostly empty. The 16 weight rows
 * sit in the lanes: a gather takes 4 packed bytes of each row (8 quants of each
 * sub-block of the pair), vpdpbusd multiplies them by 4 bytes of an activation
 * row and adds into the weight row's lane, so 8 gathers give the pair's exact
 * int32 dots of all 16 rows with every activation row; then the same
 * operations per element as group16. */
#define AMX_FEW 8
AMX_T static void group16_few_q4_k(const amx_w *W, int64_t nb, const pkv_q8a *x, int nx, float *y, int64_t ys,
                                   const uint8_t *next) {
    const __m512i rows = row_offsets(W->rb);
    const __m512i m4 = _mm512_set1_epi8(15);
    __m512 acc[AMX_FEW];
    for (int i = 0; i < nx; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b += 2) { /* nb is a multiple of 8 */
        const uint8_t *q = W->raw + (size_t)(b / 8) * 144 + 16 + 32 * (size_t)((b % 8) / 2);
        if (next && b % 8 == 0) /* the next group's super-block: 16 rows read at once are 16 streams */
            for (int m = 0; m < 16; m++)
                for (int l = 0; l < 144; l += 64) _mm_prefetch((const char *)next + (size_t)m * W->rb + (size_t)(b / 8) * 144 + l, PF_HINT);
        __m512i lo[8], hi[8];
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            const __m512i g = _mm512_i32gather_epi32(rows, q + 4 * k, 1);
            lo[k] = _mm512_and_si512(g, m4);
            hi[k] = _mm512_and_si512(_mm512_srli_epi16(g, 4), m4);
        }
        const __m512 ws0 = _mm512_loadu_ps(W->ws + b * 16), ws1 = _mm512_loadu_ps(W->ws + (b + 1) * 16);
        const __m512 wm0 = _mm512_loadu_ps(W->wm + b * 16), wm1 = _mm512_loadu_ps(W->wm + (b + 1) * 16);
        for (int i = 0; i < nx; i++) {
            const pkv_q8a *x0 = x + i * nb + b, *x1 = x0 + 1;
            int32_t d0[8], d1[8];
            memcpy(d0, x0->qs, 32);
            memcpy(d1, x1->qs, 32);
            __m512i p0 = _mm512_setzero_si512(), p1 = _mm512_setzero_si512();
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) {
                p0 = _mm512_dpbusd_epi32(p0, lo[k], _mm512_set1_epi32(d0[k]));
                p1 = _mm512_dpbusd_epi32(p1, hi[k], _mm512_set1_epi32(d1[k]));
            }
            __m512 a = acc[i];
            a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p0), _mm512_mul_ps(_mm512_set1_ps(x0->d), ws0), a);
            a = _mm512_fmadd_ps(_mm512_set1_ps(x0->ds), wm0, a);
            a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p1), _mm512_mul_ps(_mm512_set1_ps(x1->d), ws1), a);
            acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(x1->ds), wm1, a);
        }
    }
    for (int i = 0; i < nx; i++) _mm512_storeu_ps(y + i * ys, acc[i]);
}
#undef AMX_DOT

AMX_T static void run_q8_0(const amx_w *W, int64_t nb, const pkv_amx_xb *xa, int64_t n, float *y, int64_t ys,
                           const uint8_t *next) {
    const int64_t groups = (n + 15) / 16;
    if (n == 1) return group16_one_q8_0(W, nb, xa, y, next);
    for (int64_t g = 0; g < groups; g++)
        group16(K_Q8_0, W, nb, xa + g * nb, (int)PKV_MIN(16, n - g * 16), y + g * 16 * ys, ys,
                g + 1 < groups ? xa + (g + 1) * nb : NULL, g == 0 ? next : NULL);
}

AMX_T static void run_q4_k(const amx_w *W, int64_t nb, const pkv_amx_xb *xa, const pkv_q8a *xq, int64_t n, float *y,
                           int64_t ys, const uint8_t *next) {
    const int64_t groups = (n + 15) / 16;
    (void)xa;
    if (n <= AMX_FEW) return group16_few_q4_k(W, nb, xq, (int)n, y, ys, next);
    for (int64_t g = 0; g < groups; g++)
        group16(K_Q4_K, W, nb, xa + g * nb, (int)PKV_MIN(16, n - g * 16), y + g * 16 * ys, ys,
                g + 1 < groups ? xa + (g + 1) * nb : NULL, g == 0 ? next : NULL);
}

/* Make 16 q8_0 rows ready: tiles straight from the rows; the scales of each
 * block with one gather (4 bytes at each block start; the low 2 are the f16). */
AMX_T static void prep_q8_0(const uint8_t *wr, size_t rb, int64_t nb, float *ws, amx_w *W) {
    const __m512i rows = row_offsets(rb);
    for (int64_t b = 0; b < nb; b++) {
        const __m512i g = _mm512_i32gather_epi32(rows, wr + b * 34, 1);
        _mm512_storeu_ps(ws + b * 16, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g)));
    }
    *W = (amx_w){wr + 2, rb, 34, ws, NULL, wr, rb};
}

/* Make 16 q4_k rows ready: the sub-block scales and mins of each super-block
 * as floats, the 16 rows in the lanes (4 gathers: d/dmin and the 12 scale
 * bytes; then the 6-bit fields as quant.c defines them); the 4-bit quants
 * unpacked to bytes (stg: 16 rows of nb * 32). */
AMX_T static void prep_q4_k(const uint8_t *wr, size_t rb, int64_t nb, uint8_t *stg, float *ws, float *wm, amx_w *W) {
    *W = (amx_w){stg, (size_t)(nb * 32), 32, ws, wm, wr, rb};
    const int64_t cols = nb * 32, nsb = nb / 8;
    const __m512i rows = row_offsets(rb);
    const __m512i b63 = _mm512_set1_epi32(63), b15 = _mm512_set1_epi32(15), sign = _mm512_set1_epi32((int)0x80000000u);
    for (int64_t s = 0; s < nsb; s++) {
        const uint8_t *sb = wr + s * 144;
        const __m512i g0 = _mm512_i32gather_epi32(rows, sb, 1), g1 = _mm512_i32gather_epi32(rows, sb + 4, 1),
                      g2 = _mm512_i32gather_epi32(rows, sb + 8, 1), g3 = _mm512_i32gather_epi32(rows, sb + 12, 1);
        const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g0)),
                     dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(g0, 16)));
        for (int j = 0; j < 8; j++) {
            const int k = 8 * (j & 3); /* byte j (or j - 4) of a dword */
            __m512i sc, mn;
            if (j < 4) {
                sc = _mm512_and_si512(_mm512_srli_epi32(g1, (unsigned)k), b63);
                mn = _mm512_and_si512(_mm512_srli_epi32(g2, (unsigned)k), b63);
            } else {
                const __m512i hi = _mm512_srli_epi32(g3, (unsigned)k);
                sc = _mm512_or_si512(_mm512_and_si512(hi, b15),
                                     _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(g1, (unsigned)k + 6), _mm512_set1_epi32(3)), 4));
                mn = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(hi, 4), b15),
                                     _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(g2, (unsigned)k + 6), _mm512_set1_epi32(3)), 4));
            }
            _mm512_storeu_ps(ws + (s * 8 + j) * 16, _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc)));
            _mm512_storeu_ps(wm + (s * 8 + j) * 16, _mm512_castsi512_ps(_mm512_xor_si512(
                                                         _mm512_castps_si512(_mm512_mul_ps(dmin, _mm512_cvtepi32_ps(mn))), sign)));
        }
    }
    if (!stg) return; /* one activation row: group16_one_q4_k unpacks as it goes */
    const __m256i m4 = _mm256_set1_epi8(15);
    for (int m = 0; m < 16; m++) {
        const uint8_t *row = wr + (size_t)m * rb;
        uint8_t *o = stg + m * cols;
        for (int64_t s = 0; s < nsb; s++)
            for (int g = 0; g < 4; g++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(row + s * 144 + 16 + 32 * g));
                _mm256_storeu_si256((__m256i *)(o + s * 256 + 64 * g), _mm256_and_si256(v, m4));
                _mm256_storeu_si256((__m256i *)(o + s * 256 + 64 * g + 32), _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
            }
    }
}

/* ------------------------------------------------------------------- q6_k */

/* q6_k keeps a scale per 16 elements: its "blocks" here are halves of the
 * activation blocks (depth-16 tiles; half hb of activation block hb / 2), the
 * quants 0..63 unsigned, and the -32 offset taken out in integers:
 *     P' = P - 32 * (sum of the half's activation quants)
 *     acc = fma((float)P', dx * ws, acc)          ws = d * sc  */
AMX_T static void group16_q6(const amx_w *W, int64_t nb, const pkv_amx_xb *xg, int nx, float *y, int64_t ys,
                             const uint8_t *wnext) {
    __m512 acc[16];
#pragma GCC unroll 16
    for (int m = 0; m < 16; m++) acc[m] = _mm512_setzero_ps();
    int32_t p[2][16][16] __attribute__((aligned(64)));
    for (int64_t b = 0; b < nb; b++) { /* the two halves of activation block b: tiles 0/2/4 and 1/3/5 */
        if (wnext && b % 2 == 0) prefetch_rows(wnext, W->rb, b, nb);
        _tile_zero(0);
        _tile_loadd(2, W->a + (size_t)(2 * b) * 16, (long)W->as);
        _tile_loadd(4, xg[b].q, 64);
        _tile_dpbusd(0, 2, 4);
        _tile_zero(1);
        _tile_loadd(3, W->a + (size_t)(2 * b + 1) * 16, (long)W->as);
        _tile_loadd(5, xg[b].q + 256, 64);
        _tile_dpbusd(1, 3, 5);
        _tile_stored(0, p[0], 64);
        _tile_stored(1, p[1], 64);
        const __m512 dx = _mm512_loadu_ps(xg[b].d);
        for (int e = 0; e < 2; e++) {
            const __m512i off = _mm512_loadu_si512(xg[b].s32[e]);
            const float *ws = W->ws + (2 * b + e) * 16;
#pragma GCC unroll 16
            for (int m = 0; m < 16; m++)
                acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_load_si512(p[e][m]), off)),
                                         _mm512_mul_ps(dx, _mm512_set1_ps(ws[m])), acc[m]);
        }
    }
    float t[16][16] __attribute__((aligned(64)));
#pragma GCC unroll 16
    for (int m = 0; m < 16; m++) _mm512_store_ps(t[m], acc[m]);
    for (int n = 0; n < nx; n++)
        for (int m = 0; m < 16; m++) y[n * ys + m] = t[m][n];
}

/* One activation row: gathers, as group16_one_q4_k. Per half super-block
 * (128 elements, 4 activation blocks) 24 gathers: ql's 64 bytes (the low
 * nibbles of quarters 0 and 1, the high ones of 2 and 3) and qh's 32 bytes (2
 * bits of each quarter). */
AMX_T static void group16_one_q6(const amx_w *W, int64_t nb, const pkv_q8a *x, float *y, const uint8_t *next) {
    const __m512i rows = row_offsets(W->rb);
    const __m512i m4 = _mm512_set1_epi8(15), m2 = _mm512_set1_epi8(3);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t b0 = 0; b0 < nb; b0 += 4) { /* half h of super-block b0 / 8 */
        const uint8_t *sb = W->raw + (size_t)(b0 / 8) * 210;
        const int h = (int)(b0 % 8) / 4;
        const uint8_t *ql = sb + 64 * h, *qh = sb + 128 + 32 * h;
        if (next && h == 0)
            for (int m = 0; m < 16; m++)
                for (int l = 0; l < 210; l += 64) _mm_prefetch((const char *)next + (size_t)m * W->rb + (size_t)(b0 / 8) * 210 + l, PF_HINT);
        __m512i gl[2][8], gh[8];
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) {
            gl[0][i] = _mm512_i32gather_epi32(rows, ql + 4 * i, 1);
            gl[1][i] = _mm512_i32gather_epi32(rows, ql + 32 + 4 * i, 1);
            gh[i] = _mm512_i32gather_epi32(rows, qh + 4 * i, 1);
        }
        for (int k = 0; k < 4; k++) {
            const pkv_q8a *xb = &x[b0 + k];
            int32_t xd[8];
            memcpy(xd, xb->qs, 32);
            __m512i pe[2] = {_mm512_set1_epi32(-32 * (int32_t)xb->s[0]), _mm512_set1_epi32(-32 * (int32_t)xb->s[1])};
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) {
                const __m512i lo = _mm512_and_si512(_mm512_srli_epi16(gl[k & 1][i], (unsigned)(4 * (k >> 1))), m4);
                const __m512i hi = _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(gh[i], (unsigned)(2 * k)), m2), 4);
                pe[i / 4] = _mm512_dpbusd_epi32(pe[i / 4], _mm512_or_si512(lo, hi), _mm512_set1_epi32(xd[i]));
            }
            for (int e = 0; e < 2; e++)
                acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(pe[e]),
                                      _mm512_mul_ps(_mm512_set1_ps(xb->d), _mm512_loadu_ps(W->ws + (2 * (b0 + k) + e) * 16)), acc);
        }
    }
    _mm512_storeu_ps(y, acc);
}

/* 16 q6_k rows: the scales of each 16-element half as d * sc (16 rows in the
 * lanes: a gather for d, four for the 16 signed scale bytes); for more than one
 * activation row, the quants unpacked to bytes 0..63 (stg: 16 rows of nb * 32). */
AMX_T static void prep_q6_k(const uint8_t *wr, size_t rb, int64_t nb, uint8_t *stg, float *ws, amx_w *W) {
    const int64_t cols = nb * 32, nsb = nb / 8;
    *W = (amx_w){stg, (size_t)cols, 16, ws, NULL, wr, rb};
    const __m512i rows = row_offsets(rb);
    for (int64_t s = 0; s < nsb; s++) {
        const uint8_t *sb = wr + s * 210;
        const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_i32gather_epi32(rows, sb + 208, 1)));
        for (int q = 0; q < 4; q++) {
            const __m512i g = _mm512_i32gather_epi32(rows, sb + 192 + 4 * q, 1);
            for (int c = 0; c < 4; c++) { /* scale 4q + c: byte c, sign-extended */
                const __m512i sc = _mm512_srai_epi32(_mm512_slli_epi32(g, (unsigned)(24 - 8 * c)), 24);
                _mm512_storeu_ps(ws + (s * 16 + 4 * q + c) * 16, _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc)));
            }
        }
    }
    if (!stg) return;
    const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(3);
    for (int m = 0; m < 16; m++) {
        const uint8_t *row = wr + (size_t)m * rb;
        uint8_t *o = stg + m * cols;
        for (int64_t s = 0; s < nsb; s++)
            for (int h = 0; h < 2; h++) {
                const uint8_t *ql = row + s * 210 + 64 * h, *qh = row + s * 210 + 128 + 32 * h;
                const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql), l1 = _mm256_loadu_si256((const __m256i *)(ql + 32)),
                              hb = _mm256_loadu_si256((const __m256i *)qh);
                for (int k = 0; k < 4; k++) {
                    const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(k & 1 ? l1 : l0, 4 * (k >> 1)), m4);
                    const __m256i hi = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * k), m2), 4);
                    _mm256_storeu_si256((__m256i *)(o + s * 256 + 128 * h + 32 * k), _mm256_or_si256(lo, hi));
                }
            }
    }
}

bool pkv_amx_supports(pkv_type t) { return t == PKV_TYPE_Q8_0 || t == PKV_TYPE_Q4_K || t == PKV_TYPE_Q6_K; }

AMX_T void pkv_amx_rows(pkv_type t, const uint8_t *w, size_t rb, int64_t r0, int64_t r1, int64_t nb,
                        const pkv_q8a *xq, const pkv_amx_xb *xa, int64_t n, float *y, int64_t ys) {
    const int kind = t == PKV_TYPE_Q8_0 ? K_Q8_0 : t == PKV_TYPE_Q4_K ? K_Q4_K : K_Q6_K;
    float *ws = malloc((size_t)nb * 16 * sizeof *ws * 2);
    uint8_t *stg = (kind == K_Q4_K && n > AMX_FEW) || (kind == K_Q6_K && n > 1) ? malloc((size_t)nb * 32 * 16) : NULL;
    int64_t r = r0;
    if (ws && (kind == K_Q8_0 || (kind == K_Q4_K && n <= AMX_FEW) || n == 1 || stg) && r1 - r0 >= 16 &&
        rb <= (size_t)INT32_MAX / 16) {
        cfg_load(n == 1 ? 1 : 16, kind == K_Q6_K ? 16 : 32);
        for (; r + 16 <= r1; r += 16) {
            const uint8_t *wr = w + (size_t)r * rb;
            amx_w W;
            if (kind == K_Q8_0) {
                prep_q8_0(wr, rb, nb, ws, &W);
                run_q8_0(&W, nb, xa, n, y + r, ys, r + 32 <= r1 ? wr + 16 * rb : NULL);
            } else if (kind == K_Q4_K) {
                prep_q4_k(wr, rb, nb, stg, ws, ws + nb * 16, &W);
                run_q4_k(&W, nb, xa, xq, n, y + r, ys, r + 32 <= r1 ? wr + 16 * rb : NULL);
            } else {
                prep_q6_k(wr, rb, nb, stg, ws, &W);
                if (n == 1)
                    group16_one_q6(&W, nb, xq, y + r, r + 32 <= r1 ? wr + 16 * rb : NULL);
                else
                    for (int64_t g = 0; g < (n + 15) / 16; g++)
                        group16_q6(&W, nb, xa + g * nb, (int)PKV_MIN(16, n - g * 16), y + r + g * 16 * ys, ys,
                                   g == 0 && r + 32 <= r1 ? wr + 16 * rb : NULL);
            }
        }
        _tile_release();
    }
    free(ws);
    free(stg);
    for (; r < r1; r++) /* the rows that do not fill a group (or all, without memory for the scales) */
        for (int64_t i = 0; i < n; i++) y[i * ys + r] = tail_dot(kind, w + (size_t)r * rb, xq + i * nb, nb);
}

#else /* no AMX on this target */

bool pkv_cpu_amx_available(void) { return false; }
bool pkv_amx_supports(pkv_type t) {
    (void)t;
    return false;
}
void pkv_amx_x_layout(const pkv_q8a *x, int64_t n, int64_t nb, pkv_amx_xb *out) {
    (void)x, (void)n, (void)nb, (void)out;
}
void pkv_amx_rows(pkv_type t, const uint8_t *w, size_t rb, int64_t r0, int64_t r1, int64_t nb, const pkv_q8a *xq,
                  const pkv_amx_xb *xa, int64_t n, float *y, int64_t ys) {
    (void)t, (void)w, (void)rb, (void)r0, (void)r1, (void)nb, (void)xq, (void)xa, (void)n, (void)y, (void)ys;
}
#endif
