// labels: unit kernels
/* The CPU attention at depth: sequences of several 256-token spans (the
 * flash-decoding split and its fold), runs of queries of one sequence (the
 * prefill blocks), a page id outside the pool, f32 and f16 K/V, head sizes that
 * are and are not multiples of 16; on every instruction-set path. Checked: the
 * reference (nmse < 1e-8, the bound of check-kernels.c), and bitwise equality
 * of each query computed alone, in the whole call, and on 1 or 3 threads (the
 * split of the work must not show in any result: fork == replay). */
#include "testhelp.h"

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
    bool ok = bq && bk && bv && bo && bm;
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
    pkv_device_close(dev);
    return ok;
}

static void test_shape(const char *path, pkv_type kt, int n_head, int n_kv, int d) {
    const size_t n_kv_el = (size_t)NP * PS * n_kv * d, nq_el = (size_t)NQ * n_head * d;
    float *q = malloc(nq_el * 4), *k = malloc(n_kv_el * 4), *v = malloc(n_kv_el * 4);
    uint16_t *k16 = malloc(n_kv_el * 2), *v16 = malloc(n_kv_el * 2);
    float *ref = malloc(nq_el * 4), *out[2], *alone[2];
    for (int i = 0; i < 2; i++) {
        out[i] = malloc(nq_el * 4);
        alone[i] = malloc(nq_el * 4);
    }
    NEED(q && k && v && k16 && v16 && ref && out[0] && out[1] && alone[0] && alone[1]);
    for (size_t i = 0; i < nq_el; i++) q[i] = th_randf(&g_seed) * 2.0f;
    for (size_t i = 0; i < n_kv_el; i++) {
        k16[i] = pkv_f32_to_f16(th_randf(&g_seed));
        v16[i] = pkv_f32_to_f16(th_randf(&g_seed));
        k[i] = pkv_f16_to_f32(k16[i]);
        v[i] = pkv_f16_to_f32(v16[i]);
    }
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
    const bool f16 = kt == PKV_TYPE_F16;
    pkv_k_attention_args a = {.k_type = kt, .v_type = kt, .n_seq = NSEQ, .meta_pages = 95, .n_pages = NP, .page_size = PS,
                              .n_head = n_head, .n_kv = n_kv, .dk = d, .dv = d, .scale = 0.125f};
    static int32_t meta[2 * NQ + NSEQ + 1 + NP];
    make_meta(meta, NQ, seq, len, indptr, pages);
    a.n_q = NQ;
    pkv_ref_attention(&a, q, f16 ? (const void *)k16 : k, f16 ? (const void *)v16 : v, meta, ref);
    const int threads[2] = {1, 3};
    for (int t = 0; t < 2; t++)
        NEED(run(threads[t], a, q, f16 ? (const void *)k16 : k, f16 ? (const void *)v16 : v, n_kv_el * (f16 ? 2 : 4),
                    seq, len, indptr, pages, out[t], alone[t]));
    const double e = th_nmse(ref, out[0], nq_el);
    if (!(e < 1e-8)) TH_FAIL("%s %s h%d/%d d%d: nmse %g against the reference", path, f16 ? "f16" : "f32", n_head, n_kv, d, e);
    th_checks++;
    if (memcmp(out[0], out[1], nq_el * 4)) TH_FAIL("%s %s d%d: 1 vs 3 threads differ", path, f16 ? "f16" : "f32", d);
    th_checks++;
    for (int t = 0; t < 2; t++)
        for (int i = 0; i < NQ; i++) {
            th_checks++;
            if (memcmp(out[t] + (size_t)i * n_head * d, alone[t] + (size_t)i * n_head * d, (size_t)n_head * d * 4))
                TH_FAIL("%s %s d%d threads %d: query %d alone differs from batched", path, f16 ? "f16" : "f32", d,
                        threads[t], i);
        }
    /* query 7 sees one token: its output is that token's V row */
    const int32_t p0 = pages[indptr[1]];
    for (int h = 0; h < n_head; h++)
        CHECK(!memcmp(out[0] + ((size_t)7 * n_head + h) * d, v + ((size_t)p0 * PS * n_kv + h / (n_head / n_kv)) * d,
                      (size_t)d * 4));
    free(q);
    free(k);
    free(v);
    free(k16);
    free(v16);
    free(ref);
    for (int i = 0; i < 2; i++) {
        free(out[i]);
        free(alone[i]);
    }
}

int main(void) {
    static const char *paths[] = {"generic", "avx2", "avx512"};
    for (int p = 0; p < 3; p++) {
        setenv("PKV_CPU_PATH", paths[p], 1);
        test_shape(paths[p], PKV_TYPE_F16, 8, 2, 64);
        test_shape(paths[p], PKV_TYPE_F32, 8, 2, 64);
        test_shape(paths[p], PKV_TYPE_F16, 6, 3, 40);
        test_shape(paths[p], PKV_TYPE_F32, 4, 4, 48);
    }
    unsetenv("PKV_CPU_PATH");
    return th_done();
}
