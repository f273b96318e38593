/* Speed of the ssm_scan kernel on one device: prefill (many tokens of one sequence)
 * and decode (one token for each of many sequences), on a Granite-4.0-H-Micro-shaped
 * layer by default (64 heads of 64, one group, d_state 128). Prints one JSON line per
 * mode: tokens/s and the state bytes read and written per second. Built by hand
 * against the shared library (not part of the build; docs/kernels.md has the numbers):
 *   cc -O2 -std=c11 -Iinclude -Isrc tools/bench-ssm-scan.c -Lbuild -lpagekv -Wl,-rpath,$PWD/build -lm \
 *      -o build/bench-ssm-scan
 *   build/bench-ssm-scan [device [threads [n_head head_dim n_group d_state [prefill_tokens decode_seqs]]]] */
#define _POSIX_C_SOURCE 199309L
#include "device/device.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static pkv_buffer *filled(pkv_device *dev, size_t floats, float lo, float hi, unsigned seed) {
    float *h = malloc(floats * sizeof(float));
    for (size_t i = 0; i < floats; i++) {
        seed = seed * 1664525u + 1013904223u;
        h[i] = lo + (hi - lo) * (float)(seed >> 8) / 16777216.0f;
    }
    pkv_buffer *b = pkv_buffer_alloc(dev, floats * sizeof(float));
    if (!b || pkv_buffer_write(b, 0, h, floats * sizeof(float))) {
        fprintf(stderr, "bench-ssm-scan: %s\n", pkv_errmsg());
        exit(1);
    }
    free(h);
    return b;
}

/* n_seq sequences of len tokens each, reps calls; prints one JSON line */
static void run(pkv_device *dev, int threads, const char *mode, int nh, int hd, int ng, int ds, int n_seq, int len,
                int reps) {
    const int64_t n = (int64_t)n_seq * len;
    const size_t row = (size_t)nh * hd + 2 * (size_t)ng * ds, slot = (size_t)nh * hd * ds;
    pkv_buffer *in = filled(dev, (size_t)n * row, -1, 1, 1), *dt = filled(dev, (size_t)n * nh, -4, 1, 2);
    pkv_buffer *par = filled(dev, 3 * (size_t)nh, -1, -0.1f, 3), *y = filled(dev, (size_t)n * nh * hd, 0, 0, 4);
    pkv_buffer *pool = filled(dev, (size_t)n_seq * slot, -0.1f, 0.1f, 5);
    int32_t *meta = malloc(sizeof(int32_t) * (2 * (size_t)n_seq + 1));
    for (int s = 0; s <= n_seq; s++) meta[s] = s * len;
    for (int s = 0; s < n_seq; s++) meta[n_seq + 1 + s] = s;
    pkv_buffer *bm = pkv_buffer_alloc(dev, sizeof(int32_t) * (2 * (size_t)n_seq + 1));
    pkv_buffer_write(bm, 0, meta, sizeof(int32_t) * (2 * (size_t)n_seq + 1));
    pkv_k_ssm_scan_args a = {.x = pkv_tref_make(in, 0),
                             .B = pkv_tref_make(in, (size_t)nh * hd * 4),
                             .C = pkv_tref_make(in, ((size_t)nh * hd + (size_t)ng * ds) * 4),
                             .x_stride = row * 4,
                             .B_stride = row * 4,
                             .C_stride = row * 4,
                             .dt = pkv_tref_make(dt, 0),
                             .dt_bias = pkv_tref_make(par, 0),
                             .A = pkv_tref_make(par, (size_t)nh * 4),
                             .D = pkv_tref_make(par, (size_t)nh * 8),
                             .y = pkv_tref_make(y, 0),
                             .state = pkv_tref_make(pool, 0),
                             .state_stride = slot * 4,
                             .n_slots = n_seq,
                             .meta = pkv_tref_make(bm, 0),
                             .n_tok = n,
                             .n_seq = n_seq,
                             .n_head = nh,
                             .head_dim = hd,
                             .n_group = ng,
                             .d_state = ds};
    double best = 1e30;
    for (int r = 0; r < reps + 1; r++) {
        pkv_device_sync(dev);
        const double t0 = now();
        if (pkv_k_ssm_scan(dev, &a) || pkv_device_sync(dev)) {
            fprintf(stderr, "bench-ssm-scan: %s\n", pkv_errmsg());
            exit(1);
        }
        const double t = now() - t0;
        if (r > 0 && t < best) best = t; /* the first call warms up */
    }
    /* every token reads and writes its head's state rows once (prefill keeps a head's
     * state in cache between tokens, so this is an upper bound of the traffic there) */
    printf("{\"mode\": \"%s\", \"device\": \"%s\", \"threads\": %d, \"n_head\": %d, \"head_dim\": %d, "
           "\"n_group\": %d, \"d_state\": %d, \"n_seq\": %d, \"tokens\": %lld, \"ms\": %.3f, \"tokens_per_s\": %.1f, "
           "\"state_gb_per_s\": %.2f}\n",
           mode, pkv_device_name(dev), threads, nh, hd, ng, ds, n_seq, (long long)n, best * 1e3, (double)n / best,
           2.0 * (double)n * (double)slot * 4 / best / 1e9);
    pkv_buffer *all[] = {in, dt, par, y, pool, bm};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) pkv_buffer_free(all[i]);
    free(meta);
}

int main(int argc, char **argv) {
    const char *name = argc > 1 ? argv[1] : "cpu";
    pkv_device_params p = pkv_device_default_params();
    if (argc > 2) p.n_threads = atoi(argv[2]);
    int nh = 64, hd = 64, ng = 1, ds = 128, prefill = 512, seqs = 32;
    if (argc > 6) {
        nh = atoi(argv[3]);
        hd = atoi(argv[4]);
        ng = atoi(argv[5]);
        ds = atoi(argv[6]);
    }
    if (argc > 8) {
        prefill = atoi(argv[7]);
        seqs = atoi(argv[8]);
    }
    pkv_device *dev = pkv_device_open(name, p);
    if (!dev) {
        fprintf(stderr, "bench-ssm-scan: %s: %s\n", name, pkv_errmsg());
        return 1;
    }
    run(dev, p.n_threads, "prefill", nh, hd, ng, ds, 1, prefill, 5);
    run(dev, p.n_threads, "decode", nh, hd, ng, ds, seqs, 1, 20);
    pkv_device_close(dev);
    return 0;
}
