/* AVX-512 (F, BW, VL) row dot products: 16-float lanes for the float weight
 * types. The 8-bit block dots stay 256 bits wide (a 32-element block fills one
 * register) and use VNNI's vpdpbusd where the CPU has AVX512-VNNI
 * (pkv_cpu_dots_vnni); otherwise the AVX2 ones. */
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

__attribute__((always_inline)) T static inline __m512 ldw(const void *w, int kind, int64_t i) {
    if (kind == 0) return _mm512_loadu_ps((const float *)w + i);
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

/* One weight row against four x rows (see cpu-avx2.c). */
__attribute__((always_inline)) T static inline void fx4(const void *w, int kind, const float *x, int64_t xs, int64_t n,
                                                        float *out) {
    __m512 a[8];
    for (int r = 0; r < 8; r++) a[r] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m512 w0 = ldw(w, kind, i), w1 = ldw(w, kind, i + 16);
        for (int r = 0; r < 4; r++) {
            a[r] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + r * xs + i), a[r]);
            a[r + 4] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + r * xs + i + 16), a[r + 4]);
        }
    }
    for (int r = 0; r < 4; r++) {
        float s = _mm512_reduce_add_ps(_mm512_add_ps(a[r], a[r + 4]));
        for (int64_t k = i; k < n; k++) s += w_at(w, kind, k) * x[r * xs + k];
        out[r] = s;
    }
}

T static void x_f32x(const float *w, const float *x, int64_t xs, int64_t n, int nx, float *out) {
    if (nx == 4)
        fx4(w, 0, x, xs, n, out);
    else
        for (int r = 0; r < nx; r++) out[r] = x_f32(w, x + r * xs, n);
}
T static void x_f16x(const uint16_t *w, const float *x, int64_t xs, int64_t n, int nx, float *out) {
    if (nx == 4)
        fx4(w, 1, x, xs, n, out);
    else
        for (int r = 0; r < nx; r++) out[r] = x_f16(w, x + r * xs, n);
}
T static void x_bf16x(const uint16_t *w, const float *x, int64_t xs, int64_t n, int nx, float *out) {
    if (nx == 4)
        fx4(w, 2, x, xs, n, out);
    else
        for (int r = 0; r < nx; r++) out[r] = x_bf16(w, x + r * xs, n);
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
    .f32x = x_f32x,
    .f16x = x_f16x,
    .bf16x = x_bf16x,
    .axpy = x_axpy,
};
#endif

#ifdef PKV_CPU_X86
#define V __attribute__((target("avx512vnni,avx512vl,avx512f,avx512bw,avx2,fma,f16c")))

/* 8 int32 lanes, lane i = sum of u[4i..4i+3] * x[4i..4i+3] (u unsigned, x signed). */
V static inline __m256i v_dot(__m256i u, __m256i x) { return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, x); }

#define QB_T V static
#define QB_DOT_U8(u, x) v_dot(u, x)
#define QB_NAME(n) v_##n
#include "device/cpu/cpu-qdot-body.h"
#undef QB_T
#undef QB_DOT_U8
#undef QB_NAME

const pkv_cpu_dots pkv_cpu_dots_vnni = {
    .name = "avx512",
    .q8_0 = v_q8_0,
    .q4_0 = v_q4_0,
    .q4_k = v_q4_k,
    .q5_k = v_q5_k,
    .q6_k = v_q6_k,
};
#endif
