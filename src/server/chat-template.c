/* Chat templates: GGUF files carry a Jinja template (tokenizer.chat_template).
 * pagekv does not run Jinja; it recognises the common families by the special
 * markers their templates contain and renders each family in C. A template
 * with no known markers is an error at startup (--chat-template NAME forces a
 * family), never a silently wrong prompt. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "server/server.h"

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

typedef struct sbuf {
    char *p;
    size_t len, cap;
    bool oom;
    size_t *spans; /* [2 * n_spans]: [start, end) of the bytes that came from messages */
    size_t n_spans, cap_spans;
} sbuf;

static void put(sbuf *b, const char *s) {
    size_t n = strlen(s);
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t nc = (b->len + n + 1) * 2;
        char *q = realloc(b->p, nc);
        if (!q) {
            b->oom = true;
            return;
        }
        b->p = q;
        b->cap = nc;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

/* Message text: recorded as a data span, so its special-token text stays text. */
static void put_data(sbuf *b, const char *s) {
    size_t start = b->len;
    put(b, s);
    if (b->oom || b->len == start) return;
    if (b->n_spans && b->spans[2 * b->n_spans - 1] == start) { /* adjoining: one span */
        b->spans[2 * b->n_spans - 1] = b->len;
        return;
    }
    if (b->n_spans == b->cap_spans) {
        size_t nc = b->cap_spans ? b->cap_spans * 2 : 16;
        size_t *q = realloc(b->spans, 2 * nc * sizeof *q);
        if (!q) {
            b->oom = true;
            return;
        }
        b->spans = q;
        b->cap_spans = nc;
    }
    b->spans[2 * b->n_spans] = start;
    b->spans[2 * b->n_spans + 1] = b->len;
    b->n_spans++;
}

static bool is_role(const pkv_chat_msg *m, const char *r) { return !strcmp(m->role, r); }

/* The system text at the start of an [INST] turn: llama2 wraps it in <<SYS>>. */
static void put_inst_sys(sbuf *b, pkv_tpl t, const char *sys) {
    if (t == PKV_TPL_LLAMA2) {
        put(b, "<<SYS>>\n");
        put_data(b, sys);
        put(b, "\n<</SYS>>\n\n");
    } else {
        put_data(b, sys);
        put(b, "\n\n");
    }
}

char *pkv_tpl_render(pkv_tpl t, const pkv_chat_msg *msgs, int n, char *err, size_t err_size) {
    size_t *spans = NULL, n_spans = 0;
    char *r = pkv_tpl_render_spans(t, msgs, n, &spans, &n_spans, err, err_size);
    free(spans);
    return r;
}

char *pkv_tpl_render_spans(pkv_tpl t, const pkv_chat_msg *msgs, int n, size_t **spans, size_t *n_spans, char *err,
                           size_t err_size) {
    sbuf b = {0};
    *spans = NULL;
    *n_spans = 0;
    if (n <= 0) {
        snprintf(err, err_size, "messages is empty");
        return NULL;
    }
    for (int i = 0; i < n; i++)
        if (!is_role(&msgs[i], "system") && !is_role(&msgs[i], "user") && !is_role(&msgs[i], "assistant")) {
            snprintf(err, err_size, "messages[%d].role '%s' is not supported (system, user, assistant)", i, msgs[i].role);
            return NULL;
        }
    switch (t) {
    case PKV_TPL_CHATML:
        for (int i = 0; i < n; i++) {
            put(&b, "<|im_start|>");
            put(&b, msgs[i].role);
            put(&b, "\n");
            put_data(&b, msgs[i].content);
            put(&b, "<|im_end|>\n");
        }
        put(&b, "<|im_start|>assistant\n");
        break;
    case PKV_TPL_LLAMA3:
        for (int i = 0; i < n; i++) {
            put(&b, "<|start_header_id|>");
            put(&b, msgs[i].role);
            put(&b, "<|end_header_id|>\n\n");
            put_data(&b, msgs[i].content);
            put(&b, "<|eot_id|>");
        }
        put(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        break;
    case PKV_TPL_PHI3:
        for (int i = 0; i < n; i++) {
            put(&b, "<|");
            put(&b, msgs[i].role);
            put(&b, "|>\n");
            put_data(&b, msgs[i].content);
            put(&b, "<|end|>\n");
        }
        put(&b, "<|assistant|>\n");
        break;
    case PKV_TPL_GEMMA: {
        /* Gemma has no system turn: the system text opens the next user turn
         * (several system messages are joined, none is dropped). */
        sbuf sys = {0};
        for (int i = 0; i < n; i++) {
            if (is_role(&msgs[i], "system")) {
                if (sys.len) put(&sys, "\n\n");
                put(&sys, msgs[i].content); /* all of sys is put as data */
                if (!sys.p) put(&sys, ""); /* an empty system text still counts */
                continue;
            }
            put(&b, "<start_of_turn>");
            put(&b, is_role(&msgs[i], "assistant") ? "model" : "user");
            put(&b, "\n");
            if (sys.p && is_role(&msgs[i], "user")) {
                put_data(&b, sys.p);
                put(&b, "\n\n");
                free(sys.p);
                sys = (sbuf){0};
            }
            put_data(&b, msgs[i].content);
            put(&b, "<end_of_turn>\n");
        }
        if (sys.p) { /* a system text no user turn followed: a user turn of its own, not dropped */
            put(&b, "<start_of_turn>user\n");
            put_data(&b, sys.p);
            put(&b, "<end_of_turn>\n");
        }
        if (sys.oom) b.oom = true;
        free(sys.p);
        put(&b, "<start_of_turn>model\n");
        break;
    }
    case PKV_TPL_LLAMA2:
    case PKV_TPL_MISTRAL: {
        /* [INST] user [/INST] assistant</s>; the system text goes into the first
         * user turn (llama2 wraps it in <<SYS>>). BOS comes from the tokenizer. */
        sbuf sys = {0}; /* several system messages are joined, none is dropped */
        bool first = true;
        for (int i = 0; i < n; i++) {
            if (is_role(&msgs[i], "system")) {
                if (sys.len) put(&sys, "\n\n");
                put(&sys, msgs[i].content); /* all of sys is put as data */
                if (!sys.p) put(&sys, "");
            } else if (is_role(&msgs[i], "user")) {
                if (!first) put(&b, "<s>");
                put(&b, "[INST] ");
                if (sys.p) {
                    put_inst_sys(&b, t, sys.p);
                    free(sys.p);
                    sys = (sbuf){0};
                }
                put_data(&b, msgs[i].content);
                put(&b, " [/INST]");
                first = false;
            } else {
                put(&b, " ");
                put_data(&b, msgs[i].content);
                put(&b, " </s>");
                first = false;
            }
        }
        if (sys.p) { /* a system text no user turn followed (e.g. system only): its own [INST] turn */
            if (!first) put(&b, "<s>");
            put(&b, "[INST] ");
            put_inst_sys(&b, t, sys.p);
            put(&b, " [/INST]");
        }
        if (sys.oom) b.oom = true;
        free(sys.p);
        break;
    }
    case PKV_TPL_DEEPSEEK:
        for (int i = 0; i < n; i++) {
            if (is_role(&msgs[i], "system")) {
                put_data(&b, msgs[i].content);
            } else if (is_role(&msgs[i], "user")) {
                put(&b, "<\xef\xbd\x9cUser\xef\xbd\x9c>");
                put_data(&b, msgs[i].content);
            } else {
                put(&b, "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>");
                put_data(&b, msgs[i].content);
                put(&b, "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>");
            }
        }
        put(&b, "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>");
        break;
    default:
        snprintf(err, err_size, "no chat template");
        free(b.p);
        free(b.spans);
        return NULL;
    }
    if (b.oom || !b.p) {
        snprintf(err, err_size, "out of memory rendering the chat template");
        free(b.p);
        free(b.spans);
        return NULL;
    }
    *spans = b.spans;
    *n_spans = b.n_spans;
    return b.p;
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
