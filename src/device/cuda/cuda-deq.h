/* Element k of a weight row in its GGUF block layout (src/base/quant.c), as the
 * CUDA kernels read it. The same code compiles for the GPU (nvcc, in
 * cuda-kernels.cu) and for the host (C, in tests/test-cuda-plan.c), where it is
 * checked bit for bit against pkv_dequantize_row without a GPU.
 *
 * Each computes in float in the reference's order with explicit round-to-nearest
 * multiplies and subtractions (no fused multiply-add), so the result is the
 * reference's. On the GPU the row must be 4-byte aligned for f32 and 2-byte
 * aligned for the types with f16 fields (their block sizes are even); mxfp4
 * (17-byte blocks, read byte by byte) may start at any address. */
#ifndef PKV_CUDA_DEQ_H
#define PKV_CUDA_DEQ_H

#include "device/cuda/cuda-launch.h"

#ifdef __CUDACC__
#include <cuda_fp16.h>
#define PKV_CU_DQ static __device__ __forceinline__
#define PKV_CU_MUL(a, b) __fmul_rn((a), (b))
#define PKV_CU_SUB(a, b) __fsub_rn((a), (b))
#define PKV_CU_UNROLL _Pragma("unroll")
PKV_CU_DQ float pkv_cu_ld_f16(const uint8_t *p) { return __half2float(*(const __half *)p); }
PKV_CU_DQ float pkv_cu_ld_bf16(const uint8_t *p) { return __uint_as_float((uint32_t)(*(const uint16_t *)p) << 16); }
PKV_CU_DQ float pkv_cu_ld_f32(const uint8_t *p) { return *(const float *)p; }
PKV_CU_DQ float pkv_cu_bits_f32(uint32_t u) { return __uint_as_float(u); }
#else
#include "pagekv.h"
#include <string.h>
#define PKV_CU_DQ static inline
#define PKV_CU_MUL(a, b) ((float)(a) * (float)(b))
#define PKV_CU_SUB(a, b) ((float)(a) - (float)(b))
#define PKV_CU_UNROLL
PKV_CU_DQ float pkv_cu_ld_f16(const uint8_t *p) { return pkv_f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }
PKV_CU_DQ float pkv_cu_ld_bf16(const uint8_t *p) { return pkv_bf16_to_f32((uint16_t)(p[0] | p[1] << 8)); }
PKV_CU_DQ float pkv_cu_ld_f32(const uint8_t *p) {
    float f;
    memcpy(&f, p, 4);
    return f;
}
PKV_CU_DQ float pkv_cu_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
#endif

/* 6-bit scale and min of sub-block j of a q4_k/q5_k super-block. */
PKV_CU_DQ void pkv_cu_scale_min_k4(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 15) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

PKV_CU_DQ float pkv_cu_deq_f32(const uint8_t *row, int64_t k) { return pkv_cu_ld_f32(row + 4 * k); }
PKV_CU_DQ float pkv_cu_deq_f16(const uint8_t *row, int64_t k) { return pkv_cu_ld_f16(row + 2 * k); }
PKV_CU_DQ float pkv_cu_deq_bf16(const uint8_t *row, int64_t k) { return pkv_cu_ld_bf16(row + 2 * k); }

/* q8_0: { f16 d; i8 q[32]; } x = d * q */
PKV_CU_DQ float pkv_cu_deq_q8_0(const uint8_t *row, int64_t k) {
    const uint8_t *b = row + (k >> 5) * 34;
    return PKV_CU_MUL(pkv_cu_ld_f16(b), (float)(int8_t)b[2 + (k & 31)]);
}

/* q4_0: { f16 d; u8 q[16]; } element j < 16: low nibble of q[j]; j >= 16: high
 * nibble of q[j - 16]; x = d * (q - 8) */
PKV_CU_DQ float pkv_cu_deq_q4_0(const uint8_t *row, int64_t k) {
    const uint8_t *b = row + (k >> 5) * 18;
    const int j = (int)(k & 31);
    const int q = j < 16 ? (b[2 + j] & 15) : (b[2 + j - 16] >> 4);
    return PKV_CU_MUL(pkv_cu_ld_f16(b), (float)(q - 8));
}

/* mxfp4: the doubled E2M1 value of code q (quant.h's pkv_mxfp4_kvalues, without
 * a table the GPU would have to keep in memory): magnitude code m < 4 is m,
 * above that (2 + (m & 1)) << ((m >> 1) - 1), i.e. 4, 6, 8, 12; bit 3 the sign */
PKV_CU_DQ int pkv_cu_fp4x2(int q) {
    const int m = q & 7, v = m < 4 ? m : (2 + (m & 1)) << ((m >> 1) - 1);
    return q & 8 ? -v : v;
}

/* The E8M0 byte e as the scale of the doubled values: 2^(e - 128), subnormal
 * for e < 2 (quant.h's pkv_e8m0_half) */
PKV_CU_DQ float pkv_cu_e8m0_half(uint8_t e) {
    return pkv_cu_bits_f32(e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23);
}

/* mxfp4: { u8 e; u8 q[16]; } element j < 16: low nibble of q[j]; j >= 16: high
 * nibble of q[j - 16]; x = fp4x2(q) * 2^(e - 128), an exact product */
PKV_CU_DQ float pkv_cu_deq_mxfp4(const uint8_t *row, int64_t k) {
    const uint8_t *b = row + (k >> 5) * 17;
    const int j = (int)(k & 31);
    const int q = j < 16 ? (b[1 + j] & 15) : (b[1 + j - 16] >> 4);
    return PKV_CU_MUL((float)pkv_cu_fp4x2(q), pkv_cu_e8m0_half(b[0]));
}

/* q4_k: 144-byte super-blocks of 256: element 64g + 32h + l is nibble h of
 * qs[32g + l], sub-block 2g + h; x = (d * sc) * q - dmin * m */
PKV_CU_DQ float pkv_cu_deq_q4_k(const uint8_t *row, int64_t k) {
    const uint8_t *b = row + (k >> 8) * 144;
    const int e = (int)(k & 255), g = e >> 6, hi = (e >> 5) & 1, l = e & 31;
    int sc, m;
    pkv_cu_scale_min_k4(2 * g + hi, b + 4, &sc, &m);
    const uint8_t qb = b[16 + 32 * g + l];
    const int q = hi ? qb >> 4 : qb & 15;
    const float d = PKV_CU_MUL(pkv_cu_ld_f16(b), (float)sc), mn = PKV_CU_MUL(pkv_cu_ld_f16(b + 2), (float)m);
    return PKV_CU_SUB(PKV_CU_MUL(d, (float)q), mn);
}

/* q5_k: 176-byte super-blocks: q4_k's layout after 32 bytes qh; element
 * 64g + 32h + l gets 16 more when bit 2g + h of qh[l] is set */
PKV_CU_DQ float pkv_cu_deq_q5_k(const uint8_t *row, int64_t k) {
    const uint8_t *b = row + (k >> 8) * 176;
    const int e = (int)(k & 255), g = e >> 6, hi = (e >> 5) & 1, l = e & 31;
    int sc, m;
    pkv_cu_scale_min_k4(2 * g + hi, b + 4, &sc, &m);
    const uint8_t qb = b[48 + 32 * g + l];
    const int q = (hi ? qb >> 4 : qb & 15) + (((b[16 + l] >> (2 * g + hi)) & 1) ? 16 : 0);
    const float d = PKV_CU_MUL(pkv_cu_ld_f16(b), (float)sc), mn = PKV_CU_MUL(pkv_cu_ld_f16(b + 2), (float)m);
    return PKV_CU_SUB(PKV_CU_MUL(d, (float)q), mn);
}

/* q6_k: 210-byte super-blocks, halves of 128 elements; quarter r (32 elements)
 * of a half: low 4 bits from ql[l + 32 (r & 1)] (high nibble for r >= 2), high 2
 * bits from qh[l] >> 2r, scale sc[l / 16 + 2r]; x = (d * sc) * (q - 32) */
PKV_CU_DQ float pkv_cu_deq_q6_k(const uint8_t *row, int64_t k) {
    const uint8_t *b = row + (k >> 8) * 210;
    const int e = (int)(k & 255), h = e >> 7, r = (e >> 5) & 3, l = e & 31;
    const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
    const int8_t sc = (int8_t)b[192 + 8 * h + l / 16 + 2 * r];
    const uint8_t lb = ql[l + 32 * (r & 1)];
    const int nib = r >= 2 ? lb >> 4 : lb & 15;
    const int q = (nib | ((qh[l] >> (2 * r)) & 3) << 4) - 32;
    const float ds = PKV_CU_MUL(pkv_cu_ld_f16(b + 208), (float)sc);
    return PKV_CU_MUL(ds, (float)q);
}

/* The 32 elements 32 sb .. 32 sb + 31 of a row at once (a q8_0/q4_0/mxfp4 block, a
 * k-quant sub-block; for float types 32 consecutive values), each equal to
 * the element-wise functions above: the decode kernel's unit of work. */
PKV_CU_DQ void pkv_cu_deq32_q8_0(const uint8_t *row, int64_t sb, float *y) {
    const uint8_t *b = row + sb * 34;
    const float d = pkv_cu_ld_f16(b);
    PKV_CU_UNROLL
    for (int j = 0; j < 32; j++) y[j] = PKV_CU_MUL(d, (float)(int8_t)b[2 + j]);
}

PKV_CU_DQ void pkv_cu_deq32_q4_0(const uint8_t *row, int64_t sb, float *y) {
    const uint8_t *b = row + sb * 18;
    const float d = pkv_cu_ld_f16(b);
    PKV_CU_UNROLL
    for (int j = 0; j < 16; j++) {
        y[j] = PKV_CU_MUL(d, (float)((b[2 + j] & 15) - 8));
        y[j + 16] = PKV_CU_MUL(d, (float)((b[2 + j] >> 4) - 8));
    }
}

PKV_CU_DQ void pkv_cu_deq32_mxfp4(const uint8_t *row, int64_t sb, float *y) {
    const uint8_t *b = row + sb * 17;
    const float d = pkv_cu_e8m0_half(b[0]);
    PKV_CU_UNROLL
    for (int j = 0; j < 16; j++) {
        y[j] = PKV_CU_MUL((float)pkv_cu_fp4x2(b[1 + j] & 15), d);
        y[j + 16] = PKV_CU_MUL((float)pkv_cu_fp4x2(b[1 + j] >> 4), d);
    }
}

/* q4_k and q5_k (five = 1): sub-block j = sb % 8 of super-block sb / 8 */
PKV_CU_DQ void pkv_cu_deq32_kmin(const uint8_t *row, int64_t sb, float *y, int five) {
    const uint8_t *b = row + (sb >> 3) * (five ? 176 : 144);
    const int j = (int)(sb & 7), g = j >> 1, hi = j & 1;
    int sc, m;
    pkv_cu_scale_min_k4(j, b + 4, &sc, &m);
    const float d = PKV_CU_MUL(pkv_cu_ld_f16(b), (float)sc), mn = PKV_CU_MUL(pkv_cu_ld_f16(b + 2), (float)m);
    const uint8_t *qs = b + (five ? 48 : 16) + 32 * g, *qh = b + 16;
    PKV_CU_UNROLL
    for (int l = 0; l < 32; l++) {
        int q = hi ? qs[l] >> 4 : qs[l] & 15;
        if (five && ((qh[l] >> j) & 1)) q += 16;
        y[l] = PKV_CU_SUB(PKV_CU_MUL(d, (float)q), mn);
    }
}

/* q6_k: sub-block j = sb % 8 is quarter j % 4 of half j / 4; its two halves of
 * 16 have their own scales */
PKV_CU_DQ void pkv_cu_deq32_q6_k(const uint8_t *row, int64_t sb, float *y) {
    const uint8_t *b = row + (sb >> 3) * 210;
    const int j = (int)(sb & 7), h = j >> 2, r = j & 3;
    const uint8_t *ql = b + 64 * h + 32 * (r & 1), *qh = b + 128 + 32 * h;
    const float d = pkv_cu_ld_f16(b + 208);
    const float ds0 = PKV_CU_MUL(d, (float)(int8_t)b[192 + 8 * h + 2 * r]);
    const float ds1 = PKV_CU_MUL(d, (float)(int8_t)b[192 + 8 * h + 2 * r + 1]);
    PKV_CU_UNROLL
    for (int l = 0; l < 32; l++) {
        const int nib = r >= 2 ? ql[l] >> 4 : ql[l] & 15;
        const int q = (nib | ((qh[l] >> (2 * r)) & 3) << 4) - 32;
        y[l] = PKV_CU_MUL(l < 16 ? ds0 : ds1, (float)q);
    }
}

PKV_CU_DQ void pkv_cu_deq32(int t, const uint8_t *row, int64_t sb, float *y) {
    switch (t) {
    case PKV_CU_W_Q8_0: pkv_cu_deq32_q8_0(row, sb, y); return;
    case PKV_CU_W_Q4_0: pkv_cu_deq32_q4_0(row, sb, y); return;
    case PKV_CU_W_Q4_K: pkv_cu_deq32_kmin(row, sb, y, 0); return;
    case PKV_CU_W_Q5_K: pkv_cu_deq32_kmin(row, sb, y, 1); return;
    case PKV_CU_W_Q6_K: pkv_cu_deq32_q6_k(row, sb, y); return;
    case PKV_CU_W_MXFP4: pkv_cu_deq32_mxfp4(row, sb, y); return;
    case PKV_CU_W_F32:
        for (int j = 0; j < 32; j++) y[j] = pkv_cu_deq_f32(row, 32 * sb + j);
        return;
    case PKV_CU_W_F16:
        for (int j = 0; j < 32; j++) y[j] = pkv_cu_deq_f16(row, 32 * sb + j);
        return;
    case PKV_CU_W_BF16:
        for (int j = 0; j < 32; j++) y[j] = pkv_cu_deq_bf16(row, 32 * sb + j);
        return;
    default:
        for (int j = 0; j < 32; j++) y[j] = 0.0f;
        return;
    }
}

/* Any type by its PKV_CU_W_* code (the host test's entry; the kernels use the
 * functions above through templates). */
PKV_CU_DQ float pkv_cu_deq(int t, const uint8_t *row, int64_t k) {
    switch (t) {
    case PKV_CU_W_F32: return pkv_cu_deq_f32(row, k);
    case PKV_CU_W_F16: return pkv_cu_deq_f16(row, k);
    case PKV_CU_W_BF16: return pkv_cu_deq_bf16(row, k);
    case PKV_CU_W_Q8_0: return pkv_cu_deq_q8_0(row, k);
    case PKV_CU_W_Q4_0: return pkv_cu_deq_q4_0(row, k);
    case PKV_CU_W_Q4_K: return pkv_cu_deq_q4_k(row, k);
    case PKV_CU_W_Q5_K: return pkv_cu_deq_q5_k(row, k);
    case PKV_CU_W_Q6_K: return pkv_cu_deq_q6_k(row, k);
    case PKV_CU_W_MXFP4: return pkv_cu_deq_mxfp4(row, k);
    default: return 0.0f;
    }
}

#endif /* PKV_CUDA_DEQ_H */
