/* The contexts API of pagekv serve: KV contexts as HTTP resources.
 *   POST   /v1/contexts                 {prompt | tokens}  -> a prefilled context
 *   GET    /v1/contexts                 the list
 *   GET    /v1/contexts/{id}            length, pages, shared pages, tokens
 *   POST   /v1/contexts/{id}/fork       O(1) copy-on-write child
 *   POST   /v1/contexts/{id}/append     {text | tokens}
 *   POST   /v1/contexts/{id}/truncate   {n_tokens}
 *   POST   /v1/contexts/{id}/generate   {max_tokens, sampling..., stream}
 *   DELETE /v1/contexts/{id}
 * Every operation runs on the worker thread (srv_gen_call), between engine steps.
 * Nothing here decodes: create and append submit a prefill-only engine request on
 * the context (pkv_request_params.prefill_only), which the engine chunks, batches
 * with the other requests and preempts like them, and the call answers at its
 * final event; generate is an engine request on the context (server-gen.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/server-http.h"

enum { OP_CREATE, OP_INFO, OP_FORK, OP_APPEND, OP_TRUNCATE, OP_DELETE };

typedef struct ctx_call {
    srv *s;
    int op;
    int64_t id;
    int32_t *toks;
    int n_toks;
    int64_t n_keep;
    /* a prefill (create, append) between the worker's calls: its engine request runs */
    pkv_context *building; /* create: the context until it is registered */
    srv_ctx *target;       /* append: the context (busy meanwhile) */
    int64_t reserved;      /* create, append: quota pages reserved until the prefill ends */
    int64_t matched;
    uint64_t eng_id;       /* the prefill-only engine request, 0 = none */
    bool eng_done;         /* its final event came (prefill_event) */
    pkv_finish_reason eng_fin;
    pkv_status eng_st;
    char eng_msg[512];
    /* result */
    int status;
    char err[600];
    json_t *res;
} ctx_call;

static void idstr(int64_t id, char *buf, size_t n) { snprintf(buf, n, "ctx-%lld", (long long)id); }

static json_t *ctx_json(srv_gen *g, srv_ctx *e, bool with_tokens) {
    char id[32];
    idstr(e->id, id, sizeof id);
    int64_t pages = 0, shared = 0, n = pkv_context_n_tokens(e->ctx);
    srv_ctx_pages(g, e, &pages, &shared);
    json_t *j = json_pack("{s:s,s:s,s:I,s:I,s:I,s:I,s:b,s:b,s:f}", "id", id, "object", "context", "n_tokens",
                          (json_int_t)n, "n_ctx", (json_int_t)pkv_context_n_ctx(e->ctx), "pages", (json_int_t)pages,
                          "shared_pages", (json_int_t)shared, "swapped", srv_ctx_swapped(g, e), "busy", e->busy, "idle_seconds",
                          srv_now() - e->last_used);
    if (j && e->parent) {
        char pid[32];
        idstr(e->parent, pid, sizeof pid);
        json_object_set_new(j, "parent", json_string(pid));
    }
    if (with_tokens && j) {
        json_t *a = json_array();
        int32_t *t = malloc((size_t)(n + 1) * sizeof *t);
        if (t && pkv_context_tokens(e->ctx, 0, n, t) == PKV_OK)
            for (int64_t i = 0; i < n; i++) json_array_append_new(a, json_integer(t[i]));
        free(t);
        json_object_set_new(j, "tokens", a);
    }
    return j;
}

static bool fail(ctx_call *k, int status, const char *msg) {
    k->status = status;
    snprintf(k->err, sizeof k->err, "%s", msg);
    return true;
}

/* Pages n more tokens may take (a partial page copied on write, a new last page). */
static int64_t pages_for(srv_gen *g, int64_t n) {
    int ps = pkv_kv_layout_page_size(pkv_kv_cache_layout(srv_gen_cache(g)));
    return (n + ps - 1) / ps + 1;
}

/* A prefill that failed (st: its status): out of pages is the pool's state (503),
 * anything else the input's (400). */
static bool prefill_fail(ctx_call *k, pkv_status st, const char *detail) {
    char msg[600];
    snprintf(msg, sizeof msg, "%s failed: %s: %s", k->op == OP_CREATE ? "prefill" : "append", pkv_status_str(st), detail);
    return fail(k, st == PKV_ERR_OUT_OF_PAGES ? 503 : 400, msg);
}

/* The final event of a prefill-only request (worker thread, inside a step). */
static bool prefill_event(const pkv_engine_event *ev, void *user) {
    ctx_call *k = user;
    if (ev->finish == PKV_FINISH_NONE) return true;
    k->eng_done = true;
    k->eng_fin = ev->finish;
    k->eng_st = ev->status;
    snprintf(k->eng_msg, sizeof k->eng_msg, "%s", ev->message ? ev->message : "");
    if (k->target) k->target->engine_req = 0;
    return true;
}

/* Submit k's tokens from `from` on as a prefill-only request on ctx. false with k
 * failed: the pool can never hold the context (503), or submit refused it. */
static bool prefill_submit(srv_gen *g, ctx_call *k, pkv_context *ctx, int from) {
    pkv_kv_stats ks;
    pkv_kv_stats_get(srv_gen_cache(g), &ks);
    int ps = pkv_kv_layout_page_size(pkv_kv_cache_layout(srv_gen_cache(g)));
    int64_t len = pkv_context_n_tokens(ctx) + (k->n_toks - from), need = (len + ps - 1) / ps;
    if (need > ks.n_pages) {
        char msg[300];
        snprintf(msg, sizeof msg, "the context would hold %lld tokens, %lld KV pages of %d tokens; the device pool "
                 "has %lld pages", (long long)len, (long long)need, ps, (long long)ks.n_pages);
        prefill_fail(k, PKV_ERR_OUT_OF_PAGES, msg);
        return false;
    }
    pkv_request_params rp = pkv_request_default_params();
    rp.prompt = k->toks + from;
    rp.n_prompt = k->n_toks - from;
    rp.context = ctx;
    rp.prefill_only = true;
    rp.on_event = prefill_event;
    rp.user = k;
    k->eng_done = false;
    pkv_status st = pkv_engine_submit(srv_gen_engine(g), &rp, &k->eng_id);
    if (st) {
        prefill_fail(k, st, pkv_errmsg());
        return false;
    }
    return true;
}

/* Has k's prefill request ended? At shutdown it is cancelled and ended now (the
 * worker no longer steps the engine, and its context is about to go). */
static bool prefill_over(srv_gen *g, ctx_call *k) {
    if (!k->eng_done && srv_gen_stopping(g)) srv_gen_end_request(g, k->eng_id, &k->eng_done);
    if (!k->eng_done) return false;
    k->eng_id = 0;
    if (k->eng_fin == PKV_FINISH_LENGTH) return true;
    if (k->eng_fin == PKV_FINISH_ERROR) prefill_fail(k, k->eng_st ? k->eng_st : PKV_ERR_INTERNAL, k->eng_msg);
    else fail(k, 503, "the server is shutting down");
    return true;
}

static bool create_call(srv_gen *g, ctx_call *k) {
    srv *s = k->s;
    char msg[600];
    if (!k->building) { /* first call: the context, its prefix match, the quota, the prefill request */
        pkv_context *ctx = pkv_context_create(srv_gen_model(g), srv_gen_cache(g), s->n_ctx);
        if (!ctx) {
            snprintf(msg, sizeof msg, "cannot create a context: %s", pkv_errmsg());
            return fail(k, 503, msg);
        }
        if (srv_ctx_count_api(g) >= s->o.max_contexts) {
            pkv_context_free(ctx);
            snprintf(msg, sizeof msg, "%d contexts are alive already (--max-contexts): delete some", s->o.max_contexts);
            return fail(k, 503, msg);
        }
        int64_t matched = 0;
        if (k->n_toks > 1 &&
            pkv_kv_prefix_match(srv_gen_cache(g), pkv_context_seq(ctx), k->toks, NULL, k->n_toks - 1, &matched))
            matched = 0;
        if (!srv_ctx_quota_ok(g, pkv_context_seq(ctx), pages_for(g, k->n_toks - matched), msg, sizeof msg)) {
            pkv_context_free(ctx);
            return fail(k, 503, msg);
        }
        if (matched < k->n_toks && !prefill_submit(g, k, ctx, (int)matched)) {
            pkv_context_free(ctx);
            return true;
        }
        /* until it is registered nobody else counts its pages */
        k->reserved = pages_for(g, k->n_toks);
        srv_ctx_quota_reserve(g, k->reserved);
        k->building = ctx;
        k->matched = matched;
        k->eng_done = matched >= k->n_toks; /* nothing to compute (no tokens) */
        k->eng_fin = PKV_FINISH_LENGTH;
        if (!k->eng_done) return false; /* answered at the prefill's final event */
    }
    if (!prefill_over(g, k)) return false;
    pkv_context *ctx = k->building;
    k->building = NULL;
    srv_ctx_quota_reserve(g, -k->reserved);
    k->reserved = 0;
    if (k->status) { /* the prefill failed */
        pkv_context_free(ctx);
        return true;
    }
    srv_ctx *e = srv_ctx_add(g, ctx);
    if (!e) {
        pkv_context_free(ctx);
        snprintf(msg, sizeof msg, "%d contexts are alive already (--max-contexts): delete some", s->o.max_contexts);
        return fail(k, 503, msg);
    }
    k->res = ctx_json(g, e, false);
    json_object_set_new(k->res, "cached_tokens", json_integer(k->matched));
    k->status = 200;
    return true;
}

/* An append's prefill request ended: the context is free again; a failed one
 * goes back to its length before the append (without logits, as after a truncate). */
static bool append_over(srv_gen *g, ctx_call *k) {
    if (!prefill_over(g, k)) return false;
    srv_ctx *e = k->target;
    /* a failed append goes back (the engine's again after); one cancelled while swapped out stays as it is */
    if (k->status && !srv_ctx_swapped(g, e) && srv_ctx_release(g, e) == PKV_OK) {
        pkv_context_truncate(e->ctx, k->n_keep);
        srv_ctx_hold(g, e);
    }
    e->busy = false;
    e->engine_req = 0;
    e->last_used = srv_now();
    k->target = NULL;
    srv_ctx_quota_reserve(g, -k->reserved);
    k->reserved = 0;
    if (!k->status) {
        k->res = ctx_json(g, e, false);
        k->status = 200;
    }
    return true;
}

static bool run_call(srv_gen *g, void *arg) {
    ctx_call *k = arg;
    srv *s = k->s;
    char msg[600];
    if (k->op == OP_CREATE) return create_call(g, k);
    if (k->target) return append_over(g, k); /* an append in progress */
    srv_ctx *e = srv_ctx_find(g, k->id);
    if (e && e->internal) e = NULL; /* a /v1/responses conversation */
    if (!e) return fail(k, 404, "no such context (deleted, or dropped after its idle TTL)");
    char id[32];
    idstr(e->id, id, sizeof id);
    if (k->op == OP_INFO) {
        k->res = ctx_json(g, e, true);
        k->status = 200;
        return true;
    }
    if (e->busy) return fail(k, 409, "the context is busy (a generation or an append runs on it): wait for it to finish");
    if (k->op == OP_DELETE) {
        srv_ctx_remove(g, e);
        k->res = json_pack("{s:s,s:s,s:b}", "id", id, "object", "context", "deleted", 1);
        k->status = 200;
        return true;
    }
    pkv_status st;
    /* fork and truncate change the context directly: resident again, the engine's after */
    if ((k->op == OP_FORK || k->op == OP_TRUNCATE) && (st = srv_ctx_release(g, e))) {
        snprintf(msg, sizeof msg, "cannot swap the context back in: %s", pkv_errmsg());
        return fail(k, 503, msg);
    }
    e->last_used = srv_now();
    if (k->op == OP_FORK) {
        pkv_context *child = pkv_context_fork(e->ctx);
        srv_ctx_hold(g, e);
        srv_ctx *ce = child ? srv_ctx_add(g, child) : NULL;
        if (!ce) {
            if (child) snprintf(msg, sizeof msg, "%d contexts are alive already (--max-contexts)", s->o.max_contexts);
            else snprintf(msg, sizeof msg, "fork failed: %s", pkv_errmsg());
            pkv_context_free(child);
            return fail(k, 503, msg);
        }
        ce->parent = e->id;
        k->res = ctx_json(g, ce, false);
        json_object_set_new(k->res, "parent", json_string(id));
        k->status = 200;
        return true;
    }
    if (k->op == OP_APPEND) {
        int64_t len = pkv_context_n_tokens(e->ctx);
        if (len + k->n_toks > pkv_context_n_ctx(e->ctx)) {
            snprintf(msg, sizeof msg, "the context would hold %lld tokens, more than its limit of %lld",
                     (long long)(len + k->n_toks), (long long)pkv_context_n_ctx(e->ctx));
            return fail(k, 400, msg);
        }
        if (!srv_ctx_quota_ok(g, -1, pages_for(g, k->n_toks), msg, sizeof msg)) return fail(k, 503, msg);
        if (!prefill_submit(g, k, e->ctx, 0)) return true;
        k->reserved = pages_for(g, k->n_toks);
        srv_ctx_quota_reserve(g, k->reserved);
        e->busy = true; /* the engine's until the final event: no fork, delete, swap or generation */
        e->engine_req = k->eng_id;
        k->target = e;
        k->n_keep = len; /* where a failed append goes back to */
        return false;
    } else if (k->op == OP_TRUNCATE) {
        int64_t len = pkv_context_n_tokens(e->ctx);
        if (k->n_keep > len) {
            srv_ctx_hold(g, e);
            snprintf(msg, sizeof msg, "'n_tokens' %lld is more than the context's %lld tokens", (long long)k->n_keep,
                     (long long)len);
            return fail(k, 400, msg);
        }
        st = pkv_context_truncate(e->ctx, k->n_keep);
        srv_ctx_hold(g, e);
        if (st) {
            snprintf(msg, sizeof msg, "truncate failed: %s", pkv_errmsg());
            return fail(k, 500, msg);
        }
    }
    k->res = ctx_json(g, e, false);
    k->status = 200;
    return true;
}

static bool list_call(srv_gen *g, void *arg) {
    ctx_call *k = arg;
    json_t *a = json_array();
    for (int i = 0, n = srv_ctx_count(g); i < n; i++)
        if (!srv_ctx_at(g, i)->internal) json_array_append_new(a, ctx_json(g, srv_ctx_at(g, i), false));
    k->res = json_pack("{s:s,s:o}", "object", "list", "data", a);
    k->status = 200;
    return true;
}

static bool parse_id(const char *p, int64_t *id, const char **rest) {
    if (strncmp(p, "ctx-", 4)) return false;
    p += 4;
    int64_t v = 0;
    const char *q = p;
    while (*q >= '0' && *q <= '9' && q - p < 15) v = v * 10 + (*q++ - '0');
    if (q == p || v <= 0) return false;
    *id = v;
    *rest = q;
    return true;
}

/* text or tokens of a body into k->toks */
static bool body_tokens(srv *s, json_t *b, bool add_special, ctx_call *k, srv_out *o) {
    json_t *tok = json_object_get(b, "tokens"), *text = json_object_get(b, "prompt");
    if (!text) text = json_object_get(b, "text");
    if (tok && !json_is_null(tok)) return srv_json_tokens(s, tok, "tokens", &k->toks, &k->n_toks, o);
    if (json_is_string(text))
        return srv_tokenize(s, json_string_value(text), json_string_length(text), add_special, true, &k->toks, &k->n_toks, o);
    srv_error(o, 400, "give 'tokens' (an array of token ids) or 'prompt'/'text' (a string)");
    return false;
}

static void finish(srv *s, ctx_call *k, srv_out *o) {
    (void)s;
    if (!k->status) srv_error(o, 503, "the server is shutting down");
    else if (k->status != 200) srv_error(o, k->status, "%s", k->err);
    else {
        o->status = 200;
        o->json = k->res;
        k->res = NULL;
    }
    json_decref(k->res);
    free(k->toks);
}

static void generate(srv *s, int64_t id, json_t *b, const srv_conn *conn, srv_out *o) {
    bool stream = false, logprobs = false;
    long long n = 1;
    json_t *nv = json_object_get(b, "n");
    if (nv && !json_is_null(nv) && (!json_is_integer(nv) || json_integer_value(nv) != 1))
        return srv_error(o, 400, "'n' must be 1 on a context: fork it for more samples");
    (void)n;
    json_t *sv = json_object_get(b, "stream");
    if (sv && !json_is_null(sv)) {
        if (!json_is_boolean(sv)) return srv_error(o, 400, "'stream' must be true or false");
        stream = json_is_true(sv);
    }
    srv_req *r = srv_req_new(1);
    if (!r) return srv_error(o, 500, "out of memory");
    if (!srv_parse_sampling(s, b, r, SRV_FMT_CONTEXT, &logprobs, o)) goto out;
    if (!json_object_get(b, "max_tokens") && !json_object_get(b, "max_completion_tokens"))
        r->max_tokens = s->o.max_tokens_default;
    r->ctx_id = id;
    r->stop_ids = s->stop_ids;
    r->n_stop_ids = s->n_stop_ids;
    char rid[32];
    idstr(id, rid, sizeof rid);
    if (!srv_submit_and_wait(s, r, stream ? SRV_FMT_CONTEXT : -1, logprobs, false, rid, conn, o)) goto out;
    srv_choice *c = &r->ch[0];
    json_t *ids = json_array();
    for (int i = 0; i < c->n_toks; i++) json_array_append_new(ids, json_integer(c->toks[i].id));
    o->status = 200;
    o->json = json_pack("{s:s,s:s,s:o,s:o,s:s,s:I}", "id", rid, "object", "context.generation", "text",
                        srv_text_json(c->text, c->len), "tokens", ids, "finish_reason", c->finish ? c->finish : "length",
                        "n_tokens", (json_int_t)r->ctx_len);
    if (logprobs) {
        json_t *lp = json_array();
        for (int i = 0; i < c->n_toks; i++) json_array_append_new(lp, json_real(c->toks[i].logprob));
        json_object_set_new(o->json, "logprobs", lp);
    }
out:
    srv_req_release(r);
}

void srv_api_contexts(srv *s, const char *method, const char *rest, json_t *b, const srv_conn *conn, srv_out *o) {
    ctx_call k;
    memset(&k, 0, sizeof k);
    k.s = s;
    bool get = !strcmp(method, "GET"), post = !strcmp(method, "POST"), del = !strcmp(method, "DELETE");
    if (!*rest || !strcmp(rest, "/")) {
        if (get) {
            srv_gen_call(s->g, list_call, &k);
            return finish(s, &k, o);
        }
        if (!post) return srv_error(o, 405, "use GET or POST /v1/contexts");
        if (!body_tokens(s, b, true, &k, o)) return;
        if (k.n_toks >= s->n_ctx) {
            free(k.toks);
            return srv_error(o, 400, "the prompt has %d tokens; a context holds %lld", k.n_toks, (long long)s->n_ctx);
        }
        k.op = OP_CREATE;
        srv_gen_call(s->g, run_call, &k);
        return finish(s, &k, o);
    }
    const char *tail;
    if (rest[0] != '/' || !parse_id(rest + 1, &k.id, &tail)) return srv_error(o, 404, "no such context: %s", rest + 1);
    if (!*tail) {
        if (get) k.op = OP_INFO;
        else if (del) k.op = OP_DELETE;
        else return srv_error(o, 405, "use GET or DELETE /v1/contexts/{id}");
    } else if (!post) {
        return srv_error(o, 405, "use POST /v1/contexts/{id}%s", tail);
    } else if (!strcmp(tail, "/fork")) {
        k.op = OP_FORK;
    } else if (!strcmp(tail, "/append")) {
        if (!body_tokens(s, b, false, &k, o)) return;
        if (k.n_toks == 0) {
            free(k.toks);
            return srv_error(o, 400, "nothing to append");
        }
        k.op = OP_APPEND;
    } else if (!strcmp(tail, "/truncate")) {
        json_t *v = json_object_get(b, "n_tokens");
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return srv_error(o, 400, "'n_tokens' must be a non-negative integer (the tokens to keep)");
        k.n_keep = json_integer_value(v);
        k.op = OP_TRUNCATE;
    } else if (!strcmp(tail, "/generate")) {
        return generate(s, k.id, b, conn, o);
    } else {
        return srv_error(o, 404, "no such endpoint: %s /v1/contexts%s", method, rest);
    }
    srv_gen_call(s->g, run_call, &k);
    finish(s, &k, o);
}
