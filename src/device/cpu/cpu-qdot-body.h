/* The x86 8-bit block dots, written once and compiled twice: by cpu-avx2.c with
 * maddubs+madd as the byte dot, and by cpu-avx512.c with VNNI's vpdpbusd. The
 * includer defines:
 *   QB_T             function attributes (target, static)
 *   QB_DOT_U8(u, x)  8 int32 lanes; lane i = sum of u[4i..4i+3] * x[4i..4i+3],
 *                    u unsigned bytes (<= 128 in the products used here), x signed
 *   QB_NAME(n)       the name of the exported function for type n
 *   QB_VNNI          1 for the VNNI build (accumulation order, see below)
 *   QB_NXMAX           the activation rows of q4_kr's largest group (registers)
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
/* ---- k-quants against pkv_q8s: eight sub-blocks scaled by one vector op.
 * For each activation row, the eight 32-element byte dots of a super-block are
 * reduced to one int32 per sub-block (red8: lane k = sub-block k), converted
 * once, and scaled by (weight scale * activation scale) of all eight
 * sub-blocks in one multiply; a row's operations are the same in every group
 * size NX. */

/* lane k of the result = the sum of p[k]'s 8 lanes */
QB_AI __m256i QB_NAME(red8)(const __m256i *p) {
    const __m256i ab = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
    const __m256i cd = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
    /* ab: lanes 0-3 = sums of p[0..3]'s lanes 0-3, lanes 4-7 = of their lanes 4-7 */
    return _mm256_add_epi32(_mm256_permute2x128_si256(ab, cd, 0x20), _mm256_permute2x128_si256(ab, cd, 0x31));
}

#define QB_SQS(p, k) _mm256_loadu_si256((const __m256i *)((p)->qs + 32 * (k)))

QB_AI void QB_NAME(kmins_body)(const uint8_t *w, const pkv_q8s *x, int64_t xs, int64_t nb, const int NX,
                               const bool five, float *out) {
    __m256 acc[QB_NXMAX], cor[QB_NXMAX];
    for (int r = 0; r < NX; r++) {
        acc[r] = _mm256_setzero_ps();
        cor[r] = _mm256_setzero_ps();
    }
    const __m256i m4 = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
    for (int64_t b = 0; b < nb; b++, w += five ? 176 : 144) {
        const float d = QB_NAME(half)(w), dmin = QB_NAME(half)(w + 2);
        /* The eight 6-bit scales and mins from the 12 packed bytes at once, as
         * three little-endian words (the layout of quant.c's q4_k scales, per byte lane). */
        uint32_t u[3];
        memcpy(u, w + 4, 12);
        const uint32_t sc_lo = u[0] & 0x3f3f3f3fu, m_lo = u[1] & 0x3f3f3f3fu;
        const uint32_t sc_hi = (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4);
        const uint32_t m_hi = ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4);
        const __m128i scm = _mm_set_epi32((int)m_hi, (int)m_lo, (int)sc_hi, (int)sc_lo);
        const __m256 dsc = _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(scm)));
        const __m256 dmm =
            _mm256_mul_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(scm, 8))));
        const uint8_t *qs = five ? w + 48 : w + 16;
        const __m256i qh = five ? _mm256_loadu_si256((const __m256i *)(w + 16)) : _mm256_setzero_si256();
        __m256i q[8];
        for (int g = 0; g < 4; g++) {
            const __m256i raw = _mm256_loadu_si256((const __m256i *)(qs + 32 * g));
            q[2 * g] = _mm256_and_si256(raw, m4);
            q[2 * g + 1] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
            if (five) {
                q[2 * g] = _mm256_or_si256(q[2 * g], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * g), one), 4));
                q[2 * g + 1] =
                    _mm256_or_si256(q[2 * g + 1], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * g + 1), one), 4));
            }
        }
        for (int r = 0; r < NX; r++) {
            const pkv_q8s *xb = x + r * xs + b;
            __m256i p[8];
            for (int k = 0; k < 8; k++) p[k] = QB_DOT_U8(q[k], QB_SQS(xb, k));
            const __m256 sum = _mm256_cvtepi32_ps(QB_NAME(red8)(p));
            acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(dsc, _mm256_loadu_ps(xb->d)), sum, acc[r]);
            cor[r] = _mm256_fmadd_ps(dmm, _mm256_loadu_ps(xb->ds), cor[r]);
        }
    }
    for (int r = 0; r < NX; r++) out[r] = QB_NAME(hsum)(acc[r]) - QB_NAME(hsum)(cor[r]);
}

/* ---- q4_k on the repacked layout (cpu-dots.h, pkv_q4kr): lane i = weight row
 * i of the group. Per sub-block k and activation row, the exact int32 sums of
 * the 8 rows come from 8 byte dots of 4 elements each (the activation's 4 bytes
 * broadcast); then, per lane, the float operations kmins_body does in lane k:
 *     acc = fma(d*sc * dx, float(sum), acc),  cor = fma(dmin*m, dx*sum(qx), cor)
 * and at the end hsum's order over k: ((0+4)+(2+6)) + ((1+5)+(3+7)). So each
 * (weight row, activation row) pair gets the same result as on the plain layout. */

/* s += the byte dots of q (row i's 4 bytes in lane i) with the 4 bytes at xq,
 * broadcast. AVX2: int16 pair sums; 8 of them (one per 4-byte chunk of a
 * sub-block) are at most 8 * 2 * 15 * 127 = 30480, and are widened at the end
 * (QB_RDOT_END). */
QB_AI __m256i QB_NAME(bcast4)(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}
#if QB_VNNI
#define QB_RDOT(s, q, xq) _mm256_dpbusd_epi32(s, q, QB_NAME(bcast4)(xq))
#define QB_RDOT_END(s) (s)
#else
#define QB_RDOT(s, q, xq) _mm256_add_epi16(s, _mm256_maddubs_epi16(q, QB_NAME(bcast4)(xq)))
#define QB_RDOT_END(s) _mm256_madd_epi16(s, _mm256_set1_epi16(1))
#endif

/* hsum's order, lane by lane over the eight vectors v[k] */
QB_AI __m256 QB_NAME(rsum8)(const __m256 *v) {
    return _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(v[0], v[4]), _mm256_add_ps(v[2], v[6])),
                         _mm256_add_ps(_mm256_add_ps(v[1], v[5]), _mm256_add_ps(v[3], v[7])));
}

QB_AI void QB_NAME(q4_kr_body)(const pkv_q4kr *w, const pkv_q8s *x, int64_t xs, int64_t nb, const int NX, float *out) {
    __m256 acc[QB_NXMAX][8], cor[QB_NXMAX][8];
    for (int r = 0; r < NX; r++)
        for (int k = 0; k < 8; k++) acc[r][k] = cor[r][k] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(15);
    for (int64_t b = 0; b < nb; b++, w++) {
        const __m256 dv = _mm256_loadu_ps(w->d), dmv = _mm256_loadu_ps(w->dmin);
        for (int k = 0; k < 8; k++) {
            __m256i s[QB_NXMAX];
            for (int r = 0; r < NX; r++) s[r] = _mm256_setzero_si256();
            for (int c = 0; c < 8; c++) { /* one chunk of the 8 rows against every activation row */
                const __m256i raw = _mm256_loadu_si256((const __m256i *)w->qs[k / 2][c]);
                const __m256i q = _mm256_and_si256(k & 1 ? _mm256_srli_epi16(raw, 4) : raw, m4);
                for (int r = 0; r < NX; r++) s[r] = QB_RDOT(s[r], q, (x + r * xs + b)->qs + 32 * k + 4 * c);
            }
            const __m256 dsc = _mm256_mul_ps(dv, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)w->sc[k]))));
            const __m256 dmm = _mm256_mul_ps(dmv, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)w->m[k]))));
            for (int r = 0; r < NX; r++) {
                const pkv_q8s *xb = x + r * xs + b;
                const __m256 sum = _mm256_cvtepi32_ps(QB_RDOT_END(s[r]));
                acc[r][k] = _mm256_fmadd_ps(_mm256_mul_ps(dsc, _mm256_set1_ps(xb->d[k])), sum, acc[r][k]);
                cor[r][k] = _mm256_fmadd_ps(dmm, _mm256_set1_ps(xb->ds[k]), cor[r][k]);
            }
        }
    }
    for (int r = 0; r < NX; r++)
        _mm256_storeu_ps(out + 8 * r, _mm256_sub_ps(QB_NAME(rsum8)(acc[r]), QB_NAME(rsum8)(cor[r])));
}

/* Activation rows in groups of QB_NXMAX, then 4, 2 and 1 (the group size does
 * not change a pair's operations). */
QB_T void QB_NAME(q4_kr)(const pkv_q4kr *w, const pkv_q8s *x, int64_t xs, int64_t nb, int nx, float *out) {
    int r = 0;
    for (; r + QB_NXMAX <= nx; r += QB_NXMAX) QB_NAME(q4_kr_body)(w, x + r * xs, xs, nb, QB_NXMAX, out + 8 * r);
    for (; r + 4 <= nx; r += 4) QB_NAME(q4_kr_body)(w, x + r * xs, xs, nb, 4, out + 8 * r);
    for (; r + 2 <= nx; r += 2) QB_NAME(q4_kr_body)(w, x + r * xs, xs, nb, 2, out + 8 * r);
    for (; r < nx; r++) QB_NAME(q4_kr_body)(w, x + r * xs, xs, nb, 1, out + 8 * r);
}

/* The types with 16 scales per super-block (one per 16 elements: q6_k, q3_k,
 * q2_k). The byte dots' lanes 0-3 cover a sub-block's first 16 elements and
 * lanes 4-7 its second, so two hadd levels keep both halves' sums apart; they
 * are scaled in int32 (exact). sc_a/sc_b: the scales of the first/second
 * halves of sub-blocks 0..7. Lane k of the result: sub-block k's scaled sum. */
QB_AI __m256i QB_NAME(dot16)(const __m256i *q, const pkv_q8s *xb, __m256i sc_a, __m256i sc_b) {
    __m256i p[8];
    for (int k = 0; k < 8; k++) p[k] = QB_DOT_U8(q[k], QB_SQS(xb, k));
    const __m256i ab = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
    const __m256i cd = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
    return _mm256_add_epi32(_mm256_mullo_epi32(_mm256_permute2x128_si256(ab, cd, 0x20), sc_a),
                            _mm256_mullo_epi32(_mm256_permute2x128_si256(ab, cd, 0x31), sc_b));
}

/* 16 int8 scales to the even (first-half) and odd (second-half) int32 vectors
 * of dot16 and the int16 vector that pairs with pkv_q8s.s (madd: lane k =
 * sc[2k] * s[2k] + sc[2k+1] * s[2k+1]). */
QB_AI void QB_NAME(scales16)(__m128i sc, __m256i *sc_a, __m256i *sc_b, __m256i *sc16) {
    const __m128i eo = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    const __m128i sce = _mm_shuffle_epi8(sc, eo);
    *sc_a = _mm256_cvtepi8_epi32(sce);
    *sc_b = _mm256_cvtepi8_epi32(_mm_srli_si128(sce, 8));
    *sc16 = _mm256_cvtepi8_epi16(sc);
}

/* q6_k: unsigned 6-bit quants, the -32 offset folded in through the
 * activation's 16-element sums. */
QB_AI void QB_NAME(q6_ks_body)(const uint8_t *w, const pkv_q8s *x, int64_t xs, int64_t nb, const int NX, float *out) {
    __m256 acc[QB_NXMAX];
    for (int r = 0; r < NX; r++) acc[r] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(3);
    for (int64_t b = 0; b < nb; b++, w += 210) {
        const __m256 dv = _mm256_set1_ps(QB_NAME(half)(w + 208));
        __m256i sc_a, sc_b, sc16;
        QB_NAME(scales16)(_mm_loadu_si128((const __m128i *)(w + 192)), &sc_a, &sc_b, &sc16);
        __m256i q[8];
        for (int h = 0; h < 2; h++) {
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(w + 128 + 32 * h));
            for (int k = 0; k < 4; k++) {
                const __m256i l = _mm256_loadu_si256((const __m256i *)(w + 64 * h + 32 * (k & 1)));
                const __m256i lo = k < 2 ? _mm256_and_si256(l, m4) : _mm256_and_si256(_mm256_srli_epi16(l, 4), m4);
                q[4 * h + k] = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), m2), 4));
            }
        }
        for (int r = 0; r < NX; r++) {
            const pkv_q8s *xb = x + r * xs + b;
            const __m256i off = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)xb->s), sc16);
            const __m256i dot = _mm256_sub_epi32(QB_NAME(dot16)(q, xb, sc_a, sc_b), _mm256_slli_epi32(off, 5));
            acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(dv, _mm256_loadu_ps(xb->d)), _mm256_cvtepi32_ps(dot), acc[r]);
        }
    }
    for (int r = 0; r < NX; r++) out[r] = QB_NAME(hsum)(acc[r]);
}

/* q3_k: 2 low bits plus the high bit (hmask bit 4h + j) to an unsigned 0..7,
 * the -4 folded in like q6_k's -32; signed 6-bit scales (minus 32). */
QB_AI void QB_NAME(q3_ks_body)(const uint8_t *w, const pkv_q8s *x, int64_t xs, int64_t nb, const int NX, float *out) {
    __m256 acc[QB_NXMAX];
    for (int r = 0; r < NX; r++) acc[r] = _mm256_setzero_ps();
    const __m256i m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    for (int64_t b = 0; b < nb; b++, w += 110) {
        const __m256 dv = _mm256_set1_ps(QB_NAME(half)(w + 108));
        /* scale g: low 4 bits from byte g % 8 (its high nibble for g >= 8),
         * high 2 bits from byte 8 + g % 4 (bits 2 * (g / 4)) */
        uint64_t lo8;
        uint32_t hi4;
        memcpy(&lo8, w + 96, 8);
        memcpy(&hi4, w + 104, 4);
        const __m128i m4 = _mm_set1_epi8(15), lb = _mm_cvtsi64_si128((long long)lo8);
        const __m128i low = _mm_unpacklo_epi64(_mm_and_si128(lb, m4), _mm_and_si128(_mm_srli_epi16(lb, 4), m4));
        const __m128i high = _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32((int)hi4), _mm_setr_epi32(0, 2, 4, 6)), _mm_set1_epi8(3));
        const __m128i s8 = _mm_sub_epi8(_mm_or_si128(low, _mm_slli_epi16(high, 4)), _mm_set1_epi8(32));
        __m256i sc_a, sc_b, sc16;
        QB_NAME(scales16)(s8, &sc_a, &sc_b, &sc16);
        const __m256i hm = _mm256_loadu_si256((const __m256i *)w);
        __m256i q[8];
        for (int h = 0; h < 2; h++) {
            const __m256i raw = _mm256_loadu_si256((const __m256i *)(w + 32 + 32 * h));
            for (int j = 0; j < 4; j++) {
                const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(raw, 2 * j), m3);
                const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(hm, 4 * h + j), one);
                q[4 * h + j] = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 2));
            }
        }
        for (int r = 0; r < NX; r++) {
            const pkv_q8s *xb = x + r * xs + b;
            const __m256i off = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)xb->s), sc16);
            const __m256i dot = _mm256_sub_epi32(QB_NAME(dot16)(q, xb, sc_a, sc_b), _mm256_slli_epi32(off, 2));
            acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(dv, _mm256_loadu_ps(xb->d)), _mm256_cvtepi32_ps(dot), acc[r]);
        }
    }
    for (int r = 0; r < NX; r++) out[r] = QB_NAME(hsum)(acc[r]);
}

/* q2_k: unsigned 2-bit quants, 4-bit scales and mins; the mins against the
 * activation's 16-element sums in int32, scaled by dmin once per sub-block. */
QB_AI void QB_NAME(q2_ks_body)(const uint8_t *w, const pkv_q8s *x, int64_t xs, int64_t nb, const int NX, float *out) {
    __m256 acc[QB_NXMAX], cor[QB_NXMAX];
    for (int r = 0; r < NX; r++) {
        acc[r] = _mm256_setzero_ps();
        cor[r] = _mm256_setzero_ps();
    }
    const __m256i m3 = _mm256_set1_epi8(3);
    const __m128i m4 = _mm_set1_epi8(15);
    for (int64_t b = 0; b < nb; b++, w += 84) {
        const __m256 dv = _mm256_set1_ps(QB_NAME(half)(w + 80)), dmv = _mm256_set1_ps(QB_NAME(half)(w + 82));
        const __m128i scm = _mm_loadu_si128((const __m128i *)w);
        __m256i sc_a, sc_b, sc16;
        QB_NAME(scales16)(_mm_and_si128(scm, m4), &sc_a, &sc_b, &sc16);
        const __m256i m16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(scm, 4), m4));
        (void)sc16;
        __m256i q[8];
        for (int h = 0; h < 2; h++) {
            const __m256i raw = _mm256_loadu_si256((const __m256i *)(w + 16 + 32 * h));
            for (int j = 0; j < 4; j++) q[4 * h + j] = _mm256_and_si256(_mm256_srli_epi16(raw, 2 * j), m3);
        }
        for (int r = 0; r < NX; r++) {
            const pkv_q8s *xb = x + r * xs + b;
            const __m256 dx = _mm256_loadu_ps(xb->d);
            const __m256i mins = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)xb->s), m16);
            acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(dv, dx), _mm256_cvtepi32_ps(QB_NAME(dot16)(q, xb, sc_a, sc_b)), acc[r]);
            cor[r] = _mm256_fmadd_ps(_mm256_mul_ps(dmv, dx), _mm256_cvtepi32_ps(mins), cor[r]);
        }
    }
    for (int r = 0; r < NX; r++) out[r] = QB_NAME(hsum)(acc[r]) - QB_NAME(hsum)(cor[r]);
}

#define QB_SGROUPS(body, ...)                                                                       \
    int r = 0;                                                                                     \
    for (; r + 8 <= nx; r += 8) body(w, x + r * xs, xs, nb, 8, __VA_ARGS__ out + r);                \
    for (; r + 4 <= nx; r += 4) body(w, x + r * xs, xs, nb, 4, __VA_ARGS__ out + r);                \
    for (; r < nx; r++) body(w, x + r * xs, xs, nb, 1, __VA_ARGS__ out + r);

QB_T void QB_NAME(q4_ks)(const uint8_t *w, const pkv_q8s *x, int64_t xs, int64_t nb, int nx, float *out) {
    QB_SGROUPS(QB_NAME(kmins_body), false, )
}
QB_T void QB_NAME(q5_ks)(const uint8_t *w, const pkv_q8s *x, int64_t xs, int64_t nb, int nx, float *out) {
    QB_SGROUPS(QB_NAME(kmins_body), true, )
}
QB_T void QB_NAME(q6_ks)(const uint8_t *w, const pkv_q8s *x, int64_t xs, int64_t nb, int nx, float *out) {
    QB_SGROUPS(QB_NAME(q6_ks_body), )
}
QB_T void QB_NAME(q3_ks)(const uint8_t *w, const pkv_q8s *x, int64_t xs, int64_t nb, int nx, float *out) {
    QB_SGROUPS(QB_NAME(q3_ks_body), )
}
QB_T void QB_NAME(q2_ks)(const uint8_t *w, const pkv_q8s *x, int64_t xs, int64_t nb, int nx, float *out) {
    QB_SGROUPS(QB_NAME(q2_ks_body), )
}
/* pkv_cpu_dots.sup of this path */
#define QB_SUP_TABLE                                                                                    \
    {[PKV_TYPE_Q2_K] = QB_NAME(q2_ks), [PKV_TYPE_Q3_K] = QB_NAME(q3_ks), [PKV_TYPE_Q4_K] = QB_NAME(q4_ks),   \
     [PKV_TYPE_Q5_K] = QB_NAME(q5_ks), [PKV_TYPE_Q6_K] = QB_NAME(q6_ks)}
#undef QB_SGROUPS
#undef QB_RDOT
#undef QB_RDOT_END
#undef QB_SQS

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

QB_T void QB_NAME(mxfp4)(const uint8_t *w, const pkv_q8a *x, int64_t xs, int64_t nb, int nx, float *out) {
    int r = 0;
#if QB_NXMAX >= 8
    for (; r + 8 <= nx; r += 8) QB_NAME(mxfp4_body)(w, x + r * xs, xs, nb, 8, out + r);
#endif
    for (; r + 4 <= nx; r += 4) QB_NAME(mxfp4_body)(w, x + r * xs, xs, nb, 4, out + r);
    for (; r < nx; r++) QB_NAME(mxfp4_body)(w, x + r * xs, xs, nb, 1, out + r);
}

/* ------------------------------------------------------------------------
 * The types with an integer form (quant.h, pkv_qblock). Each activation block
 * of 32 meets 32 weight values whose first and second 16 may have different
 * scales: the byte dot's lanes 0-3 sum elements 0-15 and lanes 4-7 elements
 * 16-31, so one vector of the two scales (times the activation's d) weights
 * them. */

/* 32 bits as 32 byte masks: byte i is 0xff if bit i of v is set. */
QB_AI __m256i QB_NAME(bits32)(uint32_t v) {
    const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3,
                                          3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    return _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)v), shuf), bit), bit);
}

QB_AI __m256 QB_NAME(two_scales)(float s0, float s1) { return _mm256_set_m128(_mm_set1_ps(s1), _mm_set1_ps(s0)); }

/* Any such type: each block decoded to its integer form in plain C (once per
 * row group), the dots vectorized. The fallback for the types without a
 * kernel of their own below. */
QB_AI void QB_NAME(dec_body)(pkv_qblock_fn dec, int nsub, size_t bb, bool has_min, const uint8_t *w, const pkv_q8a *x,
                             int64_t xs, int64_t nb, const int NX, float *out) {
    __m256 acc[QB_NXMAX];
    float corr[QB_NXMAX];
    for (int r = 0; r < NX; r++) {
        acc[r] = _mm256_setzero_ps();
        corr[r] = 0;
    }
    pkv_qblock o;
    for (int64_t b = 0; b < nb; b++, w += bb) {
        dec(w, &o);
        for (int j = 0; j < nsub; j++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(o.q + 32 * j)), aq = _mm256_sign_epi8(q, q);
            const __m256 dv = QB_NAME(two_scales)(o.d[2 * j], o.d[2 * j + 1]);
            for (int r = 0; r < NX; r++) {
                const pkv_q8a *xb = x + r * xs + b * nsub + j;
                const __m256i p = QB_DOT_U8(aq, _mm256_sign_epi8(QB_XQS(xb), q));
                acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(dv, _mm256_broadcast_ss(&xb->d)), _mm256_cvtepi32_ps(p), acc[r]);
                if (has_min) corr[r] += xb->d * (o.m[2 * j] * (float)xb->s[0] + o.m[2 * j + 1] * (float)xb->s[1]);
            }
        }
    }
    for (int r = 0; r < NX; r++) out[r] = QB_NAME(hsum)(acc[r]) + corr[r];
}

/* q5_0: the nibbles as q4_0, the fifth bits from the 32-bit mask; the byte dot
 * takes the unsigned 0..31 and the -16 comes off in integers (16 * sum(qx)). */
QB_AI void QB_NAME(q5_0_body)(const uint8_t *w, const pkv_q8a *x, int64_t xs, int64_t nb, const int NX, float *out) {
    __m256 acc[QB_NXMAX];
    for (int r = 0; r < NX; r++) acc[r] = _mm256_setzero_ps();
    const __m128i m4 = _mm_set1_epi8(15);
    const __m256i b4 = _mm256_set1_epi8(16);
    for (int64_t b = 0; b < nb; b++, w += 22) {
        uint32_t qh;
        memcpy(&qh, w + 2, 4);
        const __m128i raw = _mm_loadu_si128((const __m128i *)(w + 6));
        __m256i q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), m4), _mm_and_si128(raw, m4));
        q = _mm256_or_si256(q, _mm256_and_si256(QB_NAME(bits32)(qh), b4));
        const float dw = QB_NAME(half)(w);
        for (int r = 0; r < NX; r++) {
            const pkv_q8a *xb = x + r * xs + b;
            __m256i p = QB_DOT_U8(q, QB_XQS(xb));
            p = _mm256_sub_epi32(p, _mm256_setr_epi32(16 * (xb->s[0] + xb->s[1]), 0, 0, 0, 0, 0, 0, 0));
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * xb->d), _mm256_cvtepi32_ps(p), acc[r]);
        }
    }
    for (int r = 0; r < NX; r++) out[r] = QB_NAME(hsum)(acc[r]);
}

/* iq4_nl / iq4_xs: a table shuffle turns the nibbles into the 16 signed levels
 * (as mxfp4); the sign moves onto the activation for the unsigned byte dot. */
QB_AI __m256i QB_NAME(iq4_levels)(const uint8_t *qs) {
    const __m128i tbl = _mm_loadu_si128((const __m128i *)(const void *)pkv_iq4nl_values), m4 = _mm_set1_epi8(15);
    const __m128i raw = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_set_m128i(_mm_shuffle_epi8(tbl, _mm_and_si128(_mm_srli_epi16(raw, 4), m4)),
                            _mm_shuffle_epi8(tbl, _mm_and_si128(raw, m4)));
}

QB_AI void QB_NAME(iq4_nl_body)(const uint8_t *w, const pkv_q8a *x, int64_t xs, int64_t nb, const int NX, float *out) {
    __m256 acc[QB_NXMAX];
    for (int r = 0; r < NX; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++, w += 18) {
        const __m256i q = QB_NAME(iq4_levels)(w + 2), aq = _mm256_sign_epi8(q, q);
        const float dw = QB_NAME(half)(w);
        for (int r = 0; r < NX; r++) {
            const pkv_q8a *xb = x + r * xs + b;
            const __m256i p = QB_DOT_U8(aq, _mm256_sign_epi8(QB_XQS(xb), q));
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * xb->d), _mm256_cvtepi32_ps(p), acc[r]);
        }
    }
    for (int r = 0; r < NX; r++) out[r] = QB_NAME(hsum)(acc[r]);
}

QB_AI void QB_NAME(iq4_xs_body)(const uint8_t *w, const pkv_q8a *x, int64_t xs, int64_t nb, const int NX, float *out) {
    __m256 acc[QB_NXMAX];
    for (int r = 0; r < NX; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++, w += 136) {
        const float d = QB_NAME(half)(w);
        const unsigned sh = (unsigned)(w[2] | w[3] << 8);
        for (int ib = 0; ib < 8; ib++) {
            const int ls = (int)(((w[4 + ib / 2] >> (4 * (ib % 2))) & 15) | ((sh >> (2 * ib)) & 3) << 4);
            const float dl = d * (float)(ls - 32);
            const __m256i q = QB_NAME(iq4_levels)(w + 8 + 16 * ib), aq = _mm256_sign_epi8(q, q);
            for (int r = 0; r < NX; r++) {
                const pkv_q8a *xb = x + r * xs + 8 * b + ib;
                const __m256i p = QB_DOT_U8(aq, _mm256_sign_epi8(QB_XQS(xb), q));
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dl * xb->d), _mm256_cvtepi32_ps(p), acc[r]);
            }
        }
    }
    for (int r = 0; r < NX; r++) out[r] = QB_NAME(hsum)(acc[r]);
}

/* q2_k: element 128h + 32j + l is 2 bits of byte 32h + l, so activation block
 * 4h + j is one shift and mask of a 32-byte load; scales and mins per 16. */
/* iq3_s: per 32 elements eight 9-bit grid indices gathered as 4-byte entries
 * (the magnitudes, unsigned), 32 sign bits as +-1 bytes applied to the
 * activation, one scale. */
QB_AI void QB_NAME(iq3_s_body)(const uint8_t *w, const pkv_q8a *x, int64_t xs, int64_t nb, const int NX, float *out) {
    __m256 acc[QB_NXMAX];
    for (int r = 0; r < NX; r++) acc[r] = _mm256_setzero_ps();
    const int *grid = (const int *)(const void *)pkv_iq_tables_get()->iq3s;
    const __m256i shifts = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), one32 = _mm256_set1_epi32(1), one8 = _mm256_set1_epi8(1);
    for (int64_t b = 0; b < nb; b++, w += 110) {
        const float d = QB_NAME(half)(w);
        for (int ib = 0; ib < 8; ib++) {
            const __m256i lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(w + 2 + 8 * ib)));
            const __m256i hi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(w[66 + ib]), shifts), one32);
            const __m256i mag = _mm256_i32gather_epi32(grid, _mm256_or_si256(lo, _mm256_slli_epi32(hi, 8)), 4);
            uint32_t sb;
            memcpy(&sb, w + 74 + 4 * ib, 4);
            const __m256i sgn = _mm256_or_si256(QB_NAME(bits32)(sb), one8); /* -1 or +1 */
            const float db = d * (float)(1 + 2 * ((w[106 + ib / 2] >> (4 * (ib % 2))) & 15));
            for (int r = 0; r < NX; r++) {
                const pkv_q8a *xb = x + r * xs + 8 * b + ib;
                const __m256i p = QB_DOT_U8(mag, _mm256_sign_epi8(QB_XQS(xb), sgn));
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(db * xb->d), _mm256_cvtepi32_ps(p), acc[r]);
            }
        }
    }
    for (int r = 0; r < NX; r++) out[r] = QB_NAME(hsum)(acc[r]);
}

#if QB_NXMAX >= 8
#define QB_GROUPS(call)                                                                            \
    int r = 0;                                                                                     \
    for (; r + 8 <= nx; r += 8) call(8);                                                           \
    for (; r + 4 <= nx; r += 4) call(4);                                                           \
    for (; r < nx; r++) call(1);
#else
#define QB_GROUPS(call)                                                                            \
    int r = 0;                                                                                     \
    for (; r + 4 <= nx; r += 4) call(4);                                                           \
    for (; r < nx; r++) call(1);
#endif

#define QB_OWN(n)                                                                                       \
    QB_T void QB_NAME(n)(const uint8_t *w, const pkv_q8a *x, int64_t xs, int64_t nb, int nx, float *out) { \
        QB_GROUPS(QB_CALL_##n)                                                                         \
    }
#define QB_CALL_OWN(n, K) QB_NAME(n##_body)(w, x + r * xs, xs, nb, K, out + r)
#define QB_CALL_q5_0(K) QB_CALL_OWN(q5_0, K)
#define QB_CALL_iq4_nl(K) QB_CALL_OWN(iq4_nl, K)
#define QB_CALL_iq4_xs(K) QB_CALL_OWN(iq4_xs, K)
#define QB_CALL_iq3_s(K) QB_CALL_OWN(iq3_s, K)
QB_OWN(q5_0)
QB_OWN(iq4_nl)
QB_OWN(iq4_xs)
QB_OWN(iq3_s)

#define QB_DEC(n, T)                                                                                        \
    QB_T void QB_NAME(dec_##n)(const uint8_t *w, const pkv_q8a *x, int64_t xs, int64_t nb, int nx, float *out) { \
        const pkv_qblock_fn dec = pkv_qblock_decoder(T);                                                    \
        const int ns = (int)pkv_type_block_elems(T) / 32;                                                   \
        const size_t bb = pkv_type_block_bytes(T);                                                          \
        const bool hm = pkv_qblock_has_min(T);                                                              \
        QB_GROUPS(QB_CALL_DEC)                                                                              \
    }
#define QB_CALL_DEC(K) QB_NAME(dec_body)(dec, ns, bb, hm, w, x + r * xs, xs, nb, K, out + r)
QB_DEC(q4_1, PKV_TYPE_Q4_1)
QB_DEC(q5_1, PKV_TYPE_Q5_1)
QB_DEC(iq2_xxs, PKV_TYPE_IQ2_XXS)
QB_DEC(iq2_xs, PKV_TYPE_IQ2_XS)
QB_DEC(iq2_s, PKV_TYPE_IQ2_S)
QB_DEC(iq3_xxs, PKV_TYPE_IQ3_XXS)
QB_DEC(iq1_s, PKV_TYPE_IQ1_S)
QB_DEC(iq1_m, PKV_TYPE_IQ1_M)
QB_DEC(tq1_0, PKV_TYPE_TQ1_0)
QB_DEC(tq2_0, PKV_TYPE_TQ2_0)

/* The table entries of pkv_cpu_dots.more for this path, and which are the
 * block-decoding fallback. */
#define QB_MORE_TABLE                                                                                   \
    {[PKV_TYPE_Q4_1] = QB_NAME(dec_q4_1),       [PKV_TYPE_Q5_0] = QB_NAME(q5_0),                          \
     [PKV_TYPE_Q5_1] = QB_NAME(dec_q5_1),                          \
     [PKV_TYPE_IQ2_XXS] = QB_NAME(dec_iq2_xxs),                \
     [PKV_TYPE_IQ2_XS] = QB_NAME(dec_iq2_xs),   [PKV_TYPE_IQ2_S] = QB_NAME(dec_iq2_s),                    \
     [PKV_TYPE_IQ3_XXS] = QB_NAME(dec_iq3_xxs), [PKV_TYPE_IQ3_S] = QB_NAME(iq3_s),                        \
     [PKV_TYPE_IQ1_S] = QB_NAME(dec_iq1_s),     [PKV_TYPE_IQ1_M] = QB_NAME(dec_iq1_m),                    \
     [PKV_TYPE_IQ4_NL] = QB_NAME(iq4_nl),       [PKV_TYPE_IQ4_XS] = QB_NAME(iq4_xs),                      \
     [PKV_TYPE_TQ1_0] = QB_NAME(dec_tq1_0),     [PKV_TYPE_TQ2_0] = QB_NAME(dec_tq2_0)}
#define QB_MORE_SLOW                                                                                    \
    (PKV_QDOT_MORE_TYPES & ~(PKV_QDOT_BIT(PKV_TYPE_Q5_0) | PKV_QDOT_BIT(PKV_TYPE_Q2_K) |                   \
                             PKV_QDOT_BIT(PKV_TYPE_Q3_K) | PKV_QDOT_BIT(PKV_TYPE_IQ3_S) |                  \
                             PKV_QDOT_BIT(PKV_TYPE_IQ4_NL) | PKV_QDOT_BIT(PKV_TYPE_IQ4_XS)))

#undef QB_GROUPS
#undef QB_OWN
#undef QB_DEC
#undef QB_CALL_DEC
#undef QB_CALL_OWN
#undef QB_AI
#undef QB_XQS
