// labels: kv
/* Failure paths: every KV operation is run with the 1st, 2nd, ... allocation
 * failing until it succeeds; each failure must return an error and leave every
 * sequence (lengths, tokens, positions, K/V content read from the devices) and
 * the page accounting exactly as before. Out-of-pages is checked the same way.
 * A failed forward step's rollback (and a failed window replay's reset) on a
 * cache with a window pool leaves both pools as before and offers none of the
 * step's unwritten pages to a prefix match. At the end nothing has leaked. */
#include "kv-testlib.h"

static pkv_kv_cache *g_c;
static int32_t A, B, C, D, E, F = -1, L = -1;

static uint64_t mixin(uint64_t h, const void *p, size_t n) { return pkv_hash64(p, n, h); }

/* Everything observable about the cache, hashed. */
static uint64_t state(void) {
    uint64_t h = 1;
    pkv_kv_stats st;
    pkv_kv_stats_get(g_c, &st);
    st.cow_pages = st.cow_bytes = st.prefix_hit_pages = st.evicted_pages = 0;
    st.pages_free += st.pages_cached; /* a failed call may not change these either, but */
    st.pages_cached = 0;              /* eviction counts only on success: keep it simple */
    h = mixin(h, &st, sizeof st);
    for (int32_t id = 0; id < 16; id++) {
        int64_t n = pkv_kv_seq_len(g_c, id);
        h = mixin(h, &n, sizeof n);
        if (n <= 0) continue;
        bool sw = pkv_kv_seq_swapped(g_c, id);
        h = mixin(h, &sw, sizeof sw);
        int32_t tok[128], pos[128];
        pkv_kv_seq_tokens(g_c, id, 0, n, tok, pos);
        h = mixin(h, tok, (size_t)n * 4);
        h = mixin(h, pos, (size_t)n * 4);
        if (sw) continue;
        static float buf[128 * 32];
        for (int il = 0; il < 2; il++)
            for (int v = 0; v < 2; v++) {
                pkv_alloc_fail_at(0);
                kt_read_seq(g_c, id, il, v, buf);
                h = mixin(h, buf, (size_t)n * (size_t)kt_dim(g_c, il, v) * 4);
            }
    }
    return h;
}

static void fill(int32_t seq, int n, uint64_t seed) {
    int32_t rows[64], tok[64];
    for (int i = 0; i < n; i++) tok[i] = (int32_t)(i % 5);
    pkv_status st = pkv_kv_append(g_c, seq, n, tok, NULL, rows);
    CHECK_OK(st);
    if (st) return;
    for (int i = 0; i < n; i++)
        for (int il = 0; il < 2; il++)
            for (int v = 0; v < 2; v++) {
                float vals[64];
                for (int k = 0; k < kt_dim(g_c, il, v); k++) vals[k] = th_randf(&seed);
                kt_write_row(g_c, il, v, rows[i], vals);
            }
}

typedef pkv_status (*op_fn)(void);

static int32_t g_rows[64];
static pkv_status op_append(void) {
    int32_t seqs[2] = {A, C}, nt[2] = {3, 2}, tok[5] = {1, 2, 3, 4, 0};
    return pkv_kv_append_batch(g_c, 2, seqs, nt, tok, NULL, g_rows);
}
static int32_t g_child;
static pkv_status op_fork(void) { return pkv_kv_fork(g_c, C, &g_child); }
static pkv_status op_truncate(void) { return pkv_kv_truncate(g_c, B, 3); }
static pkv_status op_shift(void) { return pkv_kv_shift(g_c, A, 2, 3, -3); }
static pkv_status op_swap_out(void) { return pkv_kv_swap_out(g_c, C); }
static pkv_status op_swap_in(void) { return pkv_kv_swap_in(g_c, D); }
static pkv_status op_prefix(void) {
    int32_t tok[12] = {0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1};
    int64_t m;
    pkv_status st = pkv_kv_prefix_match(g_c, F, tok, NULL, 12, &m);
    if (!st && m != 8) TH_FAIL("prefix match found %lld tokens, want 8", (long long)m);
    return st;
}
static pkv_status op_save(void) { return pkv_kv_seq_save(g_c, A, th_tmp("kv-faults.pkv")); }
static pkv_status op_load(void) { return pkv_kv_seq_load(g_c, th_tmp("kv-faults.pkv"), 0, &L); }
static pkv_status op_table(void) {
    int32_t seqs[4] = {A, B, E, L};
    pkv_kv_block_table bt;
    return pkv_kv_block_table_get(g_c, 4, seqs, true, &bt);
}
static pkv_status op_clear_seq(void) { return pkv_kv_seq_clear(g_c, B); }
static pkv_status op_free(void) { return pkv_kv_seq_free(g_c, A); }
static pkv_status op_create(void) {
    int32_t id;
    return pkv_kv_seq_create(g_c, 1, &id);
}
static pkv_status op_clear(void) { return pkv_kv_clear(g_c); }

static void run_op(const char *name, op_fn fn) {
    const char *only = getenv("KV_FAULTS_ONLY");
    if (only && !strstr(only, name)) return;
    uint64_t before = state();
    int failures = 0;
    for (uint64_t k = 1; k < 1000; k++) {
        pkv_alloc_fail_at(k);
        pkv_status st = fn();
        pkv_alloc_fail_at(0);
        if (st == PKV_OK) break;
        failures++;
        if (st != PKV_ERR_NOMEM) TH_FAIL("%s with allocation %llu failing: %s (%s)", name, (unsigned long long)k,
                                         pkv_status_str(st), pkv_errmsg());
        if (state() != before) {
            TH_FAIL("%s with allocation %llu failing changed the cache", name, (unsigned long long)k);
            break;
        }
    }
    fprintf(stderr, "%-12s ok after %d injected allocation failures\n", name, failures);
}

static void test_create_failures(kt_env *e) {
    int64_t live = pkv_alloc_live();
    int fails = 0;
    for (uint64_t k = 1; k < 1000; k++) {
        pkv_alloc_fail_at(k);
        pkv_kv_cache *c = pkv_kv_cache_create(kt_params(e, 4, 8, 4));
        pkv_alloc_fail_at(0);
        if (c) {
            pkv_kv_cache_free(c);
            break;
        }
        fails++;
        CHECK_INT(pkv_alloc_live(), live);
        CHECK(strstr(pkv_errmsg(), "memory") || strstr(pkv_errmsg(), "cannot allocate"));
    }
    fprintf(stderr, "create       ok after %d injected allocation failures\n", fails);
    CHECK(fails > 5);
    CHECK_INT(pkv_alloc_live(), live);
}

/* A failed forward step on a cache with a window pool: the forward pass appends
 * the step's tokens to both pools, fails before writing their K/V, and rolls back
 * with pkv_kv_truncate. The rollback must leave both pools as before: no page of
 * the step may reach the prefix index (its K/V was never computed), so a new
 * sequence with the same tokens matches nothing. The same for a failed replay of
 * the window layers, undone by pkv_kv_window_reset. */
static void test_failed_step_window(kt_env *e) {
    e->layers[1].window = 4; /* layer 1 moves to a window pool */
    pkv_kv_cache *c = pkv_kv_cache_create(kt_params(e, 4, 32, 8));
    e->layers[1].window = 0;
    REQUIRE_VOID(c);
    int32_t tok[24], rows[24], rows_w[24], s, t;
    for (int i = 0; i < 24; i++) tok[i] = 7 * i + 1;
    pkv_kv_stats st0, st1;
    int64_t m = -1;
    CHECK_OK(pkv_kv_seq_create(c, 5, &s));
    pkv_kv_stats_get(c, &st0);
    /* the step: 10 tokens appended to both pools, then rolled back unwritten */
    int32_t n = 10;
    CHECK_OK(pkv_kv_append_batch_w(c, 1, &s, &n, tok, NULL, rows, rows_w));
    CHECK_OK(pkv_kv_truncate(c, s, 0));
    pkv_kv_stats_get(c, &st1);
    CHECK_INT(st1.pages_cached, st0.pages_cached);
    CHECK_INT(st1.pages_free, st0.pages_free);
    CHECK_INT(st1.window_cached, st0.window_cached);
    CHECK_INT(st1.window_free, st0.window_free);
    CHECK_OK(pkv_kv_seq_create(c, 5, &t));
    CHECK_OK(pkv_kv_prefix_match(c, t, tok, NULL, 10, &m));
    CHECK_INT(m, 0); /* nothing of the failed step is offered */
    CHECK_OK(pkv_kv_seq_free(c, t));
    /* the same rollback done as a shift that removes the tail */
    CHECK_OK(pkv_kv_append_batch_w(c, 1, &s, &n, tok, NULL, rows, rows_w));
    CHECK_OK(pkv_kv_shift(c, s, 0, 10, 0));
    pkv_kv_stats_get(c, &st1);
    CHECK_INT(st1.pages_cached, st0.pages_cached);
    CHECK_INT(st1.window_cached, st0.window_cached);
    /* A step that fails after earlier ones succeeded: only the pages that were
     * full before it may be published (here: 1 of 3). */
    n = 6;
    CHECK_OK(pkv_kv_append_batch_w(c, 1, &s, &n, tok, NULL, rows, rows_w)); /* written (by contract) */
    n = 6;
    CHECK_OK(pkv_kv_append_batch_w(c, 1, &s, &n, tok + 6, NULL, rows, rows_w));
    CHECK_OK(pkv_kv_truncate(c, s, 6)); /* the second step failed */
    CHECK_OK(pkv_kv_seq_create(c, 5, &t));
    CHECK_OK(pkv_kv_prefix_match(c, t, tok, NULL, 12, &m));
    CHECK_INT(m, 4);
    CHECK_OK(pkv_kv_seq_free(c, t));
    /* A failed replay of the window layers: steps of 4 tokens release the window
     * pool's early pages; a truncate back into them empties the window sequence;
     * the replay of 8 tokens fails unwritten and pkv_kv_window_reset undoes it. */
    CHECK_OK(pkv_kv_truncate(c, s, 0));
    for (int i = 0; i < 24; i += 4) {
        n = 4;
        CHECK_OK(pkv_kv_append_batch_w(c, 1, &s, &n, tok + i, NULL, rows, rows_w));
    }
    CHECK_OK(pkv_kv_truncate(c, s, 12));
    CHECK_INT(pkv_kv_seq_window_len(c, s), 0);
    pkv_kv_stats_get(c, &st0);
    CHECK_OK(pkv_kv_window_replay(c, s, 8, rows_w));
    CHECK_OK(pkv_kv_window_reset(c, s));
    pkv_kv_stats_get(c, &st1);
    CHECK_INT(st1.window_cached, st0.window_cached);
    CHECK_INT(st1.window_free, st0.window_free);
    CHECK_INT(pkv_kv_seq_window_len(c, s), 0);
    CHECK_OK(pkv_kv_seq_free(c, s));
    pkv_kv_cache_free(c);
}

int main(void) {
    kt_env e;
    if (!kt_open(&e)) return th_skip("cannot open cpu and cpu:1");
    kt_layout_sharded(&e);
    int64_t live0 = pkv_alloc_live();
    test_create_failures(&e);
    test_failed_step_window(&e);
    g_c = pkv_kv_cache_create(kt_params(&e, 4, 24, 8));
    if (!g_c) return th_done();
    CHECK_OK(pkv_kv_seq_create(g_c, 3, &E));
    fill(E, 10, 1);
    CHECK_OK(pkv_kv_seq_create(g_c, 3, &A));
    fill(A, 10, 2);
    CHECK_OK(pkv_kv_fork(g_c, A, &B));
    CHECK_OK(pkv_kv_seq_create(g_c, 3, &C));
    fill(C, 6, 3);
    CHECK_OK(pkv_kv_seq_create(g_c, 3, &D));
    fill(D, 5, 4);
    CHECK_OK(pkv_kv_swap_out(g_c, D));
    CHECK_OK(pkv_kv_seq_free(g_c, E)); /* its 2 full pages become cached */
    CHECK_OK(pkv_kv_seq_create(g_c, 3, &F));
    run_op("create", op_create);
    run_op("append", op_append);
    run_op("fork", op_fork);
    run_op("truncate", op_truncate);
    run_op("shift", op_shift);
    run_op("swap out", op_swap_out);
    run_op("swap in", op_swap_in);
    run_op("prefix", op_prefix);
    run_op("save", op_save);
    run_op("load", op_load);
    run_op("block table", op_table);
    /* out of pages: nothing changes */
    {
        pkv_kv_stats st;
        pkv_kv_stats_get(g_c, &st);
        uint64_t before = state();
        int32_t nt = (int32_t)(4 * (st.pages_free + st.pages_cached) + 1);
        int32_t rows[128];
        CHECK_STATUS(pkv_kv_append(g_c, B, nt, NULL, NULL, rows), PKV_ERR_OUT_OF_PAGES);
        CHECK_MSG("are free or evictable");
        CHECK(state() == before);
    }
    run_op("clear seq", op_clear_seq);
    run_op("free", op_free);
    run_op("clear all", op_clear);
    pkv_kv_cache_free(g_c);
    CHECK_INT(pkv_alloc_live(), live0);
    kt_close(&e);
    return th_done();
}
