// labels: server timeout=240
/* POST /v1/messages (Anthropic's Messages API) through curl: the answer equals
 * the chat completion of the same conversation (greedy); streamed events come
 * in Anthropic's order and their deltas concatenate to the whole answer; tool
 * calls forced by tool_choice any/tool are tool_use blocks valid for the
 * input_schema, and a tool_result turn renders as the OpenAI tool message does;
 * system as a string or blocks, stop_sequences, max_tokens, thinking blocks
 * (a template that opens <think>), count_tokens, cache_read_input_tokens, the
 * x-api-key header, and errors in Anthropic's shape naming the field. The plain
 * turn runs again on chatml (no format to parse: the raw text streamed), and an
 * image block on a vision pair equals the chat path's image_url part. */
#include "server-testlib.h"

#ifndef PKV_HAVE_SERVER
int main(void) { return th_skip("pagekv was built without the server (libmicrohttpd-dev, libjansson-dev)"); }
#else
#include "media-testlib.h"
#include "server-json.h"

static int g_port;
static const char *g_auth = "-H 'x-api-key: test-key'";

/* POST body (taken over) to path; the parsed answer in *out (NULL when not JSON). */
static int post(const char *path, json_t *body, json_t **out) {
    char *t = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    if (!t) return 0;
    char f[512];
    snprintf(f, sizeof f, "%s", ts_file("body.json", t, strlen(t)));
    free(t);
    int code = ts_http(g_port, "%s -H 'Content-Type: application/json' -H 'anthropic-version: 2023-06-01' --data-binary @%s %s",
                       g_auth, f, path);
    if (out) *out = json_loads(ts_body, 0, NULL);
    return code;
}

static int post_text(const char *path, const char *body, json_t **out) {
    json_error_t e;
    json_t *b = json_loads(body, 0, &e);
    if (!b) {
        TH_FAIL("bad test JSON: %s: %s", e.text, body);
        return 0;
    }
    return post(path, b, out);
}

static const char *jstr(json_t *j, const char *path) {
    json_t *v = jget(j, path);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

/* A request: the messages (JSON text), max_tokens, greedy, and extra fields (JSON
 * object text, may be NULL). */
static json_t *req(const char *messages, int max_tokens, const char *extra) {
    json_t *b = json_pack("{s:s,s:i,s:i,s:o}", "model", "tiny", "max_tokens", max_tokens, "temperature", 0, "messages",
                          json_loads(messages, 0, NULL));
    if (extra) {
        json_t *x = json_loads(extra, 0, NULL);
        if (!x) TH_FAIL("bad test JSON: %s", extra);
        json_object_update(b, x);
        json_decref(x);
    }
    return b;
}

/* ------------------------------------------------------------ SSE events */

#define MAX_BLK 8
typedef struct msse {
    int n_blk;
    char type[MAX_BLK][16];
    char text[MAX_BLK][16384]; /* text, thinking or the input's JSON, concatenated */
    char id[MAX_BLK][64], name[MAX_BLK][64];
    bool signed_[MAX_BLK];     /* a thinking block got its signature_delta */
    char stop_reason[32], stop_sequence[64];
    long long output_tokens, input_tokens, cache_read;
    char msg_id[64];
    int events;
    char bad[256];             /* the first broken rule; "" = none */
} msse;

static void bad(msse *t, const char *fmt, const char *what) {
    if (!t->bad[0]) snprintf(t->bad, sizeof t->bad, fmt, what);
}

static void cat(char *dst, size_t size, const char *s) {
    size_t n = strlen(dst);
    if (s) snprintf(dst + n, size - n, "%s", s);
}

/* Parse an Anthropic SSE body: every event is "event: NAME" then "data: {json}"
 * with type NAME; message_start first; blocks start at the next index, only
 * while none is open, and get deltas and a stop at their own index; then
 * message_delta and message_stop last. */
static void msse_parse(const char *body, msse *t) {
    memset(t, 0, sizeof *t);
    int open = -1, phase = 0; /* 0: before message_start, 1: blocks, 2: after message_delta, 3: stopped */
    const char *p = body;
    while (*p) {
        const char *end = strstr(p, "\n\n");
        size_t n = end ? (size_t)(end - p) : strlen(p);
        char ev[65536];
        if (n >= sizeof ev) {
            bad(t, "%s", "an event too long");
            return;
        }
        memcpy(ev, p, n);
        ev[n] = 0;
        p = end ? end + 2 : p + n;
        if (!n) continue;
        char name[64];
        const char *data = strstr(ev, "\ndata: ");
        if (strncmp(ev, "event: ", 7) || !data || (size_t)(data - ev - 7) >= sizeof name) {
            bad(t, "not an 'event:' then 'data:' event: %.100s", ev);
            continue;
        }
        snprintf(name, sizeof name, "%.*s", (int)(data - ev - 7), ev + 7);
        json_t *d = json_loads(data + 7, 0, NULL);
        t->events++;
        const char *type = jstr(d, "type");
        if (!type || strcmp(type, name)) bad(t, "event %s: data.type differs", name);
        if (phase == 3) bad(t, "event %s after message_stop", name);
        int idx = (int)jint(d, "index");
        if (!strcmp(name, "ping")) {
        } else if (!strcmp(name, "message_start")) {
            if (phase != 0) bad(t, "%s", "message_start twice");
            phase = 1;
            snprintf(t->msg_id, sizeof t->msg_id, "%s", jstr(d, "message.id") ? jstr(d, "message.id") : "");
            if (!json_is_array(jget(d, "message.content")) || json_array_size(jget(d, "message.content")) ||
                strcmp(jstr(d, "message.role") ? jstr(d, "message.role") : "", "assistant"))
                bad(t, "%s", "message_start: not an empty assistant message");
        } else if (!strcmp(name, "content_block_start")) {
            if (phase != 1 || open >= 0 || idx != t->n_blk || t->n_blk >= MAX_BLK) bad(t, "%s", "content_block_start out of order");
            else {
                const char *bt = jstr(d, "content_block.type");
                snprintf(t->type[idx], sizeof t->type[idx], "%s", bt ? bt : "?");
                if (bt && !strcmp(bt, "tool_use")) {
                    snprintf(t->id[idx], sizeof t->id[idx], "%s", jstr(d, "content_block.id") ? jstr(d, "content_block.id") : "");
                    snprintf(t->name[idx], sizeof t->name[idx], "%s", jstr(d, "content_block.name") ? jstr(d, "content_block.name") : "");
                }
                open = t->n_blk++;
            }
        } else if (!strcmp(name, "content_block_delta")) {
            const char *dt = jstr(d, "delta.type");
            if (open < 0 || idx != open || !dt) bad(t, "%s", "content_block_delta outside its block");
            else if (!strcmp(dt, "text_delta") && !strcmp(t->type[open], "text"))
                cat(t->text[open], sizeof t->text[open], jstr(d, "delta.text"));
            else if (!strcmp(dt, "thinking_delta") && !strcmp(t->type[open], "thinking"))
                cat(t->text[open], sizeof t->text[open], jstr(d, "delta.thinking"));
            else if (!strcmp(dt, "signature_delta") && !strcmp(t->type[open], "thinking"))
                t->signed_[open] = true;
            else if (!strcmp(dt, "input_json_delta") && !strcmp(t->type[open], "tool_use"))
                cat(t->text[open], sizeof t->text[open], jstr(d, "delta.partial_json"));
            else
                bad(t, "delta %s does not fit its block", dt);
        } else if (!strcmp(name, "content_block_stop")) {
            if (open < 0 || idx != open) bad(t, "%s", "content_block_stop of a block not open");
            open = -1;
        } else if (!strcmp(name, "message_delta")) {
            if (phase != 1 || open >= 0) bad(t, "%s", "message_delta with a block open");
            phase = 2;
            snprintf(t->stop_reason, sizeof t->stop_reason, "%s", jstr(d, "delta.stop_reason") ? jstr(d, "delta.stop_reason") : "");
            snprintf(t->stop_sequence, sizeof t->stop_sequence, "%s",
                     jstr(d, "delta.stop_sequence") ? jstr(d, "delta.stop_sequence") : "");
            t->output_tokens = jint(d, "usage.output_tokens");
            t->input_tokens = jint(d, "usage.input_tokens");
            t->cache_read = jint(d, "usage.cache_read_input_tokens");
        } else if (!strcmp(name, "message_stop")) {
            if (phase != 2) bad(t, "%s", "message_stop before message_delta");
            phase = 3;
        } else {
            bad(t, "unknown event %s", name);
        }
        json_decref(d);
    }
    if (phase != 3) bad(t, "%s", "the stream did not end with message_stop");
}

/* The streamed answer equals the whole one: the same blocks (tool_use inputs
 * as JSON values), stop reason, sequence and usage. */
static void same_as_stream(json_t *whole, const msse *t, const char *what) {
    if (t->bad[0]) {
        TH_FAIL("%s: stream: %s\n%.2000s", what, t->bad, ts_body);
        return;
    }
    json_t *content = json_object_get(whole, "content");
    th_checks++;
    if ((int)json_array_size(content) != t->n_blk) {
        TH_FAIL("%s: %zu blocks, streamed %d", what, json_array_size(content), t->n_blk);
        return;
    }
    for (int i = 0; i < t->n_blk; i++) {
        json_t *b = json_array_get(content, (size_t)i);
        const char *type = jstr(b, "type");
        th_checks++;
        if (!type || strcmp(type, t->type[i])) {
            TH_FAIL("%s: block %d is %s, streamed %s", what, i, type ? type : "?", t->type[i]);
            continue;
        }
        if (!strcmp(type, "text") || !strcmp(type, "thinking")) {
            const char *x = jstr(b, type);
            if (!x || strcmp(x, t->text[i])) TH_FAIL("%s: block %d: '%s' != streamed '%s'", what, i, x ? x : "(none)", t->text[i]);
            if (!strcmp(type, "thinking")) CHECK(t->signed_[i] && jstr(b, "signature"));
        } else {
            json_t *in = json_loads(t->text[i], 0, NULL);
            if (!json_equal(in, json_object_get(b, "input")))
                TH_FAIL("%s: tool_use input streamed as '%s' differs", what, t->text[i]);
            CHECK(!strcmp(jstr(b, "name") ? jstr(b, "name") : "", t->name[i]) && !strncmp(t->id[i], "toolu_", 6));
            json_decref(in);
        }
    }
    const char *sr = jstr(whole, "stop_reason");
    if (!sr || strcmp(sr, t->stop_reason)) TH_FAIL("%s: stop_reason %s, streamed %s", what, sr ? sr : "?", t->stop_reason);
    const char *ss = jstr(whole, "stop_sequence");
    CHECK(!strcmp(ss ? ss : "", t->stop_sequence));
    CHECK_INT(jint(whole, "usage.output_tokens"), t->output_tokens);
    CHECK_INT(jint(whole, "usage.input_tokens") + jint(whole, "usage.cache_read_input_tokens"), t->input_tokens + t->cache_read);
    CHECK(!strncmp(t->msg_id, "msg_", 4));
}

/* The same request streamed (stream: true added). */
static void stream_of(json_t *b, msse *t) {
    json_t *c = json_deep_copy(b);
    json_object_set_new(c, "stream", json_true());
    CHECK_INT(post("/v1/messages", c, NULL), 200);
    msse_parse(ts_body, t);
}

static long long count_tokens(json_t *b) {
    json_t *j = NULL;
    json_t *c = json_deep_copy(b);
    json_object_del(c, "max_tokens");
    json_object_del(c, "temperature");
    int code = post("/v1/messages/count_tokens", c, &j);
    long long n = code == 200 ? jint(j, "input_tokens") : -1;
    if (code != 200) TH_FAIL("count_tokens: %d %.300s", code, ts_body);
    json_decref(j);
    return n;
}

/* Tokens of the prompt the template renders for an OpenAI chat body (text). */
static long long oai_tokens(const char *chat_body) {
    json_t *j = NULL;
    const char *save = g_auth;
    g_auth = "-H 'Authorization: Bearer test-key'";
    CHECK_INT(post_text("/apply-template", chat_body, &j), 200);
    long long n = -1;
    if (jstr(j, "prompt")) {
        json_t *tb = json_pack("{s:s,s:b}", "content", jstr(j, "prompt"), "add_special", 1);
        json_t *tj = NULL;
        if (post("/tokenize", tb, &tj) == 200) n = (long long)json_array_size(json_object_get(tj, "tokens"));
        json_decref(tj);
    }
    json_decref(j);
    g_auth = save;
    return n;
}

/* ------------------------------------------------------------ tests */

/* A plain turn: Anthropic's message object, equal to the chat completion of the
 * same conversation, streamed deltas equal to it, usage that adds up. */
static void test_basic(void) {
    static const char *msgs = "[{\"role\": \"user\", \"content\": \"Tell me about Paris.\"}]";
    json_t *j = NULL, *c = NULL;
    json_t *b = req(msgs, 12, NULL);
    CHECK_INT(post("/v1/messages", json_incref(b), &j), 200);
    const char *id = jstr(j, "id");
    CHECK(id && !strncmp(id, "msg_", 4));
    CHECK(!strcmp(jstr(j, "type") ? jstr(j, "type") : "", "message") && !strcmp(jstr(j, "role") ? jstr(j, "role") : "", "assistant"));
    CHECK(!strcmp(jstr(j, "model") ? jstr(j, "model") : "", "tiny"));
    CHECK(json_is_null(jget(j, "stop_sequence")));
    /* the chat completion of the same conversation */
    char chat[1024];
    snprintf(chat, sizeof chat, "{\"messages\": %s, \"max_tokens\": 12, \"temperature\": 0}", msgs);
    const char *save = g_auth;
    g_auth = "-H 'Authorization: Bearer test-key'";
    CHECK_INT(post_text("/v1/chat/completions", chat, &c), 200);
    g_auth = save;
    const char *want = jstr(c, "choices.0.message.content"), *fin = jstr(c, "choices.0.finish_reason");
    char text[4096] = "";
    if (jstr(j, "content.0.text")) snprintf(text, sizeof text, "%s", jstr(j, "content.0.text"));
    if (want && *want) {
        CHECK_INT(json_array_size(json_object_get(j, "content")), 1);
        if (strcmp(text, want)) TH_FAIL("messages text '%s' != chat content '%s'", text, want);
    } else {
        CHECK_INT(json_array_size(json_object_get(j, "content")), 0);
    }
    const char *sr = jstr(j, "stop_reason");
    CHECK(sr && fin && !strcmp(sr, !strcmp(fin, "length") ? "max_tokens" : "end_turn"));
    CHECK_INT(jint(j, "usage.output_tokens"), jint(c, "usage.completion_tokens"));
    CHECK_INT(jint(j, "usage.input_tokens") + jint(j, "usage.cache_read_input_tokens"), jint(c, "usage.prompt_tokens"));
    CHECK_INT(count_tokens(b), jint(c, "usage.prompt_tokens"));
    /* the prefix cache: the same prompt again is read from it */
    json_t *j2 = NULL;
    CHECK_INT(post("/v1/messages", json_incref(b), &j2), 200);
    CHECK(jint(j2, "usage.cache_read_input_tokens") > 0);
    CHECK_INT(jint(j2, "usage.input_tokens") + jint(j2, "usage.cache_read_input_tokens"), jint(c, "usage.prompt_tokens"));
    json_decref(j2);
    msse t;
    stream_of(b, &t);
    same_as_stream(j, &t, "basic");
    json_decref(j);
    json_decref(c);
    /* content as text blocks (cache_control accepted) is the same conversation */
    json_t *bb = req("[{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"Tell me about Paris.\", "
                     "\"cache_control\": {\"type\": \"ephemeral\"}}]}]", 12, NULL);
    CHECK_INT(post("/v1/messages", json_incref(bb), &j), 200);
    const char *t2 = jstr(j, "content.0.text");
    CHECK(!strcmp(t2 ? t2 : "", text));
    json_decref(j);
    json_decref(bb);
    json_decref(b);
}

/* A final assistant message is a prefill the answer continues, as on the chat
 * path (the same greedy text). */
static void test_prefill(void) {
    static const char *msgs = "[{\"role\": \"user\", \"content\": \"Tell me about Paris.\"}, {\"role\": \"assistant\", "
                              "\"content\": \"Paris is\"}]";
    json_t *j = NULL, *c = NULL;
    CHECK_INT(post("/v1/messages", req(msgs, 8, NULL), &j), 200);
    char chat[1024];
    snprintf(chat, sizeof chat, "{\"messages\": %s, \"max_tokens\": 8, \"temperature\": 0}", msgs);
    const char *save = g_auth;
    g_auth = "-H 'Authorization: Bearer test-key'";
    CHECK_INT(post_text("/v1/chat/completions", chat, &c), 200);
    g_auth = save;
    const char *want = jstr(c, "choices.0.message.content"), *got = jstr(j, "content.0.text");
    if (strcmp(want ? want : "", got ? got : "")) TH_FAIL("prefill: '%s' != chat '%s'", got ? got : "", want ? want : "");
    CHECK_INT(jint(j, "usage.input_tokens") + jint(j, "usage.cache_read_input_tokens"), jint(c, "usage.prompt_tokens"));
    json_decref(j);
    json_decref(c);
    /* a final assistant turn with a tool_use cannot be continued */
    CHECK_INT(post_text("/v1/messages", "{\"max_tokens\": 4, \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, "
                        "{\"role\": \"assistant\", \"content\": [{\"type\": \"tool_use\", \"id\": \"t\", \"name\": \"f\", "
                        "\"input\": {}}]}]}", &j), 400);
    CHECK(strstr(jstr(j, "error.message") ? jstr(j, "error.message") : "", "tool calls") != NULL);
    json_decref(j);
}

/* max_tokens: a limit reached is stop_reason max_tokens; a limit past the
 * context is cut to it (Anthropic's clients always send one). */
static void test_max_tokens(void) {
    /* a forced tool call cannot end its JSON in 2 tokens */
    json_t *j = NULL;
    json_t *b = req("[{\"role\": \"user\", \"content\": \"Weather?\"}]", 2,
                    "{\"tools\": [{\"name\": \"get_weather\", \"input_schema\": {\"type\": \"object\", \"properties\": "
                    "{\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}], \"tool_choice\": {\"type\": \"any\"}}");
    CHECK_INT(post("/v1/messages", json_incref(b), &j), 200);
    CHECK(!strcmp(jstr(j, "stop_reason") ? jstr(j, "stop_reason") : "", "max_tokens"));
    CHECK_INT(jint(j, "usage.output_tokens"), 2);
    msse t;
    stream_of(b, &t);
    CHECK(!t.bad[0] && !strcmp(t.stop_reason, "max_tokens") && t.output_tokens == 2);
    json_decref(j);
    json_decref(b);
    b = req("[{\"role\": \"user\", \"content\": \"hi\"}]", 32000, NULL);
    CHECK_INT(post("/v1/messages", b, &j), 200);
    json_decref(j);
}

/* stop_sequences: the answer ends before the first match, stop_reason
 * stop_sequence names it, streamed or not. */
static void test_stop_sequences(void) {
    json_t *j = NULL;
    json_t *b = req("[{\"role\": \"user\", \"content\": \"Count: one two three\"}]", 24, NULL);
    CHECK_INT(post("/v1/messages", json_incref(b), &j), 200);
    char text[4096] = "";
    if (jstr(j, "content.0.text")) snprintf(text, sizeof text, "%s", jstr(j, "content.0.text"));
    json_decref(j);
    /* two ASCII bytes from the second half of the text */
    size_t n = strlen(text), at = n;
    for (size_t i = n / 2; i + 1 < n; i++)
        if (text[i] > 32 && text[i] < 127 && text[i + 1] > 32 && text[i + 1] < 127) {
            at = i;
            break;
        }
    if (at == n) {
        TH_FAIL("no ASCII pair in the greedy text to stop at: '%s'", text);
        json_decref(b);
        return;
    }
    char seq[3] = {text[at], text[at + 1], 0};
    size_t cut = (size_t)(strstr(text, seq) - text);
    json_object_set_new(b, "stop_sequences", json_pack("[s,s]", "\x01never", seq));
    CHECK_INT(post("/v1/messages", json_incref(b), &j), 200);
    const char *got = jstr(j, "content.0.text");
    if (cut == 0) CHECK_INT(json_array_size(json_object_get(j, "content")), 0);
    else if (!got || strlen(got) != cut || strncmp(got, text, cut))
        TH_FAIL("stop '%s': '%s', want the first %zu bytes of '%s'", seq, got ? got : "(none)", cut, text);
    CHECK(!strcmp(jstr(j, "stop_reason") ? jstr(j, "stop_reason") : "", "stop_sequence"));
    CHECK(!strcmp(jstr(j, "stop_sequence") ? jstr(j, "stop_sequence") : "", seq));
    msse t;
    stream_of(b, &t);
    same_as_stream(j, &t, "stop_sequences");
    json_decref(j);
    json_decref(b);
}

/* system as a string and as text blocks: the prompt the OpenAI system message
 * renders, the same answer either way. */
static void test_system(void) {
    json_t *a = req("[{\"role\": \"user\", \"content\": \"hi\"}]", 8, "{\"system\": \"Be brief.\\n\\nUse French.\"}");
    json_t *b = req("[{\"role\": \"user\", \"content\": \"hi\"}]", 8,
                    "{\"system\": [{\"type\": \"text\", \"text\": \"Be brief.\"}, {\"type\": \"text\", \"text\": \"Use French.\", "
                    "\"cache_control\": {\"type\": \"ephemeral\"}}]}");
    json_t *none = req("[{\"role\": \"user\", \"content\": \"hi\"}]", 8, NULL);
    long long na = count_tokens(a), nb = count_tokens(b), n0 = count_tokens(none);
    CHECK_INT(na, nb);
    CHECK_INT(na, oai_tokens("{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\\n\\nUse French.\"}, "
                             "{\"role\": \"user\", \"content\": \"hi\"}]}"));
    CHECK(na > n0);
    json_t *ja = NULL, *jb = NULL;
    CHECK_INT(post("/v1/messages", a, &ja), 200);
    CHECK_INT(post("/v1/messages", b, &jb), 200);
    CHECK(json_equal(json_object_get(ja, "content"), json_object_get(jb, "content")));
    json_decref(ja);
    json_decref(jb);
    json_decref(none);
}

/* Claude Code's billing line: its cch stamp changes every request and must not
 * stop the prefix cache (it is written as f's). */
static void test_billing_header(void) {
    char sys[4096];
    json_t *j = NULL;
    long long prompt = 0, cached[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        int n = snprintf(sys, sizeof sys, "x-anthropic-billing-header: cc_version=2.1.101.e51; cc_entrypoint=cli; cch=%s;You are "
                         "a helpful assistant.", k ? "b7777" : "a5145");
        for (int r = 0; r < 40; r++) n += snprintf(sys + n, sizeof sys - (size_t)n, " Rule %d: be precise and kind.", r);
        json_t *b = req("[{\"role\": \"user\", \"content\": \"hello\"}]", 2, NULL);
        json_object_set_new(b, "system", k ? json_pack("[{s:s,s:s}]", "type", "text", "text", sys) : json_string(sys));
        CHECK_INT(post("/v1/messages", b, &j), 200);
        prompt = jint(j, "usage.input_tokens") + jint(j, "usage.cache_read_input_tokens");
        cached[k] = jint(j, "usage.cache_read_input_tokens");
        json_decref(j);
    }
    /* the second request reads all but the last page or two from the cache */
    if (!(prompt > 200 && cached[1] >= prompt - 40))
        TH_FAIL("billing header: %lld of %lld prompt tokens cached (first request %lld)", cached[1], prompt, cached[0]);
    th_checks++;
}

static const char *k_tools =
    "[{\"name\": \"get_weather\", \"description\": \"Weather of a city\", \"input_schema\": {\"type\": \"object\", "
    "\"properties\": {\"city\": {\"type\": \"string\", \"maxLength\": 20}, \"unit\": {\"enum\": [\"C\", \"F\"]}}, "
    "\"required\": [\"city\", \"unit\"], \"additionalProperties\": false}, \"cache_control\": {\"type\": \"ephemeral\"}}, "
    "{\"name\": \"add\", \"input_schema\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}, \"b\": "
    "{\"type\": \"integer\"}}, \"required\": [\"a\", \"b\"], \"additionalProperties\": false}}]";

/* Characters (code points) of UTF-8 text: what maxLength counts. */
static size_t chars(const char *s) {
    size_t n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

/* An input valid for its tool's input_schema. */
static void check_input(const char *name, json_t *in) {
    th_checks++;
    if (!json_is_object(in)) {
        TH_FAIL("%s: input is not an object", name);
        return;
    }
    if (!strcmp(name, "get_weather")) {
        const char *city = jstr(in, "city"), *unit = jstr(in, "unit");
        CHECK(city && chars(city) <= 20 && unit && (!strcmp(unit, "C") || !strcmp(unit, "F")) && json_object_size(in) == 2);
    } else {
        CHECK(!strcmp(name, "add") && json_is_integer(json_object_get(in, "a")) && json_is_integer(json_object_get(in, "b")) &&
              json_object_size(in) == 2);
    }
}

/* tool_choice any and tool: a tool_use block valid for its input_schema,
 * stop_reason tool_use, streamed as input_json_delta; then the call and its
 * tool_result in the history render as the OpenAI tool messages do. */
static void test_tools(void) {
    char extra[4096];
    for (int k = 0; k < 2; k++) {
        snprintf(extra, sizeof extra, "{\"tools\": %s, \"tool_choice\": %s}", k_tools,
                 k ? "{\"type\": \"tool\", \"name\": \"add\"}" : "{\"type\": \"any\"}");
        json_t *b = req("[{\"role\": \"user\", \"content\": \"Weather in Paris?\"}]", 200, extra), *j = NULL;
        CHECK_INT(post("/v1/messages", json_incref(b), &j), 200);
        json_t *content = json_object_get(j, "content");
        json_t *tu = json_array_get(content, json_array_size(content) - 1);
        const char *name = jstr(tu, "name"), *id = jstr(tu, "id");
        if (!name || !id || strcmp(jstr(tu, "type"), "tool_use")) {
            TH_FAIL("no tool_use block: %.500s", ts_body);
        } else {
            CHECK(!strncmp(id, "toolu_", 6));
            if (k) CHECK(!strcmp(name, "add"));
            check_input(name, json_object_get(tu, "input"));
        }
        CHECK(!strcmp(jstr(j, "stop_reason") ? jstr(j, "stop_reason") : "", "tool_use"));
        msse t;
        stream_of(b, &t);
        same_as_stream(j, &t, k ? "tool_choice tool" : "tool_choice any");
        json_decref(j);
        json_decref(b);
    }
    /* the round trip: a tool_use turn and its tool_result, then text */
    static const char *hist =
        "[{\"role\": \"user\", \"content\": \"Weather in Paris?\"}, {\"role\": \"assistant\", \"content\": [{\"type\": "
        "\"text\", \"text\": \"Let me check.\"}, {\"type\": \"tool_use\", \"id\": \"toolu_01\", \"name\": \"get_weather\", "
        "\"input\": {\"city\": \"Paris\", \"unit\": \"C\"}}]}, {\"role\": \"user\", \"content\": [{\"type\": \"tool_result\", "
        "\"tool_use_id\": \"toolu_01\", \"content\": [{\"type\": \"text\", \"text\": \"18 C, sunny\"}]}, {\"type\": \"text\", "
        "\"text\": \"And tomorrow?\"}]}]";
    snprintf(extra, sizeof extra, "{\"tools\": %s, \"tool_choice\": {\"type\": \"none\"}}", k_tools);
    json_t *b = req(hist, 8, extra), *j = NULL;
    char chat[8192];
    snprintf(chat, sizeof chat,
             "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather in Paris?\"}, {\"role\": \"assistant\", \"content\": "
             "[{\"type\": \"text\", \"text\": \"Let me check.\"}], \"tool_calls\": [{\"id\": \"toolu_01\", \"type\": \"function\", "
             "\"function\": {\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\":\\\"Paris\\\",\\\"unit\\\":\\\"C\\\"}\"}}]}, "
             "{\"role\": \"tool\", \"tool_call_id\": \"toolu_01\", \"content\": \"18 C, sunny\"}, {\"role\": \"user\", "
             "\"content\": [{\"type\": \"text\", \"text\": \"And tomorrow?\"}]}], \"tools\": [{\"type\": \"function\", "
             "\"function\": {\"name\": \"get_weather\", \"description\": \"Weather of a city\", \"parameters\": {\"type\": "
             "\"object\", \"properties\": {\"city\": {\"type\": \"string\", \"maxLength\": 20}, \"unit\": {\"enum\": [\"C\", "
             "\"F\"]}}, \"required\": [\"city\", \"unit\"], \"additionalProperties\": false}}}, {\"type\": \"function\", "
             "\"function\": {\"name\": \"add\", \"parameters\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": "
             "\"integer\"}, \"b\": {\"type\": \"integer\"}}, \"required\": [\"a\", \"b\"], \"additionalProperties\": false}}}]}");
    long long want = oai_tokens(chat);
    CHECK(want > 0);
    CHECK_INT(count_tokens(b), want);
    if (post("/v1/messages", json_incref(b), &j) != 200) TH_FAIL("tool_result turn: %s", ts_body);
    CHECK(!strcmp(jstr(j, "stop_reason") ? jstr(j, "stop_reason") : "", "max_tokens") ||
          !strcmp(jstr(j, "stop_reason") ? jstr(j, "stop_reason") : "", "end_turn"));
    json_t *content = json_object_get(j, "content");
    size_t i;
    json_t *blk;
    json_array_foreach(content, i, blk) CHECK(strcmp(jstr(blk, "type"), "tool_use")); /* tool_choice none: text only */
    json_decref(j);
    /* is_error reaches the model */
    json_t *e = json_deep_copy(b);
    json_object_set_new(jget(e, "messages.2.content.0"), "is_error", json_true());
    CHECK(count_tokens(e) > want);
    json_decref(e);
    json_decref(b);
}

/* Errors: Anthropic's shape, the HTTP status, the field named. */
static void test_errors(void) {
    static const struct {
        int status;
        const char *body, *msg;
    } bad_req[] = {
        {400, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}", "'max_tokens' is required"},
        {400, "{\"max_tokens\": 0, \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}", "'max_tokens' is required"},
        {400, "{\"max_tokens\": 5, \"messages\": []}", "'messages' must be a non-empty array"},
        {400, "{\"max_tokens\": 5, \"messages\": [{\"role\": \"system\", \"content\": \"hi\"}]}", "'messages[0].role' must be"},
        {400, "{\"max_tokens\": 5, \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image\", \"source\": {\"type\": "
              "\"base64\", \"media_type\": \"image/png\", \"data\": \"AAAA\"}}]}]}",
         "'messages[0].content[0]': image blocks need a vision projector (start the server with --mmproj)"},
        {400, "{\"max_tokens\": 5, \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"document\", \"source\": {}}]}]}",
         "'messages[0].content[0]': content blocks of type 'document' are not supported"},
        {400, "{\"max_tokens\": 5, \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"tool_use\", \"id\": \"x\", "
              "\"name\": \"f\", \"input\": {}}]}]}", "blocks of type 'tool_use' are not supported in user messages"},
        {400, "{\"max_tokens\": 5, \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"tool_result\"}]}]}",
         "'messages[0].content[0].tool_use_id' must be a string"},
        {400, "{\"max_tokens\": 5, \"messages\": [{\"role\": \"assistant\", \"content\": [{\"type\": \"tool_use\", \"id\": \"x\", "
              "\"name\": \"f\", \"input\": \"{}\"}]}]}", "'messages[0].content[0]' must have 'id' and 'name' strings and an 'input' object"},
        {400, "{\"max_tokens\": 5, \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\", \"x\": 1}]}]}",
         "'messages[0].content[0].x' is not a field of a 'text' block"},
        {400, "{\"max_tokens\": 5, \"system\": 3, \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}", "'system' must be"},
        {400, "{\"max_tokens\": 5, \"temperature\": 1.5, \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}",
         "'temperature' must be a number in [0, 1]"},
        {400, "{\"max_tokens\": 5, \"stop_sequences\": \"x\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}",
         "'stop_sequences' must be an array"},
        {400, "{\"max_tokens\": 5, \"tools\": [{\"type\": \"web_search_20250305\", \"name\": \"web_search\"}], \"messages\": "
              "[{\"role\": \"user\", \"content\": \"hi\"}]}", "'tools[0].type': Anthropic's server tools ('web_search_20250305') are not supported"},
        {400, "{\"max_tokens\": 5, \"tools\": [{\"name\": \"f\"}], \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}",
         "'tools[0].input_schema' must be a JSON schema"},
        {400, "{\"max_tokens\": 5, \"tools\": [{\"name\": \"f\", \"input_schema\": {\"type\": \"strnig\"}}], \"tool_choice\": "
              "{\"type\": \"any\"}, \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}", "'tools[0].input_schema"},
        {400, "{\"max_tokens\": 5, \"tools\": [{\"name\": \"f\", \"input_schema\": {}}], \"tool_choice\": {\"type\": \"tool\", "
              "\"name\": \"g\"}, \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}", "'tool_choice.name' names the tool 'g'"},
        {400, "{\"max_tokens\": 5, \"tool_choice\": {\"type\": \"any\"}, \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}",
         "'tool_choice': \"any\" needs 'tools'"},
        {400, "{\"max_tokens\": 5, \"tool_choice\": {\"type\": \"sometimes\"}, \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}",
         "'tool_choice.type' must be"},
        {400, "{\"max_tokens\": 5, \"thinking\": {\"type\": \"enabled\"}, \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}",
         "'thinking.budget_tokens' must be an integer"},
        {400, "{\"max_tokens\": 5, \"mcp_servers\": [{}], \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}",
         "'mcp_servers' is not implemented"},
        {400, "{\"max_tokens\": 5, \"top_q\": 1, \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}", "unknown field 'top_q'"},
        {400, "{\"max_tokens\": 5, \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]", "invalid JSON"},
    };
    for (size_t i = 0; i < sizeof bad_req / sizeof bad_req[0]; i++) {
        char f[512];
        snprintf(f, sizeof f, "%s", ts_file("bad.json", bad_req[i].body, strlen(bad_req[i].body)));
        int code = ts_http(g_port, "%s -H 'Content-Type: application/json' --data-binary @%s /v1/messages", g_auth, f);
        json_t *j = json_loads(ts_body, 0, NULL);
        const char *msg = jstr(j, "error.message");
        th_checks++;
        if (code != bad_req[i].status || !msg || !strstr(msg, bad_req[i].msg) || strcmp(jstr(j, "type") ? jstr(j, "type") : "", "error") ||
            strcmp(jstr(j, "error.type") ? jstr(j, "error.type") : "", "invalid_request_error"))
            TH_FAIL("case %zu: %d %s, want %d with '%s'", i, code, ts_body, bad_req[i].status, bad_req[i].msg);
        json_decref(j);
    }
    /* the key: x-api-key or Authorization, else 401 in Anthropic's shape */
    const char *save = g_auth;
    g_auth = "-H 'x-api-key: wrong'";
    json_t *j = NULL;
    CHECK_INT(post("/v1/messages", req("[{\"role\": \"user\", \"content\": \"hi\"}]", 2, NULL), &j), 401);
    CHECK(!strcmp(jstr(j, "error.type") ? jstr(j, "error.type") : "", "authentication_error"));
    json_decref(j);
    g_auth = "-H 'Authorization: Bearer test-key'";
    CHECK_INT(post("/v1/messages", req("[{\"role\": \"user\", \"content\": \"hi\"}]", 2, NULL), NULL), 200);
    g_auth = save;
    CHECK_INT(ts_http(g_port, "%s /v1/messages", g_auth), 405);
    j = json_loads(ts_body, 0, NULL);
    CHECK(!strcmp(jstr(j, "type") ? jstr(j, "type") : "", "error"));
    json_decref(j);
}

/* A template that opens <think> in the prompt: the answer is reasoning, a
 * thinking block, streamed as thinking_delta with a signature_delta. */
static void test_thinking(void) {
    json_t *b = req("[{\"role\": \"user\", \"content\": \"hi\"}]", 10, "{\"thinking\": {\"type\": \"enabled\", \"budget_tokens\": 1024}}");
    json_t *j = NULL;
    CHECK_INT(post("/v1/messages", json_incref(b), &j), 200);
    const char *ty = jstr(j, "content.0.type"), *th = jstr(j, "content.0.thinking");
    if (!ty || strcmp(ty, "thinking") || !th || !*th) TH_FAIL("no thinking block: %.500s", ts_body);
    msse t;
    stream_of(b, &t);
    same_as_stream(j, &t, "thinking");
    json_decref(j);
    /* an earlier thinking block in the history is accepted */
    json_decref(b);
    b = req("[{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": [{\"type\": \"thinking\", "
            "\"thinking\": \"plan\", \"signature\": \"\"}, {\"type\": \"text\", \"text\": \"Hello\"}]}, {\"role\": \"user\", "
            "\"content\": \"again\"}]", 4, NULL);
    CHECK_INT(post("/v1/messages", b, NULL), 200);
}

#ifdef PKV_HAVE_SPNG
/* With a vision projector an image block is the image_url part of the chat
 * path: the same prompt tokens (image rows included) and the same greedy text. */
static void test_image(const char *model, const char *proj, const char *log) {
    char args[2048];
    snprintf(args, sizeof args, "-m '%s' --mmproj '%s' -c 1024 --api-key test-key --alias tiny", model, proj);
    pid_t pid = ts_start(args, log, &g_port);
    REQUIRE_VOID(pid > 0);
    size_t n = 0;
    uint8_t *png = tm_png(-1, &n);
    char *data = png ? tm_b64(png, n) : NULL;
    free(png);
    REQUIRE_VOID(data);
    json_t *b = json_pack("{s:s,s:i,s:i,s:[{s:s,s:[{s:s,s:s},{s:s,s:{s:s,s:s,s:s}},{s:s,s:s}]}]}", "model", "tiny",
                          "max_tokens", 12, "temperature", 0, "messages", "role", "user", "content", "type", "text", "text",
                          "Look at this:", "type", "image", "source", "type", "base64", "media_type", "image/png", "data", data,
                          "type", "text", "text", "What is it?");
    size_t un = strlen(data) + 64;
    char *url = malloc(un);
    snprintf(url, un, "data:image/png;base64,%s", data);
    json_t *c = json_pack("{s:i,s:i,s:[{s:s,s:[{s:s,s:s},{s:s,s:{s:s}},{s:s,s:s}]}]}", "max_tokens", 12, "temperature", 0,
                          "messages", "role", "user", "content", "type", "text", "text", "Look at this:", "type", "image_url",
                          "image_url", "url", url, "type", "text", "text", "What is it?");
    free(url);
    free(data);
    json_t *j = NULL, *cj = NULL;
    CHECK_INT(post("/v1/messages", b, &j), 200);
    const char *save = g_auth;
    g_auth = "-H 'Authorization: Bearer test-key'";
    CHECK_INT(post("/v1/chat/completions", c, &cj), 200);
    g_auth = save;
    CHECK(jint(cj, "usage.prompt_tokens_details.image_tokens") > 0);
    CHECK_INT(jint(j, "usage.input_tokens") + jint(j, "usage.cache_read_input_tokens"), jint(cj, "usage.prompt_tokens"));
    const char *want = jstr(cj, "choices.0.message.content"), *got = jstr(j, "content.0.text");
    if (strcmp(want ? want : "", got ? got : "")) TH_FAIL("image: messages '%s' != chat '%s'", got ? got : "", want ? want : "");
    json_decref(j);
    json_decref(cj);
    CHECK_INT(ts_stop(pid, SIGTERM), 0);
}
#endif

int main(void) {
    if (th_cli("", true, "serve --help") != 0) return th_skip("pagekv serve is not available");
    char model[512], log[512], args[2048];
    snprintf(model, sizeof model, "%s", th_tmp("msg.gguf"));
    snprintf(log, sizeof log, "%s", th_tmp("msg-serve.log"));
    REQUIRE(th_cli("", true, "mkmodel --no-template -o '%s'", model) == 0);
    /* Qwen3's template: tools in the prompt, Hermes tool calls, <think> parsed */
    snprintf(args, sizeof args, "-m '%s' -c 2048 --chat-template '%s/tests/templates/Qwen-Qwen3-0.6B.jinja' --api-key test-key "
                                "--alias tiny", model, PKV_TEST_SRC);
    pid_t pid = ts_start(args, log, &g_port);
    REQUIRE(pid > 0);
    test_basic();
    test_prefill();
    test_max_tokens();
    test_stop_sequences();
    test_system();
    test_billing_header();
    test_tools();
    test_errors();
    CHECK_INT(ts_stop(pid, SIGTERM), 0);
    /* chatml: no tool-call or reasoning format, the answer streamed as raw text */
    snprintf(args, sizeof args, "-m '%s' -c 2048 --chat-template chatml --api-key test-key --alias tiny", model);
    pid = ts_start(args, log, &g_port);
    REQUIRE(pid > 0);
    test_basic();
    CHECK_INT(ts_stop(pid, SIGTERM), 0);
    /* DeepSeek-R1's template opens <think> at the generation prompt */
    snprintf(args, sizeof args, "-m '%s' -c 2048 --chat-template '%s/tests/templates/deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja' "
                                "--api-key test-key --alias tiny", model, PKV_TEST_SRC);
    pid = ts_start(args, log, &g_port);
    REQUIRE(pid > 0);
    test_thinking();
    CHECK_INT(ts_stop(pid, SIGTERM), 0);
#ifdef PKV_HAVE_SPNG
    char proj[512];
    snprintf(model, sizeof model, "%s", th_tmp("msg-gemma3.gguf"));
    snprintf(proj, sizeof proj, "%s", th_tmp("msg-gemma3-mmproj.gguf"));
    if (th_cli("", true, "mkmodel --arch gemma3 --vision -o '%s' --mmproj-out '%s'", model, proj) == 0)
        test_image(model, proj, log);
    else
        TH_FAIL("mkmodel cannot write a gemma3 vision pair: %s", th_out);
#else
    fprintf(stderr, "built without libspng: the image block case is not run\n");
#endif
    return th_done();
}
#endif
