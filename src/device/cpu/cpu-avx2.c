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

/* One weight row (kind 0 f32, 1 f16, 2 bf16) against NX x rows: each weight
 * vector is loaded and widened once and used NX times. One x row gets the same
 * float operations in the same order whatever NX is, so a matmul's result for a
 * row does not depend on how many rows share the call (batch composition). */
__attribute__((always_inline)) T static inline __m256 ldw(const void *w, int kind, int64_t i) {
    if (kind == 0) return _mm256_loadu_ps((const float *)w + i);
    if (kind == 1) return ld_f16((const uint16_t *)w + i);
    return ld_bf16((const uint16_t *)w + i);
}

__attribute__((always_inline)) T static inline float w_at(const void *w, int kind, int64_t i) {
    if (kind == 0) return ((const float *)w)[i];
    if (kind == 1) return _cvtsh_ss(((const uint16_t *)w)[i]);
    uint32_t u = (uint32_t)((const uint16_t *)w)[i] << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

__attribute__((always_inline)) T static inline void fxn(const void *w, int kind, const float *x, int64_t xs, int64_t n,
                                                        const int NX, float *out) {
    __m256 a[8];
    for (int r = 0; r < 2 * NX; r++) a[r] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256 w0 = ldw(w, kind, i), w1 = ldw(w, kind, i + 8);
        for (int r = 0; r < NX; r++) {
            a[2 * r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + r * xs + i), a[2 * r]);
            a[2 * r + 1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + r * xs + i + 8), a[2 * r + 1]);
        }
    }
    for (int r = 0; r < NX; r++) {
        float s = hsum(_mm256_add_ps(a[2 * r], a[2 * r + 1]));
        for (int64_t k = i; k < n; k++) s += w_at(w, kind, k) * x[r * xs + k];
        out[r] = s;
    }
}

T static void a_f32x(const float *w, const float *x, int64_t xs, int64_t n, int nx, float *out) {
    if (nx == 4)
        fxn(w, 0, x, xs, n, 4, out);
    else
        for (int r = 0; r < nx; r++) fxn(w, 0, x + r * xs, xs, n, 1, out + r);
}
T static void a_f16x(const uint16_t *w, const float *x, int64_t xs, int64_t n, int nx, float *out) {
    if (nx == 4)
        fxn(w, 1, x, xs, n, 4, out);
    else
        for (int r = 0; r < nx; r++) fxn(w, 1, x + r * xs, xs, n, 1, out + r);
}
T static void a_bf16x(const uint16_t *w, const float *x, int64_t xs, int64_t n, int nx, float *out) {
    if (nx == 4)
        fxn(w, 2, x, xs, n, 4, out);
    else
        for (int r = 0; r < nx; r++) fxn(w, 2, x + r * xs, xs, n, 1, out + r);
}

/* The matmul's register tile (cpu-dots.h, f32t): NW weight rows x NX x rows, one
 * 8-lane accumulator per pair; lane l sums the products of elements 8k + l in k
 * order, then hsum, then the tail elements in order with fmaf. A pair gets
 * exactly these operations in every tile shape. */
__attribute__((always_inline)) T static inline void ftile(const void *w, int kind, int64_t ws, const float *x,
                                                          int64_t xs, int64_t n, const int NW, const int NX, float *y,
                                                          int64_t ys) {
    __m256 a[8];
    for (int k = 0; k < NW * NX; k++) a[k] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 wv[4];
        for (int q = 0; q < NW; q++) wv[q] = ldw(w, kind, q * ws + i);
        for (int r = 0; r < NX; r++) {
            const __m256 xv = _mm256_loadu_ps(x + r * xs + i);
            for (int q = 0; q < NW; q++) a[r * NW + q] = _mm256_fmadd_ps(wv[q], xv, a[r * NW + q]);
        }
    }
    for (int r = 0; r < NX; r++)
        for (int q = 0; q < NW; q++) {
            float s = hsum(a[r * NW + q]);
            for (int64_t k = i; k < n; k++) s = fmaf(w_at(w, kind, q * ws + k), x[r * xs + k], s);
            y[r * ys + q] = s;
        }
}

/* 4 x 2 tiles where the shape allows (16 ymm registers); every pair gets the
 * same operations. */
#define TILE_FN(name, WT, kind)                                                                                       \
    T static void name(const WT *w, int64_t ws, int nw, const float *x, int64_t xs, int nx, int64_t n, float *y,     \
                       int64_t ys) {                                                                                 \
        if (nw == 4) {                                                                                               \
            int r = 0;                                                                                               \
            for (; r + 2 <= nx; r += 2) ftile(w, kind, ws, x + r * xs, xs, n, 4, 2, y + r * ys, ys);                 \
            for (; r < nx; r++) ftile(w, kind, ws, x + r * xs, xs, n, 4, 1, y + r * ys, ys);                         \
        } else if (nx == 4) {                                                                                        \
            for (int q = 0; q < nw; q++) ftile(w + q * ws, kind, ws, x, xs, n, 1, 4, y + q, ys);                     \
        } else {                                                                                                     \
            for (int q = 0; q < nw; q++)                                                                             \
                for (int r = 0; r < nx; r++) ftile(w + q * ws, kind, ws, x + r * xs, xs, n, 1, 1, y + r * ys + q, ys); \
        }                                                                                                            \
    }
TILE_FN(a_f32t, float, 0)
TILE_FN(a_f16t, uint16_t, 1)
TILE_FN(a_bf16t, uint16_t, 2)
#undef TILE_FN

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
    .f16row = a_f16row,
    .f32f16row = a_f32f16row,
    .q8_0 = a_q8_0,
    .q4_0 = a_q4_0,
    .sup = QB_SUP_TABLE,
    .mxfp4 = a_mxfp4,
    .more = QB_MORE_TABLE,
    .slow = QB_MORE_SLOW,
    .q8a = a_q8a,
};
#undef QB_NAME
#endif
