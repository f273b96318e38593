// labels: server timeout=300
/* Structured output and forced tool calls through the official `openai` client with
 * zod 4, the Vercel AI SDK and LangChain JS (all pinned in tests/package.json,
 * installed by `npm ci` into the build folder) against pagekv serve with a real chat
 * template (Qwen2.5's, which renders tools): see tests/server/sdk-schema.cjs. zod's
 * integers, formats, patterns, tuples and records are constrained, and every output
 * is valid against the schema each SDK sent (ajv). Without node/npm, or when the npm
 * registry cannot be reached, the test is skipped (exit 77), never passed. */
#include "server-testlib.h"

#ifndef PKV_HAVE_SERVER
int main(void) { return th_skip("pagekv was built without the server (libmicrohttpd-dev, libjansson-dev)"); }
#else

int main(void) {
    static const char *const mods[] = {"openai", "zod", "ai", "@ai-sdk/openai-compatible", "@langchain/openai",
                                       "@langchain/core", "ajv", "ajv-formats", NULL};
    return ts_sdk_main(mods, "sdk-schema", "sdk-schema.cjs");
}
#endif
