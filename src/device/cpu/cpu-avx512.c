/* AVX-512 (F, BW, VL) row dot products: 16-float lanes for the float weight
 * types. The 8-bit block dots stay 256 bits wide (a 32-element block fills one
 * register) and use VNNI's vpdpbusd where the CPU has AVX512-VNNI
 * (pkv_cpu_dots_vnni); otherwise the AVX2 ones. */
#include "device/cpu/cpu-dots.h"

#include "base/quant.h"

#ifdef PKV_CPU_X86
#include <immintrin.h>
#include <math.h>
#include <string.h>

#define T __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

T static inline __m512 ld_f16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }

T static inline __m512 ld_bf16(const uint16_t *p) {
    __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}

#define FV_TARGET T
#define FV_V __m512
#define FV_LANES 16
#define FV_ZERO() _mm512_setzero_ps()
#define FV_LOADU(p) _mm512_loadu_ps(p)
#define FV_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define FV_ADD(a, b) _mm512_add_ps(a, b)
#define FV_HSUM(v) _mm512_reduce_add_ps(v)
#define FV_NAME(n) x_##n
#define FV_STOREU(p, v) _mm512_storeu_ps(p, v)
#define FV_MUL(a, b) _mm512_mul_ps(a, b)
#define FV_SET1(f) _mm512_set1_ps(f)
#define FV_TILE_NX 4
#include "device/cpu/cpu-fdot-body.h"


/* NULL slots: cpu-kernels.c uses the AVX2 function instead. */
const pkv_cpu_dots pkv_cpu_dots_avx512 = {
    .name = "avx512",
    .f32x = x_f32x,
    .f16x = x_f16x,
    .bf16x = x_bf16x,
    .f32t = x_f32t,
    .f16t = x_f16t,
    .bf16t = x_bf16t,
    .scan = x_scan,
};
#endif

#ifdef PKV_CPU_X86
#define V __attribute__((target("avx512vnni,avx512vl,avx512f,avx512bw,avx2,fma,f16c")))

/* 8 int32 lanes, lane i = sum of u[4i..4i+3] * x[4i..4i+3] (u unsigned, x signed). */
V static inline __m256i v_dot(__m256i u, __m256i x) { return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, x); }

#define QB_T V static
#define QB_DOT_U8(u, x) v_dot(u, x)
#define QB_NAME(n) v_##n
#define QB_VNNI 1
#define QB_NXMAX 8
#include "device/cpu/cpu-qdot-body.h"
#undef QB_VNNI
#undef QB_NXMAX
#undef QB_T
#undef QB_DOT_U8

/* lo in lanes 0..7, hi in 8..15 (AVX512F only, no DQ) */
V static inline __m512 halves(__m256 lo, __m256 hi) {
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(lo)), _mm256_castps_pd(hi), 1));
}

/* q8_0 (cpu-dots.h, q8_0z): two blocks per step; vpdpbusd takes the weights'
 * magnitudes (unsigned) and the activations with the weights' signs applied
 * (negated under the mask of negative weights): the same exact int32 products
 * as signed bytes, with no correction term to load per row. */
__attribute__((always_inline)) V static inline void q8z_body(const uint8_t *w, const pkv_q8z *x, int64_t xs,
                                                             int64_t nb, const int NX, float *out) {
    __m512 acc[8];
    for (int r = 0; r < NX; r++) acc[r] = _mm512_setzero_ps();
    const __m512i zero = _mm512_setzero_si512();
    int64_t b = 0, k = 0;
    for (; b + 2 <= nb; b += 2, k++, w += 68) {
        const __m512i wv = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(w + 2))),
                                              _mm256_loadu_si256((const __m256i *)(w + 36)), 1);
        const __m512i u = _mm512_abs_epi8(wv);
        const __mmask64 neg = _mm512_movepi8_mask(wv);
        const __m512 dw = halves(_mm256_set1_ps(v_half(w)), _mm256_set1_ps(v_half(w + 34)));
        for (int r = 0; r < NX; r++) {
            const pkv_q8z *xz = x + r * xs + k;
            const __m512i xq = _mm512_loadu_si512(xz->qs);
            const __m512i p = _mm512_dpbusd_epi32(zero, u, _mm512_mask_sub_epi8(xq, neg, zero, xq));
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_loadu_ps(xz->d)), _mm512_cvtepi32_ps(p), acc[r]);
        }
    }
    if (b < nb) { /* odd last block: the second half of its pair is zero */
        const __m512i wv = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(w + 2)));
        const __m512i u = _mm512_abs_epi8(wv);
        const __mmask64 neg = _mm512_movepi8_mask(wv);
        const __m512 dw = halves(_mm256_set1_ps(v_half(w)), _mm256_setzero_ps());
        for (int r = 0; r < NX; r++) {
            const pkv_q8z *xz = x + r * xs + k;
            const __m512i xq = _mm512_loadu_si512(xz->qs);
            const __m512i p = _mm512_dpbusd_epi32(zero, u, _mm512_mask_sub_epi8(xq, neg, zero, xq));
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_loadu_ps(xz->d)), _mm512_cvtepi32_ps(p), acc[r]);
        }
    }
    for (int r = 0; r < NX; r++) out[r] = _mm512_reduce_add_ps(acc[r]);
}

/* Rows in groups of 8, then 4, then one at a time (as cpu-qdot-body.h): each
 * weight pair is loaded and made unsigned once per group; a row gets the same
 * operations in every group size. */
V static void v_q8_0z(const uint8_t *w, const pkv_q8z *x, int64_t xs, int64_t nb, int nx, float *out) {
    int r = 0;
    for (; r + 8 <= nx; r += 8) q8z_body(w, x + r * xs, xs, nb, 8, out + r);
    for (; r + 4 <= nx; r += 4) q8z_body(w, x + r * xs, xs, nb, 4, out + r);
    for (; r < nx; r++) q8z_body(w, x + r * xs, xs, nb, 1, out + r);
}

V static void v_q8z(const pkv_q8a *x, pkv_q8z *z, int64_t nb) {
    for (int64_t b = 0; b < nb; b += 2, z++) {
        memset(z, 0, sizeof *z);
        for (int h = 0; h < 2 && b + h < nb; h++) {
            _mm256_storeu_si256((__m256i *)(z->qs + 32 * h), _mm256_loadu_si256((const __m256i *)x[b + h].qs));
            _mm256_storeu_ps(z->d + 8 * h, _mm256_set1_ps(x[b + h].d));
        }
    }
}

const pkv_cpu_dots pkv_cpu_dots_vnni = {
    .q8_0z = v_q8_0z,
    .q8z = v_q8z,
    .name = "avx512",
    .q8_0 = v_q8_0,
    .q4_0 = v_q4_0,
    .sup = QB_SUP_TABLE,
    .q4_kr = v_q4_kr,
    .mxfp4 = v_mxfp4,
    .more = QB_MORE_TABLE,
    .slow = QB_MORE_SLOW,
};
#undef QB_NAME
#endif
