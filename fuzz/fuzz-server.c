/* Fuzz harness: HTTP requests of pagekv serve, from the body bytes to the answer,
 * through the same entry point the HTTP layer calls (srv_handle in
 * src/server/server-core.c): JSON parsing (jansson, duplicates refused), every
 * field check of the OpenAI endpoints and the contexts API, chat templates,
 * tokenizing, generation on the worker thread (the serving engine, the contexts
 * API's generations included) and the JSON / server-sent-event answers. libmicrohttpd itself is
 * not in the loop (its limits are tested by test-server-load).
 *
 * Input: up to 8 requests separated by NUL bytes. Each starts with a selector
 * byte (never 0): its low 4 bits pick the endpoint (OP_*), bits 4-6 a chat-template
 * family (0 = none) or which known context a contexts call names (6 = a context
 * that does not exist, 7 = a malformed id), bit 7 of the first request the
 * server (set: one whose engine steps 8 tokens, so prompts run in many chunks; the
 * simple worker it used to pick is retired). The rest is the body; for the "raw" endpoint its first line
 * is "METHOD PATH" and the rest the body.
 *
 * The model is tiny (fuzz_kv_model_params, 300 tokens) with a 128-token context
 * and a pool smaller than four full sequences, so long requests preempt each
 * other. After every input the contexts it created are deleted.
 *
 * Checked: no crash, leak or undefined behaviour; every answer has a status and
 * exactly one body; JSON answers serialize; an error answer is an OpenAI error
 * object; a completion that succeeded has as many choices as asked; a stream is
 * a sequence of "data: " events, each a JSON object, ending with "data: [DONE]"
 * or an error event; token ids returned are in the vocabulary; and after the
 * input no KV page is still referenced (checked on the worker thread).
 * FUZZ_VERBOSE=1 in the environment prints each request and its answer. */
#include "fuzz-common.h"

#include "server/server-http.h"

#include <stdint.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { N_VOCAB = 300, MAX_REQS = 8, MAX_CTX_IDS = 16 };

static pkv_model *g_model;
static srv g_srv[2]; /* [0] 32 tokens per engine step, [1] 8 */

static void start(srv *s, int batch_tokens) {
    memset(s, 0, sizeof *s);
    s->o = pkv_serve_default_opts();
    s->o.parallel = 4;
    s->o.kv_pages = 80; /* 4 x 32 pages would hold four full sequences */
    s->o.max_contexts = 6;
    s->o.queue = 16;
    s->o.chat_template = "chatml";
    s->o.batch_tokens = batch_tokens;
    /* grammar work limits far below serve's defaults (20M steps a token, 1G a
     * request: seconds under ASan), so no costly grammar makes an input slow */
    s->o.grammar_token_steps = 1000000;
    s->o.grammar_request_steps = 8000000;
    s->m = g_model;
    pkv_setup_model_opts mo = {0};
    mo.n_ctx = 128;
    mo.page_size = 4;
    mo.kv_type = PKV_TYPE_F16;
    mo.kv_type_v = PKV_TYPE_F16;
    mo.threads = 1;
    if (!srv_start(s, NULL, &mo)) {
        fprintf(stderr, "fuzz-server: cannot start the server (%d tokens per step): %s\n", batch_tokens, pkv_errmsg());
        abort();
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    pkv_log_set(NULL, NULL, PKV_LOG_NONE);
    pkv_mkmodel_params mp = fuzz_kv_model_params();
    void *img = NULL;
    size_t n = 0;
    if (pkv_mkmodel_memory(&mp, &img, &n)) {
        fprintf(stderr, "fuzz-server: mkmodel: %s\n", pkv_errmsg());
        abort();
    }
    g_model = pkv_model_load_memory(img, n, "fuzz-server-model", fuzz_model_params());
    pkv_mkmodel_free_memory(img);
    if (!g_model) {
        fprintf(stderr, "fuzz-server: model: %s\n", pkv_errmsg());
        abort();
    }
    start(&g_srv[0], 32);
    start(&g_srv[1], 8);
    return 0;
}

/* ------------------------------------------------------------ checking */

static void check_error_object(json_t *j) {
    json_t *e = json_object_get(j, "error");
    FUZZ_CHECK(json_is_object(e));
    FUZZ_CHECK(json_is_string(json_object_get(e, "message")));
    FUZZ_CHECK(json_is_string(json_object_get(e, "type")));
}

static void check_ids(json_t *a) {
    if (!json_is_array(a)) return;
    size_t i;
    json_t *v;
    json_array_foreach(a, i, v) {
        /* /tokenize with "with_pieces" gives {"id", "piece"} objects */
        if (json_is_object(v)) {
            FUZZ_CHECK(json_is_string(json_object_get(v, "piece")));
            v = json_object_get(v, "id");
        }
        FUZZ_CHECK(json_is_integer(v));
        FUZZ_CHECK(json_integer_value(v) >= 0 && json_integer_value(v) < N_VOCAB);
    }
}

/* A stream read to its end: "data: <json object>\n\n"... then "data: [DONE]\n\n",
 * or an error event last. */
static void check_stream(srv_stream *st) {
    size_t len = 0, cap = 4096;
    char *all = malloc(cap);
    FUZZ_CHECK(all != NULL);
    for (;;) {
        if (cap - len < 1024) {
            char *p = realloc(all, cap *= 2);
            FUZZ_CHECK(p != NULL);
            all = p;
        }
        ssize_t k = srv_stream_read(st, all + len, cap - len - 1);
        FUZZ_CHECK(k >= 0); /* no socket here: the stream never fails */
        if (k == 0) break;
        len += (size_t)k;
    }
    all[len] = 0;
    srv_stream_free(st);
    bool done = false, error = false;
    size_t at = 0;
    while (at < len) {
        FUZZ_CHECK(!done && !error); /* nothing after [DONE] or an error event */
        FUZZ_CHECK(len - at > 6 && !memcmp(all + at, "data: ", 6));
        char *end = strstr(all + at, "\n\n");
        FUZZ_CHECK(end != NULL);
        size_t n = (size_t)(end - (all + at)) - 6;
        if (n == 6 && !memcmp(all + at + 6, "[DONE]", 6)) {
            done = true;
        } else {
            json_error_t je;
            json_t *j = json_loadb(all + at + 6, n, 0, &je);
            FUZZ_CHECK(json_is_object(j));
            if (json_object_get(j, "error")) {
                check_error_object(j);
                error = true;
            } else {
                FUZZ_CHECK(json_is_array(json_object_get(j, "choices")));
                size_t i;
                json_t *c;
                json_array_foreach(json_object_get(j, "choices"), i, c) check_ids(json_object_get(c, "tokens"));
            }
            json_decref(j);
        }
        at = (size_t)(end - all) + 2;
    }
    FUZZ_CHECK(done || error);
    free(all);
}

/* ------------------------------------------------------------- requests */

typedef struct ids {
    char id[MAX_CTX_IDS][40];
    int n;
} ids;

enum { OP_CHAT, OP_COMPL, OP_TOK, OP_DETOK, OP_CREATE, OP_LIST, OP_INFO, OP_FORK, OP_APPEND, OP_TRUNC, OP_GEN, OP_DEL,
       OP_MODELS, OP_METRICS, OP_HEALTH, OP_RAW };

/* The number of choices a request asks for ("n", default 1). */
static long long asked_n(const char *body, size_t len) {
    json_t *b = json_loadb(body, len, JSON_REJECT_DUPLICATES, NULL);
    json_t *n = json_object_get(b, "n");
    long long k = json_is_integer(n) ? json_integer_value(n) : 1;
    json_decref(b);
    return k;
}

static void request(srv *s, int sel, const char *body, size_t len, ids *known) {
    int op = sel & 15, who = (sel >> 4) & 7;
    char url[128];
    const char *method = "POST";
    char ctx[48];
    if (who == 6) snprintf(ctx, sizeof ctx, "ctx-987654321");
    else if (who == 7) snprintf(ctx, sizeof ctx, "ctx-%%00/../x");
    else if (known->n) snprintf(ctx, sizeof ctx, "%s", known->id[who % known->n]);
    else snprintf(ctx, sizeof ctx, "ctx-0");
    switch (op) {
    case OP_CHAT: snprintf(url, sizeof url, "/v1/chat/completions"); break;
    case OP_COMPL: snprintf(url, sizeof url, "/v1/completions"); break;
    case OP_TOK: snprintf(url, sizeof url, "/tokenize"); break;
    case OP_DETOK: snprintf(url, sizeof url, "/detokenize"); break;
    case OP_CREATE: snprintf(url, sizeof url, "/v1/contexts"); break;
    case OP_LIST: snprintf(url, sizeof url, "/v1/contexts"), method = "GET"; break;
    case OP_INFO: snprintf(url, sizeof url, "/v1/contexts/%s", ctx), method = "GET"; break;
    case OP_FORK: snprintf(url, sizeof url, "/v1/contexts/%s/fork", ctx); break;
    case OP_APPEND: snprintf(url, sizeof url, "/v1/contexts/%s/append", ctx); break;
    case OP_TRUNC: snprintf(url, sizeof url, "/v1/contexts/%s/truncate", ctx); break;
    case OP_GEN: snprintf(url, sizeof url, "/v1/contexts/%s/generate", ctx); break;
    case OP_DEL: snprintf(url, sizeof url, "/v1/contexts/%s", ctx), method = "DELETE"; break;
    case OP_MODELS: snprintf(url, sizeof url, "/v1/models"), method = "GET"; break;
    case OP_METRICS: snprintf(url, sizeof url, "/metrics"), method = "GET"; break;
    case OP_HEALTH: snprintf(url, sizeof url, "/health"), method = "GET"; break;
    default: { /* "METHOD PATH\n" then the body */
        const char *nl = memchr(body, '\n', len), *sp = memchr(body, ' ', nl ? (size_t)(nl - body) : len);
        if (!nl || !sp || sp - body > 15 || nl - sp - 1 > 100) return;
        static char m[16];
        memcpy(m, body, (size_t)(sp - body));
        m[sp - body] = 0;
        memcpy(url, sp + 1, (size_t)(nl - sp - 1));
        url[nl - sp - 1] = 0;
        method = m;
        len -= (size_t)(nl + 1 - body);
        body = nl + 1;
    }
    }
    if (op == OP_CHAT) s->tpl = (pkv_tpl)(who % PKV_TPL_COUNT); /* 0: no template -> a 400 */
    srv_conn sc = {-1, NULL, 30, NULL, "application/json"};
    srv_out o = {0};
    srv_handle(s, method, url, body, len, NULL, &sc, &o);
    if (getenv("FUZZ_VERBOSE")) {
        char *t = o.json ? json_dumps(o.json, JSON_COMPACT) : NULL;
        fprintf(stderr, "%s %s -> %d %.200s\n", method, url, o.status, t ? t : o.stream ? "(stream)" : "(text)");
        free(t);
    }
    FUZZ_CHECK(o.status >= 100 && o.status < 600);
    FUZZ_CHECK((o.json != NULL) + (o.text != NULL) + (o.stream != NULL) + (o.body != NULL) == 1);
    if (o.body) { /* a lazily written JSON answer: read whole, it must parse */
        FUZZ_CHECK(o.status == 200);
        size_t blen = 0, bcap = 4096;
        char *all = malloc(bcap);
        FUZZ_CHECK(all != NULL);
        for (;;) {
            if (bcap - blen < 1024) {
                char *p = realloc(all, bcap *= 2);
                FUZZ_CHECK(p != NULL);
                all = p;
            }
            ssize_t k = o.body->read(o.body, all + blen, bcap - blen - 1);
            FUZZ_CHECK(k >= 0);
            if (k == 0) break;
            blen += (size_t)k;
        }
        o.body->free(o.body);
        json_error_t je;
        o.json = json_loadb(all, blen, 0, &je);
        free(all);
        FUZZ_CHECK(o.json != NULL);
    }
    if (o.stream) {
        FUZZ_CHECK(o.status == 200);
        check_stream(o.stream);
    } else if (o.json) {
        char *t = json_dumps(o.json, JSON_COMPACT);
        FUZZ_CHECK(t != NULL);
        free(t);
        if (o.status >= 400) check_error_object(o.json);
        if (o.status == 200 && (op == OP_CHAT || op == OP_COMPL)) {
            json_t *ch = json_object_get(o.json, "choices");
            FUZZ_CHECK(json_is_array(ch) && (long long)json_array_size(ch) == asked_n(body, len));
        }
        if (o.status == 200 && op == OP_TOK) check_ids(json_object_get(o.json, "tokens"));
        json_t *id = json_object_get(o.json, "id"); /* a context made (also through OP_RAW) */
        if (o.status == 200 && json_is_string(id) && !strncmp(json_string_value(id), "ctx-", 4) && known->n < MAX_CTX_IDS)
            snprintf(known->id[known->n++], sizeof known->id[0], "%s", json_string_value(id));
        json_decref(o.json);
    } else {
        FUZZ_CHECK(o.status == 200);
        free(o.text);
    }
}

/* On the worker thread, between steps: pages still referenced. */
static bool pages_used(srv_gen *g, void *arg) {
    pkv_kv_stats st;
    pkv_kv_stats_get(srv_gen_cache(g), &st);
    *(int64_t *)arg = st.pages_used;
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > 1 << 16) return 0;
    srv *s = &g_srv[data[0] >> 7];
    ids known = {.n = 0};
    char *buf = malloc(size + 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    buf[size] = 0;
    size_t at = 0;
    for (int r = 0; r < MAX_REQS && at < size; r++) {
        size_t len = strnlen(buf + at, size - at);
        if (len > 0) request(s, (unsigned char)buf[at], buf + at + 1, len - 1, &known);
        at += len + 1;
    }
    free(buf);
    /* Delete every context the input made (whatever the input deleted already
     * answers 404) and check that nothing holds a page any more. */
    for (int i = 0; i < known.n; i++) {
        char url[96];
        snprintf(url, sizeof url, "/v1/contexts/%s", known.id[i]);
        srv_conn sc = {-1, NULL, 30, NULL, "application/json"};
        srv_out o = {0};
        srv_handle(s, "DELETE", url, "", 0, NULL, &sc, &o);
        FUZZ_CHECK(o.status == 200 || o.status == 404);
        json_decref(o.json);
    }
    int64_t used = -1;
    srv_gen_call(s->g, pages_used, &used);
    FUZZ_CHECK(used == 0);
    return 0;
}
