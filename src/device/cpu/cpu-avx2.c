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

/* Sum of 32 products of unsigned bytes u (<= 63) with signed bytes x, as 8 int32 lanes. */
T static inline __m256i dot_u8(__m256i u, __m256i x) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1));
}

T static inline __m256i q4_0_bytes(const uint8_t *w) {
    const __m128i raw = _mm_loadu_si128((const __m128i *)(w + 2));
    const __m128i m4 = _mm_set1_epi8(15);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), m4), _mm_and_si128(raw, m4));
}

T static float a_q4_0(const uint8_t *w, const pkv_q8a *x, int64_t nb) {
    /* two blocks per step into two accumulators, to overlap the FMA latencies */
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    float corr0 = 0, corr1 = 0; /* the -8 offset: 8 * d * sum(x) per block */
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2, w += 36) {
        const float d0 = rd_f16(w) * x[b].d, d1 = rd_f16(w + 18) * x[b + 1].d;
        const __m256i p0 = dot_u8(q4_0_bytes(w), _mm256_loadu_si256((const __m256i *)x[b].qs));
        const __m256i p1 = dot_u8(q4_0_bytes(w + 18), _mm256_loadu_si256((const __m256i *)x[b + 1].qs));
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(d0), _mm256_cvtepi32_ps(p0), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(d1), _mm256_cvtepi32_ps(p1), acc1);
        corr0 += d0 * (float)(8 * (x[b].s[0] + x[b].s[1]));
        corr1 += d1 * (float)(8 * (x[b + 1].s[0] + x[b + 1].s[1]));
    }
    for (; b < nb; b++, w += 18) {
        const float d0 = rd_f16(w) * x[b].d;
        const __m256i p0 = dot_u8(q4_0_bytes(w), _mm256_loadu_si256((const __m256i *)x[b].qs));
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(d0), _mm256_cvtepi32_ps(p0), acc0);
        corr0 += d0 * (float)(8 * (x[b].s[0] + x[b].s[1]));
    }
    return hsum(_mm256_add_ps(acc0, acc1)) - (corr0 + corr1);
}

static inline void scale_min(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 15) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* q4_k / q5_k (see cpu-dots.c for the algebra): per sub-block j one unsigned
 * byte dot with activation block j, scaled by dx*d*sc; mins folded via sums. */
T static inline float kmin(const uint8_t *w, const pkv_q8a *x, int64_t nb, bool five) {
    __m256 acc = _mm256_setzero_ps();
    float corr = 0;
    const __m256i m4 = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
    for (int64_t b = 0; b < nb; b++, w += five ? 176 : 144, x += 8) {
        const float d = rd_f16(w), dmin = rd_f16(w + 2);
        const uint8_t *qs = five ? w + 48 : w + 16;
        const __m256i qh = five ? _mm256_loadu_si256((const __m256i *)(w + 16)) : _mm256_setzero_si256();
        for (int g = 0; g < 4; g++) {
            const __m256i raw = _mm256_loadu_si256((const __m256i *)(qs + 32 * g));
            __m256i q0 = _mm256_and_si256(raw, m4), q1 = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
            if (five) {
                const __m256i h0 = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * g), one);
                const __m256i h1 = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * g + 1), one);
                q0 = _mm256_or_si256(q0, _mm256_slli_epi16(h0, 4));
                q1 = _mm256_or_si256(q1, _mm256_slli_epi16(h1, 4));
            }
            int sc0, m0, sc1, m1;
            scale_min(2 * g, w + 4, &sc0, &m0);
            scale_min(2 * g + 1, w + 4, &sc1, &m1);
            const pkv_q8a *x0 = &x[2 * g], *x1 = &x[2 * g + 1];
            const __m256i p0 = dot_u8(q0, _mm256_loadu_si256((const __m256i *)x0->qs));
            const __m256i p1 = dot_u8(q1, _mm256_loadu_si256((const __m256i *)x1->qs));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(x0->d * d * (float)sc0), _mm256_cvtepi32_ps(p0), acc);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(x1->d * d * (float)sc1), _mm256_cvtepi32_ps(p1), acc);
            corr += x0->d * dmin * (float)m0 * (float)(x0->s[0] + x0->s[1]) +
                    x1->d * dmin * (float)m1 * (float)(x1->s[0] + x1->s[1]);
        }
    }
    return hsum(acc) - corr;
}

T static float a_q4_k(const uint8_t *w, const pkv_q8a *x, int64_t nb) { return kmin(w, x, nb, false); }
T static float a_q5_k(const uint8_t *w, const pkv_q8a *x, int64_t nb) { return kmin(w, x, nb, true); }

T static float a_q6_k(const uint8_t *w, const pkv_q8a *x, int64_t nb) {
    __m256 acc = _mm256_setzero_ps();
    float corr = 0;
    const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(3);
    for (int64_t b = 0; b < nb; b++, w += 210, x += 8) {
        const float d = rd_f16(w + 208);
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
                /* int16 pair sums, then weighted by the two half-block scales */
                const __m256i p16 = _mm256_maddubs_epi16(q, _mm256_loadu_si256((const __m256i *)xb->qs));
                const __m256i scv = _mm256_set_m128i(_mm_set1_epi16((short)s1), _mm_set1_epi16((short)s0));
                const __m256i p32 = _mm256_madd_epi16(p16, scv);
                const float dd = d * xb->d;
                acc = _mm256_fmadd_ps(_mm256_set1_ps(dd), _mm256_cvtepi32_ps(p32), acc);
                corr += dd * (float)(32 * (s0 * xb->s[0] + s1 * xb->s[1]));
            }
        }
    }
    return hsum(acc) - corr;
}

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
    .q8_0 = a_q8_0,
    .q4_0 = a_q4_0,
    .q4_k = a_q4_k,
    .q5_k = a_q5_k,
    .q6_k = a_q6_k,
    .axpy = a_axpy,
    .f16_row = a_f16_row,
};
#endif
