// labels: unit kernels
/* The reference kernels (cpu/ref.c) against independent double-precision
 * computations written here, then the CPU device's kernels against the
 * reference: the conformance suite on "cpu", on every forced instruction-set
 * path (PKV_CPU_PATH, read by the CPU backend at each kernel call, so setenv
 * between calls is enough), larger matmuls per path, thread-count determinism
 * and the alignment contract. */
#include "testhelp.h"

#include "cpu-paths.h"
#include "base/quant.h"
#include "device/cpu/cpu-dots.h"
#include "device/cpu/ref.h"
#include "device/device.h"

#include <math.h>

static uint64_t g_seed = 1234;

/* REQUIRE for void helpers: record the failure and leave the helper. */
#define NEED(cond)                                                                         \
    do {                                                                                   \
        th_checks++;                                                                       \
        if (!(cond)) {                                                                     \
            TH_FAIL("required: %s (%s)", #cond, pkv_errmsg());                             \
            return;                                                                        \
        }                                                                                  \
    } while (0)

static void fill(float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = th_randf(&g_seed) * scale;
}

/* ------------------------------------------------- reference vs independent */

static void test_ref_matmul(void) {
    enum { R = 13, C = 96, N = 3 };
    static float w[R * C], x[N * C], y[N * R], wd[R * C];
    static uint8_t wq[R * 2 * C * 4];
    fill(w, R * C, 1.0f);
    fill(x, N * C, 1.0f);
    const pkv_type types[] = {PKV_TYPE_F32, PKV_TYPE_F16, PKV_TYPE_BF16, PKV_TYPE_Q8_0, PKV_TYPE_Q4_0};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const pkv_type t = types[ti];
        const size_t rb = pkv_type_row_bytes(t, C);
        for (int r = 0; r < R; r++) {
            CHECK_OK(pkv_quantize_row(t, w + r * C, wq + r * rb, C));
            CHECK_OK(pkv_dequantize_row(t, wq + r * rb, wd + r * C, C));
        }
        CHECK_OK(pkv_ref_matmul(wq, t, R, C, x, N, y));
        double worst = 0;
        for (int i = 0; i < N; i++)
            for (int r = 0; r < R; r++) {
                double want = 0;
                for (int c = 0; c < C; c++) want += (double)wd[r * C + c] * x[i * C + c];
                worst = fmax(worst, fabs(want - y[i * R + r]) / fmax(1.0, fabs(want)));
            }
        if (!(worst < 1e-6)) TH_FAIL("ref matmul %s: relative error %g", pkv_type_name(t), worst);
        th_checks++;
    }
    /* f32 weights: dequantization is the identity, so y is the plain product */
    CHECK_OK(pkv_ref_matmul(w, PKV_TYPE_F32, R, C, x, N, y));
    double want = 0;
    for (int c = 0; c < C; c++) want += (double)w[5 * C + c] * x[2 * C + c];
    CHECK_NEAR(y[2 * R + 5], want, 1e-5);
    CHECK_STATUS(pkv_ref_matmul(w, PKV_TYPE_I32, R, C, x, N, y), PKV_ERR_UNSUPPORTED);
}

/* RoPE as complex multiplication: pair (a, b) is a + ib, multiplied by
 * e^{i theta}, theta = pos * scale * exp(-(2i/n_rot) ln base). */
static void rope_indep(double *x, int n_heads, int head_dim, int n_rot, bool neox, double pos, double base,
                       double scale) {
    for (int h = 0; h < n_heads; h++)
        for (int i = 0; i < n_rot / 2; i++) {
            const double theta = pos * scale * exp(-(2.0 * i / n_rot) * log(base));
            double *a = &x[h * head_dim + (neox ? i : 2 * i)], *b = &x[h * head_dim + (neox ? i + n_rot / 2 : 2 * i + 1)];
            const double re = *a * cos(theta) - *b * sin(theta), im = *a * sin(theta) + *b * cos(theta);
            *a = re;
            *b = im;
        }
}

static void test_ref_rope(void) {
    enum { MAXR = 7, H = 3, D = 16, PAD = 2, E = H * D + PAD };
    for (int variant = 0; variant < 8; variant++) {
        const bool neox = variant & 1, f16 = variant & 2, list = variant & 4;
        const int n_rot = neox ? 12 : 8; /* < head_dim: the last dims stay */
        const int n_rows = list ? 4 : MAXR;
        const int32_t rows[4] = {5, 0, 6, 2};
        int32_t pos[MAXR];
        for (int r = 0; r < n_rows; r++) pos[r] = (int32_t)(r * 97 + 3);
        float xf[MAXR * E];
        uint8_t raw[MAXR * E * 4], before[MAXR * E * 4];
        fill(xf, MAXR * E, 2.0f);
        const size_t es = f16 ? 2 : 4;
        for (int i = 0; i < MAXR * E; i++) {
            if (f16) {
                uint16_t h = pkv_f32_to_f16(xf[i]);
                memcpy(raw + 2 * i, &h, 2);
                xf[i] = pkv_f16_to_f32(h);
            } else {
                memcpy(raw + 4 * i, &xf[i], 4);
            }
        }
        memcpy(before, raw, sizeof raw);
        pkv_k_rope_args a = {0};
        a.dtype = f16 ? PKV_TYPE_F16 : PKV_TYPE_F32;
        a.n_rows = n_rows;
        a.max_rows = MAXR;
        a.row_stride = E * es;
        a.n_heads = H;
        a.head_dim = D;
        a.n_rot = n_rot;
        a.neox = neox;
        a.freq_base = 10000.0f;
        a.freq_scale = 0.5f;
        pkv_ref_rope(&a, raw, pos, list ? rows : NULL, NULL);
        int bad = 0;
        for (int r = 0; r < MAXR; r++) {
            int k = -1; /* which list entry rotates row r */
            for (int j = 0; j < n_rows; j++)
                if ((list ? rows[j] : j) == r) k = j;
            double want[E];
            for (int e = 0; e < E; e++) want[e] = xf[r * E + e];
            if (k >= 0) rope_indep(want, H, D, n_rot, neox, pos[k], 10000.0, 0.5);
            for (int e = 0; e < E; e++) {
                float got;
                if (f16) {
                    uint16_t h;
                    memcpy(&h, raw + 2 * (r * E + e), 2);
                    got = pkv_f16_to_f32(h);
                } else {
                    memcpy(&got, raw + 4 * (r * E + e), 4);
                }
                const bool rotated = k >= 0 && e < H * D && e % D < n_rot;
                /* untouched elements are bit-identical; rotated ones round once */
                const double tol = rotated ? (f16 ? 2e-3 : 1e-6) * fmax(1.0, fabs(want[e])) : 0;
                if (!rotated && memcmp(raw + es * (size_t)(r * E + e), before + es * (size_t)(r * E + e), es) != 0) bad++;
                if (!(fabs(got - want[e]) <= tol) && bad++ < 3)
                    TH_FAIL("rope %s %s%s row %d elem %d: %.9g want %.9g", neox ? "neox" : "normal", f16 ? "f16" : "f32",
                            list ? " list" : "", r, e, got, want[e]);
            }
        }
        CHECK_INT(bad, 0);
    }
    /* rotations compose: pos 300 then pos 45 equals pos 345; pos 0 is the identity */
    float x1[2 * D], x2[2 * D];
    fill(x1, 2 * D, 1.0f);
    memcpy(x2, x1, sizeof x1);
    pkv_k_rope_args a = {0};
    a.dtype = PKV_TYPE_F32;
    a.n_rows = 1;
    a.max_rows = 1;
    a.row_stride = 2 * D * 4;
    a.n_heads = 2;
    a.head_dim = D;
    a.n_rot = D;
    a.neox = true;
    a.freq_base = 1e6f;
    a.freq_scale = 1.0f;
    int32_t p0 = 0, p1 = 300, p2 = 45, p3 = 345;
    float keep[2 * D];
    memcpy(keep, x1, sizeof x1);
    pkv_ref_rope(&a, x1, &p0, NULL, NULL);
    CHECK_MEM(x1, keep, sizeof keep);
    pkv_ref_rope(&a, x1, &p1, NULL, NULL);
    pkv_ref_rope(&a, x1, &p2, NULL, NULL);
    pkv_ref_rope(&a, x2, &p3, NULL, NULL);
    CHECK(th_nmse(x2, x1, 2 * D) < 1e-12);
}

/* Attention the obvious way: gather each sequence's keys and values into
 * contiguous arrays through its page list, then softmax over the first q_len. */
static void attn_indep(const pkv_k_attention_args *a, const float *q, const float *k, const float *v, const int32_t *meta,
                       double *out) {
    const int32_t *q_seq = meta, *q_len = meta + a->n_q, *indptr = meta + 2 * a->n_q, *pages = indptr + a->n_seq + 1;
    for (int i = 0; i < a->n_q; i++) {
        const int s = q_seq[i];
        double kc[256][32], vc[256][32];
        int nt;
        for (int h = 0; h < a->n_head; h++) {
            const int kvh = h * a->n_kv / a->n_head;
            double sc[256], mx = -1e300, sum = 0;
            nt = 0;
            for (int t = 0; t < q_len[i]; t++) {
                const int pg = pages[indptr[s] + t / a->page_size];
                if (pg < 0 || pg >= a->n_pages) continue;
                const size_t row = ((size_t)pg * a->page_size + (size_t)(t % a->page_size)) * a->n_kv + kvh;
                for (int d = 0; d < a->dk; d++) kc[nt][d] = k[row * a->dk + d];
                for (int d = 0; d < a->dv; d++) vc[nt][d] = v[row * a->dv + d];
                nt++;
            }
            for (int t = 0; t < nt; t++) {
                double dot = 0;
                for (int d = 0; d < a->dk; d++) dot += q[((size_t)i * a->n_head + h) * a->dk + d] * kc[t][d];
                sc[t] = dot * a->scale;
                mx = fmax(mx, sc[t]);
            }
            for (int t = 0; t < nt; t++) sum += exp(sc[t] - mx);
            for (int d = 0; d < a->dv; d++) {
                double acc = 0;
                for (int t = 0; t < nt; t++) acc += exp(sc[t] - mx) / sum * vc[t][d];
                out[((size_t)i * a->n_head + h) * a->dv + d] = nt ? acc : 0;
            }
        }
    }
}

/* GQA 6:2, three sequences; seq 1 is a fork of seq 0 sharing its first two pages;
 * seq 1 has a prefill of three queries with growing causal limits; seq 2 has an
 * out-of-range page id whose tokens are skipped. */
enum { AQ = 6, AH = 6, AKV = 2, ADK = 16, ADV = 8, APS = 4, ANP = 8, ASEQ = 3 };
static const int32_t k_meta[] = {
    /* q_seq */ 0, 1, 1, 1, 2, 2,
    /* q_len */ 7, 9, 10, 11, 3, 8,
    /* indptr */ 0, 2, 5, 7,
    /* pages */ 3, 1, /**/ 3, 1, 6, /**/ 0, 42};

static void attn_args(pkv_k_attention_args *a, pkv_type kt) {
    memset(a, 0, sizeof *a);
    a->k_type = kt;
    a->v_type = kt;
    a->n_q = AQ;
    a->n_seq = ASEQ;
    a->meta_pages = 7;
    a->n_pages = ANP;
    a->page_size = APS;
    a->n_head = AH;
    a->n_kv = AKV;
    a->dk = ADK;
    a->dv = ADV;
    a->scale = 0.25f;
}

static void test_ref_attention(void) {
    static float q[AQ * AH * ADK], k[ANP * APS * AKV * ADK], v[ANP * APS * AKV * ADV], out[AQ * AH * ADV];
    static double want[AQ * AH * ADV];
    static uint8_t k16[sizeof k / 2], v16[sizeof v / 2];
    fill(q, sizeof q / 4, 3.0f);
    fill(k, sizeof k / 4, 1.0f);
    fill(v, sizeof v / 4, 1.0f);
    pkv_k_attention_args a;
    for (int f16 = 0; f16 < 2; f16++) {
        attn_args(&a, f16 ? PKV_TYPE_F16 : PKV_TYPE_F32);
        if (f16) { /* round K and V to f16; the independent version uses the rounded values */
            for (size_t i = 0; i < sizeof k / 4; i++) {
                uint16_t h = pkv_f32_to_f16(k[i]);
                memcpy(k16 + 2 * i, &h, 2);
                k[i] = pkv_f16_to_f32(h);
            }
            for (size_t i = 0; i < sizeof v / 4; i++) {
                uint16_t h = pkv_f32_to_f16(v[i]);
                memcpy(v16 + 2 * i, &h, 2);
                v[i] = pkv_f16_to_f32(h);
            }
        }
        pkv_ref_attention(&a, q, f16 ? (const void *)k16 : k, f16 ? (const void *)v16 : v, k_meta, out);
        attn_indep(&a, q, k, v, k_meta, want);
        double worst = 0;
        for (size_t i = 0; i < sizeof out / 4; i++) worst = fmax(worst, fabs(out[i] - want[i]));
        if (!(worst < 1e-6)) TH_FAIL("ref attention %s: max error %g", f16 ? "f16" : "f32", worst);
        th_checks++;
    }
    /* Sanity of the semantics themselves: make query 0, head 0 (KV head 0) point
     * hard at token 5 of seq 0 (page 1, slot 1): the output is that token's value. */
    attn_args(&a, PKV_TYPE_F32);
    const size_t row = ((size_t)1 * APS + 1) * AKV + 0;
    for (int d = 0; d < ADK; d++) q[d] = 200.0f * k[row * ADK + d];
    pkv_ref_attention(&a, q, k, v, k_meta, out);
    for (int d = 0; d < ADV; d++) CHECK_NEAR(out[d], v[row * ADV + d], 1e-4);
    /* query 4 of seq 2 sees only tokens 0..2 of page 0 */
    attn_indep(&a, q, k, v, k_meta, want);
    CHECK_NEAR(out[(4 * AH + 3) * ADV + 1], want[(4 * AH + 3) * ADV + 1], 1e-6);
}

/* ----------------------------------------------------- device against ref */

typedef struct {
    int rows, failed, skipped;
    char names[128][64];
} suite_log;

static void on_row(const pkv_check_result *r, void *user) {
    suite_log *l = user;
    if (l->rows < 128) snprintf(l->names[l->rows], 64, "%s", r->test);
    l->rows++;
    if (!r->passed) {
        l->failed++;
        fprintf(stderr, "  %s: FAILED: %s\n", r->test, r->detail);
    }
    if (r->skipped) l->skipped++;
}

static void on_row_quiet(const pkv_check_result *r, void *user) {
    suite_log *l = user;
    l->rows++;
    if (!r->passed) l->failed++;
}

static bool has_row(const suite_log *l, const char *name) {
    for (int i = 0; i < l->rows && i < 128; i++)
        if (strcmp(l->names[i], name) == 0) return true;
    return false;
}

/* A row named "kernel <kernel>" or "kernel <kernel> ..." */
static bool has_kernel_rows(const suite_log *l, const char *kernel) {
    char want[64];
    snprintf(want, sizeof want, "kernel %s", kernel);
    const size_t n = strlen(want);
    for (int i = 0; i < l->rows && i < 128; i++)
        if (strncmp(l->names[i], want, n) == 0 && (l->names[i][n] == 0 || l->names[i][n] == ' ')) return true;
    return false;
}

static void run_suite(pkv_device *dev, const char *label) {
    suite_log l;
    memset(&l, 0, sizeof l);
    pkv_check_params p = {0};
    p.seed = 99;
    pkv_status s = pkv_check_kernels(dev, p, on_row, &l);
    if (s) TH_FAIL("pkv_check_kernels on path %s: %s: %s", label, pkv_status_str(s), pkv_errmsg());
    th_checks++;
    CHECK_INT(l.failed, 0);
    CHECK_INT(l.skipped, 0);
    /* + quantized KV: set_rows, rope (2 each), attention (4); + the attention kinds (2) */
    /* matmul and get_rows for 25 weight types, + q4_k's matmul on wrapped weights */
    CHECK_INT(l.rows, 25 * 2 + 1 + 11 + 8 + 2 + 1 + 5 + 9 + 4 + 3 + 4 + 3 + 5 + 2 + 1); /* + geglu; + swiglu_oai and rope with YaRN (f32,
                                                                             f16, q8_0, q4_0) */
    /* + attention with V read from K (MLA): f32, f16 with the kinds, q8_0 */
    /* + moe_route (4 kinds), moe_combine */
    /* + partial rope (Gemma 4's proportional RoPE: f32, f16, q8_0, q4_0) */
    /* + rope with LongRoPE's frequency factors (f32, f16, q8_0, q4_0) */
    /* + the recurrent-layer kernels: ssm_conv (2), delta_net (2), l2_norm, unary (4); + ssm_scan (2) */
    /* + the media encoders' kernels: unary gelu, unary gelu_erf, layer_norm */
    /* + unary relu_sqr (Nemotron-H's MLP) */
    /* every kernel of the list has check rows */
#define KERNEL_ROWS(name) CHECK(has_kernel_rows(&l, #name));
    PKV_KERNELS(KERNEL_ROWS)
#undef KERNEL_ROWS
    CHECK(has_row(&l, "kernel unary gelu_erf"));
    CHECK(has_row(&l, "kernel unary relu_sqr"));
    CHECK(has_row(&l, "kernel rope f32 ff"));
    CHECK(has_row(&l, "kernel rope f16 ff"));
    CHECK(has_row(&l, "kernel rope q8_0 ff"));
    CHECK(has_row(&l, "kernel rope q4_0 ff"));
    CHECK(has_row(&l, "kernel layer_norm"));
    CHECK(has_row(&l, "kernel moe_route sigmoid, bias, groups (DeepSeek-V3)"));
    CHECK(has_row(&l, "kernel moe_combine"));
    CHECK(has_row(&l, "kernel ssm_conv (silu)"));
    CHECK(has_row(&l, "kernel delta_net (grouped heads)"));
    CHECK(has_row(&l, "kernel ssm_scan (D skip)"));
    CHECK(has_row(&l, "kernel l2_norm"));
    CHECK(has_row(&l, "kernel unary softplus"));
    CHECK(has_row(&l, "kernel matmul q4_k"));
    CHECK(has_row(&l, "kernel matmul mxfp4"));
    CHECK(has_row(&l, "kernel get_rows mxfp4"));
    CHECK(has_row(&l, "kernel matmul iq1_m"));
    CHECK(has_row(&l, "kernel get_rows tq2_0"));
    CHECK(has_row(&l, "kernel attention f16 window/softcap/sinks"));
    CHECK(has_row(&l, "kernel attention q8_0 window/softcap/sinks"));
    CHECK(has_row(&l, "kernel attention f16"));
    CHECK(has_row(&l, "kernel attention f32 v_in_k"));
    CHECK(has_row(&l, "kernel attention f16 window/softcap/sinks v_in_k"));
    CHECK(has_row(&l, "kernel attention q8_0 v_in_k"));
    CHECK(has_row(&l, "kernel rope f16"));
    CHECK(has_row(&l, "kernel rope q4_0"));
    CHECK(has_row(&l, "kernel rope f32 yarn"));
    CHECK(has_row(&l, "kernel rope q8_0 yarn"));
    CHECK(has_row(&l, "kernel rope f32 partial"));
    CHECK(has_row(&l, "kernel rope q4_0 partial"));
    CHECK(has_row(&l, "kernel swiglu_oai (gpt-oss, alpha 1.702, limit 7)"));
    CHECK(has_row(&l, "kernel set_rows q8_0"));
    CHECK(has_row(&l, "kernel attention K q8_0 V f16"));
}

static pkv_buffer *upload(pkv_device *dev, const void *data, size_t n, size_t off) {
    pkv_buffer *b = pkv_buffer_alloc(dev, off + n + 8);
    if (b && data) pkv_buffer_write(b, off, data, n);
    return b;
}

/* A larger matmul per weight type: n = 1 (decode) and n = 37 (blocked prefill),
 * against the reference. Tolerances as in check-kernels.c. */
static void matmul_vs_ref(pkv_device *dev, const char *label) {
    enum { R = 72, C = 1024, N = 37 };
    static float w[R * C], x[N * C], y[N * R], ref[N * R];
    static uint8_t wq[R * C * 4];
    fill(w, R * C, 1.0f);
    fill(x, N * C, 1.0f);
    const pkv_type types[] = {PKV_TYPE_F32,    PKV_TYPE_F16,    PKV_TYPE_BF16,    PKV_TYPE_Q8_0,   PKV_TYPE_Q4_0,
                              PKV_TYPE_Q4_K,   PKV_TYPE_Q5_K,   PKV_TYPE_Q6_K,    PKV_TYPE_MXFP4,  PKV_TYPE_Q4_1,
                              PKV_TYPE_Q5_0,   PKV_TYPE_Q5_1,   PKV_TYPE_Q2_K,    PKV_TYPE_Q3_K,   PKV_TYPE_IQ4_NL,
                              PKV_TYPE_IQ4_XS, PKV_TYPE_IQ3_XXS, PKV_TYPE_IQ3_S,  PKV_TYPE_IQ2_XXS, PKV_TYPE_IQ2_XS,
                              PKV_TYPE_IQ2_S,  PKV_TYPE_IQ1_S,  PKV_TYPE_IQ1_M,   PKV_TYPE_TQ1_0,  PKV_TYPE_TQ2_0};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const pkv_type t = types[ti];
        const size_t rb = pkv_type_row_bytes(t, C);
        for (int r = 0; r < R; r++) pkv_quantize_row(t, w + r * C, wq + r * rb, C);
        const double tol = pkv_type_block_elems(t) > 1 ? 5e-4 : 1e-9;
        for (int n = 1; n <= N; n += N - 1) {
            CHECK_OK(pkv_ref_matmul(wq, t, R, C, x, n, ref));
            pkv_buffer *bw = upload(dev, wq, R * rb, 12), *bx = upload(dev, x, (size_t)n * C * 4, 4),
                       *by = upload(dev, NULL, (size_t)n * R * 4, 8);
            NEED(bw && bx && by);
            pkv_k_matmul_args a = {pkv_tref_make(bw, 12), t, R, C, pkv_tref_make(bx, 4), pkv_tref_make(by, 8), n};
            CHECK_OK(pkv_k_matmul(dev, &a));
            CHECK_OK(pkv_buffer_read(by, 8, y, (size_t)n * R * 4));
            const double e = th_nmse(ref, y, (size_t)n * R);
            if (!(e <= tol)) TH_FAIL("path %s matmul %s n=%d: nmse %.3g > %.3g", label, pkv_type_name(t), n, e, tol);
            th_checks++;
            pkv_buffer_free(bw);
            pkv_buffer_free(bx);
            pkv_buffer_free(by);
        }
    }
}

static int g_warnings;
static char g_last_warning[256];
static void on_log(pkv_log_level level, const char *msg, void *user) {
    (void)user;
    if (level == PKV_LOG_WARN) {
        g_warnings++;
        snprintf(g_last_warning, sizeof g_last_warning, "%s", msg);
    }
}

/* An unknown PKV_CPU_PATH falls back to the best path, with a warning. */
static void test_bad_path(void) {
    pkv_log_set(on_log, NULL, PKV_LOG_WARN);
    setenv("PKV_CPU_PATH", "sse9", 1);
    pkv_device *dev = pkv_device_open("cpu", pkv_device_default_params());
    NEED(dev);
    float w[2 * 32], x[32], y[2];
    fill(w, 64, 1.0f);
    fill(x, 32, 1.0f);
    pkv_buffer *bw = upload(dev, w, sizeof w, 0), *bx = upload(dev, x, sizeof x, 0), *by = upload(dev, NULL, sizeof y, 0);
    NEED(bw && bx && by);
    pkv_k_matmul_args a = {pkv_tref_make(bw, 0), PKV_TYPE_F32, 2, 32, pkv_tref_make(bx, 0), pkv_tref_make(by, 0), 1};
    CHECK_OK(pkv_k_matmul(dev, &a));
    CHECK_OK(pkv_buffer_read(by, 0, y, sizeof y));
    double want = 0;
    for (int c = 0; c < 32; c++) want += (double)w[32 + c] * x[c];
    CHECK_NEAR(y[1], want, 1e-5);
    CHECK(g_warnings >= 1 && strstr(g_last_warning, "sse9") != NULL);
    pkv_buffer_free(bw);
    pkv_buffer_free(bx);
    pkv_buffer_free(by);
    pkv_device_close(dev);
    unsetenv("PKV_CPU_PATH");
    pkv_log_set(NULL, NULL, PKV_LOG_WARN);
}

/* The CPU device with 2 threads on the path named (PKV_CPU_PATH, left set). */
static pkv_device *open_path(const char *path) {
    setenv("PKV_CPU_PATH", path, 1);
    pkv_device_params dp = pkv_device_default_params();
    dp.n_threads = 2;
    return pkv_device_open("cpu", dp);
}

static void test_paths(void) {
    const char *paths[TH_MAX_CPU_PATHS];
    const int np = th_cpu_paths(paths);
    for (int i = 0; i < np; i++) {
        pkv_device *dev = open_path(paths[i]);
        NEED(dev);
        run_suite(dev, paths[i]);
        matmul_vs_ref(dev, paths[i]);
        pkv_device_close(dev);
    }
    unsetenv("PKV_CPU_PATH");
}

/* Results do not depend on the thread count: bitwise equal with 1 and 3 threads
 * (q4_0, and q8_0, q4_k and q6_k, which take the amx path where the CPU has AMX: 200
 * rows are 12 groups of 16 split over the tasks and a tail of 8). */
static void test_threads_deterministic(void) {
    enum { R = 200, C = 512, N = 5 };
    static float w[R * C], x[N * C], y1[N * R], y3[N * R];
    static uint8_t wq[R * C * 2]; /* q8_0 takes 34 bytes per 32 weights */
    fill(w, R * C, 1.0f);
    fill(x, N * C, 1.0f);
    static const pkv_type types[] = {PKV_TYPE_Q4_0, PKV_TYPE_Q8_0, PKV_TYPE_Q4_K, PKV_TYPE_Q6_K};
    for (int t = 0; t < 4; t++) {
        const pkv_type ty = types[t];
        const size_t rb = pkv_type_row_bytes(ty, C);
        for (int r = 0; r < R; r++) pkv_quantize_row(ty, w + r * C, wq + r * rb, C);
        for (int th = 1; th <= 3; th += 2) {
            pkv_device_params dp = pkv_device_default_params();
            dp.n_threads = th;
            pkv_device *dev = pkv_device_open("cpu", dp);
            NEED(dev);
            pkv_buffer *bw = upload(dev, wq, R * rb, 0), *bx = upload(dev, x, sizeof x, 0),
                       *by = upload(dev, NULL, sizeof y1, 0);
            NEED(bw && bx && by);
            pkv_k_matmul_args a = {pkv_tref_make(bw, 0), ty, R, C, pkv_tref_make(bx, 0), pkv_tref_make(by, 0), N};
            CHECK_OK(pkv_k_matmul(dev, &a));
            CHECK_OK(pkv_buffer_read(by, 0, th == 1 ? y1 : y3, sizeof y1));
            pkv_buffer_free(bw);
            pkv_buffer_free(bx);
            pkv_buffer_free(by);
            pkv_device_close(dev);
        }
        CHECK_MEM(y1, y3, sizeof y1);
    }
}

/* A matmul row's result does not depend on the batch: each of N x rows computed
 * alone equals the same row inside calls of many sizes (bitwise): 1, 3, 4, 5
 * (groups of 4 and single rows), 8, 9, 16, 17 (groups of 8 of the batched
 * decode/prefill dots plus remainders) and 64, at several offsets, with weight
 * rows and x rows that do not fill the register tiles and a column tail, on
 * every path and weight type (fork == replay relies on this). */
static void test_batch_deterministic(void) {
    const char *paths[TH_MAX_CPU_PATHS];
    const int np = th_cpu_paths(paths);
    static const pkv_type types[] = {PKV_TYPE_F32,    PKV_TYPE_F16,    PKV_TYPE_BF16,    PKV_TYPE_Q8_0,   PKV_TYPE_Q4_0,
                              PKV_TYPE_Q4_K,   PKV_TYPE_Q5_K,   PKV_TYPE_Q6_K,    PKV_TYPE_MXFP4,  PKV_TYPE_Q4_1,
                              PKV_TYPE_Q5_0,   PKV_TYPE_Q5_1,   PKV_TYPE_Q2_K,    PKV_TYPE_Q3_K,   PKV_TYPE_IQ4_NL,
                              PKV_TYPE_IQ4_XS, PKV_TYPE_IQ3_XXS, PKV_TYPE_IQ3_S,  PKV_TYPE_IQ2_XXS, PKV_TYPE_IQ2_XS,
                              PKV_TYPE_IQ2_S,  PKV_TYPE_IQ1_S,  PKV_TYPE_IQ1_M,   PKV_TYPE_TQ1_0,  PKV_TYPE_TQ2_0};
    static const int sizes[] = {1, 3, 4, 5, 8, 9, 16, 17, 64};
    enum { R = 37, N = 64, CMAX = 512 }; /* N >= 8: f16/bf16 widen their weight rows; R: two groups of
                                          * 16 rows of the amx path and a tail */
    static float w[R * CMAX], x[N * CMAX], yb[N * R], ya[N * R], ref[N * R];
    static uint8_t wq[R * CMAX * 4];
    fill(w, R * CMAX, 1.0f);
    fill(x, N * CMAX, 1.0f);
    for (int p = 0; p < np; p++) {
        setenv("PKV_CPU_PATH", paths[p], 1);
        pkv_device_params dp = pkv_device_default_params();
        dp.n_threads = 2;
        pkv_device *dev = pkv_device_open("cpu", dp);
        NEED(dev);
        for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
            const pkv_type ty = types[t];
            const int C = pkv_type_block_elems(ty) == 1 ? 203 : pkv_type_block_elems(ty) == 32 ? 96 : 512;
            const size_t rb = pkv_type_row_bytes(ty, C);
            for (int r = 0; r < R; r++) pkv_quantize_row(ty, w + r * C, wq + r * rb, C);
            pkv_buffer *bw = upload(dev, wq, R * rb, 0), *bx = upload(dev, x, sizeof x, 0),
                       *by = upload(dev, NULL, sizeof yb, 0);
            NEED(bw && bx && by);
            pkv_k_matmul_args a = {pkv_tref_make(bw, 0), ty, R, C, pkv_tref_make(bx, 0), pkv_tref_make(by, 0), 1};
            /* every row alone; close to the reference (an odd number of q8_0 blocks) */
            for (int i = 0; i < N; i++) {
                a.x = pkv_tref_make(bx, (size_t)i * C * 4);
                CHECK_OK(pkv_k_matmul(dev, &a));
                CHECK_OK(pkv_buffer_read(by, 0, ya + i * R, R * sizeof(float)));
                for (int r = 0; r < R; r++) ref[i * R + r] = (float)pkv_dot_ref(ty, wq + r * rb, x + i * C, C);
            }
            CHECK(th_nmse(ref, ya, N * R) < (pkv_type_block_elems(ty) == 1 ? 1e-9 : 1e-4));
            for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
                const int n = sizes[k];
                for (int s0 = 0; s0 + n <= N; s0 += n < 16 ? 23 : N) { /* several offsets for small batches */
                    a.x = pkv_tref_make(bx, (size_t)s0 * C * 4);
                    a.n = n;
                    CHECK_OK(pkv_k_matmul(dev, &a));
                    CHECK_OK(pkv_buffer_read(by, 0, yb, (size_t)n * R * sizeof(float)));
                    for (int i = 0; i < n; i++)
                        if (memcmp(ya + (s0 + i) * R, yb + i * R, R * sizeof(float)) != 0)
                            fprintf(stderr, "batch vs alone differ: path %s type %s batch %d row %d\n", paths[p],
                                    pkv_type_name(ty), n, s0 + i);
                    CHECK_MEM(ya + s0 * R, yb, (size_t)n * R * sizeof(float));
                }
            }
            pkv_buffer_free(bw);
            pkv_buffer_free(bx);
            pkv_buffer_free(by);
        }
        pkv_device_close(dev);
    }
    unsetenv("PKV_CPU_PATH");
}

/* The ARM paths form each unit's integer dot with different instructions
 * (SMULL/SADALP, SDOT, SMMLA on pairs of weight rows) but sum it exactly before
 * any float operation, and share the float part: their matmuls agree bit for
 * bit, for every weight type, at batch sizes that pair rows and leave one over
 * (37 weight rows, 9 and 2 activation rows), on 1 and 3 threads. */
static void test_arm_paths_agree(void) {
#ifdef PKV_CPU_ARM
    const char *paths[TH_MAX_CPU_PATHS];
    const int np = th_cpu_paths(paths);
    enum { R = 37, N = 9, C = 512 };
    static float w[R * C], x[N * C], y[N * R], y0[N * R];
    static uint8_t wq[R * C * 4];
    fill(w, R * C, 1.0f);
    fill(x, N * C, 1.0f);
    int compared = 0;
    for (int t = 0; t < PKV_TYPE_COUNT; t++) {
        const pkv_type ty = (pkv_type)t;
        if (!pkv_qblock_decoder(ty) && ty != PKV_TYPE_Q8_0 && ty != PKV_TYPE_Q4_0 && ty != PKV_TYPE_Q4_K &&
            ty != PKV_TYPE_Q5_K && ty != PKV_TYPE_Q6_K && ty != PKV_TYPE_MXFP4)
            continue;
        const size_t rb = pkv_type_row_bytes(ty, C);
        for (int r = 0; r < R; r++) pkv_quantize_row(ty, w + r * C, wq + r * rb, C);
        bool first = true;
        for (int p = 0; p < np; p++) {
            if (!strcmp(paths[p], "generic")) continue;
            setenv("PKV_CPU_PATH", paths[p], 1);
            for (int th = 1; th <= 3; th += 2)
                for (int n = N; n >= 2; n -= N - 2) {
                    pkv_device_params dp = pkv_device_default_params();
                    dp.n_threads = th;
                    pkv_device *dev = pkv_device_open("cpu", dp);
                    NEED(dev);
                    pkv_buffer *bw = upload(dev, wq, R * rb, 0), *bx = upload(dev, x, sizeof x, 0),
                               *by = upload(dev, NULL, sizeof y, 0);
                    NEED(bw && bx && by);
                    pkv_k_matmul_args a = {pkv_tref_make(bw, 0), ty, R, C, pkv_tref_make(bx, 0), pkv_tref_make(by, 0), n};
                    CHECK_OK(pkv_k_matmul(dev, &a));
                    CHECK_OK(pkv_buffer_read(by, 0, y, (size_t)n * R * sizeof(float)));
                    if (first && n == N) memcpy(y0, y, sizeof y);
                    else if (memcmp(y, y0, (size_t)n * R * sizeof(float)) != 0)
                        TH_FAIL("type %s: path %s (%d threads, %d rows) differs from path %s", pkv_type_name(ty),
                                paths[p], th, n, "the first ARM path");
                    th_checks++;
                    first = false;
                    pkv_buffer_free(bw);
                    pkv_buffer_free(bx);
                    pkv_buffer_free(by);
                    pkv_device_close(dev);
                }
            compared++;
        }
    }
    unsetenv("PKV_CPU_PATH");
    printf("ARM paths compared bitwise: %d (type, path) runs\n", compared);
#endif
}

/* rope on the device: every path, f32 and f16 rows, normal and neox, rows with
 * repeated and changing positions (cos/sin are reused across a run of equal
 * positions), all bitwise equal to the same rows rotated one call per row on
 * the generic path (scalar conversions), and close to the reference. */
static void test_rope_paths(void) {
    const char *paths[TH_MAX_CPU_PATHS];
    const int np = th_cpu_paths(paths);
    enum { NR = 9, H = 3, D = 40 };
    static const int32_t pos[NR] = {5, 5, 5, -3, -3, 70000, 5, 0, 123456};
    static float x0[NR * H * D], want[NR * H * D];
    static uint8_t got[NR * H * D * 4], one[NR * H * D * 4];
    fill(x0, NR * H * D, 2.0f);
    for (int f16 = 0; f16 <= 1; f16++)
        for (int neox = 0; neox <= 1; neox++) {
            const size_t es = f16 ? 2 : 4, rs = (size_t)H * D * es;
            uint8_t raw[NR * H * D * 4];
            for (int e = 0; e < NR * H * D; e++) {
                if (f16) {
                    const uint16_t h = pkv_f32_to_f16(x0[e]);
                    memcpy(raw + 2 * e, &h, 2);
                } else
                    memcpy(raw + 4 * e, &x0[e], 4);
            }
            pkv_k_rope_args a = {0};
            a.dtype = f16 ? PKV_TYPE_F16 : PKV_TYPE_F32;
            a.row_stride = rs;
            a.n_heads = H;
            a.head_dim = D;
            a.n_rot = 32;
            a.neox = neox;
            a.freq_base = 10000.0f;
            a.freq_scale = 1.0f;
            for (int p = 0; p < np; p++) {
                setenv("PKV_CPU_PATH", paths[p], 1);
                pkv_device *dev = pkv_device_open("cpu", pkv_device_default_params());
                NEED(dev);
                pkv_buffer *bx = upload(dev, raw, NR * rs, 0), *bp = upload(dev, pos, sizeof pos, 0);
                NEED(bx && bp);
                a.x = pkv_tref_make(bx, 0);
                a.pos = pkv_tref_make(bp, 0);
                a.n_rows = a.max_rows = NR;
                CHECK_OK(pkv_k_rope(dev, &a));
                CHECK_OK(pkv_buffer_read(bx, 0, got, NR * rs));
                if (p == 0) {
                    /* one row per call */
                    CHECK_OK(pkv_buffer_write(bx, 0, raw, NR * rs));
                    for (int r = 0; r < NR; r++) {
                        a.x = pkv_tref_make(bx, r * rs);
                        a.pos = pkv_tref_make(bp, (size_t)r * 4);
                        a.n_rows = a.max_rows = 1;
                        CHECK_OK(pkv_k_rope(dev, &a));
                    }
                    CHECK_OK(pkv_buffer_read(bx, 0, one, NR * rs));
                    float xr[NR * H * D];
                    for (int e = 0; e < NR * H * D; e++) {
                        if (f16) {
                            uint16_t h;
                            memcpy(&h, raw + 2 * e, 2);
                            xr[e] = pkv_f16_to_f32(h);
                        } else
                            memcpy(&xr[e], raw + 4 * e, 4);
                    }
                    pkv_k_rope_args ra = a;
                    ra.dtype = PKV_TYPE_F32;
                    ra.row_stride = (size_t)H * D * 4;
                    ra.n_rows = ra.max_rows = NR;
                    pkv_ref_rope(&ra, xr, pos, NULL, NULL);
                    memcpy(want, xr, sizeof want);
                    float gf[NR * H * D];
                    for (int e = 0; e < NR * H * D; e++) {
                        if (f16) {
                            uint16_t h;
                            memcpy(&h, got + 2 * e, 2);
                            gf[e] = pkv_f16_to_f32(h);
                        } else
                            memcpy(&gf[e], got + 4 * e, 4);
                    }
                    CHECK(th_nmse(want, gf, NR * H * D) < (f16 ? 1e-6 : 1e-8));
                }
                if (memcmp(got, one, NR * rs) != 0)
                    fprintf(stderr, "rope differs: path %s %s %s\n", paths[p], f16 ? "f16" : "f32", neox ? "neox" : "normal");
                CHECK_MEM(got, one, NR * rs);
                pkv_buffer_free(bx);
                pkv_buffer_free(bp);
                pkv_device_close(dev);
            }
        }
    unsetenv("PKV_CPU_PATH");
}

/* set_rows to f16 rounds exactly as pkv_f32_to_f16 on every path (vectorized
 * where the path has F16C): ties, subnormals, overflow, infinities, NaN. */
static void test_set_rows_f16_paths(void) {
    const char *paths[TH_MAX_CPU_PATHS];
    const int np = th_cpu_paths(paths);
    enum { E = 37 };
    float src[2 * E];
    fill(src, 2 * E, 3.0f);
    const uint32_t special[] = {0x3f801000u, 0x3f803000u, 0x33000000u, 0x33000001u, 0x387fc000u, 0x477ff000u,
                                0x477fefffu, 0x7f800000u, 0xff800000u, 0x7fc00001u, 0x80000000u, 0x38800000u, 0x2f000000u};
    for (size_t k = 0; k < sizeof special / sizeof special[0]; k++) memcpy(&src[3 * k], &special[k], 4);
    uint16_t want[2 * E], got[2 * E];
    for (int e = 0; e < 2 * E; e++) want[e] = pkv_f32_to_f16(src[e]);
    const int32_t idx[2] = {1, 0};
    for (int p = 0; p < np; p++) {
        setenv("PKV_CPU_PATH", paths[p], 1);
        pkv_device *dev = pkv_device_open("cpu", pkv_device_default_params());
        NEED(dev);
        pkv_buffer *bs = upload(dev, src, sizeof src, 0), *bd = upload(dev, NULL, sizeof got, 0),
                   *bi = upload(dev, idx, sizeof idx, 0);
        NEED(bs && bd && bi);
        pkv_k_set_rows_args sr = {pkv_tref_make(bs, 0), E * 4, pkv_tref_make(bd, 0), PKV_TYPE_F16, E * 2, 2,
                                  pkv_tref_make(bi, 0), 2, E};
        CHECK_OK(pkv_k_set_rows(dev, &sr));
        CHECK_OK(pkv_buffer_read(bd, 0, got, sizeof got));
        CHECK_MEM(got, want + E, E * 2); /* source row 1 went to row 0 */
        CHECK_MEM(got + E, want, E * 2);
        pkv_buffer_free(bs);
        pkv_buffer_free(bd);
        pkv_buffer_free(bi);
        pkv_device_close(dev);
    }
    unsetenv("PKV_CPU_PATH");
}

static void test_device_attention_and_misc(void) {
    pkv_device *dev = pkv_device_open("cpu", pkv_device_default_params());
    NEED(dev);
    /* the shared-page GQA case above, on the device */
    static float q[AQ * AH * ADK], k[ANP * APS * AKV * ADK], v[ANP * APS * AKV * ADV], out[AQ * AH * ADV],
        ref[AQ * AH * ADV];
    fill(q, sizeof q / 4, 3.0f);
    fill(k, sizeof k / 4, 1.0f);
    fill(v, sizeof v / 4, 1.0f);
    pkv_k_attention_args a;
    attn_args(&a, PKV_TYPE_F32);
    pkv_ref_attention(&a, q, k, v, k_meta, ref);
    pkv_buffer *bq = upload(dev, q, sizeof q, 4), *bk = upload(dev, k, sizeof k, 8), *bv = upload(dev, v, sizeof v, 12),
               *bo = upload(dev, NULL, sizeof out, 16), *bm = upload(dev, k_meta, sizeof k_meta, 20);
    NEED(bq && bk && bv && bo && bm);
    a.q = pkv_tref_make(bq, 4);
    a.k = pkv_tref_make(bk, 8);
    a.v = pkv_tref_make(bv, 12);
    a.out = pkv_tref_make(bo, 16);
    a.meta = pkv_tref_make(bm, 20);
    CHECK_OK(pkv_k_attention(dev, &a));
    CHECK_OK(pkv_buffer_read(bo, 16, out, sizeof out));
    CHECK(th_nmse(ref, out, sizeof out / 4) < 1e-10);
    /* misaligned f32 argument: refused with a message, not read misaligned */
    a.q = pkv_tref_make(bq, 2);
    CHECK_STATUS(pkv_k_attention(dev, &a), PKV_ERR_INVALID);
    CHECK_MSG("aligned");
    pkv_buffer_free(bq);
    pkv_buffer_free(bk);
    pkv_buffer_free(bv);
    pkv_buffer_free(bo);
    pkv_buffer_free(bm);
    /* every weight type of the reference that the CPU claims */
    CHECK(pkv_device_supports_weight(dev, PKV_TYPE_Q6_K));
    CHECK(pkv_device_supports_weight(dev, PKV_TYPE_BF16));
    CHECK(!pkv_device_supports_weight(dev, PKV_TYPE_I32));
    for (int t = 0; t < PKV_TYPE_COUNT; t++)
        if (pkv_qblock_decoder((pkv_type)t)) CHECK(pkv_device_supports_weight(dev, (pkv_type)t));
    pkv_device_close(dev);
}

/* Which weight types run on the slow fallback, per path: every type with an
 * integer form on the generic path; on avx2/avx512 all but the ones with
 * kernels of their own (q5_0, q2_k, q3_k, iq4_nl, iq4_xs, iq3_s; on the ARM
 * paths q4_1 and q5_1 too). The types of the first kernels are fast
 * everywhere; i32 is not a weight type. */
static void test_weight_speed(void) {
    const char *paths[TH_MAX_CPU_PATHS];
    const int np = th_cpu_paths(paths);
    for (int p = 0; p < np; p++) {
        if (!strcmp(paths[p], "amx")) continue; /* the avx512 table */
        setenv("PKV_CPU_PATH", paths[p], 1);
        pkv_device *dev = pkv_device_open("cpu", pkv_device_default_params());
        NEED(dev);
        const bool simd = p > 0 && strstr(pkv_device_get_caps(dev)->description, paths[p]) != NULL;
#ifdef PKV_CPU_ARM
        CHECK_INT(pkv_device_weight_speed(dev, PKV_TYPE_Q4_1), simd ? PKV_WEIGHT_FAST : PKV_WEIGHT_SLOW);
        CHECK_INT(pkv_device_weight_speed(dev, PKV_TYPE_Q5_1), simd ? PKV_WEIGHT_FAST : PKV_WEIGHT_SLOW);
#endif
        CHECK_INT(pkv_device_weight_speed(dev, PKV_TYPE_Q4_K), PKV_WEIGHT_FAST);
        CHECK_INT(pkv_device_weight_speed(dev, PKV_TYPE_Q8_0), PKV_WEIGHT_FAST);
        CHECK_INT(pkv_device_weight_speed(dev, PKV_TYPE_I32), PKV_WEIGHT_NONE);
        CHECK_INT(pkv_device_weight_speed(dev, PKV_TYPE_IQ2_XXS), PKV_WEIGHT_SLOW);
        CHECK_INT(pkv_device_weight_speed(dev, PKV_TYPE_TQ1_0), PKV_WEIGHT_SLOW);
        static const pkv_type own[] = {PKV_TYPE_Q5_0, PKV_TYPE_Q2_K,  PKV_TYPE_Q3_K,
                                       PKV_TYPE_IQ4_NL, PKV_TYPE_IQ4_XS, PKV_TYPE_IQ3_S};
        for (int i = 0; i < 6; i++)
            if (p == 0 || simd) CHECK_INT(pkv_device_weight_speed(dev, own[i]), simd ? PKV_WEIGHT_FAST : PKV_WEIGHT_SLOW);
        pkv_device_close(dev);
    }
    unsetenv("PKV_CPU_PATH");
}

/* The faulty device (offset reads return bytes from offset 0, DESIGN.md failure
 * 1) must fail the kernel suite, because results are read back at offsets. */
static void test_faulty_caught(void) {
    setenv("PKV_FAULTY_DEVICE", "1", 1);
    pkv_device *dev = pkv_device_open("faulty", pkv_device_default_params());
    unsetenv("PKV_FAULTY_DEVICE");
    NEED(dev);
    suite_log l;
    memset(&l, 0, sizeof l);
    pkv_check_params p = {0};
    CHECK_STATUS(pkv_check_kernels(dev, p, on_row_quiet, &l), PKV_ERR_DEVICE);
    CHECK(l.failed >= 20); /* nearly every kernel reads its result at an offset */
    pkv_device_close(dev);
}

/* Values read from memory that no host check sees are guarded as device.h says:
 * bad page ids and causal limits past a sequence's pages skip tokens, a bad
 * sequence id gives zeros, out-of-range rope rows and set_rows indices are
 * skipped, out-of-range get_rows ids give zeros. The CPU must match the
 * reference exactly in what it touches, and never crash. */
static void test_guards(void) {
    pkv_device *dev = pkv_device_open("cpu", pkv_device_default_params());
    NEED(dev);
    /* attention: q0 sees 30 tokens of a 2-page sequence (8 valid), q1 has sequence
     * 7 (of 2), q2's sequence has only bad page ids, q3 is normal */
    enum { H = 2, KV = 1, D = 8, PS = 4, NP = 3 };
    const int32_t meta[] = {0, 7, 1, 0, /* q_seq */ 30, 3, 4, 5, /* q_len */ 0, 2, 4, /* indptr */ 2, 0, -1, 3};
    static float q[4 * H * D], k[NP * PS * KV * D], v[NP * PS * KV * D], out[4 * H * D], ref[4 * H * D];
    fill(q, sizeof q / 4, 1.0f);
    fill(k, sizeof k / 4, 1.0f);
    fill(v, sizeof v / 4, 1.0f);
    pkv_k_attention_args a = {.k_type = PKV_TYPE_F32, .v_type = PKV_TYPE_F32, .n_q = 4, .n_seq = 2, .meta_pages = 4,
                              .n_pages = NP, .page_size = PS, .n_head = H, .n_kv = KV, .dk = D, .dv = D, .scale = 0.5f};
    pkv_ref_attention(&a, q, k, v, meta, ref);
    int zeros = 0;
    for (int e = H * D; e < 3 * H * D; e++) zeros += ref[e] == 0.0f; /* q1 and q2 see nothing */
    CHECK_INT(zeros, 2 * H * D);
    pkv_buffer *bq = upload(dev, q, sizeof q, 0), *bk = upload(dev, k, sizeof k, 0), *bv = upload(dev, v, sizeof v, 0),
               *bo = upload(dev, NULL, sizeof out, 0), *bm = upload(dev, meta, sizeof meta, 0);
    NEED(bq && bk && bv && bo && bm);
    a.q = pkv_tref_make(bq, 0);
    a.k = pkv_tref_make(bk, 0);
    a.v = pkv_tref_make(bv, 0);
    a.out = pkv_tref_make(bo, 0);
    a.meta = pkv_tref_make(bm, 0);
    CHECK_OK(pkv_k_attention(dev, &a));
    CHECK_OK(pkv_buffer_read(bo, 0, out, sizeof out));
    CHECK(th_nmse(ref, out, sizeof out / 4) < 1e-12);
    pkv_buffer_free(bq);
    pkv_buffer_free(bk);
    pkv_buffer_free(bv);
    pkv_buffer_free(bo);
    pkv_buffer_free(bm);

    /* rope with a row list holding -1 and max_rows: those are skipped */
    float x[3 * 8], xr[3 * 8];
    fill(x, 24, 1.0f);
    memcpy(xr, x, sizeof x);
    const int32_t rows[3] = {-1, 2, 3}, pos[3] = {5, 6, 7};
    pkv_k_rope_args r = {0};
    r.dtype = PKV_TYPE_F32;
    r.n_rows = 3;
    r.max_rows = 3;
    r.row_stride = 8 * 4;
    r.n_heads = 1;
    r.head_dim = 8;
    r.n_rot = 8;
    r.freq_base = 10000.0f;
    r.freq_scale = 1.0f;
    pkv_ref_rope(&r, xr, pos, rows, NULL);
    pkv_buffer *bx = upload(dev, x, sizeof x, 0), *bp = upload(dev, pos, sizeof pos, 0), *br = upload(dev, rows, sizeof rows, 0);
    NEED(bx && bp && br);
    r.x = pkv_tref_make(bx, 0);
    r.pos = pkv_tref_make(bp, 0);
    r.rows = pkv_tref_make(br, 0);
    CHECK_OK(pkv_k_rope(dev, &r));
    CHECK_OK(pkv_buffer_read(bx, 0, x, sizeof x));
    CHECK_MEM(x, xr, 16 * sizeof(float)); /* rows 0 and 1 untouched */
    CHECK(th_nmse(xr, x, 24) < 1e-12);    /* row 2 rotated as the reference does */
    pkv_buffer_free(bx);
    pkv_buffer_free(bp);
    pkv_buffer_free(br);

    /* set_rows: index 5 of 4 rows and -3 are skipped */
    float src[3 * 4], dst[4 * 4], dref[4 * 4];
    fill(src, 12, 1.0f);
    fill(dst, 16, 1.0f);
    memcpy(dref, dst, sizeof dst);
    const int32_t idx[3] = {5, 1, -3};
    pkv_k_set_rows_args sr = {{0}, 16, {0}, PKV_TYPE_F32, 16, 4, {0}, 3, 4};
    pkv_ref_set_rows(&sr, src, dref, idx);
    pkv_buffer *bs = upload(dev, src, sizeof src, 0), *bd = upload(dev, dst, sizeof dst, 0), *bi = upload(dev, idx, sizeof idx, 0);
    NEED(bs && bd && bi);
    sr.src = pkv_tref_make(bs, 0);
    sr.dst = pkv_tref_make(bd, 0);
    sr.idx = pkv_tref_make(bi, 0);
    CHECK_OK(pkv_k_set_rows(dev, &sr));
    CHECK_OK(pkv_buffer_read(bd, 0, dst, sizeof dst));
    CHECK_MEM(dst, dref, sizeof dst);
    CHECK_MEM(dst + 4, src + 4, 4 * sizeof(float)); /* row 1 written from source row 1 */
    pkv_buffer_free(bs);
    pkv_buffer_free(bd);
    pkv_buffer_free(bi);
    pkv_device_close(dev);
}

/* Every path's activation quantizer gives the generic one's bytes exactly. */
static void test_q8a_paths(void) {
    enum { NB = 40 };
    static float x[NB * 32];
    static pkv_q8a want[NB], got[NB];
    fill(x, NB * 32, 3.0f);
    for (int j = 0; j < 32; j++) x[32 + j] = 0.0f;                  /* an all-zero block */
    for (int j = 0; j < 32; j++) x[64 + j] = (float)(j - 16) * 0.5f; /* ties at .5 after scaling */
    x[64 + 31] = 63.5f;                                                /* amax 63.5: d = 0.5, x*id = 2j - 32 */
    x[96] = 1e-30f;                                                    /* a tiny block */
    for (int j = 1; j < 32; j++) x[96 + j] = 0.0f;
    pkv_cpu_quantize_q8a(x, want, NB);
    CHECK(want[1].d == 0.0f && want[1].s[0] == 0 && want[1].qs[5] == 0);
    int checked = 0;
#ifdef PKV_CPU_ARM
    memset(got, 0x55, sizeof got);
    pkv_cpu_dots_neon.q8a(x, got, NB); /* Advanced SIMD: every aarch64 CPU */
    for (int b = 0; b < NB; b++) {
        CHECK(got[b].d == want[b].d);
        CHECK(got[b].ds == want[b].ds);
        CHECK_INT(got[b].s[0], want[b].s[0]);
        CHECK_INT(got[b].s[1], want[b].s[1]);
        CHECK_MEM(got[b].qs, want[b].qs, 32);
    }
    checked++;
#endif
#ifdef PKV_CPU_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) { /* F16C comes with AVX2 */
        memset(got, 0x55, sizeof got);
        pkv_cpu_dots_avx2.q8a(x, got, NB);
        for (int b = 0; b < NB; b++) {
            CHECK(got[b].d == want[b].d);
            CHECK_INT(got[b].s[0], want[b].s[0]);
            CHECK_INT(got[b].s[1], want[b].s[1]);
            CHECK_MEM(got[b].qs, want[b].qs, 32);
        }
        checked++;
    }
#endif
    if (!checked) fprintf(stderr, "note: no SIMD quantizer on this CPU; only the generic one ran\n");
}

/* q4_k on the repacked layout (cpu-repack.c: weights of a wrapped buffer, groups
 * of 8 rows) against the plain layout (the same bytes in an allocated buffer)
 * bit for bit: 29 rows (3 groups and 5 tail rows on the plain layout), random
 * block bytes (every 6-bit scale and min, nibbles up to 15) against activation
 * rows that include saturated ones (quants of +-127: the AVX2 dot's int16 sums
 * at their largest), n = 1, 2, 7, 16, 33, on every path. On avx2 and avx512
 * pkv_device_weight_layout must say the weight was repacked (and a 5-row weight
 * not); freeing the wrapped buffer forgets the copy. */
static void test_q4k_repacked(void) {
    const char *paths[TH_MAX_CPU_PATHS];
    const int np = th_cpu_paths(paths);
    enum { R = 29, C = 768, N = 33, R5 = 5 };
    const size_t rb = pkv_type_row_bytes(PKV_TYPE_Q4_K, C);
    static uint8_t wq[R * 3 * 144];
    static float x[N * C], ya[N * R], yb[N * R];
    for (size_t i = 0; i < sizeof wq; i++) wq[i] = (uint8_t)(th_rand(&g_seed) >> 7);
    for (int r = 0; r < R; r++)
        for (int b = 0; b < C / 256; b++) {
            uint8_t *blk = wq + r * rb + b * 144;
            const uint16_t d = pkv_f32_to_f16(0.001f + 0.01f * fabsf(th_randf(&g_seed)));
            const uint16_t dm = pkv_f32_to_f16(0.002f * fabsf(th_randf(&g_seed)));
            memcpy(blk, &d, 2);
            memcpy(blk + 2, &dm, 2);
        }
    fill(x, N * C, 2.0f);
    for (int j = 0; j < C; j++) {
        x[j] = 3.0f;                          /* row 0: every quant 127 */
        x[C + j] = j & 1 ? -5.0f : 5.0f;      /* row 1: +-127 */
    }
    static const int ns[] = {1, 2, 7, 16, 33};
    for (int p = 0; p < np; p++) {
        pkv_device *dev = open_path(paths[p]);
        NEED(dev);
        pkv_buffer *bp = upload(dev, wq, sizeof wq, 0), *bw = pkv_buffer_wrap_host(dev, wq, sizeof wq);
        pkv_buffer *b5 = pkv_buffer_wrap_host(dev, wq, R5 * rb);
        pkv_buffer *bx = upload(dev, x, sizeof x, 0), *by = upload(dev, NULL, sizeof ya, 0);
        NEED(bp && bw && b5 && bx && by);
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
            pkv_k_matmul_args a = {pkv_tref_make(bp, 0), PKV_TYPE_Q4_K, R, C, pkv_tref_make(bx, 0), pkv_tref_make(by, 0), ns[k]};
            CHECK_OK(pkv_k_matmul(dev, &a));
            CHECK_OK(pkv_buffer_read(by, 0, ya, (size_t)ns[k] * R * sizeof(float)));
            a.w = pkv_tref_make(bw, 0);
            CHECK_OK(pkv_k_matmul(dev, &a));
            CHECK_OK(pkv_buffer_read(by, 0, yb, (size_t)ns[k] * R * sizeof(float)));
            if (memcmp(ya, yb, (size_t)ns[k] * R * sizeof(float)) != 0)
                fprintf(stderr, "q4_k repacked vs plain differ: path %s n %d\n", paths[p], ns[k]);
            CHECK_MEM(ya, yb, (size_t)ns[k] * R * sizeof(float));
            for (int i = 0; i < ns[k] * R; i++) CHECK(isfinite(yb[i]) && yb[i] != 0.0f);
            /* the 5-row weight: the plain layout */
            pkv_k_matmul_args a5 = {pkv_tref_make(b5, 0), PKV_TYPE_Q4_K, R5, C, pkv_tref_make(bx, 0), pkv_tref_make(by, 0), ns[k]};
            CHECK_OK(pkv_k_matmul(dev, &a5));
        }
        char lay[256];
        pkv_device_weight_layout(dev, PKV_TYPE_Q4_K, lay, sizeof lay);
        const bool want = strcmp(paths[p], "avx2") == 0 || strcmp(paths[p], "avx512") == 0;
        const char *expect = want ? "repacked8: 1 weights (10944 bytes), plain: 1 weights (fewer than 8 rows)" : "plain";
        if (strcmp(lay, expect) != 0) fprintf(stderr, "path %s: layout \"%s\", expected \"%s\"\n", paths[p], lay, expect);
        CHECK(strcmp(lay, expect) == 0);
        pkv_buffer_free(bw);
        pkv_buffer_free(b5);
        pkv_device_weight_layout(dev, PKV_TYPE_Q4_K, lay, sizeof lay);
        CHECK(strcmp(lay, "plain") == 0);
        pkv_buffer_free(bp);
        pkv_buffer_free(bx);
        pkv_buffer_free(by);
        pkv_device_close(dev);
    }
    unsetenv("PKV_CPU_PATH");
}

int main(void) {
    test_q8a_paths();
    test_ref_matmul();
    test_ref_rope();
    test_ref_attention();
    test_device_attention_and_misc();
    test_threads_deterministic();
    test_batch_deterministic();
    test_q4k_repacked();
    test_arm_paths_agree();
    test_rope_paths();
    test_set_rows_f16_paths();
    test_paths();
    test_bad_path();
    test_faulty_caught();
    test_weight_speed();
    test_guards();
    CHECK_INT(pkv_alloc_live(), 0);
    return th_done();
}
