/* Kernel dispatch: check that each argument lives on the device and that every
 * region the kernel will touch is inside its buffer, then call the backend.
 * Backends may trust these checks (they still guard page ids read from device
 * memory, which no host-side check can see). */
#include "device/device-impl.h"

#include <math.h>
#include <stdio.h>

typedef struct {
    const char *kernel;
    pkv_device *dev;
} kctx;

/* A tensor argument of `bytes` bytes at t: on the device, inside its buffer. */
static pkv_status arg(const kctx *k, const char *name, pkv_tref t, uint64_t bytes) {
    if (!t.buf) return pkv_err(PKV_ERR_INVALID, "kernel %s on %s: argument %s is NULL", k->kernel, k->dev->caps.name, name);
    if (t.buf->dev != k->dev)
        return pkv_err(PKV_ERR_INVALID, "kernel %s on %s: argument %s is a buffer of device %s", k->kernel,
                       k->dev->caps.name, name, t.buf->dev->caps.name);
    if (t.off > t.buf->size || bytes > t.buf->size - t.off)
        return pkv_err(PKV_ERR_INVALID,
                       "kernel %s on %s: argument %s needs %llu bytes at offset %zu, buffer has %zu bytes",
                       k->kernel, k->dev->caps.name, name, (unsigned long long)bytes, t.off, t.buf->size);
    return PKV_OK;
}

static pkv_status start(kctx *k, pkv_device *dev, const char *kernel, const void *args, void *slot) {
    k->kernel = kernel;
    k->dev = dev;
    if (!dev) return pkv_err(PKV_ERR_INVALID, "kernel %s: device is NULL", kernel);
    if (!args) return pkv_err(PKV_ERR_INVALID, "kernel %s on %s: args is NULL", kernel, dev->caps.name);
    if (!dev->ops->kernels || !slot)
        return pkv_err(PKV_ERR_UNSUPPORTED, "device %s has no %s kernel", dev->caps.name, kernel);
    return PKV_OK;
}

#define KOPS(dev) ((dev) && (dev)->ops->kernels ? (dev)->ops->kernels : NULL)
#define SLOT(dev, name) (KOPS(dev) ? (void *)KOPS(dev)->name : NULL)
#define TRY(x)                                                                             \
    do {                                                                                   \
        pkv_status _s = (x);                                                               \
        if (_s) return _s;                                                                 \
    } while (0)
#define SHAPE(cond, ...)                                                                   \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            char _m[256];                                                                  \
            snprintf(_m, sizeof _m, __VA_ARGS__);                                          \
            return pkv_err(PKV_ERR_INVALID, "kernel %s on %s: %s", k->kernel, k->dev->caps.name, _m); \
        }                                                                                  \
    } while (0)

bool pkv_device_supports_weight(const pkv_device *dev, pkv_type t) {
    const pkv_kernel_ops *ko = KOPS(dev);
    if (!ko || !ko->matmul) return false;
    if (pkv_type_block_elems(t) == 0 || t == PKV_TYPE_I32) return false;
    return ko->supports_type ? ko->supports_type(dev->ctx, t) : true;
}

void pkv_device_weight_layout(const pkv_device *dev, pkv_type t, char *buf, size_t size) {
    if (!buf || !size) return;
    const pkv_kernel_ops *ko = dev ? KOPS(dev) : NULL;
    if (ko && ko->weight_layout)
        ko->weight_layout(dev->ctx, t, buf, size);
    else
        snprintf(buf, size, "plain");
}

pkv_weight_speed pkv_device_weight_speed(const pkv_device *dev, pkv_type t) {
    if (!dev || !pkv_device_supports_weight(dev, t)) return PKV_WEIGHT_NONE;
    const pkv_kernel_ops *ko = KOPS(dev);
    return ko->weight_speed ? ko->weight_speed(dev->ctx, t) : PKV_WEIGHT_FAST;
}

static pkv_status weight_type(const kctx *k, pkv_type t, int64_t cols) {
    if (!pkv_device_supports_weight(k->dev, t))
        return pkv_err(PKV_ERR_UNSUPPORTED, "kernel %s on %s: weight type %s is not supported on this device",
                       k->kernel, k->dev->caps.name, pkv_type_name(t) ? pkv_type_name(t) : "(unknown)");
    if (cols <= 0 || pkv_type_row_bytes(t, (size_t)cols) == 0)
        return pkv_err(PKV_ERR_INVALID, "kernel %s on %s: %lld columns is not a whole number of %s blocks",
                       k->kernel, k->dev->caps.name, (long long)cols, pkv_type_name(t));
    return PKV_OK;
}

static pkv_status check_matmul(const kctx *k, pkv_k_matmul_args *a) {
    SHAPE(a->rows > 0 && a->n > 0, "rows %lld, n %lld", (long long)a->rows, (long long)a->n);
    TRY(weight_type(k, a->wtype, a->cols));
    TRY(arg(k, "w", a->w, (uint64_t)a->rows * pkv_type_row_bytes(a->wtype, (size_t)a->cols)));
    TRY(arg(k, "x", a->x, (uint64_t)a->n * (uint64_t)a->cols * 4));
    TRY(arg(k, "y", a->y, (uint64_t)a->n * (uint64_t)a->rows * 4));
    return PKV_OK;
}

static pkv_status check_get_rows(const kctx *k, pkv_k_get_rows_args *a) {
    SHAPE(a->n_vocab > 0 && a->n > 0, "n_vocab %lld, n %lld", (long long)a->n_vocab, (long long)a->n);
    TRY(weight_type(k, a->wtype, a->cols));
    TRY(arg(k, "w", a->w, (uint64_t)a->n_vocab * pkv_type_row_bytes(a->wtype, (size_t)a->cols)));
    TRY(arg(k, "ids", a->ids, (uint64_t)a->n * 4));
    TRY(arg(k, "out", a->out, (uint64_t)a->n * (uint64_t)a->cols * 4));
    SHAPE(a->scale < INFINITY && a->scale > -INFINITY, "scale %g must be finite", (double)a->scale);
    return PKV_OK;
}

static pkv_status check_rms_norm(const kctx *k, pkv_k_rms_norm_args *a) {
    SHAPE(a->n_rows > 0 && a->row_len > 0, "n_rows %lld, row_len %lld", (long long)a->n_rows, (long long)a->row_len);
    uint64_t bytes = (uint64_t)a->n_rows * (uint64_t)a->row_len * 4;
    TRY(arg(k, "x", a->x, bytes));
    TRY(arg(k, "w", a->w, (uint64_t)a->row_len * 4));
    TRY(arg(k, "y", a->y, bytes));
    return PKV_OK;
}

static pkv_status check_layer_norm(const kctx *k, pkv_k_layer_norm_args *a) {
    SHAPE(a->n_rows > 0 && a->row_len > 0, "n_rows %lld, row_len %lld", (long long)a->n_rows, (long long)a->row_len);
    SHAPE(a->eps >= 0 && a->eps < INFINITY, "eps %g must be finite and >= 0", (double)a->eps);
    uint64_t bytes = (uint64_t)a->n_rows * (uint64_t)a->row_len * 4;
    TRY(arg(k, "x", a->x, bytes));
    TRY(arg(k, "y", a->y, bytes));
    if (a->w.buf) TRY(arg(k, "w", a->w, (uint64_t)a->row_len * 4));
    if (a->b.buf) TRY(arg(k, "b", a->b, (uint64_t)a->row_len * 4));
    return PKV_OK;
}

static pkv_status check_add(const kctx *k, pkv_k_add_args *a) {
    SHAPE(a->n > 0 && a->b_len > 0 && a->n % a->b_len == 0, "n %lld is not a multiple of b_len %lld",
          (long long)a->n, (long long)a->b_len);
    TRY(arg(k, "a", a->a, (uint64_t)a->n * 4));
    TRY(arg(k, "b", a->b, (uint64_t)a->b_len * 4));
    TRY(arg(k, "y", a->y, (uint64_t)a->n * 4));
    return PKV_OK;
}

static pkv_status check_swiglu(const kctx *k, pkv_k_swiglu_args *a) {
    SHAPE(a->n > 0, "n %lld", (long long)a->n);
    TRY(arg(k, "g", a->g, (uint64_t)a->n * 4));
    TRY(arg(k, "u", a->u, (uint64_t)a->n * 4));
    TRY(arg(k, "y", a->y, (uint64_t)a->n * 4));
    SHAPE(!a->oai || (!a->gelu && a->limit > 0 && a->limit < INFINITY && a->alpha > -INFINITY && a->alpha < INFINITY),
          "oai needs gelu off, a finite alpha and a limit in (0, inf) (alpha %g, limit %g)", (double)a->alpha,
          (double)a->limit);
    return PKV_OK;
}

static pkv_status check_rope(const kctx *k, pkv_k_rope_args *a) {
    SHAPE(pkv_kv_type_ok(a->dtype), "dtype must be f32, f16, q8_0 or q4_0");
    SHAPE(a->n_rows > 0 && a->n_heads > 0 && a->head_dim > 0, "empty shape");
    SHAPE(!pkv_kv_type_quant(a->dtype) || a->head_dim % 32 == 0, "head_dim %d of a %s row is not a multiple of 32",
          a->head_dim, pkv_type_name(a->dtype));
    SHAPE(a->n_rot > 0 && a->n_rot % 2 == 0 && a->n_rot <= a->head_dim,
          "n_rot %d must be even and in (0, head_dim %d]", a->n_rot, a->head_dim);
    /* freq_scale 0 only inside YaRN's mix: the partial RoPE of pkv_rope_partial */
    SHAPE(a->freq_base > 0 && (a->freq_scale > 0 || (a->freq_scale == 0 && a->ext_factor != 0)),
          "freq_base and freq_scale must be > 0 (freq_scale 0 only with ext_factor != 0)");
    SHAPE(isfinite(a->ext_factor) && isfinite(a->corr_lo) && isfinite(a->corr_hi) && isfinite(a->mscale) && a->mscale >= 0,
          "YaRN ext_factor %g, corr %g..%g and mscale %g must be finite (mscale >= 0)", (double)a->ext_factor,
          (double)a->corr_lo, (double)a->corr_hi, (double)a->mscale);
    uint64_t row_bytes = (uint64_t)a->n_heads * pkv_type_row_bytes(a->dtype, (size_t)a->head_dim);
    SHAPE(a->row_stride >= row_bytes, "row stride %zu < row of %llu bytes", a->row_stride, (unsigned long long)row_bytes);
    int64_t max_rows = a->rows.buf ? a->max_rows : a->n_rows;
    SHAPE(max_rows >= (a->rows.buf ? 1 : a->n_rows), "max_rows %lld", (long long)max_rows);
    TRY(arg(k, "x", a->x, (uint64_t)(max_rows - 1) * a->row_stride + row_bytes));
    TRY(arg(k, "pos", a->pos, (uint64_t)a->n_rows * 4));
    if (a->rows.buf) TRY(arg(k, "rows", a->rows, (uint64_t)a->n_rows * 4));
    if (a->ff.buf) TRY(arg(k, "ff", a->ff, (uint64_t)(a->n_rot / 2) * 4));
    return PKV_OK;
}

void pkv_rope_yarn_corr_dims(int n_rot, int n_ctx_orig, float freq_base, float beta_fast, float beta_slow,
                             float dims[2]) {
    const float two_pi = 6.28318530717958647692f, lb = 2.0f * logf(freq_base);
    const float lo = floorf((float)n_rot * logf((float)n_ctx_orig / (beta_fast * two_pi)) / lb);
    const float hi = ceilf((float)n_rot * logf((float)n_ctx_orig / (beta_slow * two_pi)) / lb);
    dims[0] = lo > 0 ? lo : 0;
    dims[1] = hi < (float)(n_rot - 1) ? hi : (float)(n_rot - 1);
}

static pkv_status check_set_rows(const kctx *k, pkv_k_set_rows_args *a) {
    SHAPE(pkv_kv_type_ok(a->dst_type), "dst_type must be f32, f16, q8_0 or q4_0");
    SHAPE(a->n > 0 && a->row_elems > 0 && a->dst_rows > 0, "empty shape");
    SHAPE(!pkv_kv_type_quant(a->dst_type) || a->row_elems % 32 == 0, "row of %lld elements is not whole %s blocks",
          (long long)a->row_elems, pkv_type_name(a->dst_type));
    const uint64_t drow = pkv_type_row_bytes(a->dst_type, (size_t)a->row_elems);
    SHAPE(a->src_stride >= (size_t)a->row_elems * 4 && a->dst_stride >= drow, "strides smaller than a row");
    TRY(arg(k, "src", a->src, (uint64_t)(a->n - 1) * a->src_stride + (uint64_t)a->row_elems * 4));
    TRY(arg(k, "dst", a->dst, (uint64_t)(a->dst_rows - 1) * a->dst_stride + drow));
    TRY(arg(k, "idx", a->idx, (uint64_t)a->n * 4));
    return PKV_OK;
}

static pkv_status check_attention(const kctx *k, pkv_k_attention_args *a) {
    SHAPE(pkv_kv_type_ok(a->k_type) && pkv_kv_type_ok(a->v_type), "k_type and v_type must be f32, f16, q8_0 or q4_0");
    SHAPE(a->n_q > 0 && a->n_seq > 0 && a->n_pages > 0 && a->page_size > 0 && a->meta_pages >= 0, "empty shape");
    SHAPE(a->n_kv > 0 && a->n_head > 0 && a->n_head % a->n_kv == 0, "n_head %d is not a multiple of n_kv %d",
          a->n_head, a->n_kv);
    SHAPE(a->dk > 0 && a->dv > 0, "head sizes dk %d, dv %d", a->dk, a->dv);
    if (a->v_in_k) { /* MLA: V is the head of each K row; backends read it through k */
        SHAPE(a->n_kv == 1 && a->dv <= a->dk, "v_in_k needs one KV head and dv <= dk (n_kv %d, dk %d, dv %d)", a->n_kv,
              a->dk, a->dv);
        a->v = a->k;
        a->v_type = a->k_type;
    }
    SHAPE((!pkv_kv_type_quant(a->k_type) || a->dk % 32 == 0) && (!pkv_kv_type_quant(a->v_type) || a->dv % 32 == 0),
          "quantized K/V need head sizes that are multiples of 32 (dk %d, dv %d)", a->dk, a->dv);
    uint64_t slots = (uint64_t)a->n_pages * (uint64_t)a->page_size * (uint64_t)a->n_kv;
    TRY(arg(k, "q", a->q, (uint64_t)a->n_q * a->n_head * a->dk * 4));
    TRY(arg(k, "k", a->k, slots * pkv_type_row_bytes(a->k_type, (size_t)a->dk)));
    if (!a->v_in_k) TRY(arg(k, "v", a->v, slots * pkv_type_row_bytes(a->v_type, (size_t)a->dv)));
    TRY(arg(k, "out", a->out, (uint64_t)a->n_q * a->n_head * a->dv * 4));
    TRY(arg(k, "meta", a->meta, ((uint64_t)a->n_q * 2 + (uint64_t)a->n_seq + 1 + (uint64_t)a->meta_pages) * 4));
    SHAPE(a->window >= 0, "window %d is negative", a->window);
    SHAPE(a->chunk >= 0, "chunk %d is negative", a->chunk);
    SHAPE(a->softcap >= 0 && a->softcap < INFINITY, "softcap %g must be finite and >= 0", (double)a->softcap);
    if (a->sinks.buf) TRY(arg(k, "sinks", a->sinks, (uint64_t)a->n_head * 4));
    if (a->q_win.buf) TRY(arg(k, "q_win", a->q_win, (uint64_t)a->n_q * 4));
    return PKV_OK;
}

static pkv_status check_softmax(const kctx *k, pkv_k_softmax_args *a) {
    SHAPE(a->n_rows > 0 && a->row_len > 0, "empty shape");
    uint64_t bytes = (uint64_t)a->n_rows * (uint64_t)a->row_len * 4;
    TRY(arg(k, "x", a->x, bytes));
    TRY(arg(k, "y", a->y, bytes));
    return PKV_OK;
}

static pkv_status check_argmax(const kctx *k, pkv_k_argmax_args *a) {
    SHAPE(a->n_rows > 0 && a->row_len > 0, "empty shape");
    TRY(arg(k, "x", a->x, (uint64_t)a->n_rows * (uint64_t)a->row_len * 4));
    TRY(arg(k, "out", a->out, (uint64_t)a->n_rows * 4));
    return PKV_OK;
}

/* ---- recurrent layers: strides of 0 become the packed row size here, so backends
 * always see real strides. */

static pkv_status stride_of(const kctx *k, const char *name, size_t *stride, uint64_t row_bytes) {
    if (*stride == 0) *stride = (size_t)row_bytes;
    if (*stride % 4 || *stride < row_bytes)
        return pkv_err(PKV_ERR_INVALID, "kernel %s on %s: %s stride %zu must be a multiple of 4 and >= a row of %llu bytes",
                       k->kernel, k->dev->caps.name, name, *stride, (unsigned long long)row_bytes);
    return PKV_OK;
}

/* The slot pool and the meta table shared by the recurrent kernels. */
static pkv_status state_args(const kctx *k, pkv_tref state, size_t stride, int64_t n_slots, uint64_t slot_bytes,
                             pkv_tref meta, int n_seq) {
    if (n_slots <= 0 || n_seq <= 0)
        return pkv_err(PKV_ERR_INVALID, "kernel %s on %s: n_slots %lld, n_seq %d must be > 0", k->kernel,
                       k->dev->caps.name, (long long)n_slots, n_seq);
    if (stride % 4 || stride < slot_bytes)
        return pkv_err(PKV_ERR_INVALID,
                       "kernel %s on %s: state stride %zu must be a multiple of 4 and >= a slot of %llu bytes",
                       k->kernel, k->dev->caps.name, stride, (unsigned long long)slot_bytes);
    TRY(arg(k, "state", state, (uint64_t)(n_slots - 1) * stride + slot_bytes));
    return arg(k, "meta", meta, (2 * (uint64_t)n_seq + 1) * 4);
}

static pkv_status check_ssm_conv(const kctx *k, pkv_k_ssm_conv_args *a) {
    SHAPE(a->n_tok > 0 && a->channels > 0, "n_tok %lld, channels %lld", (long long)a->n_tok, (long long)a->channels);
    SHAPE(a->d_conv >= 2 && a->d_conv <= PKV_SSM_CONV_MAX, "d_conv %d must be in [2, %d]", a->d_conv, PKV_SSM_CONV_MAX);
    const uint64_t bytes = (uint64_t)a->n_tok * (uint64_t)a->channels * 4;
    TRY(arg(k, "x", a->x, bytes));
    TRY(arg(k, "w", a->w, (uint64_t)a->channels * (uint64_t)a->d_conv * 4));
    TRY(arg(k, "y", a->y, bytes));
    TRY(state_args(k, a->state, a->state_stride, a->n_slots, (uint64_t)(a->d_conv - 1) * (uint64_t)a->channels * 4,
                   a->meta, a->n_seq));
    return PKV_OK;
}

static pkv_status check_delta_net(const kctx *k, pkv_k_delta_net_args *a) {
    SHAPE(a->n_tok > 0, "n_tok %lld", (long long)a->n_tok);
    SHAPE(a->n_k_heads > 0 && a->n_v_heads > 0 && a->n_v_heads % a->n_k_heads == 0,
          "n_v_heads %d is not a multiple of n_k_heads %d", a->n_v_heads, a->n_k_heads);
    SHAPE(a->d_k > 0 && a->d_v > 0, "head sizes d_k %d, d_v %d", a->d_k, a->d_v);
    SHAPE(isfinite(a->scale), "scale %g must be finite", (double)a->scale);
    const uint64_t qk_row = (uint64_t)a->n_k_heads * (uint64_t)a->d_k * 4, v_row = (uint64_t)a->n_v_heads * (uint64_t)a->d_v * 4;
    TRY(stride_of(k, "q", &a->q_stride, qk_row));
    TRY(stride_of(k, "k", &a->k_stride, qk_row));
    TRY(stride_of(k, "v", &a->v_stride, v_row));
    const uint64_t last = (uint64_t)(a->n_tok - 1);
    TRY(arg(k, "q", a->q, last * a->q_stride + qk_row));
    TRY(arg(k, "k", a->k, last * a->k_stride + qk_row));
    TRY(arg(k, "v", a->v, last * a->v_stride + v_row));
    TRY(arg(k, "g", a->g, (uint64_t)a->n_tok * (uint64_t)a->n_v_heads * 4));
    TRY(arg(k, "beta", a->beta, (uint64_t)a->n_tok * (uint64_t)a->n_v_heads * 4));
    TRY(arg(k, "out", a->out, (uint64_t)a->n_tok * v_row));
    TRY(state_args(k, a->state, a->state_stride, a->n_slots, (uint64_t)a->n_v_heads * (uint64_t)a->d_k * (uint64_t)a->d_v * 4,
                   a->meta, a->n_seq));
    if (a->scale == 0) a->scale = (float)(1.0 / sqrt((double)a->d_k));
    return PKV_OK;
}

static pkv_status check_ssm_scan(const kctx *k, pkv_k_ssm_scan_args *a) {
    SHAPE(a->n_tok > 0, "n_tok %lld", (long long)a->n_tok);
    SHAPE(a->n_head > 0 && a->head_dim > 0 && a->n_group > 0 && a->d_state > 0,
          "n_head %d, head_dim %d, n_group %d, d_state %d must be > 0", a->n_head, a->head_dim, a->n_group, a->d_state);
    SHAPE(a->n_head % a->n_group == 0, "n_head %d is not a multiple of n_group %d", a->n_head, a->n_group);
    const uint64_t x_row = (uint64_t)a->n_head * (uint64_t)a->head_dim * 4, bc_row = (uint64_t)a->n_group * (uint64_t)a->d_state * 4;
    TRY(stride_of(k, "x", &a->x_stride, x_row));
    TRY(stride_of(k, "B", &a->B_stride, bc_row));
    TRY(stride_of(k, "C", &a->C_stride, bc_row));
    const uint64_t last = (uint64_t)(a->n_tok - 1), heads = (uint64_t)a->n_head * 4;
    TRY(arg(k, "x", a->x, last * a->x_stride + x_row));
    TRY(arg(k, "B", a->B, last * a->B_stride + bc_row));
    TRY(arg(k, "C", a->C, last * a->C_stride + bc_row));
    TRY(arg(k, "dt", a->dt, (uint64_t)a->n_tok * heads));
    TRY(arg(k, "dt_bias", a->dt_bias, heads));
    TRY(arg(k, "A", a->A, heads));
    if (a->D.buf) TRY(arg(k, "D", a->D, heads));
    TRY(arg(k, "y", a->y, (uint64_t)a->n_tok * x_row));
    return state_args(k, a->state, a->state_stride, a->n_slots, x_row * (uint64_t)a->d_state, a->meta, a->n_seq);
}

static pkv_status check_l2_norm(const kctx *k, pkv_k_l2_norm_args *a) {
    SHAPE(a->n > 0 && a->n_heads > 0 && a->head_dim > 0, "n %lld, n_heads %lld, head_dim %lld", (long long)a->n,
          (long long)a->n_heads, (long long)a->head_dim);
    SHAPE(a->eps >= 0 && a->eps < INFINITY, "eps %g must be finite and >= 0", (double)a->eps);
    const uint64_t row = (uint64_t)a->n_heads * (uint64_t)a->head_dim * 4;
    TRY(stride_of(k, "x", &a->x_stride, row));
    TRY(stride_of(k, "y", &a->y_stride, row));
    TRY(arg(k, "x", a->x, (uint64_t)(a->n - 1) * a->x_stride + row));
    TRY(arg(k, "y", a->y, (uint64_t)(a->n - 1) * a->y_stride + row));
    return PKV_OK;
}

static pkv_status check_unary(const kctx *k, pkv_k_unary_args *a) {
    SHAPE(a->n > 0, "n %lld", (long long)a->n);
    SHAPE(a->op >= PKV_UNARY_ID && a->op <= PKV_UNARY_LAST, "unknown op %d", (int)a->op);
    TRY(arg(k, "x", a->x, (uint64_t)a->n * 4));
    TRY(arg(k, "y", a->y, (uint64_t)a->n * 4));
    if (a->bias.buf) {
        SHAPE(a->bias_len > 0 && a->n % a->bias_len == 0, "n %lld is not a multiple of bias_len %lld", (long long)a->n,
              (long long)a->bias_len);
        TRY(arg(k, "bias", a->bias, (uint64_t)a->bias_len * 4));
    }
    if (a->mul.buf) {
        SHAPE(a->mul_len > 0 && a->n % a->mul_len == 0, "n %lld is not a multiple of mul_len %lld", (long long)a->n,
              (long long)a->mul_len);
        TRY(arg(k, "mul", a->mul, (uint64_t)a->mul_len * 4));
    }
    return PKV_OK;
}

static pkv_status check_moe_route(const kctx *k, pkv_k_moe_route_args *a) {
    SHAPE(a->n > 0, "n %lld", (long long)a->n);
    SHAPE(a->n_expert >= 1 && a->n_expert <= 4096, "n_expert %d must be in [1, 4096]", a->n_expert);
    SHAPE(a->k >= 1 && a->k <= 64 && a->k <= a->n_expert, "k %d must be in [1, min(64, n_expert %d)]", a->k, a->n_expert);
    SHAPE(a->gating >= 0 && a->gating <= 2, "unknown gating %d", a->gating);
    SHAPE(isfinite(a->w_scale), "w_scale %g", (double)a->w_scale);
    if (a->n_group > 1) {
        const int per = a->n_expert / a->n_group;
        SHAPE(a->n_group <= 64 && a->n_expert % a->n_group == 0 && per >= 2,
              "n_group %d must be at most 64 and divide the %d experts into groups of 2 or more", a->n_group, a->n_expert);
        SHAPE(a->n_group_used >= 1 && a->n_group_used <= a->n_group && a->n_group_used * per >= a->k,
              "n_group_used %d must be in [1, %d] and hold the k %d", a->n_group_used, a->n_group, a->k);
    }
    TRY(arg(k, "logits", a->logits, (uint64_t)a->n * (uint64_t)a->n_expert * 4));
    if (a->bias.buf) TRY(arg(k, "bias", a->bias, (uint64_t)a->n_expert * 4));
    TRY(arg(k, "sel", a->sel, (uint64_t)a->n * (uint64_t)a->k * 4));
    TRY(arg(k, "w", a->w, (uint64_t)a->n * (uint64_t)a->k * 4));
    return PKV_OK;
}

static pkv_status check_moe_combine(const kctx *k, pkv_k_moe_combine_args *a) {
    SHAPE(a->n > 0 && a->cols > 0 && a->out_rows > 0, "n %lld, cols %lld, out_rows %lld", (long long)a->n,
          (long long)a->cols, (long long)a->out_rows);
    TRY(arg(k, "out", a->out, (uint64_t)a->out_rows * (uint64_t)a->cols * 4));
    TRY(arg(k, "y", a->y, (uint64_t)a->n * (uint64_t)a->cols * 4));
    TRY(arg(k, "rows", a->rows, (uint64_t)a->n * 4));
    TRY(arg(k, "w", a->w, (uint64_t)a->n * 4));
    return PKV_OK;
}

/* pkv_k_<name> for every kernel of the list: the common checks (start), the
 * kernel's own (check_<name>, on a copy that may fill in defaults such as
 * strides of 0), then the backend's slot. */
#define ENTRY(name)                                                                        \
    pkv_status pkv_k_##name(pkv_device *dev, const pkv_k_##name##_args *a) {               \
        kctx k;                                                                            \
        TRY(start(&k, dev, #name, a, SLOT(dev, name)));                                    \
        pkv_k_##name##_args r = *a;                                                        \
        TRY(check_##name(&k, &r));                                                         \
        return dev->ops->kernels->name(dev->ctx, &r);                                      \
    }
PKV_KERNELS(ENTRY)
#undef ENTRY
