// labels: server
/* Requests a web page on another site can make the browser send (issue 50.7):
 *  1. a JSON endpoint refuses any Content-Type but application/json (with or
 *     without parameters) with a 415, and changes nothing: text/plain, a form
 *     and no type at all are "simple" requests that need no CORS preflight;
 *  2. DNS rebinding: a Host that is not an IP address, localhost or a name
 *     given with --allowed-host is refused (403 naming the option), the web
 *     page included; with --api-key any Host is answered (the key protects). */
#include "server-testlib.h"

#ifndef PKV_HAVE_SERVER
int main(void) { return th_skip("pagekv was built without the server (libmicrohttpd-dev, libjansson-dev)"); }
#else
#include "server-json.h"

static int g_port;

/* POST json with the given curl header arguments. */
static int post_as(const char *headers, const char *path, const char *json) {
    char f[512];
    snprintf(f, sizeof f, "%s", ts_file("body.json", json, strlen(json)));
    return ts_http(g_port, "%s --data-binary @%s %s", headers, f, path);
}

static long long ctx_tokens(const char *id) {
    char path[128];
    snprintf(path, sizeof path, "/v1/contexts/%s", id);
    if (ts_http(g_port, "%s", path) != 200) return -1;
    json_t *j = json_loads(ts_body, 0, NULL);
    long long n = jint(j, "n_tokens");
    json_decref(j);
    return n;
}

static int content_types(void) {
    const char *log = th_tmp("origin-a.log");
    pid_t pid = ts_start("-c 64", log, &g_port);
    REQUIRE(pid > 0);
    const char *json = "-H 'Content-Type: application/json'";
    CHECK_INT(post_as(json, "/v1/contexts", "{\"tokens\": [1, 2, 3, 4, 5, 6]}"), 200);
    CHECK(strstr(ts_body, "\"ctx-1\"") != NULL);
    CHECK_INT(ctx_tokens("ctx-1"), 6);
    /* what a page on any site may send with fetch(..., {mode: 'no-cors'}) or a form */
    const char *simple[] = {"-H 'Content-Type: text/plain'", "-H 'Content-Type: text/plain;charset=UTF-8'",
                            "-H 'Content-Type: application/x-www-form-urlencoded'", "-H 'Content-Type:'",
                            "-H 'Content-Type: application/jsonp'"};
    for (size_t i = 0; i < sizeof simple / sizeof *simple; i++) {
        CHECK_INT(post_as(simple[i], "/v1/contexts/ctx-1/truncate", "{\"n_tokens\": 1}"), 415);
        CHECK(strstr(ts_body, "application/json") != NULL);
        CHECK_INT(ctx_tokens("ctx-1"), 6); /* nothing changed */
        CHECK_INT(post_as(simple[i], "/v1/completions", "{\"prompt\": [1, 2], \"max_tokens\": 1}"), 415);
        CHECK_INT(post_as(simple[i], "/v1/contexts/ctx-1/fork", "{}"), 415);
    }
    CHECK_INT(ts_http(g_port, "/v1/contexts"), 200);
    CHECK(strstr(ts_body, "ctx-2") == NULL); /* no fork was made */
    CHECK_INT(post_as("-H 'Content-Type: application/json; charset=utf-8'", "/v1/contexts/ctx-1/truncate",
                      "{\"n_tokens\": 2}"),
              200);
    CHECK_INT(ctx_tokens("ctx-1"), 2);
    CHECK_INT(post_as("-H 'Content-Type: Application/JSON'", "/v1/completions", "{\"prompt\": [1, 2], \"max_tokens\": 1}"),
              200);
    /* Host: IP addresses and localhost (any port) are answered, other names are not */
    const char *good[] = {"127.0.0.1", "localhost", "LocalHost", "[::1]", "10.1.2.3"};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        CHECK_INT(ts_http(g_port, "-H 'Host: %s:%d' /health", good[i], g_port), 200);
        CHECK_INT(ts_http(g_port, "-H 'Host: %s' /v1/models", good[i]), 200);
    }
    const char *bad[] = {"evil.example", "evil.example:80", "127.0.0.1.evil.example", "localhost.evil.example",
                         "[not-v6]", "127.0.0.1:x"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        CHECK_INT(ts_http(g_port, "-H 'Host: %s' /health", bad[i]), 403);
        CHECK(strstr(ts_body, "--allowed-host") != NULL);
        CHECK_INT(ts_http(g_port, "-H 'Host: %s' /", bad[i]), 403); /* the web page too */
        CHECK_INT(post_as("-H 'Content-Type: application/json' -H 'Host: evil.example'", "/v1/contexts/ctx-1/truncate",
                          "{\"n_tokens\": 1}"),
                  403);
    }
    CHECK_INT(ctx_tokens("ctx-1"), 2);
    CHECK_INT(ts_stop(pid, SIGTERM), 0);
    return 0;
}

static int allowed_hosts(void) {
    const char *log = th_tmp("origin-b.log");
    pid_t pid = ts_start("-c 64 --allowed-host pagekv.lan --allowed-host Box", log, &g_port);
    REQUIRE(pid > 0);
    CHECK_INT(ts_http(g_port, "-H 'Host: pagekv.lan:%d' /health", g_port), 200);
    CHECK_INT(ts_http(g_port, "-H 'Host: box' /v1/models"), 200);
    CHECK_INT(ts_http(g_port, "-H 'Host: 127.0.0.1:%d' /health", g_port), 200);
    CHECK_INT(ts_http(g_port, "-H 'Host: evil.example' /health"), 403);
    CHECK_INT(ts_stop(pid, SIGTERM), 0);
    /* with a key the Host is not checked: a rebinding page does not have the key */
    pid = ts_start("-c 64 --api-key k", log, &g_port);
    REQUIRE(pid > 0);
    CHECK_INT(ts_http(g_port, "-H 'Host: evil.example' /v1/models"), 401);
    CHECK_INT(ts_http(g_port, "-H 'Host: evil.example' -H 'Authorization: Bearer k' /v1/models"), 200);
    CHECK_INT(ts_stop(pid, SIGTERM), 0);
    /* the option's own errors */
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' serve --allowed-host evil.example:80 --port 0 2>&1", getenv("PKV_CLI"));
    FILE *f = popen(cmd, "r");
    char out[512] = "";
    size_t n = fread(out, 1, sizeof out - 1, f);
    out[n] = 0;
    CHECK_INT(WEXITSTATUS(pclose(f)), 2);
    CHECK(strstr(out, "--allowed-host 'evil.example:80' is not a host name") != NULL);
    return 0;
}

int main(void) {
    content_types();
    allowed_hosts();
    return th_done();
}
#endif
