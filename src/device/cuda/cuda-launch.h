/* The boundary between the CUDA backend's host code (cuda.c, plain C11 built by
 * the C compiler) and its kernels (cuda-kernels.cu, built by nvcc). Only plain C
 * types cross it, so this header compiles as C and as C++ and needs no CUDA
 * header. Pointers here are device pointers, already offset to the argument's
 * first byte; the host side has checked bounds (kernels.c) and alignment
 * (cuda-plan.c) before any of these is called.
 *
 * Every pkv_cu_launch_* queues its kernel(s) on `stream` (a cudaStream_t) and
 * returns the cudaError_t of the launch as an int (0 = cudaSuccess). */
#ifndef PKV_CUDA_LAUNCH_H
#define PKV_CUDA_LAUNCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Weight types of matmul and get_rows (pkv_cu_wtype in cuda-plan.c maps
 * pkv_type to these). */
enum {
    PKV_CU_W_F32 = 0,
    PKV_CU_W_F16,
    PKV_CU_W_BF16,
    PKV_CU_W_Q8_0, /* the block types follow: the kernels test T >= PKV_CU_W_Q8_0 */
    PKV_CU_W_Q4_0,
    PKV_CU_W_Q4_K,
    PKV_CU_W_Q5_K,
    PKV_CU_W_Q6_K,
    PKV_CU_W_MXFP4,
    PKV_CU_W_COUNT
};

/* The matrix-vector kernel reads the weights once per this many x rows; batches up
 * to it take one weight row per warp, larger ones several (the same arithmetic per
 * output: batch-invariant), or with pkv_cu_matmul.tiled the tiled kernel. */
#define PKV_CU_MMV_MAX 8
/* Attention keeps a head's q and accumulator in registers, 32 lanes x this many
 * elements: head sizes dk, dv up to 32 * PKV_CU_ATT_DPL (576: DeepSeek's latent row). */
#define PKV_CU_ATT_DPL 18
#define PKV_CU_ATT_MAX_D (32 * PKV_CU_ATT_DPL)
/* Warps of an attention block; warp w takes tokens t0 + w, t0 + w + 4, ... */
#define PKV_CU_ATT_WARPS 4
/* Most splits of one query's tokens in the split-K decode attention. */
#define PKV_CU_ATT_MAX_SPLIT 64

#ifdef __CUDACC__
#define PKV_CU_HD __host__ __device__
#else
#define PKV_CU_HD
#endif

/* The tokens [*t0, *t1) that split sp of n_split handles of a query that sees
 * len tokens: equal parts, the last ones possibly empty. Shared by the kernel
 * and the host-side tests so both use the same formula. */
static inline PKV_CU_HD void pkv_cu_split_range(int64_t len, int n_split, int sp, int64_t *t0, int64_t *t1) {
    int64_t per = (len + n_split - 1) / n_split;
    int64_t a = per * sp, b = a + per;
    *t0 = a < len ? a : len;
    *t1 = b < len ? b : len;
}

/* Attention index logic, shared by the kernel and a host emulation in
 * tests/test-cuda-plan.c. meta is the kernel's i32 table (kernel-list.h).
 * The tokens query i sees: its sequence's first block-table index in *lo, and the
 * count, 0 for a sequence outside [0, n_seq) or a bad page range, and never more
 * than its pages hold (the reference skips those tokens). */
static inline PKV_CU_HD int64_t pkv_cu_att_len(const int32_t *meta, int n_q, int n_seq, int meta_pages, int page_size,
                                               int i, int32_t *lo) {
    const int32_t *q_seq = meta, *q_len = meta + n_q, *indptr = meta + 2 * n_q;
    const int32_t s = q_seq[i];
    *lo = 0;
    if (s < 0 || s >= n_seq) return 0;
    const int32_t a = indptr[s], b = indptr[s + 1];
    if (a < 0 || b < a || b > meta_pages) return 0;
    *lo = a;
    const int64_t cap = (int64_t)(b - a) * page_size, len = q_len[i];
    return len < 0 ? 0 : len < cap ? len : cap;
}

/* The first token query i sees under a sliding window of `window` tokens and
 * chunks of `chunk` tokens (0 = none): max(0, q_len[i] - window), from the query's own q_len as in the
 * reference (not from the length above, which its pages may cut short), or from
 * min(q_win[i], q_len[i]) when q_win is given (kernel-list.h), and never past len.
 * The query's tokens are [first, len). */
static inline PKV_CU_HD int64_t pkv_cu_att_first(const int32_t *meta, const int32_t *q_win, int n_q, int window,
                                                 int chunk, int i, int64_t len) {
    if (window <= 0 && chunk <= 0) return 0;
    const int64_t q_len = meta[n_q + i], end = q_win && q_win[i] < q_len ? q_win[i] : q_len;
    int64_t first = window > 0 ? end - window : 0;
    /* a chunked layer: the query's chunk, [floor((end - 1) / chunk) * chunk, ..) */
    if (chunk > 0 && end > 0 && (end - 1) / chunk * chunk > first) first = (end - 1) / chunk * chunk;
    return first <= 0 ? 0 : first < len ? first : len;
}

/* The KV row of token t (t < the length above) for KV head kvh, in units of one
 * head's vector: k at slot * dk, v at slot * dv; -1 when the page id is outside
 * [0, n_pages) (skipped). */
static inline PKV_CU_HD int64_t pkv_cu_att_slot(const int32_t *meta, int n_q, int n_seq, int32_t lo, int64_t t,
                                                int page_size, int n_pages, int n_kv, int kvh) {
    const int32_t *pages = meta + 2 * n_q + n_seq + 1;
    const int32_t page = pages[lo + t / page_size];
    if (page < 0 || page >= n_pages) return -1;
    return ((int64_t)page * page_size + t % page_size) * n_kv + kvh;
}

/* How the copy kernel moves a chunk of n bytes from address s to address d:
 * *head bytes one by one, then *words words of *wb bytes (16 or 4: the widest
 * to which s and d are equally aligned, the words then aligned in both), then
 * the rest byte by byte from *head + *words * *wb. With *wb == 1 it is all
 * bytes (*head = *words = 0). */
static inline PKV_CU_HD void pkv_cu_copy_layout(uint64_t s, uint64_t d, uint64_t n, unsigned *wb, uint64_t *head,
                                                uint64_t *words) {
    const uint64_t mis = s ^ d;
    const unsigned w = (mis & 15) == 0 ? 16 : (mis & 3) == 0 ? 4 : 1;
    uint64_t h = (w - (d & (w - 1))) & (w - 1);
    if (h > n) h = n;
    *wb = w;
    *head = h;
    *words = w == 1 ? 0 : (n - h) / w;
}

/* One piece of a batched region copy: one thread block copies it. */
typedef struct pkv_cu_chunk {
    uint64_t src_off, dst_off, size; /* bytes */
} pkv_cu_chunk;

typedef struct pkv_cu_matmul {
    const uint8_t *w; /* [rows][row_bytes] */
    int wtype;        /* PKV_CU_W_* */
    size_t row_bytes;
    int64_t rows, cols, n;
    const float *x; /* [n][cols] */
    float *y;       /* [n][rows] */
    bool tiled;     /* n > PKV_CU_MMV_MAX: the tiled kernel (not batch-invariant) in place of the
                       matrix-vector one over several weight rows per warp */
} pkv_cu_matmul;

typedef struct pkv_cu_get_rows {
    const uint8_t *w; /* [n_vocab][row_bytes] */
    int wtype;
    size_t row_bytes;
    int64_t n_vocab, cols, n;
    const int32_t *ids; /* [n] */
    float *out;         /* [n][cols] */
    float scale;        /* out = dequant * scale, one f32 multiply; 0 = none (exact copies) */
} pkv_cu_get_rows;

typedef struct pkv_cu_swiglu {
    const float *g, *u; /* [n] */
    float *y;           /* [n], may alias g */
    int64_t n;
    int gelu; /* 0: silu(g) * u; 1: gelu(g) * u, the tanh form (kernel-list.h) */
    int oai;  /* 1: gpt-oss's clamped form with alpha and limit (kernel-list.h); gelu is then 0 */
    float alpha, limit;
} pkv_cu_swiglu;

typedef struct pkv_cu_rope {
    uint8_t *x; /* f32 or f16 rows of row_stride bytes */
    int f16;
    int64_t n_rows, max_rows;
    size_t row_stride;
    int n_heads, head_dim, n_rot, neox;
    float freq_base, freq_scale;
    const int32_t *pos;  /* [n_rows] */
    const int32_t *rows; /* [n_rows] or NULL */
    float ext_factor, corr_lo, corr_hi; /* YaRN (kernel-list.h); ext_factor 0 = none */
    float mscale;                       /* cos and sin times this (1 = none) */
} pkv_cu_rope;

typedef struct pkv_cu_set_rows {
    const uint8_t *src;
    size_t src_stride;
    uint8_t *dst;
    int dst_f16;
    size_t dst_stride;
    int64_t dst_rows, n, row_elems;
    const int32_t *idx;
} pkv_cu_set_rows;

typedef struct pkv_cu_attention {
    const float *q;
    const void *k, *v; /* f16 or f32 pools */
    int kv_f16;
    const int32_t *meta;
    float *out;
    /* [n_q][n_head][n_split][2 + dv] floats (running max, sum, accumulator) when
     * n_split > 1, else unused; the sink is not in them (the merge adds it) */
    float *partial;
    int n_split;
    int n_q, n_seq, meta_pages, n_pages, page_size, n_head, n_kv, dk, dv;
    int v_stride;       /* elements from one V slot to the next: dv, or dk where V is read from K (v_in_k) */
    float scale;
    int window;         /* tokens; 0 = every visible token (pkv_cu_att_first) */
    int chunk;          /* tokens; 0 = no chunks (pkv_cu_att_first) */
    const int32_t *q_win; /* [n_q], or NULL (pkv_cu_att_first) */
    float softcap;      /* 0 = none */
    const float *sinks; /* [n_head], or NULL */
} pkv_cu_attention;

/* The recurrent kernels' meta (kernel-list.h): sequence s's token range and slot.
 * Returns 0 for a bad range (skipped), 1 for a bad slot (zero output rows, state
 * untouched), 2 to run it. Shared by the kernels and host-side tests. */
static inline PKV_CU_HD int pkv_cu_rec_seq(const int32_t *meta, int n_seq, int64_t n_tok, int64_t n_slots, int s,
                                           int64_t *lo, int64_t *hi, int64_t *slot) {
    *lo = meta[s];
    *hi = meta[s + 1];
    *slot = meta[n_seq + 1 + s];
    if (*lo < 0 || *hi < *lo || *hi > n_tok) return 0;
    return *slot >= 0 && *slot < n_slots ? 2 : 1;
}

typedef struct pkv_cu_ssm_conv {
    const float *x, *w; /* [n_tok][channels], [channels][d_conv] */
    float *y;           /* [n_tok][channels], may alias x */
    uint8_t *state;     /* slot i at i * state_stride: f32 [d_conv - 1][channels] */
    size_t state_stride;
    int64_t n_slots;
    const int32_t *meta; /* indptr[n_seq + 1], slot[n_seq] */
    int64_t n_tok, channels;
    int n_seq, d_conv, silu;
} pkv_cu_ssm_conv;

/* delta_net keeps a state column in registers, d_k / 32 values per lane. */
#define PKV_CU_DN_MAX_DK 256
typedef struct pkv_cu_delta_net {
    const uint8_t *q, *k, *v; /* rows at their strides (bytes) */
    size_t q_stride, k_stride, v_stride;
    const float *g, *beta; /* [n_tok][n_v_heads] */
    float *out;            /* [n_tok][n_v_heads][d_v] */
    uint8_t *state;        /* slot i at i * state_stride: f32 [n_v_heads][d_k][d_v] */
    size_t state_stride;
    int64_t n_slots;
    const int32_t *meta;
    int64_t n_tok;
    int n_seq, n_k_heads, n_v_heads, d_k, d_v, grouped;
    float scale; /* already resolved (never 0) */
} pkv_cu_delta_net;

/* ssm_scan keeps a state row in registers, d_state / 32 values per lane. */
#define PKV_CU_SCAN_MAX_DS 256
typedef struct pkv_cu_ssm_scan {
    const uint8_t *x, *B, *C; /* rows at their strides (bytes) */
    size_t x_stride, B_stride, C_stride;
    const float *dt;                /* [n_tok][n_head] */
    const float *dt_bias, *A, *D;   /* [n_head]; D NULL: no skip term */
    float *y;                       /* [n_tok][n_head][head_dim] */
    uint8_t *state;                 /* slot i at i * state_stride: f32 [n_head][head_dim][d_state] */
    size_t state_stride;
    int64_t n_slots;
    const int32_t *meta;
    int64_t n_tok;
    int n_seq, n_head, head_dim, n_group, d_state;
} pkv_cu_ssm_scan;

typedef struct pkv_cu_l2_norm {
    const uint8_t *x; /* row (t, h) at t * x_stride + h * head_dim * 4 */
    uint8_t *y;
    int64_t n, n_heads, head_dim;
    size_t x_stride, y_stride;
    float eps;
} pkv_cu_l2_norm;

typedef struct pkv_cu_unary {
    const float *x;
    float *y;
    int64_t n;
    int op;            /* pkv_unary_op: 0 id, 1 sigmoid, 2 softplus, 3 silu, 4 gelu, 5 gelu_erf */
    const float *bias; /* [bias_len] or NULL */
    int64_t bias_len;
    const float *mul; /* [mul_len] or NULL */
    int64_t mul_len;
} pkv_cu_unary;

/* pkv_k_moe_route_args / pkv_k_moe_combine_args (kernel-list.h), device pointers */
typedef struct pkv_cu_moe_route {
    const float *logits, *bias; /* bias NULL: none */
    int32_t *sel;
    float *w;
    int64_t n;
    int n_expert, k, n_group, n_group_used, gating, norm_w, sel_logits;
    float w_scale;
} pkv_cu_moe_route;

typedef struct pkv_cu_moe_combine {
    float *out;
    const float *y, *w;
    const int32_t *rows;
    int64_t n, cols, out_rows;
    int add;
} pkv_cu_moe_combine;

int pkv_cu_launch_copy_chunks(const uint8_t *src, uint8_t *dst, const pkv_cu_chunk *chunks, int64_t n_chunks,
                              void *stream);
int pkv_cu_launch_matmul(const pkv_cu_matmul *a, void *stream);
int pkv_cu_launch_get_rows(const pkv_cu_get_rows *a, void *stream);
int pkv_cu_launch_rms_norm(const float *x, const float *w, float *y, int64_t n_rows, int64_t row_len, float eps,
                           void *stream);
int pkv_cu_launch_layer_norm(const float *x, const float *w, const float *b, float *y, int64_t n_rows,
                             int64_t row_len, float eps, void *stream); /* w, b may be NULL */
int pkv_cu_launch_add(const float *a, const float *b, float *y, int64_t n, int64_t b_len, void *stream);
int pkv_cu_launch_swiglu(const pkv_cu_swiglu *a, void *stream);
int pkv_cu_launch_rope(const pkv_cu_rope *a, void *stream);
int pkv_cu_launch_set_rows(const pkv_cu_set_rows *a, void *stream);
int pkv_cu_launch_attention(const pkv_cu_attention *a, void *stream);
int pkv_cu_launch_softmax(const float *x, float *y, int64_t n_rows, int64_t row_len, void *stream);
int pkv_cu_launch_argmax(const float *x, int32_t *out, int64_t n_rows, int64_t row_len, void *stream);
int pkv_cu_launch_ssm_conv(const pkv_cu_ssm_conv *a, void *stream);
int pkv_cu_launch_delta_net(const pkv_cu_delta_net *a, void *stream);
int pkv_cu_launch_ssm_scan(const pkv_cu_ssm_scan *a, void *stream);
int pkv_cu_launch_l2_norm(const pkv_cu_l2_norm *a, void *stream);
int pkv_cu_launch_unary(const pkv_cu_unary *a, void *stream);
int pkv_cu_launch_moe_route(const pkv_cu_moe_route *a, void *stream);
int pkv_cu_launch_moe_combine(const pkv_cu_moe_combine *a, void *stream);

/* Is there code in this binary the current device can run? Returns the
 * cudaError_t of querying a kernel's attributes (cudaErrorNoKernelImageForDevice
 * for a GPU older than the oldest compiled architecture). */
int pkv_cu_probe(void);

#ifdef __cplusplus
}
#endif

#endif /* PKV_CUDA_LAUNCH_H */
