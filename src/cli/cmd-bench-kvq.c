/* pagekv bench kv-accuracy: what quantized KV pages cost in accuracy. The same
 * token sequence (random ids, teacher-forced) runs through the model once per
 * KV type; at each depth D (default 512 and 4096) the logits of the tokens at
 * positions D .. D+N-1 (decoded one at a time, as in generation) are compared with
 * those of the f16-KV run: normalized mean squared error (sum of squared
 * differences over the sum of squared f16 logits) and top-1 agreement (the share
 * of positions whose argmax is the same). f32 pages are in the default list as
 * the noise floor: how far the model moves for a perturbation of the K/V by f16
 * rounding. Printed as JSON. Measured, never asserted. */
#include "cli/cli.h"
#include "cli/commands.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTHS 8
#define MAX_TYPES 8

typedef struct {
    int k, v; /* pkv_type */
} kv_pair;

/* "--types f32,q8_0,q8_0/q4_0": T (K and V) or K/V, at most MAX_TYPES; the
 * count, or 0 with the error printed. */
static int parse_types(const char *cmd, const char *opt, const char *v, kv_pair *types) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", v);
    int nt = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (nt == MAX_TYPES) {
            fprintf(stderr, "pagekv bench %s: at most %d types\n", cmd, MAX_TYPES);
            return 0;
        }
        char *slash = strchr(tok, '/');
        if (slash) *slash = 0;
        if (!pkv_cli_kv_type(opt, tok, &types[nt].k) || !pkv_cli_kv_type(opt, slash ? slash + 1 : tok, &types[nt].v))
            return 0;
        nt++;
    }
    if (!nt) fprintf(stderr, "pagekv bench %s: %s is empty\n", cmd, opt);
    return nt;
}

/* Logits [n_depths][n][V] of one run with KV types kp. */
static int run_types(pkv_model *m, const pkv_cli_model_opts *base, kv_pair kp, const int32_t *toks, const long long *depths,
                     int nd, int n, int V, float *out) {
    pkv_cli_model_opts o = *base;
    o.kv_type = kp.k;
    o.kv_type_v = kp.v;
    o.n_ctx = (int)(depths[nd - 1] + n + 1);
    pkv_kv_cache *c = pkv_cli_open_cache("bench kv-accuracy", m, &o, 1);
    if (!c) return 1;
    pkv_context *ctx = pkv_context_create(m, c, o.n_ctx);
    int rc = 1;
    if (!ctx) {
        pkv_cli_fail("bench kv-accuracy", "context", PKV_ERR_NOMEM);
        goto out;
    }
    long long done = 0;
    for (int d = 0; d < nd; d++) {
        /* prefill up to the depth in chunks of 512, then N single-token steps */
        while (done < depths[d]) {
            int k = (int)(depths[d] - done < 512 ? depths[d] - done : 512);
            pkv_status s = pkv_context_decode(ctx, toks + done, k);
            if (s) {
                pkv_cli_fail("bench kv-accuracy", "prefill", s);
                goto out;
            }
            done += k;
        }
        for (int i = 0; i < n; i++) {
            pkv_status s = pkv_context_decode(ctx, toks + done, 1);
            if (s) {
                pkv_cli_fail("bench kv-accuracy", "decode", s);
                goto out;
            }
            done++;
            memcpy(out + ((size_t)d * n + i) * V, pkv_context_logits(ctx), (size_t)V * sizeof(float));
        }
    }
    rc = 0;
out:
    pkv_context_free(ctx);
    pkv_kv_cache_free(c);
    return rc;
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static void kv_accuracy_usage(FILE *f) {
    fprintf(f, "usage: pagekv bench kv-accuracy [-m FILE.gguf] [-t N] [-d DEVICE] [--depths D1,D2,...] [-n N]\n"
               "                                [--types T1,T2,...]\n"
               "Logits NMSE and top-1 agreement of KV page types against f16 pages, over the N (default\n"
               "32) tokens after each depth (default 512,4096), on the same teacher-forced random tokens.\n"
               "--types: T (K and V) or K/V, of f32, f16, q8_0, q4_0 (default f32,q8_0,q4_0,q8_0/q4_0;\n"
               "f32 shows the noise floor of the model). JSON on stdout.\n");
}

/* What `pagekv bench kv-accuracy` was asked. */
typedef struct kva_opts {
    pkv_cli_model_opts o; /* first: pkv_cli_model_more */
    long long depths[MAX_DEPTHS], n;
    int nd, nt;
    kv_pair types[MAX_TYPES];
    bool help;
} kva_opts;

static bool kva_opt_types(void *opts, const char *opt, const char *v) {
    kva_opts *k = opts;
    int nt = parse_types("kv-accuracy", opt, v, k->types);
    if (nt) k->nt = nt;
    return nt > 0;
}

static bool kva_opt_depths(void *opts, const char *opt, const char *v) {
    kva_opts *k = opts;
    (void)opt;
    k->nd = 0;
    for (const char *p = v; *p && k->nd < MAX_DEPTHS;) {
        char *end;
        long long x = strtoll(p, &end, 10);
        if (end == p || x < 0 || (k->nd > 0 && x < k->depths[k->nd - 1] + 32)) {
            fprintf(stderr, "pagekv bench kv-accuracy: --depths wants increasing numbers, got '%s'\n", v);
            return false;
        }
        k->depths[k->nd++] = x;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') {
            fprintf(stderr, "pagekv bench kv-accuracy: --depths wants D1,D2,..., got '%s'\n", v);
            return false;
        }
    }
    return true;
}

static const pkv_cli_opt kva_options[] = {
    PKV_CLI_OPT(kva_opts, "-h", "--help", PKV_CLI_FLAG, help, 0, 0),
    {"--types", NULL, PKV_CLI_FN, 0, 0, 0, kva_opt_types, true},
    PKV_CLI_OPT(kva_opts, "-n", NULL, PKV_CLI_LLONG, n, 1, 4096),
    {"--depths", NULL, PKV_CLI_FN, 0, 0, 0, kva_opt_depths, true},
};
static const pkv_cli_cmd kva_cmd = {"bench kv-accuracy", kva_options, sizeof kva_options / sizeof kva_options[0],
                                    offsetof(kva_opts, help), kv_accuracy_usage, pkv_cli_model_more, false, false, 0};

int pkv_cli_bench_kv_accuracy(int argc, char **argv) {
    kva_opts args = {.depths = {512, 4096}, .n = 32, .nd = 2, .nt = 4,
                  .types = {{PKV_TYPE_F32, PKV_TYPE_F32},
                            {PKV_TYPE_Q8_0, PKV_TYPE_Q8_0},
                            {PKV_TYPE_Q4_0, PKV_TYPE_Q4_0},
                            {PKV_TYPE_Q8_0, PKV_TYPE_Q4_0}}};
    args.o = pkv_cli_model_defaults();
    int parsed = pkv_cli_parse(&kva_cmd, argc, argv, &args);
    if (parsed >= 0) return parsed;
    pkv_cli_model_opts o = args.o;
    const long long *depths = args.depths, n = args.n;
    const int nd = args.nd, nt = args.nt;
    const kv_pair *types = args.types;
    for (int d = 1; d < nd; d++)
        if (depths[d] < depths[d - 1] + n) {
            fprintf(stderr, "pagekv bench kv-accuracy: depths must be at least -n %lld apart\n", n);
            return 2;
        }
    pkv_model *m = pkv_cli_open_model("bench kv-accuracy", &o);
    if (!m) return 1;
    pkv_model_info info;
    pkv_model_get_info(m, &info);
    const int V = info.n_vocab;
    const long long total = depths[nd - 1] + n;
    int32_t *toks = malloc((size_t)total * sizeof *toks);
    const size_t per = (size_t)nd * (size_t)n * (size_t)V;
    float *ref = malloc(per * sizeof(float)), *got = malloc(per * sizeof(float));
    int rc = 1;
    if (!toks || !ref || !got) {
        pkv_cli_fail("bench kv-accuracy", "memory", PKV_ERR_NOMEM);
        goto out;
    }
    uint64_t seed = 42;
    for (long long i = 0; i < total; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        toks[i] = (int32_t)((seed >> 33) % (uint64_t)V);
    }
    if ((rc = run_types(m, &o, (kv_pair){PKV_TYPE_F16, PKV_TYPE_F16}, toks, depths, nd, (int)n, V, ref))) goto out;
    printf("{\"model\": \"%s\", \"arch\": \"%s\", \"weight_type\": \"%s\", \"device\": \"%s\", \"tokens_per_depth\": %lld, "
           "\"against\": \"f16\", \"results\": [",
           o.model ? o.model : "builtin", info.arch, info.weight_type, pkv_device_name(pkv_model_device(m)), n);
    for (int t = 0; t < nt; t++) {
        if ((rc = run_types(m, &o, types[t], toks, depths, nd, (int)n, V, got))) goto out;
        for (int d = 0; d < nd; d++) {
            double num = 0, den = 0;
            int agree = 0;
            for (int i = 0; i < n; i++) {
                const float *a = ref + ((size_t)d * n + i) * V, *b = got + ((size_t)d * n + i) * V;
                for (int j = 0; j < V; j++) {
                    num += ((double)a[j] - b[j]) * ((double)a[j] - b[j]);
                    den += (double)a[j] * a[j];
                }
                agree += argmax(a, V) == argmax(b, V);
            }
            printf("%s{\"k\": \"%s\", \"v\": \"%s\", \"depth\": %lld, \"nmse\": %.3e, \"top1_agreement\": %.4f}",
                   t || d ? ", " : "", pkv_type_name((pkv_type)types[t].k), pkv_type_name((pkv_type)types[t].v), depths[d],
                   den > 0 ? num / den : 0, (double)agree / (double)n);
            fflush(stdout);
        }
    }
    printf("]}\n");
    rc = 0;
out:
    free(toks);
    free(ref);
    free(got);
    pkv_model_free(m);
    return rc;
}

/* pagekv bench kv-speed: decode speed at a depth for several KV types, measured
 * in one process with the types interleaved (round r decodes N tokens on each
 * type in turn), so that load from elsewhere on a shared machine hits every type
 * alike; the best round of each type is reported, and its median. */
static void kv_speed_usage(FILE *f) {
    fprintf(f, "usage: pagekv bench kv-speed [-m FILE.gguf] [-t N] [-d DEVICE] [--depth D] [--decode N]\n"
               "                             [--rounds R] [--types T1,T2,...]\n"
               "Decode tokens/s at depth D (default 4096) for each KV type (default f16,q8_0,q4_0,q8_0/q4_0;\n"
               "T or K/V), the types interleaved over R rounds (default 5) of N tokens (default 16). JSON.\n");
}

/* What `pagekv bench kv-speed` was asked. */
typedef struct kvs_opts {
    pkv_cli_model_opts o; /* first: pkv_cli_model_more */
    long long depth, n, rounds;
    int nt;
    kv_pair types[MAX_TYPES];
    bool help;
} kvs_opts;

static bool kvs_opt_types(void *opts, const char *opt, const char *v) {
    kvs_opts *k = opts;
    int nt = parse_types("kv-speed", opt, v, k->types);
    if (nt) k->nt = nt;
    return nt > 0;
}

static const pkv_cli_opt kvs_options[] = {
    PKV_CLI_OPT(kvs_opts, "-h", "--help", PKV_CLI_FLAG, help, 0, 0),
    PKV_CLI_OPT(kvs_opts, "--depth", NULL, PKV_CLI_LLONG, depth, 1, 1 << 20),
    PKV_CLI_OPT(kvs_opts, "--decode", NULL, PKV_CLI_LLONG, n, 1, 4096),
    PKV_CLI_OPT(kvs_opts, "--rounds", NULL, PKV_CLI_LLONG, rounds, 1, 100),
    {"--types", NULL, PKV_CLI_FN, 0, 0, 0, kvs_opt_types, true},
};
static const pkv_cli_cmd kvs_cmd = {"bench kv-speed", kvs_options, sizeof kvs_options / sizeof kvs_options[0],
                                    offsetof(kvs_opts, help), kv_speed_usage, pkv_cli_model_more, false, false, 0};

int pkv_cli_bench_kv_speed(int argc, char **argv) {
    kvs_opts args = {.depth = 4096, .n = 16, .rounds = 5, .nt = 4,
                  .types = {{PKV_TYPE_F16, PKV_TYPE_F16},
                            {PKV_TYPE_Q8_0, PKV_TYPE_Q8_0},
                            {PKV_TYPE_Q4_0, PKV_TYPE_Q4_0},
                            {PKV_TYPE_Q8_0, PKV_TYPE_Q4_0}}};
    args.o = pkv_cli_model_defaults();
    int parsed = pkv_cli_parse(&kvs_cmd, argc, argv, &args);
    if (parsed >= 0) return parsed;
    pkv_cli_model_opts o = args.o;
    const long long depth = args.depth, n = args.n, rounds = args.rounds;
    const int nt = args.nt;
    const kv_pair *types = args.types;
    pkv_model *m = pkv_cli_open_model("bench kv-speed", &o);
    if (!m) return 1;
    pkv_model_info info;
    pkv_model_get_info(m, &info);
    const long long total = depth + n * rounds + 1;
    int32_t *toks = malloc((size_t)total * sizeof *toks);
    pkv_kv_cache *c[MAX_TYPES] = {0};
    pkv_context *ctx[MAX_TYPES] = {0};
    double best[MAX_TYPES], times[MAX_TYPES][100];
    int rc = 1;
    if (!toks) goto out;
    uint64_t seed = 7;
    for (long long i = 0; i < total; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        toks[i] = (int32_t)((seed >> 33) % (uint64_t)info.n_vocab);
    }
    for (int t = 0; t < nt; t++) {
        pkv_cli_model_opts ot = o;
        ot.kv_type = types[t].k;
        ot.kv_type_v = types[t].v;
        ot.n_ctx = (int)total;
        if (!(c[t] = pkv_cli_open_cache("bench kv-speed", m, &ot, 1))) goto out;
        if (!(ctx[t] = pkv_context_create(m, c[t], total))) {
            pkv_cli_fail("bench kv-speed", "context", PKV_ERR_NOMEM);
            goto out;
        }
        for (long long done = 0; done < depth;) {
            int k = (int)(depth - done < 512 ? depth - done : 512);
            pkv_status s = pkv_context_decode(ctx[t], toks + done, k);
            if (s) {
                pkv_cli_fail("bench kv-speed", "prefill", s);
                goto out;
            }
            done += k;
        }
        best[t] = 1e30;
    }
    for (int r = 0; r < rounds; r++)
        for (int t = 0; t < nt; t++) {
            double t0 = pkv_time_now_cli();
            for (int i = 0; i < n; i++) {
                pkv_status s = pkv_context_decode(ctx[t], toks + depth + (long long)r * n + i, 1);
                if (s) {
                    pkv_cli_fail("bench kv-speed", "decode", s);
                    goto out;
                }
            }
            times[t][r] = (pkv_time_now_cli() - t0) / (double)n;
            if (times[t][r] < best[t]) best[t] = times[t][r];
        }
    printf("{\"model\": \"%s\", \"arch\": \"%s\", \"weight_type\": \"%s\", \"device\": \"%s\", \"threads\": %d, \"depth\": %lld, "
           "\"tokens_per_round\": %lld, \"rounds\": %lld, \"results\": [",
           o.model ? o.model : "builtin", info.arch, info.weight_type, pkv_device_name(pkv_model_device(m)), o.threads, depth,
           n, rounds);
    for (int t = 0; t < nt; t++) {
        double s[100];
        memcpy(s, times[t], (size_t)rounds * sizeof(double));
        for (int a = 1; a < rounds; a++) /* insertion sort: a few values */
            for (int b = a; b > 0 && s[b] < s[b - 1]; b--) {
                double x = s[b];
                s[b] = s[b - 1];
                s[b - 1] = x;
            }
        printf("%s{\"k\": \"%s\", \"v\": \"%s\", \"kv_bytes_per_token\": %.0f, \"decode_tok_s_best\": %.2f, "
               "\"decode_tok_s_median\": %.2f}",
               t ? ", " : "", pkv_type_name((pkv_type)types[t].k), pkv_type_name((pkv_type)types[t].v),
               pkv_cli_kv_bytes_per_token(c[t]), 1.0 / best[t], 1.0 / s[rounds / 2]);
    }
    printf("]}\n");
    rc = 0;
out:
    for (int t = 0; t < nt; t++) {
        pkv_context_free(ctx[t]);
        pkv_kv_cache_free(c[t]);
    }
    free(toks);
    pkv_model_free(m);
    return rc;
}
