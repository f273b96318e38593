// labels: device cuda timeout=900
/* The CUDA backend on cuda:0. Skipped (77) when no CUDA device opens, so it can
 * never pass without a GPU; a device that is listed must open.
 *   - conformance: pkv_check_transfers, pkv_check_cross with the CPU both ways,
 *     pkv_check_kernels (every kernel and weight type against the reference);
 *   - geglu over [-12, 12] against a double-precision loop; get_rows with
 *     scale 0 (exact copies) and 11.3 (one f32 multiply, bit for bit) for f32,
 *     f16, q8_0 and q4_k rows;
 *   - transfers past the staging limit, batched region copies of many pages
 *     (chunked, merged, unaligned) against a host shadow, queue order of a copy
 *     before a kernel and of a fill before a read;
 *   - attention on the split-K path (long decode, few heads) and unsplit, f16
 *     and f32 KV, against the double-precision reference; the attention kinds
 *     (sliding window, softcap, sinks, all three) both ways too;
 *   - the model (test-model.c on cuda:0): fork == replay bitwise, swap and
 *     save/load round trips, batches;
 *   - whole-model logits of every architecture and weight type against the CPU:
 *     nmse 1e-5 for f32/f16/bf16 weights, 2e-3 for the block-quantized ones
 *     (the CPU rounds activations to 8 bits, the CUDA kernels do not), and the
 *     k-quants also against the CPU running their f32 twin within 1e-5. */
#define MODEL_DEVICE "cuda:0"
#include "device/device.h"
int model_main(void);
#define main model_main
#include "test-model.c"
#undef main

#include "base/quant.h"
#include "device/cpu/ref.h"
#include "model/gguf.h"

/* ------------------------------------------------------------ conformance */

/* A row may skip only for what the README lists as not on CUDA: rope with
 * LongRoPE's frequency factors, quantized KV pages, and the weight types the
 * device says it lacks (pkv_device_supports_weight; the row names the type last). */
static pkv_device *g_cu;
static bool skip_allowed(const pkv_check_result *r) {
    const size_t tl = strlen(r->test);
    if (tl > 3 && !strcmp(r->test + tl - 3, " ff") && !strncmp(r->test, "kernel rope", 11)) return true;
    if (strstr(r->detail, "KV pages of type q8_0") || strstr(r->detail, "KV pages of type q4_0")) return true;
    const char *ty = strrchr(r->test, ' ');
    if (strncmp(r->test, "kernel matmul ", 14) && strncmp(r->test, "kernel get_rows ", 16)) return false;
    pkv_type t;
    return ty && g_cu && pkv_type_from_name(ty + 1, &t) == PKV_OK && !pkv_device_supports_weight(g_cu, t);
}

static void report_row(const pkv_check_result *r, void *user) {
    (void)user;
    th_checks++;
    fprintf(stderr, "  %-10s %-26s %-4s %6ld  %s\n", r->device, r->test, r->skipped ? "skip" : r->passed ? "ok" : "FAIL",
            r->count, r->detail);
    if (!r->passed && !r->skipped) TH_FAIL("conformance %s on %s: %s", r->test, r->device, r->detail);
    if (r->skipped && !skip_allowed(r)) TH_FAIL("conformance %s on %s skipped: %s", r->test, r->device, r->detail);
}

static void conformance(pkv_device *cu) {
    g_cu = cu;
    pkv_check_params p = pkv_check_default_params();
    CHECK_OK(pkv_check_transfers(cu, p, report_row, NULL));
    pkv_device *cpu = pkv_device_open("cpu", pkv_device_default_params());
    REQUIRE_VOID(cpu != NULL);
    CHECK_OK(pkv_check_cross(cpu, cu, p, report_row, NULL));
    CHECK_OK(pkv_check_cross(cu, cpu, p, report_row, NULL));
    pkv_device_close(cpu);
    pkv_status s = pkv_check_kernels(cu, p, report_row, NULL);
    th_checks++;
    if (s != PKV_OK) TH_FAIL("pkv_check_kernels: %s: %s", pkv_status_str(s), pkv_errmsg());
}

/* -------------------------------------------------------------- transfers */

/* 65 MiB + 3 bytes at offset 5: more than one staging load (64 MiB). */
static void big_transfer(pkv_device *dev) {
    size_t n = ((size_t)65 << 20) + 3;
    pkv_buffer *b = pkv_buffer_alloc(dev, n + 8);
    REQUIRE_VOID(b != NULL);
    uint8_t *h = malloc(n), *back = malloc(n);
    for (size_t i = 0; i < n; i++) h[i] = (uint8_t)(i * 2654435761u >> 13);
    CHECK_OK(pkv_buffer_fill(b, 0, 5, 0x11));
    CHECK_OK(pkv_buffer_write(b, 5, h, n));
    memset(h + n / 2, 0, 16); /* write must have taken its copy already */
    CHECK_OK(pkv_buffer_fill(b, n + 5, 3, 0x22));
    CHECK_OK(pkv_buffer_read(b, 5, back, n));
    for (size_t i = n / 2; i < n / 2 + 16; i++) h[i] = (uint8_t)(i * 2654435761u >> 13);
    CHECK_MEM(back, h, n);
    uint8_t edge[8];
    CHECK_OK(pkv_buffer_read(b, 0, edge, 5));
    CHECK(edge[0] == 0x11 && edge[4] == 0x11);
    CHECK_OK(pkv_buffer_read(b, n + 5, edge, 3));
    CHECK(edge[0] == 0x22 && edge[2] == 0x22);
    pkv_buffer_free(b);
    free(h);
    free(back);
}

/* A fork's page copy on a real shape: 28 layers x 2 (K, V) pages of 32 KiB
 * (several chunks each), plus pages at odd offsets (byte and word paths), in
 * one call; then the same buffer copied within itself. */
static void region_copies(pkv_device *dev) {
    const size_t page = 32 << 10, n_pages = 64, size = n_pages * page + 4096;
    pkv_buffer *a = pkv_buffer_alloc(dev, size), *b = pkv_buffer_alloc(dev, size);
    REQUIRE_VOID(a && b);
    uint8_t *ha = malloc(size), *hb = malloc(size), *got = malloc(size);
    uint64_t rng = 3;
    for (size_t i = 0; i < size; i++) ha[i] = (uint8_t)th_rand(&rng), hb[i] = (uint8_t)th_rand(&rng);
    CHECK_OK(pkv_buffer_write(a, 0, ha, size));
    CHECK_OK(pkv_buffer_write(b, 0, hb, size));
    pkv_region r[64];
    size_t nr = 0;
    for (size_t i = 0; i < 56; i++) r[nr++] = (pkv_region){i * page, ((i * 5) % 56) * page, page}; /* a permutation */
    r[nr++] = (pkv_region){56 * page + 1, 56 * page + 3, page - 5};  /* bytes */
    r[nr++] = (pkv_region){57 * page + 4, 57 * page + 8, page - 12}; /* 4-byte words */
    r[nr++] = (pkv_region){58 * page + 3, 58 * page + 19, 1};        /* one byte */
    r[nr++] = (pkv_region){59 * page, 59 * page, 0};                  /* empty */
    CHECK_OK(pkv_buffer_copy_regions(a, b, r, nr));
    for (size_t i = 0; i < nr; i++) memcpy(hb + r[i].dst_off, ha + r[i].src_off, r[i].size);
    CHECK_OK(pkv_buffer_read(b, 0, got, size));
    CHECK_MEM(got, hb, size);
    /* within one buffer: the lower half's pages to the upper half, reversed */
    nr = 0;
    for (size_t i = 0; i < 32; i++) r[nr++] = (pkv_region){i * page, (63 - i) * page, page};
    CHECK_OK(pkv_buffer_copy_regions(b, b, r, nr));
    for (size_t i = 0; i < nr; i++) memcpy(hb + r[i].dst_off, hb + r[i].src_off, r[i].size);
    CHECK_OK(pkv_buffer_read(b, 0, got, size));
    CHECK_MEM(got, hb, size);
    pkv_buffer_free(a);
    pkv_buffer_free(b);
    free(ha);
    free(hb);
    free(got);
}

/* I3: a write, a copy and a kernel queued without waiting see each other. */
static void queue_order(pkv_device *dev) {
    enum { N = 1 << 20 };
    pkv_buffer *x = pkv_buffer_alloc(dev, N * 4), *y = pkv_buffer_alloc(dev, N * 4), *o = pkv_buffer_alloc(dev, N * 4);
    REQUIRE_VOID(x && y && o);
    float *h = malloc(N * 4), *got = malloc(N * 4);
    for (int round = 0; round < 4; round++) {
        for (int i = 0; i < N; i++) h[i] = (float)(i % 1000) + (float)round;
        CHECK_OK(pkv_buffer_write(x, 0, h, N * 4));
        CHECK_OK(pkv_buffer_copy(x, 0, y, 0, N * 4));
        pkv_k_add_args a = {pkv_tref_make(x, 0), pkv_tref_make(y, 0), pkv_tref_make(o, 0), N, N};
        CHECK_OK(pkv_k_add(dev, &a));
        CHECK_OK(pkv_buffer_fill(x, 0, N * 4, 0));
        CHECK_OK(pkv_buffer_read(o, 0, got, N * 4));
        int bad = 0;
        for (int i = 0; i < N; i++) bad += got[i] != 2 * h[i];
        CHECK_INT(bad, 0);
    }
    pkv_buffer_free(x);
    pkv_buffer_free(y);
    pkv_buffer_free(o);
    free(h);
    free(got);
}

/* ------------------------------------------------- geglu, get_rows scale */

static uint64_t erng = 29;

/* GeGLU: y = gelu(g) * u, the tanh form, against a double-precision loop of the
 * formula in device.h, g over [-12, 12] with the large magnitudes planted: above
 * 9 gelu(x) is x, below -9 it is 0 to f32 precision. On [-6, 0) every element
 * keeps its relative precision (1e-4), which 0.5 x (1 + tanhf(t)) evaluated in
 * f32 does not below x = -4. Out of place, then in place (y = g), same bits. */
static void test_geglu(pkv_device *dev) {
    static const float planted[] = {12.0f, -12.0f, 11.99f, -11.99f, 10.0f, -10.0f, 9.0f, -9.0f, 7.5f, -7.5f,
                                    5.0f,  -5.0f,  4.0f,   -4.0f,   3.0f,  -3.0f,  1.0f, -1.0f, 1e-3f, -1e-3f,
                                    1e-20f, -1e-20f, 0.0f, -0.0f};
    const int64_t np = (int64_t)(sizeof planted / sizeof planted[0]), n = 70001; /* several blocks, a partial one */
    float *g = malloc(sizeof(float) * n), *u = malloc(sizeof(float) * n), *ref = malloc(sizeof(float) * n),
          *got = malloc(sizeof(float) * n), *got2 = malloc(sizeof(float) * n);
    for (int64_t i = 0; i < n; i++) {
        g[i] = i < np ? planted[i] : 12.0f * th_randf(&erng);
        u[i] = i < np ? 1.0f : 2.0f * th_randf(&erng);
    }
    const double c = sqrt(2.0 / M_PI);
    for (int64_t i = 0; i < n; i++) {
        const double x = g[i];
        ref[i] = (float)(0.5 * x * (1.0 + tanh(c * (x + 0.044715 * x * x * x))) * (double)u[i]);
    }
    pkv_buffer *bg = pkv_buffer_alloc(dev, n * 4 + 8), *bu = pkv_buffer_alloc(dev, n * 4 + 4),
               *by = pkv_buffer_alloc(dev, n * 4 + 4);
    REQUIRE_VOID(bg && bu && by);
    CHECK_OK(pkv_buffer_write(bg, 8, g, n * 4));
    CHECK_OK(pkv_buffer_write(bu, 4, u, n * 4));
    pkv_k_swiglu_args a = {.g = pkv_tref_make(bg, 8), .u = pkv_tref_make(bu, 4), .y = pkv_tref_make(by, 0), .n = n,
                           .gelu = true};
    CHECK_OK(pkv_k_swiglu(dev, &a));
    CHECK_OK(pkv_buffer_read(by, 0, got, n * 4));
    double e = th_nmse(ref, got, (size_t)n);
    th_checks++;
    fprintf(stderr, "  geglu [-12, 12] n %lld: nmse %.2e (tol 1e-10)\n", (long long)n, e);
    if (!(e <= 1e-10)) TH_FAIL("geglu: nmse %g > 1e-10", e);
    /* where the curve bends, alone, so that the large values cannot hide it */
    float *rs = malloc(sizeof(float) * n), *gs = malloc(sizeof(float) * n);
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++)
        if (fabsf(g[i]) < 6.0f) rs[m] = ref[i], gs[m] = got[i], m++;
    e = th_nmse(rs, gs, (size_t)m);
    th_checks++;
    fprintf(stderr, "  geglu |g| < 6 (%lld values): nmse %.2e (tol 1e-10)\n", (long long)m, e);
    if (!(e <= 1e-10)) TH_FAIL("geglu |g| < 6: nmse %g > 1e-10", e);
    free(rs), free(gs);
    int big_bad = 0, neg_bad = 0;
    for (int64_t i = 0; i < n; i++) {
        const double x = g[i], xu = fabs(x * u[i]);
        if (x >= 9.0) big_bad += !(fabs((double)got[i] - x * u[i]) <= 1e-6 * xu);
        if (x <= -9.0) big_bad += !(fabs((double)got[i]) <= 1e-6 * xu);
        if (x >= -6.0 && x < 0.0) neg_bad += !(fabs((double)got[i] - ref[i]) <= 1e-4 * fabs((double)ref[i]));
    }
    CHECK_INT(big_bad, 0);
    CHECK_INT(neg_bad, 0);
    a.y = a.g; /* in place */
    CHECK_OK(pkv_k_swiglu(dev, &a));
    CHECK_OK(pkv_buffer_read(bg, 8, got2, n * 4));
    CHECK_MEM(got2, got, n * 4);
    pkv_buffer_free(bg);
    pkv_buffer_free(bu);
    pkv_buffer_free(by);
    free(g), free(u), free(ref), free(got), free(got2);
}

/* get_rows with Gemma's embedding scale. Scale 0: exact copies of the
 * dequantization; 11.3 (and 1): one f32 multiply of the dequantized value, bit
 * for bit (a product of two floats is correctly rounded). Ids out of range stay
 * zeros. Weights at a 2-byte offset unless f32. */
static void test_get_rows_scale(pkv_device *dev, pkv_type t) {
    const int64_t vocab = 13, cols = 512, n = 7;
    const size_t rb = pkv_type_row_bytes(t, (size_t)cols), woff = t == PKV_TYPE_F32 ? 4 : 2;
    const int32_t ids[7] = {12, 0, -1, 5, 13, 12, 3};
    float *wf = malloc(sizeof(float) * vocab * cols), *deqd = malloc(sizeof(float) * vocab * cols);
    float *ref = malloc(sizeof(float) * n * cols), *got = malloc(sizeof(float) * n * cols);
    uint8_t *w = malloc(rb * vocab);
    for (int64_t i = 0; i < vocab * cols; i++) wf[i] = 2.0f * th_randf(&erng);
    for (int64_t r = 0; r < vocab; r++) {
        CHECK_OK(pkv_quantize_row(t, wf + r * cols, w + r * rb, cols));
        CHECK_OK(pkv_dequantize_row(t, w + r * rb, deqd + r * cols, cols));
    }
    pkv_buffer *bw = pkv_buffer_alloc(dev, woff + rb * vocab), *bi = pkv_buffer_alloc(dev, sizeof ids + 4),
               *bo = pkv_buffer_alloc(dev, sizeof(float) * n * cols + 4);
    REQUIRE_VOID(bw && bi && bo);
    CHECK_OK(pkv_buffer_write(bw, woff, w, rb * vocab));
    CHECK_OK(pkv_buffer_write(bi, 4, ids, sizeof ids));
    static const float scales[3] = {0.0f, 11.3f, 1.0f};
    for (int si = 0; si < 3; si++) {
        const float sc = scales[si];
        for (int64_t i = 0; i < n; i++)
            for (int64_t c = 0; c < cols; c++) {
                float v = ids[i] >= 0 && ids[i] < vocab ? deqd[ids[i] * cols + c] : 0.0f;
                ref[i * cols + c] = sc != 0.0f ? v * sc : v;
            }
        CHECK_OK(pkv_buffer_fill(bo, 0, sizeof(float) * n * cols + 4, 0xA5));
        pkv_k_get_rows_args a = {.w = pkv_tref_make(bw, woff), .wtype = t, .n_vocab = vocab, .cols = cols,
                                 .ids = pkv_tref_make(bi, 4), .out = pkv_tref_make(bo, 4), .n = n, .scale = sc};
        CHECK_OK(pkv_k_get_rows(dev, &a));
        CHECK_OK(pkv_buffer_read(bo, 4, got, sizeof(float) * n * cols));
        CHECK_MEM(got, ref, sizeof(float) * n * cols);
        fprintf(stderr, "  get_rows %-5s scale %-4g bit-exact: %s\n", pkv_type_name(t), (double)sc,
                memcmp(got, ref, sizeof(float) * n * cols) ? "NO" : "yes");
    }
    pkv_buffer_free(bw);
    pkv_buffer_free(bi);
    pkv_buffer_free(bo);
    free(wf), free(deqd), free(ref), free(got), free(w);
}

/* -------------------------------------------------------------- attention */

static uint64_t arng = 17;

/* The per-layer options of an attention kind (device.h); all zero: plain. */
typedef struct att_kind {
    int window;    /* tokens; 0 = none */
    float softcap; /* 0 = none */
    bool sinks;    /* random sinks [n_head], one head's -inf */
    int over;      /* each q_len is this many tokens past its sequence's pages
                    * (tokens the reference skips; a window starts from q_len) */
} att_kind;
static const att_kind plain = {.window = 0};

/* n_q queries, each of its own sequence of len[i] tokens on shuffled pages. */
static void attention_case(pkv_device *dev, pkv_type kt, int n_q, const int *len, int n_head, int n_kv, int d,
                           int page_size, att_kind kind) {
    int total_pages = 0;
    for (int i = 0; i < n_q; i++) total_pages += (len[i] + page_size - 1) / page_size;
    const int n_pages = total_pages + 3;
    const size_t es = kt == PKV_TYPE_F16 ? 2 : 4, slots = (size_t)n_pages * page_size * n_kv;
    const size_t nq = (size_t)n_q * n_head * d, no = nq, nkv = slots * d;
    float *q = malloc(nq * 4), *ref = malloc(no * 4), *got = malloc(no * 4), *sinks = malloc((size_t)n_head * 4);
    uint8_t *k = malloc(nkv * es), *v = malloc(nkv * es);
    int32_t *meta = malloc((size_t)(3 * n_q + 1 + total_pages) * 4);
    for (size_t i = 0; i < nq; i++) q[i] = th_randf(&arng) * 2;
    /* around the log of the longest length, so the sink takes a real share; drawn
     * only when used, so the plain cases keep their data */
    int max_len = 1;
    for (int i = 0; i < n_q; i++) max_len = len[i] > max_len ? len[i] : max_len;
    for (int h = 0; kind.sinks && h < n_head; h++)
        sinks[h] = h % 4 == 3 ? -INFINITY : logf((float)max_len) + 3 * th_randf(&arng);
    for (size_t i = 0; i < nkv; i++) {
        float a = th_randf(&arng), b = th_randf(&arng);
        if (kt == PKV_TYPE_F16) {
            uint16_t ha = pkv_f32_to_f16(a), hb = pkv_f32_to_f16(b);
            memcpy(k + 2 * i, &ha, 2);
            memcpy(v + 2 * i, &hb, 2);
        } else {
            memcpy(k + 4 * i, &a, 4);
            memcpy(v + 4 * i, &b, 4);
        }
    }
    int32_t *q_seq = meta, *q_len = meta + n_q, *indptr = meta + 2 * n_q, *pages = indptr + n_q + 1;
    int p = 0;
    indptr[0] = 0;
    for (int i = 0; i < n_q; i++) {
        q_seq[i] = n_q - 1 - i; /* query i reads sequence n_q-1-i */
        q_len[i] = len[n_q - 1 - i] + kind.over;
    }
    for (int s = 0; s < n_q; s++) {
        int np = (len[s] + page_size - 1) / page_size;
        for (int j = 0; j < np; j++, p++) pages[p] = (p * 7 + 3) % n_pages; /* shuffled (shared, like a fork, when 7 divides n_pages) */
        indptr[s + 1] = p;
    }
    pkv_k_attention_args a = {.k_type = kt, .v_type = kt, .n_q = n_q, .n_seq = n_q, .meta_pages = total_pages,
                              .n_pages = n_pages, .page_size = page_size, .n_head = n_head, .n_kv = n_kv,
                              .dk = d, .dv = d, .scale = 1.0f / sqrtf((float)d), .window = kind.window,
                              .softcap = kind.softcap};
    pkv_ref_attention_sinks(&a, q, k, v, meta, kind.sinks ? sinks : NULL, ref);
    pkv_buffer *bq = pkv_buffer_alloc(dev, nq * 4 + 4), *bk = pkv_buffer_alloc(dev, nkv * es),
               *bv = pkv_buffer_alloc(dev, nkv * es), *bo = pkv_buffer_alloc(dev, no * 4 + 8),
               *bm = pkv_buffer_alloc(dev, (size_t)(3 * n_q + 1 + total_pages) * 4),
               *bs = kind.sinks ? pkv_buffer_alloc(dev, (size_t)n_head * 4 + 8) : NULL;
    REQUIRE_VOID(bq && bk && bv && bo && bm && (bs || !kind.sinks));
    if (kind.sinks) {
        CHECK_OK(pkv_buffer_write(bs, 8, sinks, (size_t)n_head * 4));
        a.sinks = pkv_tref_make(bs, 8);
    }
    CHECK_OK(pkv_buffer_write(bq, 4, q, nq * 4));
    CHECK_OK(pkv_buffer_write(bk, 0, k, nkv * es));
    CHECK_OK(pkv_buffer_write(bv, 0, v, nkv * es));
    CHECK_OK(pkv_buffer_fill(bo, 0, no * 4 + 8, 0xA5));
    CHECK_OK(pkv_buffer_write(bm, 0, meta, (size_t)(3 * n_q + 1 + total_pages) * 4));
    a.q = pkv_tref_make(bq, 4);
    a.k = pkv_tref_make(bk, 0);
    a.v = pkv_tref_make(bv, 0);
    a.out = pkv_tref_make(bo, 4);
    a.meta = pkv_tref_make(bm, 0);
    CHECK_OK(pkv_k_attention(dev, &a));
    CHECK_OK(pkv_buffer_read(bo, 4, got, no * 4));
    uint8_t guard[4];
    CHECK_OK(pkv_buffer_read(bo, 0, guard, 4));
    CHECK(guard[0] == 0xA5 && guard[3] == 0xA5);
    CHECK_OK(pkv_buffer_read(bo, 4 + no * 4, guard, 4));
    CHECK(guard[0] == 0xA5 && guard[3] == 0xA5);
    /* a (query, head) that sees no token writes exact zeros, sink or not */
    int blind = 0, bad_zero = 0;
    for (size_t r = 0; r < no; r += (size_t)d) {
        bool zero = true;
        for (int j = 0; j < d; j++) zero &= ref[r + (size_t)j] == 0.0f;
        if (!zero) continue;
        blind++;
        for (int j = 0; j < d; j++) bad_zero += got[r + (size_t)j] != 0.0f;
    }
    CHECK_INT(bad_zero, 0);
    double e = th_nmse(ref, got, no);
    th_checks++;
    fprintf(stderr,
            "  attention %s n_q %d heads %d/%d d %d page %d len[0] %d window %d softcap %g sinks %d over %d: nmse "
            "%.2e (%d blind rows)\n",
            pkv_type_name(kt), n_q, n_head, n_kv, d, page_size, len[0], kind.window, (double)kind.softcap,
            (int)kind.sinks, kind.over, e, blind);
    if (!(e <= 1e-8))
        TH_FAIL("attention %s n_q %d len[0] %d window %d softcap %g sinks %d over %d: nmse %g > 1e-8",
                pkv_type_name(kt), n_q, len[0], kind.window, (double)kind.softcap, (int)kind.sinks, kind.over, e);
    pkv_buffer_free(bq);
    pkv_buffer_free(bk);
    pkv_buffer_free(bv);
    pkv_buffer_free(bo);
    pkv_buffer_free(bm);
    pkv_buffer_free(bs);
    free(q);
    free(sinks);
    free(ref);
    free(got);
    free(k);
    free(v);
    free(meta);
}

static const int long1[1] = {9000}, two[2] = {5000, 3}, four[4] = {1, 700, 4097, 64};

/* The attention kinds (window, softcap, sinks) on dev, f16 KV unless named.
 * With page 16: lens 700 and 64 under a window of 8 stay inside one page
 * ([692, 700) of page 43, [56, 64) of page 3); under 20 the four lens' windows
 * cross a page boundary (but 1 sees its only token); 5000 is more than every
 * q_len (the whole sequence, as plain). */
static void attention_kinds(pkv_device *dev) {
    static const int inpage[2] = {700, 64}, past[2] = {64, 70};
    const pkv_type f16 = PKV_TYPE_F16, f32 = PKV_TYPE_F32;
    attention_case(dev, f16, 4, four, 32, 8, 128, 16, (att_kind){.window = 1});
    attention_case(dev, f16, 2, inpage, 8, 2, 128, 16, (att_kind){.window = 8});
    attention_case(dev, f16, 4, four, 32, 8, 128, 16, (att_kind){.window = 20});
    attention_case(dev, f16, 4, four, 32, 8, 128, 16, (att_kind){.window = 5000});
    attention_case(dev, f16, 1, long1, 8, 2, 128, 16, (att_kind){.window = 3000}); /* split-K inside the window */
    attention_case(dev, f32, 2, two, 4, 4, 64, 32, (att_kind){.window = 100});
    attention_case(dev, f16, 4, four, 32, 8, 128, 16, (att_kind){.softcap = 0.5f});
    attention_case(dev, f16, 1, long1, 8, 2, 128, 16, (att_kind){.softcap = 0.5f});
    attention_case(dev, f16, 4, four, 32, 8, 128, 16, (att_kind){.sinks = true});
    attention_case(dev, f16, 1, long1, 8, 2, 128, 16, (att_kind){.sinks = true});
    attention_case(dev, f32, 2, two, 4, 4, 64, 32, (att_kind){.sinks = true});
    for (int f = 0; f < 2; f++) {
        const pkv_type kt = f ? f32 : f16;
        attention_case(dev, kt, 4, four, 32, 8, 128, 16, (att_kind){.window = 300, .softcap = 0.5f, .sinks = true});
        attention_case(dev, kt, 1, long1, 8, 2, 128, 16, (att_kind){.window = 4000, .softcap = 0.5f, .sinks = true});
        attention_case(dev, kt, 1, long1, 2, 1, 256, 256, (att_kind){.window = 700, .softcap = 30.0f, .sinks = true});
    }
    /* q_len 25 past the pages, window 20: the window starts from q_len, so the
     * query of 64 tokens (no slack in its last page) sees none and writes zeros
     * despite its sink; the one of 70 sees slots [75, 80) of its last page. */
    attention_case(dev, f16, 2, past, 4, 2, 64, 16, (att_kind){.window = 20, .sinks = true, .over = 25});
}

static void test_attention(pkv_device *dev) {
    /* the same cases unsplit and with 64 splits, forced (PKV_CUDA_ATT_SPLIT) */
    static const char *forced[] = {"1", "64"};
    for (int fi = 0; fi < 2; fi++) {
        setenv("PKV_CUDA_ATT_SPLIT", forced[fi], 1);
        pkv_device *d = pkv_device_open("cuda:0", pkv_device_default_params());
        unsetenv("PKV_CUDA_ATT_SPLIT");
        REQUIRE_VOID(d != NULL);
        fprintf(stderr, "  attention with PKV_CUDA_ATT_SPLIT=%s:\n", forced[fi]);
        attention_case(d, PKV_TYPE_F16, 1, long1, 8, 2, 128, 16, plain);
        attention_case(d, PKV_TYPE_F32, 2, two, 4, 4, 64, 32, plain);
        attention_case(d, PKV_TYPE_F16, 4, four, 32, 8, 128, 16, plain);
        attention_kinds(d);
        pkv_device_close(d);
    }
    for (int f = 0; f < 2; f++) {
        pkv_type kt = f ? PKV_TYPE_F32 : PKV_TYPE_F16;
        attention_case(dev, kt, 1, long1, 8, 2, 128, 16, plain); /* split-K: 16 blocks, 9000 tokens */
        attention_case(dev, kt, 2, two, 4, 4, 64, 32, plain);    /* split, one query of 3 tokens (empty splits) */
        attention_case(dev, kt, 4, four, 32, 8, 128, 16, plain); /* 128 blocks: splits only on small GPUs */
        attention_case(dev, kt, 1, long1, 2, 1, 256, 256, plain);
    }
    fprintf(stderr, "  attention kinds, splits chosen per call:\n");
    attention_kinds(dev);
}

/* --------------------------------------------------------------- logits */

static void decode19(pkv_model *m, float *out, bool *ok) {
    *ok = m != NULL;
    if (!m) return;
    pkv_kv_cache *c = cache(m, 16, PKV_TYPE_F16);
    pkv_context *ctx = c ? pkv_context_create(m, c, 0) : NULL;
    int32_t toks[19];
    for (int i = 0; i < 19; i++) toks[i] = (i * 41 + 2) % V;
    *ok = ctx && pkv_context_decode_all(ctx, toks, 19, out) == PKV_OK;
    pkv_context_free(ctx);
    pkv_kv_cache_free(c);
    pkv_model_free(m);
}

#include "kq-twin.h"

static void nmse_check(const char *arch, pkv_type t, const char *vs, const float *a, const float *b, double tol) {
    double e = th_nmse(a, b, 19 * V);
    th_checks++;
    fprintf(stderr, "  %-6s %-5s cuda:0 vs %-15s nmse %.2e (tol %.0e)\n", arch, pkv_type_name(t), vs, e, tol);
    if (!(e <= tol)) TH_FAIL("%s %s vs %s: nmse %g > %g", arch, pkv_type_name(t), vs, e, tol);
}

static void test_logits(void) {
    static const char *archs[] = {"llama", "qwen2", "qwen3"};
    static const pkv_type types[] = {PKV_TYPE_F32, PKV_TYPE_F16, PKV_TYPE_BF16, PKV_TYPE_Q8_0, PKV_TYPE_Q4_0,
                                     PKV_TYPE_Q4_K, PKV_TYPE_Q5_K, PKV_TYPE_Q6_K};
    static float a[19 * V], b[19 * V], t32[19 * V];
    for (int ai = 0; ai < 3; ai++)
        for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
            pkv_type t = types[ti];
            bool kq = pkv_type_block_elems(t) == 256;
            bool ok_c, ok_g;
            if (!kq) {
                decode19(make(archs[ai], t, 2, "cpu"), a, &ok_c);
                decode19(make(archs[ai], t, 2, "cuda:0"), b, &ok_g);
                if (!ok_c || !ok_g) {
                    TH_FAIL("%s %s: %s", archs[ai], pkv_type_name(t), pkv_errmsg());
                    continue;
                }
                nmse_check(archs[ai], t, "cpu", a, b, pkv_type_block_elems(t) > 1 ? 2e-3 : 1e-5);
                continue;
            }
            pkv_mkmodel_params p = kq_params(archs[ai], t);
            void *img, *twin;
            size_t size, twin_size;
            if (pkv_mkmodel_memory(&p, &img, &size)) {
                TH_FAIL("mkmodel %s %s: %s", archs[ai], pkv_type_name(t), pkv_errmsg());
                continue;
            }
            bool ok_t;
            decode19(kq_load(img, size, "cpu"), a, &ok_c);
            decode19(kq_load(img, size, "cuda:0"), b, &ok_g);
            ok_t = kq_twin(&p, img, size, &twin, &twin_size);
            if (ok_t) {
                decode19(kq_load(twin, twin_size, "cpu"), t32, &ok_t);
                pkv_mkmodel_free_memory(twin);
            }
            pkv_mkmodel_free_memory(img);
            if (!ok_c || !ok_g || !ok_t) {
                TH_FAIL("%s %s: %s", archs[ai], pkv_type_name(t), pkv_errmsg());
                continue;
            }
            nmse_check(archs[ai], t, "cpu", a, b, 2e-3);
            nmse_check(archs[ai], t, "cpu on f32 twin", t32, b, 1e-5);
        }
}

/* ------------------------------------------------------------------- main */

int main(void) {
    char names[80][64], why[512] = "";
    int n = 0;
    CHECK_OK(pkv_device_enumerate(0, names, 80, &n, why, sizeof why));
    bool listed = false;
    for (int i = 0; i < n && i < 80; i++) listed |= strcmp(names[i], "cuda:0") == 0;
    pkv_device *dev = pkv_device_open("cuda:0", pkv_device_default_params());
    if (!dev) {
        CHECK(!listed); /* a listed device must open */
        if (th_failures) return th_done();
        char msg[1024];
        snprintf(msg, sizeof msg, "no CUDA device: %s", pkv_errmsg());
        return th_skip(msg);
    }
    CHECK(listed);
    const pkv_device_caps *caps = pkv_device_get_caps(dev);
    fprintf(stderr, "cuda:0 = %s, %llu MiB\n", caps->description, (unsigned long long)(caps->memory_bytes >> 20));
    CHECK_INT(caps->kind, PKV_DEVICE_CUDA);
    CHECK(strcmp(caps->name, "cuda:0") == 0);
    CHECK(caps->has_kernels && !caps->host_memory && caps->memory_bytes > 0);

    conformance(dev);
    big_transfer(dev);
    region_copies(dev);
    queue_order(dev);
    test_geglu(dev);
    static const pkv_type st[4] = {PKV_TYPE_F32, PKV_TYPE_F16, PKV_TYPE_Q8_0, PKV_TYPE_Q4_K};
    for (int i = 0; i < 4; i++) test_get_rows_scale(dev, st[i]);
    test_attention(dev);
    pkv_device_close(dev);

    /* fork == replay, swap, save/load, batches on cuda:0 (its failures count in th_failures) */
    if (model_main() == 77) TH_FAIL("test-model on cuda:0 skipped although the device opened");
    test_logits();
    CHECK_INT(pkv_alloc_live(), 0);
    return th_done();
}
