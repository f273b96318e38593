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
    .axpy = x_axpy,
};
#endif

#ifdef PKV_CPU_X86
#define V __attribute__((target("avx512vnni,avx512vl,avx512f,avx512bw,avx2,fma,f16c")))

V static inline float v_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

V static inline float v_f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* 8 int32 lanes, lane i = sum of u[4i..4i+3] * x[4i..4i+3] (u unsigned, x signed). */
V static inline __m256i v_dot(__m256i u, __m256i x) { return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, x); }

V static float v_q8_0(const uint8_t *w, const pkv_q8a *x, int64_t nb) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++, w += 34) {
        const __m256i qw = _mm256_loadu_si256((const __m256i *)(w + 2));
        const __m256i qx = _mm256_loadu_si256((const __m256i *)x[b].qs);
        const __m256i p = v_dot(_mm256_sign_epi8(qw, qw), _mm256_sign_epi8(qx, qw));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(v_f16(w) * x[b].d), _mm256_cvtepi32_ps(p), acc);
    }
    return v_hsum(acc);
}

V static float v_q4_0(const uint8_t *w, const pkv_q8a *x, int64_t nb) {
    __m256 acc = _mm256_setzero_ps();
    float corr = 0;
    const __m128i m4 = _mm_set1_epi8(15);
    for (int64_t b = 0; b < nb; b++, w += 18) {
        const __m128i raw = _mm_loadu_si128((const __m128i *)(w + 2));
        const __m256i q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), m4), _mm_and_si128(raw, m4));
        const float dd = v_f16(w) * x[b].d;
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dd), _mm256_cvtepi32_ps(v_dot(q, _mm256_loadu_si256((const __m256i *)x[b].qs))), acc);
        corr += dd * (float)(8 * (x[b].s[0] + x[b].s[1]));
    }
    return v_hsum(acc) - corr;
}

static inline void v_scale_min(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 15) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

V static inline float v_kmin(const uint8_t *w, const pkv_q8a *x, int64_t nb, bool five) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    float corr = 0;
    const __m256i m4 = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
    for (int64_t b = 0; b < nb; b++, w += five ? 176 : 144, x += 8) {
        const float d = v_f16(w), dmin = v_f16(w + 2);
        const uint8_t *qs = five ? w + 48 : w + 16;
        const __m256i qh = five ? _mm256_loadu_si256((const __m256i *)(w + 16)) : _mm256_setzero_si256();
        for (int g = 0; g < 4; g++) {
            const __m256i raw = _mm256_loadu_si256((const __m256i *)(qs + 32 * g));
            __m256i q0 = _mm256_and_si256(raw, m4), q1 = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
            if (five) {
                q0 = _mm256_or_si256(q0, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * g), one), 4));
                q1 = _mm256_or_si256(q1, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * g + 1), one), 4));
            }
            int sc0, m0, sc1, m1;
            v_scale_min(2 * g, w + 4, &sc0, &m0);
            v_scale_min(2 * g + 1, w + 4, &sc1, &m1);
            const pkv_q8a *x0 = &x[2 * g], *x1 = &x[2 * g + 1];
            const __m256i p0 = v_dot(q0, _mm256_loadu_si256((const __m256i *)x0->qs));
            const __m256i p1 = v_dot(q1, _mm256_loadu_si256((const __m256i *)x1->qs));
            acc0 = _mm256_fmadd_ps(_mm256_set1_ps(x0->d * d * (float)sc0), _mm256_cvtepi32_ps(p0), acc0);
            acc1 = _mm256_fmadd_ps(_mm256_set1_ps(x1->d * d * (float)sc1), _mm256_cvtepi32_ps(p1), acc1);
            corr += x0->d * dmin * (float)m0 * (float)(x0->s[0] + x0->s[1]) +
                    x1->d * dmin * (float)m1 * (float)(x1->s[0] + x1->s[1]);
        }
    }
    return v_hsum(_mm256_add_ps(acc0, acc1)) - corr;
}

V static float v_q4_k(const uint8_t *w, const pkv_q8a *x, int64_t nb) { return v_kmin(w, x, nb, false); }
V static float v_q5_k(const uint8_t *w, const pkv_q8a *x, int64_t nb) { return v_kmin(w, x, nb, true); }

V static float v_q6_k(const uint8_t *w, const pkv_q8a *x, int64_t nb) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    float corr = 0;
    const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(3);
    for (int64_t b = 0; b < nb; b++, w += 210, x += 8) {
        const float d = v_f16(w + 208);
        const int8_t *sc = (const int8_t *)(w + 192);
        for (int h = 0; h < 2; h++) {
            const __m256i la = _mm256_loadu_si256((const __m256i *)(w + 64 * h));
            const __m256i lb = _mm256_loadu_si256((const __m256i *)(w + 64 * h + 32));
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(w + 128 + 32 * h));
            for (int k = 0; k < 4; k++) {
                const __m256i l = k & 1 ? lb : la;
                const __m256i lo = k < 2 ? _mm256_and_si256(l, m4) : _mm256_and_si256(_mm256_srli_epi16(l, 4), m4);
                const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), m2);
                const __m256i q = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
                const pkv_q8a *xb = &x[4 * h + k];
                const int s0 = sc[8 * h + 2 * k], s1 = sc[8 * h + 2 * k + 1];
                const float dd = d * xb->d;
                /* lanes 0-3 hold elements 0-15 (scale s0), lanes 4-7 elements 16-31 (s1) */
                const __m256 scv = _mm256_set_m128(_mm_set1_ps(dd * (float)s1), _mm_set1_ps(dd * (float)s0));
                const __m256 p = _mm256_cvtepi32_ps(v_dot(q, _mm256_loadu_si256((const __m256i *)xb->qs)));
                if (k & 1)
                    acc1 = _mm256_fmadd_ps(scv, p, acc1);
                else
                    acc0 = _mm256_fmadd_ps(scv, p, acc0);
                corr += dd * (float)(32 * (s0 * xb->s[0] + s1 * xb->s[1]));
            }
        }
    }
    return v_hsum(_mm256_add_ps(acc0, acc1)) - corr;
}

const pkv_cpu_dots pkv_cpu_dots_vnni = {
    .name = "avx512",
    .q8_0 = v_q8_0,
    .q4_0 = v_q4_0,
    .q4_k = v_q4_k,
    .q5_k = v_q5_k,
    .q6_k = v_q6_k,
};
#endif
