// labels: server
/* Idle contexts and the contexts' page quota (issue 50.8):
 *  1. with room in the pool, requests do not swap idle contexts out: a context
 *     and its forks stay on the device, sharing their pages, however many
 *     completions run beside them;
 *  2. generations on forks started together never take the contexts past
 *     --context-pages: each reserves its pages when admitted, those that would
 *     pass the quota are a 503 naming it, and the pages the contexts hold
 *     afterwards (counted from GET /v1/kv) are within the quota. */
#include "server-testlib.h"

#ifndef PKV_HAVE_SERVER
int main(void) { return th_skip("pagekv was built without the server (libmicrohttpd-dev, libjansson-dev)"); }
#else
#include "server-json.h"

static int g_port;

static int post(const char *path, const char *json, json_t **out) {
    char f[512];
    snprintf(f, sizeof f, "%s", ts_file("body.json", json, strlen(json)));
    int code = ts_http(g_port, "-H 'Content-Type: application/json' --data-binary @%s %s", f, path);
    if (out) *out = json_loads(ts_body, 0, NULL);
    return code;
}

static json_t *get(const char *path) {
    if (ts_http(g_port, "%s", path) != 200) return NULL;
    return json_loads(ts_body, 0, NULL);
}

/* Distinct pages the contexts hold (device pages once, host pages of swapped
 * ones), from GET /v1/kv; *swapped: contexts in the host tier. */
static long long held_pages(int *swapped) {
    json_t *kv = get("/v1/kv");
    if (!kv) return -1;
    static unsigned char dev[1 << 16], host[1 << 16];
    memset(dev, 0, sizeof dev);
    memset(host, 0, sizeof host);
    long long n = 0;
    *swapped = 0;
    json_t *seqs = jget(kv, "sequences"), *sq;
    size_t i;
    json_array_foreach(seqs, i, sq) {
        json_t *kind = jget(sq, "owner.kind");
        if (!json_is_string(kind) || strcmp(json_string_value(kind), "context")) continue;
        bool on_host = !strcmp(json_string_value(jget(sq, "tier")), "host");
        *swapped += on_host;
        unsigned char *map = on_host ? host : dev;
        json_t *run;
        size_t k;
        json_array_foreach(jget(sq, "pages"), k, run) {
            long long first = json_integer_value(json_array_get(run, 0)), cnt = json_integer_value(json_array_get(run, 1));
            for (long long p = first; p >= 0 && p < first + cnt && p < (long long)sizeof dev; p++)
                if (!map[p]) {
                    map[p] = 1;
                    n++;
                }
        }
    }
    json_decref(kv);
    return n;
}

static const char *ctx_body =
    "{\"tokens\": [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, "
    "35, 36, 37, 38, 39, 40, 41, 42, 43]}"; /* 33 tokens: two full pages and one token */

static int resident(void) {
    json_t *r = NULL;
    int code = post("/v1/contexts", ctx_body, &r);
    json_decref(r);
    REQUIRE(code == 200);
    for (int i = 0; i < 3; i++) CHECK_INT(post("/v1/contexts/ctx-1/fork", "{}", NULL), 200);
    const char *req = "{\"prompt\": [5, 6, 7, 8, 9], \"max_tokens\": 8, \"temperature\": 0, \"ignore_eos\": true}";
    for (int i = 0; i < 6; i++) CHECK_INT(post("/v1/completions", req, NULL), 200);
    int swapped = -1;
    CHECK_INT(held_pages(&swapped), 3); /* the forks share every page of ctx-1 */
    CHECK_INT(swapped, 0);
    for (int i = 1; i <= 4; i++) {
        char p[64];
        snprintf(p, sizeof p, "/v1/contexts/ctx-%d", i);
        json_t *c = get(p);
        CHECK(c && json_is_false(jget(c, "swapped")));
        CHECK_INT(jint(c, "pages"), 3);
        CHECK_INT(jint(c, "shared_pages"), 3);
        json_decref(c);
    }
    CHECK_INT(ts_http(g_port, "/metrics"), 200);
    CHECK(strstr(ts_body, "pagekv_preemptions_total 0\n") != NULL);
    /* the quota counts shared pages once: an append to a fork is within it */
    CHECK_INT(post("/v1/contexts/ctx-2/append", "{\"tokens\": [50]}", NULL), 200);
    return 0;
}

static int concurrent(void) {
    json_t *r = NULL;
    int code = post("/v1/contexts", ctx_body, &r);
    json_decref(r);
    REQUIRE(code == 200);
    for (int i = 0; i < 4; i++) CHECK_INT(post("/v1/contexts/ctx-1/fork", "{}", NULL), 200);
    /* four generations of 160 tokens at once, one on each fork: 11 pages each
     * reserved, three fit in the quota of 40 beside the 3 pages held */
    char cmd[4096], outs[4][512];
    int at = snprintf(cmd, sizeof cmd, "(");
    for (int i = 0; i < 4; i++) {
        snprintf(outs[i], sizeof outs[i], "%s", th_tmp(i == 0 ? "gen0" : i == 1 ? "gen1" : i == 2 ? "gen2" : "gen3"));
        at += snprintf(cmd + at, sizeof cmd - (size_t)at,
                       "curl -sS --max-time 60 -o '%s' -w '%%{http_code}\\n' -H 'Content-Type: application/json' "
                       "-d '{\"max_tokens\": 160, \"ignore_eos\": true, \"temperature\": 0}' "
                       "http://127.0.0.1:%d/v1/contexts/ctx-%d/generate & ",
                       outs[i], g_port, i + 2);
    }
    snprintf(cmd + at, sizeof cmd - (size_t)at, "wait)");
    FILE *f = popen(cmd, "r");
    REQUIRE(f != NULL);
    int ok = 0, refused = 0, other = 0, c;
    while (fscanf(f, "%d", &c) == 1) {
        if (c == 200) ok++;
        else if (c == 503) refused++;
        else other++;
    }
    pclose(f);
    CHECK(ok >= 1);
    CHECK_INT(other, 0);
    CHECK_INT(ok + refused, 4);
    for (int i = 0; i < 4; i++) {
        static char t[1 << 16];
        if (th_read_text(outs[i], t, sizeof t) && strstr(t, "\"error\"")) CHECK(strstr(t, "--context-pages") != NULL);
    }
    int swapped = -1;
    long long held = held_pages(&swapped);
    CHECK(held > 3);
    if (held > 40) TH_FAIL("the contexts hold %lld pages, their quota is 40 (%d generations ran)", held, ok);
    th_checks++;
    return 0;
}

int main(void) {
    const char *log = th_tmp("quota-a.log");
    pid_t pid = ts_start("-c 512 --kv-pages 256 --context-pages 64 --parallel 4", log, &g_port);
    REQUIRE(pid > 0);
    resident();
    CHECK_INT(ts_stop(pid, SIGTERM), 0);
    pid = ts_start("-c 512 --kv-pages 256 --context-pages 40 --parallel 4", log, &g_port);
    REQUIRE(pid > 0);
    concurrent();
    CHECK_INT(ts_stop(pid, SIGTERM), 0);
    return th_done();
}
#endif
