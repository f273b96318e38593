/* Idle contexts the engine owns (pkv_engine_context_hold; docs/engine.md "Idle
 * contexts"): the held set, the one room-making rule that swaps them out (least
 * recently used first, before any running request is preempted: engine-sched.c
 * calls pkv_engine_ctx_evict), and release, which brings one back. */
#include "engine/engine-impl.h"
#include "engine/engine.h"

static int held_find(const pkv_engine *e, const pkv_context *ctx) {
    for (int i = 0; i < e->n_held; i++)
        if (e->held[i].ctx == ctx) return i;
    return -1;
}

/* Hold, release and drop change the held set and the cache: only between steps
 * on the stepping thread. */
static pkv_status held_call_ok(pkv_engine *e, const pkv_context *ctx, const char *what) {
    if (!e || !ctx) return pkv_err(PKV_ERR_INVALID, "%s: engine or context is NULL", what);
    pthread_mutex_lock(&e->mu);
    bool busy = e->running || e->in_step;
    pthread_mutex_unlock(&e->mu);
    if (busy)
        return pkv_err(PKV_ERR_INVALID, "%s: the engine thread is running or a step is in progress (call it from the "
                       "stepping thread between steps, or stop the thread first)", what);
    return PKV_OK;
}

/* Does an unfinished request of the step's list run on ctx? (Requests submitted
 * since the step took its queue are not seen: one on a context swapped out now
 * brings it back at its admission.) */
static bool ctx_in_use(const pkv_engine *e, const pkv_context *ctx) {
    for (int i = 0; i < e->n_reqs; i++)
        if (e->reqs[i]->p.context == ctx && e->reqs[i]->n_final < e->reqs[i]->n) return true;
    return false;
}

/* Would swapping h out free device pages (and, with PKV_HOLD_UNSHARED, copy no
 * shared page to the host)? */
static bool held_frees(const pkv_engine *e, const eng_held *h) {
    int32_t seq = pkv_context_seq(h->ctx);
    int64_t pages = 0, shared = 0;
    if (pkv_kv_seq_swapped(e->c, seq) || pkv_kv_seq_page_stats(e->c, seq, &pages, &shared)) return false;
    if (pages <= shared) return false;
    return !(h->flags & PKV_HOLD_UNSHARED) || shared == 0;
}

bool pkv_engine_ctx_evict(pkv_engine *e, const pkv_context *keep) {
    eng_held *v = NULL;
    for (int i = 0; i < e->n_held; i++) {
        eng_held *h = &e->held[i];
        if (h->ctx == keep || (v && v->used <= h->used)) continue;
        if (held_frees(e, h) && !ctx_in_use(e, h->ctx)) v = h;
    }
    if (!v) return false;
    pkv_status st = pkv_kv_swap_out(e->c, pkv_context_seq(v->ctx));
    if (st) { /* the host pool is full (or the copy failed): it stays on the device */
        PKV_DEBUG("engine: idle context (sequence %d) stays on the device: %s", (int)pkv_context_seq(v->ctx),
                  pkv_errmsg());
        return false;
    }
    e->ctx_out++;
    return true;
}

void pkv_engine_ctx_touch(pkv_engine *e, const pkv_context *ctx) {
    int i = held_find(e, ctx);
    if (i >= 0) e->held[i].used = ++e->held_clock;
}

bool pkv_engine_ctx_held(const pkv_engine *e, const pkv_context *ctx) { return held_find(e, ctx) >= 0; }

void pkv_engine_ctx_counts(const pkv_engine *e, int *held, int *swapped) {
    *held = e->n_held;
    *swapped = 0;
    for (int i = 0; i < e->n_held; i++) *swapped += pkv_kv_seq_swapped(e->c, pkv_context_seq(e->held[i].ctx));
}

pkv_status pkv_engine_context_hold(pkv_engine *e, pkv_context *ctx, unsigned flags) {
    pkv_status st = held_call_ok(e, ctx, "context hold");
    if (st) return st;
    if (pkv_context_cache(ctx) != e->c || pkv_context_model(ctx) != e->m)
        return pkv_err(PKV_ERR_INVALID, "context hold: the context is not on the engine's cache");
    if (flags & ~(unsigned)PKV_HOLD_UNSHARED)
        return pkv_err(PKV_ERR_INVALID, "context hold: unknown flags 0x%x (PKV_HOLD_UNSHARED is 0x%x)", flags,
                       (unsigned)PKV_HOLD_UNSHARED);
    if (held_find(e, ctx) >= 0) return pkv_err(PKV_ERR_INVALID, "context hold: the context is held already");
    if (e->n_held == e->held_cap) {
        void *p = e->held;
        size_t cap = (size_t)e->held_cap;
        if ((st = pkv_grow(&p, &cap, (size_t)e->n_held + 1, sizeof *e->held))) return st;
        e->held = p;
        e->held_cap = (int)cap;
    }
    e->held[e->n_held++] = (eng_held){ctx, ++e->held_clock, flags};
    pkv_engine_snapshot(e);
    return PKV_OK;
}

static void held_remove(pkv_engine *e, int i) {
    e->held[i] = e->held[--e->n_held];
    pkv_engine_snapshot(e);
}

pkv_status pkv_engine_context_release(pkv_engine *e, pkv_context *ctx) {
    pkv_status st = held_call_ok(e, ctx, "context release");
    if (st) return st;
    int i = held_find(e, ctx);
    if (i < 0) return pkv_err(PKV_ERR_NOT_FOUND, "context release: the context is not held by the engine");
    int32_t seq = pkv_context_seq(ctx);
    if (pkv_kv_seq_swapped(e->c, seq)) {
        while ((st = pkv_kv_swap_in(e->c, seq)) == PKV_ERR_OUT_OF_PAGES && pkv_engine_ctx_evict(e, ctx)) continue;
        if (st) {
            pkv_engine_snapshot(e); /* others may have gone to make room */
            return pkv_err_prefix(st, "context release: cannot swap the context back in");
        }
        e->ctx_in++;
    }
    held_remove(e, held_find(e, ctx));
    return PKV_OK;
}

pkv_status pkv_engine_context_drop(pkv_engine *e, pkv_context *ctx) {
    pkv_status st = held_call_ok(e, ctx, "context drop");
    if (st) return st;
    int i = held_find(e, ctx);
    if (i < 0) return pkv_err(PKV_ERR_NOT_FOUND, "context drop: the context is not held by the engine");
    held_remove(e, i);
    return PKV_OK;
}
