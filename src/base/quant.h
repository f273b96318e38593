/* Quantized block formats exactly as GGUF defines them, with plain-C reference
 * conversions. These are the definition every fast path is tested against.
 * Block layouts (little-endian, packed):
 *   q8_0: { f16 d; int8 qs[32]; }                       x = d * q
 *   q4_0: { f16 d; uint8 qs[16]; }  element j < 16 is qs[j] & 15, element j + 16 is
 *                                   qs[j] >> 4;         x = d * (q - 8)
 *   q4_k, q5_k, q6_k, q8_k: 256-element super-blocks (see quant.c). */
#ifndef PKV_QUANT_H
#define PKV_QUANT_H

#include "pagekv.h"

/* dst[0..n) = dequantized row; n a multiple of the type's block. Any weight type
 * (f32, f16, bf16, q*) is accepted. Returns PKV_ERR_UNSUPPORTED for others. */
pkv_status pkv_dequantize_row(pkv_type t, const void *src, float *dst, int64_t n);
/* Quantize n floats into dst (row of pkv_type_row_bytes(t, n) bytes), nearest
 * rounding as the reference quantizers do. */
pkv_status pkv_quantize_row(pkv_type t, const float *src, void *dst, int64_t n);
/* Reference dot product of a weight row with f32 x (accumulated in double). */
double pkv_dot_ref(pkv_type t, const void *w, const float *x, int64_t n);

#endif
