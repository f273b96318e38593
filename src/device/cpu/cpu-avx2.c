/* AVX2 + FMA + F16C row dot products. Compiled with per-function target
 * attributes so the library still runs on any x86-64; cpu-kernels.c only picks
 * this table when the CPU reports the features. */
#include "device/cpu/cpu-dots.h"

#include "base/quant.h"

#ifdef PKV_CPU_X86
#include <immintrin.h>
#include <math.h>
#include <string.h>

#define T __attribute__((target("avx2,fma,f16c")))

T static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

T static inline __m256 ld_f16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

T static inline __m256 ld_bf16(const uint16_t *p) {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

#define FV_TARGET T
#define FV_V __m256
#define FV_LANES 8
#define FV_ZERO() _mm256_setzero_ps()
#define FV_LOADU(p) _mm256_loadu_ps(p)
#define FV_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define FV_ADD(a, b) _mm256_add_ps(a, b)
#define FV_HSUM(v) hsum(v)
#define FV_NAME(n) a_##n
#define FV_STOREU(p, v) _mm256_storeu_ps(p, v)
#define FV_MUL(a, b) _mm256_mul_ps(a, b)
#define FV_SET1(f) _mm256_set1_ps(f)
#define FV_TILE_NX 2
#include "device/cpu/cpu-fdot-body.h"

/* f16 <-> f32 rows (F16C; round to nearest even, as pkv_f32_to_f16). */
T static void a_f16row(const uint16_t *src, float *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, ld_f16(src + i));
    for (; i < n; i++) dst[i] = _cvtsh_ss(src[i]);
}
T static void a_f32f16row(const float *src, uint16_t *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) dst[i] = _cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT);
}

/* Sum of 32 products of unsigned bytes u with signed bytes x, as 8 int32 lanes.
 * Products here are at most 128 * 127, so maddubs' int16 pair sums cannot saturate. */
T static inline __m256i dot_u8(__m256i u, __m256i x) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1));
}

#define QB_T T static
#define QB_DOT_U8(u, x) dot_u8(u, x)
#define QB_NAME(n) a_##n
#define QB_VNNI 0
#define QB_NXMAX 8
#include "device/cpu/cpu-qdot-body.h"
#undef QB_VNNI
#undef QB_NXMAX
#undef QB_T
#undef QB_DOT_U8


/* pkv_cpu_quantize_q8a vectorized, with the same float operations: amax, d =
 * amax/127, id = 1/d, q = x*id rounded to nearest even (lrintf). */
T static void a_q8a(const float *x, pkv_q8a *y, int64_t nb) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t b = 0; b < nb; b++, x += 32) {
        const __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8), v2 = _mm256_loadu_ps(x + 16),
                     v3 = _mm256_loadu_ps(x + 24);
        const __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                                       _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4), d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
        const __m256 vid = _mm256_set1_ps(id);
        /* Clamped to [-127, 127] as the scalar path clamps lrintf: a no-op for finite
         * input; for NaN/inf (0x80000000 from the conversion) it keeps the int sums
         * below from overflowing (undefined behaviour; found by fuzz-gguf). */
        const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
#define Q8A_CVT(v) _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v, vid)), lo), hi)
        const __m256i i0 = Q8A_CVT(v0), i1 = Q8A_CVT(v1), i2 = Q8A_CVT(v2), i3 = Q8A_CVT(v3);
#undef Q8A_CVT
        y[b].d = d;
        __m256i s01 = _mm256_add_epi32(i0, i1), s23 = _mm256_add_epi32(i2, i3);
        __m256i h = _mm256_hadd_epi32(s01, s23); /* lane-wise pair sums of both halves */
        h = _mm256_hadd_epi32(h, h);
        const int32_t *hv = (const int32_t *)&h;
        y[b].s[0] = (int16_t)(hv[0] + hv[4]);
        y[b].s[1] = (int16_t)(hv[1] + hv[5]);
        y[b].ds = d * (float)(hv[0] + hv[4] + hv[1] + hv[5]);
        const __m256i q = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
        _mm256_storeu_si256((__m256i *)y[b].qs, _mm256_permutevar8x32_epi32(q, perm));
    }
}

const pkv_cpu_dots pkv_cpu_dots_avx2 = {
    .name = "avx2",
    .f32x = a_f32x,
    .f16x = a_f16x,
    .bf16x = a_bf16x,
    .f32t = a_f32t,
    .f16t = a_f16t,
    .bf16t = a_bf16t,
    .scan = a_scan,
    .f16row = a_f16row,
    .f32f16row = a_f32f16row,
    .q8_0 = a_q8_0,
    .q4_0 = a_q4_0,
    .sup = QB_SUP_TABLE,
    .q4_kr = a_q4_kr,
    .mxfp4 = a_mxfp4,
    .more = QB_MORE_TABLE,
    .slow = QB_MORE_SLOW,
    .q8a = a_q8a,
};
#undef QB_NAME
#endif
