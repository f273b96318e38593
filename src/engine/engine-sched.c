/* The engine step (docs/engine.md): take new requests and cancellations, resume
 * preempted sequences and admit waiting requests while pages and the token budget
 * allow, form one batch of decode tokens and prefill chunks, run it as one
 * forward pass (preempting the least important sequence whenever the pool runs
 * out), then sample and deliver events. Runs on one thread; the mutex is taken
 * only to exchange queues and the statistics snapshot. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "engine/engine-impl.h"
#include "engine/engine.h" /* pkv_context_set_logits: a context request leaves its last logits */
#include "kv/kv-impl.h" /* pkv_kv_seq_publish: offer a step's full pages at once */
#include "model/model-impl.h"
#include "engine/sampler.h" /* pkv_sampler_grammar_cost */

static int64_t pages_for(const pkv_engine *e, int64_t n_tokens) { return (n_tokens + e->ps - 1) / e->ps; }

static int64_t pool_avail(const pkv_engine *e) {
    pkv_kv_stats ks;
    pkv_kv_stats_get(e->c, &ks);
    return ks.pages_free + ks.pages_cached;
}

/* ------------------------------------------------------------ requests */

static void seq_release(pkv_engine *e, eng_seq *s) {
    if (s->kv >= 0 && !s->r->p.context) pkv_kv_seq_free(e->c, s->kv); /* a context's sequence stays its own */
    s->kv = -1;
    s->fin_wait = PKV_FINISH_NONE;
    if (s->dkv >= 0) pkv_kv_seq_free(e->dc, s->dkv);
    s->dkv = -1;
    s->n_prop = 0;
    pkv_free(s->q);
    s->q = NULL;
    if (s->smp != s->r->p.sampler) pkv_sampler_free(s->smp); /* the caller's stays the caller's */
    s->smp = NULL;
    pkv_free(s->tok);
    s->tok = NULL;
    s->n_tok = s->cap = s->n_kv = 0;
    s->step_n = 0;
    s->st = SEQ_DONE;
}

void pkv_engine_req_free(pkv_engine *e, eng_req *r) {
    if (!r) return;
    for (int i = 0; r->seqs && i < r->n; i++)
        if (r->seqs[i].r && r->seqs[i].st != SEQ_DONE) seq_release(e, &r->seqs[i]); /* r NULL: submit failed first */
    pkv_free(r->prompt);
    pkv_free(r->media);
    pkv_free(r->embd);
    pkv_free(r->pool);
    pkv_free(r->acc);
    pkv_free(r->stop);
    pkv_free(r->bias);
    pkv_free(r->seqs);
    pkv_grammar_free((pkv_grammar *)r->p.grammar);
    pkv_free(r);
}

/* Is a scheduled before b (more important)? Priority, then submission order, then
 * sample index: a total order over all sequences. */
static bool seq_before(const eng_seq *a, const eng_seq *b) {
    if (a->r->p.priority != b->r->p.priority) return a->r->p.priority > b->r->p.priority;
    if (a->r->order != b->r->order) return a->r->order < b->r->order;
    return a->sample < b->sample;
}

/* log-softmax of row at tok, and the n_top most likely tokens. Computed the same
 * way for every row, so equal rows give bitwise equal figures. */
static float logprob_of(pkv_engine *e, const float *row, int32_t tok, int n_top) {
    int32_t V = e->n_vocab;
    float mx = row[0];
    for (int32_t i = 1; i < V; i++)
        if (row[i] > mx) mx = row[i];
    double z = 0.0;
    for (int32_t i = 0; i < V; i++) z += exp((double)row[i] - (double)mx);
    double lz = (double)mx + log(z);
    int k = 0;
    pkv_token_logprob *t = e->top;
    for (int32_t i = 0; i < V && n_top > 0; i++) {
        if (k == n_top && !(row[i] > t[k - 1].logprob)) continue; /* ties keep the lower id */
        int j = k < n_top ? k++ : k - 1;
        while (j > 0 && row[i] > t[j - 1].logprob) {
            t[j] = t[j - 1];
            j--;
        }
        t[j].token = i;
        t[j].logprob = row[i];
    }
    for (int j = 0; j < k; j++) t[j].logprob = (float)((double)t[j].logprob - lz);
    return (float)((double)row[tok] - lz);
}

/* Deliver one event of sample s; a final event (fin != NONE) releases the sample.
 * Returns the callback's answer (true without a callback). */
static bool emit(pkv_engine *e, eng_seq *s, int32_t tok, const float *row, pkv_finish_reason fin, bool stop_tok,
                 pkv_status st, const char *msg) {
    eng_req *r = s->r;
    pkv_engine_event ev;
    memset(&ev, 0, sizeof ev);
    ev.request = r->id;
    ev.sample = s->sample;
    ev.token = tok;
    ev.finish = fin;
    ev.stop_token = stop_tok;
    ev.n_prompt = r->p.n_prompt;
    ev.n_cached = r->n_cached;
    ev.n_generated = s->n_gen;
    ev.n_shifted = s->n_shifted;
    ev.status = st;
    ev.message = msg ? msg : "";
    if (tok >= 0 && row) {
        ev.logprob = logprob_of(e, row, tok, r->p.top_logprobs);
        ev.n_top = r->p.top_logprobs;
        ev.top = e->top;
    }
    bool go = true;
    /* A context whose request ends early keeps what its KV holds, without logits
     * (they would not be those of its last token; the normal end set them), unless
     * last_pending kept them for it (s->lp_ok), or nothing has run (a first round's
     * step: the context's own). */
    if (r->p.context && r->started && (fin == PKV_FINISH_CANCELLED || fin == PKV_FINISH_ERROR)) {
        int64_t len = s->kv >= 0 ? pkv_kv_seq_len(e->c, s->kv) : -1;
        if (!(s->lp_ok && len == s->n_tok - 1) && !(s->dfirst && len == s->n_tok))
            pkv_context_set_logits(r->p.context, NULL);
    }
    if (r->p.on_event && !s->dist_stop) go = r->p.on_event(&ev, r->p.user);
    if (fin != PKV_FINISH_NONE) {
        seq_release(e, s);
        r->n_final++;
    }
    return go;
}

/* Final events for every sample of r not finished yet. */
static void req_finish(pkv_engine *e, eng_req *r, pkv_finish_reason fin, pkv_status st, const char *msg) {
    if (fin == PKV_FINISH_ERROR) r->failed = true;
    for (int i = 0; i < r->n; i++)
        if (r->seqs[i].st != SEQ_DONE) emit(e, &r->seqs[i], -1, NULL, fin, false, st, msg);
}

static void req_fail(pkv_engine *e, eng_req *r, pkv_status st) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", pkv_errmsg());
    PKV_WARN("engine: request %llu failed: %s", (unsigned long long)r->id, msg);
    req_finish(e, r, PKV_FINISH_ERROR, st, msg);
}

/* A context request's final event was held until its token went into the
 * context's KV (sample_seq): note what it carries. */
static void defer_final(pkv_engine *e, eng_seq *s, int32_t tok, const float *row, pkv_finish_reason fin, bool stop) {
    s->fin_wait = fin;
    s->fin_stop = stop;
    s->fin_tok = tok;
    s->fin_lp = 0;
    s->fin_ntop = 0;
    if (tok >= 0 && row) {
        s->fin_lp = logprob_of(e, row, tok, s->r->p.top_logprobs);
        s->fin_ntop = s->r->p.top_logprobs;
        memcpy(s->fin_top, e->top, (size_t)s->fin_ntop * sizeof *s->fin_top);
    }
}

/* Deliver the held final event of s: the step ran its last token, whose logits
 * row is lg. */
static void final_deferred(pkv_engine *e, eng_seq *s, const float *lg) {
    eng_req *r = s->r;
    pkv_context_set_logits(r->p.context, lg);
    pkv_engine_event ev;
    memset(&ev, 0, sizeof ev);
    ev.request = r->id;
    ev.sample = s->sample;
    ev.token = s->fin_tok;
    ev.logprob = s->fin_lp;
    ev.n_top = s->fin_ntop;
    ev.top = s->fin_top;
    ev.finish = s->fin_wait;
    ev.stop_token = s->fin_stop;
    ev.n_prompt = r->p.n_prompt;
    ev.n_cached = r->n_cached;
    ev.n_generated = s->n_gen;
    ev.n_shifted = s->n_shifted;
    ev.message = "";
    if (r->p.on_event) r->p.on_event(&ev, r->p.user);
    seq_release(e, s);
    r->n_final++;
}

/* -------------------------------------------------------------- queues */

/* Leading over MPI ranks: send the other ranks the requests taken (head..) and
 * the cancels logged since the last step (taken from e under mu), then apply
 * the cancels here, where the other ranks apply theirs: in this step's drain. */
static pkv_status drain_lead(pkv_engine *e, eng_req *head) {
    uint64_t *cancel = e->dist_cancel;
    int n_cancel = e->n_dist_cancel;
    e->dist_cancel = NULL;
    e->n_dist_cancel = e->dist_cancel_cap = 0;
    pthread_mutex_unlock(&e->mu);
    pkv_status s = pkv_engine_dist_send(head, cancel, n_cancel);
    for (int k = 0; k < n_cancel; k++)
        if (ENG_STOP_SAMPLE(cancel[k]) >= 0)
            pkv_engine_end_sample(e, ENG_STOP_ID(cancel[k]), ENG_STOP_SAMPLE(cancel[k]));
        else
            for (int i = 0; i < e->n_reqs; i++)
                if (e->reqs[i]->id == cancel[k]) {
                    e->reqs[i]->cancel = true;
                    atomic_store(&e->reqs[i]->stop_grammar, true);
                }
    pkv_free(cancel);
    return s;
}

void pkv_engine_end_sample(pkv_engine *e, uint64_t id, int sample) {
    for (int i = 0; i < e->n_reqs; i++) {
        eng_req *r = e->reqs[i];
        if (r->id != id || sample < 0 || sample >= r->p.n || r->seqs[sample].st == SEQ_DONE || !r->seqs[sample].r)
            continue;
        r->seqs[sample].dist_stop = false; /* the final event is delivered */
        emit(e, &r->seqs[sample], -1, NULL, PKV_FINISH_STOP, false, PKV_OK, NULL);
    }
}

/* Take submitted requests (in priority order into reqs) and cancellations. */
static pkv_status drain(pkv_engine *e) {
    pthread_mutex_lock(&e->mu);
    int n_in = 0;
    eng_req *head = NULL; /* the requests taken */
    for (eng_req *r = e->in_head; r; r = r->next) n_in++;
    if (n_in) {
        void *p = e->reqs;
        size_t cap = (size_t)e->reqs_cap;
        if (pkv_grow(&p, &cap, (size_t)e->n_reqs + (size_t)n_in, sizeof *e->reqs) == PKV_OK) {
            e->reqs = p;
            e->reqs_cap = (int)cap;
            for (eng_req *r = e->in_head; r; r = r->next) {
                int at = e->n_reqs;
                while (at > 0 && e->reqs[at - 1]->p.priority < r->p.priority) at--;
                memmove(e->reqs + at + 1, e->reqs + at, (size_t)(e->n_reqs - at) * sizeof *e->reqs);
                e->reqs[at] = r;
                e->n_reqs++;
            }
            head = e->in_head;
            e->in_head = e->in_tail = NULL;
        } /* else: they stay queued until memory is found */
    }
    if (e->dist == ENG_DIST_LEAD) return drain_lead(e, head); /* unlocks */
    if (e->cancel_pending) {
        for (int i = 0; i < e->n_reqs; i++) e->reqs[i]->cancel |= e->reqs[i]->cancel_flag;
        e->cancel_pending = false;
    }
    pthread_mutex_unlock(&e->mu);
    return PKV_OK;
}

/* Drop finished requests from reqs and the live list, and free them. */
static void sweep(pkv_engine *e) {
    int k = 0;
    for (int i = 0; i < e->n_reqs; i++) {
        eng_req *r = e->reqs[i];
        if (r->n_final < r->n) {
            e->reqs[k++] = r;
            continue;
        }
        pthread_mutex_lock(&e->mu);
        for (int j = 0; j < e->n_live; j++)
            if (e->live[j] == r) {
                e->live[j] = e->live[--e->n_live];
                break;
            }
        pthread_mutex_unlock(&e->mu);
        e->finished++;
        if (r->p.context) pkv_engine_ctx_touch(e, r->p.context); /* compares the pointer only */
        if (r->failed) e->failed++;
        else if (r->cancel) e->cancelled++;
        pkv_engine_req_free(e, r);
    }
    e->n_reqs = k;
}

void pkv_engine_snapshot(pkv_engine *e) {
    pkv_engine_stats st;
    memset(&st, 0, sizeof st);
    for (int i = 0; i < e->n_reqs; i++) {
        eng_req *r = e->reqs[i];
        if (!r->started) st.n_waiting++;
        for (int j = 0; j < r->n; j++) {
            eng_seq_state ss = r->seqs[j].st;
            st.n_running += ss == SEQ_RUNNING;
            st.n_swapped += ss == SEQ_SWAPPED;
            st.n_recompute += ss == SEQ_DROPPED;
        }
    }
    pkv_kv_stats ks;
    pkv_kv_stats_get(e->c, &ks);
    st.pages_total = ks.n_pages;
    st.pages_used = ks.pages_used;
    st.pages_free = ks.pages_free;
    st.pages_cached = ks.pages_cached;
    if (ks.pages_used > e->pages_peak) e->pages_peak = ks.pages_used;
    st.pages_peak = e->pages_peak;
    st.waiting_for_pages = e->short_of_pages;
    st.host_pages = ks.host_pages;
    st.host_free = ks.host_free;
    st.requests_finished = e->finished;
    st.requests_cancelled = e->cancelled;
    st.requests_failed = e->failed;
    st.prompt_tokens = e->prompt_tokens;
    st.prefix_hit_tokens = e->hit_tokens;
    st.computed_tokens = e->computed;
    st.generated_tokens = e->generated;
    st.preemptions_swap = e->pre_swap;
    st.preemptions_recompute = e->pre_drop;
    st.steps = e->steps;
    st.busy_seconds = e->busy;
    st.batch_invariant = e->invariant;
    st.draft_proposed = e->d_proposed;
    st.draft_accepted = e->d_accepted;
    st.draft_steps = e->d_steps;
    st.draft_disabled = e->d_disabled;
    st.draft_skipped = e->d_skipped;
    st.grammar_masks = e->g_masks;
    st.grammar_mask_seconds = e->g_mask_s;
    st.preemptions_spill = e->sp_n;
    st.spill_failed = e->sp_failed;
    st.spill_pages_written = e->sp_written;
    st.spill_bytes_written = e->sp_bytes;
    st.spill_pages_read = e->sp_read;
    st.spill_pages_resumed = e->sp_resumed;
    st.spill_write_seconds = e->sp_write_s;
    st.spill_read_seconds = e->sp_read_s;
    st.prefill_seconds_per_token = e->pf_tok ? e->pf_s / (double)e->pf_tok : 0.0;
    st.tokens_per_second = e->busy > 0 ? (double)e->generated / e->busy : 0.0;
    pthread_mutex_lock(&e->mu);
    for (eng_req *r = e->in_head; r; r = r->next) st.n_waiting++;
    st.n_requests = e->n_live;
    st.context_swap_outs = e->ctx_out;
    st.context_swap_ins = e->ctx_in;
    pkv_engine_ctx_counts(e, &st.n_contexts_held, &st.n_contexts_swapped);
    st.requests_submitted = e->submitted;
    e->snap = st;
    pthread_mutex_unlock(&e->mu);
}

void pkv_engine_cancel_all(pkv_engine *e) {
    pthread_mutex_lock(&e->mu);
    for (eng_req *r = e->in_head; r; r = r->next) r->cancel_flag = true;
    e->cancel_pending = true;
    pthread_mutex_unlock(&e->mu);
    (void)drain(e); /* freeing: leading has ended (pkv_engine_dist_stop), nothing is sent */
    for (int i = 0; i < e->n_reqs; i++) {
        e->reqs[i]->cancel = true;
        req_finish(e, e->reqs[i], PKV_FINISH_CANCELLED, PKV_OK, NULL);
    }
    sweep(e);
    /* a request the drain could not take (out of memory) */
    pthread_mutex_lock(&e->mu);
    eng_req *r = e->in_head;
    e->in_head = e->in_tail = NULL;
    pthread_mutex_unlock(&e->mu);
    while (r) {
        eng_req *nx = r->next;
        req_finish(e, r, PKV_FINISH_CANCELLED, PKV_OK, NULL);
        pthread_mutex_lock(&e->mu);
        for (int j = 0; j < e->n_live; j++)
            if (e->live[j] == r) e->live[j] = e->live[--e->n_live];
        pthread_mutex_unlock(&e->mu);
        pkv_engine_req_free(e, r);
        r = nx;
    }
    pkv_engine_snapshot(e);
}

/* ---------------------------------------------------------- preemption */

/* The least important resident sequence other than keep; with a limit, only
 * sequences of requests whose priority is below it. NULL when none. */
static eng_seq *pick_victim(pkv_engine *e, const eng_seq *keep, bool limited, int limit) {
    eng_seq *v = NULL;
    for (int i = 0; i < e->n_reqs; i++) {
        eng_req *r = e->reqs[i];
        if (limited && r->p.priority >= limit) continue;
        for (int j = 0; j < r->n; j++) {
            eng_seq *s = &r->seqs[j];
            if (s->st != SEQ_RUNNING || s == keep) continue;
            if (!v || seq_before(v, s)) v = s;
        }
    }
    return v;
}

/* The sequence goes on without speculative decoding. */
static void draft_off(pkv_engine *e, eng_seq *s) {
    if (s->dkv >= 0) pkv_kv_seq_free(e->dc, s->dkv);
    s->dkv = -1;
    s->n_prop = 0;
    s->n_dtrue = s->n_dkv = 0;
    if (!s->nodraft) e->d_disabled++;
    s->nodraft = true;
}

/* Spilling to disk: should v, whose leading n pages a spill would cover (unw of
 * them not on disk yet), be spilled rather than recomputed? PKV_SPILL_AUTO compares
 * the two costs as measured on this engine: writing (the spills so far: device
 * read, file write, fsync, rename; per page written) and reading back (the
 * resumed spills' prefix matches, else the disk tier's own file reads; per page)
 * against recomputing n pages of tokens (forward seconds per token of the steps
 * of at least a page of tokens). Before the first spill nothing is known about
 * the disk: it spills once, to measure. */
static bool spill_cheaper(pkv_engine *e, int64_t n, int64_t unw) {
    if (e->p.spill == PKV_SPILL_ALWAYS) return true;
    if (!e->sp_written || !e->pf_tok) return true;
    double w = e->sp_write_s / (double)e->sp_written, r;
    if (e->sp_read) {
        r = e->sp_read_s / (double)e->sp_read;
    } else {
        pkv_kv_stats ks;
        pkv_kv_stats_get(e->c, &ks);
        r = ks.disk_hit_pages ? ks.disk_read_seconds / (double)ks.disk_hit_pages : w;
    }
    double t = e->pf_s / (double)e->pf_tok;
    return (double)unw * w + (double)n * r < (double)n * (double)e->ps * t;
}

/* Spill v's full pages to the disk tier before v is dropped (the host pool could
 * not take it): true when some are on disk. A failure (a full disk, an I/O error:
 * the tier turns itself off) only means v is recomputed, as without a disk. */
static bool try_spill(pkv_engine *e, eng_seq *v) {
    if (e->p.spill == PKV_SPILL_NEVER || !e->p.prefix_cache || !pkv_kv_disk_on(e->c)) return false;
    int64_t unw = 0, n = pkv_kv_disk_spill_plan(e->c, v->kv, &unw);
    if (n <= 0 || !spill_cheaper(e, n, unw)) return false;
    int64_t got = 0, wr = 0;
    uint64_t bytes = 0;
    double t0 = pkv_time_now();
    pkv_status st = pkv_kv_disk_spill(e->c, v->kv, &got, &wr, &bytes);
    double dt = pkv_time_now() - t0;
    e->sp_bytes += bytes;
    if (wr > 0) {
        e->sp_written += (uint64_t)wr;
        e->sp_write_s += dt;
    }
    if (st) {
        PKV_WARN("engine: %s; the sequence is dropped and recomputed", pkv_errmsg());
        e->sp_failed++;
        return false;
    }
    return got > 0;
}

/* Swap the sequence (and its draft's) to the host pools, or when that is off or
 * either is full, drop their pages (full pages stay in the prefix caches) to
 * recompute them later, spilling them to the disk tier first when that is
 * cheaper (pkv_engine_params.spill). */
static void preempt(pkv_engine *e, eng_seq *v) {
    bool dswap = v->dkv < 0 || (e->p.swap && pkv_kv_swap_out(e->dc, v->dkv) == PKV_OK);
    if (e->p.swap && dswap && pkv_kv_swap_out(e->c, v->kv) == PKV_OK) {
        v->st = SEQ_SWAPPED;
        e->pre_swap++;
    } else if (v->r->p.context) { /* the context stays: only what the request added goes */
        pkv_status st = pkv_kv_truncate(e->c, v->kv, v->r->n_base);
        if (st) {
            req_fail(e, v->r, st);
            return;
        }
        v->kv = -1;
        v->n_kv = v->r->n_base;
        if (v->dkv >= 0) pkv_kv_seq_free(e->dc, v->dkv); /* it starts again with the context */
        v->dkv = -1;
        v->n_dtrue = v->n_dkv = 0;
        v->st = SEQ_DROPPED;
        e->pre_drop++;
    } else {
        v->spilled = try_spill(e, v);
        e->sp_n += v->spilled;
        pkv_kv_seq_free(e->c, v->kv);
        v->kv = -1;
        v->n_kv = 0;
        if (v->dkv >= 0) pkv_kv_seq_free(e->dc, v->dkv); /* resident or swapped */
        v->dkv = -1;
        v->n_dtrue = v->n_dkv = 0;
        v->st = SEQ_DROPPED;
        e->pre_drop++;
    }
    v->step_n = 0;
    v->n_prop = 0;
}

static int n_resident(const pkv_engine *e) {
    int n = 0;
    for (int i = 0; i < e->n_reqs; i++)
        for (int j = 0; j < e->reqs[i]->n; j++) n += e->reqs[i]->seqs[j].st == SEQ_RUNNING;
    return n;
}

/* ----------------------------------------------------------- admission */

static pkv_status seq_alloc_tokens(eng_seq *s, const int32_t *tok, int32_t n, int32_t cap) {
    s->tok = pkv_malloc((size_t)cap * sizeof *s->tok);
    if (!s->tok) return pkv_err(PKV_ERR_NOMEM, "engine: out of memory for %d tokens", (int)cap);
    memcpy(s->tok, tok, (size_t)n * sizeof *tok);
    s->n_tok = n;
    s->cap = cap;
    return PKV_OK;
}

static pkv_status seq_sampler(pkv_engine *e, eng_seq *s) {
    if (s->smp) return PKV_OK;
    if (s->r->p.sampler) { /* checked at submit: sample 0 of a request without a grammar */
        s->smp = s->r->p.sampler;
        return PKV_OK;
    }
    pkv_sampler_params sp = s->r->p.sampling;
    sp.seed += (uint64_t)s->sample;
    s->smp = pkv_sampler_create(sp, e->n_vocab);
    if (!s->smp) return PKV_ERR_NOMEM;
    if (!s->r->p.grammar) return PKV_OK;
    /* constrained output: every sample has its own parse state (batch invariance) */
    if (!e->gvocab && !(e->gvocab = pkv_grammar_vocab_create(e->m))) return pkv_err_prefix(PKV_ERR_INVALID, "engine");
    pkv_status st = pkv_sampler_set_grammar(s->smp, s->r->p.grammar, e->gvocab);
    pkv_sampler_grammar_cancel(s->smp, &s->r->stop_grammar);
    if (st) {
        pkv_sampler_free(s->smp);
        s->smp = NULL;
    }
    return st;
}

/* The draft's sequence of s, whose model sequence kv matched *matched tokens of
 * the prefix cache: the draft matches in its own cache, and both keep what both
 * have (an MTP head's row p needs the model's hidden state at p - 1, so the model
 * keeps one token less and recomputes it). Errors of the draft only turn it off
 * for s; an error truncating the model's sequence is returned. */
static pkv_status draft_start(pkv_engine *e, eng_seq *s, int32_t kv, int64_t *matched) {
    int32_t dkv;
    int64_t dm = 0;
    s->n_dtrue = s->n_dkv = 0;
    if (pkv_kv_seq_create(e->dc, e->dfp, &dkv)) {
        draft_off(e, s);
        return PKV_OK;
    }
    if (e->p.prefix_cache && s->n_tok > 1 && pkv_kv_prefix_match(e->dc, dkv, s->tok, NULL, s->n_tok - 1, &dm)) {
        pkv_kv_seq_free(e->dc, dkv);
        draft_off(e, s);
        return PKV_OK;
    }
    int64_t both = PKV_MIN(*matched, dm), mt = e->dmtp && both > 0 ? both - 1 : both;
    if (dm > both && pkv_kv_truncate(e->dc, dkv, both)) {
        pkv_kv_seq_free(e->dc, dkv);
        draft_off(e, s);
        return PKV_OK;
    }
    if (*matched > mt) {
        pkv_status st = pkv_kv_truncate(e->c, kv, mt);
        if (st) {
            pkv_kv_seq_free(e->dc, dkv);
            return st;
        }
        *matched = mt;
    }
    s->dkv = dkv;
    s->n_dtrue = s->n_dkv = (int32_t)both;
    return PKV_OK;
}

/* The own-cache draft of a request on a context whose sequence holds s->tok[0,
 * base): a draft sequence matched against the draft's published pages; its next
 * round decodes the rest. An MTP head also needs the model's hidden state of each
 * token it takes in: the context's kept ones (pkv_context_keep_hidden; the engine
 * keeps them too for the tokens it runs), else the request goes without it. */
static void ctx_draft_start(pkv_engine *e, eng_seq *s, int64_t base) {
    int32_t dkv;
    int64_t dm = 0;
    s->dkv = -1;
    s->n_dtrue = s->n_dkv = 0;
    if (s->nodraft || !e->dc) return;
    if (pkv_kv_seq_create(e->dc, e->dfp, &dkv)) {
        draft_off(e, s);
        return;
    }
    bool off = e->p.prefix_cache && base > 1 && pkv_kv_prefix_match(e->dc, dkv, s->tok, NULL, base - 1, &dm);
    if (!off && e->dmtp && base > 0) off = !pkv_context_hidden(s->r->p.context, dm > 0 ? dm - 1 : 0);
    if (off) {
        pkv_kv_seq_free(e->dc, dkv);
        draft_off(e, s);
        return;
    }
    s->dkv = dkv;
    s->n_dtrue = s->n_dkv = (int32_t)dm;
}

/* A request with last_pending whose final event is held (its last token sampled
 * from row, not in the KV): it ends now, the context left with that row. */
static void final_pending(pkv_engine *e, eng_seq *s, const float *row) {
    if (s->st != SEQ_RUNNING || !s->r->p.last_pending) return;
    if (s->fin_wait != PKV_FINISH_NONE) {
        final_deferred(e, s, row);
        return;
    }
    /* not the end yet: the context holds the row too, so that an early end (an
     * error, a cancel) leaves it as pkv_generate would */
    pkv_context_set_logits(s->r->p.context, row);
    s->lp_ok = true;
}

/* Start (sample 0 of a new request) or resume (a preempted sample) s when the pool
 * has room for what it must compute beyond `reserve` pages; `alone` (nothing is
 * resident) skips the check: a request that fits at all fits then.
 * Returns 1 started, 0 no room (nothing changed), or -1 error (request failed). */
static int32_t sample_seq(pkv_engine *e, eng_seq *s, const float *row);
static int32_t sample_round(pkv_engine *e, eng_seq *s, const float *row);

/* seq_start for a request on a context: its sequence is the context's, holding
 * the context's tokens; the prompt and what is generated go after them. A
 * dropped one goes on from the context's length at admission. A prefill-only
 * request is one whose final event is held from the start: the step that runs its
 * prompt's last token delivers it and leaves that token's logits (final_deferred). */
static int ctx_start(pkv_engine *e, eng_seq *s, int64_t reserve, bool alone) {
    eng_req *r = s->r;
    pkv_context *ctx = r->p.context;
    pkv_status st;
    if (s->st == SEQ_DROPPED) {
        if (!alone && pool_avail(e) - reserve < pages_for(e, s->n_tok + 1) - pages_for(e, s->n_kv) + 1) return 0;
        s->kv = pkv_context_seq(ctx);
        s->st = SEQ_RUNNING;
        ctx_draft_start(e, s, s->n_kv); /* (preempt gave its draft sequence back) */
        return 1;
    }
    int64_t base = pkv_context_n_tokens(ctx), n = base + r->p.n_prompt;
    bool out = pkv_kv_seq_swapped(e->c, pkv_context_seq(ctx)); /* swapped out while idle: it comes back first */
    /* + 1: the context's last page may be shared (a fork) and is copied on write */
    if (!alone && pool_avail(e) - reserve < pages_for(e, n + 1) - (out ? 0 : pages_for(e, base)) + 1) return 0;
    if (out) {
        st = pkv_kv_swap_in(e->c, pkv_context_seq(ctx));
        if (st == PKV_ERR_OUT_OF_PAGES) return 0;
        if (st) goto fail;
        e->ctx_in++;
    }
    pkv_engine_ctx_touch(e, ctx);
    if (!s->tok) {
        /* with a context shift the sequence never holds more than the engine's n_ctx
         * tokens, and one sampled token more */
        int64_t cap = r->p.context_shift ? PKV_MIN(n + r->max_tokens, e->n_ctx + 1) : n + r->max_tokens;
        s->tok = pkv_malloc((size_t)cap * sizeof *s->tok);
        if (!s->tok) {
            st = pkv_err(PKV_ERR_NOMEM, "engine: out of memory for %lld tokens", (long long)cap);
            goto fail;
        }
        s->cap = (int32_t)cap;
    }
    if (base > 0 && (st = pkv_context_tokens(ctx, 0, base, s->tok))) goto fail;
    memcpy(s->tok + base, r->prompt, (size_t)r->p.n_prompt * sizeof *s->tok);
    s->n_tok = (int32_t)n;
    if (r->p.prefill_only) /* nothing is sampled: the final event waits for the prompt's last token */
        defer_final(e, s, -1, NULL, PKV_FINISH_LENGTH, false);
    else if ((st = seq_sampler(e, s)))
        goto fail;
    for (int64_t i = 0; i < base && !s->nodraft; i++) s->nodraft = s->tok[i] < 0; /* a draft takes no media rows */
    ctx_draft_start(e, s, base);
    s->kv = pkv_context_seq(ctx);
    s->n_kv = (int32_t)base;
    s->st = SEQ_RUNNING;
    r->n_base = (int32_t)base;
    r->started = true;
    e->prompt_tokens += (uint64_t)r->p.n_prompt;
    /* nothing to compute: the first token comes from the context's own logits, by
     * the first round of a draft (first_rounds) or sampled now */
    if (r->p.n_prompt == 0 && (e->dm || e->dngram) && !s->nodraft && !r->p.prefill_only && !r->p.context_shift &&
        r->max_tokens >= 2 && base >= 1) {
        s->dfirst = true;
    } else if (r->p.n_prompt == 0) {
        if (sample_round(e, s, pkv_context_logits(ctx)) < 0) return -1;
        final_pending(e, s, pkv_context_logits(ctx));
    }
    return 1;
fail:
    req_fail(e, r, st);
    return -1;
}

/* ------------------------------------------------------------ embeddings */

/* Does embedding request r need the hidden state of every token from the first on
 * (so no prefix match may skip computing them)? LAST and RANK (qwen3's rerankers
 * score the last token, as llama.cpp does; submit refuses RANK elsewhere) read only
 * the last token's, which a prefix match always leaves to compute. */
static bool embed_all(const eng_req *r) {
    return r->p.embed && r->p.pooling != PKV_POOLING_LAST && r->p.pooling != PKV_POOLING_RANK;
}

/* The step computed positions [a, a + n) of embedding sequence s, whose final
 * normed hidden states are rows h (f32 [n][n_embd]): keep what the pooling needs. */
static void embed_take(pkv_engine *e, eng_seq *s, int32_t a, int32_t n, const float *h) {
    eng_req *r = s->r;
    size_t E = (size_t)e->m->hp.n_embd;
    int32_t last = s->n_tok - 1;
    switch (r->p.pooling) {
    case PKV_POOLING_NONE:
        memcpy(r->pool + (size_t)a * E, h, (size_t)n * E * sizeof *h);
        break;
    case PKV_POOLING_MEAN:
        for (int32_t t = 0; t < n; t++)
            for (size_t j = 0; j < E; j++) r->acc[j] += h[(size_t)t * E + j];
        break;
    case PKV_POOLING_CLS:
        if (a == 0) memcpy(r->pool, h, E * sizeof *h);
        break;
    case PKV_POOLING_LAST:
        if (a + n > last) memcpy(r->pool, h + (size_t)(last - a) * E, E * sizeof *h);
        break;
    case PKV_POOLING_RANK: {
        if (last < a || last >= a + n) break;
        const float *x = h + (size_t)(last - a) * E;
        int k = e->m->n_cls_out;
        for (int i = 0; i < k; i++) {
            const float *w = e->m->cls_out + (size_t)i * E;
            double d = e->m->cls_out_b ? e->m->cls_out_b[i] : 0.0;
            for (size_t j = 0; j < E; j++) d += (double)w[j] * x[j];
            r->pool[i] = (float)d;
        }
        float mx = r->pool[0]; /* Qwen3-Reranker: the softmax of yes / no */
        for (int i = 1; i < k; i++) mx = r->pool[i] > mx ? r->pool[i] : mx;
        double z = 0;
        for (int i = 0; i < k; i++) z += exp((double)r->pool[i] - mx);
        for (int i = 0; i < k; i++) r->pool[i] = (float)(exp((double)r->pool[i] - mx) / z);
        break;
    }
    }
}

/* Embedding sequence s has computed its whole prompt: the final event with the
 * pooled result. */
static void embed_final(pkv_engine *e, eng_seq *s) {
    eng_req *r = s->r;
    if (r->p.pooling == PKV_POOLING_MEAN)
        for (int32_t j = 0; j < e->m->hp.n_embd; j++) r->pool[j] = (float)(r->acc[j] / (double)s->n_tok);
    pkv_engine_event ev;
    memset(&ev, 0, sizeof ev);
    ev.request = r->id;
    ev.sample = s->sample;
    ev.token = -1;
    ev.finish = PKV_FINISH_LENGTH;
    ev.n_prompt = r->p.n_prompt;
    ev.n_cached = r->n_cached;
    ev.message = "";
    ev.embd = r->pool;
    ev.n_embd = r->n_pool;
    if (r->p.on_event) r->p.on_event(&ev, r->p.user);
    seq_release(e, s);
    r->n_final++;
}

static int seq_start(pkv_engine *e, eng_seq *s, int64_t reserve, bool alone) {
    eng_req *r = s->r;
    pkv_status st;
    if (r->p.context && s->st != SEQ_SWAPPED) return ctx_start(e, s, reserve, alone);
    if (s->st == SEQ_SWAPPED) {
        if (!alone && pool_avail(e) - reserve < pages_for(e, s->n_kv + 1)) return 0;
        st = pkv_kv_swap_in(e->c, s->kv);
        if (st == PKV_ERR_OUT_OF_PAGES) return 0;
        if (st) goto fail;
        if (s->dkv >= 0 && pkv_kv_swap_in(e->dc, s->dkv)) draft_off(e, s);
        s->st = SEQ_RUNNING;
        return 1;
    }
    bool first = s->st == SEQ_NONE;
    if (first && !s->tok && (st = seq_alloc_tokens(s, r->prompt, r->p.n_prompt, r->p.n_prompt + r->max_tokens))) goto fail;
    if (!r->p.embed && (st = seq_sampler(e, s))) goto fail;
    int32_t kv;
    if ((st = pkv_kv_seq_create(e->c, r->fp, &kv))) goto fail;
    int64_t matched = 0;
    pkv_kv_stats k0, k1;
    double t0 = 0;
    if (s->spilled) { /* a spilled sequence comes back: count what it finds again */
        pkv_kv_stats_get(e->c, &k0);
        t0 = pkv_time_now();
    }
    if (e->p.prefix_cache && s->n_tok > 1 && !embed_all(r) &&
        (st = pkv_kv_prefix_match_media(e->c, kv, s->tok, NULL, s->n_tok - 1, r->media, r->n_media, &matched))) {
        pkv_kv_seq_free(e->c, kv);
        goto fail;
    }
    if (s->spilled) {
        pkv_kv_stats_get(e->c, &k1);
        uint64_t rd = k1.disk_hit_pages - k0.disk_hit_pages;
        e->sp_read += rd;
        if (rd) e->sp_read_s += pkv_time_now() - t0;
        e->sp_resumed += (uint64_t)(matched / e->ps);
        s->spilled = false; /* once: a failed admission below frees what it matched (memory keeps it) */
    }
    if (e->dc && !s->nodraft && (st = draft_start(e, s, kv, &matched))) {
        pkv_kv_seq_free(e->c, kv);
        goto fail;
    }
    int64_t need = pages_for(e, s->n_tok + 1) - matched / e->ps + (r->n > 1 && !r->forked ? r->n - 1 : 0);
    if (!alone && pool_avail(e) - reserve < need) {
        pkv_kv_seq_free(e->c, kv); /* the matched pages go back to the cache */
        if (s->dkv >= 0) pkv_kv_seq_free(e->dc, s->dkv);
        s->dkv = -1;
        return 0;
    }
    s->kv = kv;
    s->n_kv = (int32_t)matched;
    s->st = SEQ_RUNNING;
    if (r->acc) memset(r->acc, 0, (size_t)e->m->hp.n_embd * sizeof *r->acc); /* (re)computed from token 0 */
    if (first) {
        r->started = true;
        r->n_cached = (int32_t)matched;
        e->prompt_tokens += (uint64_t)r->p.n_prompt;
        e->hit_tokens += (uint64_t)matched;
    }
    return 1;
fail:
    req_fail(e, r, st);
    return -1;
}

/* Does a resident sequence (of another request) share at least one more full page
 * of r's prompt than the cache holds now, and is it still computing it? Then r
 * waits for those pages rather than computing them a second time: a burst of
 * requests with one system prompt computes it once. Never waits on a sequence
 * that is not running (it may never finish the part). */
static bool wait_for_prefix(const pkv_engine *e, const eng_req *r) {
    if (!e->p.prefix_cache) return false;
    int64_t can = r->p.n_prompt - 1; /* prefix match leaves one token to compute */
    for (int i = 0; i < e->n_reqs; i++) {
        const eng_req *o = e->reqs[i];
        if (o == r || o->fp != r->fp) continue; /* (another LoRA set: nothing to share) */
        for (int j = 0; j < o->n; j++) {
            const eng_seq *s = &o->seqs[j];
            if (s->st != SEQ_RUNNING) continue;
            int64_t L = 0, lim = PKV_MIN(can, (int64_t)s->n_tok);
            while (L < lim && s->tok[L] == r->prompt[L]) L++;
            L = L / e->ps * e->ps;
            if (L > 0 && s->n_kv < L) return true;
        }
    }
    return false;
}

/* Pages the resident sequences need to compute what they hold pending, plus one
 * token each: what admitting more must leave them. */
static int64_t reserve_pages(const pkv_engine *e) {
    int64_t n = 0;
    for (int i = 0; i < e->n_reqs; i++)
        for (int j = 0; j < e->reqs[i]->n; j++) {
            const eng_seq *s = &e->reqs[i]->seqs[j];
            if (s->st == SEQ_RUNNING) n += pages_for(e, s->n_tok + 1) - pages_for(e, s->n_kv);
        }
    return n;
}

static int64_t pending_tokens(const pkv_engine *e) {
    int64_t n = 0;
    for (int i = 0; i < e->n_reqs; i++)
        for (int j = 0; j < e->reqs[i]->n; j++) {
            const eng_seq *s = &e->reqs[i]->seqs[j];
            if (s->st == SEQ_RUNNING) n += s->n_tok - s->n_kv;
        }
    return n;
}

/* Resume preempted sequences and admit new requests in priority order, while the
 * step has token budget left and the pool has room; a candidate that does not
 * fit may preempt sequences of lower priority, else admission stops there (no
 * overtaking, so nothing starves). Returns whether anything changed. */
static bool admit(pkv_engine *e) {
    bool changed = false;
    int resident = n_resident(e);
    int64_t budget = e->p.max_batch_tokens - pending_tokens(e);
    e->short_of_pages = false;
    for (int i = 0; i < e->n_reqs; i++) {
        eng_req *r = e->reqs[i];
        if (r->cancel || r->n_final == r->n) continue;
        for (int j = 0; j < r->n; j++) {
            eng_seq *s = &r->seqs[j];
            bool cand = s->st == SEQ_SWAPPED || s->st == SEQ_DROPPED || (s->st == SEQ_NONE && j == 0);
            if (!cand) continue;
            if (s->st == SEQ_NONE && !r->p.context && !embed_all(r) && wait_for_prefix(e, r)) break; /* later requests may go first */
            for (;;) {
                if (budget <= 0 || resident >= e->p.max_seqs) return changed;
                int got = seq_start(e, s, reserve_pages(e), resident == 0);
                if (got < 0) {
                    changed = true;
                    break; /* the request failed; go on with the next */
                }
                if (got > 0) {
                    changed = true;
                    resident++;
                    budget -= s->n_tok - s->n_kv;
                    break;
                }
                if (pkv_engine_ctx_evict(e, NULL)) { /* idle contexts go first (engine-contexts.c) */
                    changed = true;
                    continue;
                }
                eng_seq *v = pick_victim(e, NULL, true, r->p.priority);
                if (!v) {
                    e->short_of_pages = true;
                    return changed;
                }
                preempt(e, v);
                resident--;
                changed = true;
            }
            if (r->n_final == r->n) break;
        }
    }
    return changed;
}

/* ---------------------------------------------------------------- batch */

/* Tokens of r's sequence from n_kv on that a step of at most n may take without
 * splitting a non-causal chunk: the cut moves before the chunk, or, when the chunk
 * starts at n_kv and does not fit, 0 (it waits; submit made sure it fits a step). */
static int32_t media_fit(const eng_req *r, int32_t n_kv, int32_t n) {
    for (int i = 0; i < r->n_media; i++) {
        const pkv_kv_media *m = &r->media[i];
        if (!(m->flags & PKV_MEDIA_NON_CAUSAL)) continue;
        if (n_kv + n > m->start && n_kv + n < m->start + m->n_rows) return m->start > n_kv ? (int32_t)(m->start - n_kv) : 0;
    }
    return n;
}

/* The step's media rows and non-causal spans of s's tokens [n_kv, n_kv + n) at
 * batch offset t; *rows counts the rows written so far. */
static pkv_status media_pack(pkv_engine *e, const eng_seq *s, int64_t t, int64_t *rows, bool *any_nc) {
    const eng_req *r = s->r;
    const size_t E = (size_t)e->m->hp.n_embd;
    int64_t base = 0;
    for (int i = 0; i < r->n_media; i++) {
        const pkv_kv_media *m = &r->media[i];
        int64_t a = PKV_MAX(m->start, (int64_t)s->n_kv), b = PKV_MIN(m->start + m->n_rows, (int64_t)(s->n_kv + s->step_n));
        if (a < b) {
            if (*rows + (b - a) > (int64_t)e->cap_embd) {
                void *p = e->b_embd;
                size_t cap = e->cap_embd * E; /* floats */
                pkv_status st = pkv_grow(&p, &cap, (size_t)(*rows + (b - a)) * E, sizeof(float));
                e->b_embd = p;
                if (st) return st;
                e->cap_embd = cap / E;
            }
            memcpy(e->b_embd + (size_t)*rows * E, r->embd + (size_t)(base + a - m->start) * E, (size_t)(b - a) * E * sizeof(float));
            *rows += b - a;
            if (m->flags & PKV_MEDIA_NON_CAUSAL) {
                for (int64_t k = a; k < b; k++) e->b_span[t + k - s->n_kv] = (int32_t)(m->start + m->n_rows - s->n_kv);
                *any_nc = true;
            }
        }
        base += m->n_rows;
    }
    return PKV_OK;
}

/* Record the chunks of s that its last step completed (tokens [a, n_kv) now in). */
static pkv_status media_record(pkv_engine *e, const eng_seq *s, int32_t a) {
    const eng_req *r = s->r;
    pkv_status st = PKV_OK;
    for (int i = 0; i < r->n_media && !st; i++) {
        int64_t end = r->media[i].start + r->media[i].n_rows;
        if (end > a && end <= s->n_kv) st = pkv_kv_media_add(e->c, s->kv, &r->media[i]);
    }
    return st;
}

/* The step's batch: resident sequences in priority order, first one decode token
 * each, then prefill chunks from what the token budget leaves. */
static int form_batch(pkv_engine *e) {
    int nb = 0;
    int64_t budget = e->p.max_batch_tokens;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < e->n_reqs; i++)
            for (int j = 0; j < e->reqs[i]->n; j++) {
                eng_seq *s = &e->reqs[i]->seqs[j];
                if (s->st != SEQ_RUNNING || s->step_n || (s->dfirst && !s->n_prop)) continue;
                int32_t left = s->n_tok - s->n_kv;
                const bool dec = left == 1 || s->dfirst;
                if ((pass == 0) != dec || budget <= 0 || nb >= e->p.max_seqs) continue;
                if (dec) { /* a decode token and the draft's proposals after it (a first round's: alone) */
                    s->n_prop = (int32_t)PKV_MIN((int64_t)s->n_prop, budget - left);
                    left += s->n_prop;
                }
                int32_t n = (int32_t)PKV_MIN((int64_t)left, budget);
                if (s->r->n_media && !(n = media_fit(s->r, s->n_kv, n))) continue; /* its chunk waits for room */
                s->step_n = n;
                budget -= s->step_n;
                e->batch[nb++] = s;
            }
    return nb;
}

static int pack_batch(pkv_engine *e, int nb) {
    int k = 0;
    int64_t t = 0;
    for (int i = 0; i < nb; i++) {
        eng_seq *s = e->batch[i];
        if (!s->step_n) continue; /* preempted */
        e->batch[k] = s;
        e->b_kv[k] = s->kv;
        e->b_n[k] = s->step_n;
        e->b_nl[k] = !s->dfirst + s->n_prop; /* logits of the decode token and of each proposal */
        s->h_row = (int32_t)t;
        s->h_pos = s->n_kv;
        memcpy(e->b_tok + t, s->tok + s->n_kv, (size_t)s->step_n * sizeof *e->b_tok);
        t += s->step_n;
        k++;
    }
    return k;
}

/* Context shift (pkv_request_params.context_shift): s just sampled a token that
 * goes into its context next; when the context is full (for the request's last
 * token: when the sequence is at the engine's limit), keep n_keep tokens (and a
 * leading BOS), drop half of the rest, and drop them from s->tok alike. */
static pkv_status ctx_shift(pkv_engine *e, eng_seq *s, bool last) {
    eng_req *r = s->r;
    pkv_context *ctx = r->p.context;
    int64_t have = s->n_kv, lim = last ? e->n_ctx : PKV_MIN(e->n_ctx, pkv_context_n_ctx(ctx));
    if (have < lim) return PKV_OK;
    int64_t keep = r->p.n_keep;
    if (keep < 1 && have > 0 && s->tok[0] == pkv_model_bos(e->m)) keep = 1;
    if (keep > have - 2) keep = PKV_MAX(have - 2, 0);
    int64_t drop = (have - keep) / 2;
    if (drop < 1)
        return pkv_err(PKV_ERR_INVALID, "context shift: nothing to drop: n_keep %d holds the whole context of %lld tokens",
                       (int)r->p.n_keep, (long long)have);
    pkv_status st = pkv_context_shift(ctx, keep, drop);
    if (st) return st;
    memmove(s->tok + keep, s->tok + keep + drop, (size_t)(s->n_tok - keep - drop) * sizeof *s->tok);
    s->n_tok -= (int32_t)drop;
    s->n_kv -= (int32_t)drop;
    s->n_shifted += drop;
    if (r->n_base > keep) r->n_base = (int32_t)keep; /* a drop (preempt) recomputes from here */
    return PKV_OK;
}

/* Sampling s failed with st: the request fails. */
static void sample_failed(pkv_engine *e, eng_seq *s, pkv_status st) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", pkv_errmsg());
    s->r->failed = true;
    emit(e, s, -1, NULL, PKV_FINISH_ERROR, false, st, msg);
}

/* tok, drawn for s from its logits row, becomes its next token and is delivered
 * (or held, for a context request's last token); returns tok, or -1 when the
 * context shift it needed failed (the request failed). */
static int32_t take_token(pkv_engine *e, eng_seq *s, int32_t tok, const float *row) {
    eng_req *r = s->r;
    pkv_sampler_accept(s->smp, tok);
    s->tok[s->n_tok++] = tok;
    s->n_gen++;
    e->generated++;
    pkv_finish_reason fin = PKV_FINISH_NONE;
    bool stop = !r->p.ignore_eos && pkv_model_is_eog(e->m, tok);
    for (int i = 0; !stop && i < r->p.n_stop; i++) stop = r->stop[i] == tok;
    if (stop) fin = PKV_FINISH_STOP;
    else if (s->n_gen >= r->max_tokens) fin = PKV_FINISH_LENGTH;
    pkv_status st = r->p.context_shift ? ctx_shift(e, s, fin != PKV_FINISH_NONE) : PKV_OK;
    if (st) {
        sample_failed(e, s, st);
        return -1;
    }
    if (r->p.context && fin != PKV_FINISH_NONE) { /* the context keeps the token: run it first */
        defer_final(e, s, tok, row, fin, stop);
        return tok;
    }
    bool go = emit(e, s, tok, row, fin, stop, PKV_OK, NULL);
    if (fin == PKV_FINISH_NONE && !go && e->dist == ENG_DIST_LEAD) {
        /* the other ranks have no callback: the sample ends on every rank at the next
         * step's start (without memory for the list it runs on, undelivered) */
        s->dist_stop = true;
        pthread_mutex_lock(&e->mu); /* the list is also the cancels of the server's threads */
        if (pkv_engine_dist_log_cancel(e, ENG_SAMPLE_STOP(r->id, s->sample)))
            PKV_WARN("engine: %s", pkv_errmsg());
        pthread_mutex_unlock(&e->mu);
    } else if (fin == PKV_FINISH_NONE && !go) {
        if (r->p.context) defer_final(e, s, -1, NULL, PKV_FINISH_STOP, false);
        else emit(e, s, -1, NULL, PKV_FINISH_STOP, false, PKV_OK, NULL);
    }
    return tok;
}

/* Sample the next token of s from its logits row and deliver it; the token, or -1
 * when sampling failed. */
static int32_t sample_seq(pkv_engine *e, eng_seq *s, const float *row) {
    eng_req *r = s->r;
    int32_t tok;
    uint64_t m0 = 0, m1 = 0;
    double s0 = 0, s1 = 0;
    if (r->p.grammar) pkv_sampler_grammar_cost(s->smp, &m0, &s0);
    pkv_status st = pkv_sampler_sample(s->smp, row, &tok);
    if (r->p.grammar) {
        pkv_sampler_grammar_cost(s->smp, &m1, &s1);
        e->g_masks += m1 - m0;
        e->g_mask_s += s1 - s0;
    }
    if (st) {
        sample_failed(e, s, st);
        return -1;
    }
    return take_token(e, s, tok, row);
}

/* pkv_engine_params.on_draft_round for a round of s from position pos. */
static void round_hook(pkv_engine *e, const eng_seq *s, int64_t pos, const int32_t *prop, int np, int acc) {
    if (!e->p.on_draft_round || (!e->dm && !e->dngram)) return;
    pkv_spec_round rd = {.pos = pos, .proposed = prop, .n_proposed = np, .n_accepted = acc};
    e->p.on_draft_round(s->r->id, s->sample, &rd, e->p.draft_round_user);
}

/* A plain sampling round (nothing proposed) of s from its row, for the hook. */
static int32_t sample_round(pkv_engine *e, eng_seq *s, const float *row) {
    round_hook(e, s, s->n_tok - 1, NULL, 0, 0);
    return sample_seq(e, s, row);
}

/* Samples 1..n-1 of r as forks of sample 0, which just finished the prompt. */
static pkv_status fork_samples(pkv_engine *e, eng_req *r) {
    eng_seq *p = &r->seqs[0];
    pkv_status st = PKV_OK;
    for (int j = 1; j < r->n && !st; j++) {
        eng_seq *s = &r->seqs[j];
        if ((st = seq_alloc_tokens(s, p->tok, p->n_tok, p->cap))) break;
        if ((st = seq_sampler(e, s))) break;
        if ((st = pkv_kv_fork(e->c, p->kv, &s->kv))) break;
        s->n_kv = p->n_kv;
        s->st = SEQ_RUNNING;
        if (p->dkv >= 0 && !s->nodraft) { /* the draft's rows of the prompt too */
            if (pkv_kv_fork(e->dc, p->dkv, &s->dkv)) {
                draft_off(e, s);
            } else {
                s->n_dtrue = p->n_dtrue;
                s->n_dkv = p->n_dkv;
            }
        }
        s->h_row = p->h_row;
        s->h_pos = p->h_pos;
    }
    r->forked = true;
    return st;
}

/* ------------------------------------------------------------- draft */

/* Grow a host array of rows x width floats to hold n rows. */
static pkv_status grow_rows(float **a, size_t *cap, size_t n, size_t width) {
    if (n <= *cap) return PKV_OK;
    size_t c = PKV_MAX(n, 2 * *cap), bytes;
    if (!pkv_mul_ok(c, width * sizeof(float), &bytes)) return pkv_err(PKV_ERR_NOMEM, "engine: %zu rows", n);
    float *p = pkv_malloc(bytes);
    if (!p) return pkv_err(PKV_ERR_NOMEM, "engine: out of memory for %zu rows of %zu floats", c, width);
    pkv_free(*a);
    *a = p;
    *cap = c;
    return PKV_OK;
}

/* s verifies its proposals by the speculative-sampling rule (else by MATCH). */
static bool seq_draws(const pkv_engine *e, const eng_seq *s) {
    return e->p.draft_accept == PKV_DRAFT_ACCEPT_SAMPLING && !s->r->p.grammar;
}

/* The proposals of s were verified by this step (the model's rows `lg`, one per
 * token from its decode token at position a). MATCH: sample from each row in turn
 * as plain decoding would, keeping a proposal while the sample equals it.
 * SAMPLING: keep proposal i with probability min(1, p/q), else take the residual's
 * token and stop; all kept: sample the next row. The model's rows after the last
 * kept one are truncated away. */
static void verify(pkv_engine *e, eng_seq *q, const float *lg, int32_t a) {
    const int np = q->n_prop;
    const bool draws = seq_draws(e, q);
    int j = 0, i = 0;
    bool ended = false, kept = false;
    e->d_proposed += (uint64_t)np;
    for (; i <= np; i++) {
        const float *row = lg + (size_t)i * (size_t)e->n_vocab;
        kept = false;
        if (draws && i < np) {
            int32_t y;
            pkv_status st = pkv_sampler_spec_verify(q->smp, row, q->q + (size_t)i * (size_t)e->n_vocab, q->prop[i], e->vp,
                                                    &kept, &y);
            if (st) sample_failed(e, q, st);
            else take_token(e, q, y, row);
            kept = kept && !st;
        } else {
            int32_t y = sample_seq(e, q, row);
            kept = i < np && y == q->prop[i];
        }
        e->d_accepted += kept;
        j += kept;
        /* finished (or failed): released; a context request's end is held */
        if ((ended = q->st != SEQ_RUNNING) || q->fin_wait != PKV_FINISH_NONE || !kept) break;
    }
    round_hook(e, q, a, q->prop, np, j);
    if (ended) return;
    q->n_prop = 0;
    /* the last token, from row i, is at position a + 1 + i: in the KV when it was a
     * kept proposal, else pending */
    const bool held = q->fin_wait != PKV_FINISH_NONE, pending = held && q->r->p.last_pending;
    int32_t keep = a + 1 + j - (pending && kept);
    if (keep < q->n_kv) {
        pkv_status st = pkv_kv_truncate(e->c, q->kv, keep);
        if (st) {
            req_fail(e, q->r, st);
            return;
        }
        q->n_kv = keep;
    }
    if (pending || (!held && q->r->p.last_pending)) final_pending(e, q, lg + (size_t)i * (size_t)e->n_vocab);
    else if (held && kept) final_deferred(e, q, lg + (size_t)(i + 1) * (size_t)e->n_vocab); /* the row after it */
}

static int32_t argmax(const float *row, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (row[i] > row[best]) best = i;
    return best;
}

/* Proposal i of s from the draft's logits row: its most likely token (MATCH), or a
 * token drawn from q_i = s's sampler chain over the row, q_i kept for the
 * verification (SAMPLING). -1 when that fails: s goes on without the draft. */
static int32_t propose(pkv_engine *e, eng_seq *s, int i, const float *row) {
    const size_t V = (size_t)e->n_vocab;
    if (!seq_draws(e, s)) return argmax(row, (int32_t)V);
    int32_t d;
    pkv_status st = PKV_OK;
    if (!s->q && !(s->q = pkv_malloc((size_t)e->K * V * sizeof *s->q)))
        st = pkv_err(PKV_ERR_NOMEM, "engine: out of memory for %d draft distributions", e->K);
    if (!st) st = pkv_sampler_spec_propose(s->smp, row, s->q + (size_t)i * V, &d);
    if (!st) return d;
    PKV_WARN("engine: a draft proposal failed (%s); the sequence goes on without the draft", pkv_errmsg());
    draft_off(e, s);
    return -1;
}

/* One step of the draft over d_seq[0..n) with d_n[k] tokens each (in d_tok), into
 * dlogits: on cache c (the draft's own, or the model's for a draft without one),
 * publishing nothing unless publish; pos / hidden rows where the draft takes them
 * (NULL: none). Counted in d_steps. */
static pkv_status draft_step(pkv_engine *e, pkv_kv_cache *c, int n, bool publish, bool peek, bool hidden) {
    pkv_fwd_batch b;
    memset(&b, 0, sizeof b);
    b.n_seqs = n;
    b.seqs = e->d_seq;
    b.n_tokens = e->d_n;
    b.tokens = e->d_tok;
    b.no_publish = !publish;
    if (peek) { /* read-only queries at the given positions (a draft without a cache) */
        b.pos = e->d_pos;
        b.peek = true;
    }
    if (hidden) {
        b.hidden_in = e->dh_in;
        b.hidden_out = e->dh_out;
    }
    pkv_status st = pkv_model_forward(e->dm, c, &e->dws, &b, e->dlogits);
    e->d_steps++;
    return st;
}

/* One draft forward over d_who[0..n) with d_n[k] tokens each (in d_tok), hidden
 * input rows dh_in (an MTP head); publish: rows made from committed tokens. The
 * sequences of a failed step go on without the draft. */
static bool draft_forward(pkv_engine *e, int n, bool publish) {
    pkv_status st = draft_step(e, e->dc, n, publish, false, e->dmtp);
    if (st) {
        PKV_WARN("engine: the draft's step failed (%s); %d sequence(s) go on without it", pkv_errmsg(), n);
        for (int k = 0; k < n; k++) draft_off(e, e->d_who[k]);
        return false;
    }
    return true;
}

/* The model's final hidden state at position p of s: a row of this step, or one
 * the request's context kept; NULL: not at hand. */
static const float *seq_hidden(const pkv_engine *e, const eng_seq *s, int32_t p) {
    if (s->h_row >= 0 && p >= s->h_pos) return e->hid + (size_t)(s->h_row + p - s->h_pos) * (size_t)e->m->hp.n_embd;
    return s->r->p.context ? pkv_context_hidden(s->r->p.context, p) : NULL;
}

/* The model's hidden state at position p - 1 (p >= 1), from which an MTP head's
 * row p is made. */
static const float *mtp_hidden(const pkv_engine *e, const eng_seq *s, int32_t p) { return seq_hidden(e, s, p - 1); }

/* Does a draft round skip s? A first round (first_rounds) takes only the
 * sequences whose first round has proposed nothing yet; a round after a step
 * takes the others. */
static bool round_skips(const eng_seq *s, bool first) { return first ? !s->dfirst || s->n_prop > 0 : s->dfirst; }

/* After a step: the draft takes in what its sequences committed (from the rows
 * the step computed), then proposes up to K tokens for each sequence that decodes
 * next: the draft's most likely token, fed back K - 1 times. Batches of at most
 * max_seqs sequences. first: the first rounds of requests on contexts, before the
 * step (the hidden states are the contexts' kept ones): the draft catches up with
 * every token and proposes after the last. */
static void draft_round(pkv_engine *e, bool first) {
    const size_t E = (size_t)e->m->hp.n_embd, V = (size_t)e->n_vocab;
    int ri = 0, rj = 0; /* where the search for sequences goes on */
    for (;;) {
        int n = 0;
        size_t T = 0;
        for (; ri < e->n_reqs && n < e->p.max_seqs; ri++, rj = 0) {
            eng_req *r = e->reqs[ri];
            for (; rj < r->n && n < e->p.max_seqs; rj++) {
                eng_seq *s = &r->seqs[rj];
                if (s->st != SEQ_RUNNING || round_skips(s, first) || s->dkv < 0 || (!first && s->h_row < 0)) continue;
                int32_t end = PKV_MIN(s->n_kv + 1, s->n_tok);
                s->n_prop = 0;
                if (first && s->n_dtrue >= end) s->n_dtrue = end - 1; /* its last token's logits are needed */
                if (s->n_dkv > s->n_dtrue) { /* the last proposals' rows */
                    if (pkv_kv_truncate(e->dc, s->dkv, s->n_dtrue)) {
                        draft_off(e, s);
                        continue;
                    }
                    s->n_dkv = s->n_dtrue;
                }
                if (end <= s->n_dtrue) continue;
                if (e->dmtp && s->n_dtrue > 0 && !mtp_hidden(e, s, s->n_dtrue)) { /* the hidden state is not at hand */
                    draft_off(e, s);
                    continue;
                }
                e->d_who[n] = s;
                e->d_seq[n] = s->dkv;
                e->d_n[n] = end - s->n_dtrue;
                T += (size_t)e->d_n[n];
                n++;
            }
            if (n == e->p.max_seqs) break;
        }
        if (!n) return;
        void *dt = e->d_tok;
        if (pkv_grow(&dt, &e->cap_dtok, T, sizeof(int32_t)) ||
            (e->dmtp && (grow_rows(&e->dh_in, &e->cap_hid_d, T, E) ||
                         grow_rows(&e->dh_out, &e->cap_hid_o, T, E)))) {
            for (int k = 0; k < n; k++) draft_off(e, e->d_who[k]);
            continue;
        }
        e->d_tok = dt;
        size_t t = 0;
        for (int k = 0; k < n; k++) { /* catch up: row p from token p and the hidden state at p - 1 */
            eng_seq *s = e->d_who[k];
            for (int32_t p = s->n_dtrue; p < s->n_dtrue + e->d_n[k]; p++, t++) {
                e->d_tok[t] = s->tok[p];
                if (!e->dmtp) continue;
                if (p == 0) memset(e->dh_in + t * E, 0, E * sizeof(float));
                else memcpy(e->dh_in + t * E, mtp_hidden(e, s, p), E * sizeof(float)); /* (contiguous from n_dtrue) */
            }
        }
        if (!draft_forward(e, n, true)) continue;
        /* the sequences that decode next propose; the others only caught up */
        int m = 0;
        t = 0;
        for (int k = 0; k < n; k++) {
            eng_seq *s = e->d_who[k];
            t += (size_t)e->d_n[k];
            s->n_dtrue = s->n_dkv = s->n_dtrue + e->d_n[k];
            int32_t room = s->r->max_tokens - s->n_gen - 1;
            if (s->n_dtrue != s->n_tok || s->n_kv != s->n_tok - !s->dfirst || room < 1 || s->fin_wait != PKV_FINISH_NONE)
                continue; /* (a context request's held end: its last token only goes in) */
            int32_t d = propose(e, s, 0, e->dlogits + (size_t)k * V);
            if (d < 0) continue;
            s->prop[0] = s->tok[s->n_tok] = d;
            s->n_prop = 1; /* the proposals go after the pending token, where the step reads them */
            e->d_who[m] = s;
            e->d_seq[m] = s->dkv;
            if (e->dmtp) memmove(e->dh_in + (size_t)m * E, e->dh_out + (t - 1) * E, E * sizeof(float));
            m++;
        }
        for (int i = 1; m > 0 && i < e->K; i++) { /* feed each its last proposal */
            int w = 0;
            for (int k = 0; k < m; k++) {
                eng_seq *s = e->d_who[k];
                if (s->n_prop < i || s->r->max_tokens - s->n_gen - 1 <= i) continue;
                e->d_who[w] = s;
                e->d_seq[w] = s->dkv;
                e->d_n[w] = 1;
                e->d_tok[w] = s->prop[i - 1];
                if (e->dmtp && w != k) memcpy(e->dh_in + (size_t)w * E, e->dh_in + (size_t)k * E, E * sizeof(float));
                w++;
            }
            m = w;
            if (!m || !draft_forward(e, m, false)) break;
            for (int k = 0; k < m; k++) {
                eng_seq *s = e->d_who[k];
                s->n_dkv++; /* (before propose: a failure gives back the whole sequence) */
                int32_t d = propose(e, s, i, e->dlogits + (size_t)k * V);
                if (d < 0) continue;
                s->prop[i] = s->tok[s->n_tok + i] = d;
                s->n_prop = i + 1;
                if (e->dmtp) memcpy(e->dh_in + (size_t)k * E, e->dh_out + (size_t)k * E, E * sizeof(float));
            }
        }
    }
}

/* The sequence a first round reads in the model's cache: a fork of s's without
 * its last token, which the round takes as if it were pending (*seq; false: no
 * fork, s sits the round out). */
static bool first_fork(pkv_engine *e, const eng_seq *s, int32_t *seq) {
    if (pkv_kv_fork(e->c, s->kv, seq)) return false;
    if (!pkv_kv_truncate(e->c, *seq, s->n_kv - 1)) return true;
    pkv_kv_seq_free(e->c, *seq);
    return false;
}

/* Gemma 4's assistant (no cache of its own): each sequence whose next step decodes
 * one pending token proposes up to K tokens after it, every query at the position
 * after the sequence's cached tokens, reading the model's own pages: first fed the
 * pending token and the model's hidden state of its last cached token (a row of the
 * step just done, or one its context kept), then each proposal and the assistant's
 * own next hidden state. first (first_rounds): the context's last token is taken
 * as pending, read through a fork without it (freed after the round). Batches of
 * at most max_seqs sequences, one token each. */
static void assistant_round(pkv_engine *e, bool first) {
    const size_t E = (size_t)e->m->hp.n_embd, V = (size_t)e->n_vocab;
    int ri = 0, rj = 0;
    for (;;) {
        int n = 0;
        for (; ri < e->n_reqs && n < e->p.max_seqs; ri++, rj = 0) {
            eng_req *r = e->reqs[ri];
            for (; rj < r->n && n < e->p.max_seqs; rj++) {
                eng_seq *s = &r->seqs[rj];
                if (round_skips(s, first)) continue;
                s->n_prop = 0;
                const int32_t c = s->n_kv - s->dfirst; /* the cached tokens it reads */
                /* (a request of n > 1 samples forks after its prompt's plain step: its first
                 * sample proposes nothing before) */
                if (s->st != SEQ_RUNNING || s->nodraft || (!first && s->h_row < 0) || s->n_kv != s->n_tok - !s->dfirst ||
                    c < 1 || !seq_hidden(e, s, c - 1) || r->max_tokens - s->n_gen - 1 < 1 || (r->n > 1 && !r->forked) ||
                    s->fin_wait != PKV_FINISH_NONE)
                    continue;
                e->d_seq[n] = s->kv;
                if (first && !first_fork(e, s, &e->d_seq[n])) continue;
                int32_t last;
                if (pkv_kv_seq_tokens(e->c, e->d_seq[n], c - 1, 1, NULL, &last)) {
                    if (first) pkv_kv_seq_free(e->c, e->d_seq[n]);
                    draft_off(e, s);
                    continue;
                }
                e->d_who[n] = s;
                e->d_n[n] = 1;
                e->d_pos[n] = last + 1;
                n++;
            }
            if (n == e->p.max_seqs) break;
        }
        if (!n) return;
        void *dt = e->d_tok;
        if (pkv_grow(&dt, &e->cap_dtok, (size_t)n, sizeof(int32_t)) || grow_rows(&e->dh_in, &e->cap_hid_d, (size_t)n, E) ||
            grow_rows(&e->dh_out, &e->cap_hid_o, (size_t)n, E)) {
            for (int k = 0; k < n; k++) {
                if (first) pkv_kv_seq_free(e->c, e->d_seq[k]);
                draft_off(e, e->d_who[k]);
            }
            continue;
        }
        e->d_tok = dt;
        for (int k = 0; k < n; k++) {
            eng_seq *s = e->d_who[k];
            const int32_t c = s->n_kv - s->dfirst;
            e->d_tok[k] = s->tok[c];
            memcpy(e->dh_in + (size_t)k * E, seq_hidden(e, s, c - 1), E * sizeof(float));
        }
        for (int i = 0; n > 0 && i < e->K; i++) {
            pkv_status st = draft_step(e, e->c, n, true, true, true);
            if (st) {
                PKV_WARN("engine: the assistant's step failed (%s); %d sequence(s) go on without it", pkv_errmsg(), n);
                for (int k = 0; k < n; k++) draft_off(e, e->d_who[k]);
                break;
            }
            int w = 0; /* the sequences that go on: fed their proposal and next hidden state */
            for (int k = 0; k < n; k++) {
                eng_seq *s = e->d_who[k];
                int32_t d = propose(e, s, i, e->dlogits + (size_t)k * V);
                if (d >= 0) {
                    s->prop[i] = s->tok[s->n_tok + i] = d;
                    s->n_prop = i + 1;
                }
                if (d < 0 || s->r->max_tokens - s->n_gen - 1 <= i + 1) {
                    if (first) pkv_kv_seq_free(e->c, e->d_seq[k]);
                    continue;
                }
                e->d_who[w] = s;
                e->d_seq[w] = e->d_seq[k];
                e->d_pos[w] = e->d_pos[k];
                e->d_tok[w] = s->prop[i];
                memcpy(e->dh_in + (size_t)w * E, e->dh_out + (size_t)k * E, E * sizeof(float));
                w++;
            }
            n = w;
        }
        for (int k = 0; first && k < n; k++) pkv_kv_seq_free(e->c, e->d_seq[k]);
    }
}

/* A shared-KV draft's fork of s (of its first c tokens: a first round's leaves the
 * last out): the pages its K proposal steps need (the copy-on-write copy of the
 * shared last page included) fit in what the pool has left (*avail, less them on
 * success), and the fork exists (d_seq[n]). Else s sits this round out
 * (draft_skipped): drafting never takes pages a request needs. */
static bool shared_fork(pkv_engine *e, eng_seq *s, int32_t c, int32_t steps, int64_t *avail, int n) {
    int64_t need = pages_for(e, (int64_t)c + steps) - c / e->ps;
    if (need > *avail || (c == s->n_kv ? pkv_kv_fork(e->c, s->kv, &e->d_seq[n]) : !first_fork(e, s, &e->d_seq[n]))) {
        e->d_skipped++;
        return false;
    }
    *avail -= need;
    return true;
}

/* A shared-KV draft (no cache of its own: its layers attend over the model's cache
 * layers it names): each sequence whose next step decodes one pending token
 * drafts on a fork of its sequence in the model's cache (copy-on-write: the
 * draft's K/V go to copied pages, never into the sequence's), fed the pending
 * token, then each proposal in turn; the forks are freed after the round, before
 * the step that verifies. first (first_rounds): the fork leaves the context's last
 * token out and is fed it. Batches of at most max_seqs sequences, one token each. */
static void shared_round(pkv_engine *e, bool first) {
    const size_t V = (size_t)e->n_vocab;
    int ri = 0, rj = 0;
    for (;;) {
        int n = 0;
        int64_t avail = pool_avail(e); /* (the last batch's forks are freed) */
        for (; ri < e->n_reqs && n < e->p.max_seqs; ri++, rj = 0) {
            eng_req *r = e->reqs[ri];
            for (; rj < r->n && n < e->p.max_seqs; rj++) {
                eng_seq *s = &r->seqs[rj];
                int32_t room = r->max_tokens - s->n_gen - 1, c = s->n_kv - s->dfirst;
                if (round_skips(s, first)) continue;
                s->n_prop = 0;
                if (s->st != SEQ_RUNNING || s->nodraft || (!first && s->h_row < 0) || s->n_kv != s->n_tok - !s->dfirst ||
                    room < 1 || c < 1 || (r->n > 1 && !r->forked) || s->fin_wait != PKV_FINISH_NONE ||
                    !shared_fork(e, s, c, PKV_MIN(e->K, room), &avail, n))
                    continue;
                e->d_who[n] = s;
                e->d_n[n] = 1;
                n++;
            }
            if (n == e->p.max_seqs) break;
        }
        if (!n) return;
        void *dt = e->d_tok;
        if (pkv_grow(&dt, &e->cap_dtok, (size_t)n, sizeof(int32_t))) {
            for (int k = 0; k < n; k++) pkv_kv_seq_free(e->c, e->d_seq[k]);
            e->d_skipped += (uint64_t)n;
            continue;
        }
        e->d_tok = dt;
        for (int k = 0; k < n; k++) e->d_tok[k] = e->d_who[k]->tok[e->d_who[k]->n_kv - e->d_who[k]->dfirst];
        for (int i = 0; n > 0 && i < e->K; i++) {
            pkv_status st = draft_step(e, e->c, n, false, false, false);
            if (st == PKV_ERR_OUT_OF_PAGES) { /* another pool (a window's) ran short: the proposals so far stand */
                e->d_skipped += (uint64_t)n;
                break;
            }
            if (st) {
                PKV_WARN("engine: the draft's step failed (%s); %d sequence(s) go on without it", pkv_errmsg(), n);
                for (int k = 0; k < n; k++) draft_off(e, e->d_who[k]);
                break;
            }
            int w = 0; /* the sequences that go on: fed their proposal */
            for (int k = 0; k < n; k++) {
                eng_seq *s = e->d_who[k];
                int32_t d = propose(e, s, i, e->dlogits + (size_t)k * V);
                if (d >= 0) {
                    s->prop[i] = s->tok[s->n_tok + i] = d;
                    s->n_prop = i + 1;
                }
                if (d < 0 || s->r->max_tokens - s->n_gen - 1 <= i + 1) {
                    pkv_kv_seq_free(e->c, e->d_seq[k]);
                    continue;
                }
                e->d_who[w] = s;
                e->d_seq[w] = e->d_seq[k];
                e->d_tok[w] = d;
                w++;
            }
            n = w;
        }
        for (int k = 0; k < n; k++) pkv_kv_seq_free(e->c, e->d_seq[k]);
    }
}

/* ------------------------------------------------------ n-gram drafts */

/* Prompt lookup for s: the tokens that followed the most recent earlier
 * occurrence of its last n tokens, for the longest n in ng_min..ng_max that
 * occurs; at most k of them into out. One backward scan over s->tok: each
 * position whose token equals the last one is extended backwards while it
 * matches (at most ng_max tokens), and the scan stops at the first occurrence of
 * the longest n-gram. O(n_tok) compares plus O(ng_max) per hit of the last
 * token, per sequence and round; no index to keep. Returns the count. */
static int ngram_lookup(const pkv_engine *e, const eng_seq *s, int k, int32_t *out) {
    const int32_t *t = s->tok, n = s->n_tok;
    const int nmax = (int)PKV_MIN((int32_t)e->ng_max, n - 1);
    if (nmax < e->ng_min) return 0;
    int32_t best = -1;
    int best_len = e->ng_min - 1;
    const int32_t last = t[n - 1];
    for (int32_t j = n - 2; j >= 0; j--) { /* j: where a candidate occurrence ends */
        if (t[j] != last) continue;
        int len = 1;
        while (len < nmax && j - len >= 0 && t[j - len] == t[n - 1 - len]) len++;
        if (len > best_len) {
            best = j;
            best_len = len;
            if (len == nmax) break;
        }
    }
    int m = 0;
    for (int32_t i = best + 1; best >= 0 && i < n && m < k && t[i] >= 0; i++) out[m++] = t[i];
    return m;
}

/* N-gram drafts (pkv_engine_params.draft_ngram): every sequence whose next step
 * decodes one pending token (first: whose first round drafts, first_rounds)
 * proposes what prompt lookup finds (ngram_lookup),
 * bounded by its max_tokens and by its context (the last proposal's position
 * stays below n_ctx, so no context shift falls inside a verification). Under
 * PKV_DRAFT_ACCEPT_SAMPLING a proposal's q is one-hot: it is kept with the
 * model's probability of it, else the residual is p without it. */
static void ngram_round(pkv_engine *e, bool first) {
    const size_t V = (size_t)e->n_vocab;
    for (int ri = 0; ri < e->n_reqs; ri++) {
        eng_req *r = e->reqs[ri];
        for (int rj = 0; rj < r->n; rj++) {
            eng_seq *s = &r->seqs[rj];
            if (round_skips(s, first)) continue;
            s->n_prop = 0;
            if (s->st != SEQ_RUNNING || s->nodraft || s->n_kv != s->n_tok - !s->dfirst || (r->n > 1 && !r->forked) ||
                s->fin_wait != PKV_FINISH_NONE)
                continue;
            int64_t lim = e->n_ctx;
            if (r->p.context) lim = PKV_MIN(lim, (int64_t)pkv_context_n_ctx(r->p.context));
            int64_t k = PKV_MIN((int64_t)e->K, (int64_t)(r->max_tokens - s->n_gen - 1));
            k = PKV_MIN(k, lim - 1 - s->n_tok);
            if (k < 1) continue;
            int m = ngram_lookup(e, s, (int)k, s->prop);
            if (!m) continue;
            if (seq_draws(e, s)) {
                if (!s->q && !(s->q = pkv_malloc((size_t)e->K * V * sizeof *s->q))) {
                    PKV_WARN("engine: out of memory for %d draft distributions; the sequence goes on without drafts", e->K);
                    draft_off(e, s);
                    continue;
                }
                for (int i = 0; i < m; i++) {
                    float *q = s->q + (size_t)i * V;
                    memset(q, 0, V * sizeof *q);
                    q[s->prop[i]] = 1.0f;
                }
            }
            memcpy(s->tok + s->n_tok, s->prop, (size_t)m * sizeof *s->tok);
            s->n_prop = m;
        }
    }
}

/* A draft round of the engine's kind of draft (first: see first_rounds). */
static void draft_rounds(pkv_engine *e, bool first) {
    if (e->dc) draft_round(e, first);
    else if (e->dasst) assistant_round(e, first);
    else if (e->dshared) shared_round(e, first);
    else if (e->dngram) ngram_round(e, first);
}

/* The first rounds of requests on contexts that start from the context's logits
 * (eng_seq.dfirst), before the step: as llama.cpp's first round drafts from the
 * prompt's last token, the draft proposes as if the context's last token were
 * pending, and the step runs the proposals alone (verify_first). A sequence
 * whose round proposes nothing samples its first token from the logits now. */
static void first_rounds(pkv_engine *e) {
    bool any = false;
    for (int i = 0; i < e->n_reqs; i++)
        for (int j = 0; j < e->reqs[i]->n; j++) {
            eng_seq *s = &e->reqs[i]->seqs[j];
            s->h_row = -1; /* no step rows yet (a sequence admitted now has none set) */
            any |= s->st == SEQ_RUNNING && s->dfirst && !s->n_prop;
        }
    if (!any) return;
    draft_rounds(e, true);
    for (int i = 0; i < e->n_reqs; i++)
        for (int j = 0; j < e->reqs[i]->n; j++) {
            eng_seq *s = &e->reqs[i]->seqs[j];
            if (s->st != SEQ_RUNNING || !s->dfirst || s->n_prop) continue;
            s->dfirst = false;
            const float *lg = pkv_context_logits(s->r->p.context);
            if (sample_round(e, s, lg) >= 0) final_pending(e, s, lg);
        }
}

/* The step ran the first round's proposals of q alone (their rows lg, from
 * position a): verified as if the context's last token were pending, whose row is
 * the context's logits. */
static void verify_first(pkv_engine *e, eng_seq *q, const float *lg, int32_t a) {
    const size_t V = (size_t)e->n_vocab;
    const float *l0 = pkv_context_logits(q->r->p.context);
    pkv_status st = l0 ? grow_rows(&e->vfirst, &e->cap_vfirst, (size_t)q->n_prop + 1, V)
                       : pkv_err(PKV_ERR_INVALID, "engine: the context lost its logits before its first round");
    q->dfirst = false;
    if (st) {
        req_fail(e, q->r, st);
        return;
    }
    memcpy(e->vfirst, l0, V * sizeof *l0);
    memcpy(e->vfirst + V, lg, (size_t)q->n_prop * V * sizeof *lg);
    verify(e, q, e->vfirst, a - 1);
}

pkv_status pkv_engine_step_locked_out(pkv_engine *e, bool *did_work) {
    double t0 = pkv_time_now();
    *did_work = false;
    if (drain(e)) /* the ranks broke: this step's forward fails its requests */
        PKV_WARN("engine: %s", pkv_errmsg());
    for (int i = 0; i < e->n_reqs; i++) {
        eng_req *r = e->reqs[i];
        if (r->cancel && r->n_final < r->n) {
            req_finish(e, r, PKV_FINISH_CANCELLED, PKV_OK, NULL);
            *did_work = true;
        }
    }
    sweep(e);
    if (admit(e)) *did_work = true;
    first_rounds(e);
    int nb = form_batch(e);
    pkv_status s = PKV_OK;
    bool hid = false; /* the step made hidden rows (e->hid) */
    while (nb > 0) {
        nb = pack_batch(e, nb);
        if (nb == 0) break;
        pkv_fwd_batch b;
        memset(&b, 0, sizeof b);
        b.n_seqs = nb;
        b.seqs = e->b_kv;
        b.n_tokens = e->b_n;
        b.tokens = e->b_tok;
        b.n_logits = e->b_nl;
        bool any_lora = false;
        for (int i = 0; i < nb; i++) {
            const eng_req *rq = e->batch[i]->r;
            e->b_lora[i] = rq->has_lora ? &rq->lora : NULL;
            any_lora |= rq->has_lora;
        }
        if (any_lora) b.lora = e->b_lora;
        size_t rows = 0, T = 0;
        for (int i = 0; i < nb; i++) rows += (size_t)e->b_nl[i], T += (size_t)e->b_n[i];
        int64_t m_rows = 0, t = 0;
        bool any_nc = false, any_media = false;
        s = PKV_OK; /* (a retry after preempting: the last try's status is handled) */
        for (int i = 0; i < nb; t += e->b_n[i], i++) {
            if (!e->batch[i]->r->n_media) continue;
            if (!any_media) memset(e->b_span, 0, T * sizeof *e->b_span);
            any_media = true;
            if ((s = media_pack(e, e->batch[i], t, &m_rows, &any_nc))) break;
        }
        if (s) break;
        if (m_rows) {
            b.media_embd = e->b_embd;
            b.n_media_rows = m_rows;
        }
        if (any_nc) b.span_end = e->b_span;
        if ((s = grow_rows(&e->logits, &e->cap_logits, rows, (size_t)e->n_vocab))) break;
        bool want_hid = e->dmtp || e->dasst; /* an MTP head or an assistant drafts from the model's hidden states */
        for (int i = 0; i < nb && !want_hid; i++) want_hid = e->batch[i]->r->p.embed; /* an embedding pools them */
        if (want_hid) {
            if ((s = grow_rows(&e->hid, &e->cap_hid, T, (size_t)e->m->hp.n_embd))) break;
            b.hidden_out = e->hid;
        }
        hid = b.hidden_out != NULL;
        double tf = pkv_time_now();
        s = pkv_model_forward(e->m, e->c, &e->ws, &b, e->logits);
        if (!s && T >= (size_t)e->ps) { /* what recomputing costs per token (the spill rule) */
            e->pf_s += pkv_time_now() - tf;
            e->pf_tok += T;
        }
        if (s != PKV_ERR_OUT_OF_PAGES) break;
        if (pkv_engine_ctx_evict(e, NULL)) { /* idle contexts go before any running request */
            *did_work = true;
            continue;
        }
        eng_seq *v = pick_victim(e, NULL, false, 0);
        if (!v || n_resident(e) < 2) break;
        preempt(e, v);
        *did_work = true;
    }
    if (nb > 0) {
        *did_work = true;
        if (s) { /* the step did not happen: fail its requests, keep serving the others */
            char msg[512];
            snprintf(msg, sizeof msg, "%s", pkv_errmsg());
            for (int i = 0; i < nb; i++) {
                eng_req *r = e->batch[i]->r;
                e->batch[i]->step_n = 0;
                if (r->n_final < r->n) {
                    r->failed = true;
                    req_finish(e, r, PKV_FINISH_ERROR, s, msg);
                }
            }
        } else {
            e->steps++;
            size_t row = 0;
            for (int i = 0; i < nb; i++) {
                eng_seq *q = e->batch[i];
                int32_t a = q->n_kv;
                q->n_kv += q->step_n;
                q->lp_ok = false; /* the KV moved on from the logits a last_pending context holds */
                if (hid && q->r->p.context) /* kept for the context's later requests (an MTP head's catch-up) */
                    pkv_context_put_hidden(q->r->p.context, a, e->hid + (size_t)q->h_row * (size_t)e->m->hp.n_embd,
                                           q->step_n);
                if (q->r->p.embed && q->st == SEQ_RUNNING)
                    embed_take(e, q, a, q->step_n, e->hid + (size_t)q->h_row * (size_t)e->m->hp.n_embd);
                if (q->r->n_media && q->st == SEQ_RUNNING) {
                    pkv_status ms = media_record(e, q, a);
                    if (ms) req_fail(e, q->r, ms);
                }
                e->computed += (uint64_t)q->step_n;
                q->step_n = 0;
                if (q->dfirst) verify_first(e, q, e->logits + row * (size_t)e->n_vocab, a);
                else if (e->b_nl[i] > 1) verify(e, q, e->logits + row * (size_t)e->n_vocab, a); /* samples its tokens */
                row += (size_t)e->b_nl[i];
                if (q->st != SEQ_RUNNING) continue;
                /* The step wrote its K/V: its full pages can serve prefix matches from
                 * the next admission on, not only after this sequence's next step. */
                kv_seq *ks = pkv_kv_seq_get(e->c, q->kv, "publish");
                if (ks) pkv_kv_seq_publish(e->c, ks);
            }
            pkv_kv_stats ks; /* peak pages: the pool is fullest right after the step */
            pkv_kv_stats_get(e->c, &ks);
            if (ks.pages_used > e->pages_peak) e->pages_peak = ks.pages_used;
            row = 0;
            for (int i = 0; i < nb; i++, row += (size_t)e->b_nl[i - 1]) {
                eng_seq *q = e->batch[i];
                eng_req *r = q->r;
                /* (verified: a first round's too, whose n_kv is then below n_tok) */
                if (e->b_nl[i] > 1 || q->n_kv != q->n_tok || r->n_final == r->n) continue;
                const float *lg = e->logits + row * (size_t)e->n_vocab;
                if (r->p.embed) {
                    embed_final(e, q);
                    continue;
                }
                if (q->fin_wait != PKV_FINISH_NONE) { /* a context request's last token is in */
                    final_deferred(e, q, lg);
                    continue;
                }
                if (q->sample == 0 && r->n > 1 && !r->forked) {
                    pkv_status fs = fork_samples(e, r);
                    if (fs) {
                        req_fail(e, r, fs);
                        continue;
                    }
                    for (int j = 0; j < r->n; j++) sample_round(e, &r->seqs[j], lg);
                } else {
                    sample_round(e, q, lg);
                    final_pending(e, q, lg);
                }
            }
            draft_rounds(e, false);
        }
    }
    for (int i = 0; i < e->n_reqs; i++)
        for (int j = 0; j < e->reqs[i]->n; j++) {
            e->reqs[i]->seqs[j].step_n = 0;
            e->reqs[i]->seqs[j].h_row = -1;
        }
    sweep(e);
    if (*did_work) e->busy += pkv_time_now() - t0;
    pkv_engine_snapshot(e);
    return PKV_OK;
}
