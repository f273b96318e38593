/* pagekv bench kv: speed of the KV cache operations on one device, printed as one
 * JSON object (--json) or a table. Measured, never asserted.
 *
 * Layout: 28 layers, 8 KV heads, head size 128 (K and V), f16 by default (a
 * 7B-class GQA model); --kv-type, --kv-type-k, --kv-type-v choose f16, f32, q8_0,
 * q4_0. kv_bytes_per_token and max_context: what one token costs, and the most
 * tokens (whole pages) that fit in --kv-memory MiB (default 8192). fork_us: mean fork time of a context of 256 .. 65,536 tokens (the fork is
 * O(1): the target is the 65,536-token fork within 2x of the 256-token fork).
 * cow_bytes: bytes copied by the first append after a fork into a shared partial
 * page. swap_*_gbps vs memcpy_gbps: a 2,048-token sequence moved to the host pool
 * and back, against a plain host memcpy of the same size in the same run.
 * hybrid: a Qwen3.5-0.8B-shaped cache (24 layers: 18 gated delta-net layers of 16
 * value heads of 128, conv window 3 x 6144, and 6 attention layers of 2 KV heads of
 * 256): the recurrent state's bytes per sequence and the fork of a 4,096-token
 * context with and without the recurrent layers (the state is copied, the pages
 * shared).
 * snapshot_us: pkv_kv_snapshot_take + free (what pagekv serve's GET /v1/kv costs
 * the worker between engine steps) of a 16,384-page pool holding a 4,096-token
 * context and 64 forks of it, each one token longer (a page of its own): the
 * size of the layout does not matter to it, so the pool is one small layer. */
#include "cli/commands.h"
#include "cli/cli.h"
#include "base/base.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BK_LAYERS 28
#define BK_HEADS 8
#define BK_DIM 128
#define BK_SWAP_TOKENS 2048

typedef struct bench_kv {
    int n_ctx;
    int ctx[8];
    double fork_us[8];
    uint64_t cow_bytes, swap_bytes;
    double swap_out_gbps, swap_in_gbps, memcpy_gbps;
    double memcpy_chunk_gbps; /* the same total in chunk_bytes pieces, as the swap moves it */
    size_t chunk_bytes;
    double shift_us_per_token, shift_move_us_per_token, append_us;
    int64_t shift_tokens;
    size_t hy_state_bytes;                 /* one sequence's recurrent state (all 18 layers) */
    double hy_fork_us, hy_fork_kv_only_us; /* fork at 4,096 tokens: with the state, attention layers alone */
    double snap_us;                        /* pkv_kv_snapshot_take + free, median */
    int64_t snap_pages, snap_entries;      /* the pool, and block table entries listed */
} bench_kv;

static pkv_type g_tk = PKV_TYPE_F16, g_tv = PKV_TYPE_F16; /* --kv-type* */

static pkv_kv_cache *make_cache(pkv_device *dev, int page_size, int64_t n_pages, int64_t host_pages,
                                pkv_kv_layer_desc *L) {
    for (int i = 0; i < BK_LAYERS; i++) L[i] = (pkv_kv_layer_desc){BK_HEADS, BK_DIM, BK_DIM, g_tk, g_tv, 0, NULL, 0, 0, 0, 0, 0, {0}, 0, 0, false, false, 0};
    pkv_kv_params p = pkv_kv_default_params();
    p.n_layers = BK_LAYERS;
    p.layers = L;
    p.device = dev;
    p.page_size = page_size;
    p.n_pages = n_pages;
    p.host_pages = host_pages;
    p.rope_neox = true;
    p.rope_freq_base = 1000000.0f;
    return pkv_kv_cache_create(p);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Fork of a 4,096-token context on the Qwen3.5-0.8B shape; recurrent false: the
 * attention layers alone. Median of 101. */
static pkv_status bench_fork_hybrid(pkv_device *dev, int ps, bool recurrent, double *us, size_t *state_bytes) {
    enum { HL = 24, REPS = 101 };
    const int conv = 3 * (2 * 16 * 128 + 16 * 128), ssm = 16 * 128 * 128;
    pkv_kv_layer_desc L[HL];
    int n = 0;
    for (int i = 0; i < HL; i++) {
        bool attn = (i + 1) % 4 == 0;
        if (!attn && !recurrent) continue;
        L[n++] = attn ? (pkv_kv_layer_desc){.n_kv_heads = 2, .head_dim_k = 256, .head_dim_v = 256, .dtype_k = g_tk,
                                            .dtype_v = g_tv}
                      : (pkv_kv_layer_desc){.n_kv_heads = 1, .state_per_head = (conv + 63) / 64 * 64 + ssm};
    }
    pkv_kv_params p = pkv_kv_default_params();
    p.n_layers = n;
    p.layers = L;
    p.device = dev;
    p.page_size = ps;
    p.n_pages = 4096 / ps + 8;
    p.state_slots = 4;
    p.rope_neox = true;
    pkv_kv_cache *c = pkv_kv_cache_create(p);
    if (!c) return PKV_ERR_NOMEM;
    int32_t seq, child, *rows = pkv_malloc(4096 * sizeof *rows);
    pkv_status st = rows ? pkv_kv_seq_create(c, 0, &seq) : PKV_ERR_NOMEM;
    if (!st) st = pkv_kv_append(c, seq, 4096, NULL, NULL, rows);
    static double t[REPS];
    for (int i = 0; i < REPS && !st; i++) {
        double t0 = pkv_time_now();
        st = pkv_kv_fork(c, seq, &child);
        if (!st) st = pkv_device_sync(dev); /* the state copy is device work */
        t[i] = pkv_time_now() - t0;
        if (!st) st = pkv_kv_seq_free(c, child);
    }
    if (!st) {
        qsort(t, REPS, sizeof t[0], cmp_double);
        *us = t[REPS / 2] * 1e6;
        pkv_kv_stats ks;
        pkv_kv_stats_get(c, &ks);
        *state_bytes = ks.state_slot_bytes;
    }
    pkv_free(rows);
    pkv_kv_cache_free(c);
    return st;
}

/* The snapshot behind GET /v1/kv (see the top). Median of 201. */
static pkv_status bench_snapshot(pkv_device *dev, bench_kv *r) {
    enum { REPS = 201, FORKS = 64, CTX = 4096 };
    pkv_kv_layer_desc L = {1, 32, 32, PKV_TYPE_F16, PKV_TYPE_F16, 0, NULL, 0, 0, 0, 0, 0, {0}, 0, 0, false, false, 0};
    pkv_kv_params p = pkv_kv_default_params();
    p.n_layers = 1;
    p.layers = &L;
    p.device = dev;
    p.page_size = 16;
    p.n_pages = 16384;
    p.host_pages = 16384;
    pkv_kv_cache *c = pkv_kv_cache_create(p);
    if (!c) return PKV_ERR_NOMEM;
    int32_t seq, *rows = pkv_malloc(CTX * sizeof *rows);
    pkv_status st = rows ? pkv_kv_seq_create(c, 0, &seq) : PKV_ERR_NOMEM;
    if (!st) st = pkv_kv_append(c, seq, CTX, NULL, NULL, rows);
    for (int i = 0; i < FORKS && !st; i++) {
        int32_t child;
        st = pkv_kv_fork(c, seq, &child);
        if (!st) st = pkv_kv_append(c, child, 1, NULL, NULL, rows);
    }
    static double t[REPS];
    for (int i = 0; i < REPS && !st; i++) {
        double t0 = pkv_time_now();
        pkv_kv_snapshot *sn = pkv_kv_snapshot_take(c, 0);
        if (!sn) {
            st = PKV_ERR_NOMEM;
            break;
        }
        r->snap_pages = sn->n_pages;
        r->snap_entries = sn->n_listed;
        pkv_kv_snapshot_free(sn);
        t[i] = pkv_time_now() - t0;
    }
    if (!st) {
        qsort(t, REPS, sizeof t[0], cmp_double);
        r->snap_us = t[REPS / 2] * 1e6;
    }
    pkv_free(rows);
    pkv_kv_cache_free(c);
    return st;
}

/* Fork times for contexts of 256 .. 65,536 tokens in one cache. */
static pkv_status bench_fork(pkv_device *dev, int ps, bench_kv *r) {
    pkv_kv_layer_desc L[BK_LAYERS];
    int max_ctx = 65536;
    pkv_kv_cache *c = NULL;
    while (!c && max_ctx >= 256) {
        c = make_cache(dev, ps, max_ctx / ps + 4, 0, L);
        if (!c) max_ctx /= 2;
    }
    if (!c) return PKV_ERR_NOMEM;
    r->n_ctx = 0;
    for (int n = 256; n <= max_ctx; n *= 4) {
        int32_t seq;
        pkv_status st = pkv_kv_seq_create(c, 0, &seq);
        int32_t *rows = pkv_malloc((size_t)n * sizeof *rows);
        if (st || !rows || (st = pkv_kv_append(c, seq, n, NULL, NULL, rows))) {
            pkv_free(rows);
            pkv_kv_cache_free(c);
            return st ? st : PKV_ERR_NOMEM;
        }
        pkv_free(rows);
        enum { REPS = 2001 };
        static double t[REPS];
        for (int i = 0; i < REPS; i++) {
            int32_t child;
            double t0 = pkv_time_now();
            st = pkv_kv_fork(c, seq, &child);
            t[i] = pkv_time_now() - t0;
            if (!st) st = pkv_kv_seq_free(c, child);
            if (st) break;
        }
        if (st) {
            pkv_kv_cache_free(c);
            return st;
        }
        qsort(t, REPS, sizeof t[0], cmp_double);
        r->ctx[r->n_ctx] = n;
        r->fork_us[r->n_ctx++] = t[REPS / 2] * 1e6;
        pkv_kv_seq_free(c, seq);
        if (n < 65536 && n * 4 > max_ctx && n != max_ctx) n = max_ctx / 4; /* finish on the largest that fits */
    }
    /* cow: a context with a partial last page, fork, one append into the child */
    int32_t seq, child, rows[1024];
    pkv_kv_stats a, b;
    pkv_status st = pkv_kv_seq_create(c, 0, &seq);
    if (!st) st = pkv_kv_append(c, seq, 1000, NULL, NULL, rows);
    if (!st) st = pkv_kv_fork(c, seq, &child);
    pkv_kv_stats_get(c, &a);
    if (!st) st = pkv_kv_append(c, child, 1, NULL, NULL, rows);
    pkv_kv_stats_get(c, &b);
    r->cow_bytes = b.cow_bytes - a.cow_bytes;
    /* append: one token per call, decode-style */
    if (!st) {
        int n = 4096 < max_ctx - 1100 ? 4096 : max_ctx - 1100;
        double t0 = pkv_time_now();
        for (int i = 0; i < n && !st; i++) st = pkv_kv_append(c, child, 1, NULL, NULL, rows);
        r->append_us = (pkv_time_now() - t0) / n * 1e6;
    }
    pkv_kv_cache_free(c);
    return st;
}

static pkv_status bench_swap_shift(pkv_device *dev, int ps, bench_kv *r) {
    pkv_kv_layer_desc L[BK_LAYERS];
    int n = BK_SWAP_TOKENS;
    int64_t pages = n / ps + 2;
    pkv_kv_cache *c = make_cache(dev, ps, 2 * pages + 2, pages, L);
    if (!c) return PKV_ERR_NOMEM;
    int32_t seq, *rows = pkv_malloc((size_t)n * sizeof *rows);
    pkv_status st = rows ? pkv_kv_seq_create(c, 0, &seq) : PKV_ERR_NOMEM;
    if (!st) st = pkv_kv_append(c, seq, n, NULL, NULL, rows);
    pkv_free(rows);
    /* Touch every page so the timings see resident memory. */
    for (int il = 0; il < BK_LAYERS && !st; il++) {
        pkv_kv_shard_info si;
        pkv_kv_shard(c, il, 0, &si);
        st = pkv_buffer_fill(si.k, si.k_off, (size_t)si.n_pages * si.k_page_bytes, (uint8_t)(il + 1));
        if (!st) st = pkv_buffer_fill(si.v, si.v_off, (size_t)si.n_pages * si.v_page_bytes, (uint8_t)(il + 2));
    }
    pkv_kv_layer_info li;
    pkv_kv_layout_layer(pkv_kv_cache_layout(c), 0, &li);
    r->swap_bytes = (uint64_t)(n / ps) * (li.k_page_bytes + li.v_page_bytes) * BK_LAYERS;
    /* Swap out, swap in and a plain host memcpy of the same total, interleaved in
     * the same loop so machine noise hits all three alike; best of the rounds. */
    uint8_t *x = pkv_malloc((size_t)r->swap_bytes), *y = pkv_malloc((size_t)r->swap_bytes);
    if (!st && (!x || !y)) st = PKV_ERR_NOMEM;
    if (!st) {
        memset(x, 1, (size_t)r->swap_bytes);
        memset(y, 2, (size_t)r->swap_bytes);
    }
    double best_out = 1e9, best_in = 1e9, best_mc = 1e9, best_chunk = 1e9;
    size_t chunk = (size_t)r->swap_bytes / (2 * BK_LAYERS); /* one K or V array's run */
    for (int rep = 0; rep < 9 && !st; rep++) {
        double t0 = pkv_time_now();
        st = pkv_kv_swap_out(c, seq);
        double t1 = pkv_time_now();
        if (!st) st = pkv_kv_swap_in(c, seq);
        double t2 = pkv_time_now();
        memcpy(rep & 1 ? x : y, rep & 1 ? y : x, (size_t)r->swap_bytes);
        double t3 = pkv_time_now();
        for (size_t o = 0; o + chunk <= (size_t)r->swap_bytes; o += chunk) memcpy(y + o, x + o, chunk);
        double t4 = pkv_time_now();
        if (rep > 0) { /* the first round faults the host pool in */
            best_chunk = PKV_MIN(best_chunk, t4 - t3);
            best_out = PKV_MIN(best_out, t1 - t0);
            best_in = PKV_MIN(best_in, t2 - t1);
            best_mc = PKV_MIN(best_mc, t3 - t2);
        }
    }
    pkv_free(x);
    pkv_free(y);
    r->swap_out_gbps = (double)r->swap_bytes / best_out / 1e9;
    r->swap_in_gbps = (double)r->swap_bytes / best_in / 1e9;
    r->memcpy_gbps = (double)r->swap_bytes / best_mc / 1e9;
    r->memcpy_chunk_gbps = (double)(chunk * 2 * BK_LAYERS) / best_chunk / 1e9;
    r->chunk_bytes = chunk;
    /* shift: drop 256 tokens and move the rest without re-rotation (pos_delta 0:
     * the page copies alone), then drop the next 256 and re-rotate the rest */
    if (!st) {
        int64_t len = pkv_kv_seq_len(c, seq);
        double t0 = pkv_time_now();
        st = pkv_kv_shift(c, seq, 0, 256, 0);
        if (!st) st = pkv_device_sync(dev);
        r->shift_move_us_per_token = (pkv_time_now() - t0) / (double)(len - 256) * 1e6;
    }
    if (!st) {
        int64_t len = pkv_kv_seq_len(c, seq);
        double t0 = pkv_time_now();
        st = pkv_kv_shift(c, seq, 0, 256, -256);
        if (!st) st = pkv_device_sync(dev);
        r->shift_tokens = len - 256;
        r->shift_us_per_token = (pkv_time_now() - t0) / (double)r->shift_tokens * 1e6;
    }
    pkv_kv_cache_free(c);
    return st;
}

static int usage(FILE *f, int rc) {
    fprintf(f, "usage: pagekv bench kv [--json] [--device NAME] [--page-size N] [--kv-type T]\n"
               "                     [--kv-type-k T] [--kv-type-v T] [--kv-memory MIB]\n"
               "Fork, copy-on-write, swap, shift and append on a 28-layer layout (Qwen3-0.6B's KV shape).\n"
               "  --json          one JSON object on stdout (else a table)\n"
               "  --device NAME   where the cache lives (default cpu)\n"
               "  --page-size N   tokens per page, 1..%d (default 16)\n"
               "  T: f16 (default), f32, q8_0, q4_0; --kv-memory: memory for max_context (default 8192)\n",
            PKV_KV_MAX_PAGE_SIZE);
    return rc;
}

int pkv_cli_bench_kv(int argc, char **argv) {
    bool json = false;
    const char *devname = "cpu";
    int ps = 16;
    double mem_mib = 8192;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help"))
            return usage(stdout, 0);
        if (strcmp(argv[i], "--json") == 0)
            json = true;
        else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc)
            devname = argv[++i];
        else if (strcmp(argv[i], "--page-size") == 0 && i + 1 < argc) {
            ps = atoi(argv[++i]);
            if (ps < 1 || ps > PKV_KV_MAX_PAGE_SIZE) {
                fprintf(stderr, "pagekv bench kv: page size %s is outside [1, %d]\n", argv[i], PKV_KV_MAX_PAGE_SIZE);
                return 2;
            }
        } else if ((!strcmp(argv[i], "--kv-type") || !strcmp(argv[i], "--kv-type-k") || !strcmp(argv[i], "--kv-type-v")) &&
                   i + 1 < argc) {
            int t;
            if (!pkv_cli_kv_type(argv[i], argv[i + 1], &t)) return 2;
            if (strcmp(argv[i], "--kv-type-v")) g_tk = (pkv_type)t;
            if (strcmp(argv[i], "--kv-type-k")) g_tv = (pkv_type)t;
            i++;
        } else if (strcmp(argv[i], "--kv-memory") == 0 && i + 1 < argc) {
            long long x;
            if (!pkv_cli_int(argv[i], argv[i + 1], 1, 1 << 30, &x)) return 2;
            mem_mib = (double)x;
            i++;
        } else if (strcmp(argv[i], "kv") == 0 && i == 0)
            continue; /* tolerate "bench kv ..." passed through whole */
        else {
            fprintf(stderr, "pagekv bench kv: unknown option '%s' (see 'pagekv bench kv --help')\n", argv[i]);
            return 2;
        }
    }
    pkv_device *dev = pkv_device_open(devname, pkv_device_default_params());
    if (!dev) {
        fprintf(stderr, "pagekv bench kv: %s\n", pkv_errmsg());
        return 1;
    }
    bench_kv r;
    memset(&r, 0, sizeof r);
    double per_token = 0;
    long long max_ctx = 0;
    {
        pkv_kv_layer_desc L[BK_LAYERS];
        pkv_kv_cache *c = make_cache(dev, ps, 1, 0, L);
        if (!c) {
            fprintf(stderr, "pagekv bench kv on %s: %s\n", devname, pkv_errmsg());
            pkv_device_close(dev);
            return 1;
        }
        per_token = pkv_cli_kv_bytes_per_token(c);
        max_ctx = pkv_cli_kv_max_tokens(c, mem_mib * 1048576.0);
        pkv_kv_cache_free(c);
    }
    pkv_status st = bench_fork(dev, ps, &r);
    if (!st) st = bench_swap_shift(dev, ps, &r);
    if (!st) st = bench_fork_hybrid(dev, ps, true, &r.hy_fork_us, &r.hy_state_bytes);
    size_t none = 0;
    if (!st) st = bench_fork_hybrid(dev, ps, false, &r.hy_fork_kv_only_us, &none);
    if (!st) st = bench_snapshot(dev, &r);
    if (st) {
        fprintf(stderr, "pagekv bench kv on %s: %s: %s\n", devname, pkv_status_str(st), pkv_errmsg());
        pkv_device_close(dev);
        return 1;
    }
    double ratio = r.n_ctx ? r.fork_us[r.n_ctx - 1] / r.fork_us[0] : 0;
    if (json) {
        printf("{\"device\": \"%s\", \"page_size\": %d, \"layout\": {\"layers\": %d, \"kv_heads\": %d, \"head_dim\": %d, "
               "\"dtype_k\": \"%s\", \"dtype_v\": \"%s\"}, \"kv_bytes_per_token\": %.0f, \"kv_memory_mib\": %.0f, "
               "\"max_context\": %lld, ",
               pkv_device_name(dev), ps, BK_LAYERS, BK_HEADS, BK_DIM, pkv_type_name(g_tk), pkv_type_name(g_tv), per_token,
               mem_mib, max_ctx);
        printf("\"fork_us\": [");
        for (int i = 0; i < r.n_ctx; i++) printf("%s{\"tokens\": %d, \"us\": %.3f}", i ? ", " : "", r.ctx[i], r.fork_us[i]);
        printf("], \"fork_ratio_max_vs_256\": %.3f, ", ratio);
        printf("\"cow_bytes\": %llu, \"swap_bytes\": %llu, \"swap_out_gbps\": %.3f, \"swap_in_gbps\": %.3f, "
               "\"memcpy_gbps\": %.3f, \"swap_out_vs_memcpy\": %.3f, \"swap_in_vs_memcpy\": %.3f, "
               "\"memcpy_chunk_bytes\": %zu, \"memcpy_chunk_gbps\": %.3f, ",
               (unsigned long long)r.cow_bytes, (unsigned long long)r.swap_bytes, r.swap_out_gbps, r.swap_in_gbps,
               r.memcpy_gbps, r.swap_out_gbps / r.memcpy_gbps, r.swap_in_gbps / r.memcpy_gbps, r.chunk_bytes,
               r.memcpy_chunk_gbps);
        printf("\"shift_tokens\": %lld, \"shift_us_per_token\": %.4f, \"shift_move_only_us_per_token\": %.4f, "
               "\"append_us\": %.4f, ",
               (long long)r.shift_tokens, r.shift_us_per_token, r.shift_move_us_per_token, r.append_us);
        printf("\"hybrid\": {\"shape\": \"qwen35-0.8b\", \"state_bytes_per_seq\": %zu, \"fork_4096_us\": %.3f, "
               "\"fork_4096_kv_only_us\": %.3f, \"fork_state_vs_kv\": %.2f}, ",
               r.hy_state_bytes, r.hy_fork_us, r.hy_fork_kv_only_us,
               r.hy_fork_kv_only_us > 0 ? r.hy_fork_us / r.hy_fork_kv_only_us : 0.0);
        printf("\"snapshot\": {\"pages\": %lld, \"block_table_entries\": %lld, \"us\": %.1f}}\n",
               (long long)r.snap_pages, (long long)r.snap_entries, r.snap_us);
    } else {
        printf("KV cache on %s: %d layers x %d KV heads x %d dims, K %s, V %s, pages of %d tokens\n",
               pkv_device_name(dev), BK_LAYERS, BK_HEADS, BK_DIM, pkv_type_name(g_tk), pkv_type_name(g_tv), ps);
        printf("  %.0f KV bytes per token; %lld tokens fit in %.0f MiB\n", per_token, max_ctx, mem_mib);
        for (int i = 0; i < r.n_ctx; i++) printf("  fork, %6d tokens   %10.3f us\n", r.ctx[i], r.fork_us[i]);
        printf("  fork %d / 256 tokens  %8.2fx (target <= 2)\n", r.n_ctx ? r.ctx[r.n_ctx - 1] : 0, ratio);
        printf("  cow bytes (first append after fork)  %llu\n", (unsigned long long)r.cow_bytes);
        printf("  swap out  %8.2f GB/s  (%.0f%% of memcpy)\n", r.swap_out_gbps, 100 * r.swap_out_gbps / r.memcpy_gbps);
        printf("  swap in   %8.2f GB/s  (%.0f%% of memcpy)\n", r.swap_in_gbps, 100 * r.swap_in_gbps / r.memcpy_gbps);
        printf("  memcpy    %8.2f GB/s  (%llu bytes in one call)\n", r.memcpy_gbps, (unsigned long long)r.swap_bytes);
        printf("  memcpy    %8.2f GB/s  (in %zu-byte pieces, as the swap moves them)\n", r.memcpy_chunk_gbps,
               r.chunk_bytes);
        printf("  shift     %8.4f us per moved token (%lld tokens)\n", r.shift_us_per_token, (long long)r.shift_tokens);
        printf("  shift     %8.4f us per moved token without re-rotation (page copies only)\n",
               r.shift_move_us_per_token);
        printf("  append    %8.4f us per 1-token append\n", r.append_us);
        printf("  hybrid (Qwen3.5-0.8B shape): recurrent state %.1f MiB per sequence; fork at 4096 tokens %.1f us, "
               "%.1f us for its attention layers alone (%.0fx)\n", (double)r.hy_state_bytes / 1048576.0, r.hy_fork_us,
               r.hy_fork_kv_only_us, r.hy_fork_kv_only_us > 0 ? r.hy_fork_us / r.hy_fork_kv_only_us : 0.0);
        printf("  snapshot (GET /v1/kv) of %lld pages, %lld block table entries  %.1f us\n", (long long)r.snap_pages,
               (long long)r.snap_entries, r.snap_us);
    }
    pkv_device_close(dev);
    return 0;
}
