// labels: server timeout=300
/* The Responses API (POST /v1/responses) through the official `openai` client
 * (responses.parse with zodTextFormat, zodResponsesFunction tools), the Vercel AI
 * SDK's Responses provider (@ai-sdk/openai) and LangChain JS with useResponsesApi,
 * all with zod 4 schemas, against pagekv serve with a real chat template (Qwen2.5's,
 * which renders tools): see tests/server/sdk-responses.cjs. Every output is valid
 * against the schema each SDK sent (ajv) and parses with the SDK's own zod parse.
 * The SDKs are the ones pinned in tests/package.json, installed by `npm ci` into the
 * build folder; without node/npm, or when the npm registry cannot be reached, the
 * test is skipped (exit 77), never passed. */
#include "server-testlib.h"

#ifndef PKV_HAVE_SERVER
int main(void) { return th_skip("pagekv was built without the server (libmicrohttpd-dev, libjansson-dev)"); }
#else

int main(void) {
    static const char *const mods[] = {"openai", "zod", "ai", "@ai-sdk/openai", "@langchain/openai", "@langchain/core",
                                       "ajv", "ajv-formats", NULL};
    const char *src, *dir;
    int ready = ts_node_ready(mods, "the SDKs are", &src, &dir);
    if (ready >= 0) return ready;
    char model[512], log[512], args[1024];
    snprintf(model, sizeof model, "%s", th_tmp("sdk-responses.gguf"));
    snprintf(log, sizeof log, "%s", th_tmp("sdk-responses-serve.log"));
    /* a context long enough for the tool schemas the template renders into the prompt */
    REQUIRE(th_cli("", true, "mkmodel --ctx 8192 -o '%s'", model) == 0);
    snprintf(args, sizeof args, "-m '%s' -c 8192 --chat-template '%s/tests/templates/Qwen-Qwen2.5-7B-Instruct.jinja' "
                                "--api-key test-key --alias tiny", model, src);
    int port;
    pid_t pid = ts_start(args, log, &port);
    REQUIRE(pid > 0);
    CHECK_INT(ts_node_run(src, dir, "sdk-responses.cjs", port, 150), 0);
    CHECK_INT(ts_http(port, "/health"), 200);
    CHECK_INT(ts_stop(pid, SIGTERM), 0);
    return th_done();
}
#endif
