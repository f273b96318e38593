/* Row dot products of the CPU matmul, one table per instruction-set path.
 * The generic path (cpu-dots.c) is plain C and always available; cpu-avx2.c and
 * cpu-avx512.c hold the same functions compiled for those targets, cpu-neon.c
 * the 64-bit ARM ones (neon, dotprod, i8mm). Which table a call uses is chosen
 * at run time, at every kernel call (cpu-kernels.c, dots_select; PKV_CPU_PATH
 * forces one). */
#ifndef PKV_CPU_DOTS_H
#define PKV_CPU_DOTS_H

#include "pagekv.h"

/* An activation block quantized to 8 bits (like q8_0 but with an f32 scale):
 * x[j] ≈ d * qs[j], qs in [-127, 127]; s[h] = sum of qs[16h .. 16h+16), which
 * lets unsigned weight quants (q4_0, k-quants) fold their offsets and mins out
 * of the inner loop. A 32-element block lines up with a k-quant sub-block. */
typedef struct pkv_q8a {
    float d;
    float ds; /* d * (s[0] + s[1]), for the k-quant mins */
    int16_t s[2];
    int8_t qs[32];
} pkv_q8a;

/* Most activation rows one call of the quantized dots takes (PKV_QDOT_NX). */
#define PKV_QDOT_NX 8

/* Dots of one weight row of nb blocks (of the weight type's own size: 32 for
 * q8_0/q4_0/mxfp4, 256 for k-quants) with nx (1..PKV_QDOT_NX) activation rows: row r starts at
 * x + r*xs (xs in activation blocks); out[r] receives its dot. */
typedef void (*pkv_qdot_fn)(const uint8_t *w, const pkv_q8a *x, int64_t xs, int64_t nb, int nx, float *out);

/* The same for two weight rows at once, w and w + ws bytes: out[r] receives the
 * first row's dot with activation row r, out[PKV_QDOT_NX + r] the second's. A
 * (weight row, activation row) pair gets exactly the operations of the one-row
 * function, so results do not depend on which rows are paired. */
typedef void (*pkv_qdot2_fn)(const uint8_t *w, size_t ws, const pkv_q8a *x, int64_t xs, int64_t nb, int nx,
                             float *out);

/* Two consecutive activation blocks laid out for 512-bit q8_0 dots (q8_0z):
 * qs of both blocks and the scales (d of the first block in d[0..8), of the
 * second in d[8..16)). An odd last block has a zero second half. */
typedef struct pkv_q8z {
    int8_t qs[64];
    float d[16];
} pkv_q8z;

/* Eight consecutive activation blocks (256 elements: one k-quant super-block)
 * with their scales side by side: d[k], ds[k] and s[2k], s[2k+1] are block k's,
 * qs[32k .. 32k+32) its quants. The same numbers as the eight pkv_q8a blocks
 * (pkv_cpu_q8s lays them out), so the k-quant dots can scale eight sub-blocks
 * with one vector operation instead of one broadcast each. */
typedef struct pkv_q8s {
    float d[8];
    float ds[8];
    int16_t s[16];
    int8_t qs[256];
} pkv_q8s;

/* A k-quant dot against pkv_q8s rows (x row r at x + r*xs super-blocks), like
 * pkv_qdot_fn otherwise. */
typedef void (*pkv_sdot_fn)(const uint8_t *w, const pkv_q8s *x, int64_t xs, int64_t nb, int nx, float *out);

/* Lay nsb super-blocks (8 * nsb pkv_q8a blocks) out as pkv_q8s. */
void pkv_cpu_q8s(const pkv_q8a *x, pkv_q8s *s, int64_t nsb);

/* q4_k weights repacked (pkv_cpu_repack_q4_k): PKV_Q4KR_ROWS consecutive weight
 * rows interleaved per super-block, with the 6-bit scales and mins unpacked to
 * bytes, so that a dot reads 8 rows' quants as one vector per 4 elements (lane i
 * = row i) and nothing is unpacked but the nibbles. One super-block of 8 rows:
 * 1216 bytes against 8 * 144 in the file. */
#define PKV_Q4KR_ROWS 8
typedef struct pkv_q4kr {
    float d[8], dmin[8];       /* row i's d and dmin (the f16 values, widened exactly) */
    uint8_t sc[8][8], m[8][8]; /* [sub-block k][row i]: the 6-bit scale and min */
    uint8_t qs[4][8][32];      /* [g][c][4i + j] = row i's qs[32g + 4c + j] (sub-blocks 2g, 2g + 1) */
} pkv_q4kr;

/* Lay out the rows of one group (rows 8 at a time from w, rb bytes apart, nb
 * super-blocks each) as nb pkv_q4kr. */
void pkv_cpu_repack_q4_k(const uint8_t *w, size_t rb, int64_t nb, pkv_q4kr *dst);

/* The 8 rows of a pkv_q4kr group (nb super-blocks) against nx (1..PKV_QDOT_NX)
 * pkv_q8s rows at x + r*xs: out[8r + i] = row i's dot with x row r. A (weight
 * row, activation row) pair gets exactly the operations of the sup[PKV_TYPE_Q4_K]
 * dot on the plain layout (the same integer sums, the same float operations in
 * the same order, lane for lane), so the two layouts give bit-identical results. */
typedef void (*pkv_rdot_fn)(const pkv_q4kr *w, const pkv_q8s *x, int64_t xs, int64_t nb, int nx, float *out);

/* The types of pkv_cpu_dots.more, as a bit mask (bit t for type t). */
#define PKV_QDOT_BIT(t) (1ull << (t))
#define PKV_QDOT_MORE_TYPES                                                                                     \
    (PKV_QDOT_BIT(PKV_TYPE_Q4_1) | PKV_QDOT_BIT(PKV_TYPE_Q5_0) | PKV_QDOT_BIT(PKV_TYPE_Q5_1) |                   \
     PKV_QDOT_BIT(PKV_TYPE_Q2_K) | PKV_QDOT_BIT(PKV_TYPE_Q3_K) | PKV_QDOT_BIT(PKV_TYPE_IQ2_XXS) |                \
     PKV_QDOT_BIT(PKV_TYPE_IQ2_XS) | PKV_QDOT_BIT(PKV_TYPE_IQ2_S) | PKV_QDOT_BIT(PKV_TYPE_IQ3_XXS) |             \
     PKV_QDOT_BIT(PKV_TYPE_IQ3_S) | PKV_QDOT_BIT(PKV_TYPE_IQ1_S) | PKV_QDOT_BIT(PKV_TYPE_IQ1_M) |                \
     PKV_QDOT_BIT(PKV_TYPE_IQ4_NL) | PKV_QDOT_BIT(PKV_TYPE_IQ4_XS) | PKV_QDOT_BIT(PKV_TYPE_TQ1_0) |              \
     PKV_QDOT_BIT(PKV_TYPE_TQ2_0))

typedef struct pkv_cpu_dots {
    const char *name; /* "generic", "avx2", "avx512"; "neon", "dotprod", "i8mm" */
    /* one weight row against nx (1..4) x rows at x + r*xs floats; out[r] = dot */
    void (*f32x)(const float *w, const float *x, int64_t xs, int64_t n, int nx, float *out);
    void (*f16x)(const uint16_t *w, const float *x, int64_t xs, int64_t n, int nx, float *out);
    void (*bf16x)(const uint16_t *w, const float *x, int64_t xs, int64_t n, int nx, float *out);
    /* The matmul's register tile: nw (1..4) weight rows, row i at w + i*ws
     * elements, against nx (1..4) x rows at x + r*xs floats; y[r*ys + i] = dot.
     * Every (weight row, x row) pair has its own accumulator and the same
     * operations in the same order whatever nw and nx are (and whatever tile the
     * pair comes in), so a row's result does not depend on the batch. Not the
     * same order as f32x/f16x/bf16x (which attention uses). NULL (generic):
     * the matmul uses f32x/f16x/bf16x per weight row. */
    void (*f32t)(const float *w, int64_t ws, int nw, const float *x, int64_t xs, int nx, int64_t n, float *y, int64_t ys);
    void (*f16t)(const uint16_t *w, int64_t ws, int nw, const float *x, int64_t xs, int nx, int64_t n, float *y,
                 int64_t ys);
    void (*bf16t)(const uint16_t *w, int64_t ws, int nw, const float *x, int64_t xs, int nx, int64_t n, float *y,
                  int64_t ys);
    /* exact f16 -> f32 and round-to-nearest-even f32 -> f16 (as pkv_f32_to_f16)
     * of n elements; NULL on the generic path */
    void (*f16row)(const uint16_t *src, float *dst, int64_t n);
    void (*f32f16row)(const float *src, uint16_t *dst, int64_t n);
    /* quantized weights against 8-bit activations; NULL (avx512 table): use the AVX2 one */
    pkv_qdot_fn q8_0, q4_0, q4_k, q5_k, q6_k, mxfp4;
    /* The k-quants against pkv_q8s rows, indexed by type (q2_k .. q6_k); where
     * set they replace the pkv_q8a dot for every batch size (so results stay
     * batch-invariant). */
    pkv_sdot_fn sup[PKV_TYPE_COUNT];
    /* q4_k on the repacked layout (pkv_q4kr); NULL: this path keeps the plain one. */
    pkv_rdot_fn q4_kr;
    /* The types with an integer form (quant.h, pkv_qblock: q4_1 .. tq2_0),
     * indexed by type; NULL (avx512 table): use the AVX2 one. */
    pkv_qdot_fn more[PKV_TYPE_COUNT];
    /* Bit t set: more[t] on this path is the fallback that decodes each block
     * to its integer form in plain C before the dots (the generic path's only
     * way; on AVX2/AVX-512 and the ARM paths the dots themselves are
     * vectorized), not a kernel written for the type. Reported by pagekv
     * devices and bench model. */
    uint64_t slow;
    /* q8_0 two blocks per 512-bit step against pkv_q8z rows (x row r at
     * x + r*xs pairs): 16 float lanes, blocks 2k in lanes 0..7 and 2k+1 in 8..15,
     * then one fixed reduction; nx 1..PKV_QDOT_NX. Used for decode and prefill alike where present.
     * q8z lays nb blocks out as (nb + 1) / 2 pairs. NULL without VNNI. */
    void (*q8_0z)(const uint8_t *w, const pkv_q8z *x, int64_t xs, int64_t nb, int nx, float *out);
    void (*q8z)(const pkv_q8a *x, pkv_q8z *z, int64_t nb);
    /* pkv_cpu_quantize_q8a (same results on every path) */
    void (*q8a)(const float *x, pkv_q8a *y, int64_t nb);
    /* Two weight rows per call (pkv_qdot2_fn), indexed by type, for prefill and
     * batched decode; NULL: one row at a time with the functions above. Only
     * the i8mm path has them (SMMLA multiplies 2 x 8 by 8 x 2 bytes: two weight
     * rows against two activation rows). */
    pkv_qdot2_fn pair[PKV_TYPE_COUNT];
    /* One token of Mamba-2's scan (kernel ssm_scan) over nr state rows of ds floats,
     * row r at S + r * ds: S[r][n] = S[r][n] * decay + dx[r] * B[n], then
     * o[r] = sum_n S[r][n] * C[n]. A row gets the same operations whatever nr is
     * (and whatever rows share the call), so results do not depend on the batch.
     * Every table has one (the generic loop, AVX2/AVX-512 and NEON vectors). */
    void (*scan)(float *S, int nr, int ds, float decay, const float *dx, const float *B, const float *C, float *o);
} pkv_cpu_dots;

extern const pkv_cpu_dots pkv_cpu_dots_generic;
#if defined(__x86_64__) && defined(__GNUC__)
#define PKV_CPU_X86 1
extern const pkv_cpu_dots pkv_cpu_dots_avx2;
extern const pkv_cpu_dots pkv_cpu_dots_avx512;
extern const pkv_cpu_dots pkv_cpu_dots_vnni; /* only the 8-bit dots; needs AVX512-VNNI */
#endif
#if defined(__aarch64__) && defined(__GNUC__)
#define PKV_CPU_ARM 1
extern const pkv_cpu_dots pkv_cpu_dots_neon;    /* ARMv8.0 Advanced SIMD: every aarch64 CPU */
extern const pkv_cpu_dots pkv_cpu_dots_dotprod; /* + SDOT (HWCAP_ASIMDDP) */
extern const pkv_cpu_dots pkv_cpu_dots_i8mm;    /* + SMMLA (HWCAP2_I8MM, with SDOT) */
#endif

/* Quantize nb blocks of 32 floats to pkv_q8a (d = amax/127, nearest rounding,
 * clamped to [-127, 127]). A block with a NaN or infinity gives a meaningless
 * but defined result (no overflow); the paths agree bit for bit only on finite
 * input. */
void pkv_cpu_quantize_q8a(const float *x, pkv_q8a *y, int64_t nb);

#endif
