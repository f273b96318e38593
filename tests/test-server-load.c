// labels: server timeout=300
/* Load and faults against pagekv serve, driven by tests/server/load.cjs (node):
 * 64 concurrent streaming clients each equal to the request alone, pages back
 * at baseline, 20 mid-stream disconnects, slowloris, oversized bodies and
 * headers, 500 malformed requests; then the tree-of-thought example client
 * (tools/tree-of-thought.cjs: fork 2 ways 3 levels deep, every leaf equal to a
 * replay). The server must still answer /health and exit 0 on SIGTERM.
 * Skipped (exit 77) without node. */
#include "server-testlib.h"

#ifndef PKV_HAVE_SERVER
int main(void) { return th_skip("pagekv was built without the server (libmicrohttpd-dev, libjansson-dev)"); }
#else
int main(void) {
    const char *src = getenv("PKV_SOURCE_DIR");
    if (!src) return th_skip("PKV_SOURCE_DIR not set (run through ctest)");
    if (system("node --version >/dev/null 2>&1") != 0) return th_skip("node is not installed");
    char model[512], log[512], args[1024], cmd[2048];
    snprintf(model, sizeof model, "%s", th_tmp("load.gguf"));
    snprintf(log, sizeof log, "%s", th_tmp("load-serve.log"));
    REQUIRE(th_cli("", true, "mkmodel -o '%s'", model) == 0);
    static const char *const backends[1] = {""}; /* the serving engine (--simple was retired) */
    for (int b = 0; b < 1; b++) {
        snprintf(args, sizeof args, "-m '%s' -c 4096 --kv-pages 2048 --parallel 16 --timeout 2 --max-conns 200 --queue 128 %s", model, backends[b]);
        int port;
        pid_t pid = ts_start(args, log, &port);
        REQUIRE(pid > 0);
        snprintf(cmd, sizeof cmd, "cd '%s' && timeout 200 node tests/server/load.cjs %d 2", src, port);
        int rc = system(cmd);
        CHECK_INT(WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, 0);
        snprintf(cmd, sizeof cmd, "cd '%s' && timeout 100 node tools/tree-of-thought.cjs --port %d --check >/dev/null", src, port);
        rc = system(cmd);
        CHECK_INT(WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, 0);
        CHECK_INT(ts_http(port, "/health"), 200);
        CHECK_INT(ts_http(port, "/metrics"), 200);
        CHECK(strstr(ts_body, "\npagekv_contexts 0\n") != NULL);
        CHECK(strstr(ts_body, "\npagekv_kv_pages_used 0\n") != NULL);
        CHECK_INT(ts_stop(pid, SIGTERM), 0);
    }
    return th_done();
}
#endif
