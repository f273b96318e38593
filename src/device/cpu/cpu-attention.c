/* The CPU attention's inner loops (cpu-attention.h): plain C, AVX2 / AVX-512
 * versions compiled with per-function target attributes, and a NEON version
 * (ARMv8.0 Advanced SIMD, shared by the neon, dotprod and i8mm paths: these
 * loops are float work, which the extensions do not change). */
#include "device/cpu/cpu-attention.h"

#include "device/cpu/cpu-dots.h" /* PKV_CPU_X86 */

#include <math.h>
#include <string.h>

/* ---------------------------------------------------------------- generic */

static void g_cvt(const uint16_t *src, float *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = pkv_f16_to_f32(src[i]);
}

static inline float g_d(const uint8_t *b) { return pkv_f16_to_f32((uint16_t)(b[0] | b[1] << 8)); }

static void g_deq(pkv_type t, const uint8_t *src, float *dst, int64_t n) {
    if (t == PKV_TYPE_Q8_0) {
        for (int64_t b = 0; b < n / 32; b++, src += 34, dst += 32) {
            const float d = g_d(src);
            for (int j = 0; j < 32; j++) dst[j] = d * (float)(int8_t)src[2 + j];
        }
        return;
    }
    for (int64_t b = 0; b < n / 32; b++, src += 18, dst += 32) {
        const float d = g_d(src);
        for (int j = 0; j < 16; j++) {
            dst[j] = d * (float)((src[2 + j] & 15) - 8);
            dst[j + 16] = d * (float)((src[2 + j] >> 4) - 8);
        }
    }
}

static float g_tree(float *l) {
    for (int w = 8; w >= 1; w /= 2)
        for (int j = 0; j < w; j++) l[j] = l[j] + l[j + w];
    return l[0];
}

static void g_scores(const float *const *k, const float *q, int64_t qs, int nr, int64_t d, float scale, float *s,
                     int64_t ss) {
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < PKV_ATT_TOKENS; c++) {
            const float *kc = k[c], *qr = q + r * qs;
            float l[16] = {0};
            int64_t i = 0;
            for (; i + 16 <= d; i += 16)
                for (int j = 0; j < 16; j++) l[j] += kc[i + j] * qr[i + j];
            for (int j = 0; i + j < d; j++) l[j] += kc[i + j] * qr[i + j];
            s[r * ss + c] = scale * g_tree(l);
        }
}

static void g_vsum(float *acc, const float *p, const float *const *v, int n, int64_t dv) {
    for (int c = 0; c < n; c++)
        for (int64_t i = 0; i < dv; i++) acc[i] += p[c] * v[c][i];
}

static float g_softexp(float *p, int n, float m) {
    float l = 0;
    for (int c = 0; c < n; c++) {
        p[c] = expf(p[c] - m);
        l += p[c];
    }
    return l;
}

static const pkv_cpu_att att_generic = {"generic", g_cvt, g_deq, g_scores, g_softexp, g_vsum};

#ifdef PKV_CPU_X86
#include <immintrin.h>

/* ------------------------------------------------------------------- avx2 */

#define T2 __attribute__((target("avx2,fma,f16c")))

T2 static void a2_cvt(const uint16_t *src, float *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++) dst[i] = pkv_f16_to_f32(src[i]);
}

/* A block's f16 scale with F16C (exact, as pkv_f16_to_f32, without a call). */
T2 static inline __m256 a2_d(const uint8_t *b) {
    uint16_t h;
    memcpy(&h, b, 2);
    return _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}

T2 static void a2_deq(pkv_type t, const uint8_t *src, float *dst, int64_t n) {
    if (t == PKV_TYPE_Q8_0) {
        for (int64_t b = 0; b < n / 32; b++, src += 34, dst += 32) {
            const __m256 d = a2_d(src);
            for (int j = 0; j < 32; j += 8) {
                const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(src + 2 + j)));
                _mm256_storeu_ps(dst + j, _mm256_mul_ps(d, _mm256_cvtepi32_ps(q)));
            }
        }
        return;
    }
    const __m128i lo4 = _mm_set1_epi8(15), eight = _mm_set1_epi8(8);
    for (int64_t b = 0; b < n / 32; b++, src += 18, dst += 32) {
        const __m256 d = a2_d(src);
        const __m128i x = _mm_loadu_si128((const __m128i *)(const void *)(src + 2));
        const __m128i l = _mm_sub_epi8(_mm_and_si128(x, lo4), eight);
        const __m128i h = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(x, 4), lo4), eight);
        _mm256_storeu_ps(dst, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(l))));
        _mm256_storeu_ps(dst + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(l, 8)))));
        _mm256_storeu_ps(dst + 16, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(h))));
        _mm256_storeu_ps(dst + 24, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(h, 8)))));
    }
}

/* lanes lo (0..7) and hi (8..15) summed in the tree of cpu-attention.h */
T2 static inline float a2_tree(__m256 lo, __m256 hi) {
    const __m256 v = _mm256_add_ps(lo, hi);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

T2 static void a2_scores(const float *const *k, const float *q, int64_t qs, int nr, int64_t d, float scale, float *s,
                         int64_t ss) {
    if (d % 16) {
        g_scores(k, q, qs, nr, d, scale, s, ss);
        return;
    }
    for (int r = 0; r < nr; r++) {
        const float *qr = q + r * qs;
        for (int c = 0; c < PKV_ATT_TOKENS; c += 4) {
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, b0 = a0, b1 = a0, c0 = a0, c1 = a0, d0 = a0, d1 = a0;
            const float *k0 = k[c], *k1 = k[c + 1], *k2 = k[c + 2], *k3 = k[c + 3];
            for (int64_t i = 0; i < d; i += 16) {
                const __m256 q0 = _mm256_loadu_ps(qr + i), q1 = _mm256_loadu_ps(qr + i + 8);
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(k0 + i), q0, a0);
                a1 = _mm256_fmadd_ps(_mm256_loadu_ps(k0 + i + 8), q1, a1);
                b0 = _mm256_fmadd_ps(_mm256_loadu_ps(k1 + i), q0, b0);
                b1 = _mm256_fmadd_ps(_mm256_loadu_ps(k1 + i + 8), q1, b1);
                c0 = _mm256_fmadd_ps(_mm256_loadu_ps(k2 + i), q0, c0);
                c1 = _mm256_fmadd_ps(_mm256_loadu_ps(k2 + i + 8), q1, c1);
                d0 = _mm256_fmadd_ps(_mm256_loadu_ps(k3 + i), q0, d0);
                d1 = _mm256_fmadd_ps(_mm256_loadu_ps(k3 + i + 8), q1, d1);
            }
            s[r * ss + c] = scale * a2_tree(a0, a1);
            s[r * ss + c + 1] = scale * a2_tree(b0, b1);
            s[r * ss + c + 2] = scale * a2_tree(c0, c1);
            s[r * ss + c + 3] = scale * a2_tree(d0, d1);
        }
    }
}

T2 static void a2_vsum(float *acc, const float *p, const float *const *v, int n, int64_t dv) {
    int64_t i = 0;
    for (; i + 32 <= dv; i += 32) {
        __m256 a0 = _mm256_loadu_ps(acc + i), a1 = _mm256_loadu_ps(acc + i + 8), a2 = _mm256_loadu_ps(acc + i + 16),
               a3 = _mm256_loadu_ps(acc + i + 24);
        for (int c = 0; c < n; c++) {
            const __m256 pc = _mm256_broadcast_ss(p + c);
            a0 = _mm256_fmadd_ps(pc, _mm256_loadu_ps(v[c] + i), a0);
            a1 = _mm256_fmadd_ps(pc, _mm256_loadu_ps(v[c] + i + 8), a1);
            a2 = _mm256_fmadd_ps(pc, _mm256_loadu_ps(v[c] + i + 16), a2);
            a3 = _mm256_fmadd_ps(pc, _mm256_loadu_ps(v[c] + i + 24), a3);
        }
        _mm256_storeu_ps(acc + i, a0);
        _mm256_storeu_ps(acc + i + 8, a1);
        _mm256_storeu_ps(acc + i + 16, a2);
        _mm256_storeu_ps(acc + i + 24, a3);
    }
    for (; i + 8 <= dv; i += 8) {
        __m256 a0 = _mm256_loadu_ps(acc + i);
        for (int c = 0; c < n; c++) a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(p + c), _mm256_loadu_ps(v[c] + i), a0);
        _mm256_storeu_ps(acc + i, a0);
    }
    for (; i < dv; i++)
        for (int c = 0; c < n; c++) acc[i] = __builtin_fmaf(p[c], v[c][i], acc[i]);
}

/* exp(x) for x <= 0: 2^k * e^r, |r| <= ln2/2, e^r by its Taylor polynomial to
 * r^6 (relative error about 2e-7); below -87 it returns about 1e-38 or 0. */
T2 static inline __m256 a2_exp(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693145752f), x);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(1.42860677e-6f), r);
    __m256 y = _mm256_set1_ps(1.0f / 720);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.0f / 120));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.0f / 24));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.0f / 6));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(0.5f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.0f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

T2 static float a2_softexp(float *p, int n, float m) {
    float buf[16] = {0};
    memcpy(buf, p, (size_t)n * sizeof(float));
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 mv = _mm256_set1_ps(m);
    /* lanes at or past n are 0, so they add nothing to the tree */
    const __m256 ok0 = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n), idx));
    const __m256 ok1 = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n - 8), idx));
    const __m256 e0 = _mm256_and_ps(a2_exp(_mm256_sub_ps(_mm256_loadu_ps(buf), mv)), ok0);
    const __m256 e1 = _mm256_and_ps(a2_exp(_mm256_sub_ps(_mm256_loadu_ps(buf + 8), mv)), ok1);
    _mm256_storeu_ps(buf, e0);
    _mm256_storeu_ps(buf + 8, e1);
    memcpy(p, buf, (size_t)n * sizeof(float));
    return a2_tree(e0, e1);
}

static const pkv_cpu_att att_avx2 = {"avx2", a2_cvt, a2_deq, a2_scores, a2_softexp, a2_vsum};

/* ----------------------------------------------------------------- avx512 */

#define T5 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

T5 static void a5_cvt(const uint16_t *src, float *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
    for (; i < n; i++) dst[i] = pkv_f16_to_f32(src[i]);
}

T5 static inline __m512 a5_d(const uint8_t *b) {
    uint16_t h;
    memcpy(&h, b, 2);
    return _mm512_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}

T5 static void a5_deq(pkv_type t, const uint8_t *src, float *dst, int64_t n) {
    if (t == PKV_TYPE_Q8_0) {
        for (int64_t b = 0; b < n / 32; b++, src += 34, dst += 32) {
            const __m512 d = a5_d(src);
            const __m512i q0 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(src + 2)));
            const __m512i q1 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(src + 18)));
            _mm512_storeu_ps(dst, _mm512_mul_ps(d, _mm512_cvtepi32_ps(q0)));
            _mm512_storeu_ps(dst + 16, _mm512_mul_ps(d, _mm512_cvtepi32_ps(q1)));
        }
        return;
    }
    const __m128i lo4 = _mm_set1_epi8(15), eight = _mm_set1_epi8(8);
    for (int64_t b = 0; b < n / 32; b++, src += 18, dst += 32) {
        const __m512 d = a5_d(src);
        const __m128i x = _mm_loadu_si128((const __m128i *)(const void *)(src + 2));
        const __m128i l = _mm_sub_epi8(_mm_and_si128(x, lo4), eight);
        const __m128i h = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(x, 4), lo4), eight);
        _mm512_storeu_ps(dst, _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(l))));
        _mm512_storeu_ps(dst + 16, _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(h))));
    }
}

/* Pairs of 16-lane sums folded so that each keeps the tree of cpu-attention.h. */
T5 static inline __m512 a5_l1(__m512 x, __m512 y) { /* j + 8: [x 0..7, y 0..7] */
    return _mm512_add_ps(_mm512_shuffle_f32x4(x, y, 0x44), _mm512_shuffle_f32x4(x, y, 0xEE));
}
T5 static inline __m512 a5_l2(__m512 x, __m512 y) { /* j + 4: 4 x 4 partials */
    return _mm512_add_ps(_mm512_shuffle_f32x4(x, y, 0x88), _mm512_shuffle_f32x4(x, y, 0xDD));
}
T5 static inline __m512 a5_l3(__m512 x, __m512 y) { /* j + 2 */
    return _mm512_add_ps(_mm512_shuffle_ps(x, y, 0x44), _mm512_shuffle_ps(x, y, 0xEE));
}
T5 static inline __m512 a5_l4(__m512 x, __m512 y) { /* j + 1 */
    return _mm512_add_ps(_mm512_shuffle_ps(x, y, 0x88), _mm512_shuffle_ps(x, y, 0xDD));
}

#define A5_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15)

T5 static void a5_scores(const float *const *k, const float *q, int64_t qs, int nr, int64_t d, float scale, float *s,
                         int64_t ss) {
    if (d % 16) {
        g_scores(k, q, qs, nr, d, scale, s, ss);
        return;
    }
    /* where token c's sum lands after the folds (see a5_order below) */
    static const int order[16] = {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};
    const __m512i perm = _mm512_loadu_si512(order);
    const __m512 sc = _mm512_set1_ps(scale);
    for (int r = 0; r < nr; r++) {
        const float *qr = q + r * qs;
#define DECL(c) __m512 a##c = _mm512_setzero_ps(); const float *k##c = k[c];
        A5_ROWS(DECL)
#undef DECL
        for (int64_t i = 0; i < d; i += 16) {
            const __m512 qv = _mm512_loadu_ps(qr + i);
#define FMA(c) a##c = _mm512_fmadd_ps(_mm512_loadu_ps(k##c + i), qv, a##c);
            A5_ROWS(FMA)
#undef FMA
        }
        const __m512 b0 = a5_l1(a0, a1), b1 = a5_l1(a2, a3), b2 = a5_l1(a4, a5), b3 = a5_l1(a6, a7);
        const __m512 b4 = a5_l1(a8, a9), b5 = a5_l1(a10, a11), b6 = a5_l1(a12, a13), b7 = a5_l1(a14, a15);
        const __m512 c0 = a5_l2(b0, b1), c1 = a5_l2(b2, b3), c2 = a5_l2(b4, b5), c3 = a5_l2(b6, b7);
        const __m512 d0 = a5_l3(c0, c1), d1 = a5_l3(c2, c3);
        const __m512 e = a5_l4(d0, d1);
        _mm512_storeu_ps(s + r * ss, _mm512_mul_ps(sc, _mm512_permutexvar_ps(perm, e)));
    }
}

T5 static void a5_vsum(float *acc, const float *p, const float *const *v, int n, int64_t dv) {
    int64_t i = 0;
    for (; i + 128 <= dv; i += 128) { /* eight chains: enough to hide the FMA latency */
        __m512 a[8];
        for (int x = 0; x < 8; x++) a[x] = _mm512_loadu_ps(acc + i + 16 * x);
        for (int c = 0; c < n; c++) {
            const __m512 pc = _mm512_set1_ps(p[c]);
            for (int x = 0; x < 8; x++) a[x] = _mm512_fmadd_ps(pc, _mm512_loadu_ps(v[c] + i + 16 * x), a[x]);
        }
        for (int x = 0; x < 8; x++) _mm512_storeu_ps(acc + i + 16 * x, a[x]);
    }
    for (; i + 64 <= dv; i += 64) {
        __m512 a0 = _mm512_loadu_ps(acc + i), a1 = _mm512_loadu_ps(acc + i + 16), a2 = _mm512_loadu_ps(acc + i + 32),
               a3 = _mm512_loadu_ps(acc + i + 48);
        for (int c = 0; c < n; c++) {
            const __m512 pc = _mm512_set1_ps(p[c]);
            a0 = _mm512_fmadd_ps(pc, _mm512_loadu_ps(v[c] + i), a0);
            a1 = _mm512_fmadd_ps(pc, _mm512_loadu_ps(v[c] + i + 16), a1);
            a2 = _mm512_fmadd_ps(pc, _mm512_loadu_ps(v[c] + i + 32), a2);
            a3 = _mm512_fmadd_ps(pc, _mm512_loadu_ps(v[c] + i + 48), a3);
        }
        _mm512_storeu_ps(acc + i, a0);
        _mm512_storeu_ps(acc + i + 16, a1);
        _mm512_storeu_ps(acc + i + 32, a2);
        _mm512_storeu_ps(acc + i + 48, a3);
    }
    for (; i + 16 <= dv; i += 16) {
        __m512 a0 = _mm512_loadu_ps(acc + i);
        for (int c = 0; c < n; c++) a0 = _mm512_fmadd_ps(_mm512_set1_ps(p[c]), _mm512_loadu_ps(v[c] + i), a0);
        _mm512_storeu_ps(acc + i, a0);
    }
    for (; i < dv; i++)
        for (int c = 0; c < n; c++) acc[i] = __builtin_fmaf(p[c], v[c][i], acc[i]);
}

/* exp(x) for x <= 0 as in a2_exp, scaled by 2^k with vscalefps. */
T5 static inline __m512 a5_exp(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
    const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693145752f), x);
    r = _mm512_fnmadd_ps(k, _mm512_set1_ps(1.42860677e-6f), r);
    __m512 y = _mm512_set1_ps(1.0f / 720);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f / 120));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f / 24));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f / 6));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(0.5f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(y, k);
}

T5 static float a5_softexp(float *p, int n, float m) {
    const __mmask16 ok = (__mmask16)((1u << n) - 1);
    const __m512 e = _mm512_maskz_mov_ps(ok, a5_exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(ok, p), _mm512_set1_ps(m))));
    _mm512_mask_storeu_ps(p, ok, e);
    /* the tree of a5_scores' folds for one sum; lanes past n are 0 */
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(e), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1)));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static const pkv_cpu_att att_avx512 = {"avx512", a5_cvt, a5_deq, a5_scores, a5_softexp, a5_vsum};
#endif

#ifdef PKV_CPU_ARM
#include <arm_neon.h>

/* ------------------------------------------------------------------- neon */

static void n_cvt(const uint16_t *src, float *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(dst + i, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(src + i))));
    for (; i < n; i++) dst[i] = pkv_f16_to_f32(src[i]);
}

/* 16 signed bytes times d into dst[0..16) (exact products: the bits of g_deq) */
static inline void n_deq16(int8x16_t q, float d, float *dst) {
    const int16x8_t lo = vmovl_s8(vget_low_s8(q)), hi = vmovl_high_s8(q);
    vst1q_f32(dst, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))), d));
    vst1q_f32(dst + 4, vmulq_n_f32(vcvtq_f32_s32(vmovl_high_s16(lo)), d));
    vst1q_f32(dst + 8, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))), d));
    vst1q_f32(dst + 12, vmulq_n_f32(vcvtq_f32_s32(vmovl_high_s16(hi)), d));
}

static void n_deq(pkv_type t, const uint8_t *src, float *dst, int64_t n) {
    if (t == PKV_TYPE_Q8_0) {
        for (int64_t b = 0; b < n / 32; b++, src += 34, dst += 32) {
            const float d = g_d(src);
            n_deq16(vld1q_s8((const int8_t *)src + 2), d, dst);
            n_deq16(vld1q_s8((const int8_t *)src + 18), d, dst + 16);
        }
        return;
    }
    for (int64_t b = 0; b < n / 32; b++, src += 18, dst += 32) {
        const float d = g_d(src);
        const uint8x16_t x = vld1q_u8(src + 2);
        const int8x16_t eight = vdupq_n_s8(8);
        n_deq16(vsubq_s8(vreinterpretq_s8_u8(vandq_u8(x, vdupq_n_u8(15))), eight), d, dst);
        n_deq16(vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(x, 4)), eight), d, dst + 16);
    }
}

/* Lanes 0-3, 4-7, 8-11, 12-15 of a 16-lane sum added in the tree of
 * cpu-attention.h: j + 8, j + 4, j + 2, j + 1. */
static inline float n_tree(float32x4_t a0, float32x4_t a1, float32x4_t a2, float32x4_t a3) {
    const float32x4_t c = vaddq_f32(vaddq_f32(a0, a2), vaddq_f32(a1, a3));
    const float32x2_t e = vadd_f32(vget_low_f32(c), vget_high_f32(c));
    return vget_lane_f32(e, 0) + vget_lane_f32(e, 1);
}

static void n_scores(const float *const *k, const float *q, int64_t qs, int nr, int64_t d, float scale, float *s,
                     int64_t ss) {
    if (d % 16) {
        g_scores(k, q, qs, nr, d, scale, s, ss);
        return;
    }
    for (int r = 0; r < nr; r++) {
        const float *qr = q + r * qs;
        for (int c = 0; c < PKV_ATT_TOKENS; c += 4) { /* 4 tokens x 16 lanes: 16 accumulators */
            float32x4_t a[4][4];
            for (int t = 0; t < 4; t++)
                for (int l = 0; l < 4; l++) a[t][l] = vdupq_n_f32(0);
            for (int64_t i = 0; i < d; i += 16) {
                float32x4_t qv[4];
                for (int l = 0; l < 4; l++) qv[l] = vld1q_f32(qr + i + 4 * l);
                for (int t = 0; t < 4; t++)
                    for (int l = 0; l < 4; l++) a[t][l] = vfmaq_f32(a[t][l], vld1q_f32(k[c + t] + i + 4 * l), qv[l]);
            }
            for (int t = 0; t < 4; t++) s[r * ss + c + t] = scale * n_tree(a[t][0], a[t][1], a[t][2], a[t][3]);
        }
    }
}

static void n_vsum(float *acc, const float *p, const float *const *v, int n, int64_t dv) {
    int64_t i = 0;
    for (; i + 32 <= dv; i += 32) { /* eight chains: enough to hide the FMA latency */
        float32x4_t a[8];
        for (int x = 0; x < 8; x++) a[x] = vld1q_f32(acc + i + 4 * x);
        for (int c = 0; c < n; c++) {
            const float pc = p[c];
            for (int x = 0; x < 8; x++) a[x] = vfmaq_n_f32(a[x], vld1q_f32(v[c] + i + 4 * x), pc);
        }
        for (int x = 0; x < 8; x++) vst1q_f32(acc + i + 4 * x, a[x]);
    }
    for (; i + 4 <= dv; i += 4) {
        float32x4_t a0 = vld1q_f32(acc + i);
        for (int c = 0; c < n; c++) a0 = vfmaq_n_f32(a0, vld1q_f32(v[c] + i), p[c]);
        vst1q_f32(acc + i, a0);
    }
    for (; i < dv; i++)
        for (int c = 0; c < n; c++) acc[i] = __builtin_fmaf(p[c], v[c][i], acc[i]);
}

/* exp(x) for x <= 0 as a2_exp: 2^k * e^r, |r| <= ln2/2, e^r by its Taylor
 * polynomial to r^6; below -87 about 1e-38 or 0. */
static inline float32x4_t n_exp(float32x4_t x) {
    x = vmaxq_f32(x, vdupq_n_f32(-87.0f));
    const float32x4_t k = vrndnq_f32(vmulq_n_f32(x, 1.44269504f));
    float32x4_t r = vfmsq_f32(x, k, vdupq_n_f32(0.693145752f));
    r = vfmsq_f32(r, k, vdupq_n_f32(1.42860677e-6f));
    float32x4_t y = vdupq_n_f32(1.0f / 720);
    y = vfmaq_f32(vdupq_n_f32(1.0f / 120), y, r);
    y = vfmaq_f32(vdupq_n_f32(1.0f / 24), y, r);
    y = vfmaq_f32(vdupq_n_f32(1.0f / 6), y, r);
    y = vfmaq_f32(vdupq_n_f32(0.5f), y, r);
    y = vfmaq_f32(vdupq_n_f32(1.0f), y, r);
    y = vfmaq_f32(vdupq_n_f32(1.0f), y, r);
    const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(k), vdupq_n_s32(127)), 23);
    return vmulq_f32(y, vreinterpretq_f32_s32(e));
}

static float n_softexp(float *p, int n, float m) {
    float buf[16] = {0};
    memcpy(buf, p, (size_t)n * sizeof(float));
    float32x4_t e[4];
    for (int l = 0; l < 4; l++) {
        /* lanes at or past n are 0, so they add nothing to the tree */
        const int32x4_t idx = vaddq_s32(vld1q_s32((const int32_t[4]){0, 1, 2, 3}), vdupq_n_s32(4 * l));
        const uint32x4_t ok = vcltq_s32(idx, vdupq_n_s32(n));
        e[l] = vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(n_exp(vsubq_f32(vld1q_f32(buf + 4 * l), vdupq_n_f32(m)))), ok));
        vst1q_f32(buf + 4 * l, e[l]);
    }
    memcpy(p, buf, (size_t)n * sizeof(float));
    return n_tree(e[0], e[1], e[2], e[3]);
}

static const pkv_cpu_att att_neon = {"neon", n_cvt, n_deq, n_scores, n_softexp, n_vsum};
#endif

const pkv_cpu_att *pkv_cpu_att_for(const char *path) {
#ifdef PKV_CPU_X86
    if (path && !strcmp(path, "avx512")) return &att_avx512;
    if (path && !strcmp(path, "avx2")) return &att_avx2;
#endif
#ifdef PKV_CPU_ARM
    if (path && (!strcmp(path, "neon") || !strcmp(path, "dotprod") || !strcmp(path, "i8mm"))) return &att_neon;
#endif
    (void)path;
    return &att_generic;
}
