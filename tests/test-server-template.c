// labels: server
/* pagekv serve against hostile chat templates and the requests that make a
 * template work hard (issues 43.4 and 50.6), each failing before its fix:
 *  1. a model whose tokenizer.chat_template is 2 MB of one expression
 *     ({{ x.y.y.y ... }}) kept the server at 100% CPU for 13+ minutes before it
 *     listened: now it exits within seconds, the error naming the line and the
 *     nesting limit;
 *  2. SIGTERM during start-up waited for the start to finish (and the server
 *     listened): now the process ends at once and never listens;
 *  3. a render that scans a long message 200,000 times ran for many minutes:
 *     a 400 naming the work limit; a slow loop: a 400 naming --template-time;
 *     a render over the shared budget: 503 naming --template-budget;
 *  4. a client that resets its connection during a render cancels it (counted
 *     in client_disconnects_total). */
#include "server-testlib.h"

#ifndef PKV_HAVE_SERVER
int main(void) { return th_skip("pagekv was built without the server (libmicrohttpd-dev, libjansson-dev)"); }
#else
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

static double secs(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static bool make_model(const char *out, const char *tpl_name, const char *tpl, size_t n) {
    const char *tf = ts_file(tpl_name, tpl, n);
    return th_cli("", true, "mkmodel --chat-template '%s' -o '%s'", tf, out) == 0;
}

static const char *read_log(const char *log) {
    static char buf[1 << 16];
    return th_read_text(log, buf, sizeof buf) ? buf : "";
}

/* 1 */
static void test_hostile_template(void) {
    size_t n = (size_t)2 << 20;
    char *t = malloc(n + 16);
    REQUIRE_VOID(t != NULL);
    size_t k = (size_t)sprintf(t, "\n\n{{ x");
    while (k + 2 < n) {
        t[k++] = '.';
        t[k++] = 'y';
    }
    k += (size_t)sprintf(t + k, " }}");
    const char *model = th_tmp("tpl-hostile.gguf");
    REQUIRE_VOID(make_model(model, "tpl-hostile.jinja", t, k));
    free(t);
    const char *log = th_tmp("tpl-hostile.log");
    char args[1024];
    snprintf(args, sizeof args, "-m '%s'", model);
    int st = 0;
    double t0 = secs();
    pid_t pid = ts_start(args, log, &st);
    double dt = secs() - t0;
    CHECK(pid < 0 && st == 1);
    if (pid > 0) ts_stop(pid, SIGKILL);
    const char *l = read_log(log);
    CHECK(strstr(l, "tokenizer.chat_template") && strstr(l, "line 3") && strstr(l, "nesting limit"));
    if (dt > 10.0) TH_FAIL("the server took %.1f s to refuse the template", dt);
    printf("a 2 MB template of one expression refused in %.2f s: %.200s\n", dt, l);
    unlink(model);
}

/* 2: SIGTERM while the server analyses its template (a slow one) */
static void test_sigterm_startup(void) {
    /* each of the ~10 analysis renders scans 500 KB until its work limit: ~2 s in all */
    const char *tpl = "{% set a = 'az' * 500 %}{% set s = a * 500 %}{% for i in range(100000) %}{% if 'zz' in s %}{% endif %}"
                      "{% endfor %}{% for m in messages %}{{ m.content }}{% endfor %}";
    const char *model = th_tmp("tpl-slow.gguf");
    REQUIRE_VOID(make_model(model, "tpl-slow.jinja", tpl, strlen(tpl)));
    const char *log = th_tmp("tpl-slow.log"), *pf = th_tmp("tpl-slow.port");
    unlink(pf);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "exec '%s' serve -m '%s' --host 127.0.0.1 --port 0 --port-file '%s' >'%s' 2>&1",
             getenv("PKV_CLI"), model, pf, log);
    if (ts_n_pids == 0) atexit(ts_kill_all);
    pid_t pid = fork();
    REQUIRE_VOID(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    if (ts_n_pids < TS_MAX_SERVERS) ts_pids[ts_n_pids++] = pid;
    ts_sleep_ms(150);
    kill(pid, SIGTERM);
    double t0 = secs();
    int st = 0;
    bool gone = false;
    while (secs() - t0 < 10.0) {
        if (waitpid(pid, &st, WNOHANG) == pid) {
            gone = true;
            break;
        }
        ts_sleep_ms(20);
    }
    double dt = secs() - t0;
    for (int j = 0; j < ts_n_pids; j++)
        if (ts_pids[j] == pid) ts_pids[j] = 0;
    if (!gone) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
    }
    const char *l = read_log(log);
    CHECK(gone && dt < 2.0);
    CHECK(!strstr(l, "listening") && access(pf, F_OK) != 0); /* it never served */
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM);
    printf("SIGTERM during start-up: gone after %.2f s (%s)\n", dt, l);
    unlink(model);
}

static int g_port;

static int post(const char *path, const char *json) {
    const char *f = ts_file("tpl-body.json", json, strlen(json));
    return ts_http(g_port, "-H 'Content-Type: application/json' --data-binary @%s %s", f, path);
}

/* {"messages": [{"role": "user", "content": "azaz..." (n bytes; "aaaa..." when !z)}], "max_tokens": 1} */
static char *big_request(size_t n, bool z) {
    char *b = malloc(n + 256);
    if (!b) abort();
    size_t k = (size_t)sprintf(b, "{\"messages\": [{\"role\": \"user\", \"content\": \"");
    for (size_t i = 0; i < n; i++) b[k++] = z && i % 2 ? 'z' : 'a';
    sprintf(b + k, "\"}], \"max_tokens\": 1}");
    return b;
}

/* POST req to /v1/chat/completions on a raw socket, without reading the answer */
static int send_raw(const char *req) {
    char head[256];
    int hl = snprintf(head, sizeof head, "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                                         "Content-Length: %zu\r\n\r\n", strlen(req));
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)g_port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0 || write(fd, head, (size_t)hl) != hl) {
        if (fd >= 0) close(fd);
        return -1;
    }
    size_t off = 0, len = strlen(req);
    while (off < len) {
        ssize_t w = write(fd, req + off, len - off);
        if (w <= 0) break;
        off += (size_t)w;
    }
    return fd;
}

static uint64_t metric(const char *name) {
    if (ts_http(g_port, "/metrics") != 200) return (uint64_t)-1;
    const char *p = ts_body;
    size_t nl = strlen(name);
    while ((p = strstr(p, name))) {
        if ((p == ts_body || p[-1] == '\n') && p[nl] == ' ') return strtoull(p + nl + 1, NULL, 10);
        p += nl;
    }
    return (uint64_t)-1;
}

/* 3 and 4 */
static void test_render_bounds(void) {
    /* the loops run only for a long message or "spin": the load-time analysis is quick */
    const char *tpl = "{% for m in messages %}{% if m.content|length > 100000 %}"
                      "{% for i in range(500) %}{% for j in range(400) %}{% if 'zz' in m.content %}{% endif %}{% endfor %}{% endfor %}"
                      "{% elif m.content == 'spin' %}{% set s = ('az' * 1000) * 500 %}"
                      "{% for i in range(1000) %}{% if 'zz' in s %}{% endif %}{% endfor %}"
                      "{% endif %}{{ m.content|length }}{% endfor %}";
    const char *model = th_tmp("tpl-work.gguf");
    REQUIRE_VOID(make_model(model, "tpl-work.jinja", tpl, strlen(tpl)));
    const char *log = th_tmp("tpl-work.log");
    char args[1024];
    snprintf(args, sizeof args, "-m '%s' --max-body 24000000 --template-time 700 --template-budget 16", model);
    pid_t pid = ts_start(args, log, &g_port);
    REQUIRE_VOID(pid > 0);
    /* a 1 MB message scanned 200,000 times: the work limit (a fast scan: no candidate) */
    char *req = big_request((size_t)1 << 20, false);
    double t0 = secs();
    int code = post("/v1/chat/completions", req);
    double dt = secs() - t0;
    CHECK(code == 400 && strstr(ts_body, "work limit"));
    if (dt > 10.0) TH_FAIL("the work limit took %.1f s", dt);
    printf("work: %d in %.2f s: %.300s\n", code, dt, ts_body);
    free(req);
    /* a slow scan, under the work limit: --template-time */
    t0 = secs();
    code = post("/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"spin\"}], \"max_tokens\": 1}");
    dt = secs() - t0;
    CHECK(code == 400 && strstr(ts_body, "time limit") && strstr(ts_body, "--template-time"));
    if (dt > 5.0) TH_FAIL("the time limit took %.1f s", dt);
    printf("time: %d in %.2f s: %.300s\n", code, dt, ts_body);
    /* an 18 MB message does not fit the 16 MiB shared budget: 503 */
    req = big_request((size_t)18 << 20, false);
    memcpy(strstr(req, "aaaa"), "short", 5); /* no loop: only the copy of the message */
    code = post("/v1/chat/completions", req);
    CHECK(code == 503 && strstr(ts_body, "--template-budget"));
    printf("budget: %d: %.300s\n", code, ts_body);
    free(req);
    /* a normal request is served */
    code = post("/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"hello\"}], \"max_tokens\": 1}");
    CHECK(code == 200);
    /* 4: a client resets its connection while its render runs: cancelled */
    uint64_t before = metric("pagekv_client_disconnects_total");
    req = big_request((size_t)1 << 20, true); /* a slow scan: the render runs until --template-time */
    int fd = send_raw(req);
    REQUIRE_VOID(fd >= 0);
    ts_sleep_ms(200); /* the render is under way (700 ms until its time limit) */
    struct linger lg = {1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    close(fd); /* a reset */
    uint64_t after = before;
    for (int i = 0; i < 50 && after == before; i++) {
        ts_sleep_ms(100);
        after = metric("pagekv_client_disconnects_total");
    }
    CHECK(before != (uint64_t)-1 && after == before + 1);
    /* 5: SIGTERM while a render runs: the server drains it and exits 0 within
     * the documented 60 s (a render is bounded by --template-time, and one still
     * running after the drain is cancelled) */
    fd = send_raw(req);
    REQUIRE_VOID(fd >= 0);
    ts_sleep_ms(200);
    double t1 = secs();
    CHECK_INT(ts_stop(pid, SIGTERM), 0);
    double stop_s = secs() - t1;
    CHECK(stop_s < 10.0);
    printf("SIGTERM during a render: stopped in %.2f s\n", stop_s);
    close(fd);
    free(req);
    unlink(model);
}

int main(void) {
    test_hostile_template();
    test_sigterm_startup();
    test_render_bounds();
    return th_done();
}
#endif
