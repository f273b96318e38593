// labels: unit kernels
/* The CPU attention at depth: sequences of several 256-token spans (the
 * flash-decoding split and its fold), runs of queries of one sequence (the
 * prefill blocks), a page id outside the pool, f32, f16, q8_0 and q4_0 K/V (and
 * mixed K/V types), head sizes that are and are not multiples of 16; on every
 * instruction-set path. Checked: the reference on the same K/V bytes (nmse <
 * 1e-8, the bound of check-kernels.c); the reference on the unrounded f32 K/V,
 * the error the page type itself costs (nmse bounds per type: f16 1e-6, q8_0
 * 1e-4, q4_0 1e-2; measured 3.5e-8, 1.3e-5, 4.2e-3); and bitwise equality of
 * each query computed alone, in the whole call, and on 1 or 3 threads (the split
 * of the work must not show in any result: fork == replay). */
#include "testhelp.h"

#include "cpu-paths.h"

#include "base/quant.h"
#include "device/cpu/ref.h"
#include "device/device.h"

#include <stdlib.h>
#include <string.h>

enum { PS = 16, NP = 100, NSEQ = 2, NQ = 14, MAXH = 8 };

static uint64_t g_seed = 99;

/* REQUIRE for void helpers: record the failure and leave the helper. */
#define NEED(cond)                                                                         \
    do {                                                                                   \
        th_checks++;                                                                       \
        if (!(cond)) {                                                                     \
            TH_FAIL("required: %s (%s)", #cond, pkv_errmsg());                             \
            return;                                                                        \
        }                                                                                  \
    } while (0)

/* meta for n_q queries: q_seq, q_len, indptr, pages */
static int make_meta(int32_t *m, int n_q, const int32_t *seq, const int32_t *len, const int32_t *indptr,
                     const int32_t *pages) {
    memcpy(m, seq, (size_t)n_q * 4);
    memcpy(m + n_q, len, (size_t)n_q * 4);
    memcpy(m + 2 * n_q, indptr, (NSEQ + 1) * 4);
    memcpy(m + 2 * n_q + NSEQ + 1, pages, (size_t)indptr[NSEQ] * 4);
    return 2 * n_q + NSEQ + 1 + indptr[NSEQ];
}

static pkv_buffer *put(pkv_device *dev, const void *data, size_t n) {
    pkv_buffer *b = pkv_buffer_alloc(dev, n + 8);
    if (b && data && pkv_buffer_write(b, 0, data, n)) {
        pkv_buffer_free(b);
        return NULL;
    }
    return b;
}

/* The attention kind's constants of the next test_shape calls (0 / NULL: off). */
static int g_window;
static int g_chunk;
static float g_softcap;
static const float *g_sinks; /* [n_head] */

/* Runs the kernel on `threads` threads: all NQ queries (out) and each alone (alone). */
static bool run(int threads, pkv_k_attention_args a, const float *q, const void *k, const void *v, size_t kv_bytes,
                const int32_t *seq, const int32_t *len, const int32_t *indptr, const int32_t *pages, float *out,
                float *alone) {
    pkv_device_params dp = pkv_device_default_params();
    dp.n_threads = threads;
    pkv_device *dev = pkv_device_open("cpu", dp);
    if (!dev) return false;
    const size_t qrow = (size_t)a.n_head * a.dk * 4, orow = (size_t)a.n_head * a.dv * 4;
    static int32_t meta[4 * NQ + NSEQ + 1 + NP];
    int nm = make_meta(meta, NQ, seq, len, indptr, pages);
    pkv_buffer *bq = put(dev, q, NQ * qrow), *bk = put(dev, k, kv_bytes), *bv = put(dev, v, kv_bytes),
               *bo = put(dev, NULL, NQ * orow), *bm = put(dev, meta, (size_t)nm * 4);
    pkv_buffer *bs = g_sinks ? put(dev, g_sinks, (size_t)a.n_head * 4) : NULL;
    bool ok = bq && bk && bv && bo && bm && (!g_sinks || bs);
    if (bs) a.sinks = pkv_tref_make(bs, 0);
    a.q = pkv_tref_make(bq, 0);
    a.k = pkv_tref_make(bk, 0);
    a.v = pkv_tref_make(bv, 0);
    a.out = pkv_tref_make(bo, 0);
    a.meta = pkv_tref_make(bm, 0);
    a.n_q = NQ;
    ok = ok && !pkv_k_attention(dev, &a) && !pkv_buffer_read(bo, 0, out, NQ * orow);
    for (int i = 0; ok && i < NQ; i++) {
        nm = make_meta(meta, 1, seq + i, len + i, indptr, pages);
        a.n_q = 1;
        ok = !pkv_buffer_write(bq, 0, q + (size_t)i * a.n_head * a.dk, qrow) && !pkv_buffer_write(bm, 0, meta, (size_t)nm * 4) &&
             !pkv_k_attention(dev, &a) && !pkv_buffer_read(bo, 0, alone + (size_t)i * a.n_head * a.dv, orow);
    }
    pkv_buffer_free(bq);
    pkv_buffer_free(bk);
    pkv_buffer_free(bv);
    pkv_buffer_free(bo);
    pkv_buffer_free(bm);
    pkv_buffer_free(bs);
    pkv_device_close(dev);
    return ok;
}

/* Rows of d floats as KV type t (bytes out), and x replaced by what the page holds. */
static void encode(pkv_type t, float *x, size_t rows, int d, uint8_t *out) {
    const size_t rb = pkv_type_row_bytes(t, (size_t)d);
    for (size_t r = 0; r < rows; r++) {
        pkv_quantize_row(t, x + r * d, out + r * rb, d);
        pkv_dequantize_row(t, out + r * rb, x + r * d, d);
    }
}

static double type_bound(pkv_type t) {
    return t == PKV_TYPE_F32 ? 1e-12 : t == PKV_TYPE_F16 ? 1e-6 : t == PKV_TYPE_Q8_0 ? 1e-4 : 1e-2;
}

static void test_shape(const char *path, pkv_type kt, pkv_type vt, int n_head, int n_kv, int d) {
    const size_t n_kv_el = (size_t)NP * PS * n_kv * d, nq_el = (size_t)NQ * n_head * d;
    const size_t kbytes = (size_t)NP * PS * n_kv * pkv_type_row_bytes(kt, (size_t)d);
    const size_t vbytes = (size_t)NP * PS * n_kv * pkv_type_row_bytes(vt, (size_t)d);
    const size_t bytes = kbytes > vbytes ? kbytes : vbytes;
    float *q = malloc(nq_el * 4), *k = malloc(n_kv_el * 4), *v = malloc(n_kv_el * 4);
    float *kr = malloc(n_kv_el * 4), *vr = malloc(n_kv_el * 4);
    uint8_t *kb = calloc(bytes, 1), *vb = calloc(bytes, 1);
    float *ref = malloc(nq_el * 4), *ref_raw = malloc(nq_el * 4), *out[2], *alone[2];
    for (int i = 0; i < 2; i++) {
        out[i] = malloc(nq_el * 4);
        alone[i] = malloc(nq_el * 4);
    }
    NEED(q && k && v && kr && vr && kb && vb && ref && ref_raw && out[0] && out[1] && alone[0] && alone[1]);
    char name[128];
    snprintf(name, sizeof name, "%s K %s V %s h%d/%d d%d%s%s%s%s", path, pkv_type_name(kt), pkv_type_name(vt), n_head, n_kv, d,
             g_window ? " window" : "", g_chunk ? " chunk" : "", g_softcap > 0 ? " softcap" : "", g_sinks ? " sinks" : "");
    for (size_t i = 0; i < nq_el; i++) q[i] = th_randf(&g_seed) * 2.0f;
    for (size_t i = 0; i < n_kv_el; i++) {
        kr[i] = k[i] = th_randf(&g_seed);
        vr[i] = v[i] = th_randf(&g_seed);
    }
    encode(kt, k, n_kv_el / (size_t)d, d, kb);
    encode(vt, v, n_kv_el / (size_t)d, d, vb);
    /* sequence 0: 75 pages in shuffled order, entry 40 outside the pool;
     * sequence 1: 20 pages */
    int32_t pages[95], indptr[NSEQ + 1] = {0, 75, 95};
    for (int i = 0; i < 95; i++) pages[i] = i;
    for (int i = 94; i > 0; i--) {
        int j = (int)(th_rand(&g_seed) % (uint64_t)(i + 1)), t = pages[i];
        pages[i] = pages[j];
        pages[j] = t;
    }
    pages[40] = NP + 3;
    /* a run of six queries of sequence 0 (prefill), others interleaved */
    const int32_t seq[NQ] = {0, 0, 0, 0, 0, 0, 1, 1, 0, 1, 0, 0, 0, 1};
    const int32_t len[NQ] = {1195, 1196, 1197, 1198, 1199, 1200, 300, 1, 256, 17, 257, 513, 640, 320};
    pkv_k_attention_args a = {.k_type = kt, .v_type = vt, .n_seq = NSEQ, .meta_pages = 95, .n_pages = NP, .page_size = PS,
                              .n_head = n_head, .n_kv = n_kv, .dk = d, .dv = d, .scale = 0.125f, .window = g_window,
                              .softcap = g_softcap, .chunk = g_chunk};
    static int32_t meta[2 * NQ + NSEQ + 1 + NP];
    make_meta(meta, NQ, seq, len, indptr, pages);
    a.n_q = NQ;
    pkv_ref_attention_sinks(&a, q, kb, vb, meta, g_sinks, ref);
    pkv_k_attention_args araw = a;
    araw.k_type = araw.v_type = PKV_TYPE_F32;
    pkv_ref_attention_sinks(&araw, q, kr, vr, meta, g_sinks, ref_raw);
    const int threads[2] = {1, 3};
    for (int t = 0; t < 2; t++) NEED(run(threads[t], a, q, kb, vb, bytes, seq, len, indptr, pages, out[t], alone[t]));
    const double e = th_nmse(ref, out[0], nq_el);
    if (!(e < 1e-8)) TH_FAIL("%s: nmse %g against the reference", name, e);
    th_checks++;
    /* what the page types cost: against attention over the unrounded values */
    const double eraw = th_nmse(ref_raw, out[0], nq_el), bound = type_bound(kt) > type_bound(vt) ? type_bound(kt) : type_bound(vt);
    if (path[0] == 'g' && d == 64) fprintf(stderr, "%s: nmse vs unrounded f32 K/V %.2e (bound %.0e)\n", name, eraw, bound);
    if (!(eraw < bound)) TH_FAIL("%s: nmse %g against attention over the unrounded K/V, bound %g", name, eraw, bound);
    th_checks++;
    if (memcmp(out[0], out[1], nq_el * 4)) TH_FAIL("%s: 1 vs 3 threads differ", name);
    th_checks++;
    for (int t = 0; t < 2; t++)
        for (int i = 0; i < NQ; i++) {
            th_checks++;
            if (memcmp(out[t] + (size_t)i * n_head * d, alone[t] + (size_t)i * n_head * d, (size_t)n_head * d * 4))
                TH_FAIL("%s threads %d: query %d alone differs from batched", name, threads[t], i);
        }
    /* query 7 sees one token: its output is that token's V row (as the page holds it;
     * compared as values: a q4_0 zero d * (8 - 8) is -0 when d < 0, the sum +0) */
    const int32_t p0 = pages[indptr[1]];
    for (int h = 0; h < n_head && !g_sinks; h++) { /* (a sink takes a share of the softmax) */
        th_checks++;
        const float *o7 = out[0] + ((size_t)7 * n_head + h) * d, *v7 = v + ((size_t)p0 * PS * n_kv + h / (n_head / n_kv)) * d;
        for (int i = 0; i < d; i++)
            if (o7[i] != v7[i]) {
                TH_FAIL("%s: query 7 (one visible token) head %d is not that token's V row", name, h);
                break;
            }
    }
    free(q);
    free(k);
    free(v);
    free(kr);
    free(vr);
    free(kb);
    free(vb);
    free(ref);
    free(ref_raw);
    for (int i = 0; i < 2; i++) {
        free(out[i]);
        free(alone[i]);
    }
}

int main(void) {
    const char *paths[TH_MAX_CPU_PATHS];
    const int np = th_cpu_paths(paths);
    for (int p = 0; p < np; p++) {
        setenv("PKV_CPU_PATH", paths[p], 1);
        test_shape(paths[p], PKV_TYPE_F16, PKV_TYPE_F16, 8, 2, 64);
        test_shape(paths[p], PKV_TYPE_F32, PKV_TYPE_F32, 8, 2, 64);
        test_shape(paths[p], PKV_TYPE_F16, PKV_TYPE_F16, 6, 3, 40);
        test_shape(paths[p], PKV_TYPE_F32, PKV_TYPE_F32, 4, 4, 48);
        test_shape(paths[p], PKV_TYPE_Q8_0, PKV_TYPE_Q8_0, 8, 2, 64);
        test_shape(paths[p], PKV_TYPE_Q4_0, PKV_TYPE_Q4_0, 8, 2, 64);
        test_shape(paths[p], PKV_TYPE_Q8_0, PKV_TYPE_Q4_0, 6, 3, 96);
        test_shape(paths[p], PKV_TYPE_Q4_0, PKV_TYPE_F16, 4, 4, 32);
    }
    /* the attention kinds: a sliding window of 300 (it starts inside spans and
     * pages; the one-token query still sees its token), Gemma 2's soft-cap, gpt-oss's
     * sinks, and all three; Llama 4's chunks of 299 tokens (a chunk boundary inside
     * the prefill run and inside pages), alone and with the window, on every path:
     * reference, threads, alone == batched */
    static const float sinks[8] = {-1.5f, 0.25f, 2.0f, -0.5f, 6.0f, 1.0f, -3.0f, 0.0f};
    for (int p = 0; p < np; p++) {
        setenv("PKV_CPU_PATH", paths[p], 1);
        for (int variant = 0; variant < 6; variant++) {
            g_window = variant == 0 || variant == 3 || variant == 5 ? 300 : 0;
            g_chunk = variant >= 4 ? 299 : 0;
            g_softcap = variant == 1 || variant == 3 ? 1.5f : 0;
            g_sinks = variant == 2 || variant == 3 ? sinks : NULL;
            test_shape(paths[p], PKV_TYPE_F16, PKV_TYPE_F16, 8, 2, 64);
            test_shape(paths[p], PKV_TYPE_Q8_0, PKV_TYPE_Q4_0, 6, 3, 96);
        }
        g_window = 0;
        g_chunk = 0;
        g_softcap = 0;
        g_sinks = NULL;
    }
    unsetenv("PKV_CPU_PATH");
    return th_done();
}
