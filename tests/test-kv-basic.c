// labels: kv
/* KV cache basics: layout validation messages, append rows and the CSR block
 * table, copy-on-write after fork (parent and child diverge; shared full pages
 * are never written), forks of forks freed in every order, truncate, attach
 * validation messages, prefix reuse (hits, verified collisions, LRU eviction),
 * and the read-only snapshot behind pagekv serve's GET /v1/kv. */
#include "kv-testlib.h"

static void fill_vals(float *v, int n, uint64_t seed) {
    for (int i = 0; i < n; i++) v[i] = kt_round(PKV_TYPE_F16, th_randf(&seed));
}

/* Write deterministic content for token rows: value depends on (tag, layer, kind). */
static void write_tokens(pkv_kv_cache *c, const int32_t *rows, int n, uint64_t tag) {
    for (int i = 0; i < n; i++)
        for (int il = 0; il < 2; il++)
            for (int v = 0; v < 2; v++) {
                float vals[64];
                fill_vals(vals, kt_dim(c, il, v), tag * 1000 + (uint64_t)i * 10 + (uint64_t)(il * 2 + v));
                kt_write_row(c, il, v, rows[i], vals);
            }
}

/* Expect tokens [from, from+n) of seq to hold write_tokens(tag) content at index i - from + off. */
static int check_tokens(pkv_kv_cache *c, int32_t seq, int from, int n, uint64_t tag, int off) {
    static float buf[4096];
    int bad = 0;
    for (int il = 0; il < 2; il++)
        for (int v = 0; v < 2; v++) {
            int d = kt_dim(c, il, v);
            if (kt_read_seq(c, seq, il, v, buf)) return 0;
            for (int t = from; t < from + n; t++) {
                float want[64];
                fill_vals(want, d, tag * 1000 + (uint64_t)(t - from + off) * 10 + (uint64_t)(il * 2 + v));
                if (memcmp(want, buf + (size_t)t * d, (size_t)d * 4)) bad++;
            }
        }
    return bad == 0;
}

static void test_layout_errors(kt_env *e) {
    pkv_kv_params p = kt_params(e, 4, 8, 0);
    e->shards[0][1].head_begin = 1; /* overlaps shard 0 */
    CHECK(pkv_kv_cache_create(p) == NULL);
    CHECK_MSG("layer 0: shards overlap");
    e->shards[0][1].head_begin = 2;
    e->shards[1][0].n_heads = 0;
    CHECK(pkv_kv_cache_create(p) == NULL);
    CHECK_MSG("layer 1 shard 0");
    e->shards[1][0].n_heads = 1;
    e->layers[1].n_shards = 1; /* head 1 uncovered */
    CHECK(pkv_kv_cache_create(p) == NULL);
    CHECK_MSG("layer 1: heads [1, 2) are in no shard");
    e->layers[1].n_shards = 2;
    e->shards[1][1].compute = e->cpu1; /* stored on cpu, computed on cpu:1 */
    CHECK(pkv_kv_cache_create(p) == NULL);
    CHECK_MSG("stored on cpu but computed on cpu:1");
    e->shards[1][1].compute = e->cpu;
    e->layers[1].dtype_v = PKV_TYPE_Q8_0; /* V head size 6: not whole blocks of 32 */
    CHECK(pkv_kv_cache_create(p) == NULL);
    CHECK_MSG("layer 1: V head size 6 is not a multiple of 32, the block of q8_0 pages");
    e->layers[1].dtype_v = PKV_TYPE_F16;
    e->layers[1].dtype_k = PKV_TYPE_BF16;
    CHECK(pkv_kv_cache_create(p) == NULL);
    CHECK_MSG("layer 1: K dtype bf16 (KV pages are f32, f16, q8_0 or q4_0)");
    e->layers[1].dtype_k = PKV_TYPE_F16;
    p.page_size = 257;
    CHECK(pkv_kv_cache_create(p) == NULL);
    CHECK_MSG("page size 257");
    p.page_size = 4;
    p.rope_n_rot = 6; /* > head_dim_k 4 of layer 1 */
    CHECK(pkv_kv_cache_create(p) == NULL);
    CHECK_MSG("layer 1: rope_n_rot 6");
    p.rope_n_rot = 4;
    p.n_pages = 0;
    p.budget_bytes = 10;
    CHECK(pkv_kv_cache_create(p) == NULL);
    CHECK_MSG("holds no page");
    /* budget: page bytes = 4 tokens * (3*(8+4)*4 + 2*(4+6)*2) = 4 * 184 = 736 */
    p.budget_bytes = 736 * 5 + 100;
    pkv_kv_cache *c = pkv_kv_cache_create(p);
    if (!c) {
        TH_FAIL("budget cache: %s", pkv_errmsg());
        return;
    }
    pkv_kv_stats st;
    pkv_kv_stats_get(c, &st);
    CHECK_INT(st.n_pages, 5);
    pkv_kv_layer_info li;
    CHECK_OK(pkv_kv_layout_layer(pkv_kv_cache_layout(c), 1, &li));
    CHECK_INT(li.k_page_bytes, 4 * 2 * 4 * 2);
    CHECK_INT(li.v_page_bytes, 4 * 2 * 6 * 2);
    CHECK_INT(li.n_shards, 2);
    pkv_kv_shard_info si;
    CHECK_OK(pkv_kv_shard(c, 0, 1, &si));
    CHECK(si.storage == e->cpu1 && si.head_begin == 2 && si.n_heads == 1 && si.k_row_bytes == 8 * 4);
    CHECK(pkv_buffer_device(si.k) == e->cpu1);
    CHECK_STATUS(pkv_kv_shard(c, 2, 0, &si), PKV_ERR_INVALID);
    CHECK_MSG("layer 2 does not exist");
    pkv_kv_cache_free(c);
}

static void test_append_table(kt_env *e) {
    pkv_kv_cache *c = pkv_kv_cache_create(kt_params(e, 4, 16, 0));
    if (!c) {
        TH_FAIL("%s", pkv_errmsg());
        return;
    }
    int32_t a, b, rows[16];
    CHECK_OK(pkv_kv_seq_create(c, 1, &a));
    CHECK_OK(pkv_kv_seq_create(c, 1, &b));
    int32_t tok[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    CHECK_OK(pkv_kv_append(c, a, 6, tok, NULL, rows));
    for (int i = 0; i < 6; i++) CHECK_INT(rows[i], (i / 4) * 4 + i % 4); /* pages 0, 1 */
    int32_t seqs[2] = {a, b}, nt[2] = {3, 2}, pos[5] = {10, 11, 12, 100, 101};
    CHECK_OK(pkv_kv_append_batch(c, 2, seqs, nt, tok, pos, rows));
    CHECK_INT(rows[0], 1 * 4 + 2);
    CHECK_INT(rows[2], 2 * 4 + 0);
    pkv_kv_block_table bt;
    CHECK_OK(pkv_kv_block_table_get(c, 2, seqs, true, &bt));
    CHECK_INT(bt.indptr[0], 0);
    CHECK_INT(bt.indptr[1], 3);
    CHECK_INT(bt.indptr[2], 4);
    CHECK_INT(bt.pages[0], 0);
    CHECK_INT(bt.pages[2], 2);
    CHECK_INT(bt.last_page_len[0], 1);
    CHECK_INT(bt.last_page_len[1], 2);
    CHECK_INT(bt.seq_len[0], 9);
    CHECK_INT(bt.tok_indptr[1], 9);
    CHECK_INT(bt.positions[5], 5);
    CHECK_INT(bt.positions[6], 10);
    CHECK_INT(bt.positions[9], 100);
    int32_t bad[2] = {a, a};
    CHECK_STATUS(pkv_kv_append_batch(c, 2, bad, nt, tok, NULL, rows), PKV_ERR_INVALID);
    CHECK_MSG("appears twice");
    CHECK_STATUS(pkv_kv_append(c, 99, 1, tok, NULL, rows), PKV_ERR_INVALID);
    CHECK_MSG("no sequence 99");
    /* truncate (rollback) and re-append reuse the same slots */
    CHECK_OK(pkv_kv_truncate(c, a, 5));
    CHECK_INT(pkv_kv_seq_len(c, a), 5);
    CHECK_STATUS(pkv_kv_truncate(c, a, 6), PKV_ERR_INVALID);
    CHECK_OK(pkv_kv_append(c, a, 1, tok, NULL, rows));
    CHECK_INT(rows[0], 1 * 4 + 1);
    int32_t p5;
    CHECK_OK(pkv_kv_seq_tokens(c, a, 5, 1, NULL, &p5));
    CHECK_INT(p5, 5);
    pkv_kv_stats st;
    pkv_kv_stats_get(c, &st);
    CHECK_INT(st.pages_used, 3); /* a: pages 0,1 ; b: page 3; page 2 freed by the truncate */
    pkv_kv_cache_free(c);
}

/* Fork, then both append: they diverge; full shared pages are never written. */
static void test_cow(kt_env *e) {
    pkv_kv_cache *c = pkv_kv_cache_create(kt_params(e, 4, 32, 0));
    if (!c) {
        TH_FAIL("%s", pkv_errmsg());
        return;
    }
    int32_t a, b, rows[16];
    CHECK_OK(pkv_kv_seq_create(c, 0, &a));
    CHECK_OK(pkv_kv_append(c, a, 10, NULL, NULL, rows));
    write_tokens(c, rows, 10, 1);
    CHECK_OK(pkv_kv_fork(c, a, &b));
    /* snapshot every arena: shared full pages 0, 1 must stay bit-identical */
    pkv_kv_block_table bt;
    CHECK_OK(pkv_kv_block_table_get(c, 1, &b, false, &bt));
    int32_t shared[3] = {bt.pages[0], bt.pages[1], bt.pages[2]};
    uint8_t before[2][2][2][512];
    for (int il = 0; il < 2; il++)
        for (int s = 0; s < 2; s++) {
            pkv_kv_shard_info si;
            pkv_kv_shard(c, il, s, &si);
            for (int p = 0; p < 2; p++)
                pkv_buffer_read(si.k, si.k_off + (size_t)shared[p] * si.k_page_bytes, before[il][s][p], si.k_page_bytes);
        }
    pkv_kv_stats st0, st1;
    pkv_kv_stats_get(c, &st0);
    CHECK_OK(pkv_kv_append(c, b, 3, NULL, NULL, rows)); /* into the shared partial page 2: COW */
    write_tokens(c, rows, 3, 2);
    pkv_kv_stats_get(c, &st1);
    CHECK_INT(st1.cow_pages - st0.cow_pages, 1);
    /* 2 valid tokens copied: per token 3*(8+4)*4 + 2*(4+6)*2 = 184 bytes */
    CHECK_INT(st1.cow_bytes - st0.cow_bytes, 2 * 184);
    CHECK(rows[0] / 4 != shared[2]);
    CHECK_OK(pkv_kv_append(c, a, 2, NULL, NULL, rows)); /* a now owns page 2 alone: no copy */
    write_tokens(c, rows, 2, 3);
    pkv_kv_stats_get(c, &st0);
    CHECK_INT(st0.cow_pages, st1.cow_pages);
    CHECK_INT(rows[0], shared[2] * 4 + 2);
    CHECK(check_tokens(c, a, 0, 10, 1, 0));
    CHECK(check_tokens(c, a, 10, 2, 3, 0));
    CHECK(check_tokens(c, b, 0, 10, 1, 0));
    CHECK(check_tokens(c, b, 10, 3, 2, 0));
    for (int il = 0; il < 2; il++)
        for (int s = 0; s < 2; s++) {
            pkv_kv_shard_info si;
            pkv_kv_shard(c, il, s, &si);
            for (int p = 0; p < 2; p++) {
                uint8_t now[512];
                pkv_buffer_read(si.k, si.k_off + (size_t)shared[p] * si.k_page_bytes, now, si.k_page_bytes);
                CHECK_MEM(now, before[il][s][p], si.k_page_bytes);
            }
        }
    /* forks of forks, freed in every order of three */
    int orders[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
    for (int o = 0; o < 6; o++) {
        int32_t ids[3];
        ids[0] = b;
        CHECK_OK(pkv_kv_fork(c, b, &ids[1]));
        CHECK_OK(pkv_kv_append(c, ids[1], 5, NULL, NULL, rows));
        write_tokens(c, rows, 5, 10 + (uint64_t)o);
        CHECK_OK(pkv_kv_fork(c, ids[1], &ids[2]));
        CHECK_OK(pkv_kv_append(c, ids[2], 1, NULL, NULL, rows));
        write_tokens(c, rows, 1, 20 + (uint64_t)o);
        int32_t keep = ids[orders[o][2]];
        for (int k = 0; k < 2; k++) {
            int32_t id = ids[orders[o][k]];
            if (id == b) { /* free the original b, keep its content under a new id */
                CHECK_OK(pkv_kv_fork(c, b, &b));
                if (b == id) TH_FAIL("fork returned the parent's id");
            }
            CHECK_OK(pkv_kv_seq_free(c, id));
        }
        /* survivors keep their content */
        CHECK(check_tokens(c, keep, 0, 10, 1, 0));
        if (keep != b) {
            CHECK(check_tokens(c, b, 0, 10, 1, 0));
            CHECK(check_tokens(c, b, 10, 3, 2, 0));
            CHECK_OK(pkv_kv_seq_free(c, keep));
        } else {
            CHECK(check_tokens(c, b, 10, 3, 2, 0));
        }
    }
    CHECK_OK(pkv_kv_seq_free(c, a));
    CHECK_OK(pkv_kv_seq_free(c, b));
    pkv_kv_stats_get(c, &st0);
    CHECK_INT(st0.n_seqs, 0);
    CHECK_INT(st0.pages_used, 0);
    CHECK_INT(st0.pages_free, 32);
    pkv_kv_cache_free(c);
}

static void test_attach(kt_env *e) {
    pkv_kv_layer_desc L[28];
    pkv_kv_shard_desc sh = {e->cpu1, e->cpu1, 0, 8};
    for (int i = 0; i < 28; i++) L[i] = (pkv_kv_layer_desc){8, 32, 32, PKV_TYPE_Q8_0, PKV_TYPE_F16, 1, &sh, 0, 0, 0, 0, 0, {0}, 0, 0, false, false, 0};
    pkv_kv_params p = pkv_kv_default_params();
    p.n_layers = 28;
    p.layers = L;
    p.page_size = 16;
    p.n_pages = 4;
    pkv_kv_cache *c = pkv_kv_cache_create(p);
    if (!c) {
        TH_FAIL("%s", pkv_errmsg());
        return;
    }
    pkv_kv_attach_layer d = {27, 8, 32, 32, PKV_TYPE_Q8_0, PKV_TYPE_F16, e->cpu};
    CHECK_STATUS(pkv_kv_attach(c, "draft", 16, &d, 1), PKV_ERR_MISMATCH);
    CHECK_MSG("draft layer 0 shares KV layer 27, stored on cpu:1, but computes on cpu: place the draft on cpu:1 or "
              "store the cache on cpu");
    d.compute = e->cpu1;
    CHECK_OK(pkv_kv_attach(c, "draft", 16, &d, 1));
    d.compute = NULL;
    CHECK_OK(pkv_kv_attach(c, "draft", 16, &d, 1));
    d.n_kv_heads = 4;
    CHECK_STATUS(pkv_kv_attach(c, "draft", 16, &d, 1), PKV_ERR_MISMATCH);
    CHECK_MSG("draft layer 0 shares KV layer 27: it has 4 KV heads, the cache layer 8");
    d.n_kv_heads = 8;
    d.dtype_v = PKV_TYPE_F32;
    CHECK_STATUS(pkv_kv_attach(c, "mtp", 16, &d, 1), PKV_ERR_MISMATCH);
    CHECK_MSG("mtp layer 0 shares KV layer 27: V dtype f32, the cache layer stores f16");
    d.dtype_v = PKV_TYPE_F16;
    d.dtype_k = PKV_TYPE_F16;
    CHECK_STATUS(pkv_kv_attach(c, "mtp", 16, &d, 1), PKV_ERR_MISMATCH);
    CHECK_MSG("mtp layer 0 shares KV layer 27: K dtype f16, the cache layer stores q8_0");
    d.dtype_k = PKV_TYPE_Q8_0;
    d.head_dim_v = 8;
    CHECK_STATUS(pkv_kv_attach(c, "draft", 16, &d, 1), PKV_ERR_MISMATCH);
    CHECK_MSG("head sizes K 32, V 8");
    d.head_dim_v = 32;
    CHECK_STATUS(pkv_kv_attach(c, "draft", 32, &d, 1), PKV_ERR_MISMATCH);
    CHECK_MSG("pages of 32 tokens, the cache 16");
    d.kv_layer = 28;
    CHECK_STATUS(pkv_kv_attach(c, "draft", 16, &d, 1), PKV_ERR_MISMATCH);
    CHECK_MSG("draft layer 0 shares KV layer 28, but the cache has 28 layers");
    pkv_kv_cache_free(c);
    /* sharded cache: a draft on one device cannot reach the other shard */
    c = pkv_kv_cache_create(kt_params(e, 4, 4, 0));
    if (!c) return;
    pkv_kv_attach_layer d2 = {0, 3, 8, 4, PKV_TYPE_F32, PKV_TYPE_F32, e->cpu};
    CHECK_STATUS(pkv_kv_attach(c, "draft", 4, &d2, 1), PKV_ERR_MISMATCH);
    CHECK_MSG("draft layer 0 shares KV layer 0 heads 2..2, stored on cpu:1, but computes on cpu");
    d2.compute = NULL; /* same split as the target */
    CHECK_OK(pkv_kv_attach(c, "draft", 4, &d2, 1));
    pkv_kv_cache_free(c);
}

static void test_prefix(kt_env *e, bool collide) {
    pkv_kv_test_hash_collide = collide;
    pkv_kv_cache *c = pkv_kv_cache_create(kt_params(e, 4, 12, 0));
    if (!c) {
        TH_FAIL("%s", pkv_errmsg());
        return;
    }
    int32_t tokA[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    int32_t tokB[12] = {9, 9, 9, 9, 5, 6, 7, 8, 9, 10, 11, 12}; /* same page 1 tokens, other prefix */
    int32_t a, b, x, rows[12];
    CHECK_OK(pkv_kv_seq_create(c, 5, &a));
    CHECK_OK(pkv_kv_append(c, a, 10, tokA, NULL, rows));
    write_tokens(c, rows, 10, 100);
    CHECK_OK(pkv_kv_seq_create(c, 5, &b));
    CHECK_OK(pkv_kv_append(c, b, 10, tokB, NULL, rows));
    write_tokens(c, rows, 10, 200);
    CHECK_OK(pkv_kv_seq_free(c, a)); /* publishes a's 2 full pages */
    CHECK_OK(pkv_kv_seq_free(c, b));
    pkv_kv_stats st;
    pkv_kv_stats_get(c, &st);
    CHECK_INT(st.pages_cached, 4);
    int64_t m = -1;
    /* B's prefix: must get B's pages, never A's page 1 (same tokens, other prefix) */
    CHECK_OK(pkv_kv_seq_create(c, 5, &x));
    CHECK_OK(pkv_kv_prefix_match(c, x, tokB, NULL, 11, &m));
    CHECK_INT(m, 8);
    CHECK(check_tokens(c, x, 0, 8, 200, 0));
    CHECK_OK(pkv_kv_seq_free(c, x));
    /* A's first page then a different second page */
    int32_t tokC[12] = {1, 2, 3, 4, 5, 6, 7, 0};
    CHECK_OK(pkv_kv_seq_create(c, 5, &x));
    CHECK_OK(pkv_kv_prefix_match(c, x, tokC, NULL, 8, &m));
    CHECK_INT(m, 4);
    CHECK(check_tokens(c, x, 0, 4, 100, 0));
    CHECK_OK(pkv_kv_seq_free(c, x));
    /* other fingerprint (model/adapter): no match; other positions: no match */
    CHECK_OK(pkv_kv_seq_create(c, 6, &x));
    CHECK_OK(pkv_kv_prefix_match(c, x, tokA, NULL, 8, &m));
    CHECK_INT(m, 0);
    CHECK_OK(pkv_kv_seq_free(c, x));
    int32_t pos[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    CHECK_OK(pkv_kv_seq_create(c, 5, &x));
    CHECK_OK(pkv_kv_prefix_match(c, x, tokA, pos, 8, &m));
    CHECK_INT(m, 0);
    /* matched sequence continues: appends into a fresh page, cached pages untouched */
    CHECK_OK(pkv_kv_seq_free(c, x));
    CHECK_OK(pkv_kv_seq_create(c, 5, &x));
    CHECK_OK(pkv_kv_prefix_match(c, x, tokA, NULL, 12, &m));
    CHECK_INT(m, 8);
    CHECK_OK(pkv_kv_truncate(c, x, 6)); /* into a published page: the next append copies it */
    pkv_kv_stats st0;
    pkv_kv_stats_get(c, &st0);
    CHECK_OK(pkv_kv_append(c, x, 1, tokA, NULL, rows));
    write_tokens(c, rows, 1, 300);
    pkv_kv_stats_get(c, &st);
    CHECK_INT(st.cow_pages - st0.cow_pages, 1);
    CHECK(check_tokens(c, x, 0, 6, 100, 0));
    CHECK(check_tokens(c, x, 6, 1, 300, 0));
    CHECK_OK(pkv_kv_seq_free(c, x));
    /* eviction: LRU-first when the pool runs dry; an evicted page never matches */
    CHECK_OK(pkv_kv_seq_create(c, 5, &x));
    int32_t big[64] = {0}, brows[64];
    pkv_kv_stats_get(c, &st0);
    CHECK(st0.pages_free <= 16);
    CHECK_OK(pkv_kv_append(c, x, (int32_t)(4 * st0.pages_free), big, NULL, brows)); /* uses free pages only */
    pkv_kv_stats_get(c, &st);
    CHECK_INT(st.evicted_pages, st0.evicted_pages);
    int32_t y;
    CHECK_OK(pkv_kv_seq_create(c, 5, &y));
    CHECK_OK(pkv_kv_append(c, y, 4, big, NULL, rows)); /* evicts the oldest cached page */
    pkv_kv_stats_get(c, &st);
    CHECK_INT(st.evicted_pages, st0.evicted_pages + 1);
    CHECK_OK(pkv_kv_seq_free(c, y));
    CHECK_OK(pkv_kv_seq_free(c, x));
    CHECK_OK(pkv_kv_seq_create(c, 5, &x));
    CHECK_OK(pkv_kv_prefix_match(c, x, tokA, NULL, 12, &m));
    CHECK(m == 0 || check_tokens(c, x, 0, (int)m, 100, 0));
    CHECK_OK(pkv_kv_seq_free(c, x));
    pkv_kv_cache_free(c);
    pkv_kv_test_hash_collide = false;
}

/* Eviction order: the least recently released cached page goes first. */
static void test_lru(kt_env *e) {
    pkv_kv_cache *c = pkv_kv_cache_create(kt_params(e, 2, 6, 0));
    if (!c) {
        TH_FAIL("%s", pkv_errmsg());
        return;
    }
    int32_t tx[4] = {1, 2, 3, 4}, ty[4] = {5, 6, 7, 8}, x, y, z, rows[8];
    int64_t m;
    CHECK_OK(pkv_kv_seq_create(c, 1, &x));
    CHECK_OK(pkv_kv_append(c, x, 4, tx, NULL, rows));
    write_tokens(c, rows, 4, 1);
    CHECK_OK(pkv_kv_seq_create(c, 1, &y));
    CHECK_OK(pkv_kv_append(c, y, 4, ty, NULL, rows));
    write_tokens(c, rows, 4, 2);
    CHECK_OK(pkv_kv_seq_free(c, x)); /* x's pages are the oldest cached */
    CHECK_OK(pkv_kv_seq_free(c, y));
    CHECK_OK(pkv_kv_seq_create(c, 1, &z));
    CHECK_OK(pkv_kv_append(c, z, 6, NULL, NULL, rows)); /* 2 free pages + 1 eviction */
    pkv_kv_stats st;
    pkv_kv_stats_get(c, &st);
    CHECK_INT(st.evicted_pages, 1);
    CHECK_INT(st.pages_cached, 3);
    CHECK_OK(pkv_kv_seq_free(c, z));
    CHECK_OK(pkv_kv_seq_create(c, 1, &z));
    CHECK_OK(pkv_kv_prefix_match(c, z, ty, NULL, 4, &m));
    CHECK_INT(m, 4); /* the newer chain is intact */
    CHECK(check_tokens(c, z, 0, 4, 2, 0));
    CHECK_OK(pkv_kv_seq_free(c, z));
    CHECK_OK(pkv_kv_seq_create(c, 1, &z));
    CHECK_OK(pkv_kv_prefix_match(c, z, tx, NULL, 4, &m));
    CHECK_INT(m, 0); /* x's first page was evicted, and with it the chain */
    pkv_kv_cache_free(c);
}

/* pkv_kv_snapshot_take: refcounts in block tables (a fork's shared pages 2, a
 * copied partial page 1 each), flags (free, indexed, cached), the block tables
 * themselves, and a swapped sequence's host pages; pool 1 refused without a
 * window pool; an allocation failure is NULL with nothing leaked. */
static void test_snapshot(kt_env *e) {
    pkv_kv_cache *c = pkv_kv_cache_create(kt_params(e, 4, 16, 8));
    if (!c) {
        TH_FAIL("%s", pkv_errmsg());
        return;
    }
    int32_t toks[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, a, b, rows[16];
    CHECK_OK(pkv_kv_seq_create(c, 1, &a));
    CHECK_OK(pkv_kv_append(c, a, 10, toks, NULL, rows)); /* 3 pages: 2 full + a partial */
    CHECK_OK(pkv_kv_fork(c, a, &b));
    pkv_kv_snapshot *s = pkv_kv_snapshot_take(c, 0);
    CHECK(s != NULL);
    if (s) {
        CHECK_INT(s->page_size, 4);
        CHECK_INT(s->n_pages, 16);
        CHECK_INT(s->host_pages, 8);
        CHECK_INT(s->n_seqs, 2);
        CHECK_INT(s->n_listed, 6);
        CHECK_INT(s->seqs[0].id, a);
        CHECK_INT(s->seqs[1].id, b);
        CHECK_INT(s->seqs[1].n_tokens, 10);
        int held = 0;
        for (int i = 0; i < 3; i++) {
            int32_t p = s->pages[s->seqs[0].first + i];
            CHECK_INT(s->pages[s->seqs[1].first + i], p); /* the same block table */
            CHECK_INT(s->page_refs[p], 2);
            CHECK(!(s->page_flags[p] & PKV_KV_PAGE_FREE));
        }
        /* fork published the parent's full pages */
        CHECK(s->page_flags[s->pages[0]] & PKV_KV_PAGE_INDEX);
        CHECK(!(s->page_flags[s->pages[2]] & PKV_KV_PAGE_INDEX));
        for (int p = 0; p < 16; p++) held += !(s->page_flags[p] & PKV_KV_PAGE_FREE);
        CHECK_INT(held, 3);
        CHECK_INT(s->stats.pages_used, 3);
        pkv_kv_snapshot_free(s);
    }
    /* the child appends: its partial page is copied; then the parent is swapped out */
    CHECK_OK(pkv_kv_append(c, b, 1, toks, NULL, rows));
    CHECK_OK(pkv_kv_swap_out(c, a));
    s = pkv_kv_snapshot_take(c, 0);
    CHECK(s != NULL);
    if (s) {
        const pkv_kv_snapshot_seq *sa = &s->seqs[0], *sb = &s->seqs[1];
        CHECK(sa->swapped && !sb->swapped);
        CHECK_INT(sa->n, 3);
        CHECK_INT(sb->n, 3);
        int used = 0;
        for (int h = 0; h < 8; h++) used += s->host_used[h];
        CHECK_INT(used, 3);
        for (int i = 0; i < 3; i++) CHECK_INT(s->host_used[s->pages[sa->first + i]], 1);
        for (int i = 0; i < 3; i++) CHECK_INT(s->page_refs[s->pages[sb->first + i]], 1); /* the child alone */
        CHECK_INT(s->stats.host_free, 5);
        pkv_kv_snapshot_free(s);
    }
    /* freed: the full pages stay cached (indexed, held by nobody) */
    CHECK_OK(pkv_kv_seq_free(c, a));
    CHECK_OK(pkv_kv_seq_free(c, b));
    s = pkv_kv_snapshot_take(c, 0);
    CHECK(s != NULL);
    if (s) {
        int cached = 0;
        for (int p = 0; p < 16; p++) {
            CHECK_INT(s->page_refs[p], 0);
            if (s->page_flags[p] & PKV_KV_PAGE_CACHED) {
                cached++;
                CHECK(s->page_flags[p] & PKV_KV_PAGE_INDEX);
            }
        }
        CHECK_INT(cached, (int)s->stats.pages_cached);
        CHECK(cached >= 2);
        CHECK_INT(s->n_seqs, 0);
        pkv_kv_snapshot_free(s);
    }
    CHECK(pkv_kv_snapshot_take(c, 1) == NULL);
    CHECK_MSG("no pool 1");
    CHECK(pkv_kv_snapshot_take(NULL, 0) == NULL);
    pkv_alloc_fail_at(1);
    CHECK(pkv_kv_snapshot_take(c, 0) == NULL);
    CHECK_MSG("kv snapshot: out of memory");
    pkv_alloc_fail_at(0);
    pkv_kv_snapshot_free(NULL);
    pkv_kv_cache_free(c);
}

int main(void) {
    kt_env e;
    if (!kt_open(&e)) return th_skip("cannot open cpu and cpu:1");
    int64_t live0 = pkv_alloc_live();
    kt_layout_sharded(&e);
    test_layout_errors(&e);
    kt_layout_sharded(&e);
    test_append_table(&e);
    test_cow(&e);
    test_attach(&e);
    test_prefix(&e, false);
    test_prefix(&e, true);
    test_lru(&e);
    test_snapshot(&e);
    CHECK_INT(pkv_alloc_live(), live0);
    kt_close(&e);
    return th_done();
}
