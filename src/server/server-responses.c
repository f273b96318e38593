/* POST /v1/responses, OpenAI's Responses API (docs/server.md "/v1/responses"),
 * over the chat-completions machinery: the request's input items become chat
 * messages, its tools and text.format the chat fields, and the answer's text is
 * read by the same parser (reasoning, content, tool calls) into output items.
 *
 * Every response runs on its own context (srv_ctx.internal). A stored response
 * (store, the default) keeps that context, which holds its conversation's KV
 * pages (the engine swaps them to host when idle), and its conversation as chat
 * messages: a request naming it as previous_response_id renders the whole
 * conversation, forks the context, cuts the fork to the tokens it shares with the
 * new prompt, and computes only the rest. The store is bounded (--responses-max,
 * least recently used dropped first) and entries expire (--responses-ttl). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/server-http.h"
#include "server/server-tools.h"

/* ----------------------------------------------------------------- errors */

/* srv_error with OpenAI's "param" (the field at fault) and "code". */
static void perr(srv_out *o, int status, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void perr(srv_out *o, int status, const char *param, const char *code, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    srv_error(o, status, "%s", msg);
    json_t *e = json_object_get(o->json, "error");
    if (!e) return;
    if (param) json_object_set_new(e, "param", json_string(param));
    if (code) json_object_set_new(e, "code", json_string(code));
    if (status == 404) json_object_set_new(e, "type", json_string("invalid_request_error")); /* OpenAI's type */
}

/* ------------------------------------------------------------------ store */

typedef struct resp_entry {
    char id[64];
    int64_t ctx_id;    /* its conversation's context (internal); 0 = none */
    double last_used;  /* srv_now() */
    json_t *response;  /* the response object (GET) */
    json_t *messages;  /* the conversation as chat messages, instructions left out (OpenAI
                          does not carry instructions over to a follow-up) */
    char *prompt;      /* the prompt's text as rendered (instructions included), prompt_len
                          bytes: the context's first n_prompt tokens are this text */
    size_t prompt_len;
    int64_t n_prompt;
    bool special_text; /* its answer's text kept special tokens' text (srv_req.special_text) */
} resp_entry;

struct srv_resp_store {
    pthread_mutex_t mu;
    int max, n;
    double ttl_s;
    resp_entry *e; /* [max] */
};

struct srv_resp_store *srv_resp_store_new(int max, double ttl_s) {
    struct srv_resp_store *st = calloc(1, sizeof *st);
    if (!st) return NULL;
    st->e = calloc((size_t)(max > 0 ? max : 1), sizeof *st->e);
    if (!st->e) {
        free(st);
        return NULL;
    }
    st->max = max;
    st->ttl_s = ttl_s;
    pthread_mutex_init(&st->mu, NULL);
    return st;
}

static void entry_clear(resp_entry *e) {
    json_decref(e->response);
    json_decref(e->messages);
    free(e->prompt);
    memset(e, 0, sizeof *e);
}

void srv_resp_store_free(struct srv_resp_store *st) {
    if (!st) return;
    for (int i = 0; i < st->n; i++) entry_clear(&st->e[i]);
    free(st->e);
    pthread_mutex_destroy(&st->mu);
    free(st);
}

/* Context ids to free on the worker (at most the store's size + 1). */
typedef struct drops {
    int64_t *ids;
    int n;
} drops;

static void drops_add(drops *d, int64_t id) {
    if (!id) return;
    int64_t *a = realloc(d->ids, (size_t)(d->n + 1) * sizeof *a);
    if (!a) return; /* the context stays until shutdown: memory, not correctness */
    d->ids = a;
    d->ids[d->n++] = id;
}

static void remove_at(struct srv_resp_store *st, int i, drops *d) {
    drops_add(d, st->e[i].ctx_id);
    entry_clear(&st->e[i]);
    st->e[i] = st->e[--st->n];
    memset(&st->e[st->n], 0, sizeof st->e[st->n]);
}

/* Entries idle past the TTL go (st->mu held). */
static void expire(struct srv_resp_store *st, double now, drops *d) {
    for (int i = 0; i < st->n;)
        if (st->ttl_s > 0 && now - st->e[i].last_used > st->ttl_s) remove_at(st, i, d);
        else i++;
}

static int find(struct srv_resp_store *st, const char *id) {
    for (int i = 0; i < st->n; i++)
        if (!strcmp(st->e[i].id, id)) return i;
    return -1;
}

/* Keep e (taken over), dropping the least recently used entry when full. */
static void store_put(struct srv_resp_store *st, resp_entry *e, drops *d) {
    pthread_mutex_lock(&st->mu);
    double now = srv_now();
    expire(st, now, d);
    if (st->max <= 0) {
        drops_add(d, e->ctx_id);
        entry_clear(e);
        pthread_mutex_unlock(&st->mu);
        return;
    }
    if (st->n == st->max) {
        int lru = 0;
        for (int i = 1; i < st->n; i++)
            if (st->e[i].last_used < st->e[lru].last_used) lru = i;
        remove_at(st, lru, d);
    }
    e->last_used = now;
    st->e[st->n++] = *e;
    memset(e, 0, sizeof *e);
    pthread_mutex_unlock(&st->mu);
}

/* A copy of entry id's response and messages and its context (touching it);
 * false when there is none. prev (may be NULL) gets a copy of its prompt's text
 * (NULL out of memory) and token count. */
typedef struct prev_prompt {
    char *text;
    size_t len;
    int64_t n_tokens;
    bool special_text; /* the answer's special tokens were in its text (srv_req.special_text) */
} prev_prompt;

static bool store_get(struct srv_resp_store *st, const char *id, json_t **response, json_t **messages, int64_t *ctx_id,
                      prev_prompt *prev, drops *d) {
    pthread_mutex_lock(&st->mu);
    expire(st, srv_now(), d);
    int i = find(st, id);
    if (i >= 0) {
        st->e[i].last_used = srv_now();
        if (response) *response = json_deep_copy(st->e[i].response);
        if (messages) *messages = json_deep_copy(st->e[i].messages);
        if (ctx_id) *ctx_id = st->e[i].ctx_id;
        if (prev && st->e[i].prompt && (prev->text = malloc(st->e[i].prompt_len + 1))) {
            memcpy(prev->text, st->e[i].prompt, st->e[i].prompt_len);
            prev->len = st->e[i].prompt_len;
            prev->n_tokens = st->e[i].n_prompt;
            prev->special_text = st->e[i].special_text;
        }
    }
    pthread_mutex_unlock(&st->mu);
    return i >= 0;
}

static bool store_del(struct srv_resp_store *st, const char *id, drops *d) {
    pthread_mutex_lock(&st->mu);
    expire(st, srv_now(), d);
    int i = find(st, id);
    if (i >= 0) remove_at(st, i, d);
    pthread_mutex_unlock(&st->mu);
    return i >= 0;
}

/* --------------------------------------------------------- worker calls */

/* Free contexts of responses dropped from the store, or never stored. A context
 * still generating (a request the client left, being cancelled) is freed after
 * the step that ends it. */
static bool drop_fn(srv_gen *g, void *arg) {
    drops *d = arg;
    bool all = true;
    for (int i = 0; i < d->n; i++) {
        if (!d->ids[i]) continue;
        srv_ctx *e = srv_ctx_find(g, d->ids[i]);
        if (e && e->internal && e->busy && !srv_gen_stopping(g)) {
            all = false;
            continue;
        }
        if (e && e->internal) srv_ctx_remove(g, e);
        d->ids[i] = 0;
    }
    return all;
}

static void drops_run(srv *s, drops *d) {
    if (d->n) srv_gen_call(s->g, drop_fn, d);
    free(d->ids);
    d->ids = NULL;
    d->n = 0;
}

static void drop_ctx(srv *s, int64_t id) {
    drops d = {0};
    drops_add(&d, id);
    drops_run(s, &d);
}

/* Pages the stored responses' contexts hold together (device pages counted once,
 * host pages of swapped ones); those generating are live requests, not counted. */
typedef struct held {
    int64_t pages;
    bool ok;
} held;

static bool held_fn(srv_gen *g, void *arg) {
    held *h = arg;
    int n = srv_ctx_count(g), k = 0;
    int32_t *seqs = malloc((size_t)(n + 1) * sizeof *seqs);
    if (!seqs) return true;
    for (int i = 0; i < n; i++) {
        srv_ctx *e = srv_ctx_at(g, i);
        if (e->internal && !e->busy) seqs[k++] = pkv_context_seq(e->ctx);
    }
    int64_t dev = 0, host = 0;
    h->ok = pkv_kv_pages_held(srv_gen_cache(g), k, seqs, &dev, &host) == PKV_OK;
    h->pages = dev + host;
    free(seqs);
    return true;
}

/* Stored responses yield to live requests: while they hold more than
 * --responses-pages, the least recently used go (the newest too, when it alone
 * holds more). Without this, idle conversations filled the device and host pools
 * and every new request failed with 503. */
static void enforce_pages(srv *s) {
    for (int guard = 0; guard < 1 << 20; guard++) {
        held h = {0, false};
        srv_gen_call(s->g, held_fn, &h);
        if (!h.ok || h.pages <= s->responses_pages) return;
        struct srv_resp_store *st = s->responses;
        drops d = {0};
        pthread_mutex_lock(&st->mu);
        int lru = -1;
        for (int i = 0; i < st->n; i++)
            if (lru < 0 || st->e[i].last_used < st->e[lru].last_used) lru = i;
        if (lru >= 0) remove_at(st, lru, &d);
        pthread_mutex_unlock(&st->mu);
        drops_run(s, &d);
        if (lru < 0) return;
    }
}

/* The context a response runs on: a fork of the previous response's, cut to the
 * tokens it shares with the prompt, or a new one sharing the prefix cache's
 * pages. At least one prompt token is left to compute (it gives the logits). */
typedef struct prep {
    int64_t prev;        /* the previous response's context, 0 = none */
    int64_t splice;      /* > 0: the prompt continues prev's tokens, which must be this many */
    const int32_t *toks; /* the whole prompt */
    int n;
    int64_t n_ctx;
    int64_t id, keep;    /* out: the context and the tokens it holds already */
    int status;          /* out: 200, 404 (prev gone), 503 */
    char err[400];
} prep;

static bool prep_fn(srv_gen *g, void *arg) {
    prep *p = arg;
    pkv_context *ctx = NULL;
    int64_t keep = 0;
    p->status = 503;
    if (p->prev) {
        srv_ctx *e = srv_ctx_find(g, p->prev);
        if (!e || !e->internal) {
            p->status = 404;
            return true;
        }
        if (e->busy && !srv_gen_stopping(g)) return false; /* never for a stored one; wait a step */
        if (srv_ctx_release(g, e)) {
            snprintf(p->err, sizeof p->err, "cannot bring the previous response's conversation back: %s", pkv_errmsg());
            return true;
        }
        ctx = pkv_context_fork(e->ctx);
        srv_ctx_hold(g, e);
        e->last_used = srv_now();
        if (!ctx) {
            snprintf(p->err, sizeof p->err, "cannot fork the previous response's conversation: %s", pkv_errmsg());
            return true;
        }
        int64_t len = pkv_context_n_tokens(ctx);
        if (p->splice > 0 && len == p->splice) {
            keep = len;
            goto add;
        }
        p->splice = 0; /* not what the handler read: the prompt is the whole conversation's */
        int32_t *t = malloc((size_t)(len + 1) * sizeof *t);
        if (t && !pkv_context_tokens(ctx, 0, len, t))
            while (keep < len && keep < p->n - 1 && t[keep] == p->toks[keep]) keep++;
        free(t);
        if (keep < len && pkv_context_truncate(ctx, keep)) {
            snprintf(p->err, sizeof p->err, "cannot cut the conversation's context: %s", pkv_errmsg());
            pkv_context_free(ctx);
            return true;
        }
    } else {
        ctx = pkv_context_create(srv_gen_model(g), srv_gen_cache(g), p->n_ctx);
        if (!ctx) {
            snprintf(p->err, sizeof p->err, "cannot create a context: %s", pkv_errmsg());
            return true;
        }
        if (p->n > 1 && pkv_kv_prefix_match(srv_gen_cache(g), pkv_context_seq(ctx), p->toks, NULL, p->n - 1, &keep))
            keep = 0;
        keep = pkv_context_n_tokens(ctx);
    }
add:;
    srv_ctx *ce = srv_ctx_add_internal(g, ctx);
    if (!ce) {
        pkv_context_free(ctx);
        snprintf(p->err, sizeof p->err, "too many responses are stored or generating at once (--responses-max, "
                                        "--queue, --parallel): retry later");
        return true;
    }
    p->id = ce->id;
    p->keep = keep;
    p->status = 200;
    return true;
}

/* The tokens of a stored response's context (malloc'd in toks, n of them; NULL
 * when it is gone or out of memory). */
typedef struct peek {
    int64_t id;
    int32_t *toks;
    int64_t n;
} peek;

static bool peek_fn(srv_gen *g, void *arg) {
    peek *k = arg;
    srv_ctx *e = srv_ctx_find(g, k->id);
    if (!e || !e->internal) return true;
    if (e->busy && !srv_gen_stopping(g)) return false; /* never for a stored one; wait a step */
    int64_t len = pkv_context_n_tokens(e->ctx);
    int32_t *t = malloc((size_t)(len + 1) * sizeof *t);
    if (t && !pkv_context_tokens(e->ctx, 0, len, t)) {
        k->toks = t;
        k->n = len;
    } else {
        free(t);
    }
    return true;
}

/* An end of the answer's turn: an end-of-generation token or one of the template's
 * end-of-turn ids (srv.stop_ids). */
static bool turn_end(srv *s, int32_t id) {
    if (pkv_model_is_eog(s->m, id)) return true;
    for (int i = 0; i < s->n_stop_ids; i++)
        if (s->stop_ids[i] == id) return true;
    return false;
}

/* A follow-up continues the stored context's own tokens: its previous prompt (text
 * prev->text, prev->n_tokens tokens) and the answer as sampled, its end-of-turn
 * token included. The new prompt's text (text, len; spans: its data spans) must
 * start with the previous prompt's text and then the answer's text as the client
 * got it (its tokens' pieces, UTF-8 sanitized); what follows (the end of the turn,
 * the template's text after it, as "\n" after <|im_end|>, and the new turn with
 * the generation prompt) is tokenized on its own, as template text, and is the
 * prompt to compute, less its first token when the context holds the end-of-turn
 * token the model sampled: that stands in for the template's (which must be an
 * end-of-turn token too). So the prompt's tokens are those of rendering the whole
 * conversation wherever the answer's sampled tokens are the canonical tokens of
 * its text and its end-of-turn token the template's. false (nothing set) when the
 * template renders the earlier turns otherwise (it drops earlier reasoning,
 * reformats tool calls, the instructions changed, the answer was trimmed or had
 * bytes that are not UTF-8, ...), or on any failure: the caller falls back to
 * cutting the context where the tokens first differ. */
/* A splice's result: the stored context's tokens (k's, taken) and the new ones
 * (*out); false, with *out freed, when nothing is new. */
static bool take_splice(peek *k, int32_t **all, int64_t *n_ctx_toks, int32_t **out, int *n_out) {
    if (*n_out == 0) {
        free(*out);
        *out = NULL;
        return false;
    }
    *all = k->toks;
    *n_ctx_toks = k->n;
    k->toks = NULL;
    return true;
}

static bool splice_prompt(srv *s, int64_t ctx_id, const prev_prompt *prev, const char *text, size_t len,
                          const size_t *spans, size_t n_spans, int32_t **all, int64_t *n_ctx_toks, int32_t **out,
                          int *n_out) {
    if (!prev->text || prev->len > len || memcmp(text, prev->text, prev->len)) return false;
    peek k = {.id = ctx_id};
    srv_gen_call(s->g, peek_fn, &k);
    bool ok = false;
    size_t *sp = NULL;
    char *raw = NULL, *san = NULL;
    if (!k.toks || k.n < prev->n_tokens) goto done;
    size_t n_ans = (size_t)(k.n - prev->n_tokens), off = prev->len, n_raw = 0;
    const int32_t *at = k.toks + prev->n_tokens;
    bool ended = n_ans && turn_end(s, at[n_ans - 1]);
    size_t n_text = n_ans - (ended ? 1 : 0);
    size_t cap = 0;
    for (size_t i = 0; i < n_text; i++) {
        char piece[512];
        size_t np = 0;
        if (pkv_model_is_eog(s->m, at[i])) continue; /* none in the text (ignore_eos) */
        if (pkv_model_token_piece(s->m, at[i], prev->special_text, piece, sizeof piece, &np)) goto done;
        if (n_raw + np > cap) {
            size_t nc = cap ? 2 * cap : 4096;
            while (nc < n_raw + np) nc *= 2;
            char *nr = realloc(raw, nc);
            if (!nr) goto done;
            raw = nr;
            cap = nc;
        }
        memcpy(raw + n_raw, piece, np);
        n_raw += np;
    }
    size_t n_san = 0;
    if (!(san = pkv_utf8_sanitize(raw, n_raw, &n_san))) goto done;
    if (n_san > len - off || memcmp(text + off, san, n_san)) goto done;
    off += n_san;
    if (off >= len) goto done;
    /* the data spans of the rest, moved to its start */
    if (!(sp = malloc((2 * n_spans + 1) * sizeof *sp))) goto done;
    size_t m = 0;
    for (size_t i = 0; i < n_spans; i++) {
        size_t a = spans[2 * i], b = spans[2 * i + 1];
        if (b <= off) continue;
        sp[2 * m] = (a > off ? a : off) - off;
        sp[2 * m + 1] = b - off;
        m++;
    }
    srv_out tmp = {0};
    if (!srv_tokenize_part(s, text + off, len - off, false, sp, m, out, n_out, &tmp)) {
        json_decref(tmp.json);
        goto done;
    }
    if (ended) { /* the sampled end of turn in place of the template's */
        if (*n_out < 1 || !turn_end(s, (*out)[0])) {
            free(*out);
            *out = NULL;
            goto done;
        }
        memmove(*out, *out + 1, (size_t)(*n_out - 1) * sizeof **out);
        (*n_out)--;
    }
    ok = take_splice(&k, all, n_ctx_toks, out, n_out);
done:
    free(k.toks);
    free(raw);
    free(san);
    free(sp);
    return ok;
}

/* A data span of the rendered text (spans: [start, end) pairs) holding byte i. */
static bool in_span(const size_t *spans, size_t n_spans, size_t i) {
    for (size_t k = 0; k < n_spans; k++)
        if (i >= spans[2 * k] && i < spans[2 * k + 1]) return true;
    return false;
}

/* Text that stands for the first new message's content in a second rendering. */
#define SPLICE_MARK "PkvSpliceMark7f3q"

/* The follow-up as the model saw the earlier turns (--responses-history generated):
 * the stored context's tokens exactly as they are (the previous prompt, then the
 * answer as sampled: reasoning, tool calls, its end of turn), then the rendered
 * text after the stored assistant turn ends: for templates that render earlier
 * turns otherwise once more follow (Qwen3 drops earlier reasoning, gpt-oss the
 * analysis channel; tool calls come back reformatted), where splice_prompt's text
 * match fails. msgs: the whole conversation (instructions first) of chat, msgs[at]
 * its first new message, msgs[at - 1] the stored assistant turn; text (len, spans):
 * its rendering, toks its n_toks tokens.
 * The stored turn ends where, in text, the last end-of-turn token (one of toks that
 * turn_end takes, or a message end of the template's format: pkv_tc_message_ends;
 * written by the template: not in a data span) before the first new message's
 * content is; that content is found by rendering again with it replaced
 * by SPLICE_MARK (all before it must render the same). Checked: the messages before
 * the stored turn, with this request's instructions, tools and options, render to
 * the stored prompt's text exactly (else what changed must be seen: recut); no
 * request data lies between that end and the content but the new message's role
 * and the stored turn's tool names (gpt-oss names the function in the tool's
 * header), so the turn was closed (Mistral's tool list, moved to the last user
 * turn, is data there: recut, rather than the model seeing it twice).
 * Out as splice_prompt; false (nothing set) where any of this does not hold. */
static bool splice_generated(srv *s, json_t *chat, json_t *msgs, size_t at, int64_t ctx_id, const prev_prompt *prev,
                             const char *text, size_t len, const size_t *spans, size_t n_spans, const int32_t *toks,
                             int n_toks, int32_t **all, int64_t *n_ctx_toks, int32_t **out, int *n_out) {
    json_t *asst = json_array_get(msgs, at - 1), *first = json_array_get(msgs, at);
    if (!prev->text || at < 1 || !first || !asst || strcmp(srv_jstr(asst, "role") ? srv_jstr(asst, "role") : "", "assistant"))
        return false;
    if (memmem(text, len, SPLICE_MARK, strlen(SPLICE_MARK))) return false;
    bool ok = false;
    char *q = NULL, *x2 = NULL;
    size_t *qs = NULL, *x2s = NULL, nq = 0, nx2 = 0, qlen = 0, x2len = 0;
    json_t *c = json_copy(chat), *m = json_array(), *alt = json_deep_copy(first);
    srv_out tmp = {0};
    peek k = {.id = ctx_id};
    char (*ends)[64] = NULL;
    if (!c || !m || !alt) goto done;
    /* the turns before the stored one, as this request renders them */
    for (size_t i = 0; i + 1 < at; i++) json_array_append(m, json_array_get(msgs, i));
    json_object_set(c, "messages", m);
    if (!(q = srv_chat_prompt(s, c, NULL, &qlen, &qs, &nq, &tmp))) goto done;
    if (qlen != prev->len || memcmp(q, prev->text, qlen)) goto done;
    /* the first new message's content, by a second rendering */
    json_array_clear(m);
    json_array_extend(m, msgs);
    json_object_set_new(alt, "content", json_string(SPLICE_MARK));
    json_array_set(m, at, alt);
    if (!(x2 = srv_chat_prompt(s, c, NULL, &x2len, &x2s, &nx2, &tmp))) goto done;
    const char *mk = memmem(x2, x2len, SPLICE_MARK, strlen(SPLICE_MARK));
    if (!mk) goto done;
    size_t cpos = (size_t)(mk - x2);
    if (cpos > len || memcmp(x2, text, cpos)) goto done;
    /* the texts of the end-of-turn tokens the template wrote */
    int n_ends = 0;
    if (!(ends = calloc(8, sizeof *ends))) goto done;
    for (int i = 0; i < n_toks && n_ends < 8; i++) {
        if (!turn_end(s, toks[i])) continue;
        char piece[64];
        size_t np = 0;
        if (pkv_model_token_piece(s->m, toks[i], true, piece, sizeof piece - 1, &np) || !np) continue;
        piece[np] = 0;
        int e = 0;
        while (e < n_ends && strcmp(ends[e], piece)) e++;
        if (e == n_ends) snprintf(ends[n_ends++], sizeof ends[0], "%s", piece);
    }
    /* and the template's own message ends that are not such tokens (gpt-oss's <|end|>) */
    const char *tsrc = pkv_chat_source(s->chat);
    bool tthink = false;
    const char *const *me = pkv_tc_message_ends(tsrc ? pkv_tc_detect(tsrc, strlen(tsrc), &tthink) : PKV_TC_NONE);
    for (int i = 0; me[i] && n_ends < 8; i++) {
        int e = 0;
        while (e < n_ends && strcmp(ends[e], me[i])) e++;
        if (e == n_ends) snprintf(ends[n_ends++], sizeof ends[0], "%s", me[i]);
    }
    size_t e0 = 0, e1 = 0; /* the stored turn's end: [e0, e1) */
    for (size_t i = cpos; i-- > 0 && !e1;)
        for (int e = 0; e < n_ends && !e1; e++) {
            size_t el = strlen(ends[e]);
            if (i + el <= cpos && !memcmp(text + i, ends[e], el) && !in_span(spans, n_spans, i)) e0 = i, e1 = i + el;
        }
    if (!e1) goto done;
    /* nothing of the request between but the new message's role and the stored turn's tool names */
    for (size_t i = 0; i < n_spans; i++) {
        size_t a = spans[2 * i], b = spans[2 * i + 1];
        if (b <= e1 || a >= cpos) continue;
        const char *role = srv_jstr(first, "role");
        bool name = role && strlen(role) == b - a && !memcmp(text + a, role, b - a);
        json_t *calls = json_object_get(asst, "tool_calls"), *tc;
        size_t ci;
        json_array_foreach(calls, ci, tc) {
            const char *nm = srv_jstr(json_object_get(tc, "function"), "name");
            if (nm && strlen(nm) == b - a && !memcmp(text + a, nm, b - a)) name = true;
        }
        if (!name) goto done;
    }
    srv_gen_call(s->g, peek_fn, &k);
    if (!k.toks || k.n < prev->n_tokens) goto done;
    bool ended = k.n > prev->n_tokens && turn_end(s, k.toks[k.n - 1]);
    size_t off = ended ? e1 : e0; /* the sampled end of turn stands in for the template's */
    if (off >= len) goto done;
    size_t *sp = malloc((2 * n_spans + 1) * sizeof *sp), ns = 0;
    if (!sp) goto done;
    for (size_t i = 0; i < n_spans; i++) {
        size_t a = spans[2 * i], b = spans[2 * i + 1];
        if (b <= off) continue;
        sp[2 * ns] = (a > off ? a : off) - off;
        sp[2 * ns + 1] = b - off;
        ns++;
    }
    bool tk = srv_tokenize_part(s, text + off, len - off, false, sp, ns, out, n_out, &tmp);
    free(sp);
    if (!tk) goto done;
    ok = take_splice(&k, all, n_ctx_toks, out, n_out);
done:
    json_decref(tmp.json);
    json_decref(c);
    json_decref(m);
    json_decref(alt);
    free(q);
    free(qs);
    free(x2);
    free(x2s);
    free(ends);
    free(k.toks);
    return ok;
}

/* ------------------------------------------------------------- request */


/* The fields of a Responses request (issue 28's rule: nothing silently ignored). */
static const char *const k_fields[] = {
    "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "text", "max_output_tokens",
    "temperature", "top_p", "stream", "stream_options", "store", "previous_response_id", "reasoning", "metadata",
    "user", "truncation", "include", "background", "service_tier", "prompt_cache_key", "safety_identifier",
    "max_tool_calls", "top_logprobs", "conversation", "prompt",
    /* llama-server's extensions, as on /v1/chat/completions */
    "seed", "grammar",
    /* vLLM's, as on /v1/chat/completions: the prompt's token ids in the answer */
    "return_token_ids", NULL};

static bool in_list(const char *const *l, const char *k) {
    for (int i = 0; l[i]; i++)
        if (!strcmp(l[i], k)) return true;
    return false;
}

/* The text of a content value: a string, or parts of type input_text, output_text
 * or text (joined); where is the field's name for errors. */
static bool content_text(json_t *c, const char *where, json_t **out, srv_out *o) {
    if (json_is_string(c)) {
        *out = json_incref(c);
        return true;
    }
    if (!json_is_array(c)) {
        perr(o, 400, where, "invalid_type", "'%s' must be a string or an array of content parts", where);
        return false;
    }
    char *buf = NULL;
    size_t len = 0;
    size_t i;
    json_t *p;
    json_array_foreach(c, i, p) {
        const char *type = srv_jstr(p, "type"), *text = srv_jstr(p, "text");
        char f[128];
        snprintf(f, sizeof f, "%s[%zu].type", where, i);
        if (!type) {
            free(buf);
            perr(o, 400, f, "invalid_type", "'%s' must be a string", f);
            return false;
        }
        if (strcmp(type, "input_text") && strcmp(type, "output_text") && strcmp(type, "text")) {
            free(buf);
            perr(o, 400, f, "unsupported_value",
                 "'%s' is \"%s\": pagekv serve's /v1/responses takes text parts (input_text, output_text) only", f, type);
            return false;
        }
        if (!text) {
            snprintf(f, sizeof f, "%s[%zu].text", where, i);
            free(buf);
            perr(o, 400, f, "invalid_type", "'%s' must be a string", f);
            return false;
        }
        size_t tl = json_string_length(json_object_get(p, "text"));
        char *nb = realloc(buf, len + tl + 1);
        if (!nb) {
            free(buf);
            srv_error(o, 500, "out of memory");
            return false;
        }
        buf = nb;
        memcpy(buf + len, text, tl);
        len += tl;
    }
    *out = json_stringn_nocheck(buf ? buf : "", len);
    free(buf);
    return true;
}

/* The last message of msgs if it is the assistant's (function_call items join it). */
static json_t *last_assistant(json_t *msgs) {
    size_t n = json_array_size(msgs);
    json_t *m = n ? json_array_get(msgs, n - 1) : NULL;
    return m && !strcmp(srv_jstr(m, "role") ? srv_jstr(m, "role") : "", "assistant") ? m : NULL;
}

/* The input (a string or a list of items) as chat messages appended to msgs. */
static bool input_messages(json_t *input, json_t *msgs, srv_out *o) {
    if (json_is_string(input)) {
        json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", "user", "content", input));
        return true;
    }
    if (!json_is_array(input) || json_array_size(input) > 4096) {
        perr(o, 400, "input", "invalid_type", "'input' must be a string or an array of at most 4096 items");
        return false;
    }
    json_t *reasoning = NULL; /* a reasoning item: the next assistant message's reasoning_content */
    size_t i;
    json_t *it;
    char f[96];
    json_array_foreach(input, i, it) {
        if (!json_is_object(it)) {
            snprintf(f, sizeof f, "input[%zu]", i);
            perr(o, 400, f, "invalid_type", "'%s' must be an object", f);
            goto fail;
        }
        const char *type = srv_jstr(it, "type");
        if (!type && json_object_get(it, "type")) {
            snprintf(f, sizeof f, "input[%zu].type", i);
            perr(o, 400, f, "invalid_type", "'%s' must be a string", f);
            goto fail;
        }
        if (!type || !strcmp(type, "message")) {
            const char *role = srv_jstr(it, "role");
            snprintf(f, sizeof f, "input[%zu].role", i);
            if (!role || (strcmp(role, "user") && strcmp(role, "system") && strcmp(role, "developer") &&
                          strcmp(role, "assistant"))) {
                perr(o, 400, f, "invalid_value",
                     "'%s' must be one of \"user\", \"system\", \"developer\", \"assistant\"", f);
                goto fail;
            }
            snprintf(f, sizeof f, "input[%zu].content", i);
            json_t *text = NULL;
            if (!content_text(json_object_get(it, "content"), f, &text, o)) goto fail;
            /* developer is OpenAI's newer name of system; chat templates know system */
            json_t *m = json_pack("{s:s,s:o}", "role", !strcmp(role, "developer") ? "system" : role, "content", text);
            if (!strcmp(role, "assistant") && reasoning) {
                json_object_set_new(m, "reasoning_content", reasoning);
                reasoning = NULL;
            }
            json_array_append_new(msgs, m);
        } else if (!strcmp(type, "function_call")) {
            static const char *const need[] = {"call_id", "name", "arguments"};
            for (int k = 0; k < 3; k++)
                if (!srv_jstr(it, need[k])) {
                    snprintf(f, sizeof f, "input[%zu].%s", i, need[k]);
                    perr(o, 400, f, "invalid_type", "'%s' must be a string", f);
                    goto fail;
                }
            json_t *call = json_pack("{s:O,s:s,s:{s:O,s:O}}", "id", json_object_get(it, "call_id"), "type", "function",
                                     "function", "name", json_object_get(it, "name"), "arguments",
                                     json_object_get(it, "arguments"));
            json_t *m = last_assistant(msgs);
            if (!m || reasoning) {
                m = json_pack("{s:s,s:n}", "role", "assistant", "content");
                if (reasoning) json_object_set_new(m, "reasoning_content", reasoning);
                reasoning = NULL;
                json_array_append_new(msgs, m);
            }
            json_t *calls = json_object_get(m, "tool_calls");
            if (!calls) json_object_set_new(m, "tool_calls", calls = json_array());
            json_array_append_new(calls, call);
        } else if (!strcmp(type, "function_call_output")) {
            snprintf(f, sizeof f, "input[%zu].call_id", i);
            if (!srv_jstr(it, "call_id")) {
                perr(o, 400, f, "invalid_type", "'%s' must be a string", f);
                goto fail;
            }
            snprintf(f, sizeof f, "input[%zu].output", i);
            json_t *out = NULL;
            if (!content_text(json_object_get(it, "output"), f, &out, o)) goto fail;
            json_array_append_new(msgs, json_pack("{s:s,s:O,s:o}", "role", "tool", "tool_call_id",
                                                  json_object_get(it, "call_id"), "content", out));
        } else if (!strcmp(type, "reasoning")) {
            /* its text: content (reasoning_text parts), else the summary (summary_text parts) */
            json_t *parts = json_object_get(it, "content");
            if (!json_is_array(parts) || !json_array_size(parts)) parts = json_object_get(it, "summary");
            json_decref(reasoning);
            reasoning = NULL;
            if (json_is_array(parts)) {
                char *buf = NULL;
                size_t len = 0, k;
                json_t *p;
                json_array_foreach(parts, k, p) {
                    json_t *t = json_object_get(p, "text");
                    if (!json_is_string(t)) continue;
                    char *nb = realloc(buf, len + json_string_length(t) + 1);
                    if (!nb) continue;
                    buf = nb;
                    memcpy(buf + len, json_string_value(t), json_string_length(t));
                    len += json_string_length(t);
                }
                if (len) reasoning = json_stringn_nocheck(buf, len);
                free(buf);
            }
        } else {
            snprintf(f, sizeof f, "input[%zu].type", i);
            perr(o, 400, f, "unsupported_value",
                 "'%s' is \"%s\": pagekv serve's /v1/responses takes the item types message, function_call, "
                 "function_call_output and reasoning",
                 f, type);
            goto fail;
        }
    }
    json_decref(reasoning);
    return true;
fail:
    json_decref(reasoning);
    return false;
}

/* The Responses request as a /v1/chat/completions body (without messages). */
static json_t *chat_fields(srv *s, json_t *b, srv_out *o) {
    const char *k;
    json_t *v;
    json_object_foreach(b, k, v) {
        if (in_list(k_fields, k) || s->o.lenient_fields) continue;
        perr(o, 400, k, "unknown_parameter", "unknown field '%s' (not a field of OpenAI's Responses API; start the "
                                             "server with --lenient-fields to ignore unknown fields)", k);
        return NULL;
    }
    /* fields that would change the output and that pagekv does not implement */
    if (json_is_true(json_object_get(b, "background")))
        return perr(o, 400, "background", "unsupported_value", "'background' responses are not supported by pagekv serve"), NULL;
    static const char *const unimpl[] = {"conversation", "prompt", "max_tool_calls", NULL};
    for (int i = 0; unimpl[i]; i++)
        if (srv_jpresent(b, unimpl[i]))
            return perr(o, 400, unimpl[i], "unsupported_parameter", "'%s' is not supported by pagekv serve", unimpl[i]), NULL;
    json_t *tl = json_object_get(b, "top_logprobs");
    if (tl && !json_is_null(tl) && !(json_is_integer(tl) && json_integer_value(tl) == 0))
        return perr(o, 400, "top_logprobs", "unsupported_parameter", "'top_logprobs' is not supported by pagekv serve's "
                                                                    "/v1/responses"), NULL;
    json_t *inc = json_object_get(b, "include");
    if (inc && !json_is_null(inc) && !(json_is_array(inc) && json_array_size(inc) == 0))
        return perr(o, 400, "include", "unsupported_parameter", "'include' is not supported by pagekv serve"), NULL;
    const char *tr = srv_jstr(b, "truncation");
    if (srv_jpresent(b, "truncation") && (!tr || strcmp(tr, "disabled")))
        return perr(o, 400, "truncation", "unsupported_value", "'truncation' must be \"disabled\" (pagekv serve does not "
                                                                 "cut conversations)"), NULL;
    json_t *chat = json_object();
    /* sampling: checked here so that errors name the Responses fields */
    json_t *mo = json_object_get(b, "max_output_tokens");
    if (mo && !json_is_null(mo)) {
        if (!json_is_integer(mo) || json_integer_value(mo) < 1 || json_integer_value(mo) > (1 << 30)) {
            json_decref(chat);
            return perr(o, 400, "max_output_tokens", "invalid_value", "'max_output_tokens' must be an integer in [1, %d]",
                        1 << 30), NULL;
        }
        json_object_set(chat, "max_completion_tokens", mo);
    }
    static const struct {
        const char *k;
        double lo, hi;
    } nums[] = {{"temperature", 0, 2}, {"top_p", 1e-9, 1}};
    for (int i = 0; i < 2; i++) {
        json_t *x = json_object_get(b, nums[i].k);
        if (!x || json_is_null(x)) continue;
        if (!json_is_number(x) || !(json_number_value(x) >= nums[i].lo && json_number_value(x) <= nums[i].hi)) {
            json_decref(chat);
            return perr(o, 400, nums[i].k, "invalid_value", "'%s' must be a number in [%g, %g]", nums[i].k, nums[i].lo,
                        nums[i].hi), NULL;
        }
        json_object_set(chat, nums[i].k, x);
    }
    if (srv_jpresent(b, "seed")) json_object_set(chat, "seed", json_object_get(b, "seed"));
    if (srv_jpresent(b, "grammar")) json_object_set(chat, "grammar", json_object_get(b, "grammar"));
    if (srv_jpresent(b, "parallel_tool_calls")) json_object_set(chat, "parallel_tool_calls", json_object_get(b, "parallel_tool_calls"));
    /* tools: function tools {type, name, description, parameters, strict} */
    json_t *tools = json_object_get(b, "tools");
    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools) || json_array_size(tools) > 128) {
            json_decref(chat);
            return perr(o, 400, "tools", "invalid_type", "'tools' must be an array of at most 128 tools"), NULL;
        }
        json_t *ct = json_array();
        json_object_set_new(chat, "tools", ct);
        size_t i;
        json_t *t;
        char f[64];
        json_array_foreach(tools, i, t) {
            const char *type = srv_jstr(t, "type"), *name = srv_jstr(t, "name");
            json_t *params = json_object_get(t, "parameters"), *desc = json_object_get(t, "description"),
                   *strict = json_object_get(t, "strict");
            const char *bad = NULL, *why = NULL;
            if (!json_is_object(t)) bad = "", why = "must be an object";
            else if (!type) bad = ".type", why = "must be a string";
            else if (strcmp(type, "function")) bad = ".type", why = "is not \"function\" (pagekv serve runs function tools only)";
            else if (!name || !*name) bad = ".name", why = "must be a non-empty string";
            else if (params && !json_is_null(params) && !json_is_object(params))
                bad = ".parameters", why = "must be a JSON schema object";
            else if (desc && !json_is_null(desc) && !json_is_string(desc)) bad = ".description", why = "must be a string";
            else if (strict && !json_is_null(strict) && !json_is_boolean(strict)) bad = ".strict", why = "must be true or false";
            if (bad) {
                snprintf(f, sizeof f, "tools[%zu]%s", i, bad);
                json_decref(chat);
                return perr(o, 400, f, "invalid_value", "'%s' %s", f, why), NULL;
            }
            json_t *fn = json_pack("{s:s}", "name", name);
            if (desc && !json_is_null(desc)) json_object_set(fn, "description", desc);
            if (params && !json_is_null(params)) json_object_set(fn, "parameters", params);
            if (strict && !json_is_null(strict)) json_object_set(fn, "strict", strict);
            json_array_append_new(ct, json_pack("{s:s,s:o}", "type", "function", "function", fn));
        }
    }
    json_t *tc = json_object_get(b, "tool_choice");
    if (tc && !json_is_null(tc)) {
        if (json_is_string(tc)) {
            json_object_set(chat, "tool_choice", tc);
        } else if (json_is_object(tc) && srv_jstr(tc, "type") && !strcmp(srv_jstr(tc, "type"), "function") && srv_jstr(tc, "name")) {
            json_object_set_new(chat, "tool_choice",
                                json_pack("{s:s,s:{s:s}}", "type", "function", "function", "name", srv_jstr(tc, "name")));
        } else {
            json_decref(chat);
            return perr(o, 400, "tool_choice", "invalid_value", "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                                                                "{\"type\": \"function\", \"name\": ...}"), NULL;
        }
    }
    /* text.format: text, json_object, json_schema {name, schema, strict} */
    json_t *text = json_object_get(b, "text");
    if (text && !json_is_null(text)) {
        if (!json_is_object(text)) {
            json_decref(chat);
            return perr(o, 400, "text", "invalid_type", "'text' must be an object"), NULL;
        }
        const char *tk;
        json_t *tv;
        json_object_foreach(text, tk, tv) {
            if (!strcmp(tk, "format") || json_is_null(tv)) continue;
            char f[80];
            snprintf(f, sizeof f, "text.%.60s", tk);
            json_decref(chat);
            return perr(o, 400, f, "unsupported_parameter", "'%s' is not supported by pagekv serve", f), NULL;
        }
        json_t *fm = json_object_get(text, "format");
        if (fm && !json_is_null(fm)) {
            const char *type = srv_jstr(fm, "type");
            if (!type) {
                json_decref(chat);
                return perr(o, 400, "text.format.type", "invalid_type", "'text.format' must be an object with a 'type'"), NULL;
            }
            if (!strcmp(type, "json_object")) {
                json_object_set_new(chat, "response_format", json_pack("{s:s}", "type", "json_object"));
            } else if (!strcmp(type, "json_schema")) {
                json_t *schema = json_object_get(fm, "schema"), *strict = json_object_get(fm, "strict");
                const char *bad = !json_is_object(schema) ? "text.format.schema"
                                  : !srv_jstr(fm, "name") ? "text.format.name"
                                  : strict && !json_is_null(strict) && !json_is_boolean(strict) ? "text.format.strict"
                                                                                              : NULL;
                if (bad) {
                    json_decref(chat);
                    return perr(o, 400, bad, "invalid_value", "'%s' is missing or has the wrong type (text.format of type "
                                                              "json_schema needs 'name' (a string) and 'schema' (an object))", bad), NULL;
                }
                json_t *js = json_pack("{s:s,s:O}", "name", srv_jstr(fm, "name"), "schema", schema);
                if (strict && !json_is_null(strict)) json_object_set(js, "strict", strict);
                json_object_set_new(chat, "response_format", json_pack("{s:s,s:o}", "type", "json_schema", "json_schema", js));
            } else if (strcmp(type, "text")) {
                json_decref(chat);
                return perr(o, 400, "text.format.type", "invalid_value", "'text.format.type' must be \"text\", "
                                                                         "\"json_object\" or \"json_schema\", got \"%s\"", type), NULL;
            }
        }
    }
    json_t *re = json_object_get(b, "reasoning");
    if (re && !json_is_null(re)) {
        json_t *ef = json_object_get(re, "effort");
        if (!json_is_object(re) || (ef && !json_is_null(ef) && !json_is_string(ef))) {
            json_decref(chat);
            return perr(o, 400, "reasoning.effort", "invalid_type", "'reasoning' must be an object whose 'effort' is a string"), NULL;
        }
        if (json_is_string(ef)) json_object_set(chat, "reasoning_effort", ef); /* for the chat template */
    }
    json_t *md = json_object_get(b, "metadata");
    if (md && !json_is_null(md)) {
        bool ok = json_is_object(md) && json_object_size(md) <= 16;
        json_object_foreach(md, k, v) if (!json_is_string(v) || strlen(k) > 64 || json_string_length(v) > 512) ok = false;
        if (!ok) {
            json_decref(chat);
            return perr(o, 400, "metadata", "invalid_value", "'metadata' must be an object of at most 16 string values "
                                                             "(keys up to 64 characters, values up to 512)"), NULL;
        }
    }
    static const char *const strs[] = {"user", "instructions", "previous_response_id", "model", "service_tier",
                                       "prompt_cache_key", "safety_identifier", NULL};
    for (int i = 0; strs[i]; i++)
        if (srv_jpresent(b, strs[i]) && !json_is_string(json_object_get(b, strs[i]))) {
            json_decref(chat);
            return perr(o, 400, strs[i], "invalid_type", "'%s' must be a string", strs[i]), NULL;
        }
    static const char *const bools[] = {"stream", "store", "parallel_tool_calls", "background", NULL};
    for (int i = 0; bools[i]; i++)
        if (srv_jpresent(b, bools[i]) && !json_is_boolean(json_object_get(b, bools[i]))) {
            json_decref(chat);
            return perr(o, 400, bools[i], "invalid_type", "'%s' must be true or false", bools[i]), NULL;
        }
    return chat;
}

/* ------------------------------------------------------------ output items */

enum { IT_REASONING, IT_MESSAGE, IT_CALL };

typedef struct ritem {
    int kind;
    char id[96];
    char call_id[96]; /* IT_CALL */
    int call_index;   /* IT_CALL: the parser's index */
    char *name;       /* IT_CALL */
    char *text;       /* reasoning or message text, or a call's arguments */
    size_t len;
    bool closed;
} ritem;

/* The output items of a response, built from the parser's deltas; streamed,
 * each change is also an SSE event in ev. The whole answer and the stream use
 * this one path, so their items are the same. */
typedef struct racc {
    ritem *it;
    int n, cur;       /* cur: the open item, -1 = none */
    bool events;
    char *ev;
    size_t ev_len, ev_pos;
    long long seq;    /* sequence_number of the next event */
    char tag[64];     /* the response id without its "resp_": item ids are made of it */
    bool short_ids;   /* call ids of 9 letters and digits (Mistral Nemo's template refuses others) */
} racc;

static void ev_put(racc *a, const char *type, json_t *j) {
    if (!a->events || !j) {
        json_decref(j);
        return;
    }
    json_t *e = json_pack("{s:s,s:I}", "type", type, "sequence_number", (json_int_t)a->seq++);
    json_object_update(e, j);
    json_decref(j);
    char *t = json_dumps(e, JSON_COMPACT);
    json_decref(e);
    if (!t) return;
    size_t n = strlen(t), need = strlen(type) + n + 20;
    char *p = realloc(a->ev, a->ev_len + need);
    if (p) {
        a->ev = p;
        a->ev_len += (size_t)snprintf(p + a->ev_len, need, "event: %s\ndata: %s\n\n", type, t);
    }
    free(t);
}

static json_t *text_of(const ritem *r) { return srv_text_json(r->text, r->len); }

/* An item as the response lists it (status: completed or incomplete). */
static json_t *item_json(const ritem *r, const char *status) {
    switch (r->kind) {
    case IT_REASONING:
        return json_pack("{s:s,s:s,s:[],s:[{s:s,s:o}]}", "id", r->id, "type", "reasoning", "summary", "content", "type",
                         "reasoning_text", "text", text_of(r));
    case IT_MESSAGE:
        return json_pack("{s:s,s:s,s:s,s:s,s:[{s:s,s:o,s:[],s:[]}]}", "id", r->id, "type", "message", "status", status,
                         "role", "assistant", "content", "type", "output_text", "text", text_of(r), "annotations",
                         "logprobs");
    default:
        return json_pack("{s:s,s:s,s:s,s:s,s:o,s:o}", "id", r->id, "type", "function_call", "status", status, "call_id",
                         r->call_id, "name", srv_text_json(r->name, strlen(r->name)), "arguments", text_of(r));
    }
}

static void acc_close(racc *a, const char *status) {
    if (a->cur < 0) return;
    ritem *r = &a->it[a->cur];
    int oi = a->cur;
    a->cur = -1;
    r->closed = true;
    if (r->kind == IT_CALL) {
        ev_put(a, "response.function_call_arguments.done",
               json_pack("{s:s,s:i,s:o,s:o}", "item_id", r->id, "output_index", oi, "name",
                         srv_text_json(r->name, strlen(r->name)), "arguments", text_of(r)));
    } else {
        bool msg = r->kind == IT_MESSAGE;
        ev_put(a, msg ? "response.output_text.done" : "response.reasoning_text.done",
               json_pack(msg ? "{s:s,s:i,s:i,s:o,s:[]}" : "{s:s,s:i,s:i,s:o}", "item_id", r->id, "output_index", oi,
                         "content_index", 0, "text", text_of(r), "logprobs"));
        json_t *part = msg ? json_pack("{s:s,s:o,s:[],s:[]}", "type", "output_text", "text", text_of(r), "annotations", "logprobs")
                           : json_pack("{s:s,s:o}", "type", "reasoning_text", "text", text_of(r));
        ev_put(a, "response.content_part.done",
               json_pack("{s:s,s:i,s:i,s:o}", "item_id", r->id, "output_index", oi, "content_index", 0, "part", part));
    }
    ev_put(a, "response.output_item.done", json_pack("{s:i,s:o}", "output_index", oi, "item", item_json(r, status)));
}

static ritem *acc_open(racc *a, int kind, const char *name, size_t name_len, int call_index) {
    acc_close(a, "completed");
    ritem *it = realloc(a->it, (size_t)(a->n + 1) * sizeof *it);
    if (!it) return NULL;
    a->it = it;
    ritem *r = &a->it[a->n];
    memset(r, 0, sizeof *r);
    r->kind = kind;
    static const char *const pre[] = {"rs", "msg", "fc"};
    snprintf(r->id, sizeof r->id, "%s_%s_%d", pre[kind], a->tag, a->n);
    if (kind == IT_CALL) {
        snprintf(r->call_id, sizeof r->call_id, "call_%s_%d", a->tag, a->n);
        if (a->short_ids) srv_short_id(r->call_id, r->call_id); /* Mistral Nemo's template */
    }
    if (kind == IT_CALL) {
        r->call_index = call_index;
        r->name = malloc(name_len + 1);
        if (!r->name) return NULL;
        memcpy(r->name, name, name_len);
        r->name[name_len] = 0;
    }
    a->cur = a->n++;
    int oi = a->cur;
    json_t *item = kind == IT_REASONING ? json_pack("{s:s,s:s,s:[],s:[]}", "id", r->id, "type", "reasoning", "summary", "content")
                   : kind == IT_MESSAGE ? json_pack("{s:s,s:s,s:s,s:s,s:[]}", "id", r->id, "type", "message", "status",
                                                    "in_progress", "role", "assistant", "content")
                                        : json_pack("{s:s,s:s,s:s,s:s,s:o,s:s}", "id", r->id, "type", "function_call", "status",
                                                    "in_progress", "call_id", r->call_id, "name",
                                                    srv_text_json(r->name, name_len), "arguments", "");
    ev_put(a, "response.output_item.added", json_pack("{s:i,s:o}", "output_index", oi, "item", item));
    if (kind != IT_CALL) {
        json_t *part = kind == IT_MESSAGE ? json_pack("{s:s,s:s,s:[],s:[]}", "type", "output_text", "text", "", "annotations", "logprobs")
                                          : json_pack("{s:s,s:s}", "type", "reasoning_text", "text", "");
        ev_put(a, "response.content_part.added",
               json_pack("{s:s,s:i,s:i,s:o}", "item_id", r->id, "output_index", oi, "content_index", 0, "part", part));
    }
    return r;
}

static void acc_append(ritem *r, const char *p, size_t n) {
    char *t = realloc(r->text, r->len + n + 1);
    if (!t) return;
    r->text = t;
    memcpy(t + r->len, p, n);
    r->len += n;
    t[r->len] = 0;
}

static void acc_delta(racc *a, const pkv_tc_delta *d) {
    ritem *r = a->cur >= 0 ? &a->it[a->cur] : NULL;
    switch (d->kind) {
    case PKV_TC_D_REASONING:
    case PKV_TC_D_CONTENT: {
        int kind = d->kind == PKV_TC_D_CONTENT ? IT_MESSAGE : IT_REASONING;
        if (!d->len) return;
        if (!r || r->kind != kind) r = acc_open(a, kind, NULL, 0, 0);
        if (!r) return;
        acc_append(r, d->text, d->len);
        ev_put(a, kind == IT_MESSAGE ? "response.output_text.delta" : "response.reasoning_text.delta",
               json_pack(kind == IT_MESSAGE ? "{s:s,s:i,s:i,s:o,s:[]}" : "{s:s,s:i,s:i,s:o}", "item_id", r->id,
                         "output_index", a->cur, "content_index", 0, "delta", srv_text_json(d->text, d->len), "logprobs"));
        return;
    }
    case PKV_TC_D_CALL:
        acc_open(a, IT_CALL, d->text, d->len, d->index);
        return;
    default:
        if (!r || r->kind != IT_CALL || r->call_index != d->index) return; /* the parser's arguments follow their call */
        acc_append(r, d->text, d->len);
        ev_put(a, "response.function_call_arguments.delta",
               json_pack("{s:s,s:i,s:o}", "item_id", r->id, "output_index", a->cur, "delta", srv_text_json(d->text, d->len)));
    }
}

static void acc_free(racc *a) {
    for (int i = 0; i < a->n; i++) {
        free(a->it[i].name);
        free(a->it[i].text);
    }
    free(a->it);
    free(a->ev);
    memset(a, 0, sizeof *a);
}

/* ------------------------------------------------------------------ jobs */

/* One response from submission to its answer. */
typedef struct resp_job {
    srv *s;
    srv_req *r;
    srv_outfmt of;
    pkv_tc_stream *tcs;  /* the answer parsed as it grows (of.parse) */
    size_t fed;          /* bytes given to the parser (or, raw, taken as content) */
    racc acc;
    json_t *echo;        /* request fields echoed in the response object */
    json_t *conv;        /* the conversation so far (earlier turns + this input), chat messages */
    char id[64];
    long long created_at;
    int64_t ctx_id;      /* its context until stored (then the store's) */
    int n_prompt;        /* the whole prompt's tokens */
    char *text;          /* the prompt's text as rendered (tlen bytes), kept with a stored response */
    size_t tlen;
    int32_t *ids;        /* return_token_ids: the whole prompt's token ids (n_prompt), else NULL */
    bool store;
    srv_conn conn;
} resp_job;

static void job_free(resp_job *j) {
    if (!j) return;
    if (j->ctx_id) drop_ctx(j->s, j->ctx_id);
    pkv_tc_stream_free(j->tcs);
    acc_free(&j->acc);
    json_decref(j->echo);
    json_decref(j->conv);
    free(j->text);
    free(j->ids);
    srv_req_release(j->r);
    free(j);
}

/* Feed the answer's text up to upto to the items (final: it is all); r->mu held. */
static void job_feed(resp_job *j, bool final) {
    srv_choice *c = &j->r->ch[0];
    size_t upto = final ? c->len : c->stable;
    if (j->of.parse) {
        const pkv_tc_delta *d = NULL;
        int nd = 0;
        if (!j->tcs || !pkv_tc_stream_update(j->tcs, c->text ? c->text : "", upto, final, &d, &nd)) nd = 0;
        for (int k = 0; k < nd; k++) acc_delta(&j->acc, &d[k]);
    } else if (upto > j->fed) {
        pkv_tc_delta d = {PKV_TC_D_CONTENT, 0, c->text + j->fed, upto - j->fed};
        acc_delta(&j->acc, &d);
    }
    j->fed = upto;
}

/* Tokens of the answer's reasoning: those that start before the end of its
 * <think> block (templates with <think>; other formats count 0). */
static int reasoning_tokens(resp_job *j) {
    srv_choice *c = &j->r->ch[0];
    if (!j->of.parse || !j->of.tc.think || !c->text) return 0;
    const char *e = strstr(c->text, "</think>");
    if (!e) return 0;
    size_t end = (size_t)(e - c->text) + 8;
    int n = 0;
    while (n < c->n_toks && c->toks[n].text_off < end) n++;
    return n;
}

/* The response object; status: "in_progress" (no output or usage yet), or the
 * finished one's. */
static json_t *response_json(resp_job *j, const char *status, bool final) {
    json_t *out = json_array();
    bool incomplete = final && !strcmp(status, "incomplete");
    for (int i = 0; final && i < j->acc.n; i++)
        json_array_append_new(out, item_json(&j->acc.it[i], incomplete && i == j->acc.n - 1 ? "incomplete" : "completed"));
    json_t *resp = json_pack("{s:s,s:s,s:I,s:s,s:b,s:n,s:o,s:s,s:o}", "id", j->id, "object", "response", "created_at",
                             (json_int_t)j->created_at, "status", status, "background", 0, "error", "incomplete_details",
                             incomplete ? json_pack("{s:s}", "reason", "max_output_tokens") : json_null(), "model",
                             j->s->model_id, "output", out);
    json_object_update(resp, j->echo);
    if (final) {
        srv_req *r = j->r;
        int gen = r->ch[0].n_toks;
        json_object_set_new(resp, "usage",
                            json_pack("{s:i,s:{s:i},s:i,s:{s:i},s:i}", "input_tokens", j->n_prompt, "input_tokens_details",
                                      "cached_tokens", r->cached_tokens, "output_tokens", gen, "output_tokens_details",
                                      "reasoning_tokens", reasoning_tokens(j), "total_tokens", j->n_prompt + gen));
        if (j->ids) {
            json_t *a = json_array();
            for (int i = 0; i < j->n_prompt; i++) json_array_append_new(a, json_integer(j->ids[i]));
            json_object_set_new(resp, "prompt_token_ids", a);
        }
    } else {
        json_object_set_new(resp, "usage", json_null());
    }
    return resp;
}

/* The finished response (r done without error): its items closed, the response
 * kept when store asks for it (its context with it), else its context freed. */
static json_t *job_finish(resp_job *j) {
    pthread_mutex_lock(&j->r->mu);
    job_feed(j, true);
    const char *fin = j->r->ch[0].finish ? j->r->ch[0].finish : "length";
    pthread_mutex_unlock(&j->r->mu);
    const char *status = !strcmp(fin, "length") ? "incomplete" : "completed";
    if (j->acc.n == 0) acc_open(&j->acc, IT_MESSAGE, NULL, 0, 0); /* an empty answer is an empty message */
    acc_close(&j->acc, status);
    json_t *resp = response_json(j, status, true);
    if (!resp) return NULL;
    if (j->store && j->s->responses) {
        /* the turn as a chat message, as a client would send it back */
        json_t *m = json_pack("{s:s,s:n}", "role", "assistant", "content");
        json_t *calls = NULL;
        for (int i = 0; i < j->acc.n; i++) {
            ritem *it = &j->acc.it[i];
            if (it->kind == IT_REASONING) json_object_set_new(m, "reasoning_content", text_of(it));
            else if (it->kind == IT_MESSAGE) json_object_set_new(m, "content", text_of(it));
            else {
                if (!calls) json_object_set_new(m, "tool_calls", calls = json_array());
                json_array_append_new(calls, json_pack("{s:s,s:s,s:{s:o,s:o}}", "id", it->call_id, "type", "function", "function",
                                                       "name", srv_text_json(it->name, strlen(it->name)), "arguments",
                                                       text_of(it)));
            }
        }
        json_array_append_new(j->conv, m);
        resp_entry e = {0};
        snprintf(e.id, sizeof e.id, "%s", j->id);
        e.ctx_id = j->ctx_id;
        e.response = json_incref(resp);
        e.messages = json_incref(j->conv);
        e.prompt = j->text;
        e.prompt_len = j->tlen;
        e.n_prompt = j->n_prompt;
        e.special_text = j->r->special_text;
        j->text = NULL;
        j->ctx_id = 0; /* the store's now */
        drops d = {0};
        store_put(j->s->responses, &e, &d);
        drops_run(j->s, &d);
        enforce_pages(j->s);
    }
    return resp;
}

/* -------------------------------------------------------------- streams */

typedef struct rstream {
    srv_body base;
    resp_job *j;
    bool started, ended;
} rstream;

static bool rs_progressed(resp_job *j) {
    srv_req *r = j->r;
    return r->done || r->http_status || r->ch[0].stable > j->fed;
}

/* The next events: created and in_progress first, then the items as the text
 * grows, then completed (or incomplete); an error event when generation fails. */
static ssize_t rs_read(srv_body *b, char *buf, size_t max) {
    rstream *st = (rstream *)b;
    resp_job *j = st->j;
    racc *a = &j->acc;
    while (a->ev_pos >= a->ev_len) {
        a->ev_len = a->ev_pos = 0;
        if (st->ended) return 0;
        if (!st->started) {
            st->started = true;
            ev_put(a, "response.created", json_pack("{s:o}", "response", response_json(j, "in_progress", false)));
            ev_put(a, "response.in_progress", json_pack("{s:o}", "response", response_json(j, "in_progress", false)));
            continue;
        }
        srv_req *r = j->r;
        pthread_mutex_lock(&r->mu);
        bool waited = !rs_progressed(j);
        if (waited) srv_conn_waiting(&j->conn, true);
        while (!rs_progressed(j)) {
            srv_req_wait_200ms(r);
            if (!rs_progressed(j) && srv_conn_gone(&j->conn)) {
                pthread_mutex_unlock(&r->mu);
                return -1; /* rs_free cancels it */
            }
        }
        if (waited) srv_conn_waiting(&j->conn, false);
        if (r->http_status) {
            char msg[600];
            int status = r->http_status;
            snprintf(msg, sizeof msg, "%s", r->err);
            pthread_mutex_unlock(&r->mu);
            const char *code = status == 503 ? "server_overloaded" : status >= 500 ? "server_error" : "invalid_request_error";
            ev_put(a, "error", json_pack("{s:s,s:s,s:n}", "code", code, "message", msg, "param"));
            st->ended = true;
            continue;
        }
        bool done = r->done;
        if (!done) job_feed(j, false);
        pthread_mutex_unlock(&r->mu);
        if (done) {
            json_t *resp = job_finish(j);
            const char *type = resp && !strcmp(srv_jstr(resp, "status"), "incomplete") ? "response.incomplete" : "response.completed";
            ev_put(a, type, json_pack("{s:o}", "response", resp ? resp : json_null()));
            st->ended = true;
        }
    }
    size_t n = a->ev_len - a->ev_pos < max ? a->ev_len - a->ev_pos : max;
    memcpy(buf, a->ev + a->ev_pos, n);
    a->ev_pos += n;
    return (ssize_t)n;
}

static void rs_free(srv_body *b) {
    rstream *st = (rstream *)b;
    resp_job *j = st->j;
    pthread_mutex_lock(&j->r->mu);
    bool done = j->r->done, failed = j->r->http_status != 0;
    pthread_mutex_unlock(&j->r->mu);
    if (!done) { /* the client left mid-stream */
        srv_gen_cancel(j->s->g, j->r);
        if (!failed) {
            pthread_mutex_lock(&j->s->mu);
            j->s->disconnects++;
            pthread_mutex_unlock(&j->s->mu);
        }
    }
    job_free(j);
    free(st);
}

/* An error of the chat layer's output fields, in the Responses request's names
 * (the fields it was translated from), with the first one named as param. */
static void rename_fields(srv_out *o) {
    json_t *e = json_object_get(o->json, "error");
    const char *m = json_string_value(json_object_get(e, "message"));
    if (!m) return;
    static const char *const from[] = {"response_format.json_schema.schema", "response_format.json_schema",
                                       "response_format.schema", "response_format", ".function.parameters",
                                       ".function.name"};
    static const char *const to[] = {"text.format.schema", "text.format", "text.format", "text.format", ".parameters",
                                     ".name"};
    char out[1200];
    size_t n = 0;
    for (const char *p = m; *p && n + 40 < sizeof out;) {
        int k = 0;
        while (k < 6 && strncmp(p, from[k], strlen(from[k]))) k++;
        if (k < 6) {
            n += (size_t)snprintf(out + n, sizeof out - n, "%s", to[k]);
            p += strlen(from[k]);
        } else {
            out[n++] = *p++;
        }
    }
    out[n] = 0;
    json_object_set_new(e, "message", json_string(out));
    const char *q = strchr(out, '\'');
    const char *q2 = q ? strchr(q + 1, '\'') : NULL;
    if (q2 && q2 - q < 100) json_object_set_new(e, "param", json_stringn(q + 1, (size_t)(q2 - q - 1)));
}

/* ------------------------------------------------------------- handlers */

/* What the response object repeats of request b (store as decided, r's sampling). */
static json_t *request_echo(json_t *b, bool store, const srv_req *r) {
    json_t *tools = json_object_get(b, "tools"), *re = json_object_get(b, "reasoning");
    json_t *ec = json_object();
    if (!ec) return NULL;
#define ECHO(k, dflt) json_object_set_new(ec, k, srv_jpresent(b, k) ? json_incref(json_object_get(b, k)) : (dflt))
    ECHO("instructions", json_null());
    ECHO("max_output_tokens", json_null());
    ECHO("previous_response_id", json_null());
    ECHO("tool_choice", json_string("auto"));
    ECHO("metadata", json_object());
    ECHO("user", json_null());
    ECHO("parallel_tool_calls", json_true());
    ECHO("text", json_pack("{s:{s:s}}", "format", "type", "text"));
#undef ECHO
    json_object_set_new(ec, "tools", json_is_array(tools) ? json_incref(tools) : json_array());
    json_object_set_new(ec, "store", json_boolean(store));
    json_object_set_new(ec, "truncation", json_string("disabled"));
    json_t *eff = json_is_object(re) ? json_object_get(re, "effort") : NULL;
    json_object_set_new(ec, "reasoning", json_pack("{s:O,s:n}", "effort", eff ? eff : json_null(), "summary"));
    json_object_set_new(ec, "temperature", json_real(r->sp.temp));
    json_object_set_new(ec, "top_p", json_real(r->sp.top_p));
    json_object_set_new(ec, "max_tool_calls", json_null());
    return ec;
}

/* A follow-up of previous_response_id prev: counted by the path it took; a recut
 * one (the template renders the earlier turns otherwise) says so. */
static void count_followup(srv *s, const char *prev, bool spliced, bool as_generated, int64_t keep, int n_prompt) {
    pthread_mutex_lock(&s->mu);
    if (spliced) s->resp_spliced++;
    else s->resp_recut++;
    if (as_generated) s->resp_generated++;
    pthread_mutex_unlock(&s->mu);
    if (!spliced)
        fprintf(stderr, "pagekv serve: previous_response_id %.100s: the template renders the earlier turns "
                        "otherwise; its context is cut where the tokens differ (%lld of %d kept)\n",
                prev, (long long)keep, n_prompt);
}

/* The request's prompt once its context is prepared: with a splice, the new
 * turn's tokens (sfx, taken) after the stored context's; otherwise the rendered
 * prompt less the p->keep tokens the context already holds. j->n_prompt is the
 * whole prompt's length, j->ids (ret_ids) its tokens; false when out of memory. */
static bool adopt_prompt(resp_job *j, srv_req *r, const prep *p, const int32_t *ctx_toks, int64_t n_ctx_toks,
                         int32_t **sfx, int n_sfx, bool ret_ids) {
    if (p->splice) {
        j->n_prompt = (int)(n_ctx_toks + n_sfx);
        if (ret_ids && (j->ids = malloc((size_t)j->n_prompt * sizeof *j->ids))) {
            memcpy(j->ids, ctx_toks, (size_t)n_ctx_toks * sizeof *j->ids);
            memcpy(j->ids + n_ctx_toks, *sfx, (size_t)n_sfx * sizeof *j->ids);
        }
        free(r->prompt);
        r->prompt = *sfx;
        r->n_prompt = n_sfx;
        *sfx = NULL;
    } else {
        j->n_prompt = r->n_prompt;
        if (ret_ids && (j->ids = malloc((size_t)j->n_prompt * sizeof *j->ids)))
            memcpy(j->ids, r->prompt, (size_t)j->n_prompt * sizeof *j->ids);
        memmove(r->prompt, r->prompt + p->keep, (size_t)(r->n_prompt - p->keep) * sizeof *r->prompt);
        r->n_prompt -= (int)p->keep;
    }
    return !ret_ids || j->ids;
}

static void create(srv *s, json_t *b, const srv_conn *conn, srv_out *o) {
    json_t *chat = chat_fields(s, b, o);
    if (!chat) return;
    resp_job *j = calloc(1, sizeof *j);
    json_t *prev_msgs = NULL, *stored_last = NULL;
    srv_req *r = srv_req_new(1);
    size_t *spans = NULL, n_spans = 0, tlen = 0;
    char *text = NULL;
    prev_prompt pp = {0};
    int32_t *ctx_toks = NULL, *sfx = NULL; /* the splice: the stored context's tokens, then the new ones */
    if (!j || !r) {
        srv_error(o, 500, "out of memory");
        goto fail;
    }
    j->s = s;
    j->r = r;
    j->conn = conn ? *conn : (srv_conn){-1, NULL, 0, NULL, NULL};
    j->conn.content_type = NULL;
    j->store = !json_is_false(json_object_get(b, "store"));
    json_t *rti = json_object_get(b, "return_token_ids");
    if (rti && !json_is_null(rti) && !json_is_boolean(rti)) {
        perr(o, 400, "return_token_ids", "invalid_type", "'return_token_ids' must be a boolean");
        goto fail;
    }
    bool ret_ids = json_is_true(rti);
    if (ret_ids && json_is_true(json_object_get(b, "stream"))) {
        perr(o, 400, "return_token_ids", "invalid_value", "'return_token_ids' is for answers that are not streamed");
        goto fail;
    }
    const char *prev = srv_jstr(b, "previous_response_id");
    int64_t prev_ctx = 0;
    if (prev) {
        drops d = {0};
        bool found = s->responses && store_get(s->responses, prev, NULL, &prev_msgs, &prev_ctx, &pp, &d);
        drops_run(s, &d);
        if (!found) {
            perr(o, 400, "previous_response_id", "previous_response_not_found", "Previous response with id '%.100s' not found.",
                 prev);
            goto fail;
        }
    }
    /* the conversation: earlier turns, then this input; instructions go first, for this turn only */
    size_t n_stored = json_array_size(prev_msgs);
    stored_last = n_stored ? json_deep_copy(json_array_get(prev_msgs, n_stored - 1)) : NULL;
    j->conv = prev_msgs ? prev_msgs : json_array();
    prev_msgs = NULL;
    json_t *input = json_object_get(b, "input");
    if (!input || json_is_null(input)) {
        perr(o, 400, "input", "missing_required_parameter", "'input' is required");
        goto fail;
    }
    if (!input_messages(input, j->conv, o)) goto fail;
    /* the stored turn as it was (a function_call item of the input joins it otherwise) */
    bool stored_kept = stored_last && json_array_size(j->conv) > n_stored &&
                       json_equal(stored_last, json_array_get(j->conv, n_stored - 1));
    json_t *msgs = json_array();
    if (srv_jstr(b, "instructions"))
        json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", "system", "content", json_object_get(b, "instructions")));
    json_array_extend(msgs, j->conv);
    json_object_set_new(chat, "messages", msgs);
    if (!json_array_size(msgs)) {
        perr(o, 400, "input", "invalid_value", "'input' holds no message");
        goto fail;
    }
    bool logprobs = false;
    if (!srv_parse_sampling(s, chat, r, SRV_FMT_CHAT, &logprobs, o)) goto fail;
    if (!srv_output_request(s, chat, true, r, &j->of, o)) {
        rename_fields(o);
        goto fail;
    }
    if (!(text = srv_chat_prompt(s, chat, conn, &tlen, &spans, &n_spans, o))) goto fail;
    srv_output_prompt(&j->of, text, tlen);
    if (!srv_tokenize_spans(s, text, tlen, spans, n_spans, &r->prompt, &r->n_prompt, o)) goto fail;
    if (r->n_prompt == 0) {
        srv_error(o, 400, "the prompt is empty");
        goto fail;
    }
    if (r->n_prompt >= s->n_ctx || (r->max_tokens_asked && r->n_prompt + (int64_t)r->max_tokens > s->n_ctx)) {
        perr(o, 400, r->n_prompt >= s->n_ctx ? "input" : "max_output_tokens", "context_length_exceeded",
             "the conversation has %d tokens%s; the context holds %lld (start the server with a larger -c)", r->n_prompt,
             r->n_prompt >= s->n_ctx ? "" : " plus max_output_tokens", (long long)s->n_ctx);
        goto fail;
    }
    r->stop_ids = s->stop_ids;
    r->n_stop_ids = s->n_stop_ids;
    if (j->of.parse && !(j->tcs = pkv_tc_stream_new(&j->of.tc))) {
        srv_error(o, 500, "out of memory");
        goto fail;
    }
    /* its context: the previous response's forked (continued, or cut where the
     * tokens first differ), or a new one */
    int64_t n_ctx_toks = 0;
    int n_sfx = 0;
    bool spliced = prev_ctx && splice_prompt(s, prev_ctx, &pp, text, tlen, spans, n_spans, &ctx_toks, &n_ctx_toks,
                                             &sfx, &n_sfx);
    bool as_generated = false;
    if (prev_ctx && !spliced && stored_kept && !s->o.responses_template)
        spliced = as_generated = splice_generated(s, chat, msgs, (srv_jstr(b, "instructions") ? 1 : 0) + n_stored, prev_ctx,
                                                  &pp, text, tlen, spans, n_spans, r->prompt, r->n_prompt, &ctx_toks,
                                                  &n_ctx_toks, &sfx, &n_sfx);
    if (spliced && n_ctx_toks + n_sfx >= s->n_ctx) {
        perr(o, 400, "input", "context_length_exceeded",
             "the conversation has %lld tokens; the context holds %lld (start the server with a larger -c)",
             (long long)(n_ctx_toks + n_sfx), (long long)s->n_ctx);
        goto fail;
    }
    prep p = {.prev = prev_ctx, .splice = spliced ? n_ctx_toks : 0, .toks = r->prompt, .n = r->n_prompt,
              .n_ctx = s->n_ctx};
    srv_gen_call(s->g, prep_fn, &p);
    if (p.status == 404) {
        perr(o, 400, "previous_response_id", "previous_response_not_found", "Previous response with id '%.100s' not found.",
             prev);
        goto fail;
    }
    if (p.status != 200) {
        srv_error(o, 503, "%s", p.err[0] ? p.err : "the server is shutting down");
        goto fail;
    }
    j->ctx_id = p.id;
    if (!adopt_prompt(j, r, &p, ctx_toks, n_ctx_toks, &sfx, n_sfx, ret_ids)) {
        srv_error(o, 500, "out of memory");
        goto fail;
    }
    if (prev_ctx) count_followup(s, prev, p.splice != 0, as_generated && p.splice, p.keep, j->n_prompt);
    j->text = text; /* kept with the response: a follow-up checks its prompt starts so */
    j->tlen = tlen;
    text = NULL;
    r->ctx_id = p.id;
    r->ctx_cont = true;
    srv_next_id(s, "resp", j->id, sizeof j->id);
    j->id[4] = '_';
    snprintf(j->acc.tag, sizeof j->acc.tag, "%s", j->id + 5);
    const char *tsrc = pkv_chat_source(s->chat);
    bool tthink = false;
    j->acc.short_ids = tsrc && pkv_tc_detect(tsrc, strlen(tsrc), &tthink) == PKV_TC_MISTRAL;
    j->acc.cur = -1;
    j->created_at = (long long)time(NULL);
    j->echo = request_echo(b, j->store, r);
    if (!j->echo) {
        srv_error(o, 500, "out of memory");
        goto fail;
    }
    bool stream = json_is_true(json_object_get(b, "stream"));
    j->acc.events = stream;
    if (stream) {
        snprintf(r->log_id, sizeof r->log_id, "%s", j->id);
        rstream *st = calloc(1, sizeof *st);
        if (!st) {
            srv_error(o, 500, "out of memory");
            goto fail;
        }
        if (!srv_gen_submit(s->g, r)) {
            free(st);
            srv_error(o, 503, "the server is busy: %d requests are waiting already (--queue); retry later", s->o.queue);
            goto fail;
        }
        st->base.read = rs_read;
        st->base.free = rs_free;
        st->j = j;
        o->status = 200;
        o->body = &st->base;
        o->ctype = "text/event-stream";
        o->no_cache = true;
        free(text);
        free(spans);
        free(pp.text);
        free(ctx_toks);
        json_decref(chat);
        json_decref(stored_last);
        return;
    }
    if (!srv_submit_and_wait(s, r, -1, false, false, j->id, conn, o)) goto fail;
    json_t *resp = job_finish(j);
    if (!resp) {
        srv_error(o, 500, "out of memory");
        goto fail;
    }
    o->status = 200;
    o->json = resp;
fail:
    free(text);
    free(spans);
    free(pp.text);
    free(ctx_toks);
    free(sfx);
    json_decref(chat);
    json_decref(prev_msgs);
    json_decref(stored_last);
    if (j) job_free(j);
    else srv_req_release(r);
}

void srv_api_responses(srv *s, const char *method, const char *rest, json_t *b, const srv_conn *conn, srv_out *o) {
    bool get = !strcmp(method, "GET"), post = !strcmp(method, "POST"), del = !strcmp(method, "DELETE");
    if (!*rest || !strcmp(rest, "/")) {
        if (!post) return srv_error(o, 405, "use POST /v1/responses");
        return create(s, b, conn, o);
    }
    const char *id = rest + 1;
    if (strchr(id, '/')) return srv_error(o, 404, "no such endpoint: %s /v1/responses%s (pagekv serve has GET and DELETE "
                                                  "/v1/responses/{id})", method, rest);
    if (!get && !del) return srv_error(o, 405, "use GET or DELETE /v1/responses/{id}");
    drops d = {0};
    json_t *resp = NULL;
    bool found = s->responses && (get ? store_get(s->responses, id, &resp, NULL, NULL, NULL, &d) : store_del(s->responses, id, &d));
    drops_run(s, &d);
    if (!found) return perr(o, 404, NULL, NULL, "Response with id '%.100s' not found.", id);
    o->status = 200;
    o->json = get ? resp : json_pack("{s:s,s:s,s:b}", "id", id, "object", "response", "deleted", 1);
}
