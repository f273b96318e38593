/* AVX-512 (F, BW, VL) row dot products: 16-float lanes for the float weight
 * types; the 8-bit block dots reuse the AVX2 ones (a 32-element block fills one
 * 256-bit register, so wider vectors would need two blocks per step). */
#include "device/cpu/cpu-dots.h"

#ifdef PKV_CPU_X86
#include <immintrin.h>
#include <string.h>

#define T __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

T static float x_f32(const float *w, const float *x, int64_t n) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i), _mm512_loadu_ps(x + i), a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 16), _mm512_loadu_ps(x + i + 16), a1);
    }
    if (i + 16 <= n) {
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i), _mm512_loadu_ps(x + i), a0);
        i += 16;
    }
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w + i), _mm512_maskz_loadu_ps(m, x + i), a1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}

T static inline __m512 ld_f16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }

T static float x_f16(const uint16_t *w, const float *x, int64_t n) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm512_fmadd_ps(ld_f16(w + i), _mm512_loadu_ps(x + i), a0);
        a1 = _mm512_fmadd_ps(ld_f16(w + i + 16), _mm512_loadu_ps(x + i + 16), a1);
    }
    if (i + 16 <= n) {
        a0 = _mm512_fmadd_ps(ld_f16(w + i), _mm512_loadu_ps(x + i), a0);
        i += 16;
    }
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        const __m512 wv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, w + i));
        a1 = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, x + i), a1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}

T static inline __m512 ld_bf16(const uint16_t *p) {
    __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}

T static float x_bf16(const uint16_t *w, const float *x, int64_t n) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm512_fmadd_ps(ld_bf16(w + i), _mm512_loadu_ps(x + i), a0);
        a1 = _mm512_fmadd_ps(ld_bf16(w + i + 16), _mm512_loadu_ps(x + i + 16), a1);
    }
    float s = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
    for (; i < n; i++) {
        uint32_t u = (uint32_t)w[i] << 16;
        float f;
        memcpy(&f, &u, 4);
        s += f * x[i];
    }
    return s;
}

T static void x_axpy(float *y, float a, const float *x, int64_t n) {
    const __m512 va = _mm512_set1_ps(a);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

/* NULL slots: cpu-kernels.c uses the AVX2 function instead. */
const pkv_cpu_dots pkv_cpu_dots_avx512 = {
    .name = "avx512",
    .f32 = x_f32,
    .f16 = x_f16,
    .bf16 = x_bf16,
    .q8_0 = NULL,
    .q4_0 = NULL,
    .axpy = x_axpy,
};
#endif
