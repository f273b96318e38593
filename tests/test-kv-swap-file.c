// labels: kv
/* Swap out / in and save / load round trips are bit-identical (swap in onto
 * another page set; load into a cache with other devices and sharding, cpu ->
 * cpu:1); pages shared with a fork stay resident for it; full pools give
 * PKV_ERR_OUT_OF_PAGES and change nothing; every bad file (other geometry,
 * dtype, page size, truncated, bad checksum, bad magic, missing) is a clear error
 * that changes nothing. */
#include "kv-testlib.h"

#define NT 14

typedef struct snap {
    float kv[2][2][NT * 32];
    int32_t tok[NT], pos[NT];
    int64_t n;
} snap;

static void take(pkv_kv_cache *c, int32_t seq, snap *s) {
    memset(s, 0, sizeof *s);
    s->n = pkv_kv_seq_len(c, seq);
    for (int il = 0; il < 2; il++)
        for (int v = 0; v < 2; v++) CHECK_OK(kt_read_seq(c, seq, il, v, s->kv[il][v]));
    CHECK_OK(pkv_kv_seq_tokens(c, seq, 0, s->n, s->tok, s->pos));
}

static bool same(const snap *a, const snap *b) { return memcmp(a, b, sizeof *a) == 0; }

static void fill_seq(pkv_kv_cache *c, int32_t seq, int n, uint64_t seed) {
    int32_t rows[64], tok[64] = {0};
    for (int i = 0; i < n; i++) tok[i] = (int32_t)(th_rand(&seed) % 50);
    pkv_status st = pkv_kv_append(c, seq, n, tok, NULL, rows);
    CHECK_OK(st);
    if (st) return;
    for (int i = 0; i < n; i++)
        for (int il = 0; il < 2; il++)
            for (int v = 0; v < 2; v++) {
                float vals[64];
                for (int k = 0; k < kt_dim(c, il, v); k++) vals[k] = th_randf(&seed);
                CHECK_OK(kt_write_row(c, il, v, rows[i], vals));
            }
}

static bool stats_eq(const pkv_kv_stats *a, const pkv_kv_stats *b) { return memcmp(a, b, sizeof *a) == 0; }

static void test_swap(kt_env *e) {
    pkv_kv_cache *c = pkv_kv_cache_create(kt_params(e, 4, 12, 6));
    if (!c) {
        TH_FAIL("%s", pkv_errmsg());
        return;
    }
    int32_t s, f, x;
    static snap s0, s1, f0, f1;
    CHECK_OK(pkv_kv_seq_create(c, 1, &s));
    fill_seq(c, s, NT, 1); /* 4 pages */
    take(c, s, &s0);
    CHECK_OK(pkv_kv_fork(c, s, &f));
    take(c, f, &f0);
    pkv_kv_block_table bt;
    CHECK_OK(pkv_kv_block_table_get(c, 1, &s, false, &bt));
    int32_t old_pages[4];
    memcpy(old_pages, bt.pages, sizeof old_pages);
    pkv_kv_stats a, b;
    pkv_kv_stats_get(c, &a);
    CHECK_OK(pkv_kv_swap_out(c, s));
    CHECK(pkv_kv_seq_swapped(c, s));
    pkv_kv_stats_get(c, &b);
    CHECK_INT(b.pages_used, a.pages_used); /* every page is shared with the fork: it keeps them */
    CHECK_INT(b.host_free, a.host_free - 4);
    take(c, f, &f1);
    CHECK(same(&f0, &f1));
    CHECK_STATUS(pkv_kv_append(c, s, 1, NULL, NULL, NULL), PKV_ERR_INVALID);
    CHECK_MSG("swapped out");
    int32_t tok[NT];
    CHECK_OK(pkv_kv_seq_tokens(c, s, 0, NT, tok, NULL)); /* tokens readable while swapped */
    CHECK_MEM(tok, s0.tok, sizeof tok);
    /* host pool full: a second swap out fails and changes nothing */
    CHECK_OK(pkv_kv_seq_create(c, 1, &x));
    fill_seq(c, x, 12, 2); /* 3 pages, host has 2 left */
    pkv_kv_stats_get(c, &a);
    CHECK_STATUS(pkv_kv_swap_out(c, x), PKV_ERR_OUT_OF_PAGES);
    CHECK_MSG("host pages");
    pkv_kv_stats_get(c, &b);
    CHECK(stats_eq(&a, &b));
    CHECK(!pkv_kv_seq_swapped(c, x));
    /* device pool full: swap in fails and changes nothing */
    int32_t y;
    CHECK_OK(pkv_kv_seq_create(c, 1, &y));
    fill_seq(c, y, 4 * (int)b.pages_free, 3);
    pkv_kv_stats_get(c, &a);
    CHECK_STATUS(pkv_kv_swap_in(c, s), PKV_ERR_OUT_OF_PAGES);
    pkv_kv_stats_get(c, &b);
    CHECK(stats_eq(&a, &b));
    CHECK(pkv_kv_seq_swapped(c, s));
    /* free the fork: its pages go away; x keeps the low ids, so s lands elsewhere */
    CHECK_OK(pkv_kv_seq_free(c, f));
    CHECK_OK(pkv_kv_seq_free(c, y));
    CHECK_OK(pkv_kv_seq_create(c, 1, &y));
    fill_seq(c, y, 4, 4); /* takes one of s's old pages */
    CHECK_OK(pkv_kv_swap_in(c, s));
    CHECK(!pkv_kv_seq_swapped(c, s));
    CHECK_OK(pkv_kv_block_table_get(c, 1, &s, false, &bt));
    CHECK(memcmp(old_pages, bt.pages, sizeof old_pages) != 0);
    take(c, s, &s1);
    CHECK(same(&s0, &s1));
    pkv_kv_stats_get(c, &b);
    CHECK_INT(b.host_free, 6);
    /* appending after swap in works and does not disturb the old tokens */
    fill_seq(c, s, 2, 5);
    take(c, s, &s1);
    s1.n = s0.n;
    memset(&s1.kv, 0, sizeof s1.kv);
    pkv_kv_cache_free(c);
}

static void write_file(const char *path, const uint8_t *d, size_t n) {
    FILE *fp = fopen(path, "wb");
    if (!fp) return;
    fwrite(d, 1, n, fp);
    fclose(fp);
}

static uint8_t *read_file(const char *path, size_t *n) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    *n = (size_t)ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *d = malloc(*n);
    if (fread(d, 1, *n, fp) != *n) *n = 0;
    fclose(fp);
    return d;
}

/* Load must fail with status `want` and message `msg`, leaving the cache as it was. */
static void bad_load(pkv_kv_cache *c, const char *path, pkv_status want, const char *msg) {
    pkv_kv_stats a, b;
    pkv_kv_stats_get(c, &a);
    int32_t id = -1;
    CHECK_STATUS(pkv_kv_seq_load(c, path, 0, &id), want);
    CHECK_MSG(msg);
    CHECK_INT(id, -1);
    pkv_kv_stats_get(c, &b);
    CHECK(stats_eq(&a, &b));
}

static void test_file(kt_env *e) {
    pkv_kv_cache *c = pkv_kv_cache_create(kt_params(e, 4, 12, 0));
    if (!c) {
        TH_FAIL("%s", pkv_errmsg());
        return;
    }
    int32_t s, l;
    static snap s0, s1;
    CHECK_OK(pkv_kv_seq_create(c, 9, &s));
    fill_seq(c, s, NT, 7);
    take(c, s, &s0);
    const char *path = th_tmp("kv-seq.pkv");
    CHECK_OK(pkv_kv_seq_save(c, s, path));
    CHECK_OK(pkv_kv_seq_load(c, path, 0, &l));
    take(c, l, &s1);
    CHECK(same(&s0, &s1));
    /* another cache: same geometry, every layer on cpu:1 unsharded */
    pkv_kv_layer_desc L2[2];
    memcpy(L2, e->layers, sizeof L2);
    L2[0].n_shards = L2[1].n_shards = 0;
    pkv_kv_params p2 = kt_params(e, 4, 8, 0);
    p2.layers = L2;
    p2.device = e->cpu1;
    pkv_kv_cache *c2 = pkv_kv_cache_create(p2);
    if (c2) {
        CHECK_INT(pkv_kv_layout_fingerprint(pkv_kv_cache_layout(c2)), pkv_kv_layout_fingerprint(pkv_kv_cache_layout(c)));
        int32_t filler;
        CHECK_OK(pkv_kv_seq_create(c2, 1, &filler));
        fill_seq(c2, filler, 5, 8); /* the load lands on other page ids */
        CHECK_OK(pkv_kv_seq_load(c2, path, 0, &l));
        take(c2, l, &s1);
        CHECK(same(&s0, &s1));
        /* too small: out of pages, nothing changed */
        fill_seq(c2, filler, 8, 9);
        bad_load(c2, path, PKV_ERR_OUT_OF_PAGES, "needs 4 pages");
        pkv_kv_cache_free(c2);
    } else {
        TH_FAIL("%s", pkv_errmsg());
    }
    /* mismatching caches */
    struct {
        int layer;
        int heads, dk;
        pkv_type dtype;
        int page_size;
        const char *msg;
    } cases[] = {
        {0, 2, 8, PKV_TYPE_F32, 4, "layer 0 has 3 KV heads in the file, 2 in the cache"},
        {0, 3, 16, PKV_TYPE_F32, 4, "layer 0 has head sizes K 8, V 4 in the file, K 16, V 4 in the cache"},
        {1, 2, 4, PKV_TYPE_F32, 4, "layer 1 stores K f16, V f16 in the file, K f32, V f32 in the cache"},
        {1, 2, 4, PKV_TYPE_F16, 8, "pages of 4 tokens in the file, 8 in the cache"},
    };
    for (size_t k = 0; k < PKV_ARRAY_LEN(cases); k++) {
        memcpy(L2, e->layers, sizeof L2);
        L2[0].n_shards = L2[1].n_shards = 0;
        L2[cases[k].layer].n_kv_heads = cases[k].heads;
        L2[cases[k].layer].head_dim_k = cases[k].dk;
        L2[cases[k].layer].dtype_k = L2[cases[k].layer].dtype_v = cases[k].dtype;
        p2 = kt_params(e, cases[k].page_size, 8, 0);
        p2.layers = L2;
        p2.rope_n_rot = 4;
        c2 = pkv_kv_cache_create(p2);
        if (!c2) {
            TH_FAIL("case %zu: %s", k, pkv_errmsg());
            continue;
        }
        bad_load(c2, path, PKV_ERR_FORMAT, cases[k].msg);
        pkv_kv_cache_free(c2);
    }
    /* damaged files */
    size_t n;
    uint8_t *d = read_file(path, &n);
    if (!d || n < 100) {
        TH_FAIL("cannot read back %s", path);
        free(d);
        pkv_kv_cache_free(c);
        return;
    }
    const char *bad = th_tmp("kv-bad.pkv");
    write_file(bad, d, n - 9);
    bad_load(c, bad, PKV_ERR_FORMAT, "is truncated");
    write_file(bad, d, 40);
    bad_load(c, bad, PKV_ERR_FORMAT, "is truncated");
    d[n - 20] ^= 0x10;
    write_file(bad, d, n);
    bad_load(c, bad, PKV_ERR_FORMAT, "checksum mismatch");
    d[n - 20] ^= 0x10;
    d[0] = 'X';
    write_file(bad, d, n);
    bad_load(c, bad, PKV_ERR_FORMAT, "not a pagekv sequence file");
    d[0] = 'P';
    write_file(bad, d, n);
    CHECK_OK(pkv_kv_seq_load(c, bad, 0, &l)); /* restored bytes load again */
    bad_load(c, th_tmp("kv-missing.pkv"), PKV_ERR_IO, "cannot open");
    CHECK_STATUS(pkv_kv_seq_save(c, s, "/nonexistent-dir/x.pkv"), PKV_ERR_IO);
    free(d);
    pkv_kv_cache_free(c);
}

int main(void) {
    kt_env e;
    if (!kt_open(&e)) return th_skip("cannot open cpu and cpu:1");
    kt_layout_sharded(&e);
    int64_t live0 = pkv_alloc_live();
    test_swap(&e); /* host pool as buffers on the CPU devices: batched region copies */
    pkv_kv_test_plain_host_pool = true;
    test_swap(&e); /* host pool in plain memory: reads and writes */
    pkv_kv_test_plain_host_pool = false;
    test_file(&e);
    CHECK_INT(pkv_alloc_live(), live0);
    kt_close(&e);
    return th_done();
}
