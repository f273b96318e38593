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
    static const char *const mods[] = {"@anthropic-ai/sdk", NULL};
    const char *src, *dir;
    int ready = ts_node_ready(mods, "the Anthropic client is", &src, &dir);
    if (ready >= 0) return ready;
    char model[512], log[512], args[1024];
    snprintf(model, sizeof model, "%s", th_tmp("anth.gguf"));
    snprintf(log, sizeof log, "%s", th_tmp("anth-serve.log"));
    REQUIRE(th_cli("", true, "mkmodel --no-template -o '%s'", model) == 0);
    snprintf(args, sizeof args, "-m '%s' -c 2048 --chat-template '%s/tests/templates/Qwen-Qwen3-0.6B.jinja' --api-key test-key "
                                "--alias tiny", model, src);
    int port;
    pid_t pid = ts_start(args, log, &port);
    REQUIRE(pid > 0);
    CHECK_INT(ts_node_run(src, dir, "anthropic-client.cjs", port, 120), 0);
    CHECK_INT(ts_stop(pid, SIGTERM), 0);
    return th_done();
}
#endif
