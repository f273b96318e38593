/* The generation worker of pagekv serve (see server-gen.h). One thread owns the
 * serving engine, its model and its cache. Each loop: run queued calls (the
 * contexts API's operations, whose create and append submit prefill-only engine
 * requests and wait across steps for them), hand waiting requests to the engine
 * (completions, and the contexts API's generations as requests on their
 * context), then one engine step: one batch over every running request. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/server-gen.h"
#include "server/server.h"

const double srv_ttft_buckets[11] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
const double srv_tpot_buckets[10] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1};

double srv_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct call {
    srv_call_fn fn;
    void *arg;
    bool done;
    struct call *next;
} call;

struct srv_gen {
    pkv_engine *eng; /* the serving engine (owned) */
    pkv_model *m;
    pkv_kv_cache *c;
    srv_gen_params p;
    int32_t n_vocab;
    pthread_t th;
    bool started;
    pthread_mutex_t mu; /* guards everything below up to the worker-only part */
    pthread_cond_t cv, cv_done;
    bool stop;
    int eng_waiting;    /* requests the engine has not started (snapshot) */
    srv_req **waiting;
    int n_waiting, cap_waiting;
    call *calls, *calls_tail;
    srv_stats st;
    /* worker-only */
    srv_ctx **ctxs;
    int n_ctxs, n_internal;
    int64_t next_ctx_id;
    double last_sweep;
    int64_t quota_reserved; /* srv_ctx_quota_reserve: pages operations in progress may still take */
    int eng_pending; /* unfinished engine requests after the last step */
    bool defer;      /* inside a loop iteration: req_finish_one queues to fin */
    srv_req **fin;
    int n_fin, cap_fin;
};

/* ------------------------------------------------------------- requests */

srv_req *srv_req_new(int n) {
    srv_req *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->ch = calloc((size_t)(n > 0 ? n : 1), sizeof *r->ch);
    if (!r->ch) {
        free(r);
        return NULL;
    }
    r->n = n;
    r->refs = 1;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    return r;
}

void srv_req_release(srv_req *r) {
    if (!r) return;
    pthread_mutex_lock(&r->mu);
    int left = --r->refs;
    pthread_mutex_unlock(&r->mu);
    if (left > 0) return;
    for (int i = 0; i < r->n; i++) {
        free(r->ch[i].text);
        free(r->ch[i].toks);
    }
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->stop);
    free(r->bias);
    free(r->ch);
    free(r->prompt);
    free(r->embd);
    for (int i = 0; i < r->n_media; i++) free((void *)r->media[i].embd);
    free(r->media);
    pkv_grammar_free(r->grammar);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}

/* Mark a request failed (the worker drops its sequences at the next step). */
static void req_fail(srv_req *r, int status, const char *fmt, const char *detail) {
    pthread_mutex_lock(&r->mu);
    if (!r->http_status) {
        r->http_status = status;
        snprintf(r->err, sizeof r->err, fmt, detail ? detail : "");
    }
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/* ----------------------------------------------------------------- create */

static void *worker(void *arg);

srv_gen *srv_gen_create_engine(pkv_engine *e, srv_gen_params p) {
    srv_gen *g = calloc(1, sizeof *g);
    pkv_model_info info;
    if (!g || pkv_model_get_info(pkv_engine_model(e), &info)) {
        free(g);
        pkv_engine_free(e);
        return NULL;
    }
    g->eng = e;
    g->m = pkv_engine_model(e);
    g->c = pkv_engine_cache(e);
    g->p = p;
    g->n_vocab = info.n_vocab;
    g->next_ctx_id = 1;
    g->st.engine = true;
    if (p.max_internal < 0) p.max_internal = 0;
    g->p = p;
    g->ctxs = calloc((size_t)(p.max_contexts > 0 ? p.max_contexts : 1) + (size_t)p.max_internal, sizeof *g->ctxs);
    if (!g->ctxs) {
        free(g);
        pkv_engine_free(e);
        return NULL;
    }
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    pthread_cond_init(&g->cv_done, NULL);
    pkv_kv_stats_get(g->c, &g->st.kv);
    if (pthread_create(&g->th, NULL, worker, g)) {
        srv_gen_free(g);
        return NULL;
    }
    g->started = true;
    return g;
}

void srv_gen_free(srv_gen *g) {
    if (!g) return;
    if (g->started) {
        pthread_mutex_lock(&g->mu);
        g->stop = true;
        pthread_cond_broadcast(&g->cv);
        pthread_mutex_unlock(&g->mu);
        pthread_join(g->th, NULL);
    }
    for (int i = 0; i < g->n_ctxs; i++) {
        pkv_engine_context_drop(g->eng, g->ctxs[i]->ctx); /* the engine's statistics read held contexts */
        pkv_context_free(g->ctxs[i]->ctx);
        free(g->ctxs[i]);
    }
    /* after the contexts (they live in its cache): final CANCELLED events for what is left */
    pkv_engine_free(g->eng);
    free(g->ctxs);
    free(g->fin);
    free(g->waiting);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    pthread_cond_destroy(&g->cv_done);
    free(g);
}

pkv_model *srv_gen_model(srv_gen *g) { return g->m; }
pkv_kv_cache *srv_gen_cache(srv_gen *g) { return g->c; }
pkv_engine *srv_gen_engine(srv_gen *g) { return g->eng; }

bool srv_gen_submit(srv_gen *g, srv_req *r) {
    pthread_mutex_lock(&g->mu);
    if (g->stop || g->n_waiting + g->eng_waiting >= g->p.queue) {
        pthread_mutex_unlock(&g->mu);
        return false;
    }
    if (g->n_waiting == g->cap_waiting) {
        int nc = g->cap_waiting ? g->cap_waiting * 2 : 16;
        srv_req **w = realloc(g->waiting, (size_t)nc * sizeof *w);
        if (!w) {
            pthread_mutex_unlock(&g->mu);
            return false;
        }
        g->waiting = w;
        g->cap_waiting = nc;
    }
    pthread_mutex_lock(&r->mu);
    r->refs++;
    r->t_submit = srv_now();
    pthread_mutex_unlock(&r->mu);
    g->waiting[g->n_waiting++] = r;
    g->st.waiting = g->n_waiting;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    return true;
}

void srv_gen_cancel(srv_gen *g, srv_req *r) {
    pthread_mutex_lock(&r->mu);
    r->cancelled = true;
    uint64_t eid = r->engine_id;
    pthread_mutex_unlock(&r->mu);
    if (eid) pkv_engine_cancel(g->eng, eid); /* thread-safe; unknown once finished */
    pthread_mutex_lock(&g->mu);
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

void srv_gen_stats(srv_gen *g, srv_stats *out) {
    pthread_mutex_lock(&g->mu);
    *out = g->st;
    pkv_engine *e = g->eng;
    pthread_mutex_unlock(&g->mu);
    { /* the engine's own figures (its snapshot is thread-safe) */
        pkv_engine_stats es;
        pkv_engine_stats_get(e, &es);
        out->waiting += es.n_waiting;
        out->running += es.n_requests - es.n_waiting;
        out->prompt_tokens += es.prompt_tokens;
        out->prefix_hit_tokens += es.prefix_hit_tokens;
        out->gen_tokens += es.generated_tokens;
        /* idle contexts the engine swapped out to make room count as before, when the server did it */
        out->preemptions += es.preemptions_swap + es.preemptions_recompute + es.context_swap_outs;
        out->seqs_swapped = es.n_swapped;
        out->seqs_recompute = es.n_recompute;
        out->draft_proposed = es.draft_proposed;
        out->draft_accepted = es.draft_accepted;
        out->steps = es.steps;
        out->spills = es.preemptions_spill;
        out->spill_failed = es.spill_failed;
        out->spill_pages_written = es.spill_pages_written;
        out->spill_bytes_written = es.spill_bytes_written;
        out->spill_pages_read = es.spill_pages_read;
    }
}

bool srv_gen_busy(srv_gen *g) { return g->eng_pending > 0; }

bool srv_gen_stopping(srv_gen *g) {
    pthread_mutex_lock(&g->mu);
    bool stop = g->stop;
    pthread_mutex_unlock(&g->mu);
    return stop;
}

void srv_gen_end_request(srv_gen *g, uint64_t id, const bool *done) {
    pkv_engine_cancel(g->eng, id); /* NOT_FOUND once finished */
    for (int i = 0; i < 1000 && !*done; i++)
        if (pkv_engine_step(g->eng, NULL)) break;
}

bool srv_ctx_quota_ok(srv_gen *g, int32_t pending, int64_t more, char *msg, size_t size) {
    if (g->p.ctx_pages <= 0) return true;
    int32_t *seqs = malloc((size_t)(g->n_ctxs + 1) * sizeof *seqs);
    if (!seqs) {
        snprintf(msg, size, "out of memory");
        return false;
    }
    int n = 0;
    for (int i = 0; i < g->n_ctxs; i++)
        if (!g->ctxs[i]->internal) seqs[n++] = pkv_context_seq(g->ctxs[i]->ctx);
    if (pending >= 0) seqs[n++] = pending;
    int64_t dev = 0, host = 0;
    pkv_status st = pkv_kv_pages_held(g->c, n, seqs, &dev, &host);
    free(seqs);
    if (st) {
        snprintf(msg, size, "%s", pkv_errmsg());
        return false;
    }
    int64_t res = g->quota_reserved;
    if (dev + host + res + more <= g->p.ctx_pages) return true;
    snprintf(msg, size,
             "the contexts hold %lld KV pages (%lld on the device, %lld swapped to host), operations in progress "
             "reserved %lld more and this needs %lld more; their quota is %lld pages (--context-pages): delete "
             "contexts or wait for idle ones to expire",
             (long long)(dev + host), (long long)dev, (long long)host, (long long)res, (long long)more,
             (long long)g->p.ctx_pages);
    return false;
}

void srv_ctx_quota_reserve(srv_gen *g, int64_t pages) {
    g->quota_reserved += pages;
    if (g->quota_reserved < 0) g->quota_reserved = 0;
}

/* Whether swapping idle e out frees device pages within the quota. A swapped
 * context's host copy is its own, so pages it shares with another context (a
 * fork) stay on the device and are held twice: a context that shares all its
 * pages frees nothing, and one whose shared pages would pass the quota is kept. */
static bool swap_frees(srv_gen *g, srv_ctx *e) {
    int64_t pages = 0, shared = 0;
    if (e->busy || srv_ctx_swapped(g, e) || pkv_context_n_tokens(e->ctx) == 0) return false;
    if (pkv_kv_seq_page_stats(g->c, pkv_context_seq(e->ctx), &pages, &shared) || pages <= shared) return false;
    char msg[400];
    return shared == 0 || srv_ctx_quota_ok(g, -1, shared, msg, sizeof msg);
}

void srv_gen_call(srv_gen *g, srv_call_fn fn, void *arg) {
    call k = {fn, arg, false, NULL};
    pthread_mutex_lock(&g->mu);
    if (g->stop) { /* the worker is gone: nothing else uses the model now */
        pthread_mutex_unlock(&g->mu);
        return;
    }
    if (g->calls_tail) g->calls_tail->next = &k;
    else g->calls = &k;
    g->calls_tail = &k;
    pthread_cond_broadcast(&g->cv);
    while (!k.done) pthread_cond_wait(&g->cv_done, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

/* ------------------------------------------------------------- contexts */

srv_ctx *srv_ctx_find(srv_gen *g, int64_t id) {
    for (int i = 0; i < g->n_ctxs; i++)
        if (g->ctxs[i]->id == id) return g->ctxs[i];
    return NULL;
}

int srv_ctx_count(srv_gen *g) { return g->n_ctxs; }
srv_ctx *srv_ctx_at(srv_gen *g, int i) { return i >= 0 && i < g->n_ctxs ? g->ctxs[i] : NULL; }

int srv_ctx_count_api(srv_gen *g) { return g->n_ctxs - g->n_internal; }

static srv_ctx *ctx_add(srv_gen *g, pkv_context *ctx, bool internal) {
    if (internal ? g->n_internal >= g->p.max_internal : g->n_ctxs - g->n_internal >= g->p.max_contexts) return NULL;
    srv_ctx *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->id = g->next_ctx_id++;
    e->ctx = ctx;
    e->internal = internal;
    g->n_internal += internal;
    e->last_used = srv_now();
    g->ctxs[g->n_ctxs++] = e;
    srv_ctx_hold(g, e);
    return e;
}

srv_ctx *srv_ctx_add(srv_gen *g, pkv_context *ctx) { return ctx_add(g, ctx, false); }
srv_ctx *srv_ctx_add_internal(srv_gen *g, pkv_context *ctx) { return ctx_add(g, ctx, true); }

void srv_ctx_remove(srv_gen *g, srv_ctx *e) {
    for (int i = 0; i < g->n_ctxs; i++)
        if (g->ctxs[i] == e) {
            g->ctxs[i] = g->ctxs[--g->n_ctxs];
            g->n_internal -= e->internal;
            break;
        }
    pkv_engine_context_drop(g->eng, e->ctx); /* NOT_FOUND when its hold failed */
    pkv_context_free(e->ctx);
    free(e);
}

/* The engine owns an idle context's residency (pkv_engine_context_hold): with a
 * page quota it swaps one out only while it shares no page, so that its host copy
 * never holds a page twice past --context-pages. */
void srv_ctx_hold(srv_gen *g, srv_ctx *e) {
    if (pkv_engine_context_hold(g->eng, e->ctx, g->p.ctx_pages > 0 ? PKV_HOLD_UNSHARED : 0))
        fprintf(stderr, "pagekv serve: context %lld stays on the device: %s\n", (long long)e->id, pkv_errmsg());
}

pkv_status srv_ctx_release(srv_gen *g, srv_ctx *e) {
    pkv_status s = pkv_engine_context_release(g->eng, e->ctx);
    return s == PKV_ERR_NOT_FOUND ? PKV_OK : s; /* not held (its hold failed): the server's already */
}

bool srv_ctx_swapped(srv_gen *g, const srv_ctx *e) { return pkv_kv_seq_swapped(g->c, pkv_context_seq(e->ctx)); }

void srv_ctx_pages(srv_gen *g, srv_ctx *e, int64_t *pages, int64_t *shared) {
    /* The cache answers from the sequence's own chain: a list of N contexts costs
     * O(N), not a block table of every context per entry. A swapped context's host
     * copy is its own (shared 0). */
    if (pkv_kv_seq_page_stats(g->c, pkv_context_seq(e->ctx), pages, shared)) *pages = *shared = 0;
}

/* Swap out contexts idle past ctx_swap_s, drop those idle past ctx_ttl_s. */
static void sweep(srv_gen *g) {
    double now = srv_now();
    if (now - g->last_sweep < 0.5) return;
    g->last_sweep = now;
    for (int i = 0; i < g->n_ctxs;) {
        srv_ctx *e = g->ctxs[i];
        double idle = now - e->last_used;
        if (!e->busy && !e->internal && g->p.ctx_ttl_s > 0 && idle > g->p.ctx_ttl_s) {
            srv_ctx_remove(g, e);
            continue;
        }
        if (g->p.ctx_swap_s > 0 && idle > g->p.ctx_swap_s && swap_frees(g, e) &&
            pkv_engine_context_drop(g->eng, e->ctx) == PKV_OK) { /* swapped out, then the engine's again */
            pkv_context_swap_out(e->ctx);
            srv_ctx_hold(g, e);
        }
        i++;
    }
}

/* --------------------------------------------------------------- admit */

static void req_finish_now(srv_gen *g, srv_req *r) {
    pthread_mutex_lock(&r->mu);
    r->n_done++;
    bool all = r->n_done >= r->n;
    if (all) {
        r->done = true;
        for (int i = 0; i < r->n; i++) r->ch[i].stable = r->ch[i].len;
    }
    bool failed = r->http_status != 0;
    if (all) { /* one log line per request, as llama-server writes: what it cost and how it ended */
        double now = srv_now(), first = 0;
        long gen = 0;
        char fin[64] = "";
        for (int i = 0; i < r->n; i++) {
            gen += r->ch[i].n_toks;
            if (r->ch[i].n_toks && (first == 0 || r->ch[i].t_first < first)) first = r->ch[i].t_first;
            if (i < 3) {
                size_t l = strlen(fin);
                snprintf(fin + l, sizeof fin - l, "%s%s", i ? "," : "", r->ch[i].finish ? r->ch[i].finish : "-");
            }
        }
        fprintf(stderr, "pagekv serve: request %s: prompt %d tokens (%d cached), generated %ld in %d choice%s, "
                        "first token %.1f ms, total %.1f ms, %s%s\n",
                r->log_id[0] ? r->log_id : r->ctx_id ? "(context)" : "-", r->n_prompt, r->cached_tokens, gen, r->n,
                r->n == 1 ? "" : "s", first > 0 ? (first - r->t_submit) * 1e3 : 0.0, (now - r->t_submit) * 1e3,
                failed ? "failed: " : "finish ", failed ? r->err : fin);
    }
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    if (all) {
        pthread_mutex_lock(&g->mu);
        if (failed) g->st.requests_failed++;
        else g->st.requests_done++;
        pthread_mutex_unlock(&g->mu);
        srv_req_release(r);
    }
}

/* One choice of r is over. On the worker thread this is deferred to the end of
 * the loop iteration, after the statistics snapshot is refreshed: a client that
 * reads /metrics right after its answer sees its pages returned. */
static void req_finish_one(srv_gen *g, srv_req *r) {
    if (g->defer) {
        if (g->n_fin == g->cap_fin) {
            int nc = g->cap_fin ? g->cap_fin * 2 : 64;
            srv_req **a = realloc(g->fin, (size_t)nc * sizeof *a);
            if (!a) { /* cannot defer: finish now (only the snapshot is late) */
                req_finish_now(g, r);
                return;
            }
            g->fin = a;
            g->cap_fin = nc;
        }
        g->fin[g->n_fin++] = r;
        return;
    }
    req_finish_now(g, r);
}

static void flush_finished(srv_gen *g) {
    for (int i = 0; i < g->n_fin; i++) req_finish_now(g, g->fin[i]);
    g->n_fin = 0;
}

/* Fail a request that has no sequences yet. */
static void admit_fail(srv_gen *g, srv_req *r, int status, const char *fmt, const char *detail) {
    req_fail(r, status, fmt, detail);
    pthread_mutex_lock(&r->mu);
    r->n_done = r->n - 1;
    pthread_mutex_unlock(&r->mu);
    req_finish_one(g, r);
}

/* ----------------------------------------------------------------- step */

static bool grow_text(srv_choice *c, size_t add) {
    if (c->len + add + 1 <= c->cap) return true;
    size_t nc = (c->len + add + 1) * 2 + 64;
    char *t = realloc(c->text, nc);
    if (!t) return false;
    c->text = t;
    c->cap = nc;
    return true;
}

/* Bytes at the end of text that are the start of some stop string (held back). */
static size_t stop_holdback(const srv_req *r, const char *text, size_t len) {
    size_t best = 0;
    for (int k = 0; k < r->n_stop; k++) {
        size_t sl = strlen(r->stop[k]);
        for (size_t m = sl - 1; m > best; m--)
            if (m <= len && !memcmp(text + len - m, r->stop[k], m)) {
                best = m;
                break;
            }
    }
    return best;
}

static void hist_add(uint64_t *h, const double *b, int nb, double v) {
    int i = 0;
    while (i < nb && v > b[i]) i++;
    h[i]++;
}

/* Append token tk to choice idx of r: its text, stop strings, max_tokens. eog:
 * an end-of-generation token (no text). Returns the finish reason or NULL. */
static const char *choice_push(srv_gen *g, srv_req *r, int idx, const srv_tok *tk0, bool eog) {
    srv_choice *c = &r->ch[idx];
    srv_tok tk = *tk0;
    char piece[512];
    size_t np = 0;
    if (eog || pkv_model_token_piece(g->m, tk.id, r->special_text, piece, sizeof piece, &np)) np = 0;
    const char *fin = NULL;
    pthread_mutex_lock(&r->mu);
    if (c->n_toks == c->cap_toks) {
        int nc = c->cap_toks ? c->cap_toks * 2 : 32;
        srv_tok *a = realloc(c->toks, (size_t)nc * sizeof *a);
        if (a) {
            c->toks = a;
            c->cap_toks = nc;
        }
    }
    if (c->n_toks < c->cap_toks && grow_text(c, np)) {
        tk.text_off = c->len;
        c->toks[c->n_toks++] = tk;
        size_t old = c->len;
        memcpy(c->text + c->len, piece, np);
        c->len += np;
        c->text[c->len] = 0;
        if (eog) fin = "stop";
        /* stop strings: the earliest match in the region the new bytes can complete */
        size_t maxs = 0;
        for (int k = 0; k < r->n_stop; k++)
            if (strlen(r->stop[k]) > maxs) maxs = strlen(r->stop[k]);
        size_t from = old >= maxs ? old - maxs + 1 : 0;
        size_t cut = (size_t)-1;
        int hit = 0;
        for (int k = 0; k < r->n_stop && np; k++) {
            size_t sl = strlen(r->stop[k]);
            for (size_t i = from; i + sl <= c->len; i++)
                if (!memcmp(c->text + i, r->stop[k], sl)) {
                    if (i < cut) {
                        cut = i;
                        hit = k + 1;
                    }
                    break;
                }
        }
        if (cut != (size_t)-1) {
            c->len = cut;
            c->text[cut] = 0;
            c->stop_hit = hit;
            fin = "stop";
        }
        if (!fin && c->n_toks >= r->max_tokens) fin = "length";
        size_t st = c->len - stop_holdback(r, c->text, c->len);
        st = pkv_utf8_stable(c->text, st);
        if (st > c->stable) c->stable = st;
    } else {
        if (!r->http_status) {
            r->http_status = 500;
            snprintf(r->err, sizeof r->err, "out of memory recording tokens");
        }
        fin = "length";
    }
    if (fin) {
        c->finish = fin;
        c->stable = c->len;
    }
    /* latency: first token since arrival, then the gap between tokens */
    double now = srv_now(), v = c->n_toks <= 1 ? now - r->t_submit : now - c->t_last;
    c->t_last = now;
    if (c->n_toks <= 1) c->t_first = now;
    bool first = c->n_toks <= 1;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    pthread_mutex_lock(&g->mu);
    if (first) {
        hist_add(g->st.ttft_hist, srv_ttft_buckets, 11, v);
        g->st.ttft_sum += v;
        g->st.ttft_count++;
    } else {
        hist_add(g->st.tpot_hist, srv_tpot_buckets, 10, v);
        g->st.tpot_sum += v;
        g->st.tpot_count++;
    }
    pthread_mutex_unlock(&g->mu);
    return fin;
}

/* ------------------------------------------------------- engine backend */

/* A contexts-API generation is over (its final event, on the worker): the
 * context is free again, holding every token the request ran into it. */
static void ctx_gen_done(srv_gen *g, srv_req *r) {
    srv_ctx *ce = srv_ctx_find(g, r->ctx_id);
    if (!ce) return;
    ce->busy = false;
    ce->engine_req = 0;
    srv_ctx_quota_reserve(g, -ce->gen_reserved);
    ce->gen_reserved = 0;
    ce->last_used = srv_now(); /* preempted by swap and cancelled: it stays swapped, the engine's to bring back */
    pthread_mutex_lock(&r->mu);
    r->ctx_len = pkv_context_n_tokens(ce->ctx);
    pthread_mutex_unlock(&r->mu);
}

/* Events of the serving engine, on the worker thread (it steps the engine). */
static bool on_engine_event(const pkv_engine_event *ev, void *user) {
    srv_req *r = user;
    srv_gen *g = r->backend;
    const char *fin = NULL;
    if (ev->sample < 0 || ev->sample >= r->n) return false;
    if (ev->token >= 0) {
        srv_tok tk;
        memset(&tk, 0, sizeof tk);
        tk.id = ev->token;
        tk.logprob = ev->logprob;
        tk.n_top = ev->n_top < r->top_logprobs ? ev->n_top : r->top_logprobs;
        for (int k = 0; k < tk.n_top; k++) {
            tk.top_id[k] = ev->top[k].token;
            tk.top_lp[k] = ev->top[k].logprob;
        }
        fin = choice_push(g, r, ev->sample, &tk, ev->stop_token);
    }
    float *embd = NULL;
    if (ev->embd && ev->n_embd > 0 && (embd = malloc((size_t)ev->n_embd * sizeof *embd)))
        memcpy(embd, ev->embd, (size_t)ev->n_embd * sizeof *embd);
    pthread_mutex_lock(&r->mu);
    if (ev->embd && ev->n_embd > 0 && !embd && !r->http_status) {
        r->http_status = 500;
        snprintf(r->err, sizeof r->err, "out of memory for an embedding of %d floats", (int)ev->n_embd);
    } else if (embd) {
        free(r->embd);
        r->embd = embd;
        r->n_embd = ev->n_embd;
    }
    if (!r->ctx_cont) r->cached_tokens = ev->n_cached;
    bool cancelled = r->cancelled;
    if (ev->finish != PKV_FINISH_NONE) {
        srv_choice *c = &r->ch[ev->sample];
        if (!c->finish) c->finish = ev->finish == PKV_FINISH_LENGTH ? "length" : "stop";
        c->stable = c->len;
        if (ev->finish == PKV_FINISH_ERROR && !r->http_status) {
            /* out of pages is the pool's state, not the request's fault: try again later */
            r->http_status = ev->status == PKV_ERR_INVALID ? 400 : ev->status == PKV_ERR_OUT_OF_PAGES ? 503 : 500;
            snprintf(r->err, sizeof r->err, "%s", ev->message ? ev->message : "engine error");
        } else if (ev->finish == PKV_FINISH_ERROR && !r->engine_id) { /* ctx_restore's request failed */
            size_t l = strlen(r->err);
            snprintf(r->err + l, sizeof r->err - l, "; cannot restore the context: %s", ev->message ? ev->message : "");
        }
        if (ev->finish == PKV_FINISH_CANCELLED && !r->cancelled && !r->http_status) {
            r->http_status = 503;
            snprintf(r->err, sizeof r->err, "the server is shutting down");
        }
    }
    pthread_mutex_unlock(&r->mu);
    if (ev->finish != PKV_FINISH_NONE) {
        if (r->ctx_id) ctx_gen_done(g, r);
        req_finish_one(g, r);
        return false;
    }
    return !fin && !cancelled;
}

/* A contexts-API generation: the checks the context needs, then it becomes an
 * engine request on the context (pkv_request_params.context). A context without
 * logits (after a truncate) gives its last token back as the prompt, computed
 * in the engine's batch. false: r was failed or finished here. */
static bool ctx_request(srv_gen *g, srv_req *r, srv_ctx **out, int32_t *last, bool *relast, int64_t *quota) {
    srv_ctx *ce = srv_ctx_find(g, r->ctx_id);
    pkv_status s;
    *relast = false;
    if (ce && ce->internal != r->ctx_cont) ce = NULL; /* the contexts API never sees a response's */
    if (!ce) {
        admit_fail(g, r, 404, "no context %s", "with this id (deleted, or dropped after its TTL)");
        return false;
    }
    if (ce->busy) {
        admit_fail(g, r, 409, "the context is generating already%s", "");
        return false;
    }
    pkv_context *ctx = ce->ctx; /* swapped out or not: the engine brings it back at admission */
    int64_t len = pkv_context_n_tokens(ctx);
    if (r->ctx_cont) { /* the prompt continues the context: it computes the logits */
        int64_t room = pkv_context_n_ctx(ctx) - len - r->n_prompt;
        if (g->p.n_ctx - len - r->n_prompt < room) room = g->p.n_ctx - len - r->n_prompt;
        if (room <= 0 || r->n_prompt <= 0) {
            admit_fail(g, r, 400, "the conversation fills the context%s", " (start the server with a larger -c)");
            return false;
        }
        if (r->max_tokens > room) r->max_tokens = (int)room;
        pthread_mutex_lock(&r->mu);
        r->cached_tokens = (int)len;
        pthread_mutex_unlock(&r->mu);
        *quota = 0;
        *out = ce;
        return true;
    }
    if (len == 0) {
        admit_fail(g, r, 400, "the context is empty: append tokens first%s", "");
        return false;
    }
    int64_t room = pkv_context_n_ctx(ctx) - len;
    if (g->p.n_ctx - len < room) room = g->p.n_ctx - len;
    if (room <= 0) { /* full: a token it sampled could not be kept, so none is sampled */
        pthread_mutex_lock(&r->mu);
        r->ch[0].finish = "length";
        r->ctx_len = len;
        r->n_done = r->n - 1;
        pthread_mutex_unlock(&r->mu);
        req_finish_one(g, r);
        return false;
    }
    if (r->max_tokens > room) r->max_tokens = (int)room;
    char qmsg[400];
    int ps = pkv_kv_layout_page_size(pkv_kv_cache_layout(g->c));
    *quota = (r->max_tokens + ps - 1) / ps + 1;
    if (!srv_ctx_quota_ok(g, -1, *quota, qmsg, sizeof qmsg)) {
        admit_fail(g, r, 503, "%s", qmsg);
        return false;
    }
    if (!pkv_context_logits(ctx)) { /* after a truncate: its last token again, in the engine's batch */
        if ((s = srv_ctx_release(g, ce))) { /* the truncate is the server's: resident first */
            admit_fail(g, r, 503, "cannot swap the context in: %s", pkv_errmsg());
            return false;
        }
        s = pkv_context_tokens(ctx, len - 1, 1, last);
        if (!s) s = pkv_context_truncate(ctx, len - 1);
        srv_ctx_hold(g, ce);
        if (s) {
            admit_fail(g, r, 500, "cannot restore the context's logits: %s", pkv_errmsg());
            return false;
        }
        *relast = true;
    }
    *out = ce;
    return true;
}

/* A generation on ce failed at submit after its last token was taken off to be
 * computed again (ctx_request): the context gets it back, logits included, as a
 * prefill-only engine request of that token, and r (failed with status and msg)
 * is answered at that request's final event (on_engine_event, ctx_gen_done), so
 * the client sees the context as it was. It is no request of r's client: a
 * client that leaves does not cancel it. false: not submitted (pkv_errmsg). */
static bool ctx_restore(srv_gen *g, srv_req *r, srv_ctx *ce, int32_t last, int status, const char *msg) {
    pkv_request_params rp = pkv_request_default_params();
    rp.prompt = &last;
    rp.n_prompt = 1;
    rp.context = ce->ctx;
    rp.prefill_only = true;
    rp.on_event = on_engine_event;
    rp.user = r;
    r->backend = g;
    uint64_t id = 0;
    if (pkv_engine_submit(g->eng, &rp, &id)) return false;
    req_fail(r, status, "%s", msg);
    ce->busy = true;
    ce->engine_req = id;
    ce->gen_reserved = 0;
    return true;
}

static void admit_engine(srv_gen *g, srv_req *r) {
    if (r->cancelled) {
        admit_fail(g, r, 499, "cancelled%s", "");
        return;
    }
    srv_ctx *ce = NULL;
    int32_t last = 0;
    bool relast = false;
    int64_t quota = 0;
    if (r->ctx_id && !ctx_request(g, r, &ce, &last, &relast, &quota)) return;
    if (!ce && !r->embed) {
        int64_t room = g->p.n_ctx - r->n_prompt - r->media_rows_audio - r->media_rows_image;
        if (r->max_tokens > room) r->max_tokens = (int)room;
    }
    pkv_request_params rp = pkv_request_default_params();
    rp.prompt = ce && !r->ctx_cont ? (relast ? &last : NULL) : r->prompt;
    rp.n_prompt = ce && !r->ctx_cont ? (relast ? 1 : 0) : r->n_prompt;
    rp.context = ce ? ce->ctx : NULL;
    rp.sampling = r->sp;
    rp.max_tokens = r->max_tokens;
    rp.stop_tokens = r->stop_ids;
    rp.n_stop = r->n_stop_ids;
    rp.n = r->n;
    rp.top_logprobs = r->top_logprobs;
    rp.ignore_eos = r->ignore_eos;
    rp.grammar = r->grammar;
    rp.media = ce ? NULL : r->media;
    rp.n_media = ce ? 0 : r->n_media;
    rp.lora = r->has_lora ? r->lora : NULL;
    rp.n_lora = r->n_lora;
    rp.on_event = on_engine_event;
    rp.user = r;
    if (r->embed) { /* nothing is generated or sampled */
        rp.embed = true;
        rp.pooling = r->pooling;
        rp.max_tokens = 0;
        rp.n_stop = 0;
        rp.stop_tokens = NULL;
    }
    r->backend = g;
    uint64_t id = 0;
    pkv_status st = pkv_engine_submit(g->eng, &rp, &id);
    if (st) {
        char msg[512];
        int status = st == PKV_ERR_INVALID ? 400 : 503;
        snprintf(msg, sizeof msg, "%s", pkv_errmsg());
        if (relast && ctx_restore(g, r, ce, last, status, msg)) return; /* answered when the context is back */
        if (relast) snprintf(msg, sizeof msg, "cannot restore the context: %s", pkv_errmsg());
        admit_fail(g, r, status, "%s", msg);
        return;
    }
    if (ce) { /* the engine's until its final event (ctx_gen_done): no swap, fork, append or delete */
        ce->busy = true;
        ce->engine_req = id;
        ce->gen_reserved = quota;
        srv_ctx_quota_reserve(g, quota);
    }
    pthread_mutex_lock(&r->mu);
    r->engine_id = id;
    pthread_mutex_unlock(&r->mu);
}

/* The engine's waiting requests, for srv_gen_submit's queue bound. */
static void refresh_waiting(srv_gen *g) {
    pkv_engine_stats es;
    pkv_engine_stats_get(g->eng, &es);
    pthread_mutex_lock(&g->mu);
    g->eng_waiting = es.n_waiting;
    pthread_mutex_unlock(&g->mu);
}

/* The statistics /metrics reads, as of now. Worker thread. */
static void snapshot(srv_gen *g) {
    pthread_mutex_lock(&g->mu);
    pkv_kv_stats_get(g->c, &g->st.kv);
    g->st.running = 0; /* the engine's figures are added by srv_gen_stats */
    g->st.waiting = g->n_waiting;
    g->st.contexts = g->n_ctxs - g->n_internal;
    g->st.contexts_responses = g->n_internal;
    int sw = 0;
    for (int i = 0; i < g->n_ctxs; i++) sw += srv_ctx_swapped(g, g->ctxs[i]);
    g->st.contexts_swapped = sw;
    pthread_mutex_unlock(&g->mu);
}

static void *worker(void *arg) {
    srv_gen *g = arg;
    for (;;) {
        pthread_mutex_lock(&g->mu);
        if (!g->stop && !g->calls && g->n_waiting == 0 && g->eng_pending == 0) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += 1;
            pthread_cond_timedwait(&g->cv, &g->mu, &ts);
        }
        if (g->stop) {
            pthread_mutex_unlock(&g->mu);
            break;
        }
        call *calls = g->calls;
        g->calls = g->calls_tail = NULL;
        srv_req *adm[256];
        int n_adm = 0;
        while (g->n_waiting > 0 && n_adm < 256) { /* all to the engine: it schedules */
            adm[n_adm++] = g->waiting[0];
            memmove(g->waiting, g->waiting + 1, (size_t)(g->n_waiting - 1) * sizeof *g->waiting);
            g->n_waiting--;
        }
        pthread_mutex_unlock(&g->mu);
        g->defer = true;
        call *fin = NULL, *again = NULL, *again_last = NULL, **fin_tail = &fin;
        for (call *k = calls; k;) {
            call *next = k->next;
            k->next = NULL;
            if (k->fn(g, k->arg)) { /* finished */
                *fin_tail = k;
                fin_tail = &k->next;
            } else { /* one piece done: again after this step */
                if (again_last) again_last->next = k;
                else again = k;
                again_last = k;
            }
            k = next;
        }
        if (calls) { /* answers leave after the snapshot shows their effect */
            snapshot(g);
            pthread_mutex_lock(&g->mu);
            for (call *k = fin; k;) {
                call *next = k->next; /* k lives on the caller's stack until done is seen */
                k->done = true;
                k = next;
            }
            if (again) { /* ahead of calls that came meanwhile */
                again_last->next = g->calls;
                if (!g->calls) g->calls_tail = again_last;
                g->calls = again;
            }
            pthread_cond_broadcast(&g->cv_done);
            pthread_mutex_unlock(&g->mu);
        }
        for (int i = 0; i < n_adm; i++) admit_engine(g, adm[i]);
        refresh_waiting(g);
        int pending = 0;
        if (pkv_engine_step(g->eng, &pending) == PKV_OK) g->eng_pending = pending;
        else g->eng_pending = 0; /* misuse or an internal failure: its requests got final events */
        sweep(g);
        snapshot(g);
        refresh_waiting(g); /* the queue bound sees this step's admissions at once, not after the next wake-up */
        g->defer = false;
        flush_finished(g);
    }
    /* Shutting down: the generations on contexts end now, while their contexts
     * live (srv_gen_free frees the contexts before the engine, whose cache they
     * are in); the engine's other requests get their final events when it is freed. */
    for (int i = 0; i < g->n_ctxs; i++)
        if (g->ctxs[i]->engine_req) pkv_engine_cancel(g->eng, g->ctxs[i]->engine_req);
    for (int k = 0; k < 1000; k++) {
        bool busy = false;
        for (int i = 0; i < g->n_ctxs; i++) busy |= g->ctxs[i]->engine_req != 0;
        if (!busy || pkv_engine_step(g->eng, NULL)) break;
    }
    pthread_mutex_lock(&g->mu);
    int nw = g->n_waiting;
    g->n_waiting = 0;
    call *calls = g->calls;
    g->calls = g->calls_tail = NULL;
    pthread_mutex_unlock(&g->mu);
    for (int i = 0; i < nw; i++) admit_fail(g, g->waiting[i], 503, "the server is shutting down%s", "");
    for (call *k = calls; k;) { /* callers waiting: run them, nothing else uses the model now */
        call *next = k->next;
        while (!k->fn(g, k->arg)) continue; /* pieces of bounded work: to the end */
        pthread_mutex_lock(&g->mu);
        k->done = true;
        pthread_cond_broadcast(&g->cv_done);
        pthread_mutex_unlock(&g->mu);
        k = next;
    }
    return NULL;
}
