/* pagekv bench: kv | model | all. Every figure is measured in the run that prints
 * it (the memory bandwidth included), and printed as JSON with --json. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/resource.h>
#include <unistd.h>

#include "base/base.h"     /* thread pool for the bandwidth probe */
#include "base/quant.h"    /* quantized K/V for the attention probe */
#include "device/device.h" /* the attention kernel, for paged vs contiguous */
#include "cli/cli.h"
#include "cli/commands.h"
#include "pagekv.h"

/* Run a bench part with stdout sent to a temporary file; *out gets its text without
 * the trailing newline (NULL on failure). Returns the part's exit code. */
static int capture(int (*fn)(int, char **), int argc, char **argv, char **out) {
    *out = NULL;
    fflush(stdout);
    FILE *tmp = tmpfile();
    int saved = dup(STDOUT_FILENO);
    if (!tmp || saved < 0 || dup2(fileno(tmp), STDOUT_FILENO) < 0) {
        fprintf(stderr, "pagekv bench all: cannot capture output: %s\n", strerror(errno));
        if (tmp) fclose(tmp);
        if (saved >= 0) close(saved);
        return 1;
    }
    int rc = fn(argc, argv);
    fflush(stdout);
    dup2(saved, STDOUT_FILENO);
    close(saved);
    if (!rc) {
        long n = ftell(tmp) >= 0 ? (fseek(tmp, 0, SEEK_END), ftell(tmp)) : -1;
        char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
        rewind(tmp);
        if (!buf || fread(buf, 1, (size_t)n, tmp) != (size_t)n) {
            fprintf(stderr, "pagekv bench all: cannot read back the output of bench %s\n", argv[0]);
            free(buf);
            rc = 1;
        } else {
            while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' ')) n--;
            buf[n] = 0;
            *out = buf;
        }
    }
    fclose(tmp);
    return rc;
}

static void bench_usage(FILE *f) {
    fprintf(f, "usage: pagekv bench kv [options] | model [options] | spec [options] | serve [options] | server [options] | all [options]\n"
               "  bench kv     fork, copy-on-write, swap, shift, append on a 28-layer f16 layout\n"
               "  bench model  prefill and decode tokens/s, memory bandwidth and decode roofline\n"
               "  bench spec   speculative vs plain decoding: acceptance, tokens per target step, speed-up\n"
               "  bench serve  serving load through the engine: throughput, TTFT/TPOT percentiles, prefix hits, preemptions\n"
               "  bench server pagekv serve over HTTP: a completion's latency while clients poll the contexts\n"
               "               list, the server's peak memory under large tokenize and logprobs answers\n"
               "  bench all    all three, one JSON object {\"kv\": ..., \"model\": ..., \"spec\": ...}\n"
               "  bench kv-accuracy  logits NMSE and top-1 agreement of q8_0/q4_0 KV pages against f16\n"
               "  bench kv-speed     decode tokens/s at a depth per KV type, the types interleaved\n"
               "  bench grammar      constrained output: token-mask microseconds with a 150k vocabulary\n"
               "'pagekv bench kv --help' and 'pagekv bench model --help' list the options.\n");
}

int pkv_cli_bench(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        bench_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "kv")) return pkv_cli_bench_kv(argc - 1, argv + 1);
    if (!strcmp(argv[1], "model")) return pkv_cli_bench_model(argc - 1, argv + 1);
    if (!strcmp(argv[1], "spec")) return pkv_cli_bench_spec(argc - 1, argv + 1);
    if (!strcmp(argv[1], "serve")) return pkv_cli_bench_serve(argc - 1, argv + 1);
    if (!strcmp(argv[1], "server")) return pkv_cli_bench_server(argc - 1, argv + 1);
    if (!strcmp(argv[1], "kv-accuracy")) return pkv_cli_bench_kv_accuracy(argc - 1, argv + 1);
    if (!strcmp(argv[1], "kv-speed")) return pkv_cli_bench_kv_speed(argc - 1, argv + 1);
    if (!strcmp(argv[1], "grammar")) return pkv_cli_bench_grammar(argc - 1, argv + 1);
    if (!strcmp(argv[1], "all")) {
        /* One JSON object. model gets every option given (plus --json); kv and
         * spec get the device, and spec the model and threads. */
        for (int i = 2; i < argc; i++)
            if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
                printf("usage: pagekv bench all [bench model's options]\n"
                       "Runs bench kv, bench model and bench spec and prints one JSON object\n"
                       "{\"kv\": ..., \"model\": ..., \"spec\": ...}. Every option goes to bench model; -m, -t\n"
                       "and -d also go to bench spec, -d to bench kv. Nothing is printed on stdout unless\n"
                       "all three succeed. See 'pagekv bench model --help'.\n");
                return 0;
            }
        char *margv[64], *sargv[16], *kargv[8];
        int mc = 0, sc = 0, kc = 0;
        margv[mc++] = "model";
        sargv[sc++] = "spec";
        kargv[kc++] = "kv";
        for (int i = 2; i < argc && mc < 60; i++) {
            if (!strcmp(argv[i], "--json")) continue;
            margv[mc++] = argv[i];
            bool shared = !strcmp(argv[i], "-m") || !strcmp(argv[i], "-t") || !strcmp(argv[i], "-d") || !strcmp(argv[i], "--device");
            if (shared && i + 1 < argc && sc < 12) {
                sargv[sc++] = argv[i];
                sargv[sc++] = argv[i + 1];
                if ((!strcmp(argv[i], "-d") || !strcmp(argv[i], "--device")) && kc < 6) {
                    kargv[kc++] = "--device";
                    kargv[kc++] = argv[i + 1];
                }
            }
        }
        margv[mc++] = "--json";
        sargv[sc++] = "--json";
        kargv[kc++] = "--json";
        /* Each part's JSON is captured first and printed only when all three
         * succeeded: stdout never holds a partial object. */
        char *out[3] = {NULL, NULL, NULL};
        /* model first: it checks every option and the model file */
        int rc = capture(pkv_cli_bench_model, mc, margv, &out[1]);
        if (!rc) rc = capture(pkv_cli_bench_kv, kc, kargv, &out[0]);
        if (!rc) rc = capture(pkv_cli_bench_spec, sc, sargv, &out[2]);
        if (!rc) printf("{\"kv\": %s, \"model\": %s, \"spec\": %s}\n", out[0], out[1], out[2]);
        for (int k = 0; k < 3; k++) free(out[k]);
        return rc;
    }
    fprintf(stderr, "pagekv bench: unknown benchmark '%s'\n", argv[1]);
    bench_usage(stderr);
    return 2;
}

/* ------------------------------------------------------------ bandwidth */

/* Bandwidth of a device's own memory (a GPU's HBM), for the decode roofline of
 * a device whose buffers are not host memory: the best of several copies of a
 * 256 MiB buffer within the device, counting the bytes read and written (twice
 * the size per copy). 0 when the buffers cannot be had. */
static double measure_device_bandwidth(pkv_device *dev) {
    const pkv_device_caps *caps = pkv_device_get_caps(dev);
    size_t size = (size_t)256 << 20;
    if (caps->memory_bytes && size > caps->memory_bytes / 8) size = (size_t)(caps->memory_bytes / 8) & ~(size_t)4095;
    if (size < 4096) return 0;
    pkv_buffer *a = pkv_buffer_alloc(dev, size), *b = a ? pkv_buffer_alloc(dev, size) : NULL;
    double best = 0;
    if (b && !pkv_buffer_fill(a, 0, size, 1) && !pkv_device_sync(dev))
        for (int r = 0; r < 5; r++) {
            double t0 = pkv_time_now();
            if (pkv_buffer_copy(a, 0, b, 0, size) || pkv_device_sync(dev)) break;
            double t = pkv_time_now() - t0;
            if (t > 0 && 2.0 * (double)size / t / 1e9 > best) best = 2.0 * (double)size / t / 1e9;
        }
    pkv_buffer_free(a);
    pkv_buffer_free(b);
    return best;
}

/* -------------------------------------------------------------- FMA peak */

typedef struct {
    long iters;
    double sink[64];
} fma_job;

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
__attribute__((target("avx2,fma"))) static double fma_loop(long iters) {
    /* 12 independent accumulators hide the FMA latency (4-5 cycles, 2 ports) */
    __m256 a[12], m = _mm256_set1_ps(0.9999f), c = _mm256_set1_ps(0.0001f);
    for (int i = 0; i < 12; i++) a[i] = _mm256_set1_ps((float)i);
    for (long k = 0; k < iters; k++)
        for (int i = 0; i < 12; i++) a[i] = _mm256_fmadd_ps(a[i], m, c);
    float out[8];
    __m256 t = a[0];
    for (int i = 1; i < 12; i++) t = _mm256_add_ps(t, a[i]);
    _mm256_storeu_ps(out, t);
    return out[0];
}
#define FMA_FLOPS_PER_ITER (12.0 * 8 * 2)
static bool fma_available(void) { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
#elif defined(__aarch64__) && defined(__GNUC__)
#include <arm_neon.h>
static double fma_loop(long iters) {
    /* 16 independent 4-lane accumulators: FMA latency 4 cycles, up to 4 pipes */
    float32x4_t a[16];
    const float32x4_t m = vdupq_n_f32(0.9999f), c = vdupq_n_f32(0.0001f);
    for (int i = 0; i < 16; i++) a[i] = vdupq_n_f32((float)i);
    for (long k = 0; k < iters; k++)
        for (int i = 0; i < 16; i++) a[i] = vfmaq_f32(c, a[i], m);
    float32x4_t t = a[0];
    for (int i = 1; i < 16; i++) t = vaddq_f32(t, a[i]);
    return vgetq_lane_f32(t, 0);
}
#define FMA_FLOPS_PER_ITER (16.0 * 4 * 2)
static bool fma_available(void) { return true; } /* Advanced SIMD is part of every aarch64 CPU */
#else
static double fma_loop(long iters) {
    volatile float a = 1;
    for (long k = 0; k < iters; k++) a = a * 0.9999f + 0.0001f;
    return a;
}
#define FMA_FLOPS_PER_ITER 2.0
static bool fma_available(void) { return true; }
#endif

static void fma_task(int i, int n, void *arg) {
    (void)n;
    fma_job *j = arg;
    j->sink[i % 64] = fma_loop(j->iters);
}

/* Peak f32 FMA throughput of n threads, GFLOP/s (0 on x86 without AVX2+FMA). */
static double measure_fma_peak(int threads) {
    if (!fma_available()) return 0;
    pkv_pool *pool = pkv_pool_create(threads);
    fma_job j = {20000000, {0}};
    double best = 1e30;
    for (int r = 0; r < 3; r++) {
        double t0 = pkv_time_now();
        pkv_pool_run(pool, pkv_pool_threads(pool), fma_task, &j);
        double t = pkv_time_now() - t0;
        if (t < best) best = t;
    }
    int n = pkv_pool_threads(pool);
    pkv_pool_free(pool);
    return FMA_FLOPS_PER_ITER * (double)j.iters * n / best / 1e9;
}

/* ------------------------------------------------- paged vs contiguous */

/* Microseconds per decode-step attention call over `depth` tokens of one layer
 * (n_kv heads of dk, n_head query heads, K of type kt and V of type vt): with the
 * KV in pages of 16 tokens in shuffled order (what a long-running cache looks
 * like), and in one contiguous run (a single page of depth tokens: the plain
 * contiguous layout). */
static int bench_attention(pkv_device *dev, int depth, int n_head, int n_kv, int dk, pkv_type kt, pkv_type vt,
                           double *paged_us, double *contig_us) {
    const size_t rows = (size_t)depth * (size_t)n_kv;
    const size_t k_bytes = rows * pkv_type_row_bytes(kt, (size_t)dk), v_bytes = rows * pkv_type_row_bytes(vt, (size_t)dk);
    const size_t f_bytes = rows * (size_t)dk * 4;
    int ps = 16, n_pages = (depth + ps - 1) / ps;
    pkv_buffer *k = pkv_buffer_alloc(dev, k_bytes), *v = pkv_buffer_alloc(dev, v_bytes);
    pkv_buffer *q = pkv_buffer_alloc(dev, (size_t)n_head * (size_t)dk * 4), *o = pkv_buffer_alloc(dev, (size_t)n_head * (size_t)dk * 4);
    pkv_buffer *meta = pkv_buffer_alloc(dev, (size_t)(n_pages + 8) * 4);
    int32_t *mh = malloc((size_t)(n_pages + 8) * sizeof *mh);
    float *fill = malloc(f_bytes);
    uint8_t *enc = malloc(f_bytes);
    int rc = 1;
    if (!k || !v || !q || !o || !meta || !mh || !fill || !enc) goto out;
    for (size_t i = 0; i < f_bytes / 4; i++) fill[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
    if (pkv_quantize_row(kt, fill, enc, (int64_t)(f_bytes / 4)) || pkv_buffer_write(k, 0, enc, k_bytes) ||
        pkv_quantize_row(vt, fill, enc, (int64_t)(f_bytes / 4)) || pkv_buffer_write(v, 0, enc, v_bytes) ||
        pkv_buffer_write(q, 0, fill, (size_t)n_head * (size_t)dk * 4))
        goto out;
    for (int pass = 0; pass < 2; pass++) {
        bool paged = pass == 0;
        int page_size = paged ? ps : depth, np = paged ? n_pages : 1;
        /* meta: q_seq[1] q_len[1] indptr[2] pages[np] */
        mh[0] = 0;
        mh[1] = depth;
        mh[2] = 0;
        mh[3] = np;
        uint64_t r = 12345;
        for (int i = 0; i < np; i++) mh[4 + i] = i;
        for (int i = np - 1; paged && i > 0; i--) { /* shuffle the page order */
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            int j = (int)((r >> 33) % (uint64_t)(i + 1)), t = mh[4 + i];
            mh[4 + i] = mh[4 + j];
            mh[4 + j] = t;
        }
        if (pkv_buffer_write(meta, 0, mh, (size_t)(4 + np) * 4)) goto out;
        pkv_k_attention_args a = {.q = pkv_tref_make(q, 0), .k = pkv_tref_make(k, 0), .v = pkv_tref_make(v, 0),
                                  .out = pkv_tref_make(o, 0), .meta = pkv_tref_make(meta, 0), .k_type = kt,
                                  .v_type = vt, .n_q = 1, .n_seq = 1, .meta_pages = np, .n_pages = np, .page_size = page_size,
                                  .n_head = n_head, .n_kv = n_kv, .dk = dk, .dv = dk, .scale = 0.088f};
        int reps = 30;
        double best = 1e30;
        for (int rep = 0; rep < reps; rep++) {
            double t0 = pkv_time_now();
            if (pkv_k_attention(dev, &a) || pkv_device_sync(dev)) goto out;
            double t = pkv_time_now() - t0;
            if (t < best) best = t;
        }
        *(paged ? paged_us : contig_us) = best * 1e6;
    }
    rc = 0;
out:
    if (rc) pkv_cli_fail("bench model", "attention", PKV_ERR_DEVICE);
    free(mh);
    free(fill);
    free(enc);
    pkv_buffer_free(k);
    pkv_buffer_free(v);
    pkv_buffer_free(q);
    pkv_buffer_free(o);
    pkv_buffer_free(meta);
    return rc;
}

/* ---------------------------------------------------------------- model */

typedef struct {
    double prefill_tok_s, decode_tok_s;
    double rank_bytes_per_step; /* under MPI ranks: bytes rank 0 sent and received per decode step */
} speed;

/* Prefill n_prefill tokens (in chunks of 512) on top of `depth` tokens, then
 * decode n_decode tokens one at a time. */
static int measure(pkv_model *m, pkv_kv_cache *c, int V, int depth, int n_prefill, int n_decode, speed *out) {
    pkv_context *ctx = pkv_context_create(m, c, depth + n_prefill + n_decode + 1);
    if (!ctx) return pkv_cli_fail("bench model", "context", PKV_ERR_NOMEM);
    int32_t *toks = malloc(512 * sizeof *toks);
    uint64_t seed = 42;
    for (int i = 0; i < 512; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        toks[i] = (int32_t)((seed >> 33) % (uint64_t)V);
    }
    pkv_status s = PKV_OK;
    for (int done = 0; !s && done < depth; done += 512) s = pkv_context_decode(ctx, toks, PKV_MIN(512, depth - done));
    double t0 = pkv_time_now();
    int done = 0;
    while (!s && done < n_prefill) {
        int k = PKV_MIN(512, n_prefill - done);
        s = pkv_context_decode(ctx, toks, k);
        done += k;
    }
    double t1 = pkv_time_now();
    uint64_t tx0, rx0, tx1, rx1;
    pkv_dist_bytes(&tx0, &rx0);
    for (int i = 0; !s && i < n_decode; i++) s = pkv_context_decode(ctx, &toks[i % 512], 1);
    double t2 = pkv_time_now();
    pkv_dist_bytes(&tx1, &rx1);
    out->rank_bytes_per_step = n_decode > 0 ? (double)(tx1 - tx0 + rx1 - rx0) / n_decode : 0;
    free(toks);
    pkv_context_free(ctx);
    if (s) return pkv_cli_fail("bench model", "decode", s);
    out->prefill_tok_s = n_prefill / (t1 - t0);
    out->decode_tok_s = n_decode / (t2 - t1);
    return 0;
}

/* Batched decode: a prompt of `prompt` tokens forked into n sequences, then
 * n_decode steps of one token for each of the n sequences in one pkv_decode.
 * Returns total generated tokens per second over the n sequences (0 on error). */
static double measure_batched(pkv_model *m, const pkv_cli_model_opts *o, int V, int n, int prompt, int n_decode) {
    pkv_cli_model_opts bo = *o;
    bo.n_ctx = prompt + n_decode + 1;
    int ps = bo.page_size ? bo.page_size : 16;
    int64_t pages = (int64_t)n * ((bo.n_ctx + ps - 1) / ps + 1);
    pkv_kv_cache *c = pkv_cli_open_cache_pages("bench model", m, &bo, n, pages);
    if (!c) return 0;
    pkv_context **ctx = calloc((size_t)n, sizeof *ctx);
    int32_t *toks = malloc((size_t)(prompt + n) * sizeof *toks), *ones = malloc((size_t)n * sizeof *ones);
    const int32_t **tp = malloc((size_t)n * sizeof *tp);
    double rate = 0;
    pkv_status s = PKV_ERR_NOMEM;
    if (!ctx || !toks || !ones || !tp || !(ctx[0] = pkv_context_create(m, c, bo.n_ctx))) goto out;
    uint64_t seed = 7;
    for (int i = 0; i < prompt + n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        toks[i] = (int32_t)((seed >> 33) % (uint64_t)V);
    }
    if ((s = pkv_context_decode(ctx[0], toks, prompt))) goto out;
    for (int i = 1; i < n; i++)
        if (!(ctx[i] = pkv_context_fork(ctx[0]))) {
            s = PKV_ERR_OUT_OF_PAGES;
            goto out;
        }
    for (int i = 0; i < n; i++) {
        ones[i] = 1;
        tp[i] = &toks[prompt + i]; /* a different token per sequence */
    }
    double t0 = pkv_time_now();
    for (int k = 0; k < n_decode && !s; k++) s = pkv_decode(ctx, n, tp, ones);
    double t = pkv_time_now() - t0;
    if (!s && t > 0) rate = (double)n * n_decode / t;
out:
    if (s) pkv_cli_fail("bench model", "batched decode", s);
    for (int i = n - 1; ctx && i >= 0; i--) pkv_context_free(ctx[i]);
    free(ctx);
    free(toks);
    free(ones);
    free(tp);
    pkv_kv_cache_free(c);
    return rate;
}

static void bench_model_usage(FILE *f) {
    fprintf(f, "usage: pagekv bench model [-m FILE.gguf] [-t N] [-d DEVICE] [--json]\n"
               "                          [--prefill N] [--decode N] [--depth N] [--n-seq N[,N...]]\n"
               "                          [--kv-type T] [--kv-type-k T] [--kv-type-v T] [--kv-memory MIB]\n"
               "Prefill (default 512 tokens) and decode (default 128 tokens) speed, at depth 0 and\n"
               "at --depth (default 4096; 0 skips it), with the host's read bandwidth measured in the\n"
               "same run and the decode roofline (weight bytes per token / bandwidth). On a device\n"
               "whose memory is not the host's (a GPU), the bandwidth is that of copies within the\n"
               "device's memory (bytes read + written), reported as \"bandwidth_kind\".\n"
               "The KV bytes per token of the cache's types (f16 default, f32, q8_0, q4_0) and the\n"
               "largest context that fits in --kv-memory MiB (default 8192). With sliding-window layers\n"
               "(gemma2/3) the per-token bytes count the layers that keep every token; the window\n"
               "layers add a fixed kv_window_bytes_per_seq per sequence (kv_bytes_per_token_all_layers:\n"
               "the cost if every layer kept every token). With recurrent layers (qwen35, granitehybrid,\n"
               "nemotron_h, lfm2) state_bytes_per_seq is one sequence's state, what a fork or checkpoint copies.\n"
               "--n-seq 4,16,64: also decode that many sequences together (a 64-token prompt forked\n"
               "N ways, --decode steps of N tokens each): total tokens/s and the ratio to one sequence.\n"
               "Without -m: the built-in tiny model. For the reference shape:\n"
               "  pagekv mkmodel --arch qwen3 --type q8_0 --layers 28 --dim 1024 --heads 16 --kv-heads 8 \\\n"
               "      --head-dim 128 --ffn 3072 --vocab 151936 -o qwen3-0.6b-q8_0.gguf\n");
}

/* What `pagekv bench model` was asked. */
typedef struct bm_opts {
    pkv_cli_model_opts o; /* first: pkv_cli_model_more */
    bool json, help;
    long long depth, n_prefill, n_decode, mem_mib;
    int n_seqs[8], n_nseq;
} bm_opts;

static bool bm_opt_n_seq(void *opts, const char *opt, const char *v) {
    bm_opts *b = opts;
    (void)opt;
    b->n_nseq = 0;
    for (const char *q = v; *q;) {
        char *end;
        long x = strtol(q, &end, 10);
        if (end == q || x < 1 || x > 256 || b->n_nseq == 8 || (*end && *end != ',')) {
            fprintf(stderr, "pagekv bench model: --n-seq expects up to 8 comma-separated counts in 1..256, got '%s'\n", v);
            return false;
        }
        b->n_seqs[b->n_nseq++] = (int)x;
        q = *end ? end + 1 : end;
    }
    return true;
}

#define BM_OPT(...) PKV_CLI_OPT(bm_opts, __VA_ARGS__)
static const pkv_cli_opt bm_options[] = {
    BM_OPT("-h", "--help", PKV_CLI_FLAG, help, 0, 0),
    BM_OPT("--json", NULL, PKV_CLI_FLAG, json, 0, 0),
    BM_OPT("--kv-memory", NULL, PKV_CLI_LLONG, mem_mib, 1, 1 << 30),
    BM_OPT("--depth", NULL, PKV_CLI_LLONG, depth, 0, 1 << 20),
    BM_OPT("--prefill", NULL, PKV_CLI_LLONG, n_prefill, 1, 1 << 20),
    BM_OPT("--decode", NULL, PKV_CLI_LLONG, n_decode, 1, 1 << 20),
    {"--n-seq", NULL, PKV_CLI_FN, 0, 0, 0, bm_opt_n_seq, true},
};
#undef BM_OPT
static const pkv_cli_cmd bm_cmd = {"bench model", bm_options, sizeof bm_options / sizeof bm_options[0],
                                   offsetof(bm_opts, help), bench_model_usage, pkv_cli_model_more, true, false, 0};

int pkv_cli_bench_model(int argc, char **argv) {
    bm_opts a = {.depth = 4096, .n_prefill = 512, .n_decode = 128, .mem_mib = 8192};
    a.o = pkv_cli_model_defaults();
    int parsed = pkv_cli_parse(&bm_cmd, argc, argv, &a);
    if (parsed >= 0) return parsed;
    pkv_cli_model_opts o = a.o;
    bool json = a.json;
    long long depth = a.depth, n_prefill = a.n_prefill, n_decode = a.n_decode, mem_mib = a.mem_mib;
    const int *n_seqs = a.n_seqs, n_nseq = a.n_nseq;
    pkv_model *m = pkv_cli_open_model("bench model", &o);
    if (!m) return 1;
    pkv_model_info info;
    pkv_model_get_info(m, &info);
    o.n_ctx = (int)(depth + n_prefill + n_decode + 1);
    pkv_kv_cache *c = pkv_cli_open_cache("bench model", m, &o, 1);
    int rc = 1;
    speed s0 = {0}, sd = {0};
    if (!c) goto out;
    if ((rc = measure(m, c, info.n_vocab, 0, (int)n_prefill, (int)n_decode, &s0))) goto out;
    if (depth > 0 && (rc = measure(m, c, info.n_vocab, (int)depth, (int)n_prefill, (int)n_decode, &sd))) goto out;
    double batched[8] = {0};
    for (int k = 0; k < n_nseq; k++)
        if (!(batched[k] = measure_batched(m, &o, info.n_vocab, n_seqs[k], 64, (int)n_decode))) {
            rc = 1;
            goto out;
        }
    double attn_paged = 0, attn_contig = 0;
    if ((rc = bench_attention(pkv_model_device(m), depth > 0 ? (int)depth : 4096, info.n_head, info.n_head_kv, info.head_dim,
                              (pkv_type)o.kv_type, (pkv_type)o.kv_type_v, &attn_paged, &attn_contig)))
        goto out;
    {
        int threads = o.threads > 0 ? o.threads : pkv_cpu_count();
        /* the model's peak, before the bandwidth probe's buffer (4x the LLC) */
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        double peak_mib = (double)ru.ru_maxrss / 1024.0;
        /* a GPU's decode reads its own memory, not the host's */
        bool on_device = !pkv_device_get_caps(pkv_model_device(m))->host_memory;
        pkv_cli_bw bwr;
        pkv_cli_measure_bandwidth(threads, &bwr);
        double bw = on_device ? measure_device_bandwidth(pkv_model_device(m)) : bwr.median_gbps;
        /* Decode reads every weight once per token, except the embedding table, of
         * which it reads one row (tied models read it whole as the output matrix):
         * see pkv_model_info.decode_bytes_per_token. */
        double bytes_per_token = (double)info.decode_bytes_per_token;
        double peak = measure_fma_peak(threads);
        /* 2 FLOPs per weight per token for every matrix a token goes through
         * (all but the embedding table, plus the output matrix for the 1 row of
         * logits in a prefill step: not counted) plus attention: 4 * heads * dk
         * per token and visible key, half a prompt visible on average */
        double mat_params = (double)info.n_layer * ((double)info.n_embd * info.head_dim * (2.0 * info.n_head + 2.0 * info.n_head_kv) +
                                                   3.0 * info.n_embd * info.n_ff);
        double attn = (double)info.n_layer * 4.0 * info.n_head * info.head_dim * (double)n_prefill / 2;
        double gflops = (2 * mat_params + attn) * s0.prefill_tok_s / 1e9;
        double roofline = bw > 0 ? bw * 1e9 / bytes_per_token : 0;
        const double kv_tok = pkv_cli_kv_bytes_per_token(c);
        char slow[512], slow_json[640];
        pkv_cli_weight_types(pkv_model_device(m), info.weight_types, PKV_WEIGHT_SLOW, false, slow, sizeof slow);
        pkv_cli_weight_types(pkv_model_device(m), info.weight_types, PKV_WEIGHT_SLOW, true, slow_json, sizeof slow_json);
        const long long kv_max = pkv_cli_kv_max_tokens(c, (double)mem_mib * 1048576.0);
        pkv_kv_stats kst;
        pkv_kv_stats_get(c, &kst);
        const double st_seq = (double)kst.state_slot_bytes; /* one sequence's live state (a checkpoint: the same) */
        if (json) {
            printf("{\"kv_type_k\": \"%s\", \"kv_type_v\": \"%s\", \"kv_bytes_per_token\": %.0f, "
                   "\"kv_bytes_per_token_all_layers\": %.0f, \"kv_window_bytes_per_seq\": %.0f, \"kv_memory_mib\": %lld, "
                   "\"kv_max_context\": %lld, \"state_bytes_per_seq\": %.0f, ",
                   pkv_type_name((pkv_type)o.kv_type), pkv_type_name((pkv_type)o.kv_type_v), kv_tok,
                   pkv_cli_kv_bytes_per_token_all(c), pkv_cli_kv_window_bytes_per_seq(c), mem_mib, kv_max, st_seq);
            printf("\"model\": \"%s\", \"arch\": \"%s\", \"weight_type\": \"%s\", \"device\": \"%s\", \"threads\": %d, "
                   "\"weight_bytes\": %llu, \"prefill_tokens\": %lld, \"decode_tokens\": %lld, "
                   "\"prefill_tok_s\": %.2f, \"decode_tok_s\": %.2f, \"depth\": %lld, "
                   "\"prefill_tok_s_at_depth\": %.2f, \"decode_tok_s_at_depth\": %.2f, "
                   "\"bandwidth_gbps\": %.2f, \"bandwidth_kind\": \"%s\", \"decode_bytes_per_token\": %.0f, \"roofline_tok_s\": %.2f, "
                   "\"roofline_fraction\": %.3f, \"attn_depth\": %lld, \"attn_paged_us\": %.1f, \"attn_contiguous_us\": %.1f, "
                   "\"attn_paged_vs_contiguous\": %.3f, \"gflops\": %.1f, \"fma_peak_gflops\": %.1f, "
                   "\"prefill_peak_fraction\": %.3f, \"peak_rss_mib\": %.1f, \"weights_mib\": %.1f, "
                   "\"weights_mapped_mib\": %.1f, \"bandwidth_best_gbps\": %.2f, \"bandwidth_buffer_mib\": %.0f, "
                   "\"llc_mib\": %.1f, \"bandwidth_passes\": %d",
                   o.model ? o.model : "builtin", info.arch, info.weight_type,
                   pkv_device_name(pkv_model_device(m)), threads, (unsigned long long)info.weight_bytes, n_prefill, n_decode,
                   s0.prefill_tok_s, s0.decode_tok_s, depth, sd.prefill_tok_s, sd.decode_tok_s, bw,
                   on_device ? "device copy" : "host read", bytes_per_token, roofline,
                   roofline > 0 ? s0.decode_tok_s / roofline : 0, depth > 0 ? depth : 4096, attn_paged, attn_contig,
                   attn_contig > 0 ? attn_paged / attn_contig : 0, gflops, peak, peak > 0 ? gflops / peak : 0, peak_mib,
                   (double)info.weight_bytes / 1048576.0, (double)info.weight_bytes_mapped / 1048576.0, bwr.best_gbps,
                   (double)bwr.buffer_bytes / 1048576.0, (double)bwr.llc_bytes / 1048576.0, bwr.passes);
            printf(", \"device_description\": \"%s\"", pkv_device_get_caps(pkv_model_device(m))->description);
            printf(", \"slow_weight_types\": [%s]", slow_json);
            if (info.n_ranks > 1)
                printf(", \"ranks\": %d, \"rank0_layers\": [%d, %d], \"rank0_bytes_per_decode_step\": %.0f", info.n_ranks,
                       info.layer_first, info.layer_end, s0.rank_bytes_per_step);
            printf(", \"weight_layouts\": {");
            for (int t = 0, k = 0; t < PKV_TYPE_COUNT && t < 64; t++) {
                if (!(info.weight_types >> t & 1)) continue;
                char lay[256];
                pkv_device_weight_layout(pkv_model_device(m), (pkv_type)t, lay, sizeof lay);
                printf("%s\"%s\": \"%s\"", k++ ? ", " : "", pkv_type_name((pkv_type)t), lay);
            }
            printf("}");
            if (n_nseq) {
                printf(", \"batched_decode\": [");
                for (int k = 0; k < n_nseq; k++)
                    printf("%s{\"n_seq\": %d, \"tok_s\": %.2f, \"vs_one_sequence\": %.2f}", k ? ", " : "", n_seqs[k],
                           batched[k], s0.decode_tok_s > 0 ? batched[k] / s0.decode_tok_s : 0);
                printf("]");
            }
            printf("}\n");
        } else {
            printf("model %s (%s %s) on %s, %d threads\n", o.model ? o.model : "builtin", info.arch, info.weight_type,
                   pkv_device_name(pkv_model_device(m)), threads);
            if (slow[0])
                printf("note: weight types on a slow fallback path on %s: %s (no kernel of their own there: "
                       "blocks are decoded before the dot products)\n", pkv_device_name(pkv_model_device(m)), slow);
            for (int t = 0; t < PKV_TYPE_COUNT && t < 64; t++) {
                if (!(info.weight_types >> t & 1)) continue;
                char lay[256];
                pkv_device_weight_layout(pkv_model_device(m), (pkv_type)t, lay, sizeof lay);
                if (strcmp(lay, "plain") != 0) printf("weight layout of %s: %s\n", pkv_type_name((pkv_type)t), lay);
            }
            printf("prefill %lld tokens: %.1f tok/s (at depth %lld: %.1f)\n", n_prefill, s0.prefill_tok_s, depth, sd.prefill_tok_s);
            printf("decode  %lld tokens: %.1f tok/s (at depth %lld: %.1f)\n", n_decode, s0.decode_tok_s, depth, sd.decode_tok_s);
            if (on_device)
                printf("device memory (copy) bandwidth %.2f GB/s; decode roofline %.1f tok/s; reached %.1f%%\n", bw, roofline,
                       roofline > 0 ? 100 * s0.decode_tok_s / roofline : 0);
            else
                printf("memory read bandwidth %.2f GB/s (median of %d passes over %.0f MiB, 4x the %.0f MiB last-level "
                       "cache; best %.2f); decode roofline %.1f tok/s; reached %.1f%%\n", bw, bwr.passes,
                       (double)bwr.buffer_bytes / 1048576.0, (double)bwr.llc_bytes / 1048576.0, bwr.best_gbps, roofline,
                   roofline > 0 ? 100 * s0.decode_tok_s / roofline : 0);
            printf("attention at depth %lld: paged %.1f us, contiguous %.1f us (%.3fx)\n", depth > 0 ? depth : 4096, attn_paged,
                   attn_contig, attn_contig > 0 ? attn_paged / attn_contig : 0);
            printf("prefill %.1f GFLOP/s of a measured FMA peak of %.1f GFLOP/s (%.1f%%)\n", gflops, peak,
                   peak > 0 ? 100 * gflops / peak : 0);
            for (int k = 0; k < n_nseq; k++)
                printf("decode %d sequences together: %.1f tok/s in all (%.2fx one sequence)\n", n_seqs[k], batched[k],
                       s0.decode_tok_s > 0 ? batched[k] / s0.decode_tok_s : 0);
            if (info.n_ranks > 1)
                printf("%d MPI ranks: rank 0 holds layers [%d, %d) and sent + received %.0f bytes per decode step\n",
                       info.n_ranks, info.layer_first, info.layer_end, s0.rank_bytes_per_step);
            printf("peak RSS %.1f MiB; weights %.1f MiB, of which %.1f MiB used in place from the mapped file\n", peak_mib,
                   (double)info.weight_bytes / 1048576.0, (double)info.weight_bytes_mapped / 1048576.0);
            printf("KV %s: %.0f bytes per token; %lld tokens fit in %lld MiB\n", pkv_cli_kv_desc(&o), kv_tok, kv_max,
                   mem_mib);
            if (pkv_cli_kv_window_bytes_per_seq(c) > 0)
                printf("KV of the sliding-window layers: %.0f bytes per sequence at most (%.0f bytes per token if every "
                       "layer kept every token)\n", pkv_cli_kv_window_bytes_per_seq(c), pkv_cli_kv_bytes_per_token_all(c));
            if (st_seq > 0)
                printf("recurrent state: %.0f bytes per sequence, as much as %.0f tokens of KV; each checkpoint (fork, "
                       "prefix boundary) copies that much\n", st_seq, kv_tok > 0 ? st_seq / kv_tok : 0.0);
        }
        rc = 0;
    }
out:
    pkv_kv_cache_free(c);
    pkv_model_free(m);
    return rc;
}
