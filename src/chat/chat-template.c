/* Chat templates: GGUF files carry a Jinja template (tokenizer.chat_template),
 * which serve and run -cnv run with its interpreter (jinja*.c) the way llama.cpp's
 * server does (common/chat.cpp): the same message normalisation, the same
 * workarounds for templates without a system role or with object arguments,
 * the same variables. --chat-template NAME picks one of the built-in family
 * templates below; the family markers still name the end-of-turn tokens. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdarg.h>
#include <strings.h>
#include <time.h>

#include <jansson.h>

#include "chat/chat-families.h"
#include "chat/jinja.h"
#include "chat/chat.h"

static const char *const k_names[PKV_TPL_COUNT] = {
    [PKV_TPL_NONE] = "none",       [PKV_TPL_CHATML] = "chatml", [PKV_TPL_LLAMA3] = "llama3",
    [PKV_TPL_LLAMA2] = "llama2",   [PKV_TPL_MISTRAL] = "mistral", [PKV_TPL_GEMMA] = "gemma",
    [PKV_TPL_PHI3] = "phi3",       [PKV_TPL_DEEPSEEK] = "deepseek",
};

const char *pkv_tpl_name(pkv_tpl t) { return t >= 0 && t < PKV_TPL_COUNT ? k_names[t] : "?"; }

const char *pkv_tpl_names(void) { return "chatml (qwen), llama3, llama2, mistral, gemma, phi3, deepseek"; }

pkv_tpl pkv_tpl_from_name(const char *name) {
    if (!name) return PKV_TPL_NONE;
    if (!strcasecmp(name, "qwen") || !strcasecmp(name, "qwen2") || !strcasecmp(name, "qwen3")) return PKV_TPL_CHATML;
    if (!strcasecmp(name, "llama-3") || !strcasecmp(name, "llama31")) return PKV_TPL_LLAMA3;
    if (!strcasecmp(name, "phi-3")) return PKV_TPL_PHI3;
    if (!strcasecmp(name, "deepseek3") || !strcasecmp(name, "deepseek-v3")) return PKV_TPL_DEEPSEEK;
    for (int t = 1; t < PKV_TPL_COUNT; t++)
        if (!strcasecmp(name, k_names[t])) return (pkv_tpl)t;
    return PKV_TPL_NONE;
}

static bool has(const char *s, size_t n, const char *marker) {
    size_t m = strlen(marker);
    if (m > n) return false;
    for (size_t i = 0; i + m <= n; i++)
        if (s[i] == marker[0] && !memcmp(s + i, marker, m)) return true;
    return false;
}

pkv_tpl pkv_tpl_detect(const char *t, size_t n) {
    if (!t || !n) return PKV_TPL_NONE;
    /* Most specific markers first: a template may mention another family's
     * tokens only as part of its own (none of these overlap in practice). */
    if (has(t, n, "<|start_header_id|>") && has(t, n, "<|eot_id|>")) return PKV_TPL_LLAMA3;
    if (has(t, n, "<|im_start|>")) return PKV_TPL_CHATML;
    if (has(t, n, "<start_of_turn>")) return PKV_TPL_GEMMA;
    if (has(t, n, "<\xef\xbd\x9cUser\xef\xbd\x9c>") || has(t, n, "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>"))
        return PKV_TPL_DEEPSEEK;
    if (has(t, n, "<|user|>") && has(t, n, "<|end|>") && has(t, n, "<|assistant|>")) return PKV_TPL_PHI3;
    if (has(t, n, "[INST]")) return has(t, n, "<<SYS>>") ? PKV_TPL_LLAMA2 : PKV_TPL_MISTRAL;
    return PKV_TPL_NONE;
}

const char *const *pkv_tpl_end_texts(pkv_tpl t) {
    static const char *const chatml[] = {"<|im_end|>", "<|endoftext|>", NULL};
    static const char *const llama3[] = {"<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", NULL};
    static const char *const inst[] = {"</s>", NULL};
    static const char *const gemma[] = {"<end_of_turn>", "<eos>", NULL};
    static const char *const phi3[] = {"<|end|>", "<|endoftext|>", NULL};
    static const char *const deepseek[] = {"<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>", NULL};
    static const char *const none[] = {NULL};
    switch (t) {
    case PKV_TPL_CHATML: return chatml;
    case PKV_TPL_LLAMA3: return llama3;
    case PKV_TPL_LLAMA2:
    case PKV_TPL_MISTRAL: return inst;
    case PKV_TPL_GEMMA: return gemma;
    case PKV_TPL_PHI3: return phi3;
    case PKV_TPL_DEEPSEEK: return deepseek;
    default: return none;
    }
}

/* ------------------------------------------------------- family templates */

const char *pkv_tpl_source(pkv_tpl t) {
    switch (t) {
    case PKV_TPL_CHATML: return PKV_JINJA_CHATML;
    case PKV_TPL_LLAMA3: return PKV_JINJA_LLAMA3;
    case PKV_TPL_LLAMA2: return PKV_JINJA_LLAMA2;
    case PKV_TPL_MISTRAL: return PKV_JINJA_MISTRAL;
    case PKV_TPL_GEMMA: return PKV_JINJA_GEMMA;
    case PKV_TPL_PHI3: return PKV_JINJA_PHI3;
    case PKV_TPL_DEEPSEEK: return PKV_JINJA_DEEPSEEK;
    default: return NULL;
    }
}

/* ------------------------------------------------------------- chat layer */

typedef enum {
    PKV_CONT_AUTO,   // generation prompt cut at think_start, then think_start, reasoning, think_end, content
    PKV_CONT_GPTOSS, // analysis channel message, then final channel message
    PKV_CONT_GEMMA4, // <|turn>model, <|channel>thought, reasoning, <channel|>, content
    PKV_CONT_QWEN3X, // <|im_start|>assistant and, when the template thinks, a <think> block
} pkv_cont_style;

struct pkv_chat {
    pkv_jinja *j;
    char *src, *bos, *eos;
    bool add_bos, add_eos;
    /* what the template does with its inputs, found by rendering probe
     * conversations as llama.cpp's jinja::caps_get does */
    bool string_content, typed_content, system_role, tool_calls, object_arguments;
    /* how a continued final assistant message is written after the prompt
     * (llama.cpp: a dedicated handler for some template families, else the
     * differential autoparser's reasoning markers) */
    pkv_cont_style cont_style;
    char *think_start, *think_end; // reasoning markers as rendered, "" when none (autoparser style only)
};

static json_t *jparse(const char *s) { return json_loads(s, 0, NULL); }

/* The renders of the template analysis at load (about ten): each small, so a
 * hostile template cannot hold the server's start for long. */
#define PROBE_LIMITS                                                                                      \
    {.max_steps = 1000000, .max_output = (size_t)1 << 20, .max_memory = (size_t)64 << 20,               \
     .max_work = (int64_t)64 << 20, .max_time_ms = 250}

const char *pkv_chat_source(const pkv_chat *c) { return c ? c->src : NULL; }

/* Render one probe context; true when it rendered. */
static bool probe(const pkv_chat *c, const char *ctx_json, const char *const *paths, int n, unsigned *flags, char **out) {
    json_t *ctx = jparse(ctx_json);
    if (!ctx) return false;
    pkv_jinja_probe pr = {paths, n, flags};
    pkv_jinja_error e;
    size_t len;
    pkv_jinja_limits lim = PROBE_LIMITS;
    for (int i = 0; i < n; i++) flags[i] = 0;
    char *r = pkv_jinja_render(c->j, ctx, false, 0, &lim, &len, NULL, NULL, &pr, &e);
    json_decref(ctx);
    if (out) *out = r;
    else free(r);
    return r != NULL;
}

#define PROBE_CTX(MSGS, TOOLS) \
    "{\"messages\": " MSGS ", \"tools\": " TOOLS ", \"bos_token\": \"\", \"eos_token\": \"\", \"add_generation_prompt\": true}"
#define PROBE_TOOLS \
    "[{\"name\": \"tool\", \"type\": \"function\", \"function\": {\"name\": \"tool1\", \"description\": \"Tool description\", " \
    "\"parameters\": {\"type\": \"object\", \"properties\": {\"arg\": {\"type\": \"string\", \"description\": \"Arg description\"}}, " \
    "\"required\": [\"arg\"]}}}]"
#define PROBE_TOOL_MSGS(ARGS) \
    "[{\"role\": \"user\", \"content\": \"User message\"}, {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": " \
    "[{\"id\": \"call00001\", \"type\": \"function\", \"function\": {\"name\": \"tool1\", \"arguments\": " ARGS "}}]}, " \
    "{\"role\": \"tool\", \"content\": \"Tool response\", \"tool_call_id\": \"call00001\"}, " \
    "{\"role\": \"assistant\", \"content\": \"The tool response was 'tool response'\"}, {\"role\": \"user\", \"content\": \"User message\"}]"

static void find_caps(pkv_chat *c) {
    unsigned f[4];
    char *out = NULL;
    c->string_content = true;
    c->typed_content = false;
    c->system_role = true;
    c->tool_calls = true;
    c->object_arguments = false;
    static const char *const content[] = {"messages.0.content"};
    bool ok = probe(c, PROBE_CTX("[{\"role\": \"user\", \"content\": \"STRING_MARKER\"}]", "[]"), content, 1, f, &out);
    bool checks_string = f[0] & PKV_JINJA_OP_STRING, as_array = f[0] & PKV_JINJA_OP_ARRAY;
    if (as_array) c->typed_content = true;
    if (!ok) c->string_content = false;
    else if (as_array && !strstr(out, "STRING_MARKER")) c->string_content = false;
    free(out);
    if (checks_string) {
        ok = probe(c, PROBE_CTX("[{\"role\": \"user\", \"content\": []}]", "[]"), content, 1, f, NULL);
        if (ok && (f[0] & PKV_JINJA_OP_ARRAY)) c->typed_content = true;
    }
    probe(c, PROBE_CTX("[{\"role\": \"system\", \"content\": \"System message\"}, {\"role\": \"user\", \"content\": \"User message\"}]", "[]"),
          content, 1, f, NULL);
    if (!(f[0] & PKV_JINJA_USED)) c->system_role = false;
    static const char *const tp[] = {"tools.0.function.name", "messages.1.tool_calls", "messages.1.tool_calls.0.function.arguments.arg"};
    ok = probe(c, PROBE_CTX(PROBE_TOOL_MSGS("{\"arg\": \"value\"}"), PROBE_TOOLS), tp, 3, f, NULL);
    if (ok) {
        if (!(f[1] & PKV_JINJA_USED)) c->tool_calls = false;
        else if (f[2] & PKV_JINJA_USED) c->object_arguments = true;
    }
    if (!c->object_arguments && (!ok || c->tool_calls)) {
        ok = probe(c, PROBE_CTX(PROBE_TOOL_MSGS("\"{\\\"arg\\\": \\\"value\\\"}\""), PROBE_TOOLS), tp, 2, f, NULL);
        if (!ok) c->tool_calls = false;
        else if (!(f[1] & PKV_JINJA_USED)) c->tool_calls = false;
    }
}

void pkv_chat_free(pkv_chat *c) {
    if (!c) return;
    pkv_jinja_free(c->j);
    free(c->src);
    free(c->bos);
    free(c->eos);
    free(c->think_start);
    free(c->think_end);
    free(c);
}

static char *dupn(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = 0;
    }
    return p;
}

/* llama.cpp patches two known template bugs before parsing (common_chat_templates_init) */
static void patch_source(char **src) {
    static const char *const fixes[][3] = {
        {"<|channel|>", "in message.content or",
         "{%- if \"<|channel|>analysis<|message|>\" in message.content or \"<|channel|>final<|message|>\" in message.content %}"},
        {"[TOOL_CALLS]", "if (message['content'] is none or",
         "{%- if (message['content'] is none or message['content'] == '' or message['content']|length == 0) and "
         "(message['tool_calls'] is not defined or message['tool_calls'] is none or message['tool_calls']|length == 0) %}"},
    };
    for (size_t i = 0; i < sizeof fixes / sizeof fixes[0]; i++) {
        if (!strstr(*src, fixes[i][0]) || !strstr(*src, fixes[i][1])) continue;
        const char *from = fixes[i][2], *to = "{%- if false %}";
        char *at;
        while ((at = strstr(*src, from))) {
            size_t n = strlen(*src), fl = strlen(from), tl = strlen(to);
            memmove(at + tl, at + fl, n - (size_t)(at - *src) - fl + 1);
            memcpy(at, to, tl);
        }
    }
}

static void find_reasoning(pkv_chat *c);

pkv_chat *pkv_chat_init(const char *src, size_t len, const char *bos, const char *eos, bool add_bos, bool add_eos,
                        char *err, size_t err_size) {
    pkv_chat *c = calloc(1, sizeof *c);
    if (!c || !(c->src = dupn(src, len)) || !(c->bos = strdup(bos ? bos : "")) || !(c->eos = strdup(eos ? eos : ""))) {
        snprintf(err, err_size, "out of memory");
        pkv_chat_free(c);
        return NULL;
    }
    patch_source(&c->src);
    c->add_bos = add_bos;
    c->add_eos = add_eos;
    pkv_jinja_error e;
    if (!(c->j = pkv_jinja_parse(c->src, strlen(c->src), &e))) {
        snprintf(err, err_size, "the chat template does not parse: %s", e.msg);
        pkv_chat_free(c);
        return NULL;
    }
    find_caps(c);
    find_reasoning(c);
    if (!c->think_start || !c->think_end) {
        snprintf(err, err_size, "out of memory");
        pkv_chat_free(c);
        return NULL;
    }
    return c;
}

/* The vocabulary's text of a special token ("" when there is none). */
static void token_text(const pkv_model *m, int32_t id, char *buf, size_t size) {
    size_t n = 0;
    if (id < 0 || pkv_model_token_piece(m, id, true, buf, size - 1, &n) != PKV_OK) n = 0;
    buf[n] = 0;
}

/* Whether the tokenizer puts BOS first (tokenizing "" with add_special). */
static bool adds_bos(const pkv_model *m) {
    int32_t ids[4];
    size_t n = 0;
    return pkv_model_bos(m) >= 0 && pkv_model_tokenize(m, "", 0, true, false, ids, 4, &n) == PKV_OK && n >= 1 &&
           ids[0] == pkv_model_bos(m);
}

pkv_chat *pkv_chat_init_model(const pkv_model *m, const char *src, size_t len, char *err, size_t err_size) {
    char bos[256], eos[256];
    token_text(m, pkv_model_bos(m), bos, sizeof bos);
    token_text(m, pkv_model_eos(m), eos, sizeof eos);
    return pkv_chat_init(src, len, bos, eos, adds_bos(m), false, err, err_size);
}

bool pkv_chat_system_role(const pkv_chat *c) { return c->system_role; }

/* ---- request to template context (llama.cpp's oaicompat_chat_params_parse and
 * common_chat_templates_apply_jinja) */

typedef struct creq {
    char *err;
    size_t err_size;
    int status;
} creq;

static bool bad(creq *q, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool bad(creq *q, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(q->err, q->err_size, fmt, ap);
    va_end(ap);
    q->status = 400;
    return false;
}

static const char *str_or(json_t *o, const char *k, const char *def) {
    json_t *v = json_object_get(o, k);
    return json_is_string(v) ? json_string_value(v) : def;
}

/* text parts joined by newlines (common_chat_msg's content_parts as concatenated) */
static json_t *concat_parts(json_t *parts) {
    size_t total = 0, i;
    json_t *p;
    json_array_foreach(parts, i, p) total += json_string_length(json_object_get(p, "text")) + 1;
    char *buf = malloc(total + 1);
    if (!buf) return NULL;
    size_t n = 0;
    json_array_foreach(parts, i, p) {
        json_t *t = json_object_get(p, "text");
        if (strcmp(str_or(p, "type", ""), "text")) continue;
        if (n) buf[n++] = '\n';
        memcpy(buf + n, json_string_value(t), json_string_length(t));
        n += json_string_length(t);
    }
    json_t *r = json_stringn_nocheck(buf, n);
    free(buf);
    return r;
}

/* One message as llama.cpp hands it to a template: role, content (a string, the
 * parts as {type, text}, or ""), reasoning_content, name, tool_call_id and
 * tool_calls [{type, function: {name, arguments (a string)}, id}]. */
static json_t *norm_msg(const pkv_chat *c, json_t *m, size_t i, creq *q) {
    if (!json_is_object(m)) return bad(q, "Failed to parse messages: Expected 'message' to be an object"), NULL;
    json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content"), *tcs = json_object_get(m, "tool_calls");
    if (!role) return bad(q, "Failed to parse messages: Missing 'role' in message"), NULL;
    if (!json_is_string(role)) return bad(q, "'messages[%zu].role' must be a string", i), NULL;
    const char *r = json_string_value(role);
    if (strcmp(r, "assistant") && !content) return bad(q, "All non-assistant messages must contain 'content'"), NULL;
    if (!strcmp(r, "assistant") && !content && !tcs)
        return bad(q, "Assistant message must contain either 'content' or 'tool_calls'!"), NULL;
    json_t *o = json_object();
    json_object_set(o, "role", role);
    if (json_is_string(content) && json_string_length(content)) {
        json_object_set(o, "content", content);
    } else if (json_is_array(content) && json_array_size(content)) {
        json_t *parts = json_array();
        size_t k;
        json_t *p;
        json_array_foreach(content, k, p) {
            const char *ty = str_or(p, "type", NULL);
            json_t *tx = json_object_get(p, "text");
            if (!ty) return json_decref(parts), json_decref(o), bad(q, "Failed to parse messages: Missing content part type"), NULL;
            if (strcmp(ty, "text"))
                return json_decref(parts), json_decref(o),
                       bad(q, "'messages[%zu].content[%zu]': content parts of type '%s' are not supported (text only)", i, k, ty), NULL;
            if (!json_is_string(tx)) return json_decref(parts), json_decref(o), bad(q, "'messages[%zu].content[%zu].text' must be a string", i, k), NULL;
            json_array_append_new(parts, json_pack("{s:s,s:O}", "type", "text", "text", tx));
        }
        json_object_set_new(o, "content", parts);
    } else if (content && !json_is_null(content) && !json_is_string(content) && !json_is_array(content)) {
        json_decref(o);
        return bad(q, "Failed to parse messages: Invalid 'content' type: expected string or array"), NULL;
    } else {
        json_object_set_new(o, "content", json_string(""));
    }
    /* caps: a template that reads only strings gets parts joined; one that reads
     * only parts gets a string wrapped */
    json_t *ct = json_object_get(o, "content");
    if (c->string_content && !c->typed_content && json_is_array(ct)) {
        json_t *s = concat_parts(ct);
        if (s) json_object_set_new(o, "content", s);
    } else if (!c->string_content && c->typed_content && json_is_string(ct)) {
        json_object_set_new(o, "content", json_pack("[{s:s,s:O}]", "type", "text", "text", ct));
    }
    const char *rc = str_or(m, "reasoning_content", "");
    if (*rc) json_object_set(o, "reasoning_content", json_object_get(m, "reasoning_content"));
    const char *nm = str_or(m, "name", "");
    if (*nm) json_object_set(o, "name", json_object_get(m, "name"));
    const char *tci = str_or(m, "tool_call_id", "");
    if (*tci) json_object_set(o, "tool_call_id", json_object_get(m, "tool_call_id"));
    if (tcs && json_is_array(tcs) && json_array_size(tcs)) {
        json_t *out = json_array();
        size_t k;
        json_t *tc;
        json_array_foreach(tcs, k, tc) {
            json_t *fn = json_object_get(tc, "function"), *args = json_object_get(fn, "arguments");
            if (!json_is_object(tc) || strcmp(str_or(tc, "type", ""), "function") || !json_is_object(fn) ||
                !json_is_string(json_object_get(fn, "name")) || !args) {
                json_decref(out);
                json_decref(o);
                return bad(q, "Failed to parse messages: 'messages[%zu].tool_calls[%zu]' must be {\"type\": \"function\", "
                              "\"function\": {\"name\", \"arguments\"}}", i, k), NULL;
            }
            json_t *a = json_is_string(args) ? json_incref(args) : NULL;
            if (!a) {
                char *d = json_dumps(args, JSON_COMPACT | JSON_ENCODE_ANY | JSON_PRESERVE_ORDER);
                a = json_string(d ? d : "");
                free(d);
            }
            json_t *e = json_pack("{s:s,s:{s:O,s:o}}", "type", "function", "function", "name", json_object_get(fn, "name"), "arguments", a);
            const char *id = str_or(tc, "id", "");
            if (*id) json_object_set(e, "id", json_object_get(tc, "id"));
            json_array_append_new(out, e);
        }
        json_object_set_new(o, "tool_calls", out);
    }
    return o;
}

/* object arguments: tool-call argument strings parsed to JSON */
static bool args_to_objects(json_t *msgs, creq *q) {
    size_t i, k;
    json_t *m, *tc;
    json_array_foreach(msgs, i, m) {
        json_array_foreach(json_object_get(m, "tool_calls"), k, tc) {
            json_t *fn = json_object_get(tc, "function"), *a = json_object_get(fn, "arguments");
            if (!json_is_string(a)) continue;
            json_error_t je;
            json_t *v = json_loadb(json_string_value(a), json_string_length(a), JSON_DECODE_ANY, &je);
            if (!v) return bad(q, "Failed to parse tool call arguments as JSON: %s", je.text);
            json_object_set_new(fn, "arguments", v);
        }
    }
    return true;
}

static void put_date(json_t *ctx, int64_t now) {
    time_t t = now ? (time_t)now : time(NULL);
    struct tm tm;
    char b[64];
    localtime_r(&t, &tm);
    strftime(b, sizeof b, "%b %d %Y", &tm);
    json_object_set_new(ctx, "datetime", json_string(b));
    strftime(b, sizeof b, "%d %b %Y", &tm);
    json_object_set_new(ctx, "date_string", json_string(b));
}

static char *render_ctx(const pkv_chat *c, json_t *ctx, int64_t now, const pkv_jinja_limits *lim, size_t *len, size_t **spans,
                        size_t *n_spans, creq *q) {
    pkv_jinja_error e;
    char *out = pkv_jinja_render(c->j, ctx, true, now, lim, len, spans, n_spans, NULL, &e);
    if (!out) {
        q->status = e.kind == PKV_JINJA_ENOMEM ? 500 : e.kind == PKV_JINJA_EBUDGET ? 503 : e.kind == PKV_JINJA_ECANCEL ? 499 : 400;
        if (e.kind == PKV_JINJA_ERAISE) snprintf(q->err, q->err_size, "%s", e.msg);
        else snprintf(q->err, q->err_size, "chat template error: %s", e.msg);
        return NULL;
    }
    /* BOS/EOS text the tokenizer adds anyway is taken off (llama.cpp does the same) */
    size_t bl = strlen(c->bos), el = strlen(c->eos), cut = 0;
    if (c->add_bos && bl && *len >= bl && !memcmp(out, c->bos, bl)) cut = bl;
    if (c->add_eos && el && *len - cut >= el && !memcmp(out + *len - el, c->eos, el)) *len -= el;
    if (cut) {
        memmove(out, out + cut, *len - cut);
        *len -= cut;
    }
    out[*len] = 0;
    if (spans && *n_spans) { /* shift and clip the spans to the kept text */
        size_t k = 0;
        for (size_t i = 0; i < *n_spans; i++) {
            size_t a = (*spans)[2 * i], b = (*spans)[2 * i + 1];
            a = a > cut ? a - cut : 0;
            b = b > cut ? b - cut : 0;
            if (b > *len) b = *len;
            if (a < b) {
                (*spans)[2 * k] = a;
                (*spans)[2 * k + 1] = b;
                k++;
            }
        }
        *n_spans = k;
    }
    return out;
}

/* ---- reasoning markers for continuing a final assistant message: the facts of
 * llama.cpp's differential template analysis (common/chat-diff-analyzer.cpp,
 * analyze_reasoning and its source-text workarounds), on the same probes. */

#define R_USER "U_USER_MSG Hello END_U"
#define R_ASST "A_ASST_MSG I can help END_A"
#define R_THINK "REASON_PART I am thinking END_R"

static char *render_json(const pkv_chat *c, json_t *ctx) {
    if (!ctx) return NULL;
    pkv_jinja_error e;
    size_t len;
    pkv_jinja_limits lim = PROBE_LIMITS;
    json_object_set_new(ctx, "bos_token", json_string(c->bos));
    json_object_set_new(ctx, "eos_token", json_string(c->eos));
    put_date(ctx, 1);
    char *r = pkv_jinja_render(c->j, ctx, false, 1, &lim, &len, NULL, NULL, NULL, &e);
    json_decref(ctx);
    return r;
}

static bool cws(char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r'; }

/* the end of a <...> or [...] marker starting at s[i], or 0 when none starts there */
static size_t marker_end(const char *s, size_t i) {
    char cl = s[i] == '<' ? '>' : s[i] == '[' ? ']' : 0;
    if (!cl) return 0;
    const char *e = strchr(s + i + 1, cl);
    return e ? (size_t)(e - s) + 1 : 0;
}

/* s without leading and trailing whitespace, malloc'd */
static char *trim_dup(const char *s, size_t n) {
    while (n && cws(*s)) s++, n--;
    while (n && cws(s[n - 1])) n--;
    return dupn(s, n);
}

/* segments of text split at <...> and [...] markers, whitespace-only text
 * segments dropped (segmentize_markers + prune_whitespace_segments); returns
 * the count, writes at most max [start, end, is_marker] triples */
static size_t segments(const char *t, size_t (*seg)[3], size_t max) {
    size_t n = 0, last = 0, i = 0, len = strlen(t);
    while (i < len) {
        size_t e = (t[i] == '<' || t[i] == '[') ? marker_end(t, i) : 0;
        if (!e) {
            i++;
            continue;
        }
        size_t parts[2][3] = {{last, i, 0}, {i, e, 1}};
        for (int k = 0; k < 2; k++) {
            size_t a = parts[k][0], b = parts[k][1];
            bool blank = true;
            for (size_t x = a; x < b; x++) blank = blank && cws(t[x]);
            if (blank) continue;
            if (n < max) memcpy(seg[n], parts[k], sizeof parts[k]);
            n++;
        }
        last = i = e;
    }
    bool blank = true;
    for (size_t x = last; x < len; x++) blank = blank && cws(t[x]);
    if (!blank) {
        if (n < max) seg[n][0] = last, seg[n][1] = len, seg[n][2] = 0;
        n++;
    }
    return n;
}

/* reasoning_content rendered in a past assistant turn: the marker before it
 * (with the whitespace up to it) is the start, the marker after it (with the
 * whitespace around it) the end; or only an end marker after it */
static void reasoning_presence(const pkv_chat *c, char **start, char **end) {
    char *a = render_json(c, json_pack("{s:[{s:s,s:s},{s:s,s:s}],s:b,s:b}", "messages", "role", "user", "content", R_USER,
                                       "role", "assistant", "content", R_ASST, "add_generation_prompt", 0,
                                       "enable_thinking", 1));
    char *b = render_json(c, json_pack("{s:[{s:s,s:s},{s:s,s:s,s:s}],s:b,s:b}", "messages", "role", "user", "content", R_USER,
                                       "role", "assistant", "content", R_ASST, "reasoning_content", R_THINK,
                                       "add_generation_prompt", 0, "enable_thinking", 1));
    const char *r = a && b && strcmp(a, b) ? strstr(b, R_THINK) : NULL;
    if (r) {
        size_t ri = (size_t)(r - b), re = ri + strlen(R_THINK);
        /* after: whitespace, a marker, whitespace */
        size_t x = re;
        while (cws(b[x])) x++;
        size_t me = marker_end(b, x), pe = me;
        while (pe && cws(b[pe])) pe++;
        /* before: a marker, whitespace */
        size_t y = ri, ps = 0;
        bool pre = false;
        while (y && cws(b[y - 1])) y--;
        if (y && (b[y - 1] == '>' || b[y - 1] == ']')) {
            char op = b[y - 1] == '>' ? '<' : '[';
            for (size_t k = y - 1; k-- > 0 && b[k] != b[y - 1];)
                if (b[k] == op) ps = k, pre = true;
        }
        if (pre && me) {
            free(*start);
            free(*end);
            *start = dupn(b + ps, ri - ps);
            *end = dupn(b + re, pe - re);
        } else if (me) {
            free(*end);
            *end = dupn(b + x, pe - x);
        }
    }
    free(a);
    free(b);
}

/* the generation prompt with enable_thinking false and true: what one adds
 * and the other lacks names the markers */
static void thinking_enabled(const pkv_chat *c, char **start, char **end) {
    char *A = render_json(c, json_pack("{s:[{s:s,s:s}],s:b,s:b}", "messages", "role", "user", "content", R_USER,
                                       "add_generation_prompt", 1, "enable_thinking", 0));
    char *B = render_json(c, json_pack("{s:[{s:s,s:s}],s:b,s:b}", "messages", "role", "user", "content", R_USER,
                                       "add_generation_prompt", 1, "enable_thinking", 1));
    if (!A || !B) goto out;
    size_t la = strlen(A), lb = strlen(B), p = 0, q = 0;
    while (p < la && p < lb && A[p] == B[p]) p++;
    while (q < la - p && q < lb - p && A[la - 1 - q] == B[lb - 1 - q]) q++;
    char *left = dupn(A + p, la - p - q), *right = dupn(B + p, lb - p - q);
    char *lt = trim_dup(left, strlen(left)), *rt = trim_dup(right, strlen(right));
    size_t llt = strlen(lt), lrt = strlen(rt);
    if (!*lt && *right) {
        if (*rt && lb >= lrt && !strcmp(B + lb - lrt, rt) && !**start) {
            free(*start);
            *start = right;
            right = NULL;
        }
    } else if (!*rt && *left) {
        if (*lt && la >= llt && !strcmp(A + la - llt, lt) && !**end) {
            size_t seg[1024][3];
            size_t n = segments(A, seg, 1024);
            if (n >= 2 && n <= 1024 && seg[n - 1][1] - seg[n - 1][0] == llt && !memcmp(A + seg[n - 1][0], lt, llt) &&
                seg[n - 2][2]) {
                free(*start);
                *start = dupn(A + seg[n - 2][0], seg[n - 2][1] - seg[n - 2][0]);
            }
            free(*end);
            *end = left;
            left = NULL;
        }
    } else if (*lt && *rt) {
        /* the tail of one output found in the other, followed by two markers */
        for (int dir = 0; dir < 2; dir++) {
            const char *base = dir ? A : B, *ext = dir ? B : A;
            size_t bl = strlen(base), el = strlen(ext), n = bl < 64 ? bl : 64;
            const char *anchor = base + bl - n, *pos = NULL;
            for (const char *f = strstr(ext, anchor); f; f = strstr(f + 1, anchor)) pos = f;
            if (!pos || (size_t)(pos - ext) + n >= el) continue;
            char *extra = trim_dup(pos + n, el - (size_t)(pos - ext) - n);
            size_t seg[3][3];
            if (*extra && segments(extra, seg, 3) == 2 && seg[0][2] && seg[1][2]) {
                if (!**start) {
                    free(*start);
                    *start = dupn(extra + seg[0][0], seg[0][1] - seg[0][0]);
                }
                if (!**end) {
                    free(*end);
                    *end = dupn(extra + seg[1][0], seg[1][1] - seg[1][0]);
                }
                free(extra);
                break;
            }
            free(extra);
        }
    }
    free(left);
    free(right);
    free(lt);
    free(rt);
out:
    free(A);
    free(B);
}

static void set_markers(pkv_chat *c, const char *start, const char *end) {
    free(c->think_start);
    free(c->think_end);
    c->think_start = strdup(start);
    c->think_end = strdup(end);
}

static void find_reasoning(pkv_chat *c) {
    const char *s = c->src;
    /* the families llama.cpp gives a dedicated handler (common_chat_try_specialized_template) */
    if (strstr(s, "<|channel|>")) c->cont_style = PKV_CONT_GPTOSS;
    else if (strstr(s, "'<|tool_call>call:'")) c->cont_style = PKV_CONT_GEMMA4;
    else if (strstr(s, "<tool_call>") && strstr(s, "<function=") && strstr(s, "<parameter=") &&
             !strstr(s, "'<tool_call><function=' ~ tool_call.name ~ '>'"))
        c->cont_style = PKV_CONT_QWEN3X;
    else c->cont_style = PKV_CONT_AUTO;
    char *start = strdup(""), *end = strdup("");
    if (c->cont_style == PKV_CONT_AUTO && start && end) {
        reasoning_presence(c, &start, &end);
        thinking_enabled(c, &start, &end);
    }
    c->think_start = start ? start : strdup("");
    c->think_end = end ? end : strdup("");
    if (!c->think_start || !c->think_end) return;
    /* llama.cpp's source-text workarounds that set reasoning markers */
    if (strstr(s, "content.split('</think>')") && !strstr(s, "reasoning_content") && !strstr(s, "<SPECIAL_12>") &&
        !*c->think_start && !*c->think_end)
        set_markers(c, "<think>", "</think>"); /* old Qwen / DeepSeek-R1 */
    if (strstr(s, "Write your thoughts between <think></think> and write your response between <response></response>"))
        set_markers(c, "<think>", "</think>"); /* Granite 3.3 */
    if (strstr(s, "<SPECIAL_10>") && strstr(s, "<SPECIAL_11>") && strstr(s, "<SPECIAL_12>") && strstr(s, "<TOOL_RESPONSE>"))
        set_markers(c, "<think>\n", "</think>"); /* Nemotron Nano v2 */
    if (strstr(s, "laguna_glm_thinking")) { /* Laguna: the bare tags */
        char *a = trim_dup(c->think_start, strlen(c->think_start)), *b = trim_dup(c->think_end, strlen(c->think_end));
        if (a && b) set_markers(c, a, b);
        free(a);
        free(b);
    }
}

char *pkv_chat_apply(const pkv_chat *c, json_t *body, int64_t now, size_t *len, size_t **spans, size_t *n_spans, int *status,
                     char *err, size_t err_size) {
    return pkv_chat_apply_ex(c, body, now, NULL, len, spans, n_spans, status, err, err_size);
}

/* Out of memory while applying: status 500. */
static bool oom(creq *q) {
    q->status = 500;
    snprintf(q->err, q->err_size, "out of memory");
    return false;
}

/* The request's messages checked and normalized (norm_msg); NULL (q says why). */
static json_t *apply_messages(const pkv_chat *c, json_t *body, creq *q) {
    json_t *jm = json_object_get(body, "messages");
    if (!jm) return bad(q, "'messages' is required"), NULL;
    if (!json_is_array(jm)) return bad(q, "Expected 'messages' to be an array"), NULL;
    if (json_array_size(jm) > 65536) return bad(q, "'messages' has more than 65536 messages"), NULL;
    json_t *msgs = json_array(), *m;
    size_t i;
    json_array_foreach(jm, i, m) {
        json_t *n = norm_msg(c, m, i, q);
        if (!n) {
            json_decref(msgs);
            return NULL;
        }
        json_array_append_new(msgs, n);
    }
    return msgs;
}

/* tools: {type, function: {name, description, parameters}} into *tl (NULL: none);
 * false (q says why) on a malformed list. */
static bool apply_tools(json_t *body, json_t **tl, creq *q) {
    json_t *tools = json_object_get(body, "tools"), *t;
    size_t i;
    *tl = NULL;
    if (!tools || json_is_null(tools)) return true;
    if (!json_is_array(tools)) return bad(q, "Failed to parse tools: Expected 'tools' to be an array");
    *tl = json_array();
    json_array_foreach(tools, i, t) {
        json_t *fn = json_object_get(t, "function");
        if (strcmp(str_or(t, "type", ""), "function") || !json_is_object(fn) || !json_is_string(json_object_get(fn, "name")))
            return bad(q, "Failed to parse tools: 'tools[%zu]' must be {\"type\": \"function\", \"function\": {\"name\", ...}}", i);
        json_t *params = json_object_get(fn, "parameters");
        json_array_append_new(*tl, json_pack("{s:s,s:{s:O,s:s,s:o}}", "type", "function", "function", "name",
                                             json_object_get(fn, "name"), "description", str_or(fn, "description", ""),
                                             "parameters", params && !json_is_null(params) ? json_incref(params) : json_object()));
    }
    if (!json_array_size(*tl)) {
        json_decref(*tl);
        *tl = NULL;
    }
    return true;
}

/* add_generation_prompt and continue_final_message: whether to add the
 * generation prompt, and the final assistant message to continue, taken out of
 * msgs into *cont (NULL: none); false (q says why) when they contradict. */
static bool apply_continue(json_t *body, json_t *msgs, bool *add_gen, json_t **cont, creq *q) {
    json_t *agp = json_object_get(body, "add_generation_prompt");
    *add_gen = json_is_boolean(agp) ? json_is_true(agp) : true;
    /* continuing the final assistant message: its text is appended after the
     * assistant's generation prompt instead of being closed by the template */
    json_t *cfm = json_object_get(body, "continue_final_message");
    bool continuing = json_is_true(cfm) || (json_is_string(cfm) && (!strcmp(json_string_value(cfm), "content") ||
                                                                   !strcmp(json_string_value(cfm), "reasoning_content")));
    size_t nm = json_array_size(msgs);
    json_t *last = nm ? json_array_get(msgs, nm - 1) : NULL;
    bool last_asst = last && !strcmp(str_or(last, "role", ""), "assistant");
    if (!continuing && last_asst) {
        if (nm >= 2 && !strcmp(str_or(json_array_get(msgs, nm - 2), "role", ""), "assistant"))
            return bad(q, "Cannot have 2 or more assistant messages at the end of the list.");
        continuing = true;
        *add_gen = false;
    }
    if (continuing && *add_gen) return bad(q, "Cannot set both add_generation_prompt and continue_final_message to true.");
    if (continuing && last_asst && json_array_size(json_object_get(last, "tool_calls")))
        return bad(q, "Cannot continue an assistant message that contains tool calls.");
    if (continuing && nm) {
        *cont = json_incref(last);
        json_array_remove(msgs, nm - 1);
    }
    return true;
}

/* The roles as the template reads them: developer is system (but for gpt-oss),
 * a system message folded into the first turn where the template has no system
 * role, tool-call arguments as objects where it wants them. */
static bool apply_roles(const pkv_chat *c, json_t *msgs, creq *q) {
    size_t i;
    json_t *m;
    if (!strstr(c->src, "<|channel|>")) { /* developer is system for every template but gpt-oss's */
        json_array_foreach(msgs, i, m) if (!strcmp(str_or(m, "role", ""), "developer")) json_object_set_new(m, "role", json_string("system"));
    } else {
        /* gpt-oss's template reads the reasoning as thinking and refuses content beside
         * it in a tool-call turn: as llama.cpp hands them over (the analysis channel
         * before the call) */
        json_array_foreach(msgs, i, m) {
            json_t *rc = json_object_get(m, "reasoning_content");
            if (!json_is_string(rc)) continue;
            json_object_set(m, "thinking", rc);
            if (json_array_size(json_object_get(m, "tool_calls"))) json_object_del(m, "content");
        }
    }
    if (!c->system_role && json_array_size(msgs) && !strcmp(str_or(json_array_get(msgs, 0), "role", ""), "system")) {
        json_t *first = json_array_get(msgs, 0), *second = json_array_get(msgs, 1);
        if (second) {
            const char *a = str_or(first, "content", ""), *b = str_or(second, "content", "");
            size_t la = strlen(a), lb = strlen(b);
            char *joined = malloc(la + lb + 2);
            if (!joined) return oom(q);
            memcpy(joined, a, la);
            joined[la] = '\n';
            memcpy(joined + la + 1, b, lb + 1);
            json_object_set_new(second, "content", json_string(joined));
            free(joined);
        }
        json_array_remove(msgs, 0);
    }
    return !c->object_arguments || args_to_objects(msgs, q);
}

/* The template's variables: messages, tokens, tools (taken from *tl), the date,
 * chat_template_kwargs, thinking and reasoning effort; NULL (q says why). */
static json_t *apply_context(const pkv_chat *c, json_t *body, json_t *msgs, json_t **tl, int64_t now, bool add_gen,
                             creq *q) {
    bool thinking = true;
    json_t *ctx = json_object();
    json_object_set(ctx, "messages", msgs);
    json_object_set_new(ctx, "bos_token", json_string(c->bos));
    json_object_set_new(ctx, "eos_token", json_string(c->eos));
    if (*tl) json_object_set_new(ctx, "tools", *tl);
    *tl = NULL;
    put_date(ctx, now);
    json_t *kw = json_object_get(body, "chat_template_kwargs");
    const char *k;
    json_t *v;
    if (json_is_object(kw)) json_object_foreach(kw, k, v) json_object_set(ctx, k, v);
    json_t *et = json_object_get(kw, "enable_thinking");
    if (json_is_boolean(et)) thinking = json_is_true(et);
    else if (json_is_string(et)) {
        bad(q, "invalid type for \"enable_thinking\" (expected boolean, got string)");
        json_decref(ctx);
        return NULL;
    }
    const char *effort = str_or(body, "reasoning_effort", NULL);
    if (effort && !strcmp(effort, "none")) {
        thinking = false;
        json_object_del(ctx, "reasoning_effort");
    } else if (effort && *effort) {
        json_object_set_new(ctx, "reasoning_effort", json_string(effort));
    }
    json_t *re = json_object_get(ctx, "reasoning_effort");
    if (json_is_string(re) && json_string_length(re)) json_object_set(ctx, "reasoning_strength", re);
    json_object_set_new(ctx, "enable_thinking", json_boolean(thinking));
    if (add_gen) json_object_set_new(ctx, "add_generation_prompt", json_true());
    return ctx;
}

/* The rendering of a continued message: what opens the assistant's turn (pre,
 * pre_len bytes), the reasoning markers and what goes between reasoning and
 * content (mid), by the template's continuation style. *gen holds the rendering
 * with the generation prompt (PKV_CONT_AUTO). */
typedef struct cont_parts {
    const char *pre, *start, *end, *mid;
    size_t pre_len;
} cont_parts;

static bool continuation_parts(const pkv_chat *c, json_t *ctx, int64_t now, const pkv_jinja_limits *lim, const char *out,
                               size_t len, char **gen, cont_parts *cp, creq *q) {
    *cp = (cont_parts){"", "", "", "", 0};
    switch (c->cont_style) {
    case PKV_CONT_GPTOSS:
        cp->pre = "<|start|>assistant<|channel|>analysis<|message|>";
        cp->mid = "<|end|><|start|>assistant<|channel|>final<|message|>";
        break;
    case PKV_CONT_GEMMA4:
        cp->pre = len >= 8 && !strcmp(out + len - 8, "<turn|>\n") ? "<|turn>model\n" : "";
        cp->start = "<|channel>thought\n";
        cp->mid = "<channel|>";
        break;
    case PKV_CONT_QWEN3X:
        cp->pre = "<|im_start|>assistant\n";
        if (strstr(c->src, "<think>")) cp->start = "<think>\n", cp->end = "\n</think>\n\n";
        break;
    case PKV_CONT_AUTO: {
        /* the generation prompt: what add_generation_prompt adds to the text,
         * cut where the reasoning start marker begins */
        size_t glen;
        json_object_set_new(ctx, "add_generation_prompt", json_true());
        if (!(*gen = render_ctx(c, ctx, now, lim, &glen, NULL, NULL, q))) return false;
        size_t p = 0;
        while (p < len && p < glen && out[p] == (*gen)[p]) p++;
        cp->pre = *gen + p;
        cp->start = c->think_start;
        cp->end = c->think_end;
        if (*cp->start && strstr(cp->pre, cp->start)) cp->pre_len = (size_t)(strstr(cp->pre, cp->start) - cp->pre);
        else cp->pre_len = strlen(cp->pre);
        return true;
    }
    }
    cp->pre_len = strlen(cp->pre);
    return true;
}

/* llama.cpp renders the messages before the continued one, then writes the
 * assistant's opening, the reasoning block its template analysis names
 * (find_reasoning) and the message's text: appended to *out (*len bytes), the
 * message's own text recorded in spans as data. */
static bool apply_continuation(const pkv_chat *c, json_t *ctx, json_t *cont, json_t *cfm, int64_t now,
                               const pkv_jinja_limits *lim, char **out, size_t *len, size_t **spans, size_t *n_spans,
                               char **gen, creq *q) {
    const char *content = str_or(cont, "content", "");
    const char *reasoning = str_or(cont, "reasoning_content", "");
    bool content_mode = !(json_is_string(cfm) && !strcmp(json_string_value(cfm), "reasoning_content")) &&
                        !(!*content && *reasoning && !json_is_string(cfm));
    cont_parts cp;
    if (!continuation_parts(c, ctx, now, lim, *out, *len, gen, &cp, q)) return false;
    /* the reasoning block is written whenever the style has one */
    bool block = c->cont_style == PKV_CONT_GPTOSS || *cp.start;
    if (!content_mode) cp.end = cp.mid = content = "";
    size_t need = *len + cp.pre_len + strlen(cp.start) + strlen(reasoning) + strlen(cp.end) + strlen(cp.mid) +
                  strlen(content) + 1;
    char *r = realloc(*out, need);
    if (!r) return oom(q);
    *out = r;
    memcpy(r + *len, cp.pre, cp.pre_len);
    *len += cp.pre_len;
    r[*len] = 0;
    const char *pieces[5] = {cp.start, block ? reasoning : "", cp.end, cp.mid, content};
    for (int pc = 0; pc < 5; pc++) {
        size_t a = *len, n = strlen(pieces[pc]);
        memcpy(r + *len, pieces[pc], n + 1);
        *len += n;
        if (spans && n && (pc == 1 || pc == 4)) { /* the message's own text is data */
            size_t *q2 = realloc(*spans, (2 * *n_spans + 2) * sizeof *q2);
            if (q2) {
                *spans = q2;
                q2[2 * *n_spans] = a;
                q2[2 * *n_spans + 1] = *len;
                (*n_spans)++;
            }
        }
    }
    return true;
}

char *pkv_chat_apply_ex(const pkv_chat *c, json_t *body, int64_t now, const struct pkv_jinja_limits *lim, size_t *len,
                        size_t **spans, size_t *n_spans, int *status, char *err, size_t err_size) {
    creq q = {err, err_size, 0};
    char *out = NULL, *gen = NULL;
    json_t *msgs = NULL, *ctx = NULL, *cont = NULL, *tl = NULL; /* tl: owned here until ctx takes it */
    bool add_gen = true;
    if (spans) {
        *spans = NULL;
        *n_spans = 0;
    }
    if ((msgs = apply_messages(c, body, &q)) && apply_tools(body, &tl, &q) &&
        apply_continue(body, msgs, &add_gen, &cont, &q) && apply_roles(c, msgs, &q) &&
        (ctx = apply_context(c, body, msgs, &tl, now, add_gen, &q)) &&
        (out = render_ctx(c, ctx, now, lim, len, spans, n_spans, &q)) && cont)
        apply_continuation(c, ctx, cont, json_object_get(body, "continue_final_message"), now, lim, &out, len, spans,
                           n_spans, &gen, &q);
    if (q.status && out) {
        free(out);
        out = NULL;
    }
    if (!out && spans) {
        free(*spans);
        *spans = NULL;
        *n_spans = 0;
    }
    free(gen);
    json_decref(msgs);
    json_decref(ctx);
    json_decref(cont);
    json_decref(tl);
    if (status) *status = q.status;
    return out;
}

/* ------------------------------------------------------------------ utf-8 */

/* Bytes of the sequence starting with lead byte c; 0 for a byte that cannot start one. */
static int seq_len(unsigned char c) {
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) return 2;
    if (c >= 0xE0 && c <= 0xEF) return 3;
    if (c >= 0xF0 && c <= 0xF4) return 4;
    return 0;
}

/* Length of a valid sequence at s[0..n), 0 if invalid, -k if it is a valid
 * but incomplete start of a sequence (k bytes present). */
static int seq_at(const unsigned char *s, size_t n) {
    int L = seq_len(s[0]);
    if (L == 0) return 0;
    if (L == 1) return 1;
    for (int i = 1; i < L; i++) {
        if ((size_t)i >= n) return -i;
        unsigned char c = s[i];
        if ((c & 0xC0) != 0x80) return 0;
        if (i == 1) { /* overlong, surrogate and above-U+10FFFF checks on the second byte */
            if (s[0] == 0xE0 && c < 0xA0) return 0;
            if (s[0] == 0xED && c > 0x9F) return 0;
            if (s[0] == 0xF0 && c < 0x90) return 0;
            if (s[0] == 0xF4 && c > 0x8F) return 0;
        }
    }
    return L;
}

size_t pkv_utf8_stable(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        size_t i = n - back;
        if ((u[i] & 0xC0) == 0x80) continue; /* a continuation byte: look further back */
        int r = seq_at(u + i, n - i);
        return r < 0 ? i : n;
    }
    return n;
}

char *pkv_utf8_sanitize(const char *s, size_t n, size_t *out_len) {
    const unsigned char *u = (const unsigned char *)s;
    char *out = malloc(n * 3 + 1), *o = out;
    if (!out) return NULL;
    size_t i = 0;
    while (i < n) {
        int r = u[i] ? seq_at(u + i, n - i) : 0;
        if (r > 0) {
            memcpy(o, u + i, (size_t)r);
            o += r;
            i += (size_t)r;
        } else {
            memcpy(o, "\xef\xbf\xbd", 3);
            o += 3;
            i++;
        }
    }
    *o = 0;
    *out_len = (size_t)(o - out);
    return out;
}

bool pkv_utf8_valid(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        int r = u[i] ? seq_at(u + i, n - i) : 0;
        if (r <= 0) return false;
        i += (size_t)r;
    }
    return true;
}
