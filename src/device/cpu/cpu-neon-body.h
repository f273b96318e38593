/* The 64-bit ARM quantized dots, written once and compiled three times by
 * cpu-neon.c. The includer defines:
 *   QN_T        function attributes (target, static)
 *   QN_NAME(n)  the name of the function for type n
 *   QN_DOT      0: byte dots with SMULL/SMLAL2/SADALP (ARMv8.0);
 *               1: with SDOT; 2: as 1, and the two-row functions (pkv_qdot2_fn)
 *               with SMMLA instead of the one-row ones
 * A weight row is a sequence of 32-element units (nq_decode); units go in
 * groups of four float lanes (4 units, or 2 units of two 16-element halves).
 * Per group and activation row: the exact int32 total of each lane's byte dot,
 * then one FMA of the four lanes into the row's accumulator (scale = weight
 * scale * activation d) and, for types with offsets, one more into a second.
 * At the end each accumulator's lanes are added (FADDP). Rows go in groups of
 * 8, 4 and 1 (two-row functions: 8, 4, 2, 1): a weight group is decoded once
 * per row group; a row gets the same float operations in every group. */

#define QN_AI __attribute__((always_inline)) QN_T inline

/* acc + the dot of 16 signed bytes, as 4 int32 lanes (how the 16 products
 * spread over the lanes differs between the instructions; only the lane total
 * is used). Products are at most 128 * 127, so SMLAL2's int16 pair sums hold. */
QN_AI int32x4_t QN_NAME(dot16)(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if QN_DOT == 0
    int16x8_t p = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    p = vmlal_high_s8(p, a, b);
    return vpadalq_s16(acc, p);
#else
    return vdotq_s32(acc, a, b);
#endif
}

/* The int32 totals of a group's lanes for one activation row (x: its block of
 * the group's first unit). */
QN_AI int32x4_t QN_NAME(totals)(int K, const nq_group *g, int nu, const pkv_q8a *x) {
    const int32x4_t z = vdupq_n_s32(0);
    int32x4_t p[4] = {z, z, z, z};
    if (!k_halves(K)) {
        for (int k = 0; k < 4; k++)
            if (k < nu)
                p[k] = QN_NAME(dot16)(QN_NAME(dot16)(z, g->q[k][0], vld1q_s8(x[k].qs)), g->q[k][1],
                                      vld1q_s8(x[k].qs + 16));
    } else {
        for (int k = 0; k < 2; k++)
            if (k < nu) {
                p[2 * k] = QN_NAME(dot16)(z, g->q[k][0], vld1q_s8(x[k].qs));
                p[2 * k + 1] = QN_NAME(dot16)(z, g->q[k][1], vld1q_s8(x[k].qs + 16));
            }
    }
    return vpaddq_s32(vpaddq_s32(p[0], p[1]), vpaddq_s32(p[2], p[3]));
}

#if QN_DOT < 2
/* One group of nu units of one weight row into NX rows' accumulators. */
QN_AI void QN_NAME(group)(int K, nq_state *st, const uint8_t *w, const pkv_q8a *x, int64_t xs, int64_t u0,
                          const int nu, const int NX, float32x4_t *acc, float32x4_t *cor) {
    nq_group g;
    nq_decode(K, w, u0, nu, &g, st);
    for (int r = 0; r < NX; r++) {
        const pkv_q8a *xr = x + r * xs + u0;
        float32x4_t dx, ds;
        nq_xside(K, xr, nu, &dx, &ds);
        nq_accum(K, &g, dx, ds, QN_NAME(totals)(K, &g, nu, xr), &acc[r], &cor[r]);
    }
}

/* One weight row against NX activation rows. */
QN_AI void QN_NAME(body)(int K, nq_state *st, const uint8_t *w, const pkv_q8a *x, int64_t xs, int64_t nb,
                         const int NX, float *out) {
    float32x4_t acc[8], cor[8];
    for (int r = 0; r < NX; r++) acc[r] = cor[r] = vdupq_n_f32(0);
    const int64_t nu_all = nb * k_nsub(K);
    const int G = nq_per_group(K);
    int64_t u0 = 0;
    for (; u0 + G <= nu_all; u0 += G) QN_NAME(group)(K, st, w, x, xs, u0, G, NX, acc, cor);
    if (u0 < nu_all) QN_NAME(group)(K, st, w, x, xs, u0, (int)(nu_all - u0), NX, acc, cor); /* a short last group */
    for (int r = 0; r < NX; r++) out[r] = nq_out(K, acc[r], cor[r]);
}

#define QN_FN(n, K, T)                                                                                      \
    QN_T void QN_NAME(n)(const uint8_t *w, const pkv_q8a *x, int64_t xs, int64_t nb, int nx, float *out) {   \
        nq_state st;                                                                                        \
        st.dec = K == K_DEC ? pkv_qblock_decoder(T) : NULL;                                                 \
        st.bb = pkv_type_block_bytes(T);                                                                    \
        int r = 0;                                                                                          \
        for (; r + 8 <= nx; r += 8) QN_NAME(body)(K, &st, w, x + r * xs, xs, nb, 8, out + r);               \
        for (; r + 4 <= nx; r += 4) QN_NAME(body)(K, &st, w, x + r * xs, xs, nb, 4, out + r);               \
        for (; r < nx; r++) QN_NAME(body)(K, &st, w, x + r * xs, xs, nb, 1, out + r);                       \
    }
#else
/* [a's 8-byte half h, b's] as one vector: SMMLA's operand of two 2 x 8 rows */
QN_AI int8x16_t QN_NAME(zip)(int8x16_t a, int8x16_t b, int h) {
    const int64x2_t a6 = vreinterpretq_s64_s8(a), b6 = vreinterpretq_s64_s8(b);
    return vreinterpretq_s8_s64(h ? vzip2q_s64(a6, b6) : vzip1q_s64(a6, b6));
}

/* Two weight rows (w, w + ws bytes) against NX activation rows. Per pair of
 * activation rows and unit (or half), SMMLA gives the four (activation row,
 * weight row) byte dots at once; a 4 x 4 transpose turns the lanes of four
 * units into each pair's group totals, the same int32 values as the one-row
 * functions compute. An odd last row takes SDOT for both weight rows. */
/* One group of nu units of both weight rows into NX rows' accumulators. */
QN_AI void QN_NAME(pgroup)(int K, nq_state *st0, nq_state *st1, const uint8_t *w, size_t ws, const pkv_q8a *x,
                           int64_t xs, int64_t u0, const int nu, const int NX, float32x4_t (*acc)[8],
                           float32x4_t (*cor)[8]) {
    const int32x4_t z = vdupq_n_s32(0);
    nq_group g[2];
    nq_decode(K, w, u0, nu, &g[0], st0);
    nq_decode(K, w + ws, u0, nu, &g[1], st1);
    int8x16_t B[4][4]; /* [unit][8-byte chunk]: the chunk of both weight rows */
    for (int k = 0; k < (k_halves(K) ? 2 : 4); k++)
        for (int c = 0; c < 4; c++)
            B[k][c] = k < nu ? QN_NAME(zip)(g[0].q[k][c / 2], g[1].q[k][c / 2], c & 1) : vdupq_n_s8(0);
    int r = 0;
    for (; r + 2 <= NX; r += 2) {
        const pkv_q8a *x0 = x + r * xs + u0, *x1 = x0 + xs;
        int32x4_t m[4] = {z, z, z, z}; /* lanes: (x0, w0), (x0, w1), (x1, w0), (x1, w1) */
        for (int k = 0; k < (k_halves(K) ? 2 : 4); k++) {
            if (k >= nu) continue;
            for (int e = 0; e < 2; e++) {
                const int8x16_t a0 = vld1q_s8(x0[k].qs + 16 * e), a1 = vld1q_s8(x1[k].qs + 16 * e);
                int32x4_t *mk = &m[k_halves(K) ? 2 * k + e : k];
                *mk = vmmlaq_s32(*mk, QN_NAME(zip)(a0, a1, 0), B[k][2 * e]);
                *mk = vmmlaq_s32(*mk, QN_NAME(zip)(a0, a1, 1), B[k][2 * e + 1]);
            }
        }
        const int32x4_t t01a = vtrn1q_s32(m[0], m[1]), t01b = vtrn2q_s32(m[0], m[1]);
        const int32x4_t t23a = vtrn1q_s32(m[2], m[3]), t23b = vtrn2q_s32(m[2], m[3]);
#define QN_T64(f, a, b) vreinterpretq_s32_s64(f(vreinterpretq_s64_s32(a), vreinterpretq_s64_s32(b)))
        const int32x4_t t[2][2] = {{QN_T64(vtrn1q_s64, t01a, t23a), QN_T64(vtrn1q_s64, t01b, t23b)},
                                   {QN_T64(vtrn2q_s64, t01a, t23a), QN_T64(vtrn2q_s64, t01b, t23b)}};
#undef QN_T64
        for (int i = 0; i < 2; i++) {
            float32x4_t dx, ds;
            nq_xside(K, i ? x1 : x0, nu, &dx, &ds);
            for (int v = 0; v < 2; v++) nq_accum(K, &g[v], dx, ds, t[i][v], &acc[v][r + i], &cor[v][r + i]);
        }
    }
    if (r < NX) { /* NX odd: one row */
        const pkv_q8a *xr = x + r * xs + u0;
        float32x4_t dx, ds;
        nq_xside(K, xr, nu, &dx, &ds);
        for (int v = 0; v < 2; v++)
            nq_accum(K, &g[v], dx, ds, QN_NAME(totals)(K, &g[v], nu, xr), &acc[v][r], &cor[v][r]);
    }
}

QN_AI void QN_NAME(pbody)(int K, nq_state *st0, nq_state *st1, const uint8_t *w, size_t ws, const pkv_q8a *x,
                          int64_t xs, int64_t nb, const int NX, float *out) {
    float32x4_t acc[2][8], cor[2][8];
    for (int r = 0; r < NX; r++) acc[0][r] = acc[1][r] = cor[0][r] = cor[1][r] = vdupq_n_f32(0);
    const int64_t nu_all = nb * k_nsub(K);
    const int G = nq_per_group(K);
    int64_t u0 = 0;
    for (; u0 + G <= nu_all; u0 += G) QN_NAME(pgroup)(K, st0, st1, w, ws, x, xs, u0, G, NX, acc, cor);
    if (u0 < nu_all) QN_NAME(pgroup)(K, st0, st1, w, ws, x, xs, u0, (int)(nu_all - u0), NX, acc, cor);
    for (int r = 0; r < NX; r++) {
        out[r] = nq_out(K, acc[0][r], cor[0][r]);
        out[PKV_QDOT_NX + r] = nq_out(K, acc[1][r], cor[1][r]);
    }
}

#define QN_FN(n, K, T)                                                                                        \
    QN_T void QN_NAME(n)(const uint8_t *w, size_t ws, const pkv_q8a *x, int64_t xs, int64_t nb, int nx,        \
                         float *out) {                                                                        \
        nq_state st[2];                                                                                       \
        st[0].dec = st[1].dec = K == K_DEC ? pkv_qblock_decoder(T) : NULL;                                    \
        st[0].bb = st[1].bb = pkv_type_block_bytes(T);                                                        \
        int r = 0;                                                                                            \
        for (; r + 8 <= nx; r += 8) QN_NAME(pbody)(K, &st[0], &st[1], w, ws, x + r * xs, xs, nb, 8, out + r); \
        for (; r + 4 <= nx; r += 4) QN_NAME(pbody)(K, &st[0], &st[1], w, ws, x + r * xs, xs, nb, 4, out + r); \
        for (; r + 2 <= nx; r += 2) QN_NAME(pbody)(K, &st[0], &st[1], w, ws, x + r * xs, xs, nb, 2, out + r); \
        for (; r < nx; r++) QN_NAME(pbody)(K, &st[0], &st[1], w, ws, x + r * xs, xs, nb, 1, out + r);       \
    }
#endif

QN_FN(q8_0, K_Q8_0, PKV_TYPE_Q8_0)
QN_FN(q4_0, K_Q4_0, PKV_TYPE_Q4_0)
QN_FN(q4_k, K_Q4_K, PKV_TYPE_Q4_K)
QN_FN(q5_k, K_Q5_K, PKV_TYPE_Q5_K)
QN_FN(q6_k, K_Q6_K, PKV_TYPE_Q6_K)
QN_FN(mxfp4, K_MXFP4, PKV_TYPE_MXFP4)
QN_FN(q4_1, K_Q4_1, PKV_TYPE_Q4_1)
QN_FN(q5_0, K_Q5_0, PKV_TYPE_Q5_0)
QN_FN(q5_1, K_Q5_1, PKV_TYPE_Q5_1)
QN_FN(q2_k, K_Q2_K, PKV_TYPE_Q2_K)
QN_FN(q3_k, K_Q3_K, PKV_TYPE_Q3_K)
QN_FN(iq4_nl, K_IQ4_NL, PKV_TYPE_IQ4_NL)
QN_FN(iq4_xs, K_IQ4_XS, PKV_TYPE_IQ4_XS)
QN_FN(iq3_s, K_IQ3_S, PKV_TYPE_IQ3_S)
QN_FN(iq2_xxs, K_DEC, PKV_TYPE_IQ2_XXS)
QN_FN(iq2_xs, K_DEC, PKV_TYPE_IQ2_XS)
QN_FN(iq2_s, K_DEC, PKV_TYPE_IQ2_S)
QN_FN(iq3_xxs, K_DEC, PKV_TYPE_IQ3_XXS)
QN_FN(iq1_s, K_DEC, PKV_TYPE_IQ1_S)
QN_FN(iq1_m, K_DEC, PKV_TYPE_IQ1_M)
QN_FN(tq1_0, K_DEC, PKV_TYPE_TQ1_0)
QN_FN(tq2_0, K_DEC, PKV_TYPE_TQ2_0)

#undef QN_FN
#undef QN_AI
