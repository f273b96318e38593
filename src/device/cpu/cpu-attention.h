/* Inner loops of the CPU attention (cpu-kernels.c), one table per
 * instruction-set path (cpu-attention.c). Every function gives a value the same
 * float operations whatever else shares the call (its position among the rows
 * or tokens, their number), so a query's result does not depend on how it was
 * batched. The paths differ from each other in rounding (FMA or not). */
#ifndef PKV_CPU_ATTENTION_H
#define PKV_CPU_ATTENTION_H

#include "pagekv.h"

#define PKV_ATT_TOKENS 16 /* tokens per chunk of scores */

typedef struct pkv_cpu_att {
    const char *name;
    /* dst[i] = src[i] (f16) as f32, i < n */
    void (*cvt)(const uint16_t *src, float *dst, int64_t n);
    /* dst[0..n) = the n / 32 blocks at src (q8_0 or q4_0) dequantized: d * q as
     * quant.h defines it, one exact product per element, so every path gives the
     * same bits */
    void (*deq)(pkv_type t, const uint8_t *src, float *dst, int64_t n);
    /* s[r * ss + c] = scale * (k[c] . q[r]) for c < PKV_ATT_TOKENS, r < nr, where
     * q[r] = q + r * qs and the dot of d elements is summed in 16 lanes (lane j
     * takes elements j, j + 16, ... in order), then the lanes in a fixed tree
     * (j with j + 8, then j + 4, j + 2, j + 1). All PKV_ATT_TOKENS k rows must be
     * readable (repeat one for missing tokens). */
    void (*scores)(const float *const *k, const float *q, int64_t qs, int nr, int64_t d, float scale, float *s,
                   int64_t ss);
    /* p[c] = exp(p[c] - m) for c < n (n <= PKV_ATT_TOKENS, p[c] <= m); returns
     * their sum, taken in a fixed order for each n */
    float (*softexp)(float *p, int n, float m);
    /* acc[i] += sum over c < n of p[c] * v[c][i], in c order, i < dv */
    void (*vsum)(float *acc, const float *p, const float *const *v, int n, int64_t dv);
} pkv_cpu_att;

/* The table of the path named `path` ("generic", "avx2", "avx512", "neon",
 * "dotprod", "i8mm": the name of the cpu-dots.h table in use, so the CPU has
 * it); generic for anything else. */
const pkv_cpu_att *pkv_cpu_att_for(const char *path);

#endif
