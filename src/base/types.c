/* The element-type table: names and block geometry as GGUF defines them. */
#include "base/base.h"

#include <strings.h>

typedef struct {
    const char *name;
    size_t block_elems, block_bytes;
} type_info;

static const type_info k_types[PKV_TYPE_COUNT] = {
    [PKV_TYPE_F32] = {"f32", 1, 4},
    [PKV_TYPE_F16] = {"f16", 1, 2},
    [PKV_TYPE_Q4_0] = {"q4_0", 32, 18},   /* f16 d; 16 bytes of 4-bit quants */
    [PKV_TYPE_Q4_1] = {"q4_1", 32, 20},   /* f16 d, m; 16 bytes of 4-bit quants */
    [PKV_TYPE_Q5_0] = {"q5_0", 32, 22},   /* f16 d; 4 bytes of fifth bits; 16 bytes of 4-bit quants */
    [PKV_TYPE_Q5_1] = {"q5_1", 32, 24},   /* f16 d, m; then as q5_0 */
    [PKV_TYPE_Q8_0] = {"q8_0", 32, 34},   /* f16 d; 32 int8 */
    [PKV_TYPE_Q2_K] = {"q2_k", 256, 84},  /* 16 scale/min bytes; 64 quant bytes; f16 d, dmin */
    [PKV_TYPE_Q3_K] = {"q3_k", 256, 110}, /* 32 high-bit bytes; 64 quant bytes; 12 scale bytes; f16 d */
    [PKV_TYPE_Q4_K] = {"q4_k", 256, 144}, /* f16 d, dmin; 12 scale bytes; 128 quant bytes */
    [PKV_TYPE_Q5_K] = {"q5_k", 256, 176}, /* + 32 bytes of high bits */
    [PKV_TYPE_Q6_K] = {"q6_k", 256, 210}, /* 128 low, 64 high, 16 int8 scales, f16 d */
    [PKV_TYPE_Q8_K] = {"q8_k", 256, 292}, /* f32 d; 256 int8; 16 int16 block sums */
    [PKV_TYPE_IQ2_XXS] = {"iq2_xxs", 256, 66}, /* f16 d; 32 u16 of grid indices, signs and scales */
    [PKV_TYPE_IQ2_XS] = {"iq2_xs", 256, 74},   /* f16 d; 32 u16 (9-bit index, 7 sign bits); 8 scale bytes */
    [PKV_TYPE_IQ3_XXS] = {"iq3_xxs", 256, 98}, /* f16 d; 64 index bytes; 32 bytes of signs and scales */
    [PKV_TYPE_IQ1_S] = {"iq1_s", 256, 50},     /* f16 d; 32 index bytes; 8 u16 of high bits, scale, delta */
    [PKV_TYPE_IQ4_NL] = {"iq4_nl", 32, 18},    /* f16 d; 16 bytes of 4-bit codes */
    [PKV_TYPE_IQ3_S] = {"iq3_s", 256, 110},    /* f16 d; 64 index bytes; 8 high-bit bytes; 32 sign bytes; 4 scale bytes */
    [PKV_TYPE_IQ2_S] = {"iq2_s", 256, 82},     /* f16 d; 32 index bytes; 32 sign bytes; 8 high-bit bytes; 8 scale bytes */
    [PKV_TYPE_IQ4_XS] = {"iq4_xs", 256, 136},  /* f16 d; u16 high scale bits; 4 low scale bytes; 128 code bytes */
    [PKV_TYPE_I32] = {"i32", 1, 4},
    [PKV_TYPE_IQ1_M] = {"iq1_m", 256, 56},     /* 32 index bytes; 16 high-bit bytes; 8 scale bytes (with d) */
    [PKV_TYPE_BF16] = {"bf16", 1, 2},
    [PKV_TYPE_TQ1_0] = {"tq1_0", 256, 54},     /* 48 bytes of 5 trits, 4 bytes of 4 trits; f16 d */
    [PKV_TYPE_TQ2_0] = {"tq2_0", 256, 66},     /* 64 bytes of 2-bit codes; f16 d */
    [PKV_TYPE_MXFP4] = {"mxfp4", 32, 17}, /* u8 e (E8M0); 16 bytes of 4-bit E2M1 codes */
};

static const type_info *info(pkv_type t) {
    if ((int)t < 0 || t >= PKV_TYPE_COUNT || !k_types[t].name) return NULL;
    return &k_types[t];
}

const char *pkv_type_name(pkv_type t) {
    const type_info *i = info(t);
    return i ? i->name : NULL;
}

pkv_status pkv_type_from_name(const char *name, pkv_type *out) {
    if (!name || !out) return pkv_err(PKV_ERR_INVALID, "type_from_name: NULL name or output");
    for (int t = 0; t < PKV_TYPE_COUNT; t++)
        if (k_types[t].name && strcasecmp(k_types[t].name, name) == 0) {
            *out = (pkv_type)t;
            return PKV_OK;
        }
    return pkv_err(PKV_ERR_NOT_FOUND, "unknown type '%s'", name);
}

size_t pkv_type_block_elems(pkv_type t) {
    const type_info *i = info(t);
    return i ? i->block_elems : 0;
}

size_t pkv_type_block_bytes(pkv_type t) {
    const type_info *i = info(t);
    return i ? i->block_bytes : 0;
}

size_t pkv_type_row_bytes(pkv_type t, size_t n) {
    const type_info *i = info(t);
    if (!i || n % i->block_elems) return 0;
    size_t r;
    if (!pkv_mul_ok(n / i->block_elems, i->block_bytes, &r)) return 0;
    return r;
}
