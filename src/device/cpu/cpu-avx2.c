/* AVX2 + FMA + F16C row dot products. Compiled with per-function target
 * attributes so the library still runs on any x86-64; cpu-kernels.c only picks
 * this table when the CPU reports the features. */
#include "device/cpu/cpu-dots.h"

#ifdef PKV_CPU_X86
#include <immintrin.h>
#include <string.h>

#define T __attribute__((target("avx2,fma,f16c")))

T static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

T static float a_f32(const float *w, const float *x, int64_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 16), _mm256_loadu_ps(x + i + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 24), _mm256_loadu_ps(x + i + 24), a3);
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
    float s = hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; i++) s += w[i] * x[i];
    return s;
}

T static inline __m256 ld_f16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

T static float a_f16(const uint16_t *w, const float *x, int64_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_fmadd_ps(ld_f16(w + i), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(ld_f16(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
        a2 = _mm256_fmadd_ps(ld_f16(w + i + 16), _mm256_loadu_ps(x + i + 16), a2);
        a3 = _mm256_fmadd_ps(ld_f16(w + i + 24), _mm256_loadu_ps(x + i + 24), a3);
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(ld_f16(w + i), _mm256_loadu_ps(x + i), a0);
    float s = hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; i++) s += _cvtsh_ss(w[i]) * x[i];
    return s;
}

T static inline __m256 ld_bf16(const uint16_t *p) {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

T static float a_bf16(const uint16_t *w, const float *x, int64_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_fmadd_ps(ld_bf16(w + i), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(ld_bf16(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(ld_bf16(w + i), _mm256_loadu_ps(x + i), a0);
    float s = hsum(_mm256_add_ps(a0, a1));
    for (; i < n; i++) {
        uint32_t u = (uint32_t)w[i] << 16;
        float f;
        memcpy(&f, &u, 4);
        s += f * x[i];
    }
    return s;
}

/* One weight row (kind 0 f32, 1 f16, 2 bf16) against four x rows: each weight
 * vector is loaded and widened once and used four times. */
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

__attribute__((always_inline)) T static inline void fx4(const void *w, int kind, const float *x, int64_t xs, int64_t n,
                                                        float *out) {
    __m256 a[8];
    for (int r = 0; r < 8; r++) a[r] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256 w0 = ldw(w, kind, i), w1 = ldw(w, kind, i + 8);
        for (int r = 0; r < 4; r++) {
            a[r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + r * xs + i), a[r]);
            a[r + 4] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + r * xs + i + 8), a[r + 4]);
        }
    }
    for (int r = 0; r < 4; r++) {
        float s = hsum(_mm256_add_ps(a[r], a[r + 4]));
        for (int64_t k = i; k < n; k++) s += w_at(w, kind, k) * x[r * xs + k];
        out[r] = s;
    }
}

T static void a_f32x(const float *w, const float *x, int64_t xs, int64_t n, int nx, float *out) {
    if (nx == 4)
        fx4(w, 0, x, xs, n, out);
    else
        for (int r = 0; r < nx; r++) out[r] = a_f32(w, x + r * xs, n);
}
T static void a_f16x(const uint16_t *w, const float *x, int64_t xs, int64_t n, int nx, float *out) {
    if (nx == 4)
        fx4(w, 1, x, xs, n, out);
    else
        for (int r = 0; r < nx; r++) out[r] = a_f16(w, x + r * xs, n);
}
T static void a_bf16x(const uint16_t *w, const float *x, int64_t xs, int64_t n, int nx, float *out) {
    if (nx == 4)
        fx4(w, 2, x, xs, n, out);
    else
        for (int r = 0; r < nx; r++) out[r] = a_bf16(w, x + r * xs, n);
}

/* Sum of 32 products of unsigned bytes u with signed bytes x, as 8 int32 lanes.
 * Products here are at most 128 * 127, so maddubs' int16 pair sums cannot saturate. */
T static inline __m256i dot_u8(__m256i u, __m256i x) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1));
}

#define QB_T T static
#define QB_DOT_U8(u, x) dot_u8(u, x)
#define QB_NAME(n) a_##n
#include "device/cpu/cpu-qdot-body.h"
#undef QB_T
#undef QB_DOT_U8
#undef QB_NAME

T static void a_axpy(float *y, float a, const float *x, int64_t n) {
    const __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

T static void a_f16_row(const uint16_t *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, ld_f16(x + i));
    for (; i < n; i++) y[i] = _cvtsh_ss(x[i]);
}

const pkv_cpu_dots pkv_cpu_dots_avx2 = {
    .name = "avx2",
    .f32 = a_f32,
    .f16 = a_f16,
    .bf16 = a_bf16,
    .f32x = a_f32x,
    .f16x = a_f16x,
    .bf16x = a_bf16x,
    .q8_0 = a_q8_0,
    .q4_0 = a_q4_0,
    .q4_k = a_q4_k,
    .q5_k = a_q5_k,
    .q6_k = a_q6_k,
    .axpy = a_axpy,
    .f16_row = a_f16_row,
};
#endif
