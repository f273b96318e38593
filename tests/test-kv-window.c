// labels: kv model vulkan timeout=900
/* Sliding-window layers in the paged cache (the window pool, src/kv/kv-window.c).
 *
 * A gemma2 model (sliding window on its even layers) runs on a cache with a
 * window pool and, side by side, on a reference cache that keeps every token of
 * every layer (the same layers with window 0 in the cache layout). Every KV
 * operation is done on both and the logits compared bitwise: decode past the
 * window (pages released), a long prompt (split into steps), fork, a short
 * truncate (rollback inside the kept page), a deep truncate (back into released
 * pages: the window layers are recomputed), swap out/in, save/load, context
 * shifts starting before and inside the released pages, and a prefix hit whose
 * window pages must be found beside the main pool's. Windows 8 and 20 with
 * pages of 4, 8, 16 and 32 tokens (dividing the window and not, smaller and
 * larger), f16 and q8_0 KV, on cpu, on a two-device split with the cache on the
 * host, and on vulkan:0 when present. The window pool's page count is checked to
 * stay bounded while the main pool grows. */
#include "model/forward.h"
#include "testhelp.h"

enum { V = 320 };

/* dev: one device, or "A,B" (heads split over two devices), "A,B+host" (and the cache on the host). */
static pkv_model *make(int window, const char *dev) {
    pkv_mkmodel_params p = pkv_mkmodel_default_params();
    p.arch = "gemma2";
    p.n_layer = 4;
    p.n_embd = 128;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.n_ff = 128;
    p.n_vocab = V;
    p.sliding_window = window;
    void *img;
    size_t size;
    if (pkv_mkmodel_memory(&p, &img, &size)) return NULL;
    pkv_model_params mp = pkv_model_default_params();
    char devs[64];
    snprintf(devs, sizeof devs, "%s", dev);
    char *host = strstr(devs, "+host");
    if (host) *host = 0;
    if (strchr(devs, ','))
        mp.devices = devs;
    else
        mp.device = devs;
    mp.kv_on_host = host != NULL;
    mp.n_threads = 2;
    pkv_model *m = pkv_model_load_memory(img, size, "gemma2-window", mp);
    pkv_mkmodel_free_memory(img);
    return m;
}

/* The window cache (pkv_model_cache_create) or the reference: every layer full. */
static pkv_kv_cache *make_cache(pkv_model *m, int ps, pkv_type kv, bool reference) {
    if (!reference) {
        pkv_cache_params cp = pkv_cache_default_params();
        cp.n_ctx = 512;
        cp.n_seq_max = 4;
        cp.page_size = ps;
        cp.kv_type = kv;
        return pkv_model_cache_create(m, cp);
    }
    pkv_model_info mi;
    if (pkv_model_get_info(m, &mi)) return NULL;
    pkv_kv_layer_desc L[8];
    pkv_kv_shard_desc S[8 * 4];
    pkv_kv_params kp = pkv_model_kv_params(m, L, S);
    for (int l = 0; l < kp.n_layers; l++) {
        L[l].window = 0;
        L[l].dtype_k = L[l].dtype_v = kv;
    }
    kp.page_size = ps;
    kp.n_pages = 4 * ((512 + ps - 1) / ps);
    kp.host_pages = kp.n_pages;
    return pkv_kv_cache_create(kp);
}

typedef struct pair {
    pkv_context *w, *r; /* on the window cache, on the reference */
} pair;

static int argmax(const float *x) {
    int b = 0;
    for (int i = 1; i < V; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Both logits exist and are bitwise equal. */
static bool same(const pair *p, const char *what) {
    const float *a = pkv_context_logits(p->w), *b = pkv_context_logits(p->r);
    th_checks++;
    if (!a || !b) {
        TH_FAIL("%s: no logits (window %p, reference %p)", what, (const void *)a, (const void *)b);
        return false;
    }
    if (memcmp(a, b, V * sizeof(float))) {
        double e = 0, n = 0;
        for (int i = 0; i < V; i++) e += (a[i] - b[i]) * (double)(a[i] - b[i]), n += (double)b[i] * b[i];
        TH_FAIL("%s: logits differ from the reference (nmse %.3g)", what, e / (n > 0 ? n : 1));
        return false;
    }
    return true;
}

static void decode(pair *p, const int32_t *t, int n, const char *what) {
    CHECK_OK(pkv_context_decode(p->w, t, n));
    CHECK_OK(pkv_context_decode(p->r, t, n));
    same(p, what);
}

/* n greedy tokens on both, compared at every step. */
static void greedy(pair *p, int n, const char *what) {
    for (int i = 0; i < n; i++) {
        const float *l = pkv_context_logits(p->w);
        if (!l) return;
        int32_t t = argmax(l);
        decode(p, &t, 1, what);
    }
}

static pkv_kv_stats stats(const pair *p) {
    pkv_kv_stats s;
    pkv_kv_stats_get(pkv_context_cache(p->w), &s);
    return s;
}

static void run(pkv_model *m, int window, int ps, pkv_type kv, const char *label) {
    pkv_kv_cache *cw = make_cache(m, ps, kv, false), *cr = make_cache(m, ps, kv, true);
    if (!cw || !cr) {
        TH_FAIL("%s: caches: %s", label, pkv_errmsg());
        pkv_kv_cache_free(cw);
        pkv_kv_cache_free(cr);
        return;
    }
    char what[160];
    pkv_kv_stats s0;
    pkv_kv_stats_get(cw, &s0);
    CHECK(s0.window_pages > 0 && s0.window_page_bytes > 0);
    CHECK(s0.window_page_bytes == s0.page_bytes); /* gemma2: half the layers slide, same geometry */
    pair a = {pkv_context_create(m, cw, 512), pkv_context_create(m, cr, 512)};
    REQUIRE_VOID(a.w && a.r);
    int32_t prompt[300];
    for (int i = 0; i < 300; i++) prompt[i] = (i * 37 + 11) % V;

    /* decode past the window: pages leave it and go back to the pool */
    snprintf(what, sizeof what, "%s: prompt + greedy", label);
    decode(&a, prompt, 30, what);
    greedy(&a, 60, what);
    pkv_kv_stats s1 = stats(&a);
    int64_t bound = (window + ps + ps - 1) / ps + 1;
    CHECK(s1.window_released > 0);
    if (s1.window_used > bound) TH_FAIL("%s: %lld window pages used, at most %lld expected", label, (long long)s1.window_used, (long long)bound);
    CHECK(s1.pages_used >= 90 / ps);
    CHECK_INT(pkv_kv_seq_window_len(cw, pkv_context_seq(a.w)), 90);

    /* fork: both branches on, each equal to the reference's */
    pair b = {pkv_context_fork(a.w), pkv_context_fork(a.r)};
    REQUIRE_VOID(b.w && b.r);
    int32_t t1 = 5, t2 = 6;
    snprintf(what, sizeof what, "%s: fork", label);
    decode(&a, &t1, 1, what);
    decode(&b, &t2, 1, what);
    greedy(&a, 12, what);
    greedy(&b, 12, what);

    /* short truncate (a rejected draft): no recompute */
    uint64_t replays = stats(&a).window_replays;
    int64_t n = pkv_context_n_tokens(a.w);
    CHECK_OK(pkv_context_truncate(a.w, n - 2));
    CHECK_OK(pkv_context_truncate(a.r, n - 2));
    snprintf(what, sizeof what, "%s: truncate by 2", label);
    decode(&a, &t2, 1, what);
    greedy(&a, 4, what);
    CHECK_INT(stats(&a).window_replays, replays);

    /* deep truncate into released pages: the window layers are recomputed */
    CHECK_OK(pkv_context_truncate(b.w, 10));
    CHECK_OK(pkv_context_truncate(b.r, 10));
    CHECK(pkv_kv_seq_window_len(cw, pkv_context_seq(b.w)) < 10);
    snprintf(what, sizeof what, "%s: truncate into released pages", label);
    decode(&b, &t1, 1, what);
    greedy(&b, 30, what);
    CHECK(stats(&a).window_replays > replays);
    CHECK_INT(pkv_kv_seq_window_len(cw, pkv_context_seq(b.w)), pkv_context_n_tokens(b.w));

    /* swap out and in */
    CHECK_OK(pkv_context_swap_out(a.w));
    CHECK_OK(pkv_context_swap_out(a.r));
    CHECK_OK(pkv_context_swap_in(a.w));
    CHECK_OK(pkv_context_swap_in(a.r));
    snprintf(what, sizeof what, "%s: swap", label);
    greedy(&a, 4, what);

    /* save and load into new contexts */
    char path[256];
    snprintf(path, sizeof path, "%s/kv-window-%d-%d.kv", getenv("PKV_TEST_TMP") ? getenv("PKV_TEST_TMP") : "/tmp", window, ps);
    CHECK_OK(pkv_context_save(a.w, path));
    pair c = {pkv_context_load(m, cw, path, 512), NULL};
    CHECK(c.w != NULL);
    if (c.w) {
        c.r = pkv_context_fork(a.r);
        int32_t last;
        CHECK_OK(pkv_context_tokens(a.r, pkv_context_n_tokens(a.r) - 1, 1, &last));
        CHECK_OK(pkv_context_truncate(c.r, pkv_context_n_tokens(c.r) - 1));
        CHECK_OK(pkv_context_decode(c.r, &last, 1)); /* load decodes its last token again */
        snprintf(what, sizeof what, "%s: save/load", label);
        same(&c, what);
        greedy(&c, 6, what);
        pkv_context_free(c.w);
        pkv_context_free(c.r);
    }
    unlink(path);

    /* context shifts: from inside the released pages (StreamingLLM: keep 4), and
     * from inside the window */
    n = pkv_context_n_tokens(a.w);
    int32_t last;
    CHECK_OK(pkv_context_tokens(a.w, n - 1, 1, &last));
    const int64_t starts[2] = {4, n - window - 3};
    for (int k = 0; k < 2; k++) {
        int64_t nr = k == 0 ? 10 : 2;
        CHECK_OK(pkv_context_shift(a.w, starts[k], nr));
        CHECK_OK(pkv_context_shift(a.r, starts[k], nr));
        snprintf(what, sizeof what, "%s: shift at %lld", label, (long long)starts[k]);
        decode(&a, &last, 1, what);
        greedy(&a, 5, what);
        n = pkv_context_n_tokens(a.w);
        CHECK_OK(pkv_context_tokens(a.w, n - 1, 1, &last));
    }

    /* prefix hit: a freed context's pages, window included, serve a new one */
    pair d = {pkv_context_create(m, cw, 512), pkv_context_create(m, cr, 512)};
    REQUIRE_VOID(d.w && d.r);
    CHECK_OK(pkv_context_decode(d.w, prompt, 300)); /* longer than one step: split */
    CHECK_OK(pkv_context_decode(d.r, prompt, 300));
    snprintf(what, sizeof what, "%s: 300-token prompt", label);
    same(&d, what);
    pkv_context_free(d.w);
    d.w = pkv_context_create(m, cw, 512);
    REQUIRE_VOID(d.w);
    int64_t hit = 0;
    CHECK_OK(pkv_kv_prefix_match(cw, pkv_context_seq(d.w), prompt, NULL, 299, &hit));
    CHECK(hit > 0 && hit % ps == 0);
    CHECK_INT(pkv_kv_seq_window_len(cw, pkv_context_seq(d.w)), hit);
    CHECK_OK(pkv_context_decode(d.w, prompt + hit, (int32_t)(300 - hit)));
    snprintf(what, sizeof what, "%s: prefix hit of %lld tokens", label, (long long)hit);
    same(&d, what);
    greedy(&d, 4, what);

    pkv_context_free(a.w);
    pkv_context_free(a.r);
    pkv_context_free(b.w);
    pkv_context_free(b.r);
    pkv_context_free(d.w);
    pkv_context_free(d.r);
    pkv_kv_stats se;
    pkv_kv_stats_get(cw, &se);
    CHECK_INT(se.window_used, 0);
    pkv_kv_cache_free(cw);
    pkv_kv_cache_free(cr);
}

/* cases: a bit mask over the table below (lavapipe and the split are slower than
 * cpu: they take a few). */
static void device(const char *dev, unsigned mask) {
    static const struct {
        int window, ps;
        pkv_type kv;
    } cases[] = {{8, 4, PKV_TYPE_F16},  {8, 8, PKV_TYPE_F16},   {8, 16, PKV_TYPE_F16},
                 {20, 8, PKV_TYPE_F16}, {20, 32, PKV_TYPE_F16}, {20, 16, PKV_TYPE_Q8_0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (!(mask >> i & 1)) continue;
        pkv_model *m = make(cases[i].window, dev);
        if (!m) {
            TH_FAIL("%s: model: %s", dev, pkv_errmsg());
            return;
        }
        char label[96];
        snprintf(label, sizeof label, "%s window %d pages of %d %s", dev, cases[i].window, cases[i].ps,
                 pkv_type_name(cases[i].kv));
        run(m, cases[i].window, cases[i].ps, cases[i].kv, label);
        pkv_model_free(m);
    }
}

/* Layout errors name the layer; a window longer than the context names the key. */
static void test_errors(void) {
    pkv_mkmodel_params mp = pkv_mkmodel_default_params();
    mp.arch = "gemma2";
    mp.n_ctx = 64;
    mp.sliding_window = 100;
    void *img;
    size_t size;
    CHECK_OK(pkv_mkmodel_memory(&mp, &img, &size));
    if (img) {
        CHECK(pkv_model_load_memory(img, size, "long window", pkv_model_default_params()) == NULL);
        CHECK(strstr(pkv_errmsg(), "'gemma2.attention.sliding_window' 100 is larger than 'gemma2.context_length' 64"));
        pkv_mkmodel_free_memory(img);
    }
    pkv_kv_layer_desc L[2] = {{2, 32, 32, PKV_TYPE_F16, PKV_TYPE_F16, 0, NULL, 0, 0, 0, 0, 0, {0}, 0, 0, false, false, 0},
                              {2, 32, 32, PKV_TYPE_F16, PKV_TYPE_F16, 0, NULL, -3, 0, 0, 0, 0, {0}, 0, 0, false, false, 0}};
    pkv_kv_params p = pkv_kv_default_params();
    p.n_layers = 2;
    p.layers = L;
    pkv_device *cpu = pkv_device_open("cpu", pkv_device_default_params());
    REQUIRE_VOID(cpu);
    p.device = cpu;
    p.n_pages = 8;
    CHECK(pkv_kv_cache_create(p) == NULL);
    CHECK(strstr(pkv_errmsg(), "layer 1") != NULL);
    L[1].window = 4;
    pkv_kv_cache *c = pkv_kv_cache_create(p);
    CHECK(c != NULL);
    int32_t s;
    pkv_kv_block_table bt;
    CHECK_OK(pkv_kv_seq_create(c, 1, &s));
    CHECK_OK(pkv_kv_block_table_window(c, 1, &s, &bt));
    CHECK_STATUS(pkv_kv_window_replay(c, s, 1, (int32_t[1]){0}), PKV_ERR_INVALID); /* nothing to replay */
    pkv_kv_cache_free(c);
    pkv_device_close(cpu);
}

int main(void) {
    test_errors();
    device("cpu", 0x3f);
    device("cpu,cpu:1+host", 0x24);
    char names[16][64], why[256] = "";
    int n = 0;
    bool vk = false;
    if (!pkv_device_enumerate(0, names, 16, &n, why, sizeof why))
        for (int i = 0; i < n && i < 16; i++) vk |= !strcmp(names[i], "vulkan:0");
    if (vk)
        device("vulkan:0", 0x31);
    else
        fprintf(stderr, "vulkan:0 not present (%s): its cases are skipped\n", why);
    return th_done();
}
