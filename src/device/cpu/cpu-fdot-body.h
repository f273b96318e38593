/* The x86 float-weight dots (f32, f16, bf16 weights against f32 rows), written
 * once and compiled twice: by cpu-avx2.c with 8-float ymm vectors and by
 * cpu-avx512.c with 16-float zmm vectors. The includer defines ld_f16 and
 * ld_bf16 (one vector from FV_LANES halves) and:
 *   FV_TARGET        the target attribute of every function
 *   FV_V, FV_LANES   the vector type and its number of floats
 *   FV_ZERO() FV_LOADU(p) FV_FMA(a, b, c) FV_ADD(a, b)
 *   FV_HSUM(v)       the sum of the lanes of v, in a fixed order
 *   FV_STOREU(p, v) FV_MUL(a, b) FV_SET1(f)
 *   FV_NAME(n)       the name of the function for n (f32x .. bf16t)
 *   FV_TILE_NX       x rows per tile with four weight rows (2 with 16 ymm
 *                    registers, 4 with 32 zmm)
 * and gets the static functions FV_NAME(f32x), FV_NAME(f16x), FV_NAME(bf16x),
 * FV_NAME(f32t), FV_NAME(f16t), FV_NAME(bf16t) and FV_NAME(scan) of cpu-dots.h. */

#define FV_AI __attribute__((always_inline)) FV_TARGET static inline

FV_AI FV_V ldw(const void *w, int kind, int64_t i) {
    if (kind == 0) return FV_LOADU((const float *)w + i);
    if (kind == 1) return ld_f16((const uint16_t *)w + i);
    return ld_bf16((const uint16_t *)w + i);
}

FV_AI float w_at(const void *w, int kind, int64_t i) {
    if (kind == 0) return ((const float *)w)[i];
    if (kind == 1) return _cvtsh_ss(((const uint16_t *)w)[i]);
    uint32_t u = (uint32_t)((const uint16_t *)w)[i] << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* One weight row (kind 0 f32, 1 f16, 2 bf16) against NX x rows: each weight
 * vector is loaded and widened once and used NX times. One x row gets the same
 * float operations in the same order whatever NX is, so a matmul's result for a
 * row does not depend on how many rows share the call (batch composition). */
FV_AI void fxn(const void *w, int kind, const float *x, int64_t xs, int64_t n, const int NX, float *out) {
    FV_V a[8];
    for (int r = 0; r < 2 * NX; r++) a[r] = FV_ZERO();
    int64_t i = 0;
    for (; i + 2 * FV_LANES <= n; i += 2 * FV_LANES) {
        const FV_V w0 = ldw(w, kind, i), w1 = ldw(w, kind, i + FV_LANES);
        for (int r = 0; r < NX; r++) {
            a[2 * r] = FV_FMA(w0, FV_LOADU(x + r * xs + i), a[2 * r]);
            a[2 * r + 1] = FV_FMA(w1, FV_LOADU(x + r * xs + i + FV_LANES), a[2 * r + 1]);
        }
    }
    for (int r = 0; r < NX; r++) {
        float s = FV_HSUM(FV_ADD(a[2 * r], a[2 * r + 1]));
        for (int64_t k = i; k < n; k++) s += w_at(w, kind, k) * x[r * xs + k];
        out[r] = s;
    }
}

#define FV_ROW_FN(name, WT, kind)                                                          \
    FV_TARGET static void name(const WT *w, const float *x, int64_t xs, int64_t n, int nx, float *out) { \
        if (nx == 4)                                                                       \
            fxn(w, kind, x, xs, n, 4, out);                                                \
        else                                                                               \
            for (int r = 0; r < nx; r++) fxn(w, kind, x + r * xs, xs, n, 1, out + r);      \
    }
FV_ROW_FN(FV_NAME(f32x), float, 0)
FV_ROW_FN(FV_NAME(f16x), uint16_t, 1)
FV_ROW_FN(FV_NAME(bf16x), uint16_t, 2)
#undef FV_ROW_FN

/* The matmul's register tile (cpu-dots.h, f32t): NW weight rows x NX x rows, one
 * FV_LANES-lane accumulator per pair; lane l sums the products of elements
 * FV_LANES k + l in k order, then FV_HSUM (a fixed order), then the tail
 * elements in order with fmaf. A pair gets exactly these operations in every
 * tile shape. */
FV_AI void ftile(const void *w, int kind, int64_t ws, const float *x, int64_t xs, int64_t n, const int NW,
                 const int NX, float *y, int64_t ys) {
    FV_V a[4 * FV_TILE_NX];
    for (int k = 0; k < NW * NX; k++) a[k] = FV_ZERO();
    int64_t i = 0;
    for (; i + FV_LANES <= n; i += FV_LANES) {
        FV_V wv[4];
        for (int q = 0; q < NW; q++) wv[q] = ldw(w, kind, q * ws + i);
        for (int r = 0; r < NX; r++) {
            const FV_V xv = FV_LOADU(x + r * xs + i);
            for (int q = 0; q < NW; q++) a[r * NW + q] = FV_FMA(wv[q], xv, a[r * NW + q]);
        }
    }
    for (int r = 0; r < NX; r++)
        for (int q = 0; q < NW; q++) {
            float s = FV_HSUM(a[r * NW + q]);
            for (int64_t k = i; k < n; k++) s = fmaf(w_at(w, kind, q * ws + k), x[r * xs + k], s);
            y[r * ys + q] = s;
        }
}

/* 4 x FV_TILE_NX tiles where the shape allows (then 4 x 1), 1 x 4 with fewer
 * weight rows; every pair gets the same operations. */
#define FV_TILE_FN(name, WT, kind)                                                         \
    FV_TARGET static void name(const WT *w, int64_t ws, int nw, const float *x, int64_t xs, int nx, int64_t n, \
                               float *y, int64_t ys) {                                     \
        if (nw == 4) {                                                                     \
            int r = 0;                                                                     \
            for (; r + FV_TILE_NX <= nx; r += FV_TILE_NX)                                  \
                ftile(w, kind, ws, x + r * xs, xs, n, 4, FV_TILE_NX, y + r * ys, ys);      \
            for (; r < nx; r++) ftile(w, kind, ws, x + r * xs, xs, n, 4, 1, y + r * ys, ys); \
        } else if (nx == 4) {                                                              \
            for (int q = 0; q < nw; q++) ftile(w + q * ws, kind, ws, x, xs, n, 1, 4, y + q, ys); \
        } else {                                                                           \
            for (int q = 0; q < nw; q++)                                                   \
                for (int r = 0; r < nx; r++)                                               \
                    ftile(w + q * ws, kind, ws, x + r * xs, xs, n, 1, 1, y + r * ys + q, ys); \
        }                                                                                  \
    }
FV_TILE_FN(FV_NAME(f32t), float, 0)
FV_TILE_FN(FV_NAME(f16t), uint16_t, 1)
FV_TILE_FN(FV_NAME(bf16t), uint16_t, 2)
#undef FV_TILE_FN
/* Mamba-2's scan (cpu-dots.h, scan) for NR rows at once, sharing the loads of B and
 * C: lane l of a row's accumulator sums the elements FV_LANES k + l in k order, then
 * FV_HSUM, then the tail elements in order with fmaf; a row gets exactly these
 * operations for every NR. */
FV_AI void scan_rows(float *S, int ds, float decay, const float *dx, const float *B, const float *C, const int NR,
                     float *o) {
    FV_V acc[4], dxv[4];
    const FV_V dv = FV_SET1(decay);
    for (int r = 0; r < NR; r++) {
        acc[r] = FV_ZERO();
        dxv[r] = FV_SET1(dx[r]);
    }
    int n = 0;
    for (; n + FV_LANES <= ds; n += FV_LANES) {
        const FV_V b = FV_LOADU(B + n), c = FV_LOADU(C + n);
        for (int r = 0; r < NR; r++) {
            float *p = S + (size_t)r * ds + n;
            const FV_V sv = FV_FMA(FV_LOADU(p), dv, FV_MUL(dxv[r], b));
            FV_STOREU(p, sv);
            acc[r] = FV_FMA(sv, c, acc[r]);
        }
    }
    for (int r = 0; r < NR; r++) {
        float *row = S + (size_t)r * ds, sum = FV_HSUM(acc[r]);
        for (int k = n; k < ds; k++) {
            row[k] = fmaf(row[k], decay, dx[r] * B[k]);
            sum = fmaf(row[k], C[k], sum);
        }
        o[r] = sum;
    }
}

FV_TARGET static void FV_NAME(scan)(float *S, int nr, int ds, float decay, const float *dx, const float *B,
                                    const float *C, float *o) {
    int r = 0;
    for (; r + 4 <= nr; r += 4) scan_rows(S + (size_t)r * ds, ds, decay, dx + r, B, C, 4, o + r);
    for (; r < nr; r++) scan_rows(S + (size_t)r * ds, ds, decay, dx + r, B, C, 1, o + r);
}
#undef FV_AI
