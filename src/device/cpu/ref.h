/* Plain-C reference of every kernel of kernel-list.h, on host pointers. These define
 * the results every backend is tested against: straightforward loops, sums in
 * double, no threads, no SIMD. Shapes and semantics are those of the matching
 * pkv_k_*_args in kernel-list.h; where a function takes an args struct, only its shape
 * fields are read (its pkv_tref fields are ignored) and the data come from the
 * host pointers. Inputs read from "device memory" that could be out of range
 * (ids, page ids, row indices) are guarded exactly as kernel-list.h states. */
#ifndef PKV_REF_H
#define PKV_REF_H

#include "device/device.h"

/* y[i][r] = sum_c dequant(w[r])[c] * x[i][c], in double. w: wt [rows][cols].
 * Returns PKV_ERR_UNSUPPORTED for a type quant.h cannot dequantize. */
pkv_status pkv_ref_matmul(const void *w, pkv_type wt, int64_t rows, int64_t cols, const float *x, int64_t n,
                          float *y);
/* out[i] = dequant(w[ids[i]]), zeros for an id outside [0, n_vocab). */
pkv_status pkv_ref_get_rows(const void *w, pkv_type wt, int64_t n_vocab, int64_t cols, const int32_t *ids,
                            int64_t n, float *out);
void pkv_ref_rms_norm(const float *x, const float *w, float *y, int64_t n_rows, int64_t row_len, float eps);
/* w, b NULL: 1, 0. y may equal x. */
void pkv_ref_layer_norm(const float *x, const float *w, const float *b, float *y, int64_t n_rows, int64_t row_len,
                        float eps);
void pkv_ref_add(const float *a, const float *b, float *y, int64_t n, int64_t b_len);
void pkv_ref_swiglu(const float *g, const float *u, float *y, int64_t n);
/* y = act(g) * u with act silu (gelu false) or the tanh form of gelu (kernel-list.h). */
void pkv_ref_glu(const float *g, const float *u, float *y, int64_t n, bool gelu);
/* gpt-oss's clamped SwiGLU (kernel-list.h, pkv_k_swiglu_args.oai), in double. */
void pkv_ref_swiglu_oai(const float *g, const float *u, float *y, int64_t n, float alpha, float limit);
/* x *= scale in f32 (get_rows' scale; 0 = nothing). */
void pkv_ref_scale(float *x, int64_t n, float scale);
/* x: the bytes at a->x (rows at row(r) * a->row_stride). rows NULL: identity.
 * Rows outside [0, a->max_rows) are skipped; the list should not repeat a row. */
void pkv_ref_rope(const pkv_k_rope_args *a, void *x, const int32_t *pos, const int32_t *rows, const float *ff); /* ff: NULL = none */
/* dst: the bytes at a->dst. Indices outside [0, a->dst_rows) are skipped. */
void pkv_ref_set_rows(const pkv_k_set_rows_args *a, const void *src, void *dst, const int32_t *idx);
/* meta laid out as kernel-list.h says. Exact two-pass softmax in double. A query that
 * sees no valid token gets zeros. */
void pkv_ref_attention(const pkv_k_attention_args *a, const float *q, const void *k, const void *v,
                       const int32_t *meta, float *out);
/* pkv_ref_attention with the attention's sinks (f32 [n_head], host memory; NULL =
 * none): a->window and a->softcap are read from a, the sinks from here. */
void pkv_ref_attention_sinks(const pkv_k_attention_args *a, const float *q, const void *k, const void *v,
                             const int32_t *meta, const float *sinks, float *out);
/* pkv_ref_attention_sinks with the window measured back from q_win (i32 [n_q],
 * host memory; NULL = q_len; kernel-list.h's pkv_k_attention_args). */
void pkv_ref_attention_win(const pkv_k_attention_args *a, const float *q, const void *k, const void *v,
                           const int32_t *meta, const float *sinks, const int32_t *q_win, float *out);
void pkv_ref_softmax(const float *x, float *y, int64_t n_rows, int64_t row_len);
void pkv_ref_argmax(const float *x, int32_t *out, int64_t n_rows, int64_t row_len);

/* The recurrent-layer kernels. state: the slot pool's bytes (slot i at
 * i * a->state_stride); meta: i32 [2 n_seq + 1] as kernel-list.h says; strides of 0
 * mean packed. Sums in double within a token; the states stay f32 between tokens
 * (rounded after every token), so one call and consecutive calls over the same
 * tokens agree bitwise. Bad ranges and slots are guarded as kernel-list.h states. */
void pkv_ref_ssm_conv(const pkv_k_ssm_conv_args *a, const float *x, const float *w, float *y, void *state,
                      const int32_t *meta);
/* q, k, v: the bytes at a->q, a->k, a->v (rows at their strides). a->scale 0 = 1/sqrt(d_k). */
void pkv_ref_delta_net(const pkv_k_delta_net_args *a, const void *q, const void *k, const void *v, const float *g,
                       const float *beta, float *out, void *state, const int32_t *meta);
/* x, B, C: the bytes at a->x, a->B, a->C (rows at their strides); D NULL: no skip term. */
void pkv_ref_ssm_scan(const pkv_k_ssm_scan_args *a, const void *x, const void *B, const void *C, const float *dt,
                      const float *dt_bias, const float *A, const float *D, float *y, void *state, const int32_t *meta);
/* x, y: the bytes at a->x, a->y (rows at their strides); y may equal x. */
void pkv_ref_l2_norm(const pkv_k_l2_norm_args *a, const void *x, void *y);
/* bias / mul NULL: none. */
void pkv_ref_unary(pkv_unary_op op, const float *x, float *y, int64_t n, const float *bias, int64_t bias_len,
                   const float *mul, int64_t mul_len);
/* Routing of rows [r0, r1) of a (kernel-list.h; the arrays are a's, on the host). */
void pkv_ref_moe_route(const pkv_k_moe_route_args *a, const float *logits, const float *bias, int32_t *sel, float *w,
                       int64_t r0, int64_t r1);
void pkv_ref_moe_combine(const pkv_k_moe_combine_args *a, float *out, const float *y, const int32_t *rows, const float *w);

#endif
