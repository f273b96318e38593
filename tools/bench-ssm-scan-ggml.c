/* llama.cpp's ggml_ssm_scan (the CPU backend) on the shapes of bench-ssm-scan.c, for
 * docs/kernels.md's comparison: prefill (one sequence of many tokens) and decode (one
 * token for each of many sequences). Built by hand against a llama.cpp build:
 *   L=/work/scratch/llama.cpp; cc -O2 -std=c11 -I$L/ggml/include tools/bench-ssm-scan-ggml.c \
 *      -L$L/build/bin -lggml -lggml-base -lggml-cpu -Wl,-rpath,$L/build/bin -lm -o build/bench-ssm-scan-ggml
 *   build/bench-ssm-scan-ggml [threads [n_head head_dim n_group d_state [prefill_tokens decode_seqs]]] */
#define _POSIX_C_SOURCE 199309L
#include "ggml-cpu.h"
#include "ggml.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void fill(struct ggml_tensor *t, float lo, float hi, unsigned seed) {
    float *p = t->data;
    for (int64_t i = 0; i < ggml_nelements(t); i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = lo + (hi - lo) * (float)(seed >> 8) / 16777216.0f;
    }
}

static void run(const char *mode, int threads, int nh, int hd, int ng, int ds, int n_seq, int len, int reps) {
    const size_t state = (size_t)ds * hd * nh * n_seq, tok = (size_t)n_seq * len;
    const size_t per_tok = (size_t)hd * nh * 2 + 2 * (size_t)ds * ng + nh; /* x, y, B, C, dt */
    const size_t bytes = 4 * (2 * state + tok * per_tok + nh + n_seq) + (1 << 20);
    struct ggml_init_params ip = {bytes, NULL, false};
    struct ggml_context *ctx = ggml_init(ip);
    struct ggml_tensor *s = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, ds, hd, nh, n_seq);
    struct ggml_tensor *x = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, hd, nh, len, n_seq);
    struct ggml_tensor *dt = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, nh, len, n_seq);
    struct ggml_tensor *A = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 1, nh);
    struct ggml_tensor *B = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, ds, ng, len, n_seq);
    struct ggml_tensor *C = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, ds, ng, len, n_seq);
    struct ggml_tensor *ids = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n_seq);
    fill(s, -0.1f, 0.1f, 5);
    fill(x, -1, 1, 1);
    fill(dt, -4, 1, 2);
    fill(A, -1, -0.1f, 3);
    fill(B, -1, 1, 6);
    fill(C, -1, 1, 7);
    for (int i = 0; i < n_seq; i++) ((int32_t *)ids->data)[i] = i;
    struct ggml_tensor *out = ggml_ssm_scan(ctx, s, x, dt, A, B, C, ids, 1);
    struct ggml_cgraph *gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    double best = 1e30;
    for (int r = 0; r < reps + 1; r++) {
        const double t0 = now();
        ggml_graph_compute_with_ctx(ctx, gf, threads);
        const double t = now() - t0;
        if (r > 0 && t < best) best = t;
    }
    printf("{\"mode\": \"%s\", \"impl\": \"ggml_ssm_scan\", \"threads\": %d, \"n_head\": %d, \"head_dim\": %d, "
           "\"n_group\": %d, \"d_state\": %d, \"n_seq\": %d, \"tokens\": %zu, \"ms\": %.3f, \"tokens_per_s\": %.1f}\n",
           mode, threads, nh, hd, ng, ds, n_seq, tok, best * 1e3, (double)tok / best);
    ggml_free(ctx);
}

int main(int argc, char **argv) {
    const int threads = argc > 1 ? atoi(argv[1]) : 1;
    int nh = 64, hd = 64, ng = 1, ds = 128, prefill = 512, seqs = 32;
    if (argc > 5) {
        nh = atoi(argv[2]);
        hd = atoi(argv[3]);
        ng = atoi(argv[4]);
        ds = atoi(argv[5]);
    }
    if (argc > 7) {
        prefill = atoi(argv[6]);
        seqs = atoi(argv[7]);
    }
    run("prefill", threads, nh, hd, ng, ds, 1, prefill, 5);
    run("decode", threads, nh, hd, ng, ds, seqs, 1, 20);
    return 0;
}
