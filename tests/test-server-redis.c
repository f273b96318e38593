// labels: server timeout=240
/* pagekv serve --kv-remote: two replicas on one redis-server of the test's own.
 * Replica B answers a long prompt only replica A has seen with cached_tokens > 0
 * (its pages from Redis: the remote hit counter moves, /v1/kv lists the tier) and
 * the text of A's cold run; Redis killed mid-run: both replicas go on serving the
 * same text, count errors and report the tier down, and once Redis is back
 * (restarted empty) a prompt A answers is found by B again; a hybrid model
 * (qwen35: recurrent layers, their state in the value) and a sliding-window one
 * (gemma3: the window layers' rows in the last pages' values) hit too; a URL that does
 * not parse and a wrong password are refused at startup naming the URL (the
 * password masked); an unreachable Redis is a warning and serving starts. */
#include "testhelp.h"

#ifndef PKV_HAVE_SERVER
int main(void) { return th_skip("pagekv was built without the server (libmicrohttpd-dev, libjansson-dev)"); }
#else
#include "kv/kv-impl.h"
#include "redis-testlib.h"
#include "server-json.h"
#include "server-testlib.h"

static long long metric(int port, const char *name) {
    if (ts_http(port, "/metrics") != 200) return -1;
    char key[128];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *p = strstr(ts_body, key);
    return p ? atoll(p + strlen(key)) : -1;
}

/* The completion of body on the server at port: its text (static) and cached_tokens. */
static const char *ask(int port, const char *body, long long *cached) {
    static char text[8][4096];
    static int k;
    char *out = text[k++ & 7];
    out[0] = 0;
    *cached = -1;
    const char *f = ts_file("body.json", body, strlen(body));
    CHECK_INT(ts_http(port, "-H 'Content-Type: application/json' --data-binary @%s /v1/completions", f), 200);
    json_t *j = json_loads(ts_body, 0, NULL);
    json_t *t = j ? jget(j, "choices.0.text") : NULL;
    if (json_is_string(t)) {
        snprintf(out, 4096, "%s", json_string_value(t));
        *cached = jint(j, "usage.prompt_tokens_details.cached_tokens");
    } else {
        fprintf(stderr, "response: %.300s\n", ts_body);
    }
    json_decref(j);
    return out;
}

/* Wait until A's published page count has held still for 0.3 s; the count. */
static long long settle(int port) {
    long long w = -1;
    /* asynchronous writes: the count must hold still for 1 s (a sanitizer build's
     * writer can pause longer than a few polls) */
    for (int i = 0, still = 0; i < 600 && still < 20; i++) {
        long long x = metric(port, "pagekv_kv_remote_written_pages_total");
        still = (x > 0 && x == w) ? still + 1 : 0;
        w = x;
        ts_sleep_ms(50);
    }
    return w;
}

static void prompt(char *body, size_t n, const char *words, int reps) {
    snprintf(body, n, "{\"prompt\": \"");
    for (int i = 0; i < reps; i++) strncat(body, words, n - strlen(body) - 64);
    strcat(body, "\", \"max_tokens\": 12, \"temperature\": 0}");
}

/* Two replicas of model on the Redis at rport (logs under the test's tmp; B's path
 * into lb when not NULL). */
static bool start_pair(const char *model, int rport, pid_t *a, int *pa, pid_t *b, int *pb, char *lb) {
    char args[1024], la[512], lbb[512];
    snprintf(la, sizeof la, "%s", th_tmp("redis-a.log"));
    snprintf(lbb, sizeof lbb, "%s", th_tmp("redis-b.log"));
    if (lb) snprintf(lb, 512, "%s", lbb);
    snprintf(args, sizeof args, "-m '%s' -c 1024 --kv-remote redis://127.0.0.1:%d", model, rport);
    *a = ts_start(args, la, pa);
    *b = ts_start(args, lbb, pb);
    return *a > 0 && *b > 0;
}

/* Replica B of model answers what only A saw: from Redis, with A's text. */
static void replicas(const char *model, int rport, const char *what) {
    char body[8192];
    int pa = 0, pb = 0;
    pid_t a, b;
    REQUIRE_VOID(start_pair(model, rport, &a, &pa, &b, &pb, NULL));
    prompt(body, sizeof body, "a long shared system prompt that every replica sees word for word ", 12);
    long long cached;
    char cold[4096];
    snprintf(cold, sizeof cold, "%s", ask(pa, body, &cached));
    CHECK_INT(cached, 0);
    CHECK(cold[0] != 0);
    long long written = settle(pa);
    CHECK(written > 10);
    const char *warm = ask(pb, body, &cached);
    if (strcmp(warm, cold)) TH_FAIL("%s: replica B's text differs:\n cold: %s\n B: %s", what, cold, warm);
    th_checks++;
    CHECK(cached > 0 && cached % 16 == 0);
    fprintf(stderr, "%s: B cached %lld tokens, A published %lld pages\n", what, cached, written);
    CHECK(metric(pb, "pagekv_kv_remote_hit_pages_total") * 16 >= cached);
    CHECK(metric(pb, "pagekv_kv_remote_lookups_total") >= 1);
    CHECK_INT(metric(pb, "pagekv_kv_remote_rejected_values_total"), 0);
    CHECK_INT(metric(pb, "pagekv_kv_remote_enabled"), 1);
    REQUIRE_VOID(ts_http(pb, "/v1/kv") == 200);
    CHECK(strstr(ts_body, "\"name\":\"remote\"") != NULL && strstr(ts_body, "\"kind\":\"redis\"") != NULL);
    CHECK_INT(ts_stop(a, SIGTERM), 0);
    CHECK_INT(ts_stop(b, SIGTERM), 0);
}

/* Redis killed mid-run and restarted empty: the replicas go on, then use it again. */
static void outage(const char *model, int rport, const char *rlog, pid_t *rp) {
    char body[8192], lb[512];
    int pa = 0, pb = 0;
    pid_t a, b;
    REQUIRE_VOID(start_pair(model, rport, &a, &pa, &b, &pb, lb));
    rt_stop(*rp);
    prompt(body, sizeof body, "while the shared store is down the replicas answer on their own ", 10);
    long long ca, cb;
    char ta[4096];
    double t0 = pkv_time_now();
    snprintf(ta, sizeof ta, "%s", ask(pa, body, &ca));
    const char *tb = ask(pb, body, &cb);
    CHECK(ta[0] && !strcmp(ta, tb));
    CHECK(pkv_time_now() - t0 < 20.0);
    CHECK(metric(pb, "pagekv_kv_remote_errors_total") >= 1);
    CHECK_INT(metric(pb, "pagekv_kv_remote_enabled"), 0);
    *rp = rt_start(rport, "", rlog);
    REQUIRE_VOID(*rp > 0);
    ts_sleep_ms(1200); /* the back-off */
    prompt(body, sizeof body, "after the store came back empty a replica fills it again for all ", 10);
    snprintf(ta, sizeof ta, "%s", ask(pa, body, &ca));
    CHECK_INT(ca, 0);
    CHECK(settle(pa) > 0);
    tb = ask(pb, body, &cb);
    CHECK(!strcmp(ta, tb));
    CHECK(cb > 0);
    CHECK_INT(metric(pb, "pagekv_kv_remote_enabled"), 1);
    char buf[1 << 16];
    CHECK(strstr(th_read_text(lb, buf, sizeof buf), "going on without it") != NULL);
    CHECK(strstr(buf, "connected again") != NULL);
    CHECK_INT(ts_stop(a, SIGTERM), 0);
    CHECK_INT(ts_stop(b, SIGTERM), 0);
}

int main(void) {
    if (th_cli("", true, "serve --help") != 0) return th_skip("pagekv serve is not available");
    if (!pkv_kv_remote_available()) return th_skip("pagekv was built without hiredis (libhiredis-dev)");
    const char *miss = rt_missing();
    if (miss) return th_skip(miss);
    /* a llama, a hybrid (qwen35) and a sliding-window (gemma3: a global layer every six) model */
    static const char *const arch[3] = {"llama", "qwen35", "gemma3 --layers 6"};
    char models[3][512], rlog[512];
    for (int i = 0; i < 3; i++) {
        snprintf(models[i], sizeof models[i], "%s-%d.gguf", th_tmp("redis"), i);
        REQUIRE(th_cli("", true, "mkmodel --arch %s --no-template -o '%s'", arch[i], models[i]) == 0);
    }
    const char *model = models[0], *hybrid = models[1], *sliding = models[2];
    snprintf(rlog, sizeof rlog, "%s", th_tmp("redis-server.log"));
    int rport = rt_free_port(NULL);
    pid_t rp = rt_start(rport, "", rlog);
    REQUIRE(rp > 0);

    /* startup: refusals naming the URL, the password masked; unreachable: a warning */
    CHECK_INT(th_cli("", true, "serve -m '%s' --kv-remote 'redis//127.0.0.1' --port 0", model), 1);
    HAS("does not parse");
    rt_cli(rport, "CONFIG SET requirepass sesame");
    CHECK_INT(th_cli("", true, "serve -m '%s' --kv-remote 'redis://u:hunter2@127.0.0.1:%d' --port 0", model, rport), 1);
    HAS("AUTH refused");
    CHECK(strstr(th_out, "hunter2") == NULL);
    rt_cli(rport, "-a sesame --no-auth-warning CONFIG SET requirepass ''");
    {
        char args[1024], lg[512];
        snprintf(lg, sizeof lg, "%s", th_tmp("redis-none.log"));
        snprintf(args, sizeof args, "-m '%s' --kv-remote redis://127.0.0.1:%d", model, rt_free_port(NULL));
        int p = 0;
        pid_t s = ts_start(args, lg, &p);
        CHECK(s > 0);
        CHECK_INT(metric(p, "pagekv_kv_remote_enabled"), 0);
        CHECK_INT(ts_stop(s, SIGTERM), 0);
        char buf[1 << 14];
        CHECK(strstr(th_read_text(lg, buf, sizeof buf), "starting without it") != NULL);
    }

    replicas(model, rport, "llama");
    replicas(hybrid, rport, "qwen35 (hybrid)");
    replicas(sliding, rport, "gemma3 (sliding window)");
    outage(model, rport, rlog, &rp);
    rt_stop(rp);
    return th_done();
}
#endif
