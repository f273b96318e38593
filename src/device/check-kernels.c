/* Kernel conformance: every kernel of a device against the plain-C reference
 * (cpu/ref.c) on random inputs of a few shapes, through the public buffer API
 * only, so it runs on any device. Inputs sit at non-zero offsets (4 + 4k bytes)
 * inside larger buffers; the bytes around every output are checked to be
 * untouched. Each kernel (and weight type) reports one row with its worst
 * normalized mean squared error against the tolerance below. A kernel the device
 * does not have (PKV_ERR_UNSUPPORTED) is reported as skipped:
 *
 *   matmul f32/f16/bf16            1e-9   f32 sums in another order
 *   matmul q8_0, q4_0, k-quants,   1e-4   devices may round activations to 8 bits
 *          mxfp4, q4_1, q5_0, q5_1,
 *          i-quants, tq1_0, tq2_0
 *   (matmul errors are normalized by the squared sums of |w*x| terms, not of the
 *   outputs: a dot product whose terms cancel has a tiny result but the same
 *   absolute rounding error, and must not fail for that)
 *   get_rows                       1e-12  dequantization is exact
 *   rms_norm, add, swiglu, softmax 1e-10   (swiglu: silu, gelu and gpt-oss's clamped form)
 *   rope f32 / f16                 1e-8 / 1e-6   angles may be computed in f32; also with
 *                                                YaRN and with partial RoPE (pkv_rope_partial:
 *                                                Gemma 4's full layers), each its own row,
 *                                                q8_0/q4_0 too
 *   set_rows f32 / f16             0 / 1e-7      f16 rounding may differ by an ulp
 *   attention (f32 or f16 KV)      1e-8
 *   argmax                         exact indices
 *   ssm_conv, l2_norm, unary       1e-10  (conv: several sequences and slots, in place, a bad slot;
 *                                         unary: also gelu (tanh form) and gelu_erf)
 *   layer_norm                     1e-10  with and without weight and bias, in place, rows
 *                                         with a large common offset (mean >> spread)
 *   delta_net                      1e-9   f32 state and sums; several sequences of different
 *                                         lengths, strided q/k/v, tiled and grouped heads, a bad slot
 *   ssm_scan                       1e-9   f32 state and sums; several sequences of different
 *                                         lengths, strided x/B/C from one row, 1 and several
 *                                         groups, with and without D, a bad slot
 *   moe_route                      exact experts, weights 1e-10 (f32 against the double
 *                                         reference): softmax, the chosen's softmax, sigmoid with
 *                                         a bias, groups, norm and scale, a choice on the logits
 *   moe_combine                    1e-12  added and stored, rows out of range skipped
 */
#include "base/base.h"
#include "base/quant.h"
#include "device/device.h"
#include "device/cpu/ref.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define GUARD 0xA5
#define MAX_BUFS 12

typedef struct {
    pkv_buffer *buf;
    size_t off, size;
} dbuf;

typedef struct {
    pkv_device *dev;
    pkv_check_report_fn report;
    void *user;
    uint64_t rng;
    bool any_failed;
    /* the row being built */
    pkv_check_result row;
    char test[96];
    double tol, worst, t0;
    bool row_error; /* first failure already in detail */
    /* buffers of the current case */
    dbuf bufs[MAX_BUFS];
    int n_bufs;
} ck;

static uint64_t rnd(ck *k) {
    uint64_t z = (k->rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static float rndf(ck *k) { return (float)((double)(rnd(k) >> 11) / 9007199254740992.0 * 2.0 - 1.0); }
static void fill_rand(ck *k, float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = rndf(k) * scale;
}

static void row_begin(ck *k, const char *fmt, const char *arg, double tol) {
    memset(&k->row, 0, sizeof k->row);
    snprintf(k->test, sizeof k->test, fmt, arg);
    k->row.device = pkv_device_name(k->dev);
    k->row.test = k->test;
    k->row.passed = true;
    k->tol = tol;
    k->worst = 0;
    k->row_error = false;
    k->t0 = pkv_time_now();
}

static void row_fail(ck *k, const char *fmt, const char *a, const char *b) {
    k->row.passed = false;
    if (!k->row_error) snprintf(k->row.detail, sizeof k->row.detail, fmt, a, b);
    k->row_error = true;
}

/* One case's error against the tolerance. */
static void row_case(ck *k, const char *what, double err) {
    k->row.count++;
    if (!(err <= k->tol)) {
        char e[64];
        snprintf(e, sizeof e, "%.3g > %.3g", err, k->tol);
        row_fail(k, "%s: nmse %s", what, e);
    }
    if (!(err <= k->worst)) k->worst = err; /* NaN sticks */
}

static void row_end(ck *k) {
    k->row.seconds = pkv_time_now() - k->t0;
    if (!k->row_error && !k->row.skipped && !k->row.detail[0])
        snprintf(k->row.detail, sizeof k->row.detail, "nmse %.2g <= %.2g (%ld cases)", k->worst, k->tol, k->row.count);
    if (!k->row.passed) k->any_failed = true;
    if (k->report) k->report(&k->row, k->user);
}

static void bufs_free(ck *k) {
    for (int i = 0; i < k->n_bufs; i++) pkv_buffer_free(k->bufs[i].buf);
    k->n_bufs = 0;
}

/* A device region of n bytes at a random offset 4 + 4j inside a buffer whose
 * other bytes are GUARD; data (if not NULL) written into the region. */
static pkv_status put(ck *k, dbuf **out, const void *data, size_t n) {
    if (k->n_bufs == MAX_BUFS) return pkv_err(PKV_ERR_INTERNAL, "check kernels: too many buffers in one case");
    dbuf *b = &k->bufs[k->n_bufs];
    b->off = 4 + 4 * (size_t)(rnd(k) % 8);
    b->size = n;
    const size_t total = b->off + n + 8 + 4 * (size_t)(rnd(k) % 4);
    b->buf = pkv_buffer_alloc(k->dev, total);
    if (!b->buf) return pkv_err_prefix(PKV_ERR_NOMEM, "check kernels on %s", pkv_device_name(k->dev));
    k->n_bufs++;
    pkv_status s = pkv_buffer_fill(b->buf, 0, total, GUARD);
    if (!s && data && n) s = pkv_buffer_write(b->buf, b->off, data, n);
    if (s) return s;
    *out = b;
    return PKV_OK;
}

static pkv_tref tr(const dbuf *b) { return pkv_tref_make(b->buf, b->off); }

/* Read the region back into out, at its offset as any user would, and check
 * that the bytes around it are intact. */
static pkv_status get(ck *k, const dbuf *b, void *out, bool *guard_ok) {
    const size_t total = pkv_buffer_size(b->buf), tail = total - b->off - b->size;
    uint8_t *around = pkv_malloc(b->off + tail);
    if (!around) return pkv_err(PKV_ERR_NOMEM, "check kernels: no host memory");
    pkv_status s = pkv_buffer_read(b->buf, b->off, out, b->size);
    if (!s) s = pkv_buffer_read(b->buf, 0, around, b->off);
    if (!s) s = pkv_buffer_read(b->buf, b->off + b->size, around + b->off, tail);
    for (size_t i = 0; !s && i < b->off + tail; i++)
        if (around[i] != GUARD) {
            *guard_ok = false;
            break;
        }
    pkv_free(around);
    (void)k;
    return s;
}

/* Squared error over the squared reference; den_override > 0 replaces the
 * denominator (matmul: the squared sums of |w·x| terms, the scale rounding
 * errors of a dot product grow with, even when its terms cancel). */
static double nmse_den(const float *ref, const float *got, size_t n, double den_override) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = (double)ref[i] - (double)got[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    if (den_override > 0) den = den_override;
    return den > 0 ? num / den : num;
}

static double nmse(const float *ref, const float *got, size_t n) { return nmse_den(ref, got, n, 0); }

/* After a kernel call: a device error ends the row (unsupported: skipped). */
static bool kernel_ok(ck *k, pkv_status s, const char *what) {
    if (!s) return true;
    if (s == PKV_ERR_UNSUPPORTED && k->row.count == 0) {
        k->row.skipped = true;
        snprintf(k->row.detail, sizeof k->row.detail, "%s", pkv_errmsg());
    } else {
        row_fail(k, "%s: %s", what, pkv_errmsg());
    }
    return false;
}

/* Compare float output region b (n floats) with ref; records the case. den: see nmse_den. */
static pkv_status compare_f32_den(ck *k, const dbuf *b, const float *ref, size_t n, const char *what, double den) {
    float *got = pkv_malloc(n * sizeof(float) + 1);
    if (!got) return pkv_err(PKV_ERR_NOMEM, "check kernels: no host memory");
    bool guard = true;
    pkv_status s = get(k, b, got, &guard);
    if (!s) {
        row_case(k, what, nmse_den(ref, got, n, den));
        if (!guard) row_fail(k, "%s: %s", what, "wrote outside its output region");
    }
    pkv_free(got);
    return s;
}

static pkv_status compare_f32(ck *k, const dbuf *b, const float *ref, size_t n, const char *what) {
    return compare_f32_den(k, b, ref, n, what, 0);
}

#define TRY(x)                                                                             \
    do {                                                                                   \
        pkv_status _s = (x);                                                               \
        if (_s) goto done;                                                                 \
    } while (0)

/* ------------------------------------------------------------------ matmul */

/* The "wrapped" matmul rows: the weights once in a device buffer (the plain
 * layout) and once as host memory the device wraps (pkv_buffer_wrap_host, as a
 * mapped GGUF file is; the CPU repacks q4_k weights there, cpu-repack.c). Runs
 * the plain case, keeps its output in *plain and points a->w at the wrapped
 * copy; same_bits then requires the wrapped case's output bit for bit. */
static pkv_status wrap_weights(ck *k, pkv_k_matmul_args *a, const uint8_t *wq, size_t n, const dbuf *by,
                               float **plain) {
    bool guard = true;
    pkv_status s = pkv_k_matmul(k->dev, a);
    if (!s) s = pkv_device_sync(k->dev);
    *plain = s ? NULL : pkv_malloc(by->size + 1);
    if (!s && !*plain) s = pkv_err(PKV_ERR_NOMEM, "check kernels: no host memory");
    if (!s) s = get(k, by, *plain, &guard);
    if (s) return s;
    if (k->n_bufs == MAX_BUFS) return pkv_err(PKV_ERR_INTERNAL, "check kernels: too many buffers in one case");
    dbuf *b = &k->bufs[k->n_bufs];
    b->buf = pkv_buffer_wrap_host(k->dev, wq, n);
    if (!b->buf) return PKV_ERR_UNSUPPORTED;
    b->off = 0;
    b->size = n;
    k->n_bufs++;
    a->w = pkv_tref_make(b->buf, 0);
    return PKV_OK;
}

static pkv_status same_bits(ck *k, const dbuf *by, const float *plain, const char *what) {
    bool guard = true;
    float *got = pkv_malloc(by->size + 1);
    if (!got) return pkv_err(PKV_ERR_NOMEM, "check kernels: no host memory");
    pkv_status s = get(k, by, got, &guard);
    if (!s && memcmp(got, plain, by->size) != 0) row_fail(k, "%s: %s", what, "differs from the plain layout's bits");
    pkv_free(got);
    return s;
}

static pkv_status check_matmul(ck *k, pkv_type t, bool wrapped) {
    static const int64_t shapes[][3] = {{1, 32, 1},  {7, 64, 1},   {33, 96, 3},  {5, 13, 2},   {3, 1, 1},
                                        {19, 256, 1}, {64, 512, 5}, {17, 768, 17}, {9, 256, 40}, {4, 4096, 70}, {6, 77, 9}};
    const bool quantized = pkv_type_block_elems(t) > 1;
    if (wrapped) { /* no row where the device cannot wrap host memory (Vulkan, CUDA) */
        static _Alignas(64) uint8_t probe[64];
        pkv_buffer *pb = pkv_buffer_wrap_host(k->dev, probe, sizeof probe);
        if (!pb) return PKV_OK;
        pkv_buffer_free(pb);
    }
    row_begin(k, wrapped ? "kernel matmul %s, weights wrapped" : "kernel matmul %s", pkv_type_name(t),
              quantized ? 1e-4 : 1e-9);
    pkv_status s = PKV_OK;
    for (size_t si = 0; si < PKV_ARRAY_LEN(shapes) && !k->row_error && !k->row.skipped; si++) {
        const int64_t rows = shapes[si][0], cols = shapes[si][1], n = shapes[si][2];
        const size_t rb = pkv_type_row_bytes(t, (size_t)cols);
        if (rb == 0) continue;
        float *plain = NULL;
        float *wf = pkv_malloc((size_t)(rows * cols + n * cols + 2 * n * rows) * sizeof(float));
        uint8_t *wq = pkv_malloc((size_t)rows * rb);
        if (!wf || !wq) {
            pkv_free(wf);
            pkv_free(wq);
            return pkv_err(PKV_ERR_NOMEM, "check kernels: no host memory");
        }
        float *x = wf + rows * cols, *y = x + n * cols;
        fill_rand(k, wf, (size_t)(rows * cols), 1.0f);
        fill_rand(k, x, (size_t)(n * cols), 1.0f);
        for (int64_t r = 0; r < rows; r++) pkv_quantize_row(t, wf + r * cols, wq + (size_t)r * rb, cols);
        dbuf *bw, *bx, *by;
        TRY(s = put(k, &bw, wq, (size_t)rows * rb));
        TRY(s = put(k, &bx, x, (size_t)(n * cols) * 4));
        TRY(s = put(k, &by, NULL, (size_t)(n * rows) * 4));
        TRY(s = pkv_ref_matmul(wq, t, rows, cols, x, n, y));
        pkv_k_matmul_args a = {tr(bw), t, rows, cols, tr(bx), tr(by), n};
        if (wrapped && (s = wrap_weights(k, &a, wq, (size_t)rows * rb, by, &plain)) == PKV_ERR_UNSUPPORTED) {
            k->row.skipped = true;
            snprintf(k->row.detail, sizeof k->row.detail, "%s has no wrapped host buffers", pkv_device_name(k->dev));
            s = PKV_OK;
            goto done;
        }
        TRY(s);
        if (kernel_ok(k, pkv_k_matmul(k->dev, &a), "matmul")) {
            char what[64];
            snprintf(what, sizeof what, "%lldx%lld n=%lld", (long long)rows, (long long)cols, (long long)n);
            /* denominator: sum over outputs of (sum_c |w_rc x_c|)^2 */
            double den = 0;
            float *wrow = pkv_malloc((size_t)cols * sizeof *wrow);
            if (!wrow) s = pkv_err(PKV_ERR_NOMEM, "check kernels: no host memory");
            for (int64_t r = 0; !s && r < rows; r++) {
                pkv_dequantize_row(t, wq + (size_t)r * rb, wrow, cols);
                for (int64_t j = 0; j < n; j++) {
                    double a1 = 0;
                    for (int64_t c = 0; c < cols; c++) a1 += fabs((double)wrow[c] * x[j * cols + c]);
                    den += a1 * a1;
                }
            }
            pkv_free(wrow);
            if (!s) s = compare_f32_den(k, by, y, (size_t)(n * rows), what, den);
            if (!s && plain) s = same_bits(k, by, plain, what);
        }
    done:
        pkv_free(plain);
        bufs_free(k);
        pkv_free(wf);
        pkv_free(wq);
        if (s) return s;
    }
    row_end(k);
    return PKV_OK;
}

/* ---------------------------------------------------------------- get_rows */

static pkv_status check_get_rows(ck *k, pkv_type t) {
    static const int64_t cols_list[] = {5, 64, 256, 512};
    row_begin(k, "kernel get_rows %s", pkv_type_name(t), 1e-12);
    pkv_status s = PKV_OK;
    for (size_t cv = 0; cv < 2 * PKV_ARRAY_LEN(cols_list) && !k->row_error && !k->row.skipped; cv++) {
        const size_t ci = cv / 2;
        const float scale = cv & 1 ? 11.3f : 0.0f; /* and Gemma's embedding scale */
        const int64_t cols = cols_list[ci], n_vocab = 11, n = 6;
        const size_t rb = pkv_type_row_bytes(t, (size_t)cols);
        if (rb == 0) continue;
        float *wf = pkv_malloc((size_t)(n_vocab * cols + n * cols) * sizeof(float));
        uint8_t *wq = pkv_malloc((size_t)n_vocab * rb);
        if (!wf || !wq) {
            pkv_free(wf);
            pkv_free(wq);
            return pkv_err(PKV_ERR_NOMEM, "check kernels: no host memory");
        }
        float *out = wf + n_vocab * cols;
        fill_rand(k, wf, (size_t)(n_vocab * cols), 2.0f);
        for (int64_t r = 0; r < n_vocab; r++) pkv_quantize_row(t, wf + r * cols, wq + (size_t)r * rb, cols);
        const int32_t ids[6] = {3, 0, 10, 3, -1, 11}; /* repeats and two out of range (zeros) */
        dbuf *bw, *bi, *bo;
        TRY(s = put(k, &bw, wq, (size_t)n_vocab * rb));
        TRY(s = put(k, &bi, ids, sizeof ids));
        TRY(s = put(k, &bo, NULL, (size_t)(n * cols) * 4));
        TRY(s = pkv_ref_get_rows(wq, t, n_vocab, cols, ids, n, out));
        pkv_ref_scale(out, n * cols, scale);
        pkv_k_get_rows_args a = {.w = tr(bw), .wtype = t, .n_vocab = n_vocab, .cols = cols, .ids = tr(bi), .out = tr(bo),
                                 .n = n, .scale = scale};
        if (kernel_ok(k, pkv_k_get_rows(k->dev, &a), "get_rows")) s = compare_f32(k, bo, out, (size_t)(n * cols), "get_rows");
    done:
        bufs_free(k);
        pkv_free(wf);
        pkv_free(wq);
        if (s) return s;
    }
    row_end(k);
    return PKV_OK;
}

/* ------------------------------------------------------ elementwise / rows */

/* Host scratch for the small kernels: up to 4 arrays of n floats. */
static float *scratch(size_t n, int count) { return pkv_calloc((size_t)count * n + 1, sizeof(float)); }

static pkv_status check_rms_norm(ck *k) {
    static const int64_t shapes[][2] = {{1, 7}, {3, 64}, {5, 128}, {2, 1000}};
    row_begin(k, "kernel %s", "rms_norm", 1e-10);
    pkv_status s = PKV_OK;
    for (size_t si = 0; si < 2 * PKV_ARRAY_LEN(shapes) && !k->row_error && !k->row.skipped; si++) {
        const int64_t nr = shapes[si / 2][0], len = shapes[si / 2][1];
        const bool inplace = si & 1;
        const size_t n = (size_t)(nr * len);
        float *h = scratch(n, 3);
        if (!h) return pkv_err(PKV_ERR_NOMEM, "check kernels: no host memory");
        float *x = h, *w = h + n, *y = h + 2 * n;
        fill_rand(k, x, n, 3.0f);
        fill_rand(k, w, (size_t)len, 1.5f);
        pkv_ref_rms_norm(x, w, y, nr, len, 1e-6f);
        dbuf *bx, *bw, *by;
        TRY(s = put(k, &bx, x, n * 4));
        TRY(s = put(k, &bw, w, (size_t)len * 4));
        if (inplace)
            by = bx;
        else
            TRY(s = put(k, &by, NULL, n * 4));
        pkv_k_rms_norm_args a = {tr(bx), tr(bw), tr(by), nr, len, 1e-6f};
        if (kernel_ok(k, pkv_k_rms_norm(k->dev, &a), "rms_norm")) s = compare_f32(k, by, y, n, inplace ? "in place" : "rms_norm");
    done:
        bufs_free(k);
        pkv_free(h);
        if (s) return s;
    }
    row_end(k);
    return PKV_OK;
}

static pkv_status check_layer_norm(ck *k) {
    /* rows, row_len, w/b present (bit 0: w, bit 1: b), mean offset of the rows */
    static const struct { int64_t nr, len; int wb; float off; } shapes[] = {
        {1, 7, 3, 0}, {3, 64, 1, 0}, {5, 128, 0, 0}, {2, 1000, 2, 0}, {4, 384, 3, 50}, {1500, 64, 3, 0}};
    row_begin(k, "kernel %s", "layer_norm", 1e-10);
    pkv_status s = PKV_OK;
    for (size_t si = 0; si < 2 * PKV_ARRAY_LEN(shapes) && !k->row_error && !k->row.skipped; si++) {
        const int64_t nr = shapes[si / 2].nr, len = shapes[si / 2].len;
        const int wb = shapes[si / 2].wb;
        const bool inplace = si & 1;
        const size_t n = (size_t)(nr * len);
        float *h = scratch(n, 2);
        float *wh = scratch((size_t)len, 2);
        if (!h || !wh) {
            pkv_free(h);
            pkv_free(wh);
            return pkv_err(PKV_ERR_NOMEM, "check kernels: no host memory");
        }
        float *x = h, *y = h + n, *w = wh, *b = wh + len;
        fill_rand(k, x, n, 3.0f);
        for (size_t i = 0; i < n; i++) x[i] += shapes[si / 2].off;
        fill_rand(k, w, (size_t)len, 1.5f);
        fill_rand(k, b, (size_t)len, 1.0f);
        pkv_ref_layer_norm(x, (wb & 1) ? w : NULL, (wb & 2) ? b : NULL, y, nr, len, 1e-5f);
        dbuf *bx, *bw = NULL, *bb = NULL, *by;
        TRY(s = put(k, &bx, x, n * 4));
        if (wb & 1) TRY(s = put(k, &bw, w, (size_t)len * 4));
        if (wb & 2) TRY(s = put(k, &bb, b, (size_t)len * 4));
        if (inplace)
            by = bx;
        else
            TRY(s = put(k, &by, NULL, n * 4));
        pkv_k_layer_norm_args a = {.x = tr(bx), .y = tr(by), .n_rows = nr, .row_len = len, .eps = 1e-5f};
        if (bw) a.w = tr(bw);
        if (bb) a.b = tr(bb);
        if (kernel_ok(k, pkv_k_layer_norm(k->dev, &a), "layer_norm"))
            s = compare_f32(k, by, y, n, inplace ? "in place" : "layer_norm");
    done:
        bufs_free(k);
        pkv_free(h);
        pkv_free(wh);
        if (s) return s;
    }
    row_end(k);
    return PKV_OK;
}

static pkv_status check_add(ck *k) {
    static const int64_t shapes[][2] = {{12, 12}, {96, 32}, {7, 1}, {3000, 1000}};
    row_begin(k, "kernel %s", "add", 1e-10);
    pkv_status s = PKV_OK;
    for (size_t si = 0; si < 2 * PKV_ARRAY_LEN(shapes) && !k->row_error && !k->row.skipped; si++) {
        const int64_t n = shapes[si / 2][0], bl = shapes[si / 2][1];
        const bool inplace = si & 1;
        float *h = scratch((size_t)n, 3);
        if (!h) return pkv_err(PKV_ERR_NOMEM, "check kernels: no host memory");
        float *x = h, *b = h + n, *y = h + 2 * n;
        fill_rand(k, x, (size_t)n, 1.0f);
        fill_rand(k, b, (size_t)bl, 1.0f);
        pkv_ref_add(x, b, y, n, bl);
        dbuf *bx, *bb, *by;
        TRY(s = put(k, &bx, x, (size_t)n * 4));
        TRY(s = put(k, &bb, b, (size_t)bl * 4));
        if (inplace)
            by = bx;
        else
            TRY(s = put(k, &by, NULL, (size_t)n * 4));
        pkv_k_add_args a = {tr(bx), tr(bb), tr(by), n, bl};
        if (kernel_ok(k, pkv_k_add(k->dev, &a), "add")) s = compare_f32(k, by, y, (size_t)n, inplace ? "in place" : "add");
    done:
        bufs_free(k);
        pkv_free(h);
        if (s) return s;
    }
    row_end(k);
    return PKV_OK;
}

/* gelu: the tanh form of GeGLU; oai: gpt-oss's clamped SwiGLU (alpha 1.702, limit 7),
 * with inputs past the limit both ways so that every clamp is taken. */
static pkv_status check_swiglu(ck *k, bool gelu, bool oai) {
    static const int64_t sizes[] = {1, 37, 1000, 70000};
    row_begin(k, "kernel %s", oai ? "swiglu_oai (gpt-oss, alpha 1.702, limit 7)" : gelu ? "geglu (gelu, tanh form)" : "swiglu",
              1e-10);
    pkv_status s = PKV_OK;
    for (size_t si = 0; si < 2 * PKV_ARRAY_LEN(sizes) && !k->row_error && !k->row.skipped; si++) {
        const int64_t n = sizes[si / 2];
        const bool alias = si & 1;
        float *h = scratch((size_t)n, 3);
        if (!h) return pkv_err(PKV_ERR_NOMEM, "check kernels: no host memory");
        float *g = h, *u = h + n, *y = h + 2 * n;
        fill_rand(k, g, (size_t)n, oai ? 12.0f : 6.0f);
        fill_rand(k, u, (size_t)n, oai ? 12.0f : 2.0f);
        if (oai)
            pkv_ref_swiglu_oai(g, u, y, n, 1.702f, 7.0f);
        else
            pkv_ref_glu(g, u, y, n, gelu);
        dbuf *bg, *bu, *by;
        TRY(s = put(k, &bg, g, (size_t)n * 4));
        TRY(s = put(k, &bu, u, (size_t)n * 4));
        if (alias)
            by = bg;
        else
            TRY(s = put(k, &by, NULL, (size_t)n * 4));
        pkv_k_swiglu_args a = {.g = tr(bg), .u = tr(bu), .y = tr(by), .n = n, .gelu = gelu, .oai = oai, .alpha = 1.702f,
                               .limit = 7.0f};
        if (kernel_ok(k, pkv_k_swiglu(k->dev, &a), "swiglu")) s = compare_f32(k, by, y, (size_t)n, alias ? "y = g" : "swiglu");
    done:
        bufs_free(k);
        pkv_free(h);
        if (s) return s;
    }
    row_end(k);
    return PKV_OK;
}

static pkv_status check_softmax(ck *k) {
    static const int64_t shapes[][2] = {{1, 1}, {3, 17}, {2, 1000}, {4, 5000}};
    row_begin(k, "kernel %s", "softmax", 1e-10);
    pkv_status s = PKV_OK;
    for (size_t si = 0; si < 2 * PKV_ARRAY_LEN(shapes) && !k->row_error && !k->row.skipped; si++) {
        const int64_t nr = shapes[si / 2][0], len = shapes[si / 2][1];
        const bool inplace = si & 1;
        const size_t n = (size_t)(nr * len);
        float *h = scratch(n, 2);
        if (!h) return pkv_err(PKV_ERR_NOMEM, "check kernels: no host memory");
        float *x = h, *y = h + n;
        fill_rand(k, x, n, 10.0f);
        pkv_ref_softmax(x, y, nr, len);
        dbuf *bx, *by;
        TRY(s = put(k, &bx, x, n * 4));
        if (inplace)
            by = bx;
        else
            TRY(s = put(k, &by, NULL, n * 4));
        pkv_k_softmax_args a = {tr(bx), tr(by), nr, len};
        if (kernel_ok(k, pkv_k_softmax(k->dev, &a), "softmax")) s = compare_f32(k, by, y, n, inplace ? "in place" : "softmax");
    done:
        bufs_free(k);
        pkv_free(h);
        if (s) return s;
    }
    row_end(k);
    return PKV_OK;
}

static pkv_status check_argmax(ck *k) {
    static const int64_t shapes[][2] = {{1, 1}, {4, 33}, {3, 50000}};
    row_begin(k, "kernel %s", "argmax", 0);
    pkv_status s = PKV_OK;
    for (size_t si = 0; si < PKV_ARRAY_LEN(shapes) && !k->row_error && !k->row.skipped; si++) {
        const int64_t nr = shapes[si][0], len = shapes[si][1];
        const size_t n = (size_t)(nr * len);
        float *x = scratch(n, 1);
        int32_t ref[4], got[4];
        if (!x) return pkv_err(PKV_ERR_NOMEM, "check kernels: no host memory");
        fill_rand(k, x, n, 1.0f);
        if (len > 2) { /* row 0: a tie between two maxima, the first must win */
            x[len / 3] = 5.0f;
            x[len - 1] = 5.0f;
        }
        pkv_ref_argmax(x, ref, nr, len);
        dbuf *bx, *bo;
        TRY(s = put(k, &bx, x, n * 4));
        TRY(s = put(k, &bo, NULL, (size_t)nr * 4));
        pkv_k_argmax_args a = {tr(bx), tr(bo), nr, len};
        if (kernel_ok(k, pkv_k_argmax(k->dev, &a), "argmax")) {
            bool guard = true;
            TRY(s = get(k, bo, got, &guard));
            k->row.count++;
            for (int64_t r = 0; r < nr; r++)
                if (got[r] != ref[r]) {
                    char e[64];
                    snprintf(e, sizeof e, "row %lld: %d, want %d", (long long)r, got[r], ref[r]);
                    row_fail(k, "%s: %s", "argmax", e);
                    break;
                }
            if (!guard) row_fail(k, "%s: %s", "argmax", "wrote outside its output region");
        }
    done:
        bufs_free(k);
        pkv_free(x);
        if (s) return s;
    }
    if (!k->row_error && !k->row.skipped)
        snprintf(k->row.detail, sizeof k->row.detail, "indices exact (%ld cases)", k->row.count);
    row_end(k);
    return PKV_OK;
}

/* -------------------------------------------------------------------- rope */

/* The angles of a rope row: plain (ROPE_PLAIN); YaRN (ROPE_YARN): linear factor 4
 * over an original context of 256, beta 32 / 1 (the correction range from
 * pkv_rope_yarn_corr_dims for the case's n_rot and base), ext_factor 1, and YaRN's
 * magnitude factor 1 + 0.1 ln 4 on every other case (none on the others, as the
 * shift's re-rotation passes); partial (ROPE_PARTIAL): the first quarter of the pairs
 * turn, or one pair (pkv_rope_partial, Gemma 4's proportional RoPE), at the case's
 * scale; frequency factors (ROPE_FF): LongRoPE's per-pair factors in [1, 60) at the
 * case's scale, and on every other case with YaRN's mix. */
enum { ROPE_PLAIN, ROPE_YARN, ROPE_PARTIAL, ROPE_FF };
static const char *const k_rope_row[] = {"kernel rope %s", "kernel rope %s yarn", "kernel rope %s partial",
                                         "kernel rope %s ff"};

static void rope_mode(pkv_k_rope_args *a, int mode, size_t ci) {
    if (mode == ROPE_PARTIAL) {
        pkv_rope_partial(a, a->n_rot / 8 > 0 ? a->n_rot / 8 : 1);
        return;
    }
    if (mode != ROPE_YARN) return;
    a->freq_scale = 0.25f;
    a->ext_factor = 1.0f;
    float dims[2];
    pkv_rope_yarn_corr_dims(a->n_rot, 256, a->freq_base, 32.0f, 1.0f, dims);
    a->corr_lo = dims[0];
    a->corr_hi = dims[1];
    a->mscale = ci % 2 ? 0.0f : 1.0f + 0.1f * logf(4.0f);
}

static pkv_status check_rope(ck *k, pkv_type dt, int mode) {
    typedef struct {
        int n_rows, max_rows, n_heads, head_dim, n_rot, extra; /* extra: padding elements per row */
        bool neox, list;
        float base, scale;
    } rcase;
    static const rcase cases[] = {
        {3, 3, 2, 8, 8, 0, false, false, 10000.0f, 1.0f},
        {5, 5, 4, 16, 16, 0, true, false, 1000000.0f, 1.0f},
        {4, 9, 3, 32, 16, 3, false, true, 10000.0f, 0.5f},
        {6, 11, 2, 64, 40, 0, true, true, 500000.0f, 1.0f},
        {1, 1, 8, 128, 128, 0, true, false, 10000.0f, 1.0f},
    };
    const size_t es = dt == PKV_TYPE_F32 ? 4 : 2;
    row_begin(k, k_rope_row[mode], pkv_type_name(dt), dt == PKV_TYPE_F32 ? 1e-8 : 1e-6);
    pkv_status s = PKV_OK;
    for (size_t ci = 0; ci < PKV_ARRAY_LEN(cases) && !k->row_error && !k->row.skipped; ci++) {
        const rcase *c = &cases[ci];
        const size_t row_elems = (size_t)c->n_heads * c->head_dim + (size_t)c->extra;
        const size_t stride = row_elems * es, n_el = (size_t)c->max_rows * row_elems;
        float *h = scratch(n_el, 3);
        int32_t pos[16], rows[16];
        if (!h) return pkv_err(PKV_ERR_NOMEM, "check kernels: no host memory");
        float *xf = h, *ref = h + n_el, *got = h + 2 * n_el;
        uint8_t *xb = (uint8_t *)(void *)ref, *gb = (uint8_t *)(void *)got; /* raw bytes (f16 or f32) */
        fill_rand(k, xf, n_el, 2.0f);
        for (size_t i = 0; i < n_el; i++) {
            if (dt == PKV_TYPE_F32) {
                memcpy(xb + 4 * i, &xf[i], 4);
            } else {
                const uint16_t hv = pkv_f32_to_f16(xf[i]);
                memcpy(xb + 2 * i, &hv, 2);
            }
        }
        for (int r = 0; r < c->n_rows; r++) {
            pos[r] = (int32_t)(rnd(k) % 1000);
            rows[r] = r; /* a permuted subset of the rows when c->list */
        }
        if (c->list)
            for (int r = 0; r < c->n_rows; r++) rows[r] = (int32_t)((r * 7 + 2) % c->max_rows);
        if (ci == 0) pos[0] = 0;
        dbuf *bx, *bp, *brw = NULL;
        TRY(s = put(k, &bx, xb, n_el * es));
        TRY(s = put(k, &bp, pos, (size_t)c->n_rows * 4));
        if (c->list) TRY(s = put(k, &brw, rows, (size_t)c->n_rows * 4));
        pkv_k_rope_args a = {.x = tr(bx), .dtype = dt, .n_rows = c->n_rows, .max_rows = c->max_rows, .row_stride = stride,
                             .n_heads = c->n_heads, .head_dim = c->head_dim, .n_rot = c->n_rot, .neox = c->neox,
                             .freq_base = c->base, .freq_scale = c->scale, .pos = tr(bp),
                             .rows = brw ? tr(brw) : pkv_tref_make(NULL, 0)};
        float ff[64];
        rope_mode(&a, mode == ROPE_FF && ci % 2 ? ROPE_YARN : mode, ci);
        if (mode == ROPE_FF) {
            dbuf *bff;
            for (int i = 0; i < c->n_rot / 2; i++) ff[i] = 1.0f + (float)(rnd(k) % 5900) / 100.0f;
            TRY(s = put(k, &bff, ff, (size_t)(c->n_rot / 2) * 4));
            a.ff = tr(bff);
        }
        pkv_ref_rope(&a, xb, pos, c->list ? rows : NULL, mode == ROPE_FF ? ff : NULL);
        if (kernel_ok(k, pkv_k_rope(k->dev, &a), "rope")) {
            bool guard = true;
            TRY(s = get(k, bx, gb, &guard));
            /* compare all rows, rotated or not, as floats */
            float *rf = xf; /* reuse: reference values as f32 */
            float *gf = pkv_malloc(n_el * sizeof(float));
            if (!gf) {
                s = pkv_err(PKV_ERR_NOMEM, "check kernels: no host memory");
                goto done;
            }
            for (size_t i = 0; i < n_el; i++) {
                if (dt == PKV_TYPE_F32) {
                    memcpy(&rf[i], xb + 4 * i, 4);
                    memcpy(&gf[i], gb + 4 * i, 4);
                } else {
                    uint16_t h0, h1;
                    memcpy(&h0, xb + 2 * i, 2);
                    memcpy(&h1, gb + 2 * i, 2);
                    rf[i] = pkv_f16_to_f32(h0);
                    gf[i] = pkv_f16_to_f32(h1);
                }
            }
            char what[64];
            snprintf(what, sizeof what, "%s n_rot %d/%d%s", c->neox ? "neox" : "normal", c->n_rot, c->head_dim,
                     c->list ? " row list" : "");
            row_case(k, what, nmse(rf, gf, n_el));
            if (!guard) row_fail(k, "%s: %s", "rope", "wrote outside its rows");
            pkv_free(gf);
        }
    done:
        bufs_free(k);
        pkv_free(h);
        if (s) return s;
    }
    row_end(k);
    return PKV_OK;
}

/* ---------------------------------------------------------------- set_rows */

static pkv_status check_set_rows(ck *k, pkv_type dt) {
    static const int64_t shapes[][4] = {/* n, row_elems, dst_rows, padding elements */
                                        {1, 8, 1, 0},
                                        {3, 24, 11, 5},
                                        {16, 128, 41, 0},
                                        {7, 33, 9, 3}};
    const size_t es = dt == PKV_TYPE_F32 ? 4 : 2;
    row_begin(k, "kernel set_rows %s", pkv_type_name(dt), dt == PKV_TYPE_F32 ? 0 : 1e-7);
    pkv_status s = PKV_OK;
    for (size_t si = 0; si < PKV_ARRAY_LEN(shapes) && !k->row_error && !k->row.skipped; si++) {
        const int64_t n = shapes[si][0], re = shapes[si][1], dr = shapes[si][2], pad = shapes[si][3];
        const size_t src_stride = (size_t)(re + pad) * 4, dst_stride = (size_t)(re + pad) * es;
        const size_t src_el = (size_t)(n * (re + pad)), dst_el = (size_t)(dr * (re + pad));
        float *h = scratch(src_el + 3 * dst_el, 1);
        int32_t idx[64];
        if (!h) return pkv_err(PKV_ERR_NOMEM, "check kernels: no host memory");
        float *src = h, *ref = h + src_el, *got = ref + dst_el, *tmp = got + dst_el;
        uint8_t *rb = (uint8_t *)(void *)ref, *gb = (uint8_t *)(void *)got;
        fill_rand(k, src, src_el, 4.0f);
        fill_rand(k, tmp, dst_el, 1.0f); /* old contents the kernel must keep elsewhere */
        for (size_t i = 0; i < dst_el; i++) {
            if (dt == PKV_TYPE_F32) {
                memcpy(rb + 4 * i, &tmp[i], 4);
            } else {
                const uint16_t hv = pkv_f32_to_f16(tmp[i]);
                memcpy(rb + 2 * i, &hv, 2);
            }
        }
        for (int64_t i = 0; i < n; i++) idx[i] = (int32_t)((i * 5 + 3) % dr); /* distinct: n <= dr, 5 coprime with dr */
        dbuf *bs, *bd, *bi;
        TRY(s = put(k, &bs, src, src_el * 4));
        TRY(s = put(k, &bd, rb, dst_el * es));
        TRY(s = put(k, &bi, idx, (size_t)n * 4));
        pkv_k_set_rows_args a = {tr(bs), src_stride, tr(bd), dt, dst_stride, dr, tr(bi), n, re};
        pkv_ref_set_rows(&a, src, rb, idx);
        if (kernel_ok(k, pkv_k_set_rows(k->dev, &a), "set_rows")) {
            bool guard = true;
            TRY(s = get(k, bd, gb, &guard));
            for (size_t i = dst_el; i-- > 0;) { /* widen in place, back to front */
                if (dt == PKV_TYPE_F16) {
                    uint16_t h0, h1;
                    memcpy(&h0, rb + 2 * i, 2);
                    memcpy(&h1, gb + 2 * i, 2);
                    ref[i] = pkv_f16_to_f32(h0);
                    got[i] = pkv_f16_to_f32(h1);
                }
            }
            row_case(k, "set_rows", nmse(ref, got, dst_el));
            if (!guard) row_fail(k, "%s: %s", "set_rows", "wrote outside its destination");
        }
    done:
        bufs_free(k);
        pkv_free(h);
        if (s) return s;
    }
    row_end(k);
    return PKV_OK;
}

/* --------------------------------------------------------------- attention */

/* n rows of d floats as KV type t (rows of pkv_type_row_bytes(t, d) bytes). */
static void kv_encode(pkv_type t, const float *x, size_t n, int d, uint8_t *out) {
    const size_t rb = pkv_type_row_bytes(t, (size_t)d);
    for (size_t r = 0; r < n; r++) {
        if (pkv_kv_type_quant(t)) {
            pkv_quantize_row(t, x + r * (size_t)d, out + r * rb, d);
            continue;
        }
        for (int i = 0; i < d; i++) {
            const float f = x[r * (size_t)d + (size_t)i];
            if (t == PKV_TYPE_F32) {
                memcpy(out + r * rb + 4 * (size_t)i, &f, 4);
            } else {
                const uint16_t hv = pkv_f32_to_f16(f);
                memcpy(out + r * rb + 2 * (size_t)i, &hv, 2);
            }
        }
    }
}

/* n rows of d elements of KV type t back to floats. */
static void kv_decode(pkv_type t, const uint8_t *in, size_t n, int d, float *x) {
    const size_t rb = pkv_type_row_bytes(t, (size_t)d);
    for (size_t r = 0; r < n; r++) {
        if (pkv_kv_type_quant(t)) {
            pkv_dequantize_row(t, in + r * rb, x + r * (size_t)d, d);
            continue;
        }
        for (int i = 0; i < d; i++) {
            float f;
            if (t == PKV_TYPE_F32) {
                memcpy(&f, in + r * rb + 4 * (size_t)i, 4);
            } else {
                uint16_t hv;
                memcpy(&hv, in + r * rb + 2 * (size_t)i, 2);
                f = pkv_f16_to_f32(hv);
            }
            x[r * (size_t)d + (size_t)i] = f;
        }
    }
}

/* Both read the same K/V bytes as the reference, so the bound is the f32
 * arithmetic's, whatever the KV types. opts: the attention kinds' constants, each
 * case run with a sliding window (3 tokens: inside pages, across them, or more
 * than a query sees), a soft-cap (2, below the scores), sinks, and all three. */
static pkv_status check_attention(ck *k, pkv_type kt, pkv_type vt, bool opts, bool v_in_k) {
    typedef struct {
        int n_head, n_kv, dk, dv, page_size, n_pages, n_seq, n_q;
        int q_seq[8], q_len[8];
        int indptr[5];
        int pages[12];
    } acase;
    static const acase cases[] = {
        /* two sequences sharing page 3 (a fork), prefill-like causal limits */
        {4, 2, 16, 16, 4, 10, 2, 5, {0, 0, 0, 1, 1}, {3, 4, 6, 9, 12}, {0, 2, 5}, {3, 1, 3, 5, 2}},
        /* decode: three sequences, dk != dv, a page id out of range (skipped) */
        {8, 2, 64, 32, 16, 6, 3, 3, {2, 0, 1}, {33, 17, 30}, {0, 2, 4, 7}, {5, 0, 1, 4, 2, 99, 3}},
        /* plain multi-head, one-token pages */
        {3, 3, 8, 8, 1, 9, 1, 2, {0, 0}, {1, 9}, {0, 9}, {8, 7, 6, 5, 4, 3, 2, 1, 0}},
        /* GQA 4:1 with a long page */
        {4, 1, 128, 128, 64, 3, 2, 2, {1, 0}, {100, 64}, {0, 1, 3}, {2, 0, 1}},
        /* long decode of few heads (a GPU splits its tokens over blocks), 2000 of 2048 tokens */
        {2, 1, 64, 64, 256, 10, 1, 1, {0}, {2000}, {0, 8}, {9, 1, 2, 3, 4, 5, 6, 7}},
        /* MLA-like: 16 heads over one KV head, V narrower than K (with v_in_k: the head of K) */
        {16, 1, 96, 64, 16, 6, 2, 3, {0, 1, 1}, {20, 5, 31}, {0, 2, 4}, {4, 1, 0, 2}},
        /* DeepSeek-V2/V3's latent row: K 512 + 64 rotary dims, V its first 512 */
        {4, 1, 576, 512, 8, 5, 1, 2, {0, 0}, {9, 30}, {0, 4}, {3, 0, 4, 1}},
    };
    char name[64];
    char types[24];
    snprintf(types, sizeof types, kt == vt ? "%s" : "K %s V %s", pkv_type_name(kt), pkv_type_name(vt));
    snprintf(name, sizeof name, "%s%s%s", types, opts ? " window/softcap/sinks" : "", v_in_k ? " v_in_k" : "");
    row_begin(k, "kernel attention %s", name, 1e-8);
    pkv_status s = PKV_OK;
    /* the stream the later rows get: where it stood before the chunk variants (5, 6),
     * so that adding them changed no other row's inputs */
    uint64_t rng_rest = 0;
    bool rest_saved = false;
    for (size_t cv = 0; cv < PKV_ARRAY_LEN(cases) * (opts ? 7 : 1) && !k->row_error && !k->row.skipped; cv++) {
        const size_t ci = cv % PKV_ARRAY_LEN(cases), variant = opts ? 1 + cv / PKV_ARRAY_LEN(cases) : 0;
        if (variant >= 5 && !rest_saved) {
            rng_rest = k->rng;
            rest_saved = true;
        }
        const acase *c = &cases[ci];
        const size_t nq = (size_t)c->n_q * c->n_head * c->dk, no = (size_t)c->n_q * c->n_head * c->dv;
        const size_t slots = (size_t)c->n_pages * c->page_size * c->n_kv;
        const size_t nk = slots * c->dk, nv = slots * c->dv;
        const size_t kbytes = slots * pkv_type_row_bytes(kt, (size_t)c->dk), vbytes = slots * pkv_type_row_bytes(vt, (size_t)c->dv);
        if ((pkv_kv_type_quant(kt) && c->dk % 32) || (pkv_kv_type_quant(vt) && c->dv % 32)) continue;
        if (v_in_k && (c->n_kv != 1 || c->dv > c->dk)) continue; /* V read from K: one KV head */
        const int meta_pages = c->indptr[c->n_seq];
        const size_t n_meta = 2 * (size_t)c->n_q + c->n_seq + 1 + (size_t)meta_pages;
        float *h = scratch(nq + no + nk + nv, 1);
        uint8_t *kb = pkv_malloc(kbytes + vbytes + 1);
        int32_t meta[64];
        if (!h || !kb) {
            pkv_free(h);
            pkv_free(kb);
            return pkv_err(PKV_ERR_NOMEM, "check kernels: no host memory");
        }
        float *q = h, *out = q + nq, *kf = out + no, *vf = kf + nk;
        uint8_t *vb = kb + kbytes;
        fill_rand(k, q, nq, 2.0f);
        fill_rand(k, kf, nk + nv, 1.0f);
        kv_encode(kt, kf, slots, c->dk, kb);
        kv_encode(vt, vf, slots, c->dv, vb);
        size_t m = 0;
        for (int i = 0; i < c->n_q; i++) meta[m++] = c->q_seq[i];
        for (int i = 0; i < c->n_q; i++) meta[m++] = c->q_len[i];
        for (int i = 0; i <= c->n_seq; i++) meta[m++] = c->indptr[i];
        for (int i = 0; i < meta_pages; i++) meta[m++] = c->pages[i];
        pkv_k_attention_args a = {.k_type = kt, .v_type = vt, .n_q = c->n_q, .n_seq = c->n_seq, .meta_pages = meta_pages,
                                  .n_pages = c->n_pages, .page_size = c->page_size, .n_head = c->n_head, .n_kv = c->n_kv,
                                  .dk = c->dk, .dv = c->dv, .scale = 1.0f / sqrtf((float)c->dk), .v_in_k = v_in_k};
        /* variant 1: window; 2: softcap and sinks; 3: all three; 4: a window
         * counted back from q_win (a non-causal span's rows: q_win at or below
         * q_len, one past it, which counts as q_len); 5: chunks (4 to 16 tokens:
         * inside pages, across them, longer than some queries see); 6: chunks
         * with a window and q_win */
        float sinks[16];
        for (int hh = 0; hh < c->n_head; hh++) sinks[hh] = hh == 1 ? 8.0f : 4.0f * (float)((hh * 37 % 11) - 5) / 10.0f;
        if (variant == 1 || variant == 3 || variant == 4 || variant == 6) a.window = 3 + (int)ci * 5;
        if (variant >= 5) a.chunk = 4 + (int)ci * 3 - (variant == 6);
        if (variant == 2 || variant == 3) a.softcap = 2.0f;
        int32_t q_win[8];
        for (int i = 0; i < c->n_q; i++) q_win[i] = i == 1 ? c->q_len[i] + 1 : c->q_len[i] - (i * 7 + (int)ci) % 12;
        pkv_ref_attention_win(&a, q, kb, vb, meta, variant == 2 || variant == 3 ? sinks : NULL, variant == 4 || variant == 6 ? q_win : NULL,
                              out);
        dbuf *bq, *bk, *bv, *bo, *bm, *bs = NULL, *bw = NULL;
        TRY(s = put(k, &bq, q, nq * 4));
        TRY(s = put(k, &bk, kb, kbytes));
        TRY(s = put(k, &bv, vb, vbytes));
        TRY(s = put(k, &bo, NULL, no * 4));
        TRY(s = put(k, &bm, meta, n_meta * 4));
        if (variant == 2 || variant == 3) TRY(s = put(k, &bs, sinks, (size_t)c->n_head * 4));
        if (variant == 4 || variant == 6) TRY(s = put(k, &bw, q_win, (size_t)c->n_q * 4));
        if (bs) a.sinks = tr(bs);
        if (bw) a.q_win = tr(bw);
        a.q = tr(bq);
        a.k = tr(bk);
        a.v = tr(bv);
        a.out = tr(bo);
        a.meta = tr(bm);
        if (kernel_ok(k, pkv_k_attention(k->dev, &a), "attention")) {
            char what[64];
            snprintf(what, sizeof what, "case %zu (heads %d/%d, page %d)%s", ci, c->n_head, c->n_kv, c->page_size,
                     variant == 1 ? " window" : variant == 2 ? " softcap+sinks" : variant == 3 ? " window+softcap+sinks" : variant == 4 ? " window from q_win"
                     : variant == 5 ? " chunk" : variant == 6 ? " chunk+window from q_win" : "");
            s = compare_f32(k, bo, out, no, what);
        }
    done:
        bufs_free(k);
        pkv_free(h);
        pkv_free(kb);
        if (s) return s;
    }
    if (rest_saved) k->rng = rng_rest;
    row_end(k);
    return PKV_OK;
}

/* ------------------------------------------------ quantized KV pages */

/* set_rows into q8_0 / q4_0 rows: the device's blocks against the reference
 * quantizer's, compared dequantized (the CPU's are the same bytes; a device may
 * round 1/d differently and move an element by one step). */
static pkv_status check_set_rows_q(ck *k, pkv_type dt) {
    static const int64_t shapes[][3] = {{1, 32, 1}, {3, 96, 11}, {16, 256, 41}, {5, 64, 7}}; /* n, row_elems, dst_rows */
    row_begin(k, "kernel set_rows %s", pkv_type_name(dt), 1e-6);
    pkv_status s = PKV_OK;
    for (size_t si = 0; si < PKV_ARRAY_LEN(shapes) && !k->row_error && !k->row.skipped; si++) {
        const int64_t n = shapes[si][0], re = shapes[si][1], dr = shapes[si][2];
        const size_t rb = pkv_type_row_bytes(dt, (size_t)re), src_el = (size_t)(n * re), dst_el = (size_t)(dr * re);
        float *h = scratch(src_el + 3 * dst_el, 1);
        uint8_t *bytes = pkv_malloc(2 * (size_t)dr * rb + 1);
        int32_t idx[64];
        if (!h || !bytes) {
            pkv_free(h);
            pkv_free(bytes);
            return pkv_err(PKV_ERR_NOMEM, "check kernels: no host memory");
        }
        float *src = h, *ref = h + src_el, *got = ref + dst_el, *old = got + dst_el;
        uint8_t *rbuf = bytes, *gbuf = bytes + (size_t)dr * rb;
        fill_rand(k, src, src_el, 4.0f);
        fill_rand(k, old, dst_el, 1.0f); /* old rows the kernel must leave alone */
        kv_encode(dt, old, (size_t)dr, (int)re, rbuf);
        for (int64_t i = 0; i < n; i++) idx[i] = (int32_t)((i * 5 + 3) % dr);
        dbuf *bs, *bd, *bi;
        TRY(s = put(k, &bs, src, src_el * 4));
        TRY(s = put(k, &bd, rbuf, (size_t)dr * rb));
        TRY(s = put(k, &bi, idx, (size_t)n * 4));
        pkv_k_set_rows_args a = {tr(bs), (size_t)re * 4, tr(bd), dt, rb, dr, tr(bi), n, re};
        pkv_ref_set_rows(&a, src, rbuf, idx);
        if (kernel_ok(k, pkv_k_set_rows(k->dev, &a), "set_rows")) {
            bool guard = true;
            TRY(s = get(k, bd, gbuf, &guard));
            kv_decode(dt, rbuf, (size_t)dr, (int)re, ref);
            kv_decode(dt, gbuf, (size_t)dr, (int)re, got);
            char what[64];
            snprintf(what, sizeof what, "%lld rows of %lld", (long long)n, (long long)re);
            row_case(k, what, nmse(ref, got, dst_el));
            if (!guard) row_fail(k, "%s: %s", "set_rows", "wrote outside its destination");
        }
    done:
        bufs_free(k);
        pkv_free(h);
        pkv_free(bytes);
        if (s) return s;
    }
    row_end(k);
    return PKV_OK;
}

/* rope of q8_0 / q4_0 rows (the shift's re-rotation): dequantize, rotate,
 * quantize on the device, against the reference doing the same in double. A
 * rotated value near a rounding boundary may land one quantization step away. */
static pkv_status check_rope_q(ck *k, pkv_type dt, int mode) {
    typedef struct {
        int n_rows, max_rows, n_heads, head_dim, n_rot;
        bool neox, list;
    } rcase;
    static const rcase cases[] = {
        {3, 3, 2, 32, 32, false, false}, {4, 9, 3, 64, 48, true, true}, {5, 7, 2, 128, 128, true, true},
        {2, 2, 4, 128, 64, false, false},
    };
    row_begin(k, k_rope_row[mode], pkv_type_name(dt), dt == PKV_TYPE_Q8_0 ? 1e-5 : 1e-3);
    pkv_status s = PKV_OK;
    for (size_t ci = 0; ci < PKV_ARRAY_LEN(cases) && !k->row_error && !k->row.skipped; ci++) {
        const rcase *c = &cases[ci];
        const size_t hrow = (size_t)c->n_heads * (size_t)c->max_rows; /* head rows */
        const size_t n_el = hrow * (size_t)c->head_dim, stride = (size_t)c->n_heads * pkv_type_row_bytes(dt, (size_t)c->head_dim);
        const size_t nbytes = (size_t)c->max_rows * stride;
        float *h = scratch(n_el, 3);
        uint8_t *bytes = pkv_malloc(2 * nbytes + 1);
        int32_t pos[16], rows[16];
        if (!h || !bytes) {
            pkv_free(h);
            pkv_free(bytes);
            return pkv_err(PKV_ERR_NOMEM, "check kernels: no host memory");
        }
        float *xf = h, *rf = h + n_el, *gf = h + 2 * n_el;
        uint8_t *xb = bytes, *gb = bytes + nbytes;
        fill_rand(k, xf, n_el, 2.0f);
        kv_encode(dt, xf, hrow, c->head_dim, xb);
        for (int r = 0; r < c->n_rows; r++) {
            pos[r] = (int32_t)(rnd(k) % 1000) - 500; /* shifts go both ways */
            rows[r] = c->list ? (int32_t)((r * 5 + 2) % c->max_rows) : r; /* distinct */
        }
        dbuf *bx, *bp, *brw = NULL;
        TRY(s = put(k, &bx, xb, nbytes));
        TRY(s = put(k, &bp, pos, (size_t)c->n_rows * 4));
        if (c->list) TRY(s = put(k, &brw, rows, (size_t)c->n_rows * 4));
        pkv_k_rope_args a = {.x = tr(bx), .dtype = dt, .n_rows = c->n_rows, .max_rows = c->max_rows, .row_stride = stride,
                             .n_heads = c->n_heads, .head_dim = c->head_dim, .n_rot = c->n_rot, .neox = c->neox,
                             .freq_base = 10000.0f, .freq_scale = 1.0f, .pos = tr(bp),
                             .rows = brw ? tr(brw) : pkv_tref_make(NULL, 0)};
        float ff[64];
        rope_mode(&a, mode == ROPE_FF && ci % 2 ? ROPE_YARN : mode, ci);
        if (mode == ROPE_FF) { /* a shift of cached K turned with LongRoPE's factors */
            dbuf *bff;
            for (int i = 0; i < c->n_rot / 2; i++) ff[i] = 1.0f + (float)(rnd(k) % 5900) / 100.0f;
            TRY(s = put(k, &bff, ff, (size_t)(c->n_rot / 2) * 4));
            a.ff = tr(bff);
        }
        pkv_ref_rope(&a, xb, pos, c->list ? rows : NULL, mode == ROPE_FF ? ff : NULL);
        if (kernel_ok(k, pkv_k_rope(k->dev, &a), "rope")) {
            bool guard = true;
            TRY(s = get(k, bx, gb, &guard));
            kv_decode(dt, xb, hrow, c->head_dim, rf);
            kv_decode(dt, gb, hrow, c->head_dim, gf);
            char what[64];
            snprintf(what, sizeof what, "%s n_rot %d/%d%s", c->neox ? "neox" : "normal", c->n_rot, c->head_dim,
                     c->list ? " row list" : "");
            row_case(k, what, nmse(rf, gf, n_el));
            if (!guard) row_fail(k, "%s: %s", "rope", "wrote outside its rows");
        }
    done:
        bufs_free(k);
        pkv_free(h);
        pkv_free(bytes);
        if (s) return s;
    }
    row_end(k);
    return PKV_OK;
}

/* ------------------------------------------------------- recurrent layers */

/* The meta of a recurrent kernel for n_seq sequences of cnt[s] tokens each, in
 * distinct slots taken in a random order from [0, n_slots) (n_seq <= n_slots <= 16); with bad_slot, sequence 1
 * gets a slot outside the pool (its rows must come back as zeros, no slot changed).
 * meta: i32 [2 n_seq + 1]. Returns the token count. */
static int64_t rec_meta(ck *k, const int *cnt, int n_seq, int n_slots, bool bad_slot, int32_t *meta) {
    int64_t n = 0;
    meta[0] = 0;
    for (int s = 0; s < n_seq; s++) meta[s + 1] = (int32_t)(n += cnt[s]);
    int perm[16]; /* a random permutation of the slots (Fisher-Yates); n_slots <= 16 */
    for (int i = 0; i < n_slots; i++) perm[i] = i;
    for (int i = n_slots - 1; i > 0; i--) {
        const int j = (int)(rnd(k) % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int s = 0; s < n_seq; s++) meta[n_seq + 1 + s] = perm[s];
    if (bad_slot && n_seq > 1) meta[n_seq + 2] = (int32_t)n_slots + 2;
    return n;
}

/* A case's sequences: the leading non-zero counts of cnt[0 .. max) (at least one), in
 * n_seq + extra slots, rec_meta's meta (bad_slot as there). Returns the token count. */
static int64_t rec_case(ck *k, const int *cnt, int max, int extra, bool bad_slot, int32_t *meta, int *n_seq, int *n_slots) {
    *n_seq = 0;
    while (*n_seq < max && cnt[*n_seq]) (*n_seq)++;
    *n_slots = *n_seq + extra;
    return rec_meta(k, cnt, *n_seq, *n_slots, bad_slot, meta);
}

/* A state pool: n_slots slots of slot_floats at a stride of stride_floats, random
 * (the padding too: it must come back unchanged). */
static float *rec_pool(ck *k, int n_slots, size_t slot_floats, size_t stride_floats, float scale) {
    float *p = pkv_malloc(((size_t)(n_slots - 1) * stride_floats + slot_floats) * sizeof(float) + 1);
    if (p) fill_rand(k, p, (size_t)(n_slots - 1) * stride_floats + slot_floats, scale);
    return p;
}

static pkv_status check_ssm_conv(ck *k, bool silu) {
    /* channels, d_conv, then the token counts of up to 4 sequences (0 = none) */
    static const int cases[][6] = {{5, 2, 1, 0, 0, 0}, {70, 4, 1, 3, 9, 0}, {96, 4, 6, 1, 2, 4}, {33, 7, 2, 12, 0, 0}};
    row_begin(k, "kernel %s", silu ? "ssm_conv (silu)" : "ssm_conv", 1e-10);
    pkv_status s = PKV_OK;
    for (size_t ci = 0; ci < 2 * PKV_ARRAY_LEN(cases) && !k->row_error && !k->row.skipped; ci++) {
        const int64_t C = cases[ci / 2][0];
        const int K = cases[ci / 2][1], *cnt = &cases[ci / 2][2];
        const bool inplace = ci & 1;
        int n_seq, n_slots;
        int32_t meta[9];
        const int64_t n = rec_case(k, cnt, 4, 2, inplace, meta, &n_seq, &n_slots);
        const size_t slot = (size_t)(K - 1) * (size_t)C, stride = slot + 3;
        float *h = scratch((size_t)(n * C), 2), *w = scratch((size_t)(C * K), 1);
        float *pool = rec_pool(k, n_slots, slot, stride, 2.0f);
        if (!h || !w || !pool) {
            pkv_free(h);
            pkv_free(w);
            pkv_free(pool);
            return pkv_err(PKV_ERR_NOMEM, "check kernels: no host memory");
        }
        float *x = h, *y = h + n * C;
        fill_rand(k, x, (size_t)(n * C), 2.0f);
        fill_rand(k, w, (size_t)(C * K), 1.0f);
        dbuf *bx, *bw, *by, *bs, *bm;
        TRY(s = put(k, &bx, x, (size_t)(n * C) * 4));
        TRY(s = put(k, &bw, w, (size_t)(C * K) * 4));
        if (inplace)
            by = bx;
        else
            TRY(s = put(k, &by, NULL, (size_t)(n * C) * 4));
        const size_t pool_floats = (size_t)(n_slots - 1) * stride + slot;
        TRY(s = put(k, &bs, pool, pool_floats * 4));
        TRY(s = put(k, &bm, meta, (size_t)(2 * n_seq + 1) * 4));
        pkv_k_ssm_conv_args a = {.x = tr(bx), .w = tr(bw), .y = tr(by), .state = tr(bs), .state_stride = stride * 4,
                                 .n_slots = n_slots, .meta = tr(bm), .n_tok = n, .channels = C, .n_seq = n_seq,
                                 .d_conv = K, .silu = silu};
        pkv_ref_ssm_conv(&a, x, w, y, pool, meta);
        if (kernel_ok(k, pkv_k_ssm_conv(k->dev, &a), "ssm_conv")) {
            s = compare_f32(k, by, y, (size_t)(n * C), inplace ? "y = x, one bad slot" : "y");
            if (!s) s = compare_f32(k, bs, pool, pool_floats, "state");
        }
    done:
        bufs_free(k);
        pkv_free(h);
        pkv_free(w);
        pkv_free(pool);
        if (s) return s;
    }
    row_end(k);
    return PKV_OK;
}

/* q and k heads L2-normalized on the host (as the model feeds them): with raw
 * vectors the delta rule grows without bound and no tolerance means anything. */
static void l2_rows(float *x, size_t rows, int d) {
    for (size_t r = 0; r < rows; r++) {
        double ss = 0;
        for (int i = 0; i < d; i++) ss += (double)x[r * d + i] * x[r * d + i];
        for (int i = 0; i < d; i++) x[r * d + i] = (float)(x[r * d + i] / sqrt(ss + 1e-6));
    }
}

static pkv_status check_delta_net(ck *k, bool grouped) {
    /* n_k_heads, n_v_heads, d_k, d_v, then the token counts of up to 3 sequences */
    static const int cases[][7] = {{1, 1, 8, 8, 1, 0, 0}, {2, 4, 32, 16, 5, 1, 7}, {2, 6, 64, 80, 3, 9, 0},
                                   {1, 2, 128, 128, 4, 2, 0}};
    row_begin(k, "kernel %s", grouped ? "delta_net (grouped heads)" : "delta_net", 1e-9);
    pkv_status s = PKV_OK;
    for (size_t ci = 0; ci < 2 * PKV_ARRAY_LEN(cases) && !k->row_error && !k->row.skipped; ci++) {
        const int hk = cases[ci / 2][0], hv = cases[ci / 2][1], dk = cases[ci / 2][2], dv = cases[ci / 2][3];
        const int *cnt = &cases[ci / 2][4];
        const bool bad = ci & 1;
        int n_seq, n_slots;
        int32_t meta[7];
        const int64_t n = rec_case(k, cnt, 3, 1, bad, meta, &n_seq, &n_slots);
        /* q, k, v as the column ranges of one conv output row, as in the model */
        const size_t kd = (size_t)hk * dk, vd = (size_t)hv * dv, row = 2 * kd + vd;
        const size_t slot = (size_t)hv * dk * dv, stride = slot + 1;
        float *in = scratch((size_t)n * row, 1), *gb = scratch((size_t)n * hv, 2), *out = scratch((size_t)n * vd, 1);
        float *pool = rec_pool(k, n_slots, slot, stride, 0.5f);
        if (!in || !gb || !out || !pool) {
            pkv_free(in);
            pkv_free(gb);
            pkv_free(out);
            pkv_free(pool);
            return pkv_err(PKV_ERR_NOMEM, "check kernels: no host memory");
        }
        float *g = gb, *beta = gb + n * hv;
        fill_rand(k, in, (size_t)n * row, 1.0f);
        for (int64_t t = 0; t < n; t++) l2_rows(in + t * row, 2 * (size_t)hk, dk);
        for (int64_t i = 0; i < n * hv; i++) {
            g[i] = -0.5f * (rndf(k) + 1.0f);         /* log-decay in [-1, 0] */
            beta[i] = 0.5f * (rndf(k) + 1.0f) + 0.01f; /* (0, 1] */
        }
        dbuf *bin, *bg, *bb, *bo, *bs, *bm;
        TRY(s = put(k, &bin, in, (size_t)n * row * 4));
        TRY(s = put(k, &bg, g, (size_t)(n * hv) * 4));
        TRY(s = put(k, &bb, beta, (size_t)(n * hv) * 4));
        TRY(s = put(k, &bo, NULL, (size_t)n * vd * 4));
        const size_t pool_floats = (size_t)(n_slots - 1) * stride + slot;
        TRY(s = put(k, &bs, pool, pool_floats * 4));
        TRY(s = put(k, &bm, meta, (size_t)(2 * n_seq + 1) * 4));
        pkv_k_delta_net_args a = {.q = tr(bin),
                                  .k = pkv_tref_make(bin->buf, bin->off + kd * 4),
                                  .v = pkv_tref_make(bin->buf, bin->off + 2 * kd * 4),
                                  .q_stride = row * 4,
                                  .k_stride = row * 4,
                                  .v_stride = row * 4,
                                  .g = tr(bg),
                                  .beta = tr(bb),
                                  .out = tr(bo),
                                  .state = tr(bs),
                                  .state_stride = stride * 4,
                                  .n_slots = n_slots,
                                  .meta = tr(bm),
                                  .n_tok = n,
                                  .n_seq = n_seq,
                                  .n_k_heads = hk,
                                  .n_v_heads = hv,
                                  .d_k = dk,
                                  .d_v = dv,
                                  .grouped = grouped};
        pkv_ref_delta_net(&a, in, in + kd, in + 2 * kd, g, beta, out, pool, meta);
        if (kernel_ok(k, pkv_k_delta_net(k->dev, &a), "delta_net")) {
            s = compare_f32(k, bo, out, (size_t)n * vd, bad ? "out, one bad slot" : "out");
            if (!s) s = compare_f32(k, bs, pool, pool_floats, "state");
        }
    done:
        bufs_free(k);
        pkv_free(in);
        pkv_free(gb);
        pkv_free(out);
        pkv_free(pool);
        if (s) return s;
    }
    row_end(k);
    return PKV_OK;
}

/* Mamba-2's scan inputs of n tokens: dt in [-4, 4] with every 7th above 20 (softplus's
 * identity branch), dt_bias in [-1, 1], A = -exp(u), u in [-1, 1] (ssm_a = -exp(A_log)),
 * D in [-1, 1]: decays in (0, 1) as the models have them. par: dt_bias | A | D. */
static void scan_params(ck *k, float *dt, int64_t n, int nh, float *par) {
    for (int64_t i = 0; i < n * nh; i++) dt[i] = i % 7 == 3 ? 20.5f + rndf(k) * 0.25f : 4.0f * rndf(k);
    for (int h = 0; h < nh; h++) {
        par[h] = rndf(k);
        par[nh + h] = -expf(rndf(k));
        par[2 * nh + h] = rndf(k);
    }
}

static pkv_status check_ssm_scan(ck *k, bool skip) {
    /* n_head, head_dim, n_group, d_state, then the token counts of up to 3 sequences */
    static const int cases[][7] = {{1, 8, 1, 16, 1, 0, 0},  {4, 16, 2, 16, 5, 1, 7}, {8, 64, 1, 128, 3, 9, 0},
                                   {6, 12, 3, 13, 4, 2, 1}, {2, 5, 2, 40, 11, 0, 0}};
    row_begin(k, "kernel %s", skip ? "ssm_scan (D skip)" : "ssm_scan", 1e-9);
    pkv_status s = PKV_OK;
    for (size_t ci = 0; ci < 2 * PKV_ARRAY_LEN(cases) && !k->row_error && !k->row.skipped; ci++) {
        const int nh = cases[ci / 2][0], hd = cases[ci / 2][1], ng = cases[ci / 2][2], ds = cases[ci / 2][3];
        const int *cnt = &cases[ci / 2][4];
        const bool bad = ci & 1;
        int n_seq, n_slots;
        int32_t meta[7];
        const int64_t n = rec_case(k, cnt, 3, 1, bad, meta, &n_seq, &n_slots);
        /* x, B, C as the column ranges of one conv output row [x | B | C | pad], as in the model */
        const size_t xd = (size_t)nh * hd, bd = (size_t)ng * ds, row = xd + 2 * bd + 3;
        const size_t slot = xd * ds, stride = slot + 1;
        /* host: in [n][row], dt [n][nh], y [n][xd], par: dt_bias | A | D */
        float *in = scratch((size_t)n * (row + (size_t)nh + xd) + 3 * (size_t)nh, 1);
        float *pool = rec_pool(k, n_slots, slot, stride, 0.5f);
        if (!in || !pool) {
            pkv_free(in);
            pkv_free(pool);
            return pkv_err(PKV_ERR_NOMEM, "check kernels: no host memory");
        }
        float *dt = in + (size_t)n * row, *y = dt + n * nh, *par = y + (size_t)n * xd;
        fill_rand(k, in, (size_t)n * row, 1.0f);
        scan_params(k, dt, n, nh, par);
        dbuf *bin, *bdt, *bp, *by, *bs, *bm;
        TRY(s = put(k, &bin, in, (size_t)n * row * 4));
        TRY(s = put(k, &bdt, dt, (size_t)(n * nh) * 4));
        TRY(s = put(k, &bp, par, (size_t)nh * 3 * 4));
        TRY(s = put(k, &by, NULL, (size_t)n * xd * 4));
        const size_t pool_floats = (size_t)(n_slots - 1) * stride + slot;
        TRY(s = put(k, &bs, pool, pool_floats * 4));
        TRY(s = put(k, &bm, meta, (size_t)(2 * n_seq + 1) * 4));
        pkv_k_ssm_scan_args a = {.x = tr(bin),
                                 .B = pkv_tref_make(bin->buf, bin->off + xd * 4),
                                 .C = pkv_tref_make(bin->buf, bin->off + (xd + bd) * 4),
                                 .x_stride = row * 4,
                                 .B_stride = row * 4,
                                 .C_stride = row * 4,
                                 .dt = tr(bdt),
                                 .dt_bias = tr(bp),
                                 .A = pkv_tref_make(bp->buf, bp->off + (size_t)nh * 4),
                                 .D = skip ? pkv_tref_make(bp->buf, bp->off + (size_t)nh * 8) : (pkv_tref){0},
                                 .y = tr(by),
                                 .state = tr(bs),
                                 .state_stride = stride * 4,
                                 .n_slots = n_slots,
                                 .meta = tr(bm),
                                 .n_tok = n,
                                 .n_seq = n_seq,
                                 .n_head = nh,
                                 .head_dim = hd,
                                 .n_group = ng,
                                 .d_state = ds};
        pkv_ref_ssm_scan(&a, in, in + xd, in + xd + bd, dt, par, par + nh, skip ? par + 2 * nh : NULL, y, pool, meta);
        if (kernel_ok(k, pkv_k_ssm_scan(k->dev, &a), "ssm_scan")) {
            s = compare_f32(k, by, y, (size_t)n * xd, bad ? "y, one bad slot" : "y");
            if (!s) s = compare_f32(k, bs, pool, pool_floats, "state");
        }
    done:
        bufs_free(k);
        pkv_free(in);
        pkv_free(pool);
        if (s) return s;
    }
    row_end(k);
    return PKV_OK;
}

static pkv_status check_l2_norm(ck *k) {
    /* tokens, heads, head_dim, extra floats between tokens (q and k inside a wider row) */
    static const int64_t shapes[][4] = {{1, 1, 7, 0}, {3, 4, 128, 64}, {5, 2, 300, 0}, {2, 8, 16, 5}};
    row_begin(k, "kernel %s", "l2_norm", 1e-10);
    pkv_status s = PKV_OK;
    for (size_t si = 0; si < 2 * PKV_ARRAY_LEN(shapes) && !k->row_error && !k->row.skipped; si++) {
        const int64_t nt = shapes[si / 2][0], nh = shapes[si / 2][1], d = shapes[si / 2][2], pad = shapes[si / 2][3];
        const bool inplace = si & 1;
        const size_t row = (size_t)(nh * d + pad), n = (size_t)nt * row;
        float *h = scratch(n, 2);
        if (!h) return pkv_err(PKV_ERR_NOMEM, "check kernels: no host memory");
        float *x = h, *y = h + n;
        fill_rand(k, x, n, 3.0f);
        if (inplace) memcpy(y, x, n * 4); /* the padding between rows stays as it was */
        pkv_k_l2_norm_args a = {.n = nt, .n_heads = nh, .head_dim = d, .x_stride = row * 4, .y_stride = row * 4,
                                .eps = 1e-6f};
        pkv_ref_l2_norm(&a, x, y);
        dbuf *bx, *by;
        TRY(s = put(k, &bx, x, n * 4));
        if (inplace)
            by = bx;
        else
            TRY(s = put(k, &by, NULL, n * 4));
        a.x = tr(bx);
        a.y = tr(by);
        if (kernel_ok(k, pkv_k_l2_norm(k->dev, &a), "l2_norm")) {
            if (!inplace) /* only the rows are written: compare them, not the padding */
                for (size_t t = 0; t < (size_t)nt; t++)
                    for (size_t i = (size_t)(nh * d); i < row; i++) y[t * row + i] = 0;
            float *got = scratch(n, 1);
            bool guard = true;
            if (!got) {
                s = pkv_err(PKV_ERR_NOMEM, "check kernels: no host memory");
                goto done;
            }
            s = get(k, by, got, &guard);
            if (!s && !inplace)
                for (size_t t = 0; t < (size_t)nt; t++)
                    for (size_t i = (size_t)(nh * d); i < row; i++) got[t * row + i] = 0;
            if (!s) row_case(k, inplace ? "in place" : "l2_norm", nmse(y, got, n));
            if (!guard) row_fail(k, "%s: %s", "l2_norm", "wrote outside its output region");
            pkv_free(got);
        }
    done:
        bufs_free(k);
        pkv_free(h);
        if (s) return s;
    }
    row_end(k);
    return PKV_OK;
}

static pkv_status check_unary(ck *k, pkv_unary_op op) {
    static const char *names[] = {"unary id (bias, mul)", "unary sigmoid", "unary softplus", "unary silu",
                                  "unary gelu",           "unary gelu_erf", "unary relu_sqr"};
    _Static_assert(sizeof names / sizeof names[0] == PKV_UNARY_LAST + 1, "a name for every unary op");
    /* n, bias_len, mul_len (0 = none) */
    static const int64_t shapes[][3] = {{1, 0, 0}, {48, 16, 16}, {1000, 0, 1000}, {4096, 32, 0}};
    row_begin(k, "kernel %s", names[op], 1e-10);
    pkv_status s = PKV_OK;
    for (size_t si = 0; si < 2 * PKV_ARRAY_LEN(shapes) && !k->row_error && !k->row.skipped; si++) {
        const int64_t n = shapes[si / 2][0], bl = shapes[si / 2][1], ml = shapes[si / 2][2];
        const bool inplace = si & 1;
        float *h = scratch((size_t)n, 4);
        if (!h) return pkv_err(PKV_ERR_NOMEM, "check kernels: no host memory");
        float *x = h, *b = h + n, *m = h + 2 * n, *y = h + 3 * n;
        fill_rand(k, x, (size_t)n, 30.0f); /* past softplus' switch at 20 both ways */
        fill_rand(k, b, (size_t)bl, 2.0f);
        fill_rand(k, m, (size_t)ml, 2.0f);
        pkv_ref_unary(op, x, y, n, bl ? b : NULL, bl, ml ? m : NULL, ml);
        /* a device may flush subnormal results to zero (Vulkan allows it; lavapipe
         * does): gelu_erf's far negative tail, alone in a row of one, would
         * otherwise count as an error of 100% */
        for (int64_t i = 0; i < n; i++)
            if (fabsf(y[i]) < FLT_MIN) y[i] = 0.0f;
        dbuf *bx, *bb = NULL, *bm = NULL, *by;
        TRY(s = put(k, &bx, x, (size_t)n * 4));
        if (bl) TRY(s = put(k, &bb, b, (size_t)bl * 4));
        if (ml) TRY(s = put(k, &bm, m, (size_t)ml * 4));
        if (inplace)
            by = bx;
        else
            TRY(s = put(k, &by, NULL, (size_t)n * 4));
        pkv_k_unary_args a = {.x = tr(bx), .y = tr(by), .n = n, .op = op, .bias_len = bl, .mul_len = ml};
        if (bb) a.bias = tr(bb);
        if (bm) a.mul = tr(bm);
        if (kernel_ok(k, pkv_k_unary(k->dev, &a), "unary")) s = compare_f32(k, by, y, (size_t)n, inplace ? "in place" : "unary");
    done:
        bufs_free(k);
        pkv_free(h);
        if (s) return s;
    }
    row_end(k);
    return PKV_OK;
}

/* One routing kind: random tokens (continuous logits, so no two experts tie) on the
 * device against the reference: the same experts, weights within the row's nmse. */
static pkv_status check_moe_route(ck *k, const char *name, pkv_k_moe_route_args a, bool with_bias) {
    row_begin(k, "kernel %s", name, 1e-10);
    pkv_status s = PKV_OK;
    for (int c = 0; c < 2 && !k->row_error && !k->row.skipped; c++) {
        a.n = c ? 37 : 1;
        const size_t nl = (size_t)(a.n * a.n_expert), ns = (size_t)(a.n * a.k);
        float *h = scratch(nl + (size_t)a.n_expert + 4 * ns, 1);
        if (!h) return pkv_err(PKV_ERR_NOMEM, "check kernels: no host memory");
        float *l = h, *b = h + nl, *w = b + a.n_expert, *gw = w + ns;
        int32_t *sel = (int32_t *)(void *)(gw + ns), *gsel = sel + ns;
        fill_rand(k, l, nl, 4.0f);
        fill_rand(k, b, (size_t)a.n_expert, 0.2f);
        pkv_ref_moe_route(&a, l, with_bias ? b : NULL, sel, w, 0, a.n);
        dbuf *bl, *bb = NULL, *bs, *bw;
        TRY(s = put(k, &bl, l, nl * 4));
        if (with_bias) TRY(s = put(k, &bb, b, (size_t)a.n_expert * 4));
        TRY(s = put(k, &bs, NULL, ns * 4));
        TRY(s = put(k, &bw, NULL, ns * 4));
        pkv_k_moe_route_args d = a;
        d.logits = tr(bl), d.sel = tr(bs), d.w = tr(bw);
        d.bias = bb ? tr(bb) : (pkv_tref){0};
        if (kernel_ok(k, pkv_k_moe_route(k->dev, &d), name)) {
            bool guard = true;
            if (!(s = get(k, bs, gsel, &guard)) && memcmp(gsel, sel, ns * 4)) row_fail(k, "%s: %s", name, "other experts chosen");
            if (!s && !guard) row_fail(k, "%s: %s", name, "wrote outside its output region");
            if (!s) s = compare_f32(k, bw, w, ns, name);
        }
    done:
        bufs_free(k);
        pkv_free(h);
        if (s) return s;
    }
    row_end(k);
    return PKV_OK;
}

static pkv_status check_moe_combine(ck *k) {
    row_begin(k, "kernel %s", "moe_combine", 1e-12);
    pkv_status s = PKV_OK;
    for (int c = 0; c < 2 && !k->row_error && !k->row.skipped; c++) {
        const bool add = c == 1;
        const int64_t n = 5, cols = 96, out_rows = 9;
        float *h = scratch((size_t)(n * cols + 2 * out_rows * cols + n), 1);
        if (!h) return pkv_err(PKV_ERR_NOMEM, "check kernels: no host memory");
        float *y = h, *out = y + n * cols, *ref = out + out_rows * cols, *w = ref + out_rows * cols;
        const int32_t rows[5] = {7, 0, 3, 42, 8}; /* distinct; 42 is outside out and skipped */
        fill_rand(k, y, (size_t)(n * cols), 2.0f);
        fill_rand(k, out, (size_t)(out_rows * cols), 1.0f);
        fill_rand(k, w, (size_t)n, 1.0f);
        memcpy(ref, out, (size_t)(out_rows * cols) * 4);
        pkv_k_moe_combine_args a = {.n = n, .cols = cols, .out_rows = out_rows, .add = add};
        pkv_ref_moe_combine(&a, ref, y, rows, w);
        dbuf *bo, *by, *br, *bw;
        TRY(s = put(k, &bo, out, (size_t)(out_rows * cols) * 4));
        TRY(s = put(k, &by, y, (size_t)(n * cols) * 4));
        TRY(s = put(k, &br, rows, sizeof rows));
        TRY(s = put(k, &bw, w, (size_t)n * 4));
        a.out = tr(bo), a.y = tr(by), a.rows = tr(br), a.w = tr(bw);
        if (kernel_ok(k, pkv_k_moe_combine(k->dev, &a), "moe_combine"))
            s = compare_f32(k, bo, ref, (size_t)(out_rows * cols), add ? "added" : "stored");
    done:
        bufs_free(k);
        pkv_free(h);
        if (s) return s;
    }
    row_end(k);
    return PKV_OK;
}

/* ---- the rows of each kernel of PKV_KERNELS, in the order they run */

static const pkv_type k_wtypes[] = {
    PKV_TYPE_F32,    PKV_TYPE_F16,    PKV_TYPE_BF16,    PKV_TYPE_Q8_0,   PKV_TYPE_Q4_0,   PKV_TYPE_Q4_1,
    PKV_TYPE_Q5_0,   PKV_TYPE_Q5_1,   PKV_TYPE_Q2_K,    PKV_TYPE_Q3_K,   PKV_TYPE_Q4_K,   PKV_TYPE_Q5_K,
    PKV_TYPE_Q6_K,   PKV_TYPE_MXFP4,  PKV_TYPE_IQ4_NL,  PKV_TYPE_IQ4_XS, PKV_TYPE_IQ3_XXS, PKV_TYPE_IQ3_S,
    PKV_TYPE_IQ2_XXS, PKV_TYPE_IQ2_XS, PKV_TYPE_IQ2_S,  PKV_TYPE_IQ1_S,  PKV_TYPE_IQ1_M,  PKV_TYPE_TQ1_0,
    PKV_TYPE_TQ2_0};

/* A weight type the device does not take is one skipped matmul row (and no
 * get_rows row). */
static pkv_status rows_matmul(ck *k) {
    pkv_status s = PKV_OK;
    for (size_t i = 0; i < PKV_ARRAY_LEN(k_wtypes) && !s; i++) {
        if (!pkv_device_supports_weight(k->dev, k_wtypes[i])) {
            row_begin(k, "kernel matmul %s", pkv_type_name(k_wtypes[i]), 0);
            k->row.skipped = true;
            snprintf(k->row.detail, sizeof k->row.detail, "weight type %s not supported on %s",
                     pkv_type_name(k_wtypes[i]), pkv_device_name(k->dev));
            row_end(k);
            continue;
        }
        s = check_matmul(k, k_wtypes[i], false);
        if (!s && k_wtypes[i] == PKV_TYPE_Q4_K) s = check_matmul(k, k_wtypes[i], true);
    }
    return s;
}

static pkv_status rows_get_rows(ck *k) {
    pkv_status s = PKV_OK;
    for (size_t i = 0; i < PKV_ARRAY_LEN(k_wtypes) && !s; i++)
        if (pkv_device_supports_weight(k->dev, k_wtypes[i])) s = check_get_rows(k, k_wtypes[i]);
    return s;
}

static pkv_status rows_rms_norm(ck *k) { return check_rms_norm(k); }
static pkv_status rows_add(ck *k) { return check_add(k); }

static pkv_status rows_swiglu(ck *k) {
    pkv_status s = check_swiglu(k, false, false);
    if (!s) s = check_swiglu(k, true, false);
    if (!s) s = check_swiglu(k, false, true);
    return s;
}

static pkv_status rows_rope(ck *k) {
    pkv_status s = PKV_OK;
    for (int mode = ROPE_PLAIN; mode <= ROPE_FF && !s; mode++) {
        s = check_rope(k, PKV_TYPE_F32, mode);
        if (!s) s = check_rope(k, PKV_TYPE_F16, mode);
    }
    for (int mode = ROPE_PLAIN; mode <= ROPE_FF && !s; mode++) {
        s = check_rope_q(k, PKV_TYPE_Q8_0, mode);
        if (!s) s = check_rope_q(k, PKV_TYPE_Q4_0, mode);
    }
    return s;
}

static pkv_status rows_set_rows(ck *k) {
    pkv_status s = check_set_rows(k, PKV_TYPE_F32);
    if (!s) s = check_set_rows(k, PKV_TYPE_F16);
    if (!s) s = check_set_rows_q(k, PKV_TYPE_Q8_0);
    if (!s) s = check_set_rows_q(k, PKV_TYPE_Q4_0);
    return s;
}

static pkv_status rows_attention(ck *k) {
    /* K type, V type, the options (window, softcap, sinks) */
    /* v_in_k: V read from the head of each K row (MLA's latent cache; vt unused) */
    static const struct { pkv_type kt, vt; bool opts, v_in_k; } cases[] = {
        {PKV_TYPE_F32, PKV_TYPE_F32, false, false},   {PKV_TYPE_F16, PKV_TYPE_F16, false, false},
        {PKV_TYPE_Q8_0, PKV_TYPE_Q8_0, false, false}, {PKV_TYPE_F16, PKV_TYPE_F16, true, false},
        {PKV_TYPE_Q8_0, PKV_TYPE_Q8_0, true, false},  {PKV_TYPE_Q4_0, PKV_TYPE_Q4_0, false, false},
        {PKV_TYPE_Q8_0, PKV_TYPE_F16, false, false},  {PKV_TYPE_F16, PKV_TYPE_Q4_0, false, false},
        {PKV_TYPE_F32, PKV_TYPE_F32, false, true},    {PKV_TYPE_F16, PKV_TYPE_F16, true, true},
        {PKV_TYPE_Q8_0, PKV_TYPE_Q8_0, false, true}};
    pkv_status s = PKV_OK;
    for (size_t i = 0; i < PKV_ARRAY_LEN(cases) && !s; i++)
        s = check_attention(k, cases[i].kt, cases[i].vt, cases[i].opts, cases[i].v_in_k);
    return s;
}

static pkv_status rows_softmax(ck *k) { return check_softmax(k); }
static pkv_status rows_argmax(ck *k) { return check_argmax(k); }

static pkv_status rows_ssm_conv(ck *k) {
    pkv_status s = check_ssm_conv(k, false);
    return s ? s : check_ssm_conv(k, true);
}

static pkv_status rows_delta_net(ck *k) {
    pkv_status s = check_delta_net(k, false);
    return s ? s : check_delta_net(k, true);
}

static pkv_status rows_ssm_scan(ck *k) {
    pkv_status s = check_ssm_scan(k, false);
    return s ? s : check_ssm_scan(k, true);
}

static pkv_status rows_l2_norm(ck *k) { return check_l2_norm(k); }

static pkv_status rows_unary(ck *k) {
    pkv_status s = PKV_OK;
    for (int op = PKV_UNARY_ID; op <= PKV_UNARY_LAST && !s; op++) s = check_unary(k, (pkv_unary_op)op);
    return s;
}

static pkv_status rows_layer_norm(ck *k) { return check_layer_norm(k); }

static pkv_status rows_moe_route(ck *k) {
    static const struct {
        const char *name;
        pkv_k_moe_route_args a;
        bool bias;
    } cases[] = {
        {"moe_route softmax, normalised (Qwen3-MoE)", {.n_expert = 16, .k = 4, .gating = 0, .norm_w = true}, false},
        {"moe_route softmax of the chosen (gpt-oss)", {.n_expert = 32, .k = 4, .gating = 1}, false},
        {"moe_route sigmoid, bias, groups (DeepSeek-V3)",
         {.n_expert = 64, .k = 6, .n_group = 8, .n_group_used = 3, .gating = 2, .norm_w = true, .w_scale = 2.5f}, true},
        {"moe_route on the logits, top 1 (Llama 4)", {.n_expert = 16, .k = 1, .gating = 2, .sel_logits = true}, false},
    };
    pkv_status s = PKV_OK;
    for (size_t i = 0; i < PKV_ARRAY_LEN(cases) && !s; i++) s = check_moe_route(k, cases[i].name, cases[i].a, cases[i].bias);
    return s;
}

static pkv_status rows_moe_combine(ck *k) { return check_moe_combine(k); }

pkv_status pkv_check_kernels(pkv_device *dev, pkv_check_params p, pkv_check_report_fn report, void *user) {
    if (!dev) return pkv_err(PKV_ERR_INVALID, "check kernels: device is NULL");
    ck k;
    memset(&k, 0, sizeof k);
    k.dev = dev;
    k.report = report;
    k.user = user;
    k.rng = p.seed ? p.seed : 0x5eed5eedull;
    bool was_raw = pkv_device_set_raw(dev, true); /* results are read back through the device's own primitives */
    pkv_status s = PKV_OK;
#define ROWS(name)                                                                         \
    if (!s) s = rows_##name(&k);
    PKV_KERNELS(ROWS)
#undef ROWS
    bufs_free(&k);
    pkv_device_set_raw(dev, was_raw);
    if (s) return s;
    if (k.any_failed) return pkv_err(PKV_ERR_DEVICE, "check kernels on %s: some kernels do not match the reference", pkv_device_name(dev));
    return PKV_OK;
}
