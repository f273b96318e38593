// labels: kv
/* The model fingerprint covers all tensor data (issue 50 item 4): two models made
 * alike, B a copy of A with one byte changed past the first 64 bytes of a tensor
 * (blk.0.attn_k.weight, so its KV differs), get different fingerprints, and
 *  - B finds none of the pages A left in a disk tier directory (no cached tokens,
 *    no disk hits) while A, on the same directory, does;
 *  - a context A saved does not load into B (PKV_ERR_FORMAT naming both
 *    fingerprints) and loads into A;
 *  - the fingerprint does not depend on the thread count (models loaded with 1
 *    and 3 threads agree), and a model loaded twice gets the same one. */
#include "engine-testlib.h"
#include "model/gguf.h"
#include "model/model-impl.h"

enum { NP = 48 };

static void rm_rf(const char *dir) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

static pkv_model *load(const void *data, size_t size, const char *label, int threads) {
    pkv_model_params mp = pkv_model_default_params();
    mp.n_threads = threads;
    pkv_model *m = pkv_model_load_memory(data, size, label, mp);
    if (!m) TH_FAIL("load %s: %s", label, pkv_errmsg());
    return m;
}

/* One request of the prompt on a fresh engine over disk directory dir: its
 * cached tokens, and the cache's disk hits. Pages are flushed to disk at the end. */
static int32_t serve(pkv_model *m, const char *dir, const int32_t *prompt, uint64_t *disk_hits) {
    pkv_engine_params ep = et_params(128, 8, 0);
    ep.cache.disk_dir = dir;
    pkv_engine *e = pkv_engine_create(m, ep);
    if (!e) {
        TH_FAIL("engine: %s", pkv_errmsg());
        return -1;
    }
    static et_rec rec;
    memset(&rec, 0, sizeof rec);
    pkv_request_params r = pkv_request_default_params();
    r.prompt = prompt;
    r.n_prompt = NP;
    r.max_tokens = 4;
    r.on_event = et_on_event;
    r.user = &rec;
    CHECK_OK(pkv_engine_submit(e, &r, NULL));
    et_drain(e);
    CHECK_OK(pkv_kv_disk_flush(pkv_engine_cache(e)));
    pkv_kv_stats ks;
    pkv_kv_stats_get(pkv_engine_cache(e), &ks);
    *disk_hits = ks.disk_hit_pages;
    pkv_engine_free(e);
    CHECK_INT(rec.s[0].finals, 1);
    return rec.s[0].n_cached;
}

int main(void) {
    (void)et_rand, (void)et_same, (void)et_alone; /* engine-testlib helpers this test does not need */
    pkv_mkmodel_params p = pkv_mkmodel_default_params();
    p.n_layer = 2;
    p.n_embd = 64;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.n_ff = 128;
    p.n_vocab = 320;
    p.type = PKV_TYPE_F16;
    p.seed = 7;
    void *a = NULL;
    size_t size = 0;
    REQUIRE(pkv_mkmodel_memory(&p, &a, &size) == PKV_OK);
    uint8_t *b = malloc(size);
    REQUIRE(b);
    memcpy(b, a, size);
    { /* B: one byte of blk.0.attn_k.weight past its first 64 bytes (a low mantissa byte of an f16) */
        pkv_gguf *g = pkv_gguf_open_memory(b, size, "b");
        REQUIRE(g);
        const pkv_gguf_tensor *t = pkv_gguf_find_tensor(g, "blk.0.attn_k.weight");
        REQUIRE(t && t->n_bytes > 200);
        size_t off = (size_t)((const uint8_t *)t->data - b) + 100;
        pkv_gguf_close(g);
        b[off] ^= 0x5a;
    }
    pkv_model *ma = load(a, size, "model-a", 1), *mb = load(b, size, "model-b", 3);
    pkv_model *ma3 = load(a, size, "model-a3", 3);
    REQUIRE(ma && mb && ma3);
    fprintf(stderr, "fingerprints: a %016llx, a (3 threads) %016llx, b %016llx\n", (unsigned long long)ma->fingerprint,
            (unsigned long long)ma3->fingerprint, (unsigned long long)mb->fingerprint);
    CHECK(ma->fingerprint != mb->fingerprint);
    CHECK(ma->fingerprint == ma3->fingerprint);
    pkv_model_free(ma3);

    int32_t prompt[NP];
    for (int i = 0; i < NP; i++) prompt[i] = 3 + (i * 37) % 250;

    /* disk tier: A fills the directory; B finds nothing there, A again finds it */
    char dir[512];
    snprintf(dir, sizeof dir, "%s", th_tmp("fingerprint-disk"));
    rm_rf(dir);
    uint64_t hits = 0;
    CHECK_INT(serve(ma, dir, prompt, &hits), 0);
    int32_t cached_b = serve(mb, dir, prompt, &hits);
    fprintf(stderr, "model b on model a's directory: %d cached tokens, %llu disk hits\n", cached_b,
            (unsigned long long)hits);
    CHECK_INT(cached_b, 0);
    CHECK_INT(hits, 0);
    int32_t cached_a = serve(ma, dir, prompt, &hits);
    fprintf(stderr, "model a again: %d cached tokens, %llu disk hits\n", cached_a, (unsigned long long)hits);
    CHECK(cached_a >= 32); /* the control: the pages are there for their own model */
    CHECK(hits > 0);
    rm_rf(dir);

    /* save / load: A's saved context is refused by B, taken by A */
    char path[512];
    snprintf(path, sizeof path, "%s", th_tmp("fingerprint-a.pkv"));
    pkv_cache_params cp = pkv_cache_default_params();
    cp.n_ctx = 128;
    cp.n_seq_max = 2;
    pkv_kv_cache *ca = pkv_model_cache_create(ma, cp), *cb = pkv_model_cache_create(mb, cp);
    REQUIRE(ca && cb);
    pkv_context *x = pkv_context_create(ma, ca, 0);
    REQUIRE(x);
    CHECK_OK(pkv_context_decode(x, prompt, NP));
    CHECK_OK(pkv_context_save(x, path));
    pkv_kv_stats before;
    pkv_kv_stats_get(cb, &before);
    pkv_context *y = pkv_context_load(mb, cb, path, 0);
    CHECK(y == NULL);
    if (y) pkv_context_free(y);
    fprintf(stderr, "model b loading model a's context: %s\n", pkv_errmsg());
    CHECK(strstr(pkv_errmsg(), "another producer") != NULL);
    char want[64];
    snprintf(want, sizeof want, "expected %016llx", (unsigned long long)mb->fingerprint);
    CHECK(strstr(pkv_errmsg(), want) != NULL);
    pkv_kv_stats after;
    pkv_kv_stats_get(cb, &after);
    CHECK_INT(after.pages_used, before.pages_used); /* nothing changed */
    pkv_context *z = pkv_context_load(ma, ca, path, 0);
    CHECK(z != NULL);
    if (z) pkv_context_free(z);
    pkv_context_free(x);
    pkv_kv_cache_free(ca);
    pkv_kv_cache_free(cb);
    remove(path);

    pkv_model_free(ma);
    pkv_model_free(mb);
    pkv_mkmodel_free_memory(a);
    free(b);
    return th_done();
}
