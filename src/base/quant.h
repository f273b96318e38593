/* Quantized block formats exactly as GGUF defines them, with plain-C reference
 * conversions. These are the definition every fast path is tested against.
 * Block layouts (little-endian, packed):
 *   q8_0: { f16 d; int8 qs[32]; }                       x = d * q
 *   q4_0: { f16 d; uint8 qs[16]; }  element j < 16 is qs[j] & 15, element j + 16 is
 *                                   qs[j] >> 4;         x = d * (q - 8)
 *   mxfp4: { uint8 e; uint8 qs[16]; }  (OCP MX v1.0 MXFP4, ggml type 39; 17 bytes)
 *                                   element j < 16 is qs[j] & 15, element j + 16 is
 *                                   qs[j] >> 4, each an E2M1 code q;
 *                                   x = pkv_mxfp4_kvalues[q] * pkv_e8m0_half(e)
 *   q4_k, q5_k, q6_k, q8_k: 256-element super-blocks (see quant.c). */
#ifndef PKV_QUANT_H
#define PKV_QUANT_H

#include "pagekv.h"

#include <string.h>

/* The value of each E2M1 (FP4) code, doubled so that every one is an integer
 * (as ggml's kvalues_mxfp4): {0, 0.5, 1, 1.5, 2, 3, 4, 6} * 2, codes 8..15 the
 * same negated (code 8, -0, is 0). */
extern const int8_t pkv_mxfp4_kvalues[16];

/* An E8M0 exponent as the scale of the doubled values: 2^(e - 128), half the
 * spec's 2^(e - 127). Exact for every e: 0 and 1 give the subnormals 2^-128 and
 * 2^-127; 255, the spec's NaN, gives 2^127 as ggml does. */
static inline float pkv_e8m0_half(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* dst[0..n) = dequantized row; n a multiple of the type's block. Any weight type
 * (f32, f16, bf16, q*, mxfp4) is accepted. Returns PKV_ERR_UNSUPPORTED for others. */
pkv_status pkv_dequantize_row(pkv_type t, const void *src, float *dst, int64_t n);
/* Quantize n floats into dst (row of pkv_type_row_bytes(t, n) bytes), nearest
 * rounding as the reference quantizers do. */
pkv_status pkv_quantize_row(pkv_type t, const float *src, void *dst, int64_t n);
/* Reference dot product of a weight row with f32 x (accumulated in double). */
double pkv_dot_ref(pkv_type t, const void *w, const float *x, int64_t n);

#endif
