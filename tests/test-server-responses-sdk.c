// labels: server timeout=300
/* The official `openai` npm client's Responses API (client.responses.*) against
 * pagekv serve, with chatml and with Qwen3's template (a tool loop whose turns the
 * template renders otherwise, continued from the stored tokens): see
 * tests/server/openai-responses.cjs for what it checks. The
 * client is the one pinned in tests/package.json, installed with `npm ci` into
 * the build folder; without node/npm, or when the npm registry cannot be
 * reached, the test is skipped (exit 77), never passed. */
#include "server-testlib.h"

#ifndef PKV_HAVE_SERVER
int main(void) { return th_skip("pagekv was built without the server (libmicrohttpd-dev, libjansson-dev)"); }
#else

int main(void) {
    static const char *const mods[] = {"openai", NULL};
    const char *src, *dir;
    int ready = ts_node_ready(mods, "the openai client is", &src, &dir);
    if (ready >= 0) return ready;
    char model[512], log[512], args[2048];
    snprintf(model, sizeof model, "%s", th_tmp("resp-sdk.gguf"));
    snprintf(log, sizeof log, "%s", th_tmp("resp-sdk-serve.log"));
    REQUIRE(th_cli("", true, "mkmodel --vocab 2048 --seed 5 -o '%s'", model) == 0);
    /* chatml, then Qwen3's own template (which renders the tools in a system turn, a
     * tool call otherwise than the model wrote it, and drops earlier reasoning): the
     * tool loop's follow-ups are continued from the stored tokens on both */
    static const char *const tpl[] = {"chatml", "%s/tests/templates/Qwen-Qwen3-0.6B.jinja"};
    for (int t = 0; t < 2; t++) {
        char tp[700];
        snprintf(tp, sizeof tp, tpl[t], src);
        snprintf(args, sizeof args, "-m '%s' -c %d --chat-template '%s' --api-key test-key --alias tiny", model,
                 t ? 2048 : 512, tp);
        int port;
        pid_t pid = ts_start(args, log, &port);
        REQUIRE(pid > 0);
        CHECK_INT(ts_node_run(src, dir, "openai-responses.cjs", port, 120), 0);
        CHECK_INT(ts_http(port, "/health"), 200);
        CHECK_INT(ts_stop(pid, SIGTERM), 0);
    }
    return th_done();
}
#endif
