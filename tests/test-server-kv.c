// labels: server timeout=120
/* GET /v1/kv, the KV cache snapshot behind the web page, checked against what
 * the cache must hold: an empty pool; a context's pages held once; after a
 * fork both contexts' block tables list the same pages, each with refcount 2,
 * and the tree names the parent; after an append to the child copy-on-write
 * leaves exactly the full pages shared; a finished completion's full pages
 * stay cached (prefix index, refcount 0); a deleted context's pages come back;
 * and on a server that swaps idle contexts, a swapped context's block table is
 * in the host tier, whose flags mark exactly those pages. Every figure is
 * checked against the JSON's own page arrays and against /v1/contexts. */
#include "server-testlib.h"

#ifndef PKV_HAVE_SERVER
int main(void) { return th_skip("pagekv was built without the server (libmicrohttpd-dev, libjansson-dev)"); }
#else
#include "server-json.h"

static int g_port;

static json_t *get_json(const char *path) {
    int code = ts_http(g_port, "%s", path);
    if (code != 200) {
        fprintf(stderr, "GET %s: HTTP %d: %s\n", path, code, ts_body);
        return NULL;
    }
    return json_loads(ts_body, 0, NULL);
}

static json_t *post_json(const char *path, const char *body) {
    const char *f = ts_file("kv-body.json", body, strlen(body));
    int code = ts_http(g_port, "-H 'Content-Type: application/json' --data-binary @%s %s", f, path);
    if (code != 200) {
        fprintf(stderr, "POST %s: HTTP %d: %s\n", path, code, ts_body);
        return NULL;
    }
    return json_loads(ts_body, 0, NULL);
}

static json_t *tier(json_t *kv, const char *name) {
    json_t *t = json_object_get(kv, "tiers"), *v;
    size_t i;
    json_array_foreach(t, i, v) if (!strcmp(json_string_value(json_object_get(v, "name")), name)) return v;
    return NULL;
}

/* The sequence a context owns. */
static json_t *seq_of(json_t *kv, const char *ctx) {
    json_t *a = json_object_get(kv, "sequences"), *v;
    size_t i;
    json_array_foreach(a, i, v) {
        json_t *o = json_object_get(v, "owner");
        if (json_is_object(o) && !strcmp(json_string_value(json_object_get(o, "kind")), "context") &&
            !strcmp(json_string_value(json_object_get(o, "id")), ctx))
            return v;
    }
    return NULL;
}

/* A sequence's pages (key "pages" or "window_pages"), expanded from runs; returns the count. */
static int runs_of(json_t *seq, const char *key, int *out, int max) {
    json_t *runs = json_object_get(seq, key), *r;
    size_t i;
    int n = 0;
    json_array_foreach(runs, i, r) {
        long long first = json_integer_value(json_array_get(r, 0)), cnt = json_integer_value(json_array_get(r, 1));
        for (long long k = 0; k < cnt && n < max; k++) out[n++] = first < 0 ? -1 : (int)(first + k);
    }
    return n;
}

static int pages_of(json_t *seq, int *out, int max) { return runs_of(seq, "pages", out, max); }

static int refs_at(json_t *t, int p) { return (int)json_integer_value(json_array_get(json_object_get(t, "refs"), (size_t)p)); }
static char flag_at(json_t *t, int p) { return json_string_value(json_object_get(t, "flags"))[p]; }

/* A pool's own consistency (the device pool, or the window pool with the
 * sequences' window_pages): refs and flags agree with the counts, and the refs
 * are exactly how many listed block tables hold each page. */
static void check_pool_of(json_t *kv, const char *name, const char *key) {
    json_t *d = tier(kv, name);
    CHECK(d != NULL);
    if (!d) return;
    long long n = jint(d, "pages");
    const char *f = json_string_value(json_object_get(d, "flags"));
    CHECK(f && (long long)strlen(f) == n);
    CHECK_INT((long long)json_array_size(json_object_get(d, "refs")), n);
    if (!f || (long long)json_array_size(json_object_get(d, "refs")) != n) return;
    int *cnt = calloc((size_t)n, sizeof *cnt);
    json_t *a = json_object_get(kv, "sequences"), *v;
    size_t i;
    json_array_foreach(a, i, v) {
        if (strcmp(json_string_value(json_object_get(v, "tier")), "device")) continue;
        int pg[4096];
        int k = runs_of(v, key, pg, 4096);
        for (int j = 0; j < k; j++)
            if (pg[j] >= 0 && pg[j] < n) cnt[pg[j]]++;
    }
    long long used = 0, fr = 0, cached = 0, bad = 0;
    for (long long p = 0; p < n; p++) {
        used += f[p] == 'u' || f[p] == 'p';
        fr += f[p] == '.';
        cached += f[p] == 'c';
        bad += refs_at(d, (int)p) != cnt[p];
        bad += (f[p] == '.' || f[p] == 'c') != (cnt[p] == 0); /* held exactly when listed */
    }
    free(cnt);
    CHECK_INT(bad, 0);
    CHECK_INT(used, jint(d, "used"));
    CHECK_INT(fr, jint(d, "free"));
    CHECK_INT(cached, jint(d, "cached"));
    CHECK_INT(used + fr + cached, n);
}

static void check_pool(json_t *kv) { check_pool_of(kv, "device", "pages"); }

int main(void) {
    char model[512], log[512], args[1024];
    snprintf(model, sizeof model, "%s", th_tmp("kv.gguf"));
    snprintf(log, sizeof log, "%s", th_tmp("kv-serve.log"));
    REQUIRE(th_cli("", true, "mkmodel -o '%s'", model) == 0);
    snprintf(args, sizeof args, "-m '%s' -c 512 --kv-pages 64 --chat-template chatml --context-swap 0", model);
    pid_t pid = ts_start(args, log, &g_port);
    REQUIRE(pid > 0);

    /* empty */
    json_t *kv = get_json("/v1/kv");
    REQUIRE(kv != NULL);
    CHECK_INT(jint(kv, "page_size"), 16);
    CHECK_INT(jint(kv, "n_ctx"), 512);
    CHECK_INT(jint(tier(kv, "device"), "pages"), 64);
    CHECK_INT(jint(tier(kv, "device"), "used"), 0);
    CHECK_INT((long long)json_array_size(json_object_get(kv, "sequences")), 0);
    CHECK(tier(kv, "host") != NULL);
    check_pool(kv);
    json_decref(kv);

    /* a context of 40 tokens: 3 pages, each held once */
    char body[1024];
    int n = snprintf(body, sizeof body, "{\"tokens\": [");
    for (int i = 0; i < 40; i++) n += snprintf(body + n, sizeof body - (size_t)n, "%s%d", i ? "," : "", 10 + i);
    snprintf(body + n, sizeof body - (size_t)n, "]}");
    json_t *c1 = post_json("/v1/contexts", body);
    REQUIRE(c1 != NULL);
    CHECK(!strcmp(json_string_value(json_object_get(c1, "id")), "ctx-1"));
    json_decref(c1);
    kv = get_json("/v1/kv");
    REQUIRE(kv != NULL);
    json_t *s1 = seq_of(kv, "ctx-1");
    REQUIRE(s1 != NULL);
    CHECK_INT(jint(s1, "n_tokens"), 40);
    int p1[64], n1 = pages_of(s1, p1, 64);
    CHECK_INT(n1, 3);
    json_t *d = tier(kv, "device");
    for (int i = 0; i < n1; i++) CHECK_INT(refs_at(d, p1[i]), 1);
    CHECK_INT(jint(d, "used"), 3);
    check_pool(kv);
    json_decref(kv);

    /* fork: both block tables list the same 3 pages, each with refcount 2 */
    json_t *c2 = post_json("/v1/contexts/ctx-1/fork", "{}");
    REQUIRE(c2 != NULL);
    CHECK(!strcmp(json_string_value(json_object_get(c2, "id")), "ctx-2"));
    json_decref(c2);
    kv = get_json("/v1/kv");
    REQUIRE(kv != NULL);
    d = tier(kv, "device");
    json_t *s2 = seq_of(kv, "ctx-2");
    s1 = seq_of(kv, "ctx-1");
    REQUIRE(s1 && s2);
    int p2[64], n2 = pages_of(s2, p2, 64);
    n1 = pages_of(s1, p1, 64);
    CHECK_INT(n1, 3);
    CHECK_INT(n2, 3);
    for (int i = 0; i < n1 && i < n2; i++) {
        CHECK_INT(p2[i], p1[i]);
        CHECK_INT(refs_at(d, p1[i]), 2);
        CHECK(flag_at(d, p1[i]) == 'u' || flag_at(d, p1[i]) == 'p');
    }
    CHECK_INT(jint(d, "used"), 3); /* shared, not copied */
    CHECK(jint(s1, "seq") != jint(s2, "seq"));
    /* the tree: ctx-2's parent is ctx-1, and each names its sequence */
    json_t *ctxs = json_object_get(kv, "contexts"), *v;
    size_t i;
    int seen = 0;
    json_array_foreach(ctxs, i, v) {
        const char *id = json_string_value(json_object_get(v, "id"));
        json_t *par = json_object_get(v, "parent");
        if (!strcmp(id, "ctx-1")) {
            seen++;
            CHECK(json_is_null(par));
            CHECK_INT(jint(v, "seq"), jint(s1, "seq"));
        } else if (!strcmp(id, "ctx-2")) {
            seen++;
            CHECK(json_is_string(par) && !strcmp(json_string_value(par), "ctx-1"));
            CHECK_INT(jint(v, "seq"), jint(s2, "seq"));
            CHECK_INT(jint(v, "n_tokens"), 40);
        }
    }
    CHECK_INT(seen, 2);
    check_pool(kv);
    json_decref(kv);
    /* the contexts API agrees: 3 pages, all shared */
    json_t *info = get_json("/v1/contexts/ctx-2");
    REQUIRE(info != NULL);
    CHECK_INT(jint(info, "pages"), 3);
    CHECK_INT(jint(info, "shared_pages"), 3);
    CHECK(!strcmp(json_string_value(json_object_get(info, "parent")), "ctx-1"));
    json_decref(info);

    /* append 16 tokens to the child: the shared partial page is copied, the two
     * full pages stay shared; the child has a 4th page of its own */
    json_t *ap = post_json("/v1/contexts/ctx-2/append",
                           "{\"tokens\": [60,61,62,63,64,65,66,67,68,69,70,71,72,73,74,75]}");
    REQUIRE(ap != NULL);
    CHECK_INT(jint(ap, "n_tokens"), 56);
    json_decref(ap);
    kv = get_json("/v1/kv");
    REQUIRE(kv != NULL);
    d = tier(kv, "device");
    s1 = seq_of(kv, "ctx-1");
    s2 = seq_of(kv, "ctx-2");
    REQUIRE(s1 && s2);
    n1 = pages_of(s1, p1, 64);
    n2 = pages_of(s2, p2, 64);
    CHECK_INT(n1, 3);
    CHECK_INT(n2, 4);
    if (n1 == 3 && n2 == 4) {
        for (int k = 0; k < 2; k++) {
            CHECK_INT(p2[k], p1[k]);
            CHECK_INT(refs_at(d, p1[k]), 2);
        }
        CHECK(p2[2] != p1[2]); /* copy-on-write */
        CHECK_INT(refs_at(d, p1[2]), 1);
        CHECK_INT(refs_at(d, p2[2]), 1);
        CHECK_INT(refs_at(d, p2[3]), 1);
    }
    CHECK_INT(jint(d, "used"), 5);
    CHECK(jint(kv, "stats.cow_pages") >= 1);
    check_pool(kv);
    json_decref(kv);

    /* a finished completion leaves its full prompt pages in the prefix index,
     * held by nobody: cached, refcount 0 */
    n = snprintf(body, sizeof body, "{\"prompt\": [");
    for (int k = 0; k < 40; k++) n += snprintf(body + n, sizeof body - (size_t)n, "%s%d", k ? "," : "", 100 + k);
    snprintf(body + n, sizeof body - (size_t)n, "], \"max_tokens\": 2, \"temperature\": 0}");
    json_t *cp = post_json("/v1/completions", body);
    CHECK(cp != NULL);
    json_decref(cp);
    kv = get_json("/v1/kv");
    REQUIRE(kv != NULL);
    d = tier(kv, "device");
    CHECK(jint(d, "cached") >= 2);
    CHECK_INT((long long)json_array_size(json_object_get(kv, "sequences")), 2); /* the two contexts only */
    {
        const char *f = json_string_value(json_object_get(d, "flags"));
        for (int p = 0; f && f[p]; p++)
            if (f[p] == 'c') CHECK_INT(refs_at(d, p), 0);
    }
    check_pool(kv);
    json_decref(kv);

    /* delete both: no sequence, their full pages cached or free */
    CHECK_INT(ts_http(g_port, "-X DELETE /v1/contexts/ctx-2"), 200);
    CHECK_INT(ts_http(g_port, "-X DELETE /v1/contexts/ctx-1"), 200);
    kv = get_json("/v1/kv");
    REQUIRE(kv != NULL);
    CHECK_INT((long long)json_array_size(json_object_get(kv, "sequences")), 0);
    CHECK_INT((long long)json_array_size(json_object_get(kv, "contexts")), 0);
    CHECK_INT(jint(tier(kv, "device"), "used"), 0);
    check_pool(kv);
    json_decref(kv);
    CHECK_INT(ts_http(g_port, "-X POST /v1/kv"), 405);
    CHECK_INT(ts_stop(pid, SIGTERM), 0);

    /* the host tier: a server that swaps contexts idle for 1 s */
    snprintf(args, sizeof args, "-m '%s' -c 512 --kv-pages 64 --chat-template chatml --context-swap 1", model);
    pid = ts_start(args, log, &g_port);
    REQUIRE(pid > 0);
    json_t *c3 = post_json("/v1/contexts", "{\"tokens\": [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20]}");
    REQUIRE(c3 != NULL);
    json_decref(c3);
    json_t *sw = NULL;
    for (int k = 0; k < 100 && !sw; k++) { /* up to 10 s */
        ts_sleep_ms(100);
        kv = get_json("/v1/kv");
        json_t *s = kv ? seq_of(kv, "ctx-1") : NULL;
        if (s && !strcmp(json_string_value(json_object_get(s, "tier")), "host")) sw = kv;
        else json_decref(kv);
    }
    REQUIRE(sw != NULL);
    json_t *s3 = seq_of(sw, "ctx-1"), *h = tier(sw, "host");
    int p3[64], n3 = pages_of(s3, p3, 64);
    CHECK_INT(n3, 2);
    const char *hf = json_string_value(json_object_get(h, "flags"));
    REQUIRE(hf != NULL);
    int marked = 0;
    for (int k = 0; hf[k]; k++) marked += hf[k] == 'u';
    CHECK_INT(marked, n3);
    CHECK_INT(jint(h, "used"), n3);
    for (int k = 0; k < n3; k++) CHECK(p3[k] >= 0 && hf[p3[k]] == 'u');
    CHECK_INT(jint(tier(sw, "device"), "used"), 0);
    json_array_foreach(json_object_get(sw, "contexts"), i, v) CHECK(json_is_true(json_object_get(v, "swapped")));
    check_pool(sw);
    json_decref(sw);
    CHECK_INT(ts_stop(pid, SIGTERM), 0);

    /* sliding-window layers (gemma2, window 16): their pool is a tier of its own
     * ("window", and "window-host"), each sequence lists its window pages, and
     * pages that left the window are released: a leading run of -1 */
    char g2[512];
    snprintf(g2, sizeof g2, "%s", th_tmp("kv-g2.gguf"));
    REQUIRE(th_cli("", true, "mkmodel --arch gemma2 --sliding-window 16 -o '%s'", g2) == 0);
    snprintf(args, sizeof args, "-m '%s' -c 512 --kv-pages 64 --chat-template chatml --context-swap 0", g2);
    pid = ts_start(args, log, &g_port);
    REQUIRE(pid > 0);
    n = snprintf(body, sizeof body, "{\"tokens\": [");
    for (int k = 0; k < 100; k++) n += snprintf(body + n, sizeof body - (size_t)n, "%s%d", k ? "," : "", 10 + k);
    snprintf(body + n, sizeof body - (size_t)n, "]}");
    json_t *w1 = post_json("/v1/contexts", body);
    REQUIRE(w1 != NULL);
    json_decref(w1);
    json_decref(post_json("/v1/contexts/ctx-1/fork", "{}"));
    json_decref(post_json("/v1/contexts/ctx-2/append", "{\"tokens\": [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20]}"));
    kv = get_json("/v1/kv");
    REQUIRE(kv != NULL);
    CHECK(tier(kv, "window") != NULL && tier(kv, "window-host") != NULL);
    CHECK_INT(jint(tier(kv, "window"), "pages"), 64);
    json_t *ws1 = seq_of(kv, "ctx-1"), *ws2 = seq_of(kv, "ctx-2");
    REQUIRE(ws1 && ws2);
    int wp1[64], wp2[64], nw1 = runs_of(ws1, "window_pages", wp1, 64), nw2 = runs_of(ws2, "window_pages", wp2, 64);
    CHECK_INT(nw1, 7);
    CHECK_INT(nw2, 8); /* 120 tokens */
    int released = 0;
    while (released < nw2 && wp2[released] < 0) released++;
    CHECK(released >= 4); /* tokens before 120 + 1 - (16 + 16) are out of every window */
    for (int k = released; k < nw2; k++) CHECK(wp2[k] >= 0);
    check_pool(kv);
    check_pool_of(kv, "window", "window_pages");
    json_decref(kv);
    CHECK_INT(ts_stop(pid, SIGTERM), 0);
    return th_done();
}
#endif
