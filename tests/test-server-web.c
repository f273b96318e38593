// labels: server timeout=300
/* The web page at / in a real browser: Debian's chromium, headless, driven by
 * playwright-core (pinned in tests/package.json, installed with `npm ci` into
 * the build folder) running tests/server/web.cjs against pagekv serve on
 * 127.0.0.1 (see that script for what it checks). Screenshots at desktop and
 * phone width go to build/tests/web/. Skipped (exit 77), never passed, without
 * chromium (/usr/bin/chromium, or PKV_CHROMIUM), node 20 or later, or when npm
 * cannot reach its registry. */
#include "server-testlib.h"

#ifndef PKV_HAVE_SERVER
int main(void) { return th_skip("pagekv was built without the server (libmicrohttpd-dev, libjansson-dev)"); }
#else

int main(void) {
    const char *src = getenv("PKV_SOURCE_DIR"), *dir = getenv("PKV_NODE_DIR");
    const char *chromium = getenv("PKV_CHROMIUM") ? getenv("PKV_CHROMIUM") : "/usr/bin/chromium";
    if (!src || !dir) return th_skip("PKV_SOURCE_DIR/PKV_NODE_DIR not set (run through ctest)");
    if (access(chromium, X_OK) != 0) return th_skip("chromium is not installed (apt-get install chromium)");
    if (system("node -e 'process.exit(+process.versions.node.split(\".\")[0] >= 20 ? 0 : 1)' >/dev/null 2>&1") != 0)
        return th_skip("node 20 or later is not installed (playwright-core needs it)");
    static const char *const mods[] = {"playwright-core", NULL};
    if (!ts_npm_install(src, dir, mods)) return th_skip("npm ci failed (is the npm registry reachable?): playwright-core is not installed");
    char model[512], log[512], args[1024], out[1024];
    snprintf(model, sizeof model, "%s", th_tmp("web.gguf"));
    snprintf(log, sizeof log, "%s", th_tmp("web-serve.log"));
    snprintf(out, sizeof out, "%s/../web", dir); /* build/tests/web */
    /* a model slow enough (about 150 tokens/s on 2 cores) that a generation of
     * 3000 tokens is still running when the page stops it */
    REQUIRE(th_cli("", true, "mkmodel --dim 384 --layers 4 --ffn 1024 --heads 6 --kv-heads 2 --type f32 -o '%s'", model) == 0);
    snprintf(args, sizeof args, "-m '%s' -c 4096 --kv-pages 512 --chat-template chatml --context-swap 0 --alias web-test",
             model);
    int port;
    pid_t pid = ts_start(args, log, &port);
    REQUIRE(pid > 0);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "cd '%s' && PKV_NODE_DIR='%s' timeout 200 node tests/server/web.cjs %d '%s' '%s'", src, dir,
             port, out, chromium);
    int rc = system(cmd);
    CHECK_INT(WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, 0);
    fprintf(stderr, "screenshots: %s/web-desktop.png, %s/web-phone.png\n", out, out);
    CHECK_INT(ts_http(port, "/health"), 200);
    CHECK_INT(ts_stop(pid, SIGTERM), 0);
    return th_done();
}
#endif
