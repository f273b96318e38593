/* pagekv bench serve: a load generator over the serving engine, in process.
 * N requests arrive by a Poisson process (--rate) or from a closed loop of C
 * clients (each submits its next request when the last one finished); prompts
 * are random token ids, a --shared-prefix fraction of each being one common
 * "system prompt". The engine runs on its own thread; the figures are measured
 * in this run: throughput, time to first token and time per output token
 * (p50/p90/p99 over requests), prefix-hit fraction, preemptions, peak pages.
 * Without -m the model is the Qwen3-0.6B shape (q8_0, random weights) made in
 * memory, the reference shape of docs/BENCHMARKS.md. */
#include <math.h>
#include <stddef.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli/cli.h"
#include "cli/commands.h"
#include "pagekv.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: pagekv bench serve [-m FILE.gguf | --tiny] [options] [--json]\n"
            "Serving load through the engine (continuous batching, prefix cache, preemption).\n"
            "Without -m: the Qwen3-0.6B shape (28 layers, q8_0, random weights) made in memory.\n"
            "  --tiny                 the built-in tiny model instead (a quick smoke run)\n"
            "  -n, --requests N       requests (default 32)\n"
            "  --clients C            closed loop of C clients (default 8)\n"
            "  --rate R               Poisson arrivals, R requests/s (instead of --clients)\n"
            "  --prompt-tokens P      mean prompt length; uniform in [P/2, 3P/2] (default 96)\n"
            "  --output-tokens G      mean output length; uniform in [G/2, 3G/2] (default 32)\n"
            "  --shared-prefix F      fraction of the mean prompt that is a common prefix, 0..0.99 (default 0)\n"
            "  --pool-pages N         device KV pages (default: room for every client's longest request)\n"
            "  --host-pages N         host swap pages (default: as many as the device pool)\n"
            "  --no-swap              preempt by recompute only\n"
            "  --mtp | --draft FILE   speculative decoding with the model's MTP head or a draft model\n"
            "  --draft-max N          proposals per sequence and step (default 4)\n"
            "  --no-prefix-cache      no prefix reuse across requests\n"
            "  --batch-tokens N       tokens per step (default 256)\n"
            "  --max-seqs N           sequences per step (default 64)\n"
            "  --temp T               0 = greedy (default)\n"
            "  --json-object          every request constrained to a JSON object (response_format\n"
            "                         json_object): outputs end where the object does; reports the\n"
            "                         token-mask cost per sampled token (the built-in shape then gets\n"
            "                         a printable 151,936-token vocabulary)\n"
            "  --seed S               load and sampling seed (default 1)\n"
            "  --kv-disk DIR          a disk tier under the cache (DIR must not exist yet); reports the\n"
            "                         pages it loaded and wrote, and the spills of preempted sequences\n"
            "  --spill MODE           with --kv-disk: auto (default: whichever of spilling to disk and\n"
            "                         recomputing the engine measures cheaper), never, always\n"
            "  --warm-from-disk DIR   instead of a load: time to first token of a shared prefix of\n"
            "                         --prompt-tokens tokens, cold, warm in memory (right after, while\n"
            "                         the disk writer works, and again once it is idle) and warm from disk\n"
            "                         (a new engine on the disk tier DIR, which must not exist yet),\n"
            "                         over -n rounds with a fresh prefix each (median and each round)\n"
            "  --warm-from-remote URL likewise for the Redis tier (redis://HOST:PORT): cold on replica A,\n"
            "                         warm from Redis on replica B (a new engine once A's pages are\n"
            "                         published), warm in memory on B; -n rounds (default 1)\n"
            "  -d, -t, --page-size, --kv-type   as for run\n"
            "  --json                 one JSON object\n");
}

typedef struct bench bench;

typedef struct req_stat {
    bench *b;
    int32_t *prompt;
    int n_prompt, max_tokens;
    double t_submit, t_first, t_last;
    int n_gen;
    int n_cached;
    pkv_finish_reason fin;
    bool done;
} req_stat;

struct bench {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n_done;
    int n_error;
};

static bool on_event(const pkv_engine_event *ev, void *user) {
    req_stat *r = user;
    double t = pkv_time_now_cli();
    if (ev->token >= 0) {
        if (r->n_gen == 0) r->t_first = t;
        r->t_last = t;
        r->n_gen++;
    }
    if (ev->finish != PKV_FINISH_NONE) {
        bench *b = r->b;
        pthread_mutex_lock(&b->mu);
        r->fin = ev->finish;
        r->n_cached = ev->n_cached;
        r->done = true;
        b->n_done++;
        if (ev->finish == PKV_FINISH_ERROR) {
            b->n_error++;
            fprintf(stderr, "pagekv bench serve: request %llu failed: %s\n", (unsigned long long)ev->request, ev->message);
        }
        pthread_cond_broadcast(&b->cv);
        pthread_mutex_unlock(&b->mu);
    }
    return true;
}

static uint64_t rnd(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of sorted v[0..n). */
static double pct(const double *v, int n, double p) {
    if (n == 0) return 0;
    int k = (int)ceil(p / 100.0 * n) - 1;
    return v[k < 0 ? 0 : k >= n ? n - 1 : k];
}

static void sleep_until(double t) {
    double now = pkv_time_now_cli();
    if (t <= now) return;
    struct timespec ts;
    ts.tv_sec = (time_t)(t - now);
    ts.tv_nsec = (long)((t - now - (double)ts.tv_sec) * 1e9);
    nanosleep(&ts, NULL);
}

/* One request of n tokens with one output token, alone on a started engine; its
 * TTFT in ms and cached tokens, or -1 on failure. */
static double ttft_one(pkv_engine *e, const int32_t *tok, int n, int *cached) {
    bench b = {.n_done = 0};
    pthread_mutex_init(&b.mu, NULL);
    pthread_cond_init(&b.cv, NULL);
    req_stat r;
    memset(&r, 0, sizeof r);
    r.b = &b;
    pkv_request_params q = pkv_request_default_params();
    q.prompt = tok;
    q.n_prompt = n;
    q.max_tokens = 1;
    q.ignore_eos = true;
    q.on_event = on_event;
    q.user = &r;
    r.t_submit = pkv_time_now_cli();
    pkv_status s = pkv_engine_submit(e, &q, NULL);
    if (!s) {
        pthread_mutex_lock(&b.mu);
        while (!b.n_done) pthread_cond_wait(&b.cv, &b.mu);
        pthread_mutex_unlock(&b.mu);
    } else {
        fprintf(stderr, "pagekv bench serve: submit: %s\n", pkv_errmsg());
    }
    pthread_cond_destroy(&b.cv);
    pthread_mutex_destroy(&b.mu);
    *cached = r.n_cached;
    return s || b.n_error || r.n_gen < 1 ? -1 : (r.t_first - r.t_submit) * 1e3;
}

/* A started engine whose cache has a disk tier on dir or a remote tier at url. */
static pkv_engine *tier_engine(pkv_model *m, const char *dir, const char *url, int n_ctx, int ps, pkv_type kv_type) {
    pkv_engine_params ep = pkv_engine_default_params();
    ep.cache.n_ctx = n_ctx;
    ep.cache.page_size = ps;
    ep.cache.kv_type = kv_type;
    ep.cache.n_pages = 4 * ((n_ctx + ps - 1) / ps);
    ep.cache.disk_dir = dir;
    ep.cache.disk_bytes = 1ull << 40; /* the cap is not what is measured */
    ep.cache.remote_url = url;
    ep.cache.remote_queue_pages = 1 << 20; /* nothing skipped: the whole prefix is published */
    ep.max_seqs = 4;
    pkv_engine *e = pkv_engine_create(m, ep);
    if (!e) fprintf(stderr, "pagekv bench serve: engine: %s\n", pkv_errmsg());
    else if (pkv_engine_start(e)) {
        fprintf(stderr, "pagekv bench serve: engine thread: %s\n", pkv_errmsg());
        pkv_engine_free(e);
        e = NULL;
    }
    return e;
}

/* --warm-from-disk: per round a fresh random prefix of n_prefix tokens, asked
 * four times with its own 8-token suffix: cold (nothing anywhere), warm in
 * memory (the same engine right after, while its disk writer is still writing
 * the prefix's pages), warm in memory again once the writer is idle (the engine
 * stopped, pkv_kv_disk_flush, started again), warm from disk (the first engine
 * freed, its pages written; a new engine on the directory). Each fresh engine
 * first answers an unrelated 8-token prompt, so thread start-up is not counted. */
static int warm_from_disk(pkv_model *m, const char *dir, int n_prefix, int rounds, int ps, pkv_type kv_type,
                          uint64_t seed, bool json) {
    struct stat sb;
    if (stat(dir, &sb) == 0) {
        fprintf(stderr, "pagekv bench serve: --warm-from-disk %s exists: give a new directory (the cold run must find "
                        "nothing on disk)\n", dir);
        return 2;
    }
    pkv_model_info info;
    pkv_model_get_info(m, &info);
    int n = n_prefix + 8, n_ctx = n + 2;
    int32_t *tok = malloc((size_t)n * sizeof *tok), warm8[8];
    enum { NPH = 4 };
    double *t = calloc((size_t)rounds * NPH, sizeof *t), *srt = calloc((size_t)rounds, sizeof *srt);
    if (!tok || !t || !srt) {
        free(tok);
        free(t);
        free(srt);
        fprintf(stderr, "pagekv bench serve: out of memory\n");
        return 1;
    }
    uint64_t rs = seed * 2654435761u + 7;
    int rc = 0, cached[NPH] = {0, 0, 0, 0};
    double rd_bytes = 0, rd_s = 0, q_s = 0;
    long long w_pages = 0;
    long long disk_hits = 0;
    for (int r = 0; r < rounds && !rc; r++) {
        for (int k = 0; k < n_prefix; k++) tok[k] = (int32_t)(rnd(&rs) % (uint64_t)info.n_vocab);
        pkv_engine *e = NULL;
        for (int ph = 0; ph < NPH && !rc; ph++) {
            if (ph == 2) { /* the same engine once its writer has written everything queued */
                pkv_engine_stop(e);
                pkv_kv_stats ks; /* what the disk tier did up to here (cold and warm in memory) */
                pkv_kv_stats_get(pkv_engine_cache(e), &ks);
                q_s += ks.disk_queue_seconds;
                w_pages += (long long)ks.disk_written_pages;
                if (pkv_kv_disk_flush(pkv_engine_cache(e)) || pkv_engine_start(e)) {
                    fprintf(stderr, "pagekv bench serve: %s\n", pkv_errmsg());
                    rc = 1;
                    break;
                }
            }
            if (ph == 0 || ph == 3) { /* a fresh engine on the directory, warmed up on an unrelated prompt */
                if (!(e = tier_engine(m, dir, NULL, n_ctx, ps, kv_type))) {
                    rc = 1;
                    break;
                }
                int c0;
                for (int k = 0; k < 8; k++) warm8[k] = (int32_t)(rnd(&rs) % (uint64_t)info.n_vocab);
                if (ttft_one(e, warm8, 8, &c0) < 0) rc = 1;
            }
            for (int k = 0; k < 8; k++) tok[n_prefix + k] = (int32_t)(rnd(&rs) % (uint64_t)info.n_vocab);
            t[ph * rounds + r] = ttft_one(e, tok, n, &cached[ph]);
            if (t[ph * rounds + r] < 0) rc = 1;
            if (ph < 2) continue; /* the same engine answers warm in memory */
            pkv_engine_stop(e);
            if (ph == 3) {
                pkv_kv_stats ks;
                pkv_kv_stats_get(pkv_engine_cache(e), &ks);
                rd_bytes += (double)ks.disk_bytes_read;
                rd_s += ks.disk_read_seconds;
                disk_hits += (long long)ks.disk_hit_pages;
            }
            pkv_engine_free(e); /* its cache writes the cached pages not on disk yet */
            e = NULL;
        }
        if (e) {
            pkv_engine_stop(e);
            pkv_engine_free(e);
        }
        int full = n_prefix / ps * ps;
        if (!rc && (cached[0] != 0 || cached[1] < full || cached[2] < full || cached[3] < full)) {
            fprintf(stderr, "pagekv bench serve: round %d: cached tokens cold %d, memory %d and %d, disk %d: expected 0 "
                            "and the whole prefix's pages\n", r, cached[0], cached[1], cached[2], cached[3]);
            rc = 1;
        }
    }
    static const char *const name[NPH] = {"cold", "warm_memory", "warm_memory_idle", "warm_disk"};
    double med[NPH] = {0, 0, 0, 0};
    for (int ph = 0; ph < NPH && !rc; ph++) {
        memcpy(srt, t + ph * rounds, (size_t)rounds * sizeof *srt);
        qsort(srt, (size_t)rounds, sizeof *srt, cmp_double);
        med[ph] = pct(srt, rounds, 50);
    }
    if (!rc && json) {
        printf("{\"mode\": \"warm_from_disk\", \"weights\": \"%s\", \"layers\": %d, \"device\": \"%s\", \"prefix_tokens\": "
               "%d, \"page_size\": %d, \"rounds\": %d,\n", info.weight_type, info.n_layer,
               pkv_device_name(pkv_model_device(m)), n_prefix, ps, rounds);
        for (int ph = 0; ph < NPH; ph++) {
            printf(" \"ttft_ms_%s\": {\"median\": %.1f, \"rounds\": [", name[ph], med[ph]);
            for (int r = 0; r < rounds; r++) printf("%s%.1f", r ? ", " : "", t[ph * rounds + r]);
            printf("]},\n");
        }
        printf(" \"disk_hit_pages\": %lld, \"disk_read_mb_s\": %.0f, \"before_idle\": {\"queue_ms\": %.1f, "
               "\"written_pages\": %lld}}\n", disk_hits, rd_s > 0 ? rd_bytes / rd_s / 1e6 : 0.0, q_s * 1e3 / rounds,
               w_pages / rounds);
    } else if (!rc) {
        printf("bench serve --warm-from-disk: prefix of %d tokens (+8 own), %s weights, %d layers, %s, %d rounds\n",
               n_prefix, info.weight_type, info.n_layer, pkv_device_name(pkv_model_device(m)), rounds);
        for (int ph = 0; ph < NPH; ph++) {
            printf("  TTFT %-16s median %8.1f ms  (", name[ph], med[ph]);
            for (int r = 0; r < rounds; r++) printf("%s%.1f", r ? " " : "", t[ph * rounds + r]);
            printf(")\n");
        }
        printf("  from disk: %lld pages, %.1f MB read at %.0f MB/s (file reads alone)\n", disk_hits, rd_bytes / 1e6,
               rd_s > 0 ? rd_bytes / rd_s / 1e6 : 0.0);
        printf("  before the idle run, per round: %.1f ms of page images queued on the engine thread, %lld pages "
               "written\n", q_s * 1e3 / rounds, w_pages / rounds);
    }
    free(tok);
    free(t);
    free(srt);
    return rc;
}

/* --warm-from-remote: per round a fresh random prefix of n_prefix tokens, asked
 * three times with its own 8-token suffix: cold (replica A: a new engine, the
 * prefix in no memory and not in Redis), warm from Redis (replica B: a new engine
 * on the same Redis once A's pages are published, pkv_kv_remote_flush), warm in
 * memory (B again). Each engine first answers an unrelated 8-token prompt. */
static int warm_from_remote(pkv_model *m, const char *url, int n_prefix, int rounds, int ps, pkv_type kv_type,
                            uint64_t seed) {
    pkv_model_info info;
    pkv_model_get_info(m, &info);
    int n = n_prefix + 8, n_ctx = n + 2, rc = 0, cached[3] = {0, 0, 0};
    int32_t *tok = malloc((size_t)n * sizeof *tok), warm8[8];
    double t[3] = {0, 0, 0}, rd_s = 0;
    pkv_kv_stats ks;
    memset(&ks, 0, sizeof ks);
    uint64_t rs = seed * 2654435761u + 11;
    for (int r = 0; r < rounds && !rc && tok; r++) {
        for (int k = 0; k < n_prefix; k++) tok[k] = (int32_t)(rnd(&rs) % (uint64_t)info.n_vocab);
        for (int rep = 0; rep < 2 && !rc; rep++) { /* replica A, then B */
            pkv_engine *e = tier_engine(m, NULL, url, n_ctx, ps, kv_type);
            if (!e) {
                rc = 1;
                break;
            }
            for (int k = 0; k < 8; k++) warm8[k] = (int32_t)(rnd(&rs) % (uint64_t)info.n_vocab);
            int c0;
            rc = ttft_one(e, warm8, 8, &c0) < 0;
            for (int ph = rep; ph < 1 + 2 * rep && !rc; ph++) {
                for (int k = 0; k < 8; k++) tok[n_prefix + k] = (int32_t)(rnd(&rs) % (uint64_t)info.n_vocab);
                t[ph] = ttft_one(e, tok, n, &cached[ph]);
                rc = t[ph] < 0;
            }
            pkv_engine_stop(e);
            pkv_kv_stats_get(pkv_engine_cache(e), &ks);
            if (!rep) rc = rc || pkv_kv_remote_flush(pkv_engine_cache(e)); /* A's pages all in Redis */
            pkv_engine_free(e);
        }
        rd_s = ks.remote_read_seconds;
        printf("bench serve --warm-from-remote (round %d): prefix of %d tokens (+8 own), %s weights, %d layers, %s\n"
               "  TTFT cold (replica A)            %8.1f ms  cached %d\n"
               "  TTFT warm from Redis (replica B) %8.1f ms  cached %d: %llu pages, %.1f MB in %llu round trips, "
               "%.1f ms in them\n"
               "  TTFT warm in memory (replica B)  %8.1f ms  cached %d\n", r, n_prefix, info.weight_type,
               info.n_layer, pkv_device_name(pkv_model_device(m)), t[0], cached[0], t[1], cached[1],
               (unsigned long long)ks.remote_hit_pages, (double)ks.remote_bytes_read / 1e6,
               (unsigned long long)ks.remote_lookups, rd_s * 1e3, t[2], cached[2]);
        if (!rc && (cached[0] != 0 || cached[1] < n_prefix / ps * ps || cached[2] < n_prefix / ps * ps)) {
            fprintf(stderr, "pagekv bench serve: cached tokens %d, %d, %d: expected 0 and the whole prefix's pages\n",
                    cached[0], cached[1], cached[2]);
            rc = 1;
        }
    }
    free(tok);
    return rc;
}

/* The Qwen3-0.6B shape in memory; with_vocab: mkmodel's printable byte-level vocabulary of
 * that size (a grammar needs each token's text), else token ids only. */
static pkv_model *reference_model(const pkv_cli_model_opts *o, bool with_vocab) {
    pkv_mkmodel_params p = pkv_mkmodel_default_params();
    p.arch = "qwen3";
    p.type = PKV_TYPE_Q8_0;
    p.n_layer = 28;
    p.n_embd = 1024;
    p.n_head = 16;
    p.n_head_kv = 8;
    p.head_dim = 128;
    p.n_ff = 3072;
    p.n_vocab = 151936;
    p.no_vocab = !with_vocab;
    void *data = NULL;
    size_t size = 0;
    if (pkv_mkmodel_memory(&p, &data, &size)) {
        fprintf(stderr, "pagekv bench serve: cannot make the model: %s\n", pkv_errmsg());
        return NULL;
    }
    pkv_model_params mp = pkv_model_default_params();
    mp.device = o->device;
    mp.n_threads = o->threads;
    pkv_model *m = pkv_model_load_memory(data, size, "qwen3-0.6b-shape-q8_0", mp);
    pkv_mkmodel_free_memory(data);
    if (!m) fprintf(stderr, "pagekv bench serve: cannot load the model: %s\n", pkv_errmsg());
    return m;
}

/* What `pagekv bench serve` was asked (the options table below fills it). */
typedef struct bs_opts {
    pkv_cli_model_opts o; /* first: pkv_cli_model_more */
    long long n_req, clients, p_mean, g_mean, pool, host, batch_tokens, max_seqs, seed, draft_max;
    double rate, shared, temp;
    bool json_object, json, swap, prefix, tiny, use_mtp, help;
    pkv_spill_mode spill;
    const char *draft_path, *warm_dir, *disk_dir, *warm_url;
} bs_opts;

static bool bs_opt_spill(void *opts, const char *opt, const char *m) {
    bs_opts *r = opts;
    (void)opt;
    if (!strcmp(m, "auto")) r->spill = PKV_SPILL_AUTO;
    else if (!strcmp(m, "never")) r->spill = PKV_SPILL_NEVER;
    else if (!strcmp(m, "always")) r->spill = PKV_SPILL_ALWAYS;
    else {
        fprintf(stderr, "pagekv bench serve: --spill %s: give auto, never or always\n", m);
        return false;
    }
    return true;
}

#define BS_OPT(...) PKV_CLI_OPT(bs_opts, __VA_ARGS__)
static const pkv_cli_opt bs_options[] = {
    BS_OPT("-h", "--help", PKV_CLI_FLAG, help, 0, 0),
    BS_OPT("-n", "--requests", PKV_CLI_LLONG, n_req, 1, 100000),
    BS_OPT("--clients", NULL, PKV_CLI_LLONG, clients, 1, 4096),
    BS_OPT("--prompt-tokens", NULL, PKV_CLI_LLONG, p_mean, 2, 1 << 16),
    BS_OPT("--output-tokens", NULL, PKV_CLI_LLONG, g_mean, 1, 1 << 16),
    BS_OPT("--pool-pages", NULL, PKV_CLI_LLONG, pool, 1, 1 << 24),
    BS_OPT("--host-pages", NULL, PKV_CLI_LLONG, host, 1, 1 << 24),
    BS_OPT("--batch-tokens", NULL, PKV_CLI_LLONG, batch_tokens, 1, 1 << 16),
    BS_OPT("--max-seqs", NULL, PKV_CLI_LLONG, max_seqs, 1, 4096),
    BS_OPT("--seed", NULL, PKV_CLI_LLONG, seed, 0, (double)(1LL << 62)),
    BS_OPT("--draft-max", NULL, PKV_CLI_LLONG, draft_max, 1, 64),
    BS_OPT("--rate", NULL, PKV_CLI_DOUBLE, rate, 0.001, 1e6),
    BS_OPT("--shared-prefix", NULL, PKV_CLI_DOUBLE, shared, 0, 0.99),
    BS_OPT("--temp", NULL, PKV_CLI_DOUBLE, temp, 0, 100),
    BS_OPT("--no-swap", NULL, PKV_CLI_UNSET, swap, 0, 0),
    BS_OPT("--json-object", NULL, PKV_CLI_FLAG, json_object, 0, 0),
    BS_OPT("--no-prefix-cache", NULL, PKV_CLI_UNSET, prefix, 0, 0),
    BS_OPT("--tiny", NULL, PKV_CLI_FLAG, tiny, 0, 0),
    BS_OPT("--mtp", NULL, PKV_CLI_FLAG, use_mtp, 0, 0),
    BS_OPT("--draft", NULL, PKV_CLI_STR, draft_path, 0, 0),
    BS_OPT("--json", NULL, PKV_CLI_FLAG, json, 0, 0),
    BS_OPT("--kv-disk", NULL, PKV_CLI_STR, disk_dir, 0, 0),
    {"--spill", NULL, PKV_CLI_FN, 0, 0, 0, bs_opt_spill, true},
    BS_OPT("--warm-from-disk", NULL, PKV_CLI_STR, warm_dir, 0, 0),
    BS_OPT("--warm-from-remote", NULL, PKV_CLI_STR, warm_url, 0, 0),
};
#undef BS_OPT

static const pkv_cli_cmd bs_cmd = {"bench serve", bs_options, sizeof bs_options / sizeof bs_options[0],
                                   offsetof(bs_opts, help), usage, pkv_cli_model_more, false, true, 0};

/* Fill b from argv: -1 to go on, else the exit code. */
static int bs_parse(int argc, char **argv, bs_opts *b) {
    memset(b, 0, sizeof *b);
    b->o = pkv_cli_model_defaults();
    b->n_req = 32, b->clients = 8, b->p_mean = 96, b->g_mean = 32, b->batch_tokens = 256, b->max_seqs = 64;
    b->seed = 1;
    b->swap = b->prefix = true;
    b->spill = PKV_SPILL_AUTO;
    int rc = pkv_cli_parse(&bs_cmd, argc, argv, b);
    if (rc >= 0) return rc;
    if ((b->use_mtp && (b->draft_path || !b->o.model)) || (b->draft_max && !b->use_mtp && !b->draft_path)) {
        fprintf(stderr, "pagekv bench serve: --mtp needs -m FILE with MTP layers and no --draft; --draft-max needs "
                        "--mtp or --draft FILE\n");
        return 2;
    }
    return -1;
}

/* One load: its requests, the engine and what it measured. */
typedef struct bs_run {
    const bs_opts *a;
    pkv_model *m, *draft;
    pkv_model_info info;
    req_stat *rq;   /* [n_req] */
    int32_t *sys;   /* [sys_len] the shared prefix */
    double *arrive; /* [n_req] seconds after the start (--rate) */
    double *ttft, *tpot; /* [n_req] ms, sorted when reported */
    bench b;
    pkv_engine *e;
    pkv_grammar *gram;
    int ps;
    double wall;
    pkv_engine_stats st;
    pkv_kv_stats ks;
} bs_run;

/* The requests, fixed by the seed; false (said) when out of memory. */
static bool bs_make_load(bs_run *x) {
    const bs_opts *a = x->a;
    uint64_t rs = (uint64_t)a->seed * 2654435761u + 1;
    int n_vocab = x->info.n_vocab;
    int sys_len = (int)llround(a->shared * (double)a->p_mean);
    x->sys = malloc((size_t)(sys_len + 1) * sizeof *x->sys);
    x->rq = calloc((size_t)a->n_req, sizeof *x->rq);
    x->arrive = calloc((size_t)a->n_req, sizeof *x->arrive);
    x->ttft = calloc((size_t)a->n_req, sizeof *x->ttft);
    x->tpot = calloc((size_t)a->n_req, sizeof *x->tpot);
    if (!x->sys || !x->rq || !x->arrive || !x->ttft || !x->tpot) {
        fprintf(stderr, "pagekv bench serve: out of memory\n");
        return false;
    }
    for (int k = 0; k < sys_len; k++) x->sys[k] = (int32_t)(rnd(&rs) % (uint64_t)n_vocab);
    double t_arr = 0;
    for (int i = 0; i < a->n_req; i++) {
        req_stat *r = &x->rq[i];
        r->b = &x->b;
        r->n_prompt = (int)(a->p_mean / 2 + (long long)(rnd(&rs) % (uint64_t)(a->p_mean + 1)));
        if (r->n_prompt < 1) r->n_prompt = 1;
        r->max_tokens = (int)(a->g_mean / 2 + (long long)(rnd(&rs) % (uint64_t)(a->g_mean + 1)));
        if (r->max_tokens < 1) r->max_tokens = 1;
        if (!(r->prompt = malloc((size_t)r->n_prompt * sizeof *r->prompt))) {
            fprintf(stderr, "pagekv bench serve: out of memory\n");
            return false;
        }
        int k = 0;
        for (; k < sys_len && k < r->n_prompt - 1; k++) r->prompt[k] = x->sys[k];
        for (; k < r->n_prompt; k++) r->prompt[k] = (int32_t)(rnd(&rs) % (uint64_t)n_vocab);
        if (a->rate > 0) { /* exponential gaps */
            double u = (double)(rnd(&rs) >> 11) * 0x1.0p-53;
            t_arr += -log(1.0 - u) / a->rate;
            x->arrive[i] = t_arr;
        }
    }
    return true;
}

/* The engine for the load, started; else the exit code (said). */
static int bs_start_engine(bs_run *x) {
    const bs_opts *a = x->a;
    pkv_engine_params ep = pkv_engine_default_params();
    int p_max = (int)(a->p_mean * 3 / 2), g_max = (int)(a->g_mean * 3 / 2);
    int ps = x->ps = a->o.page_size ? a->o.page_size : 16;
    int n_ctx = a->o.n_ctx ? a->o.n_ctx : p_max + g_max + 1;
    long long conc = a->rate > 0 ? PKV_ENGINE_MAX_N : a->clients; /* open loop: size for 64 in flight */
    if (conc > a->n_req) conc = a->n_req;
    ep.cache.n_ctx = n_ctx;
    ep.cache.page_size = ps;
    ep.cache.kv_type = (pkv_type)a->o.kv_type;
    ep.cache.n_pages = a->pool ? a->pool : conc * ((n_ctx + ps - 1) / ps);
    ep.cache.host_pages = a->host;
    if (a->disk_dir) {
        struct stat sb;
        if (stat(a->disk_dir, &sb) == 0) {
            fprintf(stderr, "pagekv bench serve: --kv-disk %s exists: give a new directory (a run must start empty)\n",
                    a->disk_dir);
            return 2;
        }
        ep.cache.disk_dir = a->disk_dir;
        ep.cache.disk_bytes = 1ull << 40;
    }
    ep.max_batch_tokens = (int)a->batch_tokens;
    ep.max_seqs = (int)a->max_seqs;
    ep.spill = a->spill;
    ep.swap = a->swap;
    ep.prefix_cache = a->prefix;
    ep.draft = x->draft;
    ep.draft_max = (int)a->draft_max;
    if (!(x->e = pkv_engine_create(x->m, ep))) {
        fprintf(stderr, "pagekv bench serve: engine: %s\n", pkv_errmsg());
        return 1;
    }
    if (a->json_object && !(x->gram = pkv_grammar_from_json_schema("{\"type\": \"object\"}", 18))) {
        fprintf(stderr, "pagekv bench serve: --json-object: %s\n", pkv_errmsg());
        return 1;
    }
    if (pkv_engine_start(x->e)) {
        fprintf(stderr, "pagekv bench serve: engine thread: %s\n", pkv_errmsg());
        return 1;
    }
    return 0;
}

/* Submit request i to the engine (called without b.mu held). */
static void bs_submit(bs_run *x, int i) {
    req_stat *r = &x->rq[i];
    pkv_request_params q = pkv_request_default_params();
    q.prompt = r->prompt;
    q.n_prompt = r->n_prompt;
    q.max_tokens = r->max_tokens;
    q.ignore_eos = x->gram == NULL; /* a grammar decides where the output ends */
    q.grammar = x->gram;
    q.sampling.temp = (float)x->a->temp;
    q.sampling.seed = (uint64_t)x->a->seed + (uint64_t)i;
    q.on_event = on_event;
    q.user = r;
    r->t_submit = pkv_time_now_cli();
    pkv_status s = pkv_engine_submit(x->e, &q, NULL);
    pthread_mutex_lock(&x->b.mu);
    if (s) {
        fprintf(stderr, "pagekv bench serve: submit: %s\n", pkv_errmsg());
        r->done = true;
        x->b.n_done++;
        x->b.n_error++;
    }
    pthread_mutex_unlock(&x->b.mu);
}

/* Run the load to the end: arrivals by --rate or a closed loop of --clients;
 * then the engine's statistics and each request's latencies (sorted). */
static void bs_drive(bs_run *x) {
    const bs_opts *a = x->a;
    bench *b = &x->b;
    double t0 = pkv_time_now_cli();
    int next = 0;
    pthread_mutex_lock(&b->mu);
    while (b->n_done < a->n_req) {
        int in_flight = next - b->n_done;
        bool go = next < a->n_req && (a->rate > 0 ? pkv_time_now_cli() - t0 >= x->arrive[next] : in_flight < a->clients);
        if (go) {
            pthread_mutex_unlock(&b->mu);
            bs_submit(x, next++);
            pthread_mutex_lock(&b->mu);
            continue;
        }
        if (a->rate > 0 && next < a->n_req) {
            pthread_mutex_unlock(&b->mu);
            sleep_until(t0 + x->arrive[next]);
            pthread_mutex_lock(&b->mu);
        } else {
            pthread_cond_wait(&b->cv, &b->mu);
        }
    }
    pthread_mutex_unlock(&b->mu);
    x->wall = pkv_time_now_cli() - t0;
    pkv_engine_stop(x->e); /* the last step's statistics are complete once it returned */
    pkv_engine_stats_get(x->e, &x->st);
    pkv_kv_stats_get(pkv_engine_cache(x->e), &x->ks);
}

/* What the reports say beyond the engine's statistics. */
typedef struct bs_figures {
    long long gen, prompt_tok; /* tokens generated, prompt tokens */
    int n_t, n_p;              /* requests with a first token, with a second */
    double hit;                /* prefix-hit fraction of the prompt tokens */
} bs_figures;

/* Totals over the requests; ttft/tpot filled (n_t, n_p of them) and sorted. */
static void bs_figures_get(bs_run *x, bs_figures *f) {
    memset(f, 0, sizeof *f);
    for (int i = 0; i < x->a->n_req; i++) {
        req_stat *r = &x->rq[i];
        f->gen += r->n_gen;
        f->prompt_tok += r->n_prompt;
        if (r->n_gen > 0) x->ttft[f->n_t++] = (r->t_first - r->t_submit) * 1e3;
        if (r->n_gen > 1) x->tpot[f->n_p++] = (r->t_last - r->t_first) * 1e3 / (r->n_gen - 1);
    }
    qsort(x->ttft, (size_t)f->n_t, sizeof *x->ttft, cmp_double);
    qsort(x->tpot, (size_t)f->n_p, sizeof *x->tpot, cmp_double);
    f->hit = x->st.prompt_tokens ? (double)x->st.prefix_hit_tokens / (double)x->st.prompt_tokens : 0;
}

/* The figures as one JSON object (--json). */
static void bs_report_json(const bs_run *x, const bs_figures *f) {
    const bs_opts *a = x->a;
    const pkv_engine_stats *st = &x->st;
    const pkv_kv_stats *ks = &x->ks;
    const pkv_model_info *info = &x->info;
    printf("{\"model\": \"%s\", \"weights\": \"%s\", \"layers\": %d, \"device\": \"%s\",\n", a->o.model ? a->o.model : a->tiny ? "builtin" : "qwen3-0.6b-shape (made in memory)",
           info->weight_type, info->n_layer, pkv_device_name(pkv_model_device(x->m)));
    printf(" \"requests\": %lld, \"arrivals\": \"%s\", \"clients\": %lld, \"rate\": %g,\n", a->n_req,
           a->rate > 0 ? "poisson" : "closed", a->rate > 0 ? 0 : a->clients, a->rate);
    printf(" \"prompt_tokens_mean\": %lld, \"output_tokens_mean\": %lld, \"shared_prefix\": %g, \"temp\": %g,\n",
           a->p_mean, a->g_mean, a->shared, a->temp);
    printf(" \"page_size\": %d, \"pool_pages\": %lld, \"host_pages\": %lld, \"batch_tokens\": %lld, \"swap\": %s, "
           "\"prefix_cache\": %s,\n",
           x->ps, (long long)st->pages_total, (long long)st->host_pages, a->batch_tokens, a->swap ? "true" : "false",
           a->prefix ? "true" : "false");
    printf(" \"wall_s\": %.3f, \"output_tok_s\": %.2f, \"total_tok_s\": %.2f, \"computed_tok_s\": %.2f,\n", x->wall,
           (double)f->gen / x->wall, (double)(f->gen + f->prompt_tok) / x->wall, (double)st->computed_tokens / x->wall);
    printf(" \"ttft_ms\": {\"p50\": %.1f, \"p90\": %.1f, \"p99\": %.1f},\n", pct(x->ttft, f->n_t, 50), pct(x->ttft, f->n_t, 90),
           pct(x->ttft, f->n_t, 99));
    printf(" \"tpot_ms\": {\"p50\": %.1f, \"p90\": %.1f, \"p99\": %.1f},\n", pct(x->tpot, f->n_p, 50), pct(x->tpot, f->n_p, 90),
           pct(x->tpot, f->n_p, 99));
    printf(" \"prompt_tokens\": %llu, \"prefix_hit_tokens\": %llu, \"prefix_hit_fraction\": %.3f, "
           "\"generated_tokens\": %llu, \"computed_tokens\": %llu,\n",
           (unsigned long long)st->prompt_tokens, (unsigned long long)st->prefix_hit_tokens, f->hit,
           (unsigned long long)st->generated_tokens, (unsigned long long)st->computed_tokens);
    printf(" \"preemptions\": {\"swap\": %llu, \"recompute\": %llu, \"spill\": %llu}, \"peak_pages\": %lld, "
           "\"steps\": %llu, \"tokens_per_step\": %.1f, \"failed\": %d,\n",
           (unsigned long long)st->preemptions_swap, (unsigned long long)st->preemptions_recompute,
           (unsigned long long)st->preemptions_spill,
           (long long)st->pages_peak, (unsigned long long)st->steps,
           st->steps ? (double)st->computed_tokens / (double)st->steps : 0.0, x->b.n_error);
    printf(" \"draft\": %s%s%s, \"draft_proposed\": %llu, \"draft_accepted\": %llu, \"draft_steps\": %llu,\n",
           x->draft ? "\"" : "", a->use_mtp ? "mtp" : a->draft_path ? a->draft_path : "null", x->draft ? "\"" : "",
           (unsigned long long)st->draft_proposed, (unsigned long long)st->draft_accepted,
           (unsigned long long)st->draft_steps);
    printf(" \"disk_hit_pages\": %llu, \"disk_written_pages\": %llu,\n", (unsigned long long)ks->disk_hit_pages,
           (unsigned long long)ks->disk_written_pages);
    if (a->disk_dir) /* spilling preempted sequences: what it cost against recomputing */
        printf(" \"spill\": {\"mode\": \"%s\", \"preemptions\": %llu, \"failed\": %llu, \"pages_written\": %llu, "
               "\"bytes_written\": %llu, \"pages_resumed\": %llu, \"pages_read\": %llu, \"write_ms_per_page\": %.3f, "
               "\"read_ms_per_page\": %.3f, \"disk_file_read_ms_per_page\": %.3f, \"prefill_ms_per_token\": %.3f, "
               "\"recompute_ms_per_page\": %.3f},\n",
               a->spill == PKV_SPILL_NEVER ? "never" : a->spill == PKV_SPILL_ALWAYS ? "always" : "auto",
               (unsigned long long)st->preemptions_spill, (unsigned long long)st->spill_failed,
               (unsigned long long)st->spill_pages_written, (unsigned long long)st->spill_bytes_written,
               (unsigned long long)st->spill_pages_resumed, (unsigned long long)st->spill_pages_read,
               st->spill_pages_written ? st->spill_write_seconds * 1e3 / (double)st->spill_pages_written : 0.0,
               st->spill_pages_read ? st->spill_read_seconds * 1e3 / (double)st->spill_pages_read : 0.0,
               ks->disk_hit_pages ? ks->disk_read_seconds * 1e3 / (double)ks->disk_hit_pages : 0.0,
               st->prefill_seconds_per_token * 1e3, st->prefill_seconds_per_token * 1e3 * x->ps);
    printf(" \"grammar\": %s, \"vocab\": %d, \"grammar_masks\": %llu, \"grammar_mask_us_per_token\": %.1f}\n",
               x->gram ? "\"json_object\"" : "null", info->n_vocab, (unsigned long long)st->grammar_masks,
               st->grammar_masks ? st->grammar_mask_seconds * 1e6 / (double)st->grammar_masks : 0.0);
}

/* The figures for people. */
static void bs_report_text(const bs_run *x, const bs_figures *f) {
    const bs_opts *a = x->a;
    const pkv_engine_stats *st = &x->st;
    const pkv_kv_stats *ks = &x->ks;
    const pkv_model_info *info = &x->info;
    printf("bench serve: %lld requests (%s), prompt ~%lld tokens (%.0f%% shared), output ~%lld, %s weights, %s\n",
           a->n_req, a->rate > 0 ? "Poisson arrivals" : "closed loop", a->p_mean, a->shared * 100, a->g_mean, info->weight_type,
           pkv_device_name(pkv_model_device(x->m)));
    printf("  %.2f s: %.2f output tok/s, %.2f total tok/s; %llu steps, %.1f tokens per step\n", x->wall,
           (double)f->gen / x->wall, (double)(f->gen + f->prompt_tok) / x->wall, (unsigned long long)st->steps,
           st->steps ? (double)st->computed_tokens / (double)st->steps : 0.0);
    printf("  TTFT ms p50 %.1f p90 %.1f p99 %.1f; TPOT ms p50 %.1f p90 %.1f p99 %.1f\n", pct(x->ttft, f->n_t, 50),
           pct(x->ttft, f->n_t, 90), pct(x->ttft, f->n_t, 99), pct(x->tpot, f->n_p, 50), pct(x->tpot, f->n_p, 90), pct(x->tpot, f->n_p, 99));
    printf("  prefix hits %.1f%% of prompt tokens; preemptions %llu swap + %llu recompute; peak %lld of %lld pages\n",
           f->hit * 100, (unsigned long long)st->preemptions_swap, (unsigned long long)st->preemptions_recompute,
           (long long)st->pages_peak, (long long)st->pages_total);
    if (x->draft)
        printf("  draft %s: %llu proposals verified, %llu kept (%.1f%%), %llu draft steps\n",
               a->use_mtp ? "(MTP head)" : a->draft_path, (unsigned long long)st->draft_proposed,
               (unsigned long long)st->draft_accepted,
               st->draft_proposed ? 100.0 * (double)st->draft_accepted / (double)st->draft_proposed : 0.0,
               (unsigned long long)st->draft_steps);
    if (x->gram)
        printf("  json_object constraint: %llu token masks over a %d-token vocabulary, %.1f us each\n",
               (unsigned long long)st->grammar_masks, info->n_vocab,
               st->grammar_masks ? st->grammar_mask_seconds * 1e6 / (double)st->grammar_masks : 0.0);
    if (a->disk_dir)
        printf("  disk tier: %llu pages loaded, %llu written; %llu preemptions spilled (%llu failed), %llu pages "
               "written by spills (%.2f ms each), %llu read back (%.2f ms each); prefill %.3f ms per token\n",
               (unsigned long long)ks->disk_hit_pages, (unsigned long long)ks->disk_written_pages,
               (unsigned long long)st->preemptions_spill, (unsigned long long)st->spill_failed,
               (unsigned long long)st->spill_pages_written,
               st->spill_pages_written ? st->spill_write_seconds * 1e3 / (double)st->spill_pages_written : 0.0,
               (unsigned long long)st->spill_pages_read,
               st->spill_pages_read ? st->spill_read_seconds * 1e3 / (double)st->spill_pages_read : 0.0,
               st->prefill_seconds_per_token * 1e3);
    if (x->b.n_error) printf("  %d requests failed\n", x->b.n_error);
}

int pkv_cli_bench_serve(int argc, char **argv) {
    bs_opts a;
    int rc = bs_parse(argc, argv, &a);
    if (rc >= 0) return rc;
    pkv_model *m = a.o.model || a.tiny ? pkv_cli_open_model("bench serve", &a.o) : reference_model(&a.o, a.json_object);
    if (!m) return 1;
    if (a.warm_url) {
        bool has_n = false;
        for (int i = 1; i < argc; i++) has_n |= !strcmp(argv[i], "-n") || !strcmp(argv[i], "--requests");
        int r = warm_from_remote(m, a.warm_url, (int)a.p_mean, has_n ? (int)a.n_req : 1, a.o.page_size ? a.o.page_size : 16,
                                 (pkv_type)a.o.kv_type, (uint64_t)a.seed);
        pkv_model_free(m);
        return r;
    }
    if (a.warm_dir) {
        bool has_n = false;
        for (int i = 1; i < argc; i++) has_n |= !strcmp(argv[i], "-n") || !strcmp(argv[i], "--requests");
        int r = warm_from_disk(m, a.warm_dir, (int)a.p_mean, has_n ? (int)a.n_req : 3, a.o.page_size ? a.o.page_size : 16,
                               (pkv_type)a.o.kv_type, (uint64_t)a.seed, a.json);
        pkv_model_free(m);
        return r;
    }
    bs_run x = {.a = &a, .m = m};
    if (a.use_mtp || a.draft_path) {
        pkv_model_params dp = pkv_model_default_params();
        dp.device_handle = pkv_model_device(m);
        dp.n_threads = a.o.threads;
        dp.mtp = a.use_mtp;
        if (!(x.draft = pkv_model_load(a.use_mtp ? a.o.model : a.draft_path, dp))) {
            fprintf(stderr, "pagekv bench serve: cannot load the draft: %s\n", pkv_errmsg());
            pkv_model_free(m);
            return 1;
        }
    }
    pkv_model_get_info(m, &x.info);
    pthread_mutex_init(&x.b.mu, NULL);
    pthread_cond_init(&x.b.cv, NULL);
    rc = 1;
    if (bs_make_load(&x) && !(rc = bs_start_engine(&x))) {
        bs_drive(&x);
        bs_figures f;
        bs_figures_get(&x, &f);
        if (a.json) bs_report_json(&x, &f);
        else bs_report_text(&x, &f);
        rc = x.b.n_error ? 1 : 0;
    }
    pkv_engine_free(x.e);
    pkv_grammar_free(x.gram);
    pkv_model_free(x.draft);
    pkv_model_free(m);
    for (int i = 0; x.rq && i < a.n_req; i++) free(x.rq[i].prompt);
    free(x.rq);
    free(x.sys);
    free(x.arrive);
    free(x.ttft);
    free(x.tpot);
    pthread_cond_destroy(&x.b.cv);
    pthread_mutex_destroy(&x.b.mu);
    return rc;
}
