// labels: server timeout=300
/* The official `@anthropic-ai/sdk` npm client (pinned in tests/package.json,
 * installed with `npm ci` into the build folder) against pagekv serve's
 * /v1/messages: see tests/server/anthropic-client.cjs for what it checks.
 * Without node/npm, or when the npm registry cannot be reached, the test is
 * skipped (exit 77), never passed. */
#include "server-testlib.h"

#ifndef PKV_HAVE_SERVER
int main(void) { return th_skip("pagekv was built without the server (libmicrohttpd-dev, libjansson-dev)"); }
#else

int main(void) {
    const char *src = getenv("PKV_SOURCE_DIR"), *dir = getenv("PKV_NODE_DIR");
    if (!src || !dir) return th_skip("PKV_SOURCE_DIR/PKV_NODE_DIR not set (run through ctest)");
    if (system("node --version >/dev/null 2>&1") != 0 || system("npm --version >/dev/null 2>&1") != 0)
        return th_skip("node and npm are not installed");
    static const char *const mods[] = {"@anthropic-ai/sdk", NULL};
    if (!ts_npm_install(src, dir, mods))
        return th_skip("npm ci failed (is the npm registry reachable?): the Anthropic client is not installed");
    char model[512], log[512], args[1024];
    snprintf(model, sizeof model, "%s", th_tmp("anth.gguf"));
    snprintf(log, sizeof log, "%s", th_tmp("anth-serve.log"));
    REQUIRE(th_cli("", true, "mkmodel --no-template -o '%s'", model) == 0);
    snprintf(args, sizeof args, "-m '%s' -c 2048 --chat-template '%s/tests/templates/Qwen-Qwen3-0.6B.jinja' --api-key test-key "
                                "--alias tiny", model, src);
    int port;
    pid_t pid = ts_start(args, log, &port);
    REQUIRE(pid > 0);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "cd '%s' && PKV_NODE_DIR='%s' timeout 120 node tests/server/anthropic-client.cjs %d", src, dir, port);
    int rc = system(cmd);
    CHECK_INT(WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, 0);
    CHECK_INT(ts_stop(pid, SIGTERM), 0);
    return th_done();
}
#endif
