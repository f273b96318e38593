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

#include <stdbool.h>
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

/* ---------------------------------------------------------------------------
 * The integer form of the other GGUF block types: q4_1, q5_0, q5_1, q2_k, q3_k,
 * iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s, iq1_s, iq1_m, iq4_nl, iq4_xs, tq1_0,
 * tq2_0 (layouts in quant-int.c). Every one of them is, element by element,
 *     x[i] = d[i / 16] * q[i]  (+ m[i / 16] for q4_1, q5_1, q2_k)
 * with q a small signed integer (|q| <= 127) and one float scale d (and offset m)
 * per 16 elements. The decoder computes d and m in the same float operations as
 * GGUF's reference dequantization does, so that d*q (+ m), one rounding each,
 * gives its values bit for bit: this is the reference dequantization of these
 * types, and the form the CPU dots and the Vulkan shaders decode to. */
typedef struct pkv_qblock {
    int8_t q[256]; /* [block elems] */
    float d[16];   /* [block elems / 16] */
    float m[16];   /* [block elems / 16]; 0 for types without offsets */
} pkv_qblock;
typedef void (*pkv_qblock_fn)(const uint8_t *b, pkv_qblock *out);
/* The decoder of a type of the list above; NULL for any other type. */
pkv_qblock_fn pkv_qblock_decoder(pkv_type t);
/* True for the types whose blocks have offsets (q4_1, q5_1, q2_k). */
bool pkv_qblock_has_min(pkv_type t);
/* Quantize one block (32 or 256 elements) of a type of the list above
 * (quant-rtn.c); false for other types. */
bool pkv_quantize_block_int(pkv_type t, const float *x, uint8_t *b);

/* The i-quant lookup tables (src/base/iq-grids.h) expanded to bytes: entry i of
 * an 8-value grid is 8 bytes (little-endian in the uint64), of a 4-value grid 4
 * bytes. ksigns[s] = s | parity(s) << 7: the sign byte of 7 stored sign bits
 * (bit j set: value j negative), the eighth making the count of negatives even. */
typedef struct pkv_iq_tables {
    uint64_t iq2xxs[256], iq2xs[512], iq2s[1024]; /* magnitudes 8, 25, 43 */
    uint32_t iq3xxs[256], iq3s[512];              /* magnitudes 4..62 / 1..15 */
    uint64_t iq1s[2048];                          /* int8 values -1, 0, 1 */
    uint8_t ksigns[128];
} pkv_iq_tables;
const pkv_iq_tables *pkv_iq_tables_get(void);
/* The 16 non-linear levels of iq4_nl and iq4_xs. */
extern const int8_t pkv_iq4nl_values[16];

/* dst[0..n) = dequantized row; n a multiple of the type's block. Any weight type
 * (f32, f16, bf16, q*, mxfp4) is accepted. Returns PKV_ERR_UNSUPPORTED for others. */
pkv_status pkv_dequantize_row(pkv_type t, const void *src, float *dst, int64_t n);
/* Quantize n floats into dst (row of pkv_type_row_bytes(t, n) bytes), nearest
 * rounding as the reference quantizers do. */
pkv_status pkv_quantize_row(pkv_type t, const float *src, void *dst, int64_t n);
/* Reference dot product of a weight row with f32 x (accumulated in double). */
double pkv_dot_ref(pkv_type t, const void *w, const float *x, int64_t n);

#endif
