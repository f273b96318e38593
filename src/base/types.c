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
    [PKV_TYPE_Q8_0] = {"q8_0", 32, 34},   /* f16 d; 32 int8 */
    [PKV_TYPE_Q4_K] = {"q4_k", 256, 144}, /* f16 d, dmin; 12 scale bytes; 128 quant bytes */
    [PKV_TYPE_Q5_K] = {"q5_k", 256, 176}, /* + 32 bytes of high bits */
    [PKV_TYPE_Q6_K] = {"q6_k", 256, 210}, /* 128 low, 64 high, 16 int8 scales, f16 d */
    [PKV_TYPE_Q8_K] = {"q8_k", 256, 292}, /* f32 d; 256 int8; 16 int16 block sums */
    [PKV_TYPE_I32] = {"i32", 1, 4},
    [PKV_TYPE_BF16] = {"bf16", 1, 2},
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
