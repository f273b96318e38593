/* The x86 8-bit block dots, written once and compiled twice: by cpu-avx2.c with
 * maddubs+madd as the byte dot, and by cpu-avx512.c with VNNI's vpdpbusd. The
 * includer defines:
 *   QB_T             function attributes (target, static)
 *   QB_DOT_U8(u, x)  8 int32 lanes; lane i = sum of u[4i..4i+3] * x[4i..4i+3],
 *                    u unsigned bytes (<= 128 in the products used here), x signed
 *   QB_NAME(n)       the name of the exported function for type n
 *   QB_VNNI          1 for the VNNI build (accumulation order, see below)
 *   QB_NXMAX         8 or 4: the most activation rows one pass over a weight row
 *                    serves (both builds use 8: measured faster than 4 on AVX2
 *                    too, despite its 16 ymm registers)
 * Each function computes the dot of one weight row with nx (1..8) activation rows
 * (x, x + xs, x + 2xs, ... in blocks) and writes out[0..nx). Rows go in groups
 * of 8, then 4, then one at a time: within a group each weight block
 * is decoded once and used by every row of the group (prefill and batched
 * decode). A row gets the same operations in every group size (the bodies are
 * written per row, NX only repeats them), so its result does not depend on the
 * batch.
 * The algebra is in cpu-dots.c (generic versions). */

#define QB_AI __attribute__((always_inline)) QB_T inline

QB_T inline float QB_NAME(hsum)(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

QB_T inline float QB_NAME(half)(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

static inline void QB_NAME(scale_min)(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 15) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

#define QB_XQS(p) _mm256_loadu_si256((const __m256i *)(p)->qs)

QB_AI void QB_NAME(q8_0_body)(const uint8_t *w, const pkv_q8a *x, int64_t xs, int64_t nb, const int NX, float *out) {
    __m256 acc[QB_NXMAX];
    for (int r = 0; r < NX; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++, w += 34) {
        const __m256i qw = _mm256_loadu_si256((const __m256i *)(w + 2));
        const __m256i aw = _mm256_sign_epi8(qw, qw);
        const float dw = QB_NAME(half)(w);
        for (int r = 0; r < NX; r++) {
            const pkv_q8a *xb = x + r * xs + b;
            const __m256i p = QB_DOT_U8(aw, _mm256_sign_epi8(QB_XQS(xb), qw));
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * xb->d), _mm256_cvtepi32_ps(p), acc[r]);
        }
    }
    for (int r = 0; r < NX; r++) out[r] = QB_NAME(hsum)(acc[r]);
}

QB_AI void QB_NAME(q4_0_body)(const uint8_t *w, const pkv_q8a *x, int64_t xs, int64_t nb, const int NX, float *out) {
    __m256 acc[QB_NXMAX];
    float corr[QB_NXMAX]; /* sum over blocks of dw * dx * sum(qx) */
    for (int r = 0; r < NX; r++) {
        acc[r] = _mm256_setzero_ps();
        corr[r] = 0;
    }
    const __m128i m4 = _mm_set1_epi8(15);
    for (int64_t b = 0; b < nb; b++, w += 18) {
        const __m128i raw = _mm_loadu_si128((const __m128i *)(w + 2));
        const __m256i q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), m4), _mm_and_si128(raw, m4));
        const float dw = QB_NAME(half)(w);
        for (int r = 0; r < NX; r++) {
            const pkv_q8a *xb = x + r * xs + b;
            const float dd = dw * xb->d;
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dd), _mm256_cvtepi32_ps(QB_DOT_U8(q, QB_XQS(xb))), acc[r]);
            corr[r] += dw * xb->ds; /* the -8 offset, times 8 below */
        }
    }
    for (int r = 0; r < NX; r++) out[r] = QB_NAME(hsum)(acc[r]) - 8.0f * corr[r];
}

/* mxfp4: a table shuffle turns the E2M1 codes into their doubled values
 * (signed bytes, |v| <= 12); the byte dot takes |v| unsigned with the sign moved
 * onto the activation (as q8_0), so a block's integer dot is exact and is scaled
 * once by 2^(e - 128) * dx. */
QB_AI void QB_NAME(mxfp4_body)(const uint8_t *w, const pkv_q8a *x, int64_t xs, int64_t nb, const int NX, float *out) {
    __m256 acc[QB_NXMAX];
    for (int r = 0; r < NX; r++) acc[r] = _mm256_setzero_ps();
    const __m128i tbl = _mm_loadu_si128((const __m128i *)(const void *)pkv_mxfp4_kvalues), m4 = _mm_set1_epi8(15);
    for (int64_t b = 0; b < nb; b++, w += 17) {
        const __m128i raw = _mm_loadu_si128((const __m128i *)(w + 1));
        const __m256i q = _mm256_set_m128i(_mm_shuffle_epi8(tbl, _mm_and_si128(_mm_srli_epi16(raw, 4), m4)),
                                           _mm_shuffle_epi8(tbl, _mm_and_si128(raw, m4)));
        const __m256i aq = _mm256_sign_epi8(q, q);
        const float dw = pkv_e8m0_half(w[0]);
        for (int r = 0; r < NX; r++) {
            const pkv_q8a *xb = x + r * xs + b;
            const __m256i p = QB_DOT_U8(aq, _mm256_sign_epi8(QB_XQS(xb), q));
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * xb->d), _mm256_cvtepi32_ps(p), acc[r]);
        }
    }
    for (int r = 0; r < NX; r++) out[r] = QB_NAME(hsum)(acc[r]);
}

/* q4_k / q5_k: the sub-block scales d*sc and mins dmin*m are decoded once per
 * super-block (and shared by the NX activation rows); per sub-block and row one
 * byte dot, one scaled FMA, and the min folded through the activation's
 * d * sum(q). */
QB_AI void QB_NAME(kmin_body)(const uint8_t *w, const pkv_q8a *x, int64_t xs, int64_t nb, const int NX, const bool five,
                              float *out) {
    __m256 acc0[QB_NXMAX], acc1[QB_NXMAX];
    float corr[QB_NXMAX];
    for (int r = 0; r < NX; r++) {
        acc0[r] = _mm256_setzero_ps();
        acc1[r] = _mm256_setzero_ps();
        corr[r] = 0;
    }
    const __m256i m4 = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
    for (int64_t b = 0; b < nb; b++, w += five ? 176 : 144) {
        const float d = QB_NAME(half)(w), dmin = QB_NAME(half)(w + 2);
        /* The eight 6-bit scales and mins from the 12 packed bytes at once, as
         * three little-endian words (same layout as scale_min, per byte lane). */
        uint32_t u[3];
        memcpy(u, w + 4, 12);
        const uint32_t sc_lo = u[0] & 0x3f3f3f3fu, m_lo = u[1] & 0x3f3f3f3fu;
        const uint32_t sc_hi = (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4);
        const uint32_t m_hi = ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4);
        const __m128i scm = _mm_set_epi32((int)m_hi, (int)m_lo, (int)sc_hi, (int)sc_lo);
        float dsc[8], dmm[8];
        _mm256_storeu_ps(dsc, _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(scm))));
        _mm256_storeu_ps(dmm, _mm256_mul_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(scm, 8)))));
        const uint8_t *qs = five ? w + 48 : w + 16;
        const __m256i qh = five ? _mm256_loadu_si256((const __m256i *)(w + 16)) : _mm256_setzero_si256();
        for (int g = 0; g < 4; g++) {
            const __m256i raw = _mm256_loadu_si256((const __m256i *)(qs + 32 * g));
            __m256i q0 = _mm256_and_si256(raw, m4), q1 = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
            if (five) {
                q0 = _mm256_or_si256(q0, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * g), one), 4));
                q1 = _mm256_or_si256(q1, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * g + 1), one), 4));
            }
            /* the scale products x->d * (d*sc) as 8-lane products of broadcasts
             * (the same value in every lane as the scalar product; the weight
             * side broadcast once per group, the activation's from memory) */
            const __m256 s0 = _mm256_set1_ps(dsc[2 * g]), s1 = _mm256_set1_ps(dsc[2 * g + 1]);
            for (int r = 0; r < NX; r++) {
                const pkv_q8a *x0 = x + r * xs + 8 * b + 2 * g, *x1 = x0 + 1;
                const __m256i p0 = QB_DOT_U8(q0, QB_XQS(x0));
                const __m256i p1 = QB_DOT_U8(q1, QB_XQS(x1));
                acc0[r] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_broadcast_ss(&x0->d), s0), _mm256_cvtepi32_ps(p0), acc0[r]);
                acc1[r] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_broadcast_ss(&x1->d), s1), _mm256_cvtepi32_ps(p1), acc1[r]);
                corr[r] += dmm[2 * g] * x0->ds + dmm[2 * g + 1] * x1->ds;
            }
        }
    }
    for (int r = 0; r < NX; r++) out[r] = QB_NAME(hsum)(_mm256_add_ps(acc0[r], acc1[r])) - corr[r];
}

QB_AI void QB_NAME(q6_k_body)(const uint8_t *w, const pkv_q8a *x, int64_t xs, int64_t nb, const int NX, float *out) {
    __m256 acc0[QB_NXMAX], acc1[QB_NXMAX];
    float corr[QB_NXMAX];
    for (int r = 0; r < NX; r++) {
        acc0[r] = _mm256_setzero_ps();
        acc1[r] = _mm256_setzero_ps();
        corr[r] = 0;
    }
    const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(3);
    for (int64_t b = 0; b < nb; b++, w += 210) {
        const float d = QB_NAME(half)(w + 208);
        const int8_t *sc = (const int8_t *)(w + 192);
        for (int h = 0; h < 2; h++) {
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(w + 128 + 32 * h));
            for (int k = 0; k < 4; k++) {
                const __m256i l = _mm256_loadu_si256((const __m256i *)(w + 64 * h + 32 * (k & 1)));
                const __m256i lo = k < 2 ? _mm256_and_si256(l, m4) : _mm256_and_si256(_mm256_srli_epi16(l, 4), m4);
                const __m256i q = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), m2), 4));
                const int s0 = sc[8 * h + 2 * k], s1 = sc[8 * h + 2 * k + 1];
#if QB_VNNI
                /* lanes 0-3 hold elements 0-15 (scale s0), lanes 4-7 elements 16-31 (s1) */
                const __m256 dsv = _mm256_set_m128(_mm_set1_ps(d * (float)s1), _mm_set1_ps(d * (float)s0));
#endif
                for (int r = 0; r < NX; r++) {
                    const pkv_q8a *xb = x + r * xs + 8 * b + 4 * h + k;
                    const float dd = d * xb->d;
#if QB_VNNI
                    const __m256 scv = _mm256_mul_ps(dsv, _mm256_set1_ps(xb->d));
                    const __m256 p = _mm256_cvtepi32_ps(QB_DOT_U8(q, QB_XQS(xb)));
                    if (k & 1)
                        acc1[r] = _mm256_fmadd_ps(scv, p, acc1[r]);
                    else
                        acc0[r] = _mm256_fmadd_ps(scv, p, acc0[r]);
#else
                    /* int16 pair sums, then weighted by the two half-block scales */
                    const __m256i p16 = _mm256_maddubs_epi16(q, QB_XQS(xb));
                    const __m256i scv = _mm256_set_m128i(_mm_set1_epi16((short)s1), _mm_set1_epi16((short)s0));
                    acc0[r] = _mm256_fmadd_ps(_mm256_set1_ps(dd), _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, scv)), acc0[r]);
#endif
                    corr[r] += dd * (float)(32 * (s0 * xb->s[0] + s1 * xb->s[1]));
                }
            }
        }
    }
#if QB_VNNI
    for (int r = 0; r < NX; r++) out[r] = QB_NAME(hsum)(_mm256_add_ps(acc0[r], acc1[r])) - corr[r];
#else
    (void)acc1;
    for (int r = 0; r < NX; r++) out[r] = QB_NAME(hsum)(acc0[r]) - corr[r];
#endif
}

QB_T void QB_NAME(q8_0)(const uint8_t *w, const pkv_q8a *x, int64_t xs, int64_t nb, int nx, float *out) {
    int r = 0;
#if QB_NXMAX >= 8
    for (; r + 8 <= nx; r += 8) QB_NAME(q8_0_body)(w, x + r * xs, xs, nb, 8, out + r);
#endif
    for (; r + 4 <= nx; r += 4) QB_NAME(q8_0_body)(w, x + r * xs, xs, nb, 4, out + r);
    for (; r < nx; r++) QB_NAME(q8_0_body)(w, x + r * xs, xs, nb, 1, out + r);
}

QB_T void QB_NAME(q4_0)(const uint8_t *w, const pkv_q8a *x, int64_t xs, int64_t nb, int nx, float *out) {
    int r = 0;
#if QB_NXMAX >= 8
    for (; r + 8 <= nx; r += 8) QB_NAME(q4_0_body)(w, x + r * xs, xs, nb, 8, out + r);
#endif
    for (; r + 4 <= nx; r += 4) QB_NAME(q4_0_body)(w, x + r * xs, xs, nb, 4, out + r);
    for (; r < nx; r++) QB_NAME(q4_0_body)(w, x + r * xs, xs, nb, 1, out + r);
}

QB_T void QB_NAME(q4_k)(const uint8_t *w, const pkv_q8a *x, int64_t xs, int64_t nb, int nx, float *out) {
    int r = 0;
#if QB_NXMAX >= 8
    for (; r + 8 <= nx; r += 8) QB_NAME(kmin_body)(w, x + r * xs, xs, nb, 8, false, out + r);
#endif
    for (; r + 4 <= nx; r += 4) QB_NAME(kmin_body)(w, x + r * xs, xs, nb, 4, false, out + r);
    for (; r < nx; r++) QB_NAME(kmin_body)(w, x + r * xs, xs, nb, 1, false, out + r);
}

QB_T void QB_NAME(q5_k)(const uint8_t *w, const pkv_q8a *x, int64_t xs, int64_t nb, int nx, float *out) {
    int r = 0;
#if QB_NXMAX >= 8
    for (; r + 8 <= nx; r += 8) QB_NAME(kmin_body)(w, x + r * xs, xs, nb, 8, true, out + r);
#endif
    for (; r + 4 <= nx; r += 4) QB_NAME(kmin_body)(w, x + r * xs, xs, nb, 4, true, out + r);
    for (; r < nx; r++) QB_NAME(kmin_body)(w, x + r * xs, xs, nb, 1, true, out + r);
}

QB_T void QB_NAME(q6_k)(const uint8_t *w, const pkv_q8a *x, int64_t xs, int64_t nb, int nx, float *out) {
    int r = 0;
#if QB_NXMAX >= 8
    for (; r + 8 <= nx; r += 8) QB_NAME(q6_k_body)(w, x + r * xs, xs, nb, 8, out + r);
#endif
    for (; r + 4 <= nx; r += 4) QB_NAME(q6_k_body)(w, x + r * xs, xs, nb, 4, out + r);
    for (; r < nx; r++) QB_NAME(q6_k_body)(w, x + r * xs, xs, nb, 1, out + r);
}

QB_T void QB_NAME(mxfp4)(const uint8_t *w, const pkv_q8a *x, int64_t xs, int64_t nb, int nx, float *out) {
    int r = 0;
#if QB_NXMAX >= 8
    for (; r + 8 <= nx; r += 8) QB_NAME(mxfp4_body)(w, x + r * xs, xs, nb, 8, out + r);
#endif
    for (; r + 4 <= nx; r += 4) QB_NAME(mxfp4_body)(w, x + r * xs, xs, nb, 4, out + r);
    for (; r < nx; r++) QB_NAME(mxfp4_body)(w, x + r * xs, xs, nb, 1, out + r);
}

#undef QB_AI
#undef QB_XQS
