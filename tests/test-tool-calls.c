// labels: unit server
/* Reasoning and tool calls parsed from each model family's output format
 * (src/chat/tool-calls.c), whole and streamed: the text fed in random chunks,
 * the deltas concatenated must equal the whole parse. */
#include "testhelp.h"

#ifndef PKV_HAVE_SERVER
int main(void) { return th_skip("pagekv was built without the server (libmicrohttpd-dev, libjansson-dev)"); }
#else
#include "chat/tool-calls.c"

#define DS_B "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DS_E "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DS_CB "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DS_CE "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DS_S "<\xef\xbd\x9ctool\xe2\x96\x81sep\xef\xbd\x9c>"

typedef struct tcase {
    const char *what;
    pkv_tc_opts o;
    const char *text;
    const char *reasoning, *content;
    int n_calls;
    const char *name[3], *args[3];
} tcase;

#define HERMES {PKV_TC_HERMES, true, false, true}
static const tcase k_cases[] = {
    {"hermes one call", HERMES, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
     "", "", 1, {"get_weather"}, {"{\"city\": \"Paris\"}"}},
    {"hermes text then two calls", HERMES,
     "Let me check.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"arguments\": {\"x\": [1, 2]}, \"name\": \"b\"}\n</tool_call>\n",
     "", "Let me check.\n", 2, {"a", "b"}, {"{}", "{\"x\": [1, 2]}"}},
    {"qwen3 think and call", HERMES,
     "<think>\nThe user wants weather.\n</think>\n\n<tool_call>\n{\"name\": \"w\", \"arguments\": {\"q\": \"a \\\"b\\\" </tool_call>\"}}\n</tool_call>",
     "The user wants weather.\n", "", 1, {"w"}, {"{\"q\": \"a \\\"b\\\" </tool_call>\"}"}},
    {"think opened by the prompt", {PKV_TC_HERMES, true, true, true}, "reasoning here</think>\n\nThe answer.",
     "reasoning here", "The answer.", 0, {0}, {0}},
    {"think only, no tools", {PKV_TC_NONE, true, false, false}, "<think>hmm</think>Hello <tool_call>", "hmm",
     "Hello <tool_call>", 0, {0}, {0}},
    {"arguments as a string", HERMES, "<tool_call>{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"}</tool_call>", "", "", 1,
     {"f"}, {"{\"a\":1}"}},
    {"qwen3.5 xml form", HERMES,
     "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
     "", "", 1, {"get_weather"}, {"{\"city\": \"Paris\", \"days\": 3}"}},
    {"not a call", HERMES, "see <tool_call> here", "", "see <tool_call> here", 0, {0}, {0}},
    {"llama3 json", {PKV_TC_LLAMA3, false, false, true},
     "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", "", "", 1, {"get_weather"},
     {"{\"city\": \"Paris\"}"}},
    {"llama3 text", {PKV_TC_LLAMA3, false, false, true}, "Hello {there}", "", "Hello {there}", 0, {0}, {0}},
    {"llama3 python tag json", {PKV_TC_LLAMA3, false, false, true},
     "<|python_tag|>{\"name\": \"brave_search\", \"parameters\": {\"query\": \"x\"}}", "", "", 1, {"brave_search"},
     {"{\"query\": \"x\"}"}},
    {"llama3 python tag code", {PKV_TC_LLAMA3, false, false, true}, "<|python_tag|>print(\"hi\")", "", "", 1, {"python"},
     {"{\"code\":\"print(\\\"hi\\\")\"}"}},
    {"mistral array", {PKV_TC_MISTRAL, false, false, true},
     "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"x\": 1}}, {\"name\": \"b\", \"arguments\": {}}]", "", "", 2,
     {"a", "b"}, {"{\"x\": 1}", "{}"}},
    {"mistral name[ARGS]", {PKV_TC_MISTRAL, false, false, true},
     "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]b[ARGS]{}", "", "", 2, {"get_weather", "b"},
     {"{\"city\": \"Paris\"}", "{}"}},
    {"gpt-oss analysis, call", {PKV_TC_GPT_OSS, false, false, true},
     "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather "
     "<|constrain|>json<|message|>{\"city\":\"Paris\"}",
     "Need weather.", "", 1, {"get_weather"}, {"{\"city\":\"Paris\"}"}},
    {"gpt-oss final", {PKV_TC_GPT_OSS, false, false, true},
     "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Hi there.", "Think.",
     "Hi there.", 0, {0}, {0}},
    {"deepseek r1", {PKV_TC_DEEPSEEK, true, false, true},
     "<think>ok</think>\n\n" DS_B DS_CB "function" DS_S "get_weather\n```json\n{\"city\": \"Paris\"}\n```" DS_CE DS_E, "ok", "",
     1, {"get_weather"}, {"{\"city\": \"Paris\"}"}},
    {"deepseek v3.1", {PKV_TC_DEEPSEEK, false, false, true},
     "Sure." DS_B DS_CB "a" DS_S "{\"x\": 1}" DS_CE DS_CB "b" DS_S "{}" DS_CE DS_E, "", "Sure.", 2, {"a", "b"},
     {"{\"x\": 1}", "{}"}},
    {"constrained json", {PKV_TC_JSON, false, false, true}, "{\"name\":\"f\",\"arguments\":{\"a\":[1,{\"b\":\"}\"}]}}", "",
     "", 1, {"f"}, {"{\"a\":[1,{\"b\":\"}\"}]}"}},
    /* fuzz-tool-calls found leaks of decoded string arguments in both (ASan's run checks them) */
    {"arguments before the function wrapper", {PKV_TC_LLAMA3, false, false, true},
     "{\"arguments\":\"{}\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"}}", "", "", 1, {"f"},
     {"{\"a\":1}"}},
    {"string arguments, no name, broken", {PKV_TC_LLAMA3, false, false, true}, "{\"arguments\":\"{}\", 5}", "",
     "{\"arguments\":\"{}\", 5}", 0, {0}, {0}},
    {"calls off", {PKV_TC_HERMES, false, false, false}, "<tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call>", "",
     "<tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call>", 0, {0}, {0}},
};

/* Stream text in random pieces; the deltas, concatenated, must be the whole parse. */
static void stream_check(const tcase *c, const pkv_tc_result *whole, unsigned seed) {
    pkv_tc_stream *s = pkv_tc_stream_new(&c->o);
    REQUIRE_VOID(s);
    size_t n = strlen(c->text), at = 0;
    char reasoning[1024] = "", content[1024] = "", names[4][600] = {{0}}, args[4][1024] = {{0}};
    int calls = 0;
    srand(seed);
    while (1) {
        bool final = at >= n;
        const pkv_tc_delta *d;
        int nd;
        REQUIRE_VOID(pkv_tc_stream_update(s, c->text, at < n ? at : n, final, &d, &nd));
        for (int i = 0; i < nd; i++) {
            char *dst = d[i].kind == PKV_TC_D_REASONING ? reasoning
                        : d[i].kind == PKV_TC_D_CONTENT ? content
                        : d[i].kind == PKV_TC_D_ARGS    ? args[d[i].index & 3]
                                                        : NULL;
            if (d[i].kind == PKV_TC_D_CALL) {
                CHECK_INT(d[i].index, calls);
                snprintf(names[calls & 3], sizeof names[0], "%.*s", (int)d[i].len, d[i].text);
                calls++;
                continue;
            }
            if (d[i].kind == PKV_TC_D_ARGS) CHECK(d[i].index < calls);
            strncat(dst, d[i].text, d[i].len);
        }
        if (final) break;
        at += 1 + (size_t)(rand() % 7);
    }
    if (strcmp(reasoning, whole->reasoning)) TH_FAIL("%s: streamed reasoning '%s' != '%s'", c->what, reasoning, whole->reasoning);
    if (strcmp(content, whole->content)) TH_FAIL("%s: streamed content '%s' != '%s'", c->what, content, whole->content);
    CHECK_INT(calls, whole->n_calls);
    for (int i = 0; i < calls && i < whole->n_calls && i < 4; i++) {
        if (strcmp(names[i], whole->calls[i].name)) TH_FAIL("%s: call %d name '%s'", c->what, i, names[i]);
        if (strcmp(args[i], whole->calls[i].args)) TH_FAIL("%s: call %d args '%s' != '%s'", c->what, i, args[i], whole->calls[i].args);
    }
    pkv_tc_stream_free(s);
}

/* Random texts made of each format's markers and JSON pieces: the streamed
 * deltas still concatenate to the whole parse, whatever the model writes. */
static void random_texts(void) {
    static const char *const frag[] = {
        "<tool_call>", "</tool_call>", "<think>", "</think>", "{", "}", "[", "]", "\"name\"", "\"arguments\"",
        "\"parameters\"", ": ", ", ", "\"f\"", "\"a b\"", "1", "true", " ", "\n", "text", "<|python_tag|>",
        "[TOOL_CALLS]", "[ARGS]", "<|channel|>", "analysis", "final", "commentary to=functions.g ", "<|message|>", "<|end|>",
        "<|start|>assistant", "<|call|>", DS_B, DS_CB, DS_S, DS_CE, DS_E, "function", "```json\n", "```", "<function=h>",
        "<parameter=k>", "</parameter>", "</function>", "\"", "\\", "<", "|"};
    static const pkv_tc_format fmts[] = {PKV_TC_NONE, PKV_TC_HERMES, PKV_TC_LLAMA3, PKV_TC_MISTRAL,
                                         PKV_TC_GPT_OSS, PKV_TC_DEEPSEEK, PKV_TC_JSON};
    srand(12345);
    char text[600];
    for (int it = 0; it < 6000; it++) {
        text[0] = 0;
        int nf = 1 + rand() % 24;
        for (int k = 0; k < nf; k++) {
            const char *f = frag[rand() % (int)(sizeof frag / sizeof frag[0])];
            if (strlen(text) + strlen(f) < sizeof text) strcat(text, f);
        }
        tcase c = {"random", {fmts[it % 7], (it / 7) % 2 == 0, (it / 14) % 3 == 0, true}, text, "", "", 0, {0}, {0}};
        pkv_tc_result r;
        REQUIRE_VOID(pkv_tc_parse(&c.o, text, strlen(text), false, &r));
        int f0 = th_failures;
        stream_check(&c, &r, (unsigned)it);
        if (th_failures > f0) fprintf(stderr, "  format %s think %d in_think %d, text: %s\n", pkv_tc_name(c.o.fmt), c.o.think, c.o.in_think, text);
        pkv_tc_result_free(&r);
        if (th_failures > 20) return;
    }
}

int main(void) {
    random_texts();
    for (size_t k = 0; k < sizeof k_cases / sizeof k_cases[0]; k++) {
        const tcase *c = &k_cases[k];
        pkv_tc_result r;
        REQUIRE(pkv_tc_parse(&c->o, c->text, strlen(c->text), false, &r));
        if (strcmp(r.reasoning, c->reasoning)) TH_FAIL("%s: reasoning '%s' != '%s'", c->what, r.reasoning, c->reasoning);
        if (strcmp(r.content, c->content)) TH_FAIL("%s: content '%s' != '%s'", c->what, r.content, c->content);
        if (r.n_calls != c->n_calls) TH_FAIL("%s: %d calls, want %d", c->what, r.n_calls, c->n_calls);
        for (int i = 0; i < r.n_calls && i < c->n_calls; i++) {
            if (strcmp(r.calls[i].name, c->name[i])) TH_FAIL("%s: call %d name '%s'", c->what, i, r.calls[i].name);
            if (strcmp(r.calls[i].args, c->args[i])) TH_FAIL("%s: call %d args '%s' != '%s'", c->what, i, r.calls[i].args, c->args[i]);
            CHECK(r.calls[i].complete);
        }
        for (unsigned seed = 1; seed <= 40; seed++) stream_check(c, &r, seed);
        pkv_tc_result_free(&r);
    }
    { /* fuzz-tool-calls found it: a JSON call broken after its name, a python tag
       * later. A stream announces "f" before the tag arrives; the whole parse must
       * keep that call (incomplete), not switch to the tag's python call. */
        const tcase c = {"llama3 json broken after the name, python tag later", {PKV_TC_LLAMA3, false, false, true},
                         "{\"name\": \"f\" : 1} <|python_tag|>print(1)", "", "", 1, {"f"}, {""}};
        pkv_tc_result r;
        REQUIRE(pkv_tc_parse(&c.o, c.text, strlen(c.text), false, &r));
        CHECK_INT(r.n_calls, 1);
        if (r.n_calls == 1) {
            CHECK(!strcmp(r.calls[0].name, "f"));
            CHECK(!r.calls[0].complete);
        }
        CHECK(!strcmp(r.content, ""));
        for (unsigned seed = 1; seed <= 40; seed++) stream_check(&c, &r, seed);
        pkv_tc_result_free(&r);
    }
    /* detection from the vendors' templates */
    static const struct {
        const char *file;
        pkv_tc_format f;
        bool think;
    } det[] = {
        {"Qwen-Qwen3-0.6B", PKV_TC_HERMES, true},
        {"Qwen-Qwen2.5-7B-Instruct", PKV_TC_HERMES, false},
        {"meta-llama-Llama-3.1-8B-Instruct", PKV_TC_LLAMA3, false},
        {"mistralai-Mistral-Nemo-Instruct-2407", PKV_TC_MISTRAL, false},
        {"openai-gpt-oss-120b", PKV_TC_GPT_OSS, false},
        {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use", PKV_TC_HERMES, false},
        {"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", PKV_TC_DEEPSEEK, true},
        {"google-gemma-2-2b-it", PKV_TC_NONE, false},
    };
    for (size_t k = 0; k < sizeof det / sizeof det[0]; k++) {
        char path[512];
        snprintf(path, sizeof path, "%s/tests/templates/%s.jinja", PKV_TEST_SRC, det[k].file);
        FILE *f = fopen(path, "rb");
        if (!f) {
            TH_FAIL("cannot open %s", path);
            continue;
        }
        static char buf[1 << 20];
        size_t n = fread(buf, 1, sizeof buf, f);
        fclose(f);
        bool think = false;
        pkv_tc_format got = pkv_tc_detect(buf, n, &think);
        if (got != det[k].f) TH_FAIL("%s: detected %s, want %s", det[k].file, pkv_tc_name(got), pkv_tc_name(det[k].f));
        if (think != det[k].think) TH_FAIL("%s: think %d", det[k].file, think);
    }
    /* a length cut inside a call: the call so far, marked incomplete */
    pkv_tc_opts ho = HERMES;
    pkv_tc_result r;
    const char *cut = "<tool_call>{\"name\":\"f\",\"arguments\":{\"a\":1";
    REQUIRE(pkv_tc_parse(&ho, cut, strlen(cut), false, &r));
    CHECK_INT(r.n_calls, 1);
    if (r.n_calls == 1) CHECK(!r.calls[0].complete && !strcmp(r.calls[0].args, "{\"a\":1"));
    pkv_tc_result_free(&r);
    return th_done();
}
#endif
