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
    return ts_sdk_main(mods, "sdk-responses", "sdk-responses.cjs");
}
#endif
