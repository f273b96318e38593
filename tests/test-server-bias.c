// labels: server timeout=300
/* logit_bias on pagekv serve (/v1/completions, /v1/chat/completions, the contexts
 * API) in its three forms: OpenAI's {"token id": bias}, llama-server's string keys
 * (every token of the string's tokenization, without special tokens, gets the
 * bias) and its list form [[id or string, bias or false], ...] (false bans); -100
 * and false keep a token out, +100 forces it, with a grammar too (the bias comes
 * before its mask); the 400s name the key or element.
 * Then `serve --spec ngram`: greedy answers equal those of a server without
 * drafts, and its /metrics count proposals and kept ones. */
#include "server-testlib.h"

#ifndef PKV_HAVE_SERVER
int main(void) { return th_skip("pagekv was built without the server (libmicrohttpd-dev, libjansson-dev)"); }
#else
#include "server-json.h"

static int g_port;

static int post(const char *path, const char *json, json_t **out) {
    char f[512];
    snprintf(f, sizeof f, "%s", ts_file("body.json", json, strlen(json)));
    int code = ts_http(g_port, "-H 'Content-Type: application/json' --data-binary @%s %s", f, path);
    if (out) *out = json_loads(ts_body, 0, NULL);
    return code;
}

/* The generated token ids of a greedy /v1/completions of "prompt" with extra fields
 * `rest` (",\"logit_bias\": ..."), into ids[<= 16]; the count, -1 on a failure. */
static int complete(const char *prompt, int max_tokens, const char *rest, int32_t *ids) {
    char body[4096];
    snprintf(body, sizeof body,
             "{\"prompt\": \"%s\", \"max_tokens\": %d, \"temperature\": 0, \"ignore_eos\": %s, "
             "\"return_token_ids\": true%s}",
             prompt, max_tokens, strstr(rest, "grammar") ? "false" : "true", rest); /* (a grammar decides the end) */
    json_t *r = NULL;
    int code = post("/v1/completions", body, &r);
    json_t *t = jget(r, "choices.0.token_ids");
    int n = -1;
    if (code == 200 && json_is_array(t) && json_array_size(t) <= 16) {
        n = (int)json_array_size(t);
        for (int i = 0; i < n; i++) ids[i] = (int32_t)json_integer_value(json_array_get(t, (size_t)i));
    } else {
        TH_FAIL("completion %s: HTTP %d: %.300s", body, code, ts_body);
    }
    json_decref(r);
    return n;
}

/* The ids of text (no special tokens), into ids[<= 16]; the count. */
static int tokenize(const char *text, int32_t *ids) {
    char body[512];
    snprintf(body, sizeof body, "{\"content\": \"%s\", \"parse_special\": false}", text);
    json_t *r = NULL;
    CHECK_INT(post("/tokenize", body, &r), 200);
    json_t *t = jget(r, "tokens");
    int n = json_is_array(t) ? (int)json_array_size(t) : 0;
    if (n > 16) n = 16;
    for (int i = 0; i < n; i++) ids[i] = (int32_t)json_integer_value(json_array_get(t, (size_t)i));
    json_decref(r);
    return n;
}

static bool in(int32_t t, const int32_t *set, int n) {
    for (int i = 0; i < n; i++)
        if (set[i] == t) return true;
    return false;
}

static void expect_400(const char *path, const char *body, const char *want) {
    json_t *r = NULL;
    CHECK_INT(post(path, body, &r), 400);
    const char *m = json_string_value(jget(r, "error.message"));
    th_checks++;
    if (!m || !strstr(m, want)) TH_FAIL("%s: 400 message '%s' lacks '%s'", body, m ? m : "(none)", want);
    json_decref(r);
}

static void test_forms(void) {
    int32_t base[16], got[16], word[16], rest_ids[16];
    char rest[512];
    const char *prompt = "The quick brown fox";
    int n = complete(prompt, 8, "", base);
    REQUIRE_VOID(n == 8);
    /* ids: -100 and false keep the first token out; 0 changes nothing */
    snprintf(rest, sizeof rest, ", \"logit_bias\": {\"%d\": -100}", base[0]);
    if (complete(prompt, 8, rest, got) == 8) CHECK(got[0] != base[0]);
    snprintf(rest, sizeof rest, ", \"logit_bias\": [[%d, false], [%d, false]]", base[0], base[1]);
    if (complete(prompt, 8, rest, got) == 8)
        for (int i = 0; i < 8; i++) CHECK(got[i] != base[0] && got[i] != base[1]);
    snprintf(rest, sizeof rest, ", \"logit_bias\": {\"%d\": 0}", base[0]);
    if (complete(prompt, 8, rest, got) == 8) CHECK_MEM(got, base, 8 * sizeof *got);
    /* +100 forces */
    if (complete(prompt, 6, ", \"logit_bias\": {\"123\": 100}", got) == 6)
        for (int i = 0; i < 6; i++) CHECK_INT(got[i], 123);
    /* a string key: every token of its tokenization gets the bias */
    int nw = tokenize("hello world", word);
    REQUIRE_VOID(nw >= 2);
    if (complete(prompt, 8, ", \"logit_bias\": {\"hello world\": 100}", got) == 8)
        for (int i = 0; i < 8; i++) CHECK(in(got[i], word, nw));
    if (complete(prompt, 8, ", \"logit_bias\": [[\"hello world\", 100]]", got) == 8)
        for (int i = 0; i < 8; i++) CHECK(in(got[i], word, nw));
    /* the string's tokens banned, after forcing them and one more: only that one is left */
    snprintf(rest, sizeof rest, ", \"logit_bias\": [[\"hello world\", 100], [%d, 100], [\"hello world\", false]]",
             base[3]);
    if (complete(prompt, 5, rest, got) == 5)
        for (int i = 0; i < 5; i++) CHECK_INT(got[i], base[3]);
    /* entries add up: +60 and +40 on one id force it like +100 */
    int nr = tokenize("brown", rest_ids);
    REQUIRE_VOID(nr >= 1);
    snprintf(rest, sizeof rest, ", \"logit_bias\": {\"%d\": 60, \"brown\": 40}", rest_ids[0]);
    if (nr == 1 && complete(prompt, 4, rest, got) == 4)
        for (int i = 0; i < 4; i++) CHECK_INT(got[i], rest_ids[0]);

    /* with a grammar: the bias applies before its mask; banning all it allows is a 400 */
    int32_t b1[16];
    REQUIRE_VOID(tokenize("b", b1) == 1);
    if (complete(prompt, 4, ", \"grammar\": \"root ::= [a-c]+\", \"logit_bias\": {\"b\": 100}", got) == 4)
        for (int i = 0; i < 4; i++) CHECK_INT(got[i], b1[0]);
    expect_400("/v1/completions",
               "{\"prompt\": \"x\", \"max_tokens\": 3, \"grammar\": \"root ::= \\\"q\\\"\", \"logit_bias\": {\"q\": false}}",
               "logit_bias bans every token the grammar allows here");

    /* chat: forced to the token of "a": the content is that token's text, repeated */
    int32_t a[16];
    REQUIRE_VOID(tokenize("a", a) == 1);
    char body[512];
    snprintf(body, sizeof body,
             "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"max_tokens\": 5, \"temperature\": 0.7, "
             "\"seed\": 3, \"logit_bias\": {\"%d\": 100}}",
             a[0]);
    json_t *r = NULL;
    CHECK_INT(post("/v1/chat/completions", body, &r), 200);
    const char *content = json_string_value(jget(r, "choices.0.message.content"));
    th_checks++;
    if (!content || strcmp(content, "aaaaa")) TH_FAIL("chat content '%s', want 'aaaaa'", content ? content : ts_body);
    json_decref(r);
    /* the contexts API takes it too */
    r = NULL;
    CHECK_INT(post("/v1/contexts", "{\"prompt\": \"Hello\"}", &r), 200);
    const char *cid = json_string_value(jget(r, "id"));
    if (cid) {
        char path[256];
        snprintf(path, sizeof path, "/v1/contexts/%s/generate", cid);
        snprintf(body, sizeof body, "{\"max_tokens\": 3, \"logit_bias\": {\"%d\": 100}}", a[0]);
        json_t *g = NULL;
        int code = post(path, body, &g);
        CHECK_INT(code, 200);
        const char *text = json_string_value(jget(g, "text"));
        th_checks++;
        if (!text || strcmp(text, "aaa")) TH_FAIL("context generation '%s', want 'aaa'", text ? text : ts_body);
        json_decref(g);
    } else {
        TH_FAIL("contexts: %.300s", ts_body);
    }
    json_decref(r);
}

static void test_errors(void) {
    const char *c = "/v1/completions";
    expect_400(c, "{\"prompt\": \"hi\", \"logit_bias\": {\"99999\": 1}}",
               "'logit_bias' key '99999': token id 99999 is outside the vocabulary [0, 512)");
    expect_400(c, "{\"prompt\": \"hi\", \"logit_bias\": {\"-1\": 1}}", "key '-1': token id -1 is outside");
    expect_400(c, "{\"prompt\": \"hi\", \"logit_bias\": {\"5\": 101}}",
               "'logit_bias' key '5': the bias must be a number in [-100, 100] or false");
    expect_400(c, "{\"prompt\": \"hi\", \"logit_bias\": {\"5\": true}}", "key '5': the bias must be");
    expect_400(c, "{\"prompt\": \"hi\", \"logit_bias\": {\"5\": \"1\"}}", "key '5': the bias must be");
    expect_400(c, "{\"prompt\": \"hi\", \"logit_bias\": {\"\": 1}}", "key '': the string has no tokens");
    expect_400(c, "{\"prompt\": \"hi\", \"logit_bias\": [[5]]}", "'logit_bias[0]' must be a pair");
    expect_400(c, "{\"prompt\": \"hi\", \"logit_bias\": [[5, 1], [null, 1]]}", "'logit_bias[1]' must be a pair");
    expect_400(c, "{\"prompt\": \"hi\", \"logit_bias\": [[5, -1e9]]}", "element 0: the bias must be");
    expect_400(c, "{\"prompt\": \"hi\", \"logit_bias\": [[700, 1]]}", "element 0: token id 700 is outside");
    expect_400(c, "{\"prompt\": \"hi\", \"logit_bias\": 5}", "'logit_bias' must be an object");
    expect_400("/v1/chat/completions",
               "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"logit_bias\": {\"x1\": 1, \"512\": 2}}",
               "key '512': token id 512 is outside");
    /* every token banned */
    size_t cap = 512 * 16 + 64, len = 0;
    char *b = malloc(cap);
    len += (size_t)snprintf(b + len, cap - len, "{\"prompt\": \"hi\", \"logit_bias\": {");
    for (int i = 0; i < 512; i++) len += (size_t)snprintf(b + len, cap - len, "%s\"%d\": false", i ? "," : "", i);
    snprintf(b + len, cap - len, "}}");
    expect_400(c, b, "'logit_bias' bans every token of the vocabulary (512)");
    free(b);
    /* null is no bias */
    json_t *r = NULL;
    CHECK_INT(post(c, "{\"prompt\": \"hi\", \"max_tokens\": 2, \"logit_bias\": null}", &r), 200);
    json_decref(r);
}

/* The same greedy requests on this server (plain) and on one with --spec ngram. */
static void test_ngram(const char *model, const char *log) {
    static const char *prompts[] = {
        "one two three four five one two three four five one two three four five one two",
        "The quick brown fox",
        "alpha beta gamma alpha beta gamma alpha beta gamma alpha",
    };
    enum { NP = 3 };
    int32_t plain[NP][16], spec[NP][16];
    int np[NP], ns[NP];
    for (int i = 0; i < NP; i++) np[i] = complete(prompts[i], 16, "", plain[i]);
    int plain_port = g_port;
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "-m '%s' -c 512 --parallel 4 --spec ngram --draft-max 6", model);
    pid_t pid = ts_start(cmd, log, &g_port);
    REQUIRE_VOID(pid > 0);
    for (int i = 0; i < NP; i++) {
        ns[i] = complete(prompts[i], 16, "", spec[i]);
        CHECK_INT(ns[i], np[i]);
        if (ns[i] == np[i] && np[i] > 0) CHECK_MEM(spec[i], plain[i], (size_t)np[i] * sizeof(int32_t));
    }
    /* a biased request with drafts: the ban holds */
    int32_t got[16];
    char rest[128];
    snprintf(rest, sizeof rest, ", \"logit_bias\": [[%d, false]]", plain[0][0]);
    if (complete(prompts[0], 16, rest, got) == 16)
        for (int i = 0; i < 16; i++) CHECK(got[i] != plain[0][0]);
    CHECK_INT(ts_http(g_port, "/metrics"), 200);
    unsigned long long proposed = 0, accepted = 0;
    const char *p = strstr(ts_body, "\npagekv_draft_proposed_tokens_total ");
    const char *a = strstr(ts_body, "\npagekv_draft_accepted_tokens_total ");
    if (p) proposed = strtoull(p + strlen("\npagekv_draft_proposed_tokens_total "), NULL, 10);
    if (a) accepted = strtoull(a + strlen("\npagekv_draft_accepted_tokens_total "), NULL, 10);
    fprintf(stderr, "  serve --spec ngram: proposed %llu, accepted %llu\n", proposed, accepted);
    CHECK(proposed > 0);
    CHECK(accepted > 0);
    FILE *f = fopen(log, "r");
    char line[512];
    bool banner = false;
    while (f && fgets(line, sizeof line, f)) banner |= strstr(line, "n-gram drafts (prompt lookup)") != NULL;
    if (f) fclose(f);
    CHECK(banner);
    CHECK_INT(ts_stop(pid, SIGTERM), 0);
    g_port = plain_port;
    /* refused option combinations */
    CHECK(th_cli("", false, "serve -m '%s' --spec bigram", model) == 2);
    CHECK(th_cli("", false, "serve -m '%s' --spec ngram --draft '%s'", model, model) == 2);
}

int main(void) {
    if (!getenv("PKV_CLI")) return th_skip("PKV_CLI is not set");
    char model[512], log[512], log2[512], cmd[1024];
    snprintf(model, sizeof model, "%s", th_tmp("bias.gguf"));
    REQUIRE(th_cli("", true, "mkmodel --seed 5 -o '%s'", model) == 0);
    snprintf(log, sizeof log, "%s", th_tmp("bias.log"));
    snprintf(log2, sizeof log2, "%s", th_tmp("bias-ngram.log"));
    snprintf(cmd, sizeof cmd, "-m '%s' -c 512 --parallel 4", model);
    pid_t pid = ts_start(cmd, log, &g_port);
    REQUIRE(pid > 0);
    test_forms();
    test_errors();
    test_ngram(model, log2);
    CHECK_INT(ts_stop(pid, SIGTERM), 0);
    printf("test-server-bias: %ld checks, %d failures\n", th_checks, th_failures);
    return th_failures ? 1 : 0;
}
#endif
