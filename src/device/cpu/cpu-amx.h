/* Quantized matmuls on Intel AMX tiles (cpu-amx.c): the "amx" CPU path, used
 * for q8_0 and q4_k weights where the CPU and the kernel (Linux) allow the tile
 * registers; the other weight types keep the avx512 path. Its formula per output element
 * is in cpu-amx.c; every batch size and thread count gives the same bits. */
#ifndef PKV_CPU_AMX_H
#define PKV_CPU_AMX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "device/cpu/cpu-dots.h"
#include "pagekv.h"

/* True when AMX-TILE and AMX-INT8 are there and Linux granted the tile data
 * (asked once per process). */
bool pkv_cpu_amx_available(void);

/* One block of 16 activation rows: tile B (8 rows of 64 bytes: bytes 4q..4q+3
 * of row k at q*64 + 4k) and the rows' scales (0 past the last row). */
typedef struct pkv_amx_xb {
    int8_t q[512];
    float d[16];
    float ds[16]; /* d * (sum of the block's quants), for q4_k's mins */
    int32_t s32[2][16]; /* 32 * (sum of each 16-quant half), for q6_k's offset */
} pkv_amx_xb;

/* Lay out n quantized activation rows of nb blocks (x[i*nb + b]) as
 * ceil(n/16) groups of nb tiles: out[g*nb + b]. */
void pkv_amx_x_layout(const pkv_q8a *x, int64_t n, int64_t nb, pkv_amx_xb *out);

/* The weight types pkv_amx_rows takes (q8_0, q4_k, q6_k). */
bool pkv_amx_supports(pkv_type t);

/* y[i*ys + r] = row r of the weights of type t (rows of rb bytes at w) . x row
 * i, for r in [r0, r1) and every i < n (nb activation blocks of 32 per row):
 * groups of 16 rows on the tiles, the rest with the same formula in scalar
 * code. */
void pkv_amx_rows(pkv_type t, const uint8_t *w, size_t rb, int64_t r0, int64_t r1, int64_t nb, const pkv_q8a *xq,
                  const pkv_amx_xb *xa, int64_t n, float *y, int64_t ys);

#endif
