// CUDA kernels of pagekv (see cuda-launch.h for the interface and
// src/device/cpu/ref.c for the definition of every result).
//
// Written without access to a GPU: compiled in CI, never run yet. docs/gpu.md
// lists what a GPU session must run before any of this is trusted.
//
// Weights are read in place in their GGUF block layouts (src/base/quant.c):
// deq<T>(row, k) is element k of a weight row (cuda-deq.h).
#include "device/cuda/cuda-deq.h"
#include "device/cuda/cuda-launch.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#define WARP 32
#define FULL 0xffffffffu
// kernel-list.h's PKV_SSM_CONV_MAX (that header is C, not included here)
#define PKV_SSM_CONV_MAX_CU 16

static inline unsigned cdiv(int64_t a, int64_t b) { return (unsigned)((a + b - 1) / b); }
// Blocks for a grid-stride loop over n items with `threads` per block.
static inline unsigned grid_for(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    if (b > (1 << 20)) b = 1 << 20;
    return (unsigned)(b < 1 ? 1 : b);
}

// ------------------------------------------------------------- helpers

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL, v, o));
    return v;
}

// Sum (or max) over the block; sh holds 32 floats. Every thread gets the result.
// The leading barrier lets a block call these back to back on the same sh.
template <bool MAX>
__device__ float block_reduce(float v, float *sh) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = MAX ? warp_max(v) : warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    if (wid == 0) {
        v = lane < nw ? sh[lane] : (MAX ? -INFINITY : 0.0f);
        v = MAX ? warp_max(v) : warp_sum(v);
        if (lane == 0) sh[0] = v;
    }
    __syncthreads();
    return sh[0];
}

// ---------------------------------------------------- weight dequantization

// deq<T>(row, k): element k of a weight row (cuda-deq.h, shared with the host
// test that checks it against the reference bit for bit).
template <int T>
__device__ __forceinline__ float deq(const uint8_t *row, int64_t k);
#define DEQ(T, fn)                                                                         \
    template <>                                                                            \
    __device__ __forceinline__ float deq<T>(const uint8_t *row, int64_t k) {               \
        return fn(row, k);                                                                 \
    }
DEQ(PKV_CU_W_F32, pkv_cu_deq_f32)
DEQ(PKV_CU_W_F16, pkv_cu_deq_f16)
DEQ(PKV_CU_W_BF16, pkv_cu_deq_bf16)
DEQ(PKV_CU_W_Q8_0, pkv_cu_deq_q8_0)
DEQ(PKV_CU_W_Q4_0, pkv_cu_deq_q4_0)
DEQ(PKV_CU_W_Q4_K, pkv_cu_deq_q4_k)
DEQ(PKV_CU_W_Q5_K, pkv_cu_deq_q5_k)
DEQ(PKV_CU_W_Q6_K, pkv_cu_deq_q6_k)
DEQ(PKV_CU_W_MXFP4, pkv_cu_deq_mxfp4)
#undef DEQ

// ------------------------------------------------------------------ matmul

// y[i][r] = sum_k W[r][k] x[i][k]: a warp takes R weight rows, lanes over k,
// PKV_CU_MMV_MAX rows of x per pass over the weights (the grid's y: passes over
// groups of rows of x side by side). Every output is the same
// arithmetic whatever R and however many rows of x the call has: lane l sums
// W[r][k] x[i][k] over k = l, l + 32, ... in order (explicit fused multiply-adds),
// then the warp's tree sum. So a token's row gets the same bits alone (decode,
// R = 1) and in a prefill of hundreds (R = MM_R, x rows shared by R weight rows):
// batch invariance, and fork == replay bitwise, on this device.
#define MMV_WARPS 4
#define MM_R 4
template <int T, int R>
__global__ void __launch_bounds__(MMV_WARPS * WARP)
    k_mmv(const uint8_t *w, size_t rb, int64_t rows, int64_t cols, const float *x, float *y, int64_t n) {
    const int lane = threadIdx.x & 31;
    const int64_t r0 = ((int64_t)blockIdx.x * MMV_WARPS + (threadIdx.x >> 5)) * R;
    if (r0 >= rows) return; // whole warps leave: the shuffles below stay full
    const uint8_t *wr[R];
#pragma unroll
    for (int q = 0; q < R; q++) wr[q] = w + (r0 + q < rows ? r0 + q : r0) * rb; // past the end: row r0 again, unwritten
    for (int64_t i0 = (int64_t)blockIdx.y * PKV_CU_MMV_MAX; i0 < n; i0 += (int64_t)gridDim.y * PKV_CU_MMV_MAX) {
        const int nt = (int)(n - i0 < PKV_CU_MMV_MAX ? n - i0 : PKV_CU_MMV_MAX);
        float acc[R][PKV_CU_MMV_MAX];
#pragma unroll
        for (int q = 0; q < R; q++)
#pragma unroll
            for (int j = 0; j < PKV_CU_MMV_MAX; j++) acc[q][j] = 0.0f;
        const float *xi = x + i0 * cols;
        for (int64_t k = lane; k < cols; k += WARP) {
            float xv[PKV_CU_MMV_MAX];
#pragma unroll
            for (int j = 0; j < PKV_CU_MMV_MAX; j++) xv[j] = j < nt ? xi[j * cols + k] : 0.0f;
#pragma unroll
            for (int q = 0; q < R; q++) {
                const float wv = deq<T>(wr[q], k);
#pragma unroll
                for (int j = 0; j < PKV_CU_MMV_MAX; j++) acc[q][j] = __fmaf_rn(wv, xv[j], acc[q][j]);
            }
        }
#pragma unroll
        for (int q = 0; q < R; q++)
#pragma unroll
            for (int j = 0; j < PKV_CU_MMV_MAX; j++) {
                const float v = warp_sum(acc[q][j]);
                if (lane == 0 && j < nt && r0 + q < rows) y[(i0 + j) * rows + r0 + q] = v;
            }
    }
}

// The same for block-quantized weights, a lane taking whole blocks of 32
// (pkv_cu_deq32: the scales read once per block, not per element): lane l sums,
// over blocks l, l + 32, ... in order, each block's 32 products (in order, from 0),
// then the warp's tree sum; the same for every R and batch size.
template <int T>
__device__ __forceinline__ void deq32(const uint8_t *row, int64_t sb, float *y);
#define DEQ32(T, call)                                                                     \
    template <>                                                                            \
    __device__ __forceinline__ void deq32<T>(const uint8_t *row, int64_t sb, float *y) {   \
        call;                                                                              \
    }
DEQ32(PKV_CU_W_Q8_0, pkv_cu_deq32_q8_0(row, sb, y))
DEQ32(PKV_CU_W_Q4_0, pkv_cu_deq32_q4_0(row, sb, y))
DEQ32(PKV_CU_W_Q4_K, pkv_cu_deq32_kmin(row, sb, y, 0))
DEQ32(PKV_CU_W_Q5_K, pkv_cu_deq32_kmin(row, sb, y, 1))
DEQ32(PKV_CU_W_Q6_K, pkv_cu_deq32_q6_k(row, sb, y))
DEQ32(PKV_CU_W_MXFP4, pkv_cu_deq32_mxfp4(row, sb, y))
#undef DEQ32

template <int T, int R>
__global__ void __launch_bounds__(MMV_WARPS * WARP)
    k_mmv_q(const uint8_t *w, size_t rb, int64_t rows, int64_t cols, const float *x, float *y, int64_t n) {
    const int lane = threadIdx.x & 31;
    const int64_t r0 = ((int64_t)blockIdx.x * MMV_WARPS + (threadIdx.x >> 5)) * R;
    if (r0 >= rows) return; // whole warps leave: the shuffles below stay full
    const uint8_t *wr[R];
#pragma unroll
    for (int q = 0; q < R; q++) wr[q] = w + (r0 + q < rows ? r0 + q : r0) * rb;
    const int64_t n_sb = cols >> 5; // block types have cols % 32 == 0
    for (int64_t i0 = (int64_t)blockIdx.y * PKV_CU_MMV_MAX; i0 < n; i0 += (int64_t)gridDim.y * PKV_CU_MMV_MAX) {
        const int nt = (int)(n - i0 < PKV_CU_MMV_MAX ? n - i0 : PKV_CU_MMV_MAX);
        float acc[R][PKV_CU_MMV_MAX];
#pragma unroll
        for (int q = 0; q < R; q++)
#pragma unroll
            for (int j = 0; j < PKV_CU_MMV_MAX; j++) acc[q][j] = 0.0f;
        const float *xi = x + i0 * cols;
        for (int64_t sb = lane; sb < n_sb; sb += WARP) {
#pragma unroll
            for (int q = 0; q < R; q++) {
                float wv[32];
                deq32<T>(wr[q], sb, wv);
#pragma unroll
                for (int j = 0; j < PKV_CU_MMV_MAX; j++) {
                    if (j < nt) {
                        const float *xs = xi + j * cols + 32 * sb;
                        float s = 0.0f;
#pragma unroll
                        for (int e = 0; e < 32; e++) s = __fmaf_rn(wv[e], xs[e], s);
                        acc[q][j] = __fadd_rn(acc[q][j], s);
                    }
                }
            }
        }
#pragma unroll
        for (int q = 0; q < R; q++)
#pragma unroll
            for (int j = 0; j < PKV_CU_MMV_MAX; j++) {
                const float v = warp_sum(acc[q][j]);
                if (lane == 0 && j < nt && r0 + q < rows) y[(i0 + j) * rows + r0 + q] = v;
            }
    }
}

// Tiled matrix-matrix product for prefill, only with PKV_CUDA_GEMM=1 (faster
// prefill, but its summation order is not k_mmv's: not batch-invariant): a block
// computes a 64 x 64 tile of y (64 weight rows x 64 x rows), staging 32 columns of
// both (weights dequantized) in shared memory per step; each thread owns 4 x 4 outputs.
#define GM 64
#define GN 64
#define GK 32
template <int T>
__global__ void __launch_bounds__(256)
    k_gemm(const uint8_t *w, size_t rb, int64_t rows, int64_t cols, const float *x, float *y, int64_t n) {
    __shared__ float ws[GK][GM + 1];
    __shared__ float xs[GK][GN + 1];
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const int64_t m0 = (int64_t)blockIdx.x * GM, n0 = (int64_t)blockIdx.y * GN;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
    for (int64_t k0 = 0; k0 < cols; k0 += GK) {
        for (int e = tid; e < GM * GK; e += 256) {
            const int mm = e / GK, kk = e % GK;
            const int64_t k = k0 + kk, r = m0 + mm, i = n0 + mm;
            ws[kk][mm] = (r < rows && k < cols) ? deq<T>(w + r * rb, k) : 0.0f;
            xs[kk][mm] = (i < n && k < cols) ? x[i * cols + k] : 0.0f;
        }
        __syncthreads();
#pragma unroll 8
        for (int kk = 0; kk < GK; kk++) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; i++) a[i] = ws[kk][tx + 16 * i];
#pragma unroll
            for (int j = 0; j < 4; j++) b[j] = xs[kk][ty + 16 * j];
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int64_t r = m0 + tx + 16 * i, ii = n0 + ty + 16 * j;
            if (r < rows && ii < n) y[ii * rows + r] = acc[i][j];
        }
}

// scale 0: no multiply, the rows are exact copies.
template <int T>
__global__ void k_get_rows(const uint8_t *w, size_t rb, int64_t n_vocab, int64_t cols, const int32_t *ids,
                           float *out, int64_t n, float scale) {
    const int64_t total = n * cols;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = e / cols, c = e % cols;
        const int32_t id = ids[i];
        float v = 0.0f;
        if (id >= 0 && id < n_vocab) {
            v = deq<T>(w + (int64_t)id * rb, c);
            if (scale != 0.0f) v = __fmul_rn(v, scale); // one rounded f32 multiply, never fused
        }
        out[e] = v;
    }
}

template <int T, int R>
static void launch_mmv(const pkv_cu_matmul *a, cudaStream_t st) {
    const int64_t groups = (a->n + PKV_CU_MMV_MAX - 1) / PKV_CU_MMV_MAX;
    const dim3 grid(cdiv(cdiv(a->rows, R), MMV_WARPS), (unsigned)(groups < 65535 ? groups : 65535));
    if constexpr (T >= PKV_CU_W_Q8_0)
        k_mmv_q<T, R><<<grid, MMV_WARPS * WARP, 0, st>>>(a->w, a->row_bytes, a->rows, a->cols, a->x, a->y, a->n);
    else
        k_mmv<T, R><<<grid, MMV_WARPS * WARP, 0, st>>>(a->w, a->row_bytes, a->rows, a->cols, a->x, a->y, a->n);
}

template <int T>
static int launch_matmul_t(const pkv_cu_matmul *a, cudaStream_t st) {
    if (a->n <= PKV_CU_MMV_MAX) {
        launch_mmv<T, 1>(a, st);
    } else if (!a->tiled) {
        launch_mmv<T, MM_R>(a, st);
    } else {
        // grid.y is limited to 65535 tiles of 64 x rows: split longer batches
        const int64_t step = (int64_t)65535 * GN;
        for (int64_t i0 = 0; i0 < a->n; i0 += step) {
            const int64_t ni = a->n - i0 < step ? a->n - i0 : step;
            dim3 grid(cdiv(a->rows, GM), cdiv(ni, GN));
            k_gemm<T><<<grid, 256, 0, st>>>(a->w, a->row_bytes, a->rows, a->cols, a->x + i0 * a->cols,
                                            a->y + i0 * a->rows, ni);
        }
    }
    return (int)cudaGetLastError();
}

template <int T>
static int launch_get_rows_t(const pkv_cu_get_rows *a, cudaStream_t st) {
    k_get_rows<T><<<grid_for(a->n * a->cols, 256), 256, 0, st>>>(a->w, a->row_bytes, a->n_vocab, a->cols, a->ids,
                                                                 a->out, a->n, a->scale);
    return (int)cudaGetLastError();
}

#define BY_TYPE(fn, a, st)                                                                 \
    switch ((a)->wtype) {                                                                  \
    case PKV_CU_W_F32: return fn<PKV_CU_W_F32>(a, st);                                     \
    case PKV_CU_W_F16: return fn<PKV_CU_W_F16>(a, st);                                     \
    case PKV_CU_W_BF16: return fn<PKV_CU_W_BF16>(a, st);                                   \
    case PKV_CU_W_Q8_0: return fn<PKV_CU_W_Q8_0>(a, st);                                   \
    case PKV_CU_W_Q4_0: return fn<PKV_CU_W_Q4_0>(a, st);                                   \
    case PKV_CU_W_Q4_K: return fn<PKV_CU_W_Q4_K>(a, st);                                   \
    case PKV_CU_W_Q5_K: return fn<PKV_CU_W_Q5_K>(a, st);                                   \
    case PKV_CU_W_Q6_K: return fn<PKV_CU_W_Q6_K>(a, st);                                   \
    case PKV_CU_W_MXFP4: return fn<PKV_CU_W_MXFP4>(a, st);                                 \
    default: return (int)cudaErrorInvalidValue;                                            \
    }

extern "C" int pkv_cu_launch_matmul(const pkv_cu_matmul *a, void *stream) {
    BY_TYPE(launch_matmul_t, a, (cudaStream_t)stream)
}

extern "C" int pkv_cu_launch_get_rows(const pkv_cu_get_rows *a, void *stream) {
    BY_TYPE(launch_get_rows_t, a, (cudaStream_t)stream)
}

// ------------------------------------------------------------ elementwise

__global__ void k_rms_norm(const float *x, const float *w, float *y, int64_t row_len, float eps) {
    __shared__ float sh[32];
    const float *xr = x + (int64_t)blockIdx.x * row_len;
    float *yr = y + (int64_t)blockIdx.x * row_len;
    float ss = 0.0f;
    for (int64_t j = threadIdx.x; j < row_len; j += blockDim.x) ss += xr[j] * xr[j];
    ss = block_reduce<false>(ss, sh);
    const float inv = 1.0f / sqrtf(ss / (float)row_len + eps);
    for (int64_t j = threadIdx.x; j < row_len; j += blockDim.x) yr[j] = xr[j] * inv * w[j];
}

// Layer norm: mean, then the squared deviations (two passes); w, b may be NULL.
__global__ void k_layer_norm(const float *x, const float *w, const float *b, float *y, int64_t row_len, float eps) {
    __shared__ float sh[32];
    const float *xr = x + (int64_t)blockIdx.x * row_len;
    float *yr = y + (int64_t)blockIdx.x * row_len;
    float s = 0.0f;
    for (int64_t j = threadIdx.x; j < row_len; j += blockDim.x) s += xr[j];
    const float mean = block_reduce<false>(s, sh) / (float)row_len;
    s = 0.0f;
    for (int64_t j = threadIdx.x; j < row_len; j += blockDim.x) s += (xr[j] - mean) * (xr[j] - mean);
    const float inv = 1.0f / sqrtf(block_reduce<false>(s, sh) / (float)row_len + eps);
    for (int64_t j = threadIdx.x; j < row_len; j += blockDim.x) {
        float v = (xr[j] - mean) * inv;
        if (w) v *= w[j];
        if (b) v += b[j];
        yr[j] = v;
    }
}

__global__ void k_add(const float *a, const float *b, float *y, int64_t n, int64_t b_len) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = a[i] + b[b_len == n ? i : i % b_len];
}

// GELU, the tanh form 0.5 x (1 + tanh(t)), evaluated as x * sigmoid(2t) with
// expf of a non-positive argument, as swiglu.comp does: 1 + tanhf(t) cancels
// where tanh is near -1 and in f32 keeps no correct digit below x = -5. t is
// clamped (as there) so that an x whose cube overflows meets expf(-100), not -inf.
// OAI (gpt-oss): min(g, limit) * sigmoid(alpha min(g, limit)) * (clamp(u, -limit, limit) + 1).
template <bool GELU, bool OAI>
__global__ void k_swiglu(const float *g, const float *u, float *y, int64_t n, float alpha, float limit) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float x = g[i];
        if (OAI) {
            const float xc = fminf(x, limit), v = fminf(fmaxf(u[i], -limit), limit);
            y[i] = xc / (1.0f + expf(-alpha * xc)) * (v + 1.0f);
        } else if (GELU) {
            const float t = fminf(fmaxf(0.7978845608028654f * (x + 0.044715f * x * x * x), -50.0f), 50.0f);
            const float e = expf(-2.0f * fabsf(t));
            y[i] = (t >= 0.0f ? x / (1.0f + e) : x * e / (1.0f + e)) * u[i];
        } else {
            y[i] = x / (1.0f + expf(-x)) * u[i];
        }
    }
}

__global__ void k_softmax(const float *x, float *y, int64_t row_len) {
    __shared__ float sh[32];
    const float *xr = x + (int64_t)blockIdx.x * row_len;
    float *yr = y + (int64_t)blockIdx.x * row_len;
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < row_len; j += blockDim.x) mx = fmaxf(mx, xr[j]);
    mx = block_reduce<true>(mx, sh);
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < row_len; j += blockDim.x) sum += expf(xr[j] - mx);
    sum = block_reduce<false>(sum, sh);
    for (int64_t j = threadIdx.x; j < row_len; j += blockDim.x) yr[j] = expf(xr[j] - mx) / sum;
}

// First index of the largest value: each thread scans its elements in order
// (strictly greater replaces), then pairs combine preferring the larger value,
// on ties the smaller index. NaNs as in the reference (which compares with >):
// never chosen, except that a NaN at index 0 makes the answer 0.
__global__ void k_argmax(const float *x, int32_t *out, int64_t row_len) {
    __shared__ float sv[256];
    __shared__ int64_t si[256];
    const float *xr = x + (int64_t)blockIdx.x * row_len;
    float bv = -INFINITY;
    int64_t bi = INT64_MAX;
    for (int64_t j = threadIdx.x; j < row_len; j += blockDim.x) {
        const float v = xr[j];
        if (!isnan(v) && (bi == INT64_MAX || v > bv)) {
            bv = v;
            bi = j;
        }
    }
    sv[threadIdx.x] = bv;
    si[threadIdx.x] = bi;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) {
            const float ov = sv[threadIdx.x + s];
            const int64_t oi = si[threadIdx.x + s];
            const float mv = sv[threadIdx.x];
            const int64_t mi = si[threadIdx.x];
            if (oi != INT64_MAX && (mi == INT64_MAX || ov > mv || (ov == mv && oi < mi))) {
                sv[threadIdx.x] = ov;
                si[threadIdx.x] = oi;
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = (si[0] == INT64_MAX || isnan(xr[0])) ? 0 : (int32_t)si[0];
}

// Row blocks: grid.x is limited to 2^31 - 1, far above any row count here.
extern "C" int pkv_cu_launch_rms_norm(const float *x, const float *w, float *y, int64_t n_rows, int64_t row_len,
                                      float eps, void *stream) {
    k_rms_norm<<<(unsigned)n_rows, 256, 0, (cudaStream_t)stream>>>(x, w, y, row_len, eps);
    return (int)cudaGetLastError();
}

extern "C" int pkv_cu_launch_layer_norm(const float *x, const float *w, const float *b, float *y, int64_t n_rows,
                                        int64_t row_len, float eps, void *stream) {
    k_layer_norm<<<(unsigned)n_rows, 256, 0, (cudaStream_t)stream>>>(x, w, b, y, row_len, eps);
    return (int)cudaGetLastError();
}

extern "C" int pkv_cu_launch_add(const float *a, const float *b, float *y, int64_t n, int64_t b_len, void *stream) {
    k_add<<<grid_for(n, 256), 256, 0, (cudaStream_t)stream>>>(a, b, y, n, b_len);
    return (int)cudaGetLastError();
}

extern "C" int pkv_cu_launch_swiglu(const pkv_cu_swiglu *a, void *stream) {
    if (a->oai)
        k_swiglu<false, true><<<grid_for(a->n, 256), 256, 0, (cudaStream_t)stream>>>(a->g, a->u, a->y, a->n, a->alpha,
                                                                                     a->limit);
    else if (a->gelu)
        k_swiglu<true, false><<<grid_for(a->n, 256), 256, 0, (cudaStream_t)stream>>>(a->g, a->u, a->y, a->n, 0.0f, 0.0f);
    else
        k_swiglu<false, false><<<grid_for(a->n, 256), 256, 0, (cudaStream_t)stream>>>(a->g, a->u, a->y, a->n, 0.0f, 0.0f);
    return (int)cudaGetLastError();
}

extern "C" int pkv_cu_launch_softmax(const float *x, float *y, int64_t n_rows, int64_t row_len, void *stream) {
    k_softmax<<<(unsigned)n_rows, 256, 0, (cudaStream_t)stream>>>(x, y, row_len);
    return (int)cudaGetLastError();
}

extern "C" int pkv_cu_launch_argmax(const float *x, int32_t *out, int64_t n_rows, int64_t row_len, void *stream) {
    k_argmax<<<(unsigned)n_rows, 256, 0, (cudaStream_t)stream>>>(x, out, row_len);
    return (int)cudaGetLastError();
}

// -------------------------------------------------------------------- rope

// One thread per (row, head, pair). The angle and the rotation are computed in
// double, as in the reference; the result is rounded to float (then to f16 for
// f16 rows, as the reference stores it).
__global__ void k_rope(pkv_cu_rope a) {
    const int half = a.n_rot / 2;
    const int64_t total = a.n_rows * a.n_heads * half;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        const int i = (int)(e % half);
        const int64_t t = e / half;
        const int h = (int)(t % a.n_heads);
        const int64_t r = t / a.n_heads;
        const int64_t row = a.rows ? a.rows[r] : r;
        if (row < 0 || row >= a.max_rows) continue;
        const double p = pow((double)a.freq_base, -2.0 * i / (double)a.n_rot);
        double theta = (double)a.pos[r] * (double)a.freq_scale * p;
        if (a.ext_factor != 0.0f) { // YaRN: mix the scaled and the unscaled angle (kernel-list.h)
            const double y = ((double)i - (double)a.corr_lo) / fmax(0.001, (double)a.corr_hi - (double)a.corr_lo);
            const double mix = (1.0 - fmin(1.0, fmax(0.0, y))) * (double)a.ext_factor;
            theta = (double)a.pos[r] * p * ((double)a.freq_scale * (1.0 - mix) + mix);
        }
        double s, c;
        sincos(theta, &s, &c);
        s *= (double)a.mscale;
        c *= (double)a.mscale;
        const int64_t base = (int64_t)h * a.head_dim;
        const int64_t i0 = base + (a.neox ? i : 2 * i), i1 = base + (a.neox ? i + half : 2 * i + 1);
        uint8_t *xr = a.x + row * (int64_t)a.row_stride;
        if (a.f16) {
            __half *p = (__half *)xr;
            const double x0 = __half2float(p[i0]), x1 = __half2float(p[i1]);
            p[i0] = __float2half_rn((float)(x0 * c - x1 * s));
            p[i1] = __float2half_rn((float)(x0 * s + x1 * c));
        } else {
            float *p = (float *)xr;
            const double x0 = p[i0], x1 = p[i1];
            p[i0] = (float)(x0 * c - x1 * s);
            p[i1] = (float)(x0 * s + x1 * c);
        }
    }
}

extern "C" int pkv_cu_launch_rope(const pkv_cu_rope *a, void *stream) {
    const int64_t total = a->n_rows * a->n_heads * (a->n_rot / 2);
    k_rope<<<grid_for(total, 128), 128, 0, (cudaStream_t)stream>>>(*a);
    return (int)cudaGetLastError();
}

// ---------------------------------------------------------------- set_rows

__global__ void k_set_rows(pkv_cu_set_rows a) {
    const int64_t total = a.n * a.row_elems;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = e / a.row_elems, j = e % a.row_elems;
        const int32_t d = a.idx[i];
        if (d < 0 || d >= a.dst_rows) continue;
        const float v = ((const float *)(a.src + i * (int64_t)a.src_stride))[j];
        uint8_t *dr = a.dst + (int64_t)d * (int64_t)a.dst_stride;
        if (a.dst_f16)
            ((__half *)dr)[j] = __float2half_rn(v);
        else
            ((float *)dr)[j] = v;
    }
}

extern "C" int pkv_cu_launch_set_rows(const pkv_cu_set_rows *a, void *stream) {
    k_set_rows<<<grid_for(a->n * a->row_elems, 256), 256, 0, (cudaStream_t)stream>>>(*a);
    return (int)cudaGetLastError();
}

// ---------------------------------------------------------- recurrent layers

// Causal depthwise conv with a rolling state: one thread per (sequence, channel)
// walks its sequence's tokens with the channel's window in registers, taps summed
// oldest to newest (the token last) as on the CPU. x[t][c] is read before y[t][c]
// is written by the same thread, so y may alias x.
__global__ void k_ssm_conv(pkv_cu_ssm_conv a) {
    const int64_t gid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (gid >= (int64_t)a.n_seq * a.channels) return;
    const int s = (int)(gid / a.channels);
    const int64_t c = gid % a.channels, C = a.channels;
    const int K = a.d_conv;
    int64_t lo, hi, slot;
    const int ok = pkv_cu_rec_seq(a.meta, a.n_seq, a.n_tok, a.n_slots, s, &lo, &hi, &slot);
    if (ok == 0) return;
    if (ok == 1) {
        for (int64_t t = lo; t < hi; t++) a.y[t * C + c] = 0.0f;
        return;
    }
    float *st = (float *)(a.state + slot * (int64_t)a.state_stride);
    const float *wc = a.w + c * K;
    float win[PKV_SSM_CONV_MAX_CU - 1];
    for (int j = 0; j < K - 1; j++) win[j] = st[(int64_t)j * C + c];
    for (int64_t t = lo; t < hi; t++) {
        const float xin = a.x[t * C + c];
        float acc = 0.0f;
        for (int j = 0; j < K - 1; j++) acc += wc[j] * win[j];
        acc += wc[K - 1] * xin;
        for (int j = 0; j + 1 < K - 1; j++) win[j] = win[j + 1];
        win[K - 2] = xin;
        a.y[t * C + c] = a.silu ? acc / (1.0f + expf(-acc)) : acc;
    }
    for (int j = 0; j < K - 1; j++) st[(int64_t)j * C + c] = win[j];
}

// Gated delta rule: one warp per (sequence, v head, value column j), DN_WARPS
// columns per block. Lane l holds the column's rows i = l + 32 m in registers for
// all of the sequence's tokens; the two sums over i per token are lane partials
// in m order, then warp_sum's fixed butterfly: deterministic and independent of
// the rest of the batch (not the CPU's order: equal within rounding).
#define DN_WARPS 4
#define DN_DPL (PKV_CU_DN_MAX_DK / WARP)
__global__ void __launch_bounds__(DN_WARPS * WARP) k_delta_net(pkv_cu_delta_net a) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int nb = (a.d_v + DN_WARPS - 1) / DN_WARPS;
    const int64_t b = blockIdx.x;
    const int j = (int)(b % nb) * DN_WARPS + w, h = (int)(b / nb % a.n_v_heads), s = (int)(b / nb / a.n_v_heads);
    if (s >= a.n_seq || j >= a.d_v) return;
    int64_t lo, hi, slot;
    const int ok = pkv_cu_rec_seq(a.meta, a.n_seq, a.n_tok, a.n_slots, s, &lo, &hi, &slot);
    if (ok == 0) return;
    const int hv = a.n_v_heads, dk = a.d_k, dv = a.d_v;
    if (ok == 1) {
        if (lane == 0)
            for (int64_t t = lo; t < hi; t++) a.out[(t * hv + h) * dv + j] = 0.0f;
        return;
    }
    const int kh = a.grouped ? h / (hv / a.n_k_heads) : h % a.n_k_heads;
    float *S = (float *)(a.state + slot * (int64_t)a.state_stride) + (int64_t)h * dk * dv + j;
    float col[DN_DPL];
#pragma unroll
    for (int m = 0; m < DN_DPL; m++) {
        const int i = lane + WARP * m;
        col[m] = i < dk ? S[(int64_t)i * dv] : 0.0f;
    }
    for (int64_t t = lo; t < hi; t++) {
        const float *qt = (const float *)(a.q + t * (int64_t)a.q_stride) + (int64_t)kh * dk;
        const float *kt = (const float *)(a.k + t * (int64_t)a.k_stride) + (int64_t)kh * dk;
        const float vj = ((const float *)(a.v + t * (int64_t)a.v_stride))[(int64_t)h * dv + j];
        const float decay = expf(a.g[t * hv + h]), beta = a.beta[t * hv + h];
        float kr[DN_DPL], p = 0.0f;
#pragma unroll
        for (int m = 0; m < DN_DPL; m++) {
            const int i = lane + WARP * m;
            kr[m] = i < dk ? kt[i] : 0.0f;
            col[m] *= decay;
            p += col[m] * kr[m];
        }
        const float d = beta * (vj - warp_sum(p));
        p = 0.0f;
#pragma unroll
        for (int m = 0; m < DN_DPL; m++) {
            const int i = lane + WARP * m;
            col[m] += kr[m] * d;
            p += col[m] * (i < dk ? qt[i] : 0.0f);
        }
        p = warp_sum(p);
        if (lane == 0) a.out[(t * hv + h) * dv + j] = p * a.scale;
    }
#pragma unroll
    for (int m = 0; m < DN_DPL; m++) {
        const int i = lane + WARP * m;
        if (i < dk) S[(int64_t)i * dv] = col[m];
    }
}

// Mamba-2's selective scan: one warp per (sequence, head, state row i), SC_WARPS rows
// per block. Lane l holds the row's entries n = l + 32 m in registers for all of the
// sequence's tokens; the sum over n per token is lane partials in m order, then
// warp_sum's fixed butterfly: deterministic and independent of the rest of the batch
// (not the CPU's order: equal within rounding).
#define SC_WARPS 4
#define SC_DPL (PKV_CU_SCAN_MAX_DS / WARP)
__global__ void __launch_bounds__(SC_WARPS * WARP) k_ssm_scan(pkv_cu_ssm_scan a) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int nb = (a.head_dim + SC_WARPS - 1) / SC_WARPS;
    const int64_t b = blockIdx.x;
    const int i = (int)(b % nb) * SC_WARPS + w, h = (int)(b / nb % a.n_head), s = (int)(b / nb / a.n_head);
    if (s >= a.n_seq || i >= a.head_dim) return;
    int64_t lo, hi, slot;
    const int ok = pkv_cu_rec_seq(a.meta, a.n_seq, a.n_tok, a.n_slots, s, &lo, &hi, &slot);
    if (ok == 0) return;
    const int nh = a.n_head, hd = a.head_dim, ds = a.d_state, g = h / (nh / a.n_group);
    if (ok == 1) {
        if (lane == 0)
            for (int64_t t = lo; t < hi; t++) a.y[(t * nh + h) * hd + i] = 0.0f;
        return;
    }
    float *S = (float *)(a.state + slot * (int64_t)a.state_stride) + ((int64_t)h * hd + i) * ds;
    const float bias = a.dt_bias[h], A = a.A[h], skip = a.D ? a.D[h] : 0.0f;
    float row[SC_DPL];
#pragma unroll
    for (int m = 0; m < SC_DPL; m++) {
        const int n = lane + WARP * m;
        row[m] = n < ds ? S[n] : 0.0f;
    }
    for (int64_t t = lo; t < hi; t++) {
        const float *Bt = (const float *)(a.B + t * (int64_t)a.B_stride) + (int64_t)g * ds;
        const float *Ct = (const float *)(a.C + t * (int64_t)a.C_stride) + (int64_t)g * ds;
        const float xi = ((const float *)(a.x + t * (int64_t)a.x_stride))[(int64_t)h * hd + i];
        const float v = a.dt[t * nh + h] + bias, d = v > 20.0f ? v : log1pf(expf(v)), decay = expf(d * A), dx = d * xi;
        float p = 0.0f;
#pragma unroll
        for (int m = 0; m < SC_DPL; m++) {
            const int n = lane + WARP * m;
            if (n < ds) {
                row[m] = row[m] * decay + dx * Bt[n];
                p += row[m] * Ct[n];
            }
        }
        p = warp_sum(p);
        if (lane == 0) a.y[(t * nh + h) * hd + i] = p + skip * xi;
    }
#pragma unroll
    for (int m = 0; m < SC_DPL; m++) {
        const int n = lane + WARP * m;
        if (n < ds) S[n] = row[m];
    }
}

// y = x / sqrt(sum(x^2) + eps) per head row; one block per row. Every thread reads
// its elements for the sum before block_reduce's barriers, so y may equal x.
__global__ void k_l2_norm(pkv_cu_l2_norm a) {
    __shared__ float sh[32];
    const int64_t r = blockIdx.x, t = r / a.n_heads, h = r % a.n_heads, d = a.head_dim;
    const float *xr = (const float *)(a.x + t * (int64_t)a.x_stride) + h * d;
    float *yr = (float *)(a.y + t * (int64_t)a.y_stride) + h * d;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_reduce<false>(ss, sh);
    const float inv = 1.0f / sqrtf(ss + a.eps);
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) yr[i] = xr[i] * inv;
}

__global__ void k_unary(pkv_cu_unary a) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.n; i += (int64_t)gridDim.x * blockDim.x) {
        float v = a.x[i];
        if (a.bias) v += a.bias[i % a.bias_len];
        if (a.op == 1)
            v = 1.0f / (1.0f + expf(-v));
        else if (a.op == 2)
            v = v > 20.0f ? v : log1pf(expf(v));
        else if (a.op == 3)
            v = v / (1.0f + expf(-v));
        else if (a.op == 4) {
            const float t = 0.7978845608f * (v + 0.044715f * v * v * v), e = expf(-2.0f * fabsf(t));
            v = t >= 0.0f ? v / (1.0f + e) : v * e / (1.0f + e);
        } else if (a.op == 5)
            v = 0.5f * v * erfcf(-v * 0.70710678f);
        else if (a.op == 6)
            v = v > 0.0f ? v * v : 0.0f;
        if (a.mul) v *= a.mul[i % a.mul_len];
        a.y[i] = v;
    }
}

extern "C" int pkv_cu_launch_ssm_conv(const pkv_cu_ssm_conv *a, void *stream) {
    const int64_t n = (int64_t)a->n_seq * a->channels;
    k_ssm_conv<<<cdiv(n, 128), 128, 0, (cudaStream_t)stream>>>(*a);
    return (int)cudaGetLastError();
}

extern "C" int pkv_cu_launch_delta_net(const pkv_cu_delta_net *a, void *stream) {
    const int64_t blocks = (int64_t)a->n_seq * a->n_v_heads * ((a->d_v + DN_WARPS - 1) / DN_WARPS);
    k_delta_net<<<(unsigned)blocks, DN_WARPS * WARP, 0, (cudaStream_t)stream>>>(*a);
    return (int)cudaGetLastError();
}

extern "C" int pkv_cu_launch_ssm_scan(const pkv_cu_ssm_scan *a, void *stream) {
    const int64_t blocks = (int64_t)a->n_seq * a->n_head * ((a->head_dim + SC_WARPS - 1) / SC_WARPS);
    k_ssm_scan<<<(unsigned)blocks, SC_WARPS * WARP, 0, (cudaStream_t)stream>>>(*a);
    return (int)cudaGetLastError();
}

extern "C" int pkv_cu_launch_l2_norm(const pkv_cu_l2_norm *a, void *stream) {
    k_l2_norm<<<(unsigned)(a->n * a->n_heads), 128, 0, (cudaStream_t)stream>>>(*a);
    return (int)cudaGetLastError();
}

extern "C" int pkv_cu_launch_unary(const pkv_cu_unary *a, void *stream) {
    k_unary<<<grid_for(a->n, 256), 256, 0, (cudaStream_t)stream>>>(*a);
    return (int)cudaGetLastError();
}

// --------------------------------------------------------------- experts

// The best s[e] over e < n not taken (ties: the lowest e); s computed from the logits
// as the reference does, in float.
__device__ static float moe_score(const pkv_cu_moe_route &a, const float *l, int e, float mx, float sum) {
    const float p = a.gating == 0 ? expf(l[e] - mx) / sum : a.gating == 2 ? 1.0f / (1.0f + expf(-l[e])) : l[e];
    return a.sel_logits ? l[e] : p + (a.bias ? a.bias[e] : 0.0f);
}

// One thread per token: softmax's max and sum, the group mask, then k passes of
// selection over the experts (no per-expert array: the scores are recomputed).
__global__ void k_moe_route(pkv_cu_moe_route a) {
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= a.n) return;
    const float *l = a.logits + t * a.n_expert;
    float mx = l[0], sum = 0.0f;
    for (int e = 1; e < a.n_expert; e++) mx = fmaxf(mx, l[e]);
    if (a.gating == 0)
        for (int e = 0; e < a.n_expert; e++) sum += expf(l[e] - mx);
    unsigned long long keep = ~0ull; // groups that may be chosen
    const int G = a.n_group > 1 ? a.n_group : 1, per = a.n_expert / G;
    if (a.n_group > 1) {
        float gs[64];
        for (int g = 0; g < G; g++) {
            int b0 = -1, b1 = -1;
            for (int e = g * per; e < (g + 1) * per; e++) {
                const float v = moe_score(a, l, e, mx, sum);
                if (b0 < 0 || v > moe_score(a, l, b0, mx, sum)) b1 = b0, b0 = e;
                else if (b1 < 0 || v > moe_score(a, l, b1, mx, sum)) b1 = e;
            }
            gs[g] = moe_score(a, l, b0, mx, sum) + moe_score(a, l, b1, mx, sum);
        }
        keep = 0;
        for (int i = 0; i < a.n_group_used; i++) {
            int best = -1;
            for (int g = 0; g < G; g++)
                if (!(keep >> g & 1) && (best < 0 || gs[g] > gs[best])) best = g;
            keep |= 1ull << best;
        }
    }
    int32_t *sel = a.sel + t * a.k;
    float *w = a.w + t * a.k;
    for (int k = 0; k < a.k; k++) {
        int best = -1;
        float bv = 0.0f;
        for (int e = 0; e < a.n_expert; e++) {
            if (!(keep >> (e / per) & 1)) continue;
            bool taken = false;
            for (int j = 0; j < k && !taken; j++) taken = sel[j] == e;
            if (taken) continue;
            const float v = moe_score(a, l, e, mx, sum);
            if (best < 0 || v > bv) best = e, bv = v;
        }
        sel[k] = best;
    }
    float ws = 0.0f;
    for (int k = 0; k < a.k; k++) {
        const int e = sel[k];
        const float p = a.gating == 0 ? expf(l[e] - mx) / sum : a.gating == 2 ? 1.0f / (1.0f + expf(-l[e])) : l[e];
        w[k] = a.gating == 1 ? expf(p - l[sel[0]]) : p;
        ws += w[k];
    }
    if (a.gating == 1 || a.norm_w) {
        if (a.gating != 1) ws = fmaxf(ws, 6.103515625e-5f);
        for (int k = 0; k < a.k; k++) w[k] /= ws;
    }
    const float sc = a.w_scale != 0.0f ? a.w_scale : 1.0f;
    for (int k = 0; k < a.k; k++) w[k] *= sc;
}

__global__ void k_moe_combine(pkv_cu_moe_combine a) {
    const int64_t total = a.n * a.cols;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / a.cols, c = i % a.cols;
        const int32_t row = a.rows[r];
        if (row < 0 || row >= a.out_rows) continue;
        float *o = a.out + (int64_t)row * a.cols + c;
        *o = (a.add ? *o : 0.0f) + a.w[r] * a.y[i];
    }
}

extern "C" int pkv_cu_launch_moe_route(const pkv_cu_moe_route *a, void *stream) {
    k_moe_route<<<cdiv(a->n, 64), 64, 0, (cudaStream_t)stream>>>(*a);
    return (int)cudaGetLastError();
}

extern "C" int pkv_cu_launch_moe_combine(const pkv_cu_moe_combine *a, void *stream) {
    k_moe_combine<<<grid_for(a->n * a->cols, 256), 256, 0, (cudaStream_t)stream>>>(*a);
    return (int)cudaGetLastError();
}

// --------------------------------------------------------------- attention

#define ATT_WARPS PKV_CU_ATT_WARPS

template <bool F16>
__device__ __forceinline__ float ld_kv(const void *p, size_t i) {
    if (F16) return __half2float(((const __half *)p)[i]);
    return ((const float *)p)[i];
}

// Paged causal attention. Block (query row i, head h, split sp): the split's
// share (pkv_cu_split_range) of the tokens the query sees, [first, len) (a
// sliding window only moves the start: pkv_cu_att_first), four warps taking
// every fourth token, each warp an online softmax with q and its accumulator in
// registers (lane holds dims lane + 32 j); the warps merge through shared memory.
// With one split the block writes the normalized output; with several it writes
// (max, sum, unnormalized accumulator) to a.partial for k_att_combine.
// Softcap applies to each score; the sink, once per output, where the output is
// formed (here unsplit, in k_att_combine split): one more online-softmax term of
// max sinks[h], sum 1 and a zero vector, added only when some token was seen.
// Tokens on a page id outside [0, n_pages), past the sequence's pages, and
// queries of a sequence outside [0, n_seq) are skipped as in the reference.
// CAP: a.softcap > 0 (its tanhf costs registers the other layers need not pay).
template <bool F16, bool CAP>
__global__ void __launch_bounds__(ATT_WARPS * WARP) k_attention(pkv_cu_attention a) {
    __shared__ float sm_m[ATT_WARPS], sm_l[ATT_WARPS];
    __shared__ float sm_acc[ATT_WARPS][PKV_CU_ATT_MAX_D];
    const int i = blockIdx.x, h = blockIdx.y, sp = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int32_t lo;
    const int64_t len = pkv_cu_att_len(a.meta, a.n_q, a.n_seq, a.meta_pages, a.page_size, i, &lo);
    const int64_t first = pkv_cu_att_first(a.meta, a.q_win, a.n_q, a.window, a.chunk, i, len);
    int64_t t0, t1;
    pkv_cu_split_range(len - first, a.n_split, sp, &t0, &t1);
    t0 += first;
    t1 += first;

    const int kvh = h / (a.n_head / a.n_kv);
    const float *qh = a.q + ((size_t)i * a.n_head + h) * a.dk;
    float qr[PKV_CU_ATT_DPL], acc[PKV_CU_ATT_DPL];
#pragma unroll
    for (int j = 0; j < PKV_CU_ATT_DPL; j++) {
        const int d = lane + 32 * j;
        qr[j] = d < a.dk ? qh[d] : 0.0f;
        acc[j] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int64_t t = t0 + warp; t < t1; t += ATT_WARPS) {
        const int64_t sl = pkv_cu_att_slot(a.meta, a.n_q, a.n_seq, lo, t, a.page_size, a.n_pages, a.n_kv, kvh);
        if (sl < 0) continue; // the same for the whole warp
        const size_t slot = (size_t)sl;
        float dot = 0.0f;
#pragma unroll
        for (int j = 0; j < PKV_CU_ATT_DPL; j++) {
            const int d = lane + 32 * j;
            if (d < a.dk) dot += qr[j] * ld_kv<F16>(a.k, slot * a.dk + d);
        }
        float score = warp_sum(dot) * a.scale;
        if (CAP) score = a.softcap * tanhf(score / a.softcap);
        const float mn = fmaxf(m, score);
        const float corr = expf(m - mn), p = expf(score - mn); // corr is 0 while m is -inf
        l = l * corr + p;
#pragma unroll
        for (int j = 0; j < PKV_CU_ATT_DPL; j++) {
            const int d = lane + 32 * j;
            if (d < a.dv) acc[j] = acc[j] * corr + p * ld_kv<F16>(a.v, slot * a.v_stride + d);
        }
        m = mn;
    }
    if (lane == 0) {
        sm_m[warp] = m;
        sm_l[warp] = l;
    }
#pragma unroll
    for (int j = 0; j < PKV_CU_ATT_DPL; j++) {
        const int d = lane + 32 * j;
        if (d < a.dv) sm_acc[warp][d] = acc[j];
    }
    __syncthreads();
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < ATT_WARPS; w++) M = fmaxf(M, sm_m[w]);
    // M stays -inf (zeros written) when no token was seen, sink or not
    const bool sink = a.sinks && a.n_split == 1 && M != -INFINITY;
    const float sv = sink ? a.sinks[h] : 0.0f;
    if (sink) M = fmaxf(M, sv);
    float f[ATT_WARPS], L = 0.0f;
#pragma unroll
    for (int w = 0; w < ATT_WARPS; w++) {
        f[w] = sm_m[w] == -INFINITY ? 0.0f : expf(sm_m[w] - M);
        L += sm_l[w] * f[w];
    }
    if (sink) L += expf(sv - M);
    const size_t row = (size_t)i * a.n_head + h;
    if (a.n_split == 1) {
        float *o = a.out + row * a.dv;
        for (int d = threadIdx.x; d < a.dv; d += blockDim.x) {
            float v = 0.0f;
#pragma unroll
            for (int w = 0; w < ATT_WARPS; w++) v += sm_acc[w][d] * f[w];
            o[d] = M == -INFINITY ? 0.0f : v / L;
        }
    } else {
        float *p = a.partial + (row * a.n_split + sp) * (size_t)(a.dv + 2);
        for (int d = threadIdx.x; d < a.dv; d += blockDim.x) {
            float v = 0.0f;
#pragma unroll
            for (int w = 0; w < ATT_WARPS; w++) v += sm_acc[w][d] * f[w];
            p[2 + d] = v;
        }
        if (threadIdx.x == 0) {
            p[0] = M;
            p[1] = L;
        }
    }
}

// Merge the splits of one (query row, head): rescale each split's sum and
// accumulator to the common maximum. The head's sink (sinks: [n_head] or NULL)
// joins as one more split of max sinks[h], sum 1 and a zero accumulator, when
// some split saw a token (M stays -inf and zeros are written otherwise).
__global__ void k_att_combine(const float *partial, float *out, int n_split, int dv, const float *sinks,
                              int n_head) {
    const size_t row = blockIdx.x;
    const float *p = partial + row * n_split * (size_t)(dv + 2);
    float M = -INFINITY;
    for (int s = 0; s < n_split; s++) M = fmaxf(M, p[(size_t)s * (dv + 2)]);
    const bool sink = sinks && M != -INFINITY;
    const float sv = sink ? sinks[row % (size_t)n_head] : 0.0f;
    if (sink) M = fmaxf(M, sv);
    float L = 0.0f;
    for (int s = 0; s < n_split; s++) {
        const float ms = p[(size_t)s * (dv + 2)];
        if (ms != -INFINITY) L += p[(size_t)s * (dv + 2) + 1] * expf(ms - M);
    }
    if (sink) L += expf(sv - M);
    for (int d = threadIdx.x; d < dv; d += blockDim.x) {
        float v = 0.0f;
        for (int s = 0; s < n_split; s++) {
            const float ms = p[(size_t)s * (dv + 2)];
            if (ms != -INFINITY) v += p[(size_t)s * (dv + 2) + 2 + d] * expf(ms - M);
        }
        out[row * dv + d] = M == -INFINITY ? 0.0f : v / L;
    }
}

extern "C" int pkv_cu_launch_attention(const pkv_cu_attention *a, void *stream) {
    cudaStream_t st = (cudaStream_t)stream;
    if (a->dk > PKV_CU_ATT_MAX_D || a->dv > PKV_CU_ATT_MAX_D || a->n_head > 65535 || a->n_split < 1 ||
        a->n_split > PKV_CU_ATT_MAX_SPLIT || (a->n_split > 1 && !a->partial))
        return (int)cudaErrorInvalidValue;
    dim3 grid((unsigned)a->n_q, (unsigned)a->n_head, (unsigned)a->n_split);
    const bool cap = a->softcap > 0.0f;
    if (a->kv_f16 && cap)
        k_attention<true, true><<<grid, ATT_WARPS * WARP, 0, st>>>(*a);
    else if (a->kv_f16)
        k_attention<true, false><<<grid, ATT_WARPS * WARP, 0, st>>>(*a);
    else if (cap)
        k_attention<false, true><<<grid, ATT_WARPS * WARP, 0, st>>>(*a);
    else
        k_attention<false, false><<<grid, ATT_WARPS * WARP, 0, st>>>(*a);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess || a->n_split == 1) return (int)e;
    k_att_combine<<<(unsigned)((int64_t)a->n_q * a->n_head), 128, 0, st>>>(a->partial, a->out, a->n_split, a->dv,
                                                                          a->sinks, a->n_head);
    return (int)cudaGetLastError();
}

// ------------------------------------------------------- batched region copy

// Block b copies chunk b (and b + gridDim.x, ...). Chunks whose source and
// destination agree modulo 16 (pages at page-aligned offsets: the usual case)
// move 16-byte words after a byte head; modulo 4, 4-byte words; else bytes.
__global__ void k_copy_chunks(const uint8_t *src, uint8_t *dst, const pkv_cu_chunk *chunks, int64_t n_chunks) {
    for (int64_t b = blockIdx.x; b < n_chunks; b += gridDim.x) {
        const pkv_cu_chunk c = chunks[b];
        const uint8_t *s = src + c.src_off;
        uint8_t *d = dst + c.dst_off;
        const uint64_t n = c.size;
        unsigned wb;
        uint64_t head, words;
        pkv_cu_copy_layout((uint64_t)(uintptr_t)s, (uint64_t)(uintptr_t)d, n, &wb, &head, &words);
        for (uint64_t k = threadIdx.x; k < head; k += blockDim.x) d[k] = s[k];
        if (wb == 16) {
            const uint4 *s4 = (const uint4 *)(s + head);
            uint4 *d4 = (uint4 *)(d + head);
            for (uint64_t k = threadIdx.x; k < words; k += blockDim.x) d4[k] = s4[k];
        } else if (wb == 4) {
            const uint32_t *s4 = (const uint32_t *)(s + head);
            uint32_t *d4 = (uint32_t *)(d + head);
            for (uint64_t k = threadIdx.x; k < words; k += blockDim.x) d4[k] = s4[k];
        }
        const uint64_t tail0 = head + words * wb;
        for (uint64_t k = tail0 + threadIdx.x; k < n; k += blockDim.x) d[k] = s[k];
    }
}

extern "C" int pkv_cu_launch_copy_chunks(const uint8_t *src, uint8_t *dst, const pkv_cu_chunk *chunks,
                                         int64_t n_chunks, void *stream) {
    if (n_chunks <= 0) return 0;
    const unsigned blocks = (unsigned)(n_chunks < (1 << 20) ? n_chunks : (1 << 20));
    k_copy_chunks<<<blocks, 256, 0, (cudaStream_t)stream>>>(src, dst, chunks, n_chunks);
    return (int)cudaGetLastError();
}

extern "C" int pkv_cu_probe(void) {
    cudaFuncAttributes fa;
    return (int)cudaFuncGetAttributes(&fa, k_add);
}
