/* Row dot products of the CPU matmul, one table per instruction-set path.
 * The generic path (cpu-dots.c) is plain C and always available; cpu-avx2.c and
 * cpu-avx512.c hold the same functions compiled for those targets. Which table a
 * call uses is chosen at run time (cpu-kernels.c: pkv_cpu_dots_select). */
#ifndef PKV_CPU_DOTS_H
#define PKV_CPU_DOTS_H

#include "pagekv.h"

/* An activation block quantized to 8 bits (like q8_0 but with an f32 scale):
 * x[j] ≈ d * qs[j], qs in [-127, 127]. */
typedef struct pkv_q8a {
    float d;
    int8_t qs[32];
} pkv_q8a;

typedef struct pkv_cpu_dots {
    const char *name; /* "generic", "avx2", "avx512" */
    float (*f32)(const float *w, const float *x, int64_t n);
    float (*f16)(const uint16_t *w, const float *x, int64_t n);
    float (*bf16)(const uint16_t *w, const float *x, int64_t n);
    /* nb blocks of q8_0 / q4_0 weights against nb activation blocks. */
    float (*q8_0)(const uint8_t *w, const pkv_q8a *x, int64_t nb);
    float (*q4_0)(const uint8_t *w, const pkv_q8a *x, int64_t nb);
    /* y += a * x, n floats (attention's value accumulation). */
    void (*axpy)(float *y, float a, const float *x, int64_t n);
} pkv_cpu_dots;

extern const pkv_cpu_dots pkv_cpu_dots_generic;
#if defined(__x86_64__) && defined(__GNUC__)
#define PKV_CPU_X86 1
extern const pkv_cpu_dots pkv_cpu_dots_avx2;
extern const pkv_cpu_dots pkv_cpu_dots_avx512;
#endif

/* Quantize nb blocks of 32 floats to pkv_q8a (d = amax/127, nearest rounding). */
void pkv_cpu_quantize_q8a(const float *x, pkv_q8a *y, int64_t nb);

#endif
