/* pagekv demo: on every device, the built-in model (or any GGUF file, -m) generates
 * from a prompt, and each KV operation (fork, swap out/in, shift, save/load) is
 * checked by comparing the continuation with a replay from scratch. Prints
 * operation, device, result, time; exits 1 if any check fails. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli-media.h"
#include "cli/cli.h"
#include "cli/commands.h"
#include "pagekv.h"

#define N_GEN 12

typedef struct {
    pkv_model *m;
    pkv_kv_cache *c;
    int V;
    const char *dev;
    const char *path;    /* the model file (-m), or NULL for the built-in model */
    pkv_model_params mp; /* how the model was placed (device or split) */
    int failed, rows;
} demo;

static void row(demo *d, const char *op, bool ok, double secs, const char *detail) {
    printf("%-12s %-18s %-5s %8.3f  %s\n", op, d->dev, ok ? "pass" : "FAIL", secs, detail);
    fflush(stdout);
    d->rows++;
    if (!ok) d->failed++;
}

static bool same_bits(const float *a, const float *b, int n) { return memcmp(a, b, (size_t)n * sizeof(float)) == 0; }

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Continue ctx greedily for n tokens, recording tokens and every step's logits. */
static pkv_status continue_greedy(demo *d, pkv_context *ctx, int n, int32_t *toks, float *logits) {
    for (int i = 0; i < n; i++) {
        const float *lg = pkv_context_logits(ctx);
        if (!lg) return PKV_ERR_INVALID;
        memcpy(logits + (size_t)i * (size_t)d->V, lg, (size_t)d->V * sizeof(float));
        toks[i] = argmax(lg, d->V);
        pkv_status s = pkv_context_decode(ctx, &toks[i], 1);
        if (s) return s;
    }
    return PKV_OK;
}

/* Replay from scratch: prefix as one batch, then `steps` tokens one at a time
 * (the same batching as the original), comparing logits before each step. */
static pkv_status replay(demo *d, const int32_t *prefix, int n_prefix, const int32_t *steps, int n_steps,
                         const float *want_logits, bool *bitwise, double *max_nmse) {
    pkv_context *r = pkv_context_create(d->m, d->c, 0);
    if (!r) return PKV_ERR_NOMEM;
    pkv_status s = pkv_context_decode(r, prefix, n_prefix);
    *bitwise = true;
    *max_nmse = 0;
    for (int i = 0; !s && i < n_steps; i++) {
        const float *lg = pkv_context_logits(r), *w = want_logits + (size_t)i * (size_t)d->V;
        if (!same_bits(lg, w, d->V)) *bitwise = false;
        double num = 0, den = 0;
        for (int k = 0; k < d->V; k++) {
            num += ((double)lg[k] - w[k]) * ((double)lg[k] - w[k]);
            den += (double)w[k] * w[k];
        }
        if (num / den > *max_nmse) *max_nmse = num / den;
        s = pkv_context_decode(r, &steps[i], 1);
    }
    pkv_context_free(r);
    return s;
}

/* Context shift is exact only where cached K/V do not depend on the removed
 * tokens: in layer 0. So this check uses a one-layer model (same shapes and
 * device): decode the history, remove 4 tokens after the first, decode the next
 * token; a replay decodes the shortened history from scratch at the new
 * positions. The model is placed like the demo's (one device, or split). They differ only by rounding of the re-rotated f16 keys. (With more
 * layers, the kept tokens' deeper K/V were computed attending to the removed
 * ones: context shift is then an approximation by nature, as in every engine.) */
static pkv_status check_shift(demo *d, const int32_t *hist, int n_hist, double *nmse, bool *agree) {
    const int start = 1, drop = 4;
    pkv_mkmodel_params mp = pkv_mkmodel_default_params();
    mp.n_layer = 1;
    /* a model file: one layer of its own shape, RoPE and vocabulary (random weights) */
    mp.draft_of = d->path;
    void *img = NULL;
    size_t size = 0;
    pkv_status s = pkv_mkmodel_memory(&mp, &img, &size);
    if (s) return s;
    pkv_model *m = pkv_model_load_memory(img, size, d->path ? "1-layer model of the file's shape" : "builtin-1-layer",
                                         d->mp); /* same placement */
    pkv_mkmodel_free_memory(img);
    pkv_cache_params cp = pkv_cache_default_params();
    cp.n_ctx = 256;
    pkv_kv_cache *c = m ? pkv_model_cache_create(m, cp) : NULL;
    pkv_context *a = c ? pkv_context_create(m, c, 0) : NULL, *r = c ? pkv_context_create(m, c, 0) : NULL;
    s = a && r ? PKV_OK : PKV_ERR_NOMEM;
    if (!s) s = pkv_context_decode(a, hist, n_hist);
    int32_t next = 0, short_hist[512];
    int n_short = 0;
    if (!s) {
        next = argmax(pkv_context_logits(a), d->V);
        s = pkv_context_shift(a, start, drop);
    }
    if (!s) s = pkv_context_decode(a, &next, 1);
    for (int i = 0; i < n_hist; i++)
        if (i < start || i >= start + drop) short_hist[n_short++] = hist[i];
    if (!s) s = pkv_context_decode(r, short_hist, n_short);
    if (!s) s = pkv_context_decode(r, &next, 1);
    if (!s) {
        const float *x = pkv_context_logits(a), *y = pkv_context_logits(r);
        double num = 0, den = 0;
        for (int k = 0; k < d->V; k++) {
            num += ((double)x[k] - y[k]) * ((double)x[k] - y[k]);
            den += (double)y[k] * y[k];
        }
        *nmse = num / den;
        *agree = argmax(x, d->V) == argmax(y, d->V);
    }
    pkv_context_free(a);
    pkv_context_free(r);
    pkv_kv_cache_free(c);
    pkv_model_free(m);
    return s;
}

static void run_device(demo *d, const int32_t *prompt, int n_prompt) {
    int V = d->V;
    float *lg = malloc((size_t)N_GEN * (size_t)V * sizeof(float));
    int32_t toks[N_GEN + 256], hist[512];
    char detail[256];
    double t0;
    bool bit;
    double nmse;
    pkv_status s;
    if (!lg) return;

    /* generate: prompt + greedy continuation, and the history the later checks use */
    t0 = pkv_time_now_cli();
    pkv_context *base = pkv_context_create(d->m, d->c, 0);
    s = base ? pkv_context_decode(base, prompt, n_prompt) : PKV_ERR_NOMEM;
    if (!s) s = continue_greedy(d, base, N_GEN, toks, lg);
    if (!s) s = replay(d, prompt, n_prompt, toks, N_GEN, lg, &bit, &nmse);
    if (s) snprintf(detail, sizeof detail, "%.200s", pkv_errmsg());
    else snprintf(detail, sizeof detail, "%d prompt + %d generated tokens; replay logits %s", n_prompt, N_GEN,
                     bit ? "bitwise equal" : "DIFFER");
    row(d, "generate", !s && bit, pkv_time_now_cli() - t0, detail);
    if (s) goto out;
    int n_hist = n_prompt + N_GEN;
    memcpy(hist, prompt, (size_t)n_prompt * sizeof *hist);
    memcpy(hist + n_prompt, toks, N_GEN * sizeof *hist);

    /* fork: two branches from the same point; each must equal its own replay */
    {
        t0 = pkv_time_now_cli();
        pkv_context *a = pkv_context_fork(base), *b = pkv_context_fork(base);
        int32_t ta[N_GEN], tb[N_GEN];
        float *lb = malloc((size_t)N_GEN * (size_t)V * sizeof(float));
        s = a && b && lb ? PKV_OK : PKV_ERR_NOMEM;
        /* branch b starts with a different token so the branches diverge */
        int32_t other = (int32_t)((argmax(pkv_context_logits(base), V) + 1) % V);
        if (!s) s = continue_greedy(d, a, N_GEN, ta, lg);
        if (!s) s = pkv_context_decode(b, &other, 1);
        if (!s) s = continue_greedy(d, b, N_GEN, tb, lb);
        bool bit_a = false, bit_b = false;
        if (!s) s = replay(d, hist, n_hist, ta, N_GEN, lg, &bit_a, &nmse);
        if (!s) {
            int32_t steps[N_GEN + 1];
            steps[0] = other;
            memcpy(steps + 1, tb, sizeof tb);
            /* replay b: history, then `other`, then its tokens; compare from the step after `other` */
            pkv_context *r = pkv_context_create(d->m, d->c, 0);
            s = r ? pkv_context_decode(r, hist, n_hist) : PKV_ERR_NOMEM;
            if (!s) s = pkv_context_decode(r, &other, 1);
            bit_b = true;
            for (int i = 0; !s && i < N_GEN; i++) {
                if (!same_bits(pkv_context_logits(r), lb + (size_t)i * (size_t)V, V)) bit_b = false;
                s = pkv_context_decode(r, &tb[i], 1);
            }
            pkv_context_free(r);
        }
        bool diverged = memcmp(ta, tb, sizeof ta) != 0;
        if (s) snprintf(detail, sizeof detail, "%.200s", pkv_errmsg());
        else snprintf(detail, sizeof detail, "2 branches at %d tokens (%s); each == replay: %s", n_hist,
                      diverged ? "diverged" : "same tokens", bit_a && bit_b ? "bitwise" : "NO");
        row(d, "fork", !s && bit_a && bit_b, pkv_time_now_cli() - t0, detail);
        free(lb);
        pkv_context_free(a);
        pkv_context_free(b);
        if (s) goto out;
    }

    /* swap out, disturb the pool with another sequence, swap in, continue */
    {
        t0 = pkv_time_now_cli();
        pkv_context *a = pkv_context_fork(base);
        pkv_context *other = pkv_context_create(d->m, d->c, 0);
        s = a && other ? PKV_OK : PKV_ERR_NOMEM;
        if (!s) s = pkv_context_swap_out(a);
        if (!s) s = pkv_context_decode(other, hist, n_hist); /* reuses freed pages */
        if (!s) s = pkv_context_swap_in(a);
        int32_t ta[N_GEN];
        if (!s) s = continue_greedy(d, a, N_GEN, ta, lg);
        /* an unswapped replay with the same batching: prompt, then each token */
        bit = false;
        if (!s) {
            pkv_context *r = pkv_context_create(d->m, d->c, 0);
            s = r ? pkv_context_decode(r, prompt, n_prompt) : PKV_ERR_NOMEM;
            for (int i = 0; !s && i < N_GEN; i++) s = pkv_context_decode(r, &toks[i], 1);
            bit = true;
            for (int i = 0; !s && i < N_GEN; i++) {
                if (!same_bits(pkv_context_logits(r), lg + (size_t)i * (size_t)V, V)) bit = false;
                s = pkv_context_decode(r, &ta[i], 1);
            }
            pkv_context_free(r);
        }
        if (s) snprintf(detail, sizeof detail, "%.200s", pkv_errmsg());
        else snprintf(detail, sizeof detail, "%d tokens out to host and back; continuation == replay: %s", n_hist,
                      bit ? "bitwise" : "NO");
        row(d, "swap", !s && bit, pkv_time_now_cli() - t0, detail);
        pkv_context_free(a);
        pkv_context_free(other);
        if (s) goto out;
    }

    /* shift */
    {
        t0 = pkv_time_now_cli();
        double worst = 0;
        bool agree = false;
        s = check_shift(d, hist, n_hist, &worst, &agree);
        bool ok = !s && worst < 1e-4 && agree;
        if (s) snprintf(detail, sizeof detail, "%.200s", pkv_errmsg());
        else snprintf(detail, sizeof detail, "removed 4 of %d tokens, K re-rotated; next logits vs replay nmse %.1e (< 1e-4), argmax %s",
                      n_hist, worst, agree ? "equal" : "DIFFERS");
        row(d, "shift", ok, pkv_time_now_cli() - t0, detail);
        if (s) goto out;
    }

    /* save and load: the loaded context continues exactly like the original */
    {
        t0 = pkv_time_now_cli();
        char path[256];
        char devname[64];
        snprintf(devname, sizeof devname, "%.60s", d->dev);
        for (char *p = devname; *p; p++)
            if (*p == ':' || *p == ',' || *p == '+') *p = '_';
        snprintf(path, sizeof path, "%.150s/pagekv-demo-%d-%s.kv", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid(),
                 devname);
        s = pkv_context_save(base, path);
        pkv_context *a = s ? NULL : pkv_context_load(d->m, d->c, path, 0);
        if (!s && !a) s = PKV_ERR_FORMAT;
        unlink(path);
        int32_t ta[N_GEN], tb[N_GEN];
        float *lb = malloc((size_t)N_GEN * (size_t)V * sizeof(float));
        pkv_context *b = pkv_context_fork(base);
        if (!s && (!lb || !b)) s = PKV_ERR_NOMEM;
        if (!s) s = continue_greedy(d, a, N_GEN, ta, lg);
        if (!s) s = continue_greedy(d, b, N_GEN, tb, lb);
        bit = !s && memcmp(ta, tb, sizeof ta) == 0 && same_bits(lg, lb, N_GEN * V);
        if (s) snprintf(detail, sizeof detail, "%.200s", pkv_errmsg());
        else snprintf(detail, sizeof detail, "%lld tokens to a file and back; continuation == original: %s",
                      (long long)pkv_context_n_tokens(base), bit ? "bitwise" : "NO");
        row(d, "save/load", !s && bit, pkv_time_now_cli() - t0, detail);
        free(lb);
        pkv_context_free(a);
        pkv_context_free(b);
    }
out:
    if (s && d->rows == 0) row(d, "generate", false, 0, pkv_errmsg());
    pkv_context_free(base);
    free(lg);
}

int pkv_cli_demo(int argc, char **argv) {
    const char *only = NULL, *pair = NULL, *path = NULL;
    pkv_cli_media mo;
    memset(&mo, 0, sizeof mo);
    for (int i = 1; i < argc; i++) {
        int mr = pkv_cli_media_opt(argc, argv, &i, &mo);
        if (mr < 0) return 2;
        if (mr > 0) continue;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: pagekv demo [-m FILE.gguf] [--device NAME | --devices A,B]\n"
                   "On every device (or just NAME): the model generates from a prompt, forks,\n"
                   "swaps out and in, shifts, saves and loads, and each continuation is checked against\n"
                   "a replay from scratch. Then the same on the first two devices as a tensor-parallel\n"
                   "pair (heads split, KV sharded), with the cache on the devices and on the host\n"
                   "(\"+host\"). --devices A,B runs just that pair (e.g. cuda:0,vulkan:0), with the\n"
                   "cache on the devices and on the host. Exit 1 when a check fails.\n"
                   "  -m FILE    a GGUF model (default: the built-in tiny model): your model on your\n"
                   "             device. The shift check runs on a 1-layer model of the file's shape,\n"
                   "             RoPE and vocabulary (random weights): shift is exact only in layer 0.\n"
                   "             A model without a vocabulary is given token ids.\n"
                   "  --mmproj FILE --audio FILE | --image FILE   (with -m) every KV operation with the\n"
                   "             file's projector rows in the prompt, against replay: fork after the\n"
                   "             media, a prefix hit on it == cold, one sample/pixel changed is a miss,\n"
                   "             truncate into it, shift, swap and save/load round trips\n"
                   "             (docs/multimodal.md, \"Media in the cache\"); on --device NAME or every device.\n");
            return 0;
        } else if (!strcmp(argv[i], "-m") || !strcmp(argv[i], "--model")) {
            if (!(path = pkv_cli_value(argc, argv, &i))) return 2;
            if (access(path, R_OK)) {
                fprintf(stderr, "pagekv demo: cannot read %s\n", path);
                return 2;
            }
        } else if (!strcmp(argv[i], "--device") || !strcmp(argv[i], "-d")) {
            if (!(only = pkv_cli_value(argc, argv, &i))) return 2;
        } else if (!strcmp(argv[i], "--devices")) {
            if (!(pair = pkv_cli_value(argc, argv, &i))) return 2;
            const char *comma = strchr(pair, ',');
            if (!comma || comma == pair || !comma[1] || strchr(comma + 1, ',') || comma - pair > 60 || strlen(comma + 1) > 60) {
                fprintf(stderr, "pagekv demo: --devices takes two device names, A,B (got '%s')\n", pair);
                return 2;
            }
        } else {
            fprintf(stderr, "pagekv demo: unknown option '%s' (see 'pagekv demo --help')\n", argv[i]);
            return 2;
        }
    }
    if (!pkv_cli_media_check("demo", &mo)) return 2;
    if (mo.n && (!path || pair)) {
        fprintf(stderr, "pagekv demo: --audio/--image need the text model the projector was made for (-m FILE), on one "
                        "device at a time (not --devices)\n");
        return 2;
    }
    char names[80][64], why[256];
    int n = 0;
    if (pair) {
        /* the pair alone: names[0], names[1] feed the sharded runs below */
        const char *comma = strchr(pair, ',');
        snprintf(names[0], 64, "%.*s", (int)(comma - pair), pair);
        snprintf(names[1], 64, "%s", comma + 1);
        n = 0;
    } else if (only) {
        snprintf(names[0], 64, "%s", only);
        n = 1;
    } else {
        pkv_device_enumerate(pkv_cli_extra_cpus(), names, 80, &n, why, sizeof why);
        if (n > 80) n = 80;
        if (why[0]) printf("note: %s\n", why);
    }
    if (mo.n) { /* the media demo: each device alone */
        const char *devs[80];
        int nd = 0;
        for (int i = 0; i < n; i++)
            if (only || strcmp(names[i], "faulty")) devs[nd++] = names[i];
        printf("model: %s\nprojector: %s\nmedia: %s\n", path, mo.mmproj, mo.path[0]);
        return pkv_cli_demo_media(path, devs, nd, &mo);
    }
    if (path) printf("model: %s\n", path);
    printf("%-12s %-18s %-5s %8s  %s\n", "operation", "device", "result", "seconds", "detail");
    int failed = 0, rows = 0;
    /* every device alone, then the first two CPU devices as a tensor-parallel pair,
     * with the cache on the devices and on the host */
    char sharded[2][160];
    int n_runs = n;
    if (pair || (!only && n >= 2)) {
        snprintf(sharded[0], sizeof sharded[0], "%.60s,%.60s", names[0], names[1]);
        snprintf(sharded[1], sizeof sharded[1], "%.60s,%.60s+host", names[0], names[1]);
        n_runs = n + 2;
    }
    for (int i = 0; i < n_runs; i++) {
        const char *label = i < n ? names[i] : sharded[i - n];
        if (!only && !strcmp(label, "faulty")) continue; /* shown by `pagekv check`; `demo --device faulty` runs it */
        pkv_model_params mp = pkv_model_default_params();
        char devs[160];
        if (i < n) {
            mp.device = names[i];
        } else {
            snprintf(devs, sizeof devs, "%.60s,%.60s", names[0], names[1]);
            mp.devices = devs;
            mp.kv_on_host = i == n + 1;
        }
        demo d = {0};
        d.dev = label;
        d.path = path;
        d.mp = mp;
        d.m = path ? pkv_model_load(path, mp) : pkv_model_builtin(mp);
        pkv_cache_params cp = pkv_cache_default_params();
        cp.n_ctx = 256;
        cp.n_seq_max = 8;
        if (d.m) d.c = pkv_model_cache_create(d.m, cp);
        if (!d.m || !d.c) {
            printf("%-12s %-10s %-5s %8.3f  %s\n", "load", label, "FAIL", 0.0, pkv_errmsg());
            failed++;
            rows++;
            pkv_model_free(d.m);
            continue;
        }
        pkv_model_info info;
        pkv_model_get_info(d.m, &info);
        d.V = info.n_vocab;
        const char *text = "The quick brown fox jumps over the lazy dog";
        int32_t prompt[128];
        size_t np = 0;
        if (!info.has_vocab) /* token ids only: a fixed spread of ids */
            for (np = 0; np < 12; np++) prompt[np] = (int32_t)((np * 7919 + 1) % (size_t)d.V);
        if (info.has_vocab && pkv_model_tokenize(d.m, text, strlen(text), true, false, prompt, 128, &np)) {
            printf("%-12s %-10s %-5s %8.3f  %s\n", "tokenize", names[i], "FAIL", 0.0, pkv_errmsg());
            failed++;
        } else {
            run_device(&d, prompt, (int)np);
        }
        failed += d.failed;
        rows += d.rows;
        pkv_kv_cache_free(d.c);
        pkv_model_free(d.m);
    }
    printf("\ndemo: %d checks, %d passed, %d failed\n", rows, rows - failed, failed);
    return failed ? 1 : 0;
}
