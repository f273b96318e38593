/* Q8_0 matmuls on Intel AMX (the "amx" CPU path, cpu-amx.h).
 *
 * The tile multiply TDPBSSD takes 16 weight rows x one 32-element block (tile A,
 * read in place from the GGUF's q8_0 rows: 32 quant bytes per row, the row
 * stride as tile stride) and 16 activation rows of the same block (tile B, laid
 * out once per call in AMX's 4-byte-interleaved form) and gives the 16 x 16
 * exact int32 block dots P. Each output pair (weight row m, activation row n)
 * then gets, block after block in order,
 *     acc = fma((float)P[m][n][b], dx[n][b] * dw[m][b], acc)
 * and y = acc: no reduction at the end. The same formula, scalar, serves weight
 * rows that do not fill a group of 16 (pkv_amx_q8_0_rows' tail) and activation
 * rows that do not fill one (their B columns are zero and their results
 * dropped), so a row's result does not depend on the batch, the thread count or
 * where a task's rows start (I5-style determinism, as the other CPU paths).
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

#define AMX_T __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

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
        !__builtin_cpu_supports("avx512vl"))
        return;
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

AMX_T static void cfg_load(int cols) { /* cols: activation rows in B and P, 16 or 1 */
    amx_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 2; t++) { /* two of each: block b in tiles 0/2/4, block b+1 in 1/3/5 */
        cfg.colsb[0 + t] = (uint16_t)(4 * cols), cfg.rows[0 + t] = 16;
        cfg.colsb[2 + t] = 32, cfg.rows[2 + t] = 16;
        cfg.colsb[4 + t] = (uint16_t)(4 * cols), cfg.rows[4 + t] = 8;
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
                for (int q = 0; q < 8; q++) memcpy(o->q + q * 64 + k * 4, xb->qs + q * 4, 4);
            }
        }
}

/* The formula of the file comment for one weight row and one activation row
 * (the scale converted by the same instruction as the tiles' scales). */
AMX_T static float tail_dot(const uint8_t *w, const pkv_q8a *x, int64_t nb) {
    float acc = 0.0f;
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

/* 16 weight rows at w (stride rb) against one group of 16 activation rows.
 * Blocks go through the tiles in pairs (even block: tiles 0/2/4, odd: 1/3/5),
 * the dot of the next block issued before the scaling of the current one; the
 * scaling itself runs block after block in order. */
#define AMX_DOT(tp, ta, tb, blk)                                                                                   \
    do {                                                                                                           \
        _tile_zero(tp);                                                                                            \
        _tile_loadd(ta, w + (blk) * 34 + 2, (long)rb);                                                             \
        _tile_loadd(tb, xg[blk].q, 64);                                                                            \
        _tile_dpbssd(tp, ta, tb);                                                                                  \
    } while (0)

AMX_T static inline void scale16(__m512 *acc, const int32_t (*p)[16], const pkv_amx_xb *xb, const float *dw) {
    const __m512 dx = _mm512_loadu_ps(xb->d);
#pragma GCC unroll 16
    for (int m = 0; m < 16; m++)
        acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(p[m])), _mm512_mul_ps(dx, _mm512_set1_ps(dw[m])),
                                 acc[m]);
}

AMX_T static void group16(const uint8_t *w, size_t rb, int64_t nb, const pkv_amx_xb *xg, const float *dwf, int nx,
                          float *y, int64_t ys, const pkv_amx_xb *next) {
    __m512 acc[16]; /* in registers: every loop over m is unrolled */
#pragma GCC unroll 16
    for (int m = 0; m < 16; m++) acc[m] = _mm512_setzero_ps();
    int32_t p0[16][16] __attribute__((aligned(64))), p1[16][16] __attribute__((aligned(64)));
    AMX_DOT(0, 2, 4, 0);
    for (int64_t b = 0; b < nb; b += 2) {
        if (b + 1 < nb) AMX_DOT(1, 3, 5, b + 1);
        if (next) /* the next group's tiles B, two blocks ahead of their use */
            for (int k = 0; k < (int)(2 * sizeof *next); k += 64) _mm_prefetch((const char *)(next + b) + k, _MM_HINT_T0);
        _tile_stored(0, p0, 64);
        if (b + 2 < nb) AMX_DOT(0, 2, 4, b + 2);
        scale16(acc, (const int32_t(*)[16])p0, xg + b, dwf + b * 16);
        if (b + 1 < nb) {
            _tile_stored(1, p1, 64);
            scale16(acc, (const int32_t(*)[16])p1, xg + b + 1, dwf + (b + 1) * 16);
        }
    }
    float t[16][16] __attribute__((aligned(64)));
#pragma GCC unroll 16
    for (int m = 0; m < 16; m++) _mm512_store_ps(t[m], acc[m]);
    for (int n = 0; n < nx; n++)
        for (int m = 0; m < 16; m++) y[n * ys + m] = t[m][n];
}

/* The same for one activation row (decode): tiles of one column, so P is 16
 * int32 of 16 weight rows and the lanes run over the weight rows. Per element
 * the same operations as group16. */
AMX_T static void group16_one(const uint8_t *w, size_t rb, int64_t nb, const pkv_amx_xb *xg, const float *dwf,
                              float *y) {
    __m512 acc = _mm512_setzero_ps();
    int32_t p0[16] __attribute__((aligned(64))), p1[16] __attribute__((aligned(64)));
    AMX_DOT(0, 2, 4, 0);
    for (int64_t b = 0; b < nb; b += 2) {
        if (b + 1 < nb) AMX_DOT(1, 3, 5, b + 1);
        _tile_stored(0, p0, 4);
        if (b + 2 < nb) AMX_DOT(0, 2, 4, b + 2);
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(p0)),
                              _mm512_mul_ps(_mm512_set1_ps(xg[b].d[0]), _mm512_loadu_ps(dwf + b * 16)), acc);
        if (b + 1 < nb) {
            _tile_stored(1, p1, 4);
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(p1)),
                                  _mm512_mul_ps(_mm512_set1_ps(xg[b + 1].d[0]), _mm512_loadu_ps(dwf + (b + 1) * 16)), acc);
        }
    }
    _mm512_storeu_ps(y, acc);
}
#undef AMX_DOT

AMX_T void pkv_amx_q8_0_rows(const uint8_t *w, size_t rb, int64_t r0, int64_t r1, int64_t nb, const pkv_q8a *xq,
                             const pkv_amx_xb *xa, int64_t n, float *y, int64_t ys) {
    const int64_t groups = (n + 15) / 16;
    float *dwf = malloc((size_t)nb * 16 * sizeof *dwf);
    int64_t r = r0;
    const __m512i rows = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32((int)rb));
    if (dwf && r1 - r0 >= 16 && rb <= (size_t)INT32_MAX / 16) {
        cfg_load(n == 1 ? 1 : 16);
        for (; r + 16 <= r1; r += 16) {
            const uint8_t *wr = w + (size_t)r * rb;
            /* the 16 rows' scales of each block: one gather (4 bytes at each
             * block start; the low 2 are the f16 scale) */
            for (int64_t b = 0; b < nb; b++) {
                const __m512i g = _mm512_i32gather_epi32(rows, wr + b * 34, 1);
                _mm512_storeu_ps(dwf + b * 16, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g)));
            }
            if (n == 1)
                group16_one(wr, rb, nb, xa, dwf, y + r);
            else
                for (int64_t g = 0; g < groups; g++)
                    group16(wr, rb, nb, xa + g * nb, dwf, (int)PKV_MIN(16, n - g * 16), y + g * 16 * ys + r, ys,
                            g + 1 < groups ? xa + (g + 1) * nb : NULL);
        }
        _tile_release();
    }
    free(dwf);
    for (; r < r1; r++) /* the rows that do not fill a group (or all, without memory for the scales) */
        for (int64_t i = 0; i < n; i++) y[i * ys + r] = tail_dot(w + (size_t)r * rb, xq + i * nb, nb);
}

#else /* no AMX on this target */

bool pkv_cpu_amx_available(void) { return false; }
void pkv_amx_x_layout(const pkv_q8a *x, int64_t n, int64_t nb, pkv_amx_xb *out) {
    (void)x, (void)n, (void)nb, (void)out;
}
void pkv_amx_q8_0_rows(const uint8_t *w, size_t rb, int64_t r0, int64_t r1, int64_t nb, const pkv_q8a *xq,
                       const pkv_amx_xb *xa, int64_t n, float *y, int64_t ys) {
    (void)w, (void)rb, (void)r0, (void)r1, (void)nb, (void)xq, (void)xa, (void)n, (void)y, (void)ys;
}
#endif
