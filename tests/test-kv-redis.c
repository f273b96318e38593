// labels: kv timeout=120
/* The remote tier (kv-redis.c) against a redis-server of the test's own: pages a
 * cache published come back bit-identical into another cache (a replica; other
 * devices for the shards) in one pipelined round trip; a URL that does not parse,
 * a wrong password (masked in the message) and a peer that is not Redis are
 * refused at creation, an unreachable server is not (the cache goes on without
 * the tier); a corrupted value (one flipped byte), a foreign value and another
 * model's value under a page's key are rejected, counted, deleted and never used;
 * Redis killed mid-run: matches and publishes go on without it within a bounded
 * delay, errors are counted, and the tier is used again once a server (restarted
 * empty) is back; a small maxmemory with allkeys-lru evicts and every hit is still
 * the pages' exact content. */
#include "kv-testlib.h"
#include "redis-testlib.h"

#define PS 4
#define NT 14 /* 3 full pages + 2 tokens */
#define NSEQ 200

static char logbuf[1 << 16];
static void log_fn(pkv_log_level lv, const char *msg, void *user) {
    (void)lv;
    (void)user;
    size_t n = strlen(logbuf);
    if (n + 2 < sizeof logbuf) snprintf(logbuf + n, sizeof logbuf - n, "%s\n", msg);
}

typedef struct snap {
    float kv[2][2][NT * 32];
} snap;

static int32_t toks[NT];

static void take(pkv_kv_cache *c, int32_t seq, snap *s) {
    memset(s, 0, sizeof *s);
    for (int il = 0; il < 2; il++)
        for (int v = 0; v < 2; v++) CHECK_OK(kt_read_seq(c, seq, il, v, s->kv[il][v]));
}

/* The first n tokens' K/V of a and b are equal, bit for bit. */
static bool same_prefix(const snap *a, const snap *b, const pkv_kv_cache *c, int64_t n) {
    for (int il = 0; il < 2; il++)
        for (int v = 0; v < 2; v++)
            if (memcmp(a->kv[il][v], b->kv[il][v], (size_t)n * (size_t)kt_dim(c, il, v) * sizeof(float))) return false;
    return true;
}

static char url[256];

static pkv_kv_cache *make(kt_env *e, const char *u, int timeout_ms) {
    pkv_kv_params p = kt_params(e, PS, 16, 0);
    p.remote_url = u;
    p.remote_timeout_ms = timeout_ms;
    return pkv_kv_cache_create(p);
}

/* The Redis key of page i of producer fp's chain over tk. */
static void page_key(const pkv_kv_cache *c, const int32_t *tk, uint64_t fp, int i, char *out, size_t n) {
    int32_t pos[NT];
    for (int t = 0; t < NT; t++) pos[t] = t;
    uint64_t k = pkv_kv_fp_seed(fp);
    for (int j = 0; j <= i; j++) k = pkv_kv_page_key(c, k, tk + j * PS, pos + j * PS);
    snprintf(out, n, "pagekv:v1:%016llx:%016llx", (unsigned long long)pkv_kv_layout_fingerprint(pkv_kv_cache_layout(c)),
             (unsigned long long)k);
}

/* Publish one sequence of producer fp over tk from cache c; its K/V into s. */
static void publish(pkv_kv_cache *c, uint64_t fp, const int32_t *tk, uint64_t seed, snap *s) {
    int32_t q;
    CHECK_OK(pkv_kv_seq_create(c, fp, &q));
    kt_fill(c, q, NT, tk, seed);
    if (s) take(c, q, s);
    CHECK_OK(pkv_kv_seq_free(c, q));
}

/* Match tk in cache c (a fresh sequence of producer fp, freed after); tokens matched. */
static int64_t match(pkv_kv_cache *c, uint64_t fp, const int32_t *tk, snap *s) {
    int32_t q;
    int64_t m = -1;
    CHECK_OK(pkv_kv_seq_create(c, fp, &q));
    CHECK_OK(pkv_kv_prefix_match(c, q, tk, NULL, NT, &m));
    if (s) take(c, q, s);
    CHECK_OK(pkv_kv_seq_free(c, q));
    return m;
}

static void bad_input(kt_env *e, int port) {
    static const char *bad[] = {"http://127.0.0.1:6379", "redis://", "redis://127.0.0.1:99999",
                                "redis://127.0.0.1:12/x", "redis://nopass@127.0.0.1", "redis://127.0.0.1:80 junk"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        CHECK(make(e, bad[i], 200) == NULL);
        if (!strstr(pkv_errmsg(), "does not parse")) TH_FAIL("%s: %s", bad[i], pkv_errmsg());
        th_checks++;
    }
    /* a wrong password: refused, the password never shown */
    char u[256];
    snprintf(u, sizeof u, "redis://default:hunter2@127.0.0.1:%d", port);
    CHECK(make(e, u, 500) == NULL);
    CHECK(strstr(pkv_errmsg(), "AUTH refused") != NULL);
    CHECK(strstr(pkv_errmsg(), "hunter2") == NULL && strstr(pkv_errmsg(), "***") != NULL);
    /* a peer that accepts and never answers: not Redis */
    int fd = -1, p2 = rt_free_port(&fd);
    snprintf(u, sizeof u, "redis://127.0.0.1:%d", p2);
    CHECK(make(e, u, 200) == NULL);
    CHECK(strstr(pkv_errmsg(), "does not answer as a Redis server") != NULL);
    close(fd);
    /* nobody there: a warning, the cache works without the tier */
    p2 = rt_free_port(NULL);
    snprintf(u, sizeof u, "redis://127.0.0.1:%d/3", p2);
    pkv_kv_cache *c = make(e, u, 200);
    if (!c) {
        TH_FAIL("an unreachable Redis refused: %s", pkv_errmsg());
        return;
    }
    pkv_kv_stats st;
    pkv_kv_stats_get(c, &st);
    CHECK(st.remote_configured && !st.remote_enabled);
    CHECK_INT(st.remote_errors, 1);
    CHECK(strstr(logbuf, "starting without it") != NULL);
    CHECK_INT(match(c, 7, toks, NULL), 0);
    pkv_kv_cache_free(c);
}

int main(void) {
    if (!pkv_kv_remote_available()) return th_skip("pagekv was built without hiredis (libhiredis-dev)");
    const char *miss = rt_missing();
    if (miss) return th_skip(miss);
    kt_env e, e2;
    if (!kt_open_twins(&e, &e2)) return th_skip("no cpu devices");
    pkv_log_set(log_fn, NULL, PKV_LOG_INFO);
    uint64_t seed = 5;
    for (int i = 0; i < NT; i++) toks[i] = (int32_t)(th_rand(&seed) % 50);
    char rlog[512];
    snprintf(rlog, sizeof rlog, "%s", th_tmp("redis.log"));
    int port = rt_free_port(NULL);
    pid_t rp = rt_start(port, "--requirepass sesame", rlog);
    REQUIRE(rp > 0);
    bad_input(&e, port);
    snprintf(url, sizeof url, "redis://:sesame@127.0.0.1:%d/2", port);

    /* two replicas on one Redis: B finds what only A computed */
    static snap s0, s1;
    pkv_kv_cache *a = make(&e, url, 500), *b = make(&e2, url, 500);
    REQUIRE(a && b);
    publish(a, 7, toks, 11, &s0);
    CHECK_OK(pkv_kv_remote_flush(a));
    pkv_kv_stats st;
    pkv_kv_stats_get(a, &st);
    CHECK(st.remote_enabled);
    CHECK_INT(st.remote_written_pages, 3);
    CHECK(st.remote_bytes_written > 0);
    CHECK_INT(rt_cli(port, "-a sesame -n 2 --no-auth-warning DBSIZE"), 0);
    CHECK_INT(atoll(rt_out), 3);
    CHECK_INT(match(b, 7, toks, &s1), 12);
    CHECK(same_prefix(&s0, &s1, b, 12));
    pkv_kv_stats_get(b, &st);
    CHECK_INT(st.remote_hit_pages, 3);
    CHECK_INT(st.remote_lookups, 1); /* pipelined */
    CHECK_INT(st.remote_rejected_values, 0);
    CHECK_INT(match(b, 8, toks, NULL), 0); /* another model's chain: other keys, a miss */

    /* damaged and foreign values: rejected, counted, deleted, never used */
    {
        pkv_kv_cache *c = make(&e2, url, 500);
        char k0[80], k1[80], k8[80];
        page_key(c, toks, 7, 0, k0, sizeof k0);
        page_key(c, toks, 7, 1, k1, sizeof k1);
        CHECK_INT(rt_cli(port, "-a sesame -n 2 --no-auth-warning SETRANGE %s 300 Z", k1), 0); /* a flipped byte */
        CHECK_INT(match(c, 7, toks, &s1), 4);
        CHECK(same_prefix(&s0, &s1, c, 4));
        pkv_kv_stats_get(c, &st);
        CHECK_INT(st.remote_rejected_values, 1);
        CHECK(strstr(logbuf, "checksum mismatch") != NULL);
        CHECK_INT(rt_cli(port, "-a sesame -n 2 --no-auth-warning EXISTS %s", k1), 0);
        CHECK_INT(atoll(rt_out), 0);
        pkv_kv_cache_free(c);
        c = make(&e2, url, 500);
        CHECK_INT(rt_cli(port, "-a sesame -n 2 --no-auth-warning SET %s 'not a page'", k0), 0); /* another program's */
        CHECK_INT(match(c, 7, toks, NULL), 0);
        /* another model's page copied under this chain's key */
        publish(a, 8, toks, 12, NULL);
        CHECK_OK(pkv_kv_remote_flush(a));
        page_key(c, toks, 8, 0, k8, sizeof k8);
        CHECK_INT(rt_cli(port, "-a sesame -n 2 --no-auth-warning COPY %s %s REPLACE", k8, k0), 0);
        CHECK_INT(match(c, 7, toks, NULL), 0);
        pkv_kv_stats_get(c, &st);
        CHECK_INT(st.remote_rejected_values, 2);
        CHECK_INT(st.remote_hit_pages, 0);
        CHECK(strstr(logbuf, "(wrong size)") != NULL && strstr(logbuf, "produced by another model") != NULL);
        pkv_kv_cache_free(c);
    }

    /* Redis killed mid-run: both go on within a bounded delay, errors counted;
     * restarted empty on the same port: the tier is used again */
    rt_stop(rp);
    int32_t t2[NT];
    for (int i = 0; i < NT; i++) t2[i] = toks[i] + 100;
    double t0 = pkv_time_now();
    CHECK_INT(match(b, 7, t2, NULL), 0); /* B: not in memory, Redis gone */
    publish(a, 7, t2, 21, &s0);          /* A: its publish is dropped */
    CHECK_OK(pkv_kv_remote_flush(a));
    CHECK_INT(match(b, 7, t2, NULL), 0);
    CHECK(pkv_time_now() - t0 < 3.0);
    pkv_kv_stats_get(b, &st);
    CHECK(st.remote_errors >= 1 && !st.remote_enabled);
    pkv_kv_stats_get(a, &st);
    CHECK(st.remote_errors >= 1 || st.remote_dropped_pages >= 1);
    CHECK(strstr(logbuf, "going on without it") != NULL);
    rp = rt_start(port, "--requirepass sesame", rlog);
    REQUIRE(rp > 0);
    ts_sleep_ms(1100); /* the back-off */
    int32_t t3[NT];
    for (int i = 0; i < NT; i++) t3[i] = toks[i] + 200;
    publish(a, 7, t3, 31, &s0);
    CHECK_OK(pkv_kv_remote_flush(a));
    CHECK_INT(match(b, 7, t3, &s1), 12);
    CHECK(same_prefix(&s0, &s1, b, 12));
    CHECK(strstr(logbuf, "connected again") != NULL);
    pkv_kv_stats_get(b, &st);
    CHECK(st.remote_enabled);
    pkv_kv_cache_free(a);
    pkv_kv_cache_free(b);
    rt_stop(rp);

    /* a small maxmemory with allkeys-lru: Redis evicts; every hit is exact */
    rp = rt_start(port, "--maxmemory-policy allkeys-lru", rlog);
    REQUIRE(rp > 0);
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", port);
    a = make(&e, url, 500);
    b = make(&e2, url, 500);
    REQUIRE(a && b);
    publish(a, 10, toks, 1, NULL); /* the writer's connection too */
    CHECK_OK(pkv_kv_remote_flush(a));
    long long used = rt_info(port, "used_memory");
    REQUIRE(used > 0);
    CHECK_INT(rt_cli(port, "CONFIG SET maxmemory %lld", used + 300000), 0); /* room for about half the pages */
    static snap all[NSEQ];
    static int32_t tk[NSEQ][NT];
    for (int q = 0; q < NSEQ; q++) {
        for (int i = 0; i < NT; i++) tk[q][i] = (int32_t)(q * 1000 + i);
        publish(a, 9, tk[q], 100 + (uint64_t)q, &all[q]);
        if (q % 16 == 15) CHECK_OK(pkv_kv_remote_flush(a));
    }
    CHECK_OK(pkv_kv_remote_flush(a));
    CHECK(rt_info(port, "evicted_keys") > 0);
    int hits = 0, misses = 0;
    for (int q = 0; q < NSEQ; q++) {
        int64_t m = match(b, 9, tk[q], &s1);
        hits += m > 0;
        misses += m < 12;
        if (!same_prefix(&all[q], &s1, b, m))
            TH_FAIL("sequence %d: %lld tokens matched, content differs", q, (long long)m);
        th_checks++;
    }
    CHECK(hits > 0 && misses > 0);
    pkv_kv_stats_get(b, &st);
    CHECK_INT(st.remote_rejected_values, 0);
    pkv_kv_cache_free(a);
    pkv_kv_cache_free(b);
    rt_stop(rp);
    kt_close(&e);
    kt_close(&e2);
    return th_done();
}
