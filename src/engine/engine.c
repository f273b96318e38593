/* The serving engine's public face: parameters, submission and cancellation
 * (thread-safe, under one mutex), the engine thread and statistics. The step
 * itself is in engine-sched.c. */
#include <string.h>
#include <time.h>

#include "engine/engine-impl.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/grammar.h"
#include "model/arch/arch.h"
#include "model/lora.h"
#include "model/model-impl.h"

const char *pkv_finish_reason_str(pkv_finish_reason r) {
    switch (r) {
    case PKV_FINISH_NONE: return "none";
    case PKV_FINISH_STOP: return "stop";
    case PKV_FINISH_LENGTH: return "length";
    case PKV_FINISH_CANCELLED: return "cancelled";
    case PKV_FINISH_ERROR: return "error";
    }
    return "?";
}

pkv_request_params pkv_request_default_params(void) {
    pkv_request_params r;
    memset(&r, 0, sizeof r);
    r.sampling = pkv_sampler_default_params();
    r.n = 1;
    return r;
}

pkv_engine_params pkv_engine_default_params(void) {
    pkv_engine_params p;
    memset(&p, 0, sizeof p);
    p.cache = pkv_cache_default_params();
    p.prefix_cache = true;
    p.swap = true;
    return p;
}

/* N-gram drafts (pkv_engine_params.draft_ngram): the lookup's lengths, K and the
 * acceptance rule's scratch; no model, no cache. */
static pkv_status ngram_create(pkv_engine *e) {
    const pkv_engine_params *p = &e->p;
    if (p->draft)
        return pkv_err(PKV_ERR_INVALID, "engine: draft_ngram and draft are exclusive: n-gram drafts need no draft model");
    if (p->draft_max < 0 || p->draft_max > ENG_MAX_DRAFT)
        return pkv_err(PKV_ERR_INVALID, "engine: draft_max %d is outside 1..%d", p->draft_max, ENG_MAX_DRAFT);
    e->K = p->draft_max ? p->draft_max : 4;
    e->ng_min = p->ngram_min ? p->ngram_min : 2;
    e->ng_max = p->ngram_max ? p->ngram_max : PKV_MAX(4, e->ng_min);
    if (e->ng_min < 1 || e->ng_max < e->ng_min || e->ng_max > PKV_ENGINE_MAX_NGRAM)
        return pkv_err(PKV_ERR_INVALID, "engine: ngram_min %d and ngram_max %d: need 1 <= ngram_min <= ngram_max <= %d "
                       "(0 = the defaults 2 and 4)", p->ngram_min, p->ngram_max, PKV_ENGINE_MAX_NGRAM);
    if (p->draft_accept != PKV_DRAFT_ACCEPT_MATCH && p->draft_accept != PKV_DRAFT_ACCEPT_SAMPLING)
        return pkv_err(PKV_ERR_INVALID, "engine: draft_accept %d is neither PKV_DRAFT_ACCEPT_MATCH (0) nor "
                       "PKV_DRAFT_ACCEPT_SAMPLING (1)", (int)p->draft_accept);
    if (p->draft_accept == PKV_DRAFT_ACCEPT_SAMPLING && !(e->vp = pkv_malloc((size_t)e->n_vocab * sizeof *e->vp)))
        return pkv_err(PKV_ERR_NOMEM, "engine: out of memory for the acceptance rule's %d probabilities", (int)e->n_vocab);
    e->dngram = true;
    return PKV_OK;
}

/* A draft step's batch and logits rows, for max_seqs sequences. */
static pkv_status draft_rows(pkv_engine *e, const char *what) {
    size_t S = (size_t)e->p.max_seqs, V = (size_t)e->n_vocab;
    e->dlogits = pkv_calloc(S * V, sizeof *e->dlogits);
    e->d_seq = pkv_calloc(S, sizeof *e->d_seq);
    e->d_n = pkv_calloc(S, sizeof *e->d_n);
    e->d_who = pkv_calloc(S, sizeof *e->d_who);
    if (!e->dlogits || !e->d_seq || !e->d_n || !e->d_who)
        return pkv_err(PKV_ERR_NOMEM, "engine: out of memory for the %s's %d x %d logits", what, e->p.max_seqs, (int)V);
    return PKV_OK;
}

/* Speculative decoding. Gemma 4's assistant and a shared-KV draft have no cache:
 * they are attached to the model's (I6). Any other draft gets a cache of its own,
 * as many pages as the model's pool plus room for every sequence's proposals (one
 * layer's pages: small), the same page size and swap pool. */
static pkv_status draft_create(pkv_engine *e, int64_t n_pages, int64_t host_pages) {
    const pkv_engine_params *p = &e->p;
    pkv_model *d = p->draft;
    if (p->draft_max < 0 || p->draft_max > ENG_MAX_DRAFT)
        return pkv_err(PKV_ERR_INVALID, "engine: draft_max %d is outside 1..%d", p->draft_max, ENG_MAX_DRAFT);
    e->K = p->draft_max ? p->draft_max : 4;
    if (d && e->m->n_ranks > 1)
        return pkv_err(PKV_ERR_UNSUPPORTED, "engine: a draft model with %s split over %d MPI ranks is not supported",
                       e->m->label, e->m->n_ranks);
    if (p->draft_accept != PKV_DRAFT_ACCEPT_MATCH && p->draft_accept != PKV_DRAFT_ACCEPT_SAMPLING)
        return pkv_err(PKV_ERR_INVALID, "engine: draft_accept %d is neither PKV_DRAFT_ACCEPT_MATCH (0) nor "
                       "PKV_DRAFT_ACCEPT_SAMPLING (1)", (int)p->draft_accept);
    if (p->draft_accept == PKV_DRAFT_ACCEPT_SAMPLING && !(e->vp = pkv_malloc((size_t)e->n_vocab * sizeof *e->vp)))
        return pkv_err(PKV_ERR_NOMEM, "engine: out of memory for a row of %d probabilities", (int)e->n_vocab);
    if (d->assistant) { /* no cache of its own: it reads the model's pages, fed the model's hidden states */
        pkv_status st = pkv_model_attach(d, e->m, e->c);
        if (st) return st;
        e->dm = d;
        e->dasst = true;
        if (!(e->d_pos = pkv_calloc((size_t)p->max_seqs, sizeof *e->d_pos)))
            return pkv_err(PKV_ERR_NOMEM, "engine: out of memory for the assistant's %d query positions", p->max_seqs);
        return draft_rows(e, "assistant");
    }
    if (d->hp.n_vocab != e->n_vocab) /* (an assistant's attach says it, naming both files) */
        return pkv_err(PKV_ERR_MISMATCH, "engine: the draft has a vocabulary of %d tokens, the model %d: a draft needs the "
                       "model's vocabulary (pagekv mkmodel --draft-of makes one)", d->hp.n_vocab, (int)e->n_vocab);
    if (d->kv_draft) { /* shared KV: no cache of its own, it drafts on forks of the model's sequences */
        pkv_status st = pkv_model_attach(d, e->m, e->c);
        if (st) return pkv_err_prefix(st, "engine: shared-KV draft %s on the cache of %s", d->label, e->m->label);
        e->dm = d;
        e->dshared = true;
        return draft_rows(e, "shared-KV draft");
    }
    if (d->mtp && d->hp.n_embd != e->m->hp.n_embd)
        return pkv_err(PKV_ERR_MISMATCH, "engine: the MTP head's width %d differs from the model's %d", d->hp.n_embd,
                       e->m->hp.n_embd);
    e->dm = d;
    e->dmtp = d->mtp;
    e->dfp = p->prefix_cache ? d->fingerprint ^ 0x6472616674ull : 0;
    pkv_cache_params cp = p->cache;
    cp.n_pages = n_pages + (int64_t)p->max_seqs * ((e->K + e->ps) / e->ps + 1);
    cp.host_pages = host_pages;
    cp.n_ctx = (int)e->n_ctx + e->K;
    cp.disk_dir = NULL; /* the disk tier belongs to the model's cache (one cache per directory) */
    cp.remote_url = NULL; /* and so does the remote tier */
    if (!(e->dc = pkv_model_cache_create(d, cp))) return pkv_err_prefix(PKV_ERR_INVALID, "engine: the draft's cache");
    return draft_rows(e, "draft");
}

pkv_engine *pkv_engine_create(pkv_model *m, pkv_engine_params p) {
    if (!m) {
        pkv_err(PKV_ERR_INVALID, "engine: model is NULL");
        return NULL;
    }
    if (p.max_batch_tokens < 0 || p.max_seqs < 0) {
        pkv_err(PKV_ERR_INVALID, "engine: max_batch_tokens (%d) and max_seqs (%d) must be >= 0", p.max_batch_tokens,
                p.max_seqs);
        return NULL;
    }
    if ((int)p.spill < PKV_SPILL_AUTO || (int)p.spill > PKV_SPILL_ALWAYS) {
        pkv_err(PKV_ERR_INVALID, "engine: spill (%d) must be PKV_SPILL_AUTO, _NEVER or _ALWAYS", (int)p.spill);
        return NULL;
    }
    if (!p.max_batch_tokens) p.max_batch_tokens = 256;
    if (!p.max_seqs) p.max_seqs = 64;
    if (!p.cache.n_seq_max) p.cache.n_seq_max = 8;
    pkv_engine *e = pkv_calloc(1, sizeof *e);
    if (!e) {
        pkv_err(PKV_ERR_NOMEM, "engine: out of memory");
        return NULL;
    }
    e->m = m;
    e->p = p;
    e->n_vocab = m->hp.n_vocab;
    e->fp = p.prefix_cache ? m->fingerprint : 0;
    e->invariant = true;
    for (int d = 0; d < m->n_dev; d++) e->invariant &= pkv_device_get_caps(m->devs[d])->batch_invariant;
    if (pthread_mutex_init(&e->mu, NULL)) {
        pkv_free(e);
        pkv_err(PKV_ERR_NOMEM, "engine: cannot create a mutex");
        return NULL;
    }
    if (pthread_cond_init(&e->cv, NULL)) {
        pthread_mutex_destroy(&e->mu);
        pkv_free(e);
        pkv_err(PKV_ERR_NOMEM, "engine: cannot create a condition variable");
        return NULL;
    }
    e->next_id = 1;
    e->c = p.use_cache;
    if (!e->c && !(e->c = e->own_cache = pkv_model_cache_create(m, p.cache))) goto fail;
    const pkv_kv_layout *lay = pkv_kv_cache_layout(e->c);
    e->ps = pkv_kv_layout_page_size(lay);
    pkv_kv_stats ks;
    pkv_kv_stats_get(e->c, &ks);
    e->n_pages = ks.n_pages;
    e->n_ctx = p.cache.n_ctx > 0 ? p.cache.n_ctx : PKV_MIN(m->hp.n_ctx_train, 4096);
    size_t V = (size_t)e->n_vocab, S = (size_t)p.max_seqs, T = (size_t)p.max_batch_tokens, rows;
    if (!pkv_mul_ok(V, S, &rows)) goto nomem;
    e->logits = pkv_calloc(rows, sizeof *e->logits);
    e->cap_logits = S;
    e->batch = pkv_calloc(S, sizeof *e->batch);
    e->b_kv = pkv_calloc(S, sizeof *e->b_kv);
    e->b_lora = pkv_calloc(S, sizeof *e->b_lora);
    e->b_n = pkv_calloc(S, sizeof *e->b_n);
    e->b_nl = pkv_calloc(S, sizeof *e->b_nl);
    e->b_tok = pkv_calloc(T, sizeof *e->b_tok);
    e->b_span = pkv_calloc(T, sizeof *e->b_span);
    if (!e->logits || !e->batch || !e->b_kv || !e->b_lora || !e->b_n || !e->b_nl || !e->b_tok || !e->b_span) goto nomem;
    if (p.draft_ngram ? ngram_create(e) != PKV_OK : p.draft && draft_create(e, ks.n_pages, ks.host_pages)) goto fail;
    pkv_engine_snapshot(e);
    return e;
nomem:
    pkv_err(PKV_ERR_NOMEM, "engine: out of memory for %d sequences x %d vocabulary rows and %d batch tokens",
            p.max_seqs, (int)e->n_vocab, p.max_batch_tokens);
fail:
    pkv_engine_free(e);
    return NULL;
}

void pkv_engine_free(pkv_engine *e) {
    if (!e) return;
    pkv_engine_stop(e);
    pkv_engine_dist_stop(e); /* before cancel_all: its drain sends nothing then */
    pkv_engine_cancel_all(e);
    pkv_fwd_ws_free(e->ws);
    pkv_kv_cache_free(e->own_cache); /* a use_cache stays the caller's */
    pkv_fwd_ws_free(e->dws);
    pkv_kv_cache_free(e->dc);
    pkv_free(e->held); /* the contexts are the caller's */
    pkv_free(e->hid);
    pkv_free(e->dh_in);
    pkv_free(e->dh_out);
    pkv_free(e->dlogits);
    pkv_free(e->vp);
    pkv_free(e->vfirst);
    pkv_grammar_vocab_free(e->gvocab);
    pkv_free(e->d_pos);
    pkv_free(e->d_seq);
    pkv_free(e->d_n);
    pkv_free(e->d_tok);
    pkv_free(e->d_who);
    pkv_free(e->b_nl);
    pkv_free(e->logits);
    pkv_free(e->batch);
    pkv_free(e->b_kv);
    pkv_free(e->b_lora);
    pkv_free(e->b_n);
    pkv_free(e->b_tok);
    pkv_free(e->b_span);
    pkv_free(e->b_embd);
    pkv_free(e->reqs);
    pkv_free(e->live);
    pkv_free(e->dist_cancel);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
    pkv_free(e);
}

pkv_kv_cache *pkv_engine_cache(pkv_engine *e) { return e ? e->c : NULL; }
pkv_model *pkv_engine_model(pkv_engine *e) { return e ? e->m : NULL; }

/* ---------------------------------------------------------------- submit */

/* A request on a context: the context's own checks, and its length and limit for
 * the size checks that follow. */
static pkv_status check_context(const pkv_engine *e, const pkv_request_params *r, int64_t *base, int64_t *n_ctx) {
    pkv_context *ctx = r->context;
    if (pkv_context_cache(ctx) != e->c || pkv_context_model(ctx) != e->m)
        return pkv_err(PKV_ERR_INVALID, "submit: the context is not on the engine's cache (make it with "
                       "pkv_context_create(pkv_engine_model(e), pkv_engine_cache(e), n_ctx))");
    if (r->n != 1) return pkv_err(PKV_ERR_INVALID, "submit: n = %d on a context; must be 1 (fork the context for more)", r->n);
    if (pkv_kv_seq_swapped(e->c, pkv_context_seq(ctx)) && !pkv_engine_ctx_held(e, ctx))
        return pkv_err(PKV_ERR_INVALID, "submit: the context is swapped out and not held by the engine; swap it in "
                       "first (pkv_context_swap_in) or hand it to the engine (pkv_engine_context_hold)");
    if (r->n_prompt < 0 || (r->n_prompt > 0 && !r->prompt))
        return pkv_err(PKV_ERR_INVALID, "submit: %d prompt tokens%s", (int)r->n_prompt, r->n_prompt > 0 ? " but prompt is NULL" : "");
    *base = pkv_context_n_tokens(ctx);
    if (r->n_prompt == 0 && !pkv_context_logits(ctx))
        return pkv_err(PKV_ERR_INVALID, "submit: the context has %s and the prompt is empty: give at least one token "
                       "(after a truncate: its last token again)", *base ? "no logits (truncated or shifted)" : "no tokens");
    *n_ctx = PKV_MIN(e->n_ctx, pkv_context_n_ctx(ctx));
    return PKV_OK;
}

/* A prefill-only request: the fields that would ask for generation are refused,
 * each by name, so a caller never believes a field took effect. */
static pkv_status check_prefill_only(const pkv_request_params *r) {
    const char *bad = !r->context ? "context is NULL (a prefill-only request computes into a context)"
                      : r->n_prompt < 1 ? "the prompt is empty (n_prompt must be >= 1: there is nothing to compute)"
                      : r->n != 1       ? "n must be 1"
                      : r->max_tokens   ? "max_tokens must be 0 (nothing is generated)"
                      : r->grammar      ? "grammar must be NULL (nothing is sampled)"
                      : r->n_stop       ? "n_stop must be 0 (nothing is sampled)"
                      : r->top_logprobs ? "top_logprobs must be 0 (nothing is sampled)"
                      : r->ignore_eos   ? "ignore_eos must be false (nothing is sampled)"
                      : NULL;
    if (bad) return pkv_err(PKV_ERR_INVALID, "submit: prefill_only: %s", bad);
    return PKV_OK;
}

/* An embedding request: the fields that would ask for generation or a context are
 * refused by name, as for prefill_only. */
static pkv_status check_embed(const pkv_engine *e, const pkv_request_params *r) {
    const char *bad = r->context         ? "context must be NULL (an embedding runs on a fresh sequence)"
                      : r->prefill_only  ? "prefill_only must be false"
                      : r->n != 1        ? "n must be 1"
                      : r->max_tokens    ? "max_tokens must be 0 (nothing is generated)"
                      : r->grammar       ? "grammar must be NULL (nothing is sampled)"
                      : r->n_stop        ? "n_stop must be 0 (nothing is sampled)"
                      : r->top_logprobs  ? "top_logprobs must be 0 (nothing is sampled)"
                      : r->ignore_eos    ? "ignore_eos must be false (nothing is sampled)"
                      : r->media         ? "media are not supported in an embedding request"
                      : r->sampler       ? "sampler must be NULL (nothing is sampled)"
                      : r->context_shift ? "context_shift must be false"
                      : r->last_pending  ? "last_pending must be false"
                      : (unsigned)r->pooling > PKV_POOLING_RANK ? "pooling is not a pkv_pooling value"
                      : r->pooling == PKV_POOLING_RANK && !e->m->n_cls_out
                          ? "pooling RANK needs a classification head (cls.output.weight); the model has none"
                      : r->pooling == PKV_POOLING_RANK && !pkv_arch_ops_of(e->m->hp.arch)->rerank
                          ? "pooling RANK is implemented for qwen3 rerankers (Qwen3-Reranker) only"
                          : NULL;
    if (bad) return pkv_err(PKV_ERR_INVALID, "submit: embed: %s", bad);
    return PKV_OK;
}

static pkv_status check_request(const pkv_engine *e, const pkv_request_params *r, int *n, int32_t *max_tokens) {
    int64_t base = 0, n_ctx = e->n_ctx; /* tokens before the prompt; the sequence's limit */
    pkv_status cs = r->prefill_only ? check_prefill_only(r) : PKV_OK;
    if (!cs && r->context) cs = check_context(e, r, &base, &n_ctx);
    if (cs) return cs;
    if (!r->context && (!r->prompt || r->n_prompt < 1))
        return pkv_err(PKV_ERR_INVALID, "submit: the prompt is empty (%d tokens; at least 1 is needed)", (int)r->n_prompt);
    if (r->context_shift && (!r->context || r->max_tokens < 1 || r->grammar))
        return pkv_err(PKV_ERR_INVALID, "submit: context_shift %s", !r->context ? "needs a request on a context"
                       : r->grammar ? "with a grammar: a shift drops text the grammar has matched"
                                    : "needs max_tokens >= 1 (nothing else bounds the request)");
    if (r->n_keep < 0 || (r->n_keep && !r->context_shift))
        return pkv_err(PKV_ERR_INVALID, "submit: n_keep = %d; %s", (int)r->n_keep,
                       r->n_keep < 0 ? "must be >= 0" : "it is the context shift's: set context_shift too");
    if (r->sampler && (r->n != 1 || r->grammar || pkv_sampler_n_vocab(r->sampler) != e->n_vocab))
        return pkv_err(PKV_ERR_INVALID, "submit: a sampler of the caller's %s", r->n != 1 ? "needs n = 1"
                       : r->grammar ? "cannot take a grammar (give it to the sampler)"
                                    : "was made for another vocabulary size than the model's");
    for (int32_t i = 0; i < r->n_prompt; i++)
        if ((r->prompt[i] < 0 || r->prompt[i] >= e->n_vocab) && !(r->media && pkv_token_is_media(r->prompt[i])))
            return pkv_err(PKV_ERR_INVALID, "submit: prompt token %d is %d, outside the vocabulary [0, %d)", (int)i,
                           (int)r->prompt[i], (int)e->n_vocab);
    *n = r->n;
    if (*n < 1 || *n > PKV_ENGINE_MAX_N)
        return pkv_err(PKV_ERR_INVALID, "submit: n = %d parallel samples; must be 1..%d", r->n, PKV_ENGINE_MAX_N);
    if (r->last_pending && (!r->context || r->context_shift || r->prefill_only))
        return pkv_err(PKV_ERR_INVALID, "submit: last_pending %s", !r->context ? "needs a request on a context"
                       : r->context_shift ? "with context_shift: a shift needs the last token in the context"
                                          : "with prefill_only: nothing is generated");
    if (r->max_tokens < 0) return pkv_err(PKV_ERR_INVALID, "submit: max_tokens = %d; must be >= 0 (0 = up to the context limit)", (int)r->max_tokens);
    if (r->embed) {
        pkv_status es = check_embed(e, r);
        if (es) return es;
        *max_tokens = 0;
        int64_t need = ((int64_t)r->n_prompt + e->ps - 1) / e->ps;
        if (r->n_prompt > n_ctx)
            return pkv_err(PKV_ERR_INVALID, "submit: embed: the input has %d tokens, more than the context limit of %lld",
                           (int)r->n_prompt, (long long)n_ctx);
        if (need > e->n_pages)
            return pkv_err(PKV_ERR_INVALID, "submit: embed: the input has %d tokens, %lld KV pages of %d tokens; "
                           "the device pool has only %lld pages", (int)r->n_prompt, (long long)need, e->ps,
                           (long long)e->n_pages);
        return PKV_OK;
    }
    if (r->prefill_only) { /* it may fill the context to its limit; the pool must hold it */
        *max_tokens = 0;
        int64_t len = base + r->n_prompt, need = (len + e->ps - 1) / e->ps;
        if (len > n_ctx)
            return pkv_err(PKV_ERR_INVALID, "submit: the context would hold %lld tokens, more than its limit of %lld",
                           (long long)len, (long long)n_ctx);
        if (need > e->n_pages)
            return pkv_err(PKV_ERR_INVALID, "submit: the context would hold %lld tokens, %lld KV pages of %d tokens; "
                           "the device pool has only %lld pages", (long long)len, (long long)need, e->ps,
                           (long long)e->n_pages);
        return PKV_OK;
    }
    if (r->last_pending) n_ctx++; /* the last generated token is not stored */
    if (base + r->n_prompt >= n_ctx)
        return pkv_err(PKV_ERR_INVALID,
                       "submit: the prompt has %lld tokens, the context limit is %lld tokens (prompt + generated); "
                       "no room to generate",
                       (long long)(base + r->n_prompt), (long long)n_ctx);
    int64_t room = n_ctx - base - r->n_prompt;
    *max_tokens = r->max_tokens ? r->max_tokens : (int32_t)room;
    if (!r->context_shift && base + r->n_prompt + *max_tokens > n_ctx)
        return pkv_err(PKV_ERR_INVALID,
                       "submit: prompt %lld + max_tokens %d = %lld tokens exceed the context limit of %lld tokens "
                       "(at most %lld new tokens for this prompt)",
                       (long long)(base + r->n_prompt), (int)*max_tokens, (long long)(base + r->n_prompt + *max_tokens),
                       (long long)n_ctx, (long long)room);
    /* The sequence holds at most prompt + max_tokens - 1 tokens (the last sampled one
     * is never run through the model; on a context it is). It alone must fit the
     * device pool. */
    int64_t len = base + r->n_prompt + *max_tokens - (r->context && !r->last_pending ? 0 : 1);
    if (r->context_shift) len = PKV_MIN(len, e->n_ctx); /* a shift makes room below the engine's limit */
    int64_t need = (len + e->ps - 1) / e->ps;
    if (r->context_shift) need *= 2; /* the shift writes what it moves into fresh pages first (pkv_kv_shift) */
    if (need > e->n_pages)
        return pkv_err(PKV_ERR_INVALID,
                       "submit: prompt %d + max_tokens %d needs %lld KV pages of %d tokens for one sequence%s; the "
                       "device pool has only %lld pages",
                       (int)r->n_prompt, (int)*max_tokens, (long long)need, e->ps,
                       r->context_shift ? " (and as many for its context shift to move)" : "", (long long)e->n_pages);
    if (r->n_stop < 0 || r->n_stop > PKV_ENGINE_MAX_STOP || (r->n_stop > 0 && !r->stop_tokens))
        return pkv_err(PKV_ERR_INVALID, "submit: %d stop tokens%s; at most %d", r->n_stop,
                       r->n_stop > 0 && !r->stop_tokens ? " but stop_tokens is NULL" : "", PKV_ENGINE_MAX_STOP);
    for (int i = 0; i < r->n_stop; i++)
        if (r->stop_tokens[i] < 0 || r->stop_tokens[i] >= e->n_vocab)
            return pkv_err(PKV_ERR_INVALID, "submit: stop token %d is %d, outside the vocabulary [0, %d)", i,
                           (int)r->stop_tokens[i], (int)e->n_vocab);
    if (r->top_logprobs < 0 || r->top_logprobs > PKV_ENGINE_MAX_TOP_LOGPROBS)
        return pkv_err(PKV_ERR_INVALID, "submit: top_logprobs = %d; must be 0..%d", r->top_logprobs,
                       PKV_ENGINE_MAX_TOP_LOGPROBS);
    if (pkv_sampler_check_params(&r->sampling)) return pkv_err_prefix(PKV_ERR_INVALID, "submit");
    for (int32_t i = 0; i < r->sampling.n_logit_bias; i++)
        if (r->sampling.logit_bias[i].token >= e->n_vocab)
            return pkv_err(PKV_ERR_INVALID, "submit: logit_bias entry %d has token %d, outside the vocabulary [0, %d)",
                           (int)i, (int)r->sampling.logit_bias[i].token, (int)e->n_vocab);
    if (r->grammar) {
        pkv_model_info mi;
        if (pkv_model_get_info(e->m, &mi) == PKV_OK && !mi.has_vocab)
            return pkv_err(PKV_ERR_UNSUPPORTED, "submit: a grammar needs the model's vocabulary (each token's text); "
                           "this model has none (tokenizer.ggml.model = none)");
    }
    if (r->grammar && r->ignore_eos)
        return pkv_err(PKV_ERR_INVALID, "submit: ignore_eos with a grammar: the grammar decides where the output may "
                       "end, and allows the end-of-generation token only there");
    return PKV_OK;
}

/* A request with media chunks: the text checked, then the prompt expanded (each
 * chunk's media ids where it goes), its records and rows copied into r. *ex is the
 * request as the rest of submit sees it (prompt = the expanded one, owned by r). */
static pkv_status expand_media(const pkv_engine *e, const pkv_request_params *rp, eng_req *r, pkv_request_params *ex) {
    *ex = *rp;
    if (rp->n_media < 0 || (rp->n_media > 0 && !rp->media))
        return pkv_err(PKV_ERR_INVALID, "submit: %d media chunks%s", rp->n_media, rp->n_media > 0 ? " but media is NULL" : "");
    if (rp->n_media == 0) {
        ex->media = NULL;
        return PKV_OK;
    }
    if (rp->context)
        return pkv_err(PKV_ERR_UNSUPPORTED, "submit: media chunks in a request on a context are not supported (decode them "
                       "into the context with pkv_context_decode_prompt first)");
    if (rp->n_prompt < 0 || (rp->n_prompt > 0 && !rp->prompt))
        return pkv_err(PKV_ERR_INVALID, "submit: %d prompt tokens%s", (int)rp->n_prompt, rp->n_prompt > 0 ? " but prompt is NULL" : "");
    for (int32_t i = 0; i < rp->n_prompt; i++) /* the text: no media ids of its own */
        if (rp->prompt[i] < 0 || rp->prompt[i] >= e->n_vocab)
            return pkv_err(PKV_ERR_INVALID, "submit: prompt token %d is %d, outside the vocabulary [0, %d)", (int)i,
                           (int)rp->prompt[i], (int)e->n_vocab);
    int64_t total = rp->n_prompt, rows = 0;
    for (int i = 0; i < rp->n_media; i++) {
        const pkv_media_rows *m = &rp->media[i];
        if (m->n_rows < 1 || !m->embd)
            return pkv_err(PKV_ERR_INVALID, "submit: media chunk %d has %d rows%s", i, m->n_rows, m->embd ? "" : " and no embeddings");
        if (m->at < 0 || m->at > rp->n_prompt || (i && m->at < rp->media[i - 1].at))
            return pkv_err(PKV_ERR_INVALID, "submit: media chunk %d is placed after %d prompt tokens: at must be in [%d, %d]", i,
                           m->at, i ? rp->media[i - 1].at : 0, (int)rp->n_prompt);
        if (m->non_causal && m->n_rows > e->p.max_batch_tokens)
            return pkv_err(PKV_ERR_INVALID, "submit: media chunk %d has %d non-causal rows, which must run in one step: more "
                           "than the engine's max_batch_tokens (%d)", i, m->n_rows, e->p.max_batch_tokens);
        rows += m->n_rows;
    }
    total += rows;
    if (total > INT32_MAX / 2) return pkv_err(PKV_ERR_INVALID, "submit: a prompt of %lld tokens", (long long)total);
    const size_t E = (size_t)e->m->hp.n_embd;
    r->prompt = pkv_malloc((size_t)total * sizeof *r->prompt);
    r->media = pkv_malloc((size_t)rp->n_media * sizeof *r->media);
    r->embd = pkv_malloc((size_t)rows * E * sizeof *r->embd);
    if (!r->prompt || !r->media || !r->embd)
        return pkv_err(PKV_ERR_NOMEM, "submit: out of memory for %lld media rows", (long long)rows);
    int64_t k = 0, t = 0, row = 0;
    for (int i = 0; i <= rp->n_media; i++) {
        int32_t upto = i < rp->n_media ? rp->media[i].at : rp->n_prompt;
        while (t < upto) r->prompt[k++] = rp->prompt[t++];
        if (i == rp->n_media) break;
        const pkv_media_rows *m = &rp->media[i];
        r->media[i] = (pkv_kv_media){.key = m->key, .start = k, .n_rows = m->n_rows,
                                     .flags = m->non_causal ? PKV_MEDIA_NON_CAUSAL : 0};
        for (int32_t j = 0; j < m->n_rows; j++) r->prompt[k++] = pkv_media_token(m->key, j);
        memcpy(r->embd + (size_t)row * E, m->embd, (size_t)m->n_rows * E * sizeof *r->embd);
        row += m->n_rows;
    }
    r->n_media = rp->n_media;
    r->n_media_rows = rows;
    ex->prompt = r->prompt;
    ex->n_prompt = (int32_t)total;
    return PKV_OK;
}

pkv_status pkv_engine_submit(pkv_engine *e, const pkv_request_params *rp, uint64_t *id) {
    if (id) *id = 0;
    if (!e || !rp) return pkv_err(PKV_ERR_INVALID, "submit: NULL engine or request");
    int n = 1;
    int32_t max_tokens = 0;
    eng_req *r = pkv_calloc(1, sizeof *r);
    if (r) atomic_init(&r->stop_grammar, false);
    if (!r) return pkv_err(PKV_ERR_NOMEM, "submit: out of memory");
    pkv_request_params exp;
    pkv_status s = expand_media(e, rp, r, &exp);
    if (!s) s = check_request(e, &exp, &n, &max_tokens);
    if (!s && rp->lora) s = pkv_lora_set_check(e->m, rp->lora, rp->n_lora, "submit");
    if (!s && rp->lora) {
        r->has_lora = true;
        r->lora.n = rp->n_lora;
        if (rp->n_lora) memcpy(r->lora.u, rp->lora, (size_t)rp->n_lora * sizeof *rp->lora);
        for (int i = 0; i < rp->n_lora && !s; i++)
            if (rp->context && rp->lora[i].scale != 0.0f)
                s = pkv_err(PKV_ERR_UNSUPPORTED, "submit: LoRA adapters on a request on a context are not supported (the "
                            "context's KV is the model's default set's; pkv_model_lora_apply)");
    }
    r->fp = !e->fp ? 0 : r->has_lora ? pkv_lora_set_fingerprint(e->m, &r->lora) : e->fp;
    if (!s && e->dist == ENG_DIST_LEAD) s = pkv_engine_dist_check(e, rp);
    if (s) {
        pkv_engine_req_free(e, r);
        return s;
    }
    int32_t *expanded = r->prompt;
    r->prompt = NULL;
    rp = &exp;
    r->p = *rp;
    r->p.media = NULL; /* copied into r->media / r->embd */
    r->p.n_media = 0;
    r->p.lora = NULL; /* copied into r->lora */
    r->p.n_lora = 0;
    r->p.grammar = pkv_grammar_retain(rp->grammar); /* dropped by pkv_engine_req_free */
    r->n = n;
    r->max_tokens = max_tokens;
    r->prompt = expanded ? expanded : pkv_malloc((size_t)(rp->n_prompt ? rp->n_prompt : 1) * sizeof *r->prompt);
    r->stop = pkv_malloc((size_t)rp->n_stop * sizeof *r->stop);
    r->seqs = pkv_calloc((size_t)n, sizeof *r->seqs);
    r->bias = pkv_malloc((size_t)(rp->sampling.n_logit_bias ? rp->sampling.n_logit_bias : 1) * sizeof *r->bias);
    if (!r->prompt || !r->stop || !r->seqs || !r->bias) {
        pkv_engine_req_free(e, r);
        return pkv_err(PKV_ERR_NOMEM, "submit: out of memory for a prompt of %d tokens", (int)rp->n_prompt);
    }
    if (rp->n_prompt && !expanded) memcpy(r->prompt, rp->prompt, (size_t)rp->n_prompt * sizeof *r->prompt);
    if (rp->n_stop) memcpy(r->stop, rp->stop_tokens, (size_t)rp->n_stop * sizeof *r->stop);
    if (rp->sampling.n_logit_bias)
        memcpy(r->bias, rp->sampling.logit_bias, (size_t)rp->sampling.n_logit_bias * sizeof *r->bias);
    r->p.sampling.logit_bias = r->bias;
    if (rp->embed) {
        int64_t E = e->m->hp.n_embd;
        int64_t np = rp->pooling == PKV_POOLING_NONE ? (int64_t)rp->n_prompt * E
                     : rp->pooling == PKV_POOLING_RANK ? e->m->n_cls_out : E;
        r->n_pool = (int32_t)np;
        r->pool = pkv_calloc((size_t)np, sizeof *r->pool);
        r->acc = rp->pooling == PKV_POOLING_MEAN ? pkv_calloc((size_t)E, sizeof *r->acc) : NULL;
        if (!r->pool || (rp->pooling == PKV_POOLING_MEAN && !r->acc)) {
            pkv_engine_req_free(e, r);
            return pkv_err(PKV_ERR_NOMEM, "submit: embed: out of memory for %lld floats", (long long)np);
        }
    }
    r->p.prompt = r->prompt;
    r->p.stop_tokens = r->stop;
    r->p.n = n;
    for (int i = 0; i < n; i++) {
        r->seqs[i].r = r;
        r->seqs[i].sample = i;
        r->seqs[i].kv = -1;
        r->seqs[i].dkv = -1;
        r->seqs[i].nodraft = r->n_media > 0 || rp->embed; /* a draft takes no media rows; an embedding samples nothing */
    }
    pthread_mutex_lock(&e->mu);
    for (int i = 0; i < e->n_live && rp->context && !s; i++) /* under the mutex: two submits cannot both pass */
        if (e->live[i]->p.context == rp->context)
            s = pkv_err(PKV_ERR_INVALID, "submit: request %llu runs on this context already",
                        (unsigned long long)e->live[i]->id);
    if (!s && e->n_live == e->live_cap) {
        void *p = e->live;
        size_t cap = (size_t)e->live_cap;
        s = pkv_grow(&p, &cap, (size_t)e->n_live + 1, sizeof *e->live);
        e->live = p;
        e->live_cap = (int)cap;
    }
    if (!s) {
        r->id = e->next_id++;
        r->order = r->id;
        e->live[e->n_live++] = r;
        if (e->in_tail) e->in_tail->next = r;
        else e->in_head = r;
        e->in_tail = r;
        e->submitted++;
        e->snap.requests_submitted = e->submitted;
        e->snap.n_waiting++;
        e->snap.n_requests++;
        if (id) *id = r->id;
        pthread_cond_broadcast(&e->cv);
    }
    pthread_mutex_unlock(&e->mu);
    if (s) pkv_engine_req_free(e, r);
    return s;
}

pkv_status pkv_engine_cancel(pkv_engine *e, uint64_t id) {
    if (!e) return pkv_err(PKV_ERR_INVALID, "cancel: engine is NULL");
    pkv_status s = PKV_ERR_NOT_FOUND;
    pthread_mutex_lock(&e->mu);
    for (int i = 0; i < e->n_live; i++)
        if (e->live[i]->id == id) {
            if (e->dist == ENG_DIST_LEAD) { /* taken at the next step, with the other ranks */
                s = pkv_engine_dist_log_cancel(e, id);
                break;
            }
            e->live[i]->cancel_flag = true;
            atomic_store(&e->live[i]->stop_grammar, true);
            e->cancel_pending = true;
            pthread_cond_broadcast(&e->cv);
            s = PKV_OK;
            break;
        }
    pthread_mutex_unlock(&e->mu);
    if (s == PKV_ERR_NOT_FOUND) pkv_err(s, "cancel: no unfinished request has id %llu", (unsigned long long)id);
    return s;
}

/* ----------------------------------------------------------- the thread */

pkv_status pkv_engine_step(pkv_engine *e, int *n_pending) {
    if (n_pending) *n_pending = 0;
    if (!e) return pkv_err(PKV_ERR_INVALID, "step: engine is NULL");
    pthread_mutex_lock(&e->mu);
    bool busy = e->running || e->in_step;
    if (!busy) e->in_step = 1;
    pthread_mutex_unlock(&e->mu);
    if (busy) return pkv_err(PKV_ERR_INVALID, "step: the engine thread is running (pkv_engine_stop first)");
    bool did;
    pkv_status s = pkv_engine_step_locked_out(e, &did);
    pthread_mutex_lock(&e->mu);
    e->in_step = 0;
    if (n_pending) *n_pending = e->n_live;
    pthread_mutex_unlock(&e->mu);
    return s;
}

static void *engine_main(void *arg) {
    pkv_engine *e = arg;
    pthread_mutex_lock(&e->mu);
    bool idle = false;
    while (!e->stop) {
        if (e->n_live == 0 || idle) {
            if (idle) { /* work exists but nothing could run: look again shortly */
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_nsec += 2000000;
                if (ts.tv_nsec >= 1000000000) {
                    ts.tv_sec++;
                    ts.tv_nsec -= 1000000000;
                }
                pthread_cond_timedwait(&e->cv, &e->mu, &ts);
                idle = false;
            } else {
                pthread_cond_wait(&e->cv, &e->mu);
            }
            continue;
        }
        pthread_mutex_unlock(&e->mu);
        bool did = false;
        pkv_status s = pkv_engine_step_locked_out(e, &did);
        if (s) PKV_WARN("engine: step failed: %s", pkv_errmsg());
        pthread_mutex_lock(&e->mu);
        idle = !did;
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

pkv_status pkv_engine_start(pkv_engine *e) {
    if (!e) return pkv_err(PKV_ERR_INVALID, "start: engine is NULL");
    pthread_mutex_lock(&e->mu);
    pkv_status s = PKV_OK;
    if (e->running || e->in_step) {
        s = pkv_err(PKV_ERR_INVALID, "start: the engine is already running or stepping");
    } else {
        e->stop = false;
        if (pthread_create(&e->th, NULL, engine_main, e)) s = pkv_err(PKV_ERR_NOMEM, "start: cannot create the engine thread");
        else e->running = true;
    }
    pthread_mutex_unlock(&e->mu);
    return s;
}

pkv_status pkv_engine_stop(pkv_engine *e) {
    if (!e) return pkv_err(PKV_ERR_INVALID, "stop: engine is NULL");
    pthread_mutex_lock(&e->mu);
    bool running = e->running;
    e->stop = true;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    if (running) {
        pthread_join(e->th, NULL);
        pthread_mutex_lock(&e->mu);
        e->running = false;
        pthread_mutex_unlock(&e->mu);
    }
    return PKV_OK;
}

void pkv_engine_stats_get(pkv_engine *e, pkv_engine_stats *out) {
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    if (out) *out = e->snap;
    pthread_mutex_unlock(&e->mu);
}

pkv_status pkv_engine_seqs(pkv_engine *e, pkv_engine_seq_info *out, int max, int *n) {
    if (!e || !n || max < 0 || (max > 0 && !out)) return pkv_err(PKV_ERR_INVALID, "engine seqs: NULL argument");
    *n = 0;
    pthread_mutex_lock(&e->mu);
    bool running = e->running;
    pthread_mutex_unlock(&e->mu);
    if (running) return pkv_err(PKV_ERR_INVALID, "engine seqs: the engine thread is running (pkv_engine_stop first)");
    int k = 0;
    for (int i = 0; i < e->n_reqs; i++) {
        const eng_req *r = e->reqs[i];
        for (int j = 0; j < r->n; j++) {
            const eng_seq *s = &r->seqs[j];
            if (s->kv < 0 || (s->st != SEQ_RUNNING && s->st != SEQ_SWAPPED)) continue;
            if (k < max) {
                out[k].request = r->id;
                out[k].user = r->p.user;
                out[k].sample = j;
                out[k].kv_seq = s->kv;
                out[k].on_context = r->p.context != NULL;
            }
            k++;
        }
    }
    *n = k;
    return PKV_OK;
}
