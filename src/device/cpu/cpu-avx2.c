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

/* Sum of 32 products of signed bytes, as 8 int32 lanes converted to float.
 * Activations are in [-127, 127], so maddubs cannot saturate. */
T static inline __m256 dot_i8(__m256i a, __m256i b) {
    const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a));
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
}

T static inline float rd_f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

T static float a_q8_0(const uint8_t *w, const pkv_q8a *x, int64_t nb) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++, w += 34) {
        const __m256i qw = _mm256_loadu_si256((const __m256i *)(w + 2));
        const __m256i qx = _mm256_loadu_si256((const __m256i *)x[b].qs);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(rd_f16(w) * x[b].d), dot_i8(qw, qx), acc);
    }
    return hsum(acc);
}

T static float a_q4_0(const uint8_t *w, const pkv_q8a *x, int64_t nb) {
    __m256 acc = _mm256_setzero_ps();
    const __m128i m4 = _mm_set1_epi8(15);
    const __m256i off = _mm256_set1_epi8(8);
    for (int64_t b = 0; b < nb; b++, w += 18) {
        const __m128i raw = _mm_loadu_si128((const __m128i *)(w + 2));
        const __m128i lo = _mm_and_si128(raw, m4), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), m4);
        const __m256i qw = _mm256_sub_epi8(_mm256_set_m128i(hi, lo), off);
        const __m256i qx = _mm256_loadu_si256((const __m256i *)x[b].qs);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(rd_f16(w) * x[b].d), dot_i8(qw, qx), acc);
    }
    return hsum(acc);
}

T static void a_axpy(float *y, float a, const float *x, int64_t n) {
    const __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

const pkv_cpu_dots pkv_cpu_dots_avx2 = {
    .name = "avx2",
    .f32 = a_f32,
    .f16 = a_f16,
    .bf16 = a_bf16,
    .q8_0 = a_q8_0,
    .q4_0 = a_q4_0,
    .axpy = a_axpy,
};
#endif
